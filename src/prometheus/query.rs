//! One instant query, read with bounds: at most [`MAX_ANSWER_BYTES`] of answer and
//! [`MAX_SERIES`] series for a pool's own query (more for one many pools share: [`shared_bounds`]),
//! redirects refused, within the connection's timeout. A server that
//! streams without end, hangs, or answers something other than Prometheus's JSON fails that query
//! with a reason, never the operator.

use std::collections::BTreeMap;

use serde::Deserialize;
use serde::de::IgnoredAny;

/// The most bytes of one answer that are read: an aggregated instant vector for one lane is a
/// few hundred bytes.
pub const MAX_ANSWER_BYTES: usize = 1 << 20;

/// The most series one answer may hold (a lane's query must return one; more is a mistake
/// reported with its count, this many is a server to stop reading).
pub const MAX_SERIES: usize = 10_000;

/// The most bytes and series an answer may have.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Bounds {
    pub bytes: usize,
    pub series: usize,
}

/// The bounds of a pool's own query.
pub const OWN_BOUNDS: Bounds = Bounds {
    bytes: MAX_ANSWER_BYTES,
    series: MAX_SERIES,
};

/// The bounds of a query that `lanes` lanes share: a pool's own bounds, and 1 KiB and ten series
/// more for each lane beyond the first thousand (a grouped answer is about 150 bytes a series),
/// at most 64 MiB. A pool that names a Prometheus of its own shares with no one.
pub fn shared_bounds(lanes: usize) -> Bounds {
    Bounds {
        bytes: MAX_ANSWER_BYTES
            .max(lanes.saturating_mul(1024))
            .min(64 << 20),
        series: MAX_SERIES.max(lanes.saturating_mul(10)),
    }
}

/// How an answer over its bounds is reported: a shared query over them falls back to each
/// pool's own.
pub const TOO_LARGE: &str = "too large: ";

/// Why a 401 or 403 came back, in the fields a user changes.
pub const REFUSED_CREDENTIALS: &str = "Prometheus refused the pool's credentials (spec.prometheus.bearerTokenSecret, basicAuth or clientCertificateSecret) or their absence";

/// One series of an answer: its labels and value.
pub type Labelled = (BTreeMap<String, String>, f64);

/// Prometheus's envelope: `{"status":"success","data":{…}}` or `{"status":"error","error":…}`,
/// its `data` as `D` (the instant query's or the range query's result types).
#[derive(Deserialize)]
struct Envelope<D> {
    status: String,
    #[serde(default = "Option::default")]
    data: Option<D>,
    #[serde(default)]
    error: Option<String>,
}

#[derive(Deserialize)]
#[serde(tag = "resultType", content = "result", rename_all = "lowercase")]
enum Data {
    Vector(Vec<Sample>),
    Scalar(Value),
    Matrix(IgnoredAny),
    String(IgnoredAny),
}

#[derive(Deserialize)]
struct Sample {
    #[serde(default)]
    metric: BTreeMap<String, String>,
    value: Value,
}

