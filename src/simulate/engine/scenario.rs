//! What to simulate: the pool's arrangement, its size, the jobs and the run's length, plus the
//! autoscaling knobs. Plain data, already checked; times are whole nanoseconds so that events
//! order exactly and runs repeat bit for bit.

use std::time::Duration;

use super::arrivals::ArrivalKind;
use super::profile::RateProfile;
use crate::sizing::PoolSizing;

pub type Nanos = u64;

pub const NANOS_PER_SECOND: f64 = 1e9;

/// A worker's hand-off between two jobs over HTTP, measured on the demo's lane queue and lane
/// workers as plain processes (release build, loopback, the 2-core machine with another build
/// running): from the worker's job ending to its next take reaching the queue, a mean of 0.3 ms
/// after batch jobs and 0.4 ms after urgent ones (`lane_queue --job-log`, its `round` lines).
/// A queue in another Pod adds a network round trip or two. The default sizing assumes the
/// same (`sizing::HANDOFF_SECONDS`).
pub const QUEUE_HANDOFF: Nanos = 400_000;

pub fn nanos(duration: Duration) -> Nanos {
    u64::try_from(duration.as_nanos()).unwrap_or(u64::MAX)
}

pub fn seconds(nanos: Nanos) -> f64 {
    nanos as f64 / NANOS_PER_SECOND
}

/// How workers are assigned to lanes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Arrangement {
    /// One queue in submission order.
    Fifo,
    /// Every worker takes urgent first, batch otherwise.
    Strict,
    /// `reserved` urgent-only workers; the rest batch-only.
    Dedicated,
    /// `reserved` urgent-only workers; the rest urgent first, batch otherwise.
    ReservedShared,
}

impl Arrangement {
    pub const ALL: [Arrangement; 4] = [
        Arrangement::Fifo,
        Arrangement::Strict,
        Arrangement::Dedicated,
        Arrangement::ReservedShared,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Self::Fifo => "fifo",
            Self::Strict => "strict",
            Self::Dedicated => "dedicated",
            Self::ReservedShared => "reserved-shared",
        }
    }

    /// The role of the workers that are not reserved.
    pub fn unreserved_role(self) -> Preference {
        match self {
            // The whole backlog is queued at 0 s, ahead of every urgent job, so one FIFO queue
            // serves exactly as "batch first, then urgent".
            Self::Fifo => Preference::BatchFirst,
            Self::Strict | Self::ReservedShared => Preference::UrgentFirst,
            Self::Dedicated => Preference::BatchOnly,
        }
    }

    /// Whether the arrangement has reserved workers at all.
    pub fn reserves(self) -> bool {
        matches!(self, Self::Dedicated | Self::ReservedShared)
    }
}

/// A worker's lane preference.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Preference {
    UrgentOnly,
    BatchOnly,
    UrgentFirst,
    BatchFirst,
}

impl Preference {
    pub const COUNT: usize = 4;

    pub fn index(self) -> usize {
        self as usize
    }

    pub fn takes_urgent(self) -> bool {
        self != Self::BatchOnly
    }
}

/// A complete simulation input.
#[derive(Clone, Debug)]
pub struct Scenario {
    pub arrangement: Arrangement,
    pub workers: u32,
    /// Reserved workers at the start (the whole run for a static split).
    pub reserved: u32,
    pub urgent_job: Nanos,
    /// Batch job times, uniform in [low, high].
    pub batch_job: (Nanos, Nanos),
    pub backlog: u64,
    /// From a worker finishing a job to its next take reaching the queue (reporting the job
    /// done, then asking again), during which it takes nothing. 0 for the guide's in-process
    /// pool; [`QUEUE_HANDOFF`] for workers that talk to a queue over the network.
    pub handoff: Nanos,
    pub duration: Nanos,
    /// After the last submission, how long completions still count (throughput stays per
    /// second of `duration`). 0 except to match runs that were measured a little late.
    pub drain: Nanos,
    pub arrivals: ArrivalKind,
    pub profile: RateProfile,
    pub seed: u64,
    pub autoscale: Option<Autoscale>,
    /// KEDA and the HPA sizing the Deployments instead of lanepool (`autoscale` is then unset).
    pub keda: Option<super::keda::Arm>,
    /// Width of each time-series window.
    pub window: Nanos,
}

/// The operator's loop as the simulation runs it.
#[derive(Clone, Debug)]
pub struct Autoscale {
    /// The same settings the operator reads from a LanePool, one reserve lane named `urgent`.
    pub sizing: PoolSizing,
    pub interval: Nanos,
    /// The trailing window of the arrival-rate query (`rate(...[1m])`).
    pub rate_window: Nanos,
    /// How often Prometheus scrapes: the recent arrival rate spans one scrape interval, 5 s at
    /// least (`sizing::recent_window`). 0: no recent rate.
    pub scrape_interval: Nanos,
    /// The trailing window of the job-time query.
    pub job_time_window: Nanos,
    /// How old the newest sample Prometheus has is.
    pub scrape_delay: Nanos,
    /// From a worker's new role being decided to it taking work.
    pub pod_start: Nanos,
    /// Whether the operator reads the workers' own finished-job counts at each evaluation (the
    /// rates then come from those, seconds old; Prometheus's only until they cover a window).
    /// A worker that leaves between two reads takes what it finished since the first with it.
    pub worker_reads: bool,
    /// Whether, while a growing reserve's new workers start, the shared workers they replace
    /// stand in for them, taking only the urgent lane until they are ready (the operator's
    /// `POST /stand-in` to workers that serve a `metrics` port). Otherwise, and always when the
    /// reserve shrinks, the replaced workers keep their old role until then.
    pub stand_ins: bool,
}

impl Scenario {
    /// The guide's set-up: 10 workers, 2 reserved, 20 ms urgent, 100–300 ms batch, 2,000
    /// backlog, 8 s, even arrivals.
    pub fn guide(arrangement: Arrangement, urgent_rate: f64) -> Self {
        Self {
            arrangement,
            workers: 10,
            reserved: if arrangement.reserves() { 2 } else { 0 },
            urgent_job: 20_000_000,
            batch_job: (100_000_000, 300_000_000),
            backlog: 2_000,
            handoff: 0,
            duration: 8_000_000_000,
            drain: 0,
            arrivals: ArrivalKind::Even,
            profile: RateProfile::constant(urgent_rate),
            seed: 1,
            autoscale: None,
            keda: None,
            window: 1_000_000_000,
        }
    }
}
