//! The LanePool controller. Each reconcile is a short pipeline: **read** the pool and its
//! Deployments (from the watch cache); **validate** the spec into sizing settings; **step**
//! (`step.rs`, no I/O: is the pool due, what does it run); **measure** the reserve lanes in
//! Prometheus (only when due: Deployment events in between re-apply the last decision without
//! querying); **decide** with the pure sizing decision; **apply** the Deployments by server-side
//! apply as a surge (growing ones at once, shrinking ones once the others are ready), restoring
//! replicas and templates anyone else changed, after draining the workers a shrink will stop
//! (`drain.rs`: asked to take no new job, the shrink held, across reconciles, until they are idle
//! or the drain times out) and ranking a shrinking Deployment's Pods so idle and drained workers
//! go first (`idle_first.rs`); **report** status (only when it changed),
//! conditions and events. Errors the CRD cannot catch (a missing Secret, a URL not allowed, a
//! name taken) set Ready=False and are retried with backoff, without touching other pools.

mod apply;
mod context;
mod drain;
mod events;
mod grace;
mod idle_first;
mod measure;
mod pods;
mod reads;
mod report;
mod status;
mod step;
mod surge;
mod workers;

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use futures::StreamExt;
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::autoscaling::v2::HorizontalPodAutoscaler;
use k8s_openapi::jiff::Timestamp;
use kube::ResourceExt;
use kube::api::Api;
use kube::runtime::controller::{self, Action, Controller};
use kube::runtime::reflector::{self, Store};
use kube::runtime::{WatchStreamExt, predicates, watcher};
use tracing::{Instrument, info, info_span, warn};

use context::{Caches, PoolKey};
pub use context::{Context, DEFAULT_CONCURRENT_RECONCILES, MANAGER, Settings};
pub use drain::{DEFAULT_DRAIN_TIMEOUT, DRAINING_METRIC};
pub use events::{Recorder, SERIES_TTL, Said};
pub use grace::GRACE_PERIOD_TOO_SHORT;
pub use idle_first::{BUSY_COST, BUSY_METRIC, DELETION_COST, DRAINED_COST, IDLE_COST};
pub use surge::DEFAULT_SURGE_TIMEOUT;
pub use workers::{
    LANES_ENV, POOL_ENV, ROLE_ENV, Role, TEMPLATE_HASH, deployment_name, worker_deployments,
};

use crate::api::{LanePool, POOL_LABEL};
use crate::sizing::{Inputs, PoolSizing, Replicas, decide};
use crate::{Error, Result};
use status::ConditionState;

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
    let mut stores: Vec<Store<LanePool>> = Vec::new();
    let mut caches = Vec::new();
    let mut autoscaler_watches = Vec::new();
    let controllers: Vec<_> = scopes
        .into_iter()
        .map(|namespace| {
            let client = ctx.client.clone();
            let (pools, deployments, autoscalers): (
                Api<LanePool>,
                Api<workers::CachedDeployment>,
                Api<HorizontalPodAutoscaler>,
            ) = match &namespace {
                Some(ns) => (
                    Api::namespaced(client.clone(), ns),
                    Api::namespaced(client.clone(), ns),
                    Api::namespaced(client, ns),
                ),
                None => (
                    Api::all(client.clone()),
                    Api::all(client.clone()),
                    Api::all(client),
                ),
            };
            // The pools' Deployments and the namespace's autoscalers are read from watch caches,
            // never listed per reconcile; the Deployment watch also triggers the reconciles.
            let (deployment_cache, deployment_writer) = reflector::store();
            let deployment_events =
                watcher(deployments, watcher::Config::default().labels(POOL_LABEL))
                    .default_backoff()
                    .modify(workers::CachedDeployment::keep_what_is_read)
                    .reflect(deployment_writer)
                    .touched_objects();
            let (autoscaler_cache, autoscaler_writer) = reflector::store();
            autoscaler_watches.push(
                watcher(autoscalers, watcher::Config::default())
                    .default_backoff()
                    .modify(|h: &mut HorizontalPodAutoscaler| h.managed_fields_mut().clear())
                    .reflect(autoscaler_writer)
                    .for_each(|_| async {}),
            );
            caches.push(Caches {
                deployments: deployment_cache,
                autoscalers: autoscaler_cache,
            });
            // A pool is reconciled when its spec changes (its generation), not when its own
            // status is written: the interval and the Deployment events do the rest.
            let (pool_cache, pool_writer) = reflector::store();
            let pool_events = watcher(pools, watcher::Config::default())
                .default_backoff()
                .modify(|p: &mut LanePool| p.managed_fields_mut().clear())
                .reflect(pool_writer)
                .applied_objects()
                .predicate_filter(predicates::generation, Default::default());
            stores.push(pool_cache.clone());
            Controller::for_stream(pool_events, pool_cache)
                .with_config(
                    controller::Config::default().concurrency(ctx.settings.concurrent_reconciles),
                )
                .owns_stream(deployment_events)
                .graceful_shutdown_on(shutdown.clone())
                .run(reconcile, error_policy, ctx.clone())
                .for_each(|result| async move {
                    match result {
                        // error_policy logged it, once, with its pool and backoff.
                        Ok(_) | Err(controller::Error::ReconcilerFailed(..)) => {}
                        Err(error) => warn!(%error, "the controller's queue failed"),
                    }
                })
        })
        .collect();
    ctx.set_caches(caches);
    let autoscaler_watches = futures::future::join_all(autoscaler_watches);
    let sweep = forget_deleted_pools(ctx, stores);
    tokio::select! {
        _ = futures::future::join_all(controllers) => {}
        _ = sweep => {}
        _ = autoscaler_watches => {}
    }
}

