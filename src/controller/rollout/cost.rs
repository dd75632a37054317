//! The idle-first cost model, without I/O: what each worker is doing, read from its busy and
//! job-start gauges, becomes the deletion cost that makes the ReplicaSet controller stop idle
//! workers first, then those whose jobs should end soonest. Drained workers cost least of all.

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};

/// A worker running a job of a lane whose job time is not known (or that names no lane); one
/// on a lane with a measured mean job time costs 1 + the time its job has left in milliseconds.
pub const BUSY_COST: i32 = 1000;
/// The highest cost: a lane's jobs of 11 days and more all cost the same.
const MAX_COST: i32 = 1_000_000_000;
/// A worker waiting for a job, or one whose work is not known (just started, not scraped).
pub const IDLE_COST: i32 = 0;
/// A worker drained for this shrink: idle, and taking no new job, so it goes before any other.
pub const DRAINED_COST: i32 = -1;

/// What a worker reports: idle, or busy with a job of a lane (`None`: it names none) that
/// started at `started` (Unix seconds; `None`: not reported).
#[derive(Clone, Debug, PartialEq)]
pub enum Work {
    Idle,
    Busy {
        lane: Option<String>,
        started: Option<f64>,
    },
}

/// One series of an answer, from a worker or Prometheus: its labels and value.
pub use crate::prometheus::query::Labelled;

/// Each worker's work, by pod name, from the busy gauge's series and the job-start gauge's. A
/// series without a `pod` label, or a value that is not finite, says nothing; of two busy
/// series of one pod (the lane changed between scrapes), a busy one wins; a start time joins
/// the busy series of its pod and lane (the latest, if several).
pub fn busy_pods(busy: &[Labelled], started: &[Labelled]) -> HashMap<String, Work> {
    let mut work: HashMap<String, Work> = HashMap::new();
    for (labels, value) in busy.iter().filter(|(_, value)| value.is_finite()) {
        let Some(pod) = labels.get("pod") else {
            continue;
        };
        let this = if *value > 0.0 {
            Work::Busy {
                lane: lane_of(labels),
                started: None,
            }
        } else {
            Work::Idle
        };
        if this != Work::Idle || !work.contains_key(pod) {
            work.insert(pod.clone(), this);
        }
    }
    for (labels, value) in started.iter().filter(|(_, value)| value.is_finite()) {
        let Some(Work::Busy { lane, started }) = labels.get("pod").and_then(|p| work.get_mut(p))
        else {
            continue;
        };
        if *lane == lane_of(labels) && started.is_none_or(|s| s < *value) {
            *started = Some(*value);
        }
    }
    work
}

fn lane_of(labels: &BTreeMap<String, String>) -> Option<String> {
    labels.get("lane").filter(|l| !l.is_empty()).cloned()
}

/// How long a busy worker's job should still run, in seconds: its lane's mean job time less
/// the time since it started (0 once past the mean), or the whole mean when its start is not
/// known. `None`: idle or unknown, or its lane's job time is not known.
pub fn expected_left(
    work: Option<&Work>,
    job_seconds: &BTreeMap<String, f64>,
    now: f64,
) -> Option<f64> {
    let Some(Work::Busy { lane, started }) = work else {
        return None;
    };
    let mean = lane
        .as_ref()
        .and_then(|lane| job_seconds.get(lane))
        .filter(|s| s.is_finite() && **s >= 0.0)?;
    let ran = started
        .filter(|s| s.is_finite())
        .map_or(0.0, |s| (now - s).max(0.0));
    Some((mean - ran).max(0.0))
}

