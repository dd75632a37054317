//! Prometheus access, on its own: which servers a pool may name ([`allowed`]), how to reach one
//! (URL, timeout, bearer token or basic auth, CA, client certificate, headers), one HTTP client
//! per distinct connection, and bounded instant queries ([`query`]) (and, for `lanepool replay`,
//! range queries: [`range`]) whose answers come back as
//! plain numbers (or the reason there are none), at most a set number at once across the
//! operator. It knows nothing of the controller; what to ask comes from [`queries`], what an
//! answer means from [`crate::sizing`].

pub mod allowed;
pub mod queries;
pub mod query;
pub mod range;
pub mod spec;

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tokio::sync::{Semaphore, watch};

use crate::metrics::Metrics;
use crate::sizing::QueryAnswer;
use crate::{Error, Result};

pub use allowed::AllowedUrls;
pub use queries::{
    DEFAULT_JOB_TIME_WINDOW, DEFAULT_RATE_WINDOW, DEFAULT_RECENT_RATE_LOOKBACK, LaneQueries, Query,
    QueryWindows, RecentQuery, Series, default_job_time, pool_queries,
};

/// How to reach Prometheus: everything that goes into the HTTP client, credentials read from
/// the pool's Secrets included, so a rotated Secret makes a new connection. Its Debug form hides
/// the token, the password and the client key.
#[derive(Clone, PartialEq, Eq, Hash)]
pub struct Connection {
    pub url: String,
    pub timeout: Duration,
    pub bearer_token: Option<String>,
    pub basic_auth: Option<BasicAuth>,
    pub ca_pem: Option<Vec<u8>>,
    pub client_certificate: Option<ClientCertificate>,
    pub headers: BTreeMap<String, String>,
}

/// A username and password for HTTP basic auth.
#[derive(Clone, PartialEq, Eq, Hash)]
pub struct BasicAuth {
    pub username: String,
    pub password: String,
}

/// A PEM client certificate (the chain, leaf first) and its PEM private key, for mutual TLS.
#[derive(Clone, PartialEq, Eq, Hash)]
pub struct ClientCertificate {
    pub certificate_pem: Vec<u8>,
    pub key_pem: Vec<u8>,
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
            .field("basic_auth", &self.basic_auth)
            .field("ca_pem", &self.ca_pem.as_ref().map(|pem| pem.len()))
            .field("client_certificate", &self.client_certificate)
            .field("headers", &self.headers.keys().collect::<Vec<_>>())
            .finish()
    }
}

impl std::fmt::Debug for BasicAuth {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("BasicAuth")
            .field("username", &"<hidden>")
            .field("password", &"<hidden>")
            .finish()
    }
}

impl std::fmt::Debug for ClientCertificate {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ClientCertificate")
            .field("certificate_pem", &self.certificate_pem.len())
            .field("key_pem", &"<hidden>")
            .finish()
    }
}

/// The operator's default limit on queries in flight at once (`--prometheus-concurrency`), below
/// Prometheus's own default of 20 concurrent queries.
pub const DEFAULT_CONCURRENCY: u16 = 10;

/// One HTTP client per connection, built on first use and shared by every pool that reaches the
/// same server the same way; every query through them shares one limit on queries in flight, of
/// which one pool's own queries hold at most a quarter: a tenant's slow PromQL (it may run for
/// the connection's whole timeout) never takes every place from the other pools.
pub struct Clients {
    clients: Mutex<HashMap<Connection, Client>>,
    in_flight: Arc<Semaphore>,
    /// Each pool's share of the places in flight, by `namespace/name`.
    shares: Mutex<HashMap<String, Arc<Semaphore>>>,
    share: usize,
    metrics: Arc<Metrics>,
}

impl Clients {
    /// Clients whose queries run at most `concurrency` at once (at least one), counted in
    /// `metrics`.
    pub fn new(concurrency: usize, metrics: Arc<Metrics>) -> Self {
        Self {
            clients: Mutex::default(),
            in_flight: Arc::new(Semaphore::new(concurrency.max(1))),
            shares: Mutex::default(),
            share: (concurrency / 4).max(1),
            metrics,
        }
    }

