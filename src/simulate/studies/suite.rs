//! `--suite`: the autoscaled pool, with the defaults a LanePool gets when the user sets nothing,
//! against every static split and the hindsight oracle on many traffic shapes (fixed ones and
//! seeded random walks), three seeds each. It judges the sizing; it must never tune it.

use std::time::Duration;

use super::in_parallel;
use super::tradeoff::{Oracle, Point, frontier, static_splits};
use crate::duration::trim;
use crate::simulate::engine::arrivals::ArrivalKind;
use crate::simulate::engine::autoscale::POD_START;
use crate::simulate::engine::profile::RateProfile;
use crate::simulate::engine::rng::Pcg32;
use crate::simulate::engine::run;
use crate::simulate::engine::scenario::{Arrangement, Autoscale, QUEUE_HANDOFF, Scenario, seconds};

/// Seeds every profile is run with.
pub const SEEDS: [u64; 3] = [1, 2, 3];

/// How long each run lasts.
pub const DURATION: Duration = Duration::from_secs(20 * 60);

/// The workers of a suite pool unless asked otherwise: as the guide's, 10 in a fixed budget.
/// A pool of other size runs every shape with its rates scaled by its size over this.
pub const WORKERS: u32 = 10;

/// One traffic shape: a fixed profile, or one drawn from the run's seed.
#[derive(Clone, Debug)]
pub struct Shape {
    pub name: &'static str,
    pub what: &'static str,
    pub profile: fn(seconds: f64, seed: u64) -> RateProfile,
}

impl Shape {
    pub fn profile(&self, seconds: f64, seed: u64) -> RateProfile {
        (self.profile)(seconds, seed)
    }
}

pub fn steps(points: &[(f64, f64)]) -> RateProfile {
    RateProfile {
        steps: points.to_vec(),
    }
}

/// `base` with a spike to `peak` for `length` seconds every `every` seconds, the first at `first`.
fn spikes(seconds: f64, base: f64, peak: f64, length: f64, every: f64, first: f64) -> RateProfile {
    let mut points = vec![(0.0, base)];
    let mut at = first;
    while at + length < seconds {
        points.push((at, peak));
        points.push((at + length, base));
        at += every;
    }
    steps(&points)
}

/// A straight line from `from` to `to` and back `times` times, in 15 s steps.
fn ramps(seconds: f64, from: f64, to: f64, times: u32, back: bool) -> RateProfile {
    let step = 15.0;
    let period = seconds / f64::from(times);
    let mut points = Vec::new();
    let mut at = 0.0;
    while at < seconds {
        let phase = (at % period) / period;
        let share = if back {
            1.0 - (2.0 * phase - 1.0).abs()
        } else {
            phase
        };
        points.push((at, (from + (to - from) * share).round()));
        at += step;
    }
    steps(&points)
}

/// A random walk in `[low, high]`: every `step` seconds the rate moves by up to `jump` either way.
fn random_walk(seconds: f64, seed: u64, step: f64, jump: f64, low: f64, high: f64) -> RateProfile {
    let mut rng = Pcg32::new(seed, 7);
    let mut rate = low + (high - low) * rng.unit();
    let mut points = Vec::new();
    let mut at = 0.0;
    while at < seconds {
        points.push((at, rate.round()));
        rate = (rate + jump * (2.0 * rng.unit() - 1.0)).clamp(low, high);
        at += step;
    }
    steps(&points)
}

/// Quiet periods broken by surges of random height and length at random moments.
fn random_bursts(seconds: f64, seed: u64) -> RateProfile {
    let mut rng = Pcg32::new(seed, 8);
    let mut points = vec![(0.0, 20.0 + 30.0 * rng.unit())];
    let mut at = 60.0 + 120.0 * rng.unit();
    while at < seconds {
        let length = 15.0 + 75.0 * rng.unit();
        points.push((at, 90.0 + 90.0 * rng.unit()));
        points.push((at + length, 20.0 + 30.0 * rng.unit()));
        at += length + 60.0 + 240.0 * rng.unit();
    }
    steps(&points)
}