/// `[unix time, "value"]`; the value is text so NaN and ±Inf can travel.
#[derive(Deserialize)]
struct Value(#[allow(dead_code)] f64, String);

impl Value {
    fn number(&self) -> Result<f64, String> {
        self.1
            .parse()
            .map_err(|_| format!("the answer's value {:?} is not a number", self.1))
    }
}

/// Runs `promql` against `endpoint` (the server's `/api/v1/query`) with `http`: each series'
/// labels and value.
pub(super) async fn instant(
    http: &reqwest::Client,
    endpoint: &str,
    promql: &str,
    bounds: Bounds,
) -> Result<Vec<Labelled>, String> {
    let request = http.get(endpoint).query(&[("query", promql)]);
    match answer::<Data>(request, bounds.bytes).await? {
        Some(Data::Vector(samples)) if samples.len() > bounds.series => Err(format!(
            "{TOO_LARGE}the query returned more than {} series ({})",
            bounds.series,
            samples.len()
        )),
        Some(Data::Vector(samples)) => samples
            .into_iter()
            .map(|s| Ok((s.metric, s.value.number()?)))
            .collect(),
        Some(Data::Scalar(value)) => Ok(vec![(BTreeMap::new(), value.number()?)]),
        Some(Data::Matrix(_)) => {
            Err("the query returned a range vector; use an instant vector".into())
        }
        Some(Data::String(_)) => Err("the query returned a string; it must return a number".into()),
        None => Err("the answer has no data".into()),
    }
}

/// Sends `request` and reads Prometheus's answer, at most `bytes` of it, as an envelope whose
/// data is a `D`: no redirect followed, refused credentials named, a refused query's own error
/// given. `None`: a successful answer without data.
pub(super) async fn answer<D: serde::de::DeserializeOwned>(
    request: reqwest::RequestBuilder,
    bytes: usize,
) -> Result<Option<D>, String> {
    let response = request
        .send()
        .await
        .map_err(|e| with_tls_hint(describe(&e)))?;
    let status = response.status();
    if status.is_redirection() {
        return Err(format!("HTTP {status}: redirects are not followed"));
    }
    if matches!(
        status,
        reqwest::StatusCode::UNAUTHORIZED | reqwest::StatusCode::FORBIDDEN
    ) {
        return Err(format!("HTTP {status}: {REFUSED_CREDENTIALS}"));
    }
    let body = read_bounded(response, bytes).await?;
    let envelope: Envelope<D> = serde_json::from_slice(&body).map_err(|e| {
        if status.is_success() {
            format!("the answer is not Prometheus's JSON: {e}")
        } else {
            format!("HTTP {status}")
        }
    })?;
    if envelope.status != "success" {
        let error = envelope.error.unwrap_or_else(|| format!("HTTP {status}"));
        return Err(format!("Prometheus refused the query: {error}"));
    }
    Ok(envelope.data)
}

/// The body, or an error once it passes [`MAX_ANSWER_BYTES`]: an endless answer costs at most
/// that much memory and the connection's timeout.
pub(super) async fn read_bounded(
    mut response: reqwest::Response,
    most: usize,
) -> Result<Vec<u8>, String> {
    if response
        .content_length()
        .is_some_and(|length| length > most as u64)
    {
        return Err(too_long(most));
    }
    let mut body = Vec::new();
    while let Some(chunk) = response.chunk().await.map_err(|e| describe(&e))? {
        if body.len() + chunk.len() > most {
            return Err(too_long(most));
        }
        body.extend_from_slice(&chunk);
    }
    Ok(body)
}

fn too_long(most: usize) -> String {
    format!(
        "{TOO_LARGE}the answer is longer than {} KiB; a lane's query must return one series",
        most / 1024
    )
}

/// A failed TLS handshake, with the field that fixes it: the server refused ours (it wants a
/// client certificate its CA signed), or we refused the server's (its CA is not trusted).
pub(super) fn with_tls_hint(reason: String) -> String {
    if reason.contains("received fatal alert") {
        format!(
            "{reason}: Prometheus refused the TLS handshake; if it requires a client certificate, set spec.prometheus.clientCertificateSecret to one its client CA signed"
        )
    } else if reason.contains("invalid peer certificate") {
        format!(
            "{reason}: Prometheus's certificate is not trusted; set spec.prometheus.caSecret to the CA that signed it"
        )
    } else {
        reason
    }
}

/// The error with its causes, so "connection refused" is not hidden behind "request failed".
pub(super) fn describe(error: &dyn std::error::Error) -> String {
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

#[cfg(test)]
mod tests {
    use std::time::{Duration, Instant};

    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    use tokio::net::TcpListener;

    use super::*;

    /// A server that answers every connection with `respond` (after reading the request).
    async fn server<F, Fut>(respond: F) -> String
    where
        F: Fn(tokio::net::TcpStream) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = ()> + Send,
    {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}/api/v1/query", listener.local_addr().unwrap());
        let respond = std::sync::Arc::new(respond);
        tokio::spawn(async move {
            while let Ok((mut stream, _)) = listener.accept().await {
                let respond = respond.clone();
                tokio::spawn(async move {
                    let mut request = [0u8; 4096];
                    let _ = stream.read(&mut request).await;
                    respond(stream).await;
                });
            }
        });
        url
    }

    fn values(answer: Result<Vec<Labelled>, String>) -> Result<Vec<f64>, String> {
        answer.map(|series| series.into_iter().map(|(_, v)| v).collect())
    }

    fn http() -> reqwest::Client {
        reqwest::Client::builder()
            .timeout(Duration::from_secs(2))
            .redirect(reqwest::redirect::Policy::none())
            .build()
            .unwrap()
    }

    async fn reply(mut stream: tokio::net::TcpStream, status: &str, body: &str) {
        let response = format!(
            "HTTP/1.1 {status}\r\nContent-Type: application/json\r\nContent-Length: {}\r\nLocation: http://169.254.169.254/\r\n\r\n{body}",
            body.len()
        );
        let _ = stream.write_all(response.as_bytes()).await;
    }

    #[tokio::test]
    async fn reads_vectors_scalars_nan_and_prometheus_errors() {
        let url = server(|stream| {
            reply(
                stream,
                "200 OK",
                r#"{"status":"success","data":{"resultType":"vector","result":[{"metric":{"lane":"a"},"value":[1.5,"30.5"]},{"metric":{},"value":[1.5,"NaN"]}]}}"#,
            )
        })
        .await;
        let answer = values(instant(&http(), &url, "q", OWN_BOUNDS).await).unwrap();
        assert_eq!(answer[0], 30.5);
        assert!(answer[1].is_nan());

        let url = server(|stream| {
            reply(
                stream,
                "200 OK",
                r#"{"status":"success","data":{"resultType":"scalar","result":[1.5,"+Inf"]}}"#,
            )
        })
        .await;
        assert_eq!(
            values(instant(&http(), &url, "q", OWN_BOUNDS).await),
            Ok(vec![f64::INFINITY])
        );

        let url = server(|stream| {
            reply(
                stream,
                "400 Bad Request",
                r#"{"status":"error","errorType":"bad_data","error":"parse error at char 5"}"#,
            )
        })
        .await;
        let error = values(instant(&http(), &url, "q", OWN_BOUNDS).await).unwrap_err();
        assert!(error.contains("parse error at char 5"), "{error}");
    }

    #[tokio::test]
    async fn a_redirect_is_not_followed() {
        let url = server(|stream| reply(stream, "302 Found", "")).await;
        let error = values(instant(&http(), &url, "q", OWN_BOUNDS).await).unwrap_err();
        assert!(error.contains("redirects are not followed"), "{error}");
    }

    #[tokio::test]
    async fn an_endless_answer_stops_at_the_cap() {
        let url = server(|mut stream| async move {
            let head = "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n";
            if stream.write_all(head.as_bytes()).await.is_err() {
                return;
            }
            let series = r#"{"metric":{"lane":"x"},"value":[1,"1"]},"#.repeat(256);
            let chunk = format!("{:x}\r\n{series}\r\n", series.len());
            let start = r#"{"status":"success","data":{"resultType":"vector","result":["#;
            let _ = stream
                .write_all(format!("{:x}\r\n{start}\r\n", start.len()).as_bytes())
                .await;
            while stream.write_all(chunk.as_bytes()).await.is_ok() {}
        })
        .await;
        let started = Instant::now();
        let error = values(instant(&http(), &url, "q", OWN_BOUNDS).await).unwrap_err();
        assert!(error.contains("longer than 1024 KiB"), "{error}");
        assert!(
            started.elapsed() < Duration::from_secs(2),
            "stopped by the cap, not the timeout"
        );
    }

    #[tokio::test]
    async fn a_declared_length_over_the_cap_is_not_read() {
        let url = server(|mut stream| async move {
            let head = format!(
                "HTTP/1.1 200 OK\r\nContent-Length: {}\r\n\r\n",
                MAX_ANSWER_BYTES + 1
            );
            let _ = stream.write_all(head.as_bytes()).await;
            tokio::time::sleep(Duration::from_secs(5)).await;
        })
        .await;
        let error = values(instant(&http(), &url, "q", OWN_BOUNDS).await).unwrap_err();
        assert!(error.contains("longer than"), "{error}");
    }

    #[tokio::test]
    async fn a_server_that_never_answers_is_given_up_on_at_the_timeout() {
        let url = server(|stream| async move {
            tokio::time::sleep(Duration::from_secs(30)).await;
            drop(stream);
        })
        .await;
        let started = Instant::now();
        let error = values(instant(&http(), &url, "q", OWN_BOUNDS).await).unwrap_err();
        assert!(
            error.contains("timed out") || error.contains("timeout"),
            "{error}"
        );
        assert!(started.elapsed() < Duration::from_secs(4));
    }

    #[tokio::test]
    async fn something_other_than_prometheus_is_named_as_such() {
        let url = server(|stream| reply(stream, "200 OK", "<html>login</html>")).await;
        let error = values(instant(&http(), &url, "q", OWN_BOUNDS).await).unwrap_err();
        assert!(error.contains("not Prometheus's JSON"), "{error}");
    }
}
