//! The watches of one scope (a namespace, or every namespace) and its queue: the caches every
//! reconcile reads (the pools' Deployments, the autoscalers, the pools' Pods and their
//! ReplicaSets' metadata), and what wakes a pool's reconcile before its interval (a spec change,
//! some Deployment events, a Pod waiting for its readiness gate).

use std::sync::Arc;

use futures::future::BoxFuture;
use futures::{FutureExt, Stream, StreamExt};
use k8s_openapi::api::apps::v1::ReplicaSet;
use k8s_openapi::api::autoscaling::v2::HorizontalPodAutoscaler;
use k8s_openapi::api::core::v1::Pod;
use kube::ResourceExt;
use kube::api::Api;
use kube::core::PartialObjectMeta;
use kube::runtime::controller::{self, Controller};
use kube::runtime::reflector::{self, ObjectRef, Store};
use kube::runtime::{WatchStreamExt, predicates, watcher};
use tracing::warn;

use super::cached_pod::{self, CachedPod};
use super::caches::Caches;
use super::context::Context;
use super::deployments::CachedDeployment;
use super::pool_index::PoolIndex;
use super::reconcile::{error_policy, reconcile};
use super::triggers::Triggers;
use crate::api::{LanePool, POOL_LABEL};

/// One scope's caches, the watches that only fill them, its pools' store and its controller.
pub(super) struct Scope {
    pub(super) caches: Caches,
    pub(super) fills: Vec<BoxFuture<'static, ()>>,
    pub(super) pools: Store<LanePool>,
    pub(super) controller: BoxFuture<'static, ()>,
}

/// The watches and the queue of `namespace` (every namespace when `None`).
pub(super) fn scope(
    ctx: &Arc<Context>,
    namespace: Option<&str>,
    shutdown: impl Future<Output = ()> + Send + Sync + Clone + 'static,
) -> Scope {
    let client = &ctx.client;
    let (deployments, deployment_events) = deployments(ctx, scoped(client, namespace));
    let (autoscalers, autoscaler_fill) = autoscalers(scoped(client, namespace));
    let (pods, pod_triggers) = pods(scoped(client, namespace));
    let (replicasets, replicaset_fill) = replicasets(scoped(client, namespace));
    // A pool is reconciled when its spec changes (its generation), not when its own status is
    // written: the interval and some Deployment events do the rest.
    let (pools, pool_writer) = reflector::store();
    let pool_events = watcher(
        scoped::<LanePool>(client, namespace),
        watcher::Config::default(),
    )
    .default_backoff()
    .modify(|p: &mut LanePool| p.managed_fields_mut().clear())
    .reflect(pool_writer)
    .applied_objects()
    .predicate_filter(predicates::generation, Default::default());
    // No limit in the controller's own queue: when more pools are due than may run, it picks the
    // next in no particular order, and under a long overload some pools waited 100 s (the scale
    // benchmark). `reconcile` waits for one of `--concurrent-reconciles` slots instead, granted
    // first come, first served.
    let controller = Controller::for_stream(pool_events, pools.clone())
        .with_config(controller::Config::default().concurrency(0))
        .owns_stream(deployment_events)
        .reconcile_on(pod_triggers)
        .graceful_shutdown_on(shutdown)
        .run(reconcile, error_policy, ctx.clone())
        .for_each(|result| async move {
            match result {
                // error_policy logged it, once, with its pool and backoff.
                Ok(_) | Err(controller::Error::ReconcilerFailed(..)) => {}
                Err(error) => warn!(%error, "the controller's queue failed"),
            }
        })
        .boxed();
    Scope {
        caches: Caches {
            deployments,
            autoscalers,
            pods,
            replicasets,
        },
        fills: vec![autoscaler_fill, replicaset_fill],
        pools,
        controller,
    }
}

/// The pools' Deployments, read from a watch cache and never listed per reconcile, and the
/// events among them that reconcile their pool before its interval: only what `triggers.rs`
/// lets through.
fn deployments(
    ctx: &Arc<Context>,
    api: Api<CachedDeployment>,
) -> (
    Store<CachedDeployment>,
    impl Stream<Item = Result<CachedDeployment, watcher::Error>> + Send + 'static,
) {
    let (cache, writer) = reflector::store();
    let mut triggers = Triggers::default();
    let waits = ctx.clone();
    let events = watcher(api, watcher::Config::default().labels(POOL_LABEL))
        .default_backoff()
        .modify(CachedDeployment::keep_what_is_read)
        .reflect(writer)
        .filter_map(move |event| {
            let woken = event
                .map(|e| triggers.wakes(e, |d| waits.shrink_waits(d)))
                .transpose();
            futures::future::ready(woken)
        });
    (cache, events)
}

/// The namespace's autoscalers, for the check that none fights the operator.
fn autoscalers(
    api: Api<HorizontalPodAutoscaler>,
) -> (Store<HorizontalPodAutoscaler>, BoxFuture<'static, ()>) {
    let (cache, writer) = reflector::store();
    let fill = watcher(api, watcher::Config::default())
        .default_backoff()
        .modify(|h: &mut HorizontalPodAutoscaler| h.managed_fields_mut().clear())
        .reflect(writer)
        .for_each(|_| async {})
        .boxed();
    (cache, fill)
}

/// The pools' Pods, only what a reconcile reads of them, grouped by pool: no reconcile lists or
/// scans them. A Pod waiting only for its readiness gate reconciles its pool at once: the gate
/// opens there (`plan/gates.rs`, written by `act/steer.rs`), and the Pod counts as ready only then.
fn pods(
    api: Api<Pod>,
) -> (
    Arc<PoolIndex<CachedPod>>,
    impl Stream<Item = ObjectRef<LanePool>> + Send + 'static,
) {
    let cache = Arc::new(PoolIndex::default());
    let index = cache.clone();
    let triggers = watcher(api, watcher::Config::default().labels(POOL_LABEL))
        .default_backoff()
        .filter_map(move |event| {
            let woken = match &event {
                Ok(watcher::Event::Apply(pod) | watcher::Event::InitApply(pod)) => {
                    cached_pod::waits_for_its_gate(pod)
                }
                _ => None,
            };
            if let Ok(event) = event {
                index.apply(event, CachedPod::of);
            }
            futures::future::ready(woken)
        });
    (cache, triggers)
}

/// The metadata of the pools' ReplicaSets: whose each Pod is needs no more.
fn replicasets(
    api: Api<PartialObjectMeta<ReplicaSet>>,
) -> (
    Arc<PoolIndex<PartialObjectMeta<ReplicaSet>>>,
    BoxFuture<'static, ()>,
) {
    let cache = Arc::new(PoolIndex::default());
    let fill = watcher(api, watcher::Config::default().labels(POOL_LABEL))
        .default_backoff()
        .modify(|r: &mut PartialObjectMeta<ReplicaSet>| r.managed_fields_mut().clear())
        .for_each(fill(cache.clone(), std::convert::identity))
        .boxed();
    (cache, fill)
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
