//! Writing the pool's Deployments: server-side apply of the counts the rollout gives (skipped when
//! nothing would change), restoring replicas someone else changed, removing Deployments of lanes
//! that lost their reserve, and spotting an autoscaler that fights the operator over `replicas`.

use std::collections::BTreeMap;

use k8s_openapi::api::apps::v1::Deployment;
use kube::ResourceExt;
use kube::api::{Api, DeleteParams, Patch, PatchParams};
use kube::runtime::events::EventType;
use tracing::info;

use crate::api::LanePool;
use crate::controller::context::Context;
use crate::controller::deployments::{
    TEMPLATE_HASH, counts_by_name, owned_by, spec_replicas, template_json, worker_deployments,
};
use crate::controller::settings::MANAGER;
use crate::sizing::Replicas;
use crate::{Error, Result};

/// One reconcile's writes to the pool's Deployments.
pub(in crate::controller) struct Deployments<'a> {
    pool: &'a LanePool,
    ctx: &'a Context,
    api: Api<Deployment>,
    /// As the watch cache has them.
    live: &'a BTreeMap<String, Deployment>,
    /// The pool's names the cache lacks, as the API server had them (`observe/deployments.rs`).
    not_cached: &'a BTreeMap<String, Option<Deployment>>,
    /// What this process applied last (after a restart, what was recorded).
    applied: Option<Replicas>,
}

impl<'a> Deployments<'a> {
    pub(in crate::controller) fn new(
        pool: &'a LanePool,
        ctx: &'a Context,
        live: &'a BTreeMap<String, Deployment>,
        not_cached: &'a BTreeMap<String, Option<Deployment>>,
        applied: Option<Replicas>,
    ) -> Self {
        let api = Api::namespaced(ctx.client.clone(), &pool.namespace().unwrap_or_default());
        Self {
            pool,
            ctx,
            api,
            live,
            not_cached,
            applied,
        }
    }

    /// Applies `replicas` (see [`apply_deployments`]).
    pub(in crate::controller) async fn apply(&self, replicas: &Replicas) -> Result<()> {
        let (pool, ctx, api) = (self.pool, self.ctx, &self.api);
        let existing = (self.live, self.not_cached);
        apply_deployments(pool, ctx, api, existing, replicas, self.applied.as_ref()).await
    }

    /// Removes the Deployments of lanes gone (`leave`) whose workers may go now; the others
    /// that no lane runs keep their workers until their shrink may go.
    pub(in crate::controller) async fn remove(&self, leave: &[String]) -> Result<()> {
        for name in leave {
            let Some(deployment) = self.live.get(name) else {
                continue;
            };
            if !owned_by(self.pool, deployment) {
                continue;
            }
            self.ctx
                .write(
                    format!("deleting Deployment {name}"),
                    self.api.delete(name, &DeleteParams::default()),
                )
                .await?;
            info!(deployment = %name, "removed: no lane runs it any more");
        }
        Ok(())
    }
}

