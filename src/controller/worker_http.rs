//! The client every request to a worker Pod goes through, held in the context with the other
//! clients: [`WorkerHttp`], a `GET` and a `POST` of a path at a Pod's address, and its one
//! implementation, [`Reqwest`]. Worker Pods run whatever a tenant deploys: the client follows no
//! redirect (a Pod's 302 or 307 would send the operator, from its network position, anywhere),
//! and reads answers as a capped stream (a timeout bounds time, not bytes). Never reads more of
//! an answer than [`MOST_ANSWER_BYTES`] or [`MOST_ANSWER_LINES`]. Only the stages that do I/O
//! (`observe/`, `act/`) send requests through it.

use std::sync::OnceLock;
use std::time::Duration;

use futures::FutureExt;
use futures::future::BoxFuture;
use tracing::warn;

/// The most of one answer read: a worker's gauges and counters are a few kB; beyond this the
/// answer is dropped, never parsed.
pub(crate) const MOST_ANSWER_BYTES: usize = 256 * 1024;
/// The most lines of one answer read (many tiny lines cost more to parse than their bytes say).
pub(crate) const MOST_ANSWER_LINES: usize = 4096;
/// How long one request to a Pod may take, its answer included.
pub(crate) const REQUEST_TIMEOUT: Duration = Duration::from_millis(500);

/// Why a Pod's answer was not taken.
#[derive(Debug, thiserror::Error)]
pub(crate) enum Refused {
    #[error("{0}")]
    Http(#[from] reqwest::Error),
    #[error("no answer within {}", crate::duration::human_seconds(REQUEST_TIMEOUT.as_secs_f64()))]
    Timeout,
    #[error("answered {status} to {location:?}: redirects are not followed")]
    Redirect { status: u16, location: String },
    #[error("answered {0}")]
    Status(u16),
    #[error("an answer longer than {MOST_ANSWER_BYTES} bytes")]
    TooLong,
    #[error("an answer of more than {MOST_ANSWER_LINES} lines")]
    TooManyLines,
    #[error("an answer that is not UTF-8 text")]
    NotText,
    #[error("no time left in the reconcile's budget for Pods")]
    OutOfTime,
    #[error("no HTTP client for Pods")]
    NoClient,
    #[error("not asked: this replica's leader lease was not seen renewed in time")]
    NotLeader,
    #[error("no container port named metrics")]
    NoMetricsPort,
    #[error("answered 401: the worker does not hold the pool's credential")]
    Unauthorized,
    #[error("the pool's worker credential is not known yet")]
    NoCredential,
}

impl Refused {
    /// Whether the worker's state is unknown: it was not heard from (no connection, no answer in
    /// time, a server error) or not asked (the operator's budget, client or leadership). The
    /// other refusals are the worker's own answer: it does not take the request.
    pub(crate) fn unknown(&self) -> bool {
        match self {
            // A worker that answers 401 holds another token (a Secret not yet refreshed in its
            // volume): what it is doing is as unknown as a silent one's, never a refusal.
            Self::Http(_)
            | Self::Timeout
            | Self::OutOfTime
            | Self::NoClient
            | Self::NotLeader
            | Self::Unauthorized
            | Self::NoCredential => true,
            Self::Status(status) => *status >= 500,
            Self::Redirect { .. }
            | Self::TooLong
            | Self::TooManyLines
            | Self::NotText
            | Self::NoMetricsPort => false,
        }
    }

    /// The `reason` label of `worker_reads_rejected`: only refusals a Pod chose (its size, its
    /// redirect); `None` for what may be the network's or the operator's doing.
    pub(crate) fn rejected_reason(&self) -> Option<&'static str> {
        match self {
            Self::Redirect { .. } => Some("redirect"),
            Self::TooLong | Self::TooManyLines => Some("too_large"),
            Self::NotText => Some("not_text"),
            Self::Http(_)
            | Self::Timeout
            | Self::Status(_)
            | Self::OutOfTime
            | Self::NoClient
            | Self::NotLeader
            | Self::NoMetricsPort
            | Self::Unauthorized
            | Self::NoCredential => None,
        }
    }
}

