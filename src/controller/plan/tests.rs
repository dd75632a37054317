//! The plan on plain values: each of the ways a scale-down could stop a busy worker is one call.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::apps::v1::{Deployment, DeploymentSpec, DeploymentStatus};
use kube::api::ObjectMeta;

use super::*;
use crate::api::LanePool;
use crate::controller::cached_pod::CachedPod;
use crate::controller::rollout::Rules;
use crate::controller::rollout::cost::{DRAINED_COST, IDLE_COST, Reading, Work};
use crate::controller::rollout::drain::{self, Drain, DrainAnswer, Drained};
use crate::controller::worker::Worker;
use crate::sizing::Replicas;
use std::collections::BTreeSet;

const SHARED: &str = "jobs-shared";
const RESERVED: &str = "jobs-urgent-reserved";
const NOW: Duration = Duration::from_secs(1000);

fn pool() -> LanePool {
    serde_yaml::from_str(include_str!("../../../examples/lanepool.yaml")).unwrap()
}

fn settings() -> Settings {
    Settings {
        rules: Rules {
            surge_timeout: Duration::from_secs(120),
            rank: true,
            drain: true,
        },
        drain_timeout: Duration::from_secs(120),
        stand_ins: true,
    }
}

fn deployment(name: &str, replicas: i32) -> (String, Deployment) {
    let deployment = Deployment {
        metadata: ObjectMeta {
            name: Some(name.into()),
            ..ObjectMeta::default()
        },
        spec: Some(DeploymentSpec {
            replicas: Some(replicas),
            ..DeploymentSpec::default()
        }),
        status: Some(DeploymentStatus {
            ready_replicas: Some(replicas),
            ..DeploymentStatus::default()
        }),
    };
    (name.to_string(), deployment)
}

/// A ready worker of `deployment`'s newest template, with the deletion cost the cache shows.
fn worker(name: &str, deployment: &str, cost: Option<i32>) -> Worker {
    let pod = CachedPod {
        name: name.into(),
        ready: true,
        address: Some(format!("{name}:9100")),
        deletion_cost: cost.map(|c| c.to_string()),
        containers_ready: true,
        ..CachedPod::default()
    };
    Worker::new(&Arc::new(pod), deployment.into())
}

/// Every worker answered; `busy` run a batch job.
fn reading(workers: &[Worker], busy: &[&str]) -> Reading {
    let work: HashMap<String, Work> = workers
        .iter()
        .map(|w| {
            let work = match busy.contains(&w.name.as_str()) {
                true => Work::Busy {
                    lane: Some("batch".into()),
                    started: None,
                },
                false => Work::Idle,
            };
            (w.name.clone(), work)
        })
        .collect();
    Reading {
        heard: work.keys().cloned().collect::<HashSet<_>>(),
        work,
        job_seconds: BTreeMap::from([("urgent".into(), 0.02), ("batch".into(), 3.0)]),
        now: 1_800_000_000.0,
        scraped: None,
    }
}

fn replicas(reserved: i32, shared: i32) -> Replicas {
    Replicas {
        reserved: BTreeMap::from([("urgent".to_string(), reserved)]),
        shared,
    }
}

/// One plan of the pool running `live` shared workers (and 2 reserved), decided to run `to`.
fn plan_shrink(
    workers: &[Worker],
    busy: &[&str],
    (live, to): (i32, i32),
    steering: &mut Steering,
) -> Effects {
    let work = reading(workers, busy);
    let counts = Counts {
        cached: live,
        applied: live,
        to,
    };
    plan_with(workers, &work, counts, steering, settings())
}

/// The shared Deployment's count as the watch cache has it, as this process last wrote it, and
/// as decided.
struct Counts {
    cached: i32,
    applied: i32,
    to: i32,
}

/// One plan of the pool whose workers are doing `work`, its shared Deployment at `counts`.
fn plan_with(
    workers: &[Worker],
    work: &Reading,
    counts: Counts,
    steering: &mut Steering,
    settings: Settings,
) -> Effects {
    let pool = pool();
    let deployments = BTreeMap::from([deployment(SHARED, counts.cached), deployment(RESERVED, 2)]);
    let (target, applied) = (replicas(2, counts.to), replicas(2, counts.applied));
    let seen = Seen {
        pool: &pool,
        live: &deployments,
        workers,
        work: Some(work),
        inherited: None,
        target: &target,
        applied: Some(&applied),
        now: NOW,
    };
    plan(&seen, steering, settings)
}

