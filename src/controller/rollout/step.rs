//! One step of the rollout, without I/O: from the decision, the live Deployments, this process's
//! last counts and the surge's wait, what to write now and in which order, and what still waits.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use k8s_openapi::api::apps::v1::Deployment;

use super::drain;
use super::shrink::{Shrink, StandIn, lanes_of};
use super::surge;
use crate::api::LanePool;
use crate::controller::deployments::{Role, counts_by_name, leaving, pool_roles, spec_replicas};
use crate::sizing::Replicas;

/// How the operator rolls a decision out (from its flags).
#[derive(Clone, Copy, Debug, PartialEq)]
pub(crate) struct Rules {
    /// How long a shrink waits for the growing Deployments to be ready; zero: no wait.
    pub(crate) surge_timeout: Duration,
    /// Rank a shrinking Deployment's Pods so idle workers go first.
    pub(crate) rank: bool,
    /// Drain the workers a shrink stops before it goes.
    pub(crate) drain: bool,
}

/// Where a surge stands, as the pool's memory has it.
#[derive(Clone, Debug, Default, PartialEq)]
pub(crate) struct Surge {
    /// How long a shrink has waited for the growing Deployments (`None`: none waits).
    pub(crate) waited: Option<Duration>,
    /// The Deployments that grew for the waiting shrink.
    pub(crate) taking_over: BTreeSet<String>,
}

/// A shrink's wait for the growing Deployments, carried between reconciles: since when it
/// waits (from the first reconcile that found it waiting, until one does not) and for which
/// Deployments.
#[derive(Clone, Debug, Default, PartialEq)]
pub(crate) struct SurgeWait {
    pub(crate) since: Option<Duration>,
    pub(crate) taking_over: BTreeSet<String>,
}

impl SurgeWait {
    /// How long a shrink has been waiting, if it has.
    pub(crate) fn waited(&self, now: Duration) -> Option<Duration> {
        self.since.map(|since| now.saturating_sub(since))
    }

    /// Where the surge stands at `now`, for [`rollout`].
    pub(crate) fn surge(&self, now: Duration) -> Surge {
        Surge {
            waited: self.waited(now),
            taking_over: self.taking_over.clone(),
        }
    }

    /// Follows `rollout`: a wait starts, goes on or ends. Returns how long a wait that ends now
    /// lasted.
    pub(crate) fn follow(&mut self, rollout: &Rollout, now: Duration) -> Option<Duration> {
        let waiting = rollout.waiting;
        let ended = self.waited(now).filter(|_| !waiting);
        self.since = waiting.then(|| self.since.unwrap_or(now));
        self.taking_over = match waiting {
            true => rollout.taking_over.clone(),
            false => BTreeSet::new(),
        };
        ended
    }

    /// The latest a waiting shrink waits until, `timeout` after the wait began (from `now`
    /// when none waits).
    pub(crate) fn ends(&self, timeout: Duration, now: Duration) -> Duration {
        self.since.unwrap_or(now) + timeout
    }
}

/// One reconcile's way to the decided counts.
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct Rollout {
    /// The counts of this step of the surge: growth at once, a shrink once the others are ready.
    pub(crate) step: Replicas,
    /// A shrink waits for the growing Deployments.
    pub(crate) waiting: bool,
    /// The Deployments growing in this surge, whose readiness a shrink waits for: remembered
    /// while it waits (once grown, a Deployment's count is its target, but it still takes over).
    pub(crate) taking_over: BTreeSet<String>,
    /// The Deployments the surge lets shrink now: their workers drain first. A shrink that waits
    /// for the Deployments taking over is not among them, and its workers keep taking jobs until
    /// their replacements are ready. Empty when the operator does not drain.
    pub(crate) shrinks: Vec<Shrink>,
    /// The shrinks that wait for the Deployments taking over: their workers that will stop stand
    /// in for the new ones meanwhile. Empty when the operator does not drain.
    pub(crate) stand_ins: Vec<StandIn>,
    /// What to write before any shrinking Deployment's Pod is asked anything: the step with every
    /// shrink held. `None` when nothing is to shrink (the step goes out in one write).
    pub(crate) growth: Option<Replicas>,
    /// While a shrink waits for the surge: the Deployments taking over that are not ready yet,
    /// as (name, ready, target).
    pub(crate) not_ready: Vec<(String, i32, i32)>,
    /// The Deployments no lane runs any more: (name, what it runs, what this step gives it: 0
    /// once the surge lets it go).
    pub(crate) leaving: Vec<(String, i32, i32)>,
    /// The counts decided, and the rules the step follows: what [`Rollout::settle`] needs.
    pub(crate) decided: Replicas,
    pub(crate) rules: Rules,
}

