//! The controller's shared state: the client, event recorder, metrics and settings, and what
//! each pool's reconciles remember between runs. Every write to the API server goes through
//! `Context::write`, which bounds it with a timeout and counts its result.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

use super::pods::CachedPod;
use futures::FutureExt;
use k8s_openapi::api::apps::v1::{Deployment, ReplicaSet};
use k8s_openapi::api::autoscaling::v2::HorizontalPodAutoscaler;
use kube::core::PartialObjectMeta;
use kube::runtime::events::EventType;
use kube::runtime::reflector::{ObjectRef, Store};
use kube::{Client, ResourceExt};
use tracing::warn;

use super::events::{Recorder, Said};
use super::memory::PoolMemory;
use super::pool_index::PoolIndex;
use super::workers::CachedDeployment;
use crate::api::{LanePool, POOL_LABEL};
use crate::leader::Fence;
use crate::metrics::Metrics;
use crate::prometheus::{self, AllowedUrls, Connection, QueryWindows};
use crate::{Error, Result};

/// The field manager of every write.
pub const MANAGER: &str = "lanepool";

/// Operator-wide settings, from flags.
#[derive(Clone, Debug)]
pub struct Settings {
    /// Used when a LanePool names no Prometheus URL.
    pub default_prometheus_url: Option<String>,
    pub windows: QueryWindows,
    /// How long a write to the API server may take.
    pub write_timeout: Duration,
    /// How long a shrinking Deployment waits for the growing ones to be ready; zero: no wait.
    pub surge_timeout: Duration,
    /// The Prometheus URLs a pool may name.
    pub allowed_prometheus_urls: AllowedUrls,
    /// Most Prometheus queries in flight at once, across every pool.
    pub prometheus_concurrency: usize,
    /// Most pools reconciled at once.
    pub concurrent_reconciles: u16,
    /// Before a Deployment shrinks, mark its busy Pods costlier to delete, so idle ones go first.
    pub idle_workers_first: bool,
    /// With idle workers first: the most a shrink waits for the workers it stops to finish their
    /// jobs after asking them to drain (a lane's job times bound it lower); zero: no drain.
    pub drain_timeout: Duration,
    /// Read each measured pool's workers' own finished-job counts at their port named `metrics`
    /// (`lanepool_job_duration_seconds_count`), so the reserve follows a rate seconds old.
    pub worker_reads: bool,
}

/// The operator's default limit on pools reconciled at once (`--concurrent-reconciles`).
pub const DEFAULT_CONCURRENT_RECONCILES: u16 = 32;

/// Which pool a memory belongs to: by uid too, so a pool deleted and created again under the
/// same name starts afresh.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub(super) struct PoolKey {
    pub(super) namespace: String,
    pub(super) name: String,
    pub(super) uid: String,
}

impl PoolKey {
    pub(super) fn of(pool: &LanePool) -> Self {
        Self {
            namespace: pool.metadata.namespace.clone().unwrap_or_default(),
            name: pool.metadata.name.clone().unwrap_or_default(),
            uid: pool.metadata.uid.clone().unwrap_or_default(),
        }
    }
}

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

/// Shared state of the controller.
pub struct Context {
    pub client: Client,
    pub recorder: Recorder,
    pub metrics: Arc<Metrics>,
    pub settings: Settings,
    pub(super) started: Instant,
    /// The wall clock when `started` was taken: times since the start shown as times of day.
    started_wall: k8s_openapi::jiff::Timestamp,
    pub(super) pools: Mutex<HashMap<PoolKey, PoolMemory>>,
    pub(super) prometheus: prometheus::Clients,
    pub(super) caches: OnceLock<Vec<Caches>>,
    /// Requests to worker Pods in flight, across every pool; granted in the order asked, so a
    /// pool with many Pods waits its turn behind the others instead of starving them.
    pub(super) pod_requests: tokio::sync::Semaphore,
    /// Drain and stand-in requests in flight, across every pool: slots of their own, so workers
    /// that answer reads slowly (or not at all) never keep a scale-down from asking.
    pub(super) pod_posts: tokio::sync::Semaphore,
    /// Reconciles running, at most `--concurrent-reconciles`; granted in the order asked, so
    /// the pools that have waited longest go first when more are due than may run.
    pub(super) reconcile_slots: tokio::sync::Semaphore,
    /// Until when this replica may write (see [`Fence`]): checked before every write, event
    /// and drain request.
    pub(super) fence: Fence,
}

/// The most requests to worker Pods in flight at once across the operator: each may hold a
/// capped answer (256 KiB), so this bounds their memory too (16 MiB).
pub(super) const POD_REQUESTS_IN_FLIGHT: usize = 64;

