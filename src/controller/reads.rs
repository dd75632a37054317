//! Reading the workers' own finished-job counts (`lanepool_job_duration_seconds_count`, by lane)
//! at their port named `metrics`, each time a pool is measured, so the reserve follows a rate
//! seconds old instead of a scrape interval plus a scrape's age. Only for pools whose template
//! has that port, and only for lanes on the metric convention's default query; a read that
//! cannot count every ready worker changes nothing, and Prometheus decides as before.

use std::collections::BTreeMap;
use std::time::Duration;

use k8s_openapi::api::core::v1::{Pod, PodSpec};
use k8s_openapi::jiff::Timestamp;
use kube::ResourceExt;
use kube::api::ListParams;
use tracing::debug;

use super::context::Context;
use super::drain::pod_ready;
use super::idle_first::{METRICS_PORT, live_pods_listed, metrics_texts, sample_lines};
use super::measure::Loads;
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

/// The finished-job counts per lane in a worker's `/metrics` text; `None` when it exports none
/// (a worker that leaves counting to its queue), so that it is never read as zero.
pub fn finished_counts(text: &str) -> Option<BTreeMap<String, f64>> {
    let mut counts: BTreeMap<String, f64> = BTreeMap::new();
    let mut exported = text
        .lines()
        .any(|l| l.starts_with("# TYPE lanepool_job_duration_seconds "));
    for (name, labels, value) in sample_lines(text) {
        if name != FINISHED_METRIC || !value.is_finite() || value < 0.0 {
            continue;
        }
        exported = true;
        if let Some(lane) = labels.get("lane") {
            *counts.entry(lane.clone()).or_default() += value;
        }
    }
    exported.then_some(counts)
}

impl WorkerReads {
    /// Reads the pool's workers and records, per lane on the default convention, what they
    /// finished since the last read. Does nothing when the operator, the pool or its template
    /// does not read workers.
    pub(super) async fn read(&mut self, pool: &LanePool, ctx: &Context) {
        let lanes = read_lanes(pool);
        if !ctx.settings.worker_reads
            || lanes.is_empty()
            || !serves_metrics(pool.spec.template.spec.as_ref())
        {
            return;
        }
        let wall = Timestamp::now();
        let Some((answers, expected)) = ask(pool, ctx, self.last.map(|(_, at)| at)).await else {
            return;
        };
        // The read's own time, once its answers are in: what the counts span.
        let at = ctx.started.elapsed();
        if let (Some((since, _)), Some(finished)) = (
            self.last,
            finished_since(&self.baselines, &answers, expected),
        ) {
            let window = rate_window(ctx);
            for lane in lanes {
                let count = finished.get(&lane).copied().unwrap_or(0.0);
                self.lanes
                    .entry(lane)
                    .or_default()
                    .record(since, at, count, window);
            }
        }
        self.baselines = baselines(&answers);
        self.last = Some((at, wall));
    }

    /// Gives each lane the rates the reads support as of the last read (see
    /// [`LaneReads::applied_to`]); a lane not read at that read keeps Prometheus's.
    pub(super) fn apply_to(&self, loads: &mut Loads, window: Duration) {
        let Some((at, _)) = self.last else {
            return;
        };
        for (lane, reads) in &self.lanes {
            if let Some(Ok(load)) = loads.get_mut(lane) {
                *load = reads.applied_to(*load, at, window);
            }
        }
    }
}

/// Every live Pod of the pool asked for its counts: the answers of those that export them, and
/// how many ready ones had to answer; `None` when the Pods could not be listed or none answered
/// with counts.
async fn ask(
    pool: &LanePool,
    ctx: &Context,
    last_read: Option<Timestamp>,
) -> Option<(Vec<WorkerCount>, usize)> {
    let namespace = pool.namespace().unwrap_or_default();
    let name = pool.name_any();
    // From the API server's cache (resourceVersion 0): a read needs no quorum.
    let params = ListParams::default()
        .labels(&format!("{POOL_LABEL}={name}"))
        .match_any();
    let live = live_pods_listed(ctx, &namespace, &format!("pool {name}"), &params)
        .await
        .map_err(|error| debug!(%error, "workers not read: Prometheus alone"))
        .ok()?;
    let expected = live.iter().filter(|p| pod_ready(p)).count();
    let started_since: BTreeMap<String, bool> = live
        .iter()
        .map(|pod| {
            let since = started(pod).zip(last_read).is_some_and(|(s, l)| s > l);
            (pod.name_any(), since)
        })
        .collect();
    let answers: Vec<WorkerCount> = metrics_texts(&live.iter().collect::<Vec<_>>())
        .await
        .into_iter()
        .filter_map(|(worker, text)| {
            Some(WorkerCount {
                started_since: started_since.get(&worker).copied().unwrap_or(false),
                finished: finished_counts(&text)?,
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
        let counts = finished_counts(text).unwrap_or_default();
        assert_eq!(counts.get("urgent"), Some(&42.0));
        assert_eq!(counts.get("batch"), Some(&7.0));
        let declared_no_jobs_yet = "# TYPE lanepool_job_duration_seconds histogram\n";
        assert_eq!(finished_counts(declared_no_jobs_yet), Some(BTreeMap::new()));
        assert_eq!(finished_counts("lanepool_worker_busy 1\n"), None);
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
