//! The flags of `lanepool simulate` and their checks: every value from the user is checked
//! here, and a bad one is refused with the flag named, before anything runs.

use std::path::PathBuf;
use std::time::Duration;

use clap::ValueEnum;

use crate::duration;
use crate::simulate::SimulateError;
use crate::simulate::engine::arrivals::ArrivalKind;
use crate::simulate::engine::profile::RateProfile;
use crate::simulate::engine::scenario::{Arm, Knobs};
use crate::simulate::engine::scenario::{Arrangement, Autoscale, QUEUE_HANDOFF, Scenario, nanos};
use crate::sizing::{LaneSizing, PoolSize, PoolSizing, Rule};

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum ArrangementArg {
    Fifo,
    Strict,
    Dedicated,
    ReservedShared,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum ArrivalsArg {
    Even,
    Poisson,
}

/// An autoscaler to compare the default LanePool with.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum VersusArg {
    /// KEDA's Redis list scaler behind the HPA.
    Keda,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum OutputArg {
    Text,
    Json,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum SizingArg {
    /// The smallest reserve whose predicted urgent wait p99 is at most the job time, the
    /// operator's default.
    Queueing,
    /// ceil(arrival rate × job time × headroom).
    Formula,
    /// The smallest reserve whose predicted urgent p99 meets --target-p99.
    LatencyTarget,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum PoolSizeArg {
    /// A fixed budget of --workers: shared = workers − reserved (LanePool totalWorkers).
    Budget,
    /// Fixed shared workers (--workers − --reserved); reserved come on top (shared.replicas).
    Shared,
}

/// Simulate a worker pool with an urgent lane and a batch backlog.
#[derive(clap::Args, Debug, Clone)]
#[command(allow_negative_numbers = true)]
pub struct SimulateArgs {
    /// How workers are assigned to lanes.
    #[arg(long, value_enum, default_value = "reserved-shared")]
    pub arrangement: ArrangementArg,
    /// Workers in the pool (the budget with --autoscale).
    #[arg(long, default_value_t = 10)]
    pub workers: u32,
    /// Urgent-only workers (dedicated and reserved-shared); default 2. With --autoscale, the
    /// opening reserve comes from the sizing instead.
    #[arg(long)]
    pub reserved: Option<u32>,
    /// Urgent arrival rate, jobs per second (the peak with --urgent-profile day). Default 30.
    #[arg(long, value_name = "JOBS_PER_SECOND")]
    pub urgent_rate: Option<f64>,
    /// Urgent rate over time, such as 0s=30,120s=150,180s=30; or `day`: a day's shape over
    /// --duration, peaking at --urgent-rate.
    #[arg(long, value_name = "PROFILE")]
    pub urgent_profile: Option<String>,
    /// Urgent job time in milliseconds.
    #[arg(long, default_value_t = 20.0)]
    pub urgent_ms: f64,
    /// Batch job time in milliseconds: uniform LOW..HIGH, or one value.
    #[arg(long, default_value = "100..300")]
    pub batch_ms: String,
    /// Batch jobs queued at the start.
    #[arg(long, default_value_t = 2000)]
    pub backlog: u64,
    /// A worker's hand-off between two jobs in milliseconds: from one job's end to its next
    /// take reaching the queue (reporting it done, asking again), when it takes nothing. The
    /// default was measured on the demo's queue and workers over loopback HTTP.
    #[arg(long, default_value_t = QUEUE_HANDOFF as f64 / 1e6)]
    pub handoff_ms: f64,
    /// Length of the run: urgent jobs are submitted and completions counted within it.
    #[arg(long, default_value = "8s", value_parser = duration::flag)]
    pub duration: Duration,
    /// Leave out the run's first part: the figures count urgent jobs completed and batch jobs
    /// finished after it, per second of what is left. The run still starts at 0 s on the whole
    /// --urgent-profile, so a real run with the same seed and a warm-up gets the same
    /// arrivals. A whole number of --window, shorter than --duration.
    #[arg(long, default_value = "0s", value_parser = duration::flag)]
    pub warm_up: Duration,
    #[arg(long, value_enum, default_value = "even")]
    pub arrivals: ArrivalsArg,
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
    #[arg(long, value_enum, default_value = "text")]
    pub output: OutputArg,
    /// Width of each time-series window. Default: 1s, or --interval with --autoscale.
    #[arg(long, value_parser = duration::flag)]
    pub window: Option<Duration>,
    /// Write the time series as CSV to this file.
    #[arg(long, value_name = "FILE.csv")]
    pub series: Option<PathBuf>,
    /// Draw urgent rate, reserve, urgent p99 and batch throughput over time as SVG.
    #[arg(long, value_name = "FILE.svg")]
    pub plot: Option<PathBuf>,

    /// Compare, on this profile, every static split, the autoscaled pool (formula and several
    /// latency targets) and a per-phase oracle: urgent p99 against batch throughput.
    #[arg(long)]
    pub trade_off: bool,
    /// Judge the autoscaled pool, with the defaults a LanePool gets when the user sets nothing,
    /// on 14 traffic shapes × 3 seeds (20 minutes each, --workers in a budget, the shapes'
    /// rates scaled by --workers ÷ 10): its urgent p99 and batch throughput against the static
    /// splits' frontier and the hindsight oracle. Ignores the other flags.
    #[arg(long)]
    pub suite: bool,
    /// With --suite: the steady-load grid instead (urgent job time × batch job time × pool size
    /// × rate, and cells drawn from a seed): each default pool's urgent wait p99 against its job
    /// time, worst cell first.
    #[arg(long, requires = "suite", conflicts_with = "held_out")]
    pub steady: bool,
    /// With --suite: run the held-out shapes instead (7 families whose widths, heights, gaps
    /// and volatility are drawn from seeds the sizing was never tuned on), to check that what
    /// the suite shows generalizes.
    #[arg(long, requires = "suite")]
    pub held_out: bool,
    /// With --suite: run the shapes on these seeds instead of the set's own, such as
    /// 51234,8812,90017 (fresh seeds, drawn after the sizing is final, for a check nothing was
    /// tuned on).
    #[arg(
        long,
        requires = "suite",
        value_delimiter = ',',
        value_name = "SEED,..."
    )]
    pub suite_seeds: Vec<u64>,
    /// With --suite: run only these of the set's shapes, such as spikes-20s,walk-slow.
    #[arg(
        long,
        requires = "suite",
        value_delimiter = ',',
        value_name = "SHAPE,..."
    )]
    pub suite_shapes: Vec<String>,
    /// With --suite: each shape and seed also under what a team runs without lanepool, KEDA
    /// ScaledObjects on the lists' lengths behind the HPA, swept over its knobs: urgent wait p99
    /// at normal load and at peaks, batch jobs done, worker-seconds and jobs cut short per arm.
    /// Without --suite: this run's pool sized by KEDA instead of lanepool (the --keda-* flags):
    /// urgent-only and batch-only Deployments, a ScaledObject each on its list's length.
    #[arg(long, value_enum, value_name = "AUTOSCALER", conflicts_with_all = ["steady", "autoscale", "trade_off"])]
    pub versus: Option<VersusArg>,
    /// With --versus keda: the ScaledObjects' `listLength`, jobs waiting per replica.
    #[arg(long, default_value_t = 5.0)]
    pub keda_list_length: f64,
    /// With --versus keda: the ScaledObjects' `pollingInterval`.
    #[arg(long, default_value = "30s", value_parser = duration::flag)]
    pub keda_polling: Duration,
    /// With --versus keda: the ScaledObjects' `minReplicaCount`.
    #[arg(long, default_value_t = 1)]
    pub keda_min: u32,
    /// With --versus keda: the urgent ScaledObject's `maxReplicaCount`; the batch one gets the
    /// rest of --workers. Default: half of --workers.
    #[arg(long)]
    pub keda_urgent_max: Option<u32>,
    /// Print the guide's 4 × 2 table, our figures beside the guide's.
    #[arg(long)]
    pub guide_table: bool,
    /// Time the guide's 8 cells and a 10-minute day at 150/s, and print the timings.
    #[arg(long)]
    pub bench: bool,

    /// Run the operator's sizing decision in the loop (reserved-shared or dedicated).
    #[arg(long)]
    pub autoscale: bool,
    /// How the reserve is sized with --autoscale.
    #[arg(long, value_enum, default_value = "queueing")]
    pub sizing: SizingArg,
    /// The urgent p99 the latency-target sizing aims for, such as 25ms.
    #[arg(long, value_parser = duration::flag)]
    pub target_p99: Option<Duration>,
    /// How the pool's size is set with --autoscale.
    #[arg(long, value_enum, default_value = "budget")]
    pub pool_size: PoolSizeArg,
    /// How often the operator measures and resizes (a LanePool's spec.interval).
    #[arg(long, default_value = crate::api::DEFAULT_INTERVAL, value_parser = duration::flag)]
    pub interval: Duration,
    /// A reserve shrinks only to the highest recommendation inside this window.
    #[arg(long, default_value = crate::api::DEFAULT_STABILIZATION_WINDOW, value_parser = duration::flag)]
    pub stabilization_window: Duration,
    /// Multiplies busy workers; more than 0, at most 10.
    #[arg(long, default_value_t = crate::api::DEFAULT_HEADROOM)]
    pub headroom: f64,
    /// Fewest reserved workers.
    #[arg(long, default_value_t = 1)]
    pub reserve_min: i32,
    /// Most reserved workers. Default: --workers − --shared-min (budget), or --workers.
    #[arg(long)]
    pub reserve_max: Option<i32>,
    /// Fewest shared workers in budget mode.
    #[arg(long, default_value_t = 1)]
    pub shared_min: i32,
    /// Trailing window of the arrival-rate query.
    #[arg(long, default_value = crate::prometheus::DEFAULT_RATE_WINDOW, value_parser = duration::flag)]
    pub rate_window: Duration,
    /// How often Prometheus scrapes the workers: the recent arrival rate spans one scrape
    /// interval (irate), and never less than 5 s (the operator's rate() when scrapes are faster).
    /// 0: no recent rate, the operator follows --rate-window alone.
    #[arg(long, default_value = "15s", value_parser = duration::flag)]
    pub scrape_interval: Duration,
    /// Trailing window of the job-time query.
    #[arg(long, default_value = crate::prometheus::DEFAULT_JOB_TIME_WINDOW, value_parser = duration::flag)]
    pub job_time_window: Duration,
    /// Age of Prometheus's newest sample when the operator asks.
    #[arg(long, default_value = "15s", value_parser = duration::flag)]
    pub scrape_delay: Duration,
    /// From a role change (or a new pod) to the worker taking jobs; with `--suite`, the world
    /// its default pools run in.
    #[arg(long, default_value = "10s", value_parser = duration::flag)]
    pub pod_start: Duration,
    /// Whether the operator reads the workers' own finished-job counts each interval, as it
    /// does when they serve them at their `metrics` port (the default); false: Prometheus only.
    #[arg(long, default_value_t = true, action = clap::ArgAction::Set, value_name = "BOOL")]
    pub worker_reads: bool,
    /// Whether the shared workers a growing reserve replaces take only the urgent lane until
    /// the new reserved workers are ready, as the operator asks workers that serve a `metrics`
    /// port (the default); false: they stay shared until then.
    #[arg(long, default_value_t = true, action = clap::ArgAction::Set, value_name = "BOOL")]
    pub stand_ins: bool,
}

