//! The queue's HTTP API for workers, hand-rolled HTTP/1.1 on tokio with keep-alive, so a worker
//! holds one connection and a take costs no handshake. Jobs a connection took and did not
//! report done or give back are put back when it closes, counted as cut short: a killed worker
//! never loses a job, and a worker that stops waiting cancels its take and gives back what it
//! got, so the count is exact.
//!
//!   GET  /take?lanes=urgent,batch&worker=NAME  200 {"id","lane","job_ms","waited_ms"}, or 204
//!                                              after the long poll with nothing to take
//!   POST /done?id=ID&seconds=S                 200; S is the run time the worker measured
//!   POST /release?id=ID                        200: a job got but not started goes back to
//!                                              the front of its lane (not a job cut short)
//!   POST /cancel?worker=NAME                   200: that worker's waiting take answers 204 (or
//!                                              its next one, if none waits)
//!   POST /submit?lane=LANE&job_ms=MS           200 {"id"}: a producer outside this process
//!   GET  /metrics                              the worker metric convention
//!   GET  /healthz

use std::collections::HashSet;
use std::sync::Arc;
use std::time::Duration;

use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::{TcpListener, TcpStream};

use crate::lanes::{Job, Lanes, Round};

/// Serves until the task is dropped.
pub async fn serve(listener: TcpListener, lanes: Arc<Lanes>, long_poll: Duration) {
    loop {
        let Ok((stream, _)) = listener.accept().await else {
            continue;
        };
        let _ = stream.set_nodelay(true);
        tokio::spawn(connection(stream, lanes.clone(), long_poll));
    }
}

struct Request {
    method: String,
    path: String,
    query: Vec<(String, String)>,
    close: bool,
}

impl Request {
    fn param(&self, name: &str) -> Option<&str> {
        self.query
            .iter()
            .find(|(key, _)| key == name)
            .map(|(_, value)| value.as_str())
    }
}

struct Response {
    status: &'static str,
    content_type: &'static str,
    body: String,
    /// The job a take handed out.
    job: Option<Job>,
}

/// Notes a worker's done and, at its next take, logs the round from its last take.
fn follow_round(log: &crate::lanes::JobLog, request: &Request, round: &mut Option<Round>) {
    let now = std::time::Instant::now();
    match request.path.as_str() {
        "/done" => {
            if let Some(round) = round.as_mut() {
                round.done = Some(now);
                round.ran = request.param("seconds").and_then(|s| s.parse().ok());
            }
        }
        "/take" => {
            if let Some(round) = round.take() {
                log.round(&round, now);
            }
        }
        _ => {}
    }
}

impl Response {
    fn new(status: &'static str, body: impl Into<String>) -> Self {
        Self {
            status,
            content_type: "text/plain; charset=utf-8",
            body: body.into(),
            job: None,
        }
    }

    fn json(body: String) -> Self {
        Self {
            status: "200 OK",
            content_type: "application/json",
            body,
            job: None,
        }
    }
}

async fn connection(stream: TcpStream, lanes: Arc<Lanes>, long_poll: Duration) {
    let (read, mut write) = stream.into_split();
    let mut reader = BufReader::new(read);
    let mut taken_here: HashSet<u64> = HashSet::new();
    let mut round: Option<Round> = None;
    while let Ok(Some(request)) = read_request(&mut reader).await {
        if let Some(log) = lanes.log() {
            follow_round(log, &request, &mut round);
        }
        let response = respond(&request, &lanes, long_poll, &mut taken_here).await;
        if lanes.log().is_some()
            && request.path == "/take"
            && response.status == "200 OK"
            && let Some(job) = &response.job
        {
            round = Some(Round {
                lane: job.lane.clone(),
                job_ms: job.job_ms,
                taken: job.taken,
                ran: None,
                done: None,
            });
        }
        let head = format!(
            "HTTP/1.1 {}\r\nContent-Type: {}\r\nContent-Length: {}\r\n{}\r\n",
            response.status,
            response.content_type,
            response.body.len(),
            if request.close {
                "Connection: close\r\n"
            } else {
                ""
            },
        );
        if write.write_all(head.as_bytes()).await.is_err()
            || write.write_all(response.body.as_bytes()).await.is_err()
            || request.close
        {
            break;
        }
    }
    for id in taken_here {
        lanes.put_back(id);
    }
}

