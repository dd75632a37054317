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
    DEFAULT_JOB_TIME_WINDOW, DEFAULT_RATE_WINDOW, DEFAULT_RECENT_RATE_LOOKBACK, LaneQueries, Query,
    QueryWindows, RecentQuery, Series, pool_queries,
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
            shared: Arc::default(),
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

    /// Forgets the lanes of deleted pools in every shared query (`live` says which pools
    /// exist), so pool churn does not grow what a shared query remembers. A query being asked
    /// right now keeps its lanes until the next call.
    pub fn forget_lanes(&self, live: impl Fn(&Series) -> bool) {
        let clients = self.clients.lock().unwrap_or_else(|p| p.into_inner());
        for client in clients.values() {
            let shared = client.shared.lock().unwrap_or_else(|p| p.into_inner());
            for slot in shared.values() {
                if let Ok(mut query) = slot.try_lock() {
                    query.lanes.retain(|lane| live(lane));
                }
            }
        }
    }
}

/// A client for one Prometheus server.
#[derive(Clone)]
pub struct Client {
    http: reqwest::Client,
    /// The server's `/api/v1/query`.
    endpoint: String,
    in_flight: Arc<Semaphore>,
    /// Each shared query, by PromQL.
    shared: Arc<Mutex<HashMap<String, Arc<tokio::sync::Mutex<Shared>>>>>,
}

/// A shared query: the lanes that take their series from it, and its latest answer.
#[derive(Default)]
struct Shared {
    lanes: std::collections::HashSet<Series>,
    latest: Option<SharedAnswer>,
}

/// A shared query's answer, indexed by series, and when it was asked.
struct SharedAnswer {
    asked: Instant,
    series: std::result::Result<Arc<HashMap<Series, f64>>, String>,
}

impl Client {
    /// Asks one lane's question: a pool's own query, or its series of a shared one (asked at
    /// most once per `freshness` for all the pools that share it).
    pub async fn ask(&self, query: &Query, metrics: &Metrics, freshness: Duration) -> Answer {
        match query {
            Query::Own(promql) => self.query(promql, metrics).await,
            Query::Shared {
                promql,
                series,
                own,
            } => match self.shared(promql, series, metrics, freshness).await {
                Ok(answer) => Ok(answer.get(series).map(|v| vec![*v]).unwrap_or_default()),
                // A Prometheus holding more lanes than the pools here (other clusters, say).
                Err(reason) if reason.starts_with(query::TOO_LARGE) => {
                    self.query(own, metrics).await
                }
                Err(reason) => Err(reason),
            },
        }
    }

    /// Runs one instant query, waiting for a place among the queries in flight: its values, one
    /// per series, or why there are none (with the query).
    pub async fn query(&self, promql: &str, metrics: &Metrics) -> Answer {
        self.run(promql, metrics, query::OWN_BOUNDS)
            .await
            .map(|series| series.into_iter().map(|(_, value)| value).collect())
    }

    /// The answer to a shared query, indexed by namespace, pool and lane: the one cached if it
    /// is at most `freshness` old (errors too, so a failing server is not asked by every pool),
    /// else asked once while the others wait for it. Its bounds grow with the lanes that share
    /// it: one pool alone gets a pool's own bounds.
    async fn shared(
        &self,
        promql: &str,
        lane: &Series,
        metrics: &Metrics,
        freshness: Duration,
    ) -> std::result::Result<Arc<HashMap<Series, f64>>, String> {
        let slot = {
            let mut shared = self.shared.lock().unwrap_or_else(|p| p.into_inner());
            shared.entry(promql.to_string()).or_default().clone()
        };
        let mut shared = slot.lock().await;
        if !shared.lanes.contains(lane) {
            shared.lanes.insert(lane.clone());
        }
        if let Some(answer) = shared.latest.as_ref()
            && answer.asked.elapsed() <= freshness
        {
            return answer.series.clone();
        }
        let bounds = query::shared_bounds(shared.lanes.len());
        let series = self
            .run(promql, metrics, bounds)
            .await
            .map(|series| Arc::new(index(series)));
        shared.latest = Some(SharedAnswer {
            asked: Instant::now(),
            series: series.clone(),
        });
        series
    }

    async fn run(
        &self,
        promql: &str,
        metrics: &Metrics,
        bounds: query::Bounds,
    ) -> std::result::Result<Vec<query::Labelled>, String> {
        let permit = self.in_flight.acquire().await;
        let started = Instant::now();
        let answer = match permit {
            Ok(_permit) => query::instant(&self.http, &self.endpoint, promql, bounds).await,
            Err(_) => Err("the operator is stopping".to_string()),
        };
        metrics.observe_query(started.elapsed(), answer.as_ref().err().map(|_| "failed"));
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
    use std::sync::atomic::{AtomicUsize, Ordering};
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    /// A Prometheus stand-in that answers every query with two lanes' series, counting queries.
    async fn grouped_server() -> (String, Arc<AtomicUsize>) {
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
    async fn a_shared_answer_too_large_to_read_falls_back_to_the_pools_own_query() {
        let client = Clients::new(4)
            .get(&Connection {
                url: crowded_server().await,
                timeout: Duration::from_secs(5),
                bearer_token: None,
                ca_pem: None,
                headers: BTreeMap::new(),
            })
            .unwrap();
        let answer = client
            .ask(&shared("a"), &Metrics::default(), Duration::from_secs(60))
            .await;
        assert_eq!(answer, Ok(vec![42.0]));
    }

    #[tokio::test]
    async fn pools_sharing_a_query_ask_it_once_per_freshness_and_take_their_own_series() {
        let (url, asked) = grouped_server().await;
        let clients = Clients::new(4);
        let client = clients
            .get(&Connection {
                url,
                timeout: Duration::from_secs(2),
                bearer_token: None,
                ca_pem: None,
                headers: BTreeMap::new(),
            })
            .unwrap();
        let metrics = Metrics::default();
        let fresh = Duration::from_secs(60);
        let (qa, qb, qc) = (shared("a"), shared("b"), shared("c"));
        let (a, b, c) = futures::join!(
            client.ask(&qa, &metrics, fresh),
            client.ask(&qb, &metrics, fresh),
            client.ask(&qc, &metrics, fresh),
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
        let again = client.ask(&shared("a"), &metrics, Duration::ZERO).await;
        assert_eq!(again, Ok(vec![30.0]));
        assert_eq!(asked.load(Ordering::SeqCst), 2, "asked again once stale");
        let own = client.ask(&Query::Own("x".into()), &metrics, fresh).await;
        assert_eq!(own.map(|v| v.len()), Ok(3), "a pool's own query is its own");

        // Pool churn does not grow what the shared query remembers.
        let lanes = |client: &Client| -> usize {
            let shared = client.shared.lock().unwrap();
            shared
                .values()
                .map(|slot| slot.try_lock().unwrap().lanes.len())
                .sum()
        };
        assert_eq!(lanes(&client), 3);
        clients.forget_lanes(|lane| lane.namespace == "a");
        assert_eq!(lanes(&client), 1);
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
        let error = http_client(&connection)
            .expect_err("a bad header is refused")
            .to_string();
        assert!(error.contains("spec.prometheus.headers"), "{error}");
    }
}
