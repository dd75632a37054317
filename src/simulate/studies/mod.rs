//! Studies built on the engine: the guide's table, the trade-off between urgent p99 and batch
//! throughput against static splits and a hindsight oracle, the bursty-traffic suite and its
//! held-out shapes, and the benchmark.

pub mod bench;
pub mod guide;
pub mod held_out;
pub mod suite;
pub mod tradeoff;
