//! Drained scale-downs: before a Deployment shrinks by k, the k workers the idle-first ranking
//! would stop first are asked at their `metrics` port to take no new job (`POST /drain?seconds=N`),
//! and that Deployment's shrink waits, across reconciles, until they report
//! `lanepool_worker_busy 0` or the drain timeout ends; they then cost least to delete. A drain
//! never holds another Deployment's growth, never holds a shrink past its timeout, and a worker
//! that does not drain (a 404, no answer, no `lanepool_worker_draining 1` in its answer) is
//! ranked as before. A drain the operator forgets, or calls off, lapses in the worker.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use k8s_openapi::api::core::v1::Pod;
use kube::ResourceExt;
use kube::runtime::events::EventType;
use tracing::{info, warn};

use super::context::Context;
use super::idle_first::{self, BUSY_METRIC, gauge_values, metrics_address};
use super::pods::PoolPods;
use crate::api::LanePool;
use crate::duration::human_seconds;
use crate::prometheus::Connection;

/// The gauge a worker sets to 1 while a drain request keeps it from taking new jobs.
pub const DRAINING_METRIC: &str = "lanepool_worker_draining";
/// The most a shrink waits for its drained workers by default (`--drain-timeout`): what the
/// surge waits for new workers, so neither outlasts the other. The lanes' job times usually
/// bound it much lower (see [`drain_timeout`]).
pub const DEFAULT_DRAIN_TIMEOUT: Duration = Duration::from_secs(120);
/// How often a reconcile comes back while a drained worker is still busy: a fraction of the
/// jobs that make draining worth it (a second and more), so the shrink follows their end closely.
pub(super) const DRAIN_POLL: Duration = Duration::from_millis(500);
/// How often a drain whose workers are idle is renewed while the shrink waits for the surge.
pub(super) const DRAIN_RENEW: Duration = Duration::from_secs(5);
/// How many of the served lanes' longest mean job time a drain waits at most: a job three times
/// its lane's mean is rare (5 % of exponential job times, none of 2–4 s uniform ones).
const JOB_TIMES: f64 = 3.0;
/// The shortest drain timeout: room for the requests themselves on lanes of 20 ms jobs.
const SHORTEST_DRAIN: Duration = Duration::from_secs(2);
/// How much longer than its drain's timeout a worker holds off new jobs: the time from the
/// shrink to its SIGTERM (the Deployment, ReplicaSet and kubelet steps), with room to spare.
const LAPSE_MARGIN: Duration = Duration::from_secs(15);

/// One Deployment's drain, remembered between reconciles. Times are since the process started.
#[derive(Clone, Debug, Default, PartialEq)]
pub(super) struct Drain {
    /// The Deployment's Pod selector, to find the drained workers again.
    pub(super) selector: String,
    /// The count the Deployment shrinks to.
    pub(super) to: i32,
    /// How long a drained worker may take to finish its job.
    pub(super) timeout: Duration,
    /// The workers draining, by Pod name.
    pub(super) pods: BTreeMap<String, Drained>,
    /// Pods that answered without draining: ranked as before, not asked again for this drain.
    pub(super) refused: BTreeSet<String>,
    /// Whether the end of the wait was logged.
    pub(super) over: bool,
}

/// A worker asked to drain.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(super) struct Drained {
    pub(super) asked_at: Duration,
    /// Its last answer said `lanepool_worker_busy 0`.
    pub(super) idle: bool,
}

impl Drain {
    /// Whether the shrink still waits: a drained worker is busy, within the drain timeout.
    pub(super) fn holds(&self, now: Duration) -> bool {
        self.pods
            .values()
            .any(|p| !p.idle && now.saturating_sub(p.asked_at) < self.timeout)
    }

    /// The drained workers that are idle: the ones the shrink stops.
    pub(super) fn idle(&self) -> BTreeSet<String> {
        self.pods
            .iter()
            .filter(|(_, p)| p.idle)
            .map(|(name, _)| name.clone())
            .collect()
    }

    /// How long to ask a worker asked at `asked_at` to drain for: the rest of its timeout and
    /// the time its SIGTERM may take to come, in whole seconds.
    fn lapse(&self, asked_at: Duration, now: Duration) -> u64 {
        let left = (asked_at + self.timeout).saturating_sub(now);
        (left + LAPSE_MARGIN).as_secs_f64().ceil() as u64
    }
}

