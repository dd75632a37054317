//! The flags of `lanepool replay` and the window they describe: which pool, which past window,
//! at which step. Every value from the user is checked here, and a bad one is refused naming
//! its flag, before any connection is made.

use std::path::PathBuf;
use std::time::Duration;

use k8s_openapi::jiff::Timestamp;

use super::error::ReplayError;
use crate::duration;
use crate::prometheus::AllowedUrls;
use crate::prometheus::range::{MAX_POINTS, Range};

#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum OutputArg {
    Text,
    Json,
}

/// Replay a LanePool's own past traffic through the simulator: what its current settings, the
/// defaults, fixed splits and latency targets would have given, beside a hindsight reference.
/// Reads Prometheus only; writes nothing to the cluster.
#[derive(clap::Args, Debug, Clone)]
pub struct ReplayArgs {
    /// The LanePool to read from the cluster (with --namespace); or give --file.
    #[arg(
        value_name = "POOL",
        required_unless_present = "file",
        conflicts_with = "file"
    )]
    pub pool: Option<String>,
    /// The pool's namespace (and, with --file, the namespace of its Secrets when the manifest
    /// names none).
    #[arg(short, long, env = "LANEPOOL_NAMESPACE", default_value = "default")]
    pub namespace: String,
    /// Read the LanePool from this manifest (YAML) instead of the cluster.
    #[arg(short, long, value_name = "FILE.yaml")]
    pub file: Option<PathBuf>,

    /// The window: this long, up to now (or --to). Default 24h.
    #[arg(long, value_parser = duration::flag, conflicts_with = "from")]
    pub since: Option<Duration>,
    /// The window's start, RFC 3339 (2026-12-01T00:00:00Z); with --to, or up to now.
    #[arg(long, value_name = "RFC3339")]
    pub from: Option<Timestamp>,
    /// The window's end, RFC 3339; default now.
    #[arg(long, value_name = "RFC3339")]
    pub to: Option<Timestamp>,
    /// The step the history is read at: each step's arrival rate holds for that step in the
    /// replay. Default: 15s, or longer when the window needs it to stay within Prometheus's
    /// 11,000 points per query.
    #[arg(long, value_parser = duration::at_least(Duration::from_secs(1)))]
    pub step: Option<Duration>,

    /// Prometheus base URL, instead of the pool's spec.prometheus.url (such as a port-forward
    /// when running outside the cluster). The pool's credentials are sent to it.
    #[arg(long, env = "LANEPOOL_PROMETHEUS_URL", value_name = "URL")]
    pub prometheus_url: Option<String>,
    /// The Prometheus URLs that may be asked, as comma-separated prefixes, as the operator's
    /// flag of the same name; any other is refused before a connection is made.
    #[arg(long, env = "LANEPOOL_ALLOWED_PROMETHEUS_URLS", value_name = "URL,...", value_parser = AllowedUrls::parse)]
    pub allowed_prometheus_urls: Option<AllowedUrls>,
    /// How long each range query may take.
    #[arg(long, default_value = "30s", value_parser = duration::at_least(Duration::from_secs(1)))]
    pub timeout: Duration,
    /// Trailing window of the default arrival-rate query, as the operator's --rate-window (never
    /// shorter than --step, so no arrival is missed between steps).
    #[arg(long, default_value = crate::prometheus::DEFAULT_RATE_WINDOW, value_parser = duration::promql_window)]
    pub rate_window: String,
    /// Trailing window of the default job-time query, as the operator's --job-time-window.
    #[arg(long, default_value = crate::prometheus::DEFAULT_JOB_TIME_WINDOW, value_parser = duration::promql_window)]
    pub job_time_window: String,
    /// How often Prometheus scrapes the workers: the span of the replayed operator's recent rate
    /// (5 s at least), and the age of its newest sample.
    #[arg(long, default_value = "15s", value_parser = duration::flag)]
    pub scrape_interval: Duration,

    /// The reserve lane to replay; default the pool's first. The other reserve lanes keep their
    /// reserve.min workers, left out of the replayed pool.
    #[arg(long)]
    pub lane: Option<String>,
    /// Batch job time in milliseconds, uniform LOW..HIGH or one value. Default: the batch lanes'
    /// measured mean job time, ±50 %.
    #[arg(long, value_name = "LOW..HIGH")]
    pub batch_ms: Option<String>,
    /// From a role change (or a new pod) to the worker taking jobs.
    #[arg(long, default_value = "10s", value_parser = duration::flag)]
    pub pod_start: Duration,
    /// The seed of the simulated arrivals and batch job times: the same seed, the same replay.
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
    /// text: the table and the recommendation; json: one object for scripts (with the
    /// `lanepool simulate` flags that rerun each static row).
    #[arg(long, value_enum, default_value = "text")]
    pub output: OutputArg,
    /// Draw the measured arrival rate, and the reserve and urgent p99 of the current settings
    /// and of the recommendation, over the window, as SVG.
    #[arg(long, value_name = "FILE.svg")]
    pub plot: Option<PathBuf>,
}

/// The default step: a 15 s scrape interval's resolution.
pub const DEFAULT_STEP: Duration = Duration::from_secs(15);
/// The longest window replayed: the simulator's longest run.
pub const LONGEST_WINDOW: Duration = Duration::from_secs(31 * 24 * 3600);

/// The flag that set the window's length, for messages.
fn window_flag(args: &ReplayArgs) -> &'static str {
    if args.from.is_some() {
        "--from"
    } else {
        "--since"
    }
}

