//! The watch caches a reconcile reads instead of the API server: the pools' Deployments,
//! autoscalers, Pods and ReplicaSets, for each watched scope. Reads only; the watches that fill
//! them are the controller's (`mod.rs`).

use std::sync::{Arc, OnceLock};
use std::time::Duration;

use futures::FutureExt;
use k8s_openapi::api::apps::v1::{Deployment, ReplicaSet};
use k8s_openapi::api::autoscaling::v2::HorizontalPodAutoscaler;
use kube::ResourceExt;
use kube::core::PartialObjectMeta;
use kube::runtime::reflector::{ObjectRef, Store};

use super::cached_pod::CachedPod;
use super::deployments::CachedDeployment;
use super::pool_index::PoolIndex;
use crate::api::POOL_LABEL;

/// The watch caches of one watched scope (a namespace, or every namespace).
pub(super) struct Caches {
    pub(super) deployments: Store<CachedDeployment>,
    pub(super) autoscalers: Store<HorizontalPodAutoscaler>,
    /// Pods labelled with a pool, as much of each as a reconcile reads.
    pub(super) pods: Arc<PoolIndex<CachedPod>>,
    /// The metadata of ReplicaSets labelled with a pool.
    pub(super) replicasets: Arc<PoolIndex<PartialObjectMeta<ReplicaSet>>>,
}

/// The objects of `namespace` that `keep` accepts, from every scope's cache.
fn in_namespace<'a, K>(
    stores: impl Iterator<Item = &'a Store<K>>,
    namespace: &str,
    keep: impl Fn(&K) -> bool,
) -> Vec<Arc<K>>
where
    K: kube::Resource<DynamicType = ()> + Clone + 'static,
{
    stores
        .flat_map(|store| store.state())
        .filter(|o| o.meta().namespace.as_deref() == Some(namespace) && keep(o))
        .collect()
}

/// Every watched scope's caches, set once the watches start.
#[derive(Default)]
pub(super) struct WatchCaches {
    scopes: OnceLock<Vec<Caches>>,
}

impl WatchCaches {
    pub(super) fn set(&self, caches: Vec<Caches>) {
        let _ = self.scopes.set(caches);
    }

    /// Whether every watch cache has its first list. Asked without waiting: a reconcile that
    /// finds them not ready comes back shortly (see [`CACHES_NOT_READY`]) instead of waiting.
    /// Waiting would hang it: a store's readiness wakes only the last of its waiters (one
    /// oneshot receiver shared by all), and the Deployment watch advances only while the
    /// controller has a free slot, which reconciles waiting on it would take.
    pub(super) fn ready(&self) -> bool {
        self.scopes.get().is_some_and(|caches| {
            caches.iter().all(|cache| {
                ready_now(&cache.deployments)
                    && ready_now(&cache.autoscalers)
                    && cache.pods.is_ready()
                    && cache.replicasets.is_ready()
            })
        })
    }

    fn scopes(&self) -> &[Caches] {
        self.scopes.get().map(Vec::as_slice).unwrap_or_default()
    }

    /// A pool's Deployments, from the watch cache: each of `names` looked up by its key, and
    /// when `sweep` every Deployment labelled as the pool's (a scan of the whole cache, for what
    /// a removed lane left behind: after a spec change or a restart, not on every reconcile).
    pub(super) fn pool_deployments(
        &self,
        namespace: &str,
        pool: &str,
        names: &[String],
        sweep: bool,
    ) -> Vec<Deployment> {
        let caches = self.scopes();
        let stores = || caches.iter().map(|c| &c.deployments);
        let labelled =
            |d: &CachedDeployment| d.labels().get(POOL_LABEL).map(String::as_str) == Some(pool);
        let found = if sweep {
            in_namespace(stores(), namespace, labelled)
        } else {
            names
                .iter()
                .flat_map(|name| {
                    let key = ObjectRef::new(name).within(namespace);
                    stores().filter_map(move |store| store.get(&key))
                })
                .filter(|d| labelled(d))
                .collect()
        };
        found.iter().map(|d| d.deployment()).collect()
    }

    /// The Pods labelled as `pool`'s in `namespace`, from the watch cache.
    pub(super) fn pool_pods(&self, namespace: &str, pool: &str) -> Vec<Arc<CachedPod>> {
        let caches = self.scopes();
        caches
            .iter()
            .flat_map(|c| c.pods.pool(namespace, pool))
            .collect()
    }

    /// The metadata of the ReplicaSets labelled as `pool`'s in `namespace`, from the watch cache.
    pub(super) fn pool_replicasets(
        &self,
        namespace: &str,
        pool: &str,
    ) -> Vec<Arc<PartialObjectMeta<ReplicaSet>>> {
        let caches = self.scopes();
        caches
            .iter()
            .flat_map(|c| c.replicasets.pool(namespace, pool))
            .collect()
    }

    /// The autoscalers of a namespace, from the watch cache.
    pub(super) fn autoscalers(&self, namespace: &str) -> Vec<Arc<HorizontalPodAutoscaler>> {
        let caches = self.scopes();
        in_namespace(caches.iter().map(|c| &c.autoscalers), namespace, |_| true)
    }
}

/// How soon a reconcile that found the watch caches without their first list comes back.
pub(super) const CACHES_NOT_READY: Duration = Duration::from_millis(250);

/// Whether a store has its first list, asked once: polling the readiness future only stores
/// this caller's waker, which nothing relies on.
fn ready_now<K>(store: &Store<K>) -> bool
where
    K: kube::Resource + Clone + 'static,
    K::DynamicType: Eq + std::hash::Hash + Clone,
{
    store
        .wait_until_ready()
        .now_or_never()
        .is_some_and(|r| r.is_ok())
}
