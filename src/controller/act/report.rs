//! Reporting a decision on the LanePool: events in the guide's words, the operator's metrics,
//! and the status with its conditions, written only when it changed.

use k8s_openapi::jiff::Timestamp;
use kube::api::{Api, Patch, PatchParams};
use kube::runtime::events::EventType;
use kube::{Resource, ResourceExt};
use tracing::{info, warn};

use std::time::Duration;

use crate::api::{LanePool, LanePoolStatus};
use crate::controller::context::Context;
use crate::controller::plan::Note;
use crate::controller::rollout::grace::GRACE_PERIOD_TOO_SHORT;
use crate::controller::rollout::{Held, WaitsFor};
use crate::controller::settings::MANAGER;
use crate::controller::status::{self, ConditionState};
use crate::sizing::{Decision, Replicas};
use crate::{Error, Result};

/// A decision to report: the reserves it changed from (`applied`), its conditions, and whether
/// the status is written even if it only restates measurements within their tolerance
/// (`refresh`: the measurements shown are getting old).
pub(in crate::controller) struct Decided<'a> {
    pub(in crate::controller) decision: &'a Decision,
    pub(in crate::controller) applied: Option<&'a Replicas>,
    pub(in crate::controller) conditions: Vec<ConditionState>,
    pub(in crate::controller) refresh: bool,
}

/// Reports a decision: events for resized reserves and lost metrics, the metrics, and the
/// status over `old`, with what runs `shown` on it (see [`with_rollout`]); returns the status
/// written, if it was.
pub(in crate::controller) async fn report_decision(
    pool: &LanePool,
    ctx: &Context,
    old: &LanePoolStatus,
    decided: Decided<'_>,
    shown: impl FnOnce(LanePoolStatus) -> LanePoolStatus,
) -> Result<Option<LanePoolStatus>> {
    let Decided {
        decision,
        applied,
        conditions,
        refresh,
    } = decided;
    let namespace = pool.namespace().unwrap_or_default();
    let name = pool.name_any();
    // Events are independent of one another and of the status: they go out together.
    let mut events = Vec::new();
    for lane in &decision.lanes {
        let from = applied.and_then(|a| a.reserved.get(&lane.name).copied());
        if from != Some(lane.reserve) {
            let note = status::scale_note(lane, from);
            info!("{note}");
            events.push(ctx.event(pool, EventType::Normal, "Scaled", note));
        }
    }
    let was_available = old
        .conditions
        .iter()
        .find(|c| c.type_ == status::METRICS_AVAILABLE)
        .map(|c| (c.status.clone(), c.message.clone()));
    let unavailable = conditions
        .iter()
        .find(|c| c.type_ == status::METRICS_AVAILABLE && !c.status);
    if let Some(unavailable) = unavailable {
        // Once per change: a new reason, or the outage policy moving to its next stage.
        if was_available != Some(("False".into(), unavailable.message.clone())) {
            events.push(ctx.event(
                pool,
                EventType::Warning,
                "MetricsUnavailable",
                // Each unmeasured lane's explanation already carries its reason.
                decision.summary(),
            ));
        }
    }
    // A warning condition that turns true (or names another lane) is also an event.
    // So is a total below what the reserves ask: which lane got what.
    for warning in conditions.iter().filter(|c| {
        c.status
            && (c.type_ == GRACE_PERIOD_TOO_SHORT
                || (c.type_ == status::SCALING_LIMITED && c.reason == status::BELOW_RESERVES))
    }) {
        let was = old.conditions.iter().find(|c| c.type_ == warning.type_);
        if was.is_none_or(|c| c.status != "True" || c.message != warning.message) {
            events.push(ctx.event(
                pool,
                EventType::Warning,
                &warning.reason,
                warning.message.clone(),
            ));
        }
    }
    // Workers that cannot start (an image that cannot be pulled, a crash loop), the one thing
    // that turns a decision's Ready False: once when it turns False, or for another reason.
    let cannot_start = conditions
        .iter()
        .find(|c| c.type_ == status::READY && !c.status);
    if let Some(stuck) = cannot_start {
        let was = old.conditions.iter().find(|c| c.type_ == status::READY);
        if was.is_none_or(|c| c.status != "False" || c.reason != stuck.reason) {
            events.push(ctx.event(
                pool,
                EventType::Warning,
                status::WORKERS_CANNOT_START,
                stuck.message.clone(),
            ));
        }
    }
    ctx.metrics.decided(&namespace, &name, decision);
    let mut new = status::decision_status(decision, pool);
    new.conditions = status::merge_conditions(
        &old.conditions,
        &conditions,
        pool.metadata.generation,
        Timestamp::now(),
    );
    let new = shown(new);
    let events = futures::future::join_all(events);
    // The recent rate is counted over about one interval (a read of the workers).
    let recent_window = pool.spec.interval.get().unwrap_or(Duration::from_secs(5));
    if !refresh && status::settled(old, &new, recent_window) {
        // The status stands as written: the conditions it shows are exported as they are.
        ctx.metrics.reported(&namespace, &name, old);
        events.await;
        return Ok(None);
    }
    let (_, written) = futures::join!(events, write_status(pool, ctx, old, new.clone()));
    written?;
    Ok(Some(new))
}

