//! What a pool remembers of its workers' own counts between evaluations, without I/O: each
//! read's answers become per-lane reads of what finished since the read before (see
//! [`crate::sizing::LaneReads`]), and only this evaluation's read, when it counted every ready
//! worker, is applied to the loads. The asking is done by `observe/reads.rs`.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use k8s_openapi::jiff::Timestamp;

use crate::sizing::{
    Baselines, LaneReads, Loads, ReadCounts, WorkerCount, baselines, finished_since, median_depth,
    went_unread,
};

/// What a pool remembers of its reads between evaluations.
#[derive(Clone, Debug, Default, PartialEq)]
pub(in crate::controller) struct WorkerReads {
    baselines: Baselines,
    /// When the last read was made, once its answers were in: on the operator's clock (what the
    /// rates are counted over) and the wall clock (Pods' start times are wall-clock times).
    last: Option<(Duration, Timestamp)>,
    lanes: BTreeMap<String, LaneReads>,
    /// Each lane's queue depth at the last read, as its workers saw it (see [`median_depth`]).
    depths: BTreeMap<String, f64>,
    /// When this evaluation's read was recorded; `None` when it was not (the workers could not
    /// be listed, none answered, one did not, one read last time is gone): then the last read
    /// that was a rate may stand in (see [`Self::apply_to`]).
    current: Option<Duration>,
    /// The workers whose implausible claims were logged (once each), among those last read.
    logged: BTreeSet<String>,
    /// Reads made before the first that was a rate (a new pool's, or this process's first).
    unrated: u32,
}

/// How soon a pool is read again while its first rate is awaited: a new pool whose lanes
/// Prometheus has no series of yet is measured by its reads alone, and each second saved is one
/// its urgent jobs do not queue behind a reserve at its minimum.
pub(in crate::controller) const FIRST_RATE_READS: Duration = Duration::from_secs(2);
/// The most reads made that soon: a pool whose reads never make a rate (a worker that never
/// answers) is read at its interval after these.
const MOST_FIRST_RATE_READS: u32 = 10;

/// One read's answers, as they came in.
#[derive(Clone, Debug, PartialEq)]
pub(in crate::controller) struct CountsRead {
    pub(in crate::controller) answers: Vec<WorkerCount>,
    /// The ready workers, by name: each must answer for the read to be a rate.
    pub(in crate::controller) expected: BTreeSet<String>,
    pub(in crate::controller) lanes: Vec<String>,
    /// When the answers were in (the operator's clock), and the wall clock when asked.
    pub(in crate::controller) at: Duration,
    pub(in crate::controller) wall: Timestamp,
}

/// An answer dropped: a worker claimed more finished jobs of `lane` than it could have run.
#[derive(Clone, Debug, PartialEq)]
pub(in crate::controller) struct Implausible {
    pub(in crate::controller) worker: String,
    pub(in crate::controller) lane: String,
    pub(in crate::controller) claimed: f64,
    pub(in crate::controller) most: f64,
    /// Not logged before for this worker.
    pub(in crate::controller) first: bool,
}

impl WorkerReads {
    /// When the last read was asked, on the wall clock: a worker started since has counted
    /// from zero since.
    pub(in crate::controller) fn last_asked(&self) -> Option<Timestamp> {
        self.last.map(|(_, wall)| wall)
    }

    /// Whether the workers were read and no read was a rate yet (within the first
    /// [`MOST_FIRST_RATE_READS`]): the pool is then read again after [`FIRST_RATE_READS`], not
    /// its interval.
    pub(in crate::controller) fn awaiting_first_rate(&self) -> bool {
        self.last.is_some() && self.lanes.is_empty() && self.unrated < MOST_FIRST_RATE_READS
    }

