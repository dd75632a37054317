//! The workers and the two lanes: who is idle, who is busy with what, and how workers move
//! between roles or leave, by the operator's own rollout (`controller::rollout`): new workers
//! start at once; the workers of the role they take over from leave only once every new one is
//! ready (`surge::step`), chosen as the operator's drain chooses them (`drain::choose`: its
//! stand-ins first, then idle workers), and finish their jobs first; meanwhile the workers that
//! will leave stand in for the new ones, chosen the same way. No clock of its own: the engine
//! tells it the time and schedules what it returns.

use std::collections::VecDeque;

use super::scenario::{Nanos, Preference};
use crate::controller::rollout::drain::{Candidate, choose};
use crate::controller::rollout::surge::{self, Counts};
use crate::controller::{BUSY_COST, DEFAULT_SURGE_TIMEOUT, IDLE_COST};

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
    /// The worker of the replaced role standing in for this starting one: it leaves when this
    /// one is ready.
    pub stood_in_by: Option<usize>,
    /// Serves `role`, not its own, until the worker it stands in for is ready; then leaves.
    pub standing_in: bool,
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

/// What a surge set moving: the workers that start up, and the idle ones whose role changed
/// (they look for work in their new role at once).
#[derive(Debug, Default)]
pub struct Moved {
    pub starting: Vec<usize>,
    pub woken: Vec<usize>,
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
            stood_in_by: None,
            standing_in: false,
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

    /// Workers committed to `role` once every surge under way is over: those standing in, and
    /// those a starting worker replaces without a stand-in, are not counted.
    pub fn target(&self, role: Preference) -> usize {
        let standing_in = self
            .workers
            .iter()
            .filter(|w| w.committed() == Some(role) && w.standing_in)
            .count();
        let replaced = self
            .workers
            .iter()
            .filter(|w| {
                w.committed().is_some() && w.replaces == Some(role) && w.stood_in_by.is_none()
            })
            .count();
        self.count(role).saturating_sub(standing_in + replaced)
    }

    /// Moves `how_many` workers from `from` to `to` without ever lowering either role's capacity
    /// first (a surge): a surge under way the other way is cancelled (its stand-ins go back to
    /// their own role), otherwise a new `to` worker starts, and one `from` worker leaves only
    /// when it is ready. With `stand_in`, that `from` worker serves as a `to` worker meanwhile
    /// (idle ones first): the operator's `POST /stand-in`.
    pub fn surge(
        &mut self,
        from: Preference,
        to: Preference,
        how_many: usize,
        stand_in: bool,
    ) -> Moved {
        let mut moved = Moved::default();
        let mut left = how_many;
        for id in (0..self.workers.len()).rev() {
            let w = &self.workers[id];
            if left > 0
                && w.state == State::Starting
                && w.committed() == Some(from)
                && w.replaces == Some(to)
            {
                self.workers[id].state = State::Gone;
                if let Some(stand_in) = self.workers[id].stood_in_by.take()
                    && self.workers[stand_in].committed().is_some()
                {
                    self.workers[stand_in].standing_in = false;
                    self.change_role(stand_in, to, &mut moved.woken);
                }
                left -= 1;
            }
        }
        // The workers that will leave stand in for the new ones, chosen as the drain will choose
        // them once the new ones are ready.
        let stand_ins = match stand_in {
            true => self.chosen(from, left, |w| w.state != State::Starting && !w.standing_in),
            false => Vec::new(),
        };
        for i in 0..left {
            let id = self.add(to, State::Starting);
            self.workers[id].replaces = Some(from);
            moved.starting.push(id);
            if let Some(&stand_in) = stand_ins.get(i) {
                self.workers[stand_in].standing_in = true;
                self.workers[id].stood_in_by = Some(stand_in);
                self.change_role(stand_in, to, &mut moved.woken);
            }
        }
        // A surge the other way called off: what it started and what is ready may settle now.
        self.settle(to);
        moved
    }

    /// The `k` workers of `role` (among those `eligible`) the operator's drain would choose: not
    /// ready first, then those standing in, then idle, handing off, busy; the newest first among
    /// equals.
    fn chosen(&self, role: Preference, k: usize, eligible: impl Fn(&Worker) -> bool) -> Vec<usize> {
        // The workers standing in for a surge away from `role`: they are its workers still.
        let standing_in: Vec<usize> = self
            .workers
            .iter()
            .filter(|w| w.committed().is_some() && w.replaces == Some(role))
            .filter_map(|w| w.stood_in_by)
            .collect();
        let candidates: Vec<Candidate> = (0..self.workers.len())
            .filter(|&id| {
                let w = &self.workers[id];
                let of_role = w.committed() == Some(role) && !w.standing_in;
                let stood_in =
                    w.committed().is_some() && w.standing_in && standing_in.contains(&id);
                (of_role || stood_in) && eligible(w)
            })
            .map(|id| {
                let w = &self.workers[id];
                Candidate {
                    name: candidate_name(id),
                    ready: w.state != State::Starting,
                    cost: match w.state {
                        State::Idle => IDLE_COST,
                        State::HandingOff => IDLE_COST + 1,
                        _ => BUSY_COST,
                    },
                    draining: w.standing_in,
                }
            })
            .collect();
        choose(&candidates, k)
            .iter()
            .map(|name| candidate_id(name))
            .collect()
    }

