//! `--bench`: times the guide's 8 cells and a 10-minute day at a 150/s peak with the operator in
//! the loop, and prints the timings. Meant for release builds; debug builds are much slower.

use std::time::Instant;

use super::arrivals::ArrivalKind;
use super::engine;
use super::guide::{self, RATES};
use super::profile::RateProfile;
use super::scenario::{Arrangement, Autoscale, Scenario};
use crate::sizing::{LaneSizing, PoolSize, PoolSizing, Rule, UnavailablePolicy};
use std::time::Duration;

/// The operator's defaults, budget mode, reserve between 1 and `workers − 1`.
pub fn default_autoscale(workers: u32) -> Autoscale {
    Autoscale {
        sizing: PoolSizing {
            lanes: vec![LaneSizing {
                name: super::autoscale::LANE.to_string(),
                min: 1,
                max: workers as i32 - 1,
                rule: Rule::Formula,
            }],
            headroom: 1.5,
            size: PoolSize::Budget {
                total: workers as i32,
                shared_min: 1,
            },
            stabilization_window: Duration::from_secs(300),
            on_unavailable: UnavailablePolicy::Hold,
        },
        interval: 30_000_000_000,
        rate_window: 60_000_000_000,
        job_time_window: 300_000_000_000,
        scrape_delay: 15_000_000_000,
        pod_start: 10_000_000_000,
    }
}

/// A day's shape over `duration`, Poisson, 1,000,000 backlog, the operator in the loop.
pub fn day(peak: f64, duration_secs: u64, seed: u64) -> Scenario {
    Scenario {
        arrivals: ArrivalKind::Poisson,
        profile: RateProfile::day(peak, duration_secs as f64),
        backlog: 1_000_000,
        duration: duration_secs * 1_000_000_000,
        autoscale: Some(default_autoscale(10)),
        window: 30_000_000_000,
        seed,
        ..Scenario::guide(Arrangement::ReservedShared, peak)
    }
}

pub fn run_bench() -> (Duration, Duration, u64) {
    let start = Instant::now();
    for arrangement in Arrangement::ALL {
        for rate in RATES {
            std::hint::black_box(engine::run(&guide::scenario(arrangement, rate)));
        }
    }
    let cells = start.elapsed();
    let start = Instant::now();
    let outcome = std::hint::black_box(engine::run(&day(150.0, 600, 1)));
    (cells, start.elapsed(), outcome.urgent_submitted)
}

pub fn run() -> String {
    let (cells, day, jobs) = run_bench();
    format!(
        "guide's 8 cells (one seed each): {:.2} ms\n10-minute day at 150/s peak, autoscaled ({jobs} urgent jobs): {:.2} ms",
        cells.as_secs_f64() * 1e3,
        day.as_secs_f64() * 1e3
    )
}
