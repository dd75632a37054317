//! One reconcile of one LanePool: observe → plan → act, each stage entered once.
//! - **observe**: the pool's Deployments and Pods from the watch caches (`caches.rs`, `pods/`),
//!   the workers' credential once per process, and in one round the lanes' load and job times
//!   when due (`observe/measure.rs`), the workers' own counts (`observe/reads.rs`), what the
//!   workers of the Deployments in motion are doing (`observe/work.rs`), each worker asked at most
//!   once;
//! - **plan**, without I/O: the decision (`crate::sizing`) when due, then the rollout
//!   (`plan::plan`): the effects to perform, and the next memory;
//! - **act** (`act/`): the growth first and alone; the credential; the Pods' costs and gates and
//!   the requests to workers, their answers recorded for the next reconcile (`plan::record`);
//!   the counts; the status and events;
//! - **requeue**.
//!
//! The pool's carried state (`state/`) is written back at one point whatever the walk's outcome.
//! Errors the CRD cannot catch (a missing Secret, a URL not allowed, a name taken) set
//! Ready=False and are retried with backoff, without touching other pools.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::jiff::Timestamp;
use kube::ResourceExt;
use kube::runtime::controller::Action;
use tracing::{Instrument, info, info_span, warn};

use super::act::credential as act_credential;
use super::act::{apply, report, steer};
use super::context::Context;
use super::credential::WorkerCredential;
use super::observe::credential as observe_credential;
use super::observe::deployments as observe_deployments;
use super::observe::{autoscalers, measure, reads, work};
use super::plan::{self, inherited::Inherited};
use super::pods::{self, PoolPods};
use super::rollout::cost::Reading;
use super::rollout::{Rules, grace};
use super::state::pools::PoolKey;
use super::state::worker_reads::CountsRead;
use super::state::{self, PoolMemory, STATUS_REFRESH, Start};
use super::worker::Worker;
use super::{caches, deployments, status};
use crate::api::{LanePool, LanePoolStatus};
use crate::sizing::{Decision, Inputs, PoolSizing, Replicas, decide};
use crate::{Error, Result};

/// One reconcile of one LanePool.
pub async fn reconcile(pool: Arc<LanePool>, ctx: Arc<Context>) -> Result<Action> {
    // Pools wait their turn in the order they became due (the semaphore is never closed). A
    // pool waiting holds only this: the reconcile's own state is allocated once it may run.
    let _slot = ctx.reconcile_slots.acquire().await.ok();
    Box::pin(reconcile_now(pool, ctx.clone())).await
}

async fn reconcile_now(pool: Arc<LanePool>, ctx: Arc<Context>) -> Result<Action> {
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
    let interval = pool.spec.interval.get().map_err(|source| Error::Duration {
        field: "spec.interval".into(),
        source,
    })?;
    if pool.spec.paused {
        report::report_paused(pool, ctx).await?;
        return Ok(Action::requeue(interval));
    }
    if !ctx.caches.ready() {
        return Ok(Action::requeue(caches::CACHES_NOT_READY));
    }
    let sizing = PoolSizing::from_spec(&pool.spec)?;
    let key = PoolKey::of(pool);
    let mut memory = ctx.memory(&key);
    let walk = Walk {
        pool,
        ctx,
        interval,
        now: ctx.started.elapsed(),
        old_status: pool.status.clone().unwrap_or_default(),
    };
    let walked = walk.run(&sizing, &mut memory).await;
    // The one write-back: what the walk learned is kept whether or not it got to the end.
    ctx.keep(&key, &memory);
    walked.map(Action::requeue)
}

/// What every stage of one reconcile reads.
struct Walk<'a> {
    pool: &'a LanePool,
    ctx: &'a Context,
    interval: Duration,
    /// When the reconcile started, since the process did.
    now: Duration,
    /// The status as the reconcile found it.
    old_status: LanePoolStatus,
}

