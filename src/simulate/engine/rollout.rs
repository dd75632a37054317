//! The operator's rollout in the simulation: one reconcile's pure steps, called in the order
//! `controller/reconcile.rs` calls them (`rollout::rollout`, then the stand-ins of the shrinks
//! that wait for the surge (`StandIns`), the drains of those the surge lets go (`Drain`, its
//! timeout, its deletion-cost marks seen a round later), and `Rollout::settle`), on the
//! simulated pool's two Deployments. Where the operator asks a worker, the simulated worker
//! answers as the lane workers do (it stands in, it drains and says whether it is busy); where
//! it applies counts, a Deployment starts workers or its ReplicaSet deletes the cheapest.
//!
//! What the operator's reconcile does that this does not: Kubernetes' own delays (a watch event
//! or a write takes no time here), an earlier leader's workers, rollovers of a new template,
//! workers that do not answer, and the lapse of a stand-in in the worker (the operator always
//! ends it here); a drain the operator no longer asks for lapses at the next reconcile rather
//! than to the second.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use k8s_openapi::api::apps::v1::{Deployment as KubeDeployment, DeploymentSpec, DeploymentStatus};
use kube::api::ObjectMeta;

use super::autoscale::{BATCH_LANE, LANE};
use super::pool::{Costs, Deployment, Moved, Pool, id, name as pod_name};
use super::scenario::{Nanos, Preference, nanos};
use crate::api::{LanePool, LanePoolSpec};
use crate::controller::rollout::drain::{self, DEFAULT_DRAIN_TIMEOUT, Drain, DrainAnswer};
use crate::controller::rollout::stand_in::{self, StandIns};
use crate::controller::rollout::{Rollout, Rules, SurgeWait, rollout};
use crate::controller::{DEFAULT_SURGE_TIMEOUT, Role, deployment_name};
use crate::sizing::Replicas;

/// The operator of one simulated pool: what it decided, what it applied, and what it carries
/// between reconciles (the surge's wait, the stand-ins, the drains and the costs it marked).
#[derive(Debug)]
pub struct Operator {
    pool: LanePool,
    rules: Rules,
    /// Whether shared workers stand in for new reserved ones (`--stand-ins`).
    stand_ins_on: bool,
    /// The lanes the shared Deployment's workers take.
    shared_role: Preference,
    /// Every lane's mean job time, as the operator measures it: a drain's timeout, the ranking.
    job_seconds: BTreeMap<String, f64>,
    decided: Replicas,
    applied: Replicas,
    surge: SurgeWait,
    stand_ins: BTreeMap<String, StandIns>,
    drains: BTreeMap<String, Drain>,
    /// The Pods whose deletion cost the operator set to -1 (drained and idle), as its Pod cache
    /// shows them at the next reconcile.
    marked: BTreeSet<String>,
}

impl Operator {
    /// An operator that runs `reserve` reserved and `shared` shared workers already, its
    /// shared workers taking `shared_role`'s lanes, with stand-ins when `stand_ins_on`.
    pub fn new(
        (reserve, shared): (i32, i32),
        shared_role: Preference,
        stand_ins_on: bool,
        job_seconds: BTreeMap<String, f64>,
    ) -> Self {
        let spec: LanePoolSpec = serde_json::from_value(serde_json::json!({
            "lanes": [{"name": LANE, "reserve": {"max": i32::MAX}}, {"name": BATCH_LANE}],
            "template": {},
        }))
        .expect("a LanePool spec with a reserve lane and a batch lane");
        let counts = replicas(reserve, shared);
        Self {
            pool: LanePool::new("sim", spec),
            // The operator's defaults: idle workers first, drained within the default timeout.
            rules: Rules {
                surge_timeout: DEFAULT_SURGE_TIMEOUT,
                rank: true,
                drain: !DEFAULT_DRAIN_TIMEOUT.is_zero(),
            },
            stand_ins_on,
            shared_role,
            job_seconds,
            decided: counts.clone(),
            applied: counts,
            surge: SurgeWait::default(),
            stand_ins: BTreeMap::new(),
            drains: BTreeMap::new(),
            marked: BTreeSet::new(),
        }
    }

    /// A new decision: the counts the next reconciles roll out.
    pub fn decide(&mut self, reserve: i32, shared: i32) {
        self.decided = replicas(reserve, shared);
    }

