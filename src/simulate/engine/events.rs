//! The discrete-event loop: urgent arrivals, job completions, workers starting up and the
//! operator's evaluations and reconciles, taken in time order (ties: workers, then the
//! operator, then arrivals). Workers never preempt; a worker takes the first non-empty lane it
//! prefers. The operator's rollout (`rollout.rs`) runs at each evaluation, whenever a new worker
//! is ready (the Deployment's watch event) and when a drain asks to come back.

use std::cmp::Reverse;
use std::collections::{BTreeMap, BinaryHeap};

use super::arrivals::Arrivals;
use super::autoscale::Control;
use super::autoscale::{BATCH_LANE, LANE};
use super::keda::{Keda, Lengths};
use super::observe::Counters;
use super::outcome::{Outcome, WindowCounts};
use super::pool::{Costs, Deployment, LaneKind, Lanes, Moved, Pool, State};
use super::rng::Pcg32;
use super::rollout::Operator;
use super::scenario::{Nanos, Preference, Scenario, seconds};

/// Runs a scenario to its end.
pub fn run(scenario: &Scenario) -> Outcome {
    Engine::new(scenario).run()
}

struct Engine<'a> {
    scenario: &'a Scenario,
    pool: Pool,
    lanes: Lanes,
    /// (when, order of scheduling, worker): a job ends or a start-up is over.
    events: BinaryHeap<Reverse<(Nanos, u64, usize)>>,
    scheduled: u64,
    batch_times: Pcg32,
    arrivals: Arrivals<'a>,
    next_arrival: Option<Nanos>,
    control: Option<Control>,
    next_evaluation: Option<Nanos>,
    /// The operator's rollout, with the control.
    operator: Option<Operator>,
    /// When a drain brings the operator back.
    next_reconcile: Option<Nanos>,
    /// KEDA and the HPA in the operator's place, and their next poll or sync.
    keda: Option<Keda>,
    next_keda: Option<Nanos>,
    /// Up to when the Pods' lifetimes are counted.
    paid_until: Nanos,
    observed: Counters,
    outcome: Outcome,
}

fn to_nanos(seconds: f64) -> Nanos {
    (seconds * 1e9).round() as Nanos
}

impl<'a> Engine<'a> {
    fn new(scenario: &'a Scenario) -> Self {
        let windows = scenario.duration.div_ceil(scenario.window.max(1)) as usize;
        let control = scenario.autoscale.clone().map(|config| {
            let (low, high) = scenario.batch_job;
            Control::start(
                config,
                scenario.profile.rate_at(0.0),
                seconds(scenario.urgent_job),
                (scenario.backlog > 0).then(|| seconds(low / 2 + high / 2)),
            )
        });
        let keda = scenario.keda.as_ref().map(|arm| {
            let lengths = Lengths {
                urgent: 0,
                batch: scenario.backlog,
            };
            Keda::start(arm, lengths)
        });
        // The opening Deployments: KEDA's replicas, the operator's first decision, or the split.
        let opening: Vec<(Deployment, Preference, usize)> = match (&keda, &control) {
            (Some(keda), _) => keda.replicas(),
            (None, Some(c)) => vec![
                (
                    Deployment::Reserved,
                    Preference::UrgentOnly,
                    c.reserve.max(0) as usize,
                ),
                (
                    Deployment::Shared,
                    scenario.arrangement.unreserved_role(),
                    c.shared.max(0) as usize,
                ),
            ],
            (None, None) => {
                let unreserved = if scenario.arrangement.reserves() {
                    scenario.workers.saturating_sub(scenario.reserved)
                } else {
                    scenario.workers
                };
                vec![
                    (
                        Deployment::Reserved,
                        Preference::UrgentOnly,
                        scenario.reserved as usize,
                    ),
                    (
                        Deployment::Shared,
                        scenario.arrangement.unreserved_role(),
                        unreserved as usize,
                    ),
                ]
            }
        };
        let reserved = opening
            .iter()
            .find(|(deployment, _, _)| *deployment == Deployment::Reserved)
            .map_or(0, |(_, _, count)| *count as u32);
        let next_evaluation = control.as_ref().map(|c| c.config.interval);
        let (low, high) = scenario.batch_job;
        let job_seconds = BTreeMap::from([
            (LANE.to_string(), seconds(scenario.urgent_job)),
            (BATCH_LANE.to_string(), seconds(low / 2 + high / 2)),
        ]);
        let operator = control.as_ref().map(|c| {
            Operator::new(
                (c.reserve.max(0), c.shared.max(0)),
                scenario.arrangement.unreserved_role(),
                c.config.stand_ins,
                job_seconds,
            )
        });
        let mut engine = Self {
            scenario,
            pool: Pool::default(),
            lanes: Lanes {
                batch: scenario.backlog,
                ..Lanes::default()
            },
            events: BinaryHeap::new(),
            scheduled: 0,
            batch_times: Pcg32::new(scenario.seed, 2),
            arrivals: Arrivals::new(
                &scenario.profile,
                scenario.arrivals,
                Pcg32::new(scenario.seed, 1),
            ),
            next_arrival: None,
            control,
            next_evaluation,
            operator,
            next_reconcile: None,
            next_keda: keda.as_ref().map(|k| k.next_tick(0)),
            keda,
            paid_until: 0,
            observed: Counters::default(),
            outcome: Outcome {
                duration: scenario.duration,
                window: scenario.window.max(1),
                windows: vec![WindowCounts::default(); windows.max(1)],
                reserve_steps: vec![(0, reserved)],
                autoscaled: scenario.autoscale.is_some(),
                ..Outcome::default()
            },
        };
        for (deployment, role, count) in opening {
            for _ in 0..count {
                let id = engine.pool.add(deployment, role, State::Starting);
                engine.take_work(id, 0);
            }
        }
        engine.next_arrival = engine.draw_arrival();
        engine
    }

