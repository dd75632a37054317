//! The workers and the two lanes: who is idle, who is busy with what, which Deployment each
//! worker belongs to, and which lanes it serves. How workers come and go is the operator's own
//! rollout (`rollout.rs` runs it); this module is what it acts on: Deployments that start new
//! workers and whose ReplicaSet deletes the cheapest ones, and workers that answer the
//! operator's `POST /stand-in` and `POST /drain` as the lane workers do. No clock of its own: the
//! engine tells it the time and schedules what it returns.

use std::collections::{BTreeMap, VecDeque};

use super::scenario::{Nanos, Preference, seconds};
use crate::controller::rollout::cost::Work;
use crate::controller::rollout::drain::{Candidate, choose};

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LaneKind {
    Urgent,
    Batch,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum State {
    Idle,
    Busy {
        lane: LaneKind,
        submitted: Nanos,
        /// When the job started.
        started: Nanos,
    },
    /// Between a new Pod's creation and its taking work.
    Starting,
    /// Between finishing a job and asking for the next (reporting it done, then a take): the
    /// queue's hand-off, during which the worker takes nothing.
    HandingOff,
    Gone,
}

pub use super::scenario::Deployment;

#[derive(Clone, Debug)]
pub struct Worker {
    pub deployment: Deployment,
    /// The lanes it takes jobs from: its Deployment's, or the reserve's while it stands in.
    pub role: Preference,
    /// The lanes its Deployment gives it.
    pub own: Preference,
    /// Asked to drain: it takes no new job until it is told otherwise or `drain_lapse` passes.
    pub draining: bool,
    pub drain_lapse: Nanos,
    /// Deleted while busy: it leaves once its job is done (its SIGTERM waits for the job).
    pub leaving: bool,
    /// When a leaving worker's grace period ends: a job still running then is cut short.
    pub deadline: Option<Nanos>,
    pub state: State,
    /// Urgent jobs finished since the operator last read this worker's count.
    pub unread_urgent: u32,
    /// Whether the operator's last read counted this worker.
    pub read: bool,
}

impl Worker {
    /// Whether its Pod is still one of its Deployment's (not deleted, not gone).
    pub fn counted(&self) -> bool {
        self.state != State::Gone && !self.leaving
    }
}

/// The lanes' queues. Batch jobs are all queued at the start, so a count is enough.
#[derive(Debug, Default)]
pub struct Lanes {
    /// Submission times of waiting urgent jobs, oldest first.
    pub urgent: VecDeque<Nanos>,
    pub batch: u64,
}

impl Lanes {
    /// The first non-empty lane in the role's preference order.
    pub fn take(&mut self, role: Preference) -> Option<(LaneKind, Nanos)> {
        let urgent = |lanes: &mut Self| lanes.urgent.pop_front().map(|at| (LaneKind::Urgent, at));
        let batch = |lanes: &mut Self| {
            (lanes.batch > 0).then(|| {
                lanes.batch -= 1;
                (LaneKind::Batch, 0)
            })
        };
        match role {
            Preference::UrgentOnly => urgent(self),
            Preference::BatchOnly => batch(self),
            Preference::UrgentFirst => urgent(self).or_else(|| batch(self)),
            Preference::BatchFirst => batch(self).or_else(|| urgent(self)),
        }
    }
}

/// What a step of the rollout set moving: the workers that start up, and the idle ones whose
/// lanes changed or that may take jobs again (they look for work at once).
#[derive(Debug, Default)]
pub struct Moved {
    pub starting: Vec<usize>,
    pub woken: Vec<usize>,
}

/// The Pods' deletion costs when a ReplicaSet deletes some: as the operator annotated them, by
/// Pod name (0 for a Pod without one).
#[derive(Clone, Copy, Debug)]
pub struct Costs<'a> {
    pub annotated: &'a BTreeMap<String, i32>,
}

#[derive(Debug, Default)]
pub struct Pool {
    pub workers: Vec<Worker>,
    /// Idle workers that take jobs, by role; the most recently idle is woken first.
    idle: [Vec<usize>; Preference::COUNT],
    /// Workers whose Pod is still here (not gone), leaving ones included: what a cluster pays.
    live: usize,
}

impl Pool {
    pub fn add(&mut self, deployment: Deployment, role: Preference, state: State) -> usize {
        self.workers.push(Worker {
            deployment,
            role,
            own: role,
            draining: false,
            drain_lapse: 0,
            leaving: false,
            deadline: None,
            state,
            unread_urgent: 0,
            read: false,
        });
        self.live += 1;
        self.workers.len() - 1
    }

