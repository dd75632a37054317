//! The drain before a shrink, without I/O: which workers a shrink by k drains (the k the
//! ReplicaSet controller will delete once they cost least), how long it waits for them, what to
//! ask each worker, and what their answers mean for the shrink. A drain never holds a shrink past
//! its timeout; a drain the operator forgets, or calls off, lapses in the worker. The requests
//! themselves are planned in `plan/drains.rs`.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use super::shrink::Shrink;
use crate::controller::protocol::request_seconds;

/// The most a shrink waits for its drained workers by default (`--drain-timeout`): what the
/// surge waits for new workers, so neither outlasts the other. The lanes' job times usually
/// bound it much lower (see [`drain_timeout`]).
pub const DEFAULT_DRAIN_TIMEOUT: Duration = Duration::from_secs(120);
/// How often a reconcile comes back while a drained worker is still busy: a fraction of the
/// jobs that make draining worth it (a second and more), so the shrink follows their end closely.
pub(crate) const DRAIN_POLL: Duration = Duration::from_millis(500);
/// How often a drain whose workers are all idle is renewed until its shrink goes.
pub(crate) const DRAIN_RENEW: Duration = Duration::from_secs(5);
/// How many of the served lanes' longest mean job time a drain waits at most: a job three times
/// its lane's mean is rare (5 % of exponential job times, none of 2–4 s uniform ones).
const JOB_TIMES: f64 = 3.0;
/// The shortest drain timeout: room for the requests themselves on lanes of 20 ms jobs.
const SHORTEST_DRAIN: Duration = Duration::from_secs(2);
/// How much longer than its drain's timeout a worker holds off new jobs: the time from the
/// shrink to its SIGTERM (the Deployment, ReplicaSet and kubelet steps), with room to spare.
const LAPSE_MARGIN: Duration = Duration::from_secs(15);
/// How long a drained worker's idle answer is trusted: half of [`LAPSE_MARGIN`], so the drain it
/// answered still holds for as long again when the shrink it lets go is written. Answers come
/// every [`DRAIN_RENEW`] at the latest while the reconciles keep up; after a stall (failed
/// reconciles, a backlog) the worker is asked again before anything stops.
pub(crate) const FRESH_ANSWER: Duration = Duration::from_millis(7_500);

/// One Deployment's drain, remembered between reconciles. Times are since the process started.
#[derive(Clone, Debug, Default, PartialEq)]
pub(crate) struct Drain {
    /// Whether its workers were chosen: a drain starts when first advanced.
    pub(crate) started: bool,
    /// The count the Deployment shrinks to.
    pub(crate) to: i32,
    /// How long a drained worker may take to finish its job.
    pub(crate) timeout: Duration,
    /// The workers draining, by Pod name.
    pub(crate) pods: BTreeMap<String, Drained>,
    /// Pods that answered without draining: ranked as before, not asked again for this drain.
    pub(crate) refused: BTreeSet<String>,
    /// A drained worker refused since the workers were chosen: another is chosen in its place.
    pub(crate) rechoose: bool,
    /// No worker could be chosen: none answered and Prometheus did not say what they do.
    pub(crate) unread: bool,
    /// A drained worker known idle does not show its deletion cost -1 in the Pod cache yet: the
    /// shrink waits for it, and the reconcile comes back soon.
    pub(crate) costs_unseen: bool,
    /// Whether the end of the wait was logged.
    pub(crate) over: bool,
    /// A drained worker answered idle since the plan last looked: the next reconcile acts on it,
    /// so it comes soon (as a busy one's poll does), not at the drain's renewal.
    pub(crate) turned_idle: bool,
    /// The drain of a rollover (`rollout/takeover.rs`): its workers make way for the new
    /// template's, not for a smaller Deployment.
    pub(crate) rollover: bool,
}

/// A worker asked to drain.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(crate) struct Drained {
    pub(crate) asked_at: Duration,
    /// Its last answer said `lanepool_worker_busy 0`. False while its state is unknown (no
    /// answer yet, or its last request went unanswered): unknown is never idle.
    pub(crate) idle: bool,
    /// When that answer came (`None`: none yet). An idle answer older than [`FRESH_ANSWER`] says
    /// nothing of now: the drain it answered may have lapsed since.
    pub(crate) answered: Option<Duration>,
}