fn check(
    ok: bool,
    flag: &'static str,
    reason: impl FnOnce() -> String,
) -> Result<(), SimulateError> {
    if ok {
        Ok(())
    } else {
        Err(SimulateError::flag(flag, reason()))
    }
}

/// Reads `100..300` or `20` as milliseconds.
pub fn parse_millis_range(text: &str) -> Result<(f64, f64), SimulateError> {
    let bad = || {
        SimulateError::flag(
            "--batch-ms",
            format!("{text:?} is not LOW..HIGH milliseconds, such as 100..300"),
        )
    };
    let number = |s: &str| s.trim().parse::<f64>().map_err(|_| bad());
    let (low, high) = match text.split_once("..") {
        Some((low, high)) => (number(low)?, number(high)?),
        None => (number(text)?, number(text)?),
    };
    check(
        low.is_finite() && high.is_finite() && low > 0.0 && low <= high,
        "--batch-ms",
        || format!("{text:?}: LOW must be more than 0 and at most HIGH"),
    )?;
    Ok((low, high))
}

fn millis_to_nanos(ms: f64) -> u64 {
    (ms * 1e6).round() as u64
}

const MOST_WORKERS: u32 = 10_000;
const LONGEST_RUN: Duration = Duration::from_secs(31 * 24 * 3600);

