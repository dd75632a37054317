//! Whether a worker stopped by a scale-down can finish its job: the pod template's
//! `terminationGracePeriodSeconds` against the measured mean job time of every lane the pool's
//! workers serve. Reports only (a condition and a warning event); it never changes a count.

use std::collections::BTreeMap;

use crate::api::LanePool;
use crate::controller::status::ConditionState;
use crate::duration::human_seconds;

pub const GRACE_PERIOD_TOO_SHORT: &str = "GracePeriodTooShort";
/// What the API server gives a Pod that names no grace period.
const DEFAULT_GRACE_SECONDS: i64 = 30;

/// The pod template's grace period in seconds.
pub fn grace_seconds(pool: &LanePool) -> i64 {
    pool.spec
        .template
        .spec
        .as_ref()
        .and_then(|s| s.termination_grace_period_seconds)
        .unwrap_or(DEFAULT_GRACE_SECONDS)
}

/// `GracePeriodTooShort`: true when some lane's mean job time is longer than the grace period,
/// naming the longest such lane; false otherwise. `job_seconds` holds the lanes measured.
pub fn grace_condition(grace: i64, job_seconds: &BTreeMap<String, f64>) -> ConditionState {
    let longest = job_seconds
        .iter()
        .filter(|(_, seconds)| seconds.is_finite())
        .max_by(|a, b| a.1.total_cmp(b.1));
    let grace_text = human_seconds(grace as f64);
    match longest {
        // The message names the lane, not the measured time: a number that moves every interval
        // would rewrite the status and repeat the warning each time.
        Some((lane, seconds)) if *seconds > grace as f64 => ConditionState::new(
            GRACE_PERIOD_TOO_SHORT,
            true,
            "JobLongerThanGracePeriod",
            format!(
                "lane {lane}'s mean job time is longer than the pod template's \
                 terminationGracePeriodSeconds ({grace_text}): a worker a scale-down stops \
                 mid-job is killed before its job ends; raise it above the longest job"
            ),
        ),
        _ => ConditionState::new(
            GRACE_PERIOD_TOO_SHORT,
            false,
            "JobsFit",
            format!(
                "every measured lane's mean job time fits in terminationGracePeriodSeconds \
                 ({grace_text})"
            ),
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_lane_whose_jobs_outlast_the_grace_period_is_named() {
        let times = BTreeMap::from([("urgent".to_string(), 0.02), ("batch".to_string(), 3.0)]);
        let too_short = grace_condition(1, &times);
        assert!(too_short.status);
        assert!(
            too_short.message.contains("lane batch"),
            "{}",
            too_short.message
        );
        assert!(!grace_condition(30, &times).status);
        assert!(
            !grace_condition(1, &BTreeMap::new()).status,
            "nothing measured: no warning"
        );
    }
}
