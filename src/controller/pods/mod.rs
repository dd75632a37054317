//! One reconcile's snapshot of a pool's own workers, and nothing that talks to them: the workers
//! from the watch caches of the pools' Pods and ReplicaSets (`owners.rs` says whose a Pod is,
//! `worker.rs` what is kept of it), the `/metrics` answers this reconcile has had (each worker is
//! asked at most once per reconcile), the places of its own requests and its one time budget
//! (`pool_pods.rs`), and the reading of what a worker answers (`text.rs`). No I/O: the stages that
//! ask the workers through the context's client (`worker_http.rs`) are `observe/` (the reads,
//! `observe/answers.rs`) and `act/` (the stand-ins, the drains, the deletion costs and the
//! readiness gates, `act/requests.rs`). What a Pod answers is never trusted beyond the client's
//! caps, and a refused answer is an answer not given.

mod owners;
mod pool_pods;
mod text;

pub(super) use super::worker::Worker;
pub(super) use pool_pods::{MetricsText, POD_BUDGET, PoolPods, REQUESTS_IN_FLIGHT, budget};
pub(super) use text::{gauge_values, parse_gauges, read_answer, worker_counts};
