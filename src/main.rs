//! The `lanepool` command: parses flags and hands over to the library.

use std::process::ExitCode;

use clap::{Parser, Subcommand};
use lanepool::crd::{lanepool_crd_chart_template, lanepool_crd_yaml};

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
    Crd {
        /// Print it as the Helm chart's template instead (charts/lanepool/templates/crd.yaml).
        #[arg(long)]
        chart: bool,
    },
    /// Run the operator: watch LanePools and size their reserved and shared Deployments.
    Run(Box<lanepool::run::RunArgs>),
    /// Size a reserve from a measured load: ceil(arrival rate × job time × headroom).
    Plan(lanepool::plan::PlanArgs),
    /// Simulate a pool with an urgent lane and a batch backlog: latency and throughput of a
    /// split, the guide's table, or the operator's sizing in a closed loop.
    Simulate(Box<lanepool::simulate::command::args::SimulateArgs>),
    /// Replay a LanePool's own past traffic from Prometheus through the simulator: what its
    /// current settings, the defaults, static splits and latency targets would have given, beside
    /// a hindsight reference, and which to set. Reads only; writes nothing to the cluster.
    Replay(Box<lanepool::replay::ReplayArgs>),
    /// Turn a worker Deployment (`rq worker`, `celery worker`) into a LanePool: the LanePool on
    /// stdout, what else to change on stderr. Reads only; writes nothing to the cluster.
    Migrate(Box<lanepool::migrate::MigrateArgs>),
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    match cli.command {
        Command::Run(args) => lanepool::run::run(*args),
        Command::Crd { chart } => {
            let yaml = if chart {
                lanepool_crd_chart_template()
            } else {
                lanepool_crd_yaml()
            };
            match yaml {
                Ok(yaml) => {
                    print!("{yaml}");
                    ExitCode::SUCCESS
                }
                Err(e) => {
                    eprintln!("error: {e}");
                    ExitCode::FAILURE
                }
            }
        }
        Command::Simulate(args) => {
            finish(lanepool::simulate::command::run(&args), |e| e.exit_code())
        }
        Command::Replay(args) => replay(&args),
        Command::Migrate(args) => migrate(&args),
        Command::Plan(args) => finish(
            lanepool::plan::run(&args).map(|lines| lines.join("\n")),
            |e| e.exit_code(),
        ),
    }
}

/// Prints what a command made, or its error and exits with the error's `code`.
fn finish<E: std::fmt::Display>(result: Result<String, E>, code: impl Fn(&E) -> u8) -> ExitCode {
    match result {
        Ok(text) => {
            println!("{text}");
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::from(code(&e))
        }
    }
}

/// `lanepool replay` on a runtime of its own; warnings and errors go to stderr (`RUST_LOG` for
/// more).
fn replay(args: &lanepool::replay::ReplayArgs) -> ExitCode {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn"));
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .init();
    let runtime = match lanepool::run::runtime() {
        Ok(runtime) => runtime,
        Err(code) => return code,
    };
    finish(runtime.block_on(lanepool::replay::replay(args)), |e| {
        e.exit_code()
    })
}

/// `lanepool migrate`: the LanePool on stdout, the steps (or the error) on stderr.
fn migrate(args: &lanepool::migrate::MigrateArgs) -> ExitCode {
    let runtime = match lanepool::run::runtime() {
        Ok(runtime) => runtime,
        Err(code) => return code,
    };
    match runtime.block_on(lanepool::migrate::migrate(args)) {
        Ok(migration) => {
            eprint!("{}", migration.steps);
            print!("{}", migration.yaml);
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::from(e.exit_code())
        }
    }
}
