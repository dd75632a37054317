//! What to ask Prometheus for a pool's reserve lanes: the spec's own queries, asked for the pool
//! alone, or the worker metric convention's (`lanepool_jobs_submitted_total`,
//! `lanepool_job_duration_seconds`), which every pool shares: one query per shape grouped by
//! namespace, pool and lane, from which each lane takes its own series.

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
    /// The lookback of the recent arrival rate (`irate`: the last scrape interval; unused when
    /// scrapes come more often than every 5 s, see `recent_query`), such as "1m"; `None`: not
    /// asked.
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
    pub arrival_rate: Query,
    /// Only for the default arrival-rate query: a custom query's window is not ours to change.
    pub recent_arrival_rate: Option<RecentQuery>,
    pub job_time: Query,
    pub job_seconds_fallback: Option<f64>,
}

/// One question for one lane.
#[derive(Clone, Debug, PartialEq)]
pub enum Query {
    /// The pool's own PromQL (a custom query), asked for this pool alone.
    Own(String),
    /// A question every pool on the metric convention shares: PromQL grouped by namespace, pool
    /// and lane, from whose answer this lane takes its series (none: no series). `own` asks for
    /// this lane alone, for when the shared answer is too large to read.
    Shared {
        promql: String,
        series: Series,
        own: String,
    },
}

impl Query {
    /// The PromQL sent.
    pub fn promql(&self) -> &str {
        match self {
            Query::Own(promql) | Query::Shared { promql, .. } => promql,
        }
    }
}

/// A lane's series in a grouped answer: its namespace, pool and lane labels.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Series {
    pub namespace: String,
    pub pool: String,
    pub lane: String,
}

/// The recent arrival rate's query and the window it counts over (one scrape interval, 5 s at
/// least).
#[derive(Clone, Debug, PartialEq)]
pub struct RecentQuery {
    pub query: Query,
    pub window: Duration,
}

/// The labels every shared query groups by: a pool's lanes are told apart by them.
const BY: &str = "sum by (namespace, pool, lane)";

/// The largest by the same labels: each worker of a lane exports the lane's depth.
const MAX_BY: &str = "max by (namespace, pool, lane)";

/// Jobs submitted per second, by lane of every pool (`function`: `rate` or `irate`).
fn submitted(function: &str, window: &str) -> String {
    format!("{BY} ({function}(lanepool_jobs_submitted_total{{pool!=\"\"}}[{window}]))")
}

/// Jobs arriving per second, by lane of every pool, over `window`: the producer's counter where
/// it is scraped, or else what the workers know, the jobs they finished plus how fast the lane's
/// queue grows (`lanepool_queue_depth`, 0 at least), or the finished jobs alone where no worker
/// exports the depth. No producer has to change.
fn arrived(window: &str) -> String {
    let finished =
        format!("{BY} (rate(lanepool_job_duration_seconds_count{{pool!=\"\"}}[{window}]))");
    format!(
        "{} or clamp_min({finished} + {MAX_BY} (deriv(lanepool_queue_depth{{pool!=\"\"}}[{window}])), 0) \
         or {finished}",
        submitted("rate", window)
    )
}

/// Mean job seconds, by lane of every pool: NaN where no job finished in the window.
fn job_seconds(window: &str) -> String {
    format!(
        "{BY} (rate(lanepool_job_duration_seconds_sum{{pool!=\"\"}}[{window}])) / {BY} (rate(lanepool_job_duration_seconds_count{{pool!=\"\"}}[{window}]))"
    )
}

