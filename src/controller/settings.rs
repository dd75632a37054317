//! The operator's settings, from its flags, and the time budgets they imply.

use std::time::Duration;

use crate::prometheus::{AllowedUrls, QueryWindows};

/// The field manager of every write.
pub const MANAGER: &str = "lanepool";

/// Operator-wide settings, from flags.
#[derive(Clone, Debug)]
pub struct Settings {
    /// Used when a LanePool names no Prometheus URL.
    pub default_prometheus_url: Option<String>,
    pub windows: QueryWindows,
    /// How long a write to the API server may take.
    pub write_timeout: Duration,
    /// How long a shrinking Deployment waits for the growing ones to be ready; zero: no wait.
    pub surge_timeout: Duration,
    /// The Prometheus URLs a pool may name.
    pub allowed_prometheus_urls: AllowedUrls,
    /// Most Prometheus queries in flight at once, across every pool.
    pub prometheus_concurrency: usize,
    /// Most pools reconciled at once.
    pub concurrent_reconciles: u16,
    /// Before a Deployment shrinks, mark its busy Pods costlier to delete, so idle ones go first.
    pub idle_workers_first: bool,
    /// With idle workers first: the most a shrink waits for the workers it stops to finish their
    /// jobs after asking them to drain (a lane's job times bound it lower); zero: no drain.
    pub drain_timeout: Duration,
    /// Read each measured pool's workers' own finished-job counts at their port named `metrics`
    /// (`lanepool_job_duration_seconds_count`), so the reserve follows a rate seconds old.
    pub worker_reads: bool,
    /// How old a pool's worker credential may get before the operator makes a new one; zero:
    /// only when the pool asks (`lanepool.dev/rotate-credential`).
    pub credential_max_age: Duration,
}

/// The operator's default `--credential-max-age`: 30 days.
pub const DEFAULT_CREDENTIAL_MAX_AGE: Duration = Duration::from_secs(30 * 86_400);

/// The operator's default limit on pools reconciled at once (`--concurrent-reconciles`).
pub const DEFAULT_CONCURRENT_RECONCILES: u16 = 32;

/// How long a pool's measurement may take: most of the interval, so a slow Prometheus delays
/// the pool's next decision at most to its next interval.
pub(super) fn measure_deadline(interval: Duration) -> Duration {
    (interval * 8 / 10).max(Duration::from_secs(1))
}
