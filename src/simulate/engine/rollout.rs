//! The operator's rollout in the simulation: each reconcile observes the simulated pool as the
//! operator's watch caches and worker reads would (its two Deployments, its Pods with their
//! deletion costs, what each worker is doing), runs the operator's own plan
//! (`controller::plan::plan`) and applies its effects: the growth, the requests to workers (the
//! simulated worker answers as the lane workers do: it stands in, drains and says whether it is
//! busy), the deletion costs, the counts (a Deployment starts workers, or its ReplicaSet deletes
//! the Pods that cost least); the answers go back through `plan::record`. No step order, drain or
//! requeue logic of its own.
//!
//! What the operator's reconcile has that this does not: Kubernetes' own delays (a watch event or
//! a write takes no time here), an earlier leader's workers, rollovers of a new template, and
//! workers that do not answer; a drain the operator no longer asks for lapses at the next
//! reconcile rather than to the second.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::apps::v1::{Deployment as KubeDeployment, DeploymentSpec, DeploymentStatus};
use kube::api::ObjectMeta;

use super::autoscale::{BATCH_LANE, LANE};
use super::pool::{Costs, Deployment, Moved, Pool, State, id, name as pod_name};
use super::scenario::{GRACE, Nanos, Preference, nanos, seconds};
use crate::api::{LanePool, LanePoolSpec};
use crate::controller::cached_pod::CachedPod;
use crate::controller::plan::{self, Answer, Ask, Request, Seen, StandInAnswer, Steering};
use crate::controller::rollout::Rules;
use crate::controller::rollout::cost::{IDLE_COST, Reading};
use crate::controller::rollout::drain::{DEFAULT_DRAIN_TIMEOUT, DrainAnswer};
use crate::controller::worker::Worker;
use crate::controller::{DEFAULT_SURGE_TIMEOUT, Role, deployment_name};
use crate::sizing::Replicas;

