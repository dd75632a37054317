//! Prometheus access, on its own: how to reach a server (URL, timeout, bearer token, CA,
//! headers), one HTTP client per distinct connection, and instant queries whose answers come back
//! as plain numbers (or the reason there are none). It knows nothing of the controller; what
//! to ask comes from [`queries`], what an answer means from [`crate::sizing`].

pub mod queries;

use std::collections::{BTreeMap, HashMap};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use prometheus_http_query::reqwest;
use prometheus_http_query::response::Data;

use crate::metrics::Metrics;
use crate::sizing::Answer;
use crate::{Error, Result};

pub use queries::{
    DEFAULT_JOB_TIME_WINDOW, DEFAULT_RATE_WINDOW, DEFAULT_RECENT_RATE_LOOKBACK, LaneQueries,
    QueryWindows, RecentQuery, pool_queries,
};

/// How to reach Prometheus: everything that goes into the HTTP client.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Connection {
    pub url: String,
    pub timeout: Duration,
    pub bearer_token: Option<String>,
    pub ca_pem: Option<Vec<u8>>,
    pub headers: BTreeMap<String, String>,
}

/// One HTTP client per connection, built on first use and shared by every pool that reaches the
/// same server the same way.
#[derive(Default)]
pub struct Clients {
    clients: Mutex<HashMap<Connection, prometheus_http_query::Client>>,
}

impl Clients {
    /// The client for `connection`, building it (and checking its headers, token and CA) once.
    pub fn get(&self, connection: &Connection) -> Result<prometheus_http_query::Client> {
        let mut clients = self.clients.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(client) = clients.get(connection) {
            return Ok(client.clone());
        }
        let built = client(connection)?;
        clients.insert(connection.clone(), built.clone());
        Ok(built)
    }
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

/// Runs one instant query: its values, one per series, or why there are none (with the query).
pub async fn query(
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

#[cfg(test)]
mod tests {
    use super::*;

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
