//! The decision: each reserve lane's load becomes a reserve by its rule, held against the
//! current one by a tolerance and, going down, by the stabilization window; the shared
//! workers get what the pool's size leaves.

use std::collections::BTreeMap;
use std::time::Duration;

use super::explain;
use super::queueing::{SharedHelp, formula, latency_target, wait_within_job_time};
use super::settings::{LaneSizing, PoolSize, PoolSizing, Rule, UnavailablePolicy};
use crate::duration::compact;

/// A reserve lane's measured load.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct LaneLoad {
    /// Jobs per second over the long window: what the reserve follows without a recent rate.
    pub arrival_rate: f64,
    /// The rate over a short recent window (the last worker read, or Prometheus's last scrape
    /// interval, 5 s at least: see [`recent_window`]), which the reserve follows both ways.
    /// `None` when not measured (a custom query, or too few samples yet).
    pub recent_arrival_rate: Option<RecentRate>,
    /// Mean job time in seconds; `None` only when the rate is zero and no job ran.
    pub job_seconds: Option<f64>,
}

/// An arrival rate counted over a short window, and that window (for its noise).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct RecentRate {
    pub per_second: f64,
    pub window: Duration,
}

impl RecentRate {
    /// How many arrivals the rate was counted from.
    fn counted(self) -> f64 {
        self.per_second * self.window.as_secs_f64()
    }
}

/// Replica counts of a pool's Deployments.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Replicas {
    /// Reserved workers per reserve lane.
    pub reserved: BTreeMap<String, i32>,
    pub shared: i32,
}

/// A reserve recommended at a moment, remembered for the scale-down stabilization window.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Recommendation {
    /// Time since an arbitrary origin chosen by the caller (process start, simulation start).
    pub at: Duration,
    pub reserve: i32,
}

/// Recent recommendations per lane.
pub type History = BTreeMap<String, Vec<Recommendation>>;

/// Each lane's load, or why it has none.
pub type Loads = BTreeMap<String, std::result::Result<LaneLoad, String>>;

/// What the decision sees at one evaluation.
#[derive(Clone, Copy, Debug)]
pub struct Inputs<'a> {
    /// Each reserve lane's load, or why it could not be measured.
    pub loads: &'a Loads,
    /// The replica counts now, or `None` when the Deployments do not exist yet.
    pub current: Option<&'a Replicas>,
    pub history: &'a History,
    pub now: Duration,
    /// The metrics outage this evaluation continues, if the last one had a lane unmeasured.
    pub outage: Outage,
    /// Mean time of the jobs shared workers run when no reserve lane waits (the lanes without
    /// a reserve), when measured: how often a shared worker frees up to help a reserve lane
    /// whose reserved workers are all busy. `None`: the reserves are sized as if alone.
    pub shared_job_seconds: Option<f64>,
}

/// A metrics outage as the caller remembers it between evaluations.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Outage {
    /// Evaluations in a row, before this one, with some lane unmeasured.
    pub failed_before: u32,
    /// When the outage began, on the clock of `Inputs::now`; `None` when unknown (the caller
    /// then counts from now).
    pub since: Option<Duration>,
}

/// The decision for one reserve lane.
#[derive(Clone, Debug, PartialEq)]
pub struct LaneDecision {
    pub name: String,
    pub load: Option<LaneLoad>,
    /// arrival rate × job time × headroom.
    pub needed: Option<f64>,
    /// ceil(needed) clamped to the lane's bounds, before stabilization.
    pub recommended: i32,
    /// The reserve to run.
    pub reserve: i32,
    /// Whether the load asks for more than reserve.max.
    pub capped: bool,
    /// The measurement behind the recommendation: "30/s × 20 ms × 1.5 = 0.9"; `None` when
    /// the lane could not be measured.
    pub arithmetic: Option<String>,
    /// The whole decision in words: "urgent 30/s × 20 ms × 1.5 = 0.9 → 1 → 1 reserved".
    pub explanation: String,
}

