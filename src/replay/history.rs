//! A reserve lane's past, read from Prometheus with range queries: its arrival rate and job time
//! at every step of the window (through the pool's own queries, or the metric convention's for
//! this lane alone), the batch lanes' job time, and which spans of the window had an answer. A
//! step without an arrival rate is a gap, never zero.

use std::time::Duration;

use k8s_openapi::jiff::Timestamp;

use super::error::ReplayError;
use crate::api::LanePool;
use crate::duration::compact;
use crate::prometheus::range::Range;
use crate::prometheus::{Client, QueryWindows, default_job_time, pool_queries};

/// What was measured of one lane, step by step: `rates[i]` holds for the step ending at
/// `range.start + i × range.step`.
#[derive(Clone, Debug, PartialEq)]
pub struct History {
    pub range: Range,
    /// The lane replayed and its index in `spec.lanes`.
    pub lane: String,
    pub lane_index: usize,
    /// Jobs per second, per step; `None`: no answer (a gap).
    pub rates: Vec<Option<f64>>,
    /// Mean job seconds, per step; `None`: no job finished in the query's window, or no answer.
    pub job_seconds: Vec<Option<f64>>,
    /// The lane's `jobTime.fallback`, for when no job time was measured at all.
    pub job_seconds_fallback: Option<f64>,
    /// The batch lanes' mean job time over the window (the mean of their means), if measured.
    pub batch_job_seconds: Option<f64>,
    /// The PromQL asked, for the output.
    pub queries: Vec<String>,
}

/// A run of steps, `[first, end)` as indices into [`History::rates`].
pub type Span = (usize, usize);

impl History {
    /// The runs of steps that have an arrival rate.
    pub fn covered(&self) -> Vec<Span> {
        let mut spans = Vec::new();
        let mut open: Option<usize> = None;
        for (i, rate) in self.rates.iter().enumerate() {
            match (rate.is_some(), open) {
                (true, None) => open = Some(i),
                (false, Some(first)) => {
                    spans.push((first, i));
                    open = None;
                }
                _ => {}
            }
        }
        if let Some(first) = open {
            spans.push((first, self.rates.len()));
        }
        spans
    }

    /// The runs of steps without one.
    pub fn skipped(&self) -> Vec<Span> {
        let mut spans = Vec::new();
        let mut next = 0;
        for (first, end) in self.covered() {
            if first > next {
                spans.push((next, first));
            }
            next = end;
        }
        if next < self.rates.len() {
            spans.push((next, self.rates.len()));
        }
        spans
    }

    /// The Unix second a step starts at.
    pub fn step_start(&self, index: usize) -> i64 {
        self.range.start - self.range.step as i64 + (index as u64 * self.range.step) as i64
    }

    /// A span as wall-clock text: `2026-12-01T10:00:00Z to 2026-12-01T11:00:00Z (1h)`.
    pub fn describe(&self, (first, end): Span) -> String {
        let at = |second: i64| {
            Timestamp::from_second(second).map_or_else(|_| second.to_string(), |t| t.to_string())
        };
        format!(
            "{} to {} ({})",
            at(self.step_start(first)),
            at(self.step_start(end)),
            compact(Duration::from_secs((end - first) as u64 * self.range.step))
        )
    }

    /// The lane's mean job time over the covered steps, weighted by arrival rate; the fallback
    /// when no step measured one.
    pub fn mean_job_seconds(&self) -> Option<f64> {
        let (mut weighted, mut weight) = (0.0, 0.0);
        for (rate, job) in self.rates.iter().zip(&self.job_seconds) {
            if let (Some(rate), Some(job)) = (rate, job) {
                weighted += rate * job;
                weight += rate;
            }
        }
        if weight > 0.0 {
            Some(weighted / weight)
        } else {
            self.job_seconds_fallback
        }
    }
}

/// The windows the default queries count over when read at `step`: the operator's, never
/// shorter than the step, so no arrival falls between two answers.
pub fn windows(rate_window: &str, job_time_window: &str, step: u64) -> QueryWindows {
    let at_least = |window: &str| {
        let seconds = crate::duration::parse(window).map_or(0, |d| d.as_secs());
        if seconds >= step {
            window.to_string()
        } else {
            format!("{step}s")
        }
    };
    QueryWindows {
        arrival_rate: at_least(rate_window),
        recent_arrival_rate: None,
        scrape_interval: Duration::from_secs(15),
        job_time: at_least(job_time_window),
    }
}