    /// The client for `connection` as the pool `pool` (`namespace/name`) uses it: its own
    /// queries hold at most the pool's share of the places in flight.
    pub fn for_pool(&self, connection: &Connection, pool: &str) -> Result<Client> {
        let share = lock(&self.shares)
            .entry(pool.to_string())
            .or_insert_with(|| Arc::new(Semaphore::new(self.share)))
            .clone();
        Ok(Client {
            share: Some(share),
            ..self.get(connection)?
        })
    }

    /// Forgets the shares of the pools `live` does not name (`namespace/name`).
    pub fn forget_pools(&self, live: impl Fn(&str) -> bool) {
        lock(&self.shares).retain(|pool, _| live(pool));
    }

    /// The client for `connection`, building it (and checking its headers, token and CA) once.
    pub fn get(&self, connection: &Connection) -> Result<Client> {
        let mut clients = lock(&self.clients);
        if let Some(client) = clients.get(connection) {
            return Ok(client.clone());
        }
        let built = Client {
            http: http_client(connection)?,
            endpoint: endpoint(&connection.url)?,
            in_flight: self.in_flight.clone(),
            share: None,
            metrics: self.metrics.clone(),
            shared: Arc::default(),
            epoch: tokio::time::Instant::now(),
        };
        clients.insert(connection.clone(), built.clone());
        Ok(built)
    }

    /// Forgets every client but those of `keep`: the connections pools still use, so a rotated
    /// token or a deleted pool does not keep a client alive (nor its refreshes running).
    pub fn retain(&self, keep: impl Fn(&Connection) -> bool) {
        lock(&self.clients).retain(|connection, client| {
            let kept = keep(connection);
            if !kept {
                client.stop_refreshing();
            }
            kept
        });
    }

    /// Forgets the lanes of deleted pools in every shared query (`live` says which pools
    /// exist), so pool churn does not grow what a shared query remembers.
    pub fn forget_lanes(&self, live: impl Fn(&Series) -> bool) {
        for client in lock(&self.clients).values() {
            for query in lock(&client.shared).values() {
                lock(&query.state).lanes.retain(|lane| live(lane));
            }
        }
    }
}

impl Drop for Clients {
    /// The refreshes stop with the operator's controller, not a minute later.
    fn drop(&mut self) {
        for client in lock(&self.clients).values() {
            client.stop_refreshing();
        }
    }
}

fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(|p| p.into_inner())
}

/// A refresh keeps running while pools take their series from it: it stops once no pool has
/// asked for this long, and the next pool to ask starts it again (and waits for its answer).
const REFRESH_IDLE: Duration = Duration::from_secs(60);

/// A client for one Prometheus server.
#[derive(Clone)]
pub struct Client {
    http: reqwest::Client,
    /// The server's `/api/v1/query`.
    endpoint: String,
    in_flight: Arc<Semaphore>,
    /// The share of `in_flight` a pool's own queries through this client hold at most (`None`:
    /// not a pool's, as a shared query's refresh).
    share: Option<Arc<Semaphore>>,
    metrics: Arc<Metrics>,
    /// Each shared query, by PromQL.
    shared: Arc<Mutex<HashMap<String, Arc<SharedQuery>>>>,
    /// The clock the refreshes keep time by: each is asked at whole periods from here, so the
    /// shapes a decision combines (a rate and its recent rate) are asked at the same moments.
    epoch: tokio::time::Instant,
}

/// A shared query: the lanes that take their series from it, its refresh, and its latest
/// answer, which pools read without waiting.
struct SharedQuery {
    state: Mutex<Refresh>,
    latest: watch::Sender<Option<SharedAnswer>>,
}

#[derive(Default)]
struct Refresh {
    lanes: HashSet<Series>,
    /// When a pool last asked: the refresh stops after [`REFRESH_IDLE`] without one.
    wanted: Option<Instant>,
    /// The background refresh, while it runs.
    running: Option<tokio::task::AbortHandle>,
}

/// A shared query's answer, indexed by series, and when it arrived.
#[derive(Clone)]
struct SharedAnswer {
    arrived: Instant,
    series: std::result::Result<Arc<HashMap<Series, f64>>, String>,
}