/// How soon to come back for the pool's drains: soon while a drained worker is busy, before
/// the drain lapses while all are idle; `None` without drains.
pub(super) fn requeue(drains: &BTreeMap<String, Drain>, now: Duration) -> Option<Duration> {
    if drains.values().any(|d| d.holds(now)) {
        Some(DRAIN_POLL)
    } else {
        drains
            .values()
            .any(|d| !d.pods.is_empty())
            .then_some(DRAIN_RENEW)
    }
}

/// How long a shrink waits for its drained workers: [`JOB_TIMES`] × the longest mean job time of
/// the lanes its workers serve, at least [`SHORTEST_DRAIN`], at most `cap`; `cap` when no served
/// lane's job time is known.
pub fn drain_timeout(served_job_seconds: &[f64], cap: Duration) -> Duration {
    let longest = served_job_seconds
        .iter()
        .copied()
        .filter(|s| s.is_finite() && *s >= 0.0)
        .reduce(f64::max);
    match longest {
        Some(seconds) => Duration::try_from_secs_f64(seconds * JOB_TIMES)
            .unwrap_or(cap)
            .max(SHORTEST_DRAIN)
            .min(cap),
        None => cap,
    }
}

/// A Pod that could be drained.
#[derive(Clone, Debug, PartialEq)]
pub struct Candidate {
    pub name: String,
    /// Running and Ready: the ReplicaSet controller deletes every other Pod first.
    pub ready: bool,
    /// Its idle-first cost: the lower, the sooner it is free.
    pub cost: i32,
    /// Draining already for this shrink.
    pub draining: bool,
}

/// The Pods to drain for a shrink by `k`: the k the ReplicaSet controller will delete once
/// they cost least. Pods that are not ready go first whatever their cost (a worker failing its
/// readiness probe may still hold a job), then those draining already (they have stopped taking
/// jobs), then the cheapest (idle, then the jobs that should end soonest).
pub fn choose(candidates: &[Candidate], k: usize) -> Vec<String> {
    let mut ranked: Vec<&Candidate> = candidates.iter().collect();
    ranked.sort_by_key(|c| (c.ready, !c.draining, c.cost, c.name.clone()));
    ranked.into_iter().take(k).map(|c| c.name.clone()).collect()
}

/// What a worker answered to a drain request.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Answer {
    /// It drains, and is busy or idle.
    Draining { busy: bool },
    /// It does not drain: an error status, or gauges without `lanepool_worker_draining 1` (a
    /// server that answers every path with its metrics).
    Refused,
}

/// Reads a worker's answer to `POST /drain?seconds=N` (`0`: an answer to calling it off).
pub fn read_answer(status: u16, text: &str) -> Answer {
    let draining = gauge_values(text, DRAINING_METRIC).iter().any(|v| *v > 0.0);
    if status != 200 || !draining {
        return Answer::Refused;
    }
    Answer::Draining {
        busy: gauge_values(text, BUSY_METRIC).iter().any(|v| *v > 0.0),
    }
}

/// Whether the ReplicaSet controller counts the Pod as ready: bound, Running and Ready.
pub(super) fn pod_ready(pod: &Pod) -> bool {
    let bound = pod.spec.as_ref().is_some_and(|s| s.node_name.is_some());
    let status = pod.status.as_ref();
    let running = status.and_then(|s| s.phase.as_deref()) == Some("Running");
    let ready = status
        .and_then(|s| s.conditions.as_ref())
        .into_iter()
        .flatten()
        .any(|c| c.type_ == "Ready" && c.status == "True");
    bound && running && ready
}

/// Asks each of `pods` to drain for its seconds (`0`: stop draining); their answers by name
/// (`Refused` too for a Pod with no metrics port, no answer in time, or a redirect).
async fn ask(workers: &PoolPods<'_>, pods: Vec<(&Pod, u64)>) -> BTreeMap<String, Answer> {
    // Owned names and addresses: the requests outlive no borrow of the listed Pods.
    let mut answers = BTreeMap::new();
    let mut reachable = Vec::new();
    for (pod, seconds) in pods {
        match metrics_address(pod) {
            Some(address) => reachable.push((pod.name_any(), address, seconds)),
            None => {
                answers.insert(pod.name_any(), Answer::Refused);
            }
        }
    }
    for (name, answer) in workers.post_drains(reachable).await {
        let answer = match answer {
            Ok((status, text)) => read_answer(status, &text),
            Err(_) => Answer::Refused,
        };
        answers.insert(name, answer);
    }
    answers
}