/// The rollout's second half: what goes out now that the drains answered, and the shrinks that
/// still wait.
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct Settled {
    pub(crate) release: Release,
    pub(crate) held: Vec<Held>,
}

/// A shrink that waits: its Deployment, the count it runs and the one decided, what it waits for
/// and the most it waits (`until`, since the process started).
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct Held {
    pub(crate) deployment: String,
    pub(crate) runs: i32,
    pub(crate) to: i32,
    pub(crate) waits_for: WaitsFor,
    pub(crate) until: Duration,
}

/// What a waiting shrink waits for.
#[derive(Clone, Debug, PartialEq)]
pub(crate) enum WaitsFor {
    /// The Deployments taking over its capacity to be ready: (name, ready, target) of each one
    /// not ready yet.
    Ready(Vec<(String, i32, i32)>),
    /// This many of its drained workers to finish their jobs.
    Drained(usize),
}

/// What goes out once the drains have answered.
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct Release {
    /// The step, with each shrink a drain holds kept at its live count.
    pub(crate) replicas: Replicas,
    /// The Deployments that shrink with this write: their Pods are ranked first, and their drains
    /// end with it. Empty when the operator does not rank.
    pub(crate) shrinking: Vec<String>,
    /// The Deployments no lane runs that go now: removed, their drains ended.
    pub(crate) remove: Vec<String>,
    /// Those that still wait (for the surge, or their drained workers), running as they are.
    pub(crate) staying: Vec<String>,
}

/// One Deployment of the pool in a rollout: its name, its role, its counts, and whether a lane
/// still runs it (the others no lane runs any more shrink to 0, and go).
struct Part {
    name: String,
    role: Role,
    counts: surge::Counts,
    lane_runs_it: bool,
}

impl Part {
    /// It grows in this surge and is not ready at its new count yet, while a shrink waits.
    fn starting(&self, waiting: bool) -> bool {
        waiting && self.counts.takes_over && self.counts.ready < self.counts.target
    }

    /// The shrink this step lets go now (`now`: the count the step gives it): only to its
    /// target, and only once the surge lets it.
    fn shrink_now(&self, pool: &LanePool, now: i32) -> Option<Shrink> {
        let live = self.counts.live.filter(|live| now < *live)?;
        Some(Shrink {
            deployment: self.name.clone(),
            live,
            to: self.counts.target,
            lanes: lanes_of(pool, &self.role),
        })
    }

    /// The shrink this step holds for the surge (`now` is still its live count).
    fn shrink_held(&self, pool: &LanePool, now: i32) -> Option<Shrink> {
        let live = self
            .counts
            .live
            .filter(|live| self.counts.target < *live && now >= *live)?;
        Some(Shrink {
            deployment: self.name.clone(),
            live,
            to: self.counts.target,
            lanes: lanes_of(pool, &self.role),
        })
    }
}

/// The pool's Deployments as a rollout sees them: the lanes' at their `decided` counts, then
/// those no lane runs any more, at 0. A count starts from what this process applied last
/// (`own`), or else from the Deployment.
fn parts(
    pool: &LanePool,
    live: &BTreeMap<String, Deployment>,
    decided: &Replicas,
    own: Option<&Replicas>,
    surge: &Surge,
) -> Vec<Part> {
    let own = counts_by_name(pool, own);
    let lanes = pool_roles(pool, decided)
        .into_iter()
        .map(|(name, role, target)| (name, role, target, true));
    let gone = leaving(pool, live.values())
        .into_iter()
        .map(|(name, role)| (name, role, 0, false));
    lanes
        .chain(gone)
        .map(|(name, role, target, lane_runs_it)| {
            let deployment = live.get(&name);
            let count = deployment
                .and(own.get(&name).copied())
                .or_else(|| deployment.and_then(spec_replicas));
            let counts = surge::Counts {
                target,
                live: count,
                ready: deployment.map_or(0, ready_replicas),
                takes_over: count.is_none_or(|count| target > count)
                    || surge.taking_over.contains(&name),
            };
            Part {
                name,
                role,
                counts,
                lane_runs_it,
            }
        })
        .collect()
}