impl Client {
    /// Asks one lane's question: a pool's own query, or its series of a shared one (asked once
    /// per `period` in the background for all the pools that share it).
    pub async fn ask(&self, query: &Query, period: Duration) -> QueryAnswer {
        match query {
            Query::Own(promql) => self.query(promql).await,
            Query::Shared {
                promql,
                series,
                own,
            } => match self.shared(promql, series, period).await {
                Ok(answer) => Ok(answer.get(series).map(|v| vec![*v]).unwrap_or_default()),
                // A Prometheus holding more lanes than the pools here (other clusters, say).
                Err(reason) if reason.starts_with(query::TOO_LARGE) => self.query(own).await,
                Err(reason) => Err(reason),
            },
        }
    }

    /// Runs one instant query, waiting for a place among the queries in flight: its values, one
    /// per series, or why there are none (with the query).
    pub async fn query(&self, promql: &str) -> QueryAnswer {
        self.run(promql, query::OWN_BOUNDS)
            .await
            .map(|series| series.into_iter().map(|(_, value)| value).collect())
    }

    /// One lane's question over a past range, as `lanepool replay` asks it: a pool's own query,
    /// or the lane-alone form of a shared one (a shared range answer would hold every pool's
    /// lanes). Its points, in time order; none when it has no series; an error when it has more
    /// than one, as for an instant query.
    pub async fn ask_range(
        &self,
        query: &Query,
        range: range::Range,
    ) -> std::result::Result<Vec<(f64, f64)>, String> {
        let promql = match query {
            Query::Own(promql) | Query::Shared { own: promql, .. } => promql,
        };
        let permit = self.in_flight.acquire().await;
        let started = Instant::now();
        let endpoint = format!("{}_range", self.endpoint);
        let answer = match permit {
            Ok(_permit) => {
                range::range(&self.http, &endpoint, promql, range, query::OWN_BOUNDS).await
            }
            Err(_) => Err("the operator is stopping".to_string()),
        };
        self.metrics
            .observe_query(started.elapsed(), answer.as_ref().err().map(|_| "failed"));
        let mut series = answer.map_err(|reason| format!("{reason} (query: {promql})"))?;
        match series.len() {
            0 => Ok(Vec::new()),
            1 => Ok(series.pop().map(|(_, points)| points).unwrap_or_default()),
            n => Err(format!(
                "the query returned {n} series; it must aggregate to one, such as sum(...) (query: {promql})"
            )),
        }
    }

    /// Runs one instant query of the pool's own, keeping each series' labels.
    pub async fn query_labelled(
        &self,
        promql: &str,
    ) -> std::result::Result<Vec<query::Labelled>, String> {
        self.run(promql, query::OWN_BOUNDS).await
    }

    /// The answer to a shared query, indexed by namespace, pool and lane. A refresh in the
    /// background asks it once per `period` while pools want it, so a pool reads the latest
    /// answer at once: errors too, so a failing server is not asked by every pool. Only an
    /// answer older than two periods (the first, or after the refresh stopped or fell behind)
    /// is waited for.
    async fn shared(
        &self,
        promql: &str,
        lane: &Series,
        period: Duration,
    ) -> std::result::Result<Arc<HashMap<Series, f64>>, String> {
        let query = lock(&self.shared)
            .entry(promql.to_string())
            .or_insert_with(|| {
                Arc::new(SharedQuery {
                    state: Mutex::default(),
                    latest: watch::Sender::new(None),
                })
            })
            .clone();
        let mut latest = query.latest.subscribe();
        {
            let mut state = lock(&query.state);
            if !state.lanes.contains(lane) {
                state.lanes.insert(lane.clone());
            }
            state.wanted = Some(Instant::now());
            if state.running.is_none() {
                // The refresh serves every pool: no pool's share limits it.
                let common = Client {
                    share: None,
                    ..self.clone()
                };
                let refresh =
                    tokio::spawn(common.refresh(promql.to_string(), query.clone(), period));
                state.running = Some(refresh.abort_handle());
            }
        }
        let fresh = |answer: &Option<SharedAnswer>| {
            answer
                .as_ref()
                .is_some_and(|a| a.arrived.elapsed() <= period * 2)
        };
        match latest.wait_for(fresh).await {
            Ok(answer) => answer.as_ref().map_or_else(
                || Err("no answer".to_string()),
                |answer| answer.series.clone(),
            ),
            Err(_) => Err("the operator is stopping".to_string()),
        }
    }

