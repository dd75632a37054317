//! Whether an autoscaler fights the operator over a Deployment it owns: read from the watch
//! cache of the pool's namespace's HorizontalPodAutoscalers.

use kube::ResourceExt;

use crate::api::LanePool;
use crate::controller::context::Context;
use crate::controller::deployments::pool_roles;
use crate::sizing::Replicas;

/// The HorizontalPodAutoscaler that targets one of the pool's Deployments, said as the
/// condition's message; `None` when none does.
pub(in crate::controller) fn autoscaler_conflict(
    pool: &LanePool,
    ctx: &Context,
    namespace: &str,
) -> Option<String> {
    let autoscalers = ctx.caches.autoscalers(namespace);
    let ours = pool_roles(pool, &Replicas::default());
    autoscalers.iter().find_map(|hpa| {
        let target = &hpa.spec.as_ref()?.scale_target_ref;
        let (name, _, _) = ours
            .iter()
            .find(|(name, _, _)| target.kind == "Deployment" && *name == target.name)?;
        Some(format!(
            "HorizontalPodAutoscaler {} targets Deployment {name}: lanepool owns its replicas and undoes the autoscaler's changes; delete the autoscaler",
            hpa.name_any(),
        ))
    })
}
