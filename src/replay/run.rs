//! The replay itself: a lane's measured history becomes a rate profile (the covered steps end to
//! end), and the simulator runs it with each policy — the pool's current settings, the
//! defaults, a few latency targets, every static split up to `reserve.max` — beside the
//! hindsight reference, on the same seed. Pure: no I/O, so tests call it with plain values.

use std::time::Duration;

use serde_json::{Value, json};

use super::error::ReplayError;
use super::history::History;
use crate::api::LanePoolSpec;
use crate::duration::trim;
use crate::simulate::engine::autoscale::LANE;
use crate::simulate::engine::outcome::Outcome;
use crate::simulate::studies::in_parallel;
use crate::simulate::studies::tradeoff::{Oracle, Point, frontier};
use crate::simulate::{
    Arrangement, ArrivalKind, Autoscale, QUEUE_HANDOFF, RateProfile, Scenario, nanos,
    run as simulate,
};
use crate::sizing::{PoolSize, PoolSizing};

/// Latency targets tried, as multiples of the lane's mean job time.
pub const TARGETS: [f64; 3] = [1.25, 2.0, 5.0];

/// The world the replayed operator lives in, from the flags.
#[derive(Clone, Debug)]
pub struct World {
    pub rate_window: Duration,
    pub job_time_window: Duration,
    pub scrape_interval: Duration,
    pub pod_start: Duration,
    /// Batch job time, uniform in [low, high] nanoseconds; `None`: the batch lanes' measured
    /// mean, ±50 %.
    pub batch_job: Option<(u64, u64)>,
    pub seed: u64,
}

/// What a row is, and so which LanePool fields it stands for.
#[derive(Clone, Debug, PartialEq)]
pub enum Policy {
    Current,
    Defaults,
    LatencyTarget { millis: u64 },
    Static { reserved: u32 },
    Hindsight { millis: u64 },
}

impl Policy {
    pub fn name(&self) -> String {
        match self {
            Self::Current => "current settings".into(),
            Self::Defaults => "defaults".into(),
            Self::LatencyTarget { millis } => format!("latency target {millis} ms"),
            Self::Static { reserved } => format!("static {reserved} reserved"),
            Self::Hindsight { millis } => format!("hindsight reference, p99 ≤ {millis} ms"),
        }
    }
}

/// One row of the table.
#[derive(Clone, Debug, PartialEq)]
pub struct Row {
    pub policy: Policy,
    pub urgent_submitted: u64,
    pub urgent_completed: u64,
    /// Of the completed urgent jobs, as `lanepool simulate` reports it.
    pub p99_ms: Option<f64>,
    pub batch_per_second: f64,
    pub reserve_changes_per_hour: f64,
    pub mean_reserve: f64,
    pub worker_seconds: f64,
    /// Batch throughput over the hindsight reference's at the same urgent p99.
    pub share_of_hindsight: Option<f64>,
}

impl Row {
    /// The share of urgent jobs that never finished inside the replay.
    pub fn unfinished(&self) -> f64 {
        if self.urgent_submitted == 0 {
            return 0.0;
        }
        1.0 - self.urgent_completed as f64 / self.urgent_submitted as f64
    }

    /// The urgent wait p99 (p99 less the job time) over the job time; infinite when more than
    /// 1 % of urgent jobs never finished (their p99 is unbounded).
    pub fn wait_over_job(&self, job_ms: f64) -> Option<f64> {
        if self.unfinished() > 0.01 {
            return Some(f64::INFINITY);
        }
        self.p99_ms.map(|p99| (p99 - job_ms).max(0.0) / job_ms)
    }

    /// The guide's test of a working pool: urgent wait p99 within the urgent job time.
    pub fn wait_within_job_time(&self, job_ms: f64) -> bool {
        self.wait_over_job(job_ms).is_some_and(|w| w <= 1.0)
    }
}

/// The replay's result.
pub struct Replay {
    pub base: Scenario,
    /// The static split's worker count is `workers_for(k)`.
    pub shared_replicas: Option<u32>,
    pub job_ms: f64,
    pub rows: Vec<Row>,
    pub recommendation: Recommendation,
    /// The current settings' run and the recommendation's, for the plot.
    pub current: Outcome,
    pub recommended: Option<Outcome>,
    pub simulated_in: Duration,
}

