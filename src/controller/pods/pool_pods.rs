//! One reconcile's view of one pool's Pods and the only way to reach them: the snapshot of its own
//! workers from the watch caches, their `/metrics` answers (each asked at most once per reconcile),
//! drain and stand-in requests and Pod patches, within one time budget.

use std::collections::HashMap;
use std::sync::{Mutex, OnceLock};
use std::time::Duration;

use futures::StreamExt;
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::Pod;
use kube::ResourceExt;
use kube::api::{Api, Patch, PatchParams};
use tokio::time::Instant;
use tracing::{debug, warn};

use super::http::{self, Refused};
use super::owners::{Owners, PoolDeployments, pool_deployments};
use super::worker::Worker;
use crate::api::LanePool;
use crate::controller::context::{Context, POD_REQUESTS_IN_FLIGHT};
use crate::controller::protocol::DELETION_COST;
use crate::controller::settings::measure_deadline;

/// One reconcile's view of one pool's Pods: only its own workers (see `owners.rs`) are ever
/// read, asked to drain or annotated, and all of it within one deadline.
pub(in crate::controller) struct PoolPods<'a> {
    ctx: &'a Context,
    deadline: tokio::time::Instant,
    namespace: String,
    pool: String,
    deployments: PoolDeployments,
    /// The pool's workers, read from the watch caches once per reconcile, when first needed.
    workers: OnceLock<Vec<Worker>>,
    /// Each worker's `/metrics` answer in this reconcile and when it was given (`None`: it gave
    /// none), by Pod name: the reads, the drains and the ranking ask each worker once between
    /// them.
    texts: Mutex<HashMap<String, Option<MetricsText>>>,
    /// A place for one read and one drain or stand-in request that is this reconcile's own, in
    /// flight beside the operator's shared ones: however many other pools' silent Pods hold
    /// those, this pool's requests go out, one at a time at worst.
    own_read: tokio::sync::Semaphore,
    own_post: tokio::sync::Semaphore,
}

impl<'a> PoolPods<'a> {
    /// The Pods of `pool`, whose Deployments are among `existing` (the watch cache's), asked
    /// for at most `budget` from now.
    pub(in crate::controller) fn new<'d>(
        ctx: &'a Context,
        pool: &LanePool,
        existing: impl IntoIterator<Item = &'d Deployment>,
        budget: Duration,
    ) -> Self {
        Self {
            ctx,
            deadline: tokio::time::Instant::now() + budget,
            namespace: pool.namespace().unwrap_or_default(),
            pool: pool.name_any(),
            deployments: pool_deployments(&pool.uid().unwrap_or_default(), existing),
            workers: OnceLock::new(),
            texts: Mutex::default(),
            own_read: tokio::sync::Semaphore::new(1),
            own_post: tokio::sync::Semaphore::new(1),
        }
    }

    /// The live (not terminating, not Failed or Succeeded) workers of the pool: Pods with its
    /// label that a ReplicaSet of one of its Deployments controls. A Pod that is not the pool's
    /// worker, however it is labelled, is left out; so is a finished one, which the ReplicaSet
    /// controller no longer counts (draining it first would leave a busy worker to be deleted). Read from the watch caches of the pools' Pods and ReplicaSets, once
    /// per reconcile: nothing is listed.
    pub(in crate::controller) fn workers(&self) -> &[Worker] {
        self.workers.get_or_init(|| {
            if self.deployments.is_empty() {
                return Vec::new();
            }
            let replicasets = self
                .ctx
                .caches
                .pool_replicasets(&self.namespace, &self.pool);
            let owners = Owners::new(&self.deployments, replicasets.iter().map(|r| &r.metadata));
            self.ctx
                .caches
                .pool_pods(&self.namespace, &self.pool)
                .iter()
                .filter(|p| !p.terminating && !p.finished)
                .filter_map(|p| {
                    let mut worker = Worker::new(p, owners.deployment_of(p)?.to_string());
                    worker.newest = owners.newest(p);
                    Some(worker)
                })
                .collect()
        })
    }

    /// The pool's workers that cannot start, each with why (see `CachedPod::cannot_start`),
    /// in the order of their names.
    pub(in crate::controller) fn cannot_start(&self) -> Vec<(String, &'static str, String)> {
        let mut stuck: Vec<_> = self
            .workers()
            .iter()
            .filter_map(|w| {
                let (reason, message) = w.cannot_start.clone()?;
                Some((w.name.clone(), reason, message))
            })
            .collect();
        stuck.sort();
        stuck
    }

    /// The live workers of the pool's Deployment `deployment`.
    pub(in crate::controller) fn workers_of(&self, deployment: &str) -> Vec<&Worker> {
        self.workers()
            .iter()
            .filter(|w| w.deployment == deployment)
            .collect()
    }
}