    /// One reconcile at `at`: what started or woke, and when to come back (a drain's poll).
    pub fn reconcile(&mut self, pool: &mut Pool, at: Nanos) -> (Moved, Option<Nanos>) {
        let now = Duration::from_nanos(at);
        let live = self.live(pool);
        let rollout = rollout(
            &self.pool,
            &live,
            &self.decided,
            Some(&self.applied),
            &self.surge.surge(now),
            self.rules,
        );
        self.surge.follow(&rollout, now);
        let surge_ends = self.surge.ends(self.rules.surge_timeout, now);
        let mut moved = Moved::default();
        // Drains the operator no longer asks for lapse in the workers (seen here, at a reconcile).
        pool.lapse(at, &mut moved);
        // The growth, alone, before any shrinking Deployment's worker is asked anything.
        if let Some(growth) = &rollout.growth {
            self.apply(pool, growth, at, &mut moved);
        }
        let stood_in = self.stand_in(pool, &rollout, at, &mut moved);
        let floors = self.drain(pool, &rollout, &stood_in, at, &mut moved);
        // Stand-ins whose shrink went or was called off and that no drain took go back.
        for (deployment, names) in stood_in {
            let drained = self.drains.get(&deployment);
            for worker in names
                .iter()
                .filter(|n| drained.is_none_or(|d| !d.pods.contains_key(*n)))
            {
                let role = self.role(of(&self.pool, &deployment));
                pool.serve(id(worker), role, &mut moved);
            }
        }
        let settled = rollout.settle(&self.pool, &live, &floors, &self.drains, (surge_ends, now));
        let release = settled.release;
        self.apply(pool, &release.replicas, at, &mut moved);
        for deployment in &release.shrinking {
            self.drains.remove(deployment);
        }
        self.applied = release.replicas;
        // A Deployment runs as many Pods as it was given: the budget holds (no worker lost, none
        // left over).
        for deployment in [Deployment::Reserved, Deployment::Shared] {
            let pods = i32::try_from(pool.pods(deployment).len()).unwrap_or(i32::MAX);
            debug_assert_eq!(
                pods,
                self.count(&self.applied, deployment),
                "{deployment:?}"
            );
        }
        // Back for a drain's poll, or when a waiting shrink's surge times out (readiness comes
        // as the Deployment's watch event; the timeout has to be watched for).
        let surge_timeout = self
            .surge
            .since
            .map(|_| surge_ends.saturating_sub(now).max(Duration::from_secs(1)));
        let again = [drain::requeue(&self.drains, now), surge_timeout]
            .into_iter()
            .flatten()
            .min()
            .map(|after| at + nanos(after));
        (moved, again)
    }

    /// The two Deployments as the operator's watch cache has them: the counts it applied, the
    /// Pods ready.
    fn live(&self, pool: &Pool) -> BTreeMap<String, KubeDeployment> {
        [Deployment::Reserved, Deployment::Shared]
            .into_iter()
            .map(|d| {
                let name = self.name(d);
                let replicas = self.count(&self.applied, d);
                let ready = i32::try_from(pool.ready(d)).unwrap_or(i32::MAX);
                let deployment = KubeDeployment {
                    metadata: ObjectMeta {
                        name: Some(name.clone()),
                        ..ObjectMeta::default()
                    },
                    spec: Some(DeploymentSpec {
                        replicas: Some(replicas),
                        ..DeploymentSpec::default()
                    }),
                    status: Some(DeploymentStatus {
                        ready_replicas: Some(ready),
                        ..DeploymentStatus::default()
                    }),
                };
                (name, deployment)
            })
            .collect()
    }

    /// The stand-ins of the shrinks waiting for the surge (`act/stand_in.rs`): chosen as the
    /// drain will choose, asked, and every one answers it stands in. Returns those of the
    /// shrinks that no longer wait, by Deployment.
    fn stand_in(
        &mut self,
        pool: &mut Pool,
        rollout: &Rollout,
        at: Nanos,
        moved: &mut Moved,
    ) -> BTreeMap<String, BTreeSet<String>> {
        let waiting = match self.stand_ins_on {
            true => rollout.stand_ins.as_slice(),
            false => &[],
        };
        let ended = stand_in::ended(&mut self.stand_ins, waiting)
            .into_iter()
            .map(|(deployment, s)| (deployment, s.pods))
            .collect();
        for wanted in waiting {
            let deployment = of(&self.pool, &wanted.shrink.deployment);
            let (own, serves) = (self.role(deployment), self.serving(&wanted.serves));
            let names: Vec<String> = pool.pods(deployment).into_iter().map(pod_name).collect();
            let set = self
                .stand_ins
                .entry(wanted.shrink.deployment.clone())
                .or_default();
            set.keep_live(names.iter().map(String::as_str));
            if !set.starting(wanted) {
                continue;
            }
            let candidates = pool.candidates(deployment, &self.job_seconds, at, |_| false);
            let (asked, called_back) = set.start(wanted, &candidates);
            for worker in &called_back {
                pool.serve(id(worker), own, moved);
            }
            for worker in &asked {
                pool.serve(id(worker), serves, moved);
            }
            set.answered(asked.into_iter().map(|w| (w, true)).collect());
        }
        ended
    }