/// The way from the `live` Deployments to `decided`. A shrink starts from what this process
/// applied last (`own`), so a count someone else set is restored at once rather than waited on;
/// after a restart, from the Deployments. `surge`: how far a waiting shrink's surge has come.
pub(crate) fn rollout(
    pool: &LanePool,
    live: &BTreeMap<String, Deployment>,
    decided: &Replicas,
    own: Option<&Replicas>,
    surge: &Surge,
    rules: Rules,
) -> Rollout {
    let parts = parts(pool, live, decided, own, surge);
    let counts: Vec<surge::Counts> = parts.iter().map(|p| p.counts).collect();
    let step_now = surge::step(&counts, surge.waited, rules.surge_timeout);
    let waiting = step_now.waiting;
    // Each Deployment with the count this step gives it.
    let now: Vec<(&Part, i32)> = parts.iter().zip(step_now.apply).collect();
    let taking_over = parts
        .iter()
        .filter(|p| p.counts.takes_over && p.counts.live.is_none_or(|l| p.counts.target >= l))
        .map(|p| p.name.clone())
        .collect();
    let not_ready = parts
        .iter()
        .filter(|p| p.starting(waiting))
        .map(|p| (p.name.clone(), p.counts.ready, p.counts.target))
        .collect();
    let shrinks = match rules.drain {
        true => now
            .iter()
            .filter_map(|(p, count)| p.shrink_now(pool, *count))
            .collect(),
        false => Vec::new(),
    };
    // While a shrink waits for the Deployments taking over, the workers it will stop serve their
    // lanes (those of the ones not ready yet, in priority order), when those are among their
    // own: a shared worker stands in for a reserved one, never the other way, since a reserved
    // worker given the batch lane could take a long job it cannot give back should the reserve
    // grow again.
    let starting: BTreeSet<String> = parts
        .iter()
        .filter(|p| p.starting(waiting))
        .flat_map(|p| lanes_of(pool, &p.role))
        .collect();
    let serves: Vec<String> = pool
        .spec
        .lanes
        .iter()
        .map(|l| l.name.clone())
        .filter(|lane| starting.contains(lane))
        .collect();
    let stand_ins = match rules.drain && !serves.is_empty() {
        true => now
            .iter()
            .filter_map(|(p, count)| p.shrink_held(pool, *count))
            .filter(|shrink| serves.iter().all(|lane| shrink.lanes.contains(lane)))
            .map(|shrink| StandIn {
                shrink,
                serves: serves.clone(),
            })
            .collect(),
        false => Vec::new(),
    };
    let mut step = decided.clone();
    let mut leaving_step = Vec::new();
    for (part, count) in &now {
        match part.lane_runs_it {
            true => set(&mut step, &part.role, *count),
            false => {
                let runs = part.counts.live.unwrap_or(0);
                leaving_step.push((part.name.clone(), runs, *count));
            }
        }
    }
    let shrinking_now = rules.rank && !shrinking(pool, live, &step).is_empty();
    let shrink_decided = rules.drain && counts.iter().any(surge::Counts::shrinks);
    let growth = (shrink_decided || shrinking_now).then(|| hold(pool, live, &step, |_| i32::MAX));
    Rollout {
        step,
        waiting,
        taking_over,
        shrinks,
        stand_ins,
        growth,
        not_ready,
        leaving: leaving_step,
        decided: decided.clone(),
        rules,
    }
}

impl Rollout {
    /// The one step back into the plan, once the drains answered (`floors`: the fewest workers
    /// each shrinking Deployment may run now; `drains`: where each drain stands): what goes out
    /// now ([`Self::release`]), and what still waits for its drained workers or for the surge,
    /// which waits until `surge_ends` at the latest ([`Self::held`]).
    pub(crate) fn settle(
        &self,
        pool: &LanePool,
        live: &BTreeMap<String, Deployment>,
        floors: &BTreeMap<String, i32>,
        drains: &BTreeMap<String, drain::Drain>,
        (surge_ends, now): (Duration, Duration),
    ) -> Settled {
        let release = self.release(pool, live, floors, self.rules);
        let held = self.held(pool, &self.decided, &release, drains, surge_ends, now);
        Settled { release, held }
    }