/// A worker's deletion cost: [`IDLE_COST`] idle or unknown; busy, 1 + the time its job should
/// still run in milliseconds (see [`expected_left`]: a worker 20 ms from done goes before one
/// 3 s from done), or [`BUSY_COST`] when its lane's job time is not known.
pub fn cost(work: Option<&Work>, job_seconds: &BTreeMap<String, f64>, now: f64) -> i32 {
    match work {
        None | Some(Work::Idle) => IDLE_COST,
        Some(Work::Busy { .. }) => expected_left(work, job_seconds, now)
            .map_or(BUSY_COST, |left| {
                (1.0 + left * 1000.0).min(f64::from(MAX_COST)) as i32
            }),
    }
}

/// The Pods whose annotation must change, with their new cost (see [`cost`]; [`DRAINED_COST`]
/// for the `drained` ones). `pods` are (name, the annotation now).
pub fn cost_changes(
    pods: &[(String, Option<String>)],
    work: &HashMap<String, Work>,
    job_seconds: &BTreeMap<String, f64>,
    drained: &BTreeSet<String>,
    now: f64,
) -> Vec<(String, i32)> {
    pods.iter()
        .filter_map(|(name, current)| {
            let cost = if drained.contains(name) {
                DRAINED_COST
            } else {
                cost(work.get(name), job_seconds, now)
            };
            let unchanged = current.as_deref().and_then(|v| v.parse::<i32>().ok()) == Some(cost)
                || (current.is_none() && cost == IDLE_COST);
            (!unchanged).then(|| (name.clone(), cost))
        })
        .collect()
}

/// What the pool's workers are doing, read just now.
#[derive(Clone, Debug, Default, PartialEq)]
pub(crate) struct Reading {
    pub(crate) work: HashMap<String, Work>,
    /// Every lane's mean job time.
    pub(crate) job_seconds: BTreeMap<String, f64>,
    /// Unix seconds when read.
    pub(crate) now: f64,
    /// The workers that answered themselves, by Pod name.
    pub(crate) heard: HashSet<String>,
    /// Whether Prometheus said which workers are busy: `None` when it was not asked.
    pub(crate) scraped: Option<bool>,
}

impl Reading {
    /// A Pod's cost (see [`cost`]).
    pub(crate) fn cost(&self, pod: &str) -> i32 {
        cost(self.work.get(pod), &self.job_seconds, self.now)
    }

    /// Whether it says anything of `live`: one of them answered, or Prometheus did, or there
    /// is no one to say anything of.
    pub(crate) fn knows<'a>(&self, live: impl Iterator<Item = &'a str>) -> bool {
        let mut live = live.peekable();
        live.peek().is_none()
            || self.scraped == Some(true)
            || live.any(|name| self.heard.contains(name))
    }
}

#[cfg(test)]
pub(in crate::controller) mod tests {
    use super::*;

    /// One gauge series of `pod` (and `lane`, unless empty).
    pub(in crate::controller) fn series(pod: &str, lane: &str, value: f64) -> Labelled {
        let mut labels = BTreeMap::from([("pod".to_string(), pod.to_string())]);
        if !lane.is_empty() {
            labels.insert("lane".into(), lane.into());
        }
        (labels, value)
    }

    const NOW: f64 = 1_800_000_000.0;

    #[test]
    fn idle_workers_cost_least_and_busy_ones_by_their_lanes_job_time() {
        let work = busy_pods(
            &[
                series("batch", "batch", 1.0),
                series("urgent", "urgent", 1.0),
                series("nameless", "", 1.0),
                series("idle", "", 0.0),
                series("nan", "", f64::NAN),
                // The lane changed between scrapes: the busy series wins.
                series("moved", "", 0.0),
                series("moved", "batch", 1.0),
            ],
            &[],
        );
        assert_eq!(work.get("nan"), None, "NaN says nothing");
        let times = BTreeMap::from([("urgent".to_string(), 0.02), ("batch".to_string(), 3.0)]);
        let cost_of = |pod: &str| cost(work.get(pod), &times, NOW);
        assert_eq!(cost_of("idle"), IDLE_COST);
        assert_eq!(cost_of("nan"), IDLE_COST);
        assert_eq!(cost_of("urgent"), 21);
        assert_eq!(cost_of("batch"), 3001);
        assert_eq!(cost_of("moved"), 3001);
        assert_eq!(cost_of("nameless"), BUSY_COST);
        assert!(IDLE_COST < cost_of("urgent") && cost_of("urgent") < cost_of("batch"));
    }

