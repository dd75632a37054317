//! The controller's shared state: the clients (Kubernetes, the event recorder, Prometheus, the
//! workers' HTTP client (`worker_http.rs`) and the slots of the requests to workers, the write
//! fence), the metrics, the settings, the watch caches (`caches.rs`) and every pool's carried
//! state (`state/pools.rs`). Every write to the API server goes through `Context::write`, which
//! bounds it with a timeout and counts its result; every request to a worker through
//! `Context::ask_worker`, which holds it to a slot and a deadline and counts its wait.

use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

use kube::Client;
use kube::runtime::events::EventType;
use tracing::warn;

use super::caches::WatchCaches;
use super::cut::truncate_bytes;
use super::deployments::CachedDeployment;
use super::events::{PoolEvent, Recorder};
use super::settings::Settings;
use super::state::PoolMemory;
use super::state::pools::{PoolKey, PoolStates};
use super::worker_http::{Refused, Reqwest, WorkerHttp};
use crate::api::LanePool;
use crate::leader::Fence;
use crate::metrics::Metrics;
use crate::prometheus::{self};
use crate::{Error, Result};

/// Shared state of the controller.
pub struct Context {
    pub client: Client,
    pub recorder: Recorder,
    pub metrics: Arc<Metrics>,
    pub settings: Settings,
    pub(super) started: Instant,
    /// The wall clock when `started` was taken: times since the start shown as times of day.
    started_wall: k8s_openapi::jiff::Timestamp,
    /// Every pool's carried state.
    pub(super) pools: PoolStates,
    pub(super) prometheus: prometheus::Clients,
    /// The watch caches every reconcile reads.
    pub(super) caches: WatchCaches,
    /// The client of every request to a worker Pod.
    pub(super) worker_http: Arc<dyn WorkerHttp>,
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
            pools: PoolStates::default(),
            prometheus,
            caches: WatchCaches::default(),
            worker_http: Arc::new(Reqwest),
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

    /// This context with another way to the workers: the whole-reconcile tests' in-memory
    /// workers (`fake.rs`).
    #[cfg(test)]
    pub(super) fn with_worker_http(mut self, worker_http: Arc<dyn WorkerHttp>) -> Self {
        self.worker_http = worker_http;
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
        self.pools.get(key)
    }

    /// Keeps a reconcile's memory whole (the reconcile owns its pool's memory while it runs:
    /// the controller never runs two reconciles of one pool at once).
    pub(super) fn keep(&self, key: &PoolKey, memory: &PoolMemory) {
        self.pools.keep(key, memory);
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
        self.pools.surging(&PoolKey {
            namespace: deployment.metadata.namespace.clone().unwrap_or_default(),
            name: owner.name.clone(),
            uid: owner.uid.clone(),
        })
    }

    pub(super) fn remember(&self, key: PoolKey, update: impl FnOnce(&mut PoolMemory)) {
        self.pools.update(key, update);
    }

    /// Forgets every pool that no longer exists (`live` says which do): its memory, its metric
    /// series, and the Prometheus clients no living pool uses.
    pub(super) fn forget_deleted(&self, live: impl Fn(&PoolKey) -> bool) {
        let living = self.pools.forget(live, |key, memory| {
            let lanes = memory.history.keys().cloned();
            let lanes = lanes.chain(
                memory
                    .replicas
                    .iter()
                    .flat_map(|r| r.reserved.keys().cloned()),
            );
            self.metrics.forget(&key.namespace, &key.name, lanes);
        });
        self.prometheus
            .retain(|connection| living.connections.contains(connection));
        let named = |namespace: &str, name: &str| {
            living
                .pools
                .contains(&(namespace.to_string(), name.to_string()))
        };
        self.prometheus
            .forget_lanes(|lane| named(&lane.namespace, &lane.pool));
        self.prometheus.forget_pools(|pool| {
            pool.split_once('/')
                .is_some_and(|(namespace, name)| named(namespace, name))
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

    /// One request to a worker Pod, once it has a place (the reconcile's `own` one, or one of
    /// the operator's `slots`), by `deadline`; how long it waited for its place and how long it
    /// took counted in the metrics.
    pub(super) async fn ask_worker<T, F>(
        &self,
        slots: &tokio::sync::Semaphore,
        own: &tokio::sync::Semaphore,
        deadline: tokio::time::Instant,
        send: impl FnOnce() -> F,
    ) -> Result<T, Refused>
    where
        F: Future<Output = Result<T, Refused>>,
    {
        let asked = tokio::time::Instant::now();
        let sent_at = OnceLock::new();
        let sent = async {
            let _slot = tokio::select! {
                biased;
                slot = own.acquire() => slot,
                slot = slots.acquire() => slot,
            }
            .map_err(|_| Refused::OutOfTime)?;
            sent_at.get_or_init(tokio::time::Instant::now);
            send().await
        };
        let answer = tokio::time::timeout_at(deadline, sent)
            .await
            .unwrap_or(Err(Refused::OutOfTime));
        // Cut off by the budget while waiting for a slot: waited all along, never sent.
        let (wait, took) = match sent_at.get() {
            Some(sent) => (sent.duration_since(asked), Some(sent.elapsed())),
            None => (asked.elapsed(), None),
        };
        self.metrics.worker_requested(wait, took);
        answer
    }

    /// Counts a refusal a Pod chose (an answer too large, a redirect) in `worker_reads_rejected`.
    pub(super) fn count_rejected(&self, refused: &Refused) {
        if let Some(reason) = refused.rejected_reason() {
            self.metrics.worker_read_rejected(reason);
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
        let said = PoolEvent {
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
