//! `--suite --steady`: the absolute promise at steady load. For each urgent job time, batch job
//! time, pool size and urgent rate, a default pool runs at one constant Poisson rate, and its
//! urgent wait p99 after the warm-up is set against the job time: the guide's test of a working
//! pool and what `LanePoolReserveTooSmall` checks. A fixed grid and cells drawn from seeds.
//! It judges the sizing; it must never tune it.

use std::time::Duration;

use super::in_parallel;
use crate::duration::human_seconds;
use crate::simulate::engine::arrivals::ArrivalKind;
use crate::simulate::engine::autoscale::lanepool_defaults;
use crate::simulate::engine::profile::RateProfile;
use crate::simulate::engine::rng::Pcg32;
use crate::simulate::engine::run;
use crate::simulate::engine::scenario::{Arrangement, QUEUE_HANDOFF, Scenario, nanos};
use crate::sizing::{PoolSize, SharedHelp, wait_within_job_time};

/// Urgent job times of the grid, in milliseconds.
pub const JOB_MS: [f64; 5] = [5.0, 20.0, 100.0, 500.0, 2000.0];
/// Mean batch job time as a multiple of the urgent one.
pub const BATCH_RATIOS: [f64; 3] = [1.0, 5.0, 20.0];
/// Workers in the pool.
pub const WORKERS: [u32; 4] = [4, 10, 40, 200];
/// Urgent load as a share of the whole pool's capacity (workers ÷ job time).
pub const LOADS: [f64; 4] = [0.05, 0.15, 0.3, 0.5];
/// Cells drawn from seeds, beside the grid: shapes of pool the grid does not hold.
pub const DRAWN: u64 = 60;
/// The seed the drawn cells come from.
pub const DRAW_SEED: u64 = 4_242;

/// How long the pool runs before its wait is counted: the reserve starts at min and grows.
const WARM_UP: Duration = Duration::from_secs(120);
/// Urgent jobs counted after the warm-up, about: enough for a p99 that does not wander.
const JOBS: f64 = 30_000.0;
const SHORTEST: Duration = Duration::from_secs(10 * 60);
const LONGEST: Duration = Duration::from_secs(24 * 3600);

/// One pool at one steady rate.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Cell {
    pub job_ms: f64,
    pub batch_ratio: f64,
    pub workers: u32,
    /// Share of the pool's capacity the urgent lane asks for.
    pub load: f64,
}

impl Cell {
    pub fn rate(&self) -> f64 {
        self.load * f64::from(self.workers) / (self.job_ms / 1e3)
    }

    fn duration(&self) -> Duration {
        let counted = Duration::from_secs_f64(JOBS / self.rate());
        (WARM_UP + counted).clamp(SHORTEST, LONGEST)
    }

    pub fn scenario(&self, seed: u64) -> Scenario {
        let mean_batch = self.job_ms * self.batch_ratio;
        let (low, high) = (mean_batch * 0.5, mean_batch * 1.5);
        let duration = nanos(self.duration());
        Scenario {
            arrangement: Arrangement::ReservedShared,
            workers: self.workers,
            reserved: 1,
            urgent_job: (self.job_ms * 1e6).round() as u64,
            batch_job: ((low * 1e6).round() as u64, (high * 1e6).round() as u64),
            backlog: u64::MAX,
            handoff: QUEUE_HANDOFF,
            duration,
            drain: 0,
            arrivals: ArrivalKind::Poisson,
            profile: RateProfile::constant(self.rate()),
            seed,
            autoscale: Some(lanepool_defaults(self.workers)),
            keda: None,
            window: nanos(WARM_UP),
        }
    }
}

/// The fixed grid: every job time × batch ratio × pool × load.
pub fn grid() -> Vec<Cell> {
    let mut cells = Vec::new();
    for job_ms in JOB_MS {
        for batch_ratio in BATCH_RATIOS {
            for workers in WORKERS {
                for load in LOADS {
                    cells.push(Cell {
                        job_ms,
                        batch_ratio,
                        workers,
                        load,
                    });
                }
            }
        }
    }
    cells
}

/// Cells drawn from `seed`: job time log-uniform in 5 ms–2 s, batch 1–20 × that, 4–200
/// workers log-uniform, load up to half the pool.
pub fn drawn(seed: u64, count: u64) -> Vec<Cell> {
    let mut rng = Pcg32::new(seed, 31);
    let log_between = |rng: &mut Pcg32, low: f64, high: f64| {
        (low.ln() + (high.ln() - low.ln()) * rng.unit()).exp()
    };
    (0..count)
        .map(|_| Cell {
            job_ms: (log_between(&mut rng, 5.0, 2000.0) * 10.0).round() / 10.0,
            batch_ratio: ((1.0 + 19.0 * rng.unit()) * 10.0).round() / 10.0,
            workers: log_between(&mut rng, 4.0, 200.0).round() as u32,
            load: ((0.01 + 0.49 * rng.unit()) * 1000.0).round() / 1000.0,
        })
        .collect()
}

/// What a default pool did in one cell.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Measured {
    pub cell: Cell,
    /// Urgent wait p99 (submission to start) after the warm-up, in milliseconds.
    pub wait_p99_ms: f64,
    /// Mean reserve after the warm-up.
    pub reserve: f64,
    pub batch_per_second: f64,
    /// Reserve changes after the warm-up.
    pub changes: usize,
    /// The reserve the sizing asks for at the true rate, when `reserve.max` is below it: the
    /// pool reports `ScalingLimited` and the promise is out of its bounds.
    pub capped: Option<i32>,
}

