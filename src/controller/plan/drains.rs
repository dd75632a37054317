//! Drained scale-downs, planned: before a Deployment shrinks by k, the k workers the idle-first
//! ranking would stop first are asked to take no new job (`POST /drain?seconds=N`), and its shrink
//! waits, across reconciles, until they answer idle or the drain timeout ends; they then cost
//! least to delete. Once the shrink is written, its idle drained workers are still asked to drain
//! until the ReplicaSet controller has stopped them. Which workers, how long and what an answer
//! means: `rollout/drain.rs`.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use kube::runtime::events::EventType;
use tracing::{info, warn};

use super::effects::{Ask, Effects, Records, Request};
use super::rank;
use super::seen::{Seen, Settings, Steering, candidates};
use crate::controller::rollout::Shrink;
use crate::controller::rollout::cost::{DRAINED_COST, IDLE_COST, Work};
use crate::controller::rollout::drain::{self, Drain, choose};
use crate::controller::worker::Worker;
use crate::duration::human_seconds;

/// Advances the drains of the pool's shrinking Deployments (`shrinks`: those the surge lets shrink
/// now) and calls off those of Deployments that no longer shrink. A drain that starts takes first
/// the workers that `standing_in` names for its Deployment. A Deployment in a rollover (workers
/// of two templates) does not shrink until the rollover is over (at most the surge timeout): its
/// Deployment controller would take the shrink from both ReplicaSets in proportion, not from the
/// drained workers. Returns, for each shrinking Deployment, the fewest workers it may run now
/// ([`drain_among`]).
pub(super) fn drain_before_shrinks(
    seen: &Seen<'_>,
    steering: &mut Steering,
    shrinks: &[Shrink],
    standing_in: &BTreeMap<String, BTreeSet<String>>,
    settings: Settings,
    effects: &mut Effects,
) -> BTreeMap<String, i32> {
    let (now, timeout) = (seen.now, settings.drain_timeout);
    let mut floors = BTreeMap::new();
    let rolling = |deployment: &str| seen.workers_of(deployment).iter().any(|w| !w.newest);
    steering.rollover_waits.retain(|d, _| rolling(d));
    // A rollover that does not end (new workers that never pass their gate) holds a shrink no
    // longer than the surge would: then it drains as it did before, across both templates.
    let limit = settings.rules.surge_timeout;
    let waits = |shrink: &&Shrink, waits: &mut BTreeMap<String, Duration>| {
        if !rolling(&shrink.deployment) {
            return false;
        }
        let since = *waits.entry(shrink.deployment.clone()).or_insert(now);
        now.saturating_sub(since) < limit
    };
    let (waiting, going): (Vec<&Shrink>, Vec<&Shrink>) = shrinks
        .iter()
        .partition(|shrink| waits(shrink, &mut steering.rollover_waits));
    for shrink in waiting {
        info!(
            deployment = shrink.deployment,
            "the shrink waits for the Deployment's rollover to end"
        );
        floors.insert(shrink.deployment.clone(), shrink.live);
    }
    let going: Vec<Shrink> = going.into_iter().cloned().collect();
    for (deployment, drain) in drain::called_off(&mut steering.drains, &going) {
        call_back(seen, &deployment, &drain, effects);
        info!(
            deployment,
            workers = drain.pods.len(),
            "drain called off: the Deployment no longer shrinks; its workers take jobs again"
        );
    }
    for shrink in &going {
        let deployment = shrink.deployment.as_str();
        // The workers of a shrink written already are not this one's to choose.
        let gone = steering.shrunk.get(deployment);
        let live: Vec<&Worker> = seen
            .workers_of(deployment)
            .into_iter()
            .filter(|w| gone.is_none_or(|g| !g.pods.contains_key(&w.name)))
            .collect();
        let drain = steering.drains.entry(deployment.to_string()).or_default();
        let stood_in = standing_in.get(deployment);
        let records = Records::Drain(deployment.to_string());
        let among = Among {
            shrink,
            live: &live,
            stood_in,
            timeout,
            records,
        };
        let floor = drain_among(seen, drain, among, effects);
        floors.insert(deployment.to_string(), floor);
    }
    floors
}

/// One drain's step: for `shrink` among the workers `live` (a Deployment's, or the old
/// template's in a rollover), those `stood_in` first, waiting at most `timeout`; the answers go to
/// `records`.
pub(super) struct Among<'a> {
    pub(super) shrink: &'a Shrink,
    pub(super) live: &'a [&'a Worker],
    pub(super) stood_in: Option<&'a BTreeSet<String>>,
    pub(super) timeout: Duration,
    pub(super) records: Records,
}

