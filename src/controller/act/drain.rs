//! Drained scale-downs, the asking: before a Deployment shrinks by k, the k workers the idle-first
//! ranking would stop first are asked at their `metrics` port to take no new job
//! (`POST /drain?seconds=N`), and that Deployment's shrink waits, across reconciles, until they
//! report `lanepool_worker_busy 0` or the drain timeout ends; they then cost least to delete. A
//! worker that does not drain (a 404, no answer, no `lanepool_worker_draining 1` in its answer)
//! is ranked as before. Which workers, how long and what an answer means: `rollout/drain.rs`.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use kube::ResourceExt;
use kube::runtime::events::EventType;
use tracing::{info, warn};

use super::rank::rank_before_shrink;
use crate::controller::observe::work::{Observed, candidates};
use crate::controller::pods::read_answer;
use crate::controller::pods::{PoolPods, Worker};
use crate::controller::rollout::Shrink;
use crate::controller::rollout::cost::{DRAINED_COST, IDLE_COST};
use crate::controller::rollout::drain::{self, Drain, DrainAnswer};
use crate::duration::human_seconds;

/// Asks each of `workers` to drain for its seconds (`0`: stop draining); their answers by name:
/// `Unreachable` for a worker not heard from (no answer in time, out of budget, not leader),
/// `Refused` for one that answered without draining, has no metrics port or redirects.
async fn ask(pods: &PoolPods<'_>, workers: Vec<(&Worker, u64)>) -> BTreeMap<String, DrainAnswer> {
    let requests = workers
        .into_iter()
        .map(|(worker, seconds)| (worker, format!("/drain?seconds={seconds}")))
        .collect();
    pods.post(requests)
        .await
        .into_iter()
        .map(|(name, answer)| match answer {
            Ok((status, text)) => (name, read_answer(status, &text)),
            Err(refused) if refused.unknown() => (name, DrainAnswer::Unreachable),
            Err(_) => (name, DrainAnswer::Refused),
        })
        .collect()
}

/// Advances the drains of the pool's shrinking Deployments (`shrinks`: those the surge lets
/// shrink now) and calls off those of Deployments that no longer shrink. A
/// drain that starts takes first the workers that `standing_in` names for its Deployment.
/// Returns, for each shrinking Deployment, the fewest workers it may run now
/// ([`Drain::floor`]): its live count while its drain holds (or its idle drained workers' costs
/// are not yet in the Pod cache), then one more than decided for each drained worker not
/// confirmed idle.
pub(in crate::controller) async fn drain_before_shrinks(
    seen: &Observed<'_>,
    drains: &mut BTreeMap<String, Drain>,
    shrinks: &[Shrink],
    standing_in: &BTreeMap<String, BTreeSet<String>>,
    now: Duration,
) -> BTreeMap<String, i32> {
    let pods = seen.pods;
    for (deployment, drain) in drain::called_off(drains, shrinks) {
        // Best effort: a worker not reached now takes jobs again when its drain lapses. One
        // marked to go first loses the mark before it takes a job.
        let back: Vec<(&Worker, u64)> = pods
            .workers_of(&deployment)
            .into_iter()
            .filter(|w| drain.pods.contains_key(&w.name))
            .map(|w| (w, 0))
            .collect();
        let marked = back
            .iter()
            .filter(|(w, _)| shows_drained_cost(w))
            .map(|(w, _)| (w.name.clone(), IDLE_COST))
            .collect();
        pods.set_deletion_costs(marked).await;
        ask(pods, back).await;
        info!(
            deployment,
            workers = drain.pods.len(),
            "drain called off: the Deployment no longer shrinks; its workers take jobs again"
        );
    }
    let mut floors = BTreeMap::new();
    for shrink in shrinks {
        let drain = drains.entry(shrink.deployment.clone()).or_default();
        let stood_in = standing_in.get(&shrink.deployment);
        let live = pods.workers_of(&shrink.deployment);
        let floor = drain_among(seen, drain, shrink, stood_in, &live, now).await;
        floors.insert(shrink.deployment.clone(), floor);
    }
    floors
}

/// Advances `drain` for `shrink` among the workers `live` (a Deployment's, or the old template's
/// in a rollover) and returns the fewest of them that may run now ([`Drain::floor`]; all of
/// them while the costs are not yet in the Pod cache).
pub(in crate::controller) async fn drain_among(
    seen: &Observed<'_>,
    drain: &mut Drain,
    shrink: &Shrink,
    stood_in: Option<&BTreeSet<String>>,
    live: &[&Worker],
    now: Duration,
) -> i32 {
    advance(seen, drain, shrink, stood_in, live, now).await;
    // The victims are certain before a shrink: the Pod cache shows deletion cost -1 on every
    // drained worker known idle, and on no other (a mark left by a drain called off, or by
    // an earlier leader). Until then the shrink waits a round (500 ms) and the costs are
    // written. The ReplicaSet controller reads the same watch, two hops later (the
    // Deployment's change reaches its ReplicaSet first).
    let floor = drain.floor(shrink, now);
    let idle = drain.idle();
    drain.costs_unseen = floor < shrink.live
        && live
            .iter()
            .any(|w| idle.contains(&w.name) != shows_drained_cost(w));
    if drain.costs_unseen {
        // Nothing stops yet: the shrink waits for the costs.
        let waiting = (shrink.deployment.as_str(), 0);
        rank_before_shrink(seen, waiting, &idle).await;
        return shrink.live;
    }
    floor
}