/// How a drain's wait ended: its drained workers idle and still busy, and how long it waited.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(crate) struct Ended {
    pub(crate) idle: usize,
    pub(crate) still_busy: usize,
    pub(crate) waited: Duration,
}

impl Drain {
    /// Whether the shrink still waits: a drained worker is busy, within the drain timeout.
    pub(crate) fn holds(&self, now: Duration) -> bool {
        self.pods
            .values()
            .any(|p| !p.idle && now.saturating_sub(p.asked_at) < self.timeout)
    }

    /// Whether it only waits for busy drained workers within its timeout: chosen, none refused
    /// since, every mark in place. Its next step needs no reading of what the workers do.
    pub(crate) fn waits_for_busy(&self, now: Duration) -> bool {
        self.started && self.holds(now) && !self.rechoose && !self.unread && !self.costs_unseen
    }

    /// The drained workers not confirmed idle: busy, or not heard from.
    pub(crate) fn unconfirmed(&self) -> usize {
        self.pods.values().filter(|p| !p.idle).count()
    }

    /// The fewest workers `shrink`'s Deployment may run now: all it runs while the drain holds;
    /// then the count it shrinks to plus one for each drained worker not confirmed idle (still
    /// busy at the timeout, or not answering), so the shrink takes only workers known idle, or
    /// ones that do not drain at all (ranked as before). Those left are asked again each
    /// reconcile and go once they answer idle.
    pub(crate) fn floor(&self, shrink: &Shrink, now: Duration) -> i32 {
        // A refusal's replacement is chosen at the next reconcile: until then, hold.
        if self.unread || self.rechoose || self.holds(now) {
            return shrink.live;
        }
        let unconfirmed = i32::try_from(self.unconfirmed()).unwrap_or(i32::MAX);
        shrink.to.saturating_add(unconfirmed).min(shrink.live)
    }

    /// Records that no worker's state could be read to choose from: unknown means hold, so the
    /// shrink waits (see [`Self::floor`]) and the next reconcile tries again.
    pub(crate) fn hold_unread(&mut self) {
        self.unread = true;
    }

    /// The drained workers that are idle: the ones the shrink stops.
    pub(crate) fn idle(&self) -> BTreeSet<String> {
        self.pods
            .iter()
            .filter(|(_, p)| p.idle)
            .map(|(name, _)| name.clone())
            .collect()
    }

    /// How long to ask a worker asked at `asked_at` to drain for: the rest of its timeout and
    /// the time its SIGTERM may take to come, in whole seconds, at most what the protocol allows
    /// (a drain timeout of hours is renewed long before a request's hour is up; asking for more
    /// would be answered 400, a refusal, and the shrink would stop the worker busy).
    fn lapse(&self, asked_at: Duration, now: Duration) -> u64 {
        let left = (asked_at + self.timeout).saturating_sub(now);
        request_seconds(left + LAPSE_MARGIN)
    }

    /// Takes an idle answer older than [`FRESH_ANSWER`] at `now` for unknown: the shrink waits
    /// for the answer to the request this reconcile renews.
    pub(crate) fn forget_stale(&mut self, now: Duration) {
        for drained in self.pods.values_mut() {
            let fresh = drained
                .answered
                .is_some_and(|at| now.saturating_sub(at) <= FRESH_ANSWER);
            drained.idle &= fresh;
        }
    }

