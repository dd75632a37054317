//! Reporting a decision on the LanePool: events in the guide's words, the operator's metrics,
//! and the status with its conditions, written only when it changed.

use k8s_openapi::jiff::Timestamp;
use kube::api::{Api, Patch, PatchParams};
use kube::runtime::events::EventType;
use kube::{Resource, ResourceExt};
use tracing::{info, warn};

use super::context::{Context, MANAGER};
use super::plan::grace::GRACE_PERIOD_TOO_SHORT;
use super::status::{self, ConditionState};
use crate::api::{LanePool, LanePoolStatus};
use crate::sizing::{Decision, Replicas};
use crate::{Error, Result};

/// Reports a decision: events for resized reserves and lost metrics, the metrics, and the
/// status. A status that only restates measurements within their tolerance is not written
/// unless `refresh` (the measurements shown are getting old); returns whether it was written.
pub(super) async fn report_decision(
    pool: &LanePool,
    ctx: &Context,
    old: &LanePoolStatus,
    decision: &Decision,
    applied: Option<&Replicas>,
    conditions: Vec<ConditionState>,
    refresh: bool,
) -> Result<bool> {
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
    for warning in conditions
        .iter()
        .filter(|c| c.type_ == GRACE_PERIOD_TOO_SHORT && c.status)
    {
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
    ctx.metrics.decided(&namespace, &name, decision);
    let mut new = status::decision_status(decision, pool);
    new.conditions = status::merge_conditions(
        &old.conditions,
        &conditions,
        pool.metadata.generation,
        Timestamp::now(),
    );
    let events = futures::future::join_all(events);
    if !refresh && status::settled(old, &new) {
        events.await;
        return Ok(false);
    }
    let (_, written) = futures::join!(events, write_status(pool, ctx, old, new));
    written?;
    Ok(true)
}

/// Says on the status that the pool is paused: its Deployments are left alone.
pub(super) async fn report_paused(pool: &LanePool, ctx: &Context) -> Result<()> {
    let old = pool.status.clone().unwrap_or_default();
    let observed = [ConditionState::new(
        status::PAUSED,
        true,
        "Paused",
        "spec.paused is true: the Deployments are left alone",
    )];
    let mut new = old.clone();
    new.conditions = status::merge_conditions(
        &old.conditions,
        &observed,
        pool.metadata.generation,
        Timestamp::now(),
    );
    write_status(pool, ctx, &old, new).await
}

pub(super) async fn report_failure(pool: &LanePool, ctx: &Context, error: &Error) {
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

pub(super) async fn write_status(
    pool: &LanePool,
    ctx: &Context,
    old: &LanePoolStatus,
    new: LanePoolStatus,
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