/// The policy to set, in the guide's words, and the LanePool fields that set it.
#[derive(Clone, Debug, PartialEq)]
pub struct Recommendation {
    pub policy: Option<Policy>,
    pub words: String,
    pub fields: Vec<String>,
}

/// The simulated pool for one lane of a spec: the lane's sizing alone, named as the simulator's
/// lane, in the workers the other reserve lanes leave (they keep their `reserve.min`).
fn lane_pool(spec: &LanePoolSpec, lane: &str) -> Result<PoolSizing, ReplayError> {
    let mut sizing = PoolSizing::from_spec(spec)?;
    if sizing.slots_per_worker != 1 {
        // The simulator's workers run one job each: a replay of several would judge another pool.
        return Err(crate::Error::invalid(
            "spec.slotsPerWorker",
            format!(
                "replay simulates workers of one job each; this pool's run {}",
                sizing.slots_per_worker
            ),
        )
        .into());
    }
    let others: i32 = sizing
        .lanes
        .iter()
        .filter(|l| l.name != lane)
        .map(|l| l.min)
        .sum();
    sizing.lanes.retain(|l| l.name == lane);
    for l in &mut sizing.lanes {
        l.name = LANE.to_string();
    }
    if let PoolSize::Budget { total, shared_min } = sizing.size {
        sizing.size = PoolSize::Budget {
            total: total - others,
            shared_min,
        };
    }
    Ok(sizing)
}

/// `spec` with `change` made to its JSON form: how the defaults and the latency targets are
/// written, so each is exactly the LanePool a user would apply.
fn changed(
    spec: &LanePoolSpec,
    change: impl FnOnce(&mut serde_json::Map<String, Value>),
) -> Result<LanePoolSpec, ReplayError> {
    let invalid = |e: serde_json::Error| crate::Error::invalid("spec", e.to_string());
    let mut value = serde_json::to_value(spec).map_err(invalid)?;
    if let Some(map) = value.as_object_mut() {
        change(map);
    }
    Ok(serde_json::from_value(value).map_err(invalid)?)
}

fn reserve_of(map: &mut serde_json::Map<String, Value>, lane: usize) -> Option<&mut Value> {
    map.get_mut("lanes")?.get_mut(lane)?.get_mut("reserve")
}

/// The defaults: the pool's lanes, bounds and size, with sizing, targetP99, headroom, interval
/// and scaleDown as a LanePool gets them when it sets none.
fn defaults(spec: &LanePoolSpec, lane: usize) -> Result<LanePoolSpec, ReplayError> {
    changed(spec, |map| {
        for field in ["headroom", "interval", "scaleDown"] {
            map.remove(field);
        }
        if let Some(Value::Object(reserve)) = reserve_of(map, lane) {
            reserve.remove("sizing");
            reserve.remove("targetP99");
        }
    })
}

fn latency_target(
    spec: &LanePoolSpec,
    lane: usize,
    millis: u64,
) -> Result<LanePoolSpec, ReplayError> {
    changed(spec, |map| {
        if let Some(Value::Object(reserve)) = reserve_of(map, lane) {
            reserve.insert("sizing".into(), json!("LatencyTarget"));
            reserve.insert("targetP99".into(), json!(format!("{millis}ms")));
        }
    })
}

/// The fields of `spec` the defaults row leaves unset.
fn set_beyond_defaults(spec: &LanePoolSpec, lane: usize) -> Vec<String> {
    let mut fields = Vec::new();
    if let Some(reserve) = spec.lanes.get(lane).and_then(|l| l.reserve.as_ref()) {
        if reserve.sizing != crate::api::SizingMode::default() {
            fields.push(format!("spec.lanes[{lane}].reserve.sizing"));
        }
        if reserve.target_p99.is_some() {
            fields.push(format!("spec.lanes[{lane}].reserve.targetP99"));
        }
    }
    if spec.headroom != crate::api::DEFAULT_HEADROOM {
        fields.push("spec.headroom".into());
    }
    if spec.interval.as_str() != crate::api::DEFAULT_INTERVAL {
        fields.push("spec.interval".into());
    }
    if spec
        .scale_down
        .as_ref()
        .is_some_and(|s| *s != crate::api::ScaleDown::default())
    {
        fields.push("spec.scaleDown".into());
    }
    fields
}

