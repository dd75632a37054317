//! A real local control plane for tests and the demo: etcd, kube-apiserver, optionally
//! kube-controller-manager, and Prometheus as processes on 127.0.0.1 (empty, or holding a
//! recorded history backfilled with promtool), the way envtest does it for Go operators. It
//! must never leave a process running after the process that started it is gone.

mod certs;
mod control_plane;
mod error;
mod examples;
mod history;
mod images;
mod keda;
mod kubectl;
mod kwok;
mod ledger;
mod node;
mod operator;
mod pod_workers;
mod process;
mod prometheus;
mod readiness;
mod redis;
mod registry;
mod tools;
mod wait;
mod worker_metrics;

pub use control_plane::{
    ControlPlane, Controllers, HPA_DOWNSCALE_STABILIZATION, HPA_SYNC_PERIOD, Keda, shared,
    shared_with, unique_name,
};
pub use error::{Result, TestEnvError};
pub use examples::{LaneQueue, example, formula_pool};
pub use history::{
    DAY_CREATED, DAY_OUTAGE, DAY_PEAK, DAY_SPIKES, RecordedLane, Recording, day_urgent_rate,
    synthetic_day,
};
pub use images::{
    build_and_push_images, build_and_push_python_worker_image, helm, push_chart,
    without_cargos_test_variables,
};
pub use kwok::{Kwok, POD_CIDR};
pub use ledger::{FINISHED, Ledger, STARTED, SUBMITTED, now_unix, p99};
pub use node::{NODE_POD_CIDR, TestNode, shared_node};
pub use operator::InProcessOperator;
pub use pod_workers::{PodRequests, PodWorkers};
pub use process::{Lifetime, process_alive, terminate_pid};
pub use prometheus::{
    BASIC_AUTH_PASSWORD, BASIC_AUTH_USERNAME, Guard, TestPrometheus, http_get, http_post,
};
pub use readiness::DeploymentReadiness;
pub use redis::{Reply, TestRedis};
pub use registry::TestRegistry;
pub use tools::{python_program, python_venv, tool, tools_dir};
pub use wait::{free_port, poll_until, until};
pub use worker_metrics::{SimulatedWorkers, serve_metrics};