fn shared_workers(n: usize) -> Vec<Worker> {
    (0..n)
        .map(|i| worker(&format!("{SHARED}-{i}"), SHARED, None))
        .collect()
}

/// A drain of `SHARED` to 3 that chose `pods` at `NOW`, each idle or not.
fn drain_of(pods: &[(&str, bool)]) -> Drain {
    Drain {
        started: true,
        to: 3,
        timeout: Duration::from_secs(9),
        pods: pods
            .iter()
            .map(|(name, idle)| {
                let drained = Drained {
                    asked_at: NOW,
                    idle: *idle,
                    answered: Some(NOW),
                };
                (name.to_string(), drained)
            })
            .collect(),
        ..Drain::default()
    }
}

fn drains_sent(effects: &Effects) -> Vec<(String, u64)> {
    effects
        .asks
        .iter()
        .filter_map(|ask| match ask.request {
            Request::Drain(seconds) => Some((ask.pod.clone(), seconds)),
            _ => None,
        })
        .collect()
}

#[test]
fn a_drain_answered_idle_shows_its_cost_then_shrinks_then_is_renewed_until_its_pod_is_stopped() {
    let mut steering = Steering::default();
    let mut workers = shared_workers(4);
    let victim = format!("{SHARED}-0");
    // The shrink 4 → 3 starts its drain: the idle worker is chosen and asked; nothing shrinks.
    let busy = ["jobs-shared-1", "jobs-shared-2", "jobs-shared-3"];
    let effects = plan_shrink(&workers, &busy, (4, 3), &mut steering);
    assert_eq!(effects.release.replicas.shared, 4);
    assert_eq!(drains_sent(&effects).len(), 1);
    assert_eq!(drains_sent(&effects)[0].0, victim);
    assert_eq!(effects.events.len(), 1, "{:?}", effects.events);
    // Its answer (idle) is recorded for the next reconcile.
    let answer = Answer::Drain(DrainAnswer::Draining { busy: false });
    let answers = effects.asks.iter().map(|a| (a.clone(), answer)).collect();
    record(&mut steering, answers, NOW);
    // The idle answer is acted on at the next reconcile, which comes soon.
    let soon = steering.requeue(Duration::from_secs(120), NOW);
    assert_eq!(soon, Some(drain::DRAIN_POLL));
    // The next marks it -1, still holding; the one after, with the mark in the cache, shrinks.
    let effects = plan_shrink(&workers, &busy, (4, 3), &mut steering);
    assert_eq!(effects.release.replicas.shared, 4);
    let marked: Vec<&String> = effects
        .costs
        .iter()
        .filter(|(_, cost)| *cost == DRAINED_COST)
        .map(|(pod, _)| pod)
        .collect();
    assert_eq!(marked, [&victim], "{:?}", effects.costs);
    workers[0] = worker(&victim, SHARED, Some(DRAINED_COST));
    let effects = plan_shrink(&workers, &busy, (4, 3), &mut steering);
    assert_eq!(effects.release.replicas.shared, 3);
    assert_eq!(effects.stopped_busy, Some(0));
    // Issue 50, item 2: the shrink is written, and the ReplicaSet controller has not acted (a
    // controller-manager failover, a backlog). The drained worker is asked to drain on: were its
    // drain to lapse, it would take a job while marked to go first.
    assert!(steering.drains.is_empty());
    assert!(steering.shrunk[SHARED].pods.contains_key(&victim));
    for _ in 0..3 {
        let effects = plan_shrink(&workers, &busy, (3, 3), &mut steering);
        assert_eq!(effects.release.replicas.shared, 3);
        let sent = drains_sent(&effects);
        assert!(
            sent.len() == 1 && sent[0].0 == victim && sent[0].1 > 0,
            "{sent:?}"
        );
        assert!(
            effects.costs.is_empty(),
            "its mark stays: {:?}",
            effects.costs
        );
    }
    assert_eq!(
        steering.requeue(Duration::from_secs(120), NOW),
        Some(drain::DRAIN_RENEW)
    );
    // Stopped at last: nothing left to follow.
    let effects = plan_shrink(&workers[1..], &busy, (3, 3), &mut steering);
    assert!(drains_sent(&effects).is_empty());
    assert!(steering.shrunk.is_empty());
}