    /// The shrinks that still wait once `release` goes out, towards `decided`: for their drained
    /// workers (`drains`), or for the surge, which waits until `surge_ends` at the latest.
    pub(crate) fn held(
        &self,
        pool: &LanePool,
        decided: &Replicas,
        release: &Release,
        drains: &BTreeMap<String, drain::Drain>,
        surge_ends: Duration,
        now: Duration,
    ) -> Vec<Held> {
        let mut runs = counts_by_name(pool, Some(&release.replicas));
        let mut roles: Vec<(String, i32)> = pool_roles(pool, decided)
            .into_iter()
            .map(|(name, _, to)| (name, to))
            .collect();
        for (name, live, _) in self
            .leaving
            .iter()
            .filter(|l| release.staying.contains(&l.0))
        {
            runs.insert(name.clone(), *live);
            roles.push((name.clone(), 0));
        }
        roles
            .into_iter()
            .filter_map(|(deployment, to)| {
                let runs = *runs.get(&deployment)?;
                if runs <= to {
                    return None;
                }
                // A drain past its timeout still keeps one worker for each drained worker not
                // confirmed idle: the shrink waits for those, asked again every few seconds.
                let drain = drains
                    .get(&deployment)
                    .filter(|d| d.holds(now) || d.unconfirmed() > 0);
                let (waits_for, until) = match drain {
                    Some(drain) => {
                        let first = drain.pods.values().map(|p| p.asked_at).min();
                        let until = (first.unwrap_or(now) + drain.timeout).max(now);
                        (WaitsFor::Drained(drain.unconfirmed()), until)
                    }
                    None => (WaitsFor::Ready(self.not_ready.clone()), surge_ends),
                };
                Some(Held {
                    deployment,
                    runs,
                    to,
                    waits_for,
                    until,
                })
            })
            .collect()
    }

    /// What goes out now that the drains said how far each shrink may go (`floors`: the fewest
    /// workers each shrinking Deployment may run now; one not named may shrink all the way).
    pub(crate) fn release(
        &self,
        pool: &LanePool,
        live: &BTreeMap<String, Deployment>,
        floors: &BTreeMap<String, i32>,
        rules: Rules,
    ) -> Release {
        let floor = |d: &str| floors.get(d).copied().unwrap_or(0);
        let replicas = hold(pool, live, &self.step, floor);
        let shrinking = if rules.rank {
            shrinking(pool, live, &replicas)
        } else {
            Vec::new()
        };
        let (remove, staying) = self
            .leaving
            .iter()
            .partition::<Vec<_>, _>(|(name, _, step)| *step == 0 && floor(name) == 0);
        Release {
            replicas,
            shrinking,
            remove: remove
                .into_iter()
                .map(|(name, _, _)| name.clone())
                .collect(),
            staying: staying
                .into_iter()
                .map(|(name, _, _)| name.clone())
                .collect(),
        }
    }
}

fn ready_replicas(deployment: &Deployment) -> i32 {
    deployment
        .status
        .as_ref()
        .and_then(|s| s.ready_replicas)
        .unwrap_or(0)
}

fn set(replicas: &mut Replicas, role: &Role, count: i32) {
    match role {
        Role::Reserved { lane } => {
            replicas.reserved.insert(lane.clone(), count);
        }
        Role::Shared => replicas.shared = count,
    }
}

/// The Deployments that `replicas` shrinks.
fn shrinking(
    pool: &LanePool,
    live: &BTreeMap<String, Deployment>,
    replicas: &Replicas,
) -> Vec<String> {
    pool_roles(pool, replicas)
        .into_iter()
        .filter(|(name, _, count)| {
            live.get(name)
                .and_then(spec_replicas)
                .is_some_and(|live| *count < live)
        })
        .map(|(name, _, _)| name)
        .collect()
}

/// `replicas` with each shrinking Deployment kept at no fewer than its `floor` (and never above
/// its live count).
fn hold(
    pool: &LanePool,
    live: &BTreeMap<String, Deployment>,
    replicas: &Replicas,
    floor: impl Fn(&str) -> i32,
) -> Replicas {
    let mut held = replicas.clone();
    for (name, role, count) in pool_roles(pool, replicas) {
        let Some(live) = live.get(&name).and_then(spec_replicas) else {
            continue;
        };
        if count < live {
            set(&mut held, &role, floor(&name).clamp(count, live));
        }
    }
    held
}

#[cfg(test)]
mod tests;
