//! Load generator for the demo: stands in for a pool's producers and workers and exports the
//! worker metric convention (`lanepool_jobs_submitted_total`, `lanepool_job_duration_seconds`)
//! for an urgent lane that follows a rate profile and a steady batch lane.
//!
//!     cargo run --example loadgen --features testenv -- --listen 127.0.0.1:9464 \
//!         --namespace demo --pool jobs --urgent-profile 0s=30,40s=150,80s=30

use std::net::SocketAddr;
use std::process::ExitCode;
use std::time::{Duration, Instant};

use clap::Parser;
use lanepool::duration;
use lanepool::simulate::profile::RateProfile;
use lanepool::testenv::SimulatedWorkers;

/// Exports simulated lane load for Prometheus to scrape.
#[derive(Parser)]
struct Args {
    /// Address to serve /metrics on.
    #[arg(long, default_value = "127.0.0.1:9464")]
    listen: SocketAddr,
    /// The LanePool's namespace (the `namespace` label).
    #[arg(long, default_value = "demo")]
    namespace: String,
    /// The LanePool's name (the `pool` label).
    #[arg(long, default_value = "jobs")]
    pool: String,
    /// Urgent arrival rate over time: `0s=30,40s=150,80s=30` (jobs per second from each time).
    #[arg(long, default_value = "0s=30,40s=150,80s=30")]
    urgent_profile: String,
    /// Urgent job time.
    #[arg(long, default_value = "20ms", value_parser = job_time)]
    urgent_job_time: Duration,
    /// Batch arrival rate (steady).
    #[arg(long, default_value_t = 40.0)]
    batch_rate: f64,
    /// Batch job time.
    #[arg(long, default_value = "200ms", value_parser = job_time)]
    batch_job_time: Duration,
}

fn job_time(value: &str) -> Result<Duration, String> {
    duration::parse(value).map_err(|e| e.to_string())
}

fn main() -> ExitCode {
    let args = Args::parse();
    let profile = match RateProfile::parse(&args.urgent_profile) {
        Ok(profile) => profile,
        Err(e) => {
            eprintln!("error: {e}");
            return ExitCode::from(2);
        }
    };
    let workers = match SimulatedWorkers::start_on(args.listen) {
        Ok(workers) => workers,
        Err(e) => {
            eprintln!("error: --listen: {e}");
            return ExitCode::from(2);
        }
    };
    eprintln!("loadgen: serving /metrics on http://{}", workers.addr());
    let started = Instant::now();
    loop {
        let now = started.elapsed().as_secs_f64();
        let urgent = profile.rate_at(now);
        let (ns, pool) = (&args.namespace, &args.pool);
        workers.set_lane(
            ns,
            pool,
            "urgent",
            urgent,
            args.urgent_job_time.as_secs_f64(),
        );
        workers.set_lane(
            ns,
            pool,
            "batch",
            args.batch_rate,
            args.batch_job_time.as_secs_f64(),
        );
        std::thread::sleep(Duration::from_millis(250));
    }
}
