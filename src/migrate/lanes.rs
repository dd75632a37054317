//! The pool's lanes and size from the worker's queues and the Deployment's replicas: the first
//! queue is the urgent lane with a reserve, the others lanes without one, each name checked
//! against the CRD's rules so the API server never has to refuse the pool. Pure.

use std::sync::LazyLock;

use regex::Regex;

use super::error::MigrateError;
use crate::api::{JobTimeQuery, Lane, Reserve, SizingMode};
use crate::duration::KubeDuration;

/// The CRD's pattern and bounds for a lane's name (api.rs, `Lane::name`).
const LANE_PATTERN: &str = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$";
const MOST_LANE_CHARACTERS: usize = 40;
const MOST_LANES: usize = 16;

/// The share of the pool the urgent lane may reserve by default: the README's first pool
/// reserves up to 6 of 10 workers, the Celery example 3 of 4.
const RESERVE_SHARE: f64 = 0.6;

/// Checks `lanes` (in priority order) against the CRD's rules; `from` says where they came from
/// (`--lanes`, or the command's queues) for the message.
pub fn check(lanes: &[String], from: &str) -> Result<(), MigrateError> {
    static NAME: LazyLock<Regex> =
        LazyLock::new(|| Regex::new(LANE_PATTERN).expect("the CRD's lane pattern compiles"));
    let queue = |queue: &str, reason: String| MigrateError::Queue {
        queue: queue.to_string(),
        from: from.to_string(),
        reason,
    };
    for (at, lane) in lanes.iter().enumerate() {
        if lane.len() > MOST_LANE_CHARACTERS {
            return Err(queue(
                lane,
                format!("a lane's name is at most {MOST_LANE_CHARACTERS} characters"),
            ));
        }
        if !NAME.is_match(lane) {
            return Err(queue(
                lane,
                "a lane's name is a DNS label: lowercase letters, digits and '-', starting and \
                 ending with a letter or digit"
                    .into(),
            ));
        }
        if lanes[..at].contains(lane) {
            return Err(queue(lane, "it is named twice".into()));
        }
    }
    let shown = lanes.join(", ");
    if lanes.len() < 2 {
        return Err(MigrateError::flag(
            "--lanes",
            format!(
                "{} lane{} ({shown}) from {from}: a LanePool needs an urgent lane (with a \
                 reserve) and at least one more that the shared workers fall back to; give the \
                 lanes in priority order, such as --lanes urgent,batch",
                lanes.len(),
                if lanes.len() == 1 { "" } else { "s" },
            ),
        ));
    }
    if lanes.len() > MOST_LANES {
        return Err(MigrateError::flag(
            "--lanes",
            format!(
                "{} lanes from {from}: a LanePool has at most {MOST_LANES}",
                lanes.len()
            ),
        ));
    }
    Ok(())
}

/// The lanes of a first pool: the first one reserved (at least 1 worker, at most `reserve_max`,
/// `job_time` assumed until measured), the others served by shared workers.
pub fn lanes(names: &[String], reserve_max: i32, job_time: &str) -> Vec<Lane> {
    names
        .iter()
        .enumerate()
        .map(|(at, name)| Lane {
            name: name.clone(),
            queue: None,
            reserve: (at == 0).then(|| Reserve {
                min: 1,
                max: reserve_max,
                sizing: SizingMode::Queueing,
                target_p99: None,
                arrival_rate: None,
                job_time: Some(JobTimeQuery {
                    query: None,
                    fallback: Some(KubeDuration::new(job_time)),
                }),
            }),
        })
        .collect()
}

/// The urgent lane's reserve.max when no flag sets it: 60 % of the pool, rounded up, leaving
/// the one shared worker that the CRD requires.
pub fn default_reserve_max(total_workers: i32) -> i32 {
    let share = (f64::from(total_workers) * RESERVE_SHARE).ceil() as i32;
    share.min(total_workers - 1).max(1)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn names(text: &str) -> Vec<String> {
        text.split(',').map(str::to_string).collect()
    }

    #[test]
    fn the_default_reserve_is_the_examples_share() {
        assert_eq!(default_reserve_max(10), 6);
        assert_eq!(default_reserve_max(4), 3);
        assert_eq!(default_reserve_max(2), 1);
        assert_eq!(default_reserve_max(3), 2);
    }

    #[test]
    fn the_first_lane_alone_has_a_reserve() {
        let lanes = lanes(&names("urgent,batch,bulk"), 6, "50ms");
        let reserve = lanes[0].reserve.as_ref().expect("urgent is reserved");
        assert_eq!((reserve.min, reserve.max), (1, 6));
        assert_eq!(
            reserve
                .job_time
                .as_ref()
                .and_then(|j| j.fallback.as_ref())
                .map(KubeDuration::as_str),
            Some("50ms")
        );
        assert!(lanes[1..].iter().all(|lane| lane.reserve.is_none()));
    }

    #[test]
    fn a_queue_that_cannot_be_a_lane_is_named() {
        let error = check(&names("high_priority,batch"), "rq worker's queues").unwrap_err();
        assert!(
            error.to_string().starts_with(
                "queue \"high_priority\" (rq worker's queues) cannot be a lane: a lane's name is a DNS label"
            ),
            "{error}"
        );
        let long = format!("{},batch", "u".repeat(41));
        assert!(
            check(&names(&long), "x")
                .unwrap_err()
                .to_string()
                .contains("at most 40")
        );
        let twice = check(&names("urgent,batch,urgent"), "x").unwrap_err();
        assert!(twice.to_string().contains("named twice"), "{twice}");
        assert!(check(&names("Urgent,batch"), "x").is_err());
    }

    #[test]
    fn one_lane_or_seventeen_are_refused() {
        let one = check(&names("default"), "rq worker's queues").unwrap_err();
        assert_eq!(
            one.to_string(),
            "--lanes: 1 lane (default) from rq worker's queues: a LanePool needs an urgent lane \
             (with a reserve) and at least one more that the shared workers fall back to; give \
             the lanes in priority order, such as --lanes urgent,batch"
        );
        let many: Vec<String> = (0..17).map(|i| format!("q{i}")).collect();
        assert!(
            check(&many, "--lanes")
                .unwrap_err()
                .to_string()
                .contains("at most 16")
        );
        assert!(check(&names("urgent,batch"), "x").is_ok());
    }
}
