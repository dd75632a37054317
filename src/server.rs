//! The operator's small HTTP endpoint: /metrics, /healthz and /readyz, served by hyper. A client
//! gets a few seconds to send its request and one response per connection, so a slow or silent
//! client holds nothing for long; it never blocks the controller.

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use http_body_util::Full;
use hyper::body::{Bytes, Incoming};
use hyper::header::CONTENT_TYPE;
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper::{Request, Response, StatusCode};
use hyper_util::rt::{TokioIo, TokioTimer};
use tokio::net::TcpListener;
use tracing::debug;

use crate::metrics::Metrics;

/// How long a client may take to send its request's headers.
const HEADER_READ_TIMEOUT: Duration = Duration::from_secs(5);
/// How long one connection may last, response included.
const CONNECTION_TIMEOUT: Duration = Duration::from_secs(30);

/// What the endpoint reports.
pub struct Health {
    /// Set once the controller's watches have started.
    pub ready: AtomicBool,
}

/// Serves until the task is dropped.
pub async fn serve(listener: TcpListener, metrics: Arc<Metrics>, health: Arc<Health>) {
    serve_with(listener, metrics, health, HEADER_READ_TIMEOUT).await
}

async fn serve_with(
    listener: TcpListener,
    metrics: Arc<Metrics>,
    health: Arc<Health>,
    header_read_timeout: Duration,
) {
    loop {
        let stream = match listener.accept().await {
            Ok((stream, _)) => stream,
            Err(error) => {
                // Out of file descriptors, say: wait rather than spin.
                debug!(%error, "accepting a connection failed");
                tokio::time::sleep(Duration::from_millis(100)).await;
                continue;
            }
        };
        let metrics = metrics.clone();
        let health = health.clone();
        tokio::spawn(async move {
            let service = service_fn(move |request: Request<Incoming>| {
                let response = respond(request.uri().path(), &metrics, &health);
                async move { Ok::<_, Infallible>(response) }
            });
            let connection = http1::Builder::new()
                .timer(TokioTimer::new())
                .header_read_timeout(header_read_timeout)
                .keep_alive(false)
                .serve_connection(TokioIo::new(stream), service);
            match tokio::time::timeout(CONNECTION_TIMEOUT, connection).await {
                Ok(Err(error)) => debug!(%error, "a metrics connection failed"),
                Err(_) => debug!("a metrics connection took too long"),
                Ok(Ok(())) => {}
            }
        });
    }
}

fn respond(path: &str, metrics: &Metrics, health: &Health) -> Response<Full<Bytes>> {
    let text = "text/plain; charset=utf-8";
    let (status, content_type, body) = match path {
        "/metrics" => (
            StatusCode::OK,
            "application/openmetrics-text; version=1.0.0; charset=utf-8",
            metrics.render(),
        ),
        "/healthz" => (StatusCode::OK, text, "ok\n".to_string()),
        "/readyz" if health.ready.load(Ordering::Relaxed) => {
            (StatusCode::OK, text, "ok\n".to_string())
        }
        "/readyz" => (
            StatusCode::SERVICE_UNAVAILABLE,
            text,
            "starting\n".to_string(),
        ),
        _ => (StatusCode::NOT_FOUND, text, "not found\n".to_string()),
    };
    let mut response = Response::new(Full::new(Bytes::from(body)));
    *response.status_mut() = status;
    response.headers_mut().insert(
        CONTENT_TYPE,
        hyper::header::HeaderValue::from_static(content_type),
    );
    response
}

/// Binds the endpoint's address, naming the flag when it cannot.
pub async fn bind(addr: SocketAddr) -> std::io::Result<TcpListener> {
    TcpListener::bind(addr).await
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    use tokio::net::TcpStream;

    async fn start(header_read_timeout: Duration) -> (SocketAddr, Arc<Health>) {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let health = Arc::new(Health {
            ready: AtomicBool::new(false),
        });
        tokio::spawn(serve_with(
            listener,
            Arc::new(Metrics::default()),
            health.clone(),
            header_read_timeout,
        ));
        (addr, health)
    }

    /// Sends `request` and reads until the server closes the connection.
    async fn exchange(addr: SocketAddr, request: &str) -> String {
        let mut stream = TcpStream::connect(addr).await.unwrap();
        stream.write_all(request.as_bytes()).await.unwrap();
        let mut response = String::new();
        stream.read_to_string(&mut response).await.unwrap();
        response
    }

    async fn get(addr: SocketAddr, path: &str) -> String {
        exchange(addr, &format!("GET {path} HTTP/1.1\r\nHost: x\r\n\r\n")).await
    }

    #[tokio::test]
    async fn serves_metrics_health_and_readiness() {
        let (addr, health) = start(HEADER_READ_TIMEOUT).await;
        let metrics = get(addr, "/metrics").await;
        assert!(metrics.starts_with("HTTP/1.1 200 OK"), "{metrics}");
        assert!(
            metrics.contains("application/openmetrics-text"),
            "{metrics}"
        );
        assert!(metrics.trim_end().ends_with("# EOF"), "{metrics}");
        assert!(get(addr, "/healthz").await.starts_with("HTTP/1.1 200 OK"));
        let starting = get(addr, "/readyz").await;
        assert!(starting.starts_with("HTTP/1.1 503"), "{starting}");
        health.ready.store(true, Ordering::Relaxed);
        assert!(get(addr, "/readyz").await.starts_with("HTTP/1.1 200 OK"));
        assert!(get(addr, "/nothing").await.starts_with("HTTP/1.1 404"));
    }

    #[tokio::test]
    async fn a_request_longer_than_a_kilobyte_is_read_whole() {
        let (addr, _) = start(HEADER_READ_TIMEOUT).await;
        let padding = "x".repeat(4096);
        let response = exchange(
            addr,
            &format!("GET /healthz HTTP/1.1\r\nHost: x\r\nX-Padding: {padding}\r\n\r\n"),
        )
        .await;
        assert!(response.starts_with("HTTP/1.1 200 OK"), "{response}");
    }

    #[tokio::test]
    async fn a_silent_client_is_let_go() {
        let (addr, _) = start(Duration::from_millis(300)).await;
        let mut silent = TcpStream::connect(addr).await.unwrap();
        let mut rest = Vec::new();
        // Closed or reset: either way the read ends, and only the timeout would fail the test.
        let _ = tokio::time::timeout(Duration::from_secs(5), silent.read_to_end(&mut rest))
            .await
            .expect("the server closes a connection that sends nothing");
        // The endpoint still answers others.
        assert!(get(addr, "/healthz").await.starts_with("HTTP/1.1 200 OK"));
    }
}