impl SimulateArgs {
    pub fn arrangement(&self) -> Arrangement {
        match self.arrangement {
            ArrangementArg::Fifo => Arrangement::Fifo,
            ArrangementArg::Strict => Arrangement::Strict,
            ArrangementArg::Dedicated => Arrangement::Dedicated,
            ArrangementArg::ReservedShared => Arrangement::ReservedShared,
        }
    }

    /// The checked scenario these flags describe.
    pub fn scenario(&self) -> Result<Scenario, SimulateError> {
        let arrangement = self.arrangement();
        check(
            (1..=MOST_WORKERS).contains(&self.workers),
            "--workers",
            || format!("{} must be from 1 to {MOST_WORKERS}", self.workers),
        )?;
        let reserved = match (self.reserved, arrangement.reserves()) {
            (Some(r), false) if r > 0 => {
                return Err(SimulateError::flag(
                    "--reserved",
                    format!("{} has no reserved workers", arrangement.name()),
                ));
            }
            (_, false) => 0,
            (r, true) => r.unwrap_or(2),
        };
        check(reserved <= self.workers, "--reserved", || {
            format!("{reserved} is more than --workers {}", self.workers)
        })?;
        check(
            self.urgent_ms.is_finite() && self.urgent_ms > 0.0,
            "--urgent-ms",
            || format!("{} must be more than 0", self.urgent_ms),
        )?;
        let (low, high) = parse_millis_range(&self.batch_ms)?;
        check(
            self.handoff_ms.is_finite() && self.handoff_ms >= 0.0,
            "--handoff-ms",
            || format!("{} must be 0 or more", self.handoff_ms),
        )?;
        check(
            self.duration > Duration::ZERO && self.duration <= LONGEST_RUN,
            "--duration",
            || "must be more than 0 and at most 31 days".into(),
        )?;
        let rate = self.urgent_rate.unwrap_or(30.0);
        check(rate.is_finite() && rate >= 0.0, "--urgent-rate", || {
            format!("{rate} must be 0 or more")
        })?;
        let profile = match self.urgent_profile.as_deref() {
            None => RateProfile::constant(rate),
            Some("day") => RateProfile::day(rate, self.duration.as_secs_f64()),
            Some(steps) => {
                check(self.urgent_rate.is_none(), "--urgent-rate", || {
                    "give --urgent-rate or a step --urgent-profile, not both".into()
                })?;
                RateProfile::parse(steps)?
            }
        };
        let autoscale = if self.autoscale {
            check(arrangement.reserves(), "--autoscale", || {
                format!(
                    "{} has no reserve to size; use reserved-shared or dedicated",
                    arrangement.name()
                )
            })?;
            Some(self.autoscale_config(reserved)?)
        } else {
            None
        };
        let default_window = if self.autoscale {
            self.interval
        } else {
            Duration::from_secs(1)
        };
        let window = self.window.unwrap_or(default_window);
        check(window > Duration::ZERO, "--window", || {
            "must be more than 0".into()
        })?;
        check(
            self.duration.as_secs_f64() / window.as_secs_f64() <= 1e6,
            "--window",
            || "too small for --duration: more than a million windows".into(),
        )?;
        check(
            self.warm_up < self.duration && nanos(self.warm_up).is_multiple_of(nanos(window)),
            "--warm-up",
            || {
                format!(
                    "{}s must be shorter than --duration and a whole number of --window ({}s)",
                    duration::trim(self.warm_up.as_secs_f64()),
                    duration::trim(window.as_secs_f64()),
                )
            },
        )?;
        let keda = match self.versus {
            Some(VersusArg::Keda) => {
                check(
                    self.keda_list_length.is_finite() && self.keda_list_length > 0.0,
                    "--keda-list-length",
                    || format!("{} must be more than 0", self.keda_list_length),
                )?;
                check(!self.keda_polling.is_zero(), "--keda-polling", || {
                    "must be more than 0".into()
                })?;
                let urgent_max = self.keda_urgent_max.unwrap_or(self.workers / 2);
                check(
                    (1..self.workers).contains(&urgent_max),
                    "--keda-urgent-max",
                    || {
                        format!(
                            "{urgent_max} must be from 1 to --workers − 1 ({}), leaving the batch Deployment one",
                            self.workers.saturating_sub(1)
                        )
                    },
                )?;
                let knobs = Knobs {
                    list_length: self.keda_list_length,
                    polling: nanos(self.keda_polling),
                    min: self.keda_min,
                };
                Some(Arm::two_lists(
                    self.workers,
                    urgent_max,
                    knobs,
                    nanos(self.pod_start),
                ))
            }
            None => None,
        };
        let arrangement = if keda.is_some() {
            Arrangement::Dedicated
        } else {
            arrangement
        };
        Ok(Scenario {
            arrangement,
            workers: self.workers,
            reserved,
            urgent_job: millis_to_nanos(self.urgent_ms),
            batch_job: (millis_to_nanos(low), millis_to_nanos(high)),
            backlog: self.backlog,
            handoff: millis_to_nanos(self.handoff_ms),
            duration: nanos(self.duration),
            drain: 0,
            arrivals: match self.arrivals {
                ArrivalsArg::Even => ArrivalKind::Even,
                ArrivalsArg::Poisson => ArrivalKind::Poisson,
            },
            profile,
            seed: self.seed,
            autoscale,
            keda,
            window: nanos(window),
        })
    }

