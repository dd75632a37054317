//! The LanePool custom resource (`lanepool.dev/v1alpha1`): lanes in priority order, the reserve
//! each lane asks for, how big the pool is, and what the operator reports back. Rules that cross
//! fields are CEL in the CRD, so the API server refuses a bad manifest; nothing here does I/O.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{PodTemplateSpec, SecretKeySelector};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use kube::{CustomResource, KubeSchema};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::duration::KubeDuration;

pub const GROUP: &str = "lanepool.dev";
/// Pod label naming the LanePool a worker belongs to.
pub const POOL_LABEL: &str = "lanepool.dev/pool";
/// Pod label saying whether a worker is `reserved` or `shared`.
pub const ROLE_LABEL: &str = "lanepool.dev/role";
/// Pod label naming the lane a reserved worker serves.
pub const LANE_LABEL: &str = "lanepool.dev/lane";

/// A worker pool whose lanes share workers: reserved workers take only their lane, shared
/// workers take every lane in priority order. The reserve is sized from the lane's measured
/// arrival rate and job time.
// The derive repeats printcolumn keys by design; clippy reads them as duplicated attributes.
#[allow(clippy::duplicated_attributes)]
#[derive(CustomResource, KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[kube(
    group = "lanepool.dev",
    version = "v1alpha1",
    kind = "LanePool",
    namespaced,
    shortname = "lp",
    status = "LanePoolStatus",
    doc = "A worker pool with priority lanes: reserved workers per lane plus shared workers.",
    validation = Rule::new("self.metadata.name.size() <= 63").message("a LanePool's name must be at most 63 characters: it is the value of its workers' lanepool.dev/pool label"),
    scale(
        spec_replicas_path = ".spec.totalWorkers",
        status_replicas_path = ".status.replicas",
        label_selector_path = ".status.selector"
    ),
    printcolumn(
        name = "Reserves",
        type_ = "string",
        description = "every reserve lane's reserve as it runs (→ what was decided, while a shrink waits)",
        json_path = ".status.reserves"
    ),
    printcolumn(name = "Reserved", type_ = "integer", json_path = ".status.reserved"),
    printcolumn(name = "Shared", type_ = "integer", json_path = ".status.shared"),
    printcolumn(
        name = "Metrics",
        type_ = "string",
        description = "whether every reserve lane was measured (MetricsAvailable)",
        json_path = ".status.conditions[?(@.type==\"MetricsAvailable\")].status"
    ),
    printcolumn(
        name = "Paused",
        type_ = "string",
        description = "True while spec.paused leaves the Deployments alone",
        json_path = ".status.conditions[?(@.type==\"Paused\")].status"
    ),
    printcolumn(
        name = "Ready",
        type_ = "string",
        json_path = ".status.conditions[?(@.type==\"Ready\")].status"
    ),
    printcolumn(
        name = "Age",
        type_ = "date",
        json_path = ".metadata.creationTimestamp"
    ),
    printcolumn(
        name = "Urgent Rate",
        type_ = "string",
        description = "arrival rate of the first reserve lane",
        json_path = ".status.lanes[0].arrivalRate",
        priority = 1
    ),
    printcolumn(
        name = "Job Time",
        type_ = "string",
        description = "job time of the first reserve lane",
        json_path = ".status.lanes[0].jobTime",
        priority = 1
    ),
    printcolumn(
        name = "Scale Down",
        type_ = "string",
        description = "Paused while spec.scaleDown.paused holds every count at its highest",
        json_path = ".status.scaleDown",
        priority = 1
    ),
    printcolumn(
        name = "Rollout",
        type_ = "string",
        description = "while a shrink waits: what it waits for, and until when",
        json_path = ".status.rollout",
        priority = 1
    )
)]
#[serde(rename_all = "camelCase")]
#[x_kube(validation = Rule::new(
    "has(self.totalWorkers) != (has(self.shared) && has(self.shared.replicas))"
).message("set exactly one pool size: spec.totalWorkers (a fixed budget) or spec.shared.replicas (shared workers, reserved added on top)").field_path(".totalWorkers"))]
#[x_kube(validation = Rule::new(
    "!has(self.totalWorkers) || self.totalWorkers >= self.lanes.filter(l, has(l.reserve)).map(l, has(l.reserve.min) ? l.reserve.min : 1).sum() + (has(self.shared) && has(self.shared.minReplicas) ? self.shared.minReplicas : 1)"
).message("spec.totalWorkers must be at least the sum of every lane's reserve.min plus shared.minReplicas").field_path(".totalWorkers"))]
#[x_kube(validation = Rule::new(
    "!has(self.prometheus) || !has(self.prometheus.timeout) || duration(self.prometheus.timeout) < duration(self.interval)"
).message("spec.prometheus.timeout must be shorter than spec.interval").field_path(".prometheus.timeout"))]
pub struct LanePoolSpec {
    /// Lanes in priority order: shared workers take the first lane with work waiting. At least
    /// one lane has a reserve and at least one has none (the lane shared workers fall back to);
    /// no two take the same queue.
    #[schemars(length(min = 1, max = 16))]
    #[x_kube(
        validation = Rule::new("self.all(a, self.filter(b, b.name == a.name).size() == 1)").message("lane names must be unique"),
        validation = Rule::new("self.all(a, self.filter(b, (has(b.queue) ? b.queue : b.name) == (has(a.queue) ? a.queue : a.name)).size() == 1)").message("two lanes may not take the same queue (a lane without spec.lanes[].queue takes the queue of its name)"),
        validation = Rule::new("self.exists(l, has(l.reserve))").message("at least one lane needs a reserve (reserved workers)"),
        validation = Rule::new("self.exists(l, !has(l.reserve))").message("at least one lane must have no reserve: the lane shared workers take when no reserve lane has work")
    )]
    pub lanes: Vec<Lane>,

    /// Multiplies the measured arrival rate each reserve is sized for. Default 1: with the
    /// default `Queueing` sizing the reserve keeps the urgent wait p99 within the job time at
    /// the measured load, and shared workers take what is above it; raise it (the guide's
    /// formula uses 1.5) to plan for more load than is measured, at some batch cost.
    /// Greater than 0, at most 10.
    #[serde(default = "default_headroom")]
    #[schemars(range(min = 0.0, max = MOST_HEADROOM), extend("exclusiveMinimum" = true))]
    pub headroom: f64,

    /// A fixed budget of workers: shared = totalWorkers − reserved, never below
    /// shared.minReplicas. At least Σ reserve.min + shared.minReplicas, so an autoscaler can take
    /// the pool as low as its reserves' floor. When it leaves less than the reserves ask, each
    /// lane keeps reserve.min and the rest goes to the lanes in priority order, each up to what
    /// it asks (ScalingLimited, reason TotalBelowReserves, says who got what); the pool never
    /// runs more than totalWorkers. Set this or shared.replicas, not both.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1, max = 10000))]
    pub total_workers: Option<i32>,

    /// Shared workers: they take every lane in priority order.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub shared: Option<SharedWorkers>,

    /// Jobs one worker (one Pod) runs at once: a Celery worker's --concurrency, a worker with
    /// several threads. Reserves are sized in job slots (the queueing model with workers ×
    /// slotsPerWorker servers) and rounded up to whole workers; reserve.min, reserve.max and the
    /// pool's size stay in workers. Every container gets it as LANEPOOL_SLOTS when it is not 1.
    /// Default 1; from 1 to 1024.
    #[serde(default = "default_slots_per_worker")]
    #[schemars(range(min = 1, max = MOST_SLOTS_PER_WORKER))]
    pub slots_per_worker: i32,

    /// The worker pod template. The operator adds LANEPOOL_LANES, LANEPOOL_ROLE and LANEPOOL_POOL
    /// to every container and the labels lanepool.dev/pool and lanepool.dev/role.
    pub template: PodTemplateSpec,

    /// Where to read the lanes' arrival rate and job time.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub prometheus: Option<PrometheusSource>,

    /// How often to measure and resize: each time the workers' own job counts are read (when
    /// they serve them at a port named `metrics`) and Prometheus asked. Default 5s; from 5s to 1h.
    #[serde(default = "default_interval")]
    #[x_kube(validation = Rule::new("duration(self) >= duration('5s') && duration(self) <= duration('1h')").message("interval must be between 5s and 1h"))]
    pub interval: KubeDuration,

    /// How scaling down is slowed; scaling up is immediate.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub scale_down: Option<ScaleDown>,

    /// What to do when a lane's metrics cannot be read. Default: Hold the current counts.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub on_metrics_unavailable: Option<OnMetricsUnavailable>,

    /// When true the operator leaves the pool's Deployments alone.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub paused: bool,
}

