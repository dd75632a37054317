//! Applying a decision: server-side apply of the pool's Deployments (skipped when nothing would
//! change), restoring replicas someone else changed, removing Deployments of lanes that lost their
//! reserve, and spotting an autoscaler that fights the operator over `replicas`.

use std::collections::BTreeMap;

use k8s_openapi::api::apps::v1::Deployment;
use kube::ResourceExt;
use kube::api::{Api, DeleteParams, Patch, PatchParams};
use kube::runtime::events::EventType;
use tracing::info;

use super::context::{Context, MANAGER};
use super::drain::Shrink;
use super::surge;
use super::workers::{
    Role, TEMPLATE_HASH, pool_roles, spec_replicas, template_json, worker_deployments,
};
use crate::api::LanePool;
use crate::sizing::Replicas;
use crate::{Error, Result};

/// Replica counts by Deployment name; empty without counts.
fn counts_by_name(pool: &LanePool, replicas: Option<&Replicas>) -> BTreeMap<String, i32> {
    replicas
        .map(|r| pool_roles(pool, r))
        .unwrap_or_default()
        .into_iter()
        .map(|(name, _, count)| (name, count))
        .collect()
}

fn ready_replicas(deployment: &Deployment) -> i32 {
    deployment
        .status
        .as_ref()
        .and_then(|s| s.ready_replicas)
        .unwrap_or(0)
}

/// The counts to apply now on the way to `decided`.
pub(super) struct SurgeStep {
    pub(super) replicas: Replicas,
    pub(super) waiting: bool,
    /// The Deployments `decided` shrinks, whether or not the surge lets them shrink yet.
    pub(super) shrinks: Vec<Shrink>,
}

/// Where the Deployments are on the way to `decided`: see [`surge::step`]. A shrink starts from
/// what this process applied last (`own`), so a count someone else set is restored at once
/// rather than waited on; after a restart, from the Deployments.
pub(super) fn surge_step(
    pool: &LanePool,
    existing: &BTreeMap<String, Deployment>,
    decided: &Replicas,
    own: Option<&Replicas>,
    waited: Option<std::time::Duration>,
    timeout: std::time::Duration,
) -> SurgeStep {
    let roles = pool_roles(pool, decided);
    let own = counts_by_name(pool, own);
    let counts: Vec<surge::Counts> = roles
        .iter()
        .map(|(name, _, target)| {
            let deployment = existing.get(name);
            surge::Counts {
                target: *target,
                live: deployment
                    .and(own.get(name).copied())
                    .or_else(|| deployment.and_then(spec_replicas)),
                ready: deployment.map_or(0, ready_replicas),
            }
        })
        .collect();
    let step = surge::step(&counts, waited, timeout);
    let selectors: BTreeMap<String, String> = worker_deployments(pool, decided)
        .iter()
        .map(|d| (d.name_any(), selector_of(d)))
        .collect();
    let shrinks = roles
        .iter()
        .zip(&counts)
        .filter_map(|((name, role, _), c)| {
            let live = c.live.filter(|live| c.target < *live)?;
            Some(Shrink {
                deployment: name.clone(),
                selector: selectors.get(name).cloned().unwrap_or_default(),
                live,
                to: c.target,
                lanes: match role {
                    Role::Reserved { lane } => vec![lane.clone()],
                    Role::Shared => pool.spec.lanes.iter().map(|l| l.name.clone()).collect(),
                },
            })
        })
        .collect();
    let mut replicas = decided.clone();
    for ((_, role, _), count) in roles.iter().zip(step.apply) {
        match role {
            Role::Reserved { lane } => {
                replicas.reserved.insert(lane.clone(), count);
            }
            Role::Shared => replicas.shared = count,
        }
    }
    SurgeStep {
        replicas,
        waiting: step.waiting,
        shrinks,
    }
}

/// A Deployment's Pod selector, `key=value,…`.
fn selector_of(deployment: &Deployment) -> String {
    let labels = deployment
        .spec
        .as_ref()
        .and_then(|s| s.selector.match_labels.clone())
        .unwrap_or_default();
    let selector: Vec<String> = labels.iter().map(|(k, v)| format!("{k}={v}")).collect();
    selector.join(",")
}

/// The Deployments that `replicas` shrinks, each with its Pods' label selector.
pub(super) fn shrinking(
    pool: &LanePool,
    existing: &BTreeMap<String, Deployment>,
    replicas: &Replicas,
) -> Vec<(String, String)> {
    worker_deployments(pool, replicas)
        .iter()
        .filter(|desired| {
            let live = existing.get(&desired.name_any()).and_then(spec_replicas);
            live.is_some_and(|live| spec_replicas(desired).unwrap_or(0) < live)
        })
        .map(|desired| (desired.name_any(), selector_of(desired)))
        .collect()
}

