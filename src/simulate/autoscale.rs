//! The operator's loop inside the simulation: every interval, read the observed arrival rate and
//! job time, call the operator's own `sizing::decide`, and hand the engine the reserve to run.
//! It never sees the true rate, only what Prometheus would answer.

use std::collections::BTreeMap;
use std::time::Duration;

use super::observe::Observed;
use super::scenario::{Autoscale, Nanos};
use crate::sizing::{Decision, History, Inputs, LaneLoad, Replicas, decide};

pub const LANE: &str = "urgent";

#[derive(Debug)]
pub struct Control {
    pub config: Autoscale,
    history: History,
    pub reserve: i32,
    pub shared: i32,
}

impl Control {
    /// Starts as if the operator had been running at the opening load: the first decision uses
    /// the true opening rate, so a run does not begin with a cold reserve.
    pub fn start(config: Autoscale, rate: f64, job_seconds: f64) -> Self {
        let mut control = Self {
            config,
            history: History::new(),
            reserve: 0,
            shared: 0,
        };
        let load = LaneLoad {
            arrival_rate: rate,
            job_seconds: Some(job_seconds),
        };
        let decision = control.decide(Ok(load), None, 0);
        control.apply(decision);
        control
    }

    /// One evaluation at `now`; returns the reserve to run from now on.
    pub fn evaluate(&mut self, now: Nanos, observed: &Observed, fallback_job: f64) -> i32 {
        let c = &self.config;
        let load = match observed.arrival_rate(now, c.rate_window, c.scrape_delay) {
            None => Err("no samples yet".to_string()),
            Some(rate) => Ok(LaneLoad {
                arrival_rate: rate,
                // The LanePool would set jobTime.fallback to the known job time.
                job_seconds: Some(
                    observed
                        .job_seconds(now, c.job_time_window, c.scrape_delay)
                        .unwrap_or(fallback_job),
                ),
            }),
        };
        let current = Replicas {
            reserved: BTreeMap::from([(LANE.to_string(), self.reserve)]),
            shared: self.shared,
        };
        let decision = self.decide(load, Some(&current), now);
        self.apply(decision);
        self.reserve
    }

    fn decide(
        &self,
        load: Result<LaneLoad, String>,
        current: Option<&Replicas>,
        now: Nanos,
    ) -> Decision {
        let loads = BTreeMap::from([(LANE.to_string(), load)]);
        decide(
            &self.config.sizing,
            Inputs {
                loads: &loads,
                current,
                history: &self.history,
                now: Duration::from_nanos(now),
            },
        )
    }

    fn apply(&mut self, decision: Decision) {
        self.reserve = decision.reserved_total();
        self.shared = decision.shared;
        self.history = decision.history;
    }
}