    /// Records, per lane, what the workers finished since the last read, with the lanes' mean
    /// `job_seconds` as measured; returns the answers dropped as implausible (see
    /// [`WorkerCount::implausible`]: a read that needed one is not a rate). Without `answers`
    /// this evaluation has no read, and none is applied.
    pub(in crate::controller) fn record(
        &mut self,
        answers: Option<CountsRead>,
        job_seconds: &BTreeMap<String, f64>,
        window: Duration,
    ) -> Vec<Implausible> {
        self.current = None;
        // Every evaluation since the first read counts, one with no answers too: a pool whose
        // workers all went quiet is not read soon forever.
        if self.last.is_some() && self.lanes.is_empty() {
            self.unrated = self.unrated.saturating_add(1);
        }
        let Some(CountsRead {
            answers,
            expected,
            lanes,
            at,
            wall,
        }) = answers
        else {
            return Vec::new();
        };
        let mut dropped = Vec::new();
        let plausible: Vec<WorkerCount> = match self.last {
            Some((since, _)) => answers
                .iter()
                .filter(|answer| {
                    let span = at.saturating_sub(since);
                    let Some((lane, claimed, most)) =
                        answer.implausible(&self.baselines, span, job_seconds)
                    else {
                        return true;
                    };
                    dropped.push(Implausible {
                        worker: answer.worker.clone(),
                        lane,
                        claimed,
                        most,
                        first: self.logged.insert(answer.worker.clone()),
                    });
                    false
                })
                .cloned()
                .collect(),
            None => answers.clone(),
        };
        let complete = finished_since(&self.baselines, &plausible, &expected)
            .filter(|_| !went_unread(&self.baselines, &answers));
        let depths: BTreeMap<String, f64> = lanes
            .iter()
            .filter_map(|lane| Some((lane.clone(), median_depth(&answers, lane)?)))
            .collect();
        if let (Some((since, _)), Some(counted)) = (self.last, complete) {
            for lane in lanes {
                let finished = counted.finished.get(&lane).copied().unwrap_or(0.0);
                // A queue that grew took jobs that arrived; one that shrank, jobs that had.
                let grew = match (self.depths.get(&lane), depths.get(&lane)) {
                    (Some(before), Some(now)) => now - before,
                    _ => 0.0,
                };
                let counts = ReadCounts {
                    finished,
                    arrived: (finished + grew).max(0.0),
                    seconds: counted.seconds.get(&lane).copied().unwrap_or(0.0),
                };
                self.lanes
                    .entry(lane)
                    .or_default()
                    .record(since, at, counts, window);
            }
            self.current = Some(at);
        }
        self.depths = depths;
        // Every answer is the next read's baseline, a dropped claim too: a worker that jumped
        // once is read again from there; one that keeps inflating is dropped every time.
        self.baselines = baselines(&answers);
        self.logged
            .retain(|w| expected.contains(w) || answers.iter().any(|a| a.worker == *w));
        self.last = Some((at, wall));
        dropped
    }

