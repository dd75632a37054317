//! Reading the workers' own finished-job counts (`lanepool_job_duration_seconds_count`, by lane)
//! at their port named `metrics`, each time a pool is measured, so the reserve follows a rate
//! seconds old instead of a scrape interval plus a scrape's age. Only for pools whose template
//! has that port, and only for lanes on the metric convention's default query; a read that
//! cannot count every worker is no rate (the last one that was stands in for a scrape interval,
//! then Prometheus decides). What is remembered of the reads is `state/worker_reads.rs`.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use k8s_openapi::jiff::Timestamp;
use tracing::warn;

use crate::api::LanePool;
use crate::controller::context::Context;
use crate::controller::deployments::serves_metrics;
use crate::controller::pods::PoolPods;
use crate::controller::pods::worker_counts;
use crate::controller::state::worker_reads::{CountsRead, WorkerReads};
use crate::sizing::{Loads, WorkerCount};

/// The long window the reads' rate is counted over: the operator's `--rate-window`.
pub(in crate::controller) fn rate_window(ctx: &Context) -> Duration {
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

/// Asks the pool's workers for their counts of the lanes on the default convention (nothing
/// is recorded here: the reconcile asks while Prometheus is asked). `None` when the operator,
/// the pool or its template does not read workers, the workers could not be listed, or none
/// answered with counts. A Pod that is not the pool's worker is never asked.
pub(in crate::controller) async fn ask(
    reads: &WorkerReads,
    pool: &LanePool,
    ctx: &Context,
    workers: &PoolPods<'_>,
) -> Option<CountsRead> {
    let lanes = read_lanes(pool);
    if !ctx.settings.worker_reads
        || lanes.is_empty()
        || !serves_metrics(pool.spec.template.spec.as_ref())
    {
        return None;
    }
    let wall = Timestamp::now();
    let last_asked = reads.last_asked();
    let live = workers.workers();
    let expected: BTreeSet<String> = live
        .iter()
        .filter(|w| w.ready)
        .map(|w| w.name.clone())
        .collect();
    let started_since: BTreeMap<&str, bool> = live
        .iter()
        .map(|w| {
            let since = w.started.zip(last_asked).is_some_and(|(s, l)| s > l);
            (w.name.as_str(), since)
        })
        .collect();
    let mut counted_at = Vec::new();
    let answers: Vec<WorkerCount> = workers
        .metrics_texts(&live.iter().collect::<Vec<_>>())
        .await
        .into_iter()
        .filter_map(|(worker, answered)| {
            let counts = worker_counts(&answered.text, &lanes)?;
            counted_at.push(answered.at);
            Some(WorkerCount {
                started_since: started_since.get(worker.as_str()).copied().unwrap_or(false),
                worker,
                ..counts
            })
        })
        .collect();
    (!answers.is_empty()).then(|| CountsRead {
        answers,
        expected,
        lanes,
        at: read_time(&counted_at),
        wall,
    })
}

/// The read's own time, what its counts span to: the mean of the moments the workers counted
/// them (each halfway between its request and its answer). Not the moment the last answer was
/// in: under load a request waits for a slot and an answer for the operator, by up to the Pod
/// budget, and a 5 s read timed 0.5 s late says a rate 10 % low (the scale benchmark saw
/// recent rates 20 % off on a steady load, and statuses rewritten for it).
fn read_time(counted_at: &[Duration]) -> Duration {
    let total: Duration = counted_at.iter().sum();
    total / u32::try_from(counted_at.len().max(1)).unwrap_or(u32::MAX)
}

/// Records this evaluation's read (see [`WorkerReads::record`]) with the lanes' job times from
/// `loads`, each answer dropped as implausible counted in `worker_reads_rejected` and logged
/// once per worker.
pub(in crate::controller) fn record(
    ctx: &Context,
    reads: &mut WorkerReads,
    answers: Option<CountsRead>,
    loads: &Loads,
) {
    let job_seconds: BTreeMap<String, f64> = loads
        .iter()
        .filter_map(|(lane, load)| Some((lane.clone(), load.as_ref().ok()?.job_seconds?)))
        .collect();
    for dropped in reads.record(answers, &job_seconds, rate_window(ctx)) {
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

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::PodSpec;

    #[test]
    fn a_read_is_timed_by_when_its_workers_counted() {
        let s = Duration::from_secs;
        assert_eq!(read_time(&[s(10), s(11), s(12)]), s(11));
        assert_eq!(read_time(&[s(7)]), s(7));
        assert_eq!(read_time(&[]), Duration::ZERO);
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