/// `replicas` with every shrinking Deployment kept at its live count: the growth alone.
pub(super) fn hold_shrinks(
    pool: &LanePool,
    existing: &BTreeMap<String, Deployment>,
    replicas: &Replicas,
) -> Replicas {
    hold(pool, existing, replicas, |_| true)
}

/// `replicas` with the shrinking Deployments that `held_back` names kept at their live counts.
pub(super) fn hold(
    pool: &LanePool,
    existing: &BTreeMap<String, Deployment>,
    replicas: &Replicas,
    held_back: impl Fn(&str) -> bool,
) -> Replicas {
    let mut held = replicas.clone();
    for (name, role, count) in pool_roles(pool, replicas) {
        let Some(live) = existing.get(&name).and_then(spec_replicas) else {
            continue;
        };
        if count < live && held_back(&name) {
            match role {
                Role::Reserved { lane } => {
                    held.reserved.insert(lane, live);
                }
                Role::Shared => held.shared = live,
            }
        }
    }
    held
}

pub(super) async fn apply_deployments(
    pool: &LanePool,
    ctx: &Context,
    deployments: &Api<Deployment>,
    existing: &BTreeMap<String, Deployment>,
    replicas: &Replicas,
    applied: Option<&Replicas>,
) -> Result<()> {
    let desired = worker_deployments(pool, replicas);
    // Nothing is written over a Deployment that is not this pool's: check every name first.
    for deployment in &desired {
        let name = deployment.name_any();
        let found = match existing.get(&name) {
            Some(found) => Some(found.clone()),
            None => {
                ctx.read(
                    format!("reading Deployment {name}"),
                    deployments.get_opt(&name),
                )
                .await?
            }
        };
        if let Some(found) = found
            && !owned_by(pool, &found)
        {
            return Err(Error::NameConflict {
                name,
                owner: owner_of(&found),
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
    // A lane that lost its reserve, or was renamed, leaves a Deployment behind: remove it.
    for (name, deployment) in existing {
        if owned_by(pool, deployment) && !desired.iter().any(|d| d.name_any() == *name) {
            ctx.write(
                format!("deleting Deployment {name}"),
                deployments.delete(name, &DeleteParams::default()),
            )
            .await?;
        }
    }
    Ok(())
}

/// Whether this pool (this very object, by uid) controls the Deployment.
fn owned_by(pool: &LanePool, deployment: &Deployment) -> bool {
    let uid = pool.uid().unwrap_or_default();
    deployment
        .owner_references()
        .iter()
        .any(|o| o.uid == uid && o.controller == Some(true))
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

pub(super) fn autoscaler_conflict(
    pool: &LanePool,
    ctx: &Context,
    namespace: &str,
) -> Result<Option<String>> {
    let autoscalers = ctx.autoscalers(namespace);
    let ours = pool_roles(pool, &Replicas::default());
    Ok(autoscalers.iter().find_map(|hpa| {
        let target = &hpa.spec.as_ref()?.scale_target_ref;
        let (name, _, _) = ours
            .iter()
            .find(|(name, _, _)| target.kind == "Deployment" && *name == target.name)?;
        Some(format!(
            "HorizontalPodAutoscaler {} targets Deployment {name}: lanepool owns its replicas and undoes the autoscaler's changes; delete the autoscaler",
            hpa.name_any(),
        ))
    }))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn growth_is_applied_alone_before_the_shrinking_deployments_pods_are_ranked() {
        let mut pool: LanePool =
            serde_yaml::from_str(include_str!("../../examples/lanepool.yaml")).unwrap();
        pool.metadata.namespace = Some("team".into());
        let live = Replicas {
            reserved: BTreeMap::from([("urgent".into(), 1)]),
            shared: 9,
        };
        let existing: BTreeMap<String, Deployment> = worker_deployments(&pool, &live)
            .into_iter()
            .map(|d| (d.name_any(), d))
            .collect();
        let target = Replicas {
            reserved: BTreeMap::from([("urgent".into(), 3)]),
            shared: 7,
        };
        let held = hold_shrinks(&pool, &existing, &target);
        assert_eq!(held.reserved["urgent"], 3, "the reserve grows at once");
        assert_eq!(held.shared, 9, "shared waits for the ranking");
        let shrinking = shrinking(&pool, &existing, &target);
        assert_eq!(shrinking.len(), 1);
        assert_eq!(shrinking[0].0, "jobs-shared");
        assert_eq!(
            shrinking[0].1,
            "lanepool.dev/pool=jobs,lanepool.dev/role=shared"
        );
    }

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