/// A worker's `/metrics` text, and when the worker counted it: on the operator's clock
/// (`Context::started`), halfway between the request going out and its answer being in. A request
/// that waited for a slot, or an answer the operator was slow to take in, does not move it.
#[derive(Clone, Debug, PartialEq)]
pub(in crate::controller) struct MetricsText {
    pub(in crate::controller) text: String,
    pub(in crate::controller) at: Duration,
}

/// The part of a Pod a patch writes.
#[derive(Clone, Copy)]
pub(in crate::controller) enum PodPart {
    Metadata,
    Status,
}

/// Most Pod patches in flight at once for one Deployment.
const PATCHES_IN_FLIGHT: usize = 8;
/// Most requests to one pool's Pods in flight at once (a pool has one reconcile at a time, and
/// it asks its Pods one step after another): a quarter of the operator's
/// [`POD_REQUESTS_IN_FLIGHT`], so one pool's silent Pods never hold every slot.
const REQUESTS_IN_FLIGHT: usize = POD_REQUESTS_IN_FLIGHT / 4;
/// The most one reconcile spends on its pool's Pods, lists and requests together (less when the
/// measurement's deadline is shorter): a healthy worker answers in milliseconds, and silent ones
/// cost their pool this, however many there are.
pub(in crate::controller) const POD_BUDGET: Duration = Duration::from_secs(1);

/// How long a reconcile of a pool measured every `interval` may spend on its Pods: within the
/// measurement's deadline, at most [`POD_BUDGET`].
pub(in crate::controller) fn budget(interval: Duration) -> Duration {
    measure_deadline(interval).min(POD_BUDGET)
}

/// Counts a refusal a Pod chose (an answer too large, a redirect) in `worker_reads_rejected`.
fn count(ctx: &Context, refused: &Refused) {
    if let Some(reason) = refused.rejected_reason() {
        ctx.metrics.worker_read_rejected(reason);
    }
}

