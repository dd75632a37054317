//! The LanePool controller. Each reconcile is a short pipeline: **read** the pool and its
//! Deployments; **validate** the spec into sizing settings; **measure** the reserve lanes in
//! Prometheus (only when the interval has passed or the spec changed: Deployment events in
//! between re-apply the last decision without querying); **decide** with the pure sizing
//! decision; **apply** the Deployments by server-side apply, restoring replicas anyone else
//! changed; **report** status (only when it changed), conditions and events. Only `decide` is
//! free of I/O. Errors the CRD cannot catch (a missing Secret, a template the API server
//! refuses) set Ready=False and are retried with backoff, without touching other pools.

mod measure;
mod status;
mod workers;

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use futures::StreamExt;
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::autoscaling::v2::HorizontalPodAutoscaler;
use k8s_openapi::api::core::v1::Secret;
use k8s_openapi::jiff::Timestamp;
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams};
use kube::runtime::controller::{Action, Controller};
use kube::runtime::events::{Event, EventType, Recorder, Reporter};
use kube::runtime::reflector::ObjectRef;
use kube::runtime::watcher;
use kube::{Client, Resource, ResourceExt};
use tracing::{info, warn};

pub use measure::{Connection, LaneQueries, QueryWindows, pool_queries};
pub use workers::{
    LANES_ENV, POOL_ENV, ROLE_ENV, Role, TEMPLATE_HASH, deployment_name, worker_deployments,
};

use crate::api::{LanePool, POOL_LABEL};
use crate::metrics::Metrics;
use crate::sizing::{Decision, History, Inputs, LaneLoad, PoolSizing, Replicas, decide};
use crate::{Error, Result};
use status::Observed;

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
}

/// What one pool's reconciles remember between runs.
#[derive(Clone, Debug, Default)]
struct PoolMemory {
    history: History,
    measured_at: Option<Duration>,
    generation: Option<i64>,
    replicas: Option<Replicas>,
    failures: u32,
}

/// Shared state of the controller.
pub struct Context {
    pub client: Client,
    pub recorder: Recorder,
    pub metrics: Arc<Metrics>,
    pub settings: Settings,
    started: Instant,
    pools: Mutex<HashMap<ObjectRef<LanePool>, PoolMemory>>,
    prometheus: Mutex<HashMap<Connection, prometheus_http_query::Client>>,
}

impl Context {
    pub fn new(client: Client, metrics: Arc<Metrics>, settings: Settings) -> Self {
        let reporter = Reporter {
            controller: "lanepool".into(),
            instance: std::env::var("POD_NAME").ok(),
        };
        Self {
            recorder: Recorder::new(client.clone(), reporter),
            client,
            metrics,
            settings,
            started: Instant::now(),
            pools: Mutex::default(),
            prometheus: Mutex::default(),
        }
    }

    fn memory(&self, key: &ObjectRef<LanePool>) -> PoolMemory {
        self.pools
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get(key)
            .cloned()
            .unwrap_or_default()
    }

    fn remember(&self, key: ObjectRef<LanePool>, update: impl FnOnce(&mut PoolMemory)) {
        let mut pools = self.pools.lock().unwrap_or_else(|p| p.into_inner());
        update(pools.entry(key).or_default());
    }

    /// Runs a write with the timeout and counts its result.
    async fn write<T>(
        &self,
        action: impl Into<String>,
        request: impl Future<Output = kube::Result<T>>,
    ) -> Result<T> {
        let action = action.into();
        match tokio::time::timeout(self.settings.write_timeout, request).await {
            Ok(Ok(value)) => {
                self.metrics.wrote("success");
                Ok(value)
            }
            Ok(Err(source)) => {
                self.metrics.wrote("failure");
                Err(Error::Kube { action, source })
            }
            Err(_) => {
                self.metrics.wrote("timeout");
                Err(Error::Timeout {
                    action,
                    seconds: self.settings.write_timeout.as_secs(),
                })
            }
        }
    }

