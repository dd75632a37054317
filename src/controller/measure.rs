//! Measuring a pool's reserve lanes in Prometheus: the queries (the spec's, or defaults built from
//! the worker metric convention and scoped to the pool), the HTTP client (timeout, bearer token,
//! CA, extra headers), and turning answers into loads. An answer that is not one finite,
//! non-negative number is "unavailable", never zero.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use prometheus_http_query::reqwest;
use prometheus_http_query::response::Data;

use k8s_openapi::api::core::v1::{Secret, SecretKeySelector};
use kube::ResourceExt;
use kube::api::Api;

use super::context::Context;
use crate::api::{LanePool, Reserve};
use crate::metrics::Metrics;
use crate::sizing::{Answer, LaneLoad, RecentRate, lane_load, single_value};
use crate::{Error, Result};

/// The operator's default trailing window of the arrival-rate query (`--rate-window`).
pub const DEFAULT_RATE_WINDOW: &str = "1m";
/// How far back the recent arrival-rate query (`irate`, the last two samples) may look
/// (`--recent-rate-lookback`): it must hold two scrapes.
pub const DEFAULT_RECENT_RATE_LOOKBACK: &str = "1m";
/// The operator's default trailing window of the job-time query (`--job-time-window`).
pub const DEFAULT_JOB_TIME_WINDOW: &str = "5m";

/// The trailing windows of the default queries.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct QueryWindows {
    /// For the arrival rate, such as "1m".
    pub arrival_rate: String,
    /// The lookback of the recent arrival rate (`irate`: the last scrape interval), such as
    /// "1m"; `None`: not asked.
    pub recent_arrival_rate: Option<String>,
    /// How often Prometheus scrapes the workers: the span of the recent rate, for its noise.
    pub scrape_interval: Duration,
    /// For the mean job time, such as "5m".
    pub job_time: String,
}

/// What to ask Prometheus for one reserve lane.
#[derive(Clone, Debug, PartialEq)]
pub struct LaneQueries {
    pub lane: String,
    pub arrival_rate: String,
    /// Only for the default arrival-rate query: a custom query's window is not ours to change.
    pub recent_arrival_rate: Option<RecentQuery>,
    pub job_time: String,
    pub job_seconds_fallback: Option<f64>,
}

/// The recent arrival rate's PromQL and the window it counts over (one scrape interval).
#[derive(Clone, Debug, PartialEq)]
pub struct RecentQuery {
    pub promql: String,
    pub window: Duration,
}

/// How to reach Prometheus: everything that goes into the HTTP client.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Connection {
    pub url: String,
    pub timeout: Duration,
    pub bearer_token: Option<String>,
    pub ca_pem: Option<Vec<u8>>,
    pub headers: BTreeMap<String, String>,
}

/// The queries for every reserve lane of a pool.
pub fn pool_queries(pool: &LanePool, windows: &QueryWindows) -> Result<Vec<LaneQueries>> {
    let namespace = pool.metadata.namespace.as_deref().unwrap_or_default();
    let name = pool.metadata.name.as_deref().unwrap_or_default();
    pool.spec
        .reserve_lanes()
        .enumerate()
        .map(|(i, (lane, reserve))| lane_queries(namespace, name, &lane.name, i, reserve, windows))
        .collect()
}

fn lane_queries(
    namespace: &str,
    pool: &str,
    lane: &str,
    index: usize,
    reserve: &Reserve,
    windows: &QueryWindows,
) -> Result<LaneQueries> {
    let selector = format!(
        "{{namespace=\"{}\",pool=\"{}\",lane=\"{}\"}}",
        escape(namespace),
        escape(pool),
        escape(lane)
    );
    let custom = |q: Option<&String>| q.filter(|q| !q.trim().is_empty()).cloned();
    let submitted = |function: &str, window: &str| {
        format!("sum({function}(lanepool_jobs_submitted_total{selector}[{window}]))")
    };
    let custom_rate = custom(reserve.arrival_rate.as_ref().and_then(|q| q.query.as_ref()));
    let recent_arrival_rate = match &custom_rate {
        Some(_) => None,
        None => windows
            .recent_arrival_rate
            .as_deref()
            .map(|lookback| RecentQuery {
                promql: submitted("irate", lookback),
                window: windows.scrape_interval,
            }),
    };
    let arrival_rate = custom_rate.unwrap_or_else(|| submitted("rate", &windows.arrival_rate));
    let job_time = custom(reserve.job_time.as_ref().and_then(|q| q.query.as_ref()))
        .unwrap_or_else(|| {
            let w = &windows.job_time;
            format!(
                "sum(rate(lanepool_job_duration_seconds_sum{selector}[{w}])) / sum(rate(lanepool_job_duration_seconds_count{selector}[{w}]))"
            )
        });
    let job_seconds_fallback = match reserve.job_time.as_ref().and_then(|j| j.fallback.as_ref()) {
        Some(fallback) => Some(
            fallback
                .get()
                .map_err(|source| Error::Duration {
                    field: format!("spec.lanes[{index}].reserve.jobTime.fallback"),
                    source,
                })?
                .as_secs_f64(),
        ),
        None => None,
    };
    Ok(LaneQueries {
        lane: lane.to_string(),
        arrival_rate,
        recent_arrival_rate,
        job_time,
        job_seconds_fallback,
    })
}

fn escape(value: &str) -> String {
    value.replace('\\', "\\\\").replace('"', "\\\"")
}

