//! The pool's worker credential: one random token per LanePool, kept in a Secret the pool owns
//! (`<pool>-worker-credential`), mounted into the pool's workers and sent with every drain and
//! stand-in request, so only the operator steers a worker. Pure: what the Secret holds, how it is
//! mounted, when it rotates. The read is `observe/credential.rs`, the write `act/credential.rs`.
//! Never logs, shows or counts a token: its `Debug` form is redacted.

use std::collections::BTreeMap;
use std::time::Duration;

use base64::Engine;
use k8s_openapi::ByteString;
use k8s_openapi::api::core::v1::{
    Container, EnvVar, KeyToPath, PodSpec, Secret, SecretVolumeSource, Volume, VolumeMount,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use k8s_openapi::jiff::{SignedDuration, Timestamp};
use kube::{Resource, ResourceExt};

use crate::api::{LanePool, POOL_LABEL};

/// The Secret's key of the token workers check.
pub const TOKEN_KEY: &str = "token";
/// The Secret's key of the token before the last rotation, while workers may still hold it.
pub const PREVIOUS_KEY: &str = "previous";
/// When the token was last made (RFC 3339), on the Secret.
pub const ROTATED_AT: &str = "lanepool.dev/rotated-at";
/// On the Secret: the value of the pool's [`ROTATE_ANNOTATION`] the token answers.
pub const ROTATION: &str = "lanepool.dev/rotation";
/// On the LanePool: a new value asks for a new token.
pub const ROTATE_ANNOTATION: &str = "lanepool.dev/rotate-credential";
/// The workers' environment variable naming the token's file.
pub const CREDENTIAL_FILE_ENV: &str = "LANEPOOL_CREDENTIAL_FILE";
/// The volume of the Secret in the workers' Pods.
pub const CREDENTIAL_VOLUME: &str = "lanepool-credential";
/// Where the volume is mounted in every container of the pool's workers.
pub const CREDENTIAL_DIR: &str = "/var/run/secrets/lanepool.dev/worker";
/// How long the token before a rotation is still sent to workers that answer 401 to the new
/// one: the kubelet refreshes a mounted Secret within its sync period and cache TTL (about a
/// minute each by default), so ten minutes leaves every live worker time to see the new file.
pub const PREVIOUS_KEPT: Duration = Duration::from_secs(600);
/// The bytes of randomness in a token (64 hex characters).
const TOKEN_BYTES: usize = 32;

/// The name of the pool's credential Secret (a pool's name is at most 63 bytes: this fits).
pub fn secret_name(pool: &str) -> String {
    format!("{pool}-worker-credential")
}

/// The pool's credential as the operator knows it.
#[derive(Clone, PartialEq, Eq)]
pub struct WorkerCredential {
    pub(in crate::controller) token: String,
    pub(in crate::controller) previous: Option<String>,
    pub(in crate::controller) rotated_at: Timestamp,
    /// The pool's [`ROTATE_ANNOTATION`] this token answers ("" when it has none).
    pub(in crate::controller) rotation: String,
}

impl std::fmt::Debug for WorkerCredential {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("WorkerCredential")
            .field("token", &"<redacted>")
            .field("previous", &self.previous.as_ref().map(|_| "<redacted>"))
            .field("rotated_at", &self.rotated_at)
            .field("rotation", &self.rotation)
            .finish()
    }
}

impl WorkerCredential {
    /// The tokens to try, in order: the current one, then the one before a recent rotation.
    pub fn tokens(&self) -> impl Iterator<Item = &str> {
        std::iter::once(self.token.as_str()).chain(self.previous.as_deref())
    }
}

/// What a pool carries of its credential between reconciles: the Secret is read once per process
/// (and again after workers refused every token known), then only written.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct CredentialMemory {
    /// The credential as last read or written.
    pub(in crate::controller) known: Option<WorkerCredential>,
    /// Whether the Secret has been read (or written) by this process since it was last doubted.
    pub(in crate::controller) read: bool,
    /// Whether the Secret exists (a write patches it rather than creating it).
    pub(in crate::controller) exists: bool,
    /// Why the pool has no credential to send, for its status.
    pub(in crate::controller) problem: Option<String>,
}

impl CredentialMemory {
    /// Forgets what was read: workers refused every token known (the Secret was changed or
    /// deleted behind the operator's back), so the next reconcile reads it again.
    pub fn doubt(&mut self) {
        self.read = false;
    }
}

/// A new random token: 32 bytes from the operating system, as lowercase hex.
pub fn fresh_token() -> Result<String, getrandom::Error> {
    let mut bytes = [0u8; TOKEN_BYTES];
    getrandom::fill(&mut bytes)?;
    Ok(bytes.iter().map(|b| format!("{b:02x}")).collect())
}