    async fn event(&self, pool: &LanePool, type_: EventType, reason: &str, note: String) {
        // The recorder merges events with the same reason and action into one series and keeps
        // the first note; so the action carries the note, and only identical events merge.
        let action: String = note.chars().take(128).collect();
        let event = Event {
            type_,
            reason: reason.into(),
            note: Some(note),
            action,
            secondary: None,
        };
        if let Err(error) = self.recorder.publish(&event, &pool.object_ref(&())).await {
            warn!(%error, "could not publish an event");
        }
    }
}

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
    let controllers = scopes.into_iter().map(|namespace| {
        let client = ctx.client.clone();
        let (pools, deployments): (Api<LanePool>, Api<Deployment>) = match &namespace {
            Some(ns) => (
                Api::namespaced(client.clone(), ns),
                Api::namespaced(client, ns),
            ),
            None => (Api::all(client.clone()), Api::all(client)),
        };
        Controller::new(pools, watcher::Config::default())
            .owns(deployments, watcher::Config::default().labels(POOL_LABEL))
            .graceful_shutdown_on(shutdown.clone())
            .run(reconcile, error_policy, ctx.clone())
            .for_each(|result| async move {
                if let Err(error) = result {
                    warn!(%error, "reconcile failed");
                }
            })
    });
    futures::future::join_all(controllers).await;
}

/// One reconcile of one LanePool.
pub async fn reconcile(pool: Arc<LanePool>, ctx: Arc<Context>) -> Result<Action> {
    let started = Instant::now();
    let namespace = pool.namespace().unwrap_or_default();
    let name = pool.name_any();
    match reconcile_pool(&pool, &ctx).await {
        Ok(action) => {
            ctx.remember(ObjectRef::from_obj(&*pool), |m| m.failures = 0);
            ctx.metrics.reconciled(&namespace, &name, started.elapsed());
            Ok(action)
        }
        Err(error) => {
            report_failure(&pool, &ctx, &error).await;
            Err(error)
        }
    }
}

/// Counts the failure and retries with exponential backoff: 5 s, 10 s, … up to 5 minutes.
pub fn error_policy(pool: Arc<LanePool>, error: &Error, ctx: Arc<Context>) -> Action {
    ctx.metrics.reconcile_failed(error.metric_label());
    let key = ObjectRef::from_obj(&*pool);
    let mut failures = 0;
    ctx.remember(key, |m| {
        m.failures = m.failures.saturating_add(1);
        failures = m.failures;
    });
    let backoff = Duration::from_secs(5 * 2u64.saturating_pow(failures.saturating_sub(1).min(6)))
        .min(Duration::from_secs(300));
    warn!(pool = %pool.name_any(), %error, ?backoff, "reconcile failed; retrying");
    Action::requeue(backoff)
}

