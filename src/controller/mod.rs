//! The LanePool controller. Each reconcile is a short pipeline: **read** the pool and its
//! Deployments; **validate** the spec into sizing settings; **measure** the reserve lanes in
//! Prometheus (only when the interval has passed or the spec changed: Deployment events in
//! between re-apply the last decision without querying); **decide** with the pure sizing
//! decision; **apply** the Deployments by server-side apply as a surge (growing ones at once,
//! shrinking ones once the others are ready), restoring replicas anyone else changed; **report**
//! status (only when it changed), conditions and events. Only `decide` and the surge step are
//! free of I/O. Errors the CRD cannot catch (a missing Secret, a template the API server
//! refuses) set Ready=False and are retried with backoff, without touching other pools.

mod apply;
mod context;
mod measure;
mod report;
mod status;
mod surge;
mod workers;

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use futures::StreamExt;
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::jiff::Timestamp;
use kube::ResourceExt;
use kube::api::{Api, ListParams};
use kube::runtime::controller::{Action, Controller};
use kube::runtime::reflector::ObjectRef;
use kube::runtime::watcher;
use tracing::warn;

pub use context::{Context, MANAGER, Settings};
pub use surge::DEFAULT_SURGE_TIMEOUT;
pub use workers::{
    LANES_ENV, POOL_ENV, ROLE_ENV, Role, TEMPLATE_HASH, deployment_name, worker_deployments,
};

use crate::api::{LanePool, POOL_LABEL};
use crate::sizing::{Inputs, PoolSizing, decide};
use crate::{Error, Result};
use status::Observed;

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
            report::report_failure(&pool, &ctx, &error).await;
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
        report::write_status(pool, ctx, &old_status, new).await?;
        return Ok(Action::requeue(interval));
    }

    let sizing = PoolSizing::from_spec(&pool.spec)?;
    let deployments: Api<Deployment> = Api::namespaced(ctx.client.clone(), &namespace);
    let existing: BTreeMap<String, Deployment> = ctx
        .read(
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
        .or_else(|| apply::applied_replicas(pool, &old_status, &existing));
    let due = memory.replicas.is_none()
        || memory.generation != pool.metadata.generation
        || memory
            .measured_at
            .is_none_or(|at| now.saturating_sub(at) + interval / 10 >= interval);
    let (decision, replicas, measured_at) = if due {
        let loads = measure::measure_pool(pool, ctx).await?;
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
        ctx.remember(key.clone(), |m| {
            m.history = decision.history.clone();
            m.measured_at = Some(now);
            m.generation = pool.metadata.generation;
            m.replicas = Some(replicas.clone());
        });
        (Some(decision), replicas, now)
    } else {
        let replicas = memory.replicas.clone().unwrap_or_default();
        (None, replicas, memory.measured_at.unwrap_or(now))
    };

    // Growing Deployments get their counts at once; shrinking ones once the others are ready.
    let surge = apply::surge_step(
        pool,
        &existing,
        &replicas,
        memory.applied.as_ref(),
        memory.surge_since.map(|since| now.saturating_sub(since)),
        ctx.settings.surge_timeout,
    );
    let surge_since = surge.waiting.then(|| memory.surge_since.unwrap_or(now));
    ctx.remember(key.clone(), |m| m.surge_since = surge_since);
    apply::apply_deployments(
        pool,
        ctx,
        &deployments,
        &existing,
        &surge.replicas,
        memory.applied.as_ref().or(applied.as_ref()),
    )
    .await?;
    ctx.remember(key, |m| m.applied = Some(surge.replicas.clone()));

    if let Some(decision) = decision {
        let hpa = apply::autoscaler_conflict(pool, ctx, &namespace).await?;
        report::report_decision(pool, ctx, &old_status, &decision, applied.as_ref(), hpa).await?;
    }
    let mut wait = interval.saturating_sub(now.saturating_sub(measured_at));
    if let Some(since) = surge_since {
        // Readiness arrives as Deployment events; the timeout has to be watched for.
        let timeout_at = since + ctx.settings.surge_timeout;
        wait = wait.min(timeout_at.saturating_sub(now));
    }
    Ok(Action::requeue(wait.max(Duration::from_secs(1))))
}
