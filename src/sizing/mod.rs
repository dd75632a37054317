//! The sizing decision: from a pool's settings, each reserve lane's measured load, the current
//! replica counts and the recent recommendations, how many reserved and shared workers to run.
//! Pure (no clock, no I/O): the controller, `lanepool plan` and the simulator all call it. It must
//! never read a missing or malformed measurement as zero.

mod answer;
mod decide;
mod explain;
mod queueing;
mod reads;
mod settings;

pub use answer::{QueryAnswer, lane_load, single_value};
pub use decide::{
    CONFIRMING_SHARE, Decision, History, Inputs, LaneDecision, LaneLoad, Loads, MOST_TOLERANCE,
    NOISE_SIGMAS, Outage, RecentRate, Recommendation, Replicas, SHORTEST_RECENT_WINDOW, TOLERANCE,
    decide, recent_window,
};
pub use queueing::{
    HANDOFF_SECONDS, SharedHelp, formula, latency_target, predicted_p99, predicted_wait_p99,
    predicted_wait_p99_helped, smallest_reserve, smallest_reserve_helped, wait_within_job_time,
};
pub use reads::{
    Baselines, Counters, LaneReads, ReadCounts, WorkerCount, baselines, finished_since,
    median_depth, went_unread,
};
pub use settings::{LaneSizing, PoolSize, PoolSizing, Rule, UnavailablePolicy};

#[cfg(test)]
mod tests;
