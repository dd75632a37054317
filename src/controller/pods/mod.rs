//! Everything that talks to worker Pods: their `/metrics` answers (counts for the reads, gauges
//! for the idle-first ranking) and drain requests, all through one client that follows no
//! redirect and reads capped answers (`http.rs`). What a Pod answers is never trusted beyond
//! those caps, and a refused answer is an answer not given.

mod http;
mod owners;

use std::time::Duration;

use futures::StreamExt;
use k8s_openapi::api::apps::v1::{Deployment, ReplicaSet};
use k8s_openapi::api::core::v1::Pod;
use kube::ResourceExt;
use kube::api::{Api, ListParams, Patch, PatchParams};
use tokio::sync::OnceCell;
use tracing::{debug, warn};

use super::context::{Context, POD_REQUESTS_IN_FLIGHT};
use super::idle_first::{DELETION_COST, PATCHES_IN_FLIGHT, metrics_address};
use crate::api::{LanePool, POOL_LABEL};
pub(crate) use http::Refused;
use owners::{Owners, PoolDeployments, pool_deployments};

/// One reconcile's view of one pool's Pods: only its own workers (see `owners.rs`) are ever
/// read, asked to drain or annotated, and all of it within one deadline.
pub(super) struct PoolPods<'a> {
    ctx: &'a Context,
    deadline: tokio::time::Instant,
    namespace: String,
    pool: String,
    deployments: PoolDeployments,
    /// The pool's ReplicaSets, listed at most once per reconcile, when first needed. (One LIST
    /// per reconcile per pool by the pool's label for now; a watch cache of ReplicaSets'
    /// metadata, as the Deployments have, is the next step.)
    owners: OnceCell<Owners>,
}

impl<'a> PoolPods<'a> {
    /// The Pods of `pool`, whose Deployments are among `existing` (the watch cache's), asked
    /// for at most `budget` from now.
    pub(super) fn new<'d>(
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
            owners: OnceCell::new(),
        }
    }

    async fn owners(&self) -> crate::Result<&Owners> {
        self.owners
            .get_or_try_init(|| async {
                let replicasets: Api<ReplicaSet> =
                    Api::namespaced(self.ctx.client.clone(), &self.namespace);
                // From the API server's cache (resourceVersion 0), metadata only.
                let params = ListParams::default()
                    .labels(&format!("{POOL_LABEL}={}", self.pool))
                    .match_any();
                let listed = self
                    .ctx
                    .read(
                        format!("listing the ReplicaSets of pool {}", self.pool),
                        replicasets.list_metadata(&params),
                    )
                    .await?;
                Ok(Owners::new(
                    &self.deployments,
                    listed.items.iter().map(|rs| &rs.metadata),
                ))
            })
            .await
    }

    /// The live (not terminating) workers of the pool among the Pods `params` lists, with the
    /// name of the Deployment each is a worker of; a Pod that is not the pool's worker, however
    /// it is labelled, is left out. `whose` names them in an error.
    pub(super) async fn workers(
        &self,
        whose: &str,
        params: &ListParams,
    ) -> crate::Result<Vec<(Pod, String)>> {
        if self.deployments.is_empty() {
            return Ok(Vec::new());
        }
        let pods: Api<Pod> = Api::namespaced(self.ctx.client.clone(), &self.namespace);
        let action = format!("listing the Pods of {whose}");
        let both = futures::future::join(
            self.ctx.read(action.clone(), pods.list(params)),
            self.owners(),
        );
        let Ok((listed, owners)) = tokio::time::timeout_at(self.deadline, both).await else {
            let seconds = POD_BUDGET.as_secs();
            return Err(crate::Error::Timeout { action, seconds });
        };
        let owners = owners?;
        Ok(listed?
            .items
            .into_iter()
            .filter(|p| p.metadata.deletion_timestamp.is_none())
            .filter_map(|p| {
                let deployment = owners.deployment_of(&p)?.to_string();
                Some((p, deployment))
            })
            .collect())
    }

    /// The live workers of the pool's Deployment `deployment`, among the Pods of `selector`.
    pub(super) async fn workers_of(
        &self,
        deployment: &str,
        selector: &str,
    ) -> crate::Result<Vec<Pod>> {
        let params = ListParams::default().labels(selector);
        let workers = self
            .workers(&format!("Deployment {deployment}"), &params)
            .await?;
        Ok(workers
            .into_iter()
            .filter(|(_, of)| of == deployment)
            .map(|(pod, _)| pod)
            .collect())
    }
}

