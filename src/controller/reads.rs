//! Reading the workers' own finished-job counts (`lanepool_job_duration_seconds_count`, by lane)
//! at their port named `metrics`, each time a pool is measured, so the reserve follows a rate
//! seconds old instead of a scrape interval plus a scrape's age. Only for pools whose template
//! has that port, and only for lanes on the metric convention's default query; a read that
//! cannot count every ready worker changes nothing, and Prometheus decides as before.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use k8s_openapi::api::core::v1::{Pod, PodSpec};
use k8s_openapi::jiff::Timestamp;
use kube::ResourceExt;
use kube::api::ListParams;
use tracing::{debug, warn};

use super::context::Context;
use super::drain::pod_ready;
use super::idle_first::{METRICS_PORT, sample_lines};
use super::measure::Loads;
use super::pods::PoolPods;
use crate::api::{LanePool, POOL_LABEL};
use crate::sizing::{Baselines, LaneReads, WorkerCount, baselines, finished_since};

/// The finished-job counter the reads sum: a histogram's `_count`, by `lane`.
pub const FINISHED_METRIC: &str = "lanepool_job_duration_seconds_count";

/// What a pool remembers of its reads between evaluations.
#[derive(Clone, Debug, Default, PartialEq)]
pub(super) struct WorkerReads {
    baselines: Baselines,
    /// When the last read was made, once its answers were in: on the operator's clock (what the
    /// rates are counted over) and the wall clock (Pods' start times are wall-clock times).
    last: Option<(Duration, Timestamp)>,
    lanes: BTreeMap<String, LaneReads>,
    /// When this evaluation's read was recorded; `None` when it was not (the workers could not
    /// be listed, none answered, one did not): then nothing of the reads is current, and
    /// Prometheus decides. Never the last read standing in for this one.
    current: Option<Duration>,
    /// The workers whose implausible claims were logged (once each), among those last read.
    logged: BTreeSet<String>,
}

/// One read's answers, as they came in.
#[derive(Clone, Debug, PartialEq)]
pub(super) struct Answers {
    answers: Vec<WorkerCount>,
    /// The ready workers, by name: each must answer for the read to be a rate.
    expected: BTreeSet<String>,
    lanes: Vec<String>,
    /// When the answers were in (the operator's clock), and the wall clock when asked.
    at: Duration,
    wall: Timestamp,
}

/// An answer dropped: a worker claimed more finished jobs of `lane` than it could have run.
#[derive(Clone, Debug, PartialEq)]
pub(super) struct Implausible {
    pub(super) worker: String,
    pub(super) lane: String,
    pub(super) claimed: f64,
    pub(super) most: f64,
    /// Not logged before for this worker.
    pub(super) first: bool,
}

/// The long window the reads' rate is counted over: the operator's `--rate-window`.
pub(super) fn rate_window(ctx: &Context) -> Duration {
    crate::duration::parse(&ctx.settings.windows.arrival_rate).unwrap_or(Duration::from_secs(60))
}

/// The reserve lanes measured through the default convention: a custom query is never overridden.
fn read_lanes(pool: &LanePool) -> Vec<String> {
    pool.spec
        .lanes
        .iter()
        .filter(|lane| {
            lane.reserve.as_ref().is_some_and(|reserve| {
                reserve
                    .arrival_rate
                    .as_ref()
                    .is_none_or(|q| q.query.is_none())
            })
        })
        .map(|lane| lane.name.clone())
        .collect()
}

/// Whether the pod template serves a `metrics` port: without one nothing is listed or asked.
fn serves_metrics(spec: Option<&PodSpec>) -> bool {
    spec.is_some_and(|spec| {
        spec.containers
            .iter()
            .flat_map(|c| c.ports.iter().flatten())
            .any(|p| p.name.as_deref() == Some(METRICS_PORT))
    })
}

/// When the Pod's newest container started: its counters count from then.
fn started(pod: &Pod) -> Option<Timestamp> {
    pod.status
        .as_ref()?
        .container_statuses
        .iter()
        .flatten()
        .filter_map(|c| c.state.as_ref()?.running.as_ref()?.started_at.as_ref())
        .map(|t| t.0)
        .max()
}

