//! What the operator writes back on a LanePool: status fields, conditions that keep their
//! transition time while unchanged, and event notes in the guide's words. Pure.

use std::time::Duration;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use k8s_openapi::jiff::Timestamp;

use crate::api::{LanePool, LanePoolStatus, LaneStatus, POOL_LABEL};
use crate::duration::{human_seconds, trim};
use crate::sizing::{Decision, LaneDecision, NOISE_SIGMAS};

pub const READY: &str = "Ready";
pub const METRICS_AVAILABLE: &str = "MetricsAvailable";
pub const SCALING_LIMITED: &str = "ScalingLimited";
/// `ScalingLimited`'s reason, and the event's, when totalWorkers is below what the reserves ask
/// plus shared.minReplicas and the reserves were cut.
pub const BELOW_RESERVES: &str = "TotalBelowReserves";
pub const PAUSED: &str = "Paused";
/// Whether only the operator can steer the pool's workers (see [`credential_condition`]).
pub const WORKER_CREDENTIAL: &str = "WorkerCredential";
/// The Warning event when `Ready` turns False because workers cannot start.
pub const WORKERS_CANNOT_START: &str = "WorkersCannotStart";

/// A condition before timestamps: type, status, reason, message.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ConditionState {
    pub type_: &'static str,
    pub status: bool,
    pub reason: String,
    pub message: String,
}

impl ConditionState {
    pub fn new(
        type_: &'static str,
        status: bool,
        reason: &str,
        message: impl Into<String>,
    ) -> Self {
        Self {
            type_,
            status,
            reason: reason.into(),
            message: message.into(),
        }
    }
}

/// `observed` as conditions, keeping each one's transition time when its status did not change
/// and keeping conditions of other types as they were.
pub fn merge_conditions(
    old: &[Condition],
    observed: &[ConditionState],
    generation: Option<i64>,
    now: Timestamp,
) -> Vec<Condition> {
    let mut conditions: Vec<Condition> = old
        .iter()
        .filter(|c| !observed.iter().any(|o| o.type_ == c.type_))
        .cloned()
        .collect();
    for o in observed {
        let status = if o.status { "True" } else { "False" };
        let since = old
            .iter()
            .find(|c| c.type_ == o.type_ && c.status == status)
            .map_or(Time(now), |c| c.last_transition_time.clone());
        conditions.push(Condition {
            type_: o.type_.into(),
            status: status.into(),
            reason: o.reason.clone(),
            message: o.message.clone(),
            observed_generation: generation,
            last_transition_time: since,
        });
    }
    let order = [READY, METRICS_AVAILABLE, SCALING_LIMITED, PAUSED];
    conditions.sort_by_key(|c| {
        order
            .iter()
            .position(|t| *t == c.type_)
            .unwrap_or(order.len())
    });
    conditions
}

/// The conditions a decision implies.
pub fn decision_conditions(decision: &Decision, hpa: Option<String>) -> Vec<ConditionState> {
    let metrics = if decision.unavailable.is_empty() {
        ConditionState::new(
            METRICS_AVAILABLE,
            true,
            "Measured",
            "every reserve lane was measured",
        )
    } else {
        let mut message = decision.unavailable.join("; ");
        if let Some(outage) = &decision.outage {
            message.push_str(&format!("; {outage}"));
        }
        ConditionState::new(METRICS_AVAILABLE, false, "QueryFailed", message)
    };
    let mut limits = decision.below_total.clone();
    limits.extend(decision.limited.iter().cloned());
    limits.extend(hpa.clone());
    let limited = if limits.is_empty() {
        ConditionState::new(
            SCALING_LIMITED,
            false,
            "WithinBounds",
            "every reserve is within its bounds",
        )
    } else {
        let reason = if hpa.is_some() {
            "HorizontalPodAutoscaler"
        } else if !decision.below_total.is_empty() {
            BELOW_RESERVES
        } else {
            "AtMax"
        };
        ConditionState::new(SCALING_LIMITED, true, reason, limits.join("; "))
    };
    vec![
        ConditionState::new(
            READY,
            true,
            "Applied",
            "the reserved and shared Deployments are applied",
        ),
        metrics,
        limited,
        ConditionState::new(PAUSED, false, "Running", "the operator manages this pool"),
    ]
}

