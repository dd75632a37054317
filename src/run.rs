//! `lanepool run`: starts the operator (the controller and the /metrics and health endpoint side
//! by side) and stops both on SIGTERM or Ctrl-C.

use std::net::SocketAddr;
use std::process::ExitCode;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use tracing::{error, info, warn};

use crate::controller::{Context, Settings};
use crate::metrics::Metrics;
use crate::prometheus::{AllowedUrls, QueryWindows};
use crate::server::{self, Health};
use crate::{duration, leader};

/// Flags of `lanepool run`; each can also be set by its environment variable.
#[derive(clap::Args, Debug)]
pub struct RunArgs {
    /// Prometheus base URL for LanePools that name none in spec.prometheus.url.
    #[arg(long, env = "LANEPOOL_PROMETHEUS_URL", value_name = "URL")]
    pub prometheus_url: Option<String>,

    /// The Prometheus URLs a LanePool may name, as comma-separated prefixes (scheme, host, port
    /// and a path prefix). A pool naming any other gets Ready=False, PrometheusURLNotAllowed, and
    /// no connection is made: its bearer token and headers never leave for a server of its
    /// choosing. Unset: every URL is allowed (the chart sets it to its prometheusUrl).
    #[arg(long, env = "LANEPOOL_ALLOWED_PROMETHEUS_URLS", value_name = "URL,...", value_parser = AllowedUrls::parse)]
    pub allowed_prometheus_urls: Option<AllowedUrls>,

    /// Most Prometheus queries in flight at once across every pool (Prometheus itself runs 20).
    #[arg(long, env = "LANEPOOL_PROMETHEUS_CONCURRENCY", default_value_t = crate::prometheus::DEFAULT_CONCURRENCY, value_parser = clap::value_parser!(u16).range(1..=1000))]
    pub prometheus_concurrency: u16,

    /// Most pools reconciled at once: bounds the operator's memory and its burst of writes when
    /// many pools change together (at start, say); when more are due, they wait their turn first
    /// come, first served. A pool whose Prometheus hangs holds one place until its query times
    /// out (spec.prometheus.timeout, at most 1m).
    #[arg(long, env = "LANEPOOL_CONCURRENT_RECONCILES", default_value_t = crate::controller::DEFAULT_CONCURRENT_RECONCILES, value_parser = clap::value_parser!(u16).range(1..=1000))]
    pub concurrent_reconciles: u16,

