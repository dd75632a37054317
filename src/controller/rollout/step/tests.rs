//! The ordering rules of a rollout, which the real-cluster tests otherwise check end to end.

use super::*;
use crate::controller::deployments::worker_deployments;
use k8s_openapi::api::apps::v1::DeploymentStatus;
use kube::ResourceExt;

const TIMEOUT: Duration = Duration::from_secs(120);
const DRAIN_AND_RANK: Rules = Rules {
    surge_timeout: TIMEOUT,
    rank: true,
    drain: true,
};

fn pool() -> LanePool {
    let mut pool: LanePool =
        serde_yaml::from_str(include_str!("../../../../examples/lanepool.yaml")).unwrap();
    pool.metadata.namespace = Some("team".into());
    pool.metadata.uid = Some("pool-uid".into());
    pool
}

fn replicas(reserved: i32, shared: i32) -> Replicas {
    Replicas {
        reserved: BTreeMap::from([("urgent".into(), reserved)]),
        shared,
    }
}

/// The pool's Deployments at `counts`, each with `ready` of its reserve and shared workers ready.
fn live(counts: &Replicas, ready: &Replicas) -> BTreeMap<String, Deployment> {
    let ready: BTreeMap<String, i32> = pool_roles(&pool(), ready)
        .into_iter()
        .map(|(name, _, count)| (name, count))
        .collect();
    worker_deployments(&pool(), counts)
        .into_iter()
        .map(|mut d| {
            d.status = Some(DeploymentStatus {
                ready_replicas: ready.get(&d.name_any()).copied(),
                ..Default::default()
            });
            (d.name_any(), d)
        })
        .collect()
}

/// The rollout towards `decided` from what this process applied (`own`), no surge waiting yet,
/// draining and ranking on.
fn unhurried(live: &BTreeMap<String, Deployment>, decided: &Replicas, own: &Replicas) -> Rollout {
    rollout(
        &pool(),
        live,
        decided,
        Some(own),
        &Surge::default(),
        DRAIN_AND_RANK,
    )
}

#[test]
fn growth_goes_out_alone_before_anything_of_a_shrinking_deployment() {
    let now = replicas(1, 9);
    let live = live(&now, &now);
    let decided = replicas(3, 7);
    let rollout = unhurried(&live, &decided, &now);
    let growth = rollout.growth.expect("shared shrinks: growth goes first");
    assert_eq!(
        growth,
        replicas(3, 9),
        "the reserve grows at once, shared waits"
    );
    assert!(
        rollout.shrinks.is_empty(),
        "shared waits for the new reserve, its workers taking jobs meanwhile"
    );
}

#[test]
fn a_shrink_waits_for_the_growing_deployment_to_be_ready_and_only_then_drains() {
    let now = replicas(1, 9);
    let decided = replicas(3, 7);
    // The reserve grows 1 → 3: the shared shrink waits for it, its workers taking jobs until
    // their replacements are ready.
    let first = rollout(
        &pool(),
        &live(&now, &now),
        &decided,
        Some(&now),
        &Surge::default(),
        DRAIN_AND_RANK,
    );
    assert!(first.waiting);
    assert_eq!(first.step, replicas(3, 9));
    assert!(
        first.shrinks.is_empty(),
        "no drain while the surge waits: {:?}",
        first.shrinks
    );
    assert_eq!(
        first.taking_over,
        BTreeSet::from(["jobs-urgent-reserved".to_string()])
    );
    // Grown to 3, only 1 ready: still waiting, for the Deployment it remembers.
    let grown = replicas(3, 9);
    let surge = Surge {
        waited: Some(Duration::from_secs(5)),
        taking_over: first.taking_over.clone(),
    };
    let growing = live(&grown, &now);
    let waiting = rollout(
        &pool(),
        &growing,
        &decided,
        Some(&grown),
        &surge,
        DRAIN_AND_RANK,
    );
    assert!(waiting.waiting);
    assert_eq!(waiting.step, grown);
    assert!(waiting.shrinks.is_empty());
    // Ready: the shrink may go.
    let ready = live(&grown, &grown);
    let go = rollout(
        &pool(),
        &ready,
        &decided,
        Some(&grown),
        &surge,
        DRAIN_AND_RANK,
    );
    assert!(!go.waiting);
    assert_eq!(go.step, decided);
    assert_eq!(
        go.shrinks,
        [Shrink {
            deployment: "jobs-shared".into(),
            live: 9,
            to: 7,
            lanes: vec!["urgent".into(), "batch".into()],
        }],
        "the drain starts once the replacements are ready"
    );
    // Never ready: the surge's timeout ends the wait.
    let over = Surge {
        waited: Some(TIMEOUT),
        ..surge.clone()
    };
    let timed_out = rollout(
        &pool(),
        &growing,
        &decided,
        Some(&grown),
        &over,
        DRAIN_AND_RANK,
    );
    assert!(!timed_out.waiting);
    assert_eq!(timed_out.step, decided);
    assert_eq!(timed_out.shrinks.len(), 1, "and once the surge timed out");
}

