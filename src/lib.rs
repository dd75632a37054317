//! lanepool: an operator that splits one worker pool into workers reserved for urgent lanes and
//! shared workers that take urgent work first and batch work otherwise, sizing the reserve from
//! the lanes' measured arrival rate and job time.
//!
//! Where things are:
//! - [`api`] (the LanePool types and their CEL rules) and [`crd`] (the generated CRD);
//! - [`sizing`]: the sizing rule, pure: settings from a spec, answers read as loads, queueing
//!   arithmetic, and `decide`, which the controller, `plan` and the simulator all run;
//! - [`prometheus`]: Prometheus access (connection, client cache, query) and the metric
//!   convention's queries; it knows nothing of the controller;
//! - [`controller`]: the reconcile pipeline, read → step → measure → decide → apply → report;
//! - [`run`], [`leader`], [`server`], [`metrics`]: `lanepool run` around the controller;
//! - [`plan`], [`simulate`] and [`replay`]: the `plan`, `simulate` and `replay` commands;
//! - [`migrate`]: `lanepool migrate`, a worker Deployment as a LanePool.

pub mod api;
pub mod controller;
pub mod crd;
pub mod duration;
pub mod error;
pub mod leader;
pub mod metrics;
pub mod migrate;
pub mod plan;
pub mod prometheus;
pub mod replay;
pub mod run;
pub mod server;
pub mod simulate;
pub mod sizing;

pub use error::{Error, Result};