    /// Namespaces to watch, comma-separated; every namespace when empty.
    #[arg(
        long,
        env = "LANEPOOL_NAMESPACES",
        value_delimiter = ',',
        value_name = "NAMESPACE"
    )]
    pub namespaces: Vec<String>,

    /// Address of the /metrics, /healthz and /readyz endpoint.
    #[arg(long, env = "LANEPOOL_METRICS_ADDR", default_value = "0.0.0.0:8080")]
    pub metrics_addr: SocketAddr,

    /// Log format: text or json.
    #[arg(long, env = "LANEPOOL_LOG_FORMAT", default_value = "text", value_parser = ["text", "json"])]
    pub log_format: String,

    /// Log level or filter, such as info or lanepool=debug,kube=warn.
    #[arg(long, env = "LANEPOOL_LOG_LEVEL", default_value = "info")]
    pub log_level: String,

    /// Trailing window of the default arrival-rate query: what status shows, and what the
    /// reserve follows while the recent rate has no answer.
    #[arg(long, env = "LANEPOOL_RATE_WINDOW", default_value = crate::prometheus::DEFAULT_RATE_WINDOW, value_parser = duration::promql_window)]
    pub rate_window: String,

    /// Lookback of the recent arrival-rate query, irate() over the default metric: the rate of
    /// the last scrape interval, which the reserve follows both ways; it must hold two scrapes.
    /// Unused when --scrape-interval is under 5 s: the recent rate is then rate() over 5 s.
    #[arg(long, env = "LANEPOOL_RECENT_RATE_LOOKBACK", default_value = crate::prometheus::DEFAULT_RECENT_RATE_LOOKBACK, value_parser = duration::promql_window)]
    pub recent_rate_lookback: String,

    /// How often Prometheus scrapes the workers: the span of the recent rate (never less than
    /// 5 s: scraped more often, it is rate() over whole scrape intervals spanning 5 s, so this
    /// must not be shorter than your Prometheus's). A rate counted over few arrivals needs a wider
    /// tolerance before the reserve follows it. 0: no recent rate.
    #[arg(long, env = "LANEPOOL_SCRAPE_INTERVAL", default_value = "15s", value_parser = duration::at_least(Duration::ZERO))]
    pub scrape_interval: Duration,

    /// Trailing window of the default job-time query.
    #[arg(long, env = "LANEPOOL_JOB_TIME_WINDOW", default_value = crate::prometheus::DEFAULT_JOB_TIME_WINDOW, value_parser = duration::promql_window)]
    pub job_time_window: String,

    /// Compete for a Lease so only one replica runs the controller.
    #[arg(long, env = "LANEPOOL_LEADER_ELECTION", default_value_t = true, action = clap::ArgAction::Set)]
    pub leader_election: bool,

    /// Namespace of the leader-election Lease (in a pod: its own namespace).
    #[arg(long, env = "POD_NAMESPACE", default_value = "default")]
    pub leader_election_namespace: String,

    /// How long a leader holds the Lease without renewing it; at least 2s.
    #[arg(long, env = "LANEPOOL_LEADER_ELECTION_LEASE_DURATION", default_value = "15s", value_parser = duration::at_least(Duration::from_secs(2)))]
    pub leader_election_lease_duration: Duration,

    /// This replica's identity in the Lease (in a pod: its name).
    #[arg(long, env = "POD_NAME")]
    pub identity: Option<String>,

    /// How long one request to the API server (a write, or a list or get) may take.
    #[arg(long, env = "LANEPOOL_WRITE_TIMEOUT", default_value = "10s", value_parser = duration::at_least(Duration::ZERO))]
    pub write_timeout: Duration,

    /// How long a shrinking Deployment waits for the growing ones to be ready (a surge: when
    /// the reserve grows, shared workers leave only once the new reserved workers are ready);
    /// 0 shrinks at once.
    #[arg(long, env = "LANEPOOL_SURGE_TIMEOUT", default_value = "2m", value_parser = duration::flag)]
    pub surge_timeout: Duration,

    /// Before a Deployment shrinks, annotate its Pods with
    /// `controller.kubernetes.io/pod-deletion-cost` from the workers' `lanepool_worker_busy`
    /// and `lanepool_worker_job_started_timestamp_seconds` gauges (asked of each Pod at its
    /// port named `metrics`, else of Prometheus), so the ReplicaSet controller removes idle
    /// workers first, then those whose jobs should end soonest (pods `list` and `patch`); false
    /// leaves the choice to the ReplicaSet controller alone.
    #[arg(long, env = "LANEPOOL_IDLE_WORKERS_FIRST", default_value_t = true, action = clap::ArgAction::Set)]
    pub idle_workers_first: bool,

    /// Each time a pool is measured, read its workers' own finished-job counts
    /// (`lanepool_job_duration_seconds_count`, by lane) at their port named `metrics`, and size
    /// the reserve from the rate they finished jobs at since the last read: seconds old, where
    /// Prometheus's is a scrape interval plus a scrape's age. Only for pools whose template has
    /// that port and lanes on the default query; a read that misses a ready worker leaves
    /// Prometheus's rates (pods `list`). false: Prometheus alone.
    #[arg(long, env = "LANEPOOL_WORKER_READS", default_value_t = true, action = clap::ArgAction::Set)]
    pub worker_reads: bool,

    /// With idle workers first: before a Deployment shrinks by k, ask the k workers it will stop
    /// to take no new job (`POST /drain?seconds=N` at their port named `metrics`) and hold that
    /// shrink until they report idle, for at most 3 × the longest mean job time of the lanes
    /// they serve (at least 2s) and never longer than this; growth never waits. Workers that do
    /// not drain are ranked as before. 0 turns draining off.
    #[arg(long, env = "LANEPOOL_DRAIN_TIMEOUT", default_value = "2m", value_parser = duration::flag)]
    pub drain_timeout: Duration,

    /// How old a pool's worker credential (the token in its Secret `<pool>-worker-credential`
    /// that drain and stand-in requests carry) may get before the operator makes a new one; the
    /// old one is still sent for 10 minutes to workers that have not seen the new file. 0: only
    /// when a pool is annotated `lanepool.dev/rotate-credential=<a new value>`.
    #[arg(long, env = "LANEPOOL_CREDENTIAL_MAX_AGE", default_value = "720h", value_parser = credential_max_age)]
    pub credential_max_age: Duration,
}