/// One lane: a queue of jobs with the same priority.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct Lane {
    /// The lane's name, as workers see it in LANEPOOL_LANES and label their metrics: a DNS label
    /// such as `urgent` (it is part of Deployment names and label values).
    #[schemars(
        length(min = 1, max = 40),
        regex(pattern = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
    )]
    pub name: String,

    /// The queue the lane's workers take its jobs from, when it is not the lane's name: an RQ
    /// queue, a Celery queue, a Redis list's name after the prefix, such as `high_priority`.
    /// Default: the lane's name. 1–255 bytes (a RabbitMQ queue name's limit), without `,`, `=`,
    /// spaces or control characters (LANEPOOL_QUEUES, and Celery's -Q, separate at them). Workers
    /// learn it from LANEPOOL_QUEUES; metrics, drains and stand-ins still name the lane.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = MOST_QUEUE_BYTES), regex(pattern = QUEUE_PATTERN))]
    #[x_kube(validation = Rule::new("bytes(self).size() <= 255").message("a lane's queue is at most 255 bytes (UTF-8)"))]
    pub queue: Option<String>,

    /// Workers reserved for this lane only. Lanes without a reserve are served by shared workers.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reserve: Option<Reserve>,
}

/// How many workers to reserve for a lane, and how to measure its load.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase")]
#[x_kube(validation = Rule::new("self.min <= self.max").message("reserve.min must not exceed reserve.max"))]
#[x_kube(validation = Rule::new("(has(self.sizing) && self.sizing == 'LatencyTarget') == has(self.targetP99)").message("reserve.targetP99 is required with sizing LatencyTarget and not allowed otherwise").field_path(".targetP99"))]
pub struct Reserve {
    /// Fewest reserved workers, whatever the load. Default 1.
    #[serde(default = "default_reserve_min")]
    #[schemars(range(min = 0, max = 1000))]
    pub min: i32,

