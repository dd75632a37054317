//! The workers and the two lanes: who is idle, who is busy with what, and how a worker changes
//! role (finish the current job, then start up again) or leaves. No clock of its own: the
//! engine tells it the time and schedules what it returns.

use std::collections::VecDeque;

use super::scenario::{Nanos, Role};

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Lane {
    Urgent,
    Batch,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum State {
    Idle,
    Busy {
        lane: Lane,
        submitted: Nanos,
    },
    /// Between a role change (or a new pod) and taking work.
    Starting,
    Gone,
}

#[derive(Clone, Debug)]
pub struct Worker {
    pub role: Role,
    /// The role to take once the current job is done.
    pub next: Option<Role>,
    /// Leave once the current job is done (a reserved pod scaled away).
    pub leaving: bool,
    pub state: State,
}

impl Worker {
    /// The role this worker has or is heading for.
    pub fn committed(&self) -> Option<Role> {
        (self.state != State::Gone && !self.leaving).then(|| self.next.unwrap_or(self.role))
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
    pub fn take(&mut self, role: Role) -> Option<(Lane, Nanos)> {
        let urgent = |lanes: &mut Self| lanes.urgent.pop_front().map(|at| (Lane::Urgent, at));
        let batch = |lanes: &mut Self| {
            (lanes.batch > 0).then(|| {
                lanes.batch -= 1;
                (Lane::Batch, 0)
            })
        };
        match role {
            Role::UrgentOnly => urgent(self),
            Role::BatchOnly => batch(self),
            Role::UrgentFirst => urgent(self).or_else(|| batch(self)),
            Role::BatchFirst => batch(self).or_else(|| urgent(self)),
        }
    }
}

#[derive(Debug, Default)]
pub struct Pool {
    pub workers: Vec<Worker>,
    /// Idle workers by role; the most recently idle is woken first.
    idle: [Vec<usize>; Role::COUNT],
}

impl Pool {
    pub fn add(&mut self, role: Role, state: State) -> usize {
        self.workers.push(Worker {
            role,
            next: None,
            leaving: false,
            state,
        });
        self.workers.len() - 1
    }

    pub fn set_idle(&mut self, worker: usize) {
        self.workers[worker].state = State::Idle;
        self.idle[self.workers[worker].role.index()].push(worker);
    }

    /// An idle worker that takes urgent jobs, reserved ones first.
    pub fn wake_for_urgent(&mut self) -> Option<usize> {
        [Role::UrgentOnly, Role::UrgentFirst, Role::BatchFirst]
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
    pub fn count(&self, role: Role) -> usize {
        self.workers
            .iter()
            .filter(|w| w.committed() == Some(role))
            .count()
    }

    /// Moves up to `how_many` workers from `from` to `to`, cheapest first: a pending change
    /// back to `to` is cancelled, then idle and starting workers move, then busy ones are told
    /// to move after their job. Returns the workers that must now start up.
    pub fn change_role(&mut self, from: Role, to: Role, how_many: usize) -> Vec<usize> {
        let mut starting = Vec::new();
        let mut left = how_many;
        for pass in 0..3 {
            for id in (0..self.workers.len()).rev() {
                if left == 0 {
                    return starting;
                }
                let w = &self.workers[id];
                if w.committed() != Some(from) {
                    continue;
                }
                let picked = match (pass, w.state) {
                    (0, _) => w.next == Some(from) && w.role == to,
                    (1, State::Idle | State::Starting) => true,
                    (2, State::Busy { .. }) => true,
                    _ => false,
                };
                if !picked {
                    continue;
                }
                left -= 1;
                match self.workers[id].state {
                    State::Idle => {
                        self.leave_idle(id);
                        self.workers[id].role = to;
                        self.workers[id].state = State::Starting;
                        starting.push(id);
                    }
                    State::Starting => self.workers[id].role = to,
                    _ => {
                        let w = &mut self.workers[id];
                        w.next = (w.role != to).then_some(to);
                    }
                }
            }
        }
        starting
    }

    /// Removes up to `how_many` workers of `role`: idle and starting ones at once, busy ones
    /// after their job.
    pub fn remove(&mut self, role: Role, how_many: usize) {
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

    /// Cancels up to `how_many` pending departures of `role`; returns how many were cancelled.
    pub fn keep(&mut self, role: Role, how_many: usize) -> usize {
        let mut kept = 0;
        for w in self.workers.iter_mut().rev() {
            if kept == how_many {
                break;
            }
            if w.leaving && w.state != State::Gone && w.next.unwrap_or(w.role) == role {
                w.leaving = false;
                kept += 1;
            }
        }
        kept
    }
}
