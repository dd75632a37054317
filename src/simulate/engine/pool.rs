//! The workers and the two lanes: who is idle, who is busy with what, and how workers move
//! between roles (a new worker starts, and the one it replaces leaves once it is ready) or
//! leave. No clock of its own: the engine tells it the time and schedules what it returns.

use std::collections::VecDeque;

use super::scenario::{Nanos, Preference};

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
    },
    /// Between a role change (or a new pod) and taking work.
    Starting,
    /// Between finishing a job and asking for the next (reporting it done, then a take): the
    /// queue's hand-off, during which the worker takes nothing.
    HandingOff,
    Gone,
}

#[derive(Clone, Debug)]
pub struct Worker {
    pub role: Preference,
    /// Leave once the current job is done (a reserved pod scaled away).
    pub leaving: bool,
    /// A new worker that, once ready, takes the place of one worker of this role (a surge).
    pub replaces: Option<Preference>,
    pub state: State,
    /// Urgent jobs finished since the operator last read this worker's count.
    pub unread_urgent: u32,
}

impl Worker {
    /// The role of a worker that is staying.
    pub fn committed(&self) -> Option<Preference> {
        (self.state != State::Gone && !self.leaving).then_some(self.role)
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

#[derive(Debug, Default)]
pub struct Pool {
    pub workers: Vec<Worker>,
    /// Idle workers by role; the most recently idle is woken first.
    idle: [Vec<usize>; Preference::COUNT],
}

impl Pool {
    pub fn add(&mut self, role: Preference, state: State) -> usize {
        self.workers.push(Worker {
            role,
            leaving: false,
            replaces: None,
            state,
            unread_urgent: 0,
        });
        self.workers.len() - 1
    }

    pub fn set_idle(&mut self, worker: usize) {
        self.workers[worker].state = State::Idle;
        self.idle[self.workers[worker].role.index()].push(worker);
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

    /// Workers committed to `role`.
    pub fn count(&self, role: Preference) -> usize {
        self.workers
            .iter()
            .filter(|w| w.committed() == Some(role))
            .count()
    }

    /// Workers committed to `role` once every surge under way is over: those replaced by a
    /// starting worker are not counted.
    pub fn target(&self, role: Preference) -> usize {
        let replaced = self
            .workers
            .iter()
            .filter(|w| w.committed().is_some() && w.replaces == Some(role))
            .count();
        self.count(role).saturating_sub(replaced)
    }

    /// Moves `how_many` workers from `from` to `to` without ever lowering either role's capacity
    /// first (a surge): a surge under way the other way is cancelled, otherwise a new `to`
    /// worker starts, and one `from` worker leaves only when it is ready. Returns the workers
    /// that must now start up.
    pub fn surge(&mut self, from: Preference, to: Preference, how_many: usize) -> Vec<usize> {
        let mut left = how_many;
        for id in (0..self.workers.len()).rev() {
            let w = &self.workers[id];
            if left > 0
                && w.state == State::Starting
                && w.committed() == Some(from)
                && w.replaces == Some(to)
            {
                self.workers[id].state = State::Gone;
                left -= 1;
            }
        }
        (0..left)
            .map(|_| {
                let id = self.add(to, State::Starting);
                self.workers[id].replaces = Some(from);
                id
            })
            .collect()
    }

    /// Removes up to `how_many` workers of `role`: idle and starting ones at once, busy ones
    /// after their job.
    pub fn remove(&mut self, role: Preference, how_many: usize) {
        let mut left = how_many;
        for busy_pass in [false, true] {
            for id in (0..self.workers.len()).rev() {
                if left == 0 {
                    return;
                }
                let w = &self.workers[id];
                let busy = matches!(w.state, State::Busy { .. });
                if w.committed() != Some(role) || busy != busy_pass {
                    continue;
                }
                left -= 1;
                if busy {
                    self.workers[id].leaving = true;
                } else {
                    if w.state == State::Idle {
                        self.leave_idle(id);
                    }
                    self.workers[id].state = State::Gone;
                }
            }
        }
    }

    /// The urgent jobs every worker still here finished since the last read, which this read
    /// takes; a departed worker's are lost with it, as a Pod's counter is.
    pub fn read_urgent_finished(&mut self) -> u64 {
        self.workers
            .iter_mut()
            .map(|w| {
                let unread = std::mem::take(&mut w.unread_urgent);
                if w.state == State::Gone {
                    0
                } else {
                    u64::from(unread)
                }
            })
            .sum()
    }

    /// Cancels up to `how_many` pending departures of `role`; returns how many were cancelled.
    pub fn keep(&mut self, role: Preference, how_many: usize) -> usize {
        let mut kept = 0;
        for w in self.workers.iter_mut().rev() {
            if kept == how_many {
                break;
            }
            if w.leaving && w.state != State::Gone && w.role == role {
                w.leaving = false;
                kept += 1;
            }
        }
        kept
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pool(reserved: usize, shared: usize) -> Pool {
        let mut pool = Pool::default();
        for _ in 0..reserved {
            pool.add(Preference::UrgentOnly, State::Idle);
        }
        for _ in 0..shared {
            pool.add(Preference::UrgentFirst, State::Idle);
        }
        pool
    }

    #[test]
    fn a_surge_keeps_the_replaced_workers_until_the_new_ones_are_ready() {
        let mut pool = pool(1, 9);
        let starting = pool.surge(Preference::UrgentFirst, Preference::UrgentOnly, 2);
        assert_eq!(starting.len(), 2);
        // Nobody has left yet: 9 shared workers still take jobs.
        assert_eq!(pool.count(Preference::UrgentFirst), 9);
        assert_eq!(pool.target(Preference::UrgentFirst), 7);
        assert_eq!(pool.target(Preference::UrgentOnly), 3);
    }

    #[test]
    fn a_surge_the_other_way_cancels_one_under_way() {
        let mut pool = pool(1, 9);
        pool.surge(Preference::UrgentFirst, Preference::UrgentOnly, 2);
        let starting = pool.surge(Preference::UrgentOnly, Preference::UrgentFirst, 1);
        assert!(starting.is_empty());
        assert_eq!(pool.target(Preference::UrgentOnly), 2);
        assert_eq!(pool.target(Preference::UrgentFirst), 8);
        assert_eq!(pool.count(Preference::UrgentFirst), 9);
    }
}