    /// Forgets the drained workers that are gone: a drained Pod deleted meanwhile no longer holds
    /// the shrink.
    pub(crate) fn keep_live<'a>(&mut self, live: impl IntoIterator<Item = &'a str>) {
        let live: BTreeSet<&str> = live.into_iter().collect();
        self.pods.retain(|name, _| live.contains(name.as_str()));
    }

    /// Whether the workers are (re)chosen now: at the start, or when the count it shrinks to
    /// changed.
    pub(crate) fn starting(&self, shrink: &Shrink) -> bool {
        !self.started || self.to != shrink.to || self.rechoose
    }

    /// Chooses the workers to drain for `shrink` among `candidates` (see [`choose`]; a Pod that
    /// refused before is not one), each newly chosen one asked at `now`, with a timeout from the
    /// served lanes' `served_job_seconds` (see [`drain_timeout`]). Returns the workers drained
    /// before and no longer chosen: they are called back.
    pub(crate) fn start(
        &mut self,
        shrink: &Shrink,
        candidates: &[Candidate],
        served_job_seconds: &[f64],
        cap: Duration,
        now: Duration,
    ) -> Vec<String> {
        let candidates: Vec<Candidate> = candidates
            .iter()
            .filter(|c| !self.refused.contains(&c.name))
            .cloned()
            .collect();
        let k = usize::try_from(shrink.live - shrink.to).unwrap_or(0);
        let chosen = choose(&candidates, k);
        let called_back = self
            .pods
            .keys()
            .filter(|name| !chosen.contains(name))
            .cloned()
            .collect();
        self.pods.retain(|name, _| chosen.contains(name));
        for name in chosen {
            self.pods.entry(name).or_insert(Drained {
                asked_at: now,
                idle: false,
                answered: None,
            });
        }
        self.started = true;
        self.rechoose = false;
        self.unread = false;
        self.to = shrink.to;
        self.timeout = drain_timeout(served_job_seconds, cap);
        self.over = false;
        called_back
    }

    /// What to ask each of the `live` workers: a drained one to drain for the rest of its time
    /// (asked again each reconcile: a restarted worker drains anew, and the lapse moves on), one
    /// `called_back` to stop draining (`0`); the others nothing.
    pub(crate) fn requests<'a>(
        &self,
        live: impl IntoIterator<Item = &'a str>,
        called_back: &[String],
        now: Duration,
    ) -> Vec<(&'a str, u64)> {
        live.into_iter()
            .filter_map(|name| match self.pods.get(name) {
                Some(drained) => Some((name, self.lapse(drained.asked_at, now))),
                None => called_back.iter().any(|c| c == name).then_some((name, 0)),
            })
            .collect()
    }

    /// Records the workers' answers: a drained worker is idle or busy as it says; one that
    /// refused is not draining, is not asked again for this drain, and another worker is chosen
    /// in its place; one not heard from is not idle (it may have taken a job) and stays drained,
    /// asked again at the next reconcile.
    pub(crate) fn answered(&mut self, answers: BTreeMap<String, DrainAnswer>, now: Duration) {
        for (name, answer) in answers {
            match (answer, self.pods.get_mut(&name)) {
                (DrainAnswer::Draining { busy }, Some(drained)) => {
                    self.turned_idle |= !busy && !drained.idle;
                    drained.idle = !busy;
                    drained.answered = Some(now);
                }
                (DrainAnswer::Unreachable, Some(drained)) => drained.idle = false,
                (DrainAnswer::Refused, Some(_)) => {
                    self.pods.remove(&name);
                    self.refused.insert(name);
                    self.rechoose = true;
                }
                _ => {}
            }
        }
    }

    /// How the wait ended, once: `None` while it holds, when it was told already, or when no
    /// worker drains.
    pub(crate) fn ended(&mut self, now: Duration) -> Option<Ended> {
        if self.holds(now) || self.over || self.pods.is_empty() {
            return None;
        }
        self.over = true;
        let idle = self.pods.values().filter(|p| p.idle).count();
        let first = self.pods.values().map(|p| p.asked_at).min().unwrap_or(now);
        Some(Ended {
            idle,
            still_busy: self.pods.len() - idle,
            waited: now.saturating_sub(first),
        })
    }
}

/// Takes out the drains of Deployments that no longer shrink (not among `shrinks`): called off,
/// their workers are to take jobs again.
pub(crate) fn called_off(
    drains: &mut BTreeMap<String, Drain>,
    shrinks: &[Shrink],
) -> Vec<(String, Drain)> {
    super::shrink::take_out_others(drains, |d| shrinks.iter().any(|s| s.deployment == d))
}

/// How soon to come back for the pool's drains: soon while a drained worker is busy, before
/// the drain lapses while all are idle; `None` without drains.
pub(crate) fn requeue(drains: &BTreeMap<String, Drain>, now: Duration) -> Option<Duration> {
    if drains
        .values()
        .any(|d| d.holds(now) || d.costs_unseen || d.rechoose || d.turned_idle)
    {
        Some(DRAIN_POLL)
    } else {
        drains
            .values()
            .any(|d| !d.pods.is_empty() || d.unread)
            .then_some(DRAIN_RENEW)
    }
}