#[test]
fn while_the_reserve_grows_the_shared_workers_it_replaces_stand_in_for_it() {
    let now = replicas(1, 9);
    let decided = replicas(3, 7);
    let first = unhurried(&live(&now, &now), &decided, &now);
    assert_eq!(
        first.stand_ins,
        [StandIn {
            shrink: Shrink {
                deployment: "jobs-shared".into(),
                live: 9,
                to: 7,
                lanes: vec!["urgent".into(), "batch".into()],
            },
            serves: vec!["urgent".into()],
        }],
        "2 shared workers take only the urgent lane while the new reserved workers start"
    );
    // The other way, reserved workers keep their lane until the new shared workers are ready:
    // given the batch lane, one could take a long job it cannot give back.
    let back = unhurried(&live(&decided, &decided), &now, &decided);
    assert!(back.waiting);
    assert!(back.stand_ins.is_empty(), "{:?}", back.stand_ins);
    // Once the new workers are ready the shrink goes, drained: no stand-in any more.
    let grown = replicas(3, 9);
    let surge = Surge {
        waited: Some(Duration::from_secs(5)),
        taking_over: first.taking_over.clone(),
    };
    let ready = live(&grown, &grown);
    let go = rollout(
        &pool(),
        &ready,
        &decided,
        Some(&grown),
        &surge,
        DRAIN_AND_RANK,
    );
    assert!(go.stand_ins.is_empty());
    assert_eq!(go.shrinks.len(), 1);
    // Without drains (workers the operator does not ask anything), no stand-ins either.
    let plain = Rules {
        drain: false,
        ..DRAIN_AND_RANK
    };
    let quiet = rollout(
        &pool(),
        &live(&now, &now),
        &decided,
        Some(&now),
        &Surge::default(),
        plain,
    );
    assert!(quiet.stand_ins.is_empty());
}

#[test]
fn a_reserve_shrink_never_waits_for_shared_workers_that_do_not_change() {
    // Fixed shared workers, one stuck Pending: the reserve shrinks 3 → 1 at once.
    let now = replicas(3, 8);
    let stuck = live(&now, &replicas(3, 7));
    let decided = replicas(1, 8);
    let rollout = unhurried(&stuck, &decided, &now);
    assert!(!rollout.waiting);
    assert_eq!(rollout.step, decided);
}

#[test]
fn a_drain_holds_its_shrink_and_only_the_shrinks_that_go_are_ranked() {
    let now = replicas(3, 9);
    let live = live(&now, &now);
    let decided = replicas(3, 7);
    let rollout = unhurried(&live, &decided, &now);
    let held = rollout.release(
        &pool(),
        &live,
        &BTreeMap::from([("jobs-shared".into(), 9)]),
        DRAIN_AND_RANK,
    );
    assert_eq!(held.replicas, now, "held at its live count");
    assert!(
        held.shrinking.is_empty(),
        "nothing is ranked for a shrink that waits"
    );
    let released = rollout.release(&pool(), &live, &BTreeMap::new(), DRAIN_AND_RANK);
    assert_eq!(released.replicas, decided);
    assert_eq!(released.shrinking, ["jobs-shared"]);
    // One drained worker not confirmed idle at the timeout: the shrink takes one worker of two.
    let partly = rollout.release(
        &pool(),
        &live,
        &BTreeMap::from([("jobs-shared".into(), 8)]),
        DRAIN_AND_RANK,
    );
    assert_eq!(partly.replicas, replicas(3, 8));
    assert_eq!(partly.shrinking, ["jobs-shared"]);
}

#[test]
fn a_shrink_called_off_ends_its_drain() {
    let now = replicas(3, 9);
    let live = live(&now, &now);
    let shrinking = rollout(
        &pool(),
        &live,
        &replicas(3, 7),
        Some(&now),
        &Surge::default(),
        DRAIN_AND_RANK,
    );
    let mut drains = BTreeMap::from([(
        "jobs-shared".to_string(),
        drain::Drain {
            started: true,
            to: 7,
            ..Default::default()
        },
    )]);
    assert!(drain::called_off(&mut drains, &shrinking.shrinks).is_empty());
    // The load came back before the shrink went: the decision keeps 9 shared workers.
    let kept = unhurried(&live, &now, &now);
    assert!(kept.shrinks.is_empty() && kept.growth.is_none());
    let off = drain::called_off(&mut drains, &kept.shrinks);
    assert_eq!(off.len(), 1, "its workers are called back");
    assert!(drains.is_empty());
}

