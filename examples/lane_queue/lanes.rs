//! The lane queues: one FIFO per lane, and a take that serves the first non-empty lane of the
//! worker's preference list, as in the guide's `Lanes.take`. A job is handed to one worker at a
//! time, and a lane is never reordered except to put back a job whose worker vanished.

use std::collections::{HashMap, VecDeque};
use std::fs::File;
use std::io::{LineWriter, Write as _};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use prometheus_client::encoding::text::encode;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::{Family, MetricConstructor};
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::Registry;
use tokio::sync::Notify;

/// A job as a worker sees it.
#[derive(Clone, Debug, serde::Serialize)]
pub struct Job {
    pub id: u64,
    pub lane: String,
    /// How long the job runs: the worker sleeps this long.
    pub job_ms: u64,
    /// Time from submission to this take.
    pub waited_ms: f64,
    #[serde(skip)]
    pub taken: Instant,
}

struct Queued {
    id: u64,
    job_ms: u64,
    submitted: Instant,
}

struct Taken {
    lane: String,
    queued: Queued,
    started: Instant,
}

#[derive(Default)]
struct State {
    /// In the pool's lane order.
    queues: Vec<(String, VecDeque<Queued>)>,
    taken: HashMap<u64, Taken>,
    next_id: u64,
}

/// Why a request about a job was refused.
#[derive(Debug, PartialEq)]
pub enum Refused {
    UnknownLane(String),
    UnknownJob(u64),
}

impl std::fmt::Display for Refused {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Refused::UnknownLane(lane) => write!(f, "unknown lane {lane:?}"),
            Refused::UnknownJob(id) => {
                write!(f, "job {id} is not taken (done already, or put back)")
            }
        }
    }
}

/// The queues of one pool and the worker metric convention for them.
pub struct Lanes {
    state: Mutex<State>,
    /// Woken on every submission, so a long-polling take answers at once.
    submitted: Notify,
    /// Each worker's cancel of its waiting take, by worker name.
    cancels: Mutex<HashMap<String, Arc<Notify>>>,
    metrics: LaneMetrics,
    log: Option<JobLog>,
}

/// Every take and every worker's round from one take to its next, one line each, to the
/// microsecond: what the histograms' buckets blur (a wait p99 inside the 15–20 ms bucket) and
/// what no metric shows (how long a worker is away between two jobs).
///
///   take SECONDS LANE WAIT_US                      SECONDS since the queue started
///   round SECONDS LANE JOB_MS RAN_US DONE_US NEXT_US  from the take: the worker's own run time,
///                                                  its done arriving, its next take arriving
pub struct JobLog {
    start: Instant,
    out: Mutex<LineWriter<File>>,
}

impl JobLog {
    pub fn create(path: &std::path::Path) -> std::io::Result<Self> {
        Ok(Self {
            start: Instant::now(),
            out: Mutex::new(LineWriter::new(File::create(path)?)),
        })
    }

    fn line(&self, line: std::fmt::Arguments<'_>) {
        let mut out = self.out.lock().unwrap_or_else(|p| p.into_inner());
        let _ = out.write_fmt(line);
    }

    fn take(&self, at: Instant, lane: &str, waited: Duration) {
        let since = at.duration_since(self.start).as_secs_f64();
        self.line(format_args!(
            "take {since:.6} {lane} {}\n",
            waited.as_micros()
        ));
    }

    /// One worker's round: its job taken at `taken`, its done at `done`, its next take at `next`.
    pub fn round(&self, round: &Round, next: Instant) {
        let since = round.taken.duration_since(self.start).as_secs_f64();
        let micros = |at: Option<Instant>| {
            at.map_or(-1, |at| at.duration_since(round.taken).as_micros() as i64)
        };
        let ran = round.ran.map_or(-1, |s| (s * 1e6).round() as i64);
        self.line(format_args!(
            "round {since:.6} {} {} {ran} {} {}\n",
            round.lane,
            round.job_ms,
            micros(round.done),
            micros(Some(next)),
        ));
    }
}

/// A job one connection took, until that connection's next take.
pub struct Round {
    pub lane: String,
    pub job_ms: u64,
    pub taken: Instant,
    /// The run time its worker reported.
    pub ran: Option<f64>,
    pub done: Option<Instant>,
}

impl Lanes {
    pub fn new(namespace: &str, pool: &str, lanes: &[&str], log: Option<JobLog>) -> Self {
        let state = State {
            queues: lanes
                .iter()
                .map(|l| (l.to_string(), VecDeque::new()))
                .collect(),
            ..State::default()
        };
        let metrics = LaneMetrics::new(namespace, pool);
        for lane in lanes {
            metrics.touch(lane);
        }
        Self {
            state: Mutex::new(state),
            submitted: Notify::new(),
            cancels: Mutex::default(),
            metrics,
            log,
        }
    }

    /// The job log, when the queue keeps one.
    pub fn log(&self) -> Option<&JobLog> {
        self.log.as_ref()
    }

