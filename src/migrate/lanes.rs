//! The pool's lanes and size from the worker's queues and the Deployment's replicas: the first
//! queue is the urgent lane with a reserve, the others lanes without one. A queue whose name is a
//! lane's name (a DNS label) is the lane of that name; another, such as `high_priority`, gets a
//! lane named after it with `queue` set. Each is checked against the CRD's rules so the API server
//! never has to refuse the pool. Pure.

use std::collections::BTreeSet;
use std::sync::LazyLock;

use regex::Regex;

use super::error::MigrateError;
use crate::api::{JobTimeQuery, Lane, MOST_QUEUE_BYTES, QUEUE_PATTERN, Reserve, SizingMode};
use crate::duration::KubeDuration;

/// The CRD's pattern and bounds for a lane's name (api.rs, `Lane::name`).
const LANE_PATTERN: &str = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$";
const MOST_LANE_CHARACTERS: usize = 40;
const MOST_LANES: usize = 16;

/// The share of the pool the urgent lane may reserve by default: the README's first pool
/// reserves up to 6 of 10 workers, the Celery example 3 of 4.
const RESERVE_SHARE: f64 = 0.6;

/// A lane made from a queue: its name, and the queue when that is not the name.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LaneOfQueue {
    pub name: String,
    pub queue: Option<String>,
}

/// Checks `queues` (in priority order) against the CRD's rules and names their lanes; `from`
/// says where they came from (`--lanes`, or the command's queues) for the message.
pub fn check(queues: &[String], from: &str) -> Result<Vec<LaneOfQueue>, MigrateError> {
    static QUEUE: LazyLock<Regex> =
        LazyLock::new(|| Regex::new(QUEUE_PATTERN).expect("the CRD's queue pattern compiles"));
    let refused = |queue: &str, reason: String| MigrateError::Queue {
        queue: queue.to_string(),
        from: from.to_string(),
        reason,
    };
    for (at, queue) in queues.iter().enumerate() {
        if queue.len() > MOST_QUEUE_BYTES as usize {
            return Err(refused(
                queue,
                format!("a lane's queue is at most {MOST_QUEUE_BYTES} bytes"),
            ));
        }
        if !QUEUE.is_match(queue) {
            return Err(refused(
                queue,
                "a lane's queue has no ',', '=', space or control character (LANEPOOL_QUEUES \
                 separates at them)"
                    .into(),
            ));
        }
        if queues[..at].contains(queue) {
            return Err(refused(queue, "it is named twice".into()));
        }
    }
    let shown = queues.join(", ");
    if queues.len() < 2 {
        return Err(MigrateError::flag(
            "--lanes",
            format!(
                "{} lane{} ({shown}) from {from}: a LanePool needs an urgent lane (with a \
                 reserve) and at least one more that the shared workers fall back to; give the \
                 lanes in priority order, such as --lanes urgent,batch",
                queues.len(),
                if queues.len() == 1 { "" } else { "s" },
            ),
        ));
    }
    if queues.len() > MOST_LANES {
        return Err(MigrateError::flag(
            "--lanes",
            format!(
                "{} lanes from {from}: a LanePool has at most {MOST_LANES}",
                queues.len()
            ),
        ));
    }
    Ok(lanes_of(queues))
}

/// Each queue's lane: the queue's own name where it can be a lane's, else a DNS label made from
/// it (lowercase, every run of other characters a '-', at most 40 characters), made unique with
/// `-2`, `-3`, … against every other lane.
fn lanes_of(queues: &[String]) -> Vec<LaneOfQueue> {
    static NAME: LazyLock<Regex> =
        LazyLock::new(|| Regex::new(LANE_PATTERN).expect("the CRD's lane pattern compiles"));
    let is_lane_name = |queue: &str| queue.len() <= MOST_LANE_CHARACTERS && NAME.is_match(queue);
    // Queues that are lane names keep them, wherever they stand in the order.
    let mut taken: BTreeSet<String> = queues.iter().filter(|q| is_lane_name(q)).cloned().collect();
    queues
        .iter()
        .map(|queue| {
            if is_lane_name(queue) {
                return LaneOfQueue {
                    name: queue.clone(),
                    queue: None,
                };
            }
            let base = label_from(queue);
            let name = (1..)
                .map(|n| match n {
                    1 => base.clone(),
                    n => {
                        let suffix = format!("-{n}");
                        let room = MOST_LANE_CHARACTERS - suffix.len();
                        format!(
                            "{}{suffix}",
                            base[..base.len().min(room)].trim_end_matches('-')
                        )
                    }
                })
                .find(|name| !taken.contains(name))
                .expect("some suffix is free");
            taken.insert(name.clone());
            LaneOfQueue {
                name,
                queue: Some(queue.clone()),
            }
        })
        .collect()
}