    /// Once every new worker taking over from `replaced` is ready (`surge::step`, the operator's
    /// own wait), as many workers of `replaced` leave, chosen as the drain chooses them: those
    /// standing in first. Until then every worker of `replaced` stays.
    fn settle(&mut self, replaced: Preference) {
        let group: Vec<usize> = (0..self.workers.len())
            .filter(|&id| {
                let w = &self.workers[id];
                w.committed().is_some() && w.replaces == Some(replaced)
            })
            .collect();
        let Some(&first) = group.first() else {
            return;
        };
        let to = self.workers[first].role;
        let stand_ins = group
            .iter()
            .filter(|&&id| {
                self.workers[id]
                    .stood_in_by
                    .is_some_and(|s| self.workers[s].committed().is_some())
            })
            .count();
        let starting = group
            .iter()
            .filter(|&&id| self.workers[id].state == State::Starting)
            .count();
        let count = |n: usize| i32::try_from(n).unwrap_or(i32::MAX);
        let taking_over = count(self.count(to).saturating_sub(stand_ins));
        let leaving_from = count(self.count(replaced) + stand_ins);
        let deployments = [
            Counts {
                target: taking_over,
                live: Some(taking_over),
                ready: taking_over - count(starting),
                takes_over: true,
            },
            Counts {
                target: leaving_from - count(group.len()),
                live: Some(leaving_from),
                ready: leaving_from,
                takes_over: false,
            },
        ];
        // The simulated pods always start: the surge's timeout (for pods that never do) is not
        // modelled, and a shrink waits for every new worker.
        if surge::step(&deployments, None, DEFAULT_SURGE_TIMEOUT).waiting {
            return;
        }
        let leaving = self.chosen(replaced, group.len(), |w| w.state != State::Gone);
        for &id in &group {
            self.workers[id].replaces = None;
            self.workers[id].stood_in_by = None;
        }
        for id in leaving {
            self.workers[id].standing_in = false;
            self.retire(id);
        }
    }

    /// Gives `worker` another role; an idle one is to look for work again (`woken`).
    fn change_role(&mut self, worker: usize, role: Preference, woken: &mut Vec<usize>) {
        if self.workers[worker].state == State::Idle {
            self.leave_idle(worker);
            self.workers[worker].state = State::HandingOff;
            woken.push(worker);
        }
        self.workers[worker].role = role;
    }

    /// A starting worker is ready: once every worker of its surge is, the workers they take
    /// over from leave (see [`Self::settle`]).
    pub fn replace(&mut self, starting: usize) {
        let Some(replaced) = self.workers[starting].replaces else {
            return;
        };
        // It counts as ready from now: the engine gives it work next.
        self.workers[starting].state = State::HandingOff;
        self.settle(replaced);
    }

    /// `worker` leaves: at once when it holds no job, after its job otherwise.
    fn retire(&mut self, worker: usize) {
        match self.workers[worker].state {
            State::Busy { .. } => self.workers[worker].leaving = true,
            State::Idle => {
                self.leave_idle(worker);
                self.workers[worker].state = State::Gone;
            }
            _ => self.workers[worker].state = State::Gone,
        }
    }

