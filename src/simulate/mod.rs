//! `lanepool simulate`: a deterministic discrete-event simulation of a worker pool with an urgent
//! lane and a batch backlog, so a split's urgent latency and batch throughput can be known
//! before deploying, and the operator's own sizing can be run in a closed loop.
//!
//! - [`engine`]: the model (scenario, arrivals, pool, the operator's loop, outcome);
//! - [`studies`]: what is measured with it (guide table, trade-off, suite, benchmark);
//! - [`command`]: the `simulate` command line and how results are shown.

pub mod command;
pub(crate) mod engine;
mod error;
pub(crate) mod studies;

pub use engine::arrivals::{ArrivalKind, Arrivals};
pub use engine::outcome::{Outcome, Summary};
pub use engine::profile::RateProfile;
pub use engine::rng::Pcg32;
pub use engine::run;
pub use engine::scenario::{Arrangement, Autoscale, QUEUE_HANDOFF, Scenario, nanos};
pub use error::SimulateError;

#[cfg(test)]
mod tests;