/// A shrink of shared written with its drained idle worker marked -1, not stopped yet: the
/// worker's name, the steering that follows it, and the 4 workers.
fn written_shrink() -> (String, Steering, Vec<Worker>) {
    let victim = format!("{SHARED}-0");
    let steering = Steering {
        shrunk: BTreeMap::from([(SHARED.to_string(), drain_of(&[(&victim, true)]))]),
        ..Steering::default()
    };
    let mut workers = shared_workers(4);
    workers[0] = worker(&victim, SHARED, Some(DRAINED_COST));
    (victim, steering, workers)
}

#[test]
fn a_drained_worker_the_replicaset_did_not_stop_is_called_back_and_loses_its_mark() {
    let (victim, mut steering, mut workers) = written_shrink();
    // Another Pod went (deleted by hand): the Deployment runs what it is given, the drained one
    // is still there.
    workers.remove(3);
    let effects = plan_shrink(&workers, &[], (3, 3), &mut steering);
    assert_eq!(drains_sent(&effects), [(victim.clone(), 0)]);
    assert_eq!(effects.costs, [(victim, IDLE_COST)]);
    assert!(steering.shrunk.is_empty());
}

#[test]
fn a_shrink_waits_for_the_deployments_rollover_and_never_drains_across_two_templates() {
    // Issue 50, item 3: shared runs workers of two templates; the Deployment controller would
    // take a shrink from both ReplicaSets in proportion, not from the drained workers.
    let mut workers = shared_workers(4);
    for old in &mut workers[..2] {
        old.newest = false;
    }
    let mut steering = Steering {
        drains: BTreeMap::from([(SHARED.to_string(), drain_of(&[("jobs-shared-0", true)]))]),
        ..Steering::default()
    };
    let effects = plan_shrink(&workers, &[], (4, 3), &mut steering);
    assert_eq!(effects.release.replicas.shared, 4, "held for the rollover");
    assert!(steering.drains.is_empty(), "the drain is called off");
    assert_eq!(drains_sent(&effects), [("jobs-shared-0".to_string(), 0)]);
    // Once every worker runs the new template, the shrink drains as any other.
    let mut steering = Steering::default();
    let effects = plan_shrink(&shared_workers(4), &[], (4, 3), &mut steering);
    assert_eq!(drains_sent(&effects).len(), 1);
}

#[test]
fn a_rollovers_gate_opens_only_once_the_cache_shows_the_idle_old_workers_mark() {
    // Issue 50, item 4: an old worker drained and idle, its -1 not yet in the Pod cache (the
    // patch failed, or has not come back): opening a gate now would let the old ReplicaSet
    // stop whichever Pod its default order picks.
    let old = "jobs-shared-0";
    let mut workers = shared_workers(3);
    workers[0].newest = false;
    workers[1].newest = false;
    let new = CachedPod {
        name: "jobs-shared-new".into(),
        address: Some("new:9100".into()),
        awaiting_takeover: true,
        containers_ready: true,
        ..CachedPod::default()
    };
    workers.push(Worker::new(&Arc::new(new), SHARED.into()));
    let mut rollover = drain_of(&[(old, true)]);
    rollover.rollover = true;
    rollover.to = 1;
    let mut steering = Steering {
        rollovers: BTreeMap::from([(SHARED.to_string(), rollover)]),
        ..Steering::default()
    };
    let effects = plan_shrink(&workers, &[], (3, 3), &mut steering);
    assert!(effects.gates.is_empty(), "{:?}", effects.gates);
    assert_eq!(effects.costs, [(old.to_string(), DRAINED_COST)]);
    // With the mark in the cache, the gate opens.
    workers[0] = worker(old, SHARED, Some(DRAINED_COST));
    workers[0].newest = false;
    let effects = plan_shrink(&workers, &[], (3, 3), &mut steering);
    assert_eq!(
        effects.gates,
        [("jobs-shared-new".to_string(), "OlderWorkerDrained")]
    );
}