    #[test]
    fn busy_workers_go_by_the_time_their_jobs_have_left() {
        let work = busy_pods(
            &[
                series("fresh", "batch", 1.0),
                series("halfway", "batch", 1.0),
                series("overdue", "batch", 1.0),
                series("unstarted", "batch", 1.0),
                series("other-lane", "batch", 1.0),
                series("idle", "", 0.0),
            ],
            &[
                series("fresh", "batch", NOW - 0.5),
                // Two start times (a scrape before and after a new job): the latest counts.
                series("halfway", "batch", NOW - 2.5),
                series("halfway", "batch", NOW - 1.5),
                series("overdue", "batch", NOW - 7.0),
                // A start time of another lane's job belongs to another series.
                series("other-lane", "urgent", NOW - 2.9),
                // An idle worker's stale start time says nothing.
                series("idle", "batch", NOW - 2.9),
            ],
        );
        let times = BTreeMap::from([("batch".to_string(), 3.0)]);
        let left = |pod: &str| expected_left(work.get(pod), &times, NOW);
        assert_eq!(left("fresh"), Some(2.5));
        assert_eq!(left("halfway"), Some(1.5));
        assert_eq!(left("overdue"), Some(0.0));
        assert_eq!(left("unstarted"), Some(3.0));
        assert_eq!(left("other-lane"), Some(3.0));
        assert_eq!(left("idle"), None);
        let cost_of = |pod: &str| cost(work.get(pod), &times, NOW);
        assert_eq!(cost_of("overdue"), 1);
        assert_eq!(cost_of("halfway"), 1501);
        assert!(cost_of("idle") < cost_of("overdue"));
        assert!(cost_of("overdue") < cost_of("halfway"));
        assert!(cost_of("halfway") < cost_of("fresh"));
        assert!(cost_of("fresh") < cost_of("unstarted"));
        // A clock behind the worker's: the job has run no time, never a negative one.
        assert_eq!(
            expected_left(work.get("fresh"), &times, NOW - 60.0),
            Some(3.0)
        );
    }

    #[test]
    fn only_changed_costs_are_written() {
        let work = busy_pods(
            &[
                series("a", "", 1.0),
                series("b", "", 0.0),
                series("e", "", 0.0),
            ],
            &[],
        );
        let pods = [
            ("a".to_string(), None),                        // busy, unmarked: write
            ("b".to_string(), Some(BUSY_COST.to_string())), // idle now: lower it
            ("c".to_string(), None),                        // unknown, unmarked: leave
            ("d".to_string(), Some(BUSY_COST.to_string())), // gone from Prometheus: idle
            ("e".to_string(), Some("0".to_string())),       // idle and marked so: leave
        ];
        assert_eq!(
            cost_changes(&pods, &work, &BTreeMap::new(), &BTreeSet::new(), NOW),
            vec![
                ("a".to_string(), BUSY_COST),
                ("b".to_string(), IDLE_COST),
                ("d".to_string(), IDLE_COST)
            ]
        );
        // A drained worker goes before every idle one, even one not marked yet.
        let drained = BTreeSet::from(["c".to_string(), "e".to_string()]);
        assert_eq!(
            cost_changes(&pods, &work, &BTreeMap::new(), &drained, NOW),
            vec![
                ("a".to_string(), BUSY_COST),
                ("b".to_string(), IDLE_COST),
                ("c".to_string(), DRAINED_COST),
                ("d".to_string(), IDLE_COST),
                ("e".to_string(), DRAINED_COST)
            ]
        );
        const { assert!(DRAINED_COST < IDLE_COST) };
    }
}