/// How long a shrink waits for its drained workers: [`JOB_TIMES`] × the longest mean job time of
/// the lanes its workers serve, at least [`SHORTEST_DRAIN`], at most `cap`; `cap` unless every
/// served lane's job time is known (none given, or one that is not a number of seconds: a lane
/// of unknown job time may run jobs of any length).
pub fn drain_timeout(served_job_seconds: &[f64], cap: Duration) -> Duration {
    let known = |s: &f64| s.is_finite() && *s >= 0.0;
    let longest = served_job_seconds
        .iter()
        .all(known)
        .then(|| served_job_seconds.iter().copied().reduce(f64::max))
        .flatten();
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

#[cfg(test)]
impl Candidate {
    /// A ready worker not yet draining, at `cost`: the candidate most tests choose among.
    pub(crate) fn ready_at(name: &str, cost: i32) -> Self {
        Self {
            name: name.into(),
            ready: true,
            cost,
            draining: false,
        }
    }
}

impl DrainAnswer {
    /// Its `outcome` label in `lanepool_operator_drain_answers`.
    pub fn outcome(self) -> &'static str {
        match self {
            DrainAnswer::Draining { busy: true } => "busy",
            DrainAnswer::Draining { busy: false } => "idle",
            DrainAnswer::Refused => "refused",
            DrainAnswer::Unreachable => "unreachable",
        }
    }
}

