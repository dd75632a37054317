//! What the plan reads: what one reconcile saw ([`Seen`]), the operator's flags ([`Settings`]),
//! and what the pool's rollout carries between reconciles ([`Steering`]).

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use k8s_openapi::api::apps::v1::Deployment;

use crate::api::LanePool;
use crate::controller::deployments::{counts_by_name, spec_replicas};
use crate::controller::rollout::cost::Reading;
use crate::controller::rollout::drain::{self, Candidate, Drain, Drained};
use crate::controller::rollout::stand_in::StandIns;
use crate::controller::rollout::{Rules, SurgeWait};
use crate::controller::worker::Worker;
use crate::sizing::Replicas;

use super::inherited::Inherited;

/// What a pool's rollout carries between reconciles.
#[derive(Clone, Debug, Default, PartialEq)]
pub(crate) struct Steering {
    /// A shrink's wait for the growing Deployments to be ready.
    pub(crate) surge_wait: SurgeWait,
    /// The drains of shrinking Deployments, by Deployment name.
    pub(crate) drains: BTreeMap<String, Drain>,
    /// The drained workers of shrinks already written, by Deployment name: renewed until the
    /// ReplicaSet controller has stopped them (a controller that acts late must not find them
    /// taking jobs again), called back if it stopped others.
    pub(crate) shrunk: BTreeMap<String, Drain>,
    /// The drains of rollovers (a template change), by Deployment name.
    pub(crate) rollovers: BTreeMap<String, Drain>,
    /// The stand-ins of shrinks waiting for the surge, by Deployment name.
    pub(crate) stand_ins: BTreeMap<String, StandIns>,
    /// Since when each shrinking Deployment's shrink waits for its rollover to end.
    pub(crate) rollover_waits: BTreeMap<String, Duration>,
    /// Whether this process has taken over what an earlier leader left in the workers: once, at
    /// its first reconcile of the pool.
    pub(crate) inherited_read: bool,
}

/// How the operator rolls decisions out: its flags.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(crate) struct Settings {
    pub(crate) rules: Rules,
    /// The most a drain waits (`--drain-timeout`).
    pub(crate) drain_timeout: Duration,
    /// Shared workers stand in for new reserved ones while those start.
    pub(crate) stand_ins: bool,
}

/// What one reconcile saw, for its rollout.
pub(crate) struct Seen<'a> {
    pub(crate) pool: &'a LanePool,
    /// The pool's Deployments, by name.
    pub(crate) live: &'a BTreeMap<String, Deployment>,
    /// The pool's live workers (see `pods::PoolPods::workers`).
    pub(crate) workers: &'a [Worker],
    /// What the workers of the Deployments in motion ([`in_motion`]) are doing: their own answers,
    /// and Prometheus for those that gave none. `None`: not read.
    pub(crate) work: Option<&'a Reading>,
    /// What an earlier leader left in the workers, read once per process (`None`: not read).
    pub(crate) inherited: Option<&'a Inherited>,
    /// The counts decided, and those this process last wrote (`None` after a start).
    pub(crate) target: &'a Replicas,
    pub(crate) applied: Option<&'a Replicas>,
    /// Since the process started.
    pub(crate) now: Duration,
}

impl Seen<'_> {
    /// The live workers of `deployment`.
    pub(crate) fn workers_of(&self, deployment: &str) -> Vec<&Worker> {
        self.workers
            .iter()
            .filter(|w| w.deployment == deployment)
            .collect()
    }

    /// Whether `deployment` runs more live workers than it is given: a shrink written and not
    /// carried out yet. What it is given is the lower of the watch cache's count and this
    /// process's last write (the cache may not show that write yet).
    pub(super) fn runs_more_than_given(&self, deployment: &str) -> bool {
        let written = counts_by_name(self.pool, self.applied)
            .get(deployment)
            .copied();
        let cached = self.live.get(deployment).and_then(spec_replicas);
        let given = match (cached, written) {
            (Some(cached), Some(written)) => Some(cached.min(written)),
            (cached, written) => cached.or(written),
        };
        let count = i32::try_from(self.workers_of(deployment).len()).unwrap_or(i32::MAX);
        given.is_some_and(|given| count > given)
    }

    /// What `live` are doing, when their answers or Prometheus said anything of them.
    pub(super) fn work_of(&self, live: &[&Worker]) -> Option<&Reading> {
        self.work
            .filter(|reading| reading.knows(live.iter().map(|w| w.name.as_str())))
    }
}

/// The Deployments whose workers observe reads for this reconcile's rollout: those whose count is
/// to change or that no lane runs any more, those with workers of an older template or waiting
/// for their gate, and those a drain or a stand-in follows; but not one whose drain only waits
/// for its busy workers (the answers to its renewals say how they are) nor one whose shrink is
/// written (its drained workers' answers say it). A pool at rest has none: its workers are asked
/// only when it is measured.
pub(crate) fn in_motion(
    pool: &LanePool,
    live: &BTreeMap<String, Deployment>,
    workers: &[Worker],
    target: &Replicas,
    steering: &Steering,
    now: Duration,
) -> BTreeSet<String> {
    let counts = counts_by_name(pool, Some(target));
    let moving = live
        .iter()
        .filter(|(name, deployment)| counts.get(*name).copied() != spec_replicas(deployment))
        .map(|(name, _)| name.clone());
    let rolling = workers
        .iter()
        .filter(|w| !w.newest || w.awaiting_takeover)
        .map(|w| w.deployment.clone());
    let followed = [&steering.drains, &steering.rollovers]
        .into_iter()
        .flat_map(BTreeMap::keys)
        .chain(steering.stand_ins.keys())
        .cloned();
    let waits = |deployment: &String| {
        [&steering.drains, &steering.rollovers]
            .into_iter()
            .filter_map(|drains| drains.get(deployment))
            .any(|d| d.waits_for_busy(now))
    };
    moving
        .chain(rolling)
        .chain(followed)
        .filter(|deployment| !waits(deployment))
        .collect()
}