impl Context {
    pub fn new(client: Client, metrics: Arc<Metrics>, settings: Settings) -> Self {
        let prometheus = prometheus::Clients::new(settings.prometheus_concurrency, metrics.clone());
        let slots = usize::from(settings.concurrent_reconciles.max(1));
        let reconcile_slots = tokio::sync::Semaphore::new(slots);
        Self {
            recorder: Recorder::new(client.clone(), std::env::var("POD_NAME").ok()),
            client,
            metrics,
            settings,
            started: Instant::now(),
            started_wall: k8s_openapi::jiff::Timestamp::now(),
            pools: Mutex::default(),
            prometheus,
            caches: OnceLock::new(),
            pod_requests: tokio::sync::Semaphore::new(POD_REQUESTS_IN_FLIGHT),
            pod_posts: tokio::sync::Semaphore::new(POD_REQUESTS_IN_FLIGHT),
            reconcile_slots,
            fence: Fence::open(),
        }
    }

    /// The same context, writing only while `fence` is open (a leader's lease seen renewed).
    pub fn with_fence(mut self, fence: Fence) -> Self {
        self.fence = fence;
        self
    }

    /// The time of day `since_start` after this process started.
    pub(super) fn wall(&self, since_start: Duration) -> k8s_openapi::jiff::Timestamp {
        let since = k8s_openapi::jiff::SignedDuration::try_from(since_start).unwrap_or_default();
        self.started_wall
            .checked_add(since)
            .unwrap_or(self.started_wall)
    }

    /// Whether this replica may write now.
    pub(super) fn may_write(&self) -> bool {
        self.fence.left().is_some()
    }

    pub(super) fn memory(&self, key: &PoolKey) -> PoolMemory {
        self.pools
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get(key)
            .cloned()
            .unwrap_or_default()
    }

    /// Keeps a reconcile's memory whole (the reconcile owns its pool's memory while it runs:
    /// the controller never runs two reconciles of one pool at once).
    pub(super) fn keep(&self, key: &PoolKey, memory: &PoolMemory) {
        let mut pools = self.pools.lock().unwrap_or_else(|p| p.into_inner());
        pools.insert(key.clone(), memory.clone());
    }

    /// Whether the LanePool controlling `deployment` has a shrink waiting for its growing
    /// Deployments to be ready.
    pub(super) fn shrink_waits(&self, deployment: &CachedDeployment) -> bool {
        let Some(owner) = deployment
            .metadata
            .owner_references
            .iter()
            .flatten()
            .find(|o| o.controller == Some(true) && o.kind == "LanePool")
        else {
            return false;
        };
        let key = PoolKey {
            namespace: deployment.metadata.namespace.clone().unwrap_or_default(),
            name: owner.name.clone(),
            uid: owner.uid.clone(),
        };
        let pools = self.pools.lock().unwrap_or_else(|p| p.into_inner());
        pools.get(&key).is_some_and(|m| m.surge_since.is_some())
    }

    pub(super) fn remember(&self, key: PoolKey, update: impl FnOnce(&mut PoolMemory)) {
        let mut pools = self.pools.lock().unwrap_or_else(|p| p.into_inner());
        update(pools.entry(key).or_default());
    }

    pub(super) fn set_caches(&self, caches: Vec<Caches>) {
        let _ = self.caches.set(caches);
    }

    /// Whether every watch cache has its first list. Asked without waiting: a reconcile that
    /// finds them not ready comes back shortly (see [`CACHES_NOT_READY`]) instead of waiting.
    /// Waiting would hang it: a store's readiness wakes only the last of its waiters (one
    /// oneshot receiver shared by all), and the Deployment watch advances only while the
    /// controller has a free slot, which reconciles waiting on it would take.
    pub(super) fn caches_ready(&self) -> bool {
        self.caches.get().is_some_and(|caches| {
            caches.iter().all(|cache| {
                ready_now(&cache.deployments)
                    && ready_now(&cache.autoscalers)
                    && cache.pods.is_ready()
                    && cache.replicasets.is_ready()
            })
        })
    }

    fn caches(&self) -> &[Caches] {
        self.caches.get().map(Vec::as_slice).unwrap_or_default()
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
        let caches = self.caches();
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
        let caches = self.caches();
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
        let caches = self.caches();
        caches
            .iter()
            .flat_map(|c| c.replicasets.pool(namespace, pool))
            .collect()
    }

    /// The autoscalers of a namespace, from the watch cache.
    pub(super) fn autoscalers(&self, namespace: &str) -> Vec<Arc<HorizontalPodAutoscaler>> {
        let caches = self.caches();
        in_namespace(caches.iter().map(|c| &c.autoscalers), namespace, |_| true)
    }

