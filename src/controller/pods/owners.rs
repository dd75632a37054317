//! Which Pods are a pool's workers. A label is not ownership (anyone who may create a Pod may
//! label it): a Pod is a worker of the pool only when its controller is a ReplicaSet whose
//! controller is one of the pool's own Deployments, compared by uid. Pure: built from listed
//! metadata, tested with plain objects.

use std::collections::BTreeMap;

use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

use crate::controller::cached_pod::{CachedPod, controller_uid};

/// The pool's own Deployments: uid → name.
pub(in crate::controller) type PoolDeployments = BTreeMap<String, String>;

/// The pool's own Deployments, by uid, among `existing`: those the pool controls.
pub(in crate::controller) fn pool_deployments<'a>(
    pool_uid: &str,
    existing: impl IntoIterator<Item = &'a Deployment>,
) -> PoolDeployments {
    existing
        .into_iter()
        .filter(|d| {
            d.metadata
                .owner_references
                .iter()
                .flatten()
                .any(|o| o.uid == pool_uid && o.controller == Some(true))
        })
        .filter_map(|d| Some((d.metadata.uid.clone()?, d.metadata.name.clone()?)))
        .collect()
}

/// The pool's Deployments and the ReplicaSets they control.
#[derive(Clone, Debug, Default, PartialEq)]
pub(in crate::controller) struct Owners {
    /// Each ReplicaSet controlled by one of the pool's Deployments: its uid → that
    /// Deployment's name and the ReplicaSet's revision.
    replicasets: BTreeMap<String, (String, u64)>,
    /// Each Deployment's newest revision among its ReplicaSets.
    newest: BTreeMap<String, u64>,
}

/// The annotation the Deployment controller numbers a Deployment's ReplicaSets with: the one of
/// the current template has the highest.
const REVISION: &str = "deployment.kubernetes.io/revision";

impl Owners {
    /// From the pool's own Deployments by uid (already checked to be the pool's: their
    /// controller is the pool) and the ReplicaSets listed by the pool's label, whoever made them.
    pub(in crate::controller) fn new<'a>(
        deployments: &PoolDeployments,
        replicasets: impl IntoIterator<Item = &'a ObjectMeta>,
    ) -> Self {
        let replicasets: BTreeMap<String, (String, u64)> = replicasets
            .into_iter()
            .filter_map(|rs| {
                let deployment = deployments.get(controller_uid(rs, "Deployment")?)?;
                let revision = rs
                    .annotations
                    .as_ref()
                    .and_then(|a| a.get(REVISION)?.parse().ok())
                    .unwrap_or(0);
                Some((rs.uid.clone()?, (deployment.clone(), revision)))
            })
            .collect();
        let mut newest: BTreeMap<String, u64> = BTreeMap::new();
        for (deployment, revision) in replicasets.values() {
            let top = newest.entry(deployment.clone()).or_default();
            *top = (*top).max(*revision);
        }
        Self {
            replicasets,
            newest,
        }
    }

    /// Whether `pod`'s ReplicaSet is the newest of its Deployment's (the current template's).
    pub(in crate::controller) fn newest(&self, pod: &CachedPod) -> bool {
        let Some((deployment, revision)) = pod
            .replicaset
            .as_deref()
            .and_then(|rs| self.replicasets.get(rs))
        else {
            return true;
        };
        self.newest.get(deployment) == Some(revision)
    }

    /// The name of the pool's Deployment whose worker `pod` is; `None`: not a worker of the
    /// pool, whatever its labels say.
    pub(in crate::controller) fn deployment_of(&self, pod: &CachedPod) -> Option<&str> {
        let replicaset = pod.replicaset.as_deref()?;
        self.replicasets.get(replicaset).map(|(d, _)| d.as_str())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;

    fn owned(name: &str, uid: &str, owner: Option<(&str, &str, bool)>) -> ObjectMeta {
        ObjectMeta {
            name: Some(name.into()),
            uid: Some(uid.into()),
            owner_references: owner.map(|(kind, uid, controller)| {
                vec![OwnerReference {
                    api_version: "apps/v1".into(),
                    kind: kind.into(),
                    name: "whatever".into(),
                    uid: uid.into(),
                    controller: Some(controller),
                    block_owner_deletion: None,
                }]
            }),
            ..ObjectMeta::default()
        }
    }

    /// The Pod with `meta`, as the watch cache keeps it.
    fn pod(meta: ObjectMeta) -> CachedPod {
        CachedPod::of(k8s_openapi::api::core::v1::Pod {
            metadata: meta,
            ..Default::default()
        })
    }

    #[test]
    fn a_worker_is_a_pod_of_a_replicaset_of_one_of_the_pools_deployments_by_uid() {
        let mut ours = owned("jobs-shared", "d-1", None);
        ours.owner_references = Some(vec![OwnerReference {
            api_version: "lanepool.dev/v1alpha1".into(),
            kind: "LanePool".into(),
            name: "jobs".into(),
            uid: "pool-1".into(),
            controller: Some(true),
            block_owner_deletion: None,
        }]);
        let deployments = [
            Deployment {
                metadata: ours,
                ..Deployment::default()
            },
            // Labelled as the pool's, not controlled by it.
            Deployment {
                metadata: owned("jobs-batch-reserved", "d-other", None),
                ..Deployment::default()
            },
        ];
        let deployments = pool_deployments("pool-1", &deployments);
        assert_eq!(deployments.len(), 1);
        let replicasets = [
            owned("jobs-shared-abc", "rs-1", Some(("Deployment", "d-1", true))),
            // Made by hand, labelled as the pool's, controlled by something else.
            owned("fake", "rs-2", Some(("Deployment", "d-other", true))),
            // Owned, not controlled.
            owned("adopted", "rs-3", Some(("Deployment", "d-1", false))),
        ];
        let owners = Owners::new(&deployments, replicasets.iter());
        let of = |meta| owners.deployment_of(&pod(meta));
        assert_eq!(
            of(owned("w", "p-1", Some(("ReplicaSet", "rs-1", true)))),
            Some("jobs-shared")
        );
        assert_eq!(of(owned("hand-made", "p-2", None)), None);
        assert_eq!(
            of(owned("w", "p-3", Some(("ReplicaSet", "rs-2", true)))),
            None
        );
        assert_eq!(
            of(owned("w", "p-4", Some(("ReplicaSet", "rs-3", true)))),
            None
        );
        assert_eq!(
            of(owned("w", "p-5", Some(("ReplicaSet", "rs-1", false)))),
            None
        );
        // A Pod naming the Deployment itself as its controller is no ReplicaSet's.
        assert_eq!(
            of(owned("w", "p-6", Some(("Deployment", "d-1", true)))),
            None
        );
        // Nor one that names the right uid as another kind.
        assert_eq!(
            of(owned("w", "p-7", Some(("StatefulSet", "rs-1", true)))),
            None
        );
    }
}