async fn respond(
    request: &Request,
    lanes: &Lanes,
    long_poll: Duration,
    taken_here: &mut HashSet<u64>,
) -> Response {
    match (request.method.as_str(), request.path.as_str()) {
        ("GET", "/take") => {
            let Some(preference) = request.param("lanes").filter(|l| !l.is_empty()) else {
                return Response::new("400 Bad Request", "take needs lanes=LANE[,LANE...]\n");
            };
            let preference: Vec<String> = preference.split(',').map(str::to_string).collect();
            match lanes
                .take(&preference, long_poll, request.param("worker"))
                .await
            {
                Ok(Some(job)) => {
                    taken_here.insert(job.id);
                    let mut response =
                        Response::json(serde_json::to_string(&job).unwrap_or_default());
                    response.job = Some(job);
                    response
                }
                Ok(None) => Response::new("204 No Content", ""),
                Err(refused) => Response::new("400 Bad Request", format!("{refused}\n")),
            }
        }
        ("POST", "/done") => {
            let Some(id) = request.param("id").and_then(|id| id.parse().ok()) else {
                return Response::new("400 Bad Request", "done needs id=JOB\n");
            };
            let seconds = request.param("seconds").and_then(|s| s.parse().ok());
            taken_here.remove(&id);
            match lanes.done(id, seconds) {
                Ok(()) => Response::new("200 OK", "ok\n"),
                Err(refused) => Response::new("404 Not Found", format!("{refused}\n")),
            }
        }
        ("POST", "/release") => {
            let Some(id) = request.param("id").and_then(|id| id.parse().ok()) else {
                return Response::new("400 Bad Request", "release needs id=JOB\n");
            };
            taken_here.remove(&id);
            match lanes.give_back(id) {
                Ok(()) => Response::new("200 OK", "ok\n"),
                Err(refused) => Response::new("404 Not Found", format!("{refused}\n")),
            }
        }
        ("POST", "/cancel") => match request.param("worker").filter(|w| !w.is_empty()) {
            Some(worker) => {
                lanes.cancel(worker);
                Response::new("200 OK", "ok\n")
            }
            None => Response::new("400 Bad Request", "cancel needs worker=NAME\n"),
        },
        ("POST", "/submit") => {
            let lane = request.param("lane").unwrap_or_default();
            let Some(job_ms) = request.param("job_ms").and_then(|ms| ms.parse().ok()) else {
                return Response::new("400 Bad Request", "submit needs lane=LANE&job_ms=MS\n");
            };
            match lanes.submit(lane, job_ms) {
                Ok(id) => Response::json(format!("{{\"id\":{id}}}")),
                Err(refused) => Response::new("400 Bad Request", format!("{refused}\n")),
            }
        }
        ("GET", "/metrics") => Response {
            status: "200 OK",
            content_type: "application/openmetrics-text; version=1.0.0; charset=utf-8",
            body: lanes.render_metrics(),
            job: None,
        },
        ("GET", "/healthz") => Response::new("200 OK", "ok\n"),
        _ => Response::new("404 Not Found", "not found\n"),
    }
}

/// Reads one request head (and skips a body); `None` when the peer closed the connection.
async fn read_request<R: AsyncBufReadExt + Unpin>(
    reader: &mut R,
) -> std::io::Result<Option<Request>> {
    let mut line = String::new();
    if reader.read_line(&mut line).await? == 0 {
        return Ok(None);
    }
    let mut parts = line.split_whitespace();
    let method = parts.next().unwrap_or_default().to_string();
    let target = parts.next().unwrap_or("/").to_string();
    let version = parts.next().unwrap_or("HTTP/1.0").to_string();
    let mut close = version == "HTTP/1.0";
    let mut content_length = 0u64;
    loop {
        let mut header = String::new();
        if reader.read_line(&mut header).await? == 0 {
            return Ok(None);
        }
        let header = header.trim_end();
        if header.is_empty() {
            break;
        }
        if let Some((name, value)) = header.split_once(':') {
            let value = value.trim();
            if name.eq_ignore_ascii_case("content-length") {
                content_length = value.parse().unwrap_or(0);
            } else if name.eq_ignore_ascii_case("connection") {
                close = value.eq_ignore_ascii_case("close");
            }
        }
    }
    if content_length > 0 {
        let mut body = (&mut *reader).take(content_length);
        tokio::io::copy(&mut body, &mut tokio::io::sink()).await?;
    }
    let (path, query) = target.split_once('?').unwrap_or((&target, ""));
    let query = query
        .split('&')
        .filter_map(|pair| pair.split_once('='))
        .map(|(key, value)| (key.to_string(), value.to_string()))
        .collect();
    Ok(Some(Request {
        method,
        path: path.to_string(),
        query,
        close,
    }))
}
