//! The rollout's promises, checked on generated histories rather than chosen examples: a shrink
//! stops no worker that is not confirmed idle (or that does not drain at all), unknown holds, a
//! shrink never goes before the Deployments taking over are ready (or the surge times out), a
//! rollover opens no more gates than old workers it may stop, and a growth called off sends
//! every stand-in back.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use proptest::prelude::*;

use super::drain::{Candidate, Drain, DrainAnswer};
use super::shrink::{Shrink, StandIn};
use super::stand_in::{StandIns, ended};
use super::surge::{Counts, step};
use super::takeover::{gates_to_open, rollover};

const CAP: Duration = Duration::from_secs(120);

/// One reconcile of a drain: how many seconds after the last, and what each worker answered.
type Round = (u64, Vec<Option<DrainAnswer>>);

fn answer() -> impl Strategy<Value = DrainAnswer> {
    prop_oneof![
        3 => any::<bool>().prop_map(|busy| DrainAnswer::Draining { busy }),
        1 => Just(DrainAnswer::Refused),
        1 => Just(DrainAnswer::Unreachable),
    ]
}

/// A shrink of `live` workers to `to`, its workers' readiness and idle-first costs, and rounds
/// of (seconds later, an answer for each worker: `None` when it was not asked or said nothing).
fn history() -> impl Strategy<Value = (Shrink, Vec<Candidate>, Vec<Round>)> {
    (1i32..12)
        .prop_flat_map(|live| (Just(live), 0..live))
        .prop_flat_map(|(live, to)| {
            let n = usize::try_from(live).unwrap();
            let candidates = prop::collection::vec((any::<bool>(), 0i32..3000), n);
            let round = (
                0u64..20,
                prop::collection::vec(prop::option::of(answer()), n),
            );
            let rounds = prop::collection::vec(round, 1..12);
            (Just(live), Just(to), candidates, rounds)
        })
        .prop_map(|(live, to, workers, rounds)| {
            let shrink = Shrink {
                deployment: "jobs-shared".into(),
                live,
                to,
                lanes: vec!["urgent".into(), "batch".into()],
            };
            let candidates = workers
                .into_iter()
                .enumerate()
                .map(|(i, (ready, cost))| Candidate {
                    name: format!("w{i}"),
                    ready,
                    cost,
                    draining: false,
                })
                .collect();
            (shrink, candidates, rounds)
        })
}