/// How often the memory, metric series and Prometheus clients of deleted pools are dropped.
const SWEEP_INTERVAL: Duration = Duration::from_secs(30);

/// Drops what the operator kept for pools that are gone, once the watches have listed them.
async fn forget_deleted_pools(ctx: Arc<Context>, stores: Vec<Store<LanePool>>) {
    for store in &stores {
        if store.wait_until_ready().await.is_err() {
            return;
        }
    }
    loop {
        tokio::time::sleep(SWEEP_INTERVAL).await;
        let live: std::collections::HashSet<PoolKey> = stores
            .iter()
            .flat_map(|store| store.state())
            .map(|pool| PoolKey::of(&pool))
            .collect();
        ctx.forget_deleted(|key| live.contains(key));
    }
}

/// One reconcile of one LanePool.
pub async fn reconcile(pool: Arc<LanePool>, ctx: Arc<Context>) -> Result<Action> {
    let started = Instant::now();
    let namespace = pool.namespace().unwrap_or_default();
    let name = pool.name_any();
    // Every line logged while reconciling the pool carries its namespace and name.
    let span = info_span!("reconcile", namespace = %namespace, pool = %name);
    async {
        match reconcile_pool(&pool, &ctx).await {
            Ok(action) => {
                ctx.remember(PoolKey::of(&pool), |m| m.failures = 0);
                ctx.metrics.reconciled(&namespace, &name, started.elapsed());
                Ok(action)
            }
            Err(error) => {
                report::report_failure(&pool, &ctx, &error).await;
                Err(error)
            }
        }
    }
    .instrument(span)
    .await
}

/// Counts the failure and retries with exponential backoff: 5 s, 10 s, … up to 5 minutes.
pub fn error_policy(pool: Arc<LanePool>, error: &Error, ctx: Arc<Context>) -> Action {
    ctx.metrics.reconcile_failed(error.metric_label());
    let key = PoolKey::of(&pool);
    let mut failures = 0;
    ctx.remember(key, |m| {
        m.failures = m.failures.saturating_add(1);
        failures = m.failures;
    });
    let backoff = Duration::from_secs(5 * 2u64.saturating_pow(failures.saturating_sub(1).min(6)))
        .min(Duration::from_secs(300));
    warn!(
        namespace = %pool.namespace().unwrap_or_default(),
        pool = %pool.name_any(),
        %error,
        ?backoff,
        "reconcile failed; retrying"
    );
    Action::requeue(backoff)
}