    fn state(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Queues a job at the back of `lane`; returns its id.
    pub fn submit(&self, lane: &str, job_ms: u64) -> Result<u64, Refused> {
        let mut state = self.state();
        state.next_id += 1;
        let id = state.next_id;
        let queue = queue_of(&mut state, lane)?;
        queue.push_back(Queued {
            id,
            job_ms,
            submitted: Instant::now(),
        });
        let depth = queue.len();
        // Under the lock, so the depth gauge never goes back to an older value.
        self.metrics.submitted(lane, depth);
        drop(state);
        self.submitted.notify_waiters();
        Ok(id)
    }

    /// The oldest job of the first non-empty lane in `preference`, waiting up to `long_poll` for
    /// one to be submitted; `None` when none came.
    pub async fn take(
        &self,
        preference: &[String],
        long_poll: Duration,
        worker: Option<&str>,
    ) -> Result<Option<Job>, Refused> {
        let deadline = tokio::time::Instant::now() + long_poll;
        let cancel = worker.map(|w| self.cancel_of(w));
        let cancelled = async {
            match &cancel {
                Some(cancel) => cancel.notified().await,
                None => std::future::pending().await,
            }
        };
        tokio::pin!(cancelled);
        loop {
            // Registered before looking, so a submission between the look and the wait wakes us.
            let notified = self.submitted.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            if let Some(job) = self.try_take(preference)? {
                return Ok(Some(job));
            }
            tokio::select! {
                () = notified => {}
                () = &mut cancelled => return Ok(None),
                () = tokio::time::sleep_until(deadline) => return Ok(None),
            }
        }
    }

    fn try_take(&self, preference: &[String]) -> Result<Option<Job>, Refused> {
        let mut state = self.state();
        for lane in preference {
            let queue = queue_of(&mut state, lane)?;
            let Some(queued) = queue.pop_front() else {
                continue;
            };
            let depth = queue.len();
            let started = Instant::now();
            let waited = started.duration_since(queued.submitted);
            let job = Job {
                id: queued.id,
                lane: lane.clone(),
                job_ms: queued.job_ms,
                waited_ms: waited.as_secs_f64() * 1000.0,
                taken: started,
            };
            if let Some(log) = &self.log {
                log.take(started, lane, waited);
            }
            state.taken.insert(
                queued.id,
                Taken {
                    lane: lane.clone(),
                    queued,
                    started,
                },
            );
            self.metrics.taken(lane, depth, waited);
            drop(state);
            return Ok(Some(job));
        }
        Ok(None)
    }

    /// Records job `id` as done; `seconds` is the run time the worker measured, else the time
    /// since it was taken.
    pub fn done(&self, id: u64, seconds: Option<f64>) -> Result<(), Refused> {
        let taken = self
            .state()
            .taken
            .remove(&id)
            .ok_or(Refused::UnknownJob(id))?;
        let seconds = seconds
            .filter(|s| s.is_finite() && *s >= 0.0)
            .unwrap_or_else(|| taken.started.elapsed().as_secs_f64());
        self.metrics.completed(&taken.lane, seconds);
        Ok(())
    }

    /// Puts a taken job back at the front of its lane: its worker went away before reporting it
    /// done or giving it back (killed, or its connection dropped), and the job must not be lost.
    /// Counted as cut short: a worker that stops waiting cancels its take and gives back what it
    /// got (`give_back`), so a job still taken when its connection closes was in hand.
    pub fn put_back(&self, id: u64) {
        self.requeue(id, true);
    }

    /// Puts a job its worker got but did not start back at the front of its lane: the worker
    /// stopped waiting (a drain, a stand-in, SIGTERM) as the queue handed it out.
    pub fn give_back(&self, id: u64) -> Result<(), Refused> {
        if !self.state().taken.contains_key(&id) {
            return Err(Refused::UnknownJob(id));
        }
        self.requeue(id, false);
        Ok(())
    }

    /// Ends `worker`'s take that waits for a job (a 204), or its next one if none waits: the
    /// worker wants other lanes, or none.
    pub fn cancel(&self, worker: &str) {
        self.cancels
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .entry(worker.to_string())
            .or_default()
            .notify_one();
    }

    fn cancel_of(&self, worker: &str) -> Arc<Notify> {
        self.cancels
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .entry(worker.to_string())
            .or_default()
            .clone()
    }

    fn requeue(&self, id: u64, cut_short: bool) {
        let mut state = self.state();
        let Some(taken) = state.taken.remove(&id) else {
            return;
        };
        let Ok(queue) = queue_of(&mut state, &taken.lane) else {
            return;
        };
        queue.push_front(taken.queued);
        let depth = queue.len();
        self.metrics.depth(&taken.lane, depth);
        if cut_short {
            self.metrics.cut_short(&taken.lane);
        }
        drop(state);
        self.submitted.notify_waiters();
    }

    /// The Prometheus exposition of every lane's metrics.
    pub fn render_metrics(&self) -> String {
        self.metrics.render()
    }
}

fn queue_of<'a>(state: &'a mut State, lane: &str) -> Result<&'a mut VecDeque<Queued>, Refused> {
    state
        .queues
        .iter_mut()
        .find(|(name, _)| name == lane)
        .map(|(_, queue)| queue)
        .ok_or_else(|| Refused::UnknownLane(lane.to_string()))
}

