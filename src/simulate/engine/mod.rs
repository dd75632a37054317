//! The simulation engine, one thing: a scenario (the pool, its jobs, the urgent rate profile and
//! arrivals) runs through a discrete-event loop over a pool of workers, with the operator's own
//! sizing in the loop when autoscaled (reading what a Prometheus would answer), and produces an
//! outcome (every urgent latency, batch completions, per-window series). Deterministic from a seed.

pub mod arrivals;
pub mod autoscale;
mod events;
pub mod keda;
pub mod observe;
pub mod outcome;
pub mod pool;
pub mod profile;
pub mod rng;
mod rollout;
pub mod scenario;

pub use events::run;
