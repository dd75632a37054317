//! Reading what workers answer, in the Prometheus text format: every sample of a `/metrics`
//! text, the gauges of the idle-first ranking, the finished-job counts of the reads and the answer
//! to a drain request. An answer is already capped in bytes and lines (`worker_http.rs`); here
//! nothing of it is kept beyond what the pool's lanes and the protocol's names ask for.

use std::collections::BTreeMap;

use crate::controller::protocol::{
    BUSY_METRIC, DEPTH_METRIC, DRAINING_METRIC, FINISHED_METRIC, JOB_SECONDS_METRIC, STARTED_METRIC,
};
use crate::controller::rollout::cost::Labelled;
use crate::controller::rollout::drain::DrainAnswer;
use crate::sizing::WorkerCount;

/// The most busy and job-start series kept of one worker's answer.
const MOST_SERIES: usize = 64;

/// Every sample of a `/metrics` text (the Prometheus text format): name, labels and value.
pub(in crate::controller) fn sample_lines(
    text: &str,
) -> impl Iterator<Item = (&str, BTreeMap<String, String>, f64)> {
    text.lines()
        .map(str::trim)
        .filter(|line| !line.starts_with('#'))
        .filter_map(parse_sample_line)
        .filter_map(|(name, labels, rest)| {
            let value = rest.split_whitespace().next()?.parse::<f64>().ok()?;
            Some((name, labels, value))
        })
}

/// The values of `metric`'s series in a worker's `/metrics` text (the Prometheus text format).
pub fn gauge_values(text: &str, metric: &str) -> Vec<f64> {
    sample_lines(text)
        .filter(|(name, _, _)| *name == metric)
        .map(|(_, _, value)| value)
        .collect()
}

/// The busy and job-start series of a worker's `/metrics` text (the Prometheus text format),
/// each labelled `pod` as Prometheus would label them.
/// An answer with more than [`MOST_SERIES`] of them says nothing (a worker runs one job at a
/// time: a few series are all it has).
pub fn parse_gauges(text: &str, pod: &str) -> (Vec<Labelled>, Vec<Labelled>) {
    let (mut busy, mut started) = (Vec::new(), Vec::new());
    for (name, mut labels, value) in sample_lines(text) {
        labels.insert("pod".into(), pod.into());
        match name {
            BUSY_METRIC => busy.push((labels, value)),
            STARTED_METRIC => started.push((labels, value)),
            _ => continue,
        }
        if busy.len() + started.len() > MOST_SERIES {
            return Default::default();
        }
    }
    (busy, started)
}

/// `name{label="value",…} rest` → (name, labels, rest); `None` if it is not such a line.
fn parse_sample_line(line: &str) -> Option<(&str, BTreeMap<String, String>, &str)> {
    let end = line.find(|c: char| c == '{' || c.is_whitespace())?;
    let (name, mut rest) = line.split_at(end);
    let mut labels = BTreeMap::new();
    if let Some(inner) = rest.strip_prefix('{') {
        let mut chars = inner.char_indices().peekable();
        loop {
            // A label name, `=`, a quoted value with \\ \" \n escapes; then `,` or `}`.
            while chars
                .next_if(|(_, c)| *c == ',' || c.is_whitespace())
                .is_some()
            {}
            let (start, c) = chars.next()?;
            if c == '}' {
                rest = &inner[start + 1..];
                break;
            }
            let mut key = String::from(c);
            while let Some((_, c)) = chars.next_if(|(_, c)| *c != '=') {
                key.push(c);
            }
            chars.next()?; // '='
            if chars.next()?.1 != '"' {
                return None;
            }
            let mut value = String::new();
            loop {
                match chars.next()?.1 {
                    '"' => break,
                    '\\' => match chars.next()?.1 {
                        'n' => value.push('\n'),
                        other => value.push(other),
                    },
                    other => value.push(other),
                }
            }
            labels.insert(key.trim().to_string(), value);
        }
    }
    Some((name, labels, rest))
}

/// The counts of `lanes` in a worker's `/metrics` text: finished jobs, the seconds they ran and
/// the depth the worker sees of each lane's queue (`worker` and `started_since` left for the
/// caller); `None` when it exports no finished-job counts, not even their declaration (such a
/// worker is no rate). Series of other lanes are never kept.
pub fn worker_counts(text: &str, lanes: &[String]) -> Option<WorkerCount> {
    let mut counts = WorkerCount::default();
    let mut exported = text
        .lines()
        .any(|l| l.starts_with("# TYPE lanepool_job_duration_seconds "));
    for (name, labels, value) in sample_lines(text) {
        let kept = match name {
            FINISHED_METRIC => &mut counts.finished,
            JOB_SECONDS_METRIC => &mut counts.seconds,
            DEPTH_METRIC => &mut counts.depth,
            _ => continue,
        };
        if !value.is_finite() || value < 0.0 {
            continue;
        }
        exported |= name == FINISHED_METRIC;
        if let Some(lane) = labels.get("lane").filter(|l| lanes.contains(l)) {
            *kept.entry(lane.clone()).or_default() += value;
        }
    }
    exported.then_some(counts)
}

