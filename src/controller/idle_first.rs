//! Idle workers go first: just before a Deployment shrinks, its Pods get the annotation
//! `controller.kubernetes.io/pod-deletion-cost` from whether each is running a job (the workers'
//! `lanepool_worker_busy` gauge, by `pod` and the `lane` of the job in hand, in the pool's
//! Prometheus), so the ReplicaSet controller removes idle workers first, then those on the
//! lanes with the shortest jobs. Only Pods of a Deployment about to shrink are read or written,
//! and only those whose cost changes; a failure here never holds a shrink back.

use std::collections::{BTreeMap, HashMap};

use futures::StreamExt;
use k8s_openapi::api::core::v1::Pod;
use kube::ResourceExt;
use kube::api::{Api, ListParams, Patch, PatchParams};
use tracing::{debug, info, warn};

use super::context::Context;
use crate::api::LanePool;
use crate::prometheus::Connection;

/// The annotation the ReplicaSet controller reads: of two Pods otherwise alike (both running
/// and ready), the one with the lower cost is deleted first.
pub const DELETION_COST: &str = "controller.kubernetes.io/pod-deletion-cost";
/// The gauge a worker sets to 1 while it runs a job and to 0 while it waits for one.
pub const BUSY_METRIC: &str = "lanepool_worker_busy";
/// A worker running a job of a lane whose job time is not known (or that names no lane); one
/// on a lane with a measured mean job time costs 1 + that time in milliseconds instead.
pub const BUSY_COST: i32 = 1000;
/// The highest cost: a lane's jobs of 11 days and more all cost the same.
const MAX_COST: i32 = 1_000_000_000;
/// A worker waiting for a job, or one Prometheus does not know yet (just started, not scraped).
pub const IDLE_COST: i32 = 0;

/// Most Pod patches in flight at once for one Deployment.
const PATCHES_IN_FLIGHT: usize = 8;

/// What a worker reports: idle, or busy with a job of a lane (`None`: it names none).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Work {
    Idle,
    Busy { lane: Option<String> },
}

/// Each worker's work, by pod name, from the gauge's answer (labels, value). A series without
/// a `pod` label, or a value that is not finite, says nothing; of two series of one pod (the
/// lane changed between scrapes), a busy one wins.
pub fn busy_pods(answer: &[(BTreeMap<String, String>, f64)]) -> HashMap<String, Work> {
    let mut work: HashMap<String, Work> = HashMap::new();
    for (labels, value) in answer.iter().filter(|(_, value)| value.is_finite()) {
        let Some(pod) = labels.get("pod") else {
            continue;
        };
        let this = if *value > 0.0 {
            Work::Busy {
                lane: labels.get("lane").filter(|l| !l.is_empty()).cloned(),
            }
        } else {
            Work::Idle
        };
        if this != Work::Idle || !work.contains_key(pod) {
            work.insert(pod.clone(), this);
        }
    }
    work
}

/// A worker's deletion cost: [`IDLE_COST`] idle or unknown; busy, 1 + the mean job time of its
/// lane in milliseconds (so a worker 20 ms from done goes before one on a 3 s job), or
/// [`BUSY_COST`] when that time is not known.
pub fn cost(work: Option<&Work>, job_seconds: &BTreeMap<String, f64>) -> i32 {
    match work {
        None | Some(Work::Idle) => IDLE_COST,
        Some(Work::Busy { lane }) => lane
            .as_ref()
            .and_then(|lane| job_seconds.get(lane))
            .filter(|s| s.is_finite() && **s >= 0.0)
            .map_or(BUSY_COST, |seconds| {
                (1.0 + seconds * 1000.0).min(f64::from(MAX_COST)) as i32
            }),
    }
}

/// The Pods whose annotation must change, with their new cost (see [`cost`]). `pods` are
/// (name, the annotation now).
pub fn cost_changes(
    pods: &[(String, Option<String>)],
    work: &HashMap<String, Work>,
    job_seconds: &BTreeMap<String, f64>,
) -> Vec<(String, i32)> {
    pods.iter()
        .filter_map(|(name, now)| {
            let cost = cost(work.get(name), job_seconds);
            let unchanged = now.as_deref().and_then(|v| v.parse::<i32>().ok()) == Some(cost)
                || (now.is_none() && cost == IDLE_COST);
            (!unchanged).then(|| (name.clone(), cost))
        })
        .collect()
}

/// The PromQL for a pool's busy gauges, by pod and lane.
pub fn busy_query(namespace: &str, pool: &str) -> String {
    format!(
        "max by (pod, lane) ({BUSY_METRIC}{{namespace={:?},pool={:?}}})",
        namespace, pool
    )
}

