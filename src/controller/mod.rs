//! The LanePool controller: the watches and the queue (here), and one reconcile per pool
//! (`reconcile.rs`): observe, decide, roll out, act. The modules depend one way, each only on
//! those listed before it:
//! - pure: `protocol`, `cut`, `settings`, `deployments` (the Deployments a pool runs),
//!   `status`, `cached_pod`, `rollout/` (surge, drains, stand-ins, costs, takeovers), `state/`
//!   (what a pool carries between reconciles), `pool_index`, `triggers`;
//! - the watch caches and the shared context: `caches`, `events`, `context`;
//! - the one way to a pool's Pods: `pods/`;
//! - the two stages that do I/O: `observe/` (every read) and `act/` (every write);
//! - the reconcile on top.
//!
//! `tests/structure.rs` fails on an import circle anywhere in the crate.

mod act;
mod cached_pod;
mod caches;
mod context;
mod cut;
mod deployments;
mod events;
#[cfg(test)]
mod fake;
mod observe;
mod pods;
mod pool_index;
mod protocol;
mod reconcile;
mod rollout;
mod settings;
mod state;
mod status;
mod triggers;

use std::sync::Arc;
use std::time::Duration;

use futures::{FutureExt, StreamExt};
use k8s_openapi::api::apps::v1::ReplicaSet;
use k8s_openapi::api::autoscaling::v2::HorizontalPodAutoscaler;
use k8s_openapi::api::core::v1::Pod;
use kube::ResourceExt;
use kube::api::Api;
use kube::core::PartialObjectMeta;
use kube::runtime::controller::{self, Controller};
use kube::runtime::reflector::{self, Store};
use kube::runtime::{WatchStreamExt, predicates, watcher};
use pool_index::PoolIndex;
use tracing::warn;
use triggers::Triggers;

use caches::Caches;
pub use context::Context;
use context::PoolKey;
pub use deployments::{
    LANES_ENV, POOL_ENV, ROLE_ENV, Role, TEMPLATE_HASH, deployment_name, worker_deployments,
};
pub use events::{Recorder, SERIES_TTL, Said};
pub use protocol::{BUSY_METRIC, DELETION_COST, DRAINING_METRIC};
pub use reconcile::{error_policy, reconcile};
pub use rollout::cost::{BUSY_COST, DRAINED_COST, IDLE_COST};
pub use rollout::drain::DEFAULT_DRAIN_TIMEOUT;
pub use rollout::grace::GRACE_PERIOD_TOO_SHORT;
pub use rollout::surge::DEFAULT_SURGE_TIMEOUT;
pub use settings::{DEFAULT_CONCURRENT_RECONCILES, MANAGER, Settings};

use crate::api::{LanePool, POOL_LABEL};