/// A Deployment about to shrink: its name, Pod selector, the count it has and the one it
/// shrinks to, and the lanes its workers serve.
#[derive(Clone, Debug, PartialEq)]
pub(super) struct Shrink {
    pub(super) deployment: String,
    pub(super) selector: String,
    pub(super) live: i32,
    pub(super) to: i32,
    pub(super) lanes: Vec<String>,
}

/// Advances the drains of the pool's shrinking Deployments (`shrinks`, as decided, whether or
/// not the surge lets them go yet) and calls off those of Deployments that no longer shrink.
/// Returns the Deployments whose shrink must still wait for its drained workers.
pub(super) async fn drain_before_shrinks(
    pool: &LanePool,
    ctx: &Context,
    workers: &PoolPods<'_>,
    connection: Option<&Connection>,
    drains: &mut BTreeMap<String, Drain>,
    shrinks: &[Shrink],
    now: Duration,
) -> BTreeSet<String> {
    let called_off: Vec<String> = drains
        .keys()
        .filter(|d| !shrinks.iter().any(|s| s.deployment == **d))
        .cloned()
        .collect();
    for deployment in called_off {
        let Some(drain) = drains.remove(&deployment) else {
            continue;
        };
        // Best effort: a worker not reached now takes jobs again when its drain lapses.
        if let Ok(live) = workers.workers_of(&deployment, &drain.selector).await {
            let back: Vec<(&Pod, u64)> = live
                .iter()
                .filter(|p| drain.pods.contains_key(&p.name_any()))
                .map(|p| (p, 0))
                .collect();
            ask(workers, back).await;
        }
        info!(
            deployment,
            workers = drain.pods.len(),
            "drain called off: the Deployment no longer shrinks; its workers take jobs again"
        );
    }
    let mut held = BTreeSet::new();
    for shrink in shrinks {
        let drain = drains.entry(shrink.deployment.clone()).or_default();
        if advance(pool, ctx, workers, connection, drain, shrink, now).await {
            held.insert(shrink.deployment.clone());
        }
    }
    held
}

