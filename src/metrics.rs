//! The operator's own metrics, served on /metrics: reconciles and their errors, each pool's
//! decision and conditions, Prometheus query latency and failures, and writes to the API server.
//! Recording a metric must never fail or block a reconcile, and no value a user writes may add a
//! series beyond a pool, a lane or a fixed set of names.

use std::time::Duration;

use prometheus_client::encoding::text::encode;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;
use std::sync::atomic::AtomicU64;

use crate::api::LanePoolStatus;
use crate::sizing::Decision;

type Labels = Vec<(&'static str, String)>;

/// The condition types the operator sets on a LanePool (`controller/status.rs`,
/// `controller/rollout/grace.rs`): the only ones exported, so a condition someone else writes
/// into the status adds no series.
pub const POOL_CONDITION_TYPES: [&str; 5] = [
    "Ready",
    "MetricsAvailable",
    "ScalingLimited",
    "Paused",
    "GracePeriodTooShort",
];

/// A condition's possible statuses: one series each, as kube-state-metrics exports conditions.
const CONDITION_STATUSES: [&str; 3] = ["True", "False", "Unknown"];

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
    pool_conditions: Family<Labels, Gauge>,
    shrink_held: Family<Labels, Gauge>,
    build_info: Family<Labels, Gauge>,
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
            pool_conditions: Family::default(),
            shrink_held: Family::default(),
            build_info: Family::default(),
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
            "pool_condition",
            "A LanePool's status conditions as its status holds them: 1 on the series of the \
             condition's status (True, False or Unknown), 0 on the other two; only the \
             operator's own condition types",
            metrics.pool_conditions.clone(),
        );
        registry.register(
            "shrink_held",
            "1 while the pool's status.rollout says a shrink waits: for the Deployments taking \
             over to be ready, or for draining workers to be idle",
            metrics.shrink_held.clone(),
        );
        registry.register(
            "build_info",
            "Always 1, with the operator's version: exported by every replica, leader or not",
            metrics.build_info.clone(),
        );
        metrics
            .build_info
            .get_or_create(&vec![("version", env!("CARGO_PKG_VERSION").to_string())])
            .set(1);
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

    /// The status written on `pool` (or found already as it should be): its conditions, one
    /// series per condition type and status, and whether a shrink waits. A type the status no
    /// longer carries has its series removed.
    pub fn reported(&self, namespace: &str, pool: &str, status: &LanePoolStatus) {
        let pool_labels = vec![
            ("namespace", namespace.to_string()),
            ("pool", pool.to_string()),
        ];
        for type_ in POOL_CONDITION_TYPES {
            let condition = status.conditions.iter().find(|c| c.type_ == type_);
            for value in CONDITION_STATUSES {
                let labels = condition_labels(&pool_labels, type_, value);
                match condition {
                    Some(c) => {
                        // Anything but True or False reads as Unknown.
                        let is = match c.status.as_str() {
                            "True" | "False" => c.status == value,
                            _ => value == "Unknown",
                        };
                        self.pool_conditions
                            .get_or_create(&labels)
                            .set(i64::from(is));
                    }
                    None => {
                        self.pool_conditions.remove(&labels);
                    }
                }
            }
        }
        self.shrink_held
            .get_or_create(&pool_labels)
            .set(i64::from(status.rollout.is_some()));
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
        self.shrink_held.remove(&pool_labels);
        for type_ in POOL_CONDITION_TYPES {
            for value in CONDITION_STATUSES {
                let labels = condition_labels(&pool_labels, type_, value);
                self.pool_conditions.remove(&labels);
            }
        }
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

fn condition_labels(pool_labels: &Labels, type_: &str, status: &str) -> Labels {
    let mut labels = pool_labels.clone();
    labels.push(("type", type_.to_string()));
    labels.push(("status", status.to_string()));
    labels
}

#[cfg(test)]
mod tests {
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
    use k8s_openapi::jiff::Timestamp;

    use super::*;

    fn condition(type_: &str, status: &str) -> Condition {
        Condition {
            type_: type_.into(),
            status: status.into(),
            reason: "Because".into(),
            message: String::new(),
            observed_generation: Some(1),
            last_transition_time: Time(Timestamp::UNIX_EPOCH),
        }
    }

    fn status(conditions: &[(&str, &str)], rollout: Option<&str>) -> LanePoolStatus {
        LanePoolStatus {
            conditions: conditions
                .iter()
                .map(|(type_, status)| condition(type_, status))
                .collect(),
            rollout: rollout.map(String::from),
            ..LanePoolStatus::default()
        }
    }

    /// The value of the series `name{labels}` in `text`, if it is exported.
    fn value(text: &str, series: &str) -> Option<f64> {
        text.lines()
            .find_map(|line| line.strip_prefix(series)?.trim().parse().ok())
    }

    fn ready(text: &str, status: &str) -> Option<f64> {
        value(
            text,
            &format!(
                "lanepool_operator_pool_condition{{namespace=\"team\",pool=\"jobs\",\
                 type=\"Ready\",status=\"{status}\"}}"
            ),
        )
    }

    #[test]
    fn each_condition_is_one_series_per_status_with_only_its_own_set() {
        let metrics = Metrics::default();
        metrics.reported(
            "team",
            "jobs",
            &status(&[("Ready", "False"), ("ScalingLimited", "True")], None),
        );
        let text = metrics.render();
        assert_eq!(ready(&text, "False"), Some(1.0), "{text}");
        assert_eq!(ready(&text, "True"), Some(0.0), "{text}");
        assert_eq!(ready(&text, "Unknown"), Some(0.0), "{text}");
        let limited = "lanepool_operator_pool_condition{namespace=\"team\",pool=\"jobs\",\
                       type=\"ScalingLimited\",status=\"True\"}";
        assert_eq!(value(&text, limited), Some(1.0), "{text}");
        // A type the status does not carry has no series.
        assert!(!text.contains("type=\"Paused\""), "{text}");

        // Ready turns True: the same series, their values swapped.
        metrics.reported("team", "jobs", &status(&[("Ready", "True")], None));
        let text = metrics.render();
        assert_eq!(ready(&text, "True"), Some(1.0), "{text}");
        assert_eq!(ready(&text, "False"), Some(0.0), "{text}");
        assert!(!text.contains("type=\"ScalingLimited\""), "{text}");
    }

    #[test]
    fn conditions_others_write_add_no_series() {
        let metrics = Metrics::default();
        let written = status(&[("Ready", "Maybe"), ("SomeoneElses", "True")], None);
        metrics.reported("team", "jobs", &written);
        let text = metrics.render();
        assert!(!text.contains("SomeoneElses"), "{text}");
        assert_eq!(ready(&text, "Unknown"), Some(1.0), "{text}");
        assert!(!text.contains("status=\"Maybe\""), "{text}");
    }

    #[test]
    fn a_held_shrink_is_exported_while_the_status_says_it_waits() {
        let metrics = Metrics::default();
        let held = "lanepool_operator_shrink_held{namespace=\"team\",pool=\"jobs\"}";
        let waiting = Some("Deployment jobs-shared runs 9, shrinks to 7 once …");
        metrics.reported("team", "jobs", &status(&[], waiting));
        assert_eq!(value(&metrics.render(), held), Some(1.0));
        metrics.reported("team", "jobs", &status(&[], None));
        assert_eq!(value(&metrics.render(), held), Some(0.0));
    }

    #[test]
    fn a_deleted_pool_leaves_no_condition_series_behind() {
        let metrics = Metrics::default();
        let every = POOL_CONDITION_TYPES.map(|type_| (type_, "True"));
        metrics.reported("team", "jobs", &status(&every, Some("waits")));
        metrics.reported("team", "other", &status(&every, None));
        metrics.forget("team", "jobs", Vec::new());
        let text = metrics.render();
        assert!(!text.contains("pool=\"jobs\""), "{text}");
        assert_eq!(
            text.matches("lanepool_operator_pool_condition{").count(),
            POOL_CONDITION_TYPES.len() * CONDITION_STATUSES.len(),
            "the other pool's stay: {text}"
        );
    }

    #[test]
    fn the_build_info_is_exported_before_any_pool() {
        let text = Metrics::default().render();
        let info = format!(
            "lanepool_operator_build_info{{version=\"{}\"}}",
            env!("CARGO_PKG_VERSION")
        );
        assert_eq!(value(&text, &info), Some(1.0), "{text}");
    }
}