    /// Most reserved workers; above this the shared workers absorb the load.
    #[schemars(range(min = 1, max = 1000))]
    pub max: i32,

    /// How the reserve is computed from the measured load. `Queueing` (the default): the
    /// smallest reserve that keeps up with the rate × headroom and whose predicted urgent wait
    /// p99 (Poisson arrivals, each job plus a 0.4 ms hand-off, the shared workers helping as
    /// often as they finish their own jobs) is at most the lane's measured job time, the guide's
    /// test of a working pool. `Formula`: ceil(arrival rate × job time × headroom).
    /// `LatencyTarget`: the smallest reserve whose predicted p99 meets `targetP99`.
    #[serde(default)]
    pub sizing: SizingMode,

    /// With sizing LatencyTarget: the urgent p99, submission to completion, to plan for
    /// (for example "25ms"). More than 0, at most 1h.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[x_kube(validation = Rule::new("duration(self) > duration('0s') && duration(self) <= duration('1h')").message("reserve.targetP99 must be more than 0 and at most 1h"))]
    pub target_p99: Option<KubeDuration>,

    /// The lane's arrival rate, in jobs per second.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub arrival_rate: Option<MetricQuery>,

    /// The lane's mean job time, in seconds.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub job_time: Option<JobTimeQuery>,
}