type Labels = Vec<(&'static str, String)>;

#[derive(Clone)]
struct Buckets(&'static [f64]);

impl MetricConstructor<Histogram> for Buckets {
    fn new_metric(&self) -> Histogram {
        Histogram::new(self.0.iter().copied())
    }
}

/// Urgent waits are milliseconds, a batch backlog's are minutes: the buckets cover both.
const WAIT_BUCKETS: &[f64] = &[
    0.001, 0.002, 0.005, 0.01, 0.015, 0.02, 0.025, 0.03, 0.04, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3,
    0.5, 1.0, 2.0, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0,
];
const DURATION_BUCKETS: &[f64] = &[
    0.005, 0.01, 0.015, 0.02, 0.025, 0.03, 0.05, 0.1, 0.15, 0.2, 0.25, 0.3, 0.4, 0.5, 1.0, 2.0, 5.0,
];

/// The README's worker metric convention, labelled `namespace`, `pool` and `lane`.
struct LaneMetrics {
    registry: Registry,
    namespace: String,
    pool: String,
    submitted: Family<Labels, Counter>,
    completed: Family<Labels, Counter>,
    wait: Family<Labels, Histogram, Buckets>,
    duration: Family<Labels, Histogram, Buckets>,
    depth: Family<Labels, Gauge>,
    cut_short: Family<Labels, Counter>,
}

impl LaneMetrics {
    fn new(namespace: &str, pool: &str) -> Self {
        let mut registry = Registry::default();
        let submitted = Family::<Labels, Counter>::default();
        let completed = Family::<Labels, Counter>::default();
        let wait = Family::new_with_constructor(Buckets(WAIT_BUCKETS));
        let duration = Family::new_with_constructor(Buckets(DURATION_BUCKETS));
        let depth = Family::<Labels, Gauge>::default();
        let cut_short = Family::<Labels, Counter>::default();
        registry.register(
            "lanepool_jobs_cut_short",
            "Jobs put back because their worker went away while running them",
            cut_short.clone(),
        );
        registry.register(
            "lanepool_jobs_submitted",
            "Jobs submitted to the lane",
            submitted.clone(),
        );
        registry.register(
            "lanepool_jobs_completed",
            "Jobs a worker reported done",
            completed.clone(),
        );
        registry.register(
            "lanepool_job_wait_seconds",
            "Time from submission to a worker taking the job",
            wait.clone(),
        );
        registry.register(
            "lanepool_job_duration_seconds",
            "Time a worker spent running the job",
            duration.clone(),
        );
        registry.register(
            "lanepool_queue_depth",
            "Jobs waiting in the lane",
            depth.clone(),
        );
        Self {
            registry,
            namespace: namespace.into(),
            pool: pool.into(),
            submitted,
            completed,
            wait,
            duration,
            depth,
            cut_short,
        }
    }

    fn labels(&self, lane: &str) -> Labels {
        vec![
            ("namespace", self.namespace.clone()),
            ("pool", self.pool.clone()),
            ("lane", lane.to_string()),
        ]
    }

    /// Creates every series of a lane at zero, so rates exist before the first job.
    fn touch(&self, lane: &str) {
        let labels = self.labels(lane);
        let _ = self.submitted.get_or_create(&labels);
        let _ = self.completed.get_or_create(&labels);
        let _ = self.cut_short.get_or_create(&labels);
        let _ = self.wait.get_or_create(&labels);
        let _ = self.duration.get_or_create(&labels);
        self.depth.get_or_create(&labels).set(0);
    }

    fn submitted(&self, lane: &str, depth: usize) {
        self.submitted.get_or_create(&self.labels(lane)).inc();
        self.depth(lane, depth);
    }

    fn taken(&self, lane: &str, depth: usize, waited: Duration) {
        self.wait
            .get_or_create(&self.labels(lane))
            .observe(waited.as_secs_f64());
        self.depth(lane, depth);
    }

    fn completed(&self, lane: &str, seconds: f64) {
        let labels = self.labels(lane);
        self.duration.get_or_create(&labels).observe(seconds);
        self.completed.get_or_create(&labels).inc();
    }

    fn cut_short(&self, lane: &str) {
        self.cut_short.get_or_create(&self.labels(lane)).inc();
    }

    fn depth(&self, lane: &str, depth: usize) {
        self.depth
            .get_or_create(&self.labels(lane))
            .set(i64::try_from(depth).unwrap_or(i64::MAX));
    }

    fn render(&self) -> String {
        let mut text = String::new();
        let _ = encode(&mut text, &self.registry);
        text
    }
}
