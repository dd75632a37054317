//! `lanepool plan`: the guide's step 5 as a command. Shows the reserve a measured load calls for
//! and the arithmetic behind it, with the same rules the operator runs: the guide's formula and
//! the default queueing rule (urgent wait p99 within the job time).

use std::time::Duration;

use crate::api::check_headroom;
use crate::duration::{human_seconds, trim};
use crate::simulate::ArrivalKind;
use crate::simulate::command::args::parse_millis_range;
use crate::simulate::{self, SimulateError};
use crate::simulate::{Arrangement, Scenario, nanos};
use crate::sizing::{
    HANDOFF_SECONDS, SharedHelp, formula, predicted_wait_p99_helped, wait_within_job_time,
};

/// The flags of `lanepool plan`.
#[derive(clap::Args, Debug, Clone)]
#[command(allow_negative_numbers = true)]
pub struct PlanArgs {
    /// The urgent lane's arrival rate, in jobs per second.
    #[arg(long, value_name = "JOBS_PER_SECOND")]
    pub urgent_rate: f64,
    /// The urgent lane's mean job time, such as 20ms or 1.5s.
    #[arg(long, value_name = "DURATION", value_parser = crate::duration::flag)]
    pub job_time: std::time::Duration,
    /// Multiplies the arrival rate planned for (a LanePool's default: 1); more than 0, at most 10.
    #[arg(long, default_value_t = crate::api::DEFAULT_HEADROOM)]
    pub headroom: f64,
    /// The rule whose reserve is recommended: the default (queueing) or the guide's formula.
    #[arg(long, value_enum, default_value = "queueing")]
    pub sizing: PlanSizing,
    /// Fewest reserved workers.
    #[arg(long, default_value_t = 1)]
    pub min: i32,
    /// Most reserved workers.
    #[arg(long)]
    pub max: Option<i32>,
    #[command(flatten)]
    pub sweep: SweepArgs,
}

/// The rules `lanepool plan` can recommend by.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum PlanSizing {
    /// The smallest reserve whose predicted urgent wait p99 is at most the job time (a
    /// LanePool's default, `sizing: Queueing`).
    Queueing,
    /// ceil(arrival rate × job time × headroom) (`sizing: Formula`).
    Formula,
}

/// `lanepool plan`: the arithmetic, then the sweep's table when `--workers` is given.
pub fn run(args: &PlanArgs) -> Result<Vec<String>, SimulateError> {
    let input = check(args)?;
    let rows = sweep(&input, &args.sweep)?;
    let planned = plan(input);
    let target_ms = args.sweep.target_p99.map(|t| t.as_secs_f64() * 1e3);
    let mut lines = planned.lines;
    if !rows.is_empty() {
        lines.extend(sweep_lines(&rows, planned.reserve, target_ms));
    }
    Ok(lines)
}

/// Checks the flags, naming the one that is wrong.
fn check(args: &PlanArgs) -> Result<PlanInput, SimulateError> {
    if !(args.urgent_rate.is_finite() && args.urgent_rate >= 0.0) {
        return Err(SimulateError::flag(
            "--urgent-rate",
            format!("{} must be 0 or more", args.urgent_rate),
        ));
    }
    check_headroom(args.headroom).map_err(|reason| SimulateError::flag("--headroom", reason))?;
    if args.min < 0 {
        return Err(SimulateError::flag(
            "--min",
            format!("{} must be 0 or more", args.min),
        ));
    }
    if let Some(max) = args.max.filter(|max| *max < args.min.max(1)) {
        return Err(SimulateError::flag(
            "--max",
            format!("{max} must be at least --min and at least 1"),
        ));
    }
    // With the pool's size, the shared workers' help is counted as the operator counts it: the
    // batch jobs' mean time is how often one frees up (shared.minReplicas: 1).
    let shared = match args.sweep.workers {
        Some(workers) => {
            let (low, high) = parse_millis_range(&args.sweep.batch_ms)?;
            Some(SharedHelp {
                job_seconds: (low + high) / 2.0 / 1e3,
                unreserved: i32::try_from(workers).unwrap_or(i32::MAX),
                least: 1,
            })
        }
        None => None,
    };
    Ok(PlanInput {
        arrival_rate: args.urgent_rate,
        job_seconds: args.job_time.as_secs_f64(),
        headroom: args.headroom,
        sizing: args.sizing,
        min: args.min,
        max: args.max,
        shared,
    })
}

