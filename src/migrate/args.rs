//! The flags of `lanepool migrate`. Bounds the CRD checks are checked here too, so a bad value is
//! refused naming its flag rather than by the API server later.

use std::path::PathBuf;
use std::time::Duration;

use crate::duration;

/// Turn a worker Deployment into a LanePool: prints the LanePool (YAML) on stdout, and on stderr
/// what else to change, in order, so that no lane is ever left without workers.
///
/// Recognises `rq worker [options] QUEUE…` (the queues in priority order; the command becomes
/// `lanepool-rq-worker`) and `celery … worker -Q A,B` (the same command; the app adds
/// `configure(app)`). The first queue becomes the urgent lane, with a reserve; the others are
/// lanes without one. Reads only; writes nothing to the cluster.
#[derive(clap::Args, Debug, Clone)]
pub struct MigrateArgs {
    /// Read the Deployment from this manifest (YAML, several documents or a List) instead of
    /// the cluster.
    #[arg(short = 'f', long, value_name = "FILE.yaml")]
    pub from_file: Option<PathBuf>,
    /// The Deployment: from the cluster, NAMESPACE/NAME (or NAME in --namespace); in a manifest
    /// with several, its NAME.
    #[arg(
        short,
        long,
        value_name = "[NAMESPACE/]NAME",
        required_unless_present = "from_file"
    )]
    pub deployment: Option<String>,
    /// The namespace of a --deployment NAME read from the cluster, and of the LanePool when the
    /// manifest names none [default: the Deployment's, else default].
    #[arg(short, long, env = "LANEPOOL_NAMESPACE")]
    pub namespace: Option<String>,
    /// The worker's container, when the Pod has several [default: the one that runs
    /// `rq worker` or `celery worker`].
    #[arg(long, value_name = "NAME")]
    pub container: Option<String>,
    /// The LanePool's name [default: the Deployment's]. At most 63 characters.
    #[arg(long, value_name = "NAME")]
    pub name: Option<String>,
    /// The lanes in priority order, first the urgent one (comma-separated), instead of the
    /// command's queues; with a command migrate does not recognise, the command is kept as it
    /// is and must then speak the worker protocol.
    #[arg(long, value_name = "LANE,...", value_delimiter = ',')]
    pub lanes: Vec<String>,
    /// spec.totalWorkers [default: the Deployment's spec.replicas].
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(i32).range(2..=10_000))]
    pub total_workers: Option<i32>,
    /// The urgent lane's reserve.max [default: 60 % of totalWorkers, rounded up, and at most
    /// totalWorkers − 1: 6 of 10, as the README's first pool].
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(i32).range(1..=1000))]
    pub reserve_max: Option<i32>,
    /// The urgent lane's jobTime.fallback: its job time assumed until its jobs are measured.
    #[arg(long, value_name = "DURATION", default_value = DEFAULT_JOB_TIME, value_parser = job_time)]
    pub job_time: String,
    /// spec.slotsPerWorker: jobs one worker runs at once [default: a Celery worker's
    /// --concurrency, else 1].
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(i32).range(1..=1024))]
    pub slots_per_worker: Option<i32>,
    /// The worker container's image in the pool: one with lanepool's worker package (and, for
    /// Celery, the app with configure(app)) [default: the Deployment's].
    #[arg(long, value_name = "IMAGE")]
    pub image: Option<String>,
}

/// The urgent lane's `jobTime.fallback` when no flag sets it: the examples' first pools'.
pub const DEFAULT_JOB_TIME: &str = "50ms";

/// The flags' defaults, as `lanepool migrate` alone gives them.
impl Default for MigrateArgs {
    fn default() -> Self {
        Self {
            from_file: None,
            deployment: None,
            namespace: None,
            container: None,
            name: None,
            lanes: Vec::new(),
            total_workers: None,
            reserve_max: None,
            job_time: DEFAULT_JOB_TIME.into(),
            slots_per_worker: None,
            image: None,
        }
    }
}

/// A job time as the CRD takes it (`jobTime.fallback`): more than 0, at most 24h; kept as written.
fn job_time(value: &str) -> Result<String, String> {
    match duration::flag(value)? {
        d if d.is_zero() || d > Duration::from_secs(24 * 3600) => {
            Err("must be more than 0 and at most 24h".into())
        }
        _ => Ok(value.to_string()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_default_is_what_clap_gives_without_flags() {
        #[derive(clap::Parser)]
        struct Cli {
            #[command(flatten)]
            args: MigrateArgs,
        }
        let parsed = <Cli as clap::Parser>::parse_from(["lanepool", "-f", "x.yaml"]).args;
        let default = MigrateArgs::default();
        assert_eq!(parsed.job_time, default.job_time);
        assert_eq!(
            (parsed.lanes, parsed.total_workers, parsed.reserve_max),
            (default.lanes, default.total_workers, default.reserve_max)
        );
    }

    #[test]
    fn a_job_time_is_kept_as_written_within_the_crds_bounds() {
        assert_eq!(job_time("250ms").unwrap(), "250ms");
        assert_eq!(job_time("1h30m").unwrap(), "1h30m");
        assert!(job_time("0").is_err());
        assert!(job_time("25h").is_err());
        assert!(job_time("fast").is_err());
    }
}