/// Applies the pool's Deployments at `replicas` over the `existing` ones (the cache's, and what
/// the API server had under the names the cache lacks); `applied` is what this operator set
/// last, so that a count someone else set is reported as restored.
async fn apply_deployments(
    pool: &LanePool,
    ctx: &Context,
    deployments: &Api<Deployment>,
    (existing, not_cached): (
        &BTreeMap<String, Deployment>,
        &BTreeMap<String, Option<Deployment>>,
    ),
    replicas: &Replicas,
    applied: Option<&Replicas>,
) -> Result<()> {
    let desired = worker_deployments(pool, replicas);
    // Nothing is written over a Deployment that is not this pool's: check every name first.
    for deployment in &desired {
        let name = deployment.name_any();
        let found = existing
            .get(&name)
            .or_else(|| not_cached.get(&name).and_then(Option::as_ref));
        if let Some(found) = found
            && !owned_by(pool, found)
        {
            return Err(Error::NameConflict {
                name,
                owner: owner_of(found),
            });
        }
    }
    // What this operator set last, by Deployment name: a count that differs from both this and
    // the new decision was set by someone else.
    let before = counts_by_name(pool, applied);
    let params = PatchParams::apply(MANAGER).force();
    let mut writes = Vec::new();
    for deployment in &desired {
        let name = deployment.name_any();
        let want = spec_replicas(deployment).unwrap_or(0);
        let found = existing.get(&name).and_then(spec_replicas);
        let last = before.get(&name).copied();
        if let (Some(found), Some(last)) = (found, last)
            && found != last
            && found != want
        {
            ctx.event(
                pool,
                EventType::Normal,
                "ReplicasRestored",
                format!("Deployment {name} was scaled to {found} by someone else; lanepool owns its replicas and set {want}"),
            )
            .await;
        }
        if existing.contains_key(&name)
            && found == Some(want)
            && same_template(&existing[&name], deployment)
            && template_kept(&existing[&name], deployment)
        {
            continue;
        }
        let params = &params;
        writes.push(async move {
            ctx.write(
                format!("applying Deployment {name}"),
                deployments.patch(&name, params, &Patch::Apply(deployment)),
            )
            .await?;
            if found != Some(want) {
                info!(deployment = %name, from = ?found, to = want, "scaled");
            }
            Ok::<_, Error>(())
        });
    }
    // The Deployments are independent objects: their writes go out together.
    futures::future::try_join_all(writes).await?;
    Ok(())
}

/// Who a Deployment belongs to, for the NameConflict message.
fn owner_of(deployment: &Deployment) -> String {
    let owners: Vec<String> = deployment
        .owner_references()
        .iter()
        .map(|o| format!("{} {} (uid {})", o.kind, o.name, o.uid))
        .collect();
    if owners.is_empty() {
        "it has no owner".into()
    } else {
        format!("owned by {}", owners.join(", "))
    }
}

/// Whether the live pod template still holds every value this operator sets: `kubectl set
/// image` or `kubectl edit` change the template without touching the hash annotation. Fields the
/// API server fills in (defaults) are not ours and do not count.
fn template_kept(found: &Deployment, desired: &Deployment) -> bool {
    match (template_json(found), template_json(desired)) {
        (Some(live), Some(ours)) => covers(&live, &ours),
        _ => false,
    }
}

/// Whether `live` has every value of `ours`: objects key by key, lists item by item, anything
/// else equal. What another field manager added (a sidecar container) is not drift: applying
/// again would not remove it.
fn covers(live: &serde_json::Value, ours: &serde_json::Value) -> bool {
    use serde_json::Value;
    match (live, ours) {
        (Value::Object(live), Value::Object(ours)) => ours
            .iter()
            .all(|(key, value)| live.get(key).is_some_and(|l| covers(l, value))),
        (Value::Array(live), Value::Array(ours)) => {
            live.len() >= ours.len() && live.iter().zip(ours).all(|(l, o)| covers(l, o))
        }
        (live, ours) => live == ours,
    }
}

/// Whether a Deployment already carries the template we would apply (by its hash annotation).
/// Saves a write per Deployment on every event.
fn same_template(found: &Deployment, desired: &Deployment) -> bool {
    let hash = |d: &Deployment| d.metadata.annotations.as_ref()?.get(TEMPLATE_HASH).cloned();
    hash(found).is_some() && hash(found) == hash(desired)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn defaults_added_by_the_api_server_are_not_drift_and_a_changed_value_is() {
        let ours = json!({"spec": {"containers": [{"name": "w", "image": "worker:1"}]}});
        let defaulted = json!({"spec": {"containers": [{"name": "w", "image": "worker:1",
            "imagePullPolicy": "IfNotPresent", "terminationMessagePath": "/dev/termination-log"}],
            "restartPolicy": "Always"}});
        assert!(covers(&defaulted, &ours));
        let set_image = json!({"spec": {"containers": [{"name": "w", "image": "worker:2"}]}});
        assert!(!covers(&set_image, &ours));
        let sidecar = json!({"spec": {"containers": [{"name": "w", "image": "worker:1"},
            {"name": "debug", "image": "busybox"}]}});
        assert!(
            covers(&sidecar, &ours),
            "applying again would not remove it"
        );
        let removed = json!({"spec": {"containers": []}});
        assert!(!covers(&removed, &ours));
    }
}