/// An HTTP client for one Prometheus connection.
pub fn client(connection: &Connection) -> Result<prometheus_http_query::Client> {
    let invalid = |field: &str, reason: String| Error::invalid(field, reason);
    let mut headers = reqwest::header::HeaderMap::new();
    for (name, value) in &connection.headers {
        let name = reqwest::header::HeaderName::from_bytes(name.as_bytes())
            .map_err(|e| invalid("spec.prometheus.headers", format!("{name}: {e}")))?;
        let value = reqwest::header::HeaderValue::from_str(value)
            .map_err(|e| invalid("spec.prometheus.headers", format!("{name}: {e}")))?;
        headers.insert(name, value);
    }
    if let Some(token) = &connection.bearer_token {
        let mut value = reqwest::header::HeaderValue::from_str(&format!("Bearer {}", token.trim()))
            .map_err(|e| invalid("spec.prometheus.bearerTokenSecret", e.to_string()))?;
        value.set_sensitive(true);
        headers.insert(reqwest::header::AUTHORIZATION, value);
    }
    let mut builder = reqwest::Client::builder()
        .timeout(connection.timeout)
        .connect_timeout(connection.timeout)
        .default_headers(headers);
    if let Some(pem) = &connection.ca_pem {
        let certificate = reqwest::Certificate::from_pem(pem)
            .map_err(|e| invalid("spec.prometheus.caSecret", e.to_string()))?;
        builder = builder.add_root_certificate(certificate);
    }
    let http = builder
        .build()
        .map_err(|e| invalid("spec.prometheus", e.to_string()))?;
    prometheus_http_query::Client::from(http, &connection.url)
        .map_err(|e| invalid("spec.prometheus.url", e.to_string()))
}

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

async fn query(
    prometheus: &prometheus_http_query::Client,
    promql: &str,
    metrics: &Metrics,
) -> Answer {
    let started = Instant::now();
    let answer = match prometheus.query(promql).get().await {
        Ok(response) => match response.data() {
            Data::Vector(samples) => Ok(samples.iter().map(|s| s.sample().value()).collect()),
            Data::Scalar(sample) => Ok(vec![sample.value()]),
            Data::Matrix(_) => {
                Err("the query returned a range vector; use an instant vector".into())
            }
        },
        Err(error) => Err(describe(&error)),
    };
    metrics.observe_query(started.elapsed(), answer.as_ref().err().map(|_| "failed"));
    answer.map_err(|reason| format!("{reason} (query: {promql})"))
}

/// The error with its causes, so "connection refused" is not hidden behind "request failed".
fn describe(error: &dyn std::error::Error) -> String {
    let mut text = error.to_string();
    let mut source = error.source();
    while let Some(cause) = source {
        let cause_text = cause.to_string();
        if !text.contains(&cause_text) {
            text.push_str(": ");
            text.push_str(&cause_text);
        }
        source = cause.source();
    }
    text
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
    let client = {
        let mut clients = ctx.prometheus.lock().unwrap_or_else(|p| p.into_inner());
        match clients.get(&connection) {
            Some(client) => client.clone(),
            None => {
                let client = client(&connection)?;
                clients.insert(connection, client.clone());
                client
            }
        }
    };
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

#[cfg(test)]
mod tests {
    use super::*;

    fn windows() -> QueryWindows {
        QueryWindows {
            arrival_rate: "1m".into(),
            recent_arrival_rate: Some("1m".into()),
            scrape_interval: Duration::from_secs(15),
            job_time: "5m".into(),
        }
    }

    fn example() -> LanePool {
        let mut pool: LanePool =
            serde_yaml::from_str(include_str!("../../examples/lanepool.yaml")).unwrap();
        pool.metadata.namespace = Some("team".into());
        pool
    }

    #[test]
    fn default_queries_follow_the_metric_convention_scoped_to_the_pool() {
        let queries = pool_queries(&example(), &windows()).unwrap();
        assert_eq!(queries.len(), 1);
        assert_eq!(
            queries[0].arrival_rate,
            r#"sum(rate(lanepool_jobs_submitted_total{namespace="team",pool="jobs",lane="urgent"}[1m]))"#
        );
        assert!(queries[0].job_time.starts_with(
            r#"sum(rate(lanepool_job_duration_seconds_sum{namespace="team",pool="jobs",lane="urgent"}[5m])) / "#
        ));
        assert_eq!(queries[0].job_seconds_fallback, Some(0.020));
    }

    #[test]
    fn custom_queries_are_used_as_written() {
        let mut pool = example();
        let reserve = pool.spec.lanes[0].reserve.as_mut().unwrap();
        reserve.arrival_rate = Some(crate::api::MetricQuery {
            query: Some("vector(30)".into()),
        });
        let queries = pool_queries(&pool, &windows()).unwrap();
        assert_eq!(queries[0].arrival_rate, "vector(30)");
    }

    #[test]
    fn a_bad_header_names_the_field() {
        let connection = Connection {
            url: "http://127.0.0.1:9".into(),
            timeout: Duration::from_secs(1),
            bearer_token: None,
            ca_pem: None,
            headers: BTreeMap::from([("bad header".into(), "x".into())]),
        };
        let error = client(&connection)
            .err()
            .expect("a bad header is refused")
            .to_string();
        assert!(error.contains("spec.prometheus.headers"), "{error}");
    }
}