/// `--credential-max-age`: 0 (never by age), or at least an hour. A token younger than the time
/// every worker takes to see the last one (the kubelet: a minute or two; the old one is sent for
/// 10 minutes) would leave workers holding neither token the operator knows, and their drains
/// waiting.
fn credential_max_age(value: &str) -> Result<Duration, String> {
    match duration::flag(value)? {
        age if age.is_zero() || age >= Duration::from_secs(3600) => Ok(age),
        _ => Err("must be 0 (only when a pool asks) or at least 1h".into()),
    }
}

/// The multi-threaded runtime a command runs on; its failure said on stderr, as an exit code.
pub fn runtime() -> Result<tokio::runtime::Runtime, ExitCode> {
    tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .map_err(|e| {
            eprintln!("error: starting the runtime: {e}");
            ExitCode::FAILURE
        })
}

/// Runs the operator until SIGTERM or Ctrl-C.
pub fn run(args: RunArgs) -> ExitCode {
    if let Err(message) = init_logging(&args) {
        eprintln!("error: --log-level: {message}");
        return ExitCode::from(2);
    }
    let runtime = match runtime() {
        Ok(runtime) => runtime,
        Err(code) => return code,
    };
    runtime.block_on(operate(args))
}

async fn operate(args: RunArgs) -> ExitCode {
    let client = match kube::Client::try_default().await {
        Ok(client) => client,
        Err(e) => {
            error!("cannot reach the Kubernetes API (KUBECONFIG or in-cluster config): {e}");
            return ExitCode::FAILURE;
        }
    };
    let listener = match server::bind(args.metrics_addr).await {
        Ok(listener) => listener,
        Err(e) => {
            error!("--metrics-addr {}: {e}", args.metrics_addr);
            return ExitCode::from(2);
        }
    };
    let metrics = Arc::new(Metrics::default());
    let health = Arc::new(Health {
        ready: Default::default(),
    });
    if args.allowed_prometheus_urls.is_none() {
        warn!(
            "--allowed-prometheus-urls is not set: a LanePool may name any Prometheus URL, and its credentials go only to --prometheus-url"
        );
    }
    let settings = Settings {
        allowed_prometheus_urls: args
            .allowed_prometheus_urls
            .clone()
            .unwrap_or_else(AllowedUrls::any),
        prometheus_concurrency: args.prometheus_concurrency.into(),
        concurrent_reconciles: args.concurrent_reconciles,
        default_prometheus_url: args.prometheus_url.clone(),
        windows: QueryWindows {
            arrival_rate: args.rate_window.clone(),
            recent_arrival_rate: Some(args.recent_rate_lookback.clone()),
            scrape_interval: args.scrape_interval,
            job_time: args.job_time_window.clone(),
        },
        surge_timeout: args.surge_timeout,
        idle_workers_first: args.idle_workers_first,
        worker_reads: args.worker_reads,
        drain_timeout: args.drain_timeout,
        credential_max_age: args.credential_max_age,
        write_timeout: args.write_timeout,
    };
    // With leader election nothing is written until this replica holds the lease and sees it
    // renewed (see `leader::Fence`).
    let fence = if args.leader_election {
        leader::Fence::closed()
    } else {
        leader::Fence::open()
    };
    let ctx = Arc::new(Context::new(client, metrics.clone(), settings).with_fence(fence.clone()));
    let endpoint = tokio::spawn(server::serve(listener, metrics, health.clone()));
    info!(
        metrics_addr = %args.metrics_addr,
        namespaces = ?args.namespaces,
        prometheus_url = ?args.prometheus_url,
        "lanepool operator starting"
    );
    health.ready.store(true, Ordering::Relaxed);
    let signal = futures::FutureExt::shared(Box::pin(shutdown_signal()));

    if !args.leader_election {
        crate::controller::run(ctx, args.namespaces, signal).await;
        endpoint.abort();
        info!("lanepool operator stopped");
        return ExitCode::SUCCESS;
    }

    let identity = args
        .identity
        .clone()
        .unwrap_or_else(|| format!("lanepool-{}", std::process::id()));
    let mut leadership = match leader::campaign(
        ctx.client.clone(),
        &args.leader_election_namespace,
        &identity,
        args.leader_election_lease_duration,
        fence,
    )
    .await
    {
        Ok(leadership) => leadership,
        Err(e) => {
            error!(
                "leader election in namespace {}: {e}",
                args.leader_election_namespace
            );
            return ExitCode::FAILURE;
        }
    };
    info!(%identity, namespace = %args.leader_election_namespace, "waiting for the leader lease");
    let became_leader = tokio::select! {
        acquired = leadership.acquired() => acquired,
        _ = signal.clone() => false,
    };
    if !became_leader {
        leadership.release().await;
        endpoint.abort();
        info!("lanepool operator stopped before it became the leader");
        return ExitCode::SUCCESS;
    }
    let lost = Arc::new(AtomicBool::new(false));
    let lost_lease = {
        let lost = lost.clone();
        let gone = leadership.lost();
        async move {
            gone.await;
            lost.store(true, Ordering::Relaxed);
        }
    };
    // SIGTERM lets the reconciles in flight finish; a lost lease drops them where they stand,
    // so nothing more is written once another replica may hold the lease.
    tokio::select! {
        _ = crate::controller::run(ctx, args.namespaces, signal) => {}
        _ = lost_lease => {}
    }
    endpoint.abort();
    if lost.load(Ordering::Relaxed) {
        error!("lost the leader lease; exiting so that no two replicas write");
        return ExitCode::FAILURE;
    }
    leadership.release().await;
    info!("lanepool operator stopped");
    ExitCode::SUCCESS
}

async fn shutdown_signal() {
    let terminate = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut signal) => {
                signal.recv().await;
            }
            Err(_) => std::future::pending::<()>().await,
        }
    };
    tokio::select! {
        _ = tokio::signal::ctrl_c() => {},
        _ = terminate => {},
    }
}

fn init_logging(args: &RunArgs) -> Result<(), String> {
    let filter =
        tracing_subscriber::EnvFilter::try_new(&args.log_level).map_err(|e| e.to_string())?;
    let builder = tracing_subscriber::fmt().with_env_filter(filter);
    let result = if args.log_format == "json" {
        builder.json().try_init()
    } else {
        builder.try_init()
    };
    result.map_err(|e| e.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_credential_may_age_an_hour_at_least_or_only_rotate_when_asked() {
        assert_eq!(credential_max_age("0"), Ok(Duration::ZERO));
        assert_eq!(credential_max_age("1h"), Ok(Duration::from_secs(3600)));
        assert_eq!(
            credential_max_age("720h"),
            Ok(Duration::from_secs(720 * 3600))
        );
        let too_soon = credential_max_age("59m59s").unwrap_err();
        assert!(too_soon.contains("at least 1h"), "{too_soon}");
        assert!(credential_max_age("soon").is_err());
    }
}