    /// The drains of the shrinks the surge lets go (`act/drain.rs`): those called off end; each
    /// shrink's workers are chosen (those that stood in first), asked to drain, and answer
    /// whether they are busy; the idle ones are marked to go first, and the shrink waits a round
    /// for the marks. Returns the fewest workers each shrinking Deployment may run now.
    fn drain(
        &mut self,
        pool: &mut Pool,
        rollout: &Rollout,
        stood_in: &BTreeMap<String, BTreeSet<String>>,
        at: Nanos,
        moved: &mut Moved,
    ) -> BTreeMap<String, i32> {
        let now = Duration::from_nanos(at);
        for (_, called_off) in drain::called_off(&mut self.drains, &rollout.shrinks) {
            for worker in called_off.pods.keys() {
                self.marked.remove(worker);
                pool.drain(id(worker), 0, at, moved);
            }
        }
        let mut floors = BTreeMap::new();
        for shrink in &rollout.shrinks {
            let deployment = of(&self.pool, &shrink.deployment);
            let names: Vec<String> = pool.pods(deployment).into_iter().map(pod_name).collect();
            let drain = self.drains.entry(shrink.deployment.clone()).or_default();
            drain.keep_live(names.iter().map(String::as_str));
            let mut called_back = Vec::new();
            if drain.starting(shrink) {
                let stood_in = stood_in.get(&shrink.deployment);
                let chosen =
                    |n: &str| drain.pods.contains_key(n) || stood_in.is_some_and(|s| s.contains(n));
                let candidates = pool.candidates(deployment, &self.job_seconds, at, chosen);
                let served: Vec<f64> = shrink
                    .lanes
                    .iter()
                    .map(|lane| self.job_seconds.get(lane).copied().unwrap_or(f64::NAN))
                    .collect();
                called_back = drain.start(shrink, &candidates, &served, DEFAULT_DRAIN_TIMEOUT, now);
            }
            let answers = drain
                .requests(names.iter().map(String::as_str), &called_back, now)
                .into_iter()
                .map(|(worker, seconds)| {
                    let w = id(worker);
                    pool.drain(w, seconds, at, moved);
                    let busy = pool.busy(w);
                    (worker.to_string(), DrainAnswer::Draining { busy })
                })
                .collect();
            drain.answered(answers);
            let floor = drain.floor(shrink, now);
            let idle = drain.idle();
            let unseen = floor < shrink.live
                && names
                    .iter()
                    .any(|n| idle.contains(n) != self.marked.contains(n));
            drain.costs_unseen = unseen;
            let floor = match unseen {
                // The marks are written now and seen at the next reconcile (`DRAIN_POLL`).
                true => {
                    self.marked.retain(|n| !names.contains(n));
                    self.marked.extend(idle);
                    shrink.live
                }
                false => floor,
            };
            floors.insert(shrink.deployment.clone(), floor);
        }
        floors
    }

    /// Applies `replicas`: a Deployment grows, or its ReplicaSet deletes the cheapest Pods,
    /// ranked by the operator just before (the drained idle ones marked -1).
    fn apply(&mut self, pool: &mut Pool, replicas: &Replicas, at: Nanos, moved: &mut Moved) {
        for deployment in [Deployment::Reserved, Deployment::Shared] {
            let count = usize::try_from(self.count(replicas, deployment)).unwrap_or(0);
            let costs = Costs {
                ranked: self.rules.rank.then_some(&self.job_seconds),
                marked: &self.marked,
                now: at,
            };
            pool.scale((deployment, self.role(deployment), count), &costs, moved);
        }
        self.marked.retain(|n| pool.workers[id(n)].counted());
    }

    fn name(&self, deployment: Deployment) -> String {
        deployment_name("sim", &self.kube_role(deployment))
    }

    fn kube_role(&self, deployment: Deployment) -> Role {
        match deployment {
            Deployment::Reserved => Role::Reserved { lane: LANE.into() },
            Deployment::Shared => Role::Shared,
        }
    }

    fn count(&self, replicas: &Replicas, deployment: Deployment) -> i32 {
        match deployment {
            Deployment::Reserved => replicas.reserved.get(LANE).copied().unwrap_or(0),
            Deployment::Shared => replicas.shared,
        }
    }

    /// The lanes a Deployment's own workers take.
    fn role(&self, deployment: Deployment) -> Preference {
        match deployment {
            Deployment::Reserved => Preference::UrgentOnly,
            Deployment::Shared => self.shared_role,
        }
    }

    /// The lanes a stand-in serves: the reserve's alone, or all of them.
    fn serving(&self, lanes: &[String]) -> Preference {
        match lanes {
            [lane] if lane == LANE => Preference::UrgentOnly,
            _ => self.shared_role,
        }
    }
}

fn replicas(reserve: i32, shared: i32) -> Replicas {
    Replicas {
        reserved: BTreeMap::from([(LANE.to_string(), reserve)]),
        shared,
    }
}

/// The simulated Deployment a Deployment name is.
fn of(pool: &LanePool, name: &str) -> Deployment {
    match name == deployment_name(&kube::ResourceExt::name_any(pool), &Role::Shared) {
        true => Deployment::Shared,
        false => Deployment::Reserved,
    }
}