fn has_metrics_port(spec: &LanePoolSpec) -> bool {
    spec.template.spec.as_ref().is_some_and(|pod| {
        pod.containers.iter().any(|c| {
            c.ports
                .iter()
                .flatten()
                .any(|p| p.name.as_deref() == Some("metrics"))
        })
    })
}

fn autoscale(
    spec: &LanePoolSpec,
    lane: &str,
    world: &World,
    worker_reads: bool,
) -> Result<Autoscale, ReplayError> {
    let interval = spec
        .interval
        .get()
        .map_err(|source| crate::Error::Duration {
            field: "spec.interval".into(),
            source,
        })?;
    Ok(Autoscale {
        sizing: lane_pool(spec, lane)?,
        interval: nanos(interval),
        rate_window: nanos(world.rate_window),
        scrape_interval: nanos(world.scrape_interval),
        job_time_window: nanos(world.job_time_window),
        scrape_delay: nanos(world.scrape_interval),
        pod_start: nanos(world.pod_start),
        worker_reads,
        // Both ask the workers at their metrics port.
        stand_ins: worker_reads,
    })
}

/// The covered steps end to end: each step's measured rate for one step of simulated time.
pub fn profile(history: &History) -> RateProfile {
    let step = history.range.step as f64;
    let steps = history
        .covered()
        .into_iter()
        .flat_map(|(first, end)| first..end)
        .filter_map(|i| history.rates[i])
        .enumerate()
        .map(|(k, rate)| (k as f64 * step, rate))
        .collect();
    RateProfile { steps }
}

/// The profile as `lanepool simulate --urgent-profile` reads it.
pub fn profile_text(profile: &RateProfile) -> String {
    profile
        .steps
        .iter()
        .map(|(at, rate)| format!("{at}s={rate}"))
        .collect::<Vec<_>>()
        .join(",")
}

fn micros_nanos(seconds: f64) -> u64 {
    (seconds * 1e6).round().max(1.0) as u64 * 1000
}

/// The simulation every policy runs in: the profile, the pool's workers, Poisson arrivals, the
/// lane's mean job time (whole microseconds), batch work always waiting.
pub fn base_scenario(
    history: &History,
    spec: &LanePoolSpec,
    world: &World,
) -> Result<(Scenario, Option<u32>), ReplayError> {
    let profile = profile(history);
    if profile.steps.is_empty() {
        return Err(ReplayError::NoData(format!(
            "lane {}: no arrival rate in the window {}: the queries ({}) have no data there",
            history.lane,
            history.describe((0, history.rates.len())),
            history.queries.first().cloned().unwrap_or_default()
        )));
    }
    let job = history.mean_job_seconds().ok_or_else(|| {
        ReplayError::NoData(format!(
            "lane {}: no job time in the window and spec.lanes[{}].reserve.jobTime.fallback is not set",
            history.lane, history.lane_index
        ))
    })?;
    let batch_job = match (world.batch_job, history.batch_job_seconds) {
        (Some(range), _) => range,
        (None, Some(mean)) => (micros_nanos(mean * 0.5), micros_nanos(mean * 1.5)),
        (None, None) => {
            return Err(ReplayError::flag(
                "--batch-ms",
                "no batch lane's job time was measured in the window: give the batch job time",
            ));
        }
    };
    let sizing = lane_pool(spec, &history.lane)?;
    let (workers, shared_replicas) = match sizing.size {
        PoolSize::Budget { total, .. } => (total.max(1) as u32, None),
        PoolSize::Shared { replicas } => (replicas.max(1) as u32, Some(replicas.max(1) as u32)),
    };
    let duration = nanos(Duration::from_secs(
        profile.steps.len() as u64 * history.range.step,
    ));
    Ok((
        Scenario {
            arrangement: Arrangement::ReservedShared,
            workers,
            reserved: 0,
            urgent_job: micros_nanos(job),
            batch_job,
            backlog: u64::MAX,
            handoff: QUEUE_HANDOFF,
            duration,
            drain: 0,
            arrivals: ArrivalKind::Poisson,
            profile,
            seed: world.seed,
            autoscale: None,
            keda: None,
            window: 1_000_000_000,
        },
        shared_replicas,
    ))
}