    /// Gives each lane the rates this evaluation's read supports, or without one the last read
    /// that was a rate while it is younger than `prometheus_lag` (a scrape interval; see
    /// [`LaneReads::applied_to`]); older than that, every lane keeps Prometheus's. A lane
    /// Prometheus has no series of yet (`unseen`, with its `jobTime.fallback`) is measured by
    /// the reads alone when they can say (see [`LaneReads::alone`]): a new pool's workers are
    /// read seconds after they start, and scraped twice only a scrape interval or two later.
    pub(in crate::controller) fn apply_to(
        &self,
        loads: &mut Loads,
        window: Duration,
        (now, prometheus_lag): (Duration, Duration),
        unseen: &BTreeMap<String, Option<f64>>,
    ) {
        // This evaluation's read is current however long its answers took.
        let now = self.current.unwrap_or(now);
        for (lane, reads) in &self.lanes {
            match loads.get_mut(lane) {
                Some(Ok(load)) => *load = reads.applied_to(*load, now, window, prometheus_lag),
                Some(load @ Err(_)) => {
                    let alone = unseen
                        .get(lane)
                        .and_then(|fallback| reads.alone(now, window, prometheus_lag, *fallback));
                    if let Some(alone) = alone {
                        *load = Ok(alone);
                    }
                }
                None => {}
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const S: Duration = Duration::from_secs(1);

    fn answers(at: Duration, counts: &[(&str, f64)], expected: &[&str]) -> Option<CountsRead> {
        Some(CountsRead {
            answers: counts
                .iter()
                .map(|(worker, urgent)| WorkerCount {
                    worker: worker.to_string(),
                    started_since: false,
                    finished: BTreeMap::from([("urgent".to_string(), *urgent)]),
                    ..WorkerCount::default()
                })
                .collect(),
            expected: expected.iter().map(|w| w.to_string()).collect(),
            lanes: vec!["urgent".into()],
            at,
            wall: Timestamp::UNIX_EPOCH,
        })
    }

    fn prometheus_says() -> Loads {
        Loads::from([(
            "urgent".to_string(),
            Ok(crate::sizing::LaneLoad {
                arrival_rate: 30.0,
                recent_arrival_rate: None,
                job_seconds: Some(0.02),
            }),
        )])
    }

    /// The loads at the last read's time, or 1 s after `reads.record(None, ..)`'s.
    fn applied(reads: &WorkerReads) -> Loads {
        let now = reads.last.map_or(Duration::ZERO, |(at, _)| at) + S;
        applied_at(reads, now)
    }

    /// The loads at `now`, Prometheus's recent rate spanning 15 s.
    fn applied_at(reads: &WorkerReads, now: Duration) -> Loads {
        let mut loads = prometheus_says();
        reads.apply_to(&mut loads, 60 * S, (now, 15 * S), &BTreeMap::new());
        loads
    }

    #[test]
    fn a_lane_prometheus_has_no_series_of_is_measured_by_the_reads_alone() {
        let job = BTreeMap::new();
        let depth = |at: Duration, finished: f64, depth: f64| {
            let mut read = answers(at, &[("a", finished)], &["a"]);
            if let Some(read) = &mut read {
                read.answers[0].depth = BTreeMap::from([("urgent".to_string(), depth)]);
                read.answers[0].seconds = BTreeMap::from([("urgent".to_string(), finished * 0.05)]);
            }
            read
        };
        let mut reads = WorkerReads::default();
        reads.record(depth(5 * S, 100.0, 3.0), &job, 60 * S);
        // 5 s: 40 finished and the queue grew 3 → 13: 50 arrived, 10/s of 50 ms jobs.
        reads.record(depth(10 * S, 140.0, 13.0), &job, 60 * S);
        let unmeasured = || -> Loads { Loads::from([("urgent".to_string(), Err("none".into()))]) };
        let unseen = BTreeMap::from([("urgent".to_string(), None)]);
        let mut loads = unmeasured();
        reads.apply_to(&mut loads, 60 * S, (11 * S, 15 * S), &unseen);
        let load = loads["urgent"].clone().expect("the reads alone measure it");
        assert_eq!(load.arrival_rate, 10.0);
        assert!((load.job_seconds.unwrap_or_default() - 0.05).abs() < 1e-9);
        // Prometheus down (not "no series"): unknown, the reads never stand for it.
        let mut loads = unmeasured();
        reads.apply_to(&mut loads, 60 * S, (11 * S, 15 * S), &BTreeMap::new());
        assert!(loads["urgent"].is_err());
        // A queue that shrank counts as jobs that had arrived before: 40 finished, 13 → 3: 30.
        reads.record(depth(15 * S, 180.0, 3.0), &job, 60 * S);
        let mut loads = prometheus_says();
        reads.apply_to(&mut loads, 60 * S, (15 * S, 15 * S), &unseen);
        let recent = loads["urgent"]
            .clone()
            .ok()
            .and_then(|l| l.recent_arrival_rate);
        assert_eq!(recent.map(|r| r.per_second), Some(6.0));
    }

    #[test]
    fn a_pool_is_read_soon_until_its_first_rate_and_not_forever() {
        let job = BTreeMap::new();
        let mut reads = WorkerReads::default();
        assert!(!reads.awaiting_first_rate(), "never read: nothing to await");
        reads.record(answers(5 * S, &[("a", 10.0)], &["a"]), &job, 60 * S);
        assert!(reads.awaiting_first_rate(), "a baseline only");
        reads.record(answers(7 * S, &[("a", 12.0)], &["a"]), &job, 60 * S);
        assert!(!reads.awaiting_first_rate(), "a rate");
        // Reads that never count every worker (b never answers), or no answers at all: soon
        // after the first read for ten evaluations, then at the interval.
        let mut stuck = WorkerReads::default();
        for i in 0..=10u32 {
            assert_eq!(stuck.awaiting_first_rate(), i > 0, "evaluation {i}");
            let read = (i % 2 == 0).then(|| answers(i * 2 * S, &[("a", 1.0)], &["a", "b"]));
            stuck.record(read.flatten(), &job, 60 * S);
        }
        assert!(!stuck.awaiting_first_rate());
    }

    #[test]
    fn a_failed_read_applies_nothing_and_prometheus_decides() {
        let job = BTreeMap::from([("urgent".to_string(), 0.02)]);
        let mut reads = WorkerReads::default();
        reads.record(answers(5 * S, &[("a", 100.0)], &["a"]), &job, 60 * S);
        assert_eq!(
            applied(&reads),
            prometheus_says(),
            "a first read sets baselines"
        );
        reads.record(answers(10 * S, &[("a", 850.0)], &["a"]), &job, 60 * S);
        let fresh = applied(&reads);
        let recent = |loads: &Loads| {
            loads["urgent"]
                .as_ref()
                .ok()
                .and_then(|l| l.recent_arrival_rate)
                .map(|r| r.per_second)
        };
        assert_eq!(recent(&fresh), Some(150.0), "750 jobs in 5 s");
        // The Pod list failed, or no worker answered: the read at 10 s stands in for this one
        // while it is fresher than Prometheus's recent rate, and no longer.
        reads.record(None, &job, 60 * S);
        assert_eq!(recent(&applied_at(&reads, 24 * S)), Some(150.0));
        assert_eq!(applied_at(&reads, 25 * S), prometheus_says());
        // A read that misses a ready worker, by name, is no rate either.
        reads.record(answers(26 * S, &[("a", 2000.0)], &["a", "b"]), &job, 60 * S);
        assert_eq!(applied(&reads), prometheus_says());
        // b answers for the first time, running before: a baseline only, still no rate.
        reads.record(
            answers(31 * S, &[("a", 2100.0), ("b", 0.0)], &["a", "b"]),
            &job,
            60 * S,
        );
        assert_eq!(applied(&reads), prometheus_says());
        // The next complete read is current again: a's 100 and b's 5 in 5 s.
        reads.record(
            answers(36 * S, &[("a", 2200.0), ("b", 5.0)], &["a", "b"]),
            &job,
            60 * S,
        );
        assert_eq!(recent(&applied(&reads)), Some(21.0));
    }

    #[test]
    fn an_implausible_claim_is_dropped_and_logged_once() {
        let job = BTreeMap::from([("urgent".to_string(), 0.02)]);
        let mut reads = WorkerReads::default();
        let both = ["a", "liar"];
        reads.record(
            answers(5 * S, &[("a", 0.0), ("liar", 0.0)], &both),
            &job,
            60 * S,
        );
        let dropped = reads.record(
            answers(10 * S, &[("a", 150.0), ("liar", 1e6)], &both),
            &job,
            60 * S,
        );
        assert_eq!(dropped.len(), 1);
        assert_eq!(
            (dropped[0].worker.as_str(), dropped[0].first),
            ("liar", true)
        );
        assert_eq!(dropped[0].most, 2501.0);
        assert_eq!(
            applied(&reads),
            prometheus_says(),
            "the liar is a ready worker: no rate"
        );
        let again = reads.record(
            answers(15 * S, &[("a", 300.0), ("liar", 2e6)], &both),
            &job,
            60 * S,
        );
        assert_eq!(again.len(), 1);
        assert!(!again[0].first, "logged once");
        // A liar that is not a ready worker (not needed for the read): the rest is a rate.
        let only_a = ["a"];
        let third = reads.record(
            answers(20 * S, &[("a", 450.0), ("liar", 3e6)], &only_a),
            &job,
            60 * S,
        );
        assert_eq!(third.len(), 1);
        let loads = applied(&reads);
        let recent = loads["urgent"]
            .as_ref()
            .ok()
            .and_then(|l| l.recent_arrival_rate);
        assert_eq!(
            recent.map(|r| r.per_second),
            Some(30.0),
            "a's 150 in 5 s only"
        );
    }

    #[test]
    fn a_read_after_a_worker_went_is_no_rate_and_the_next_one_is() {
        let job = BTreeMap::from([("urgent".to_string(), 0.020)]);
        let mut reads = WorkerReads::default();
        let both = ["a", "b"];
        reads.record(
            answers(5 * S, &[("a", 0.0), ("b", 0.0)], &both),
            &job,
            60 * S,
        );
        reads.record(
            answers(10 * S, &[("a", 50.0), ("b", 50.0)], &both),
            &job,
            60 * S,
        );
        // b's Pod went after the read at 10 s, with whatever it finished since: a's 50 alone
        // would say 10/s where 20/s arrive.
        let only_a = ["a"];
        reads.record(answers(15 * S, &[("a", 100.0)], &only_a), &job, 60 * S);
        let recent = |loads: Loads| {
            let load = loads["urgent"].as_ref().ok().copied();
            load.and_then(|l| l.recent_arrival_rate)
                .map(|r| (r.per_second, r.window))
        };
        assert_eq!(
            recent(applied_at(&reads, 15 * S)),
            Some((20.0, 5 * S)),
            "no rate without b: the read at 10 s stands in, not a's 10/s"
        );
        reads.record(answers(20 * S, &[("a", 200.0)], &only_a), &job, 60 * S);
        assert_eq!(
            recent(applied_at(&reads, 20 * S)),
            Some((20.0, 5 * S)),
            "a's 100 in 5 s"
        );
    }
}