/// `lanepool plan --workers N`: a sweep of every reserve, predicted by simulation.
#[derive(clap::Args, Debug, Clone, Default)]
pub struct SweepArgs {
    /// Pool size: add a table of reserve 0..N−1 with predicted urgent p50/p99 and batch
    /// throughput (reserved + shared workers, Poisson arrivals, a batch backlog that never empties).
    #[arg(long)]
    pub workers: Option<u32>,
    /// Batch job time in milliseconds for the sweep: uniform LOW..HIGH, or one value.
    #[arg(long, default_value = "100..300")]
    pub batch_ms: String,
    /// Recommend the reserve with the most batch throughput whose predicted p99 meets this.
    #[arg(long, value_parser = crate::duration::flag)]
    pub target_p99: Option<Duration>,
    /// Simulated time per reserve.
    #[arg(long, default_value = "2m", value_parser = crate::duration::flag)]
    pub sweep_duration: Duration,
}

/// One row of the sweep.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct SweepRow {
    pub reserve: u32,
    pub p50_ms: Option<f64>,
    pub p99_ms: Option<f64>,
    pub batch_per_second: f64,
}

/// Predicts every reserve from 0 to workers − 1 by simulating the reserved-shared pool.
pub fn sweep(input: &PlanInput, args: &SweepArgs) -> Result<Vec<SweepRow>, SimulateError> {
    let Some(workers) = args.workers else {
        return Ok(Vec::new());
    };
    if !(1..=1000).contains(&workers) {
        return Err(SimulateError::flag(
            "--workers",
            format!("{workers} must be from 1 to 1000"),
        ));
    }
    if args.sweep_duration.is_zero() || args.sweep_duration > Duration::from_secs(3600) {
        return Err(SimulateError::flag(
            "--sweep-duration",
            "must be more than 0 and at most 1h",
        ));
    }
    let (low, high) = parse_millis_range(&args.batch_ms)?;
    let duration = nanos(args.sweep_duration);
    Ok((0..workers)
        .map(|reserve| {
            let s = simulate::run(&Scenario {
                workers,
                reserved: reserve,
                urgent_job: (input.job_seconds * 1e9).round() as u64,
                batch_job: ((low * 1e6).round() as u64, (high * 1e6).round() as u64),
                backlog: u64::MAX,
                duration,
                arrivals: ArrivalKind::Poisson,
                window: duration,
                ..Scenario::guide(Arrangement::ReservedShared, input.arrival_rate)
            })
            .summary();
            SweepRow {
                reserve,
                p50_ms: s.p50_ms,
                p99_ms: s.p99_ms,
                batch_per_second: s.batch_per_second,
            }
        })
        .collect())
}

/// The sweep as a table, with the planned reserve and the target's marked.
pub fn sweep_lines(rows: &[SweepRow], planned_reserve: i32, target_ms: Option<f64>) -> Vec<String> {
    let meets = |row: &SweepRow, target: f64| row.p99_ms.is_some_and(|p99| p99 <= target);
    let chosen = target_ms.and_then(|t| rows.iter().find(|r| meets(r, t)).map(|r| r.reserve));
    let ms = |v: Option<f64>| v.map_or("—".to_string(), trim);
    let mut lines = vec![
        String::new(),
        "reserve  urgent p50 ms  urgent p99 ms  batch jobs/s".to_string(),
    ];
    for row in rows {
        let mut marks = Vec::new();
        if i64::from(row.reserve) == i64::from(planned_reserve) {
            marks.push("planned");
        }
        if chosen == Some(row.reserve) {
            marks.push("target");
        }
        lines.push(
            format!(
                "{:>7}  {:>13}  {:>13}  {:>12}  {}",
                row.reserve,
                ms(row.p50_ms),
                ms(row.p99_ms),
                trim(row.batch_per_second),
                marks.join(", ")
            )
            .trim_end()
            .to_string(),
        );
    }
    match (target_ms, chosen) {
        (Some(t), Some(r)) => lines.push(format!("recommended   = {r} reserved: the most batch throughput with p99 ≤ {} ms", trim(t))),
        (Some(t), None) => lines.push(format!("recommended   = none: no reserve meets p99 ≤ {} ms; add workers", trim(t))),
        (None, _) => lines.push(format!("recommended   = {planned_reserve} reserved (planned above); give --target-p99 to choose by latency")),
    }
    lines
}

