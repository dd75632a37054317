//! The operator's own metrics, served on /metrics: reconciles and their errors, each pool's
//! decision, Prometheus query latency and failures, and writes to the API server. Recording a
//! metric must never fail or block a reconcile.

use std::time::Duration;

use prometheus_client::encoding::text::encode;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;
use std::sync::atomic::AtomicU64;

use crate::sizing::Decision;

type Labels = Vec<(&'static str, String)>;

/// Every metric the operator exports.
pub struct Metrics {
    registry: Registry,
    reconciles: Family<Labels, Counter>,
    reconcile_errors: Family<Labels, Counter>,
    reconcile_duration: Histogram,
    measurement_lateness: Histogram,
    reserved: Family<Labels, Gauge>,
    shared: Family<Labels, Gauge>,
    arrival_rate: Family<Labels, Gauge<f64, AtomicU64>>,
    job_seconds: Family<Labels, Gauge<f64, AtomicU64>>,
    reserve_capped: Family<Labels, Gauge>,
    failed_intervals: Family<Labels, Gauge>,
    query_duration: Histogram,
    query_failures: Counter,
    writes: Family<Labels, Counter>,
    worker_reads_rejected: Family<Labels, Counter>,
    drain_answers: Family<Labels, Counter>,
    stand_in_answers: Family<Labels, Counter>,
    busy_workers_stopped: Family<Labels, Counter>,
    worker_request_wait: Histogram,
    worker_request_duration: Histogram,
    surge_duration: Histogram,
}

impl Default for Metrics {
    fn default() -> Self {
        let mut registry = Registry::with_prefix("lanepool_operator");
        let metrics = Self {
            reconciles: Family::default(),
            reconcile_errors: Family::default(),
            reconcile_duration: Histogram::new(exponential_buckets(0.001, 2.0, 14)),
            // 0 (on time) up to about 7 minutes.
            measurement_lateness: Histogram::new(
                std::iter::once(0.0).chain(exponential_buckets(0.05, 2.0, 14)),
            ),
            reserved: Family::default(),
            shared: Family::default(),
            arrival_rate: Family::default(),
            job_seconds: Family::default(),
            reserve_capped: Family::default(),
            failed_intervals: Family::default(),
            query_duration: Histogram::new(exponential_buckets(0.001, 2.0, 14)),
            query_failures: Counter::default(),
            writes: Family::default(),
            worker_reads_rejected: Family::default(),
            drain_answers: Family::default(),
            stand_in_answers: Family::default(),
            busy_workers_stopped: Family::default(),
            // 0 (a slot was free) up to about 4 s.
            worker_request_wait: Histogram::new(
                std::iter::once(0.0).chain(exponential_buckets(0.0005, 2.0, 14)),
            ),
            worker_request_duration: Histogram::new(exponential_buckets(0.0005, 2.0, 14)),
            // 1/8 s up to about 4 minutes, past the default surge timeout of 2m.
            surge_duration: Histogram::new(exponential_buckets(0.125, 2.0, 12)),
            registry: Registry::default(),
        };
        registry.register(
            "reconciles",
            "Reconciles of LanePools",
            metrics.reconciles.clone(),
        );
        registry.register(
            "reconcile_errors",
            "Failed reconciles, by kind of error",
            metrics.reconcile_errors.clone(),
        );
        registry.register(
            "reconcile_duration_seconds",
            "Time a reconcile took",
            metrics.reconcile_duration.clone(),
        );
        registry.register(
            "measurement_lateness_seconds",
            "How long past its interval a pool was measured: 0 on time, more when reconciles queue",
            metrics.measurement_lateness.clone(),
        );
        registry.register(
            "reserved_workers",
            "Reserved workers decided per pool and lane",
            metrics.reserved.clone(),
        );
        registry.register(
            "shared_workers",
            "Shared workers decided per pool",
            metrics.shared.clone(),
        );
        registry.register(
            "arrival_rate",
            "Measured arrival rate per pool and reserve lane, jobs per second",
            metrics.arrival_rate.clone(),
        );
        registry.register(
            "job_seconds",
            "Measured mean job time per pool and reserve lane",
            metrics.job_seconds.clone(),
        );
        registry.register(
            "reserve_capped",
            "1 while a reserve lane's load asks for more than its reserve.max",
            metrics.reserve_capped.clone(),
        );
        registry.register(
            "metrics_failed_intervals",
            "Intervals in a row in which some reserve lane of the pool could not be measured",
            metrics.failed_intervals.clone(),
        );
        registry.register(
            "prometheus_query_duration_seconds",
            "Latency of queries to Prometheus",
            metrics.query_duration.clone(),
        );
        registry.register(
            "prometheus_query_failures",
            "Queries to Prometheus that failed",
            metrics.query_failures.clone(),
        );
        registry.register(
            "kube_writes",
            "Writes to the API server, by result (success, failure, timeout)",
            metrics.writes.clone(),
        );
        registry.register(
            "worker_reads_rejected",
            "Answers of worker Pods not taken, by reason: too_large (over the byte or line cap, or \
             too many series), redirect (never followed), not_text, implausible (more finished \
             jobs than the worker could have run)",
            metrics.worker_reads_rejected.clone(),
        );
        registry.register(
            "drain_answers",
            "Drained workers' answers to the drain requests before a shrink, by pool and outcome: \
             busy (draining, a job in hand: the shrink waits), idle (draining, no job: it may \
             go), refused (it does not drain: another worker is chosen), unreachable (not heard \
             from: the shrink waits)",
            metrics.drain_answers.clone(),
        );
        registry.register(
            "stand_in_answers",
            "Answers to the stand-in requests while a reserve grows, by pool and outcome: \
             standing_in (it serves the reserve's lanes until the new workers are ready), \
             refused (it does not stand in), unreachable (not heard from); neither of the last \
             two holds anything back",
            metrics.stand_in_answers.clone(),
        );
        registry.register(
            "busy_workers_stopped",
            "Workers a shrink stopped that its ranking last read busy, by pool: each job in hand \
             is cut short unless it ends within the grace period. With draining on, only workers \
             that do not drain can be among them",
            metrics.busy_workers_stopped.clone(),
        );
        registry.register(
            "worker_request_wait_seconds",
            "How long a request to a worker Pod waited for one of the operator's slots: near 0 \
             when one was free, more when Pod requests are what reconciles queue on",
            metrics.worker_request_wait.clone(),
        );
        registry.register(
            "worker_request_duration_seconds",
            "Time a request to a worker Pod took once sent, answered or not",
            metrics.worker_request_duration.clone(),
        );
        registry.register(
            "surge_duration_seconds",
            "From a role change decided to the growing Deployments ready (or the surge timeout): \
             the pod start that `lanepool simulate --suite --pod-start` asks for",
            metrics.surge_duration.clone(),
        );
        Self {
            registry,
            ..metrics
        }
    }
}

impl Metrics {
    pub fn reconciled(&self, namespace: &str, pool: &str, took: Duration) {
        self.reconciles
            .get_or_create(&vec![
                ("namespace", namespace.into()),
                ("pool", pool.into()),
            ])
            .inc();
        self.reconcile_duration.observe(took.as_secs_f64());
    }

    /// A pool measured `late` past its interval.
    pub fn measured_late(&self, late: Duration) {
        self.measurement_lateness.observe(late.as_secs_f64());
    }

    /// A request to a worker Pod that waited `wait` for a slot and then took `took` (`None`:
    /// the reconcile's budget ran out while it waited).
    pub fn worker_requested(&self, wait: Duration, took: Option<Duration>) {
        self.worker_request_wait.observe(wait.as_secs_f64());
        if let Some(took) = took {
            self.worker_request_duration.observe(took.as_secs_f64());
        }
    }

    /// A role change's surge over after `waited`: its growing Deployments ready, or timed out.
    pub fn surge_ended(&self, waited: Duration) {
        self.surge_duration.observe(waited.as_secs_f64());
    }

    pub fn reconcile_failed(&self, error: &'static str) {
        self.reconcile_errors
            .get_or_create(&vec![("error", error.to_string())])
            .inc();
    }

    pub fn decided(&self, namespace: &str, pool: &str, decision: &Decision) {
        let pool_labels = || {
            vec![
                ("namespace", namespace.to_string()),
                ("pool", pool.to_string()),
            ]
        };
        for lane in &decision.lanes {
            let mut labels = pool_labels();
            labels.push(("lane", lane.name.clone()));
            self.reserved
                .get_or_create(&labels)
                .set(i64::from(lane.reserve));
            self.reserve_capped
                .get_or_create(&labels)
                .set(i64::from(lane.capped));
            if let Some(load) = lane.load {
                self.arrival_rate
                    .get_or_create(&labels)
                    .set(load.arrival_rate);
                if let Some(job) = load.job_seconds {
                    self.job_seconds.get_or_create(&labels).set(job);
                }
            }
        }
        self.shared
            .get_or_create(&pool_labels())
            .set(i64::from(decision.shared));
        self.failed_intervals
            .get_or_create(&pool_labels())
            .set(i64::from(decision.failed_intervals));
    }

    /// Removes a deleted pool's series, so the operator stops exporting it.
    pub fn forget(&self, namespace: &str, pool: &str, lanes: impl IntoIterator<Item = String>) {
        let pool_labels = vec![
            ("namespace", namespace.to_string()),
            ("pool", pool.to_string()),
        ];
        self.reconciles.remove(&pool_labels);
        self.shared.remove(&pool_labels);
        self.failed_intervals.remove(&pool_labels);
        for outcome in ["busy", "idle", "refused", "unreachable"] {
            let mut labels = pool_labels.clone();
            labels.push(("outcome", outcome.to_string()));
            self.drain_answers.remove(&labels);
        }
        for outcome in ["standing_in", "refused", "unreachable"] {
            let mut labels = pool_labels.clone();
            labels.push(("outcome", outcome.to_string()));
            self.stand_in_answers.remove(&labels);
        }
        self.busy_workers_stopped.remove(&pool_labels);
        for lane in lanes {
            let mut labels = pool_labels.clone();
            labels.push(("lane", lane));
            self.reserved.remove(&labels);
            self.arrival_rate.remove(&labels);
            self.job_seconds.remove(&labels);
            self.reserve_capped.remove(&labels);
        }
    }

    pub fn observe_query(&self, took: Duration, failure: Option<&str>) {
        self.query_duration.observe(took.as_secs_f64());
        if failure.is_some() {
            self.query_failures.inc();
        }
    }

    pub fn wrote(&self, result: &'static str) {
        self.writes
            .get_or_create(&vec![("result", result.to_string())])
            .inc();
    }

    /// A worker Pod's answer not taken, for `reason`.
    pub fn worker_read_rejected(&self, reason: &'static str) {
        self.worker_reads_rejected
            .get_or_create(&vec![("reason", reason.to_string())])
            .inc();
    }

    /// A drained worker of `pool` answered with `outcome` (busy, idle, refused, unreachable).
    pub fn drain_answered(&self, namespace: &str, pool: &str, outcome: &'static str) {
        self.drain_answers
            .get_or_create(&vec![
                ("namespace", namespace.to_string()),
                ("pool", pool.to_string()),
                ("outcome", outcome.to_string()),
            ])
            .inc();
    }

    /// A worker of `pool` asked to stand in answered with `outcome` (standing_in, refused,
    /// unreachable).
    pub fn stand_in_answered(&self, namespace: &str, pool: &str, outcome: &'static str) {
        self.stand_in_answers
            .get_or_create(&vec![
                ("namespace", namespace.to_string()),
                ("pool", pool.to_string()),
                ("outcome", outcome.to_string()),
            ])
            .inc();
    }

    /// A shrink of `pool` stopped `count` workers its ranking last read busy.
    pub fn stopped_busy(&self, namespace: &str, pool: &str, count: u64) {
        if count == 0 {
            return;
        }
        self.busy_workers_stopped
            .get_or_create(&vec![
                ("namespace", namespace.to_string()),
                ("pool", pool.to_string()),
            ])
            .inc_by(count);
    }

    /// How many workers of `pool` shrinks stopped busy.
    pub fn busy_workers_stopped(&self, namespace: &str, pool: &str) -> u64 {
        self.busy_workers_stopped
            .get_or_create(&vec![
                ("namespace", namespace.to_string()),
                ("pool", pool.to_string()),
            ])
            .get()
    }

    /// How many drain answers of `pool` had `outcome`.
    pub fn drain_answers(&self, namespace: &str, pool: &str, outcome: &'static str) -> u64 {
        self.drain_answers
            .get_or_create(&vec![
                ("namespace", namespace.to_string()),
                ("pool", pool.to_string()),
                ("outcome", outcome.to_string()),
            ])
            .get()
    }

    /// How many worker Pods' answers were not taken for `reason`.
    pub fn worker_reads_rejected(&self, reason: &'static str) -> u64 {
        self.worker_reads_rejected
            .get_or_create(&vec![("reason", reason.to_string())])
            .get()
    }

    /// The Prometheus text exposition of every metric.
    pub fn render(&self) -> String {
        let mut text = String::new();
        // Writing into a String cannot fail.
        let _ = encode(&mut text, &self.registry);
        text
    }
}
