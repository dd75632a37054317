//! Idle workers go first: just before a Deployment shrinks, its Pods get the annotation
//! `controller.kubernetes.io/pod-deletion-cost` from whether each is running a job (the workers'
//! `lanepool_worker_busy` gauge, by `pod`, in the pool's Prometheus), so the ReplicaSet controller
//! removes idle workers before busy ones. Only Pods of a Deployment about to shrink are read or
//! written, and only those whose cost changes; a failure here never holds a shrink back.

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
/// A worker running a job.
pub const BUSY_COST: i32 = 1000;
/// A worker waiting for a job, or one Prometheus does not know yet (just started, not scraped).
pub const IDLE_COST: i32 = 0;

/// Most Pod patches in flight at once for one Deployment.
const PATCHES_IN_FLIGHT: usize = 8;

/// Whether the worker is busy, by pod name, from the gauge's answer (labels, value). A series
/// without a `pod` label, or a value that is not finite, says nothing.
pub fn busy_pods(answer: &[(BTreeMap<String, String>, f64)]) -> HashMap<String, bool> {
    answer
        .iter()
        .filter(|(_, value)| value.is_finite())
        .filter_map(|(labels, value)| Some((labels.get("pod")?.clone(), *value > 0.0)))
        .collect()
}

/// The Pods whose annotation must change, with their new cost: busy workers cost
/// [`BUSY_COST`], every other [`IDLE_COST`]. `pods` are (name, the annotation now).
pub fn cost_changes(
    pods: &[(String, Option<String>)],
    busy: &HashMap<String, bool>,
) -> Vec<(String, i32)> {
    pods.iter()
        .filter_map(|(name, now)| {
            let cost = if busy.get(name).copied().unwrap_or(false) {
                BUSY_COST
            } else {
                IDLE_COST
            };
            let unchanged = now.as_deref().and_then(|v| v.parse::<i32>().ok()) == Some(cost)
                || (now.is_none() && cost == IDLE_COST);
            (!unchanged).then(|| (name.clone(), cost))
        })
        .collect()
}

/// The PromQL for a pool's busy gauges, by pod.
pub fn busy_query(namespace: &str, pool: &str) -> String {
    format!(
        "max by (pod) ({BUSY_METRIC}{{namespace={:?},pool={:?}}})",
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
    let busy = busy_pods(&answer);
    let changes = cost_changes(&live, &busy);
    let busy_count = live
        .iter()
        .filter(|(name, _)| busy.get(name).copied().unwrap_or(false))
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

    fn series(pod: &str, value: f64) -> (BTreeMap<String, String>, f64) {
        (
            BTreeMap::from([("pod".to_string(), pod.to_string())]),
            value,
        )
    }

    #[test]
    fn busy_workers_cost_more_and_only_changed_costs_are_written() {
        let busy = busy_pods(&[
            series("a", 1.0),
            series("b", 0.0),
            series("c", f64::NAN),
            (BTreeMap::new(), 1.0),
        ]);
        assert_eq!(busy.get("a"), Some(&true));
        assert_eq!(busy.get("b"), Some(&false));
        assert_eq!(busy.get("c"), None, "NaN says nothing");
        let pods = [
            ("a".to_string(), None),                        // busy, unmarked: write
            ("b".to_string(), Some(BUSY_COST.to_string())), // idle now: lower it
            ("c".to_string(), None),                        // unknown, unmarked: leave
            ("d".to_string(), Some(BUSY_COST.to_string())), // gone from Prometheus: idle
            ("e".to_string(), Some("0".to_string())),       // idle and marked so: leave
        ];
        let mut busy = busy;
        busy.insert("e".into(), false);
        assert_eq!(
            cost_changes(&pods, &busy),
            vec![
                ("a".to_string(), BUSY_COST),
                ("b".to_string(), IDLE_COST),
                ("d".to_string(), IDLE_COST)
            ]
        );
    }

    #[test]
    fn the_busy_query_names_the_pool_and_groups_by_pod() {
        assert_eq!(
            busy_query("team", "jobs"),
            r#"max by (pod) (lanepool_worker_busy{namespace="team",pool="jobs"})"#
        );
    }
}
