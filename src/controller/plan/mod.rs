//! The plan of one reconcile's rollout, without I/O: from what observe saw ([`Seen`]: the pool's
//! Deployments and workers, what the workers in motion are doing, what an earlier leader left in
//! them) and what the pool carries between reconciles ([`Steering`]), the [`Effects`] that act
//! performs: the growth, the requests to workers, the Pods' deletion costs and readiness gates,
//! the counts, the events. A step that needs an answer first (a drain's "idle") takes the next
//! reconcile: act hands the answers back through [`record`], as a level-triggered controller
//! would. The operator's reconcile and the simulator (`simulate/engine/rollout.rs`) both run it;
//! neither has a step order of its own.
//!
//! The steps, in order: take over what an earlier leader left (`inherited.rs`); the
//! stand-ins of the shrinks waiting for the surge (`stand_ins.rs`); the drains of those the
//! surge lets go (`drains.rs`), the drains whose shrink was written kept until the ReplicaSet
//! has acted; the readiness gates of rollovers (`gates.rs`); what goes out now and what waits
//! ([`rollout::Rollout::settle`]); the idle-first ranking of what shrinks now (`rank.rs`).

mod drains;
mod effects;
mod gates;
pub(super) mod inherited;
mod rank;
mod seen;
mod stand_ins;
mod step;
#[cfg(test)]
mod tests;

pub(crate) use effects::{Answer, Ask, Effects, Note, Records, Request, StandInAnswer};
pub(crate) use seen::{Seen, Settings, Steering, in_motion};
pub(crate) use step::{plan, record};
