//! Writes the pool's worker credential Secret (`credential.rs`): a first token, a rotation (the
//! pool asked for one, or the token is older than `--credential-max-age`), the old token dropped
//! once workers have had time to see the new one. A create, then merge patches of this one
//! Secret: nothing else is written, and never a Secret another owner controls.

use k8s_openapi::api::core::v1::Secret;
use k8s_openapi::jiff::Timestamp;
use kube::ResourceExt;
use kube::api::{Api, Patch, PatchParams, PostParams};
use tracing::{info, warn};

use crate::api::LanePool;
use crate::controller::context::Context;
use crate::controller::credential::{self, CredentialMemory};

/// Makes, rotates or trims the pool's credential when due, and returns the one to send (`None`
/// when the pool has none: the reason is in `memory.problem`).
pub(in crate::controller) async fn keep(
    pool: &LanePool,
    ctx: &Context,
    memory: &mut CredentialMemory,
) -> Option<credential::WorkerCredential> {
    if !memory.read || (memory.problem.is_some() && memory.known.is_none()) {
        return memory.known.clone();
    }
    let wanted = credential::wanted_rotation(pool);
    let max_age = ctx.settings.credential_max_age;
    let now = Timestamp::now();
    let fresh = credential::fresh_token;
    let next = match credential::next(memory.known.as_ref(), &wanted, now, max_age, fresh) {
        Ok(Some(next)) => next,
        Ok(None) => return memory.known.clone(),
        Err(error) => {
            warn!(%error, "no randomness for a worker credential");
            memory.problem = Some(format!("no randomness for a new credential: {error}"));
            return memory.known.clone();
        }
    };
    let name = credential::secret_name(&pool.name_any());
    let api: Api<Secret> =
        Api::namespaced(ctx.client.clone(), &pool.namespace().unwrap_or_default());
    let written = match memory.exists {
        false => {
            let secret = credential::secret(pool, &next);
            let params = PostParams::default();
            let create = api.create(&params, &secret);
            ctx.write(format!("creating Secret {name}"), create)
                .await
                .map(drop)
        }
        true => {
            let patch = credential::patch(&next);
            let params = PatchParams::default();
            let patch = Patch::Merge(&patch);
            let update = api.patch(&name, &params, &patch);
            ctx.write(format!("patching Secret {name}"), update)
                .await
                .map(drop)
        }
    };
    match written {
        Ok(()) => {
            if memory.known.as_ref().is_some_and(|k| k.token != next.token) {
                info!(secret = %name, "the workers' credential rotated: the old one is sent to workers that have not seen the new one for 10 minutes");
            }
            memory.known = Some(next);
            memory.exists = true;
            memory.problem = None;
        }
        Err(error) => {
            // Read again next time: a create that lost to another writer, a Secret deleted.
            warn!(%error, "the workers' credential was not written");
            memory.doubt();
            if memory.known.is_none() {
                memory.problem = Some(format!("Secret {name} could not be written: {error}"));
            }
        }
    }
    memory.known.clone()
}