/// Whether `token` is one this operator makes: 64 lowercase hex characters. Anything else in the
/// Secret (edited by hand, truncated) is replaced, never sent.
fn well_formed(token: &str) -> bool {
    token.len() == TOKEN_BYTES * 2
        && token
            .bytes()
            .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
}

/// What the pool's Secret says, when it is the pool's and holds a well-formed token. A Secret
/// that another owner controls is `Err` with that owner (nothing of it is read or written).
pub fn from_secret(pool: &LanePool, secret: &Secret) -> Result<Option<WorkerCredential>, String> {
    let uid = pool.uid().unwrap_or_default();
    let owner = secret
        .owner_references()
        .iter()
        .find(|o| o.controller == Some(true));
    match owner {
        Some(owner) if owner.uid == uid && owner.kind == LanePool::kind(&()) => {}
        Some(owner) => return Err(format!("controlled by {} {}", owner.kind, owner.name)),
        None => return Err("controlled by nothing".into()),
    }
    let data = secret.data.clone().unwrap_or_default();
    let text = |key: &str| {
        data.get(key)
            .and_then(|v| String::from_utf8(v.0.clone()).ok())
            .filter(|t| well_formed(t))
    };
    let Some(token) = text(TOKEN_KEY) else {
        return Ok(None);
    };
    let annotations = secret.annotations();
    let rotated_at = annotations
        .get(ROTATED_AT)
        .and_then(|at| at.parse().ok())
        .unwrap_or(Timestamp::UNIX_EPOCH);
    Ok(Some(WorkerCredential {
        token,
        previous: text(PREVIOUS_KEY),
        rotated_at,
        rotation: annotations.get(ROTATION).cloned().unwrap_or_default(),
    }))
}

/// The rotation the pool asks for: its [`ROTATE_ANNOTATION`], or "".
pub fn wanted_rotation(pool: &LanePool) -> String {
    pool.annotations()
        .get(ROTATE_ANNOTATION)
        .cloned()
        .unwrap_or_default()
}

/// The credential the pool should have now, when it differs from `current`: a first token; a
/// new one when the pool asks for another rotation or the token is older than `max_age` (zero:
/// never by age), the old kept as `previous`; the previous dropped once [`PREVIOUS_KEPT`] has
/// passed. `fresh` makes a token, only when one is needed; its failure is the answer.
pub fn next<E>(
    current: Option<&WorkerCredential>,
    wanted_rotation: &str,
    now: Timestamp,
    max_age: Duration,
    fresh: impl FnOnce() -> Result<String, E>,
) -> Result<Option<WorkerCredential>, E> {
    let Some(current) = current else {
        return Ok(Some(WorkerCredential {
            token: fresh()?,
            previous: None,
            rotated_at: now,
            rotation: wanted_rotation.to_string(),
        }));
    };
    let age = now.duration_since(current.rotated_at);
    let older_than =
        |limit: Duration| SignedDuration::try_from(limit).is_ok_and(|limit| age >= limit);
    if current.rotation != wanted_rotation || (!max_age.is_zero() && older_than(max_age)) {
        return Ok(Some(WorkerCredential {
            token: fresh()?,
            previous: Some(current.token.clone()),
            rotated_at: now,
            rotation: wanted_rotation.to_string(),
        }));
    }
    if current.previous.is_some() && older_than(PREVIOUS_KEPT) {
        return Ok(Some(WorkerCredential {
            previous: None,
            ..current.clone()
        }));
    }
    Ok(None)
}

/// The pool's credential Secret holding `credential`, controlled by the pool (deleted with it).
pub fn secret(pool: &LanePool, credential: &WorkerCredential) -> Secret {
    let bytes = |t: &str| ByteString(t.as_bytes().to_vec());
    let mut data = BTreeMap::from([(TOKEN_KEY.to_string(), bytes(&credential.token))]);
    if let Some(previous) = &credential.previous {
        data.insert(PREVIOUS_KEY.to_string(), bytes(previous));
    }
    Secret {
        metadata: ObjectMeta {
            name: Some(secret_name(&pool.name_any())),
            namespace: pool.namespace(),
            labels: Some(BTreeMap::from([(POOL_LABEL.into(), pool.name_any())])),
            annotations: Some(annotations(credential)),
            owner_references: pool.controller_owner_ref(&()).map(|owner| vec![owner]),
            ..ObjectMeta::default()
        },
        data: Some(data),
        type_: Some("Opaque".into()),
        ..Secret::default()
    }
}

