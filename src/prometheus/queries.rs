//! What to ask Prometheus for a pool's reserve lanes: the spec's own queries, or defaults built
//! from the worker metric convention (`lanepool_jobs_submitted_total`,
//! `lanepool_job_duration_seconds`) and scoped to the pool by its namespace, pool and lane labels.

use std::time::Duration;

use crate::api::{LanePool, Reserve};
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
}
