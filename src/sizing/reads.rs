//! Arrival rates read from the workers themselves. Each evaluation the operator asks every
//! worker for its own count of finished jobs per lane (`lanepool_job_duration_seconds_count`)
//! and adds up what each finished since the read before. No scrape stands between a job and the
//! count, so the rate is a read old, not a scrape interval plus a scrape's age: a spike is seen
//! in seconds. Pure: the controller and the simulator keep one [`LaneReads`] per reserve lane.
//! A read that could not count every worker (one gone since the last read too) is never
//! recorded as a lower rate.

use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::time::Duration;

use super::decide::{LaneLoad, RecentRate};

/// One read: the jobs the workers finished since the read before.
#[derive(Clone, Copy, Debug, PartialEq)]
struct Read {
    at: Duration,
    since: Duration,
    counted: ReadCounts,
}

/// What one read counted of a lane since the read before.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct ReadCounts {
    /// Jobs the workers finished.
    pub finished: f64,
    /// Jobs that arrived: those finished plus how much the lane's queue grew (the workers'
    /// `lanepool_queue_depth`), so a queue building in a spike counts; the finished ones when
    /// the depth is not known at both reads.
    pub arrived: f64,
    /// Seconds the finished jobs ran (their histogram's `_sum`); 0 when not exported.
    pub seconds: f64,
}

impl ReadCounts {
    /// `finished` jobs, the queue's depth unknown and no job time counted.
    pub fn finished(finished: f64) -> Self {
        Self {
            finished,
            arrived: finished,
            seconds: 0.0,
        }
    }
}

/// A lane's recorded reads, the newest last, none older than the longest window asked for.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct LaneReads {
    reads: VecDeque<Read>,
}

impl LaneReads {
    /// Records what a read counted of the lane between `since` and `at`. Reads older than
    /// `keep` are forgotten.
    pub fn record(&mut self, since: Duration, at: Duration, counted: ReadCounts, keep: Duration) {
        let counts = [counted.finished, counted.arrived, counted.seconds];
        if at <= since || counts.iter().any(|c| !c.is_finite() || *c < 0.0) {
            return;
        }
        self.reads.push_back(Read {
            at,
            since: at - since,
            counted,
        });
        while self
            .reads
            .front()
            .is_some_and(|r| at.saturating_sub(r.at) > keep)
        {
            self.reads.pop_front();
        }
    }

    /// The rate of the read made at `now`, over the time it spans; `None` when no read was
    /// recorded at `now` (it could not count every worker).
    pub fn recent(&self, now: Duration) -> Option<RecentRate> {
        let last = self.reads.back().filter(|r| r.at == now)?;
        Some(RecentRate {
            per_second: last.counted.arrived / last.since.as_secs_f64(),
            window: last.since,
        })
    }

    /// Jobs per second over the reads that end inside the trailing `window`; `None` until they
    /// cover at least half of it (a gap, such as a read that could not count every worker, only
    /// shortens the time counted over).
    pub fn rate(&self, now: Duration, window: Duration) -> Option<f64> {
        let (arrived, covered) = self
            .reads
            .iter()
            .filter(|r| r.at <= now && now - r.at < window)
            .fold((0.0, Duration::ZERO), |(a, c), r| {
                (a + r.counted.arrived, c + r.since)
            });
        (!covered.is_zero() && covered >= window / 2).then(|| arrived / covered.as_secs_f64())
    }

    /// The mean seconds of the jobs finished in the reads that end inside the trailing
    /// `window`; `None` when none finished or their seconds were not exported.
    pub fn job_seconds(&self, now: Duration, window: Duration) -> Option<f64> {
        let (finished, seconds) = self
            .reads
            .iter()
            .filter(|r| r.at <= now && now - r.at < window)
            .fold((0.0, 0.0), |(f, s), r| {
                (f + r.counted.finished, s + r.counted.seconds)
            });
        (finished > 0.0 && seconds > 0.0).then(|| seconds / finished)
    }

