//! The pool to replay and how to reach its Prometheus: the LanePool from a manifest or the
//! cluster, and its connection (URL, timeout, credentials from its Secrets, headers) checked
//! against the allowed URLs before any Secret is read. It only reads; nothing is written.

use std::path::Path;
use std::time::Duration;

use k8s_openapi::api::core::v1::{Secret, SecretKeySelector};
use kube::api::Api;

use super::args::ReplayArgs;
use super::error::ReplayError;
use crate::api::LanePool;
use crate::prometheus::{AllowedUrls, BasicAuth, ClientCertificate, Connection};
use crate::{Error, Result};

/// The LanePool named by the flags: `--file`, or `POOL` in `--namespace` from the cluster.
pub async fn load(args: &ReplayArgs) -> Result<LanePool, ReplayError> {
    if let Some(path) = &args.file {
        return from_file(path, &args.namespace);
    }
    let name = args.pool.clone().unwrap_or_default();
    let pools: Api<LanePool> = Api::namespaced(cluster().await?, &args.namespace);
    match pools.get_opt(&name).await {
        Ok(Some(pool)) => Ok(pool),
        Ok(None) => Err(ReplayError::UnknownPool {
            namespace: args.namespace.clone(),
            name,
        }),
        Err(e) => Err(ReplayError::Cluster(format!(
            "reading LanePool {}/{name}: {e}",
            args.namespace
        ))),
    }
}

fn from_file(path: &Path, namespace: &str) -> Result<LanePool, ReplayError> {
    let manifest = |reason: String| ReplayError::Manifest {
        path: path.to_path_buf(),
        reason,
    };
    let text = std::fs::read_to_string(path).map_err(|e| manifest(e.to_string()))?;
    let mut pool: LanePool = serde_yaml::from_str(&text).map_err(|e| manifest(e.to_string()))?;
    if pool.metadata.namespace.is_none() {
        pool.metadata.namespace = Some(namespace.to_string());
    }
    Ok(pool)
}

async fn cluster() -> Result<kube::Client, ReplayError> {
    kube::Client::try_default()
        .await
        .map_err(|e| ReplayError::Cluster(format!("no kubeconfig or in-cluster config: {e}")))
}

/// The connection to ask: `--prometheus-url` or the pool's `spec.prometheus.url`, allowed by
/// `allowed` (checked first), with the pool's timeout raised to `timeout` for range queries and
/// its credentials read from its Secrets.
pub async fn connection(
    pool: &LanePool,
    url: Option<&str>,
    allowed: &AllowedUrls,
    timeout: Duration,
) -> Result<Connection, ReplayError> {
    let source = pool.spec.prometheus.clone().unwrap_or_default();
    let Some(url) = url.map(str::to_string).or(source.url.clone()) else {
        return Err(ReplayError::flag(
            "--prometheus-url",
            "the pool sets no spec.prometheus.url: give --prometheus-url",
        ));
    };
    if !allowed.allows(&url) {
        return Err(Error::PrometheusUrlNotAllowed {
            url,
            allowed: allowed.describe(),
        }
        .into());
    }
    let credentials = source.bearer_token_secret.is_some()
        || source.basic_auth.is_some()
        || source.ca_secret.is_some()
        || source.client_certificate_secret.is_some();
    if credentials && !url.starts_with("https://") {
        return Err(Error::invalid(
            "spec.prometheus.url",
            format!(
                "{url:?} must be https:// when a bearer token, basic auth, CA or client certificate is set"
            ),
        )
        .into());
    }
    let pool_timeout = match &source.timeout {
        Some(t) => t.get().map_err(|e| Error::Duration {
            field: "spec.prometheus.timeout".into(),
            source: e,
        })?,
        None => Duration::ZERO,
    };
    let mut connection = Connection {
        url,
        timeout: pool_timeout.max(timeout),
        bearer_token: None,
        basic_auth: None,
        ca_pem: None,
        client_certificate: None,
        headers: source.headers.clone(),
    };
    if !credentials {
        return Ok(connection);
    }
    let namespace = pool.metadata.namespace.clone().unwrap_or_default();
    let secrets = Secrets(Api::namespaced(cluster().await?, &namespace));
    let text = |bytes: Vec<u8>| String::from_utf8_lossy(&bytes).into_owned();
    if let Some(selector) = source.bearer_token_secret {
        let [token] = secrets
            .keys("spec.prometheus.bearerTokenSecret", &selector)
            .await?;
        connection.bearer_token = Some(text(token));
    }
    if let Some(basic) = source.basic_auth {
        let [username] = secrets
            .keys(
                "spec.prometheus.basicAuth.usernameSecret",
                &basic.username_secret,
            )
            .await?;
        let [password] = secrets
            .keys(
                "spec.prometheus.basicAuth.passwordSecret",
                &basic.password_secret,
            )
            .await?;
        connection.basic_auth = Some(BasicAuth {
            username: text(username),
            password: text(password),
        });
    }
    if let Some(selector) = source.ca_secret {
        let [ca] = secrets.keys("spec.prometheus.caSecret", &selector).await?;
        connection.ca_pem = Some(ca);
    }
    if let Some(secret) = source.client_certificate_secret {
        let [certificate_pem, key_pem] = secrets
            .named(
                "spec.prometheus.clientCertificateSecret",
                &secret.name,
                ["tls.crt", "tls.key"],
            )
            .await?;
        connection.client_certificate = Some(ClientCertificate {
            certificate_pem,
            key_pem,
        });
    }
    Ok(connection)
}

/// The pool's Secrets, read as the operator reads them (`MissingSecret` naming the field).
struct Secrets(Api<Secret>);

impl Secrets {
    async fn keys(
        &self,
        field: &'static str,
        selector: &SecretKeySelector,
    ) -> Result<[Vec<u8>; 1], ReplayError> {
        self.named(field, &selector.name, [&selector.key]).await
    }

    async fn named<const N: usize>(
        &self,
        field: &'static str,
        name: &str,
        keys: [&str; N],
    ) -> Result<[Vec<u8>; N], ReplayError> {
        let missing = |key: &str| Error::MissingSecret {
            field,
            name: name.to_string(),
            key: key.to_string(),
        };
        let secret = self
            .0
            .get_opt(name)
            .await
            .map_err(|e| ReplayError::Cluster(format!("reading Secret {name}: {e}")))?
            .ok_or_else(|| missing(&keys.join(", ")))?;
        let mut data = secret.data.unwrap_or_default();
        let mut values = [(); N].map(|_| Vec::new());
        for (value, key) in values.iter_mut().zip(keys) {
            *value = data.remove(key).ok_or_else(|| missing(key))?.0;
        }
        Ok(values)
    }
}
