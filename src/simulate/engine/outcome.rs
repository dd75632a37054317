//! What a run produced: every urgent latency in completion order, batch completions, per-window
//! counts and the reserve over time; and the figures read from them (nearest-rank percentiles,
//! throughput). Only completions inside the run's duration are here.

use super::scenario::{Nanos, seconds};

/// Counts inside one time-series window.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct WindowCounts {
    pub urgent_submitted: u64,
    pub urgent_completed: u64,
    pub batch_completed: u64,
}

#[derive(Clone, Debug, Default)]
pub struct Outcome {
    pub duration: Nanos,
    pub window: Nanos,
    pub urgent_submitted: u64,
    /// Submission to completion, in completion order.
    pub urgent_latencies: Vec<Nanos>,
    /// When each of `urgent_latencies`' jobs was submitted, in the same order.
    pub urgent_submissions: Vec<Nanos>,
    /// Jobs still running when their worker's grace period ended after its Pod was deleted.
    pub cut_short: u64,
    /// The Pods' lifetimes over the run, in worker-seconds: what the cluster paid.
    pub worker_seconds: f64,
    /// Of those, the seconds workers spent on batch jobs.
    pub batch_busy_seconds: f64,
    pub batch_completed: u64,
    pub windows: Vec<WindowCounts>,
    /// (from, reserve): the reserve in effect from each moment on.
    pub reserve_steps: Vec<(Nanos, u32)>,
    /// Whether the reserve was decided in the loop (autoscale) rather than fixed.
    pub autoscaled: bool,
    /// The fewest workers taking jobs (ready, not draining) after any of the operator's
    /// reconciles: what a rollout left serving at its lowest. `None` without the operator.
    pub fewest_taking: Option<usize>,
}

/// Nearest rank: the smallest value with at least `p`% of values at or below it.
pub fn percentile(sorted: &[Nanos], p: f64) -> Option<Nanos> {
    if sorted.is_empty() {
        return None;
    }
    let rank = ((p / 100.0) * sorted.len() as f64).ceil() as usize;
    Some(sorted[rank.clamp(1, sorted.len()) - 1])
}

pub fn millis(nanos: Nanos) -> f64 {
    nanos as f64 / 1e6
}

/// The headline figures of a run, or of one window of it.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Summary {
    pub urgent_submitted: u64,
    pub urgent_completed: u64,
    pub p50_ms: Option<f64>,
    pub p99_ms: Option<f64>,
    pub batch_completed: u64,
    pub batch_per_second: f64,
}

pub fn summarize(
    latencies: &[Nanos],
    urgent_submitted: u64,
    batch_completed: u64,
    span: Nanos,
) -> Summary {
    let mut sorted = latencies.to_vec();
    sorted.sort_unstable();
    Summary {
        urgent_submitted,
        urgent_completed: sorted.len() as u64,
        p50_ms: percentile(&sorted, 50.0).map(millis),
        p99_ms: percentile(&sorted, 99.0).map(millis),
        batch_completed,
        batch_per_second: if span == 0 {
            0.0
        } else {
            batch_completed as f64 / seconds(span)
        },
    }
}

/// One row of the time series.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct SeriesPoint {
    pub start_s: f64,
    pub urgent_rate: f64,
    /// Mean reserve over the window.
    pub reserve: f64,
    pub summary: Summary,
}

impl Outcome {
    pub fn summary(&self) -> Summary {
        self.summary_from(0)
    }

    /// The headline figures from `from` on, a whole number of windows into the run (rounded
    /// down): the urgent jobs submitted and completed after it, the batch jobs finished after it
    /// and their rate over what is left of the run. A real run's warm-up is left out this way.
    pub fn summary_from(&self, from: Nanos) -> Summary {
        let skipped = usize::try_from(from / self.window.max(1))
            .unwrap_or(usize::MAX)
            .min(self.windows.len());
        let before = &self.windows[..skipped];
        let done = before.iter().map(|w| w.urgent_completed).sum::<u64>() as usize;
        let submitted: u64 = before.iter().map(|w| w.urgent_submitted).sum();
        let batch: u64 = before.iter().map(|w| w.batch_completed).sum();
        let start = (skipped as u64 * self.window).min(self.duration);
        summarize(
            &self.urgent_latencies[done.min(self.urgent_latencies.len())..],
            self.urgent_submitted.saturating_sub(submitted),
            self.batch_completed.saturating_sub(batch),
            self.duration - start,
        )
    }