    /// A load from these reads alone, for a lane Prometheus has no series of yet (a new pool's
    /// workers not scraped twice): the read made at `now` (or the last one, younger than
    /// `stand_in_for`) as the recent rate, the long rate once the reads cover half of `window`
    /// (the recent one until then), and the job time the reads counted or else `fallback`.
    /// `None` when the reads cannot say: no read that is a rate, or jobs arriving and no job
    /// time known.
    pub fn alone(
        &self,
        now: Duration,
        window: Duration,
        stand_in_for: Duration,
        fallback: Option<f64>,
    ) -> Option<LaneLoad> {
        let at = self.standing(now, stand_in_for)?;
        let recent = self.recent(at)?;
        let arrival_rate = self.rate(at, window).unwrap_or(recent.per_second);
        let job_seconds = self.job_seconds(at, window).or(fallback);
        if job_seconds.is_none() && arrival_rate > 0.0 {
            return None;
        }
        Some(LaneLoad {
            arrival_rate,
            recent_arrival_rate: Some(recent),
            job_seconds,
        })
    }

    /// `load` with the rates these reads give at `now`: the recent rate from the read made now,
    /// the long rate once the reads cover `window`. Without a read made now (it could not count
    /// every worker), the last one stands in, with the long rate up to it, while it is younger
    /// than `stand_in_for`: Prometheus's recent rate spans the last scrape interval and is up to
    /// one old, so a read younger than that says more of now (on real RQ workers Prometheus's
    /// rate shrank a spike's reserve 4 → 3 mid-spike on the rate from before it). What the reads
    /// cannot say, Prometheus does.
    pub fn applied_to(
        &self,
        mut load: LaneLoad,
        now: Duration,
        window: Duration,
        stand_in_for: Duration,
    ) -> LaneLoad {
        let Some(at) = self.standing(now, stand_in_for) else {
            return load;
        };
        if let Some(recent) = self.recent(at) {
            load.recent_arrival_rate = Some(recent);
            if let Some(rate) = self.rate(at, window) {
                load.arrival_rate = rate;
            }
        }
        load
    }

    /// When the read that speaks for `now` was made: the one made now, or else the last one
    /// while it is younger than `stand_in_for`.
    fn standing(&self, now: Duration, stand_in_for: Duration) -> Option<Duration> {
        self.reads
            .back()
            .map(|r| r.at)
            .filter(|&at| at == now || now.saturating_sub(at) < stand_in_for)
    }
}

/// One worker's answer: its finished-job count per lane, the seconds those jobs ran and the
/// depth it sees of each lane's queue.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct WorkerCount {
    pub worker: String,
    /// Whether its counters started after the read before (its process is younger): then its
    /// whole count is new. Otherwise a worker never read before only sets a baseline.
    pub started_since: bool,
    pub finished: BTreeMap<String, f64>,
    /// `lanepool_job_duration_seconds_sum` by lane: a counter, as `finished` is.
    pub seconds: BTreeMap<String, f64>,
    /// `lanepool_queue_depth` by lane: a gauge, the lane's queue as this worker last saw it.
    pub depth: BTreeMap<String, f64>,
}

/// One worker's counters at a read.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Counters {
    pub finished: BTreeMap<String, f64>,
    pub seconds: BTreeMap<String, f64>,
}

/// Each worker's counters at the last read.
pub type Baselines = BTreeMap<String, Counters>;

/// The shortest job a worker is believed to finish: whatever its lane, no worker finishes more
/// than a thousand jobs a second.
pub const SHORTEST_JOB_SECONDS: f64 = 0.001;
/// How much shorter than its lane's mean job time a worker's jobs may be, on average over a read.
pub const JOB_TIME_SLACK: f64 = 10.0;

/// The jobs of `lane` a worker finished since its baseline (see [`finished_since`]).
fn new_jobs(
    before: Option<&BTreeMap<String, f64>>,
    started_since: bool,
    lane: &str,
    count: f64,
) -> f64 {
    match before.and_then(|b| b.get(lane)) {
        Some(previous) if count >= *previous => count - previous,
        Some(_) => count,
        None if before.is_some() || started_since => count,
        None => 0.0,
    }
}