/// The workers of `live` as a drain or the stand-ins choose among them: ready or not, and their
/// idle-first cost in `reading`; `chosen` names those already chosen (they stay first).
pub(super) fn candidates(
    reading: &Reading,
    live: &[&Worker],
    chosen: impl Fn(&str) -> bool,
) -> Vec<Candidate> {
    live.iter()
        .map(|w| Candidate {
            name: w.name.clone(),
            ready: w.ready,
            cost: reading.cost(&w.name),
            draining: chosen(&w.name),
        })
        .collect()
}

impl Steering {
    /// Takes what an earlier leader left in the workers (`inherited`) over as this process's own, not yet started, for
    /// the Deployments that have none: the next steps treat them as any drain or stand-in of
    /// theirs. One whose Deployment shrinks now is started with its workers chosen first (see
    /// `rollout::drain::choose`); the others are called off, and their workers asked at once to
    /// take their own lanes' jobs again (`seconds=0`). The drained workers of a Deployment whose
    /// shrink is `written` and not yet carried out are the ones its ReplicaSet controller will
    /// stop (their cost is -1): they are asked to drain on until it has.
    pub(crate) fn adopt(
        &mut self,
        inherited: Inherited,
        written: impl Fn(&str) -> bool,
        now: Duration,
    ) {
        let steering = self;
        for (deployment, pods) in inherited.draining {
            let drain = match written(&deployment) {
                true => steering.shrunk.entry(deployment).or_default(),
                false => steering.drains.entry(deployment).or_default(),
            };
            if drain.started {
                continue;
            }
            for pod in pods {
                let drained = Drained {
                    asked_at: now,
                    idle: false,
                    answered: None,
                };
                drain.pods.entry(pod).or_insert(drained);
            }
        }
        for (deployment, pods) in inherited.standing_in {
            let set = steering.stand_ins.entry(deployment).or_default();
            if !set.started {
                set.pods.extend(pods);
            }
        }
    }

    /// How soon the rollout needs the next reconcile (`None`: it does not): when a waiting
    /// shrink's surge times out (readiness arrives as Deployment events, the timeout has to be
    /// watched for), never sooner than a second; soon while a drained worker is busy; before a
    /// drain lapses while all are idle or a written shrink's workers wait to be stopped.
    pub(crate) fn requeue(&self, surge_timeout: Duration, now: Duration) -> Option<Duration> {
        let surge = self.surge_wait.since.map(|since| {
            let ends = (since + surge_timeout).saturating_sub(now);
            ends.max(Duration::from_secs(1))
        });
        let shrunk = (!self.shrunk.is_empty()).then_some(drain::DRAIN_RENEW);
        [&self.drains, &self.rollovers]
            .into_iter()
            .filter_map(|drains| drain::requeue(drains, now))
            .chain(shrunk)
            .chain(surge)
            .min()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn inherited_drains_and_stand_ins_become_unstarted_ones_of_deployments_without_their_own() {
        let s = Duration::from_secs;
        let set = |names: &[&str]| names.iter().map(|n| n.to_string()).collect::<BTreeSet<_>>();
        let inherited = Inherited {
            draining: BTreeMap::from([
                ("jobs-shared".to_string(), set(&["a", "b"])),
                ("jobs-urgent-reserved".to_string(), set(&["c"])),
            ]),
            standing_in: BTreeMap::from([("jobs-shared".to_string(), set(&["d"]))]),
        };
        assert_eq!(inherited.len(), 4);
        // The reserve's drain is this process's own already: it is left as it is.
        let own = Drain {
            started: true,
            ..Drain::default()
        };
        let mut steering = Steering {
            drains: BTreeMap::from([("jobs-urgent-reserved".to_string(), own.clone())]),
            ..Steering::default()
        };
        steering.adopt(inherited, |_| false, s(7));
        let (drains, stand_ins) = (&steering.drains, &steering.stand_ins);
        assert_eq!(drains["jobs-urgent-reserved"], own);
        let shared = &drains["jobs-shared"];
        assert!(!shared.started, "chosen anew by the next step");
        assert_eq!(
            shared.pods.keys().cloned().collect::<BTreeSet<_>>(),
            set(&["a", "b"])
        );
        assert!(
            shared.pods.values().all(|d| !d.idle && d.asked_at == s(7)),
            "unknown is never idle"
        );
        assert_eq!(stand_ins["jobs-shared"].pods, set(&["d"]));
        assert!(!stand_ins["jobs-shared"].started);
    }

    #[test]
    fn the_drained_workers_of_a_shrink_written_and_not_carried_out_stay_drained() {
        // An earlier leader wrote the shrink and lost its lease before the ReplicaSet controller
        // acted: this process sees no shrink, but must not call the drain off (the workers
        // marked -1 would take jobs again and be stopped mid-job).
        let inherited = Inherited {
            draining: BTreeMap::from([(
                "jobs-shared".to_string(),
                BTreeSet::from(["a".to_string()]),
            )]),
            standing_in: BTreeMap::new(),
        };
        let mut steering = Steering::default();
        steering.adopt(inherited, |d| d == "jobs-shared", Duration::from_secs(3));
        assert!(steering.drains.is_empty());
        assert!(steering.shrunk["jobs-shared"].pods.contains_key("a"));
    }
}