/// Ranks the Pods selected by `selector` (one Deployment's) for deletion. Logs and gives up on
/// any failure: the shrink goes ahead either way, as it would without this step.
pub(super) async fn rank_before_shrink(
    pool: &LanePool,
    ctx: &Context,
    connection: Option<&Connection>,
    deployment: &str,
    selector: &str,
) {
    let started = std::time::Instant::now();
    let namespace = pool.namespace().unwrap_or_default();
    let Some(connection) = connection else {
        debug!(deployment, "no Prometheus connection yet: Pods not ranked");
        return;
    };
    let pods: Api<Pod> = Api::namespaced(ctx.client.clone(), &namespace);
    let listed = ctx
        .read(
            format!("listing the Pods of Deployment {deployment}"),
            pods.list_metadata(&ListParams::default().labels(selector)),
        )
        .await;
    let listed = match listed {
        Ok(list) => list.items,
        Err(error) => {
            warn!(deployment, %error, "Pods not ranked before the shrink");
            return;
        }
    };
    let live: Vec<(String, Option<String>)> = listed
        .iter()
        .filter(|p| p.metadata.deletion_timestamp.is_none())
        .map(|p| (p.name_any(), p.annotations().get(DELETION_COST).cloned()))
        .collect();
    if live.is_empty() {
        return;
    }
    let client = match ctx.prometheus.get(connection) {
        Ok(client) => client,
        Err(error) => {
            warn!(deployment, %error, "Pods not ranked before the shrink");
            return;
        }
    };
    let answer = match client
        .query_labelled(&busy_query(&namespace, &pool.name_any()))
        .await
    {
        Ok(answer) => answer,
        Err(error) => {
            warn!(deployment, %error, "Pods not ranked before the shrink");
            return;
        }
    };
    let work = busy_pods(&answer);
    // Every lane's mean job time, from the shared job-time query the reserve lanes already ask.
    let job_seconds =
        super::grace::served_job_seconds(pool, ctx, Some(connection), &Default::default()).await;
    let changes = cost_changes(&live, &work, &job_seconds);
    let busy_count = live
        .iter()
        .filter(|(name, _)| matches!(work.get(name), Some(Work::Busy { .. })))
        .count();
    let params = PatchParams::default();
    let patched = futures::stream::iter(changes)
        .map(|(name, cost)| {
            let pods = pods.clone();
            let params = params.clone();
            async move {
                // A merge patch of one annotation: a Pod is the ReplicaSet's, not ours to apply.
                let patch = serde_json::json!({
                    "metadata": {"annotations": {DELETION_COST: cost.to_string()}},
                });
                let result = ctx
                    .write(
                        format!("annotating Pod {name}"),
                        pods.patch_metadata(&name, &params, &Patch::Merge(&patch)),
                    )
                    .await;
                if let Err(error) = result {
                    warn!(pod = %name, %error, "deletion cost not set");
                }
            }
        })
        .buffer_unordered(PATCHES_IN_FLIGHT)
        .count()
        .await;
    info!(
        deployment,
        pods = live.len(),
        busy = busy_count,
        patched,
        ms = started.elapsed().as_millis() as u64,
        "Pods ranked before the shrink: idle workers go first"
    );
}

#[cfg(test)]
mod tests {
    use super::*;

    fn series(pod: &str, lane: &str, value: f64) -> (BTreeMap<String, String>, f64) {
        let mut labels = BTreeMap::from([("pod".to_string(), pod.to_string())]);
        if !lane.is_empty() {
            labels.insert("lane".into(), lane.into());
        }
        (labels, value)
    }

    #[test]
    fn idle_workers_cost_least_and_busy_ones_by_their_lanes_job_time() {
        let work = busy_pods(&[
            series("batch", "batch", 1.0),
            series("urgent", "urgent", 1.0),
            series("nameless", "", 1.0),
            series("idle", "", 0.0),
            series("nan", "", f64::NAN),
            // The lane changed between scrapes: the busy series wins.
            series("moved", "", 0.0),
            series("moved", "batch", 1.0),
        ]);
        assert_eq!(work.get("nan"), None, "NaN says nothing");
        let times = BTreeMap::from([("urgent".to_string(), 0.02), ("batch".to_string(), 3.0)]);
        let cost_of = |pod: &str| cost(work.get(pod), &times);
        assert_eq!(cost_of("idle"), IDLE_COST);
        assert_eq!(cost_of("nan"), IDLE_COST);
        assert_eq!(cost_of("urgent"), 21);
        assert_eq!(cost_of("batch"), 3001);
        assert_eq!(cost_of("moved"), 3001);
        assert_eq!(cost_of("nameless"), BUSY_COST);
        assert!(IDLE_COST < cost_of("urgent") && cost_of("urgent") < cost_of("batch"));
    }

    #[test]
    fn only_changed_costs_are_written() {
        let work = busy_pods(&[
            series("a", "", 1.0),
            series("b", "", 0.0),
            series("e", "", 0.0),
        ]);
        let pods = [
            ("a".to_string(), None),                        // busy, unmarked: write
            ("b".to_string(), Some(BUSY_COST.to_string())), // idle now: lower it
            ("c".to_string(), None),                        // unknown, unmarked: leave
            ("d".to_string(), Some(BUSY_COST.to_string())), // gone from Prometheus: idle
            ("e".to_string(), Some("0".to_string())),       // idle and marked so: leave
        ];
        assert_eq!(
            cost_changes(&pods, &work, &BTreeMap::new()),
            vec![
                ("a".to_string(), BUSY_COST),
                ("b".to_string(), IDLE_COST),
                ("d".to_string(), IDLE_COST)
            ]
        );
    }

    #[test]
    fn the_busy_query_names_the_pool_and_groups_by_pod_and_lane() {
        assert_eq!(
            busy_query("team", "jobs"),
            r#"max by (pod, lane) (lanepool_worker_busy{namespace="team",pool="jobs"})"#
        );
    }
}
