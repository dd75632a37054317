//! lanepool: an operator that splits one worker pool into workers reserved for urgent lanes and
//! shared workers that take urgent work first and batch work otherwise, sizing the reserve from
//! the lanes' measured arrival rate and job time.

pub mod api;
pub mod duration;
pub mod error;
pub mod sizing;

pub use error::{Error, Result};
pub mod controller;
pub mod crd;
pub mod leader;
pub mod metrics;
pub mod plan;
pub mod prometheus;
pub mod run;
pub mod server;
pub mod simulate;