/// The suite's shapes: smooth, steps of minutes, short spikes, long surges, ramps, sawtooth,
/// and seeded random ones. Rates between 10/s and 180/s against 20 ms urgent jobs: from under
/// one worker's worth of urgent work to nearly four.
pub fn shapes() -> Vec<Shape> {
    vec![
        Shape {
            name: "day",
            what: "a day's shape, peak 150/s",
            profile: |s, _| RateProfile::day(150.0, s),
        },
        Shape {
            name: "steps",
            what: "the issue's steps 30→150→30→90→30",
            profile: |_, _| {
                steps(&[
                    (0.0, 30.0),
                    (200.0, 150.0),
                    (260.0, 30.0),
                    (500.0, 90.0),
                    (900.0, 30.0),
                ])
            },
        },
        Shape {
            name: "stairs",
            what: "30→60→100→140→60→30, 3 min each",
            profile: |_, _| {
                steps(&[
                    (0.0, 30.0),
                    (180.0, 60.0),
                    (360.0, 100.0),
                    (540.0, 140.0),
                    (720.0, 60.0),
                    (900.0, 30.0),
                ])
            },
        },
        Shape {
            name: "spikes-20s",
            what: "30/s, 20 s at 150/s every 3 min",
            profile: |s, _| spikes(s, 30.0, 150.0, 20.0, 180.0, 100.0),
        },
        Shape {
            name: "spikes-40s",
            what: "40/s, 40 s at 160/s every 4 min",
            profile: |s, _| spikes(s, 40.0, 160.0, 40.0, 240.0, 130.0),
        },
        Shape {
            name: "spikes-60s",
            what: "30/s, 60 s at 130/s every 5 min",
            profile: |s, _| spikes(s, 30.0, 130.0, 60.0, 300.0, 150.0),
        },
        Shape {
            name: "surge",
            what: "30/s, 8 min at 140/s",
            profile: |_, _| steps(&[(0.0, 30.0), (300.0, 140.0), (780.0, 30.0)]),
        },
        Shape {
            name: "busy",
            what: "120/s, 2 min at 40/s in the middle",
            profile: |_, _| steps(&[(0.0, 120.0), (540.0, 40.0), (660.0, 120.0)]),
        },
        Shape {
            name: "ramp",
            what: "20/s rising to 160/s",
            profile: |s, _| ramps(s, 20.0, 160.0, 1, false),
        },
        Shape {
            name: "triangle",
            what: "20→160→20/s, twice",
            profile: |s, _| ramps(s, 20.0, 160.0, 2, true),
        },
        Shape {
            name: "sawtooth",
            what: "20→150/s over 4 min, then a drop",
            profile: |s, _| ramps(s, 20.0, 150.0, 5, false),
        },
        Shape {
            name: "walk-slow",
            what: "random walk, ±15/s a minute",
            profile: |s, seed| random_walk(s, seed, 60.0, 15.0, 10.0, 170.0),
        },
        Shape {
            name: "walk-fast",
            what: "random walk, ±40/s every 15 s",
            profile: |s, seed| random_walk(s, seed, 15.0, 40.0, 10.0, 170.0),
        },
        Shape {
            name: "bursts",
            what: "random surges of 15–90 s to 90–180/s",
            profile: |s, seed| random_bursts(s, seed),
        },
    ]
}

/// The pool every shape runs on: the guide's jobs, `workers` in a budget, Poisson arrivals, a
/// backlog that never runs out.
pub fn base(profile: RateProfile, duration: Duration, seed: u64, workers: u32) -> Scenario {
    let duration = crate::simulate::engine::scenario::nanos(duration);
    Scenario {
        arrivals: ArrivalKind::Poisson,
        profile,
        backlog: 1_000_000_000,
        handoff: QUEUE_HANDOFF,
        duration,
        window: duration,
        seed,
        workers,
        ..Scenario::guide(Arrangement::ReservedShared, 0.0)
    }
}

/// The autoscaled run of one shape and seed, beside its references.
#[derive(Clone, Debug)]
pub struct Case {
    pub autoscaled: Point,
    /// How many times the reserve changed.
    pub changes: usize,
    /// Static batch throughput at the autoscaled p99, `None` when no static split is that fast.
    pub frontier: Option<f64>,
    /// The hindsight oracle's batch throughput at the autoscaled p99, `None` when it is not
    /// that fast either.
    pub oracle: Option<f64>,
}

impl Case {
    /// Batch throughput above the static frontier at equal p99 (+0.05 = 5 % more); infinite when
    /// no static split reaches the autoscaled p99.
    pub fn margin(&self) -> f64 {
        self.frontier.map_or(f64::INFINITY, |f| {
            self.autoscaled.batch_per_second / f - 1.0
        })
    }

    /// Share of the oracle's batch throughput at equal p99, at most 1 only when the oracle is
    /// an upper bound here.
    pub fn oracle_share(&self) -> Option<f64> {
        self.oracle.map(|o| self.autoscaled.batch_per_second / o)
    }

    /// The oracle's own margin over the static frontier at the autoscaled p99: the most any
    /// sizing could win on this run, since the oracle switches with no delay and no cost.
    pub fn ceiling(&self) -> Option<f64> {
        self.oracle.zip(self.frontier).map(|(o, f)| o / f - 1.0)
    }
}