/// Reads a worker's answer to `POST /drain?seconds=N` (`0`: an answer to calling it off).
pub fn read_answer(status: u16, text: &str) -> DrainAnswer {
    if status >= 500 {
        // The worker's server failed, not the request: what the worker does is unknown.
        return DrainAnswer::Unreachable;
    }
    let draining = gauge_values(text, DRAINING_METRIC).iter().any(|v| *v > 0.0);
    if status != 200 || !draining {
        return DrainAnswer::Refused;
    }
    // A busy series that is NaN (or ±Inf) is no answer: the worker may be busy, and a drained
    // worker read as idle is stopped. Only a series at 0, or none (the gauge is optional), is idle.
    DrainAnswer::Draining {
        busy: gauge_values(text, BUSY_METRIC)
            .iter()
            .any(|v| !v.is_finite() || *v > 0.0),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::controller::rollout::cost::tests::series;
    use crate::controller::rollout::cost::{Work, busy_pods};

    #[test]
    fn a_workers_own_answer_is_read_as_prometheus_would_label_it() {
        let text = "# HELP lanepool_worker_busy 1 while the worker runs a job\n\
                    # TYPE lanepool_worker_busy gauge\n\
                    lanepool_worker_busy{lane=\"batch\"} 1\n\
                    lanepool_worker_job_started_timestamp_seconds{lane=\"batch\",note=\"a \\\"q\\\", b}\"} 1800000000.250 1700000000000\n\
                    lanepool_worker_busy_other 7\n\
                    lanepool_worker_busy{broken 1\n";
        let (busy, started) = parse_gauges(text, "jobs-shared-x");
        assert_eq!(busy, vec![series("jobs-shared-x", "batch", 1.0)]);
        let mut expected = series("jobs-shared-x", "batch", 1_800_000_000.25);
        expected.0.insert("note".into(), "a \"q\", b}".into());
        assert_eq!(started, vec![expected]);
        let (busy, started) = parse_gauges("lanepool_worker_busy 0\n", "idle");
        assert_eq!(busy, vec![series("idle", "", 0.0)]);
        assert!(started.is_empty());
        let work = busy_pods(&busy, &started);
        assert_eq!(work.get("idle"), Some(&Work::Idle));
        let many = "lanepool_worker_busy{lane=\"x\"} 1\n".repeat(MOST_SERIES + 1);
        assert_eq!(
            parse_gauges(&many, "p"),
            Default::default(),
            "too many series"
        );
    }

    #[test]
    fn a_workers_counts_are_read_by_lane_and_a_worker_without_them_says_nothing() {
        let text = "# TYPE lanepool_job_duration_seconds histogram\n\
            lanepool_job_duration_seconds_bucket{lane=\"urgent\",le=\"0.05\"} 40\n\
            lanepool_job_duration_seconds_count{lane=\"urgent\"} 42\n\
            lanepool_job_duration_seconds_sum{lane=\"urgent\"} 0.84\n\
            lanepool_job_duration_seconds_count{lane=\"batch\"} 7\n";
        let lanes = ["urgent".to_string(), "batch".to_string()];
        let counts = worker_counts(text, &lanes).unwrap_or_default();
        assert_eq!(counts.finished.get("urgent"), Some(&42.0));
        assert_eq!(counts.finished.get("batch"), Some(&7.0));
        assert_eq!(counts.seconds.get("urgent"), Some(&0.84));
        let declared_no_jobs_yet = "# TYPE lanepool_job_duration_seconds histogram\n\
            lanepool_queue_depth{lane=\"urgent\"} 12\n";
        let none_yet = worker_counts(declared_no_jobs_yet, &lanes).unwrap_or_default();
        assert_eq!(none_yet.finished, BTreeMap::new());
        assert_eq!(none_yet.depth.get("urgent"), Some(&12.0));
        assert_eq!(worker_counts("lanepool_worker_busy 1\n", &lanes), None);
        // A depth alone is no finished-job count.
        assert_eq!(
            worker_counts("lanepool_queue_depth{lane=\"urgent\"} 3\n", &lanes),
            None
        );
    }

    #[test]
    fn only_the_pools_own_lanes_are_kept_of_a_workers_counts() {
        let mut text = String::from("lanepool_job_duration_seconds_count{lane=\"urgent\"} 3\n");
        for i in 0..1000 {
            text.push_str(&format!(
                "lanepool_job_duration_seconds_count{{lane=\"made-up-{i}\"}} 1\n"
            ));
        }
        let counts = worker_counts(&text, &["urgent".to_string()]).map(|c| c.finished);
        assert_eq!(counts, Some(BTreeMap::from([("urgent".to_string(), 3.0)])));
    }

    #[test]
    fn only_a_worker_that_says_it_drains_is_draining() {
        let gauges = "# HELP lanepool_worker_busy …\n\
                      lanepool_worker_busy{lane=\"batch\"} 1\n\
                      lanepool_worker_job_started_timestamp_seconds{lane=\"batch\"} 1800000000.000\n\
                      lanepool_worker_draining 1\n";
        assert_eq!(
            read_answer(200, gauges),
            DrainAnswer::Draining { busy: true }
        );
        let idle = "lanepool_worker_busy 0\nlanepool_worker_draining 1\n";
        assert_eq!(
            read_answer(200, idle),
            DrainAnswer::Draining { busy: false }
        );
        for unknown in ["NaN", "+Inf", "-Inf"] {
            let text = format!("lanepool_worker_busy {unknown}\nlanepool_worker_draining 1\n");
            assert_eq!(
                read_answer(200, &text),
                DrainAnswer::Draining { busy: true },
                "busy {unknown}"
            );
        }
        // A 404, or a server answering every path with gauges that do not say it drains.
        assert_eq!(read_answer(404, "not found\n"), DrainAnswer::Refused);
        assert_eq!(
            read_answer(200, "lanepool_worker_busy 1\n"),
            DrainAnswer::Refused
        );
        assert_eq!(
            read_answer(200, "lanepool_worker_busy 0\nlanepool_worker_draining 0\n"),
            DrainAnswer::Refused
        );
        assert_eq!(read_answer(500, idle), DrainAnswer::Unreachable);
        assert_eq!(read_answer(503, "busy\n"), DrainAnswer::Unreachable);
        assert_eq!(read_answer(405, idle), DrainAnswer::Refused);
    }
}