/// Replica counts and the reasons behind them.
#[derive(Clone, Debug, PartialEq)]
pub struct Decision {
    pub lanes: Vec<LaneDecision>,
    pub shared: i32,
    /// The recommendations to remember for the next evaluation.
    pub history: History,
    /// Why metrics are unavailable, lane by lane; empty when every lane was measured.
    pub unavailable: Vec<String>,
    /// Why a reserve could not be as large as the load asks; empty when no lane was capped.
    pub limited: Vec<String>,
    /// How the reserves were cut because `totalWorkers` leaves less than they ask after
    /// `shared.minReplicas`, lane by lane; empty when every reserve fits.
    pub below_total: Vec<String>,
    /// Evaluations in a row, this one included, with some lane unmeasured: 0 when all were.
    pub failed_intervals: u32,
    /// What the outage policy is doing, such as "failed interval 1 of 3: holding"; `None`
    /// when every lane was measured.
    pub outage: Option<String>,
}

impl Decision {
    pub fn replicas(&self) -> Replicas {
        Replicas {
            reserved: self
                .lanes
                .iter()
                .map(|lane| (lane.name.clone(), lane.reserve))
                .collect(),
            shared: self.shared,
        }
    }

    pub fn reserved_total(&self) -> i32 {
        self.lanes.iter().map(|lane| lane.reserve).sum()
    }

    /// The whole decision in one line, for status and logs.
    pub fn summary(&self) -> String {
        let mut parts: Vec<String> = self.lanes.iter().map(|l| l.explanation.clone()).collect();
        parts.push(format!("{} shared", self.shared));
        parts.join("; ")
    }
}

/// Decides the replica counts for one evaluation, recommending each reserve by its lane's rule.
pub fn decide(sizing: &PoolSizing, inputs: Inputs<'_>) -> Decision {
    let mut history = History::new();
    let mut unavailable = Vec::new();
    let mut limited = Vec::new();
    let mut lanes = Vec::with_capacity(sizing.lanes.len());

    let failing = sizing
        .lanes
        .iter()
        .any(|lane| !matches!(inputs.loads.get(&lane.name), Some(Ok(_))));
    let failed_intervals = if failing {
        inputs.outage.failed_before.saturating_add(1)
    } else {
        0
    };
    let stage = outage_stage(sizing, &inputs.outage, failed_intervals, inputs.now);
    for lane in &sizing.lanes {
        let current = inputs
            .current
            .and_then(|c| c.reserved.get(&lane.name).copied());
        let help = shared_help(sizing, &inputs, &lane.name);
        let decision = match inputs.loads.get(&lane.name) {
            Some(Ok(load)) => {
                let lane_measured = measured(
                    sizing,
                    lane,
                    load,
                    current,
                    help,
                    inputs.history,
                    inputs.now,
                );
                history.insert(lane.name.clone(), lane_measured.history);
                limited.extend(lane_measured.capped);
                lane_measured.decision
            }
            unmeasured => {
                let reason = match unmeasured {
                    Some(Err(reason)) => reason.clone(),
                    _ => format!("lane {}: not measured", lane.name),
                };
                let (past, decision) = unmeasured_lane(
                    sizing,
                    lane,
                    current,
                    inputs.history,
                    inputs.now,
                    (&stage, &reason),
                );
                if !past.is_empty() {
                    history.insert(lane.name.clone(), past);
                }
                unavailable.push(reason);
                decision
            }
        };
        lanes.push(decision);
    }

    let below_total = match sizing.size {
        PoolSize::Budget { total, shared_min } => {
            fit_to_total(sizing, &mut lanes, total, shared_min)
        }
        PoolSize::Shared { .. } => Vec::new(),
    };
    let reserved: i32 = lanes.iter().map(|l| l.reserve).sum();
    let shared = match sizing.size {
        PoolSize::Shared { replicas } => replicas,
        // The spec guarantees total ≥ Σ min + shared_min and the reserves were fitted to it.
        PoolSize::Budget { total, shared_min } => (total - reserved).max(shared_min),
    };
    Decision {
        lanes,
        shared,
        history,
        unavailable,
        limited,
        below_total,
        failed_intervals,
        outage: failing.then(|| stage.to_string()),
    }
}