fn annotations(credential: &WorkerCredential) -> BTreeMap<String, String> {
    BTreeMap::from([
        (ROTATED_AT.to_string(), credential.rotated_at.to_string()),
        (ROTATION.to_string(), credential.rotation.clone()),
    ])
}

/// The merge patch that turns the pool's Secret into one holding `credential` (a `previous` no
/// longer kept is removed).
pub fn patch(credential: &WorkerCredential) -> serde_json::Value {
    let encode = |t: &str| base64::engine::general_purpose::STANDARD.encode(t);
    serde_json::json!({
        "metadata": {"annotations": annotations(credential)},
        "data": {
            TOKEN_KEY: encode(&credential.token),
            PREVIOUS_KEY: credential.previous.as_deref().map(encode),
        },
    })
}

/// Mounts the pool's credential into every container of `spec` (the Secret's `token` alone,
/// read-only, the file named by [`CREDENTIAL_FILE_ENV`]). Optional: a worker that starts before
/// the Secret exists runs and takes jobs; it refuses to be steered until the kubelet mounts it.
pub fn mount(pool: &str, spec: &mut PodSpec) {
    let volumes = spec.volumes.get_or_insert_with(Vec::new);
    volumes.retain(|v| v.name != CREDENTIAL_VOLUME);
    volumes.push(Volume {
        name: CREDENTIAL_VOLUME.into(),
        secret: Some(SecretVolumeSource {
            secret_name: Some(secret_name(pool)),
            optional: Some(true),
            items: Some(vec![KeyToPath {
                key: TOKEN_KEY.into(),
                path: TOKEN_KEY.into(),
                mode: None,
            }]),
            default_mode: None,
        }),
        ..Volume::default()
    });
    for container in &mut spec.containers {
        mount_in(container);
    }
}

