//! `--trade-off`: urgent p99 against batch throughput on one rate profile, for every static
//! split, for the autoscaled pool (the default queueing rule, the guide's formula and latency
//! targets) and for an oracle that picks the best static split for each phase in hindsight.

use crate::duration::trim;
use crate::simulate::engine::outcome::{Outcome, Summary, millis, summarize};
use crate::simulate::engine::run;
use crate::simulate::engine::scenario::{Autoscale, Nanos, Scenario, seconds};
use crate::sizing::Rule;

/// Latency targets tried for the autoscaled pool and the oracle, in milliseconds.
pub const TARGETS_MS: [f64; 6] = [21.0, 25.0, 30.0, 40.0, 60.0, 100.0];

#[derive(Clone, Debug, PartialEq)]
pub struct Point {
    pub policy: String,
    pub p99_ms: f64,
    pub batch_per_second: f64,
    pub mean_reserve: f64,
}

fn point(policy: String, summary: Summary, mean_reserve: f64) -> Point {
    Point {
        policy,
        p99_ms: summary.p99_ms.unwrap_or(f64::INFINITY),
        batch_per_second: summary.batch_per_second,
        mean_reserve,
    }
}

/// Static splits: `reserved` fixed for the whole run.
pub fn static_splits(base: &Scenario) -> Vec<Point> {
    (0..base.workers)
        .map(|reserved| {
            let outcome = run(&Scenario {
                reserved,
                autoscale: None,
                ..base.clone()
            });
            point(
                format!("static {reserved}"),
                outcome.summary(),
                f64::from(reserved),
            )
        })
        .collect()
}

/// The operator in the loop, with each rule.
pub fn autoscaled(base: &Scenario, config: &Autoscale) -> Vec<Point> {
    let rules = [
        ("autoscale queueing".to_string(), Rule::Queueing),
        ("autoscale formula".to_string(), Rule::Formula),
    ]
    .into_iter()
    .chain(TARGETS_MS.iter().map(|ms| {
        (
            format!("autoscale p99≤{ms}ms"),
            Rule::LatencyTarget {
                p99_seconds: ms / 1e3,
            },
        )
    }));
    rules
        .map(|(policy, rule)| {
            let mut config = config.clone();
            for lane in &mut config.sizing.lanes {
                lane.rule = rule;
            }
            let outcome = run(&Scenario {
                autoscale: Some(config),
                ..base.clone()
            });
            let mean = outcome.mean_reserve(0, outcome.duration);
            point(policy, outcome.summary(), mean)
        })
        .collect()
}

/// One static split run on one phase alone.
struct PhaseRun {
    latencies: Vec<Nanos>,
    batch_completed: u64,
    /// Computed once: every target the oracle is asked about reads it.
    p99_ms: f64,
}

/// The best static split for each phase of a profile, picked in hindsight: a reference, not a
/// policy, and not a proven upper bound. Every split runs the whole profile on the run's own
/// arrivals (its seed), so a phase starts with that split's queue and in-flight jobs, never
/// cold; each phase then takes the completions of the split it picks, switching at phase
/// boundaries with no delay and no role-change cost.
pub struct Oracle {
    /// (phase length, runs by reserved workers)
    phases: Vec<(Nanos, Vec<PhaseRun>)>,
}

/// The oracle's time slices: phase boundaries fall on whole seconds.
const SLICE: Nanos = 1_000_000_000;

impl Oracle {
    pub fn new(base: &Scenario) -> Self {
        let runs: Vec<Outcome> = (0..base.workers)
            .map(|reserved| run(&Self::split(base, reserved)))
            .collect();
        Self::from_runs(base, &runs)
    }

    /// The static split the oracle runs for `reserved`: `base` with that reserve for the whole
    /// run, counted in one-second windows.
    pub fn split(base: &Scenario, reserved: u32) -> Scenario {
        Scenario {
            reserved,
            autoscale: None,
            window: SLICE,
            ..base.clone()
        }
    }

    /// The oracle from runs already made: `runs[k]` is [`Self::split`]`(base, k)`, for every
    /// reserve from 0.
    pub fn from_runs(base: &Scenario, runs: &[Outcome]) -> Self {
        let end = base.duration as f64 / 1e9;
        let phases = base.profile.phases(end);
        let mut by_phase: Vec<(Nanos, Vec<PhaseRun>)> = phases
            .iter()
            .map(|(from, to, _)| (((to - from) * 1e9).round() as Nanos, Vec::new()))
            .collect();
        for outcome in runs {
            // Completions slice by slice, in completion order.
            let mut done = 0usize;
            let slices: Vec<(&[Nanos], u64)> = outcome
                .windows
                .iter()
                .map(|w| {
                    let end =
                        (done + w.urgent_completed as usize).min(outcome.urgent_latencies.len());
                    let slice = &outcome.urgent_latencies[done..end];
                    done = end;
                    (slice, w.batch_completed)
                })
                .collect();
            for ((from, to, _), (_, runs)) in phases.iter().zip(&mut by_phase) {
                let (first, last) = (
                    from.round() as usize,
                    (to.round() as usize).min(slices.len()),
                );
                let mut latencies = Vec::new();
                let mut batch_completed = 0;
                for (slice, batch) in slices.get(first..last).unwrap_or_default() {
                    latencies.extend_from_slice(slice);
                    batch_completed += batch;
                }
                runs.push(PhaseRun {
                    p99_ms: summarize(&latencies, 0, 0, 1)
                        .p99_ms
                        .unwrap_or(f64::INFINITY),
                    latencies,
                    batch_completed,
                });
            }
        }
        Self { phases: by_phase }
    }

