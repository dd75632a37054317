//! The demo's producers and lane queues in one process: urgent jobs following a rate profile,
//! a batch backlog plus a steady batch rate, one FIFO queue per lane, a small HTTP API for lane
//! workers (`examples/lane_worker.rs`), and the worker metric convention on /metrics.
//!
//!     cargo run --example lane_queue -- --listen 127.0.0.1:9464 --namespace demo --pool jobs \
//!         --urgent-profile 0s=30,40s=150,80s=30 --batch-backlog 2000 --batch-rate 40
//!
//! It prints `lane_queue: listening on http://ADDR` once it serves (`--listen 127.0.0.1:0` picks
//! a free port). Jobs live in memory only: this is a stand-in for a real queue, never one.

mod http;
mod lanes;
mod producers;

use std::io::Write as _;
use std::net::SocketAddr;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use clap::Parser;
use lanepool::duration;
use lanepool::simulate::RateProfile;

use lanes::Lanes;

/// The lanes of the demo's pool, in priority order.
const LANES: [&str; 2] = ["urgent", "batch"];

/// Lane queues with producers, served to lane workers over HTTP.
#[derive(Parser)]
struct Args {
    /// Address to serve the worker API and /metrics on.
    #[arg(long, default_value = "127.0.0.1:9464")]
    listen: SocketAddr,
    /// The LanePool's namespace (the `namespace` label).
    #[arg(long, default_value = "demo")]
    namespace: String,
    /// The LanePool's name (the `pool` label).
    #[arg(long, default_value = "jobs")]
    pool: String,
    /// Urgent arrival rate over time, Poisson: `0s=30,40s=150,80s=30` (jobs per second from
    /// each time). `0s=0` submits none.
    #[arg(long, default_value = "0s=30,40s=150,80s=30")]
    urgent_profile: String,
    /// Urgent job time.
    #[arg(long, default_value = "20ms", value_parser = job_time)]
    urgent_job_time: Duration,
    /// Batch jobs queued at the start.
    #[arg(long, default_value_t = 2000)]
    batch_backlog: u64,
    /// Batch arrival rate after the backlog, jobs per second, Poisson.
    #[arg(long, default_value_t = 40.0)]
    batch_rate: f64,
    /// Batch job time in milliseconds, uniform in LOW..HIGH.
    #[arg(long, default_value = "100..300", value_parser = milliseconds_range)]
    batch_ms: (u64, u64),
    /// Longest a take waits for a job before answering 204.
    #[arg(long, default_value = "1s", value_parser = job_time)]
    long_poll: Duration,
    /// Seed of the arrivals and batch job times.
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// Write every take's exact wait and every worker's round between two takes to this file
    /// (a line each; see `lanes::JobLog`).
    #[arg(long)]
    job_log: Option<std::path::PathBuf>,
}

fn job_time(value: &str) -> Result<Duration, String> {
    duration::parse(value).map_err(|e| e.to_string())
}

fn milliseconds_range(value: &str) -> Result<(u64, u64), String> {
    let (low, high) = value
        .split_once("..")
        .ok_or_else(|| format!("{value:?} is not LOW..HIGH in milliseconds, such as 100..300"))?;
    let parse = |ms: &str| {
        ms.trim()
            .parse::<u64>()
            .map_err(|_| format!("{ms:?} is not a whole number of milliseconds"))
    };
    let (low, high) = (parse(low)?, parse(high)?);
    if low > high {
        return Err(format!("{low}..{high}: LOW must not exceed HIGH"));
    }
    Ok((low, high))
}

#[tokio::main]
async fn main() -> ExitCode {
    let args = Args::parse();
    let profile = match RateProfile::parse(&args.urgent_profile) {
        Ok(profile) => profile,
        Err(e) => {
            eprintln!("lane_queue: error: {e}");
            return ExitCode::from(2);
        }
    };
    if !(args.batch_rate.is_finite() && args.batch_rate >= 0.0) {
        eprintln!("lane_queue: error: --batch-rate must be 0 or more");
        return ExitCode::from(2);
    }
    let listener = match tokio::net::TcpListener::bind(args.listen).await {
        Ok(listener) => listener,
        Err(e) => {
            eprintln!("lane_queue: error: --listen {}: {e}", args.listen);
            return ExitCode::from(2);
        }
    };
    let addr = listener.local_addr().unwrap_or(args.listen);
    let log = match args
        .job_log
        .as_deref()
        .map(lanes::JobLog::create)
        .transpose()
    {
        Ok(log) => log,
        Err(e) => {
            eprintln!("lane_queue: error: --job-log: {e}");
            return ExitCode::from(2);
        }
    };
    let lanes = Arc::new(Lanes::new(&args.namespace, &args.pool, &LANES, log));

    tokio::spawn(http::serve(listener, lanes.clone(), args.long_poll));
    tokio::spawn(producers::urgent(
        lanes.clone(),
        profile,
        args.urgent_job_time,
        args.seed,
    ));
    tokio::spawn(producers::batch(
        lanes.clone(),
        args.batch_backlog,
        args.batch_rate,
        args.batch_ms,
        args.seed,
    ));
    println!("lane_queue: listening on http://{addr}");
    let _ = std::io::stdout().flush();
    eprintln!(
        "lane_queue: pool {}/{}, urgent {} at {} ms, batch backlog {} + {}/s at {}..{} ms",
        args.namespace,
        args.pool,
        args.urgent_profile,
        args.urgent_job_time.as_millis(),
        args.batch_backlog,
        args.batch_rate,
        args.batch_ms.0,
        args.batch_ms.1,
    );

    stopped().await;
    eprintln!("lane_queue: stopping");
    ExitCode::SUCCESS
}

/// Resolves on SIGTERM or Ctrl-C.
async fn stopped() {
    use tokio::signal::unix::{SignalKind, signal};
    match signal(SignalKind::terminate()) {
        Ok(mut term) => {
            tokio::select! {
                _ = term.recv() => {}
                _ = tokio::signal::ctrl_c() => {}
            }
        }
        Err(_) => {
            let _ = tokio::signal::ctrl_c().await;
        }
    }
}