/// What a worker answered to a drain request.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum DrainAnswer {
    /// It drains, and is busy or idle.
    Draining { busy: bool },
    /// It does not drain: a client error status (404: no such request), or gauges without
    /// `lanepool_worker_draining 1` (a server that answers every path with its metrics).
    Refused,
    /// Not heard from: no answer in time, no connection, a server error, or not asked (the
    /// reconcile's budget ran out, this replica is not the leader). Its state is unknown.
    Unreachable,
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
        assert_eq!(
            drain_timeout(&[f64::NAN, 1.0], CAP),
            CAP,
            "one lane unknown"
        );
        assert_eq!(drain_timeout(&[0.02, f64::INFINITY], CAP), CAP);
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
            started: true,
            to: 5,
            timeout: secs(9.0),
            pods: BTreeMap::from([
                (
                    "a".to_string(),
                    Drained {
                        asked_at: secs(100.0),
                        idle: false,
                        answered: None,
                    },
                ),
                (
                    "b".to_string(),
                    Drained {
                        asked_at: secs(104.0),
                        idle: true,
                        answered: None,
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
        // A drain timeout of hours (20-minute jobs): asked an hour at a time, never refused.
        let long = Drain {
            timeout: secs(3.0 * 3600.0),
            ..Default::default()
        };
        assert_eq!(long.lapse(secs(0.0), secs(0.0)), 3600);
        assert_eq!(long.lapse(secs(0.0), secs(3.0 * 3600.0 - 100.0)), 115);
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
                    answered: None,
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
    fn a_drain_chooses_its_workers_asks_them_and_reads_their_answers() {
        let shrink = Shrink {
            deployment: "jobs-shared".into(),
            live: 4,
            to: 2,
            lanes: vec!["urgent".into(), "batch".into()],
        };
        let mut drain = Drain::default();
        assert!(drain.starting(&shrink));
        let pods = [
            candidate("a", true, 0, false),
            candidate("b", true, 1500, false),
            candidate("c", true, 300, false),
            candidate("d", true, 2900, false),
        ];
        let called_back = drain.start(&shrink, &pods, &[3.0], DEFAULT_DRAIN_TIMEOUT, secs(10.0));
        assert!(called_back.is_empty());
        assert_eq!(drain.pods.keys().collect::<Vec<_>>(), ["a", "c"]);
        assert_eq!(drain.timeout, secs(9.0));
        assert!(!drain.starting(&shrink), "chosen once for this count");
        let live = ["a", "b", "c", "d"];
        assert_eq!(
            drain.requests(live, &called_back, secs(10.0)),
            [("a", 24), ("c", 24)]
        );
        // c drains and is busy, a does not take drain requests: only c holds the shrink.
        drain.answered(
            BTreeMap::from([
                ("a".to_string(), DrainAnswer::Refused),
                ("c".to_string(), DrainAnswer::Draining { busy: true }),
            ]),
            Duration::ZERO,
        );
        assert!(drain.refused.contains("a") && !drain.pods.contains_key("a"));
        assert!(drain.holds(secs(11.0)));
        assert_eq!(drain.ended(secs(11.0)), None);
        // The shrink goes to 3 now: c stays, a (refused) is not chosen again.
        let smaller = Shrink {
            to: 3,
            ..shrink.clone()
        };
        assert!(drain.starting(&smaller));
        let called_back = drain.start(&smaller, &pods, &[3.0], DEFAULT_DRAIN_TIMEOUT, secs(12.0));
        assert!(called_back.is_empty());
        assert_eq!(drain.pods.keys().collect::<Vec<_>>(), ["c"]);
        drain.answered(
            BTreeMap::from([("c".to_string(), DrainAnswer::Draining { busy: false })]),
            Duration::ZERO,
        );
        let ended = drain.ended(secs(13.0)).expect("c is idle");
        assert_eq!(
            (ended.idle, ended.still_busy, ended.waited),
            (1, 0, secs(3.0))
        );
        assert_eq!(drain.ended(secs(14.0)), None, "told once");
        // c is deleted meanwhile: nothing is left to hold the shrink.
        drain.keep_live(["b", "d"]);
        assert!(drain.pods.is_empty());
    }

    #[test]
    fn a_worker_not_heard_from_holds_the_shrink_and_keeps_its_place_past_the_timeout() {
        let shrink = Shrink {
            deployment: "jobs-shared".into(),
            live: 4,
            to: 2,
            lanes: vec!["urgent".into(), "batch".into()],
        };
        let pods = [
            candidate("a", true, 0, false),
            candidate("b", true, 0, false),
            candidate("c", true, 2900, false),
        ];
        let mut drain = Drain::default();
        drain.start(&shrink, &pods, &[1.0], DEFAULT_DRAIN_TIMEOUT, secs(0.0));
        assert_eq!(drain.timeout, secs(3.0));
        // a answers idle; b's request times out (or the budget ran out): b may have a job.
        drain.answered(
            BTreeMap::from([
                ("a".to_string(), DrainAnswer::Draining { busy: false }),
                ("b".to_string(), DrainAnswer::Unreachable),
            ]),
            Duration::ZERO,
        );
        assert!(drain.pods.contains_key("b"), "not dropped as a refusal");
        assert!(!drain.rechoose && drain.refused.is_empty());
        assert!(drain.holds(secs(1.0)));
        assert_eq!(
            drain.floor(&shrink, secs(1.0)),
            4,
            "held whole while it waits"
        );
        // Past the timeout, b still unheard: the shrink takes only a, the worker known idle.
        assert!(!drain.holds(secs(4.0)));
        assert_eq!(drain.floor(&shrink, secs(4.0)), 3);
        assert_eq!(
            drain.requests(["a", "b", "c"], &[], secs(4.0)),
            [("a", 15), ("b", 15)],
            "b is asked again, and keeps draining"
        );
        // b was idle after all (a job in hand that ended, an answer that got through).
        let an_idle_answer =
            BTreeMap::from([("b".to_string(), DrainAnswer::Draining { busy: false })]);
        drain.answered(an_idle_answer, Duration::ZERO);
        assert_eq!(drain.floor(&shrink, secs(5.0)), 2);
        // An idle worker that goes silent is not idle any more: it may have taken a job.
        drain.answered(
            BTreeMap::from([("a".to_string(), DrainAnswer::Unreachable)]),
            Duration::ZERO,
        );
        assert_eq!(drain.floor(&shrink, secs(6.0)), 3);
    }

    #[test]
    fn a_drained_worker_that_refuses_is_replaced_and_an_unread_pool_holds_its_shrink() {
        let shrink = Shrink {
            deployment: "jobs-shared".into(),
            live: 3,
            to: 2,
            lanes: vec!["batch".into()],
        };
        let pods = [
            candidate("old", true, 0, false),
            candidate("new", true, 1500, false),
            candidate("busy", true, 2900, false),
        ];
        let mut drain = Drain::default();
        // No worker answered and Prometheus did not say: nothing is known idle, nothing goes.
        drain.hold_unread();
        assert_eq!(drain.floor(&shrink, secs(0.0)), 3);
        assert!(drain.starting(&shrink), "tried again");
        assert_eq!(
            requeue(&BTreeMap::from([("s".into(), drain.clone())]), secs(0.0)),
            Some(DRAIN_RENEW)
        );
        drain.start(&shrink, &pods, &[3.0], DEFAULT_DRAIN_TIMEOUT, secs(1.0));
        assert_eq!(drain.pods.keys().collect::<Vec<_>>(), ["old"]);
        assert_eq!(drain.floor(&shrink, secs(1.0)), 3);
        // "old" runs a worker that does not take drains (a 404): another is chosen, and until
        // it is, the shrink waits.
        drain.answered(
            BTreeMap::from([("old".to_string(), DrainAnswer::Refused)]),
            Duration::ZERO,
        );
        assert!(drain.starting(&shrink));
        assert_eq!(drain.floor(&shrink, secs(1.5)), 3);
        let drains = BTreeMap::from([("s".into(), drain.clone())]);
        assert_eq!(requeue(&drains, secs(1.5)), Some(DRAIN_POLL));
        drain.start(&shrink, &pods, &[3.0], DEFAULT_DRAIN_TIMEOUT, secs(2.0));
        assert_eq!(drain.pods.keys().collect::<Vec<_>>(), ["new"]);
        assert!(!drain.starting(&shrink));
        // With no worker that drains left, the shrink goes as ranked, as it always did.
        drain.answered(
            BTreeMap::from([("new".to_string(), DrainAnswer::Refused)]),
            Duration::ZERO,
        );
        assert_eq!(
            drain.floor(&shrink, secs(2.5)),
            3,
            "not before the last is tried"
        );
        drain.start(
            &shrink,
            &pods[..2],
            &[3.0],
            DEFAULT_DRAIN_TIMEOUT,
            secs(3.0),
        );
        assert!(drain.pods.is_empty());
        assert_eq!(drain.floor(&shrink, secs(3.0)), 2);
    }

    #[test]
    fn a_shrink_called_off_ends_its_drain_and_calls_its_workers_back() {
        let mut drains = BTreeMap::from([
            (
                "jobs-shared".to_string(),
                Drain {
                    started: true,
                    to: 5,
                    ..Default::default()
                },
            ),
            (
                "jobs-urgent-reserved".to_string(),
                Drain {
                    started: true,
                    to: 1,
                    ..Default::default()
                },
            ),
        ]);
        let still = [Shrink {
            deployment: "jobs-shared".into(),
            live: 7,
            to: 5,
            lanes: vec![],
        }];
        let off = called_off(&mut drains, &still);
        assert_eq!(off.len(), 1);
        assert_eq!(off[0].0, "jobs-urgent-reserved");
        assert_eq!(drains.keys().collect::<Vec<_>>(), ["jobs-shared"]);
        assert!(called_off(&mut drains, &[]).len() == 1 && drains.is_empty());
        // Workers no longer chosen when a shrink gets smaller are called back with 0.
        let mut drain = Drain::default();
        let shrink = Shrink {
            deployment: "d".into(),
            live: 3,
            to: 1,
            lanes: vec![],
        };
        let pods = [
            candidate("a", true, 0, false),
            candidate("b", true, 0, false),
            candidate("c", true, 9, false),
        ];
        drain.start(&shrink, &pods, &[], DEFAULT_DRAIN_TIMEOUT, secs(0.0));
        let back = drain.start(
            &Shrink { to: 2, ..shrink },
            &pods,
            &[],
            DEFAULT_DRAIN_TIMEOUT,
            secs(1.0),
        );
        assert_eq!(back, ["b"]);
        assert_eq!(
            drain.requests(["a", "b", "c"], &back, secs(1.0)),
            [("a", 134), ("b", 0)]
        );
    }
}