    /// For each phase, the smallest static split whose p99 in that phase meets `target_ms`
    /// (the one with the lowest p99 when none does).
    pub fn point(&self, target_ms: f64) -> Point {
        let mut latencies = Vec::new();
        let (mut batch, mut reserve_time, mut total) = (0, 0.0, 0);
        for (length, runs) in &self.phases {
            let chosen = runs
                .iter()
                .position(|r| r.p99_ms <= target_ms)
                .unwrap_or_else(|| {
                    (0..runs.len())
                        .min_by(|a, b| runs[*a].p99_ms.total_cmp(&runs[*b].p99_ms))
                        .unwrap_or(0)
                });
            latencies.extend_from_slice(&runs[chosen].latencies);
            batch += runs[chosen].batch_completed;
            reserve_time += chosen as f64 * *length as f64;
            total += length;
        }
        // The p99 by selection, not a sort: the same nearest rank, and a day's millions of
        // latencies are read once per target.
        let p99_ms = if latencies.is_empty() {
            f64::INFINITY
        } else {
            let rank = ((0.99 * latencies.len() as f64).ceil() as usize).clamp(1, latencies.len());
            millis(*latencies.select_nth_unstable(rank - 1).1)
        };
        Point {
            policy: format!("oracle p99≤{target_ms}ms"),
            p99_ms,
            batch_per_second: if total == 0 {
                0.0
            } else {
                batch as f64 / seconds(total)
            },
            mean_reserve: reserve_time / total.max(1) as f64,
        }
    }

    /// The oracle over targets from 20 ms to 200 ms, as [`Self::batch_at`] reads it.
    pub fn curve(&self) -> Vec<Point> {
        self.curve_from(20.0)
    }

    /// The oracle over targets from `lowest_ms` to ten times that, 46 of them.
    pub fn curve_from(&self, lowest_ms: f64) -> Vec<Point> {
        (0..=45)
            .map(|i| self.point(lowest_ms * 10f64.powf(f64::from(i) / 45.0)))
            .collect()
    }

    /// The oracle's batch throughput at `p99_ms`, read off its curve over targets from 20 ms to
    /// 200 ms (as the static frontier is read off the splits); `None` when it is never that fast.
    pub fn batch_at(&self, p99_ms: f64) -> Option<f64> {
        frontier(&self.curve(), p99_ms)
    }
}

/// The oracle at each of [`TARGETS_MS`].
pub fn oracle(base: &Scenario) -> Vec<Point> {
    let oracle = Oracle::new(base);
    TARGETS_MS
        .iter()
        .map(|target| oracle.point(*target))
        .collect()
}

/// The most batch throughput any static split gives at or below `p99_ms`.
pub fn best_static(splits: &[Point], p99_ms: f64) -> Option<f64> {
    splits
        .iter()
        .filter(|p| p.p99_ms <= p99_ms)
        .map(|p| p.batch_per_second)
        .reduce(f64::max)
}

/// The batch throughput of the static splits at `p99_ms`: linear between the two splits whose
/// p99 bracket it, or the best split at least that fast, whichever is higher. `None` when no
/// split is that fast.
pub fn frontier(splits: &[Point], p99_ms: f64) -> Option<f64> {
    let chords = splits.iter().flat_map(|a| {
        splits
            .iter()
            .filter(move |b| a.p99_ms < p99_ms && p99_ms < b.p99_ms && b.p99_ms.is_finite())
            .map(move |b| {
                let t = (p99_ms - a.p99_ms) / (b.p99_ms - a.p99_ms);
                a.batch_per_second + t * (b.batch_per_second - a.batch_per_second)
            })
    });
    chords.chain(best_static(splits, p99_ms)).reduce(f64::max)
}

pub fn table(base: &Scenario, config: &Autoscale) -> String {
    let splits = static_splits(base);
    let auto = autoscaled(base, config);
    let oracle = oracle(base);
    let mut lines = vec![format!(
        "{:<22} {:>10} {:>12} {:>12}  {}",
        "policy", "p99 ms", "batch jobs/s", "mean reserve", "best static at this p99"
    )];
    for p in splits.iter().chain(&auto).chain(&oracle) {
        let versus = if p.policy.starts_with("static") {
            String::new()
        } else {
            best_static(&splits, p.p99_ms).map_or("none this fast".to_string(), |b| {
                format!(
                    "{} jobs/s ({:+.1}%)",
                    trim(b),
                    (p.batch_per_second / b - 1.0) * 100.0
                )
            })
        };
        lines.push(format!(
            "{:<22} {:>10} {:>12} {:>12}  {}",
            p.policy,
            trim(p.p99_ms),
            trim(p.batch_per_second),
            trim(p.mean_reserve),
            versus
        ));
    }
    lines.join("\n")
}