/// How a reserve is computed.
#[derive(JsonSchema, Serialize, Deserialize, Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum SizingMode {
    /// The smallest reserve whose predicted urgent wait p99 is at most the lane's job time,
    /// clamped to [min, max].
    #[default]
    Queueing,
    /// The guide's rule: ceil(arrival rate × job time × headroom), clamped to [min, max].
    Formula,
    /// The smallest reserve whose predicted p99 meets `targetP99`, clamped to [min, max].
    LatencyTarget,
}

/// A PromQL query answering one number.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct MetricQuery {
    /// PromQL that returns exactly one series. When absent, built from the worker metric
    /// convention (docs/worker-protocol.md) and scoped to this pool.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 4096))]
    pub query: Option<String>,
}

/// The query for a lane's job time, and what to assume when no job ran.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct JobTimeQuery {
    /// PromQL that returns the mean job time in seconds, exactly one series.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 4096))]
    pub query: Option<String>,

    /// The job time to assume when the query has no answer because no job ran recently
    /// (for example "20ms"). Without it, a lane with arrivals but no job time is
    /// "metrics unavailable".
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[x_kube(validation = Rule::new("duration(self) > duration('0s') && duration(self) <= duration('24h')").message("jobTime.fallback must be more than 0 and at most 24h"))]
    pub fallback: Option<KubeDuration>,
}

/// Shared workers: urgent lanes first, then the rest.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct SharedWorkers {
    /// A fixed number of shared workers; reserved workers are added on top. At least 1: shared
    /// workers are the only ones that take the lanes without a reserve.
    /// Set this or spec.totalWorkers, not both.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1, max = 10000))]
    pub replicas: Option<i32>,

    /// With spec.totalWorkers: the fewest shared workers, so batch work never stops. Default 1,
    /// at least 1.
    #[serde(default = "default_shared_min")]
    #[schemars(range(min = 1, max = 10000))]
    pub min_replicas: i32,
}

/// Where Prometheus is and how to reach it.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[serde(rename_all = "camelCase")]
#[x_kube(validation = Rule::new(
    "(!has(self.bearerTokenSecret) && !has(self.basicAuth) && !has(self.caSecret) && !has(self.clientCertificateSecret)) || !has(self.url) || self.url.startsWith('https://')"
).message("prometheus.url must start with https:// when a bearer token, basic auth, CA or client certificate is set: credentials must not travel in clear").field_path(".url"))]
#[x_kube(validation = Rule::new(
    "!has(self.bearerTokenSecret) || !has(self.basicAuth)"
).message("set at most one of prometheus.bearerTokenSecret and prometheus.basicAuth: both are sent as the Authorization header").field_path(".basicAuth"))]
pub struct PrometheusSource {
    /// Base URL, such as http://prometheus.monitoring:9090. Default: the operator's
    /// --prometheus-url.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 2048))]
    #[x_kube(validation = Rule::new("self.startsWith('http://') || self.startsWith('https://')").message("prometheus.url must start with http:// or https://"))]
    pub url: Option<String>,

    /// HTTP timeout of each query. Default 5s; at most 1m and shorter than spec.interval.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[x_kube(validation = Rule::new("duration(self) > duration('0s') && duration(self) <= duration('1m')").message("prometheus.timeout must be more than 0 and at most 1m"))]
    pub timeout: Option<KubeDuration>,

    /// A Secret key holding a bearer token sent with every query; requires an https:// URL.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub bearer_token_secret: Option<SecretKeySelector>,

    /// A Secret key holding the PEM CA bundle that signs Prometheus's certificate; requires an
    /// https:// URL.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ca_secret: Option<SecretKeySelector>,

    /// HTTP basic auth sent with every query, the username and password each from a Secret
    /// key; requires an https:// URL and cannot be combined with bearerTokenSecret.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub basic_auth: Option<PrometheusBasicAuth>,

