//! The rollout, without I/O: from the decision, the live Deployments, this process's last
//! counts and the surge's wait, what to write now and in which order. Growth goes out first and
//! alone whenever a Deployment is to shrink (draining and ranking never delay new workers); a
//! shrink waits for the growing Deployments to be ready (the surge, `surge.rs`), and only then
//! are the workers it stops asked to drain (`drain.rs`); until then shared workers stand in for
//! new reserved ones (`stand_in.rs`). Each shrinking Deployment's Pods are ranked (`cost.rs`)
//! just before it shrinks. `grace.rs` checks that a stopped worker can finish its job.

pub(crate) mod cost;
pub(crate) mod drain;
pub(super) mod grace;
#[cfg(test)]
mod properties;
mod shrink;
pub(crate) mod stand_in;
mod step;
pub(crate) mod surge;
pub(super) mod takeover;

pub(crate) use shrink::{Shrink, StandIn, lanes_of};
#[cfg(test)]
pub(crate) use step::Rollout;
pub(crate) use step::{Held, Release, Rules, SurgeWait, WaitsFor, rollout};
