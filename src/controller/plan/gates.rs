//! Template changes, planned: the new workers of a Deployment whose template serves a `metrics`
//! port wait behind their readiness gate (`lanepool.dev/takeover`) until the operator sets it. A
//! Deployment with no worker of an older template left (it only grows) has its waiting gates
//! opened at once; in a rollover, the old workers are drained as a shrink of them by as many as
//! wait (`drains.rs`), and a gate opens for each drained worker known idle whose mark to go first
//! the Pod cache shows. Which gates open: `rollout/takeover.rs`.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use tracing::info;

use super::drains::{Among, drain_among};
use super::effects::{Effects, Records};
use super::seen::Seen;
use crate::controller::deployments::pool_roles;
use crate::controller::rollout::drain::Drain;
use crate::controller::rollout::{lanes_of, takeover};
use crate::controller::worker::Worker;
use crate::sizing::Replicas;

/// Why a gate opened, as its condition's reason.
const GROWS: &str = "NoOlderWorker";
const REPLACES: &str = "OlderWorkerDrained";

/// Opens the gates the pool's waiting workers may pass now, and advances the drains of the
/// rollovers (`rollovers`, by Deployment) that decide them. `drain`: whether the operator drains
/// (otherwise every gate opens at once, and the Deployment controller stops old workers as
/// ranked), and for at most how long. A Deployment with a shrink's drain under way
/// (`shrinking`) waits for it: the two would mark each other's workers.
pub(super) fn open_gates(
    seen: &Seen<'_>,
    rollovers: &mut BTreeMap<String, Drain>,
    shrinking: &BTreeSet<String>,
    (drain, timeout): (bool, Duration),
    effects: &mut Effects,
) {
    let pool = seen.pool;
    let deployments: BTreeSet<String> = seen.workers.iter().map(|w| w.deployment.clone()).collect();
    rollovers.retain(|d, _| deployments.contains(d));
    let roles = pool_roles(pool, &Replicas::default());
    for deployment in deployments {
        let workers = seen.workers_of(&deployment);
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
            let open = waiting.iter().map(|w| (w.name.clone(), GROWS));
            effects.gates.extend(open);
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
        let among = Among {
            shrink: &rollover,
            live: &old,
            stood_in: None,
            timeout,
            records: Records::Rollover(deployment.clone()),
        };
        // The floor waits for the marks to show in the Pod cache, as a shrink's does: a gate
        // opened before would let the old ReplicaSet stop a worker by its default order.
        let floor = drain_among(seen, drain, among, effects);
        let guarded = usize::try_from(rollover.live - floor).unwrap_or(0);
        let n = takeover::gates_to_open(&rollover, drain, waiting.len(), seen.now).min(guarded);
        if n > 0 {
            info!(
                deployment = %deployment,
                gates = n,
                old = old.len(),
                "rollover: drained workers of the old template are idle; as many new ones take \
                 their place"
            );
        }
        let open = waiting.iter().take(n).map(|w| (w.name.clone(), REPLACES));
        effects.gates.extend(open);
    }
}