    /// A Secret whose `tls.crt` and `tls.key` are the PEM client certificate (with any
    /// intermediates) and its private key, presented to Prometheus for mutual TLS: a
    /// kubernetes.io/tls Secret, such as cert-manager writes. Requires an https:// URL.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub client_certificate_secret: Option<ClientCertificateSecret>,

    /// Extra HTTP headers, such as X-Scope-OrgID for a multi-tenant Prometheus; at most 16.
    /// Headers that would redirect the request, carry a credential in the spec or change how
    /// the message is framed (Host, Authorization, Proxy-Authorization, Cookie and the
    /// hop-by-hop ones) are refused: credentials belong in bearerTokenSecret or basicAuth.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    #[schemars(extend("maxProperties" = 16))]
    #[x_kube(validation = Rule::new(
        "self.all(h, !(h.lowerAscii() in ['host', 'authorization', 'proxy-authorization', 'cookie', 'connection', 'keep-alive', 'te', 'trailer', 'transfer-encoding', 'upgrade', 'content-length', 'expect']))"
    ).message("prometheus.headers may not set Host, Authorization, Proxy-Authorization, Cookie or a hop-by-hop header (Connection, Keep-Alive, TE, Trailer, Transfer-Encoding, Upgrade, Content-Length, Expect): use bearerTokenSecret or basicAuth for credentials"))]
    pub headers: BTreeMap<String, String>,
}

/// HTTP basic auth for Prometheus, the way managed Prometheus services and a Prometheus with
/// `basic_auth_users` in its web config expect it.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct PrometheusBasicAuth {
    /// A Secret key holding the username.
    pub username_secret: SecretKeySelector,

    /// A Secret key holding the password.
    pub password_secret: SecretKeySelector,
}

/// A Secret of the pool's namespace holding a client certificate and its key.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct ClientCertificateSecret {
    /// The Secret's name; its keys `tls.crt` and `tls.key` are read.
    #[schemars(length(min = 1, max = 253))]
    pub name: String,
}

/// How scaling down is slowed.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct ScaleDown {
    /// A reserve shrinks only to the highest recommendation made within this window.
    /// Default 0s: a reserve shrinks as soon as the rate, raised by the 10% tolerance, asks
    /// for less (holding an idle reserve costs batch throughput); at most 24h.
    #[serde(default = "default_stabilization_window")]
    #[x_kube(validation = Rule::new("duration(self) <= duration('24h')").message("scaleDown.stabilizationWindow must be at most 24h"))]
    pub stabilization_window: KubeDuration,

    /// When true no reserve shrinks (each is held at its highest since) while growth goes on,
    /// for a deploy or an incident; with spec.totalWorkers shared workers still give way to a
    /// growing reserve. Unlike spec.paused, the operator keeps measuring and growing. Default
    /// false.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub paused: bool,
}

/// What to do while metrics are unavailable.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase")]
#[x_kube(validation = Rule::new("self.action != 'FixedReserve' || has(self.reserve)").message("onMetricsUnavailable.reserve is required with action FixedReserve").field_path(".reserve"))]
pub struct OnMetricsUnavailable {
    /// `Hold` keeps the current counts (for at most holdLimit); `FixedReserve` sets each
    /// reserve lane to `reserve` (within its min and max). Either acts only after
    /// failureThreshold failed intervals in a row; before that the counts are held.
    pub action: MetricsUnavailableAction,

    /// With FixedReserve, the reserve to use; with Hold, the reserve to fall back to once
    /// holdLimit has passed (each lane's reserve.min when not set).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 0, max = 1000))]
    pub reserve: Option<i32>,

    /// Failed intervals in a row before the action is taken; until then the counts are held,
    /// so one lost scrape changes nothing. Default 3; from 1 to 100.
    #[serde(default = "default_failure_threshold")]
    #[schemars(range(min = 1, max = 100))]
    pub failure_threshold: i32,