/// Fits the reserves into `total − shared_min` when they ask for more: every lane keeps its
/// `reserve.min` (the spec guarantees room for all of them), and what is left goes to the lanes
/// in priority order, each up to what it asked. Returns, per cut lane, what it asked and got.
fn fit_to_total(
    sizing: &PoolSizing,
    lanes: &mut [LaneDecision],
    total: i32,
    shared_min: i32,
) -> Vec<String> {
    let for_reserves = total - shared_min;
    let asked: i32 = lanes.iter().map(|l| l.reserve).sum();
    if asked <= for_reserves {
        return Vec::new();
    }
    let floor = |name: &str| {
        sizing
            .lanes
            .iter()
            .find(|l| l.name == name)
            .map_or(0, |l| l.min)
    };
    let mut left = (for_reserves - lanes.iter().map(|l| floor(&l.name)).sum::<i32>()).max(0);
    let mut cut = Vec::new();
    for lane in lanes.iter_mut() {
        let min = floor(&lane.name).min(lane.reserve);
        let extra = (lane.reserve - min).clamp(0, left);
        left -= extra;
        let gets = min + extra;
        if gets < lane.reserve {
            let suffix = format!(" → {} reserved", lane.reserve);
            let fitted = format!(
                " → {}, cut to {gets} by totalWorkers {total} → {gets} reserved",
                lane.reserve
            );
            if let Some(head) = lane.explanation.strip_suffix(&suffix) {
                lane.explanation = format!("{head}{fitted}");
            }
            cut.push(format!(
                "lane {} asks {} reserved workers and gets {gets}: totalWorkers {total} leaves {for_reserves} for reserves after shared.minReplicas {shared_min}, lanes in priority order",
                lane.name, lane.reserve
            ));
            lane.reserve = gets;
        }
    }
    cut
}

/// The shared workers' help to lane `name` (see [`SharedHelp`]): the pool's workers less the
/// other lanes' current reserves, at the shared workers' measured job time. `None` when that
/// job time is not measured.
fn shared_help(sizing: &PoolSizing, inputs: &Inputs<'_>, name: &str) -> Option<SharedHelp> {
    let job_seconds = inputs
        .shared_job_seconds
        .filter(|s| s.is_finite() && *s > 0.0)?;
    let others: i32 = inputs.current.map_or(0, |current| {
        current
            .reserved
            .iter()
            .filter(|(lane, _)| lane.as_str() != name)
            .map(|(_, reserve)| *reserve)
            .sum()
    });
    let (unreserved, least) = match sizing.size {
        PoolSize::Budget { total, shared_min } => (total.saturating_sub(others), shared_min),
        // Shared replicas do not change with the reserve: always `least`.
        PoolSize::Shared { replicas } => (0, replicas),
    };
    // The reserve is searched in job slots, so the help counts slots too.
    let slots = sizing.slots_per_worker.max(1);
    Some(SharedHelp {
        job_seconds,
        unreserved: unreserved.saturating_mul(slots),
        least: least.saturating_mul(slots),
    })
}

/// Where an outage stands against the pool's policy.
#[derive(Clone, Copy, Debug, PartialEq)]
enum OutageStage {
    /// Fewer failed intervals than the threshold: counts are held whatever the action.
    Waiting { failed: u32, threshold: u32 },
    /// The action applies: for Hold (with its limit) until the limit.
    Acting { hold_limit: Option<Duration> },
    /// Hold has kept the counts for its whole limit: the fallback applies.
    HoldExpired { limit: Duration },
}

fn outage_stage(sizing: &PoolSizing, outage: &Outage, failed: u32, now: Duration) -> OutageStage {
    if failed < sizing.failure_threshold {
        return OutageStage::Waiting {
            failed,
            threshold: sizing.failure_threshold,
        };
    }
    let held = outage
        .since
        .map_or(Duration::ZERO, |since| now.saturating_sub(since));
    match sizing.on_unavailable {
        UnavailablePolicy::Hold { limit, .. } if held >= limit => {
            OutageStage::HoldExpired { limit }
        }
        UnavailablePolicy::Hold { limit, .. } => OutageStage::Acting {
            hold_limit: Some(limit),
        },
        UnavailablePolicy::FixedReserve(_) => OutageStage::Acting { hold_limit: None },
    }
}