    /// Forgets every pool that no longer exists (`live` says which do): its memory, its metric
    /// series, and the Prometheus clients no living pool uses.
    pub(super) fn forget_deleted(&self, live: impl Fn(&PoolKey) -> bool) {
        let mut pools = self.pools.lock().unwrap_or_else(|p| p.into_inner());
        pools.retain(|key, memory| {
            if live(key) {
                return true;
            }
            let lanes = memory.history.keys().cloned();
            let lanes = lanes.chain(
                memory
                    .replicas
                    .iter()
                    .flat_map(|r| r.reserved.keys().cloned()),
            );
            self.metrics.forget(&key.namespace, &key.name, lanes);
            false
        });
        let in_use: Vec<&Connection> = pools
            .values()
            .filter_map(|m| m.connection.as_ref())
            .collect();
        self.prometheus
            .retain(|connection| in_use.contains(&connection));
        let live: std::collections::HashSet<(&str, &str)> = pools
            .keys()
            .map(|key| (key.namespace.as_str(), key.name.as_str()))
            .collect();
        self.prometheus
            .forget_lanes(|lane| live.contains(&(lane.namespace.as_str(), lane.pool.as_str())));
        self.prometheus.forget_pools(|pool| {
            pool.split_once('/')
                .is_some_and(|(namespace, name)| live.contains(&(namespace, name)))
        });
    }

    /// Runs a write with the timeout, cut short where the fence closes, and counts its result
    /// in `kube_writes`; nothing is sent once the fence is closed (`result="fenced"`).
    pub(super) async fn write<T>(
        &self,
        action: impl Into<String>,
        request: impl Future<Output = kube::Result<T>>,
    ) -> Result<T> {
        let action = action.into();
        let Some(left) = self.fence.left() else {
            self.metrics.wrote("fenced");
            return Err(Error::NotLeader { action });
        };
        let (result, outcome) = self.bounded(action, request, left).await;
        self.metrics.wrote(outcome);
        result
    }

    /// Runs a read (a list or a get) with the same timeout; reads are not counted as writes.
    pub(super) async fn read<T>(
        &self,
        action: impl Into<String>,
        request: impl Future<Output = kube::Result<T>>,
    ) -> Result<T> {
        self.bounded(action.into(), request, Duration::MAX).await.0
    }

    async fn bounded<T>(
        &self,
        action: String,
        request: impl Future<Output = kube::Result<T>>,
        fence: Duration,
    ) -> (Result<T>, &'static str) {
        let timeout = self.settings.write_timeout.min(fence);
        match tokio::time::timeout(timeout, request).await {
            Ok(Ok(value)) => (Ok(value), "success"),
            Ok(Err(source)) => (Err(Error::Kube { action, source }), "failure"),
            Err(_) => {
                let seconds = self.settings.write_timeout.as_secs();
                (Err(Error::Timeout { action, seconds }), "timeout")
            }
        }
    }

    pub(super) async fn event(
        &self,
        pool: &LanePool,
        type_: EventType,
        reason: &str,
        note: String,
    ) {
        if !self.may_write() {
            self.metrics.wrote("fenced");
            return;
        }
        // The API server counts bytes: 128 for the action, 1 kB for the note.
        let said = Said {
            type_,
            reason,
            action: truncate_bytes(&note, 128),
            note: truncate_bytes(&note, 1024),
        };
        if let Err(error) = self.recorder.publish(pool, said).await {
            warn!(%error, "could not publish an event");
        }
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

/// The longest start of `text` that fits in `bytes` bytes without splitting a character.
pub(super) fn truncate_bytes(text: &str, bytes: usize) -> &str {
    if text.len() <= bytes {
        return text;
    }
    let end = (0..=bytes)
        .rev()
        .find(|&i| text.is_char_boundary(i))
        .unwrap_or(0);
    &text[..end]
}

#[cfg(test)]
mod tests {
    use super::truncate_bytes;

    #[test]
    fn cuts_by_bytes_at_a_character_boundary() {
        // "×" and "→" are two and three bytes: 128 characters of them are far over 128 bytes.
        let note = "urgent 30/s × 20 ms × 2 = 1.2 → 2 → ".repeat(10);
        let action = truncate_bytes(&note, 128);
        assert!(
            action.len() <= 128 && action.len() >= 126,
            "{}",
            action.len()
        );
        assert!(note.starts_with(action));
        assert_eq!(truncate_bytes("→→", 4), "→");
        assert_eq!(truncate_bytes("→", 2), "");
        assert_eq!(truncate_bytes("short", 128), "short");
    }
}