/// Advances `drain` and returns the fewest of its workers that may run now ([`Drain::floor`]),
/// all of them until the Pod cache shows the drained idle workers' cost and no other worker the
/// ReplicaSet controller would take first (one not ready and busy).
pub(super) fn drain_among(
    seen: &Seen<'_>,
    drain: &mut Drain,
    among: Among<'_>,
    effects: &mut Effects,
) -> i32 {
    let Among { shrink, live, .. } = among;
    advance(seen, drain, &among, effects);
    // The victims are certain before a shrink: the Pod cache shows deletion cost -1 on every
    // drained worker known idle, and on no other (a mark left by a drain called off, or by an
    // earlier leader). Until then the shrink waits a round and the costs are written. The
    // ReplicaSet controller reads the same watch, two hops later (the Deployment's change
    // reaches its ReplicaSet first).
    drain.forget_stale(seen.now);
    drain.turned_idle = false;
    let floor = drain.floor(shrink, seen.now);
    let idle = drain.idle();
    drain.costs_unseen = floor < shrink.live
        && live
            .iter()
            .any(|w| idle.contains(&w.name) != shows_drained_cost(w));
    if drain.costs_unseen {
        // Nothing stops yet: the shrink waits for the costs.
        if let Some((costs, _)) = rank::costs(seen, &shrink.deployment, live, 0, &idle) {
            effects.costs.extend(costs);
        }
        return shrink.live;
    }
    // The ReplicaSet controller deletes the Pods that are not ready before it looks at costs: a
    // busy worker whose readiness probe fails now would go in place of a drained one. Whom the
    // shrink stops is foreseen as that controller orders them; if a busy worker is among them,
    // the drain chooses again (it takes such Pods first) and the shrink waits for it.
    let stopping = usize::try_from(shrink.live - floor).unwrap_or(0);
    // A worker not ready that says nothing may be busy too, while the drain is within its time
    // (one that never answers does not hold the shrink for ever).
    let first = drain.pods.values().map(|d| d.asked_at).min();
    let within = first.is_none_or(|first| seen.now < first + drain.timeout);
    let busy_stopped = busy_among_stopped(seen, live, &idle, (stopping, within));
    if !busy_stopped.is_empty() {
        warn!(
            deployment = shrink.deployment,
            pods = ?busy_stopped,
            "a busy worker is not ready: the ReplicaSet would stop it first; the shrink waits"
        );
        // Chosen again to drain it, unless it is drained already or does not drain.
        let known = |n: &String| drain.pods.contains_key(n) || drain.refused.contains(n);
        if !busy_stopped.iter().all(known) {
            drain.rechoose = true;
        }
        return shrink.live;
    }
    floor
}

