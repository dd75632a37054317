//! Everything that talks to worker Pods, and nothing else does: one snapshot of the pool's own
//! workers per reconcile, from the watch caches of the pools' Pods and ReplicaSets (`owners.rs`
//! says whose a Pod is, `worker.rs` what is kept of it), their
//! `/metrics` answers, each asked at most once per reconcile and read in `text.rs`, drain and
//! stand-in requests and deletion costs, all through one client that follows no redirect and
//! reads capped answers (`http.rs`), within one time budget. The stages that use them: `observe/` (the
//! reads) and `act/` (the stand-ins, the drains, the ranking and the readiness gates). What a Pod answers is never trusted beyond
//! those caps, and a refused answer is an answer not given.

mod http;
mod owners;
mod pool_pods;
mod text;
mod worker;

pub(super) use pool_pods::{PodPart, PoolPods, budget};
pub(super) use text::{finished_counts, gauge_values, parse_gauges, read_answer};
pub(super) use worker::Worker;
