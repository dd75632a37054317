//! `lanepool simulate`: a deterministic discrete-event simulation of a worker pool with an urgent
//! lane and a batch backlog, so a split's urgent latency and batch throughput can be known
//! before deploying, and the operator's own sizing can be run in a closed loop.

pub mod arrivals;
pub mod autoscale;
pub mod bench;
pub mod cli;
pub mod command;
pub mod engine;
pub mod error;
pub mod guide;
pub mod observe;
pub mod outcome;
pub mod plot;
pub mod pool;
pub mod profile;
pub mod report;
pub mod rng;
pub mod scenario;
pub mod series;
pub mod suite;
pub mod tradeoff;

pub use engine::run;
pub use error::SimulateError;
pub use outcome::{Outcome, Summary};
pub use scenario::{Arrangement, Autoscale, Scenario};

#[cfg(test)]
mod tests;