    /// With Hold, how long counts measured before the outage may be kept: after this the
    /// reserve falls back to `reserve` (or each lane's reserve.min), so a long outage cannot
    /// keep yesterday's reserve. Counted from the MetricsAvailable condition's transition, so a
    /// restart does not reset it. Default 30m; from 1m to 24h.
    #[serde(default = "default_hold_limit")]
    #[x_kube(validation = Rule::new("duration(self) >= duration('1m') && duration(self) <= duration('24h')").message("onMetricsUnavailable.holdLimit must be between 1m and 24h"))]
    pub hold_limit: KubeDuration,
}

/// The actions available while metrics are unavailable.
#[derive(JsonSchema, Serialize, Deserialize, Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum MetricsUnavailableAction {
    /// Keep the current replica counts.
    #[default]
    Hold,
    /// Use a fixed reserve per lane.
    FixedReserve,
}

/// What the operator measured and decided.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct LanePoolStatus {
    /// The spec generation this status describes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,

    /// Reserved workers across every reserve lane.
    #[serde(default)]
    pub reserved: i32,

    /// Shared workers.
    #[serde(default)]
    pub shared: i32,

    /// Every worker: reserved + shared. The `/scale` subresource's current count, so
    /// `kubectl scale`, an HPA or KEDA can size the whole pool through spec.totalWorkers.
    #[serde(default)]
    pub replicas: i32,

    /// The label selector of every worker of the pool, such as "lanepool.dev/pool=jobs": what
    /// an HPA on the `/scale` subresource reads Pod metrics from.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub selector: Option<String>,

    /// Every reserve lane's reserve as its Deployment runs it, such as "urgent 2, critical 1";
    /// while a change waits, what runs → what was decided, such as "urgent 4 → 1".
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reserves: Option<String>,

    /// While a shrink waits: each waiting Deployment, what it runs and shrinks to, what it waits
    /// for and until when at the latest, such as "Deployment jobs-shared runs 9, shrinks to 7
    /// once 2 draining workers are idle, by 2026-12-02T03:00:05Z". Absent when every Deployment
    /// runs what was decided.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rollout: Option<String>,

    /// "Paused" while spec.scaleDown.paused holds counts from shrinking; absent otherwise.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub scale_down: Option<String>,

    /// One entry per reserve lane.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub lanes: Vec<LaneStatus>,

    /// Ready, MetricsAvailable, ScalingLimited, Paused, GracePeriodTooShort.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub conditions: Vec<Condition>,

    /// The last sizing decision in words, such as
    /// "urgent 31.2/s × 20.4 ms, wait p99 ≤ job time → 2 → 2 reserved; 8 shared".
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_decision: Option<String>,
}

/// A reserve lane's measured load and reserve.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct LaneStatus {
    pub name: String,
    /// Jobs per second, as measured ("31.2/s"); absent while metrics are unavailable.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub arrival_rate: Option<String>,
    /// Jobs per second as a number.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub arrival_rate_per_second: Option<f64>,
    /// Jobs per second recently ("148/s"), which the reserve follows: over the last read of the
    /// workers' own counts, else over Prometheus's last scrape interval (5 s at least);
    /// absent for custom queries and before Prometheus has two samples.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub recent_arrival_rate: Option<String>,
    /// Mean job time as measured ("20.4ms").
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub job_time: Option<String>,
    /// Mean job time in seconds.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub job_seconds: Option<f64>,
    /// Arrival rate × job time: workers kept busy by this lane on average.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub busy_workers: Option<f64>,
    /// The reserve the measurements call for, before the stabilization window.
    pub recommended_reserve: i32,
    /// The reserve in effect: what was decided.
    pub reserve: i32,
    /// The reserved workers its Deployment runs now: above `reserve` while a shrink waits (see
    /// `rollout`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub running: Option<i32>,
}

/// Headers `spec.prometheus.headers` may not set (lower case), as its CEL rule says: they
/// would redirect the request (Host), carry a credential in the spec (Authorization, Cookie) or
/// change the message's framing (the hop-by-hop ones).
pub const REFUSED_HEADERS: [&str; 12] = [
    "host",
    "authorization",
    "proxy-authorization",
    "cookie",
    "connection",
    "keep-alive",
    "te",
    "trailer",
    "transfer-encoding",
    "upgrade",
    "content-length",
    "expect",
];