/// One shape and seed at `workers`, its rates scaled by `workers` ÷ [`WORKERS`].
pub fn scenario(shape: &Shape, duration: Duration, seed: u64, workers: u32) -> Scenario {
    let scale = f64::from(workers) / f64::from(WORKERS);
    let mut profile = shape.profile(duration.as_secs_f64(), seed);
    for (_, rate) in &mut profile.steps {
        *rate *= scale;
    }
    base(profile, duration, seed, workers)
}

/// Runs one shape with one seed.
pub fn case(
    shape: &Shape,
    duration: Duration,
    seed: u64,
    workers: u32,
    config: &Autoscale,
) -> Case {
    let scenario = scenario(shape, duration, seed, workers);
    let outcome = run(&Scenario {
        autoscale: Some(config.clone()),
        ..scenario.clone()
    });
    let summary = outcome.summary();
    let autoscaled = Point {
        policy: "autoscale".into(),
        p99_ms: summary.p99_ms.unwrap_or(f64::INFINITY),
        batch_per_second: summary.batch_per_second,
        mean_reserve: outcome.mean_reserve(0, outcome.duration),
    };
    let frontier = frontier(&static_splits(&scenario), autoscaled.p99_ms);
    let oracle = Oracle::new(&scenario).batch_at(autoscaled.p99_ms);
    Case {
        autoscaled,
        changes: outcome.reserve_changes(),
        frontier,
        oracle,
    }
}

/// One shape's three seeds.
#[derive(Clone, Debug)]
pub struct Row {
    pub shape: Shape,
    pub cases: Vec<Case>,
}

fn mean(values: impl Iterator<Item = f64>) -> f64 {
    let (sum, n) = values.fold((0.0, 0), |(s, n), v| (s + v, n + 1));
    if n == 0 { f64::NAN } else { sum / n as f64 }
}

impl Row {
    pub fn worst_margin(&self) -> f64 {
        self.cases
            .iter()
            .map(Case::margin)
            .fold(f64::INFINITY, f64::min)
    }

    /// Mean margin over the seeds, counting a seed no static split can match as its
    /// autoscaled throughput over the fastest split's (a finite, conservative figure).
    pub fn mean_margin(&self) -> f64 {
        mean(self.cases.iter().map(|c| c.margin().min(1.0)))
    }

    pub fn mean_oracle_share(&self) -> f64 {
        mean(self.cases.iter().filter_map(Case::oracle_share))
    }

    pub fn mean_ceiling(&self) -> f64 {
        mean(self.cases.iter().filter_map(Case::ceiling))
    }
}

/// The shapes a table is made of, and the seeds each runs with.
#[derive(Clone, Debug)]
pub struct Set {
    pub shapes: Vec<Shape>,
    pub seeds: Vec<u64>,
    /// The pool's workers; the shapes' rates scale with them (see [`WORKERS`]).
    pub workers: u32,
}

impl Set {
    /// The suite the sizing is measured (and was tuned) on.
    pub fn suite() -> Self {
        Self {
            shapes: shapes(),
            seeds: SEEDS.to_vec(),
            workers: WORKERS,
        }
    }
}

/// Runs every shape with every seed, on both cores.
pub fn rows(set: &Set, duration: Duration, config: &Autoscale) -> Vec<Row> {
    let jobs: Vec<(&Shape, u64)> = set
        .shapes
        .iter()
        .flat_map(|shape| set.seeds.iter().map(move |seed| (shape, *seed)))
        .collect();
    let mut cases = in_parallel(&jobs, |(shape, seed)| {
        case(shape, duration, *seed, set.workers, config)
    })
    .into_iter();
    set.shapes
        .iter()
        .map(|shape| Row {
            shape: shape.clone(),
            cases: cases.by_ref().take(set.seeds.len()).collect(),
        })
        .collect()
}

fn percent(value: f64) -> String {
    if value.is_infinite() {
        "faster than every split".into()
    } else {
        format!("{:+.1}%", value * 100.0)
    }
}