    /// Asks a shared query at once, then at every whole `period` of the client's clock, until
    /// no pool has wanted it for [`REFRESH_IDLE`]. Its bounds grow with the lanes that share it:
    /// one pool alone gets a pool's own bounds.
    async fn refresh(self, promql: String, query: Arc<SharedQuery>, period: Duration) {
        loop {
            let bounds = query::shared_bounds(lock(&query.state).lanes.len());
            let series = self
                .run(&promql, bounds)
                .await
                .map(|series| Arc::new(index(series)));
            query.latest.send_replace(Some(SharedAnswer {
                arrived: Instant::now(),
                series,
            }));
            let periods = self.epoch.elapsed().as_nanos() / period.as_nanos().max(1) + 1;
            let next = period.saturating_mul(u32::try_from(periods).unwrap_or(u32::MAX));
            tokio::time::sleep_until(self.epoch + next).await;
            let mut state = lock(&query.state);
            if state.wanted.is_none_or(|at| at.elapsed() > REFRESH_IDLE) {
                state.running = None;
                return;
            }
        }
    }

    fn stop_refreshing(&self) {
        for query in lock(&self.shared).values() {
            if let Some(refresh) = lock(&query.state).running.take() {
                refresh.abort();
            }
        }
    }

    async fn run(
        &self,
        promql: &str,
        bounds: query::Bounds,
    ) -> std::result::Result<Vec<query::Labelled>, String> {
        let share = match &self.share {
            Some(share) => Some(share.acquire().await),
            None => None,
        };
        let permit = self.in_flight.acquire().await;
        let started = Instant::now();
        let answer = match (permit, share.transpose()) {
            (Ok(_permit), Ok(_share)) => {
                query::instant(&self.http, &self.endpoint, promql, bounds).await
            }
            _ => Err("the operator is stopping".to_string()),
        };
        self.metrics
            .observe_query(started.elapsed(), answer.as_ref().err().map(|_| "failed"));
        answer.map_err(|reason| format!("{reason} (query: {promql})"))
    }
}