impl std::fmt::Display for OutageStage {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Waiting { failed, threshold } => write!(
                f,
                "failed interval {failed} of {threshold} before onMetricsUnavailable acts: holding"
            ),
            // No moving numbers: the text is in the condition, and a change is an event.
            Self::Acting {
                hold_limit: Some(limit),
            } => write!(
                f,
                "holding for at most the holdLimit of {}",
                compact(*limit)
            ),
            Self::Acting { hold_limit: None } => {
                write!(f, "failureThreshold reached: fixed reserve")
            }
            Self::HoldExpired { limit } => write!(
                f,
                "held for the holdLimit of {}: falling back",
                compact(*limit)
            ),
        }
    }
}

/// A reserve changes only when the rate, moved back toward the current reserve by this share,
/// still asks for the change: a rate sitting on an integer boundary (10/s × 50 ms × 2 = 1.0,
/// read back as 1.0000001 or 0.9999999) never flaps between two reserves. The HPA's tolerance
/// is the same 10 %.
pub const TOLERANCE: f64 = 0.1;

/// How many standard deviations of a recent rate's Poisson count tell a moved load from noise:
/// the recent rate is followed only when it departs from the long one by more (see
/// `followed_recent`), and then its growth tolerance spans as many, when that is more than
/// [`TOLERANCE`]. On the steady-load grid (`simulate --suite --steady`), following every recent
/// rate left 5 of 285 cells above the promised wait (2 s jobs, up to 8,600 resizes a day); with
/// the departure test none (worst 0.84 × the job time).
pub const NOISE_SIGMAS: f64 = 2.0;

/// The shortest span a recent arrival rate from Prometheus counts over: one default
/// `spec.interval`, the jobs a worker read counts between two decisions. Prometheus's `irate`
/// spans one scrape interval; scraped every second, 10/s is a count of 10, and at 10/s × 53 ms
/// (11.5/s asks a third reserved worker) a pool measured by Prometheus alone resized 10 times an
/// hour at steady load in `simulate` (seeds 1–10: 0–16 times), 0–2 times when the rate counts
/// over 5 s. Scraped less often than this, the rate is `irate`'s, over one scrape interval.
pub const SHORTEST_RECENT_WINDOW: Duration = Duration::from_secs(5);

/// The span Prometheus's recent arrival rate counts over when it scrapes every
/// `scrape_interval`: one scrape interval, or, when that is shorter than
/// [`SHORTEST_RECENT_WINDOW`], the fewest whole scrape intervals that span it (1 s: 5 s; 2 s:
/// 6 s), so the samples a range query finds span what the rate is judged over. `None` without a
/// scrape interval: no recent rate.
pub fn recent_window(scrape_interval: Duration) -> Option<Duration> {
    if scrape_interval.is_zero() {
        return None;
    }
    if scrape_interval >= SHORTEST_RECENT_WINDOW {
        return Some(scrape_interval);
    }
    let scrapes = SHORTEST_RECENT_WINDOW
        .as_nanos()
        .div_ceil(scrape_interval.as_nanos());
    Some(scrape_interval * u32::try_from(scrapes).unwrap_or(u32::MAX))
}

/// The widest tolerance a noisy rate gets.
pub const MOST_TOLERANCE: f64 = 0.5;

/// Growth the long rate does not confirm waits for it: a reserve grows at most to what the long
/// rate × this share asks. A new reserved worker serves a read and a pod start (about 13 s) after
/// a spike starts and stays as long after it ends, so growing for a spike the long window has
/// barely seen takes batch throughput for a wait the spike is already over for. The long rate
/// rises with the spike's length × height: a surge is confirmed within seconds, a 20 s spike to
/// 5 × the rate only in part. With rates read from the workers, 2 gives the suite +5.6 % (worst
/// seed −0.2 %), 1.5 +5.3 % (−0.7 %), no cap +5.4 % (−0.6 %); with Prometheus's rates alone
/// (15 s old) 1.5 was best.
pub const CONFIRMING_SHARE: f64 = 2.0;

