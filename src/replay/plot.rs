//! `--plot FILE.svg`: the measured arrival rate, and the reserve and urgent p99 of the current
//! settings and of the recommendation, over the window's wall-clock hours, drawn with the
//! simulator's chart. Skipped spans are breaks in the lines.

use super::history::History;
use super::run::Replay;
use crate::simulate::Outcome;
use crate::simulate::command::plot::{Line, Panel, chart};
use crate::simulate::engine::outcome::{millis, percentile};

/// About this many points per line.
const POINTS: usize = 600;

const CURRENT: &str = "#1f77b4";
const RECOMMENDED: &str = "#d62728";
const MEASURED: &str = "#555555";

/// The simulated second each covered step starts at, as wall-clock hours since the window's
/// start: the replay runs the covered steps end to end.
fn wall_hours(history: &History) -> Vec<f64> {
    let start = history.step_start(0);
    history
        .covered()
        .into_iter()
        .flat_map(|(first, end)| first..end)
        .map(|i| (history.step_start(i) - start) as f64 / 3600.0)
        .collect()
}

/// Consecutive points whose hours are at most `gap` apart, as runs.
fn runs(points: Vec<(f64, f64)>, gap: f64) -> Vec<Vec<(f64, f64)>> {
    let mut runs: Vec<Vec<(f64, f64)>> = Vec::new();
    for point in points {
        match runs.last_mut() {
            Some(run) if run.last().is_some_and(|(t, _)| point.0 - t <= gap * 1.01) => {
                run.push(point)
            }
            _ => runs.push(vec![point]),
        }
    }
    runs
}

/// (hours, mean reserve, urgent p99 ms) per bucket of `steps` covered steps.
fn buckets(outcome: &Outcome, hours: &[f64], step: u64, steps: usize) -> Vec<(f64, f64, f64)> {
    let per_bucket = step as usize * steps;
    let window_seconds = (outcome.window / 1_000_000_000).max(1) as usize;
    let windows_per_bucket = (per_bucket / window_seconds).max(1);
    let mut done = 0usize;
    let mut out = Vec::new();
    for (b, chunk) in outcome.windows.chunks(windows_per_bucket).enumerate() {
        let completed: usize = chunk.iter().map(|w| w.urgent_completed as usize).sum();
        let end = (done + completed).min(outcome.urgent_latencies.len());
        let mut slice = outcome.urgent_latencies[done..end].to_vec();
        done = end;
        slice.sort_unstable();
        let from = (b * per_bucket) as u64 * 1_000_000_000;
        let to = from + per_bucket as u64 * 1_000_000_000;
        let Some(hour) = hours.get(b * steps) else {
            break;
        };
        out.push((
            *hour,
            outcome.mean_reserve(from, to.min(outcome.duration)),
            percentile(&slice, 99.0).map_or(f64::NAN, millis),
        ));
    }
    out
}

pub fn svg(history: &History, replay: &Replay, recommended_name: &str) -> String {
    let hours = wall_hours(history);
    let steps = hours.len().div_ceil(POINTS).max(1);
    let step_hours = history.range.step as f64 / 3600.0;
    let gap = step_hours * steps as f64;
    let start = history.step_start(0);
    let rate: Vec<(f64, f64)> = history
        .rates
        .chunks(steps)
        .enumerate()
        .filter_map(|(b, chunk)| {
            let values: Vec<f64> = chunk.iter().flatten().copied().collect();
            (!values.is_empty()).then(|| {
                (
                    (history.step_start(b * steps) - start) as f64 / 3600.0,
                    values.iter().sum::<f64>() / values.len() as f64,
                )
            })
        })
        .collect();
    let mut outcomes = vec![("current settings".to_string(), CURRENT, &replay.current)];
    if let Some(recommended) = &replay.recommended {
        outcomes.push((recommended_name.to_string(), RECOMMENDED, recommended));
    }
    let series: Vec<_> = outcomes
        .iter()
        .map(|(label, colour, outcome)| {
            (
                label.clone(),
                *colour,
                buckets(outcome, &hours, history.range.step, steps),
            )
        })
        .collect();
    let lines = |value: fn(&(f64, f64, f64)) -> f64| -> Vec<Line> {
        series
            .iter()
            .map(|(label, colour, points)| Line {
                label: label.clone(),
                colour,
                runs: runs(points.iter().map(|p| (p.0, value(p))).collect(), gap),
            })
            .collect()
    };
    let panels = [
        Panel {
            title: format!("lane {}: arrival rate, measured", history.lane),
            unit: "/s",
            lines: vec![Line {
                label: String::new(),
                colour: MEASURED,
                runs: runs(rate, gap),
            }],
        },
        Panel {
            title: "reserved workers".into(),
            unit: "",
            lines: lines(|p| p.1),
        },
        Panel {
            title: "urgent p99".into(),
            unit: " ms",
            lines: lines(|p| p.2),
        },
    ];
    let end = history.rates.len() as f64 * step_hours;
    let from = k8s_openapi::jiff::Timestamp::from_second(start)
        .map_or_else(|_| start.to_string(), |t| t.to_string());
    chart(
        &panels,
        end,
        &format!("hours from {from}, 0 to {}", crate::duration::trim(end)),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_gap_breaks_a_line() {
        let points = vec![(0.0, 1.0), (0.5, 1.0), (3.0, 2.0), (3.5, 2.0)];
        assert_eq!(runs(points, 0.5).len(), 2);
    }
}