fn escape(value: &str) -> String {
    value.replace('\\', "\\\\").replace('"', "\\\"")
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

/// The metric convention's job-time query for any lane of a pool, reserve or not: the same
/// shared question the reserve lanes ask, so a lane without a reserve costs no extra query.
pub fn default_job_time(namespace: &str, pool: &str, lane: &str, windows: &QueryWindows) -> Query {
    let promql = job_seconds(&windows.job_time);
    let selector = format!(
        "namespace=\"{}\",pool=\"{}\",lane=\"{}\"",
        escape(namespace),
        escape(pool),
        escape(lane)
    );
    Query::Shared {
        own: promql
            .replace(BY, "sum")
            .replace("{pool!=\"\"}", &format!("{{{selector}}}")),
        promql,
        series: Series {
            namespace: namespace.to_string(),
            pool: pool.to_string(),
            lane: lane.to_string(),
        },
    }
}

/// The recent arrival rate's PromQL and the span it counts over (see
/// [`crate::sizing::recent_window`]): `irate` over the last two samples, one scrape interval,
/// when Prometheus scrapes at most every [`crate::sizing::SHORTEST_RECENT_WINDOW`]; scraped more
/// often, `rate` over a range one scrape interval longer than that span (whole scrape
/// intervals), so its samples span it. `None` without a scrape interval.
fn recent_query(lookback: &str, scrape_interval: Duration) -> Option<(String, Duration)> {
    let window = crate::sizing::recent_window(scrape_interval)?;
    if window == scrape_interval {
        return Some((submitted("irate", lookback), window));
    }
    let range = format!("{}ms", (window + scrape_interval).as_millis());
    Some((submitted("rate", &range), window))
}

fn lane_queries(
    namespace: &str,
    pool: &str,
    lane: &str,
    index: usize,
    reserve: &Reserve,
    windows: &QueryWindows,
) -> Result<LaneQueries> {
    let series = Series {
        namespace: namespace.to_string(),
        pool: pool.to_string(),
        lane: lane.to_string(),
    };
    let selector = format!(
        "namespace=\"{}\",pool=\"{}\",lane=\"{}\"",
        escape(namespace),
        escape(pool),
        escape(lane)
    );
    let shared = |promql: String| Query::Shared {
        own: promql
            .replace(BY, "sum")
            .replace(MAX_BY, "max")
            .replace("{pool!=\"\"}", &format!("{{{selector}}}")),
        promql,
        series: series.clone(),
    };
    let custom = |q: Option<&String>| q.filter(|q| !q.trim().is_empty()).cloned();
    let custom_rate = custom(reserve.arrival_rate.as_ref().and_then(|q| q.query.as_ref()));
    let recent_arrival_rate = match &custom_rate {
        Some(_) => None,
        None => windows
            .recent_arrival_rate
            .as_deref()
            .and_then(|lookback| recent_query(lookback, windows.scrape_interval))
            .map(|(promql, window)| RecentQuery {
                query: shared(promql),
                window,
            }),
    };
    let arrival_rate = match custom_rate {
        Some(promql) => Query::Own(promql),
        None => shared(arrived(&windows.arrival_rate)),
    };
    let job_time = match custom(reserve.job_time.as_ref().and_then(|q| q.query.as_ref())) {
        Some(promql) => Query::Own(promql),
        None => shared(job_seconds(&windows.job_time)),
    };
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
    fn default_queries_are_shared_and_each_lane_takes_its_own_series() {
        let queries = pool_queries(&example(), &windows()).unwrap();
        assert_eq!(queries.len(), 1);
        let series = Series {
            namespace: "team".into(),
            pool: "jobs".into(),
            lane: "urgent".into(),
        };
        assert_eq!(
            queries[0].arrival_rate,
            Query::Shared {
                promql: concat!(
                    r#"sum by (namespace, pool, lane) (rate(lanepool_jobs_submitted_total{pool!=""}[1m])) or "#,
                    r#"clamp_min(sum by (namespace, pool, lane) (rate(lanepool_job_duration_seconds_count{pool!=""}[1m])) "#,
                    r#"+ max by (namespace, pool, lane) (deriv(lanepool_queue_depth{pool!=""}[1m])), 0) or "#,
                    r#"sum by (namespace, pool, lane) (rate(lanepool_job_duration_seconds_count{pool!=""}[1m]))"#
                ).into(),
                series: series.clone(),
                own: concat!(
                    r#"sum (rate(lanepool_jobs_submitted_total{namespace="team",pool="jobs",lane="urgent"}[1m])) or "#,
                    r#"clamp_min(sum (rate(lanepool_job_duration_seconds_count{namespace="team",pool="jobs",lane="urgent"}[1m])) "#,
                    r#"+ max (deriv(lanepool_queue_depth{namespace="team",pool="jobs",lane="urgent"}[1m])), 0) or "#,
                    r#"sum (rate(lanepool_job_duration_seconds_count{namespace="team",pool="jobs",lane="urgent"}[1m]))"#
                ).into(),
            }
        );
        assert_eq!(
            queries[0]
                .recent_arrival_rate
                .as_ref()
                .unwrap()
                .query
                .promql(),
            r#"sum by (namespace, pool, lane) (irate(lanepool_jobs_submitted_total{pool!=""}[1m]))"#
        );
        assert!(queries[0].job_time.promql().starts_with(
            r#"sum by (namespace, pool, lane) (rate(lanepool_job_duration_seconds_sum{pool!=""}[5m])) / "#
        ));
        assert_eq!(queries[0].job_seconds_fallback, Some(0.020));

        // Another pool, another namespace, a name that needs quoting: the same PromQL.
        let mut other = example();
        other.metadata.namespace = Some("b".into());
        other.metadata.name = Some("x\"y".into());
        let theirs = pool_queries(&other, &windows()).unwrap();
        assert_eq!(
            theirs[0].arrival_rate.promql(),
            queries[0].arrival_rate.promql()
        );
        assert!(
            matches!(&theirs[0].arrival_rate, Query::Shared { series, .. } if series.pool == "x\"y")
        );
    }

    #[test]
    fn a_recent_rate_counts_over_one_interval_at_least_when_scrapes_are_faster() {
        let recent = |scrape_ms: u64| {
            let windows = QueryWindows {
                scrape_interval: Duration::from_millis(scrape_ms),
                ..windows()
            };
            let queries = pool_queries(&example(), &windows).unwrap();
            let recent = queries[0].recent_arrival_rate.clone().unwrap();
            (recent.query.promql().to_string(), recent.window)
        };
        // Scraped every second: `rate` over 6 s, whose samples span the 5 s it is judged over.
        assert_eq!(
            recent(1000),
            (
                r#"sum by (namespace, pool, lane) (rate(lanepool_jobs_submitted_total{pool!=""}[6000ms]))"#.into(),
                Duration::from_secs(5)
            )
        );
        assert_eq!(recent(2500).1, Duration::from_secs(5));
        assert!(recent(2500).0.contains("[7500ms]"));
        // Whole scrape intervals: 2 s scrapes span 6 s, 4 s scrapes 8 s (never less than 5 s).
        assert_eq!(recent(2000).1, Duration::from_secs(6));
        assert!(recent(2000).0.contains("[8000ms]"));
        assert_eq!(recent(4000).1, Duration::from_secs(8));
        assert!(recent(4000).0.contains("[12000ms]"));
        // From one interval up, `irate` over the lookback: the last scrape interval.
        for scrape_ms in [5000, 15_000, 60_000] {
            let (promql, window) = recent(scrape_ms);
            assert!(
                promql.contains("(irate(") && promql.contains("[1m]"),
                "{promql}"
            );
            assert_eq!(window, Duration::from_millis(scrape_ms));
        }
    }

    #[test]
    fn without_a_scrape_interval_no_recent_rate_is_asked() {
        let windows = QueryWindows {
            scrape_interval: Duration::ZERO,
            ..windows()
        };
        let queries = pool_queries(&example(), &windows).unwrap();
        assert_eq!(queries[0].recent_arrival_rate, None);
    }

    #[test]
    fn custom_queries_are_asked_for_the_pool_alone() {
        let mut pool = example();
        let reserve = pool.spec.lanes[0].reserve.as_mut().unwrap();
        reserve.arrival_rate = Some(crate::api::MetricQuery {
            query: Some("vector(30)".into()),
        });
        let queries = pool_queries(&pool, &windows()).unwrap();
        assert_eq!(queries[0].arrival_rate, Query::Own("vector(30)".into()));
        assert_eq!(queries[0].recent_arrival_rate, None);
    }
}
