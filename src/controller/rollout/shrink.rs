//! What a shrink is, for the drains and the stand-ins: the Deployment, its counts and the lanes
//! its workers serve.

use std::collections::BTreeMap;

use crate::api::LanePool;
use crate::controller::deployments::Role;

/// A Deployment about to shrink: its name, the count it has and the one it shrinks to, and the
/// lanes its workers serve.
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct Shrink {
    pub(crate) deployment: String,
    pub(crate) live: i32,
    pub(crate) to: i32,
    pub(crate) lanes: Vec<String>,
}

/// A shrink waiting for the surge: the `shrink.live - shrink.to` workers it will stop serve the
/// lanes of the Deployments taking over (`serves`, in priority order) until those are ready.
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct StandIn {
    pub(crate) shrink: Shrink,
    pub(crate) serves: Vec<String>,
}

/// Takes the entries of the Deployments that `still` does not name out of `by_deployment`.
pub(crate) fn take_out_others<V>(
    by_deployment: &mut BTreeMap<String, V>,
    still: impl Fn(&str) -> bool,
) -> Vec<(String, V)> {
    let others: Vec<String> = by_deployment
        .keys()
        .filter(|d| !still(d))
        .cloned()
        .collect();
    others
        .into_iter()
        .filter_map(|d| by_deployment.remove_entry(&d))
        .collect()
}

/// The lanes a role's workers take jobs from, in priority order.
pub(crate) fn lanes_of(pool: &LanePool, role: &Role) -> Vec<String> {
    match role {
        Role::Reserved { lane } => vec![lane.clone()],
        Role::Shared => pool.spec.lanes.iter().map(|l| l.name.clone()).collect(),
    }
}
