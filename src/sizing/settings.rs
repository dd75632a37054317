//! A pool's sizing settings, read and checked from a LanePool spec: everything `decide` needs
//! to know about the pool that does not change between evaluations.

use std::time::Duration;

use crate::api::{
    LanePoolSpec, MOST_SLOTS_PER_WORKER, MetricsUnavailableAction, OnMetricsUnavailable, ScaleDown,
    SizingMode, check_headroom,
};
use crate::{Error, Result};

/// A pool's sizing settings, read and checked from a LanePool spec.
#[derive(Clone, Debug, PartialEq)]
pub struct PoolSizing {
    /// Reserve lanes in priority order.
    pub lanes: Vec<LaneSizing>,
    pub headroom: f64,
    pub size: PoolSize,
    /// Jobs one worker runs at once: reserves are sized in slots, then rounded up to workers.
    pub slots_per_worker: i32,
    pub stabilization_window: Duration,
    /// `spec.scaleDown.paused`: no reserve shrinks; growth goes on.
    pub scale_down_paused: bool,
    pub on_unavailable: UnavailablePolicy,
    /// Failed intervals in a row before `on_unavailable` acts; until then counts are held.
    pub failure_threshold: u32,
}

/// The bounds of one lane's reserve.
#[derive(Clone, Debug, PartialEq)]
pub struct LaneSizing {
    pub name: String,
    pub min: i32,
    pub max: i32,
    /// How the lane's measured load becomes its reserve.
    pub rule: Rule,
}

/// How the pool's size is set.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PoolSize {
    /// A fixed number of shared workers; reserved workers come on top.
    Shared { replicas: i32 },
    /// A fixed budget: shared = total − reserved, never below `shared_min`.
    Budget { total: i32, shared_min: i32 },
}

/// What to do for a lane whose metrics are unavailable.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum UnavailablePolicy {
    /// Keep the current count for at most `limit` from the outage's start, then fall back to
    /// `fallback` (each lane's min when `None`).
    Hold {
        limit: Duration,
        fallback: Option<i32>,
    },
    FixedReserve(i32),
}

impl Default for UnavailablePolicy {
    /// `spec.onMetricsUnavailable` when not set.
    fn default() -> Self {
        outage_policy(&OnMetricsUnavailable::default())
            .expect("the LanePool's own defaults are valid")
            .0
    }
}

/// How a measured load becomes a reserve.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Rule {
    /// The default: the smallest reserve that keeps up with the rate × headroom and whose
    /// predicted urgent wait p99 (M/D/c: Poisson arrivals, a fixed job time plus the hand-off,
    /// the shared workers' help when their lanes' job time is measured) is at most the lane's
    /// measured job time.
    Queueing,
    /// The guide's formula: ceil(arrival rate × job time × headroom).
    Formula,
    /// The smallest reserve whose predicted urgent p99 (submission to completion), served by
    /// the reserve alone, is at most this many seconds. Shared workers only make it better.
    LatencyTarget { p99_seconds: f64 },
}

impl PoolSizing {
    /// Settings for `lanes`, `headroom` and `size`, with everything else at the LanePool's own
    /// defaults: what a spec that sets nothing more gives.
    pub fn new(lanes: Vec<LaneSizing>, headroom: f64, size: PoolSize) -> Self {
        let (on_unavailable, failure_threshold) = outage_policy(&OnMetricsUnavailable::default())
            .expect("the LanePool's own defaults are valid");
        let scale_down = ScaleDown::default();
        Self {
            lanes,
            headroom,
            size,
            slots_per_worker: 1,
            stabilization_window: scale_down
                .stabilization_window
                .get()
                .expect("the LanePool's own defaults are valid"),
            scale_down_paused: scale_down.paused,
            on_unavailable,
            failure_threshold,
        }
    }