    fn draw_arrival(&mut self) -> Option<Nanos> {
        self.arrivals
            .next_seconds()
            .map(to_nanos)
            .filter(|at| *at < self.scenario.duration)
    }

    fn window(&mut self, at: Nanos) -> &mut WindowCounts {
        let last = self.outcome.windows.len() - 1;
        let i = ((at / self.outcome.window) as usize).min(last);
        &mut self.outcome.windows[i]
    }

    fn schedule(&mut self, at: Nanos, worker: usize) {
        self.scheduled += 1;
        self.events.push(Reverse((at, self.scheduled, worker)));
    }

    fn run(mut self) -> Outcome {
        loop {
            let worker = self.events.peek().map(|Reverse((at, _, _))| *at);
            let evaluation = self
                .next_evaluation
                .filter(|at| *at < self.scenario.duration);
            let reconcile = self
                .next_reconcile
                .filter(|at| *at < self.scenario.duration);
            let arrival = self.next_arrival;
            let autoscaler = self.next_keda.filter(|at| *at < self.scenario.duration);
            let first = [worker, evaluation, reconcile, arrival, autoscaler]
                .into_iter()
                .flatten()
                .min();
            if let Some(at) = first {
                self.pay_until(at);
            }
            match first {
                Some(at)
                    if worker == Some(at) && at <= self.scenario.duration + self.scenario.drain =>
                {
                    if let Some(Reverse((at, _, id))) = self.events.pop() {
                        self.worker_event(id, at);
                    }
                }
                Some(at) if evaluation == Some(at) => self.evaluate(at),
                Some(at) if reconcile == Some(at) => self.reconcile(at),
                Some(at) if autoscaler == Some(at) => self.autoscale(at),
                Some(at) if arrival == Some(at) => self.arrive(at),
                _ => break,
            }
        }
        self.pay_until(self.scenario.duration);
        self.outcome
    }

    /// Counts the Pods here from the last event to `at` (within the run).
    fn pay_until(&mut self, at: Nanos) {
        let at = at.min(self.scenario.duration);
        if at > self.paid_until {
            self.outcome.worker_seconds += self.pool.live() as f64 * seconds(at - self.paid_until);
            self.paid_until = at;
        }
    }

    fn arrive(&mut self, at: Nanos) {
        self.outcome.urgent_submitted += 1;
        self.window(at).urgent_submitted += 1;
        self.observed.submitted(at);
        self.lanes.urgent.push_back(at);
        if let Some(id) = self.pool.wake_for_urgent() {
            self.take_work(id, at);
        }
        self.next_arrival = self.draw_arrival();
    }

    fn worker_event(&mut self, id: usize, at: Nanos) {
        let state = self.pool.workers[id].state;
        match state {
            State::Busy {
                lane,
                submitted,
                started,
            } => {
                if lane == LaneKind::Batch {
                    let end = self.scenario.duration;
                    self.outcome.batch_busy_seconds += seconds(at.min(end) - started.min(end));
                }
                let w = &self.pool.workers[id];
                if w.leaving && w.deadline.is_some_and(|deadline| deadline < at) {
                    // Killed at the end of its grace period, the job unfinished.
                    self.outcome.cut_short += 1;
                    self.pool.gone(id);
                    return;
                }
                if lane == LaneKind::Urgent {
                    self.pool.workers[id].unread_urgent += 1;
                }
                self.finish(lane, submitted, at);
                if self.pool.workers[id].leaving {
                    self.pool.gone(id);
                } else if self.scenario.handoff > 0 {
                    self.pool.workers[id].state = State::HandingOff;
                    self.schedule(at + self.scenario.handoff, id);
                } else {
                    self.take_work(id, at);
                }
            }
            State::HandingOff => self.take_work(id, at),
            State::Starting => {
                self.take_work(id, at);
                // The Deployment's readiness changed: the operator's watch wakes it.
                if self.operator.is_some() {
                    self.reconcile(at);
                }
            }
            // A departed worker's start-up that no longer matters.
            State::Idle | State::Gone => {}
        }
    }

