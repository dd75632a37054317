//! `--suite --versus keda`: the default LanePool against what a team runs without it, KEDA
//! ScaledObjects on the lists' lengths behind the HPA (`engine::keda`), on the suite's shapes,
//! seeds and pool sizes. KEDA is swept over its knobs, so lanepool is judged against KEDA's
//! best-tuned point for each run, not only against its defaults.
//!
//! Every arm runs the same world: the same arrivals, a backlog that never runs out, `workers`
//! at most. With a backlog that never runs out every worker the batch lane may take stays busy,
//! so worker-seconds alone would only say how much batch work an arm bought; the cost compared
//! is the worker-seconds *not* spent on batch jobs (idle, starting, handing off, urgent jobs):
//! what the arm pays to keep urgent waits short.

use std::time::Duration;

use super::in_parallel;
use super::suite::{Set, Shape, scenario};
use crate::duration::trim;
use crate::simulate::engine::outcome::{Outcome, percentile};
use crate::simulate::engine::profile::RateProfile;
use crate::simulate::engine::run;
use crate::simulate::engine::scenario::{Arm, Knobs};
use crate::simulate::engine::scenario::{Arrangement, Autoscale, Nanos, Scenario, seconds};

const SECOND: Nanos = 1_000_000_000;

/// KEDA's knobs swept for a pool of `workers`: `listLength` 1, 2, 5, 10; `pollingInterval` 5 s
/// and 30 s; `minReplicaCount` 0 and 1, and floors of a fifth, three tenths, two fifths and half
/// the pool (2, 3, 4 and 5 of 10 workers), which keep urgent workers up through a quiet spell as
/// a static reserve would; at half the pool the urgent Deployment is a fixed reserve at its
/// maximum.
pub fn sweep(workers: u32) -> Vec<Knobs> {
    let mins = floors(workers);
    let mut knobs = Vec::new();
    for list_length in [1.0, 2.0, 5.0, 10.0] {
        for polling in [5 * SECOND, 30 * SECOND] {
            for &min in &mins {
                knobs.push(Knobs {
                    list_length,
                    polling,
                    min,
                });
            }
        }
    }
    knobs
}

/// The `minReplicaCount`s swept, without repeats.
fn floors(workers: u32) -> Vec<u32> {
    let mut mins = vec![
        0,
        1,
        workers / 5,
        workers * 3 / 10,
        workers * 2 / 5,
        workers / 2,
    ];
    mins.sort_unstable();
    mins.dedup();
    mins
}

/// One arm's figures on one run.
#[derive(Clone, Debug, PartialEq)]
pub struct Figures {
    pub name: String,
    /// Urgent wait p99 over the urgent job time: the whole run, the jobs submitted at normal
    /// load (the shape's rate at or below its time-weighted median) and at its peaks (above it).
    pub wait_p99: f64,
    pub normal: Option<f64>,
    pub peak: Option<f64>,
    pub batch_per_second: f64,
    /// Mean Pods over the run (worker-seconds ÷ run seconds).
    pub workers: f64,
    /// Mean Pods not running a batch job: the cost of the urgent lane's waits.
    pub cost: f64,
    pub cut_short: u64,
}

impl Figures {
    fn of(name: String, outcome: &Outcome, scenario: &Scenario) -> Self {
        let job = scenario.urgent_job;
        let median = median_rate(&scenario.profile, seconds(scenario.duration));
        let wait = |latency: Nanos| latency.saturating_sub(job);
        let mut all = Vec::with_capacity(outcome.urgent_latencies.len());
        let (mut normal, mut peak) = (Vec::new(), Vec::new());
        for (latency, submitted) in outcome
            .urgent_latencies
            .iter()
            .zip(&outcome.urgent_submissions)
        {
            all.push(wait(*latency));
            if scenario.profile.rate_at(seconds(*submitted)) > median {
                peak.push(wait(*latency));
            } else {
                normal.push(wait(*latency));
            }
        }
        let ratio = |mut waits: Vec<Nanos>| {
            waits.sort_unstable();
            percentile(&waits, 99.0).map(|p| p as f64 / job as f64)
        };
        let run_seconds = seconds(scenario.duration);
        let summary = outcome.summary();
        let batch_busy = outcome.batch_busy_seconds;
        Self {
            name,
            wait_p99: ratio(all).unwrap_or(f64::INFINITY),
            normal: ratio(normal),
            peak: ratio(peak),
            batch_per_second: summary.batch_per_second,
            workers: outcome.worker_seconds / run_seconds,
            cost: (outcome.worker_seconds - batch_busy).max(0.0) / run_seconds,
            cut_short: outcome.cut_short,
        }
    }
}