/// The one client every request to a Pod goes through: plain HTTP, never through a proxy, no
/// redirects, short timeouts.
fn client() -> Result<&'static reqwest::Client, Refused> {
    static CLIENT: OnceLock<Option<reqwest::Client>> = OnceLock::new();
    CLIENT
        .get_or_init(|| {
            reqwest::Client::builder()
                .no_proxy()
                .redirect(reqwest::redirect::Policy::none())
                .connect_timeout(REQUEST_TIMEOUT)
                .timeout(REQUEST_TIMEOUT)
                // No connection to a Pod outlives its request: a Pod is asked once an interval,
                // and idle connections to 10,000 Pods held 47 MiB (the scale benchmark).
                .pool_max_idle_per_host(0)
                .build()
                .map_err(|error| warn!(%error, "no HTTP client to ask workers: Prometheus only"))
                .ok()
        })
        .as_ref()
        .ok_or(Refused::NoClient)
}

/// Requests to worker Pods: what the stages that do I/O send through the context.
pub(crate) trait WorkerHttp: Send + Sync {
    /// `GET http://{address}{path}`: the text of a 200 answer.
    fn get<'a>(&'a self, address: &'a str, path: &'a str)
    -> BoxFuture<'a, Result<String, Refused>>;

    /// `POST http://{address}{path}` with `Authorization: Bearer {token}`: the status and text
    /// of any answer but a redirect.
    fn post<'a>(
        &'a self,
        address: &'a str,
        path: &'a str,
        token: &'a str,
    ) -> BoxFuture<'a, Result<(u16, String), Refused>>;
}

/// The operator's [`WorkerHttp`]: the one reqwest client below, shared by the whole process.
pub(crate) struct Reqwest;

impl WorkerHttp for Reqwest {
    fn get<'a>(
        &'a self,
        address: &'a str,
        path: &'a str,
    ) -> BoxFuture<'a, Result<String, Refused>> {
        get(address, path).boxed()
    }

    fn post<'a>(
        &'a self,
        address: &'a str,
        path: &'a str,
        token: &'a str,
    ) -> BoxFuture<'a, Result<(u16, String), Refused>> {
        post(address, path, token).boxed()
    }
}

/// `GET http://{address}{path}`: the text of a 200 answer.
async fn get(address: &str, path: &str) -> Result<String, Refused> {
    let response = client()?
        .get(format!("http://{address}{path}"))
        .send()
        .await
        .map_err(not_sent)?;
    match status_of(&response)? {
        200 => capped(response).await,
        status => Err(Refused::Status(status)),
    }
}

/// `POST http://{address}{path}` with the pool's token: the status and text of any answer but a
/// redirect (never followed: the token goes to the Pod's own address and nowhere else).
async fn post(address: &str, path: &str, token: &str) -> Result<(u16, String), Refused> {
    let response = client()?
        .post(format!("http://{address}{path}"))
        .bearer_auth(token)
        .send()
        .await
        .map_err(not_sent)?;
    let status = status_of(&response)?;
    Ok((status, capped(response).await?))
}

/// A request that got no (whole) answer: [`Refused::Timeout`] when it did not come in time.
fn not_sent(error: reqwest::Error) -> Refused {
    match error.is_timeout() {
        true => Refused::Timeout,
        false => Refused::Http(error),
    }
}

/// The answer's status; a redirect refused (it is never followed, nor its body read).
fn status_of(response: &reqwest::Response) -> Result<u16, Refused> {
    let status = response.status();
    if status.is_redirection() {
        let location = response
            .headers()
            .get(reqwest::header::LOCATION)
            .and_then(|l| l.to_str().ok())
            .unwrap_or_default();
        return Err(Refused::Redirect {
            status: status.as_u16(),
            location: crate::controller::cut::truncate_bytes(location, 200).to_string(),
        });
    }
    Ok(status.as_u16())
}

