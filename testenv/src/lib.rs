//! A real local control plane for tests and the demo: etcd, kube-apiserver, optionally
//! kube-controller-manager, and Prometheus as processes on 127.0.0.1 (empty, or holding a
//! recorded history backfilled with promtool), the way envtest does it for Go operators. It
//! must never leave a process running after the process that started it is gone.

mod certs;
mod control_plane;
mod examples;
mod history;
mod keda;
mod kwok;
mod operator;
mod pod_workers;
mod process;
mod prometheus;
mod readiness;
mod redis;
mod registry;
mod worker_metrics;

use std::net::TcpListener;
use std::path::PathBuf;

pub use control_plane::{
    ControlPlane, Controllers, HPA_DOWNSCALE_STABILIZATION, HPA_SYNC_PERIOD, shared, shared_with,
    unique_name,
};
pub use examples::{LaneQueue, example};
pub use history::{
    DAY_CREATED, DAY_OUTAGE, DAY_PEAK, DAY_SPIKES, RecordedLane, Recording, day_urgent_rate,
    synthetic_day,
};
pub use kwok::{Kwok, POD_CIDR};
pub use operator::InProcessOperator;
pub use pod_workers::{PodRequests, PodWorkers};
pub use process::{Lifetime, process_alive, terminate_pid};
pub use prometheus::{BASIC_AUTH_PASSWORD, BASIC_AUTH_USERNAME, Guard, TestPrometheus, http_get};
pub use readiness::DeploymentReadiness;
pub use redis::{Reply, TestRedis};
pub use registry::TestRegistry;
pub use worker_metrics::{SimulatedWorkers, serve_metrics};

/// Why the control plane could not start.
#[derive(thiserror::Error)]
pub enum TestEnvError {
    #[error("{tool} is not built at {path}: run ./tests/setup.sh")]
    ToolMissing { tool: String, path: PathBuf },
    #[error("{what}: {source}")]
    Io {
        what: String,
        #[source]
        source: std::io::Error,
    },
    #[error("generating certificates: {0}")]
    Certificates(#[from] rcgen::Error),
    #[error("{what} did not become ready within {seconds} s; the end of its log:\n{log}")]
    NotReady {
        what: String,
        seconds: u64,
        log: String,
    },
    #[error("kube client: {0}")]
    Kube(#[from] kube::Error),
    #[error("kubeconfig: {0}")]
    Kubeconfig(#[from] kube::config::KubeconfigError),
}

/// `expect` shows Debug: make it the sentence that says what to do ("run ./tests/setup.sh").
impl std::fmt::Debug for TestEnvError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        std::fmt::Display::fmt(self, f)
    }
}

pub type Result<T, E = TestEnvError> = std::result::Result<T, E>;

fn io(what: impl Into<String>) -> impl FnOnce(std::io::Error) -> TestEnvError {
    let what = what.into();
    move |source| TestEnvError::Io { what, source }
}

/// Where tests/tools/build.sh puts the pinned binaries.
pub fn tools_dir() -> PathBuf {
    std::env::var_os("LANEPOOL_TOOLS_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../target/tools"))
}

/// The virtualenv of the Python workers (`tests/python.sh` makes it): `LANEPOOL_PYTHON_VENV` or
/// `target/python`.
pub fn python_venv() -> PathBuf {
    std::env::var_os("LANEPOOL_PYTHON_VENV")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../target/python"))
}

/// A program of the Python workers' virtualenv (`python`, `lanepool-rq-worker`, `celery`…), or
/// a clear error when it has not been made.
pub fn python_program(name: &str) -> Result<PathBuf> {
    let path = python_venv().join("bin").join(name);
    if path.is_file() {
        Ok(path)
    } else {
        Err(TestEnvError::ToolMissing {
            tool: format!("{name} (the Python workers' virtualenv)"),
            path,
        })
    }
}

/// A pinned tool, or a clear error when it has not been built.
pub fn tool(name: &str) -> Result<PathBuf> {
    let path = tools_dir().join(name);
    if path.is_file() {
        Ok(path)
    } else {
        Err(TestEnvError::ToolMissing {
            tool: name.into(),
            path,
        })
    }
}

/// A port on 127.0.0.1 that was free a moment ago.
pub fn free_port() -> Result<u16> {
    let listener = TcpListener::bind("127.0.0.1:0").map_err(io("finding a free port"))?;
    Ok(listener
        .local_addr()
        .map_err(io("finding a free port"))?
        .port())
}

/// Polls `check` every 250 ms until it is true: how long that took, or `None` after `timeout`.
pub async fn poll_until<F, Fut>(
    timeout: std::time::Duration,
    mut check: F,
) -> Option<std::time::Duration>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = bool>,
{
    let started = std::time::Instant::now();
    while !check().await {
        if started.elapsed() >= timeout {
            return None;
        }
        tokio::time::sleep(std::time::Duration::from_millis(250)).await;
    }
    Some(started.elapsed())
}

/// The tests' pool, `tests/fixtures/formula-pool.yaml`, as JSON for a test to change: the
/// guide's pool sized by the formula, whose arithmetic the integration tests assert.
pub fn formula_pool() -> serde_json::Value {
    let yaml = include_str!("../../tests/fixtures/formula-pool.yaml");
    serde_yaml::from_str(yaml).expect("tests/fixtures/formula-pool.yaml is YAML")
}