    /// Removes up to `how_many` workers of `role`, chosen as the operator's drain chooses them
    /// (starting ones, then idle, then busy): idle and starting ones at once, busy ones after their
    /// job.
    pub fn remove(&mut self, role: Preference, how_many: usize) {
        for id in self.chosen(role, how_many, |_| true) {
            self.retire(id);
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

/// A worker's name among the drain's candidates: the newest sorts first among equals.
fn candidate_name(id: usize) -> String {
    format!("{:020}", u64::MAX - id as u64)
}

fn candidate_id(name: &str) -> usize {
    name.parse::<u64>().map_or(usize::MAX, |n| {
        usize::try_from(u64::MAX - n).unwrap_or(usize::MAX)
    })
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
        let moved = pool.surge(Preference::UrgentFirst, Preference::UrgentOnly, 2, false);
        assert_eq!(moved.starting.len(), 2);
        // Nobody has left yet: 9 shared workers still take jobs.
        assert_eq!(pool.count(Preference::UrgentFirst), 9);
        assert_eq!(pool.target(Preference::UrgentFirst), 7);
        assert_eq!(pool.target(Preference::UrgentOnly), 3);
    }

    #[test]
    fn a_surge_the_other_way_cancels_one_under_way() {
        let mut pool = pool(1, 9);
        pool.surge(Preference::UrgentFirst, Preference::UrgentOnly, 2, false);
        let moved = pool.surge(Preference::UrgentOnly, Preference::UrgentFirst, 1, false);
        assert!(moved.starting.is_empty());
        assert_eq!(pool.target(Preference::UrgentOnly), 2);
        assert_eq!(pool.target(Preference::UrgentFirst), 8);
        assert_eq!(pool.count(Preference::UrgentFirst), 9);
    }

    #[test]
    fn stand_ins_serve_the_new_role_until_their_replacements_are_ready() {
        let mut pool = pool(1, 9);
        let moved = pool.surge(Preference::UrgentFirst, Preference::UrgentOnly, 2, true);
        assert_eq!(moved.starting.len(), 2);
        // Two idle shared workers take only the urgent lane at once, and look for work in it.
        assert_eq!(moved.woken.len(), 2);
        assert_eq!(pool.count(Preference::UrgentFirst), 7);
        assert_eq!(pool.count(Preference::UrgentOnly), 1 + 2 + 2);
        // Once the surge is over: 3 reserved, 7 shared, the stand-ins gone.
        assert_eq!(pool.target(Preference::UrgentOnly), 3);
        assert_eq!(pool.target(Preference::UrgentFirst), 7);
        for id in moved.starting {
            pool.workers[id].state = State::Idle;
            pool.replace(id);
        }
        assert_eq!(pool.count(Preference::UrgentOnly), 3);
        assert_eq!(pool.count(Preference::UrgentFirst), 7);
        assert!(
            pool.workers
                .iter()
                .all(|w| !w.standing_in || w.state == State::Gone)
        );
    }

    #[test]
    fn a_surge_called_off_sends_its_stand_ins_back_to_their_role() {
        let mut pool = pool(1, 9);
        let moved = pool.surge(Preference::UrgentFirst, Preference::UrgentOnly, 2, true);
        // No urgent job waits: the stand-ins go idle in their new role.
        for id in &moved.woken {
            pool.set_idle(*id);
        }
        let back = pool.surge(Preference::UrgentOnly, Preference::UrgentFirst, 2, true);
        assert!(back.starting.is_empty());
        let (mut woken, mut stood_in) = (back.woken, moved.woken);
        woken.sort();
        stood_in.sort();
        assert_eq!(woken, stood_in);
        assert_eq!(pool.count(Preference::UrgentOnly), 1);
        assert_eq!(pool.count(Preference::UrgentFirst), 9);
        assert_eq!(pool.target(Preference::UrgentFirst), 9);
        assert!(pool.workers.iter().all(|w| !w.standing_in));
    }

    #[test]
    fn a_busy_worker_stands_in_only_when_no_idle_one_can() {
        let mut pool = pool(1, 3);
        let busy = State::Busy {
            lane: LaneKind::Batch,
            submitted: 0,
        };
        for id in [1, 2] {
            pool.leave_idle(id);
            pool.workers[id].state = busy;
        }
        let moved = pool.surge(Preference::UrgentFirst, Preference::UrgentOnly, 2, true);
        // The idle shared worker is woken in its new role; the busy one finishes its job first.
        assert_eq!(moved.woken, vec![3]);
        assert!(pool.workers[3].standing_in);
        assert!(pool.workers[2].standing_in && pool.workers[2].state == busy);
        assert!(!pool.workers[1].standing_in);
    }

    #[test]
    fn the_replaced_workers_leave_only_once_every_new_worker_of_the_surge_is_ready() {
        let mut pool = pool(1, 9);
        let first = pool.surge(Preference::UrgentFirst, Preference::UrgentOnly, 2, false);
        // A second decision grows the reserve again while the first two start.
        let second = pool.surge(Preference::UrgentFirst, Preference::UrgentOnly, 1, false);
        for id in first.starting {
            pool.replace(id);
            pool.set_idle(id);
        }
        // As the operator's surge waits for the whole growing Deployment: nobody leaves yet (the
        // third new worker still starts).
        assert_eq!(pool.count(Preference::UrgentFirst), 9);
        assert_eq!(pool.count(Preference::UrgentOnly), 4);
        for id in second.starting {
            pool.replace(id);
            pool.set_idle(id);
        }
        assert_eq!(pool.count(Preference::UrgentFirst), 6);
        assert_eq!(pool.count(Preference::UrgentOnly), 4);
    }

    #[test]
    fn the_workers_that_leave_are_the_drains_pick_idle_before_busy() {
        let mut pool = pool(0, 4);
        let busy = State::Busy {
            lane: LaneKind::Batch,
            submitted: 0,
        };
        for id in [0, 1, 3] {
            pool.leave_idle(id);
            pool.workers[id].state = busy;
        }
        let moved = pool.surge(Preference::UrgentFirst, Preference::UrgentOnly, 1, false);
        for id in moved.starting {
            pool.replace(id);
        }
        // The idle worker goes at once; the busy ones keep their jobs.
        assert_eq!(pool.workers[2].state, State::Gone);
        assert!(pool.workers.iter().all(|w| !w.leaving));
    }
}