impl Measured {
    /// Wait p99 over the job time: at most 1 keeps the promise.
    pub fn ratio(&self) -> f64 {
        self.wait_p99_ms / self.cell.job_ms
    }

    /// Whether the promise holds here: within the job time, or out of the reserve's bounds.
    pub fn kept(&self) -> bool {
        self.ratio() <= 1.0 || self.capped.is_some()
    }
}

pub fn measure(cell: Cell, seed: u64) -> Measured {
    let scenario = cell.scenario(seed);
    let outcome = run(&scenario);
    // The first window is the warm-up.
    let warm_up = scenario.window;
    let after = outcome.summary_from(warm_up);
    let wait_p99_ms = after
        .p99_ms
        .map_or(f64::INFINITY, |p| p - cell.job_ms)
        .max(0.0);
    let sizing = &scenario
        .autoscale
        .as_ref()
        .expect("a steady cell is autoscaled")
        .sizing;
    let (low, high) = scenario.batch_job;
    let help = match sizing.size {
        PoolSize::Budget { total, shared_min } => SharedHelp {
            job_seconds: (low / 2 + high / 2) as f64 / 1e9,
            unreserved: total,
            least: shared_min,
        },
        PoolSize::Shared { replicas } => SharedHelp {
            job_seconds: (low / 2 + high / 2) as f64 / 1e9,
            unreserved: 0,
            least: replicas,
        },
    };
    let needed = wait_within_job_time(cell.rate(), cell.job_ms / 1e3, sizing.headroom, Some(help))
        .unwrap_or(i32::MAX);
    let most = sizing.lanes.first().map_or(0, |lane| lane.max);
    Measured {
        cell,
        wait_p99_ms,
        reserve: outcome.mean_reserve(warm_up, outcome.duration),
        batch_per_second: after.batch_per_second,
        changes: outcome
            .reserve_steps
            .iter()
            .filter(|(at, _)| *at > warm_up)
            .count(),
        capped: (needed > most).then_some(needed),
    }
}

/// Every cell of the grid and the drawn ones, on both cores: those within the reserve's bounds
/// first, worst (highest wait ÷ job time) first, then those beyond `reserve.max`.
pub fn measured_cells() -> Vec<Measured> {
    let cells: Vec<Cell> = grid().into_iter().chain(drawn(DRAW_SEED, DRAWN)).collect();
    let mut measured = in_parallel(&cells, |cell| measure(*cell, 1));
    measured.sort_by(|a, b| {
        (a.capped.is_some())
            .cmp(&b.capped.is_some())
            .then(b.ratio().total_cmp(&a.ratio()))
    });
    measured
}

/// The grid as a table, worst cell first, with a summary line.
pub fn table() -> String {
    let measured = measured_cells();
    let mut lines = vec![format!(
        "{:>8} {:>9} {:>7} {:>6} {:>9} {:>11} {:>9} {:>8} {:>8} {:>7}  {}",
        "job",
        "batch",
        "workers",
        "load",
        "rate/s",
        "wait p99",
        "÷ job",
        "reserve",
        "batch/s",
        "resizes",
        "bounds"
    )];
    for m in &measured {
        let c = m.cell;
        lines.push(format!(
            "{:>8} {:>9} {:>7} {:>5.0}% {:>9.2} {:>11} {:>9.2} {:>8.2} {:>8.2} {:>7}  {}",
            human_seconds(c.job_ms / 1e3),
            format!("{}×", c.batch_ratio),
            c.workers,
            c.load * 100.0,
            c.rate(),
            human_seconds(m.wait_p99_ms / 1e3),
            m.ratio(),
            m.reserve,
            m.batch_per_second,
            m.changes,
            m.capped.map_or("within".to_string(), |needed| format!(
                "needs {needed} > reserve.max (ScalingLimited)"
            ))
        ));
    }
    let within: Vec<&Measured> = measured.iter().filter(|m| m.capped.is_none()).collect();
    let above = within.iter().filter(|m| !m.kept()).count();
    let worst = within.first().map_or(0.0, |m| m.ratio());
    lines.push(format!(
        "\n{} cells ({} on the grid, {DRAWN} drawn from seed {DRAW_SEED}), steady Poisson load, the defaults; {} within the reserve's bounds: {above} with urgent wait p99 above the job time, worst {worst:.2} × the job time; {} beyond reserve.max, reported as ScalingLimited",
        measured.len(),
        grid().len(),
        within.len(),
        measured.len() - within.len(),
    ));
    lines.join("\n")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_grid_spans_the_promised_ranges() {
        let cells = grid();
        assert_eq!(cells.len(), 5 * 3 * 4 * 4);
        for cell in cells.iter().chain(&drawn(DRAW_SEED, DRAWN)) {
            assert!((5.0..=2000.0).contains(&cell.job_ms), "{cell:?}");
            assert!((1.0..=20.0).contains(&cell.batch_ratio), "{cell:?}");
            assert!((4..=200).contains(&cell.workers), "{cell:?}");
            assert!(cell.load > 0.0 && cell.load <= 0.5, "{cell:?}");
        }
        assert_ne!(drawn(1, 5), drawn(2, 5));
    }

    #[test]
    fn a_default_pool_at_the_guides_normal_load_waits_less_than_the_job_time() {
        let guide = Cell {
            job_ms: 20.0,
            batch_ratio: 10.0,
            workers: 10,
            load: 0.06,
        };
        let measured = measure(guide, 1);
        assert!((guide.rate() - 30.0).abs() < 1e-9);
        assert!(measured.ratio() <= 1.0, "{measured:?}");
        assert!(measured.reserve >= 1.5, "{measured:?}");
    }
}