/// One reconcile of a drain as `plan/drains.rs` runs it: choose when starting, then record what
/// the asked workers answered.
fn round(
    drain: &mut Drain,
    shrink: &Shrink,
    candidates: &[Candidate],
    answers: &[Option<DrainAnswer>],
    now: Duration,
) {
    if drain.starting(shrink) {
        drain.start(shrink, candidates, &[1.0, 3.0], CAP, now);
    }
    let asked: BTreeSet<&str> = drain.pods.keys().map(String::as_str).collect();
    let answers = candidates
        .iter()
        .zip(answers)
        .filter(|(c, _)| asked.contains(c.name.as_str()))
        .map(|(c, a)| (c.name.clone(), a.unwrap_or(DrainAnswer::Unreachable)))
        .collect();
    drain.answered(answers, Duration::ZERO);
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]

    #[test]
    fn a_shrink_stops_only_workers_confirmed_idle_or_that_do_not_drain(
        (shrink, candidates, rounds) in history()
    ) {
        let mut drain = Drain::default();
        let mut now = Duration::from_secs(100);
        let mut said_busy_or_nothing: BTreeMap<String, bool> = BTreeMap::new();
        for (later, answers) in &rounds {
            now += Duration::from_secs(*later);
            round(&mut drain, &shrink, &candidates, answers, now);
            for (c, a) in candidates.iter().zip(answers) {
                if drain.pods.contains_key(&c.name) {
                    let unknown = !matches!(a, Some(DrainAnswer::Draining { busy: false }));
                    said_busy_or_nothing.insert(c.name.clone(), unknown);
                }
            }
            let floor = drain.floor(&shrink, now);
            prop_assert!(floor >= shrink.to && floor <= shrink.live, "floor {floor}");
            let stopped = usize::try_from(shrink.live - floor).unwrap();
            let idle = drain.idle();
            prop_assert!(
                stopped <= idle.len() + drain.refused.len(),
                "{stopped} stopped, {} idle, {} refused", idle.len(), drain.refused.len()
            );
            // Idle is what the worker's last answer said: busy or nothing is never idle.
            for name in &idle {
                prop_assert_eq!(said_busy_or_nothing.get(name), Some(&false), "{}", name);
            }
            // A refusal's replacement is chosen at the next reconcile: until then, hold.
            if drain.rechoose {
                prop_assert_eq!(floor, shrink.live);
            }
        }
    }

    #[test]
    fn unknown_holds_the_shrink(live in 1i32..12, to in 0i32..12, later in 0u64..1000) {
        let to = to.min(live - 1);
        let shrink = Shrink {
            deployment: "jobs-shared".into(),
            live,
            to,
            lanes: vec!["batch".into()],
        };
        let mut drain = Drain::default();
        drain.hold_unread();
        prop_assert_eq!(drain.floor(&shrink, Duration::from_secs(later)), live);
    }

    #[test]
    fn a_shrink_never_goes_before_the_deployments_taking_over_are_ready(
        deployments in prop::collection::vec(
            (0i32..10, prop::option::of(0i32..10), 0i32..10, any::<bool>()),
            1..6,
        ),
        waited in prop::option::of(0u64..200),
    ) {
        let counts: Vec<Counts> = deployments
            .iter()
            .map(|&(target, live, ready, takes_over)| Counts { target, live, ready, takes_over })
            .collect();
        let timeout = Duration::from_secs(120);
        let waited = waited.map(Duration::from_secs);
        let now = step(&counts, waited, timeout);
        let taken_over = counts
            .iter()
            .filter(|c| !c.shrinks() && c.takes_over)
            .all(|c| c.ready >= c.target);
        let timed_out = waited.unwrap_or_default() >= timeout;
        for (c, applied) in counts.iter().zip(&now.apply) {
            // Growth goes out at once, and nothing is taken below its target.
            prop_assert!(*applied >= c.target);
            if !c.shrinks() {
                prop_assert_eq!(*applied, c.target);
            }
            if let Some(live) = c.live
                && *applied < live
            {
                prop_assert!(taken_over || timed_out, "{counts:?} → {:?}", now.apply);
            }
        }
    }

    #[test]
    fn a_rollover_opens_no_more_gates_than_old_workers_it_may_stop(
        (shrink, candidates, rounds) in history(),
        waiting in 0usize..12,
    ) {
        let old = usize::try_from(shrink.live).unwrap();
        let rollover = rollover("jobs-shared", old, waiting, shrink.lanes.clone());
        let mut drain = Drain { rollover: true, ..Drain::default() };
        let mut now = Duration::from_secs(100);
        prop_assert_eq!(gates_to_open(&rollover, &drain, waiting, now), 0, "nothing read yet");
        for (later, answers) in &rounds {
            now += Duration::from_secs(*later);
            round(&mut drain, &rollover, &candidates, answers, now);
            let open = gates_to_open(&rollover, &drain, waiting, now);
            prop_assert!(open <= waiting);
            prop_assert!(
                open <= drain.idle().len() + drain.refused.len(),
                "{open} gates, {} idle, {} refused", drain.idle().len(), drain.refused.len()
            );
        }
    }

    #[test]
    fn a_growth_called_off_sends_every_stand_in_back(
        sets in prop::collection::btree_map(
            "[a-d]", prop::collection::btree_set("w[0-9]", 0..5), 0..4,
        ),
        still_waiting in prop::collection::btree_set("[a-d]", 0..4),
    ) {
        let mut stand_ins: BTreeMap<String, StandIns> = sets
            .iter()
            .map(|(deployment, pods)| {
                let set = StandIns { pods: pods.clone(), started: true, ..StandIns::default() };
                (deployment.clone(), set)
            })
            .collect();
        let waiting: Vec<StandIn> = still_waiting
            .iter()
            .map(|deployment| StandIn {
                shrink: Shrink {
                    deployment: deployment.clone(),
                    live: 3,
                    to: 1,
                    lanes: vec!["urgent".into(), "batch".into()],
                },
                serves: vec!["urgent".into()],
            })
            .collect();
        let back = ended(&mut stand_ins, &waiting);
        // Every worker standing in is either still waited for or sent back: none is lost.
        for (deployment, pods) in &sets {
            let kept = stand_ins.get(deployment).map(|s| s.pods.clone());
            let sent = back.iter().find(|(d, _)| d == deployment).map(|(_, s)| s.pods.clone());
            match still_waiting.contains(deployment) {
                true => prop_assert_eq!(kept.as_ref(), Some(pods)),
                false => prop_assert_eq!(sent.as_ref(), Some(pods)),
            }
        }
        // With no growth waited for any more, all of them go back.
        let mut all = stand_ins.clone();
        let every = ended(&mut all, &[]);
        prop_assert!(all.is_empty());
        prop_assert_eq!(every.len(), stand_ins.len());
    }
}
