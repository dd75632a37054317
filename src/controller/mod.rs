//! The LanePool controller: for each watched scope its watches and queue (`watches.rs`), and one
//! reconcile per pool (`reconcile.rs`): observe, plan, act. The modules depend one way, each only
//! on those listed before it:
//! - pure: `protocol`, `cut`, `settings`, `credential` (what steers a worker), `deployments` (the
//!   Deployments a pool runs), `status`, `cached_pod` and `worker` (a Pod as the cache keeps it),
//!   `rollout/` (surge, drains, stand-ins, costs, takeovers), `plan/` (a reconcile's rollout, from
//!   what it saw to its effects; the simulator runs it too), `state/` (what a pool carries
//!   between reconciles), `pool_index`, `triggers`;
//! - the watch caches and the shared context: `caches`, `events`, `worker_http` (the client of
//!   every request to a worker Pod), `context`;
//! - one reconcile's snapshot of a pool's Pods, without I/O: `pods/`;
//! - the two stages that do I/O: `observe/` (every read) and `act/` (every write);
//! - the reconcile and the watches that wake it (`watches.rs`) on top.
//!
//! `tests/structure.rs` fails on an import circle anywhere in the crate.

mod act;
pub(crate) mod cached_pod;
mod caches;
mod context;
mod credential;
mod cut;
mod deployments;
mod events;
#[cfg(test)]
mod fake;
mod observe;
pub(crate) mod plan;
mod pods;
mod pool_index;
mod protocol;
mod reconcile;
pub(crate) mod rollout;
mod settings;
mod state;
mod status;
mod triggers;
mod watches;
pub(crate) mod worker;
mod worker_http;

use std::sync::Arc;
use std::time::Duration;

use kube::runtime::reflector::Store;

pub use context::Context;
pub use deployments::{
    LANES_ENV, POOL_ENV, ROLE_ENV, Role, TEMPLATE_HASH, deployment_name, worker_deployments,
};
pub use events::{PoolEvent, Recorder, SERIES_TTL};
pub use protocol::{BUSY_METRIC, DELETION_COST, DRAINING_METRIC};
pub use reconcile::{error_policy, reconcile};
pub use rollout::cost::{BUSY_COST, DRAINED_COST, IDLE_COST};
pub use rollout::drain::DEFAULT_DRAIN_TIMEOUT;
pub use rollout::grace::GRACE_PERIOD_TOO_SHORT;
pub use rollout::surge::DEFAULT_SURGE_TIMEOUT;
pub use settings::{DEFAULT_CONCURRENT_RECONCILES, DEFAULT_CREDENTIAL_MAX_AGE, MANAGER, Settings};
use state::pools::PoolKey;

use crate::api::LanePool;

/// Runs the controller for `namespaces` (every namespace when empty) until `shutdown` resolves:
/// for each scope its watches and its queue (`watches.rs`), and the sweep of deleted pools.
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
    let mut caches = Vec::new();
    let mut stores = Vec::new();
    let mut fills = Vec::new();
    let mut controllers = Vec::new();
    for namespace in &scopes {
        let scope = watches::scope(&ctx, namespace.as_deref(), shutdown.clone());
        caches.push(scope.caches);
        stores.push(scope.pools);
        fills.extend(scope.fills);
        controllers.push(scope.controller);
    }
    ctx.caches.set(caches);
    let sweep = forget_deleted_pools(ctx, stores);
    tokio::select! {
        _ = futures::future::join_all(controllers) => {}
        _ = sweep => {}
        _ = futures::future::join_all(fills) => {}
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
