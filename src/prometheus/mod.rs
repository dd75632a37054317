//! Prometheus access, on its own: which servers a pool may name ([`allowed`]), how to reach one
//! (URL, timeout, bearer token, CA, headers), one HTTP client per distinct connection, and
//! bounded instant queries ([`query`]) whose answers come back as plain numbers (or the reason
//! there are none), at most a set number at once across the operator. It knows nothing of the
//! controller; what to ask comes from [`queries`], what an answer means from [`crate::sizing`].

pub mod allowed;
pub mod queries;
pub mod query;

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tokio::sync::Semaphore;

use crate::metrics::Metrics;
use crate::sizing::Answer;
use crate::{Error, Result};

pub use allowed::AllowedUrls;
pub use queries::{
    DEFAULT_JOB_TIME_WINDOW, DEFAULT_RATE_WINDOW, DEFAULT_RECENT_RATE_LOOKBACK, LaneQueries,
    QueryWindows, RecentQuery, pool_queries,
};

/// How to reach Prometheus: everything that goes into the HTTP client. Its Debug form hides
/// the token.
#[derive(Clone, PartialEq, Eq, Hash)]
pub struct Connection {
    pub url: String,
    pub timeout: Duration,
    pub bearer_token: Option<String>,
    pub ca_pem: Option<Vec<u8>>,
    pub headers: BTreeMap<String, String>,
}

impl std::fmt::Debug for Connection {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Connection")
            .field("url", &self.url)
            .field("timeout", &self.timeout)
            .field(
                "bearer_token",
                &self.bearer_token.as_ref().map(|_| "<hidden>"),
            )
            .field("ca_pem", &self.ca_pem.as_ref().map(|pem| pem.len()))
            .field("headers", &self.headers.keys().collect::<Vec<_>>())
            .finish()
    }
}

/// The operator's default limit on queries in flight at once (`--prometheus-concurrency`), below
/// Prometheus's own default of 20 concurrent queries.
pub const DEFAULT_CONCURRENCY: u16 = 10;

/// One HTTP client per connection, built on first use and shared by every pool that reaches the
/// same server the same way; every query through them shares one limit on queries in flight.
pub struct Clients {
    clients: Mutex<HashMap<Connection, Client>>,
    in_flight: Arc<Semaphore>,
}

impl Clients {
    /// Clients whose queries run at most `concurrency` at once (at least one).
    pub fn new(concurrency: usize) -> Self {
        Self {
            clients: Mutex::default(),
            in_flight: Arc::new(Semaphore::new(concurrency.max(1))),
        }
    }

    /// The client for `connection`, building it (and checking its headers, token and CA) once.
    pub fn get(&self, connection: &Connection) -> Result<Client> {
        let mut clients = self.clients.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(client) = clients.get(connection) {
            return Ok(client.clone());
        }
        let built = Client {
            http: http_client(connection)?,
            endpoint: endpoint(&connection.url)?,
            in_flight: self.in_flight.clone(),
        };
        clients.insert(connection.clone(), built.clone());
        Ok(built)
    }

    /// Forgets every client but those of `keep`: the connections pools still use, so a rotated
    /// token or a deleted pool does not keep a client alive.
    pub fn retain(&self, keep: impl Fn(&Connection) -> bool) {
        let mut clients = self.clients.lock().unwrap_or_else(|p| p.into_inner());
        clients.retain(|connection, _| keep(connection));
    }

    /// How many clients are cached.
    pub fn len(&self) -> usize {
        self.clients.lock().unwrap_or_else(|p| p.into_inner()).len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// A client for one Prometheus server.
#[derive(Clone)]
pub struct Client {
    http: reqwest::Client,
    /// The server's `/api/v1/query`.
    endpoint: String,
    in_flight: Arc<Semaphore>,
}

impl Client {
    /// Runs one instant query, waiting for a place among the queries in flight: its values, one
    /// per series, or why there are none (with the query).
    pub async fn query(&self, promql: &str, metrics: &Metrics) -> Answer {
        let permit = self.in_flight.acquire().await;
        let started = Instant::now();
        let answer = match permit {
            Ok(_permit) => query::instant(&self.http, &self.endpoint, promql).await,
            Err(_) => Err("the operator is stopping".to_string()),
        };
        metrics.observe_query(started.elapsed(), answer.as_ref().err().map(|_| "failed"));
        answer.map_err(|reason| format!("{reason} (query: {promql})"))
    }
}

fn endpoint(url: &str) -> Result<String> {
    let parsed = reqwest::Url::parse(url)
        .map_err(|e| Error::invalid("spec.prometheus.url", format!("{url:?}: {e}")))?;
    if !matches!(parsed.scheme(), "http" | "https") {
        return Err(Error::invalid(
            "spec.prometheus.url",
            format!("{url:?} is not an http(s) URL"),
        ));
    }
    Ok(format!("{}/api/v1/query", url.trim_end_matches('/')))
}

/// The HTTP client of one connection: its timeout for the whole exchange, its headers and
/// token (marked sensitive), its CA, and no redirects.
fn http_client(connection: &Connection) -> Result<reqwest::Client> {
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
        .redirect(reqwest::redirect::Policy::none())
        .default_headers(headers);
    if let Some(pem) = &connection.ca_pem {
        let certificate = reqwest::Certificate::from_pem(pem)
            .map_err(|e| invalid("spec.prometheus.caSecret", e.to_string()))?;
        builder = builder.add_root_certificate(certificate);
    }
    builder
        .build()
        .map_err(|e| invalid("spec.prometheus", query::describe(&e)))
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
        let error = http_client(&connection)
            .expect_err("a bad header is refused")
            .to_string();
        assert!(error.contains("spec.prometheus.headers"), "{error}");
    }
}