/// The rate the profile runs at or below half the time.
fn median_rate(profile: &RateProfile, end: f64) -> f64 {
    let mut spans: Vec<(f64, f64)> = profile
        .phases(end)
        .into_iter()
        .map(|(from, to, rate)| (rate, to - from))
        .collect();
    spans.sort_by(|a, b| a.0.total_cmp(&b.0));
    let mut covered = 0.0;
    for (rate, length) in &spans {
        covered += length;
        if covered >= end / 2.0 {
            return *rate;
        }
    }
    spans.last().map_or(0.0, |(rate, _)| *rate)
}

/// One shape and seed: lanepool, KEDA's two-list arm at each knob setting (the first is KEDA's
/// defaults) and its strict-priority arm.
#[derive(Clone, Debug)]
pub struct Case {
    pub lanepool: Figures,
    pub keda: Vec<Figures>,
    pub strict: Figures,
}

impl Case {
    /// KEDA's defaults (`listLength` 5, `pollingInterval` 30 s, one replica kept).
    pub fn keda_default(&self) -> &Figures {
        let default = Knobs::DEFAULT.name();
        self.keda
            .iter()
            .find(|f| f.name == default)
            .unwrap_or(&self.keda[0])
    }

    /// KEDA's cheapest setting whose urgent wait p99 is no worse than lanepool's, if any.
    pub fn keda_at_equal_wait(&self) -> Option<&Figures> {
        self.keda
            .iter()
            .chain([&self.strict])
            .filter(|f| f.wait_p99 <= self.lanepool.wait_p99)
            .min_by(|a, b| a.cost.total_cmp(&b.cost))
    }

    /// KEDA's shortest urgent wait p99 among its settings that cost no more than lanepool.
    pub fn keda_at_equal_cost(&self) -> Option<&Figures> {
        self.keda
            .iter()
            .chain([&self.strict])
            .filter(|f| f.cost <= self.lanepool.cost)
            .min_by(|a, b| a.wait_p99.total_cmp(&b.wait_p99))
    }

    /// Mean workers lanepool saves against KEDA at equal wait: positive when lanepool pays less
    /// for the same or a shorter wait; `None` when no KEDA setting waits as little.
    pub fn saved(&self) -> Option<f64> {
        self.keda_at_equal_wait()
            .map(|k| k.cost - self.lanepool.cost)
    }

    /// Whether some KEDA setting beats lanepool: waits no longer and costs less.
    pub fn dominated(&self) -> bool {
        self.saved().is_some_and(|saved| saved < 0.0)
    }
}

/// Every arm of one shape and seed.
pub fn case(
    shape: &Shape,
    duration: Duration,
    seed: u64,
    workers: u32,
    config: &Autoscale,
) -> Case {
    let world = scenario(shape, duration, seed, workers);
    let arm = |name: String, scenario: Scenario| {
        let outcome = run(&scenario);
        Figures::of(name, &outcome, &scenario)
    };
    let lanepool = arm(
        "lanepool".into(),
        Scenario {
            autoscale: Some(config.clone()),
            ..world.clone()
        },
    );
    let pod_start = config.pod_start;
    let keda = sweep(workers)
        .into_iter()
        .map(|knobs| {
            let two = Arm::two_lists(workers, workers / 2, knobs, pod_start);
            arm(
                knobs.name(),
                Scenario {
                    arrangement: Arrangement::Dedicated,
                    keda: Some(two),
                    ..world.clone()
                },
            )
        })
        .collect();
    let strict = arm(
        "strict".into(),
        Scenario {
            arrangement: Arrangement::Strict,
            keda: Some(Arm::strict(workers, Knobs::DEFAULT, pod_start)),
            ..world
        },
    );
    Case {
        lanepool,
        keda,
        strict,
    }
}

