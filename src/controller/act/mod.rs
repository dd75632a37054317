//! Everything a reconcile changes, as its plan says: the workers' credential Secret
//! (`credential.rs`), the Deployments (`apply.rs`), the workers' stand-ins and drains and the
//! Pods' deletion costs and readiness gates (`steer.rs`, through `requests.rs`), and the status
//! and events (`report.rs`).

pub(super) mod apply;
pub(super) mod credential;
pub(super) mod report;
pub(super) mod requests;
pub(super) mod steer;
