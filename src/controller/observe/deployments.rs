//! The pool's Deployments the watch cache does not have: a name the pool is to write that is not
//! created yet, or that another owner took (the cache holds only Deployments labelled as a
//! pool's). Asked from the API server once per reconcile, at its start, only for the names
//! missing from the cache: the apply refuses a name another owner holds as this read found it.
//! A read that fails ends the reconcile before anything is measured or written (retried with
//! backoff): unknown means hold.

use std::collections::BTreeMap;

use k8s_openapi::api::apps::v1::Deployment;
use kube::ResourceExt;
use kube::api::Api;

use crate::Result;
use crate::api::LanePool;
use crate::controller::context::Context;
use crate::controller::deployments::pool_roles;
use crate::sizing::Replicas;

/// Each of the pool's Deployment names missing from `cached`, with what the API server has under
/// it (`None`: nothing).
pub(in crate::controller) async fn not_cached(
    pool: &LanePool,
    ctx: &Context,
    cached: &BTreeMap<String, Deployment>,
) -> Result<BTreeMap<String, Option<Deployment>>> {
    let api: Api<Deployment> =
        Api::namespaced(ctx.client.clone(), &pool.namespace().unwrap_or_default());
    let mut found = BTreeMap::new();
    for (name, _, _) in pool_roles(pool, &Replicas::default()) {
        if cached.contains_key(&name) {
            continue;
        }
        let deployment = ctx
            .read(format!("reading Deployment {name}"), api.get_opt(&name))
            .await?;
        found.insert(name, deployment);
    }
    Ok(found)
}