/// The static split with `reserved` workers: in a budget, the budget; with fixed shared
/// workers, those plus the reserve.
pub fn static_split(base: &Scenario, shared_replicas: Option<u32>, reserved: u32) -> Scenario {
    let mut split = Oracle::split(base, reserved);
    if let Some(replicas) = shared_replicas {
        split.workers = replicas + reserved;
    }
    split
}

/// Replays `history` for the pool `spec` with every policy.
pub fn replay(
    history: &History,
    spec: &LanePoolSpec,
    world: &World,
) -> Result<Replay, ReplayError> {
    let started = std::time::Instant::now();
    let (base, shared_replicas) = base_scenario(history, spec, world)?;
    let lane = history.lane.clone();
    let lane_index = history.lane_index;
    let job_ms = base.urgent_job as f64 / 1e6;
    let worker_reads = has_metrics_port(spec);
    let sizing = lane_pool(spec, &lane)?;
    let most = sizing.lanes.first().map_or(1, |l| l.max.max(1)) as u32;
    let most = match sizing.size {
        PoolSize::Budget { total, shared_min } => most.min((total - shared_min).max(0) as u32),
        PoolSize::Shared { .. } => most,
    };
    let targets: Vec<u64> = TARGETS
        .iter()
        .map(|m| (job_ms * m).round().max(1.0) as u64)
        .collect();
    let mut runs: Vec<(Policy, Scenario)> = vec![
        (
            Policy::Current,
            Scenario {
                autoscale: Some(autoscale(spec, &lane, world, worker_reads)?),
                ..base.clone()
            },
        ),
        (
            Policy::Defaults,
            Scenario {
                autoscale: Some(autoscale(
                    &defaults(spec, lane_index)?,
                    &lane,
                    world,
                    worker_reads,
                )?),
                ..base.clone()
            },
        ),
    ];
    for millis in &targets {
        let spec = latency_target(spec, lane_index, *millis)?;
        runs.push((
            Policy::LatencyTarget { millis: *millis },
            Scenario {
                autoscale: Some(autoscale(&spec, &lane, world, worker_reads)?),
                ..base.clone()
            },
        ));
    }
    for reserved in 0..=most {
        runs.push((
            Policy::Static { reserved },
            static_split(&base, shared_replicas, reserved),
        ));
    }
    let outcomes = in_parallel(&runs, |(_, scenario)| simulate(scenario));
    // The static splits come last, from 0 reserved up: the oracle reads them in place.
    let first_static = runs
        .iter()
        .position(|(policy, _)| matches!(policy, Policy::Static { .. }))
        .unwrap_or(runs.len());
    let oracle = Oracle::from_runs(&base, &outcomes[first_static..]);
    let curve = oracle.curve_from(job_ms);
    let hours = base.duration as f64 / 3.6e12;
    let seconds = base.duration as f64 / 1e9;
    let worker_seconds = |mean_reserve: f64| match shared_replicas {
        Some(replicas) => (f64::from(replicas) + mean_reserve) * seconds,
        None => f64::from(base.workers) * seconds,
    };
    let share = |p99: Option<f64>, batch: f64| {
        p99.and_then(|p99| frontier(&curve, p99))
            .filter(|b| *b > 0.0)
            .map(|b| batch / b)
    };
    let mut rows: Vec<Row> = runs
        .iter()
        .zip(&outcomes)
        .map(|((policy, _), outcome)| {
            let summary = outcome.summary();
            let mean_reserve = outcome.mean_reserve(0, outcome.duration);
            Row {
                policy: policy.clone(),
                urgent_submitted: summary.urgent_submitted,
                urgent_completed: summary.urgent_completed,
                p99_ms: summary.p99_ms,
                batch_per_second: summary.batch_per_second,
                reserve_changes_per_hour: outcome.reserve_changes() as f64 / hours.max(1e-9),
                mean_reserve,
                worker_seconds: worker_seconds(mean_reserve),
                share_of_hindsight: share(summary.p99_ms, summary.batch_per_second),
            }
        })
        .collect();
    for millis in &targets {
        let point: Point = oracle.point(*millis as f64);
        let p99 = point.p99_ms.is_finite().then_some(point.p99_ms);
        rows.push(Row {
            policy: Policy::Hindsight { millis: *millis },
            urgent_submitted: base_submitted(&outcomes),
            urgent_completed: base_submitted(&outcomes),
            p99_ms: p99,
            batch_per_second: point.batch_per_second,
            reserve_changes_per_hour: f64::NAN,
            mean_reserve: point.mean_reserve,
            worker_seconds: worker_seconds(point.mean_reserve),
            share_of_hindsight: share(p99, point.batch_per_second),
        });
    }
    let recommendation = recommend(&rows, job_ms, spec, lane_index);
    let recommended = recommendation.policy.as_ref().and_then(|policy| {
        runs.iter()
            .position(|(p, _)| p == policy)
            .filter(|i| *i != 0)
            .map(|i| outcomes[i].clone())
    });
    Ok(Replay {
        base,
        shared_replicas,
        job_ms,
        rows,
        recommendation,
        current: outcomes[0].clone(),
        recommended,
        simulated_in: started.elapsed(),
    })
}