/// Whether only the operator can steer the pool's workers: False with `NoCredential` when the
/// pool has no credential to send (`problem`), or with `NotChecked` naming the workers that last
/// answered `/metrics` without saying they check it (an image that predates the credential: they
/// are still drained, so no job is cut short, but anyone who reaches them may steer them too).
/// `None` while no worker has answered and nothing went wrong: there is nothing to say yet.
pub fn credential_condition(
    problem: Option<&str>,
    unchecked: Option<&[String]>,
) -> Option<ConditionState> {
    if let Some(problem) = problem {
        return Some(ConditionState::new(
            WORKER_CREDENTIAL,
            false,
            "NoCredential",
            format!("{problem}; shrinks that drain workers wait"),
        ));
    }
    let unchecked = unchecked?;
    if unchecked.is_empty() {
        return Some(ConditionState::new(
            WORKER_CREDENTIAL,
            true,
            "Checked",
            "every worker that answered takes drain and stand-in requests only with the pool's \
             credential",
        ));
    }
    const NAMED: usize = 3;
    let mut names = unchecked[..unchecked.len().min(NAMED)].join(", ");
    if unchecked.len() > NAMED {
        names.push_str(&format!(" and {} more", unchecked.len() - NAMED));
    }
    Some(ConditionState::new(
        WORKER_CREDENTIAL,
        false,
        "NotChecked",
        format!(
            "{names}: their image does not check the pool's credential \
             (no lanepool_worker_credential_required 1), so any Pod that reaches them may drain \
             or re-point them; they are still drained before a shrink; update the image"
        ),
    ))
}

