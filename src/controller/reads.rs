//! Reading the workers' own finished-job counts (`lanepool_job_duration_seconds_count`, by lane)
//! at their port named `metrics`, each time a pool is measured, so the reserve follows a rate
//! seconds old instead of a scrape interval plus a scrape's age. Only for pools whose template
//! has that port, and only for lanes on the metric convention's default query; a read that
//! cannot count every ready worker changes nothing, and Prometheus decides as before.

use std::collections::BTreeMap;
use std::time::Duration;

use futures::StreamExt;
use k8s_openapi::api::core::v1::{Pod, PodSpec};
use k8s_openapi::jiff::Timestamp;
use kube::ResourceExt;
use kube::api::{Api, ListParams};
use tracing::debug;

use super::context::Context;
use super::idle_first::{METRICS_PORT, metrics_address, sample_lines, workers_http};
use super::measure::Loads;
use crate::api::{LanePool, POOL_LABEL};
use crate::sizing::{Baselines, LaneReads, WorkerCount, baselines, finished_since};

/// The finished-job counter the reads sum: a histogram's `_count`, by `lane`.
pub const FINISHED_METRIC: &str = "lanepool_job_duration_seconds_count";

/// How many workers are asked at once.
const ASKS_IN_FLIGHT: usize = 32;

/// What a pool remembers of its reads between evaluations.
#[derive(Clone, Debug, Default, PartialEq)]
pub(super) struct WorkerReads {
    baselines: Baselines,
    /// When the last read was made: on the operator's clock and the wall clock (Pods' start
    /// times are wall-clock times).
    last: Option<(Duration, Timestamp)>,
    lanes: BTreeMap<String, LaneReads>,
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

fn ready(pod: &Pod) -> bool {
    pod.status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .is_some_and(|c| c.iter().any(|c| c.type_ == "Ready" && c.status == "True"))
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
    let mut exported = text.lines().any(|l| {
        l.strip_prefix("# TYPE lanepool_job_duration_seconds ")
            .is_some()
    });
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

/// Reads the pool's workers, records what they finished since the last read, and gives each
/// lane measured through the default convention the rates the reads now support.
pub(super) async fn apply_worker_reads(
    pool: &LanePool,
    ctx: &Context,
    memory: &mut WorkerReads,
    loads: &mut Loads,
    now: Duration,
) {
    let lanes: Vec<String> = pool
        .spec
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
        .collect();
    if !ctx.settings.worker_reads
        || lanes.is_empty()
        || !serves_metrics(pool.spec.template.spec.as_ref())
    {
        return;
    }
    let window = crate::duration::parse(&ctx.settings.windows.arrival_rate)
        .unwrap_or(Duration::from_secs(60));
    let wall = Timestamp::now();
    let Some((answers, expected)) = read(pool, ctx, memory.last.map(|(_, at)| at)).await else {
        return;
    };
    if let (Some((since, _)), Some(finished)) = (
        memory.last,
        finished_since(&memory.baselines, &answers, expected),
    ) {
        for lane in &lanes {
            let count = finished.get(lane).copied().unwrap_or(0.0);
            memory
                .lanes
                .entry(lane.clone())
                .or_default()
                .record(since, now, count, window);
        }
    }
    memory.baselines = baselines(&answers);
    memory.last = Some((now, wall));
    for lane in &lanes {
        if let (Some(reads), Some(Ok(load))) = (memory.lanes.get(lane), loads.get_mut(lane)) {
            *load = reads.applied_to(*load, now, window);
        }
    }
}

/// Every live Pod of the pool asked for its counts: the answers of those that export them, and
/// how many ready ones had to answer; `None` when the Pods could not be listed or none answered
/// with counts.
async fn read(
    pool: &LanePool,
    ctx: &Context,
    last_read: Option<Timestamp>,
) -> Option<(Vec<WorkerCount>, usize)> {
    let http = workers_http()?;
    let namespace = pool.namespace().unwrap_or_default();
    let name = pool.name_any();
    let pods: Api<Pod> = Api::namespaced(ctx.client.clone(), &namespace);
    // From the API server's cache (resourceVersion 0): a read needs no quorum.
    let params = ListParams::default()
        .labels(&format!("{POOL_LABEL}={name}"))
        .match_any();
    let listed = ctx
        .read(
            format!("listing the Pods of pool {name}"),
            pods.list(&params),
        )
        .await
        .map_err(|error| debug!(%error, "workers not read: Prometheus alone"))
        .ok()?;
    let live: Vec<&Pod> = listed
        .items
        .iter()
        .filter(|p| p.metadata.deletion_timestamp.is_none())
        .collect();
    let expected = live.iter().filter(|p| ready(p)).count();
    let targets: Vec<(String, String, bool)> = live
        .iter()
        .filter_map(|pod| {
            let started_since = match (started(pod), last_read) {
                (Some(started), Some(last)) => started > last,
                _ => false,
            };
            Some((pod.name_any(), metrics_address(pod)?, started_since))
        })
        .collect();
    let answers: Vec<WorkerCount> = futures::stream::iter(targets)
        .map(|(worker, address, started_since)| async move {
            let text = async {
                http.get(format!("http://{address}/metrics"))
                    .send()
                    .await?
                    .error_for_status()?
                    .text()
                    .await
            }
            .await
            .map_err(|error| debug!(pod = %worker, %error, "worker not read"))
            .ok()?;
            Some(WorkerCount {
                worker,
                started_since,
                finished: finished_counts(&text)?,
            })
        })
        .buffer_unordered(ASKS_IN_FLIGHT)
        .filter_map(std::future::ready)
        .collect()
        .await;
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