/// Reads `lane` (the pool's first reserve lane when `None`) of `pool` over `range`.
pub async fn read(
    pool: &LanePool,
    lane: Option<&str>,
    client: &Client,
    range: Range,
    windows: &QueryWindows,
) -> Result<History, ReplayError> {
    let queries = pool_queries(pool, windows)?;
    let reserve_lanes: Vec<String> = queries.iter().map(|q| q.lane.clone()).collect();
    let chosen = match lane {
        None => queries.first(),
        Some(name) => queries.iter().find(|q| q.lane == name),
    }
    .ok_or_else(|| {
        ReplayError::flag(
            "--lane",
            format!(
                "{:?} is not a reserve lane of the pool (its reserve lanes: {})",
                lane.unwrap_or_default(),
                reserve_lanes.join(", ")
            ),
        )
    })?;
    let lane_index = pool
        .spec
        .lanes
        .iter()
        .position(|l| l.name == chosen.lane)
        .unwrap_or_default();
    let failed = |what: &'static str| {
        let lane = chosen.lane.clone();
        move |reason: String| ReplayError::Prometheus { lane, what, reason }
    };
    let (rates, jobs) = futures::join!(
        client.ask_range(&chosen.arrival_rate, range),
        client.ask_range(&chosen.job_time, range),
    );
    let rates = by_step(range, &rates.map_err(failed("arrival rate"))?);
    let job_seconds = by_step(range, &jobs.map_err(failed("job time"))?);
    let namespace = pool.metadata.namespace.clone().unwrap_or_default();
    let name = pool.metadata.name.clone().unwrap_or_default();
    let batch_lanes: Vec<_> = pool
        .spec
        .lanes
        .iter()
        .filter(|l| l.reserve.is_none())
        .map(|l| default_job_time(&namespace, &name, &l.name, windows))
        .collect();
    let mut batch_means = Vec::new();
    for query in &batch_lanes {
        let points = client
            .ask_range(query, range)
            .await
            .map_err(failed("batch job time"))?;
        let values: Vec<f64> = by_step(range, &points).into_iter().flatten().collect();
        if !values.is_empty() {
            batch_means.push(values.iter().sum::<f64>() / values.len() as f64);
        }
    }
    let own = |q: &crate::prometheus::Query| match q {
        crate::prometheus::Query::Own(p) | crate::prometheus::Query::Shared { own: p, .. } => {
            p.clone()
        }
    };
    let mut asked = vec![own(&chosen.arrival_rate), own(&chosen.job_time)];
    asked.extend(batch_lanes.iter().map(own));
    Ok(History {
        range,
        lane: chosen.lane.clone(),
        lane_index,
        rates,
        job_seconds,
        job_seconds_fallback: chosen.job_seconds_fallback,
        batch_job_seconds: (!batch_means.is_empty())
            .then(|| batch_means.iter().sum::<f64>() / batch_means.len() as f64),
        queries: asked,
    })
}

/// Points placed on the range's steps; a value that is not a finite number of at least 0 (NaN
/// when no job finished, say) is no value.
fn by_step(range: Range, points: &[(f64, f64)]) -> Vec<Option<f64>> {
    let mut steps = vec![None; range.points() as usize];
    for (at, value) in points {
        let offset = *at - range.start as f64;
        let index = (offset / range.step as f64).round();
        if index >= 0.0 && (index as usize) < steps.len() && value.is_finite() && *value >= 0.0 {
            steps[index as usize] = Some(*value);
        }
    }
    steps
}

#[cfg(test)]
mod tests {
    use super::*;

    fn history(rates: Vec<Option<f64>>) -> History {
        History {
            range: Range {
                start: 1_000_015,
                end: 1_000_000 + 15 * rates.len() as i64,
                step: 15,
            },
            lane: "urgent".into(),
            lane_index: 0,
            job_seconds: vec![Some(0.02); rates.len()],
            rates,
            job_seconds_fallback: None,
            batch_job_seconds: None,
            queries: Vec::new(),
        }
    }

    #[test]
    fn gaps_are_spans_without_a_rate_and_never_zero() {
        let h = history(vec![None, Some(1.0), Some(0.0), None, None, Some(2.0)]);
        assert_eq!(h.covered(), vec![(1, 3), (5, 6)]);
        assert_eq!(h.skipped(), vec![(0, 1), (3, 5)]);
        assert_eq!(h.step_start(0), 1_000_000);
        assert!(
            h.describe((3, 5)).ends_with("(30s)"),
            "{}",
            h.describe((3, 5))
        );
    }

    #[test]
    fn points_land_on_their_steps_and_nan_is_no_value() {
        let range = Range {
            start: 15,
            end: 60,
            step: 15,
        };
        let steps = by_step(
            range,
            &[(15.0, 3.0), (45.0, f64::NAN), (60.0, 4.0), (75.0, 9.0)],
        );
        assert_eq!(steps, vec![Some(3.0), None, None, Some(4.0)]);
    }

    #[test]
    fn the_default_windows_are_never_shorter_than_the_step() {
        let w = windows("1m", "5m", 15);
        assert_eq!((w.arrival_rate.as_str(), w.job_time.as_str()), ("1m", "5m"));
        let w = windows("1m", "5m", 600);
        assert_eq!(
            (w.arrival_rate.as_str(), w.job_time.as_str()),
            ("600s", "600s")
        );
    }
}