/// Writes the events the plan said (a drain or stand-in started).
pub(in crate::controller) async fn report_events(pool: &LanePool, ctx: &Context, notes: Vec<Note>) {
    for (type_, reason, note) in notes {
        ctx.event(pool, type_, reason, note).await;
    }
}

/// Between decisions: the last status this process wrote (`last`), with what runs now `shown`
/// on it, written when that changed (a shrink that started or stopped waiting). Returns the
/// status written, if it was.
pub(in crate::controller) async fn report_rollout(
    pool: &LanePool,
    ctx: &Context,
    last: &LanePoolStatus,
    shown: impl FnOnce(LanePoolStatus) -> LanePoolStatus,
) -> Result<Option<LanePoolStatus>> {
    let new = shown(last.clone());
    if new == *last {
        return Ok(None);
    }
    write_status(pool, ctx, last, new.clone()).await?;
    Ok(Some(new))
}

/// Says on the status that the pool is paused: its Deployments are left alone.
pub(in crate::controller) async fn report_paused(pool: &LanePool, ctx: &Context) -> Result<()> {
    let old = pool.status.clone().unwrap_or_default();
    let observed = [ConditionState::new(
        status::PAUSED,
        true,
        "Paused",
        "spec.paused is true: the Deployments are left alone",
    )];
    let mut new = old.clone();
    // Paused, the Deployments are left alone: no shrink waits.
    new.rollout = None;
    new.conditions = status::merge_conditions(
        &old.conditions,
        &observed,
        pool.metadata.generation,
        Timestamp::now(),
    );
    write_status(pool, ctx, &old, new).await
}

/// `status` with what runs: each lane's `running` count from `running`, `reserves` as
/// "lane runs → decided" where they differ, and `rollout` saying what each waiting shrink waits
/// for (`held`), with `wall` turning the operator's clock into the time of day.
pub(in crate::controller) fn with_rollout(
    mut status: LanePoolStatus,
    running: &Replicas,
    held: &[Held],
    wall: impl Fn(Duration) -> Timestamp,
) -> LanePoolStatus {
    if status.lanes.is_empty() && status.last_decision.is_none() {
        // Nothing decided shown yet: nothing to say what runs beside.
        return status;
    }
    for lane in &mut status.lanes {
        lane.running = running.reserved.get(&lane.name).copied();
    }
    if !status.lanes.is_empty() {
        let reserves: Vec<String> = status
            .lanes
            .iter()
            .map(|lane| match lane.running.filter(|r| *r != lane.reserve) {
                Some(runs) => format!("{} {runs} → {}", lane.name, lane.reserve),
                None => format!("{} {}", lane.name, lane.reserve),
            })
            .collect();
        status.reserves = Some(reserves.join(", "));
    }
    let notes: Vec<String> = held
        .iter()
        .map(|held| {
            let waits = match &held.waits_for {
                WaitsFor::Drained(1) => "1 draining worker is idle".to_string(),
                WaitsFor::Drained(busy) => format!("{busy} draining workers are idle"),
                WaitsFor::Ready(deployments) if deployments.is_empty() => {
                    "the Deployments taking over are ready".to_string()
                }
                WaitsFor::Ready(deployments) => deployments
                    .iter()
                    .map(|(name, ready, target)| format!("{name} is ready ({ready} of {target})"))
                    .collect::<Vec<_>>()
                    .join(" and "),
            };
            let until = wall(held.until);
            let by = until
                .round(k8s_openapi::jiff::Unit::Second)
                .unwrap_or(until);
            format!(
                "Deployment {} runs {}, shrinks to {} once {waits}, by {by}",
                held.deployment, held.runs, held.to
            )
        })
        .collect();
    status.rollout = (!notes.is_empty()).then(|| notes.join("; "));
    status
}