impl WorkerCount {
    /// The most jobs of a lane one worker can have finished in `span`: a worker runs one job at a
    /// time, none shorter than a [`JOB_TIME_SLACK`]th of the lane's mean job time (when measured)
    /// nor than [`SHORTEST_JOB_SECONDS`]; one more for a job that ended as the span began.
    pub fn most_finished(span: Duration, mean_job_seconds: Option<f64>) -> f64 {
        let shortest = mean_job_seconds
            .filter(|s| s.is_finite() && *s > 0.0)
            .map_or(SHORTEST_JOB_SECONDS, |s| {
                (s / JOB_TIME_SLACK).max(SHORTEST_JOB_SECONDS)
            });
        span.as_secs_f64() / shortest + 1.0
    }

    /// A claim this worker could not have made honestly: the first lane whose jobs finished since
    /// `baselines` are more than it could have run in `span` (see [`Self::most_finished`]), with
    /// the claim and that most. Such an answer is dropped: it counts for nothing, and a read that
    /// needed it is not a rate.
    pub fn implausible(
        &self,
        baselines: &Baselines,
        span: Duration,
        job_seconds: &BTreeMap<String, f64>,
    ) -> Option<(String, f64, f64)> {
        let before = baselines.get(&self.worker).map(|b| &b.finished);
        self.finished.iter().find_map(|(lane, count)| {
            let claimed = new_jobs(before, self.started_since, lane, *count);
            let most = Self::most_finished(span, job_seconds.get(lane).copied());
            (claimed > most).then(|| (lane.clone(), claimed, most))
        })
    }
}

/// What the workers finished per lane since `baselines`, and the seconds those jobs ran, summed
/// over `answers`; `None` when the sum would miss some of it: a worker `expected` to answer (by
/// name: another's answer never stands in for it) did not, or one answered that has no baseline
/// and was running before. A count that went down is a restarted counter: its whole value is
/// new (as Prometheus's `rate()` reads a reset). A worker gone since the last read is
/// [`went_unread`]'s to tell.
pub fn finished_since(
    baselines: &Baselines,
    answers: &[WorkerCount],
    expected: &BTreeSet<String>,
) -> Option<Counters> {
    let mut since = Counters::default();
    let mut complete = expected
        .iter()
        .all(|name| answers.iter().any(|a| a.worker == *name));
    for answer in answers {
        let before = baselines.get(&answer.worker);
        if before.is_none() && !answer.started_since {
            complete = false;
        }
        for (lane, count) in &answer.finished {
            *since.finished.entry(lane.clone()).or_default() += new_jobs(
                before.map(|b| &b.finished),
                answer.started_since,
                lane,
                *count,
            );
        }
        for (lane, seconds) in &answer.seconds {
            *since.seconds.entry(lane.clone()).or_default() += new_jobs(
                before.map(|b| &b.seconds),
                answer.started_since,
                lane,
                *seconds,
            );
        }
    }
    complete.then_some(since)
}

/// The depth of `lane`'s queue the workers saw: the median of their answers (one worker's
/// claim never moves it alone); `None` when none said.
pub fn median_depth(answers: &[WorkerCount], lane: &str) -> Option<f64> {
    let mut depths: Vec<f64> = answers
        .iter()
        .filter_map(|a| a.depth.get(lane).copied())
        .filter(|d| d.is_finite() && *d >= 0.0)
        .collect();
    depths.sort_by(f64::total_cmp);
    let middle = depths.len() / 2;
    match depths.len() {
        0 => None,
        n if n % 2 == 1 => Some(depths[middle]),
        _ => Some((depths[middle - 1] + depths[middle]) / 2.0),
    }
}