#[test]
fn without_drains_or_ranking_a_step_goes_out_in_one_write() {
    let now = replicas(1, 9);
    let live = live(&now, &now);
    let decided = replicas(3, 7);
    let plain = Rules {
        surge_timeout: Duration::ZERO,
        rank: false,
        drain: false,
    };
    let rollout = rollout(
        &pool(),
        &live,
        &decided,
        Some(&now),
        &Surge::default(),
        plain,
    );
    assert_eq!(rollout.step, decided, "no surge: the shrink goes at once");
    assert!(rollout.shrinks.is_empty() && rollout.growth.is_none());
    let release = rollout.release(&pool(), &live, &BTreeMap::new(), plain);
    assert!(release.shrinking.is_empty());
    // Ranking alone still writes the growth first.
    let rank = Rules {
        rank: true,
        ..plain
    };
    let ranked = super::rollout(
        &pool(),
        &live,
        &decided,
        Some(&now),
        &Surge::default(),
        rank,
    );
    assert!(ranked.shrinks.is_empty());
    assert_eq!(ranked.growth, Some(replicas(3, 9)));
}

#[test]
fn a_count_someone_else_set_is_restored_at_once() {
    // The operator applied 9 shared; someone scaled it to 12. The decision keeps 9: growing back
    // from 12 to 9 is a restore, not a shrink that waits on this process's own last count.
    let own = replicas(3, 9);
    let live = live(&replicas(3, 12), &replicas(3, 12));
    let rollout = unhurried(&live, &own, &own);
    assert!(
        rollout.shrinks.is_empty(),
        "from the operator's own 9 nothing shrinks"
    );
    assert_eq!(rollout.step, own);
}

#[test]
fn a_removed_lanes_deployment_leaves_the_way_a_shrink_does() {
    // The pool had a second reserve lane, critical, with 2 workers; it is removed from the spec
    // and its 2 workers go to shared (9 → 11).
    let mut before = pool();
    let mut critical = before.spec.lanes[0].clone();
    critical.name = "critical".into();
    before.spec.lanes.insert(1, critical);
    let two_lanes = Replicas {
        reserved: BTreeMap::from([("urgent".into(), 1), ("critical".into(), 2)]),
        shared: 9,
    };
    let live: BTreeMap<String, Deployment> = worker_deployments(&before, &two_lanes)
        .into_iter()
        .map(|mut d| {
            let count = d.spec.as_ref().and_then(|s| s.replicas);
            d.status = Some(DeploymentStatus {
                ready_replicas: count,
                ..Default::default()
            });
            (d.name_any(), d)
        })
        .collect();
    let decided = replicas(1, 11);
    let now = replicas(1, 9);
    let first = unhurried(&live, &decided, &now);
    assert_eq!(first.step, decided, "shared grows at once");
    assert!(
        first.waiting,
        "the removed lane's workers wait for shared to be ready"
    );
    assert_eq!(
        first.leaving,
        [("jobs-critical-reserved".to_string(), 2, 2)]
    );
    assert!(
        first.shrinks.is_empty(),
        "and take jobs meanwhile: {:?}",
        first.shrinks
    );
    let release = first.release(&pool(), &live, &BTreeMap::new(), DRAIN_AND_RANK);
    assert!(release.remove.is_empty());
    assert_eq!(release.staying, ["jobs-critical-reserved"]);
    let held = first.held(
        &pool(),
        &decided,
        &release,
        &BTreeMap::new(),
        TIMEOUT,
        Duration::ZERO,
    );
    assert!(
        held.iter()
            .any(|h| h.deployment == "jobs-critical-reserved" && h.runs == 2 && h.to == 0),
        "{held:?}"
    );
    // Shared ready at 11: the Deployment goes, unless a drain still holds it.
    let mut grown = live.clone();
    let shared = grown.get_mut("jobs-shared").unwrap();
    shared.spec.as_mut().unwrap().replicas = Some(11);
    shared.status = Some(DeploymentStatus {
        ready_replicas: Some(11),
        ..Default::default()
    });
    let surge = Surge {
        waited: Some(Duration::from_secs(5)),
        taking_over: first.taking_over.clone(),
    };
    let next = rollout(
        &pool(),
        &grown,
        &decided,
        Some(&decided),
        &surge,
        DRAIN_AND_RANK,
    );
    assert!(!next.waiting);
    assert!(
        next.shrinks
            .iter()
            .any(|s| s.deployment == "jobs-critical-reserved" && s.to == 0),
        "then drain: {:?}",
        next.shrinks
    );
    let drained = BTreeMap::from([("jobs-critical-reserved".to_string(), 2)]);
    let holding = next.release(&pool(), &grown, &drained, DRAIN_AND_RANK);
    assert_eq!(
        holding.staying,
        ["jobs-critical-reserved"],
        "its drain holds it"
    );
    let gone = next.release(&pool(), &grown, &BTreeMap::new(), DRAIN_AND_RANK);
    assert_eq!(gone.remove, ["jobs-critical-reserved"]);
    assert!(gone.staying.is_empty());
}