/// A grouped answer by series; a series without all three labels belongs to no lane.
fn index(series: Vec<query::Labelled>) -> HashMap<Series, f64> {
    series
        .into_iter()
        .filter_map(|(mut labels, value)| {
            let key = Series {
                namespace: labels.remove("namespace")?,
                pool: labels.remove("pool")?,
                lane: labels.remove("lane")?,
            };
            Some((key, value))
        })
        .collect()
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
/// credentials (marked sensitive), its CA and client certificate, and no redirects.
fn http_client(connection: &Connection) -> Result<reqwest::Client> {
    let invalid = |field: &str, reason: String| Error::invalid(field, reason);
    let mut headers = reqwest::header::HeaderMap::new();
    for (name, value) in &connection.headers {
        if crate::api::REFUSED_HEADERS.contains(&name.to_ascii_lowercase().as_str()) {
            return Err(invalid(
                "spec.prometheus.headers",
                format!(
                    "{name} may not be set: use bearerTokenSecret or basicAuth for credentials"
                ),
            ));
        }
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
    if let Some(basic) = &connection.basic_auth {
        headers.insert(reqwest::header::AUTHORIZATION, basic_auth_header(basic)?);
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
    if let Some(certificate) = &connection.client_certificate {
        builder = builder.identity(identity(certificate)?);
    }
    builder
        .build()
        .map_err(|e| invalid("spec.prometheus", query::describe(&e)))
}

/// `Basic base64(username:password)`, marked sensitive so it never appears in logs. Surrounding
/// whitespace is trimmed, as for the bearer token and as Prometheus trims its own
/// `password_file`: a Secret written from a file often ends in a newline.
fn basic_auth_header(basic: &BasicAuth) -> Result<reqwest::header::HeaderValue> {
    use base64::Engine as _;
    let username = basic.username.trim();
    if username.contains(':') {
        return Err(Error::invalid(
            "spec.prometheus.basicAuth.usernameSecret",
            "a basic-auth username must not contain ':'",
        ));
    }
    let credentials = format!("{username}:{}", basic.password.trim());
    let encoded = base64::engine::general_purpose::STANDARD.encode(credentials);
    let mut value = reqwest::header::HeaderValue::from_str(&format!("Basic {encoded}"))
        .map_err(|e| Error::invalid("spec.prometheus.basicAuth", e.to_string()))?;
    value.set_sensitive(true);
    Ok(value)
}

/// The client certificate and key as reqwest's identity. The key is only read, and checked
/// against the certificate, when a client is built: one is built here with the identity alone,
/// so a bad key is reported as this field's fault and not as the connection's.
fn identity(certificate: &ClientCertificate) -> Result<reqwest::Identity> {
    let invalid = |reason: String| {
        Error::invalid(
            "spec.prometheus.clientCertificateSecret",
            format!(
                "tls.crt and tls.key must be a PEM certificate and its PEM private key: {reason}"
            ),
        )
    };
    let certificates = reqwest::Certificate::from_pem_bundle(&certificate.certificate_pem)
        .map_err(|e| invalid(format!("tls.crt: {}", query::describe(&e))))?;
    if certificates.is_empty() {
        return Err(invalid("tls.crt holds no PEM certificate".into()));
    }
    let mut pem = certificate.certificate_pem.clone();
    pem.push(b'\n');
    pem.extend_from_slice(&certificate.key_pem);
    let identity = reqwest::Identity::from_pem(&pem).map_err(|e| invalid(query::describe(&e)))?;
    reqwest::Client::builder()
        .identity(identity.clone())
        .build()
        .map_err(|e| invalid(format!("tls.key: {}", query::describe(&e))))?;
    Ok(identity)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    /// A Prometheus stand-in that answers every query with two lanes' series after `delay`,
    /// counting queries.
    async fn grouped_server(delay: Duration) -> (String, Arc<AtomicUsize>) {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}", listener.local_addr().unwrap());
        let asked = Arc::new(AtomicUsize::new(0));
        let counted = asked.clone();
        tokio::spawn(async move {
            while let Ok((mut stream, _)) = listener.accept().await {
                counted.fetch_add(1, Ordering::SeqCst);
                tokio::spawn(async move {
                    let mut request = [0u8; 4096];
                    let _ = stream.read(&mut request).await;
                    tokio::time::sleep(delay).await;
                    let body = r#"{"status":"success","data":{"resultType":"vector","result":[
                        {"metric":{"namespace":"a","pool":"jobs","lane":"urgent"},"value":[1,"30"]},
                        {"metric":{"namespace":"b","pool":"jobs","lane":"urgent"},"value":[1,"150"]},
                        {"metric":{"pool":"unlabelled"},"value":[1,"7"]}]}}"#;
                    let response = format!(
                        "HTTP/1.1 200 OK\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
                        body.len()
                    );
                    let _ = stream.write_all(response.as_bytes()).await;
                });
            }
        });
        (url, asked)
    }

    fn clients() -> Clients {
        Clients::new(4, Arc::new(Metrics::default()))
    }

    fn connection(url: String) -> Connection {
        Connection {
            url,
            timeout: Duration::from_secs(5),
            bearer_token: None,
            basic_auth: None,
            ca_pem: None,
            client_certificate: None,
            headers: BTreeMap::new(),
        }
    }

    fn shared(namespace: &str) -> Query {
        Query::Shared {
            promql: "sum by (namespace, pool, lane) (x)".into(),
            series: Series {
                namespace: namespace.into(),
                pool: "jobs".into(),
                lane: "urgent".into(),
            },
            own: "own".into(),
        }
    }

    /// A Prometheus holding far more lanes than this operator's pools: 20,000 series for the
    /// grouped query, one for a pool's own.
    async fn crowded_server() -> String {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}", listener.local_addr().unwrap());
        tokio::spawn(async move {
            while let Ok((mut stream, _)) = listener.accept().await {
                tokio::spawn(async move {
                    let mut request = [0u8; 4096];
                    let n = stream.read(&mut request).await.unwrap_or(0);
                    let line = String::from_utf8_lossy(&request[..n]).to_string();
                    let series: Vec<String> = if line.contains("query=own") {
                        vec![r#"{"metric":{},"value":[1,"42"]}"#.to_string()]
                    } else {
                        (0..20_000)
                            .map(|i| format!(r#"{{"metric":{{"namespace":"n{i}","pool":"p","lane":"l"}},"value":[1,"1"]}}"#))
                            .collect()
                    };
                    let body = format!(
                        r#"{{"status":"success","data":{{"resultType":"vector","result":[{}]}}}}"#,
                        series.join(",")
                    );
                    let response = format!(
                        "HTTP/1.1 200 OK\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
                        body.len()
                    );
                    let _ = stream.write_all(response.as_bytes()).await;
                });
            }
        });
        url
    }

    #[tokio::test]
    async fn one_pools_slow_queries_hold_only_its_share_of_the_places_in_flight() {
        let clients = clients(); // 4 places in flight: a pool's share is 1.
        let (slow, _) = grouped_server(Duration::from_secs(2)).await;
        let (fast, _) = grouped_server(Duration::ZERO).await;
        let tenant = clients.for_pool(&connection(slow), "a/jobs").unwrap();
        let hogging = tokio::spawn(async move {
            futures::future::join_all((0..4).map(|_| tenant.query("sum(x)"))).await
        });
        tokio::time::sleep(Duration::from_millis(200)).await;
        let calm = clients.for_pool(&connection(fast), "b/jobs").unwrap();
        let asked = Instant::now();
        assert!(calm.query("sum(x)").await.is_ok());
        assert!(
            asked.elapsed() < Duration::from_millis(1500),
            "the calm pool waited {:?} behind another pool's slow queries",
            asked.elapsed()
        );
        // The tenant's own queries wait for each other: four take four times as long.
        let answers = hogging.await.unwrap();
        assert!(answers.iter().all(Result::is_ok));
        clients.forget_pools(|pool| pool == "b/jobs");
        assert_eq!(lock(&clients.shares).len(), 1);
    }

    #[tokio::test]
    async fn a_shared_answer_too_large_to_read_falls_back_to_the_pools_own_query() {
        let client = clients().get(&connection(crowded_server().await)).unwrap();
        let answer = client.ask(&shared("a"), Duration::from_secs(60)).await;
        assert_eq!(answer, Ok(vec![42.0]));
    }

    #[tokio::test]
    async fn pools_sharing_a_query_ask_it_once_and_take_their_own_series() {
        let (url, asked) = grouped_server(Duration::ZERO).await;
        let clients = clients();
        let client = clients.get(&connection(url)).unwrap();
        let period = Duration::from_secs(60);
        let (qa, qb, qc) = (shared("a"), shared("b"), shared("c"));
        let (a, b, c) = futures::join!(
            client.ask(&qa, period),
            client.ask(&qb, period),
            client.ask(&qc, period),
        );
        assert_eq!(a, Ok(vec![30.0]));
        assert_eq!(b, Ok(vec![150.0]));
        assert_eq!(
            c,
            Ok(vec![]),
            "a lane without a series has none, never zero"
        );
        assert_eq!(
            asked.load(Ordering::SeqCst),
            1,
            "asked once for the three pools"
        );
        let own = client.ask(&Query::Own("x".into()), period).await;
        assert_eq!(own.map(|v| v.len()), Ok(3), "a pool's own query is its own");

        // Pool churn does not grow what the shared query remembers.
        let lanes = |client: &Client| -> usize {
            let shared = lock(&client.shared);
            shared.values().map(|q| lock(&q.state).lanes.len()).sum()
        };
        assert_eq!(lanes(&client), 3);
        clients.forget_lanes(|lane| lane.namespace == "a");
        assert_eq!(lanes(&client), 1);
    }

    #[tokio::test]
    async fn a_shared_query_is_refreshed_in_the_background_and_read_without_waiting() {
        // Each answer takes 400 ms; the query is refreshed every second.
        let slow = Duration::from_millis(400);
        let (url, asked) = grouped_server(slow).await;
        let clients = clients();
        let client = clients.get(&connection(url)).unwrap();
        let period = Duration::from_secs(1);
        let first = Instant::now();
        assert_eq!(client.ask(&shared("a"), period).await, Ok(vec![30.0]));
        assert!(
            first.elapsed() >= slow,
            "the first pool waits for the first answer"
        );

        // 1.2 s after the first ask the refresh is in flight: a pool reads the previous answer
        // instead of waiting for it.
        tokio::time::sleep_until((first + Duration::from_millis(1200)).into()).await;
        assert_eq!(
            asked.load(Ordering::SeqCst),
            2,
            "refreshed after one period"
        );
        let read = Instant::now();
        assert_eq!(client.ask(&shared("b"), period).await, Ok(vec![150.0]));
        assert!(read.elapsed() < slow, "read in {:?}", read.elapsed());

        // Once the operator's clients are gone, so is the refresh.
        drop(clients);
        tokio::time::sleep(Duration::from_millis(2500)).await;
        let after = asked.load(Ordering::SeqCst);
        tokio::time::sleep(Duration::from_millis(2500)).await;
        assert_eq!(
            asked.load(Ordering::SeqCst),
            after,
            "no refresh after the clients are dropped"
        );
    }

    /// A plain connection that sends one extra header.
    fn with_header(name: &str) -> Connection {
        Connection {
            url: "http://127.0.0.1:9".into(),
            timeout: Duration::from_secs(1),
            bearer_token: None,
            basic_auth: None,
            ca_pem: None,
            client_certificate: None,
            headers: BTreeMap::from([(name.into(), "x".into())]),
        }
    }

    #[test]
    fn a_bad_header_names_the_field() {
        let connection = with_header("bad header");
        let error = http_client(&connection)
            .expect_err("a bad header is refused")
            .to_string();
        assert!(error.contains("spec.prometheus.headers"), "{error}");
    }

    #[test]
    fn headers_that_redirect_or_carry_credentials_are_refused_as_the_crd_refuses_them() {
        let crd = crate::crd::lanepool_crd_yaml().unwrap_or_default();
        for name in crate::api::REFUSED_HEADERS {
            assert!(
                crd.contains(&format!("'{name}'")),
                "the CRD's rule misses {name}"
            );
            let shouted = name.to_ascii_uppercase();
            let error = http_client(&with_header(&shouted))
                .expect_err(name)
                .to_string();
            assert!(error.contains("spec.prometheus.headers"), "{error}");
            assert!(error.contains(&shouted), "{error}");
        }
    }

    fn guarded(url: &str) -> Connection {
        Connection {
            url: url.into(),
            timeout: Duration::from_secs(1),
            bearer_token: Some("the-token".into()),
            basic_auth: Some(BasicAuth {
                username: "the-user".into(),
                password: "the-password".into(),
            }),
            ca_pem: None,
            client_certificate: Some(ClientCertificate {
                certificate_pem: b"the-certificate".to_vec(),
                key_pem: b"the-key".to_vec(),
            }),
            headers: BTreeMap::new(),
        }
    }

    #[test]
    fn a_connections_debug_form_shows_no_credential() {
        let shown = format!("{:?}", guarded("https://127.0.0.1:9"));
        for credential in [
            "the-token",
            "the-user",
            "the-password",
            "the-certificate",
            "the-key",
        ] {
            assert!(!shown.contains(credential), "{credential} in {shown}");
        }
        assert!(shown.contains("https://127.0.0.1:9"), "{shown}");
    }

    #[test]
    fn basic_auth_is_one_sensitive_header_with_the_secrets_trailing_newline_trimmed() {
        let value = basic_auth_header(&BasicAuth {
            username: "user".into(),
            password: "pass\n".into(),
        })
        .unwrap();
        // base64("user:pass")
        assert_eq!(value.to_str().unwrap(), "Basic dXNlcjpwYXNz");
        assert!(value.is_sensitive(), "kept out of reqwest's Debug and logs");
    }

    #[test]
    fn a_basic_auth_username_with_a_colon_names_the_field() {
        let error = basic_auth_header(&BasicAuth {
            username: "a:b".into(),
            password: "p".into(),
        })
        .expect_err("refused: the colon separates the username from the password")
        .to_string();
        assert!(
            error.contains("spec.prometheus.basicAuth.usernameSecret"),
            "{error}"
        );
    }

    #[test]
    fn a_client_certificate_that_is_not_pem_names_the_field() {
        let mut connection = guarded("https://127.0.0.1:9");
        connection.basic_auth = None;
        let error = http_client(&connection).expect_err("refused").to_string();
        assert!(
            error.contains("spec.prometheus.clientCertificateSecret") && error.contains("tls.crt"),
            "{error}"
        );
        assert!(!error.contains("the-key"), "{error}");
    }
}
