//! What Prometheus would answer the operator: counters kept in one-second buckets, read over a
//! trailing window that ends `scrape_delay` before the question. It sees only the past, and
//! answers "nothing" rather than zero when it has no samples yet.

use super::scenario::{Nanos, seconds};

#[derive(Debug, Default)]
pub struct Counters {
    submitted: Vec<u32>,
    finished: Vec<u32>,
    /// Sum of urgent job times finished in each second, in seconds.
    job_seconds: Vec<f64>,
}

fn bucket(at: Nanos) -> usize {
    (at / 1_000_000_000) as usize
}

fn bump<T: Copy + Default + std::ops::AddAssign>(series: &mut Vec<T>, at: Nanos, by: T) {
    let i = bucket(at);
    if series.len() <= i {
        series.resize(i + 1, T::default());
    }
    series[i] += by;
}

impl Counters {
    pub fn submitted(&mut self, at: Nanos) {
        bump(&mut self.submitted, at, 1);
    }

    pub fn finished(&mut self, at: Nanos, job: Nanos) {
        bump(&mut self.finished, at, 1);
        bump(&mut self.job_seconds, at, seconds(job));
    }

    /// Whole seconds [from, to) that the window covers, or `None` before the first sample.
    fn span(now: Nanos, window: Nanos, delay: Nanos) -> Option<(usize, usize)> {
        let seen = now.checked_sub(delay)?;
        let to = bucket(seen);
        let from = bucket(seen.saturating_sub(window));
        (to > from).then_some((from, to))
    }

    /// `rate(submitted[window])`, in jobs per second.
    pub fn arrival_rate(&self, now: Nanos, window: Nanos, delay: Nanos) -> Option<f64> {
        let (from, to) = Self::span(now, window, delay)?;
        let count: u64 = (from..to)
            .map(|i| u64::from(self.submitted.get(i).copied().unwrap_or(0)))
            .sum();
        Some(count as f64 / (to - from) as f64)
    }

    /// Mean urgent job time over the window, or `None` when no job finished in it.
    pub fn job_seconds(&self, now: Nanos, window: Nanos, delay: Nanos) -> Option<f64> {
        let (from, to) = Self::span(now, window, delay)?;
        let count: u64 = (from..to)
            .map(|i| u64::from(self.finished.get(i).copied().unwrap_or(0)))
            .sum();
        let total: f64 = (from..to)
            .map(|i| self.job_seconds.get(i).copied().unwrap_or(0.0))
            .sum();
        (count > 0).then(|| total / count as f64)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const S: Nanos = 1_000_000_000;

    #[test]
    fn the_rate_lags_by_the_scrape_delay() {
        let mut observed = Counters::default();
        for i in 0..100 {
            observed.submitted(50 * S + i * S / 10);
        }
        // 10/s from 50 s to 60 s; at 60 s with a 15 s delay nothing of it is visible yet.
        assert_eq!(observed.arrival_rate(60 * S, 60 * S, 15 * S), Some(0.0));
        assert_eq!(observed.arrival_rate(75 * S, 10 * S, 15 * S), Some(10.0));
        assert_eq!(observed.arrival_rate(10 * S, 60 * S, 15 * S), None);
    }

    #[test]
    fn no_finished_job_means_no_job_time_not_zero() {
        let mut observed = Counters::default();
        assert_eq!(observed.job_seconds(100 * S, 60 * S, 0), None);
        observed.finished(70 * S, S / 50);
        assert_eq!(observed.job_seconds(100 * S, 60 * S, 0), Some(0.02));
    }
}