pub(in crate::controller) async fn report_failure(pool: &LanePool, ctx: &Context, error: &Error) {
    let old = pool.status.clone().unwrap_or_default();
    let mut new = old.clone();
    new.conditions = status::merge_conditions(
        &old.conditions,
        &[ConditionState::new(
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

/// Writes `new` over `old` when they differ; once the status on the cluster is `new`, its
/// conditions and held shrink are exported (`lanepool_operator_pool_condition`,
/// `lanepool_operator_shrink_held`). A status not written (refused, timed out, or not the leader)
/// leaves the series as they were: they say what `kubectl describe` says.
pub(in crate::controller) async fn write_status(
    pool: &LanePool,
    ctx: &Context,
    old: &LanePoolStatus,
    new: LanePoolStatus,
) -> Result<()> {
    let namespace = pool.namespace().unwrap_or_default();
    if *old != new {
        let api: Api<LanePool> = Api::namespaced(ctx.client.clone(), &namespace);
        let patch = serde_json::json!({
            "apiVersion": LanePool::api_version(&()),
            "kind": LanePool::kind(&()),
            "status": &new,
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
    }
    ctx.metrics.reported(&namespace, &pool.name_any(), &new);
    Ok(())
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use super::*;
    use crate::api::LaneStatus;
    use crate::metrics::POOL_CONDITION_TYPES;

    #[test]
    fn every_condition_the_operator_sets_is_exported() {
        let set = [
            status::READY,
            status::METRICS_AVAILABLE,
            status::SCALING_LIMITED,
            status::PAUSED,
            GRACE_PERIOD_TOO_SHORT,
        ];
        assert_eq!(POOL_CONDITION_TYPES, set);
    }

    fn decided(reserve: i32) -> LanePoolStatus {
        LanePoolStatus {
            reserves: Some(format!("urgent {reserve}")),
            lanes: vec![LaneStatus {
                name: "urgent".into(),
                reserve,
                ..Default::default()
            }],
            last_decision: Some("…".into()),
            ..Default::default()
        }
    }

    fn running(reserve: i32, shared: i32) -> Replicas {
        Replicas {
            reserved: BTreeMap::from([("urgent".into(), reserve)]),
            shared,
        }
    }

    #[test]
    fn a_held_shrink_shows_what_runs_what_it_waits_for_and_until_when() {
        let wall = |at: Duration| Timestamp::from_second(1_800_000_000).unwrap() + at;
        let settled = with_rollout(decided(1), &running(1, 9), &[], wall);
        assert_eq!(settled.reserves.as_deref(), Some("urgent 1"));
        assert_eq!(settled.lanes[0].running, Some(1));
        assert_eq!(settled.rollout, None);
        let held = [
            Held {
                deployment: "jobs-urgent-reserved".into(),
                runs: 4,
                to: 1,
                waits_for: WaitsFor::Drained(2),
                until: Duration::from_millis(9_400),
            },
            Held {
                deployment: "jobs-shared".into(),
                runs: 9,
                to: 7,
                waits_for: WaitsFor::Ready(vec![("jobs-other-reserved".into(), 1, 3)]),
                until: Duration::from_secs(120),
            },
        ];
        let waiting = with_rollout(decided(1), &running(4, 9), &held, wall);
        assert_eq!(waiting.reserves.as_deref(), Some("urgent 4 → 1"));
        assert_eq!(waiting.lanes[0].running, Some(4));
        assert_eq!(
            waiting.rollout.as_deref(),
            Some(
                "Deployment jobs-urgent-reserved runs 4, shrinks to 1 once 2 draining workers are \
                 idle, by 2027-01-15T08:00:09Z; Deployment jobs-shared runs 9, shrinks to 7 once \
                 jobs-other-reserved is ready (1 of 3), by 2027-01-15T08:02:00Z"
            )
        );
        assert!(
            !status::settled(&settled, &waiting, Duration::from_secs(5)),
            "a change to write"
        );
        // A pool with nothing decided yet shows nothing.
        let empty = with_rollout(LanePoolStatus::default(), &running(4, 9), &held, wall);
        assert_eq!(empty, LanePoolStatus::default());
    }
}
