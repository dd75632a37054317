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
    pub keda: Option<Arm>,
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

/// The pool's two Deployments.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Deployment {
    Reserved,
    Shared,
}

const SECOND: Nanos = 1_000_000_000;

// What a team runs without lanepool, as `keda.rs` models it: the ScaledObjects of one arm
// (plain data here; the HPA's and KEDA's behaviour, with its sources, is keda.rs).

/// `terminationGracePeriodSeconds` default: what a deleted busy worker gets to finish its job.
pub const GRACE: Nanos = 30 * SECOND;
/// `cooldownPeriod` default.
pub const COOLDOWN: Nanos = 300 * SECOND;

/// The lists a ScaledObject's triggers read.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Lists {
    Urgent,
    Batch,
    /// One trigger per list: the HPA takes the larger count.
    Both,
}

/// One ScaledObject and the Deployment it scales.
#[derive(Clone, Debug, PartialEq)]
pub struct ScaledObject {
    pub deployment: Deployment,
    /// The lanes its workers take (`rq worker urgent`, `rq worker urgent batch`, ...).
    pub role: Preference,
    pub lists: Lists,
    /// `listLength`: the jobs waiting per replica the HPA aims at.
    pub list_length: f64,
    /// `minReplicaCount` (0 scales to zero) and `maxReplicaCount`.
    pub min: u32,
    pub max: u32,
    /// `pollingInterval`.
    pub polling: Nanos,
    /// `cooldownPeriod`.
    pub cooldown: Nanos,
}

/// A whole arm: the ScaledObjects, how long a new Pod takes to take jobs, and the grace a
/// deleted busy worker gets.
#[derive(Clone, Debug, PartialEq)]
pub struct Arm {
    pub objects: Vec<ScaledObject>,
    pub pod_start: Nanos,
    pub grace: Nanos,
}

impl Arm {
    /// Two Deployments as most teams run them: urgent-only workers and batch-only workers, a
    /// ScaledObject each on its own list, `urgent_max` of the `workers` for the urgent one and
    /// the rest for the batch one, so the two never run more than `workers` together.
    pub fn two_lists(workers: u32, urgent_max: u32, knobs: Knobs, pod_start: Nanos) -> Self {
        let object = |deployment, role, lists, min, max| ScaledObject {
            deployment,
            role,
            lists,
            list_length: knobs.list_length,
            min,
            max,
            polling: knobs.polling,
            cooldown: COOLDOWN,
        };
        let urgent_max = urgent_max.clamp(1, workers.saturating_sub(1).max(1));
        Self {
            objects: vec![
                object(
                    Deployment::Reserved,
                    Preference::UrgentOnly,
                    Lists::Urgent,
                    knobs.min,
                    urgent_max,
                ),
                object(
                    Deployment::Shared,
                    Preference::BatchOnly,
                    Lists::Batch,
                    knobs.min,
                    workers.saturating_sub(urgent_max).max(1),
                ),
            ],
            pod_start,
            grace: GRACE,
        }
    }

    /// One Deployment in strict priority (each worker takes urgent first, batch otherwise),
    /// scaled on both lists up to `workers`.
    pub fn strict(workers: u32, knobs: Knobs, pod_start: Nanos) -> Self {
        Self {
            objects: vec![ScaledObject {
                deployment: Deployment::Shared,
                role: Preference::UrgentFirst,
                lists: Lists::Both,
                list_length: knobs.list_length,
                min: knobs.min,
                max: workers.max(1),
                polling: knobs.polling,
                cooldown: COOLDOWN,
            }],
            pod_start,
            grace: GRACE,
        }
    }
}

/// The settings a KEDA user tunes.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Knobs {
    pub list_length: f64,
    pub polling: Nanos,
    pub min: u32,
}

impl Knobs {
    /// KEDA's defaults, with one replica kept (`minReplicaCount: 1`).
    pub const DEFAULT: Self = Self {
        list_length: 5.0,
        polling: 30 * SECOND,
        min: 1,
    };

    pub fn name(&self) -> String {
        format!(
            "listLength {} poll {}s min {}",
            self.list_length,
            self.polling / SECOND,
            self.min
        )
    }
}