    /// `worker`'s Pod is gone.
    pub fn gone(&mut self, worker: usize) {
        if self.workers[worker].state != State::Gone {
            self.live -= 1;
            self.workers[worker].state = State::Gone;
        }
    }

    /// How many Pods are still here, busy leaving ones included.
    pub fn live(&self) -> usize {
        self.live
    }

    /// `worker` has no job: it waits for one, unless it drains.
    pub fn set_idle(&mut self, worker: usize) {
        self.workers[worker].state = State::Idle;
        if !self.workers[worker].draining {
            self.idle[self.workers[worker].role.index()].push(worker);
        }
    }

    /// An idle worker that takes urgent jobs, reserved ones first.
    pub fn wake_for_urgent(&mut self) -> Option<usize> {
        [
            Preference::UrgentOnly,
            Preference::UrgentFirst,
            Preference::BatchFirst,
        ]
        .into_iter()
        .find_map(|role| self.idle[role.index()].pop())
    }

    fn leave_idle(&mut self, worker: usize) {
        let list = &mut self.idle[self.workers[worker].role.index()];
        if let Some(at) = list.iter().position(|w| *w == worker) {
            list.swap_remove(at);
        }
    }

    /// The workers of `deployment`'s Pods, oldest first.
    pub fn pods(&self, deployment: Deployment) -> Vec<usize> {
        (0..self.workers.len())
            .filter(|&id| {
                let w = &self.workers[id];
                w.deployment == deployment && w.counted()
            })
            .collect()
    }

    /// How many workers take jobs: ready, not draining, not leaving.
    pub fn taking(&self) -> usize {
        self.workers
            .iter()
            .filter(|w| w.counted() && w.state != State::Starting && !w.draining)
            .count()
    }

    /// How many of `deployment`'s Pods are ready.
    pub fn ready(&self, deployment: Deployment) -> usize {
        self.pods(deployment)
            .into_iter()
            .filter(|&id| self.workers[id].state != State::Starting)
            .count()
    }

    /// What `worker` is doing, as its gauges say.
    pub fn work(&self, worker: usize) -> Work {
        match self.workers[worker].state {
            State::Busy { lane, started, .. } => Work::Busy {
                lane: Some(lane_name(lane).to_string()),
                started: Some(seconds(started)),
            },
            _ => Work::Idle,
        }
    }

    /// Sets `deployment` to `count` Pods: new ones start (`role` their lanes); or its ReplicaSet
    /// deletes the surplus in its own order (not ready first, then the lowest deletion cost as
    /// `costs` has them, the newest first among equals); a busy one deleted is killed at
    /// `killed_at`, the end of its grace period.
    pub fn scale(
        &mut self,
        (deployment, role, count): (Deployment, Preference, usize),
        costs: &Costs<'_>,
        killed_at: Nanos,
        moved: &mut Moved,
    ) {
        let pods = self.pods(deployment);
        if count > pods.len() {
            for _ in pods.len()..count {
                moved
                    .starting
                    .push(self.add(deployment, role, State::Starting));
            }
            return;
        }
        let candidates: Vec<Candidate> = pods
            .into_iter()
            .map(|id| {
                let name = name(id);
                let cost = costs.annotated.get(&name).copied().unwrap_or(0);
                Candidate {
                    ready: self.workers[id].state != State::Starting,
                    cost,
                    draining: false,
                    name,
                }
            })
            .collect();
        let surplus = candidates.len() - count;
        for name in choose(&candidates, surplus) {
            self.retire(id(&name), killed_at);
        }
    }

    /// `worker` serves `role`'s lanes from now (a stand-in, or back to its own); an idle one is
    /// to look for work in them (`woken`).
    pub fn serve(&mut self, worker: usize, role: Preference, moved: &mut Moved) {
        if self.workers[worker].role == role || !self.workers[worker].counted() {
            return;
        }
        let waiting = self.waiting(worker);
        if waiting {
            self.leave_idle(worker);
        }
        self.workers[worker].role = role;
        if waiting {
            self.wake(worker, moved);
        }
    }

    /// `worker` drains for `seconds` (takes no new job; a drain ends a stand-in), or takes jobs
    /// again (`0`); an idle one that may take jobs again is to look for work (`woken`).
    pub fn drain(&mut self, worker: usize, seconds: u64, at: Nanos, moved: &mut Moved) {
        if !self.workers[worker].counted() {
            return;
        }
        if self.waiting(worker) {
            self.leave_idle(worker);
        }
        let w = &mut self.workers[worker];
        w.draining = seconds > 0;
        if w.draining {
            w.role = w.own;
            w.drain_lapse = at.saturating_add(seconds.saturating_mul(1_000_000_000));
        } else if w.state == State::Idle {
            self.wake(worker, moved);
        }
    }