/// A DNS label of at most 40 characters from a queue's name; `lane` when nothing is left.
fn label_from(queue: &str) -> String {
    let mut label = String::new();
    for c in queue.chars().map(|c| c.to_ascii_lowercase()) {
        if c.is_ascii_lowercase() || c.is_ascii_digit() {
            label.push(c);
        } else if !label.is_empty() && !label.ends_with('-') {
            label.push('-');
        }
    }
    label.truncate(MOST_LANE_CHARACTERS);
    let label = label.trim_end_matches('-');
    if label.is_empty() {
        "lane".into()
    } else {
        label.into()
    }
}

/// The lanes of a first pool: the first one reserved (at least 1 worker, at most `reserve_max`,
/// `job_time` assumed until measured), the others served by shared workers.
pub fn lanes(named: &[LaneOfQueue], reserve_max: i32, job_time: &str) -> Vec<Lane> {
    named
        .iter()
        .enumerate()
        .map(|(at, lane)| Lane {
            name: lane.name.clone(),
            queue: lane.queue.clone(),
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
        let named = check(&names("urgent,batch,bulk"), "x").unwrap();
        let lanes = lanes(&named, 6, "50ms");
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
        assert!(lanes.iter().all(|lane| lane.queue.is_none()));
    }

    #[test]
    fn a_queue_that_cannot_be_a_lanes_name_gets_a_lane_named_after_it() {
        let named = check(&names("high_priority,batch"), "rq worker's queues").unwrap();
        let lanes = lanes(&named, 6, "50ms");
        assert_eq!(
            (lanes[0].name.as_str(), lanes[0].queue()),
            ("high-priority", "high_priority")
        );
        assert_eq!(
            (lanes[1].name.as_str(), lanes[1].queue.as_deref()),
            ("batch", None)
        );

        // Unique against every other lane, and at most 40 characters with its suffix.
        let long = format!("{}_x", "u".repeat(45));
        let named = check(
            &names(&format!(
                "Urgent,urgent,high.priority,high-priority,{long},{long}!,__"
            )),
            "x",
        )
        .unwrap();
        let shown: Vec<(&str, Option<&str>)> = named
            .iter()
            .map(|l| (l.name.as_str(), l.queue.as_deref()))
            .collect();
        let u40 = "u".repeat(40);
        let u38 = format!("{}-2", "u".repeat(38));
        assert_eq!(
            shown,
            [
                ("urgent-2", Some("Urgent")),
                ("urgent", None),
                ("high-priority-2", Some("high.priority")),
                ("high-priority", None),
                (u40.as_str(), Some(long.as_str())),
                (u38.as_str(), Some(format!("{long}!").as_str())),
                ("lane", Some("__")),
            ]
        );
    }

    #[test]
    fn a_queue_no_lane_can_take_is_named() {
        let twice = check(&names("urgent,batch,urgent"), "x").unwrap_err();
        assert!(twice.to_string().contains("named twice"), "{twice}");
        let error = check(&names("a=b,batch"), "rq worker's queues").unwrap_err();
        assert!(
            error
                .to_string()
                .starts_with("queue \"a=b\" (rq worker's queues) cannot be a lane's queue: "),
            "{error}"
        );
        let long = format!("{},batch", "é".repeat(128));
        assert!(
            check(&names(&long), "x")
                .unwrap_err()
                .to_string()
                .contains("at most 255 bytes")
        );
        assert!(check(&names(&format!("{},batch", "é".repeat(127))), "x").is_ok());
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