    fn finish(&mut self, lane: LaneKind, submitted: Nanos, at: Nanos) {
        match lane {
            LaneKind::Urgent => {
                self.outcome.urgent_latencies.push(at - submitted);
                self.outcome.urgent_submissions.push(submitted);
                self.window(at).urgent_completed += 1;
                self.observed.finished(at, self.scenario.urgent_job);
            }
            LaneKind::Batch => {
                self.outcome.batch_completed += 1;
                self.window(at).batch_completed += 1;
            }
        }
    }

    fn take_work(&mut self, id: usize, at: Nanos) {
        if self.pool.draining(id, at) {
            return self.pool.set_idle(id);
        }
        let role = self.pool.workers[id].role;
        match self.lanes.take(role) {
            Some((lane, submitted)) => {
                let job = match lane {
                    LaneKind::Urgent => self.scenario.urgent_job,
                    LaneKind::Batch => {
                        let (low, high) = self.scenario.batch_job;
                        self.batch_times.between(low, high)
                    }
                };
                self.pool.workers[id].state = State::Busy {
                    lane,
                    submitted,
                    started: at,
                };
                self.schedule(at + job, id);
            }
            None => self.pool.set_idle(id),
        }
    }

    fn pod_start(&self) -> Nanos {
        match (&self.control, &self.scenario.keda) {
            (Some(c), _) => c.config.pod_start,
            (None, Some(arm)) => arm.pod_start,
            (None, None) => 0,
        }
    }

    /// KEDA's poll or the HPA's sync: each Deployment to its replicas, its ReplicaSet deleting
    /// the surplus in its own order (no deletion cost is written).
    fn autoscale(&mut self, at: Nanos) {
        let (Some(keda), Some(arm)) = (self.keda.as_mut(), self.scenario.keda.as_ref()) else {
            return;
        };
        let lengths = Lengths {
            urgent: self.lanes.urgent.len() as u64,
            batch: self.lanes.batch,
        };
        keda.tick(at, lengths);
        self.next_keda = Some(keda.next_tick(at));
        let mut moved = Moved::default();
        let none = BTreeMap::new();
        let costs = Costs { annotated: &none };
        for (deployment, role, count) in keda.replicas() {
            if deployment == Deployment::Reserved
                && self.outcome.reserve_steps.last().map(|(_, r)| *r as usize) != Some(count)
            {
                self.outcome.reserve_steps.push((at, count as u32));
            }
            let killed_at = at.saturating_add(arm.grace);
            self.pool
                .scale((deployment, role, count), &costs, killed_at, &mut moved);
        }
        let ready = at + arm.pod_start;
        for id in moved.starting {
            self.schedule(ready, id);
        }
    }

    fn evaluate(&mut self, at: Nanos) {
        let Some(control) = self.control.as_mut() else {
            return;
        };
        let before = control.reserve;
        let read = control
            .config
            .worker_reads
            .then(|| self.pool.read_urgent_finished());
        let reserve = control
            .evaluate(at, &self.observed, read, seconds(self.scenario.urgent_job))
            .max(0);
        let shared = control.shared.max(0);
        self.next_evaluation = Some(at + control.config.interval);
        if reserve != before {
            self.outcome.reserve_steps.push((at, reserve as u32));
        }
        if let Some(operator) = self.operator.as_mut() {
            operator.decide(reserve, shared);
        }
        self.reconcile(at);
    }

    /// One reconcile of the operator's rollout: the workers it starts start up, those it woke
    /// look for work.
    fn reconcile(&mut self, at: Nanos) {
        let Some(operator) = self.operator.as_mut() else {
            return;
        };
        let (moved, again) = operator.reconcile(&mut self.pool, at);
        self.next_reconcile = again;
        let taking = self.pool.taking();
        let fewest = self.outcome.fewest_taking.get_or_insert(taking);
        *fewest = (*fewest).min(taking);
        let ready = at + self.pod_start();
        for id in moved.starting {
            self.schedule(ready, id);
        }
        // A worker woken and then deleted in the same reconcile takes nothing.
        for id in moved.woken {
            if self.pool.workers[id].counted() {
                self.take_work(id, at);
            }
        }
    }
}
