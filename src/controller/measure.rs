//! Measuring a pool's reserve lanes: the connection from the spec (and its Secrets), the
//! queries through the shared Prometheus clients, and the answers read as loads. An answer that
//! is not one finite, non-negative number is "unavailable", never zero.

use std::collections::BTreeMap;
use std::time::Duration;

use k8s_openapi::api::core::v1::{Secret, SecretKeySelector};
use kube::ResourceExt;
use kube::api::Api;

use super::context::Context;
use crate::api::LanePool;
use crate::metrics::Metrics;
use crate::prometheus::{Connection, LaneQueries, pool_queries, query};
use crate::sizing::{LaneLoad, RecentRate, lane_load, single_value};
use crate::{Error, Result};

/// Queries every lane and reads its load.
pub async fn measure(
    prometheus: &prometheus_http_query::Client,
    lanes: &[LaneQueries],
    metrics: &Metrics,
) -> BTreeMap<String, std::result::Result<LaneLoad, String>> {
    let mut loads = BTreeMap::new();
    for lane in lanes {
        let rate = query(prometheus, &lane.arrival_rate, metrics).await;
        let job = query(prometheus, &lane.job_time, metrics).await;
        let mut load = lane_load(&lane.lane, &rate, &job, lane.job_seconds_fallback);
        if let (Ok(load), Some(recent)) = (&mut load, &lane.recent_arrival_rate) {
            // Without an answer (fewer than two samples yet) the long window decides alone.
            let answer = query(prometheus, &recent.promql, metrics).await;
            load.recent_arrival_rate =
                single_value("recent arrival rate", &answer)
                    .ok()
                    .map(|per_second| RecentRate {
                        per_second,
                        window: recent.window,
                    });
        }
        loads.insert(lane.lane.clone(), load);
    }
    loads
}

pub(super) async fn measure_pool(
    pool: &LanePool,
    ctx: &Context,
) -> Result<BTreeMap<String, std::result::Result<LaneLoad, String>>> {
    let queries = pool_queries(pool, &ctx.settings.windows)?;
    let Some(connection) = connection(pool, ctx).await? else {
        let reason =
            "no Prometheus URL: set spec.prometheus.url or the operator's --prometheus-url";
        return Ok(queries
            .iter()
            .map(|q| (q.lane.clone(), Err(reason.to_string())))
            .collect());
    };
    let client = ctx.prometheus.get(&connection)?;
    Ok(measure(&client, &queries, &ctx.metrics).await)
}

async fn connection(pool: &LanePool, ctx: &Context) -> Result<Option<Connection>> {
    let source = pool.spec.prometheus.clone().unwrap_or_default();
    let Some(url) = source
        .url
        .or_else(|| ctx.settings.default_prometheus_url.clone())
    else {
        return Ok(None);
    };
    let timeout = match &source.timeout {
        Some(t) => t.get().map_err(|e| Error::Duration {
            field: "spec.prometheus.timeout".into(),
            source: e,
        })?,
        None => Duration::from_secs(5),
    };
    let namespace = pool.namespace().unwrap_or_default();
    let secrets: Api<Secret> = Api::namespaced(ctx.client.clone(), &namespace);
    let read = |field: &'static str, selector: Option<SecretKeySelector>| {
        let secrets = secrets.clone();
        async move {
            let Some(selector) = selector else {
                return Ok(None);
            };
            let missing = || Error::MissingSecret {
                field,
                name: selector.name.clone(),
                key: selector.key.clone(),
            };
            let secret = ctx
                .read(
                    format!("reading Secret {}", selector.name),
                    secrets.get_opt(&selector.name),
                )
                .await?
                .ok_or_else(missing)?;
            let value = secret
                .data
                .and_then(|mut d| d.remove(&selector.key))
                .ok_or_else(missing)?;
            Ok::<_, Error>(Some(value.0))
        }
    };
    let token = read(
        "spec.prometheus.bearerTokenSecret",
        source.bearer_token_secret,
    )
    .await?;
    let ca_pem = read("spec.prometheus.caSecret", source.ca_secret).await?;
    Ok(Some(Connection {
        url,
        timeout,
        bearer_token: token.map(|t| String::from_utf8_lossy(&t).into_owned()),
        ca_pem,
        headers: source.headers,
    }))
}