/// The operator of one simulated pool: what it decided, what it applied, and what its rollout
/// carries between reconciles.
#[derive(Debug)]
pub struct Operator {
    pool: LanePool,
    settings: plan::Settings,
    /// The lanes the shared Deployment's workers take.
    shared_role: Preference,
    /// Every lane's mean job time, as the operator measures it: a drain's timeout, the ranking.
    job_seconds: BTreeMap<String, f64>,
    decided: Replicas,
    applied: Replicas,
    steering: Steering,
    /// The Pods' deletion costs as the operator wrote them: its Pod cache shows them at the next
    /// reconcile, and the ReplicaSet controller deletes by them.
    costs: BTreeMap<String, i32>,
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
            settings: plan::Settings {
                rules: Rules {
                    surge_timeout: DEFAULT_SURGE_TIMEOUT,
                    rank: true,
                    drain: !DEFAULT_DRAIN_TIMEOUT.is_zero(),
                },
                drain_timeout: DEFAULT_DRAIN_TIMEOUT,
                stand_ins: stand_ins_on,
            },
            shared_role,
            job_seconds,
            decided: counts.clone(),
            applied: counts,
            steering: Steering {
                // No earlier leader left anything in the simulated workers.
                inherited_read: true,
                ..Steering::default()
            },
            costs: BTreeMap::new(),
        }
    }

    /// A new decision: the counts the next reconciles roll out.
    pub fn decide(&mut self, reserve: i32, shared: i32) {
        self.decided = replicas(reserve, shared);
    }

    /// One reconcile at `at`: observe, plan, act. Returns what started or woke, and when to come
    /// back.
    pub fn reconcile(&mut self, pool: &mut Pool, at: Nanos) -> (Moved, Option<Nanos>) {
        let now = Duration::from_nanos(at);
        let mut moved = Moved::default();
        // Drains the operator no longer asks for lapse in the workers (seen here, at a reconcile).
        pool.lapse(at, &mut moved);
        // Observe.
        let live = self.live(pool);
        let workers = self.workers(pool);
        let reading = self.reading(pool, at);
        let seen = Seen {
            pool: &self.pool,
            live: &live,
            workers: &workers,
            work: Some(&reading),
            inherited: None,
            target: &self.decided,
            applied: Some(&self.applied),
            now,
        };
        // Plan.
        let effects = plan::plan(&seen, &mut self.steering, self.settings);
        // Act: the growth alone; the costs and the requests (their answers recorded); the counts.
        if let Some(growth) = &effects.growth {
            self.apply(pool, growth, at, &mut moved);
        }
        for (pod, cost) in &effects.costs {
            match *cost == IDLE_COST {
                true => self.costs.remove(pod),
                false => self.costs.insert(pod.clone(), *cost),
            };
        }
        let answers = effects
            .asks
            .iter()
            .map(|ask| (ask.clone(), self.ask(pool, ask, at, &mut moved)))
            .collect();
        plan::record(&mut self.steering, answers, now);
        self.apply(pool, &effects.release.replicas, at, &mut moved);
        self.applied = effects.release.replicas;
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
        let surge_timeout = self.settings.rules.surge_timeout;
        let again = self.steering.requeue(surge_timeout, now);
        (moved, again.map(|after| at + nanos(after)))
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

    /// The pool's workers as the operator's Pod cache has them: ready once started, each with
    /// the deletion cost the operator last wrote.
    fn workers(&self, pool: &Pool) -> Vec<Worker> {
        [Deployment::Reserved, Deployment::Shared]
            .into_iter()
            .flat_map(|d| pool.pods(d).into_iter().map(move |id| (d, id)))
            .map(|(d, id)| {
                let name = pod_name(id);
                let pod = CachedPod {
                    ready: pool.workers[id].state != State::Starting,
                    address: Some(format!("{name}:9100")),
                    deletion_cost: self.costs.get(&name).map(i32::to_string),
                    containers_ready: true,
                    name,
                    ..CachedPod::default()
                };
                Worker::new(&Arc::new(pod), self.name(d))
            })
            .collect()
    }

    /// What every worker is doing, as its own gauges say (every one answers).
    fn reading(&self, pool: &Pool, at: Nanos) -> Reading {
        let ids = [Deployment::Reserved, Deployment::Shared]
            .into_iter()
            .flat_map(|d| pool.pods(d));
        let work: std::collections::HashMap<String, _> =
            ids.map(|id| (pod_name(id), pool.work(id))).collect();
        Reading {
            heard: work.keys().cloned().collect(),
            work,
            job_seconds: self.job_seconds.clone(),
            now: seconds(at),
            scraped: None,
        }
    }

    /// Sends `ask` to its simulated worker, which answers as the lane workers do.
    fn ask(&self, pool: &mut Pool, ask: &Ask, at: Nanos, moved: &mut Moved) -> Answer {
        let worker = id(&ask.pod);
        match &ask.request {
            Request::Drain(seconds) => {
                pool.drain(worker, *seconds, at, moved);
                Answer::Drain(DrainAnswer::Draining {
                    busy: pool.busy(worker),
                })
            }
            Request::StandIn { lanes, .. } => {
                pool.serve(worker, self.serving(lanes), moved);
                Answer::StandIn(StandInAnswer::StandingIn)
            }
            Request::OwnLanes => {
                let own = self.role(pool.workers[worker].deployment);
                pool.serve(worker, own, moved);
                Answer::StandIn(StandInAnswer::StandingIn)
            }
        }
    }

    /// Applies `replicas` at `at`: a Deployment grows, or its ReplicaSet deletes the Pods that
    /// cost least, as the operator annotated them (a busy one gets the template's grace period).
    fn apply(&mut self, pool: &mut Pool, replicas: &Replicas, at: Nanos, moved: &mut Moved) {
        let killed_at = at.saturating_add(GRACE);
        for deployment in [Deployment::Reserved, Deployment::Shared] {
            let count = usize::try_from(self.count(replicas, deployment)).unwrap_or(0);
            let costs = Costs {
                annotated: &self.costs,
            };
            pool.scale(
                (deployment, self.role(deployment), count),
                &costs,
                killed_at,
                moved,
            );
        }
        self.costs.retain(|n, _| pool.workers[id(n)].counted());
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