    /// Reads the sizing settings from a spec, checking what the CRD also checks, so a spec that
    /// reached us some other way (a test, an old CRD) cannot produce a harmful decision.
    pub fn from_spec(spec: &LanePoolSpec) -> Result<Self> {
        check_headroom(spec.headroom).map_err(|reason| Error::invalid("spec.headroom", reason))?;
        if !(1..=MOST_SLOTS_PER_WORKER).contains(&spec.slots_per_worker) {
            return Err(Error::invalid(
                "spec.slotsPerWorker",
                format!(
                    "{} must be from 1 to {MOST_SLOTS_PER_WORKER}",
                    spec.slots_per_worker
                ),
            ));
        }
        let mut lanes = Vec::new();
        let reserve_lanes = spec
            .lanes
            .iter()
            .enumerate()
            .filter_map(|(i, lane)| Some((i, lane, lane.reserve.as_ref()?)));
        for (i, lane, reserve) in reserve_lanes {
            let field = format!("spec.lanes[{i}].reserve");
            if reserve.min < 0 || reserve.min > reserve.max {
                return Err(Error::invalid(
                    field,
                    format!(
                        "min {} must be between 0 and max {}",
                        reserve.min, reserve.max
                    ),
                ));
            }
            let rule = match (reserve.sizing, &reserve.target_p99) {
                (SizingMode::Queueing, _) => Rule::Queueing,
                (SizingMode::Formula, _) => Rule::Formula,
                (SizingMode::LatencyTarget, Some(target)) => {
                    let target = target.get().map_err(|source| Error::Duration {
                        field: format!("{field}.targetP99"),
                        source,
                    })?;
                    if target.is_zero() {
                        return Err(Error::invalid(
                            format!("{field}.targetP99"),
                            "must be more than 0",
                        ));
                    }
                    Rule::LatencyTarget {
                        p99_seconds: target.as_secs_f64(),
                    }
                }
                (SizingMode::LatencyTarget, None) => {
                    return Err(Error::invalid(
                        format!("{field}.targetP99"),
                        "required with sizing LatencyTarget",
                    ));
                }
            };
            lanes.push(LaneSizing {
                name: lane.name.clone(),
                min: reserve.min,
                max: reserve.max,
                rule,
            });
        }
        if lanes.is_empty() {
            return Err(Error::invalid("spec.lanes", "no lane has a reserve"));
        }
        let shared_min = spec.shared.as_ref().map_or(1, |s| s.min_replicas);
        if shared_min < 1 {
            return Err(Error::invalid(
                "spec.shared.minReplicas",
                format!(
                    "{shared_min} must be at least 1: shared workers are the only ones that take lanes without a reserve"
                ),
            ));
        }
        let size = match (
            spec.total_workers,
            spec.shared.as_ref().and_then(|s| s.replicas),
        ) {
            (Some(total), None) => {
                // Below what the reserves ask the decision cuts them (decide::fit_to_total),
                // never below their minimums.
                let least_reserved: i32 = lanes.iter().map(|l| l.min).sum();
                if total < least_reserved + shared_min {
                    return Err(Error::invalid(
                        "spec.totalWorkers",
                        format!(
                            "{total} is less than the reserves' min ({least_reserved}) plus shared.minReplicas ({shared_min})"
                        ),
                    ));
                }
                PoolSize::Budget { total, shared_min }
            }
            (None, Some(replicas)) if replicas >= 1 => PoolSize::Shared { replicas },
            _ => {
                return Err(Error::invalid(
                    "spec.totalWorkers",
                    "set exactly one of spec.totalWorkers and spec.shared.replicas",
                ));
            }
        };
        let scale_down = spec.scale_down.clone().unwrap_or_default();
        let stabilization_window =
            scale_down
                .stabilization_window
                .get()
                .map_err(|source| Error::Duration {
                    field: "spec.scaleDown.stabilizationWindow".into(),
                    source,
                })?;
        let (on_unavailable, failure_threshold) =
            outage_policy(&spec.on_metrics_unavailable.clone().unwrap_or_default())?;
        Ok(Self {
            lanes,
            headroom: spec.headroom,
            size,
            slots_per_worker: spec.slots_per_worker,
            stabilization_window,
            scale_down_paused: scale_down.paused,
            on_unavailable,
            failure_threshold,
        })
    }
}

/// The outage policy and failure threshold `spec.onMetricsUnavailable` asks for.
fn outage_policy(policy: &OnMetricsUnavailable) -> Result<(UnavailablePolicy, u32)> {
    if policy.reserve.is_some_and(|n| n < 0) {
        return Err(Error::invalid(
            "spec.onMetricsUnavailable.reserve",
            "the reserve must be 0 or more",
        ));
    }
    let on_unavailable = match (policy.action, policy.reserve) {
        (MetricsUnavailableAction::Hold, fallback) => UnavailablePolicy::Hold {
            limit: policy.hold_limit.get().map_err(|source| Error::Duration {
                field: "spec.onMetricsUnavailable.holdLimit".into(),
                source,
            })?,
            fallback,
        },
        (MetricsUnavailableAction::FixedReserve, Some(n)) => UnavailablePolicy::FixedReserve(n),
        (MetricsUnavailableAction::FixedReserve, None) => {
            return Err(Error::invalid(
                "spec.onMetricsUnavailable.reserve",
                "a reserve of 0 or more is required with action FixedReserve",
            ));
        }
    };
    let failure_threshold = u32::try_from(policy.failure_threshold)
        .ok()
        .filter(|n| (1..=100).contains(n))
        .ok_or_else(|| {
            Error::invalid(
                "spec.onMetricsUnavailable.failureThreshold",
                "must be from 1 to 100",
            )
        })?;
    Ok((on_unavailable, failure_threshold))
}
