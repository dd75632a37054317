//! Idle workers go first, planned: just before a Deployment shrinks, its Pods get the deletion
//! cost of what each worker is doing (the cost model is `rollout/cost.rs`), so the ReplicaSet
//! controller removes drained workers first, then idle ones, then those whose jobs should end
//! soonest. Only Pods whose cost changes are written; a ranking that cannot be made never holds a
//! shrink back.

use std::collections::BTreeSet;

use tracing::{info, warn};

use super::effects::Effects;
use super::seen::{Seen, Steering};
use crate::controller::deployments::{counts_by_name, spec_replicas};
use crate::controller::rollout::Release;
use crate::controller::rollout::cost::{
    DRAINED_COST, IDLE_COST, Work, cost_changes, expected_left,
};
use crate::controller::rollout::grace::grace_seconds;
use crate::controller::worker::Worker;

/// Ranks the Pods of each Deployment that `release` shrinks, its drained workers first (those of
/// this shrink known idle, and those of a shrink written before), and counts the busy ones among
/// those it stops.
pub(super) fn rank_release(
    seen: &Seen<'_>,
    steering: &Steering,
    release: &Release,
    effects: &mut Effects,
) {
    let to = counts_by_name(seen.pool, Some(&release.replicas));
    for deployment in &release.shrinking {
        // The drained workers known idle go first, of this shrink and of one written before; a
        // written shrink's worker not known idle (one an earlier leader drained) keeps the cost
        // it has: the ReplicaSet controller may be about to stop it.
        let shrunk = steering.shrunk.get(deployment);
        let drained: BTreeSet<String> = [steering.drains.get(deployment), shrunk]
            .into_iter()
            .flatten()
            .flat_map(|d| d.idle())
            .collect();
        let kept: BTreeSet<String> = shrunk
            .map(|d| {
                let unknown = d.pods.keys().filter(|p| !drained.contains(*p));
                unknown.cloned().collect()
            })
            .unwrap_or_default();
        let from = seen.live.get(deployment).and_then(spec_replicas);
        let stopping = from.zip(to.get(deployment)).map_or(0, |(f, t)| f - t);
        let stopping = usize::try_from(stopping).unwrap_or(0);
        let live = seen.workers_of(deployment);
        if live.is_empty() {
            continue;
        }
        let Some((costs, busy)) = costs(seen, deployment, &live, stopping, &drained) else {
            continue;
        };
        let costs = costs.into_iter().filter(|(pod, _)| !kept.contains(pod));
        effects.costs.extend(costs);
        *effects.stopped_busy.get_or_insert(0) += busy;
    }
}

/// The deletion costs to write on `live` (of `deployment`), the `drained` ones first of all, and
/// how many busy workers are among the `stopping` that cost least (the shrink that follows stops
/// them). `None` when no worker answered and Prometheus did not say.
pub(super) fn costs(
    seen: &Seen<'_>,
    deployment: &str,
    live: &[&Worker],
    stopping: usize,
    drained: &BTreeSet<String>,
) -> Option<(Vec<(String, i32)>, u64)> {
    let Some(reading) = seen.work_of(live) else {
        warn!(
            deployment,
            "Pods not ranked before the shrink: no worker answered"
        );
        return None;
    };
    let names: Vec<(String, Option<String>)> = live
        .iter()
        .map(|w| (w.name.clone(), w.deletion_cost.clone()))
        .collect();
    let (work, job_seconds, now) = (&reading.work, &reading.job_seconds, reading.now);
    let changes = cost_changes(&names, work, job_seconds, drained, now);
    let costs = names
        .iter()
        .map(|(name, _)| match drained.contains(name) {
            true => DRAINED_COST,
            false => reading.cost(name),
        })
        .collect();
    let stopped_busy = busy_among_cheapest(costs, stopping);
    let busy = names
        .iter()
        .filter(|(name, _)| matches!(work.get(name), Some(Work::Busy { .. })))
        .count();
    let grace = grace_seconds(seen.pool) as f64;
    let ending = names
        .iter()
        .filter(|(name, _)| {
            expected_left(work.get(name), job_seconds, now).is_some_and(|left| left <= grace)
        })
        .count();
    if stopping > 0 {
        info!(
            deployment,
            pods = live.len(),
            busy,
            patched = changes.len(),
            ending_within_grace = ending,
            drained = drained.len(),
            "Pods ranked before the shrink: idle workers go first"
        );
    }
    Some((changes, stopped_busy))
}

/// How many of the `stopping` workers that cost least, of `costs`, are busy: what a shrink
/// stops with a job in hand.
fn busy_among_cheapest(mut costs: Vec<i32>, stopping: usize) -> u64 {
    costs.sort_unstable();
    costs
        .into_iter()
        .take(stopping)
        .filter(|cost| *cost > IDLE_COST)
        .count() as u64
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_shrink_stops_busy_workers_only_past_the_idle_and_drained_ones() {
        let costs = vec![3001, DRAINED_COST, IDLE_COST, 21, DRAINED_COST];
        assert_eq!(busy_among_cheapest(costs.clone(), 2), 0);
        assert_eq!(busy_among_cheapest(costs.clone(), 3), 0);
        assert_eq!(busy_among_cheapest(costs.clone(), 4), 1);
        assert_eq!(busy_among_cheapest(costs.clone(), 9), 2);
        assert_eq!(busy_among_cheapest(costs, 0), 0);
    }
}
