//! The pool to replay and how to reach its Prometheus: the LanePool from a manifest or the
//! cluster, and its connection (URL, timeout, credentials from its Secrets, headers) checked
//! against the allowed URLs before any Secret is read. It only reads; nothing is written.

use std::path::Path;
use std::time::Duration;

use k8s_openapi::api::core::v1::Secret;
use kube::api::Api;

use super::args::ReplayArgs;
use super::error::ReplayError;
use crate::api::LanePool;
use crate::prometheus::{AllowedUrls, Connection, spec};
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

/// The connection to ask: `--prometheus-url` or the pool's `spec.prometheus.url`, checked as the
/// operator checks it (see [`spec::connection`]: allowed by `allowed`, credentials only to a URL
/// `--prometheus-url` or `allowed` names) before any Secret is read, with the pool's timeout
/// raised to `timeout` for range queries.
pub async fn connection(
    pool: &LanePool,
    url: Option<&str>,
    allowed: &AllowedUrls,
    timeout: Duration,
) -> Result<Connection, ReplayError> {
    let source = pool.spec.prometheus.clone().unwrap_or_default();
    let own = url;
    let Some(url) = url.map(str::to_string).or(source.url.clone()) else {
        return Err(ReplayError::flag(
            "--prometheus-url",
            "the pool sets no spec.prometheus.url: give --prometheus-url",
        ));
    };
    let named = spec::Named { allowed, own };
    let namespace = pool.metadata.namespace.clone().unwrap_or_default();
    // The cluster is reached only for a pool whose connection reads Secrets.
    let secrets: Option<Api<Secret>> = match spec::reads_secrets(&source) {
        true => Some(Api::namespaced(cluster().await?, &namespace)),
        false => None,
    };
    let read = |name: String| {
        let secrets = secrets.clone();
        async move {
            let Some(secrets) = secrets else {
                return Ok(None);
            };
            secrets.get_opt(&name).await.map_err(|source| Error::Kube {
                action: format!("reading Secret {name}"),
                source,
            })
        }
    };
    let mut connection = spec::connection(&source, url, named, Duration::ZERO, read).await?;
    connection.timeout = connection.timeout.max(timeout);
    Ok(connection)
}