#[test]
fn a_busy_worker_that_fails_its_readiness_probe_holds_the_shrink_and_is_drained() {
    // Issue 50, item 7: the ReplicaSet controller deletes a Pod that is not ready before it
    // looks at deletion costs: a busy worker whose probe fails now would go in place of the
    // drained idle one.
    let victim = "jobs-shared-0";
    let mut workers = shared_workers(4);
    workers[0] = worker(victim, SHARED, Some(DRAINED_COST));
    let flapping = CachedPod {
        ready: false,
        ..(*workers[2]).clone()
    };
    workers[2] = Worker::new(&Arc::new(flapping), SHARED.into());
    let mut steering = Steering {
        drains: BTreeMap::from([(SHARED.to_string(), drain_of(&[(victim, true)]))]),
        ..Steering::default()
    };
    let effects = plan_shrink(&workers, &["jobs-shared-2"], (4, 3), &mut steering);
    assert_eq!(effects.release.replicas.shared, 4, "held");
    assert!(
        steering.drains[SHARED].rechoose,
        "chosen again: it goes first"
    );
    // The next reconcile drains it (a Pod not ready is chosen first).
    let effects = plan_shrink(&workers, &["jobs-shared-2"], (4, 3), &mut steering);
    assert!(steering.drains[SHARED].pods.contains_key("jobs-shared-2"));
    assert_eq!(effects.release.replicas.shared, 4);
    // Not ready and idle: the shrink goes (nothing of it is busy).
    let mut steering = Steering {
        drains: BTreeMap::from([(SHARED.to_string(), drain_of(&[(victim, true)]))]),
        ..Steering::default()
    };
    let effects = plan_shrink(&workers, &[], (4, 3), &mut steering);
    assert_eq!(effects.release.replicas.shared, 3);
}

#[test]
fn a_pool_at_rest_has_no_deployment_in_motion() {
    let pool = pool();
    let live = BTreeMap::from([deployment(SHARED, 8), deployment(RESERVED, 2)]);
    let workers = shared_workers(8);
    let steering = Steering::default();
    assert!(in_motion(&pool, &live, &workers, &replicas(2, 8), &steering, NOW).is_empty());
    assert_eq!(
        in_motion(&pool, &live, &workers, &replicas(3, 7), &steering, NOW),
        BTreeSet::from([SHARED.to_string(), RESERVED.to_string()])
    );
    // A drain that only waits for its busy workers reads nothing: its renewals' answers say.
    let waiting = Steering {
        drains: BTreeMap::from([(SHARED.to_string(), drain_of(&[("jobs-shared-0", false)]))]),
        ..Steering::default()
    };
    assert_eq!(
        in_motion(&pool, &live, &workers, &replicas(3, 7), &waiting, NOW),
        BTreeSet::from([RESERVED.to_string()])
    );
    let mut rolling = workers.clone();
    rolling[0].newest = false;
    assert_eq!(
        in_motion(&pool, &live, &rolling, &replicas(2, 8), &steering, NOW),
        BTreeSet::from([SHARED.to_string()])
    );
}

#[test]
fn an_hour_long_drain_timeout_asks_workers_for_no_more_than_the_protocols_hour() {
    // Issue 50, item 1: with `--drain-timeout 1h` and a lane whose job time is not known, the
    // drain waits its whole limit; asking for the limit and the margin (3,615 s) would be
    // answered 400 (a refusal) by every worker, and the shrink would go on ranking alone.
    let workers = shared_workers(4);
    let mut work = reading(&workers, &["jobs-shared-1"]);
    work.job_seconds.clear();
    let mut steering = Steering::default();
    let hour = Settings {
        drain_timeout: Duration::from_secs(3600),
        ..settings()
    };
    let counts = Counts {
        cached: 4,
        applied: 4,
        to: 3,
    };
    let effects = plan_with(&workers, &work, counts, &mut steering, hour);
    assert_eq!(steering.drains[SHARED].timeout, Duration::from_secs(3600));
    let sent = drains_sent(&effects);
    assert_eq!(sent.len(), 1);
    assert!(
        sent.iter().all(|(_, seconds)| (1..=3600).contains(seconds)),
        "{sent:?}"
    );
}