/// The finished-job counts of `lanes` in a worker's `/metrics` text; `None` when it exports none
/// (a worker that leaves counting to its queue), so that it is never read as zero. A `lane` not
/// the pool's is dropped here, before anything is kept of it.
pub fn finished_counts(text: &str, lanes: &[String]) -> Option<BTreeMap<String, f64>> {
    let mut counts: BTreeMap<String, f64> = BTreeMap::new();
    let mut exported = text
        .lines()
        .any(|l| l.starts_with("# TYPE lanepool_job_duration_seconds "));
    for (name, labels, value) in sample_lines(text) {
        if name != FINISHED_METRIC || !value.is_finite() || value < 0.0 {
            continue;
        }
        exported = true;
        if let Some(lane) = labels.get("lane").filter(|l| lanes.contains(l)) {
            *counts.entry(lane.clone()).or_default() += value;
        }
    }
    exported.then_some(counts)
}

impl WorkerReads {
    /// Asks the pool's workers for their counts of the lanes on the default convention (nothing
    /// changes here: the reconcile asks while Prometheus is asked). `None` when the operator, the
    /// pool or its template does not read workers, or no worker answered.
    pub(super) async fn ask(
        &self,
        pool: &LanePool,
        ctx: &Context,
        workers: &PoolPods<'_>,
    ) -> Option<Answers> {
        let lanes = read_lanes(pool);
        if !ctx.settings.worker_reads
            || lanes.is_empty()
            || !serves_metrics(pool.spec.template.spec.as_ref())
        {
            return None;
        }
        let wall = Timestamp::now();
        let (answers, expected) = ask(pool, workers, self.last.map(|(_, at)| at)).await?;
        Some(Answers {
            answers,
            expected,
            lanes,
            // The read's own time, once its answers are in: what the counts span.
            at: ctx.started.elapsed(),
            wall,
        })
    }

    /// Records, per lane, what the workers finished since the last read, with the lanes' mean
    /// `job_seconds` as measured; returns the answers dropped as implausible (see
    /// [`WorkerCount::implausible`]: a read that needed one is not a rate). Without `answers`
    /// this evaluation has no read, and none is applied.
    pub(super) fn record(
        &mut self,
        answers: Option<Answers>,
        job_seconds: &BTreeMap<String, f64>,
        window: Duration,
    ) -> Vec<Implausible> {
        self.current = None;
        let Some(Answers {
            answers,
            expected,
            lanes,
            at,
            wall,
        }) = answers
        else {
            return Vec::new();
        };
        let mut dropped = Vec::new();
        let plausible: Vec<WorkerCount> = match self.last {
            Some((since, _)) => answers
                .iter()
                .filter(|answer| {
                    let span = at.saturating_sub(since);
                    let Some((lane, claimed, most)) =
                        answer.implausible(&self.baselines, span, job_seconds)
                    else {
                        return true;
                    };
                    dropped.push(Implausible {
                        worker: answer.worker.clone(),
                        lane,
                        claimed,
                        most,
                        first: self.logged.insert(answer.worker.clone()),
                    });
                    false
                })
                .cloned()
                .collect(),
            None => answers.clone(),
        };
        if let (Some((since, _)), Some(finished)) = (
            self.last,
            finished_since(&self.baselines, &plausible, &expected),
        ) {
            for lane in lanes {
                let count = finished.get(&lane).copied().unwrap_or(0.0);
                self.lanes
                    .entry(lane)
                    .or_default()
                    .record(since, at, count, window);
            }
            self.current = Some(at);
        }
        // Every answer is the next read's baseline, a dropped claim too: a worker that jumped
        // once is read again from there; one that keeps inflating is dropped every time.
        self.baselines = baselines(&answers);
        self.logged
            .retain(|w| expected.contains(w) || answers.iter().any(|a| a.worker == *w));
        self.last = Some((at, wall));
        dropped
    }

    /// [`Self::record`] with the lanes' job times from `loads`, each dropped answer counted in
    /// `worker_reads_rejected` and logged once per worker.
    pub(super) fn record_measured(
        &mut self,
        ctx: &Context,
        answers: Option<Answers>,
        loads: &Loads,
    ) {
        let job_seconds: BTreeMap<String, f64> = loads
            .iter()
            .filter_map(|(lane, load)| Some((lane.clone(), load.as_ref().ok()?.job_seconds?)))
            .collect();
        for dropped in self.record(answers, &job_seconds, rate_window(ctx)) {
            ctx.metrics.worker_read_rejected("implausible");
            if dropped.first {
                warn!(
                    pod = %dropped.worker,
                    lane = %dropped.lane,
                    claimed = dropped.claimed,
                    most = dropped.most.floor(),
                    "a worker claims more finished jobs than it could have run since the last \
                     read: its counts are dropped (logged once per Pod)"
                );
            }
        }
    }

