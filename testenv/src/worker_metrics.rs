//! A metrics endpoint that stands in for a pool's workers: a test says "lane urgent of pool p now
//! receives 150 jobs/s at 20 ms", and the counters it serves grow accordingly, so Prometheus and
//! the controller see that load through real scrapes and real PromQL.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener};
use std::sync::{Arc, Mutex};
use std::time::Instant;

use crate::error::{Result, io};

/// The lane a series belongs to.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
struct SeriesKey {
    namespace: String,
    pool: String,
    lane: String,
}

#[derive(Clone, Debug)]
struct SimulatedLane {
    arrival_rate: f64,
    job_seconds: f64,
    submitted: f64,
    duration_sum: f64,
    duration_count: f64,
    since: Instant,
}

impl SimulatedLane {
    /// Adds what the current load produced since the last update.
    fn advance(&mut self, now: Instant) {
        let jobs = self.arrival_rate * now.duration_since(self.since).as_secs_f64();
        self.submitted += jobs;
        self.duration_count += jobs;
        self.duration_sum += jobs * self.job_seconds;
        self.since = now;
    }
}

/// Each lane's load, and each pod's `lanepool_worker_busy` by (namespace, pool, pod).
#[derive(Default)]
struct Served {
    lanes: BTreeMap<SeriesKey, SimulatedLane>,
    busy: BTreeMap<(String, String, String), bool>,
}

type Lanes = Arc<Mutex<Served>>;

/// Serves `lanepool_jobs_submitted_total` and `lanepool_job_duration_seconds` for the lanes a
/// test sets, and `lanepool_worker_busy` for the pods it marks, on a port of 127.0.0.1.
#[derive(Clone)]
pub struct SimulatedWorkers {
    addr: SocketAddr,
    lanes: Lanes,
}

impl SimulatedWorkers {
    /// Starts serving on a free port; the server thread lives as long as the process.
    pub fn start() -> Result<Self> {
        let listener = TcpListener::bind("127.0.0.1:0").map_err(io("binding the metrics port"))?;
        let addr = listener
            .local_addr()
            .map_err(io("reading the metrics port"))?;
        let lanes = Lanes::default();
        let served = lanes.clone();
        serve_on(listener, "simulated-workers", move || exposition(&served))?;
        Ok(Self { addr, lanes })
    }

    /// The `host:port` Prometheus scrapes.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// From now on, `lane` of `pool` receives `arrival_rate` jobs per second, each taking
    /// `job_seconds`.
    pub fn set_lane(
        &self,
        namespace: &str,
        pool: &str,
        lane: &str,
        arrival_rate: f64,
        job_seconds: f64,
    ) {
        let now = Instant::now();
        let key = SeriesKey {
            namespace: namespace.into(),
            pool: pool.into(),
            lane: lane.into(),
        };
        let mut served = self.lanes.lock().unwrap_or_else(|p| p.into_inner());
        let load = served.lanes.entry(key).or_insert(SimulatedLane {
            arrival_rate,
            job_seconds,
            submitted: 0.0,
            duration_sum: 0.0,
            duration_count: 0.0,
            since: now,
        });
        load.advance(now);
        load.arrival_rate = arrival_rate;
        load.job_seconds = job_seconds;
    }

    /// From now on, the worker in `pod` of `pool` reports itself busy (running a job) or idle.
    pub fn set_busy(&self, namespace: &str, pool: &str, pod: &str, busy: bool) {
        let mut served = self.lanes.lock().unwrap_or_else(|p| p.into_inner());
        served
            .busy
            .insert((namespace.into(), pool.into(), pod.into()), busy);
    }
}

/// Serves `render()` as a Prometheus text exposition on a free port, from a thread that lives as
/// long as the process: a scrape target for what a test exposes (the operator's own metrics).
pub fn serve_metrics(render: impl Fn() -> String + Send + 'static) -> Result<SocketAddr> {
    let listener = TcpListener::bind("127.0.0.1:0").map_err(io("binding the metrics port"))?;
    let addr = listener
        .local_addr()
        .map_err(io("reading the metrics port"))?;
    serve_on(listener, "metrics", render)?;
    Ok(addr)
}

fn serve_on(
    listener: TcpListener,
    name: &str,
    render: impl Fn() -> String + Send + 'static,
) -> Result<()> {
    std::thread::Builder::new()
        .name(name.into())
        .spawn(move || {
            for mut stream in listener.incoming().flatten() {
                let mut request = [0u8; 2048];
                let _ = stream.read(&mut request);
                let body = render();
                let _ = write!(
                    stream,
                    "HTTP/1.1 200 OK\r\nContent-Type: text/plain; version=0.0.4\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
                    body.len()
                );
            }
        })
        .map_err(io("starting the metrics thread"))?;
    Ok(())
}

fn exposition(lanes: &Lanes) -> String {
    let now = Instant::now();
    let mut served = lanes.lock().unwrap_or_else(|p| p.into_inner());
    let mut busy = String::from("# TYPE lanepool_worker_busy gauge\n");
    for ((namespace, pool, pod), value) in &served.busy {
        let _ = writeln!(
            busy,
            "lanepool_worker_busy{{namespace=\"{namespace}\",pool=\"{pool}\",pod=\"{pod}\"}} {}",
            u8::from(*value)
        );
    }
    let mut submitted = String::from("# TYPE lanepool_jobs_submitted_total counter\n");
    let mut durations = String::from("# TYPE lanepool_job_duration_seconds histogram\n");
    for (key, load) in served.lanes.iter_mut() {
        load.advance(now);
        let labels = format!(
            "namespace=\"{}\",pool=\"{}\",lane=\"{}\"",
            key.namespace, key.pool, key.lane
        );
        let _ = writeln!(
            submitted,
            "lanepool_jobs_submitted_total{{{labels}}} {}",
            load.submitted
        );
        let _ = writeln!(
            durations,
            "lanepool_job_duration_seconds_bucket{{{labels},le=\"+Inf\"}} {count}\n\
             lanepool_job_duration_seconds_sum{{{labels}}} {sum}\n\
             lanepool_job_duration_seconds_count{{{labels}}} {count}",
            count = load.duration_count,
            sum = load.duration_sum,
        );
    }
    submitted + &durations + &busy
}