/// Runs the controller for `namespaces` (every namespace when empty) until `shutdown` resolves.
pub async fn run(
    ctx: Arc<Context>,
    namespaces: Vec<String>,
    shutdown: impl Future<Output = ()> + Send + Sync + Clone + 'static,
) {
    let scopes: Vec<Option<String>> = if namespaces.is_empty() {
        vec![None]
    } else {
        namespaces.into_iter().map(Some).collect()
    };
    let mut stores: Vec<Store<LanePool>> = Vec::new();
    let mut caches = Vec::new();
    // Watches that only fill caches (no reconcile follows their events).
    let mut cache_watches: Vec<futures::future::BoxFuture<'static, ()>> = Vec::new();
    let controllers: Vec<_> = scopes
        .into_iter()
        .map(|namespace| {
            let client = ctx.client.clone();
            let pools: Api<LanePool> = scoped(&client, namespace.as_deref());
            let deployments: Api<deployments::CachedDeployment> =
                scoped(&client, namespace.as_deref());
            let autoscalers: Api<HorizontalPodAutoscaler> = scoped(&client, namespace.as_deref());
            let pods: Api<Pod> = scoped(&client, namespace.as_deref());
            // Metadata only: whose each Pod is needs no more.
            let replicasets: Api<PartialObjectMeta<ReplicaSet>> =
                scoped(&client, namespace.as_deref());
            // The pools' Deployments and the namespace's autoscalers are read from watch caches,
            // never listed per reconcile; some Deployment events also trigger a reconcile.
            let (deployment_cache, deployment_writer) = reflector::store();
            // Only what `triggers.rs` lets through reconciles a pool before its interval.
            let mut triggers = Triggers::default();
            let waits = ctx.clone();
            let deployment_events =
                watcher(deployments, watcher::Config::default().labels(POOL_LABEL))
                    .default_backoff()
                    .modify(deployments::CachedDeployment::keep_what_is_read)
                    .reflect(deployment_writer)
                    .filter_map(move |event| {
                        let woken = event
                            .map(|e| triggers.wakes(e, |d| waits.shrink_waits(d)))
                            .transpose();
                        futures::future::ready(woken)
                    });
            let (autoscaler_cache, autoscaler_writer) = reflector::store();
            cache_watches.push(
                watcher(autoscalers, watcher::Config::default())
                    .default_backoff()
                    .modify(|h: &mut HorizontalPodAutoscaler| h.managed_fields_mut().clear())
                    .reflect(autoscaler_writer)
                    .for_each(|_| async {})
                    .boxed(),
            );
            // The pools' Pods (only what a reconcile reads of them) and their ReplicaSets'
            // metadata (whose each Pod is), grouped by pool: no reconcile lists or scans either.
            // A Pod waiting only for its readiness gate reconciles its pool at once: the gate
            // opens there (`act/takeover.rs`), and the Pod counts as ready only then.
            let pod_cache = Arc::new(PoolIndex::default());
            let pod_index = pod_cache.clone();
            let pod_triggers = watcher(pods, watcher::Config::default().labels(POOL_LABEL))
                .default_backoff()
                .filter_map(move |event| {
                    let woken = match &event {
                        Ok(watcher::Event::Apply(pod) | watcher::Event::InitApply(pod)) => {
                            cached_pod::waits_for_its_gate(pod)
                        }
                        _ => None,
                    };
                    if let Ok(event) = event {
                        pod_index.apply(event, cached_pod::CachedPod::of);
                    }
                    futures::future::ready(woken)
                });
            let replicaset_cache = Arc::new(PoolIndex::default());
            cache_watches.push(
                watcher(replicasets, watcher::Config::default().labels(POOL_LABEL))
                    .default_backoff()
                    .modify(|r: &mut PartialObjectMeta<ReplicaSet>| r.managed_fields_mut().clear())
                    .for_each(fill(replicaset_cache.clone(), std::convert::identity))
                    .boxed(),
            );
            caches.push(Caches {
                deployments: deployment_cache,
                autoscalers: autoscaler_cache,
                pods: pod_cache,
                replicasets: replicaset_cache,
            });
            // A pool is reconciled when its spec changes (its generation), not when its own
            // status is written: the interval and some Deployment events do the rest.
            let (pool_cache, pool_writer) = reflector::store();
            let pool_events = watcher(pools, watcher::Config::default())
                .default_backoff()
                .modify(|p: &mut LanePool| p.managed_fields_mut().clear())
                .reflect(pool_writer)
                .applied_objects()
                .predicate_filter(predicates::generation, Default::default());
            stores.push(pool_cache.clone());
            // No limit in the controller's own queue: when more pools are due than may run, it
            // picks the next in no particular order, and under a long overload some pools waited
            // 100 s (the scale benchmark). `reconcile` waits for one of `--concurrent-reconciles`
            // slots instead, granted first come, first served.
            Controller::for_stream(pool_events, pool_cache)
                .with_config(controller::Config::default().concurrency(0))
                .owns_stream(deployment_events)
                .reconcile_on(pod_triggers)
                .graceful_shutdown_on(shutdown.clone())
                .run(reconcile, error_policy, ctx.clone())
                .for_each(|result| async move {
                    match result {
                        // error_policy logged it, once, with its pool and backoff.
                        Ok(_) | Err(controller::Error::ReconcilerFailed(..)) => {}
                        Err(error) => warn!(%error, "the controller's queue failed"),
                    }
                })
        })
        .collect();
    ctx.caches.set(caches);
    let cache_watches = futures::future::join_all(cache_watches);
    let sweep = forget_deleted_pools(ctx, stores);
    tokio::select! {
        _ = futures::future::join_all(controllers) => {}
        _ = sweep => {}
        _ = cache_watches => {}
    }
}

/// Feeds a watch's events into `index`, each object kept as what `keep` makes of it; a failed
/// watch call is retried by its backoff.
fn fill<K: kube::Resource, T>(
    index: Arc<PoolIndex<T>>,
    keep: impl Fn(K) -> T + Copy,
) -> impl FnMut(watcher::Result<watcher::Event<K>>) -> futures::future::Ready<()> {
    move |event| {
        if let Ok(event) = event {
            index.apply(event, keep);
        }
        futures::future::ready(())
    }
}

/// `K`s in `namespace`, or in every namespace.
fn scoped<K>(client: &kube::Client, namespace: Option<&str>) -> Api<K>
where
    K: kube::Resource<Scope = k8s_openapi::NamespaceResourceScope>,
    K::DynamicType: Default,
{
    match namespace {
        Some(ns) => Api::namespaced(client.clone(), ns),
        None => Api::all(client.clone()),
    }
}

/// How often the memory, metric series and Prometheus clients of deleted pools are dropped.
const SWEEP_INTERVAL: Duration = Duration::from_secs(30);

/// Drops what the operator kept for pools that are gone, once the watches have listed them.
async fn forget_deleted_pools(ctx: Arc<Context>, stores: Vec<Store<LanePool>>) {
    for store in &stores {
        if store.wait_until_ready().await.is_err() {
            return;
        }
    }
    loop {
        tokio::time::sleep(SWEEP_INTERVAL).await;
        let live: std::collections::HashSet<PoolKey> = stores
            .iter()
            .flat_map(|store| store.state())
            .map(|pool| PoolKey::of(&pool))
            .collect();
        ctx.forget_deleted(|key| live.contains(key));
    }
}
