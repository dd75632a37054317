//! Everything a reconcile reads beyond the watch caches: the pool's Deployments the cache lacks
//! (`deployments.rs`), the lanes' load from Prometheus
//! and the workers' own counts when the pool is due (`measure.rs`, `reads.rs`), and what the
//! workers are doing when a step chooses whom to drain, stand in or stop (`work.rs`), the autoscalers that would fight it (`autoscalers.rs`), and the workers' credential once per
//! process (`credential.rs`). Each worker
//! is asked at most once per reconcile (`answers.rs`, its `GET /metrics`), and Prometheus at most
//! once per query.

pub(super) mod answers;
pub(super) mod autoscalers;
pub(super) mod credential;
pub(super) mod deployments;
pub(super) mod measure;
pub(super) mod reads;
pub(super) mod work;
