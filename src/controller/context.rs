//! The controller's shared state: the client, event recorder, metrics and settings, and what
//! each pool's reconciles remember between runs. Every write to the API server goes through
//! `Context::write`, which bounds it with a timeout and counts its result.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use kube::Client;
use kube::runtime::events::EventType;
use tracing::warn;

use super::caches::WatchCaches;
use super::cut::truncate_bytes;
use super::deployments::CachedDeployment;
use super::events::{Recorder, Said};
use super::settings::Settings;
use super::state::PoolMemory;
use crate::api::LanePool;
use crate::leader::Fence;
use crate::metrics::Metrics;
use crate::prometheus::{self, Connection};
use crate::{Error, Result};

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
    /// The watch caches every reconcile reads.
    pub(super) caches: WatchCaches,
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
            caches: WatchCaches::default(),
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