impl PoolPods<'_> {
    /// One request, once it has a place (the reconcile's `own` one, or one of the operator's
    /// `slots`), by `deadline`.
    async fn request<T, F>(
        &self,
        slots: &tokio::sync::Semaphore,
        own: &tokio::sync::Semaphore,
        deadline: tokio::time::Instant,
        send: impl FnOnce() -> F,
    ) -> Result<T, Refused>
    where
        F: Future<Output = Result<T, Refused>>,
    {
        let asked = Instant::now();
        let sent_at = OnceLock::new();
        let sent = async {
            let _slot = tokio::select! {
                biased;
                slot = own.acquire() => slot,
                slot = slots.acquire() => slot,
            }
            .map_err(|_| Refused::OutOfTime)?;
            sent_at.get_or_init(Instant::now);
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
        self.ctx.metrics.worker_requested(wait, took);
        answer
    }

    /// Each of `workers` that has a metrics port asked for its `/metrics` text (once per
    /// reconcile: a worker asked before answers as it did then), at most [`REQUESTS_IN_FLIGHT`]
    /// at once: (pod name, answer) of those that answered in time.
    pub(in crate::controller) async fn metrics_texts(
        &self,
        workers: &[&Worker],
    ) -> Vec<(String, MetricsText)> {
        let (mut known, mut targets) = (Vec::new(), Vec::new());
        {
            let texts = self.texts.lock().unwrap_or_else(|p| p.into_inner());
            for worker in workers {
                match (texts.get(&worker.name), &worker.address) {
                    (Some(text), _) => known.extend(text.clone().map(|t| (worker.name.clone(), t))),
                    (None, Some(address)) => targets.push((worker.name.clone(), address.clone())),
                    (None, None) => {}
                }
            }
        }
        let clock = self.ctx.started;
        let asked: Vec<(String, Option<MetricsText>)> = futures::stream::iter(targets)
            .map(|(name, address)| async move {
                let answer = self
                    .request(
                        &self.ctx.pod_requests,
                        &self.own_read,
                        self.deadline,
                        || async {
                            let sent = clock.elapsed();
                            let text = http::get(&address, "/metrics").await?;
                            let at = sent + clock.elapsed().saturating_sub(sent) / 2;
                            Ok(MetricsText { text, at })
                        },
                    )
                    .await;
                match answer {
                    Ok(answered) => (name, Some(answered)),
                    Err(refused) => {
                        count(self.ctx, &refused);
                        debug!(pod = %name, %address, error = %refused, "worker did not answer");
                        (name, None)
                    }
                }
            })
            .buffer_unordered(REQUESTS_IN_FLIGHT)
            .collect()
            .await;
        let mut texts = self.texts.lock().unwrap_or_else(|p| p.into_inner());
        for (name, text) in asked {
            known.extend(text.clone().map(|t| (name.clone(), t)));
            texts.insert(name, text);
        }
        known
    }

    /// A `POST` of its path (a drain or stand-in request) to each worker at its metrics port:
    /// (pod name, the status and text of its answer, or why there is none). Its budget is its
    /// own ([`POD_BUDGET`] from now, and slots apart from the reads'): what a slow Prometheus
    /// or slow reads left of the reconcile's budget never decides whether a scale-down asks.
    pub(in crate::controller) async fn post(
        &self,
        requests: Vec<(&Worker, String)>,
    ) -> Vec<(String, Result<(u16, String), Refused>)> {
        let deadline = tokio::time::Instant::now() + POD_BUDGET;
        // Owned from here: futures that borrow the workers fail the controller's bound on a
        // reconcile's future ("`FnOnce` is not general enough").
        let requests: Vec<(String, Option<String>, String)> = requests
            .into_iter()
            .map(|(worker, path)| (worker.name.clone(), worker.address.clone(), path))
            .collect();
        futures::stream::iter(requests)
            .map(|(name, address, path)| async move {
                let answer = match &address {
                    None => Err(Refused::NoMetricsPort),
                    Some(address) => {
                        // The fence is checked once a slot is held, just before sending: a
                        // replica that lost its lease while it waited asks no one.
                        let send = || async {
                            if !self.ctx.may_write() {
                                return Err(Refused::NotLeader);
                            }
                            http::post(address, &path).await
                        };
                        self.request(&self.ctx.pod_posts, &self.own_post, deadline, send)
                            .await
                    }
                };
                if let Err(refused) = &answer {
                    count(self.ctx, refused);
                    debug!(pod = %name, ?address, %path, error = %refused, "worker not asked");
                }
                (name, answer)
            })
            .buffer_unordered(REQUESTS_IN_FLIGHT)
            .collect()
            .await
    }

    /// Sets each named worker's deletion cost (a merge patch of that one annotation: a Pod is
    /// its ReplicaSet's, not ours to apply; the chart's admission policy allows no more);
    /// returns how many were tried. A failure is logged: a shrink goes ahead without it.
    pub(in crate::controller) async fn set_deletion_costs(
        &self,
        changes: Vec<(String, i32)>,
    ) -> usize {
        let patches = changes
            .into_iter()
            .map(|(name, cost)| {
                let patch = serde_json::json!({
                    "metadata": {"annotations": {DELETION_COST: cost.to_string()}},
                });
                (name, patch)
            })
            .collect();
        self.patch_each(
            patches,
            PodPart::Metadata,
            "annotating",
            "deletion cost not set",
        )
        .await
    }

    /// Patches each named Pod's `part` (metadata: a merge patch; status: a strategic one, so a
    /// condition merges by its type), at most [`PATCHES_IN_FLIGHT`] at once, each through the
    /// fence and the write timeout; returns how many were tried. A failure is logged as
    /// `failed`: the next reconcile tries again.
    pub(in crate::controller) async fn patch_each(
        &self,
        patches: Vec<(String, serde_json::Value)>,
        part: PodPart,
        doing: &str,
        failed: &str,
    ) -> usize {
        let pods: Api<Pod> = Api::namespaced(self.ctx.client.clone(), &self.namespace);
        let params = PatchParams::default();
        let (pods, params) = (&pods, &params);
        futures::stream::iter(patches)
            .map(|(name, patch)| async move {
                let send = async {
                    match part {
                        PodPart::Metadata => pods
                            .patch_metadata(&name, params, &Patch::Merge(&patch))
                            .await
                            .map(drop),
                        PodPart::Status => pods
                            .patch_status(&name, params, &Patch::Strategic(&patch))
                            .await
                            .map(drop),
                    }
                };
                let result = self.ctx.write(format!("{doing} Pod {name}"), send).await;
                if let Err(error) = result {
                    warn!(pod = %name, %error, "{failed}");
                }
            })
            .buffer_unordered(PATCHES_IN_FLIGHT)
            .count()
            .await
    }
}
