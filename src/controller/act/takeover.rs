//! Template changes, the asking: the new workers of a Deployment whose template serves a
//! `metrics` port wait behind their readiness gate (`lanepool.dev/takeover`) until the operator
//! sets it. A Deployment with no worker of an older template left (it only grows) has its
//! waiting gates opened at once; in a rollover, the old workers are drained as a shrink of them
//! by as many as wait (`act/drain.rs`), and a gate opens for each drained worker known idle and
//! marked to go first. Which gates open: `rollout/takeover.rs`.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use tracing::info;

use super::drain::drain_among;
use super::requests::PodPart;
use crate::controller::deployments::pool_roles;
use crate::controller::observe::work::Observed;
use crate::controller::pods::{PoolPods, Worker};
use crate::controller::protocol::TAKEOVER_CONDITION;
use crate::controller::rollout::drain::Drain;
use crate::controller::rollout::{lanes_of, takeover};
use crate::sizing::Replicas;

/// Why a gate opened, as its condition's reason.
const GROWS: &str = "NoOlderWorker";
const REPLACES: &str = "OlderWorkerDrained";

/// Opens the gates the pool's waiting workers may pass now, and advances the drains of the
/// rollovers (`rollovers`, by Deployment) that decide them. `drain`: whether the operator
/// drains (otherwise every gate opens at once, and the Deployment controller stops old workers
/// as ranked). A Deployment with a shrink's drain under way (`shrinking`) waits for it: the two
/// would mark each other's workers.
pub(in crate::controller) async fn open_gates(
    seen: &Observed<'_>,
    rollovers: &mut BTreeMap<String, Drain>,
    shrinking: &BTreeSet<String>,
    drain: bool,
    now: Duration,
) {
    let (pool, pods) = (seen.pool, seen.pods);
    let deployments: BTreeSet<String> = pods
        .workers()
        .iter()
        .map(|w| w.deployment.clone())
        .collect();
    rollovers.retain(|d, _| deployments.contains(d));
    let roles = pool_roles(pool, &Replicas::default());
    let mut open: Vec<(String, &'static str)> = Vec::new();
    for deployment in deployments {
        let workers = pods.workers_of(&deployment);
        let waiting: Vec<&Worker> = workers
            .iter()
            .filter(|w| w.newest && w.awaiting_takeover && w.containers_ready)
            .copied()
            .collect();
        let old: Vec<&Worker> = workers.iter().filter(|w| !w.newest).copied().collect();
        if old.is_empty() {
            rollovers.remove(&deployment);
        }
        if waiting.is_empty() || shrinking.contains(&deployment) {
            continue;
        }
        if old.is_empty() || !drain {
            open.extend(waiting.iter().map(|w| (w.name.clone(), GROWS)));
            continue;
        }
        let lanes = roles
            .iter()
            .find(|(name, _, _)| *name == deployment)
            .map(|(_, role, _)| lanes_of(pool, role))
            .unwrap_or_else(|| pool.spec.lanes.iter().map(|l| l.name.clone()).collect());
        let rollover = takeover::rollover(&deployment, old.len(), waiting.len(), lanes);
        let drain = rollovers.entry(deployment.clone()).or_default();
        drain.rollover = true;
        drain_among(seen, drain, &rollover, None, &old, now).await;
        let n = takeover::gates_to_open(&rollover, drain, waiting.len(), now);
        if n > 0 {
            info!(
                deployment = %deployment,
                gates = n,
                old = old.len(),
                "rollover: drained workers of the old template are idle; as many new ones take \
                 their place"
            );
        }
        open.extend(waiting.iter().take(n).map(|w| (w.name.clone(), REPLACES)));
    }
    pods.set_takeovers(open).await;
}

impl PoolPods<'_> {
    /// Sets each named Pod's condition [`TAKEOVER_CONDITION`] to True, with its reason (only
    /// that condition of its status). A failure is logged: the next reconcile tries again.
    async fn set_takeovers(&self, open: Vec<(String, &'static str)>) {
        let now = k8s_openapi::jiff::Timestamp::now().to_string();
        let patches = open
            .into_iter()
            .map(|(name, reason)| {
                let patch = serde_json::json!({"status": {"conditions": [{
                    "type": TAKEOVER_CONDITION, "status": "True", "reason": reason,
                    "lastTransitionTime": now,
                }]}});
                (name, patch)
            })
            .collect();
        let (doing, failed) = ("opening the readiness gate of", "readiness gate not opened");
        self.patch_each(patches, PodPart::Status, doing, failed)
            .await;
    }
}
