//! One range query (`/api/v1/query_range`), read with the instant query's bounds: at most
//! [`MAX_ANSWER_BYTES`](super::query::MAX_ANSWER_BYTES) of answer, redirects refused, within the
//! connection's timeout, and at most [`MAX_POINTS`] evaluation steps, Prometheus's own limit. It
//! is for `lanepool replay`, which reads a lane's history; the operator never asks one.

use std::collections::BTreeMap;

use serde::Deserialize;
use serde::de::IgnoredAny;

use super::query::{Bounds, answer};

/// The most steps one range query may ask for: Prometheus refuses more than 11,000 points per
/// series ("exceeded maximum resolution").
pub const MAX_POINTS: u64 = 11_000;

/// The evaluation times of a range query, in whole Unix seconds: `start`, `start + step`, …,
/// up to `end`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Range {
    pub start: i64,
    pub end: i64,
    pub step: u64,
}

impl Range {
    /// How many evaluation times the range holds.
    pub fn points(&self) -> u64 {
        if self.end < self.start || self.step == 0 {
            return 0;
        }
        (self.end - self.start) as u64 / self.step + 1
    }
}

/// One series of a range answer: its labels and its (Unix time, value) points, in time order.
pub type RangeSeries = (BTreeMap<String, String>, Vec<(f64, f64)>);

#[derive(Deserialize)]
#[serde(tag = "resultType", content = "result", rename_all = "lowercase")]
enum Data {
    Matrix(Vec<Series>),
    Vector(IgnoredAny),
    Scalar(IgnoredAny),
    String(IgnoredAny),
}

#[derive(Deserialize)]
struct Series {
    #[serde(default)]
    metric: BTreeMap<String, String>,
    values: Vec<(f64, String)>,
}

/// Runs `promql` over `range` against `endpoint` (the server's `/api/v1/query_range`): each
/// series' labels and points. A value that is not a number is an error; NaN and ±Inf come back
/// as such, for the caller to treat as "no value", never as zero.
pub(super) async fn range(
    http: &reqwest::Client,
    endpoint: &str,
    promql: &str,
    range: Range,
    bounds: Bounds,
) -> Result<Vec<RangeSeries>, String> {
    if range.points() > MAX_POINTS {
        return Err(format!(
            "{} steps is more than the {MAX_POINTS} a range query may ask for",
            range.points()
        ));
    }
    let request = http.get(endpoint).query(&[
        ("query", promql.to_string()),
        ("start", range.start.to_string()),
        ("end", range.end.to_string()),
        ("step", range.step.to_string()),
    ]);
    match answer::<Data>(request, bounds.bytes).await? {
        Some(Data::Matrix(series)) if series.len() > bounds.series => Err(format!(
            "the query returned more than {} series ({})",
            bounds.series,
            series.len()
        )),
        Some(Data::Matrix(series)) => series
            .into_iter()
            .map(|s| {
                let points =
                    s.values
                        .into_iter()
                        .map(|(at, value)| {
                            value.parse::<f64>().map(|v| (at, v)).map_err(|_| {
                                format!("the answer's value {value:?} is not a number")
                            })
                        })
                        .collect::<Result<Vec<_>, String>>()?;
                Ok((s.metric, points))
            })
            .collect(),
        Some(Data::Vector(_) | Data::Scalar(_) | Data::String(_)) => {
            Err("a range query must return a matrix".into())
        }
        None => Err("the answer has no data".into()),
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    use tokio::net::TcpListener;

    use super::*;
    use crate::prometheus::query::OWN_BOUNDS;

    async fn server(status: &'static str, body: String) -> String {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!(
            "http://{}/api/v1/query_range",
            listener.local_addr().unwrap()
        );
        tokio::spawn(async move {
            while let Ok((mut stream, _)) = listener.accept().await {
                let body = body.clone();
                tokio::spawn(async move {
                    let mut request = [0u8; 4096];
                    let _ = stream.read(&mut request).await;
                    let response = format!(
                        "HTTP/1.1 {status}\r\nContent-Length: {}\r\n\r\n{body}",
                        body.len()
                    );
                    let _ = stream.write_all(response.as_bytes()).await;
                });
            }
        });
        url
    }

    fn http() -> reqwest::Client {
        reqwest::Client::builder()
            .timeout(Duration::from_secs(2))
            .redirect(reqwest::redirect::Policy::none())
            .build()
            .unwrap()
    }

    const DAY: Range = Range {
        start: 0,
        end: 86_400,
        step: 15,
    };

    #[tokio::test]
    async fn reads_a_matrix_with_nan_kept_as_nan() {
        let url = server(
            "200 OK",
            r#"{"status":"success","data":{"resultType":"matrix","result":[{"metric":{},"values":[[15,"30"],[30,"NaN"]]}]}}"#.into(),
        )
        .await;
        let series = range(&http(), &url, "q", DAY, OWN_BOUNDS).await.unwrap();
        assert_eq!(series[0].1[0], (15.0, 30.0));
        assert!(series[0].1[1].1.is_nan());
    }

    #[tokio::test]
    async fn an_answer_over_the_byte_cap_is_refused() {
        let point = r#"[15,"30"],"#.repeat(120_000);
        let body = format!(
            r#"{{"status":"success","data":{{"resultType":"matrix","result":[{{"metric":{{}},"values":[{point}[1,"1"]]}}]}}}}"#
        );
        let url = server("200 OK", body).await;
        let error = range(&http(), &url, "q", DAY, OWN_BOUNDS)
            .await
            .unwrap_err();
        assert!(error.contains("longer than 1024 KiB"), "{error}");
    }

    #[tokio::test]
    async fn more_steps_than_prometheus_allows_are_never_asked() {
        let url = "http://127.0.0.1:9/api/v1/query_range";
        let too_many = Range { step: 1, ..DAY };
        let error = range(&http(), url, "q", too_many, OWN_BOUNDS)
            .await
            .unwrap_err();
        assert!(error.contains("86401 steps"), "{error}");
    }
}
