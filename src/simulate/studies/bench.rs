//! `--bench`: times the guide's 8 cells and a 10-minute day at a 150/s peak with the operator in
//! the loop, and prints the timings. Meant for release builds; debug builds are much slower.

use std::time::Instant;

use super::guide::{self, RATES};
use crate::simulate::engine;
use crate::simulate::engine::arrivals::ArrivalKind;
use crate::simulate::engine::autoscale::lanepool_defaults;
use crate::simulate::engine::profile::RateProfile;
use crate::simulate::engine::scenario::{Arrangement, Scenario};
use std::time::Duration;

/// A day's shape over `duration`, Poisson, 1,000,000 backlog, the operator in the loop.
pub fn day(peak: f64, duration_secs: u64, seed: u64) -> Scenario {
    Scenario {
        arrivals: ArrivalKind::Poisson,
        profile: RateProfile::day(peak, duration_secs as f64),
        backlog: 1_000_000,
        duration: duration_secs * 1_000_000_000,
        autoscale: Some(lanepool_defaults(10)),
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