/// The body read chunk by chunk, given up (the connection dropped) past either cap.
async fn capped(mut response: reqwest::Response) -> Result<String, Refused> {
    if response
        .content_length()
        .is_some_and(|length| length > MOST_ANSWER_BYTES as u64)
    {
        return Err(Refused::TooLong);
    }
    let mut body = Vec::new();
    let mut lines = 0;
    while let Some(chunk) = response.chunk().await.map_err(not_sent)? {
        if body.len() + chunk.len() > MOST_ANSWER_BYTES {
            return Err(Refused::TooLong);
        }
        lines += chunk.iter().filter(|b| **b == b'\n').count();
        if lines > MOST_ANSWER_LINES {
            return Err(Refused::TooManyLines);
        }
        body.extend_from_slice(&chunk);
    }
    String::from_utf8(body).map_err(|_| Refused::NotText)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    /// A server on 127.0.0.1 answering each connection with `head` then `body` repeated
    /// `repeat` times (forever for `None`); how many connections it took.
    async fn server(
        head: String,
        body: &'static str,
        repeat: Option<usize>,
    ) -> (String, Arc<AtomicUsize>) {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let address = listener.local_addr().unwrap().to_string();
        let connections = Arc::new(AtomicUsize::new(0));
        let counted = connections.clone();
        tokio::spawn(async move {
            while let Ok((mut stream, _)) = listener.accept().await {
                counted.fetch_add(1, Ordering::SeqCst);
                let head = head.clone();
                tokio::spawn(async move {
                    let mut request = [0u8; 2048];
                    let _ = stream.read(&mut request).await;
                    if stream.write_all(head.as_bytes()).await.is_err() {
                        return;
                    }
                    let mut sent = 0;
                    while repeat.is_none_or(|n| sent < n) {
                        if stream.write_all(body.as_bytes()).await.is_err() {
                            return;
                        }
                        sent += 1;
                    }
                });
            }
        });
        (address, connections)
    }

    #[tokio::test]
    async fn an_endless_answer_is_given_up_at_the_cap() {
        let head = "HTTP/1.1 200 OK\r\nConnection: close\r\n\r\n".to_string();
        let (address, _) = server(head, "lanepool_worker_busy{lane=\"urgent\"} 1\n", None).await;
        let started = std::time::Instant::now();
        let answer = get(&address, "/metrics").await;
        assert!(
            matches!(answer, Err(Refused::TooLong | Refused::TooManyLines)),
            "{answer:?}"
        );
        assert!(
            started.elapsed() < REQUEST_TIMEOUT,
            "{:?}",
            started.elapsed()
        );
        let one_long_line: &'static str = Box::leak("x".repeat(4096).into_boxed_str());
        let head = "HTTP/1.1 200 OK\r\nConnection: close\r\n\r\n".to_string();
        let (address, _) = server(head, one_long_line, None).await;
        assert!(matches!(get(&address, "/").await, Err(Refused::TooLong)));
        let (address, _) = server(
            "HTTP/1.1 200 OK\r\nContent-Length: 99999999\r\n\r\n".into(),
            "x",
            Some(1),
        )
        .await;
        assert!(matches!(get(&address, "/").await, Err(Refused::TooLong)));
        let head = "HTTP/1.1 200 OK\r\nConnection: close\r\n\r\n".to_string();
        let (address, _) = server(head, "\n", Some(MOST_ANSWER_LINES + 1)).await;
        assert!(matches!(
            get(&address, "/").await,
            Err(Refused::TooManyLines)
        ));
        let head = "HTTP/1.1 200 OK\r\nConnection: close\r\n\r\n".to_string();
        let (address, _) = server(head, "lanepool_worker_busy 0\n", Some(3)).await;
        assert_eq!(
            get(&address, "/").await.unwrap(),
            "lanepool_worker_busy 0\n".repeat(3)
        );
    }

    #[tokio::test]
    async fn a_redirect_on_get_or_post_is_never_followed() {
        let (target, reached) = server(
            "HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n".into(),
            "",
            Some(0),
        )
        .await;
        for status in [
            "302 Found",
            "307 Temporary Redirect",
            "308 Permanent Redirect",
        ] {
            let head = format!(
                "HTTP/1.1 {status}\r\nLocation: http://{target}/-/quit\r\nContent-Length: 0\r\n\r\n"
            );
            let (address, _) = server(head, "", Some(0)).await;
            let got = get(&address, "/metrics").await;
            assert!(matches!(got, Err(Refused::Redirect { .. })), "{got:?}");
            let posted = post(&address, "/drain?seconds=5", "token").await;
            assert!(
                matches!(posted, Err(Refused::Redirect { .. })),
                "{posted:?}"
            );
        }
        assert_eq!(
            reached.load(Ordering::SeqCst),
            0,
            "the target was never asked"
        );
    }
}
