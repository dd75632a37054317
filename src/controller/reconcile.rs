//! One reconcile of one LanePool, as one forward walk through four kinds of stage:
//! - **observe**: the pool's Deployments and Pods from the watch caches (`caches.rs`, `pods/`);
//!   when the pool is due, the lanes' load from Prometheus and the workers' own counts at once
//!   (`observe/measure.rs`, `observe/reads.rs`); what the workers are doing, when a step chooses
//!   whom to stop (`observe/work.rs`, each worker asked at most once per reconcile);
//! - **decide** (`crate::sizing`) and **roll out** (`rollout/`), without I/O: the counts, then
//!   this step's growth, stand-ins and drains ([`rollout::rollout`]), and once the drains have
//!   answered, what goes out and what still waits ([`rollout::Rollout::settle`]);
//! - **act** (`act/`): the growth first and alone; the stand-ins, drains and readiness gates;
//!   the ranking of what shrinks now; the rest of the counts; the status and events;
//! - **requeue**.
//!
//! The pool's carried state (`state/`) is written back at one point whatever the walk's outcome.
//! Errors the CRD cannot catch (a missing Secret, a URL not allowed, a name taken) set
//! Ready=False and are retried with backoff, without touching other pools.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::jiff::Timestamp;
use kube::ResourceExt;
use kube::runtime::controller::Action;
use tracing::{Instrument, info, info_span, warn};