/// Most requests to one pool's Pods in flight at once (a pool has one reconcile at a time, and
/// it asks its Pods one step after another): a quarter of the operator's
/// [`POD_REQUESTS_IN_FLIGHT`], so one pool's silent Pods never hold every slot.
const REQUESTS_IN_FLIGHT: usize = POD_REQUESTS_IN_FLIGHT / 4;
/// The most one reconcile spends on its pool's Pods, lists and requests together (less when the
/// measurement's deadline is shorter): a healthy worker answers in milliseconds, and silent ones
/// cost their pool this, however many there are.
pub(super) const POD_BUDGET: Duration = Duration::from_secs(1);

/// How long a reconcile of a pool measured every `interval` may spend on its Pods: within the
/// measurement's deadline, at most [`POD_BUDGET`].
pub(super) fn budget(interval: Duration) -> Duration {
    super::measure::deadline(interval).min(POD_BUDGET)
}

/// Counts a refusal a Pod chose (an answer too large, a redirect) in `worker_reads_rejected`.
fn count(ctx: &Context, refused: &Refused) {
    if let Some(reason) = refused.rejected_reason() {
        ctx.metrics.worker_read_rejected(reason);
    }
}

impl PoolPods<'_> {
    /// One request, once the operator has a slot for it, within the reconcile's deadline.
    async fn request<T, F>(&self, send: impl FnOnce() -> F) -> Result<T, Refused>
    where
        F: Future<Output = Result<T, Refused>>,
    {
        let sent = async {
            let _slot = self
                .ctx
                .pod_requests
                .acquire()
                .await
                .map_err(|_| Refused::OutOfTime)?;
            send().await
        };
        tokio::time::timeout_at(self.deadline, sent)
            .await
            .unwrap_or(Err(Refused::OutOfTime))
    }

    /// Each of `pods` that has a metrics port asked for its `/metrics` text, at most
    /// [`REQUESTS_IN_FLIGHT`] at once: (pod name, text) of those that answered in time.
    pub(super) async fn metrics_texts(&self, pods: &[&Pod]) -> Vec<(String, String)> {
        let targets: Vec<(String, String)> = pods
            .iter()
            .filter_map(|pod| Some((pod.name_any(), metrics_address(pod)?)))
            .collect();
        futures::stream::iter(targets)
            .map(|(name, address)| async move {
                match self.request(|| http::get(&address, "/metrics")).await {
                    Ok(text) => Some((name, text)),
                    Err(refused) => {
                        count(self.ctx, &refused);
                        debug!(pod = %name, %address, error = %refused, "worker did not answer");
                        None
                    }
                }
            })
            .buffer_unordered(REQUESTS_IN_FLIGHT)
            .filter_map(std::future::ready)
            .collect()
            .await
    }

    /// `POST /drain?seconds={seconds}` to each of `pods` at its metrics address: (pod name, the
    /// status and text of its answer, or why there is none).
    pub(super) async fn post_drains(
        &self,
        pods: Vec<(String, String, u64)>,
    ) -> Vec<(String, Result<(u16, String), Refused>)> {
        futures::stream::iter(pods)
            .map(|(name, address, seconds)| async move {
                let path = format!("/drain?seconds={seconds}");
                let answer = self.request(|| http::post(&address, &path)).await;
                if let Err(refused) = &answer {
                    count(self.ctx, refused);
                    debug!(pod = %name, %address, error = %refused, "worker not asked to drain");
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
    pub(super) async fn set_deletion_costs(&self, changes: Vec<(String, i32)>) -> usize {
        let pods: Api<Pod> = Api::namespaced(self.ctx.client.clone(), &self.namespace);
        let params = PatchParams::default();
        futures::stream::iter(changes)
            .map(|(name, cost)| {
                let (pods, params) = (&pods, &params);
                async move {
                    let patch = serde_json::json!({
                        "metadata": {"annotations": {DELETION_COST: cost.to_string()}},
                    });
                    let result = self
                        .ctx
                        .write(
                            format!("annotating Pod {name}"),
                            pods.patch_metadata(&name, params, &Patch::Merge(&patch)),
                        )
                        .await;
                    if let Err(error) = result {
                        warn!(pod = %name, %error, "deletion cost not set");
                    }
                }
            })
            .buffer_unordered(PATCHES_IN_FLIGHT)
            .count()
            .await
    }
}