/// A load to size a reserve for.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct PlanInput {
    pub arrival_rate: f64,
    pub job_seconds: f64,
    pub headroom: f64,
    pub sizing: PlanSizing,
    pub min: i32,
    pub max: Option<i32>,
    /// The shared workers' help (with `--workers`); `None`: the reserve is sized alone.
    pub shared: Option<SharedHelp>,
}

/// The reserve and the lines that explain it.
#[derive(Clone, Debug, PartialEq)]
pub struct Plan {
    pub reserve: i32,
    pub lines: Vec<String>,
}

pub fn plan(input: PlanInput) -> Plan {
    let busy = input.arrival_rate * input.job_seconds;
    let (needed, ceiling) = formula(input.arrival_rate, input.job_seconds, input.headroom);
    let planned_rate = input.arrival_rate * input.headroom;
    let queueing = wait_within_job_time(
        input.arrival_rate,
        input.job_seconds,
        input.headroom,
        input.shared,
    )
    .unwrap_or(i32::MAX);
    let served = input.job_seconds + HANDOFF_SECONDS;
    let wait = |reserve: i32| {
        let wait = predicted_wait_p99_helped(planned_rate, served, reserve, input.shared);
        if wait.is_finite() {
            human_seconds(wait)
        } else {
            "without end".to_string()
        }
    };
    let helped = match input.shared {
        Some(help) => format!(
            ", the shared workers of a pool of {} ({} jobs) helping",
            help.unreserved,
            human_seconds(help.job_seconds)
        ),
        None => String::new(),
    };
    let mut queueing_line = format!(
        "queueing      = the fewest reserved whose predicted wait p99 ≤ the job time ({}) at {}/s{helped}: {queueing} (waits {})",
        human_seconds(input.job_seconds),
        trim(planned_rate),
        wait(queueing)
    );
    if queueing > 0 && queueing < i32::MAX {
        queueing_line.push_str(&format!(
            "; {} would wait {}",
            queueing - 1,
            wait(queueing - 1)
        ));
    }
    let chosen = match input.sizing {
        PlanSizing::Queueing => queueing,
        PlanSizing::Formula => ceiling,
    };
    let reserve = chosen.clamp(input.min, input.max.unwrap_or(i32::MAX).max(input.min));
    let mut lines = vec![
        format!(
            "busy workers  = arrival rate × job time = {}/s × {} = {}",
            trim(input.arrival_rate),
            human_seconds(input.job_seconds),
            trim(busy)
        ),
        format!(
            "with headroom = {} × {} = {} → ceil → {} (the formula)",
            trim(busy),
            trim(input.headroom),
            trim(needed),
            ceiling
        ),
        queueing_line,
    ];
    if reserve != chosen {
        lines.push(format!(
            "within bounds = [{}, {}] → {}",
            input.min,
            input.max.map_or("∞".to_string(), |m| m.to_string()),
            reserve
        ));
    }
    lines.push(format!(
        "reserved      = {reserve} worker{} by {}; reserved capacity {}/s (reserved ÷ job time)",
        if reserve == 1 { "" } else { "s" },
        match input.sizing {
            PlanSizing::Queueing => "queueing",
            PlanSizing::Formula => "the formula",
        },
        if input.job_seconds > 0.0 {
            trim(f64::from(reserve) / input.job_seconds)
        } else {
            "∞".to_string()
        }
    ));
    Plan { reserve, lines }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn guide(rate: f64) -> PlanInput {
        PlanInput {
            arrival_rate: rate,
            job_seconds: 0.020,
            headroom: 1.5,
            sizing: PlanSizing::Formula,
            min: 1,
            max: None,
            shared: None,
        }
    }

    #[test]
    fn reproduces_the_guides_arithmetic() {
        let plan = plan(guide(30.0));
        assert_eq!(plan.reserve, 1);
        assert_eq!(
            plan.lines[0],
            "busy workers  = arrival rate × job time = 30/s × 20 ms = 0.6"
        );
        assert_eq!(
            plan.lines[1],
            "with headroom = 0.6 × 1.5 = 0.9 → ceil → 1 (the formula)"
        );
        assert!(
            plan.lines[3].contains("reserved capacity 50/s"),
            "{:?}",
            plan.lines
        );
    }

    #[test]
    fn the_spike_needs_five() {
        assert_eq!(plan(guide(150.0)).reserve, 5);
    }

    #[test]
    fn the_sweep_trades_batch_throughput_for_urgent_latency() {
        let args = SweepArgs {
            workers: Some(4),
            batch_ms: "100..300".into(),
            target_p99: None,
            sweep_duration: Duration::from_secs(20),
        };
        let rows = sweep(&guide(30.0), &args).unwrap_or_default();
        assert_eq!(rows.len(), 4);
        assert!(
            rows.windows(2)
                .all(|w| w[1].batch_per_second < w[0].batch_per_second)
        );
        assert!(rows[3].p99_ms < rows[0].p99_ms);
        let lines = sweep_lines(&rows, 1, Some(25.0));
        assert!(lines.iter().any(|l| l.contains("planned")));
        assert!(lines.last().is_some_and(|l| l.starts_with("recommended")));
    }

    #[test]
    fn bounds_are_shown_when_they_apply() {
        let capped = plan(PlanInput {
            max: Some(2),
            ..guide(150.0)
        });
        assert_eq!(capped.reserve, 2);
        assert_eq!(capped.lines[3], "within bounds = [1, 2] → 2");
    }

    #[test]
    fn by_default_the_plan_is_the_operators_queueing_rule() {
        let plan = plan(PlanInput {
            headroom: 1.0,
            sizing: PlanSizing::Queueing,
            ..guide(30.0)
        });
        assert_eq!(plan.reserve, 2, "{:?}", plan.lines);
        assert!(plan.lines[2].starts_with("queueing      = the fewest reserved whose predicted wait p99 ≤ the job time (20 ms) at 30/s: 2 (waits "), "{:?}", plan.lines);
        assert!(
            plan.lines[2].contains("; 1 would wait "),
            "{:?}",
            plan.lines
        );
        assert!(
            plan.lines[3].starts_with("reserved      = 2 workers by queueing"),
            "{:?}",
            plan.lines
        );
    }

    /// With the pool's size the plan counts the shared workers' help as the operator does: at
    /// 30/s × 20 ms beside 200 ms batch jobs, 8 shared workers free up 40 times a second.
    #[test]
    fn with_the_pools_size_the_plan_counts_the_shared_workers_help() {
        let alone = guide(30.0);
        let help = SharedHelp {
            job_seconds: 0.2,
            unreserved: 10,
            least: 1,
        };
        let helped = PlanInput {
            headroom: 1.0,
            sizing: PlanSizing::Queueing,
            shared: Some(help),
            ..alone
        };
        let expected = wait_within_job_time(30.0, 0.020, 1.0, Some(help)).unwrap();
        let planned = plan(helped);
        assert_eq!(planned.reserve, expected, "{:?}", planned.lines);
        assert!(
            planned.lines[2].contains("the shared workers of a pool of 10 (200 ms jobs) helping"),
            "{:?}",
            planned.lines
        );
        let alone = plan(PlanInput {
            headroom: 1.0,
            sizing: PlanSizing::Queueing,
            ..alone
        });
        assert!(planned.reserve <= alone.reserve, "{planned:?} vs {alone:?}");
    }
}