/// A set as a table: per shape, the seeds' means and the worst seed's margin.
pub fn table(set: &Set, duration: Duration, config: &Autoscale) -> String {
    let rows = rows(set, duration, config);
    let mut lines = vec![format!(
        "{:<11} {:>7} {:>8} {:>9} {:>8} {:>8} {:>8} {:>7} {:>8}  {}",
        "profile",
        "p99 ms",
        "batch/s",
        "frontier",
        "margin",
        "worst",
        "ceiling",
        "oracle",
        "resizes",
        "shape"
    )];
    for row in &rows {
        let p99 = mean(row.cases.iter().map(|c| c.autoscaled.p99_ms));
        let batch = mean(row.cases.iter().map(|c| c.autoscaled.batch_per_second));
        let frontier = mean(row.cases.iter().filter_map(|c| c.frontier));
        let changes = mean(row.cases.iter().map(|c| c.changes as f64));
        lines.push(format!(
            "{:<11} {:>7.1} {:>8.2} {:>9} {:>8} {:>8} {:>8} {:>6.0}% {:>8.0}  {}",
            row.shape.name,
            p99,
            batch,
            if frontier.is_nan() {
                "-".into()
            } else {
                format!("{frontier:.2}")
            },
            format!("{:+.1}%", row.mean_margin() * 100.0),
            percent(row.worst_margin()),
            format!("{:+.1}%", row.mean_ceiling() * 100.0),
            row.mean_oracle_share() * 100.0,
            changes,
            row.shape.what
        ));
    }
    let worst = rows
        .iter()
        .map(Row::worst_margin)
        .fold(f64::INFINITY, f64::min);
    let mean_margin = mean(rows.iter().map(Row::mean_margin));
    let share = mean(rows.iter().map(Row::mean_oracle_share));
    let ceiling = mean(rows.iter().map(Row::mean_ceiling));
    let below = rows.iter().filter(|r| r.worst_margin() < 0.0).count();
    let world = if config.pod_start == POD_START {
        String::new()
    } else {
        format!(
            ", pods starting in {}",
            trim(seconds(config.pod_start)) + " s"
        )
    };
    lines.push(format!(
        "\n{} profiles × {} seeds, {} each, {} workers{world}: mean margin {}, worst seed {}, {below} profiles with a seed below the static frontier; {}% of the oracle's batch throughput at equal p99 on average, whose own mean margin (the ceiling) is {}",
        rows.len(),
        set.seeds.len(),
        trim(duration.as_secs_f64() / 60.0) + " min",
        set.workers,
        percent(mean_margin),
        percent(worst),
        trim((share * 1000.0).round() / 10.0),
        percent(ceiling)
    ));
    lines.join("\n")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn point(p99_ms: f64, batch: f64) -> Point {
        Point {
            policy: String::new(),
            p99_ms,
            batch_per_second: batch,
            mean_reserve: 0.0,
        }
    }

    #[test]
    fn the_frontier_interpolates_between_the_bracketing_splits() {
        let splits = [point(100.0, 40.0), point(60.0, 36.0), point(40.0, 30.0)];
        assert_eq!(frontier(&splits, 50.0), Some(33.0));
        assert_eq!(frontier(&splits, 60.0), Some(36.0));
        assert_eq!(frontier(&splits, 200.0), Some(40.0));
        assert_eq!(frontier(&splits, 30.0), None);
    }

    #[test]
    fn the_ceiling_is_the_oracles_margin_over_the_frontier_and_needs_both() {
        let case = |frontier, oracle| Case {
            autoscaled: point(50.0, 41.0),
            changes: 0,
            frontier,
            oracle,
        };
        let both = case(Some(40.0), Some(42.0));
        assert!((both.ceiling().unwrap_or(0.0) - 0.05).abs() < 1e-9);
        assert!((both.margin() - 0.025).abs() < 1e-9, "half the ceiling won");
        assert_eq!(case(None, Some(42.0)).ceiling(), None);
        assert_eq!(case(Some(40.0), None).ceiling(), None);
    }

    #[test]
    fn a_noisy_split_never_lowers_the_frontier() {
        // The 80 ms split is both slower and poorer than the 65 ms one: the frontier at 70 ms is
        // the chord from 65 ms to 100 ms, above both, not the line through the noisy split.
        let splits = [point(100.0, 40.0), point(65.0, 38.0), point(80.0, 35.0)];
        let at_70 = frontier(&splits, 70.0).unwrap_or(0.0);
        assert!((at_70 - (38.0 + 2.0 * 5.0 / 35.0)).abs() < 1e-9, "{at_70}");
    }

    #[test]
    fn every_shape_stays_in_its_range_and_random_ones_follow_the_seed() {
        for shape in shapes() {
            let profile = shape.profile(1200.0, 1);
            assert_eq!(profile.steps[0].0, 0.0, "{}", shape.name);
            assert!(profile.steps.windows(2).all(|w| w[0].0 < w[1].0));
            assert!(
                profile
                    .steps
                    .iter()
                    .all(|(_, r)| (10.0..=180.0).contains(r)),
                "{}: {:?}",
                shape.name,
                profile.steps
            );
        }
        let walk = &shapes()[12];
        assert_ne!(walk.profile(1200.0, 1), walk.profile(1200.0, 2));
        assert_eq!(walk.profile(1200.0, 1), walk.profile(1200.0, 1));
    }

    #[test]
    fn there_are_at_least_twelve_shapes_with_distinct_names() {
        let names: std::collections::BTreeSet<_> = shapes().iter().map(|s| s.name).collect();
        assert!(names.len() >= 12);
        assert_eq!(names.len(), shapes().len());
    }
}
