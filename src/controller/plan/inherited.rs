//! What an earlier leader left in the workers: drains and stand-ins it asked for and never
//! ended (it lost its lease, froze, restarted). The workers keep that state on the cluster and
//! say it at their `metrics` port (`lanepool_worker_draining 1`, `lanepool_worker_standing_in
//! 1`), so the first reconcile of a pool in this process reads it: a drain or stand-in this
//! process wants takes those workers first (they stopped taking jobs, or serve the lanes
//! already), and the rest are ended at once, a drained one's deletion cost -1 lowered first, so
//! no earlier leader's pick lingers until its lapse or decides which Pod a later shrink stops.

use std::collections::{BTreeMap, BTreeSet};

/// The workers that say they drain or stand in, by Deployment, as this process found them.
#[derive(Clone, Debug, Default, PartialEq)]
pub(crate) struct Inherited {
    pub(in crate::controller) draining: BTreeMap<String, BTreeSet<String>>,
    pub(in crate::controller) standing_in: BTreeMap<String, BTreeSet<String>>,
}

impl Inherited {
    /// How many workers drain or stand in.
    pub(in crate::controller) fn len(&self) -> usize {
        self.draining
            .values()
            .chain(self.standing_in.values())
            .map(BTreeSet::len)
            .sum()
    }
}
