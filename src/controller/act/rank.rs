//! Idle workers go first: just before a Deployment shrinks, its Pods get the annotation
//! `controller.kubernetes.io/pod-deletion-cost` from what each worker is doing (the cost model is
//! `rollout/cost.rs`), so the ReplicaSet controller removes idle workers first, then those whose
//! jobs should end soonest. What each worker is doing comes from `observe/work.rs`: the worker
//! itself (the freshest answer: a scrape is up to a scrape interval old, longer than many jobs),
//! or the pool's Prometheus for one that does not answer in time. Only workers of a Deployment about to shrink are read or written,
//! and only those whose cost changes; a failure here never holds a shrink back.

use std::collections::BTreeSet;

use kube::ResourceExt;
use tracing::{info, warn};

use crate::controller::observe::work::Observed;
use crate::controller::rollout::cost::{
    DRAINED_COST, IDLE_COST, Reading, Work, cost_changes, expected_left,
};
use crate::controller::rollout::grace::grace_seconds;

/// Ranks the workers of `deployment` for deletion, the `drained` ones first of all: no other Pod
/// is asked or annotated, and counts in `busy_workers_stopped` the busy ones among the
/// `stopping` that cost least (the shrink that follows stops them). Logs and gives up on any
/// failure: the shrink goes ahead either way, as it would without this step.
pub(in crate::controller) async fn rank_before_shrink(
    seen: &Observed<'_>,
    (deployment, stopping): (&str, usize),
    drained: &BTreeSet<String>,
) {
    let (pool, ctx, pods) = (seen.pool, seen.ctx, seen.pods);
    let started = std::time::Instant::now();
    let live = pods.workers_of(deployment);
    if live.is_empty() {
        return;
    }
    let Some(reading) = seen.work(deployment, &live).await else {
        warn!(
            deployment,
            "Pods not ranked before the shrink: no worker answered"
        );
        return;
    };
    let Reading {
        work,
        job_seconds,
        now,
        answered,
    } = &reading;
    let names: Vec<(String, Option<String>)> = live
        .iter()
        .map(|w| (w.name.clone(), w.deletion_cost.clone()))
        .collect();
    let changes = cost_changes(&names, work, job_seconds, drained, *now);
    let costs = names
        .iter()
        .map(|(name, _)| match drained.contains(name) {
            true => DRAINED_COST,
            false => reading.cost(name),
        })
        .collect();
    let (namespace, name) = (pool.namespace().unwrap_or_default(), pool.name_any());
    let stopped_busy = busy_among_cheapest(costs, stopping);
    ctx.metrics.stopped_busy(&namespace, &name, stopped_busy);
    let busy_count = names
        .iter()
        .filter(|(name, _)| matches!(work.get(name), Some(Work::Busy { .. })))
        .count();
    let grace = grace_seconds(pool) as f64;
    let ending = names
        .iter()
        .filter(|(name, _)| {
            expected_left(work.get(name), job_seconds, *now).is_some_and(|left| left <= grace)
        })
        .count();
    let patched = pods.set_deletion_costs(changes).await;
    info!(
        deployment,
        pods = live.len(),
        busy = busy_count,
        patched,
        ms = started.elapsed().as_millis() as u64,
        answered,
        ending_within_grace = ending,
        drained = drained.len(),
        "Pods ranked before the shrink: idle workers go first"
    );
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
