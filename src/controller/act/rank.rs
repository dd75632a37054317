//! Idle workers go first: just before a Deployment shrinks, its Pods get the annotation
//! `controller.kubernetes.io/pod-deletion-cost` from what each worker is doing (the cost model is
//! `plan/cost.rs`), so the ReplicaSet controller removes idle workers first, then those whose jobs
//! should end soonest. Each worker is asked itself (the freshest answer: a scrape is up to a
//! scrape interval old, longer than many jobs); one that does not answer in time is read from the
//! pool's Prometheus instead. Only workers of a Deployment about to shrink are read or written,
//! and only those whose cost changes; a failure here never holds a shrink back.

use std::collections::{BTreeMap, BTreeSet};
use std::time::{SystemTime, UNIX_EPOCH};

use kube::ResourceExt;
use tracing::{info, warn};

use crate::api::LanePool;
use crate::controller::context::Context;
use crate::controller::observe::measure::busy_workers;
use crate::controller::pods::parse_gauges;
use crate::controller::pods::{PoolPods, Worker};
use crate::controller::rollout::cost::{
    DRAINED_COST, IDLE_COST, Reading, Sample, Work, busy_pods, cost_changes, expected_left,
};
use crate::controller::rollout::drain::Candidate;
use crate::controller::rollout::grace::grace_seconds;
use crate::prometheus::Connection;

/// What the pool's last measurement knows that a ranking needs: how to reach its Prometheus
/// (for workers that do not answer) and every lane's mean job time.
#[derive(Clone, Copy, Debug)]
pub(in crate::controller) struct LastMeasured<'m> {
    pub(in crate::controller) connection: Option<&'m Connection>,
    pub(in crate::controller) job_seconds: &'m BTreeMap<String, f64>,
}

/// Asks each worker that has a metrics port for its gauges; the answers, labelled by pod name.
async fn ask_workers(pods: &PoolPods<'_>, workers: &[&Worker]) -> (Vec<Sample>, Vec<Sample>) {
    pods.metrics_texts(workers).await.into_iter().fold(
        Default::default(),
        |(mut busy, mut started), (name, answered)| {
            let (b, s) = parse_gauges(&answered.text, &name);
            busy.extend(b);
            started.extend(s);
            (busy, started)
        },
    )
}

/// Asks each of `live` (and Prometheus for those that do not answer) what it is doing; `None`
/// when no one could say.
pub(in crate::controller) async fn read_work(
    pool: &LanePool,
    ctx: &Context,
    pods: &PoolPods<'_>,
    measured: LastMeasured<'_>,
    deployment: &str,
    live: &[&Worker],
) -> Option<Reading> {
    // Each worker asked now, and Prometheus (a scrape old) only for those that did not answer.
    let (busy, job_started) = ask_workers(pods, live).await;
    let mut work = busy_pods(&busy, &job_started);
    let answered = work.len();
    if live.iter().any(|w| !work.contains_key(&w.name)) {
        match busy_workers(ctx, measured.connection, pool, deployment).await {
            Some((busy, job_started)) => {
                for (pod, scraped) in busy_pods(&busy, &job_started) {
                    work.entry(pod).or_insert(scraped);
                }
            }
            None if answered == 0 => return None,
            None => {}
        }
    }
    let now = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap_or_default()
        .as_secs_f64();
    Some(Reading {
        work,
        job_seconds: measured.job_seconds.clone(),
        now,
        answered,
    })
}

/// The workers of `live` as a drain or the stand-ins choose among them: ready or not, and their
/// idle-first cost in `reading`; `chosen` names those already chosen (they stay first).
pub(in crate::controller) fn candidates(
    reading: &Reading,
    live: &[&Worker],
    chosen: impl Fn(&str) -> bool,
) -> Vec<Candidate> {
    live.iter()
        .map(|w| Candidate {
            name: w.name.clone(),
            ready: w.ready,
            cost: reading.cost(&w.name),
            draining: chosen(&w.name),
        })
        .collect()
}

/// Ranks the workers of `deployment` for deletion, the `drained` ones first of all: no other Pod
/// is asked or annotated, and counts in `busy_workers_stopped` the busy ones among the
/// `stopping` that cost least (the shrink that follows stops them). Logs and gives up on any
/// failure: the shrink goes ahead either way, as it would without this step.
pub(in crate::controller) async fn rank_before_shrink(
    pool: &LanePool,
    ctx: &Context,
    pods: &PoolPods<'_>,
    measured: LastMeasured<'_>,
    (deployment, stopping): (&str, usize),
    drained: &BTreeSet<String>,
) {
    let started = std::time::Instant::now();
    let live = pods.workers_of(deployment);
    if live.is_empty() {
        return;
    }
    let Some(reading) = read_work(pool, ctx, pods, measured, deployment, &live).await else {
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