    /// The drained workers whose drain lapsed by `at` (the worker's own timer, for a drain the
    /// operator no longer asks for) take jobs again: the idle ones are to look for work.
    pub fn lapse(&mut self, at: Nanos, moved: &mut Moved) {
        for worker in 0..self.workers.len() {
            let w = &self.workers[worker];
            if w.counted() && w.draining && at >= w.drain_lapse && w.state == State::Idle {
                self.workers[worker].draining = false;
                self.wake(worker, moved);
            }
        }
    }

    /// Whether `worker` drains at `at`: a drain past its lapse is over (the worker's own timer).
    pub fn draining(&mut self, worker: usize, at: Nanos) -> bool {
        let w = &mut self.workers[worker];
        if w.draining && at >= w.drain_lapse {
            w.draining = false;
        }
        w.draining
    }

    /// Whether `worker` is idle and waiting for a job (listed as idle).
    fn waiting(&self, worker: usize) -> bool {
        self.workers[worker].state == State::Idle && !self.workers[worker].draining
    }

    /// An idle `worker` is to look for work now: the engine gives it a job or lists it idle.
    fn wake(&mut self, worker: usize, moved: &mut Moved) {
        self.workers[worker].state = State::HandingOff;
        moved.woken.push(worker);
    }

    /// Whether `worker` is busy with a job, as its `lanepool_worker_busy` says.
    pub fn busy(&self, worker: usize) -> bool {
        matches!(self.workers[worker].state, State::Busy { .. })
    }

    /// `worker`'s Pod is deleted: it leaves at once when it holds no job, after its job
    /// otherwise, unless its grace period ends first (at `killed_at`).
    fn retire(&mut self, worker: usize, killed_at: Nanos) {
        match self.workers[worker].state {
            State::Busy { .. } => {
                self.workers[worker].leaving = true;
                self.workers[worker].deadline = Some(killed_at);
            }
            State::Idle => {
                self.leave_idle(worker);
                self.gone(worker);
            }
            _ => self.gone(worker),
        }
    }

    /// The urgent jobs every worker still here finished since the last read, which this read
    /// takes; `None` when a worker the last read counted is gone: what it finished since went
    /// with its Pod, and the operator does not take a sum without it for a rate.
    pub fn read_urgent_finished(&mut self) -> Option<u64> {
        let mut complete = true;
        let mut finished = 0;
        for w in &mut self.workers {
            let unread = std::mem::take(&mut w.unread_urgent);
            if w.state == State::Gone {
                complete &= !w.read;
                w.read = false;
            } else {
                finished += u64::from(unread);
                w.read = true;
            }
        }
        complete.then_some(finished)
    }
}

/// The lane a job came from, by the name the operator knows it by.
pub fn lane_name(lane: LaneKind) -> &'static str {
    match lane {
        LaneKind::Urgent => super::autoscale::LANE,
        LaneKind::Batch => super::autoscale::BATCH_LANE,
    }
}

/// A worker's Pod name: the newest sorts first among equals, as the ReplicaSet deletes the
/// newest first.
pub fn name(id: usize) -> String {
    format!("{:020}", u64::MAX - id as u64)
}