/// The evaluation times to read at: the end of every step from the window's start (rounded up to
/// a whole step) to its end (rounded down); each answer holds for the step before it. `now` is the
/// end when neither --to nor --from gives one.
pub fn window(args: &ReplayArgs, now: Timestamp) -> Result<Range, ReplayError> {
    let to = args.to.unwrap_or(now);
    let from = match (args.from, args.since) {
        (Some(from), _) => from,
        (None, since) => {
            let since = since.unwrap_or(Duration::from_secs(24 * 3600));
            let seconds = i64::try_from(since.as_secs()).unwrap_or(i64::MAX);
            Timestamp::from_second(to.as_second().saturating_sub(seconds))
                .map_err(|e| ReplayError::flag("--since", e.to_string()))?
        }
    };
    let (from, to) = (from.as_second(), to.as_second());
    if from >= to {
        return Err(ReplayError::flag(
            window_flag(args),
            "the window's start must be before its end (--to, or now)",
        ));
    }
    let length = (to - from) as u64;
    if length > LONGEST_WINDOW.as_secs() {
        return Err(ReplayError::flag(
            window_flag(args),
            format!(
                "the window is {}, longer than the {} a replay can simulate",
                duration::compact(Duration::from_secs(length)),
                duration::compact(LONGEST_WINDOW)
            ),
        ));
    }
    let fewest = length.div_ceil(MAX_POINTS).max(1);
    let step = match args.step {
        None => DEFAULT_STEP.as_secs().max(fewest),
        Some(step) => {
            let step = step.as_secs();
            if step < fewest {
                return Err(ReplayError::flag(
                    "--step",
                    format!(
                        "{} over {} asks for {} points of each series, more than the {MAX_POINTS} Prometheus answers: use --step {} or more, or a shorter window",
                        duration::compact(Duration::from_secs(step)),
                        duration::compact(Duration::from_secs(length)),
                        length / step.max(1),
                        duration::compact(Duration::from_secs(fewest))
                    ),
                ));
            }
            step
        }
    };
    let first = from.div_euclid(step as i64) * step as i64;
    let first = if first < from {
        first + step as i64
    } else {
        first
    };
    let last = to.div_euclid(step as i64) * step as i64;
    if last <= first {
        return Err(ReplayError::flag(
            "--step",
            format!(
                "{} is longer than the window",
                duration::compact(Duration::from_secs(step))
            ),
        ));
    }
    // The first answer holds for the step before it: the window's first step.
    Ok(Range {
        start: first + step as i64,
        end: last,
        step,
    })
}

#[cfg(test)]
mod tests {
    use clap::Parser;

    use super::*;

    #[derive(Parser)]
    struct Cli {
        #[command(flatten)]
        args: ReplayArgs,
    }

    fn args(line: &str) -> ReplayArgs {
        Cli::try_parse_from(std::iter::once("replay").chain(line.split_whitespace()))
            .unwrap()
            .args
    }

    fn at(text: &str) -> Timestamp {
        text.parse().unwrap()
    }

    #[test]
    fn a_day_is_read_at_15_seconds_on_whole_steps() {
        let range = window(&args("jobs --since 24h"), at("2026-12-02T10:00:00Z")).unwrap();
        assert_eq!(range.step, 15);
        assert_eq!(range.start % 15, 0);
        assert_eq!(range.points(), 24 * 240);
        // A window that does not start on a step loses its part-steps at both ends.
        let range = window(&args("jobs --since 24h"), at("2026-12-02T10:00:07Z")).unwrap();
        assert_eq!(range.points(), 24 * 240 - 1);
    }

    #[test]
    fn a_week_gets_a_longer_step_and_a_too_fine_one_is_refused_naming_the_flag() {
        let now = at("2026-12-02T00:00:00Z");
        let range = window(&args("jobs --since 168h"), now).unwrap();
        assert_eq!(range.step, 55);
        assert!(range.points() <= MAX_POINTS);
        let error = window(&args("jobs --since 168h --step 15s"), now)
            .unwrap_err()
            .to_string();
        assert!(error.starts_with("--step"), "{error}");
        assert!(error.contains("--step 55s or more"), "{error}");
    }

    #[test]
    fn a_window_longer_than_a_simulation_names_its_flag() {
        let now = at("2026-12-02T00:00:00Z");
        let error = window(&args("jobs --since 1000h"), now)
            .unwrap_err()
            .to_string();
        assert!(error.starts_with("--since"), "{error}");
        let error = window(
            &args("jobs --from 2026-01-01T00:00:00Z --to 2026-12-01T00:00:00Z"),
            now,
        )
        .unwrap_err()
        .to_string();
        assert!(error.starts_with("--from"), "{error}");
    }

    #[test]
    fn from_and_to_give_the_window() {
        let range = window(
            &args("-f pool.yaml --from 2026-12-01T00:00:00Z --to 2026-12-01T02:00:00Z --step 60s"),
            at("2030-01-01T00:00:00Z"),
        )
        .unwrap();
        assert_eq!(range.points(), 120);
        assert_eq!(range.start, at("2026-12-01T00:01:00Z").as_second());
        let error = window(
            &args("jobs --from 2026-12-01T02:00:00Z --to 2026-12-01T00:00:00Z"),
            at("2030-01-01T00:00:00Z"),
        )
        .unwrap_err()
        .to_string();
        assert!(error.starts_with("--from"), "{error}");
    }
}