impl Walk<'_> {
    /// The stages, in order; returns when to come back.
    async fn run(&self, sizing: &PoolSizing, memory: &mut PoolMemory) -> Result<Duration> {
        let (pool, ctx, now) = (self.pool, self.ctx, self.now);
        let generation = pool.metadata.generation;
        // Observe: the Deployments (the watch cache; the API server for the names it lacks), and
        // the carried state stepped: is the pool due?
        let live = self.read_deployments(memory);
        let not_cached = observe_deployments::not_cached(pool, ctx, &live).await?;
        let period = state::period(self.interval, &pool.uid().unwrap_or_default());
        let start = memory.start(generation, period, now, || {
            state::recorded_replicas(pool, &self.old_status, &live)
        });
        if let Some(late) = start.late {
            ctx.metrics.measured_late(late);
        }
        // Observe: the pool's own workers (only Pods its Deployments' ReplicaSets control are
        // asked anything, all within one budget), the credential they are steered with, and in
        // one round the lanes' load when due, the workers' counts and what the workers of the
        // Deployments in motion are doing.
        let pods = PoolPods::new(ctx, pool, live.values(), pods::budget(self.interval));
        let credential = self.read_credential(memory).await;
        let moving = plan::in_motion(
            pool,
            &live,
            pods.workers(),
            &memory.target(),
            &memory.steering,
            now,
        );
        let seen = self.observe(&start, &pods, &moving, memory).await?;
        // Plan: the decision when due, then the rollout, without I/O.
        let decision = seen
            .measured
            .map(|measured| self.decide(sizing, &start, measured, memory));
        let target = memory.target();
        let last = memory.applied.clone().or(start.current.clone());
        let reading = seen.work.map(|mut reading| {
            reading.job_seconds = memory.job_seconds.clone();
            reading
        });
        let observed = plan::Seen {
            pool,
            live: &live,
            workers: pods.workers(),
            work: reading.as_ref(),
            inherited: seen.inherited.as_ref(),
            target: &target,
            applied: memory.applied.as_ref(),
            now,
        };
        let effects = plan::plan(&observed, &mut memory.steering, settings(ctx));
        surge_end(ctx, effects.surge_ended);
        // Act: the growth, alone, before any worker is asked anything; the credential, made or
        // rotated when due; the requests to workers and the Pods' costs and gates (their answers
        // kept for the next reconcile); the counts; the status and events.
        let deployments = apply::Deployments::new(pool, ctx, &live, &not_cached, last);
        if let Some(growth) = &effects.growth {
            deployments.apply(growth).await?;
        }
        pods.steer_with(self.keep_credential(credential, memory).await);
        let answers = steer::steer((pool, ctx, &pods), &effects).await;
        plan::record(&mut memory.steering, answers, ctx.started.elapsed());
        if let Some(busy) = effects.stopped_busy {
            let (namespace, name) = (pool.namespace().unwrap_or_default(), pool.name_any());
            ctx.metrics.stopped_busy(&namespace, &name, busy);
        }
        let release = effects.release;
        deployments.apply(&release.replicas).await?;
        deployments.remove(&release.remove).await?;
        report::report_events(pool, ctx, effects.events).await;
        if pods.refused_credential.load(Ordering::Relaxed) {
            memory.credential.doubt();
        }
        if let Some(unchecked) = pods.unchecked_workers() {
            memory.unchecked_workers = Some(unchecked);
        }
        let running = release.replicas.clone();
        memory.rolled_out(release, generation);
        // Act: report, with what runs beside what was decided.
        let held = effects.held;
        let shown = |status| report::with_rollout(status, &running, &held, |at| ctx.wall(at));
        match decision {
            Some(decision) => {
                let current = start.current.as_ref();
                self.report(&decision, current, &pods, memory, shown)
                    .await?
            }
            None => self.report_rollout(memory, shown).await?,
        }
        // Requeue.
        Ok(memory.requeue_after(period, ctx.settings.surge_timeout, now))
    }

    /// Observes, in one round: the lanes' load and every lane's job time from Prometheus (when
    /// due), beside the workers' `/metrics`, each worker asked once (every worker when due or when
    /// this process has not yet read what an earlier leader left in them; otherwise those of the
    /// `moving` Deployments, none for a pool at rest). From those answers: the workers' counts
    /// (when due), what the workers are doing (Prometheus asked for those that gave no answer,
    /// after them), and what an earlier leader left.
    async fn observe<'p>(
        &self,
        start: &Start,
        pods: &PoolPods<'p>,
        moving: &BTreeSet<String>,
        memory: &PoolMemory,
    ) -> Result<Observed> {
        let (pool, ctx) = (self.pool, self.ctx);
        let measure = async {
            match start.due {
                true => Some(measure::measure_pool(pool, ctx, self.interval).await),
                false => None,
            }
        };
        let every = start.due || !memory.steering.inherited_read;
        let asked: Vec<&Worker> = pods
            .workers()
            .iter()
            .filter(|w| every || moving.contains(&w.deployment))
            .collect();
        let answers = async {
            // The one request to each worker: the steps below read the answers kept.
            pods.metrics_texts(&asked).await;
            let counts = match start.due {
                true => reads::ask(&memory.worker_reads, pool, ctx, pods).await,
                false => None,
            };
            let whose = (!start.due).then_some(moving);
            let reading = match start.due || !moving.is_empty() {
                true => {
                    let (connection, job_seconds) =
                        (memory.connection.as_ref(), &memory.job_seconds);
                    Some(work::read((pool, ctx, pods), whose, connection, job_seconds).await)
                }
                false => None,
            };
            let inherited = match memory.steering.inherited_read {
                true => None,
                false => Some(work::inherited(pods).await),
            };
            (counts, reading, inherited)
        };
        let (measured, (counts, work, inherited)) = futures::join!(measure, answers);
        let measured = match measured {
            Some(measured) => Some((measured?, counts)),
            None => None,
        };
        Ok(Observed {
            measured,
            work,
            inherited,
        })
    }

    /// Decides from this evaluation's measurement (the workers' counts applied; without a read
    /// that is a rate, the last one for a scrape interval, then Prometheus's), every lane's job
    /// time remembered for the drains and the ranking.
    fn decide(
        &self,
        sizing: &PoolSizing,
        start: &Start,
        (measured, counts): (measure::Measured, Option<CountsRead>),
        memory: &mut PoolMemory,
    ) -> Decision {
        let (pool, ctx) = (self.pool, self.ctx);
        let measure::Measured {
            mut loads,
            job_seconds,
            connection,
            unseen,
        } = measured;
        reads::record(ctx, &mut memory.worker_reads, counts, &loads);
        let window = reads::rate_window(ctx);
        let prometheus_lag = ctx.settings.windows.scrape_interval;
        memory
            .worker_reads
            .apply_to(&mut loads, window, (self.now, prometheus_lag), &unseen);
        // The lanes only shared workers serve: their longest job time says how seldom, at
        // least, a shared worker frees up to help a reserve lane.
        let shared_job_seconds = job_seconds
            .iter()
            .filter(|(lane, _)| !loads.contains_key(*lane))
            .map(|(_, seconds)| *seconds)
            .reduce(f64::max);
        memory.measured(connection, job_seconds, &pool.spec.lanes);
        let decision = decide(
            sizing,
            Inputs {
                loads: &loads,
                current: start.current.as_ref(),
                history: &memory.history,
                now: self.now,
                outage: memory.outage(&self.old_status, self.now, Timestamp::now()),
                shared_job_seconds,
            },
        );
        memory.decided(&decision, pool.metadata.generation, self.now);
        decision
    }

    /// The credential the pool's drain and stand-in requests carry, as the Secret has it: read
    /// once per process. Only for a template with a `metrics` port (no other is asked anything);
    /// `false` when the pool has none.
    async fn read_credential(&self, memory: &mut PoolMemory) -> bool {
        let (pool, ctx) = (self.pool, self.ctx);
        if !deployments::serves_metrics(pool.spec.template.spec.as_ref()) {
            return false;
        }
        observe_credential::read(pool, ctx, &mut memory.credential).await;
        true
    }

    /// The credential, made or rotated when due (an act: after the growth); `None` when the pool
    /// steers no worker (its shrinks that need a drain wait).
    async fn keep_credential(
        &self,
        steered: bool,
        memory: &mut PoolMemory,
    ) -> Option<WorkerCredential> {
        match steered {
            true => act_credential::keep(self.pool, self.ctx, &mut memory.credential).await,
            false => None,
        }
    }

    /// The pool's Deployments, from the watch cache: its own by name (those of removed lanes
    /// still leaving too), and after a spec change or a restart every one labelled as the pool's
    /// (what a removed lane left behind).
    fn read_deployments(&self, memory: &PoolMemory) -> BTreeMap<String, Deployment> {
        let pool = self.pool;
        let names: Vec<String> = deployments::pool_roles(pool, &Replicas::default())
            .into_iter()
            .map(|(name, _, _)| name)
            .chain(memory.leaving.iter().cloned())
            .collect();
        let sweep = memory.swept.is_none() || memory.swept != pool.metadata.generation;
        let namespace = pool.namespace().unwrap_or_default();
        self.ctx
            .caches
            .pool_deployments(&namespace, &pool.name_any(), &names, sweep)
            .into_iter()
            .map(|d| (d.name_any(), d))
            .collect()
    }

    /// Reports a decision: conditions (the autoscaler check, the grace period and the workers
    /// that cannot start among them), events and the status, written when it changed or its
    /// measurements are getting old.
    async fn report(
        &self,
        decision: &Decision,
        applied: Option<&Replicas>,
        pods: &PoolPods<'_>,
        memory: &mut PoolMemory,
        shown: impl FnOnce(LanePoolStatus) -> LanePoolStatus,
    ) -> Result<()> {
        let (pool, ctx) = (self.pool, self.ctx);
        let namespace = pool.namespace().unwrap_or_default();
        let hpa = autoscalers::autoscaler_conflict(pool, ctx, &namespace);
        let mut conditions = status::decision_conditions(decision, hpa);
        status::workers_cannot_start(&mut conditions, &pods.cannot_start(), pods.workers().len());
        let grace = grace::grace_seconds(pool);
        conditions.push(grace::grace_condition(grace, &memory.job_seconds));
        let problem = memory.credential.problem.as_deref();
        let unchecked = memory.unchecked_workers.as_deref();
        conditions.extend(status::credential_condition(problem, unchecked));
        let refresh = memory
            .status_written
            .is_none_or(|at| self.now.saturating_sub(at) >= STATUS_REFRESH);
        let old = &self.old_status;
        let decided = report::Decided {
            decision,
            applied,
            conditions,
            refresh,
        };
        let written = report::report_decision(pool, ctx, old, decided, shown).await?;
        if written.is_some() {
            memory.status_written = Some(self.now);
        }
        memory.shown = written.or_else(|| Some(old.clone()));
        Ok(())
    }

    /// Between decisions: a change of what runs (a shrink that started or stopped waiting)
    /// written over the status this process last showed.
    async fn report_rollout(
        &self,
        memory: &mut PoolMemory,
        shown: impl FnOnce(LanePoolStatus) -> LanePoolStatus,
    ) -> Result<()> {
        let Some(last) = &memory.shown else {
            return Ok(());
        };
        if let Some(written) = report::report_rollout(self.pool, self.ctx, last, shown).await? {
            memory.shown = Some(written);
        }
        Ok(())
    }
}

/// How the operator's flags say to roll decisions out.
fn settings(ctx: &Context) -> plan::Settings {
    let rank = ctx.settings.idle_workers_first;
    let rules = Rules {
        surge_timeout: ctx.settings.surge_timeout,
        rank,
        drain: rank && !ctx.settings.drain_timeout.is_zero(),
    };
    plan::Settings {
        rules,
        drain_timeout: ctx.settings.drain_timeout,
        stand_ins: true,
    }
}

/// What one reconcile observed beyond the watch caches.
struct Observed {
    /// The measurement and the workers' counts, when due.
    measured: Option<(measure::Measured, Option<CountsRead>)>,
    work: Option<Reading>,
    inherited: Option<Inherited>,
}

fn surge_end(ctx: &Context, waited: Option<Duration>) {
    let Some(waited) = waited else {
        return;
    };
    ctx.metrics.surge_ended(waited);
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

#[cfg(test)]
mod tests;
