//! The operator's loop inside the simulation: every interval, read the observed arrival rate and
//! job time, call the operator's own `sizing::decide`, and hand the engine the reserve to run.
//! It never sees the true rate, only what Prometheus would answer.

use std::collections::BTreeMap;
use std::time::Duration;

use super::observe::Counters;
use super::scenario::{Autoscale, Nanos};
use crate::sizing::{
    Decision, History, Inputs, LaneLoad, LaneReads, Outage, ReadCounts, RecentRate, Replicas,
    decide, recent_window,
};

pub const LANE: &str = "urgent";
/// The batch lane, which only shared workers serve.
pub const BATCH_LANE: &str = "batch";

#[derive(Debug)]
pub struct Control {
    pub config: Autoscale,
    history: History,
    /// The workers' finished-job counts read so far, and when the last read was.
    reads: LaneReads,
    last_read: Option<Nanos>,
    pub reserve: i32,
    pub shared: i32,
    /// The mean batch job time, which the operator measures as the lanes' only shared workers
    /// serve: how often a shared worker frees up to help the urgent lane.
    shared_job_seconds: Option<f64>,
}

impl Control {
    /// Starts as if the operator had been running at the opening load: the first decision uses
    /// the true opening rate, so a run does not begin with a cold reserve.
    pub fn start(
        config: Autoscale,
        rate: f64,
        job_seconds: f64,
        shared_job_seconds: Option<f64>,
    ) -> Self {
        let mut control = Self {
            config,
            history: History::new(),
            reads: LaneReads::default(),
            last_read: None,
            reserve: 0,
            shared: 0,
            shared_job_seconds,
        };
        let load = LaneLoad {
            arrival_rate: rate,
            recent_arrival_rate: None,
            job_seconds: Some(job_seconds),
        };
        let decision = control.decide(Ok(load), None, 0);
        control.apply(decision);
        control
    }

    /// One evaluation at `now`, with the urgent jobs the workers finished since the last read
    /// when the operator reads them (`Some(None)`: a read that could not count every worker,
    /// which sets the next read's start and is no rate); returns the reserve to run from now on.
    pub fn evaluate(
        &mut self,
        now: Nanos,
        observed: &Counters,
        read: Option<Option<u64>>,
        fallback_job: f64,
    ) -> i32 {
        if let Some(read) = read {
            if let (Some(since), Some(finished)) = (self.last_read, read) {
                self.reads.record(
                    Duration::from_nanos(since),
                    Duration::from_nanos(now),
                    ReadCounts::finished(finished as f64),
                    Duration::from_nanos(self.config.rate_window),
                );
            }
            self.last_read = Some(now);
        }
        let c = &self.config;
        let load = match observed.arrival_rate(now, c.rate_window, c.scrape_delay) {
            None => Err("no samples yet".to_string()),
            Some(rate) => Ok(LaneLoad {
                arrival_rate: rate,
                recent_arrival_rate: recent_window(Duration::from_nanos(c.scrape_interval))
                    .and_then(|window| {
                        let span = u64::try_from(window.as_nanos()).unwrap_or(u64::MAX);
                        observed
                            .arrival_rate(now, span, c.scrape_delay)
                            .map(|per_second| RecentRate { per_second, window })
                    }),
                // The LanePool would set jobTime.fallback to the known job time.
                job_seconds: Some(
                    observed
                        .job_seconds(now, c.job_time_window, c.scrape_delay)
                        .unwrap_or(fallback_job),
                ),
            }),
        };
        // A read that is no rate lets the last one stand in for a scrape interval, as the
        // operator's does.
        let load = load.map(|load| {
            self.reads.applied_to(
                load,
                Duration::from_nanos(now),
                Duration::from_nanos(c.rate_window),
                Duration::from_nanos(c.scrape_interval),
            )
        });
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
                outage: Outage::default(),
                shared_job_seconds: self.shared_job_seconds,
            },
        )
    }

    fn apply(&mut self, decision: Decision) {
        self.reserve = decision.reserved_total();
        self.shared = decision.shared;
        self.history = decision.history;
    }
}

/// The operator's loop with the defaults a LanePool gets when the user sets nothing: a budget of
/// `workers` (`totalWorkers`), one reserve lane with `max` = workers − 1, the operator's default
/// query windows, and the simulator's model of the world (a 15 s scrape interval, samples 15 s
/// old, 10 s pod start).
pub fn lanepool_defaults(workers: u32) -> Autoscale {
    let spec: crate::api::LanePoolSpec = serde_json::from_value(serde_json::json!({
        "lanes": [{"name": LANE, "reserve": {"max": workers.saturating_sub(1).max(1)}}, {"name": BATCH_LANE}],
        "totalWorkers": workers,
        "template": {},
    }))
    .expect("a LanePool spec with only the required fields");
    let sizing = crate::sizing::PoolSizing::from_spec(&spec)
        .expect("the defaults of a LanePool are valid for 2 workers or more");
    let nanos = |d: &str| super::scenario::nanos(crate::duration::parse(d).unwrap_or_default());
    Autoscale {
        sizing,
        interval: super::scenario::nanos(spec.interval.get().unwrap_or_default()),
        rate_window: nanos(crate::prometheus::DEFAULT_RATE_WINDOW),
        scrape_interval: SCRAPE_INTERVAL,
        job_time_window: nanos(crate::prometheus::DEFAULT_JOB_TIME_WINDOW),
        scrape_delay: 15_000_000_000,
        pod_start: POD_START,
        worker_reads: true,
        stand_ins: true,
    }
}

/// From a role change (or a new pod) decided to the worker taking jobs, in the simulator's world
/// unless told otherwise (`--pod-start`).
pub const POD_START: Nanos = 10_000_000_000;

/// Prometheus's usual scrape interval: the recent arrival rate spans one.
pub const SCRAPE_INTERVAL: Nanos = 15_000_000_000;