async fn reconcile_pool(pool: &LanePool, ctx: &Context) -> Result<Action> {
    let namespace = pool.namespace().unwrap_or_default();
    let name = pool.name_any();
    let key = ObjectRef::from_obj(pool);
    let interval = pool.spec.interval.get().map_err(|source| Error::Duration {
        field: "spec.interval".into(),
        source,
    })?;
    let old_status = pool.status.clone().unwrap_or_default();

    if pool.spec.paused {
        let observed = [Observed::new(
            status::PAUSED,
            true,
            "Paused",
            "spec.paused is true: the Deployments are left alone",
        )];
        let mut new = old_status.clone();
        new.conditions = status::merge_conditions(
            &old_status.conditions,
            &observed,
            pool.metadata.generation,
            Timestamp::now(),
        );
        write_status(pool, ctx, &old_status, new).await?;
        return Ok(Action::requeue(interval));
    }

    let sizing = PoolSizing::from_spec(&pool.spec)?;
    let deployments: Api<Deployment> = Api::namespaced(ctx.client.clone(), &namespace);
    let existing: BTreeMap<String, Deployment> = ctx
        .write(
            format!("listing the Deployments of {namespace}/{name}"),
            deployments.list(&ListParams::default().labels(&format!("{POOL_LABEL}={name}"))),
        )
        .await?
        .into_iter()
        .map(|d| (d.name_any(), d))
        .collect();
    let now = ctx.started.elapsed();
    let memory = ctx.memory(&key);
    // What this process applied last; the status (possibly a step behind, from the watch
    // cache) or the Deployments only after a restart.
    let applied = memory
        .replicas
        .clone()
        .or_else(|| applied_replicas(pool, &old_status, &existing));
    let due = memory.replicas.is_none()
        || memory.generation != pool.metadata.generation
        || memory
            .measured_at
            .is_none_or(|at| now.saturating_sub(at) + interval / 10 >= interval);
    let decision = if due {
        let loads = measure_pool(pool, ctx).await?;
        let decision = decide(
            &sizing,
            Inputs {
                loads: &loads,
                current: applied.as_ref(),
                history: &memory.history,
                now,
            },
        );
        let replicas = decision.replicas();
        let history = decision.history.clone();
        ctx.remember(key.clone(), |m| {
            m.history = history;
            m.measured_at = Some(now);
            m.generation = pool.metadata.generation;
            m.replicas = Some(replicas);
        });
        Some(decision)
    } else {
        None
    };
    let replicas = match &decision {
        Some(decision) => decision.replicas(),
        None => memory.replicas.clone().unwrap_or_default(),
    };

    apply(
        pool,
        ctx,
        &deployments,
        &existing,
        &replicas,
        applied.as_ref(),
    )
    .await?;

    if let Some(decision) = decision {
        let hpa = autoscaler_conflict(pool, ctx, &namespace).await?;
        report(pool, ctx, &old_status, &decision, applied.as_ref(), hpa).await?;
    }
    let wait =
        interval.saturating_sub(now.saturating_sub(ctx.memory(&key).measured_at.unwrap_or(now)));
    Ok(Action::requeue(wait.max(Duration::from_secs(1))))
}

/// What the operator last applied: from the status when it has one, else from the Deployments.
fn applied_replicas(
    pool: &LanePool,
    status: &crate::api::LanePoolStatus,
    existing: &BTreeMap<String, Deployment>,
) -> Option<Replicas> {
    if status.observed_generation.is_some() && !status.lanes.is_empty() {
        return Some(Replicas {
            reserved: status
                .lanes
                .iter()
                .map(|l| (l.name.clone(), l.reserve))
                .collect(),
            shared: status.shared,
        });
    }
    let name = pool.name_any();
    let replicas_of = |role: &Role| {
        existing
            .get(&deployment_name(&name, role))
            .and_then(|d| d.spec.as_ref()?.replicas)
    };
    let shared = replicas_of(&Role::Shared)?;
    let reserved = pool
        .spec
        .reserve_lanes()
        .filter_map(|(lane, _)| {
            let role = Role::Reserved {
                lane: lane.name.clone(),
            };
            replicas_of(&role).map(|r| (lane.name.clone(), r))
        })
        .collect();
    Some(Replicas { reserved, shared })
}

async fn measure_pool(
    pool: &LanePool,
    ctx: &Context,
) -> Result<BTreeMap<String, std::result::Result<LaneLoad, String>>> {
    let queries = pool_queries(pool, &ctx.settings.windows)?;
    let Some(connection) = connection(pool, ctx).await? else {
        let reason =
            "no Prometheus URL: set spec.prometheus.url or the operator's --prometheus-url";
        return Ok(queries
            .iter()
            .map(|q| (q.lane.clone(), Err(reason.to_string())))
            .collect());
    };
    let client = {
        let mut clients = ctx.prometheus.lock().unwrap_or_else(|p| p.into_inner());
        match clients.get(&connection) {
            Some(client) => client.clone(),
            None => {
                let client = measure::client(&connection)?;
                clients.insert(connection, client.clone());
                client
            }
        }
    };
    Ok(measure::measure(&client, &queries, &ctx.metrics).await)
}