/// Whether a worker the last read counted gave no answer now (its Pod gone or going): whatever
/// it finished since that read went with it, and a sum without it is a rate low by its share.
/// After a spike that was a reserve shrunk on a recent rate of 5.8/s while 14/s arrived; such a
/// read is no rate, as one missing a ready worker is not.
pub fn went_unread(baselines: &Baselines, answers: &[WorkerCount]) -> bool {
    baselines
        .keys()
        .any(|name| !answers.iter().any(|a| a.worker == *name))
}

/// The baselines the next read compares with: every worker that answered now.
pub fn baselines(answers: &[WorkerCount]) -> Baselines {
    answers
        .iter()
        .map(|a| {
            let counters = Counters {
                finished: a.finished.clone(),
                seconds: a.seconds.clone(),
            };
            (a.worker.clone(), counters)
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    const S: Duration = Duration::from_secs(1);

    fn answer(worker: &str, started_since: bool, urgent: f64) -> WorkerCount {
        WorkerCount {
            worker: worker.into(),
            started_since,
            finished: BTreeMap::from([("urgent".to_string(), urgent)]),
            ..WorkerCount::default()
        }
    }

    fn names(workers: &[&str]) -> BTreeSet<String> {
        workers.iter().map(|w| w.to_string()).collect()
    }

    #[test]
    fn the_recent_rate_is_the_read_made_now_and_the_long_rate_needs_half_its_window() {
        let mut reads = LaneReads::default();
        let minute = 60 * S;
        for i in 1..=6u32 {
            reads.record(
                (i - 1) * 5 * S,
                i * 5 * S,
                ReadCounts::finished(150.0),
                minute,
            );
        }
        assert_eq!(reads.recent(30 * S).map(|r| r.per_second), Some(30.0));
        assert_eq!(reads.recent(35 * S), None, "no read at 35 s");
        assert_eq!(reads.rate(30 * S, minute), Some(30.0), "30 s of 60 counted");
        assert_eq!(
            reads.rate(25 * S, minute),
            None,
            "25 s is under half the window"
        );
        reads.record(30 * S, 35 * S, ReadCounts::finished(750.0), minute);
        let long = reads.rate(35 * S, minute).unwrap_or_default();
        assert!((long - 1650.0 / 35.0).abs() < 1e-9, "{long}");
    }

    #[test]
    fn reads_older_than_kept_are_forgotten_and_bad_counts_never_recorded() {
        let mut reads = LaneReads::default();
        for i in 1..=40u32 {
            reads.record(
                (i - 1) * 5 * S,
                i * 5 * S,
                ReadCounts::finished(50.0),
                60 * S,
            );
        }
        assert!(reads.reads.len() <= 13, "{}", reads.reads.len());
        reads.record(200 * S, 205 * S, ReadCounts::finished(f64::NAN), 60 * S);
        reads.record(205 * S, 205 * S, ReadCounts::finished(10.0), 60 * S);
        reads.record(205 * S, 210 * S, ReadCounts::finished(-1.0), 60 * S);
        assert_eq!(reads.recent(210 * S), None);
        assert_eq!(reads.rate(200 * S, 60 * S), Some(10.0));
    }

    #[test]
    fn a_load_takes_the_reads_rates_only_when_a_read_was_made_now() {
        let prometheus = LaneLoad {
            arrival_rate: 30.0,
            recent_arrival_rate: None,
            job_seconds: Some(0.02),
        };
        let mut reads = LaneReads::default();
        reads.record(Duration::ZERO, 5 * S, ReadCounts::finished(750.0), 60 * S);
        let fresh = reads.applied_to(prometheus, 5 * S, 60 * S, Duration::ZERO);
        assert_eq!(fresh.recent_arrival_rate.map(|r| r.per_second), Some(150.0));
        assert_eq!(
            fresh.arrival_rate, 30.0,
            "5 s of reads say nothing of a minute"
        );
        assert_eq!(fresh.job_seconds, Some(0.02));
        assert_eq!(
            reads.applied_to(prometheus, 10 * S, 60 * S, Duration::ZERO),
            prometheus
        );
    }

    #[test]
    fn a_queue_that_grew_counts_as_arrivals_and_the_reads_alone_measure_a_lane() {
        let mut reads = LaneReads::default();
        let minute = 60 * S;
        // 5 s: 40 finished, the queue grew by 35: 75 arrived; the jobs ran 2 s in all.
        let counted = ReadCounts {
            finished: 40.0,
            arrived: 75.0,
            seconds: 2.0,
        };
        reads.record(Duration::ZERO, 5 * S, counted, minute);
        let alone = reads.alone(5 * S, minute, 15 * S, None);
        assert_eq!(
            alone,
            Some(LaneLoad {
                arrival_rate: 15.0,
                recent_arrival_rate: Some(RecentRate {
                    per_second: 15.0,
                    window: 5 * S
                }),
                job_seconds: Some(0.05),
            }),
            "5 s of reads: the recent rate stands for the long one, the jobs' own time"
        );
        // Younger than a scrape interval, the read stands in; older, it says nothing.
        assert_eq!(reads.alone(19 * S, minute, 15 * S, None), alone);
        assert_eq!(reads.alone(20 * S, minute, 15 * S, None), None);
        // No job time counted: the fallback, or nothing while jobs arrive.
        let mut untimed = LaneReads::default();
        untimed.record(Duration::ZERO, 5 * S, ReadCounts::finished(10.0), minute);
        assert_eq!(untimed.alone(5 * S, minute, 15 * S, None), None);
        let fallback = untimed.alone(5 * S, minute, 15 * S, Some(0.1));
        assert_eq!(fallback.and_then(|l| l.job_seconds), Some(0.1));
        let mut idle = LaneReads::default();
        idle.record(Duration::ZERO, 5 * S, ReadCounts::finished(0.0), minute);
        assert_eq!(
            idle.alone(5 * S, minute, 15 * S, None)
                .map(|l| l.arrival_rate),
            Some(0.0),
            "nothing arrives: no job time is needed"
        );
    }

    #[test]
    fn the_depth_is_the_workers_median_and_seconds_count_like_jobs() {
        let with_depth = |worker: &str, depth: f64| WorkerCount {
            worker: worker.into(),
            depth: BTreeMap::from([("urgent".to_string(), depth)]),
            ..WorkerCount::default()
        };
        let answers = [
            with_depth("a", 10.0),
            with_depth("b", 1e9),
            with_depth("c", 12.0),
        ];
        assert_eq!(
            median_depth(&answers, "urgent"),
            Some(12.0),
            "b alone moves nothing"
        );
        assert_eq!(median_depth(&answers[..2], "urgent"), Some(5e8 + 5.0));
        assert_eq!(median_depth(&answers, "batch"), None);
        assert_eq!(median_depth(&[with_depth("a", f64::NAN)], "urgent"), None);
        let timed = |seconds: f64| WorkerCount {
            worker: "a".into(),
            finished: BTreeMap::from([("urgent".to_string(), 10.0)]),
            seconds: BTreeMap::from([("urgent".to_string(), seconds)]),
            ..WorkerCount::default()
        };
        let base = baselines(&[timed(4.0)]);
        let since = finished_since(&base, &[timed(4.5)], &names(&["a"])).unwrap_or_default();
        assert_eq!(since.seconds.get("urgent"), Some(&0.5));
        let restarted = finished_since(&base, &[timed(1.0)], &names(&["a"])).unwrap_or_default();
        assert_eq!(
            restarted.seconds.get("urgent"),
            Some(&1.0),
            "a reset: all new"
        );
    }

    #[test]
    fn counts_are_summed_since_each_workers_baseline() {
        let first = [answer("a", false, 100.0), answer("b", false, 40.0)];
        assert_eq!(
            finished_since(&Baselines::new(), &first, &names(&["a", "b"])),
            None,
            "a first read only sets baselines"
        );
        let base = baselines(&first);
        let second = [
            answer("a", false, 130.0),
            answer("b", false, 5.0), // restarted: all 5 are new
            answer("c", true, 7.0),  // started since the last read
        ];
        let urgent = finished_since(&base, &second, &names(&["a", "b", "c"]))
            .and_then(|f| f.finished.get("urgent").copied());
        assert_eq!(urgent, Some(30.0 + 5.0 + 7.0));
    }

    #[test]
    fn a_worker_cannot_claim_more_jobs_than_it_could_have_run() {
        let base = baselines(&[answer("a", false, 100.0)]);
        let five = 5 * S;
        let urgent = BTreeMap::from([("urgent".to_string(), 0.020)]);
        // 20 ms jobs, ten times faster at most: 5 s / 2 ms + 1 = 2,501 in 5 s.
        assert_eq!(WorkerCount::most_finished(five, Some(0.020)), 2501.0);
        assert_eq!(
            answer("a", false, 100.0 + 2501.0).implausible(&base, five, &urgent),
            None
        );
        assert_eq!(
            answer("a", false, 100.0 + 1e6).implausible(&base, five, &urgent),
            Some(("urgent".to_string(), 1e6, 2501.0))
        );
        // No job time known (Prometheus down): no worker finishes over a thousand a second.
        assert_eq!(WorkerCount::most_finished(five, None), 5001.0);
        assert_eq!(WorkerCount::most_finished(five, Some(f64::NAN)), 5001.0);
        assert_eq!(WorkerCount::most_finished(five, Some(0.000_01)), 5001.0);
        let unknown = BTreeMap::new();
        assert!(
            answer("a", false, 100.0 + 6000.0)
                .implausible(&base, five, &unknown)
                .is_some()
        );
        // A restarted counter's whole count is new, and bounded the same way; a new worker's too.
        assert_eq!(
            answer("a", false, 50.0).implausible(&base, five, &urgent),
            None
        );
        assert!(
            answer("n", true, 1e6)
                .implausible(&base, five, &urgent)
                .is_some()
        );
        // A worker never read before and running before sets a baseline only: nothing claimed.
        assert_eq!(
            answer("m", false, 1e9).implausible(&base, five, &urgent),
            None
        );
    }

    #[test]
    fn a_read_missing_a_worker_is_not_a_rate() {
        let base = baselines(&[answer("a", false, 10.0), answer("b", false, 10.0)]);
        let both = names(&["a", "b"]);
        let only_a = [answer("a", false, 20.0)];
        assert_eq!(
            finished_since(&base, &only_a, &both),
            None,
            "b did not answer"
        );
        let stranger = [answer("a", false, 20.0), answer("d", false, 500.0)];
        assert_eq!(
            finished_since(&base, &stranger, &both),
            None,
            "d was running before and has no baseline"
        );
        // Two answers for two ready workers, but one of them is not b's (a worker that is not
        // ready, started since): b is still missing.
        let not_b = [answer("a", false, 20.0), answer("e", true, 3.0)];
        assert_eq!(
            finished_since(&base, &not_b, &both),
            None,
            "b did not answer"
        );
        let with_b = [answer("a", false, 20.0), answer("b", false, 15.0)];
        assert_eq!(
            finished_since(&base, &with_b, &both).and_then(|f| f.finished.get("urgent").copied()),
            Some(15.0)
        );
    }

    #[test]
    fn a_read_without_a_worker_read_last_time_is_not_a_rate() {
        // b answered the last read, then its Pod went (a shrink, a rollover): no one expects it
        // now, yet what it finished since that read is not in a's count.
        let base = baselines(&[answer("a", false, 10.0), answer("b", false, 10.0)]);
        let only_a = [answer("a", false, 20.0)];
        assert!(went_unread(&base, &only_a));
        // A new worker answering beside a does not stand in for b.
        assert!(went_unread(
            &base,
            &[answer("a", false, 20.0), answer("c", true, 4.0)]
        ));
        assert!(!went_unread(
            &base,
            &[answer("b", false, 11.0), answer("a", false, 20.0)]
        ));
        // The next read counts again, from a's answer.
        assert!(!went_unread(
            &baselines(&only_a),
            &[answer("a", false, 26.0)]
        ));
    }
}
