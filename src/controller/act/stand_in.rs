//! Stand-ins, the asking: while the shared Deployment's shrink waits for a growing reserve, the
//! shared workers it will stop are asked at their `metrics` port to take only the reserve's lane
//! (`POST /stand-in?lanes=…&seconds=N`), so a grown reserve serves at once instead of a pod start
//! later. When the surge is over they are drained (which ends a stand-in in the worker) or sent
//! back to their own lanes (`seconds=0`). Which workers and for how long: `rollout/stand_in.rs`. A worker that does not stand in (a 404, no
//! answer, no `lanepool_worker_standing_in 1`) keeps its role until it is replaced, as before.

use std::collections::BTreeMap;
use std::time::Duration;

use kube::ResourceExt;
use kube::runtime::events::EventType;
use tracing::{debug, info};

use crate::controller::observe::work::{Observed, candidates};
use crate::controller::pods::gauge_values;
use crate::controller::pods::{PoolPods, Worker};
use crate::controller::protocol::STANDING_IN_METRIC;
use crate::controller::rollout::StandIn;
use crate::controller::rollout::stand_in::{self, StandIns};
use crate::duration::human_seconds;

/// The outcome of a worker that answered it stands in.
const STANDING_IN: &str = "standing_in";
const UNREACHABLE: &str = "unreachable";

/// `POST /stand-in` to each of `workers`, serving `lanes` for its seconds (`0`: its own lanes
/// again); what each answered: its outcome in `lanepool_operator_stand_in_answers`
/// (`standing_in`, `refused`, `unreachable`).
async fn ask(
    pods: &PoolPods<'_>,
    workers: Vec<(&Worker, u64)>,
    lanes: &[String],
) -> BTreeMap<String, &'static str> {
    let requests = workers
        .into_iter()
        .map(|(worker, seconds)| match seconds {
            0 => (worker, "/stand-in?seconds=0".to_string()),
            _ => (
                worker,
                format!("/stand-in?lanes={}&seconds={seconds}", lanes.join(",")),
            ),
        })
        .collect();
    pods.post(requests)
        .await
        .into_iter()
        .map(|(name, answer)| {
            let outcome = match answer {
                Ok((200, text))
                    if gauge_values(&text, STANDING_IN_METRIC)
                        .iter()
                        .any(|v| *v > 0.0) =>
                {
                    STANDING_IN
                }
                Err(refused) if refused.unknown() => UNREACHABLE,
                Ok(_) | Err(_) => "refused",
            };
            (name, outcome)
        })
        .collect()
}

/// Starts (or re-chooses) the stand-ins of the shrinks waiting for the surge (`waiting`), each
/// asked until `surge_ends` and a margin. Returns the stand-ins of the shrinks that no longer
/// wait, by Deployment: the drain prefers them, and [`end`] sends back those it does not take.
pub(in crate::controller) async fn stand_in_during_surges(
    seen: &Observed<'_>,
    stand_ins: &mut BTreeMap<String, StandIns>,
    waiting: &[StandIn],
    surge_ends: Duration,
    now: Duration,
) -> BTreeMap<String, StandIns> {
    let (pool, ctx, pods) = (seen.pool, seen.ctx, seen.pods);
    let ended = stand_in::ended(stand_ins, waiting).into_iter().collect();
    for wanted in waiting {
        let deployment = wanted.shrink.deployment.as_str();
        let set = stand_ins.entry(deployment.to_string()).or_default();
        let live = pods.workers_of(deployment);
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
        let Some(reading) = seen.work(deployment, &live).await else {
            debug!(deployment, "no stand-ins: no worker answered");
            set.started = true;
            continue;
        };
        // `start` puts those standing in already first.
        let candidates = candidates(&reading, &live, |_| false);
        let (asked, called_back) = set.start(wanted, &candidates);
        let seconds = stand_in::lapse(surge_ends, now);
        let by_name: BTreeMap<&str, &Worker> = live.iter().map(|w| (w.name.as_str(), *w)).collect();
        let requests = asked
            .iter()
            .map(|name| (name, seconds))
            .chain(called_back.iter().map(|name| (name, 0)))
            .filter_map(|(name, seconds)| Some((*by_name.get(name.as_str())?, seconds)))
            .collect();
        let answers = ask(pods, requests, &wanted.serves).await;
        let (namespace, name) = (pool.namespace().unwrap_or_default(), pool.name_any());
        let asked: BTreeMap<String, &str> = answers
            .into_iter()
            .filter(|(name, _)| !called_back.contains(name))
            .inspect(|(_, outcome)| ctx.metrics.stand_in_answered(&namespace, &name, outcome))
            .collect();
        // A worker not heard from may have taken the request late: it is ended with the rest.
        set.unheard.extend(
            asked
                .iter()
                .filter(|(_, outcome)| **outcome == UNREACHABLE)
                .map(|(worker, _)| worker.clone()),
        );
        set.answered(
            asked
                .into_iter()
                .map(|(worker, outcome)| (worker, outcome == STANDING_IN))
                .collect(),
        );
        if set.pods.is_empty() {
            info!(
                deployment,
                refused = set.refused.len(),
                "no stand-ins: the workers do not take stand-in requests"
            );
            continue;
        }
        let names: Vec<&str> = set.pods.iter().map(String::as_str).collect();
        // Only shared workers stand in: a stand-in narrows a worker's lanes.
        let n = set.pods.len();
        let (who, serve) = match n {
            1 => ("shared worker", "serves"),
            _ => ("shared workers", "serve"),
        };
        let lanes = match wanted.serves.len() {
            1 => "lane",
            _ => "lanes",
        };
        let note = format!(
            "{n} {who} {serve} {lanes} {} until the new workers are ready, before Deployment \
             {deployment} shrinks {} → {} (at most {}): {}",
            wanted.serves.join(", "),
            wanted.shrink.live,
            wanted.shrink.to,
            human_seconds(seconds as f64),
            names.join(", ")
        );
        info!(deployment, workers = set.pods.len(), "{note}");
        ctx.event(pool, EventType::Normal, "StandingIn", note).await;
    }
    ended
}

/// Sends the workers of ended stand-ins that no drain holds (`draining`: by Deployment, the Pods
/// asked to drain, which ends their stand-in) back to their own lanes. Best effort: a worker not
/// reached now goes back when its stand-in lapses.
pub(in crate::controller) async fn end(
    pods: &PoolPods<'_>,
    ended: BTreeMap<String, StandIns>,
    draining: impl Fn(&str, &str) -> bool,
) {
    for (deployment, stand_ins) in ended {
        let names = stand_ins.maybe_standing_in();
        let back: Vec<(&Worker, u64)> = pods
            .workers_of(&deployment)
            .into_iter()
            .filter(|w| names.contains(&w.name) && !draining(&deployment, &w.name))
            .map(|w| (w, 0))
            .collect();
        if back.is_empty() {
            continue;
        }
        info!(
            deployment,
            workers = back.len(),
            "stand-in over: the workers serve their own lanes again"
        );
        ask(pods, back, &[]).await;
    }
}
