//! The producers: urgent jobs arriving as a Poisson process that follows a rate profile, and
//! batch jobs as a backlog queued at the start plus a steady Poisson trickle. Seeded, so the same
//! flags submit the same jobs at the same offsets.

use std::sync::Arc;
use std::time::Duration;

use lanepool::simulate::Pcg32;
use lanepool::simulate::RateProfile;
use lanepool::simulate::{ArrivalKind, Arrivals};

use crate::lanes::Lanes;

/// Submits urgent jobs of `job_time` following `profile`, until the profile stays at zero.
pub async fn urgent(lanes: Arc<Lanes>, profile: RateProfile, job_time: Duration, seed: u64) {
    let job_ms = job_time.as_millis() as u64;
    let mut arrivals = Arrivals::new(&profile, ArrivalKind::Poisson, Pcg32::new(seed, 1));
    let start = tokio::time::Instant::now();
    while let Some(at) = arrivals.next_seconds() {
        tokio::time::sleep_until(start + Duration::from_secs_f64(at)).await;
        let _ = lanes.submit("urgent", job_ms);
    }
}

/// Queues `backlog` batch jobs at once, then submits `rate` a second; each job takes a time
/// drawn uniformly from `job_ms` (both ends included).
pub async fn batch(lanes: Arc<Lanes>, backlog: u64, rate: f64, job_ms: (u64, u64), seed: u64) {
    let mut job_times = Pcg32::new(seed, 2);
    for _ in 0..backlog {
        let _ = lanes.submit("batch", job_times.between(job_ms.0, job_ms.1));
    }
    let profile = RateProfile::constant(rate);
    let mut arrivals = Arrivals::new(&profile, ArrivalKind::Poisson, Pcg32::new(seed, 3));
    let start = tokio::time::Instant::now();
    while let Some(at) = arrivals.next_seconds() {
        tokio::time::sleep_until(start + Duration::from_secs_f64(at)).await;
        let _ = lanes.submit("batch", job_times.between(job_ms.0, job_ms.1));
    }
}