/// One reconcile of one Deployment's drain: choose its workers (at the start, or when the count
/// it shrinks to changed), ask them (again: a restarted worker drains anew, and the drain's
/// lapse moves on), and say whether the shrink still waits.
async fn advance(
    pool: &LanePool,
    ctx: &Context,
    workers: &PoolPods<'_>,
    connection: Option<&Connection>,
    drain: &mut Drain,
    shrink: &Shrink,
    now: Duration,
) -> bool {
    let deployment = shrink.deployment.as_str();
    // Only the Deployment's own workers: a Pod that merely carries its labels takes no slot.
    let live = match workers.workers_of(deployment, &shrink.selector).await {
        Ok(live) => live,
        Err(error) => {
            warn!(deployment, %error, "drained workers not asked");
            return drain.holds(now);
        }
    };
    // A drained Pod deleted meanwhile no longer holds the shrink.
    drain
        .pods
        .retain(|name, _| live.iter().any(|p| p.name_any() == *name));
    let starting = drain.to != shrink.to || drain.selector.is_empty();
    let mut called_back = Vec::new();
    if starting {
        let live_refs: Vec<&Pod> = live.iter().collect();
        let Some(reading) =
            idle_first::read_work(pool, ctx, workers, connection, deployment, &live_refs).await
        else {
            warn!(
                deployment,
                "workers not drained: no worker answered; ranked only"
            );
            return drain.holds(now);
        };
        let served: Vec<f64> = shrink
            .lanes
            .iter()
            .filter_map(|lane| reading.job_seconds.get(lane).copied())
            .collect();
        let candidates: Vec<Candidate> = live
            .iter()
            .filter(|p| !drain.refused.contains(&p.name_any()))
            .map(|p| Candidate {
                name: p.name_any(),
                ready: pod_ready(p),
                cost: reading.cost(&p.name_any()),
                draining: drain.pods.contains_key(&p.name_any()),
            })
            .collect();
        let k = usize::try_from(shrink.live - shrink.to).unwrap_or(0);
        let chosen = choose(&candidates, k);
        called_back = drain
            .pods
            .keys()
            .filter(|name| !chosen.contains(name))
            .cloned()
            .collect();
        drain.pods.retain(|name, _| chosen.contains(name));
        for name in chosen {
            drain.pods.entry(name).or_insert(Drained {
                asked_at: now,
                idle: false,
            });
        }
        drain.selector = shrink.selector.clone();
        drain.to = shrink.to;
        drain.timeout = drain_timeout(&served, ctx.settings.drain_timeout);
        drain.over = false;
    }
    let requests: Vec<(&Pod, u64)> = live
        .iter()
        .filter_map(|p| {
            let name = p.name_any();
            match drain.pods.get(&name) {
                Some(drained) => Some((p, drain.lapse(drained.asked_at, now))),
                None => called_back.contains(&name).then_some((p, 0)),
            }
        })
        .collect();
    let answers = ask(workers, requests).await;
    for (name, answer) in answers {
        match (answer, drain.pods.get_mut(&name)) {
            (Answer::Draining { busy }, Some(drained)) => drained.idle = !busy,
            (Answer::Refused, Some(_)) => {
                drain.pods.remove(&name);
                drain.refused.insert(name);
            }
            _ => {}
        }
    }
    if starting && !drain.pods.is_empty() {
        let names: Vec<&str> = drain.pods.keys().map(String::as_str).collect();
        let note = format!(
            "{} {} finish their jobs and take no new ones before Deployment {deployment} shrinks \
             {} → {} (at most {}): {}",
            drain.pods.len(),
            workers_of(shrink),
            shrink.live,
            shrink.to,
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
    let holds = drain.holds(now);
    if !holds && !drain.over && !drain.pods.is_empty() {
        drain.over = true;
        let idle = drain.pods.values().filter(|p| p.idle).count();
        let first = drain.pods.values().map(|p| p.asked_at).min().unwrap_or(now);
        info!(
            deployment,
            idle,
            still_busy = drain.pods.len() - idle,
            ms = now.saturating_sub(first).as_millis() as u64,
            "drained: the shrink may go ahead"
        );
    }
    holds
}

/// "shared workers" or "reserved workers of lane L", for the event.
fn workers_of(shrink: &Shrink) -> String {
    match shrink.lanes.as_slice() {
        [lane] if shrink.deployment.ends_with("-reserved") => {
            format!("reserved workers of lane {lane}")
        }
        _ => "shared workers".into(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const CAP: Duration = DEFAULT_DRAIN_TIMEOUT;

    fn secs(s: f64) -> Duration {
        Duration::from_secs_f64(s)
    }

    #[test]
    fn a_drain_waits_three_job_times_of_the_longest_served_lane_within_its_bounds() {
        // Shared workers serving urgent (20 ms) and batch (3 s): 9 s.
        assert_eq!(drain_timeout(&[0.02, 3.0], CAP), secs(9.0));
        // Reserved workers of 20 ms jobs: the shortest drain.
        assert_eq!(drain_timeout(&[0.02], CAP), SHORTEST_DRAIN);
        // Hour-long jobs: the cap.
        assert_eq!(drain_timeout(&[3600.0], CAP), CAP);
        // No job time known (or none that makes sense): the cap.
        assert_eq!(drain_timeout(&[], CAP), CAP);
        assert_eq!(drain_timeout(&[f64::NAN, -1.0], CAP), CAP);
        assert_eq!(drain_timeout(&[f64::NAN, 1.0], CAP), secs(3.0));
        // A cap below the shortest drain still wins.
        assert_eq!(drain_timeout(&[3.0], secs(1.0)), secs(1.0));
    }

    fn candidate(name: &str, ready: bool, cost: i32, draining: bool) -> Candidate {
        Candidate {
            name: name.into(),
            ready,
            cost,
            draining,
        }
    }

    #[test]
    fn the_pods_not_ready_drain_first_then_the_cheapest_ready_workers() {
        let pods = [
            candidate("deep", true, 2900, false),
            candidate("ending", true, 200, false),
            candidate("idle", true, 0, false),
            candidate("halfway", true, 1500, false),
            candidate("starting", false, 0, false),
        ];
        // A shrink by 3: the Pod not ready goes first whatever its cost, then the cheapest.
        assert_eq!(choose(&pods, 3), vec!["starting", "idle", "ending"]);
        assert_eq!(choose(&pods, 1), vec!["starting"]);
        assert_eq!(
            choose(&pods[..4], 5),
            vec!["idle", "ending", "halfway", "deep"]
        );
        // Among Pods none of which is ready (no kubelet has reported them), the cost decides.
        let unready: Vec<Candidate> = pods
            .iter()
            .map(|c| Candidate {
                ready: false,
                ..c.clone()
            })
            .collect();
        assert_eq!(choose(&unready, 2), vec!["idle", "starting"]);
    }

    #[test]
    fn workers_draining_already_keep_draining_when_the_shrink_changes() {
        let pods = [
            candidate("a", true, 0, false),
            candidate("b", true, 1500, true),
            candidate("c", true, 2500, true),
            candidate("d", true, 300, false),
        ];
        // Shrinking by 3 now instead of 2: both keep draining, and the cheapest other joins.
        assert_eq!(choose(&pods, 3), vec!["b", "c", "a"]);
        // By 1 instead of 2: the drained worker whose job should end soonest stays.
        assert_eq!(choose(&pods, 1), vec!["b"]);
    }

    #[test]
    fn a_drain_holds_the_shrink_until_its_workers_are_idle_or_their_time_is_up() {
        let mut drain = Drain {
            selector: "s".into(),
            to: 5,
            timeout: secs(9.0),
            pods: BTreeMap::from([
                (
                    "a".to_string(),
                    Drained {
                        asked_at: secs(100.0),
                        idle: false,
                    },
                ),
                (
                    "b".to_string(),
                    Drained {
                        asked_at: secs(104.0),
                        idle: true,
                    },
                ),
            ]),
            ..Default::default()
        };
        assert!(drain.holds(secs(108.9)));
        assert!(!drain.holds(secs(109.0)), "a's time is up");
        assert_eq!(drain.idle(), BTreeSet::from(["b".to_string()]));
        drain.pods.get_mut("a").unwrap().idle = true;
        assert!(!drain.holds(secs(101.0)));
        // The worker holds off for the rest of the timeout and the margin, in whole seconds.
        assert_eq!(drain.lapse(secs(100.0), secs(100.0)), 24);
        assert_eq!(drain.lapse(secs(100.0), secs(107.5)), 17);
        assert_eq!(drain.lapse(secs(100.0), secs(200.0)), 15);
        // No drained worker (none took the request): nothing holds.
        assert!(!Drain::default().holds(secs(0.0)));
    }

    #[test]
    fn drains_bring_the_reconcile_back_soon_only_while_a_worker_is_busy() {
        let busy = Drain {
            timeout: secs(9.0),
            pods: BTreeMap::from([(
                "a".to_string(),
                Drained {
                    asked_at: secs(0.0),
                    idle: false,
                },
            )]),
            ..Default::default()
        };
        let mut drains = BTreeMap::from([("jobs-shared".to_string(), busy.clone())]);
        assert_eq!(requeue(&drains, secs(1.0)), Some(DRAIN_POLL));
        assert_eq!(requeue(&drains, secs(10.0)), Some(DRAIN_RENEW));
        drains.clear();
        assert_eq!(requeue(&drains, secs(1.0)), None);
    }

    #[test]
    fn only_a_worker_that_says_it_drains_is_draining() {
        let gauges = "# HELP lanepool_worker_busy …\n\
                      lanepool_worker_busy{lane=\"batch\"} 1\n\
                      lanepool_worker_job_started_timestamp_seconds{lane=\"batch\"} 1800000000.000\n\
                      lanepool_worker_draining 1\n";
        assert_eq!(read_answer(200, gauges), Answer::Draining { busy: true });
        let idle = "lanepool_worker_busy 0\nlanepool_worker_draining 1\n";
        assert_eq!(read_answer(200, idle), Answer::Draining { busy: false });
        // A 404, or a server answering every path with gauges that do not say it drains.
        assert_eq!(read_answer(404, "not found\n"), Answer::Refused);
        assert_eq!(
            read_answer(200, "lanepool_worker_busy 1\n"),
            Answer::Refused
        );
        assert_eq!(
            read_answer(200, "lanepool_worker_busy 0\nlanepool_worker_draining 0\n"),
            Answer::Refused
        );
        assert_eq!(read_answer(500, idle), Answer::Refused);
    }
}