/// A lane's reserve for one arrival rate, by its rule: (needed, in job slots; its ceiling before
/// the bounds, in workers). Each rule sizes job slots (a worker of `slots_per_worker` slots is
/// that many servers of the queueing model), then rounds up to whole workers.
pub(super) fn reserve_for(
    sizing: &PoolSizing,
    lane: &LaneSizing,
    help: Option<SharedHelp>,
    arrival_rate: f64,
    job: f64,
) -> (f64, i32) {
    let slots = sizing.slots_per_worker.max(1);
    match lane.rule {
        Rule::Formula => {
            let (needed, ceiling) = formula(arrival_rate, job, sizing.headroom);
            let reserve = match ceiling {
                i32::MAX => i32::MAX,
                ceiling => workers_for(ceiling, slots),
            };
            (needed, reserve)
        }
        Rule::Queueing => {
            // An endless load asks for as much as can be asked, never for nothing.
            let needed = wait_within_job_time(arrival_rate, job, sizing.headroom, help);
            let reserve = needed.map_or(i32::MAX, |needed| workers_for(needed, slots));
            (f64::from(needed.unwrap_or(i32::MAX)), reserve)
        }
        Rule::LatencyTarget { p99_seconds } => {
            // Beyond max the target is out of reach; max + 1 makes that show as "capped".
            let most = lane.max.saturating_mul(slots);
            let needed = latency_target(arrival_rate, job, p99_seconds, most);
            let reserve = needed.map_or(lane.max.saturating_add(1), |needed| {
                workers_for(needed, slots)
            });
            (f64::from(needed.unwrap_or(most.saturating_add(1))), reserve)
        }
    }
}

/// The fewest workers of `slots` job slots each that hold `needed` slots.
fn workers_for(needed: i32, slots: i32) -> i32 {
    needed / slots + i32::from(needed % slots != 0)
}

/// The reserve growth is held to when the long rate does not confirm all of it (see
/// [`CONFIRMING_SHARE`]), never below the current reserve; `None` when nothing is held back:
/// no growth, no recent rate (the long rate already decides), or no current reserve.
fn unconfirmed_growth(
    sizing: &PoolSizing,
    lane: &LaneSizing,
    help: Option<SharedHelp>,
    load: &LaneLoad,
    current: Option<i32>,
    ceiling: i32,
) -> Option<i32> {
    let current = current.filter(|c| ceiling > *c)?;
    load.recent_arrival_rate?;
    let job = load.job_seconds.unwrap_or(0.0);
    let confirmed = reserve_for(
        sizing,
        lane,
        help,
        load.arrival_rate * CONFIRMING_SHARE,
        job,
    )
    .1
    .max(current);
    (confirmed < ceiling).then_some(confirmed)
}

/// For a process's first decision of a lane (a new leader's, after a restart or an upgrade):
/// the recent rate and the current reserve, when a growth the long rate asks for waits because
/// the recent rate is below the long one. A new leader knows nothing of the load's recent past:
/// for a minute after a spike its long window still holds the spike, which the previous leader
/// saw end, and a recent count within its noise of that long rate (so not followed) but below it
/// says the load fell back, not that it rose; growing then would shrink again a read later.
/// `None` when nothing grows, the recent rate is followed or absent, or it is not below (and
/// for every later decision, `current` being `None` then).
fn fallen_back(
    load: &LaneLoad,
    followed: Option<RecentRate>,
    current: Option<i32>,
    ceiling: i32,
) -> Option<(f64, i32)> {
    let current = current.filter(|c| ceiling > *c)?;
    if followed.is_some() {
        return None;
    }
    let recent = load.recent_arrival_rate?;
    (recent.per_second < load.arrival_rate).then_some((recent.per_second, current))
}

