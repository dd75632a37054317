//! Everything a reconcile changes: the Deployments (`apply.rs`), the workers' stand-ins, drains,
//! deletion costs and readiness gates (`stand_in.rs`, `drain.rs`, `rank.rs`, `takeover.rs`), and
//! the status and events (`report.rs`).

pub(in crate::controller) mod apply;
pub(in crate::controller) mod drain;
pub(in crate::controller) mod rank;
pub(in crate::controller) mod report;
pub(in crate::controller) mod stand_in;
pub(in crate::controller) mod takeover;