async fn connection(pool: &LanePool, ctx: &Context) -> Result<Option<Connection>> {
    let source = pool.spec.prometheus.clone().unwrap_or_default();
    let Some(url) = source
        .url
        .or_else(|| ctx.settings.default_prometheus_url.clone())
    else {
        return Ok(None);
    };
    let timeout = match &source.timeout {
        Some(t) => t.get().map_err(|e| Error::Duration {
            field: "spec.prometheus.timeout".into(),
            source: e,
        })?,
        None => Duration::from_secs(5),
    };
    let namespace = pool.namespace().unwrap_or_default();
    let secrets: Api<Secret> = Api::namespaced(ctx.client.clone(), &namespace);
    let read = |field: &'static str,
                selector: Option<k8s_openapi::api::core::v1::SecretKeySelector>| {
        let secrets = secrets.clone();
        async move {
            let Some(selector) = selector else {
                return Ok(None);
            };
            let missing = || Error::MissingSecret {
                field,
                name: selector.name.clone(),
                key: selector.key.clone(),
            };
            let secret = secrets
                .get_opt(&selector.name)
                .await
                .map_err(|source| Error::Kube {
                    action: format!("reading Secret {}", selector.name),
                    source,
                })?
                .ok_or_else(missing)?;
            let value = secret
                .data
                .and_then(|mut d| d.remove(&selector.key))
                .ok_or_else(missing)?;
            Ok::<_, Error>(Some(value.0))
        }
    };
    let token = read(
        "spec.prometheus.bearerTokenSecret",
        source.bearer_token_secret,
    )
    .await?;
    let ca_pem = read("spec.prometheus.caSecret", source.ca_secret).await?;
    Ok(Some(Connection {
        url,
        timeout,
        bearer_token: token.map(|t| String::from_utf8_lossy(&t).into_owned()),
        ca_pem,
        headers: source.headers,
    }))
}

async fn apply(
    pool: &LanePool,
    ctx: &Context,
    deployments: &Api<Deployment>,
    existing: &BTreeMap<String, Deployment>,
    replicas: &Replicas,
    applied: Option<&Replicas>,
) -> Result<()> {
    let desired = worker_deployments(pool, replicas);
    let params = PatchParams::apply(MANAGER).force();
    for deployment in &desired {
        let name = deployment.name_any();
        let want = deployment
            .spec
            .as_ref()
            .and_then(|s| s.replicas)
            .unwrap_or(0);
        let found = existing.get(&name).and_then(|d| d.spec.as_ref()?.replicas);
        let last = applied.and_then(|a| {
            if name == deployment_name(&pool.name_any(), &Role::Shared) {
                Some(a.shared)
            } else {
                a.reserved
                    .iter()
                    .find(|(lane, _)| {
                        name == deployment_name(
                            &pool.name_any(),
                            &Role::Reserved {
                                lane: (*lane).clone(),
                            },
                        )
                    })
                    .map(|(_, r)| *r)
            }
        });
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
        {
            continue;
        }
        ctx.write(
            format!("applying Deployment {name}"),
            deployments.patch(&name, &params, &Patch::Apply(deployment)),
        )
        .await?;
        if found != Some(want) {
            info!(deployment = %name, from = ?found, to = want, "scaled");
        }
    }
    // A lane that lost its reserve, or was renamed, leaves a Deployment behind: remove it.
    for (name, deployment) in existing {
        let ours = deployment
            .owner_references()
            .iter()
            .any(|o| o.uid == pool.uid().unwrap_or_default());
        if ours && !desired.iter().any(|d| d.name_any() == *name) {
            ctx.write(
                format!("deleting Deployment {name}"),
                deployments.delete(name, &DeleteParams::default()),
            )
            .await?;
        }
    }
    Ok(())
}

/// Whether a Deployment already carries the template we would apply (by its hash annotation).
/// Saves a write per Deployment on every event.
fn same_template(found: &Deployment, desired: &Deployment) -> bool {
    let hash = |d: &Deployment| d.metadata.annotations.as_ref()?.get(TEMPLATE_HASH).cloned();
    hash(found).is_some() && hash(found) == hash(desired)
}

