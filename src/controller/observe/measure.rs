//! Everything the operator asks Prometheus: a pool's reserve lanes measured as loads through the
//! connection from the spec (and its Secrets) and the shared clients, every lane's mean job time,
//! and the workers' busy gauges for those that do not answer themselves. An answer that is not one
//! finite, non-negative number is "unavailable", never zero.

use std::collections::BTreeMap;
use std::time::Duration;

use k8s_openapi::api::core::v1::Secret;
use kube::ResourceExt;
use kube::api::Api;

use tracing::warn;

use crate::Result;
use crate::api::LanePool;
use crate::controller::context::Context;
use crate::controller::protocol::{BUSY_METRIC, STARTED_METRIC};
use crate::controller::rollout::cost::Labelled;
use crate::controller::settings::measure_deadline;
use crate::duration::human_seconds;
use crate::prometheus::{Client, Connection, LaneQueries, default_job_time, pool_queries, spec};
use crate::sizing::{LaneLoad, Loads, RecentRate, lane_load, single_value};

/// Queries every lane at once (each lane's queries at once too, within the operator's limit on
/// queries in flight; shared queries refreshed once per `period` for every pool) and reads
/// their loads; a lane still waiting at `deadline` is unavailable. Also the lanes whose arrival
/// rate Prometheus answered with no series (its workers not scraped twice yet), each with its
/// `jobTime.fallback`: the workers' reads may measure those alone.
pub async fn measure(
    prometheus: &Client,
    lanes: &[LaneQueries],
    period: Duration,
    deadline: Duration,
) -> (Loads, BTreeMap<String, Option<f64>>) {
    let all = futures::future::join_all(
        lanes
            .iter()
            .map(|lane| measure_lane(prometheus, lane, period)),
    );
    match tokio::time::timeout(deadline, all).await {
        Ok(answers) => {
            let unseen = lanes
                .iter()
                .zip(&answers)
                .filter(|(_, (_, unseen))| *unseen)
                .map(|(l, _)| (l.lane.clone(), l.job_seconds_fallback))
                .collect();
            let loads = lanes
                .iter()
                .map(|l| l.lane.clone())
                .zip(answers.into_iter().map(|(load, _)| load))
                .collect();
            (loads, unseen)
        }
        Err(_) => (
            lanes
                .iter()
                .map(|l| {
                    let reason = format!(
                        "lane {}: Prometheus did not answer within the reconcile's deadline of {}",
                        l.lane,
                        human_seconds(deadline.as_secs_f64())
                    );
                    (l.lane.clone(), Err(reason))
                })
                .collect(),
            BTreeMap::new(),
        ),
    }
}

/// One lane's queries, at once; and whether Prometheus answered its arrival rate with no series.
async fn measure_lane(
    prometheus: &Client,
    lane: &LaneQueries,
    period: Duration,
) -> (std::result::Result<LaneLoad, String>, bool) {
    let recent = async {
        match &lane.recent_arrival_rate {
            Some(recent) => Some((recent, prometheus.ask(&recent.query, period).await)),
            None => None,
        }
    };
    let (rate, job, recent) = futures::join!(
        prometheus.ask(&lane.arrival_rate, period),
        prometheus.ask(&lane.job_time, period),
        recent,
    );
    let unseen = matches!(&rate, Ok(series) if series.is_empty());
    let mut load = lane_load(&lane.lane, &rate, &job, lane.job_seconds_fallback);
    if let (Ok(load), Some((recent, answer))) = (&mut load, recent) {
        // Without an answer (fewer than two samples yet) the long window decides alone.
        load.recent_arrival_rate =
            single_value("recent arrival rate", &answer)
                .ok()
                .map(|per_second| RecentRate {
                    per_second,
                    window: recent.window,
                });
    }
    (load, unseen)
}

/// How often a shared query is refreshed: three times per scrape interval, so an answer is never
/// much older than the samples it is made of, and the default convention's three shapes cost
/// nine queries per interval however many pools share them.
pub(in crate::controller) fn refresh_period(scrape_interval: Duration) -> Duration {
    (scrape_interval / 3).max(Duration::from_millis(100))
}

/// What one measurement of a pool found: the reserve lanes' loads, every lane's mean job time,
/// and the connection they were measured through (none without a URL).
pub(in crate::controller) struct Measured {
    pub(in crate::controller) loads: Loads,
    pub(in crate::controller) job_seconds: BTreeMap<String, f64>,
    pub(in crate::controller) connection: Option<Connection>,
    /// The lanes Prometheus has no arrival-rate series of, with their `jobTime.fallback`.
    pub(in crate::controller) unseen: BTreeMap<String, Option<f64>>,
}