/// Every run draws the same arrivals (one seed); the hindsight reference takes its urgent jobs
/// from the static splits, phase by phase, so it has as many.
fn base_submitted(outcomes: &[Outcome]) -> u64 {
    outcomes.first().map_or(0, |o| o.urgent_submitted)
}

/// The policy a user can set with the most batch throughput among those that keep the urgent
/// wait p99 within the job time (the guide's test); the current settings when they are within
/// 1 % of it.
pub fn recommend(rows: &[Row], job_ms: f64, spec: &LanePoolSpec, lane: usize) -> Recommendation {
    let settable = |row: &&Row| {
        !matches!(
            row.policy,
            Policy::Hindsight { .. } | Policy::Static { reserved: 0 }
        )
    };
    let passing: Vec<&Row> = rows
        .iter()
        .filter(settable)
        .filter(|r| r.wait_within_job_time(job_ms))
        .collect();
    // The first of equals wins: the current settings, then the defaults, then the rest in order.
    let best = passing
        .iter()
        .copied()
        .fold(None::<&Row>, |best, row| match best {
            Some(b) if b.batch_per_second >= row.batch_per_second => Some(b),
            _ => Some(row),
        });
    let Some(best) = best else {
        return Recommendation {
            policy: None,
            words: format!(
                "Urgent wait rose above the job time ({} ms) under every policy: the reserve is too small for this load at this pool's size, and the pool needs more workers rather than a different split.",
                trim(job_ms)
            ),
            fields: vec![
                "raise spec.totalWorkers (or spec.shared.replicas), and the lane's reserve.max"
                    .into(),
            ],
        };
    };
    let current = rows.iter().find(|r| r.policy == Policy::Current);
    let keep = current.filter(|c| {
        c.wait_within_job_time(job_ms) && c.batch_per_second >= best.batch_per_second * 0.99
    });
    let wait = |row: &Row| {
        row.p99_ms
            .map_or("—".to_string(), |p| trim((p - job_ms).max(0.0)))
    };
    if let Some(current) = keep {
        return Recommendation {
            policy: Some(Policy::Current),
            words: format!(
                "Keep the current settings: urgent wait p99 {} ms is within the job time ({} ms), and no policy gets 1 % more batch throughput ({} jobs/s).",
                wait(current),
                trim(job_ms),
                trim(current.batch_per_second)
            ),
            fields: Vec::new(),
        };
    }
    let words = match current {
        Some(c) if c.wait_within_job_time(job_ms) => format!(
            "Use {}: urgent wait p99 {} ms stays within the job time ({} ms), with {} batch jobs/s, {:+.1} % over the current settings.",
            best.policy.name(),
            wait(best),
            trim(job_ms),
            trim(best.batch_per_second),
            (best.batch_per_second / c.batch_per_second.max(1e-9) - 1.0) * 100.0
        ),
        Some(c) => format!(
            "The current settings let urgent wait p99 rise above the job time ({} ms against {} ms): the reserve is too small for this load. Use {}: urgent wait p99 {} ms, within the job time, with the most batch throughput of the policies that keep it there, {} jobs/s (the current settings: {}).",
            wait(c),
            trim(job_ms),
            best.policy.name(),
            wait(best),
            trim(best.batch_per_second),
            trim(c.batch_per_second)
        ),
        None => format!(
            "Use {}: urgent wait p99 {} ms stays within the job time ({} ms) with the most batch throughput, {} jobs/s.",
            best.policy.name(),
            wait(best),
            trim(job_ms),
            trim(best.batch_per_second)
        ),
    };
    let reserve = format!("spec.lanes[{lane}].reserve");
    let fields = match &best.policy {
        Policy::Defaults => set_beyond_defaults(spec, lane)
            .into_iter()
            .map(|field| format!("remove {field} (the default applies)"))
            .collect(),
        Policy::LatencyTarget { millis } => vec![
            format!("set {reserve}.sizing: LatencyTarget"),
            format!("set {reserve}.targetP99: {millis}ms"),
        ],
        Policy::Static { reserved } => vec![
            format!("set {reserve}.min: {reserved}"),
            format!("set {reserve}.max: {reserved}"),
        ],
        Policy::Current | Policy::Hindsight { .. } => Vec::new(),
    };
    Recommendation {
        policy: Some(best.policy.clone()),
        words,
        fields,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(policy: Policy, p99_ms: f64, batch: f64) -> Row {
        Row {
            policy,
            urgent_submitted: 1000,
            urgent_completed: 1000,
            p99_ms: Some(p99_ms),
            batch_per_second: batch,
            reserve_changes_per_hour: 0.0,
            mean_reserve: 2.0,
            worker_seconds: 0.0,
            share_of_hindsight: None,
        }
    }

    fn formula_spec() -> LanePoolSpec {
        let pool: crate::api::LanePool =
            serde_yaml::from_str(include_str!("../../tests/fixtures/formula-pool.yaml")).unwrap();
        pool.spec
    }

    #[test]
    fn current_settings_whose_wait_exceeds_the_job_time_give_way_to_the_first_best_that_keeps_it() {
        let rows = [
            row(Policy::Current, 41.7, 42.4),
            row(Policy::Defaults, 31.3, 37.6),
            row(Policy::LatencyTarget { millis: 40 }, 31.3, 37.6),
            row(Policy::Static { reserved: 0 }, 25.0, 47.0),
            row(Policy::Hindsight { millis: 40 }, 30.0, 41.0),
        ];
        let r = recommend(&rows, 20.0, &formula_spec(), 0);
        assert_eq!(r.policy, Some(Policy::Defaults), "{r:?}");
        assert!(r.words.contains("the reserve is too small"), "{}", r.words);
        assert_eq!(
            r.fields,
            vec![
                "remove spec.lanes[0].reserve.sizing (the default applies)",
                "remove spec.headroom (the default applies)"
            ]
        );
    }

    #[test]
    fn a_pool_of_several_slots_a_worker_is_refused_naming_the_field() {
        let mut spec = formula_spec();
        spec.slots_per_worker = 4;
        let lane = spec.lanes[0].name.clone();
        let error = lane_pool(&spec, &lane).unwrap_err().to_string();
        assert!(error.contains("spec.slotsPerWorker"), "{error}");
        spec.slots_per_worker = 1;
        assert!(lane_pool(&spec, &lane).is_ok());
    }

    #[test]
    fn the_current_settings_are_kept_within_one_percent_and_no_passing_policy_asks_for_workers() {
        let rows = [
            row(Policy::Current, 30.0, 40.0),
            row(Policy::Static { reserved: 2 }, 30.0, 40.2),
        ];
        let r = recommend(&rows, 20.0, &formula_spec(), 0);
        assert_eq!(r.policy, Some(Policy::Current));
        assert!(r.fields.is_empty());
        let rows = [row(Policy::Current, 90.0, 40.0)];
        let r = recommend(&rows, 20.0, &formula_spec(), 0);
        assert_eq!(r.policy, None);
        assert!(r.words.contains("needs more workers"), "{}", r.words);
    }

    #[test]
    fn more_than_one_percent_of_urgent_jobs_unfinished_is_an_unbounded_wait() {
        let mut r = row(Policy::Static { reserved: 1 }, 25.0, 40.0);
        r.urgent_completed = 980;
        assert_eq!(r.wait_over_job(20.0), Some(f64::INFINITY));
        assert!(!r.wait_within_job_time(20.0));
    }
}