/// What one measured lane leaves behind: the recommendations to remember and the decision.
struct Measured {
    history: Vec<Recommendation>,
    decision: LaneDecision,
    capped: Option<String>,
}

fn measured(
    sizing: &PoolSizing,
    lane: &LaneSizing,
    load: &LaneLoad,
    current: Option<i32>,
    help: Option<SharedHelp>,
    history: &History,
    now: Duration,
) -> Measured {
    let job = load.job_seconds.unwrap_or(0.0);
    let followed = followed_recent(load);
    let rate = followed.map_or(load.arrival_rate, |r| r.per_second);
    let (needed, mut ceiling) = reserve_for(sizing, lane, help, rate, job);
    // Move only when the rate, moved back by the tolerance, still asks for the change. A recent
    // rate counted over few arrivals is noisier than 10 %: then growth needs two standard
    // deviations of its Poisson count (75 arrivals: 23 %). Shrinking keeps the 10 %: a reserve
    // grown for a spike comes back as soon as the spike's end shows in a read.
    let growing = current.is_none_or(|current| ceiling > current);
    let tolerance = match followed.map(RecentRate::counted) {
        Some(counted) if counted > 0.0 && growing => TOLERANCE
            .max(NOISE_SIGMAS / counted.sqrt())
            .min(MOST_TOLERANCE),
        _ => TOLERANCE,
    };
    let mut tolerated = None;
    if let Some(current) = current {
        let toward = if ceiling > current {
            reserve_for(sizing, lane, help, rate / (1.0 + tolerance), job)
                .1
                .max(current)
        } else {
            reserve_for(sizing, lane, help, rate * (1.0 + tolerance), job)
                .1
                .min(current)
        };
        if toward != ceiling {
            tolerated = Some(ceiling);
            ceiling = toward;
        }
    }
    let unconfirmed = unconfirmed_growth(sizing, lane, help, load, current, ceiling);
    let wanted = ceiling;
    if let Some(confirmed) = unconfirmed {
        ceiling = confirmed;
    }
    let explained_ceiling = ceiling;
    let first = history.get(&lane.name).is_none_or(Vec::is_empty);
    let fallen_back = fallen_back(load, followed, current.filter(|_| first), ceiling);
    if let Some((_, held)) = fallen_back {
        ceiling = held;
    }
    let recommended = ceiling.clamp(lane.min, lane.max);
    let capped = (ceiling > lane.max).then(|| {
        format!(
            "lane {} needs {ceiling} reserved workers but reserve.max is {}; shared workers absorb the rest",
            lane.name, lane.max
        )
    });

    let window = sizing.stabilization_window;
    let (past, highest) =
        hold_in_window(window, history.get(&lane.name), current, now, recommended);
    let mut reserve = highest.clamp(lane.min, lane.max);
    let paused_at = current.filter(|&c| sizing.scale_down_paused && c > reserve);
    if let Some(current) = paused_at {
        reserve = current;
    }

    let arithmetic =
        explain::arithmetic(sizing, lane, rate, followed.map(|r| r.window), job, needed);
    let explanation = explain::reserve(
        &lane.name,
        &arithmetic,
        &explain::Steps {
            tolerance,
            tolerated,
            wanted,
            unconfirmed_by: unconfirmed.map(|_| load.arrival_rate),
            ceiling: explained_ceiling,
            fallen_back,
            recommended,
            max: lane.max,
            paused: paused_at.is_some(),
            window,
            reserve,
        },
    );

    Measured {
        history: past,
        decision: LaneDecision {
            name: lane.name.clone(),
            load: Some(*load),
            needed: Some(needed),
            recommended,
            reserve,
            capped: capped.is_some(),
            arithmetic: Some(arithmetic),
            explanation,
        },
        capped,
    }
}

