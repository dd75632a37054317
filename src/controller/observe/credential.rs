//! Reads the pool's worker credential Secret (`credential.rs`), by name, when this process has not
//! read it yet or workers refused every token it knows; otherwise the pool's memory holds it and
//! nothing is read. Never lists Secrets, never reads one the pool does not own.

use k8s_openapi::api::core::v1::Secret;
use kube::ResourceExt;
use kube::api::Api;
use tracing::warn;

use crate::api::LanePool;
use crate::controller::context::Context;
use crate::controller::credential::{self, CredentialMemory};

/// Brings `memory` up to date with the pool's Secret when it is in doubt. A read that fails, or a
/// Secret of that name another owner controls, leaves the pool without a credential to send (its
/// shrinks that need a drain wait; nothing else does) and says why in `memory.problem`.
pub(in crate::controller) async fn read(
    pool: &LanePool,
    ctx: &Context,
    memory: &mut CredentialMemory,
) {
    if memory.read {
        return;
    }
    let namespace = pool.namespace().unwrap_or_default();
    let name = credential::secret_name(&pool.name_any());
    let api: Api<Secret> = Api::namespaced(ctx.client.clone(), &namespace);
    let secret = match ctx
        .read(format!("reading Secret {name}"), api.get_opt(&name))
        .await
    {
        Ok(secret) => secret,
        Err(error) => {
            warn!(%error, "the workers' credential could not be read");
            // A credential known before is still sent; without one, nothing is.
            if memory.known.is_none() {
                memory.problem = Some(format!("Secret {name} could not be read: {error}"));
            }
            return;
        }
    };
    *memory = CredentialMemory {
        read: true,
        exists: secret.is_some(),
        ..CredentialMemory::default()
    };
    match secret.as_ref().map(|s| credential::from_secret(pool, s)) {
        None | Some(Ok(None)) => {}
        Some(Ok(Some(known))) => memory.known = Some(known),
        Some(Err(owner)) => {
            memory.problem = Some(format!(
                "Secret {name} exists and is not this pool's ({owner}); nothing was written to \
                 it and no worker is sent a drain or stand-in: rename the pool or delete that \
                 Secret"
            ));
        }
    }
}