use super::act::credential as act_credential;
use super::act::{apply, drain, rank, report, stand_in, takeover};
use super::context::Context;
use super::credential::WorkerCredential;
use super::observe::credential as observe_credential;
use super::observe::deployments as observe_deployments;
use super::observe::work::{LastMeasured, Observed};
use super::observe::{autoscalers, measure, reads};
use super::pods::{self, PoolPods};
use super::rollout::{self, Rules, Settled, grace};
use super::state::pools::PoolKey;
use super::state::{self, PoolMemory, STATUS_REFRESH, Start};
use super::{caches, deployments, settings, status};
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
        // Observe the Deployments (the watch cache; the API server for the names it lacks), and
        // step the carried state: is the pool due?
        let live = self.read_deployments(memory);
        let not_cached = observe_deployments::not_cached(pool, ctx, &live).await?;
        let period = state::period(self.interval, &pool.uid().unwrap_or_default());
        let start = memory.start(generation, period, now, || {
            state::recorded_replicas(pool, &self.old_status, &live)
        });
        if let Some(late) = start.late {
            ctx.metrics.measured_late(late);
        }
        // The pool's own workers: only Pods its Deployments' ReplicaSets control are asked
        // anything. All Pod I/O of this reconcile (reads, drains, ranking) ends within one budget.
        let pods = PoolPods::new(ctx, pool, live.values(), pods::budget(self.interval));
        // Observe the lanes' load and decide, when due.
        let decision = match start.due {
            true => Some(
                self.measure_and_decide(sizing, &start, &pods, memory)
                    .await?,
            ),
            false => None,
        };
        // Roll out, the first half: this step's growth, stand-ins and drains.
        let rules = rules(ctx);
        let (target, own) = (memory.target(), memory.applied.as_ref());
        let surge = memory.surge(now);
        let rollout = rollout::rollout(pool, &live, &target, own, &surge, rules);
        let surge_ended = memory.surging(&rollout, now);
        surge_end(ctx, surge_ended);
        // The latest a waiting shrink waits for the Deployments taking over.
        let surge_ends = memory.surge_wait.ends(ctx.settings.surge_timeout, now);
        let last = memory.applied.clone().or(start.current.clone());
        let deployments = apply::Deployments::new(pool, ctx, &live, &not_cached, last);
        // Act: the growth, alone, before any shrinking Deployment's Pod is asked anything.
        if let Some(growth) = &rollout.growth {
            deployments.apply(growth).await?;
        }
        // Act: the credential the workers are steered with, made or rotated when due.
        pods.steer_with(self.credential(memory).await);
        // Act: the stand-ins, the drains and the readiness gates, each worker read once; then
        // roll out the second half (what goes out now that the drains answered) and rank the
        // Pods of what shrinks now, idle workers first. The last measurement is lent to these
        // steps, not copied (it holds the Prometheus connection's certificates), and given back
        // before anything can return early.
        let connection = memory.connection.take();
        let job_seconds = std::mem::take(&mut memory.job_seconds);
        let measured = LastMeasured {
            connection: connection.as_ref(),
            job_seconds: &job_seconds,
        };
        let seen = Observed::new(pool, ctx, &pods, measured);
        let floors = self
            .stand_in_and_drain(&seen, memory, &rollout, rules, surge_ends)
            .await;
        let Settled { release, held } =
            rollout.settle(pool, &live, &floors, &memory.drains, (surge_ends, now));
        self.rank(&seen, memory, &live, &release).await;
        drop(seen);
        memory.connection = connection;
        memory.job_seconds = job_seconds;
        // Act: apply the rest; remove what no lane runs once its workers may go.
        deployments.apply(&release.replicas).await?;
        deployments.remove(&release.remove).await?;
        if pods.refused_credential.load(Ordering::Relaxed) {
            memory.credential.doubt();
        }
        if let Some(unchecked) = pods.unchecked_workers() {
            memory.unchecked_workers = Some(unchecked);
        }
        let running = release.replicas.clone();
        memory.rolled_out(release, generation);
        // Act: report, with what runs beside what was decided.
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

    /// The credential the pool's drain and stand-in requests carry: read once per process (an
    /// observation, taken here rather than at the start so the growth goes out first), made or
    /// rotated when due. Only for a template with a `metrics` port (no other is asked
    /// anything); `None` when the pool has none (its shrinks that need a drain wait).
    async fn credential(&self, memory: &mut PoolMemory) -> Option<WorkerCredential> {
        let (pool, ctx) = (self.pool, self.ctx);
        if !deployments::serves_metrics(pool.spec.template.spec.as_ref()) {
            return None;
        }
        observe_credential::read(pool, ctx, &mut memory.credential).await;
        act_credential::keep(pool, ctx, &mut memory.credential).await
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

    /// Measures the pool (Prometheus and the workers asked at once, neither waiting for the
    /// other; this evaluation's read applied, without one Prometheus decides; every lane's job
    /// time remembered for the drains and the ranking) and decides.
    async fn measure_and_decide(
        &self,
        sizing: &PoolSizing,
        start: &Start,
        pods: &PoolPods<'_>,
        memory: &mut PoolMemory,
    ) -> Result<Decision> {
        let (pool, ctx) = (self.pool, self.ctx);
        let (measured, answers) = futures::join!(
            measure::measure_pool(pool, ctx, self.interval),
            reads::ask(&memory.worker_reads, pool, ctx, pods),
        );
        let (mut loads, connection) = measured?;
        reads::record(ctx, &mut memory.worker_reads, answers, &loads);
        let window = reads::rate_window(ctx);
        memory.worker_reads.apply_to(&mut loads, window);
        let within = settings::measure_deadline(self.interval);
        let job_seconds =
            measure::served_job_seconds(pool, ctx, connection.as_ref(), &loads, within).await;
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
        Ok(decision)
    }

    /// Advances the stand-ins of the shrinks waiting for the surge (until `surge_ends`), the
    /// drains (calling off those whose shrink is gone) and the rollovers' readiness gates;
    /// returns the fewest workers each shrinking Deployment may run now.
    async fn stand_in_and_drain(
        &self,
        seen: &Observed<'_>,
        memory: &mut PoolMemory,
        rollout: &rollout::Rollout,
        rules: Rules,
        surge_ends: Duration,
    ) -> BTreeMap<String, i32> {
        // What an earlier leader left in the workers: taken over, or ended, by the steps below.
        if !memory.inherited_read {
            let inherited = seen.inherited().await;
            if inherited.len() > 0 {
                info!(
                    workers = inherited.len(),
                    "workers drain or stand in for an earlier leader: taken over where this \
                     rollout wants them, ended elsewhere"
                );
            }
            inherited.adopt(&mut memory.drains, &mut memory.stand_ins, self.now);
            memory.inherited_read = true;
        }
        // While a shrink waits for the surge, its workers that will stop stand in for the new
        // ones; once it goes, the drain takes those that said so first, and sends back every
        // other that may stand in (one not heard from may have taken the request late).
        let ended = stand_in::stand_in_during_surges(
            seen,
            &mut memory.stand_ins,
            &rollout.stand_ins,
            surge_ends,
            self.now,
        )
        .await;
        let shrinks = &rollout.shrinks;
        let drains = &mut memory.drains;
        let stood_in = ended
            .iter()
            .map(|(deployment, s)| (deployment.clone(), s.pods.clone()))
            .collect();
        let floors = drain::drain_before_shrinks(seen, drains, shrinks, &stood_in, self.now).await;
        let drains = &memory.drains;
        stand_in::end(seen.pods, ended, |deployment, pod| {
            drains
                .get(deployment)
                .is_some_and(|d| d.pods.contains_key(pod))
        })
        .await;
        // A template change: each new worker counts as available once an old one is idle.
        let shrinking = memory.drains.keys().cloned().collect();
        takeover::open_gates(
            seen,
            &mut memory.rollovers,
            &shrinking,
            rules.drain,
            self.now,
        )
        .await;
        floors
    }

    /// Ranks the Pods of each Deployment that shrinks with `release`, its drained workers first.
    async fn rank(
        &self,
        seen: &Observed<'_>,
        memory: &PoolMemory,
        live: &BTreeMap<String, Deployment>,
        release: &rollout::Release,
    ) {
        let to = deployments::counts_by_name(self.pool, Some(&release.replicas));
        for deployment in &release.shrinking {
            let drained = memory
                .drains
                .get(deployment)
                .map(|d| d.idle())
                .unwrap_or_default();
            let from = live.get(deployment).and_then(deployments::spec_replicas);
            let stopping = from.zip(to.get(deployment)).map_or(0, |(f, t)| f - t);
            let stopping = usize::try_from(stopping).unwrap_or(0);
            let shrink = (deployment.as_str(), stopping);
            rank::rank_before_shrink(seen, shrink, &drained).await;
        }
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
fn rules(ctx: &Context) -> Rules {
    let rank = ctx.settings.idle_workers_first;
    Rules {
        surge_timeout: ctx.settings.surge_timeout,
        rank,
        drain: rank && !ctx.settings.drain_timeout.is_zero(),
    }
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