/// The worker of a Pod name.
pub fn id(name: &str) -> usize {
    name.parse::<u64>().map_or(usize::MAX, |n| {
        usize::try_from(u64::MAX - n).unwrap_or(usize::MAX)
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::controller::rollout::cost::{DRAINED_COST, cost};

    fn pool(reserved: usize, shared: usize) -> Pool {
        let mut pool = Pool::default();
        for _ in 0..reserved {
            let id = pool.add(
                Deployment::Reserved,
                Preference::UrgentOnly,
                State::Starting,
            );
            pool.set_idle(id);
        }
        for _ in 0..shared {
            let id = pool.add(Deployment::Shared, Preference::UrgentFirst, State::Starting);
            pool.set_idle(id);
        }
        pool
    }

    fn busy(pool: &mut Pool, id: usize, started: Nanos) {
        pool.leave_idle(id);
        pool.workers[id].state = State::Busy {
            lane: LaneKind::Batch,
            submitted: 0,
            started,
        };
    }

    fn job_seconds() -> BTreeMap<String, f64> {
        BTreeMap::from([("urgent".into(), 0.02), ("batch".into(), 3.0)])
    }

    #[test]
    fn a_shrink_deletes_marked_workers_first_then_idle_then_the_job_nearest_its_end() {
        let mut pool = pool(0, 5);
        busy(&mut pool, 0, 0);
        busy(&mut pool, 1, 2_000_000_000);
        busy(&mut pool, 4, 0);
        let mut moved = Moved::default();
        // As the operator ranks them at 2.5 s: the marked one, then by the time left.
        let job_seconds = job_seconds();
        let mut annotated: BTreeMap<String, i32> = (0..5)
            .map(|id| {
                let cost = cost(Some(&pool.work(id)), &job_seconds, seconds(2_500_000_000));
                (name(id), cost)
            })
            .collect();
        annotated.insert(name(4), DRAINED_COST);
        let costs = Costs {
            annotated: &annotated,
        };
        let shared = |count| (Deployment::Shared, Preference::UrgentFirst, count);
        pool.scale(shared(3), &costs, u64::MAX, &mut moved);
        // The marked worker (its job done as far as the marks know) and the idle one nearest
        // the end of the list (the newest) go.
        assert!(pool.workers[4].leaving, "marked");
        assert_eq!(pool.workers[3].state, State::Gone, "idle, newest");
        assert_eq!(pool.pods(Deployment::Shared), vec![0, 1, 2]);
        pool.scale(shared(1), &costs, u64::MAX, &mut moved);
        // Then the idle one, then the job 0.5 s from its end before the one 2 s from it.
        assert_eq!(pool.workers[2].state, State::Gone);
        assert!(pool.workers[0].leaving && !pool.workers[1].leaving);
    }

    #[test]
    fn a_growing_deployment_starts_workers_in_its_role() {
        let mut pool = pool(1, 2);
        let mut moved = Moved::default();
        let none = BTreeMap::new();
        let costs = Costs { annotated: &none };
        let urgent = Preference::UrgentOnly;
        pool.scale(
            (Deployment::Reserved, urgent, 3),
            &costs,
            u64::MAX,
            &mut moved,
        );
        assert_eq!(moved.starting, vec![3, 4]);
        assert_eq!(pool.ready(Deployment::Reserved), 1);
        assert_eq!(pool.pods(Deployment::Reserved).len(), 3);
        assert!(
            moved
                .starting
                .iter()
                .all(|id| pool.workers[*id].role == urgent)
        );
    }

    #[test]
    fn a_draining_worker_takes_no_job_and_one_called_back_looks_for_work() {
        let mut pool = pool(0, 2);
        let mut moved = Moved::default();
        pool.drain(1, 5, 0, &mut moved);
        assert_eq!(
            pool.wake_for_urgent(),
            Some(0),
            "only the worker not draining"
        );
        assert_eq!(pool.wake_for_urgent(), None);
        assert!(pool.draining(1, 4_999_999_999));
        pool.set_idle(0);
        pool.drain(1, 0, 1, &mut moved);
        assert_eq!(moved.woken, vec![1]);
        assert_eq!(pool.workers[1].state, State::HandingOff, "to look for work");
        pool.drain(1, 5, 2, &mut moved);
        pool.set_idle(1);
        pool.lapse(5_000_000_001, &mut moved);
        assert!(pool.workers[1].draining, "not yet");
        pool.lapse(5_000_000_002, &mut moved);
        assert!(!pool.workers[1].draining, "the drain lapsed");
        assert_eq!(moved.woken, vec![1, 1]);
    }

    #[test]
    fn a_stand_in_serves_the_reserve_and_goes_back() {
        let mut pool = pool(0, 1);
        let mut moved = Moved::default();
        pool.serve(0, Preference::UrgentOnly, &mut moved);
        assert_eq!(pool.workers[0].role, Preference::UrgentOnly);
        pool.set_idle(0);
        assert_eq!(pool.wake_for_urgent(), Some(0));
        pool.set_idle(0);
        pool.serve(0, Preference::UrgentFirst, &mut moved);
        assert_eq!(moved.woken, vec![0, 0]);
        assert_eq!(pool.workers[0].deployment, Deployment::Shared);
    }

    #[test]
    fn pod_names_sort_the_newest_first_and_name_their_worker() {
        assert!(name(7) < name(3));
        assert_eq!(id(&name(12_345)), 12_345);
        assert_eq!(id("not a pod"), usize::MAX);
    }
}