    fn autoscale_config(&self, reserved: u32) -> Result<Autoscale, SimulateError> {
        let workers = self.workers as i32;
        crate::api::check_headroom(self.headroom)
            .map_err(|reason| SimulateError::flag("--headroom", reason))?;
        check(
            self.interval >= Duration::from_secs(1),
            "--interval",
            || "must be at least 1s".into(),
        )?;
        check(
            self.rate_window >= Duration::from_secs(1),
            "--rate-window",
            || "must be at least 1s".into(),
        )?;
        check(
            self.job_time_window >= Duration::from_secs(1),
            "--job-time-window",
            || "must be at least 1s".into(),
        )?;
        check(self.reserve_min >= 0, "--reserve-min", || {
            format!("{} must be 0 or more", self.reserve_min)
        })?;
        check(self.shared_min >= 0, "--shared-min", || {
            format!("{} must be 0 or more", self.shared_min)
        })?;
        let (size, default_max) = match self.pool_size {
            PoolSizeArg::Budget => (
                PoolSize::Budget {
                    total: workers,
                    shared_min: self.shared_min,
                },
                workers - self.shared_min,
            ),
            PoolSizeArg::Shared => (
                PoolSize::Shared {
                    replicas: workers - reserved as i32,
                },
                workers,
            ),
        };
        let max = self.reserve_max.unwrap_or(default_max);
        check(max >= self.reserve_min.max(1), "--reserve-max", || {
            format!("{max} must be at least 1 and at least --reserve-min")
        })?;
        if let PoolSize::Budget { total, shared_min } = size {
            check(max + shared_min <= total, "--reserve-max", || {
                format!("{max} plus --shared-min {shared_min} is more than --workers {total}")
            })?;
        }
        let rule = match (self.sizing, self.target_p99) {
            (SizingArg::Queueing, None) => Rule::Queueing,
            (SizingArg::Formula, None) => Rule::Formula,
            (SizingArg::LatencyTarget, Some(target)) if target > Duration::ZERO => {
                Rule::LatencyTarget {
                    p99_seconds: target.as_secs_f64(),
                }
            }
            (SizingArg::LatencyTarget, _) => {
                return Err(SimulateError::flag(
                    "--target-p99",
                    "--sizing latency-target needs a --target-p99 above 0",
                ));
            }
            (SizingArg::Formula | SizingArg::Queueing, Some(_)) => {
                return Err(SimulateError::flag(
                    "--target-p99",
                    "applies only with --sizing latency-target",
                ));
            }
        };
        Ok(Autoscale {
            sizing: PoolSizing {
                stabilization_window: self.stabilization_window,
                ..PoolSizing::new(
                    vec![LaneSizing {
                        name: crate::simulate::engine::autoscale::LANE.to_string(),
                        min: self.reserve_min,
                        max,
                        rule,
                    }],
                    self.headroom,
                    size,
                )
            },
            interval: nanos(self.interval),
            rate_window: nanos(self.rate_window),
            scrape_interval: nanos(self.scrape_interval),
            job_time_window: nanos(self.job_time_window),
            scrape_delay: nanos(self.scrape_delay),
            pod_start: nanos(self.pod_start),
            worker_reads: self.worker_reads,
            stand_ins: self.stand_ins,
        })
    }
}
