//! The rollout's requests to workers and Pods, performed: the deletion costs and readiness gates
//! first (a worker called back loses its mark to go first before it takes a job), then each
//! request to a worker (`POST /drain`, `POST /stand-in`) through `requests.rs`. Returns what each
//! worker answered, for the plan's next reconcile (`plan::record`).

use std::collections::HashMap;

use kube::ResourceExt;

use super::requests::PodPart;
use crate::api::LanePool;
use crate::controller::context::Context;
use crate::controller::plan::{Answer, Ask, Effects, Records, Request, StandInAnswer};
use crate::controller::pods::{PoolPods, gauge_values, read_answer};
use crate::controller::protocol::{STANDING_IN_METRIC, TAKEOVER_CONDITION};
use crate::controller::rollout::drain::DrainAnswer;
use crate::controller::worker::Worker;
use crate::controller::worker_http::Refused;

/// Performs the rollout's Pod patches and requests to workers; returns the answers.
pub(in crate::controller) async fn steer(
    (pool, ctx, pods): (&LanePool, &Context, &PoolPods<'_>),
    effects: &Effects,
) -> Vec<(Ask, Answer)> {
    futures::join!(
        pods.set_deletion_costs(effects.costs.clone()),
        set_takeovers(pods, &effects.gates),
    );
    // One ask per Pod (the plan makes it so): an answer is found by its Pod's name.
    let workers: HashMap<&str, &Worker> = pods
        .workers()
        .iter()
        .map(|w| (w.name.as_str(), w))
        .collect();
    let requests = effects
        .asks
        .iter()
        .filter_map(|ask| Some((*workers.get(ask.pod.as_str())?, ask.request.path())))
        .collect();
    let mut replies: HashMap<String, _> = pods.post(requests).await.into_iter().collect();
    let (namespace, name) = (pool.namespace().unwrap_or_default(), pool.name_any());
    let mut answered = Vec::new();
    for ask in &effects.asks {
        let Some(reply) = replies.remove(&ask.pod) else {
            continue;
        };
        let answer = read(&ask.request, reply);
        match (&ask.records, answer) {
            (Records::Drain(_) | Records::Rollover(_), Answer::Drain(drain)) => {
                ctx.metrics
                    .drain_answered(&namespace, &name, drain.outcome());
            }
            (Records::StandIn(_), Answer::StandIn(stand_in)) => {
                ctx.metrics
                    .stand_in_answered(&namespace, &name, stand_in.outcome());
            }
            _ => {}
        }
        answered.push((ask.clone(), answer));
    }
    answered
}

/// What a worker's reply to `request` says.
fn read(request: &Request, reply: Result<(u16, String), Refused>) -> Answer {
    match request {
        Request::Drain(_) => Answer::Drain(match reply {
            Ok((status, text)) => read_answer(status, &text),
            Err(refused) if refused.unknown() => DrainAnswer::Unreachable,
            Err(_) => DrainAnswer::Refused,
        }),
        Request::StandIn { .. } | Request::OwnLanes => Answer::StandIn(match reply {
            Ok((200, text))
                if gauge_values(&text, STANDING_IN_METRIC)
                    .iter()
                    .any(|v| *v > 0.0) =>
            {
                StandInAnswer::StandingIn
            }
            Err(refused) if refused.unknown() => StandInAnswer::Unreachable,
            Ok(_) | Err(_) => StandInAnswer::Refused,
        }),
    }
}

/// Sets each named Pod's condition [`TAKEOVER_CONDITION`] to True, with its reason (only that
/// condition of its status). A failure is logged: the next reconcile tries again.
async fn set_takeovers(pods: &PoolPods<'_>, open: &[(String, &'static str)]) {
    if open.is_empty() {
        return;
    }
    let now = k8s_openapi::jiff::Timestamp::now().to_string();
    let patches = open
        .iter()
        .map(|(name, reason)| {
            let patch = serde_json::json!({"status": {"conditions": [{
                "type": TAKEOVER_CONDITION, "status": "True", "reason": reason,
                "lastTransitionTime": now,
            }]}});
            (name.clone(), patch)
        })
        .collect();
    let (doing, failed) = ("opening the readiness gate of", "readiness gate not opened");
    pods.patch_each(patches, PodPart::Status, doing, failed)
        .await;
}
