//! The requests every asking stage sends: a `POST` to workers (the drain and stand-in requests of
//! `drain.rs` and `stand_in.rs`) through the context's client (`worker_http.rs`), and the patches
//! of the pool's Pods (the deletion costs of `drain.rs` and `rank.rs`, the readiness gates of
//! `takeover.rs`) through the context's fenced, bounded write.

use std::sync::atomic::Ordering;

use futures::StreamExt;
use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, Patch, PatchParams};
use tracing::{debug, warn};

use crate::controller::pods::{POD_BUDGET, PoolPods, REQUESTS_IN_FLIGHT, Worker};
use crate::controller::protocol::DELETION_COST;
use crate::controller::worker_http::Refused;

/// The part of a Pod a patch writes.
#[derive(Clone, Copy)]
pub(in crate::controller) enum PodPart {
    Metadata,
    Status,
}

/// Most Pod patches in flight at once for one Deployment.
const PATCHES_IN_FLIGHT: usize = 8;

impl PoolPods<'_> {
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
                            self.post_with_credential(address, &path).await
                        };
                        self.ctx
                            .ask_worker(&self.ctx.pod_posts, &self.own_post, deadline, send)
                            .await
                    }
                };
                if let Err(refused) = &answer {
                    self.ctx.count_rejected(refused);
                    debug!(pod = %name, ?address, %path, error = %refused, "worker not asked");
                }
                (name, answer)
            })
            .buffer_unordered(REQUESTS_IN_FLIGHT)
            .collect()
            .await
    }

    /// One request with the pool's credential: the current token, then (to a worker that answers
    /// 401, its Secret's file not refreshed yet) the one before a recent rotation. A 401 to every
    /// token is [`Refused::Unauthorized`]: the worker's state is unknown, never a refusal.
    async fn post_with_credential(
        &self,
        address: &str,
        path: &str,
    ) -> Result<(u16, String), Refused> {
        let credential = self.credential.get().ok_or(Refused::NoCredential)?;
        for token in credential.tokens() {
            match self.ctx.worker_http.post(address, path, token).await? {
                (401, _) => continue,
                answer => return Ok(answer),
            }
        }
        self.refused_credential.store(true, Ordering::Relaxed);
        Err(Refused::Unauthorized)
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