/// Whether the Pod cache shows `worker` with the drained workers' deletion cost.
fn shows_drained_cost(worker: &Worker) -> bool {
    let cost = worker.deletion_cost.as_deref();
    cost.and_then(|c| c.parse::<i32>().ok()) == Some(DRAINED_COST)
}

/// One reconcile of one Deployment's drain: choose its workers (at the start, or when the count
/// it shrinks to changed), ask them (again: a restarted worker drains anew, and the drain's
/// lapse moves on). The workers that `stood_in` for the new ones are chosen first, as those
/// already draining are: they were the pick all along.
async fn advance(
    seen: &Observed<'_>,
    drain: &mut Drain,
    shrink: &Shrink,
    stood_in: Option<&BTreeSet<String>>,
    live: &[&Worker],
    now: Duration,
) {
    let (pool, ctx, pods) = (seen.pool, seen.ctx, seen.pods);
    let deployment = shrink.deployment.as_str();
    drain.keep_live(live.iter().map(|w| w.name.as_str()));
    let starting = drain.starting(shrink);
    let mut called_back = Vec::new();
    if starting {
        let Some(reading) = seen.work(deployment, live).await else {
            // Unknown means hold: without a reading no worker is known idle, so none is
            // chosen and the shrink waits (its floor is its live count) until one answers.
            warn!(
                deployment,
                "workers not drained: no worker answered and Prometheus did not say; the shrink waits"
            );
            drain.hold_unread();
            return;
        };
        // A served lane whose job time was never measured could run jobs of any length: then
        // the drain waits its whole limit, not the known lanes' three job times.
        let served: Vec<f64> = shrink
            .lanes
            .iter()
            .map(|lane| reading.job_seconds.get(lane).copied().unwrap_or(f64::NAN))
            .collect();
        let candidates = candidates(&reading, live, |name| {
            drain.pods.contains_key(name) || stood_in.is_some_and(|s| s.contains(name))
        });
        called_back = drain.start(
            shrink,
            &candidates,
            &served,
            ctx.settings.drain_timeout,
            now,
        );
    }
    let by_name: BTreeMap<&str, &Worker> = live.iter().map(|w| (w.name.as_str(), *w)).collect();
    let requests = drain
        .requests(by_name.keys().copied(), &called_back, now)
        .into_iter()
        .filter_map(|(name, seconds)| Some((*by_name.get(name)?, seconds)))
        .collect();
    let answers = ask(pods, requests).await;
    let namespace = pool.namespace().unwrap_or_default();
    // The drained workers' answers only: one called back answers `seconds=0` without draining.
    for (_, answer) in answers
        .iter()
        .filter(|(name, _)| drain.pods.contains_key(*name))
    {
        ctx.metrics
            .drain_answered(&namespace, &pool.name_any(), answer.outcome());
    }
    drain.answered(answers);
    if starting && !drain.pods.is_empty() {
        let names: Vec<&str> = drain.pods.keys().map(String::as_str).collect();
        let before = match drain.rollover {
            true => format!("workers of Deployment {deployment}'s new template take their place"),
            false => format!(
                "Deployment {deployment} shrinks {} → {}",
                shrink.live, shrink.to
            ),
        };
        let note = format!(
            "{} before {before} (at most {}): {}",
            workers_finish(shrink, drain.pods.len()),
            human_seconds(drain.timeout.as_secs_f64()),
            names.join(", ")
        );
        info!(deployment, workers = drain.pods.len(), timeout = ?drain.timeout, refused = drain.refused.len(), "{note}");
        ctx.event(pool, EventType::Normal, "Draining", note).await;
    } else if starting && !drain.refused.is_empty() {
        info!(
            deployment,
            refused = drain.refused.len(),
            "workers not drained: they do not take drain requests; ranked only"
        );
    }
    if let Some(ended) = drain.ended(now) {
        info!(
            deployment,
            idle = ended.idle,
            still_busy = ended.still_busy,
            ms = ended.waited.as_millis() as u64,
            "drained: the shrink takes the idle ones"
        );
    }
}

/// "2 shared workers finish their jobs and take no new ones", or "1 reserved worker of lane L
/// finishes its job and takes no new one", for the event.
fn workers_finish(shrink: &Shrink, n: usize) -> String {
    let workers = if n == 1 { "worker" } else { "workers" };
    let who = match shrink.lanes.as_slice() {
        [lane] if shrink.deployment.ends_with("-reserved") => {
            format!("reserved {workers} of lane {lane}")
        }
        _ => format!("shared {workers}"),
    };
    let finish = if n == 1 {
        "finishes its job and takes no new one"
    } else {
        "finish their jobs and take no new ones"
    };
    format!("{n} {who} {finish}")
}