async fn reconcile_pool(pool: &LanePool, ctx: &Context) -> Result<Action> {
    let namespace = pool.namespace().unwrap_or_default();
    let name = pool.name_any();
    let key = PoolKey::of(pool);
    let interval = pool.spec.interval.get().map_err(|source| Error::Duration {
        field: "spec.interval".into(),
        source,
    })?;
    let old_status = pool.status.clone().unwrap_or_default();

    if pool.spec.paused {
        let observed = [ConditionState::new(
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

    if !ctx.caches_ready() {
        return Ok(Action::requeue(context::CACHES_NOT_READY));
    }
    let sizing = PoolSizing::from_spec(&pool.spec)?;
    let deployments: Api<Deployment> = Api::namespaced(ctx.client.clone(), &namespace);
    let mut memory = ctx.memory(&key);
    let names: Vec<String> = workers::pool_roles(pool, &Replicas::default())
        .into_iter()
        .map(|(name, _, _)| name)
        .collect();
    let sweep = memory.swept.is_none() || memory.swept != pool.metadata.generation;
    let existing: BTreeMap<String, Deployment> = ctx
        .pool_deployments(&namespace, &name, &names, sweep)
        .into_iter()
        .map(|d| (d.name_any(), d))
        .collect();
    let now = ctx.started.elapsed();
    let start = memory.start(pool.metadata.generation, interval, now, || {
        step::recorded_replicas(pool, &old_status, &existing)
    });
    // The pool's own workers: only Pods its Deployments' ReplicaSets control are asked anything.
    // All Pod I/O of this reconcile (reads, drains, ranking) ends within one budget.
    let workers = pods::PoolPods::new(ctx, pool, existing.values(), pods::budget(interval));
    let decision = if start.due {
        // The workers are read while Prometheus is asked: neither waits for the other.
        let (measured, answers) = futures::join!(
            measure::measure_pool(pool, ctx, interval),
            memory.worker_reads.ask(pool, ctx, &workers),
        );
        let (mut loads, connection) = measured?;
        memory.connection = connection;
        // Only this evaluation's read is applied: without one, Prometheus decides.
        memory.worker_reads.record_measured(ctx, answers, &loads);
        memory
            .worker_reads
            .apply_to(&mut loads, reads::rate_window(ctx));
        let decision = decide(
            &sizing,
            Inputs {
                loads: &loads,
                current: start.current.as_ref(),
                history: &memory.history,
                now,
                outage: memory.outage(&old_status, now, Timestamp::now()),
            },
        );
        memory.decided(&decision, pool.metadata.generation, now);
        ctx.keep(&key, &memory);
        let job_seconds =
            grace::served_job_seconds(pool, ctx, memory.connection.as_ref(), &loads).await;
        let grace = grace::grace_condition(grace::grace_seconds(pool), &job_seconds);
        Some((decision, grace))
    } else {
        None
    };

    // Growing Deployments get their counts at once; shrinking ones once the others are ready.
    let previous = memory.applied.clone();
    let surge = apply::surge_step(
        pool,
        &existing,
        &memory.target(),
        previous.as_ref(),
        memory.surge_waited(now),
        ctx.settings.surge_timeout,
    );
    let surge_waited = memory.surge_waited(now);
    memory.surging(surge.waiting, now);
    if let Some(waited) = surge_waited.filter(|_| !surge.waiting) {
        let waited_ms = waited.as_millis() as u64;
        if waited >= ctx.settings.surge_timeout {
            info!(
                waited_ms,
                "surge timed out: the shrinking Deployments may shrink"
            );
        } else {
            info!(
                waited_ms,
                "surge over: the growing Deployments are ready, the shrinking ones may shrink"
            );
        }
    }
    ctx.keep(&key, &memory);
    let draining = ctx.settings.idle_workers_first && !ctx.settings.drain_timeout.is_zero();
    let shrinks = if draining {
        surge.shrinks.clone()
    } else {
        Vec::new()
    };
    let shrinking_now = if ctx.settings.idle_workers_first {
        apply::shrinking(pool, &existing, &surge.replicas)
    } else {
        Vec::new()
    };
    if !shrinks.is_empty() || !shrinking_now.is_empty() {
        // Growth first: draining and ranking the Pods of a shrinking Deployment must never delay
        // new workers (both in one step only when the surge is off or timed out). Nothing is
        // written when the growth is there already.
        let growth = apply::hold_shrinks(pool, &existing, &surge.replicas);
        apply::apply_deployments(
            pool,
            ctx,
            &deployments,
            &existing,
            &growth,
            previous.as_ref().or(start.current.as_ref()),
        )
        .await?;
    }
    // A decided shrink drains its workers while the surge waits; it goes ahead once both allow.
    let held = if draining || !memory.drains.is_empty() {
        let mut drains = std::mem::take(&mut memory.drains);
        let held = drain::drain_before_shrinks(
            pool,
            ctx,
            &workers,
            memory.connection.as_ref(),
            &mut drains,
            &shrinks,
            now,
        )
        .await;
        memory.drains = drains;
        ctx.keep(&key, &memory);
        held
    } else {
        Default::default()
    };
    let replicas = apply::hold(pool, &existing, &surge.replicas, |d| held.contains(d));
    let shrinking = if ctx.settings.idle_workers_first {
        apply::shrinking(pool, &existing, &replicas)
    } else {
        Vec::new()
    };
    for (deployment, selector) in &shrinking {
        let drained = memory
            .drains
            .get(deployment)
            .map(drain::Drain::idle)
            .unwrap_or_default();
        idle_first::rank_before_shrink(
            pool,
            ctx,
            &workers,
            memory.connection.as_ref(),
            deployment,
            selector,
            &drained,
        )
        .await;
    }
    apply::apply_deployments(
        pool,
        ctx,
        &deployments,
        &existing,
        &replicas,
        previous.as_ref().or(start.current.as_ref()),
    )
    .await?;
    // A drain ends with its shrink: the workers it stopped are going.
    for (deployment, _) in &shrinking {
        memory.drains.remove(deployment);
    }
    memory.applied(replicas);
    memory.swept = pool.metadata.generation;
    ctx.keep(&key, &memory);

    if let Some((decision, grace)) = decision {
        let hpa = apply::autoscaler_conflict(pool, ctx, &namespace)?;
        let mut conditions = status::decision_conditions(&decision, hpa);
        conditions.push(grace);
        let refresh = memory
            .status_written
            .is_none_or(|at| now.saturating_sub(at) >= step::STATUS_REFRESH);
        let written = report::report_decision(
            pool,
            ctx,
            &old_status,
            &decision,
            start.current.as_ref(),
            conditions,
            refresh,
        )
        .await?;
        if written {
            memory.status_written = Some(now);
            ctx.keep(&key, &memory);
        }
    }
    Ok(Action::requeue(memory.requeue_after(
        interval,
        ctx.settings.surge_timeout,
        now,
        step::jitter(&key.uid),
    )))
}