async fn autoscaler_conflict(
    pool: &LanePool,
    ctx: &Context,
    namespace: &str,
) -> Result<Option<String>> {
    let api: Api<HorizontalPodAutoscaler> = Api::namespaced(ctx.client.clone(), namespace);
    let autoscalers = ctx
        .write(
            format!("listing HorizontalPodAutoscalers in {namespace}"),
            api.list(&ListParams::default()),
        )
        .await?;
    let ours = worker_deployments(pool, &Replicas::default());
    Ok(autoscalers.items.iter().find_map(|hpa| {
        let target = &hpa.spec.as_ref()?.scale_target_ref;
        let name = ours.iter().find(|d| target.kind == "Deployment" && d.name_any() == target.name)?;
        Some(format!(
            "HorizontalPodAutoscaler {} targets Deployment {}: lanepool owns its replicas and undoes the autoscaler's changes; delete the autoscaler",
            hpa.name_any(),
            name.name_any()
        ))
    }))
}

async fn report(
    pool: &LanePool,
    ctx: &Context,
    old: &crate::api::LanePoolStatus,
    decision: &Decision,
    applied: Option<&Replicas>,
    hpa: Option<String>,
) -> Result<()> {
    let namespace = pool.namespace().unwrap_or_default();
    let name = pool.name_any();
    for lane in &decision.lanes {
        let from = applied.and_then(|a| a.reserved.get(&lane.name).copied());
        if from != Some(lane.reserve) {
            let note = status::scale_note(lane, from);
            info!(pool = %name, "{note}");
            ctx.event(pool, EventType::Normal, "Scaled", note).await;
        }
    }
    let was_available = old
        .conditions
        .iter()
        .find(|c| c.type_ == status::METRICS_AVAILABLE)
        .map(|c| (c.status.clone(), c.message.clone()));
    if !decision.unavailable.is_empty() {
        let message = decision.unavailable.join("; ");
        if was_available != Some(("False".into(), message.clone())) {
            ctx.event(
                pool,
                EventType::Warning,
                "MetricsUnavailable",
                format!("{message}; {}", decision.summary()),
            )
            .await;
        }
    }
    ctx.metrics.decided(&namespace, &name, decision);
    let mut new = status::decision_status(decision, pool.metadata.generation);
    new.conditions = status::merge_conditions(
        &old.conditions,
        &status::decision_conditions(decision, hpa),
        pool.metadata.generation,
        Timestamp::now(),
    );
    write_status(pool, ctx, old, new).await
}

async fn report_failure(pool: &LanePool, ctx: &Context, error: &Error) {
    let old = pool.status.clone().unwrap_or_default();
    let mut new = old.clone();
    new.conditions = status::merge_conditions(
        &old.conditions,
        &[Observed::new(
            status::READY,
            false,
            error.reason(),
            error.to_string(),
        )],
        pool.metadata.generation,
        Timestamp::now(),
    );
    if new != old {
        ctx.event(pool, EventType::Warning, error.reason(), error.to_string())
            .await;
    }
    if let Err(write_error) = write_status(pool, ctx, &old, new).await {
        warn!(%write_error, "could not write the failure to the LanePool's status");
    }
}

async fn write_status(
    pool: &LanePool,
    ctx: &Context,
    old: &crate::api::LanePoolStatus,
    new: crate::api::LanePoolStatus,
) -> Result<()> {
    if *old == new {
        return Ok(());
    }
    let api: Api<LanePool> =
        Api::namespaced(ctx.client.clone(), &pool.namespace().unwrap_or_default());
    let patch = serde_json::json!({
        "apiVersion": LanePool::api_version(&()),
        "kind": LanePool::kind(&()),
        "status": new,
    });
    ctx.write(
        format!("writing the status of {}", pool.name_any()),
        api.patch_status(
            &pool.name_any(),
            &PatchParams::apply(MANAGER).force(),
            &Patch::Apply(&patch),
        ),
    )
    .await?;
    Ok(())
}