fn names<'a>(live: &'a [&'a Worker]) -> impl Iterator<Item = &'a str> {
    live.iter().map(|w| w.name.as_str())
}

/// Of the `stopping` workers of `live` the ReplicaSet controller stops first (those not ready,
/// then the drained `idle` ones marked -1, then by their cost), those known to run a job, and
/// while `unknown_holds` those not ready that run a container and say nothing.
fn busy_among_stopped(
    seen: &Seen<'_>,
    live: &[&Worker],
    idle: &BTreeSet<String>,
    (stopping, unknown_holds): (usize, bool),
) -> Vec<String> {
    let Some(reading) = seen.work.filter(|_| stopping > 0) else {
        return Vec::new();
    };
    let mut candidates = candidates(reading, live, |_| false);
    for candidate in candidates.iter_mut().filter(|c| idle.contains(&c.name)) {
        candidate.cost = DRAINED_COST;
    }
    let by_name: BTreeMap<&str, &&Worker> = live.iter().map(|w| (w.name.as_str(), w)).collect();
    let may_work = |name: &String| match reading.work.get(name) {
        Some(Work::Busy { .. }) => true,
        Some(Work::Idle) => false,
        None => {
            let worker = by_name.get(name.as_str());
            unknown_holds
                && worker
                    .is_some_and(|w| !w.ready && w.started.is_some() && w.cannot_start.is_none())
        }
    };
    choose(&candidates, stopping)
        .into_iter()
        .filter(|name| !idle.contains(name))
        .filter(may_work)
        .collect()
}

/// Whether the Pod cache shows `worker` with the drained workers' deletion cost.
pub(super) fn shows_drained_cost(worker: &Worker) -> bool {
    let cost = worker.deletion_cost.as_deref();
    cost.and_then(|c| c.parse::<i32>().ok()) == Some(DRAINED_COST)
}

/// One reconcile of one drain: choose its workers (at the start, when the count it shrinks to
/// changed, or after a refusal), and ask them (again: a restarted worker drains anew, and the
/// drain's lapse moves on). The workers that stood in for the new ones are chosen first, as those
/// already draining are: they were the pick all along.
fn advance(seen: &Seen<'_>, drain: &mut Drain, among: &Among<'_>, effects: &mut Effects) {
    let (shrink, live, now) = (among.shrink, among.live, seen.now);
    let deployment = shrink.deployment.as_str();
    drain.keep_live(live.iter().map(|w| w.name.as_str()));
    let starting = drain.starting(shrink);
    let mut called_back = Vec::new();
    if starting {
        if seen
            .work
            .is_some_and(|r| r.scraped.is_none() && !r.knows(names(live)))
        {
            // Not one of them answered, and Prometheus was not asked (nothing moved when this
            // reconcile observed): it is, at the next, which comes soon.
            drain.rechoose = true;
            return;
        }
        let Some(reading) = seen.work_of(live) else {
            // Unknown means hold: without a reading no worker is known idle, so none is chosen
            // and the shrink waits (its floor is its live count) until one answers.
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
        let stood_in = among.stood_in;
        let candidates = candidates(reading, live, |name| {
            drain.pods.contains_key(name) || stood_in.is_some_and(|s| s.contains(name))
        });
        called_back = drain.start(shrink, &candidates, &served, among.timeout, now);
        if drain.pods.is_empty() {
            info!(
                deployment,
                refused = drain.refused.len(),
                "workers not drained: they do not take drain requests; ranked only"
            );
        } else {
            effects
                .events
                .push((EventType::Normal, "Draining", draining_note(shrink, drain)));
        }
    }
    let names = live.iter().map(|w| w.name.as_str());
    for (pod, seconds) in drain.requests(names, &called_back, now) {
        let records = match drain.pods.contains_key(pod) {
            true => among.records.clone(),
            false => Records::Nothing,
        };
        effects.asks.push(Ask {
            pod: pod.to_string(),
            request: Request::Drain(seconds),
            records,
        });
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

/// "2 shared workers finish their jobs and take no new ones before Deployment D shrinks 4 → 2
/// (at most 9s): a, b", for the event.
fn draining_note(shrink: &Shrink, drain: &Drain) -> String {
    let deployment = &shrink.deployment;
    let names: Vec<&str> = drain.pods.keys().map(String::as_str).collect();
    let before = match drain.rollover {
        true => format!("workers of Deployment {deployment}'s new template take their place"),
        false => format!(
            "Deployment {deployment} shrinks {} → {}",
            shrink.live, shrink.to
        ),
    };
    format!(
        "{} before {before} (at most {}): {}",
        workers_finish(shrink, drain.pods.len()),
        human_seconds(drain.timeout.as_secs_f64()),
        names.join(", ")
    )
}

/// Asks the live workers of a drain called off to take jobs again (`seconds=0`), a mark to go
/// first lowered before (best effort: one not reached takes jobs again when its drain lapses).
fn call_back(seen: &Seen<'_>, deployment: &str, drain: &Drain, effects: &mut Effects) {
    for worker in seen
        .workers_of(deployment)
        .into_iter()
        .filter(|w| drain.pods.contains_key(&w.name))
    {
        if shows_drained_cost(worker) {
            effects.costs.push((worker.name.clone(), IDLE_COST));
        }
        effects.asks.push(Ask {
            pod: worker.name.clone(),
            request: Request::Drain(0),
            records: Records::Nothing,
        });
    }
}

/// The drains of shrinks written already: each idle drained worker still live is asked to drain
/// on until its ReplicaSet controller stops it. Once the Deployment runs no more live workers
/// than it is given, the ones left were not stopped (the count was raised again, or others went):
/// they are called back.
pub(super) fn follow_shrunk(
    seen: &Seen<'_>,
    shrunk: &mut BTreeMap<String, Drain>,
    effects: &mut Effects,
) {
    let deployments: Vec<String> = shrunk.keys().cloned().collect();
    for deployment in deployments {
        let live = seen.workers_of(&deployment);
        let Some(drain) = shrunk.get_mut(&deployment) else {
            continue;
        };
        drain.keep_live(live.iter().map(|w| w.name.as_str()));
        let stopping = seen.runs_more_than_given(&deployment);
        if drain.pods.is_empty() || !stopping {
            if let Some(drain) = shrunk.remove(&deployment)
                && !drain.pods.is_empty()
            {
                info!(
                    deployment,
                    workers = drain.pods.len(),
                    "the shrink stopped other workers: the drained ones take jobs again"
                );
                call_back(seen, &deployment, &drain, effects);
            }
            continue;
        }
        let names = live.iter().map(|w| w.name.as_str());
        for (pod, seconds) in drain.requests(names, &[], seen.now) {
            effects.asks.push(Ask {
                pod: pod.to_string(),
                request: Request::Drain(seconds),
                records: Records::Shrunk(deployment.clone()),
            });
        }
    }
}

/// A shrink of `deployment` is written: its drained idle workers are followed until they are
/// stopped ([`follow_shrunk`]); its drain goes on with the others (busy at its timeout, or not
/// heard from), if any.
pub(super) fn written(steering: &mut Steering, deployment: &str) {
    let Some(drain) = steering.drains.get_mut(deployment) else {
        return;
    };
    let idle = drain.idle();
    if !idle.is_empty() {
        let follow = steering.shrunk.entry(deployment.to_string()).or_default();
        for name in &idle {
            if let Some(drained) = drain.pods.remove(name) {
                follow.pods.insert(name.clone(), drained);
            }
        }
        follow.timeout = follow.timeout.max(drain.timeout);
    }
    if drain.pods.is_empty() {
        steering.drains.remove(deployment);
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