fn mount_in(container: &mut Container) {
    let mounts = container.volume_mounts.get_or_insert_with(Vec::new);
    mounts.retain(|m| m.name != CREDENTIAL_VOLUME && m.mount_path != CREDENTIAL_DIR);
    mounts.push(VolumeMount {
        name: CREDENTIAL_VOLUME.into(),
        mount_path: CREDENTIAL_DIR.into(),
        read_only: Some(true),
        ..VolumeMount::default()
    });
    let vars = container.env.get_or_insert_with(Vec::new);
    vars.retain(|v| v.name != CREDENTIAL_FILE_ENV);
    vars.push(EnvVar {
        name: CREDENTIAL_FILE_ENV.into(),
        value: Some(format!("{CREDENTIAL_DIR}/{TOKEN_KEY}")),
        value_from: None,
    });
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;

    fn pool() -> LanePool {
        let mut pool: LanePool = serde_json::from_value(serde_json::json!({
            "apiVersion": "lanepool.dev/v1alpha1", "kind": "LanePool",
            "metadata": {"name": "jobs", "namespace": "team", "uid": "u-1"},
            "spec": {"lanes": [{"name": "urgent"}], "totalWorkers": 4, "template": {}},
        }))
        .unwrap();
        pool.metadata.annotations = None;
        pool
    }

    fn at(seconds: i64) -> Timestamp {
        Timestamp::from_second(1_800_000_000 + seconds).unwrap()
    }

    fn credential(token: char, previous: Option<char>, rotated: i64) -> WorkerCredential {
        WorkerCredential {
            token: token.to_string().repeat(64),
            previous: previous.map(|p| p.to_string().repeat(64)),
            rotated_at: at(rotated),
            rotation: String::new(),
        }
    }

    const DAY: Duration = Duration::from_secs(86_400);

    /// [`super::next`] with a token maker that cannot fail.
    fn next(
        current: Option<&WorkerCredential>,
        wanted_rotation: &str,
        now: Timestamp,
        max_age: Duration,
        fresh: impl FnOnce() -> String,
    ) -> Option<WorkerCredential> {
        let fresh = || Ok::<_, std::convert::Infallible>(fresh());
        let Ok(next) = super::next(current, wanted_rotation, now, max_age, fresh);
        next
    }

    #[test]
    fn a_token_is_64_hex_characters_and_never_the_same_twice() {
        let (a, b) = (fresh_token().unwrap(), fresh_token().unwrap());
        assert!(well_formed(&a) && well_formed(&b), "{}", a.len());
        assert_ne!(a, b);
    }

    #[test]
    fn a_pool_without_a_credential_gets_one_and_a_rotation_keeps_the_old_for_ten_minutes() {
        let first = next(None, "", at(0), DAY, || "a".repeat(64)).unwrap();
        assert_eq!(first.tokens().collect::<Vec<_>>(), ["a".repeat(64)]);
        assert_eq!(next(Some(&first), "", at(60), DAY, || unreachable!()), None);
        let rotated = next(Some(&first), "2026-12-05", at(60), DAY, || "b".repeat(64)).unwrap();
        assert_eq!(
            rotated.tokens().collect::<Vec<_>>(),
            ["b".repeat(64), "a".repeat(64)]
        );
        assert_eq!(rotated.rotation, "2026-12-05");
        let kept = 60 + PREVIOUS_KEPT.as_secs() as i64;
        assert_eq!(
            next(
                Some(&rotated),
                "2026-12-05",
                at(kept - 1),
                DAY,
                || unreachable!()
            ),
            None
        );
        let dropped = next(
            Some(&rotated),
            "2026-12-05",
            at(kept),
            DAY,
            || unreachable!(),
        )
        .unwrap();
        assert_eq!(dropped.tokens().collect::<Vec<_>>(), ["b".repeat(64)]);
    }

    #[test]
    fn a_token_older_than_the_most_age_rotates_and_zero_never_does() {
        let old = credential('a', None, 0);
        let day = DAY.as_secs() as i64;
        assert_eq!(
            next(Some(&old), "", at(day - 1), DAY, || unreachable!()),
            None
        );
        let rotated = next(Some(&old), "", at(day), DAY, || "c".repeat(64)).unwrap();
        assert_eq!(rotated.previous.as_deref(), Some(&*"a".repeat(64)));
        let never = Duration::ZERO;
        assert_eq!(
            next(Some(&old), "", at(100 * day), never, || unreachable!()),
            None
        );
    }

    #[test]
    fn the_secret_round_trips_and_another_owners_secret_is_never_read() {
        let pool = pool();
        let credential = credential('d', Some('e'), 5);
        let mut secret = secret(&pool, &credential);
        assert_eq!(
            secret.metadata.name.as_deref(),
            Some("jobs-worker-credential")
        );
        assert_eq!(from_secret(&pool, &secret), Ok(Some(credential.clone())));
        // A token edited by hand is not one this operator made: replaced, never sent.
        let mut edited = secret.clone();
        edited
            .data
            .as_mut()
            .unwrap()
            .insert(TOKEN_KEY.into(), ByteString(b"guess".to_vec()));
        assert_eq!(from_secret(&pool, &edited), Ok(None));
        secret.metadata.owner_references = Some(vec![OwnerReference {
            api_version: "v1".into(),
            kind: "ConfigMap".into(),
            name: "other".into(),
            uid: "u-2".into(),
            controller: Some(true),
            ..OwnerReference::default()
        }]);
        assert_eq!(
            from_secret(&pool, &secret),
            Err("controlled by ConfigMap other".into())
        );
        secret.metadata.owner_references = None;
        assert!(from_secret(&pool, &secret).is_err());
    }

    #[test]
    fn the_patch_removes_a_previous_no_longer_kept() {
        let patch = patch(&credential('f', None, 0));
        assert_eq!(patch["data"][PREVIOUS_KEY], serde_json::Value::Null);
        let token = base64::engine::general_purpose::STANDARD.encode("f".repeat(64));
        assert_eq!(patch["data"][TOKEN_KEY], token.as_str());
    }

    #[test]
    fn the_debug_form_shows_no_token() {
        let shown = format!("{:?}", credential('a', Some('b'), 0));
        assert!(
            !shown.contains("aaaa") && !shown.contains("bbbb"),
            "{shown}"
        );
    }

    #[test]
    fn every_container_gets_the_token_file_once() {
        let mut spec: PodSpec = serde_json::from_value(serde_json::json!({
            "containers": [
                {"name": "worker", "env": [{"name": CREDENTIAL_FILE_ENV, "value": "/tmp/mine"}]},
                {"name": "sidecar"},
            ],
        }))
        .unwrap();
        mount("jobs", &mut spec);
        mount("jobs", &mut spec);
        let volumes = spec.volumes.as_ref().unwrap();
        assert_eq!(volumes.len(), 1);
        let source = volumes[0].secret.as_ref().unwrap();
        assert_eq!(
            source.secret_name.as_deref(),
            Some("jobs-worker-credential")
        );
        assert_eq!(source.optional, Some(true));
        for container in &spec.containers {
            let file: Vec<_> = container
                .env
                .iter()
                .flatten()
                .filter(|v| v.name == CREDENTIAL_FILE_ENV)
                .collect();
            assert_eq!(file.len(), 1);
            let expected = "/var/run/secrets/lanepool.dev/worker/token";
            assert_eq!(file[0].value.as_deref(), Some(expected));
            assert_eq!(container.volume_mounts.as_ref().unwrap().len(), 1);
        }
    }
}
