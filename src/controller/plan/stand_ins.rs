//! Stand-ins, planned: while the shared Deployment's shrink waits for a growing reserve, the shared
//! workers it will stop are asked to take only the reserve's lane (`POST /stand-in`), so a grown
//! reserve serves at once instead of a pod start later. When the surge is over they are drained
//! (which ends a stand-in in the worker) or sent back to their own lanes. Which workers and for how
//! long: `rollout/stand_in.rs`. A worker that does not stand in keeps its role until it is
//! replaced, as before.

use std::collections::BTreeMap;

use kube::runtime::events::EventType;
use tracing::{debug, info};

use super::effects::{Ask, Effects, Records, Request};
use super::seen::{Seen, candidates};
use crate::controller::rollout::StandIn;
use crate::controller::rollout::drain::Drain;
use crate::controller::rollout::stand_in::{self, StandIns};
use crate::duration::human_seconds;

/// Starts (or chooses again) the stand-ins of the shrinks waiting for the surge (`waiting`), each
/// asked until `surge_ends` and a margin. Returns the stand-ins of the shrinks that no longer
/// wait, by Deployment: the drain prefers them, and [`end`] sends back those it does not take.
pub(super) fn stand_in(
    seen: &Seen<'_>,
    stand_ins: &mut BTreeMap<String, StandIns>,
    waiting: &[StandIn],
    surge_ends: std::time::Duration,
    effects: &mut Effects,
) -> BTreeMap<String, StandIns> {
    let ended = stand_in::ended(stand_ins, waiting).into_iter().collect();
    for wanted in waiting {
        let deployment = wanted.shrink.deployment.as_str();
        let set = stand_ins.entry(deployment.to_string()).or_default();
        let live = seen.workers_of(deployment);
        set.keep_live(live.iter().map(|w| w.name.as_str()));
        if !set.starting(wanted) {
            continue;
        }
        // Only a worker with a metrics port can be asked: without one, nothing to read either.
        if live.iter().all(|w| w.address.is_none()) {
            debug!(deployment, "no stand-ins: no worker has a metrics port");
            set.started = true;
            continue;
        }
        let Some(reading) = seen.work_of(&live) else {
            debug!(deployment, "no stand-ins: no worker answered");
            set.started = true;
            continue;
        };
        // `start` puts those standing in already first.
        let candidates = candidates(reading, &live, |_| false);
        let (asked, called_back) = set.start(wanted, &candidates);
        let seconds = stand_in::lapse(surge_ends, seen.now);
        let lanes = wanted.serves.clone();
        effects.asks.extend(asked.iter().map(|pod| Ask {
            pod: pod.clone(),
            request: Request::StandIn {
                lanes: lanes.clone(),
                seconds,
            },
            records: Records::StandIn(deployment.to_string()),
        }));
        effects.asks.extend(called_back.into_iter().map(|pod| Ask {
            pod,
            request: Request::OwnLanes,
            records: Records::Nothing,
        }));
        if asked.is_empty() {
            continue;
        }
        let note = standing_in_note(wanted, &asked, seconds);
        info!(deployment, workers = asked.len(), "{note}");
        effects.events.push((EventType::Normal, "StandingIn", note));
    }
    ended
}

/// "2 shared workers serve lane urgent until the new workers are ready, before Deployment D
/// shrinks 4 → 2 (at most 2m15s): a, b", for the event.
fn standing_in_note(wanted: &StandIn, asked: &[String], seconds: u64) -> String {
    // Only shared workers stand in: a stand-in narrows a worker's lanes.
    let (who, serve) = match asked.len() {
        1 => ("shared worker", "serves"),
        _ => ("shared workers", "serve"),
    };
    let lanes = match wanted.serves.len() {
        1 => "lane",
        _ => "lanes",
    };
    format!(
        "{} {who} {serve} {lanes} {} until the new workers are ready, before Deployment {} \
         shrinks {} → {} (at most {}): {}",
        asked.len(),
        wanted.serves.join(", "),
        wanted.shrink.deployment,
        wanted.shrink.live,
        wanted.shrink.to,
        human_seconds(seconds as f64),
        asked.join(", ")
    )
}

/// Sends the workers of ended stand-ins that no drain holds (a drain ends a stand-in in the
/// worker) back to their own lanes. Best effort: a worker not reached now goes back when its
/// stand-in lapses.
pub(super) fn end(
    seen: &Seen<'_>,
    ended: BTreeMap<String, StandIns>,
    drains: &BTreeMap<String, Drain>,
    effects: &mut Effects,
) {
    for (deployment, stand_ins) in ended {
        let names = stand_ins.maybe_standing_in();
        let drained = drains.get(&deployment);
        let back: Vec<String> = seen
            .workers_of(&deployment)
            .into_iter()
            .filter(|w| names.contains(&w.name))
            .filter(|w| drained.is_none_or(|d| !d.pods.contains_key(&w.name)))
            .map(|w| w.name.clone())
            .collect();
        if back.is_empty() {
            continue;
        }
        info!(
            deployment,
            workers = back.len(),
            "stand-in over: the workers serve their own lanes again"
        );
        effects.asks.extend(back.into_iter().map(|pod| Ask {
            pod,
            request: Request::OwnLanes,
            records: Records::Nothing,
        }));
    }
}