fn mean(values: impl Iterator<Item = f64>) -> f64 {
    let (sum, n) = values.fold((0.0, 0), |(s, n), v| (s + v, n + 1));
    if n == 0 { f64::NAN } else { sum / n as f64 }
}

fn ratio(value: f64) -> String {
    if value.is_finite() {
        format!("{value:.2}")
    } else {
        "-".into()
    }
}

/// The table: per shape, the seeds' means; the worst seed where KEDA matches lanepool's wait.
pub fn table(set: &Set, duration: Duration, config: &Autoscale) -> String {
    let jobs: Vec<(&Shape, u64)> = set
        .shapes
        .iter()
        .flat_map(|shape| set.seeds.iter().map(move |seed| (shape, *seed)))
        .collect();
    let cases = in_parallel(&jobs, |(shape, seed)| {
        case(shape, duration, *seed, set.workers, config)
    });
    let mut lines = vec![
        "wait: urgent wait p99 ÷ urgent job time, at normal load / at peaks; cost: mean workers not on a batch job; paid: mean Pods".to_string(),
        "KEDA@wait: the cost of KEDA's cheapest setting whose wait p99 is no longer than lanepool's; KEDA@cost: the shortest wait p99 (whole run) of a KEDA setting that costs no more".to_string(),
        format!(
            "{:<11} | {:>11} {:>5} {:>5} {:>7} | {:>13} {:>5} {:>5} {:>7} | {:>11} {:>5} | {:>9} {:>9}",
            "profile",
            "lanepool",
            "cost",
            "paid",
            "batch/s",
            "KEDA defaults",
            "cost",
            "paid",
            "batch/s",
            "KEDA strict",
            "cost",
            "KEDA@wait",
            "KEDA@cost",
        ),
    ];
    let waits = |figures: &[&Figures]| {
        format!(
            "{}/{}",
            ratio(mean(figures.iter().filter_map(|f| f.normal))),
            ratio(mean(figures.iter().filter_map(|f| f.peak)))
        )
    };
    for (i, shape) in set.shapes.iter().enumerate() {
        let row = &cases[i * set.seeds.len()..(i + 1) * set.seeds.len()];
        let lanepool: Vec<&Figures> = row.iter().map(|c| &c.lanepool).collect();
        let default: Vec<&Figures> = row.iter().map(Case::keda_default).collect();
        let strict: Vec<&Figures> = row.iter().map(|c| &c.strict).collect();
        let at_wait: Vec<&Figures> = row.iter().filter_map(Case::keda_at_equal_wait).collect();
        let at_cost: Vec<&Figures> = row.iter().filter_map(Case::keda_at_equal_cost).collect();
        let matched = |figures: &[&Figures], value: fn(&Figures) -> f64| {
            if figures.len() < row.len() {
                format!("none in {}", row.len() - figures.len())
            } else {
                format!("{:.2}", mean(figures.iter().map(|f| value(f))))
            }
        };
        lines.push(format!(
            "{:<11} | {:>11} {:>5.2} {:>5.2} {:>7.1} | {:>13} {:>5.2} {:>5.2} {:>7.1} | {:>11} {:>5.2} | {:>9} {:>9}",
            shape.name,
            waits(&lanepool),
            mean(lanepool.iter().map(|f| f.cost)),
            mean(lanepool.iter().map(|f| f.workers)),
            mean(lanepool.iter().map(|f| f.batch_per_second)),
            waits(&default),
            mean(default.iter().map(|f| f.cost)),
            mean(default.iter().map(|f| f.workers)),
            mean(default.iter().map(|f| f.batch_per_second)),
            waits(&strict),
            mean(strict.iter().map(|f| f.cost)),
            matched(&at_wait, |f| f.cost),
            matched(&at_cost, |f| f.wait_p99),
        ));
    }
    let unmatched = cases.iter().filter(|c| c.saved().is_none()).count();
    let dominated = cases.iter().filter(|c| c.dominated()).count();
    let worst = cases
        .iter()
        .filter_map(Case::saved)
        .fold(f64::INFINITY, f64::min);
    let above = |value: Option<f64>| value.is_some_and(|v| v > 1.0);
    let lanepool_over = cases.iter().filter(|c| above(c.lanepool.normal)).count();
    let default_over = cases
        .iter()
        .filter(|c| above(c.keda_default().normal))
        .count();
    let cut_lanepool: u64 = cases.iter().map(|c| c.lanepool.cut_short).sum();
    let cut_keda: u64 = cases
        .iter()
        .flat_map(|c| c.keda.iter().chain([&c.strict]))
        .map(|f| f.cut_short)
        .sum();
    lines.push(format!(
        "\n{} profiles × {} seeds, {} each, {} workers, pods starting in {}; KEDA: two Deployments (urgent at most {}) swept over listLength 1, 2, 5, 10 × pollingInterval 5 s, 30 s × minReplicaCount {}, and one strict-priority Deployment.\n\
         KEDA beats lanepool (waits no longer and costs less) in {dominated} of {} runs; no KEDA setting waits as little in {unmatched}; where one does, lanepool's saving is at worst {} workers.\n\
         Wait p99 above the job time at normal load: lanepool in {lanepool_over} runs, KEDA's defaults in {default_over}. Jobs cut short: lanepool {cut_lanepool}, KEDA {cut_keda} (every setting).",
        set.shapes.len(),
        set.seeds.len(),
        trim(duration.as_secs_f64() / 60.0) + " min",
        set.workers,
        trim(seconds(config.pod_start)) + " s",
        set.workers / 2,
        floors(set.workers)
            .iter()
            .map(u32::to_string)
            .collect::<Vec<_>>()
            .join(", "),
        cases.len(),
        if worst.is_finite() {
            format!("{worst:+.2}")
        } else {
            "-".into()
        },
    ));
    lines.join("\n")
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::simulate::engine::autoscale::lanepool_defaults;
    use crate::simulate::studies::suite::{shapes, steps};

    #[test]
    fn the_median_rate_weighs_each_rate_by_how_long_it_runs() {
        // 30/s for 100 s, 150/s for 20 s, 30/s for 80 s: the median is the base.
        let spike = steps(&[(0.0, 30.0), (100.0, 150.0), (120.0, 30.0)]);
        assert_eq!(median_rate(&spike, 200.0), 30.0);
        // 20/s for 40 s, 60/s for 160 s: most of the run is at 60/s.
        let step = steps(&[(0.0, 20.0), (40.0, 60.0)]);
        assert_eq!(median_rate(&step, 200.0), 60.0);
    }

    #[test]
    fn the_sweep_starts_from_kedas_defaults_reach_and_covers_the_floors() {
        let knobs = sweep(10);
        assert_eq!(knobs.len(), 4 * 2 * 6);
        assert!(knobs.contains(&Knobs::DEFAULT));
        let mins: std::collections::BTreeSet<u32> = knobs.iter().map(|k| k.min).collect();
        assert_eq!(mins.into_iter().collect::<Vec<_>>(), vec![0, 1, 2, 3, 4, 5]);
        // A pool of 2 has no distinct floors: 0 and 1 only, no repeats.
        assert_eq!(sweep(2).len(), 4 * 2 * 2);
    }

    #[test]
    fn on_a_spike_keda_waits_for_a_queue_and_lanepool_does_not() {
        let shape = shapes()
            .into_iter()
            .find(|s| s.name == "spikes-20s")
            .unwrap_or_else(|| panic!("the suite has spikes-20s"));
        let c = case(
            &shape,
            Duration::from_secs(600),
            1,
            10,
            &lanepool_defaults(10),
        );
        let default = c.keda_default();
        // Every arm paid for its Pods, none more than the pool and a rollout's surge.
        for f in [&c.lanepool, default, &c.strict] {
            assert!(f.workers > 1.0 && f.workers < 11.0, "{f:?}");
            assert!(f.cost >= 0.0 && f.cost <= f.workers, "{f:?}");
        }
        // KEDA's Deployments grow only once a list is long: the spike's jobs wait seconds,
        // lanepool's within a few job times.
        assert!(default.peak.is_some_and(|p| p > 20.0), "{default:?}");
        assert!(c.lanepool.peak.is_some_and(|p| p < 5.0), "{:?}", c.lanepool);
        // Strict priority keeps every worker on batch: the cheapest, and the urgent lane waits
        // for batch jobs (100-300 ms against 20 ms).
        assert!(c.strict.cost < c.lanepool.cost, "{:?}", c.strict);
        assert!(c.strict.normal.is_some_and(|n| n > 2.0), "{:?}", c.strict);
    }
}
