//! The `lanepool` command: parses flags and hands over to the library.

use std::process::ExitCode;

use clap::{Parser, Subcommand};
use lanepool::crd::lanepool_crd_yaml;
use lanepool::duration;
use lanepool::plan::{PlanInput, plan};

/// lanepool sizes a worker pool's reserve for urgent lanes from measured load, and runs the
/// reserved and shared workers as two kinds of Deployment.
#[derive(Parser)]
#[command(name = "lanepool", version, about, long_about = None)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Print the LanePool CustomResourceDefinition as YAML (kubectl apply -f -).
    Crd,
    /// Run the operator: watch LanePools and size their reserved and shared Deployments.
    Run(Box<lanepool::run::RunArgs>),
    /// Size a reserve from a measured load: ceil(arrival rate × job time × headroom).
    Plan(PlanArgs),
    /// Simulate a pool with an urgent lane and a batch backlog: latency and throughput of a
    /// split, the guide's table, or the operator's sizing in a closed loop.
    Simulate(Box<lanepool::simulate::command::args::SimulateArgs>),
}

#[derive(clap::Args)]
#[command(allow_negative_numbers = true)]
struct PlanArgs {
    /// The urgent lane's arrival rate, in jobs per second.
    #[arg(long, value_name = "JOBS_PER_SECOND")]
    urgent_rate: f64,
    /// The urgent lane's mean job time, such as 20ms or 1.5s.
    #[arg(long, value_name = "DURATION", value_parser = duration::flag)]
    job_time: std::time::Duration,
    /// Multiplies busy workers to leave room for bursts (a LanePool's default: 1); more than 0,
    /// at most 10.
    #[arg(long, default_value_t = lanepool::api::DEFAULT_HEADROOM)]
    headroom: f64,
    /// Fewest reserved workers.
    #[arg(long, default_value_t = 1)]
    min: i32,
    /// Most reserved workers.
    #[arg(long)]
    max: Option<i32>,
    #[command(flatten)]
    sweep: lanepool::plan::SweepArgs,
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    match cli.command {
        Command::Run(args) => lanepool::run::run(*args),
        Command::Crd => match lanepool_crd_yaml() {
            Ok(yaml) => {
                print!("{yaml}");
                ExitCode::SUCCESS
            }
            Err(e) => {
                eprintln!("error: {e}");
                ExitCode::FAILURE
            }
        },
        Command::Simulate(args) => match lanepool::simulate::command::run(&args) {
            Ok(text) => {
                println!("{text}");
                ExitCode::SUCCESS
            }
            Err(e) => {
                eprintln!("error: {e}");
                ExitCode::from(e.exit_code())
            }
        },
        Command::Plan(args) => match check_plan(&args) {
            Ok(input) => match lanepool::plan::sweep(&input, &args.sweep) {
                Ok(rows) => {
                    let planned = plan(input);
                    let target_ms = args.sweep.target_p99.map(|t| t.as_secs_f64() * 1e3);
                    let table = (!rows.is_empty())
                        .then(|| lanepool::plan::sweep_lines(&rows, planned.reserve, target_ms));
                    for line in planned.lines.iter().chain(table.iter().flatten()) {
                        println!("{line}");
                    }
                    ExitCode::SUCCESS
                }
                Err(e) => {
                    eprintln!("error: {e}");
                    ExitCode::from(e.exit_code())
                }
            },
            Err(message) => {
                eprintln!("error: {message}");
                ExitCode::from(2)
            }
        },
    }
}

fn check_plan(args: &PlanArgs) -> Result<PlanInput, String> {
    if !(args.urgent_rate.is_finite() && args.urgent_rate >= 0.0) {
        return Err(format!(
            "--urgent-rate {} must be 0 or more",
            args.urgent_rate
        ));
    }
    if !(args.headroom > 0.0 && args.headroom <= 10.0) {
        return Err(format!(
            "--headroom {} must be more than 0 and at most 10",
            args.headroom
        ));
    }
    if args.min < 0 {
        return Err(format!("--min {} must be 0 or more", args.min));
    }
    if let Some(max) = args.max.filter(|max| *max < args.min.max(1)) {
        return Err(format!("--max {max} must be at least --min and at least 1"));
    }
    Ok(PlanInput {
        arrival_rate: args.urgent_rate,
        job_seconds: args.job_time.as_secs_f64(),
        headroom: args.headroom,
        min: args.min,
        max: args.max,
    })
}