    /// Gives each lane the rates this evaluation's read supports (see
    /// [`LaneReads::applied_to`]); without one, every lane keeps Prometheus's.
    pub(super) fn apply_to(&self, loads: &mut Loads, window: Duration) {
        let Some(at) = self.current else {
            return;
        };
        for (lane, reads) in &self.lanes {
            if let Some(Ok(load)) = loads.get_mut(lane) {
                *load = reads.applied_to(*load, at, window);
            }
        }
    }
}

/// Every live worker of the pool asked for its counts: the answers of those that export them,
/// and the names of the ready ones that had to answer; `None` when the workers could not be
/// listed or none answered with counts. A Pod that is not the pool's worker is never asked.
async fn ask(
    pool: &LanePool,
    workers: &PoolPods<'_>,
    last_read: Option<Timestamp>,
) -> Option<(Vec<WorkerCount>, BTreeSet<String>)> {
    let name = pool.name_any();
    // From the API server's cache (resourceVersion 0): a read needs no quorum.
    let params = ListParams::default()
        .labels(&format!("{POOL_LABEL}={name}"))
        .match_any();
    let live: Vec<Pod> = workers
        .workers(&format!("pool {name}"), &params)
        .await
        .map_err(|error| debug!(%error, "workers not read: Prometheus alone"))
        .ok()?
        .into_iter()
        .map(|(pod, _)| pod)
        .collect();
    let expected: BTreeSet<String> = live
        .iter()
        .filter(|p| pod_ready(p))
        .map(|p| p.name_any())
        .collect();
    let started_since: BTreeMap<String, bool> = live
        .iter()
        .map(|pod| {
            let since = started(pod).zip(last_read).is_some_and(|(s, l)| s > l);
            (pod.name_any(), since)
        })
        .collect();
    let lanes = read_lanes(pool);
    let answers: Vec<WorkerCount> = workers
        .metrics_texts(&live.iter().collect::<Vec<_>>())
        .await
        .into_iter()
        .filter_map(|(worker, text)| {
            Some(WorkerCount {
                started_since: started_since.get(&worker).copied().unwrap_or(false),
                finished: finished_counts(&text, &lanes)?,
                worker,
            })
        })
        .collect();
    (!answers.is_empty()).then_some((answers, expected))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_workers_counts_are_read_by_lane_and_a_worker_without_them_says_nothing() {
        let text = "# TYPE lanepool_job_duration_seconds histogram\n\
            lanepool_job_duration_seconds_bucket{lane=\"urgent\",le=\"0.05\"} 40\n\
            lanepool_job_duration_seconds_count{lane=\"urgent\"} 42\n\
            lanepool_job_duration_seconds_sum{lane=\"urgent\"} 0.84\n\
            lanepool_job_duration_seconds_count{lane=\"batch\"} 7\n";
        let lanes = ["urgent".to_string(), "batch".to_string()];
        let counts = finished_counts(text, &lanes).unwrap_or_default();
        assert_eq!(counts.get("urgent"), Some(&42.0));
        assert_eq!(counts.get("batch"), Some(&7.0));
        let declared_no_jobs_yet = "# TYPE lanepool_job_duration_seconds histogram\n";
        assert_eq!(
            finished_counts(declared_no_jobs_yet, &lanes),
            Some(BTreeMap::new())
        );
        assert_eq!(finished_counts("lanepool_worker_busy 1\n", &lanes), None);
    }

    #[test]
    fn only_the_pools_own_lanes_are_kept_of_a_workers_counts() {
        let mut text = String::from("lanepool_job_duration_seconds_count{lane=\"urgent\"} 3\n");
        for i in 0..1000 {
            text.push_str(&format!(
                "lanepool_job_duration_seconds_count{{lane=\"made-up-{i}\"}} 1\n"
            ));
        }
        let counts = finished_counts(&text, &["urgent".to_string()]);
        assert_eq!(counts, Some(BTreeMap::from([("urgent".to_string(), 3.0)])));
    }

    const S: Duration = Duration::from_secs(1);

    fn answers(at: Duration, counts: &[(&str, f64)], expected: &[&str]) -> Option<Answers> {
        Some(Answers {
            answers: counts
                .iter()
                .map(|(worker, urgent)| WorkerCount {
                    worker: worker.to_string(),
                    started_since: false,
                    finished: BTreeMap::from([("urgent".to_string(), *urgent)]),
                })
                .collect(),
            expected: expected.iter().map(|w| w.to_string()).collect(),
            lanes: vec!["urgent".into()],
            at,
            wall: Timestamp::UNIX_EPOCH,
        })
    }

    fn prometheus_says() -> Loads {
        Loads::from([(
            "urgent".to_string(),
            Ok(crate::sizing::LaneLoad {
                arrival_rate: 30.0,
                recent_arrival_rate: None,
                job_seconds: Some(0.02),
            }),
        )])
    }

    fn applied(reads: &WorkerReads) -> Loads {
        let mut loads = prometheus_says();
        reads.apply_to(&mut loads, 60 * S);
        loads
    }

    #[test]
    fn a_failed_read_applies_nothing_and_prometheus_decides() {
        let job = BTreeMap::from([("urgent".to_string(), 0.02)]);
        let mut reads = WorkerReads::default();
        reads.record(answers(5 * S, &[("a", 100.0)], &["a"]), &job, 60 * S);
        assert_eq!(
            applied(&reads),
            prometheus_says(),
            "a first read sets baselines"
        );
        reads.record(answers(10 * S, &[("a", 850.0)], &["a"]), &job, 60 * S);
        let fresh = applied(&reads);
        let recent = |loads: &Loads| {
            loads["urgent"]
                .as_ref()
                .ok()
                .and_then(|l| l.recent_arrival_rate)
                .map(|r| r.per_second)
        };
        assert_eq!(recent(&fresh), Some(150.0), "750 jobs in 5 s");
        // The Pod list failed, or no worker answered: the read at 10 s is not this one.
        reads.record(None, &job, 60 * S);
        assert_eq!(applied(&reads), prometheus_says());
        // A read that misses a ready worker, by name, is no rate either.
        reads.record(answers(20 * S, &[("a", 2000.0)], &["a", "b"]), &job, 60 * S);
        assert_eq!(applied(&reads), prometheus_says());
        // b answers for the first time, running before: a baseline only, still no rate.
        reads.record(
            answers(25 * S, &[("a", 2100.0), ("b", 0.0)], &["a", "b"]),
            &job,
            60 * S,
        );
        assert_eq!(applied(&reads), prometheus_says());
        // The next complete read is current again: a's 100 and b's 5 in 5 s.
        reads.record(
            answers(30 * S, &[("a", 2200.0), ("b", 5.0)], &["a", "b"]),
            &job,
            60 * S,
        );
        assert_eq!(recent(&applied(&reads)), Some(21.0));
    }

    #[test]
    fn an_implausible_claim_is_dropped_and_logged_once() {
        let job = BTreeMap::from([("urgent".to_string(), 0.02)]);
        let mut reads = WorkerReads::default();
        let both = ["a", "liar"];
        reads.record(
            answers(5 * S, &[("a", 0.0), ("liar", 0.0)], &both),
            &job,
            60 * S,
        );
        let dropped = reads.record(
            answers(10 * S, &[("a", 150.0), ("liar", 1e6)], &both),
            &job,
            60 * S,
        );
        assert_eq!(dropped.len(), 1);
        assert_eq!(
            (dropped[0].worker.as_str(), dropped[0].first),
            ("liar", true)
        );
        assert_eq!(dropped[0].most, 2501.0);
        assert_eq!(
            applied(&reads),
            prometheus_says(),
            "the liar is a ready worker: no rate"
        );
        let again = reads.record(
            answers(15 * S, &[("a", 300.0), ("liar", 2e6)], &both),
            &job,
            60 * S,
        );
        assert_eq!(again.len(), 1);
        assert!(!again[0].first, "logged once");
        // A liar that is not a ready worker (not needed for the read): the rest is a rate.
        let only_a = ["a"];
        let third = reads.record(
            answers(20 * S, &[("a", 450.0), ("liar", 3e6)], &only_a),
            &job,
            60 * S,
        );
        assert_eq!(third.len(), 1);
        let loads = applied(&reads);
        let recent = loads["urgent"]
            .as_ref()
            .ok()
            .and_then(|l| l.recent_arrival_rate);
        assert_eq!(
            recent.map(|r| r.per_second),
            Some(30.0),
            "a's 150 in 5 s only"
        );
    }

    #[test]
    fn only_a_template_with_a_metrics_port_is_read() {
        let spec = |port: &str| -> PodSpec {
            serde_json::from_value(serde_json::json!({
                "containers": [{"name": "w", "ports": [{"name": port, "containerPort": 9100}]}]
            }))
            .unwrap_or_default()
        };
        assert!(serves_metrics(Some(&spec("metrics"))));
        assert!(!serves_metrics(Some(&spec("http"))));
        assert!(!serves_metrics(None));
    }
}