#[test]
fn an_idle_answer_too_old_to_trust_holds_the_shrink_until_the_worker_answers_again() {
    // Review of issue 50: reconciles failed for a while after the idle answer; the drain may
    // have lapsed since and the worker taken a job. The answer is not trusted; the drain is
    // renewed, and the shrink goes on the fresh answer.
    let victim = "jobs-shared-0";
    let mut workers = shared_workers(4);
    workers[0] = worker(victim, SHARED, Some(DRAINED_COST));
    let mut drain = drain_of(&[(victim, true)]);
    drain.pods.get_mut(victim).unwrap().answered = Some(NOW - Duration::from_secs(20));
    let mut steering = Steering {
        drains: BTreeMap::from([(SHARED.to_string(), drain)]),
        ..Steering::default()
    };
    let busy = ["jobs-shared-1", "jobs-shared-2", "jobs-shared-3"];
    let effects = plan_shrink(&workers, &busy, (4, 3), &mut steering);
    assert_eq!(effects.release.replicas.shared, 4, "held on a stale answer");
    assert!(
        drains_sent(&effects)
            .iter()
            .any(|(pod, s)| pod == victim && *s > 0)
    );
    let answer = Answer::Drain(DrainAnswer::Draining { busy: false });
    let answers = effects.asks.iter().map(|a| (a.clone(), answer)).collect();
    record(&mut steering, answers, NOW);
    let effects = plan_shrink(&workers, &busy, (4, 3), &mut steering);
    assert_eq!(effects.release.replicas.shared, 3, "goes on the fresh one");
}

#[test]
fn a_written_shrinks_worker_an_earlier_leader_drained_keeps_its_cost_until_it_answers_idle() {
    // Review of issue 50: a new leader adopts drained workers of a shrink written and not carried
    // out; one may be busy (its drain timed out). A further shrink's ranking must not mark it to
    // go first.
    let mut adopted = drain_of(&[("jobs-shared-1", false)]);
    adopted.started = false;
    let mut steering = Steering {
        shrunk: BTreeMap::from([(SHARED.to_string(), adopted)]),
        drains: BTreeMap::from([(SHARED.to_string(), drain_of(&[("jobs-shared-0", true)]))]),
        ..Steering::default()
    };
    let mut workers = shared_workers(5);
    workers[0] = worker("jobs-shared-0", SHARED, Some(DRAINED_COST));
    let busy = [
        "jobs-shared-1",
        "jobs-shared-2",
        "jobs-shared-3",
        "jobs-shared-4",
    ];
    let effects = plan_shrink(&workers, &busy, (4, 3), &mut steering);
    assert_eq!(effects.release.replicas.shared, 3);
    assert!(
        !effects.costs.iter().any(|(pod, _)| pod == "jobs-shared-1"),
        "{:?}",
        effects.costs
    );
}

#[test]
fn a_watch_cache_behind_the_shrinks_write_does_not_call_its_drained_worker_back() {
    // Review of issue 50: the reconcile right after the write may still see the old count.
    let (victim, mut steering, workers) = written_shrink();
    // The cache still shows 4; this process wrote 3.
    let counts = Counts {
        cached: 4,
        applied: 3,
        to: 3,
    };
    let work = reading(&workers, &[]);
    let effects = plan_with(&workers, &work, counts, &mut steering, settings());
    let sent = drains_sent(&effects);
    assert!(
        sent.len() == 1 && sent[0].0 == victim && sent[0].1 > 0,
        "renewed: {sent:?}"
    );
    assert!(steering.shrunk.contains_key(SHARED));
}

#[test]
fn a_worker_gets_one_request_a_reconcile_and_a_drain_wins() {
    let ask = |pod: &str, request| Ask {
        pod: pod.into(),
        request,
        records: Records::Nothing,
    };
    let asks = vec![
        ask("a", Request::Drain(0)),
        ask("a", Request::Drain(30)),
        ask("b", Request::OwnLanes),
        ask("b", Request::Drain(0)),
    ];
    let kept = super::step::one_each(asks);
    assert_eq!(kept.len(), 2, "{kept:?}");
    assert_eq!(kept[0].request, Request::Drain(30));
}