/// `Ready` turned False when some of the pool's `workers` cannot start (`stuck`: each one's
/// Pod, the reason its container waits for and the kubelet's message): the reason of the first
/// as the condition's, and which Pods and why, at most three, as its message.
pub fn workers_cannot_start(
    conditions: &mut [ConditionState],
    stuck: &[(String, &'static str, String)],
    workers: usize,
) {
    let Some((_, reason, _)) = stuck.first() else {
        return;
    };
    let Some(ready) = conditions.iter_mut().find(|c| c.type_ == READY) else {
        return;
    };
    let shown: Vec<String> = stuck
        .iter()
        .take(3)
        .map(|(pod, reason, message)| match message.is_empty() {
            true => format!("{pod}: {reason}"),
            false => format!("{pod}: {reason}: {message}"),
        })
        .collect();
    let more = match stuck.len() {
        0..=3 => String::new(),
        n => format!(" (and {} more)", n - 3),
    };
    *ready = ConditionState::new(
        READY,
        false,
        reason,
        format!(
            "{} of {workers} workers cannot start: {}{more}",
            stuck.len(),
            shown.join("; ")
        ),
    );
}

/// The status fields a decision for `pool` implies (conditions are merged separately).
pub fn decision_status(decision: &Decision, pool: &LanePool) -> LanePoolStatus {
    let reserves: Vec<String> = decision
        .lanes
        .iter()
        .map(|lane| format!("{} {}", lane.name, lane.reserve))
        .collect();
    let scale_down_paused = pool.spec.scale_down.as_ref().is_some_and(|s| s.paused);
    LanePoolStatus {
        observed_generation: pool.metadata.generation,
        reserved: decision.reserved_total(),
        shared: decision.shared,
        replicas: decision.reserved_total() + decision.shared,
        selector: Some(format!(
            "{POOL_LABEL}={}",
            pool.metadata.name.as_deref().unwrap_or_default()
        )),
        reserves: Some(reserves.join(", ")),
        rollout: None,
        scale_down: scale_down_paused.then(|| "Paused".to_string()),
        lanes: decision.lanes.iter().map(lane_status).collect(),
        conditions: Vec::new(),
        last_decision: Some(decision.summary()),
    }
}

fn lane_status(lane: &LaneDecision) -> LaneStatus {
    // Three significant figures: enough to read, and the status does not churn on noise.
    let round = |v: f64| trim(v).parse::<f64>().unwrap_or(v);
    let load = lane.load.as_ref();
    LaneStatus {
        name: lane.name.clone(),
        arrival_rate: load.map(|l| format!("{}/s", trim(l.arrival_rate))),
        arrival_rate_per_second: load.map(|l| round(l.arrival_rate)),
        recent_arrival_rate: load
            .and_then(|l| l.recent_arrival_rate)
            .map(|r| format!("{}/s", trim(r.per_second))),
        job_time: load
            .and_then(|l| l.job_seconds)
            .map(|j| human_seconds(j).replace(' ', "")),
        job_seconds: load.and_then(|l| l.job_seconds).map(round),
        busy_workers: load.map(|l| round(l.arrival_rate * l.job_seconds.unwrap_or(0.0))),
        recommended_reserve: lane.recommended,
        reserve: lane.reserve,
        running: None,
    }
}

/// How far a measured number in the status may drift before the status is rewritten: the
/// sizing's own tolerance. Rates carry noise in every digit; writing each wobble would cost one
/// API write per pool per interval.
pub const MEASUREMENT_TOLERANCE: f64 = 0.10;

/// Whether `new` says nothing `old` does not: the same generation, counts, reserves and
/// conditions, and every measured number within [`MEASUREMENT_TOLERANCE`] of the one shown. A
/// recent rate, counted over `recent_window`, may also move by its own Poisson noise
/// ([`NOISE_SIGMAS`] standard deviations, as the sizing allows it): 5/s read over 5 s is 25
/// arrivals, ±20 % from one read to the next on a steady load.
pub fn settled(old: &LanePoolStatus, new: &LanePoolStatus, recent_window: Duration) -> bool {
    fn within(a: Option<f64>, b: Option<f64>, tolerance: impl Fn(f64) -> f64) -> bool {
        match (a, b) {
            (None, None) => true,
            (Some(a), Some(b)) => {
                let larger = a.abs().max(b.abs());
                (a - b).abs() <= tolerance(larger) * larger
            }
            _ => false,
        }
    }
    let close = |a, b| within(a, b, |_| MEASUREMENT_TOLERANCE);
    let recent_noise = |rate: f64| {
        let counted = rate * recent_window.as_secs_f64();
        if counted > 0.0 {
            MEASUREMENT_TOLERANCE.max(NOISE_SIGMAS / counted.sqrt())
        } else {
            MEASUREMENT_TOLERANCE
        }
    };
    let per_second = |text: &Option<String>| -> Option<f64> {
        text.as_deref()
            .map(|t| t.trim_end_matches("/s").parse().unwrap_or(f64::NAN))
    };
    let lane_settled = |(a, b): (&LaneStatus, &LaneStatus)| {
        a.name == b.name
            && a.reserve == b.reserve
            && a.recommended_reserve == b.recommended_reserve
            && a.running == b.running
            && close(a.arrival_rate_per_second, b.arrival_rate_per_second)
            && within(
                per_second(&a.recent_arrival_rate),
                per_second(&b.recent_arrival_rate),
                recent_noise,
            )
            && close(a.job_seconds, b.job_seconds)
            && close(a.busy_workers, b.busy_workers)
    };
    old.observed_generation == new.observed_generation
        && old.reserved == new.reserved
        && old.shared == new.shared
        && old.replicas == new.replicas
        && old.selector == new.selector
        && old.reserves == new.reserves
        && old.rollout == new.rollout
        && old.scale_down == new.scale_down
        && old.conditions == new.conditions
        && old.last_decision.is_some() == new.last_decision.is_some()
        && old.lanes.len() == new.lanes.len()
        && old.lanes.iter().zip(&new.lanes).all(lane_settled)
}

/// An event note for a resized reserve: "reserved urgent 1 → 3: 92/s × 21 ms × 1.5 = 2.9".
pub fn scale_note(lane: &LaneDecision, from: Option<i32>) -> String {
    let from = from.map_or_else(|| "(new)".to_string(), |n| n.to_string());
    let why = lane.arithmetic.as_deref().unwrap_or("metrics unavailable");
    format!("reserved {} {from} → {}: {why}", lane.name, lane.reserve)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn workers_whose_image_predates_the_credential_are_named_in_the_status() {
        assert_eq!(credential_condition(None, None), None);
        let checked = credential_condition(None, Some(&[])).unwrap();
        assert!(checked.status);
        let old: Vec<String> = (1..=5).map(|i| format!("jobs-shared-{i}")).collect();
        let unchecked = credential_condition(None, Some(&old)).unwrap();
        assert!(!unchecked.status);
        assert_eq!(unchecked.reason, "NotChecked");
        assert!(
            unchecked
                .message
                .starts_with("jobs-shared-1, jobs-shared-2, jobs-shared-3 and 2 more: "),
            "{}",
            unchecked.message
        );
        let none = credential_condition(
            Some("Secret jobs-worker-credential could not be read"),
            None,
        );
        assert_eq!(none.unwrap().reason, "NoCredential");
    }

    #[test]
    fn workers_that_cannot_start_turn_ready_false_with_the_first_reason() {
        let ready = || ConditionState::new(READY, true, "Applied", "applied");
        let mut conditions = vec![ready()];
        workers_cannot_start(&mut conditions, &[], 4);
        assert_eq!(conditions, vec![ready()], "nothing stuck: Ready as decided");

        let stuck: Vec<(String, &'static str, String)> = (0..5)
            .map(|i| {
                (
                    format!("jobs-shared-{i}"),
                    "ImagePullBackOff",
                    "Back-off".to_string(),
                )
            })
            .collect();
        let mut conditions = vec![ready()];
        workers_cannot_start(&mut conditions, &stuck, 6);
        let ready = &conditions[0];
        assert!(!ready.status);
        assert_eq!(ready.reason, "ImagePullBackOff");
        assert_eq!(
            ready.message,
            "5 of 6 workers cannot start: jobs-shared-0: ImagePullBackOff: Back-off; \
             jobs-shared-1: ImagePullBackOff: Back-off; jobs-shared-2: ImagePullBackOff: \
             Back-off (and 2 more)"
        );
    }

    #[test]
    fn a_scale_event_reads_like_the_guide() {
        use crate::sizing::*;
        use std::collections::BTreeMap;
        use std::time::Duration;
        let lane = LaneSizing {
            name: "urgent".into(),
            min: 1,
            max: 6,
            rule: Rule::Formula,
        };
        let sizing = PoolSizing {
            stabilization_window: Duration::from_secs(300),
            ..PoolSizing::new(vec![lane], 1.5, PoolSize::Shared { replicas: 8 })
        };
        let once = |loads: &BTreeMap<String, std::result::Result<LaneLoad, String>>| {
            decide(
                &sizing,
                Inputs {
                    loads,
                    current: None,
                    history: &History::new(),
                    now: Duration::ZERO,
                    outage: Default::default(),
                    shared_job_seconds: None,
                },
            )
        };
        let loads = BTreeMap::from([(
            "urgent".to_string(),
            Ok(LaneLoad {
                arrival_rate: 92.0,
                recent_arrival_rate: None,
                job_seconds: Some(0.021),
            }),
        )]);
        let decision = once(&loads);
        assert_eq!(
            scale_note(&decision.lanes[0], Some(1)),
            "reserved urgent 1 → 3: 92/s × 21 ms × 1.5 = 2.9"
        );
        assert_eq!(lane_status(&decision.lanes[0]).recent_arrival_rate, None);
        let recent = BTreeMap::from([(
            "urgent".to_string(),
            Ok(LaneLoad {
                arrival_rate: 92.0,
                recent_arrival_rate: Some(RecentRate {
                    per_second: 148.4,
                    window: Duration::from_secs(15),
                }),
                job_seconds: Some(0.021),
            }),
        )]);
        let rising = once(&recent);
        let status = lane_status(&rising.lanes[0]);
        assert_eq!(status.recent_arrival_rate.as_deref(), Some("148/s"));
        assert_eq!(status.arrival_rate.as_deref(), Some("92/s"));
        assert_eq!(
            scale_note(&rising.lanes[0], Some(3)),
            "reserved urgent 3 → 5: 148/s (recent) × 21 ms × 1.5 = 4.67; the recent rate over 15 s"
        );
        let unmeasured = BTreeMap::from([("urgent".to_string(), Err("down".to_string()))]);
        let held = once(&unmeasured);
        assert_eq!(
            scale_note(&held.lanes[0], None),
            "reserved urgent (new) → 1: metrics unavailable"
        );
    }

    #[test]
    fn an_unchanged_condition_keeps_its_transition_time() {
        let earlier = Timestamp::from_second(1_000).unwrap();
        let later = Timestamp::from_second(2_000).unwrap();
        let first = merge_conditions(
            &[],
            &[ConditionState::new(READY, true, "Applied", "")],
            Some(1),
            earlier,
        );
        let same = merge_conditions(
            &first,
            &[ConditionState::new(READY, true, "Applied", "")],
            Some(1),
            later,
        );
        assert_eq!(same[0].last_transition_time, Time(earlier));
        let flipped = merge_conditions(
            &same,
            &[ConditionState::new(READY, false, "Broken", "")],
            Some(1),
            later,
        );
        assert_eq!(flipped[0].last_transition_time, Time(later));
    }

    #[test]
    fn a_status_restating_measurements_within_the_tolerance_is_settled() {
        let lane = |rate: f64, recent: &str, reserve: i32| LaneStatus {
            name: "urgent".into(),
            arrival_rate: Some(format!("{rate}/s")),
            arrival_rate_per_second: Some(rate),
            recent_arrival_rate: Some(recent.into()),
            job_time: Some("20ms".into()),
            job_seconds: Some(0.020),
            busy_workers: Some(rate * 0.020),
            recommended_reserve: reserve,
            reserve,
            running: None,
        };
        let status = |lane: LaneStatus| LanePoolStatus {
            observed_generation: Some(1),
            reserved: lane.reserve,
            shared: 9,
            lanes: vec![lane],
            conditions: Vec::new(),
            last_decision: Some("urgent 45/s".into()),
            ..LanePoolStatus::default()
        };
        let settled = |a: &LanePoolStatus, b: &LanePoolStatus| settled(a, b, FIVE_SECONDS);
        let shown = status(lane(45.0, "44.9/s", 1));
        assert!(
            settled(&shown, &status(lane(47.2, "46.1/s", 1))),
            "5 % of noise"
        );
        assert!(
            !settled(&shown, &status(lane(52.0, "44.9/s", 1))),
            "a rate 15 % up"
        );
        assert!(
            !settled(&shown, &status(lane(45.0, "52/s", 1))),
            "a recent rate 15 % up"
        );
        assert!(
            !settled(&shown, &status(lane(45.0, "44.9/s", 2))),
            "a new reserve"
        );
        let mut unmeasured = lane(45.0, "44.9/s", 1);
        unmeasured.recent_arrival_rate = None;
        assert!(
            !settled(&shown, &status(unmeasured)),
            "a rate no longer measured"
        );
        let mut respecified = status(lane(45.0, "44.9/s", 1));
        respecified.observed_generation = Some(2);
        assert!(!settled(&shown, &respecified), "a new generation");
    }

    const FIVE_SECONDS: Duration = Duration::from_secs(5);

    /// A slow lane's recent rate wobbles by more than 10 % from read to read on a steady load:
    /// within two standard deviations of its count nothing is rewritten, beyond them it is.
    #[test]
    fn a_recent_rate_moving_by_its_own_noise_is_settled() {
        let lane = |recent: &str| LaneStatus {
            name: "urgent".into(),
            arrival_rate: Some("5/s".into()),
            arrival_rate_per_second: Some(5.0),
            recent_arrival_rate: Some(recent.into()),
            busy_workers: Some(0.1),
            reserve: 2,
            recommended_reserve: 2,
            ..LaneStatus::default()
        };
        let status = |recent: &str| LanePoolStatus {
            lanes: vec![lane(recent)],
            last_decision: Some("urgent 5/s".into()),
            ..LanePoolStatus::default()
        };
        // 6.06/s over 5 s is 30 arrivals: σ 18 %, so up to 36 % is noise.
        assert!(settled(&status("4.05/s"), &status("6.06/s"), FIVE_SECONDS));
        assert!(!settled(&status("3.5/s"), &status("6.06/s"), FIVE_SECONDS));
        // Counted over a minute the same move is no longer noise.
        assert!(!settled(
            &status("4.05/s"),
            &status("6.06/s"),
            Duration::from_secs(60)
        ));
    }
}
