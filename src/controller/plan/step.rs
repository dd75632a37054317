//! The plan itself: one reconcile's rollout, step by step, and the answers recorded for the next.

use std::collections::BTreeMap;
use std::time::Duration;

use tracing::info;

use super::effects::{Answer, Ask, Effects, Records, Request, StandInAnswer};
use super::seen::{Seen, Settings, Steering};
use super::{drains, gates, rank, stand_ins};
use crate::controller::rollout::drain::DrainAnswer;
use crate::controller::rollout::{self, Release};
use crate::sizing::Replicas;

/// Plans one reconcile's rollout towards `seen.target`; `steering` becomes the next memory.
pub(crate) fn plan(seen: &Seen<'_>, steering: &mut Steering, settings: Settings) -> Effects {
    let (pool, live, now) = (seen.pool, seen.live, seen.now);
    let rules = settings.rules;
    let surge = steering.surge_wait.surge(now);
    let rollout = rollout::rollout(pool, live, seen.target, seen.applied, &surge, rules);
    let surge_ended = steering.surge_wait.follow(&rollout, now);
    let surge_ends = steering.surge_wait.ends(rules.surge_timeout, now);
    let mut effects = Effects {
        growth: rollout.growth.clone(),
        asks: Vec::new(),
        costs: Vec::new(),
        gates: Vec::new(),
        release: Release {
            replicas: Replicas::default(),
            shrinking: Vec::new(),
            remove: Vec::new(),
            staying: Vec::new(),
        },
        held: Vec::new(),
        events: Vec::new(),
        stopped_busy: None,
        surge_ended,
    };
    // What an earlier leader left in the workers: taken over, or ended, by the steps below.
    if let Some(inherited) = seen.inherited.filter(|_| !steering.inherited_read) {
        if inherited.len() > 0 {
            info!(
                workers = inherited.len(),
                "workers drain or stand in for an earlier leader: taken over where this rollout \
                 wants them, ended elsewhere"
            );
        }
        let written = |deployment: &str| shrink_written(seen, deployment);
        steering.adopt(inherited.clone(), written, now);
        steering.inherited_read = true;
    }
    // While a shrink waits for the surge, its workers that will stop stand in for the new ones;
    // once it goes, the drain takes those that said so first, and sends back every other that
    // may stand in (one not heard from may have taken the request late).
    let waiting = match settings.stand_ins {
        true => rollout.stand_ins.as_slice(),
        false => &[],
    };
    let ended = stand_ins::stand_in(
        seen,
        &mut steering.stand_ins,
        waiting,
        surge_ends,
        &mut effects,
    );
    let stood_in = ended
        .iter()
        .map(|(deployment, s)| (deployment.clone(), s.pods.clone()))
        .collect();
    drains::follow_shrunk(seen, &mut steering.shrunk, &mut effects);
    let floors = drains::drain_before_shrinks(
        seen,
        steering,
        &rollout.shrinks,
        &stood_in,
        settings,
        &mut effects,
    );
    stand_ins::end(seen, ended, &steering.drains, &mut effects);
    // A template change: each new worker counts as available once an old one is idle.
    let shrinking = steering.drains.keys().cloned().collect();
    gates::open_gates(
        seen,
        &mut steering.rollovers,
        &shrinking,
        (rules.drain, settings.drain_timeout),
        &mut effects,
    );
    let settled = rollout.settle(pool, live, &floors, &steering.drains, (surge_ends, now));
    rank::rank_release(seen, steering, &settled.release, &mut effects);
    // The shrinks written now: their drains' idle workers are followed until they are stopped;
    // a drain of a Deployment that goes is over.
    for deployment in &settled.release.shrinking {
        drains::written(steering, deployment);
    }
    for deployment in &settled.release.remove {
        steering.drains.remove(deployment);
        steering.shrunk.remove(deployment);
    }
    effects.release = settled.release;
    effects.held = settled.held;
    effects.asks = one_each(effects.asks);
    effects
}

/// One request per worker: two steps may ask the same one (a drain called off and another
/// choosing it again, a stand-in ended and a drain starting), and two requests in flight at once
/// would leave it in whichever state came last. A drain wins over a stand-in, and either over a
/// worker sent back to its own lanes or called back from a drain.
pub(super) fn one_each(asks: Vec<Ask>) -> Vec<Ask> {
    let rank = |ask: &Ask| match ask.request {
        Request::Drain(seconds) if seconds > 0 => 0,
        Request::StandIn { .. } => 1,
        Request::Drain(_) | Request::OwnLanes => 2,
    };
    let mut kept: BTreeMap<String, Ask> = BTreeMap::new();
    for ask in asks {
        match kept.get(&ask.pod) {
            Some(first) if rank(first) <= rank(&ask) => {}
            _ => {
                kept.insert(ask.pod.clone(), ask);
            }
        }
    }
    kept.into_values().collect()
}

/// Whether `deployment`'s shrink is written and not yet carried out: it runs more live workers
/// than it is given, all of its newest template (a rollover's surge runs more too).
fn shrink_written(seen: &Seen<'_>, deployment: &str) -> bool {
    let newest = seen.workers_of(deployment).iter().all(|w| w.newest);
    newest && seen.runs_more_than_given(deployment)
}

/// Records what the workers answered: the drains and stand-ins the requests were for go on from
/// the answers at the next reconcile.
pub(crate) fn record(steering: &mut Steering, answers: Vec<(Ask, Answer)>, now: Duration) {
    let mut drains: BTreeMap<(u8, String), BTreeMap<String, DrainAnswer>> = BTreeMap::new();
    let mut stand_ins: BTreeMap<String, Vec<(String, StandInAnswer)>> = BTreeMap::new();
    for (ask, answer) in answers {
        match (ask.records, answer) {
            (Records::Drain(deployment), Answer::Drain(answer)) => {
                let to = drains.entry((0, deployment)).or_default();
                to.insert(ask.pod, answer);
            }
            (Records::Rollover(deployment), Answer::Drain(answer)) => {
                let to = drains.entry((1, deployment)).or_default();
                to.insert(ask.pod, answer);
            }
            (Records::Shrunk(deployment), Answer::Drain(answer)) => {
                let to = drains.entry((2, deployment)).or_default();
                to.insert(ask.pod, answer);
            }
            (Records::StandIn(deployment), Answer::StandIn(answer)) => {
                stand_ins
                    .entry(deployment)
                    .or_default()
                    .push((ask.pod, answer));
            }
            _ => {}
        }
    }
    for ((of, deployment), answers) in drains {
        let of = match of {
            0 => &mut steering.drains,
            1 => &mut steering.rollovers,
            _ => &mut steering.shrunk,
        };
        if let Some(drain) = of.get_mut(&deployment) {
            drain.answered(answers, now);
        }
    }
    for (deployment, answers) in stand_ins {
        let Some(set) = steering.stand_ins.get_mut(&deployment) else {
            continue;
        };
        set.unheard.extend(
            answers
                .iter()
                .filter(|(_, answer)| *answer == StandInAnswer::Unreachable)
                .map(|(pod, _)| pod.clone()),
        );
        set.answered(
            answers
                .into_iter()
                .map(|(pod, answer)| (pod, answer == StandInAnswer::StandingIn))
                .collect(),
        );
        if set.pods.is_empty() {
            info!(
                deployment,
                refused = set.refused.len(),
                "no stand-ins: the workers do not take stand-in requests"
            );
        }
    }
}
