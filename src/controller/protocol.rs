//! The names of the worker protocol (docs/worker-protocol.md) as the operator uses them: the port
//! it asks a worker at, the gauges and the counter it reads there, and the annotation it sets on
//! a Pod. Names only: nothing here reads or writes anything.

/// The container port a worker serves its gauges on, as Prometheus scrapes them.
pub const METRICS_PORT: &str = "metrics";
/// The gauge a worker sets to 1 while it runs a job and to 0 while it waits for one.
pub const BUSY_METRIC: &str = "lanepool_worker_busy";
/// The gauge a worker sets, while it runs a job, to when that job started (Unix seconds).
pub const STARTED_METRIC: &str = "lanepool_worker_job_started_timestamp_seconds";
/// The gauge a worker sets to 1 while a drain request keeps it from taking new jobs.
pub const DRAINING_METRIC: &str = "lanepool_worker_draining";
/// The gauge a worker sets to 1 while a stand-in request has it take other lanes than its own.
pub const STANDING_IN_METRIC: &str = "lanepool_worker_standing_in";
/// The gauge a worker sets to 1 when it takes drain and stand-in requests only with the pool's
/// credential: without it, a worker's image predates the credential and anyone may steer it.
pub const CREDENTIAL_METRIC: &str = "lanepool_worker_credential_required";
/// The most seconds a drain or stand-in request may name (the protocol's bound: a worker answers
/// `400` above it). A longer wait is asked for in pieces: a drain is renewed every few seconds
/// until its shrink goes, so it never lapses before.
pub const MOST_REQUEST_SECONDS: u64 = 3600;

/// The `seconds` of a drain or stand-in request that should last `wanted`: whole seconds, rounded
/// up, at most [`MOST_REQUEST_SECONDS`] (more would be answered 400, read as a refusal).
pub fn request_seconds(wanted: std::time::Duration) -> u64 {
    (wanted.as_secs_f64().ceil() as u64).min(MOST_REQUEST_SECONDS)
}
/// The finished-job counter the reads sum: a histogram's `_count`, by `lane`.
pub const FINISHED_METRIC: &str = "lanepool_job_duration_seconds_count";
/// The seconds the finished jobs ran: the same histogram's `_sum`, by `lane`.
pub const JOB_SECONDS_METRIC: &str = "lanepool_job_duration_seconds_sum";
/// The gauge of a lane's queue depth as the worker reads it, by `lane` (optional).
pub const DEPTH_METRIC: &str = "lanepool_queue_depth";
/// The readiness gate of the workers of a pool whose template serves a `metrics` port: the
/// operator sets this Pod condition to True once the Pod may count as available, at once for a
/// Pod that grows its Deployment, and during a template change only once a worker of the old
/// template has drained and is idle (the Deployment controller then stops that one).
pub const TAKEOVER_CONDITION: &str = "lanepool.dev/takeover";
/// The annotation the ReplicaSet controller reads: of two Pods otherwise alike (both running
/// and ready), the one with the lower cost is deleted first.
pub const DELETION_COST: &str = "controller.kubernetes.io/pod-deletion-cost";
