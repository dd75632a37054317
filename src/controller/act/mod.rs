//! Everything a reconcile changes: the workers' credential Secret (`credential.rs`), the
//! Deployments (`apply.rs`), the workers' stand-ins, drains,
//! deletion costs and readiness gates (`stand_in.rs`, `drain.rs`, `rank.rs`, `takeover.rs`, each
//! sending its requests and Pod patches through `requests.rs`), and the status and events
//! (`report.rs`).

pub(super) mod apply;
pub(super) mod credential;
pub(super) mod drain;
pub(super) mod rank;
pub(super) mod report;
pub(super) mod requests;
pub(super) mod stand_in;
pub(super) mod takeover;