/// `spec.headroom` when not set.
pub const DEFAULT_HEADROOM: f64 = 1.0;

/// The most `spec.headroom` (and `--headroom`) may be; it must also be more than 0.
pub const MOST_HEADROOM: f64 = 10.0;

/// Checks a headroom against the CRD's bounds, in words that follow the field or flag's name.
pub fn check_headroom(headroom: f64) -> Result<(), String> {
    if headroom > 0.0 && headroom <= MOST_HEADROOM {
        Ok(())
    } else {
        Err(format!(
            "{headroom} must be more than 0 and at most {MOST_HEADROOM}"
        ))
    }
}
/// The most jobs one worker may run at once (`spec.slotsPerWorker`).
pub const MOST_SLOTS_PER_WORKER: i32 = 1024;

/// `spec.interval` when not set.
pub const DEFAULT_INTERVAL: &str = "5s";
/// `spec.scaleDown.stabilizationWindow` when not set.
pub const DEFAULT_STABILIZATION_WINDOW: &str = "0s";

fn default_headroom() -> f64 {
    DEFAULT_HEADROOM
}
fn default_interval() -> KubeDuration {
    KubeDuration::new(DEFAULT_INTERVAL)
}
fn default_slots_per_worker() -> i32 {
    1
}
fn default_reserve_min() -> i32 {
    1
}
fn default_shared_min() -> i32 {
    1
}
/// `spec.onMetricsUnavailable.failureThreshold` when not set.
pub const DEFAULT_FAILURE_THRESHOLD: i32 = 3;
/// `spec.onMetricsUnavailable.holdLimit` when not set.
pub const DEFAULT_HOLD_LIMIT: &str = "30m";

fn default_failure_threshold() -> i32 {
    DEFAULT_FAILURE_THRESHOLD
}
fn default_hold_limit() -> KubeDuration {
    KubeDuration::new(DEFAULT_HOLD_LIMIT)
}
fn default_stabilization_window() -> KubeDuration {
    KubeDuration::new(DEFAULT_STABILIZATION_WINDOW)
}

impl Default for ScaleDown {
    fn default() -> Self {
        Self {
            stabilization_window: default_stabilization_window(),
            paused: false,
        }
    }
}

impl Default for OnMetricsUnavailable {
    fn default() -> Self {
        Self {
            action: MetricsUnavailableAction::Hold,
            reserve: None,
            failure_threshold: DEFAULT_FAILURE_THRESHOLD,
            hold_limit: KubeDuration::new(DEFAULT_HOLD_LIMIT),
        }
    }
}

/// The most bytes (UTF-8) `spec.lanes[].queue` may have: AMQP's limit on a queue's name, so a
/// name that works on Redis also works on RabbitMQ. The CRD also bounds it in characters (the
/// same number), which the API server's cost estimate of the CEL rules needs.
pub const MOST_QUEUE_BYTES: u32 = 255;

/// What `spec.lanes[].queue` may not contain: the separators of LANEPOOL_QUEUES (`,` and `=`),
/// spaces and control characters (command lines such as `celery -Q` and environment variables
/// cannot carry them intact).
pub const QUEUE_PATTERN: &str = r"^[^,=\x00-\x20\x7f]+$";

impl Lane {
    /// The queue the lane's workers take from: `queue`, else the lane's name.
    pub fn queue(&self) -> &str {
        self.queue.as_deref().unwrap_or(&self.name)
    }
}

impl LanePoolSpec {
    /// The lanes that have a reserve, in priority order.
    pub fn reserve_lanes(&self) -> impl Iterator<Item = (&Lane, &Reserve)> {
        self.lanes
            .iter()
            .filter_map(|lane| lane.reserve.as_ref().map(|reserve| (lane, reserve)))
    }
}