/// The scale-down window as a sliding maximum: the recommendations still inside `window`
/// that a later one has not matched or beaten (so at most one per reserve count, however long
/// the window), with `recommended` made `now` added, and the highest of them. After a restart
/// there are none: the current count stands in for them, so a restart never shortens the wait
/// before scaling down.
fn hold_in_window(
    window: Duration,
    past: Option<&Vec<Recommendation>>,
    current: Option<i32>,
    now: Duration,
    recommended: i32,
) -> (Vec<Recommendation>, i32) {
    let mut kept: Vec<Recommendation> = match past {
        Some(past) => past.clone(),
        None => current
            .filter(|_| !window.is_zero())
            .map(|reserve| vec![Recommendation { at: now, reserve }])
            .unwrap_or_default(),
    };
    kept.retain(|r| r.at <= now && now - r.at < window && r.reserve > recommended);
    kept.push(Recommendation {
        at: now,
        reserve: recommended,
    });
    let highest = kept.iter().map(|r| r.reserve).max().unwrap_or(recommended);
    (kept, highest)
}

/// A lane without a measurement. Until the failure threshold its count is held (a lane with
/// nothing to hold starts as the action says). Then `Hold` keeps its count up to the hold limit
/// and falls back after it; `FixedReserve` recommends the fixed count. A count that goes down
/// does so only through the scale-down window, like any other.
fn unmeasured_lane(
    sizing: &PoolSizing,
    lane: &LaneSizing,
    current: Option<i32>,
    history: &History,
    now: Duration,
    (stage, reason): (&OutageStage, &str),
) -> (Vec<Recommendation>, LaneDecision) {
    let past = history.get(&lane.name);
    let target = |count: i32, why: &str| {
        let fixed = count.clamp(lane.min, lane.max);
        let (kept, highest) =
            hold_in_window(sizing.stabilization_window, past, current, now, fixed);
        let held = if sizing.scale_down_paused {
            highest.max(current.unwrap_or(highest))
        } else {
            highest
        };
        let why = if held > fixed {
            format!("{why} {fixed}, held by the scale-down window")
        } else {
            format!("{why} {fixed}")
        };
        (kept, held, why)
    };
    let (kept, reserve, why) = match (sizing.on_unavailable, current, stage) {
        (_, Some(current), OutageStage::Waiting { .. })
        | (UnavailablePolicy::Hold { .. }, Some(current), OutageStage::Acting { .. }) => (
            past.cloned().unwrap_or_default(),
            current,
            format!("{stage}"),
        ),
        (
            UnavailablePolicy::Hold { .. },
            None,
            OutageStage::Waiting { .. } | OutageStage::Acting { .. },
        ) => (
            past.cloned().unwrap_or_default(),
            lane.min,
            "starting at min".to_string(),
        ),
        (UnavailablePolicy::Hold { fallback, .. }, _, OutageStage::HoldExpired { .. }) => {
            let (kept, reserve, why) = target(fallback.unwrap_or(lane.min), "fallback reserve");
            (kept, reserve, format!("{stage}: {why}"))
        }
        (UnavailablePolicy::FixedReserve(n), _, _) => target(n, "fixed reserve"),
    };
    let reserve = reserve.clamp(lane.min, lane.max);
    let decision = LaneDecision {
        name: lane.name.clone(),
        load: None,
        needed: None,
        recommended: reserve,
        reserve,
        capped: false,
        arithmetic: None,
        explanation: format!(
            "{}: metrics unavailable ({reason}); {why} → {reserve} reserved",
            lane.name
        ),
    };
    (kept, decision)
}

/// The recent rate when the load moved: when it departs from the long rate by more than
/// [`NOISE_SIGMAS`] standard deviations of its own Poisson count. The recent rate (the last read,
/// or the last scrape interval) sees a spike start or end up to a window sooner than the long
/// one; at a steady load it is only noisier (75 arrivals in a 5 s read: ±12 %), and following
/// it let one low read shrink a reserve that took a high one to grow back: a reserve one short
/// most of the time. `None`: the long rate decides.
fn followed_recent(load: &LaneLoad) -> Option<RecentRate> {
    let recent = load.recent_arrival_rate?;
    let expected = load.arrival_rate * recent.window.as_secs_f64();
    let departure = (recent.counted() - expected).abs();
    (departure > NOISE_SIGMAS * expected.max(1.0).sqrt()).then_some(recent)
}