/// Measures the pool in one round: the reserve lanes' loads and the other lanes' job times, all
/// at once, within the measurement's deadline.
pub(in crate::controller) async fn measure_pool(
    pool: &LanePool,
    ctx: &Context,
    interval: Duration,
) -> Result<Measured> {
    let queries = pool_queries(pool, &ctx.settings.windows)?;
    let unavailable = |reason: &str| -> Loads {
        queries
            .iter()
            .map(|q| (q.lane.clone(), Err(reason.to_string())))
            .collect()
    };
    let source = pool.spec.prometheus.clone().unwrap_or_default();
    let Some(url) = source
        .url
        .clone()
        .or_else(|| ctx.settings.default_prometheus_url.clone())
    else {
        let loads = unavailable(
            "no Prometheus URL: set spec.prometheus.url or the operator's --prometheus-url",
        );
        return Ok(Measured {
            loads,
            job_seconds: BTreeMap::new(),
            connection: None,
            unseen: BTreeMap::new(),
        });
    };
    let named = spec::Named {
        allowed: &ctx.settings.allowed_prometheus_urls,
        own: ctx.settings.default_prometheus_url.as_deref(),
    };
    let secrets: Api<Secret> =
        Api::namespaced(ctx.client.clone(), &pool.namespace().unwrap_or_default());
    let read = |name: String| {
        let secrets = &secrets;
        async move {
            let action = format!("reading Secret {name}");
            ctx.read(action, secrets.get_opt(&name)).await
        }
    };
    let timeout = Duration::from_secs(5);
    let connection = spec::connection(&source, url, named, timeout, read).await?;
    let client = ctx.prometheus.for_pool(&connection, &pool_key(pool))?;
    let period = refresh_period(ctx.settings.windows.scrape_interval);
    let deadline = measure_deadline(interval);
    let measured = lanes_job_seconds(pool, ctx, &client, &queries, deadline);
    let ((loads, unseen), mut job_seconds) =
        futures::join!(measure(&client, &queries, period, deadline), measured);
    job_seconds.extend(
        loads
            .iter()
            .filter_map(|(lane, load)| Some((lane.clone(), load.as_ref().ok()?.job_seconds?))),
    );
    Ok(Measured {
        loads,
        job_seconds,
        connection: Some(connection),
        unseen,
    })
}

/// Mean job seconds of the lanes without a reserve query (`measured` has the others), from the
/// metric convention's shared job-time query. A lane without an answer within `within` is left
/// out: a shared answer that hangs never holds the reconcile past its measurement's deadline.
async fn lanes_job_seconds(
    pool: &LanePool,
    ctx: &Context,
    client: &Client,
    measured: &[LaneQueries],
    within: Duration,
) -> BTreeMap<String, f64> {
    let namespace = pool.namespace().unwrap_or_default();
    let period = refresh_period(ctx.settings.windows.scrape_interval);
    let asked = pool
        .spec
        .lanes
        .iter()
        .filter(|l| !measured.iter().any(|q| q.lane == l.name))
        .map(|lane| {
            let query = default_job_time(
                &namespace,
                &pool.name_any(),
                &lane.name,
                &ctx.settings.windows,
            );
            async move {
                let answer = client.ask(&query, period).await;
                let value = single_value("job time", &answer).ok()?;
                Some((lane.name.clone(), value))
            }
        });
    match tokio::time::timeout(within, futures::future::join_all(asked)).await {
        Ok(answers) => answers.into_iter().flatten().collect(),
        Err(_) => {
            warn!("no job time: Prometheus's shared answer came too late");
            BTreeMap::new()
        }
    }
}

/// The most a ranking or a drain waits for Prometheus to say which workers are busy: as long as
/// the workers themselves get ([`crate::controller::pods`]'s Pod budget). Unknown then means hold.
const BUSY_DEADLINE: Duration = Duration::from_secs(1);

/// A pool's key among the Prometheus clients' shares: `namespace/name`.
pub(in crate::controller) fn pool_key(pool: &LanePool) -> String {
    format!(
        "{}/{}",
        pool.namespace().unwrap_or_default(),
        pool.name_any()
    )
}

/// The PromQL for a pool's busy gauges, by pod and lane.
pub fn busy_query(namespace: &str, pool: &str) -> String {
    format!(
        "max by (pod, lane) ({BUSY_METRIC}{{namespace={:?},pool={:?}}})",
        namespace, pool
    )
}

/// The PromQL for a pool's job start times, by pod and lane.
pub fn started_query(namespace: &str, pool: &str) -> String {
    format!(
        "max by (pod, lane) ({STARTED_METRIC}{{namespace={:?},pool={:?}}})",
        namespace, pool
    )
}

/// The pool's busy and job-start gauges from Prometheus, by pod and lane (`None`: not
/// reachable); `deployment` names the shrink they are for in a warning.
pub(in crate::controller) async fn busy_workers(
    ctx: &Context,
    connection: Option<&Connection>,
    pool: &LanePool,
    deployment: &str,
) -> Option<(Vec<Labelled>, Vec<Labelled>)> {
    let connection = connection?;
    let client = ctx
        .prometheus
        .for_pool(connection, &pool_key(pool))
        .map_err(|error| warn!(deployment, %error, "Prometheus not asked for busy workers"))
        .ok()?;
    let (namespace, pool) = (pool.namespace().unwrap_or_default(), pool.name_any());
    let (busy_promql, started_promql) = (
        busy_query(&namespace, &pool),
        started_query(&namespace, &pool),
    );
    let both = futures::future::join(
        client.query_labelled(&busy_promql),
        client.query_labelled(&started_promql),
    );
    let Ok((busy, started)) = tokio::time::timeout(BUSY_DEADLINE, both).await else {
        warn!(
            deployment,
            "Prometheus did not say which workers are busy within {}",
            human_seconds(BUSY_DEADLINE.as_secs_f64())
        );
        return None;
    };
    let busy = busy
        .map_err(|error| warn!(deployment, %error, "Prometheus not asked for busy workers"))
        .ok()?;
    // Workers that export no start times are ranked by their lanes' whole job times.
    Some((busy, started.unwrap_or_default()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_queries_name_the_pool_and_group_by_pod_and_lane() {
        assert_eq!(
            busy_query("team", "jobs"),
            r#"max by (pod, lane) (lanepool_worker_busy{namespace="team",pool="jobs"})"#
        );
        assert_eq!(
            started_query("team", "jobs"),
            r#"max by (pod, lane) (lanepool_worker_job_started_timestamp_seconds{namespace="team",pool="jobs"})"#
        );
    }
}