    /// Mean reserve over [from, to).
    pub fn mean_reserve(&self, from: Nanos, to: Nanos) -> f64 {
        if to <= from {
            return 0.0;
        }
        let mut total = 0.0;
        for (i, (start, reserve)) in self.reserve_steps.iter().enumerate() {
            let end = self.reserve_steps.get(i + 1).map_or(to, |(next, _)| *next);
            let (a, b) = ((*start).max(from), end.min(to));
            if b > a {
                total += f64::from(*reserve) * (b - a) as f64;
            }
        }
        total / (to - from) as f64
    }

    /// How many times the reserve changed.
    pub fn reserve_changes(&self) -> usize {
        self.reserve_changes_from(0)
    }

    /// How many times the reserve changed at or after `from`.
    pub fn reserve_changes_from(&self, from: Nanos) -> usize {
        let steps = self.reserve_steps.iter().skip(1);
        steps.filter(|(at, _)| *at >= from).count()
    }

    pub fn series(&self) -> Vec<SeriesPoint> {
        let mut done = 0usize;
        self.windows
            .iter()
            .enumerate()
            .map(|(i, counts)| {
                let from = i as u64 * self.window;
                let to = (from + self.window).min(self.duration);
                let span = to - from;
                let end = done + counts.urgent_completed as usize;
                let slice = &self.urgent_latencies[done..end.min(self.urgent_latencies.len())];
                done = end;
                SeriesPoint {
                    start_s: seconds(from),
                    urgent_rate: counts.urgent_submitted as f64 / seconds(span).max(1e-9),
                    reserve: self.mean_reserve(from, to),
                    summary: summarize(
                        slice,
                        counts.urgent_submitted,
                        counts.batch_completed,
                        span,
                    ),
                }
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nearest_rank_percentiles() {
        let values: Vec<Nanos> = (1..=100).collect();
        assert_eq!(percentile(&values, 50.0), Some(50));
        assert_eq!(percentile(&values, 99.0), Some(99));
        assert_eq!(percentile(&values[..1], 99.0), Some(1));
        assert_eq!(percentile(&[], 50.0), None);
        // 240 values: p99 is the 238th.
        let values: Vec<Nanos> = (1..=240).collect();
        assert_eq!(percentile(&values, 99.0), Some(238));
    }

    #[test]
    fn the_mean_reserve_weighs_time() {
        let outcome = Outcome {
            reserve_steps: vec![(0, 1), (30, 3)],
            ..Outcome::default()
        };
        assert_eq!(outcome.mean_reserve(0, 60), 2.0);
        assert_eq!(outcome.reserve_changes(), 1);
        assert_eq!(outcome.reserve_changes_from(30), 1);
        assert_eq!(outcome.reserve_changes_from(31), 0);
    }

    #[test]
    fn a_warm_up_leaves_out_its_windows() {
        const S: Nanos = 1_000_000_000;
        let counts = |urgent_submitted, urgent_completed, batch_completed| WindowCounts {
            urgent_submitted,
            urgent_completed,
            batch_completed,
        };
        // Two slow jobs done in the first 10 s window, then fast ones.
        let outcome = Outcome {
            duration: 30 * S,
            window: 10 * S,
            urgent_submitted: 5,
            urgent_latencies: [90, 80, 1, 2, 3].map(|ms| ms * S / 1000).to_vec(),
            batch_completed: 60,
            windows: vec![counts(2, 2, 40), counts(2, 2, 10), counts(1, 1, 10)],
            ..Outcome::default()
        };
        assert_eq!(outcome.summary_from(0), outcome.summary());
        assert_eq!(outcome.summary().p99_ms, Some(90.0));
        let after = outcome.summary_from(10 * S);
        assert_eq!(
            (after.urgent_submitted, after.urgent_completed, after.p99_ms),
            (3, 3, Some(3.0))
        );
        assert_eq!((after.batch_completed, after.batch_per_second), (20, 1.0));
        // Within a window: from its start.
        assert_eq!(outcome.summary_from(15 * S), after);
    }
}
