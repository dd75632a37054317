//! An example lane worker: the program a LanePool's pods run, written to be copied.
//!
//! The operator runs two kinds of Deployment per pool and tells each worker what it is through
//! its environment (see `src/controller/workers.rs`):
//!
//! | env var              | reserved worker      | shared worker                     |
//! | -------------------- | -------------------- | --------------------------------- |
//! | `LANEPOOL_LANES`     | `urgent` (its lane)  | `urgent,batch` (every lane, in priority order) |
//! | `LANEPOOL_ROLE`      | `reserved`           | `shared`                          |
//! | `LANEPOOL_POOL`      | the LanePool's name  | the LanePool's name               |
//!
//! Add `LANEPOOL_QUEUE_URL` (here `http://127.0.0.1:9464`, the demo's `lane_queue`) in the
//! LanePool's pod template. The worker then does what the guide's `worker()` does:
//!
//!   1. take a job from the first non-empty lane of `LANEPOOL_LANES` (the queue long-polls, so
//!      an idle worker learns of a new job at once without spinning);
//!   2. run it to the end: no preemption, a batch job is never interrupted for an urgent one;
//!   3. report it done, with the time it took;
//!
//! and on SIGTERM (Kubernetes scaling the Deployment down) it finishes the job it holds,
//! reports it, and exits 0. That is what makes a resize safe: the operator can move workers
//! between reserved and shared at any time without losing or repeating a job.
//!
//! The queue it talks to counts submissions, waits and job times per lane (the README's metric
//! convention). The worker itself exports two gauges on `/metrics`, when `LANEPOOL_METRICS_ADDR`
//! (such as `$(POD_IP):9100`) is set: `lanepool_worker_busy`, 1 (labelled with the job's `lane`)
//! while it runs a job and 0 while it waits, and `lanepool_worker_job_started_timestamp_seconds`,
//! when the job in hand started (Unix time, same `lane`; absent while it waits). Before shrinking
//! a Deployment the operator asks each of its Pods for them at the port named `metrics` (or
//! Prometheus, by `pod`, for a Pod that does not answer), so the ReplicaSet controller removes
//! idle workers first, then those whose jobs should end soonest.
//!
//! On the same port it takes the operator's drain request, `POST /drain?seconds=N`: take no new
//! job for N seconds, finish the one in hand, then report `lanepool_worker_busy 0`; after N
//! seconds without being stopped, take jobs again (so a shrink the operator called off never
//! loses a worker for good); `seconds=0` takes jobs again at once. It answers with its gauges,
//! `lanepool_worker_draining 1` among them, which is how the operator knows the request was
//! understood. It also exports `lanepool_job_duration_seconds`, its own count and sum of the
//! jobs it finished per lane: the operator reads the count there each interval, so the reserve
//! follows the lane's rate seconds old instead of waiting for Prometheus's next scrape. A worker
//! that runs against a queue that cannot count (SQS, Redis lists…) needs it for the job time
//! too, and leaves the submission count and queue depth to the producer and the queue.
//!
//!     LANEPOOL_LANES=urgent,batch LANEPOOL_ROLE=shared LANEPOOL_POOL=jobs \
//!     LANEPOOL_QUEUE_URL=http://127.0.0.1:9464 cargo run --example lane_worker

use std::process::ExitCode;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::TcpStream;
use tokio::sync::watch;

const LANES_ENV: &str = "LANEPOOL_LANES";
const ROLE_ENV: &str = "LANEPOOL_ROLE";
const POOL_ENV: &str = "LANEPOOL_POOL";
const QUEUE_URL_ENV: &str = "LANEPOOL_QUEUE_URL";
const METRICS_ADDR_ENV: &str = "LANEPOOL_METRICS_ADDR";

/// Longest the worker waits for any answer; the queue's long poll is about 1 s.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(10);
/// Pause before trying again when the queue is unreachable (starting, restarting).
const RETRY_AFTER: Duration = Duration::from_secs(1);
/// The longest drain a request can ask for: a drain the operator forgot must still end.
const LONGEST_DRAIN: Duration = Duration::from_secs(3600);

/// What the environment says this worker is.
struct Config {
    /// Lanes in preference order: the first non-empty one is served.
    lanes: Vec<String>,
    role: String,
    pool: String,
    /// `host:port` of the queue.
    queue: String,
    /// This worker's name in logs: the pod name when Kubernetes runs it.
    name: String,
}

fn config_from_env() -> Result<Config, String> {
    let lanes_text = required(
        LANES_ENV,
        "comma-separated lanes in preference order, such as urgent,batch",
    )?;
    let lanes: Vec<String> = lanes_text
        .split(',')
        .map(|l| l.trim().to_string())
        .collect();
    if let Some(bad) = lanes.iter().find(|l| !is_lane_name(l)) {
        return Err(format!(
            "{LANES_ENV}={lanes_text:?}: {bad:?} is not a lane name (lowercase letters, digits and '-'), \
             expected comma-separated lanes such as urgent,batch"
        ));
    }
    let role = required(ROLE_ENV, "reserved or shared")?;
    if role != "reserved" && role != "shared" {
        return Err(format!("{ROLE_ENV}={role:?}: expected reserved or shared"));
    }
    if role == "reserved" && lanes.len() != 1 {
        // The operator gives a reserved worker exactly its lane; more means a hand-made template.
        return Err(format!(
            "{ROLE_ENV}=reserved takes exactly one lane, but {LANES_ENV}={lanes_text:?} has {}",
            lanes.len()
        ));
    }
    let pool = required(POOL_ENV, "the LanePool's name")?;
    let url = required(
        QUEUE_URL_ENV,
        "the queue's address, such as http://127.0.0.1:9464",
    )?;
    let queue = url
        .strip_prefix("http://")
        .map(|rest| rest.trim_end_matches('/'))
        .filter(|host_port| {
            host_port
                .rsplit_once(':')
                .is_some_and(|(host, port)| !host.is_empty() && port.parse::<u16>().is_ok())
        })
        .ok_or_else(|| {
            format!(
                "{QUEUE_URL_ENV}={url:?}: expected http://HOST:PORT, such as http://127.0.0.1:9464"
            )
        })?
        .to_string();
    let name = std::env::var("HOSTNAME")
        .ok()
        .filter(|h| !h.is_empty())
        .unwrap_or_else(|| format!("{pool}-{role}-{}", std::process::id()));
    Ok(Config {
        lanes,
        role,
        pool,
        queue,
        name,
    })
}

fn required(name: &str, expected: &str) -> Result<String, String> {
    match std::env::var(name) {
        Ok(value) if !value.trim().is_empty() => Ok(value.trim().to_string()),
        Ok(_) => Err(format!("{name} is empty: expected {expected}")),
        Err(std::env::VarError::NotPresent) => Err(format!(
            "{name} is not set: expected {expected} (the operator sets LANEPOOL_LANES, \
             LANEPOOL_ROLE and LANEPOOL_POOL; set {QUEUE_URL_ENV} in the pod template)"
        )),
        Err(std::env::VarError::NotUnicode(_)) => Err(format!("{name} is not valid UTF-8")),
    }
}

fn is_lane_name(lane: &str) -> bool {
    !lane.is_empty()
        && lane.len() <= 40
        && lane
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
}

/// A job as the queue hands it out.
#[derive(serde::Deserialize)]
struct Job {
    id: u64,
    lane: String,
    job_ms: u64,
    waited_ms: f64,
}

#[tokio::main(flavor = "current_thread")]
async fn main() -> ExitCode {
    let config = match config_from_env() {
        Ok(config) => config,
        Err(message) => {
            eprintln!("lane_worker: error: {message}");
            return ExitCode::from(2);
        }
    };
    let mut stop = match stop_on_sigterm() {
        Ok(stop) => stop,
        Err(e) => {
            eprintln!("lane_worker: error: installing the SIGTERM handler: {e}");
            return ExitCode::FAILURE;
        }
    };
    // The lane of the job in hand and when it started (Unix seconds); `None` while waiting.
    let busy: Arc<Mutex<Option<(String, f64)>>> = Arc::default();
    // Jobs this worker finished, and the seconds they ran, per lane: what the operator reads to
    // see a lane's rate seconds old, without waiting for a scrape.
    let finished: Arc<Mutex<Finished>> = Arc::default();
    // Until when the operator asked this worker to take no new job; `None`: not draining. The
    // sender lives as long as the worker, so `changed()` only ever wakes for a new request.
    let (drain_requests, mut drain) = watch::channel(None::<Instant>);
    let drain_requests = Arc::new(drain_requests);
    if let Ok(addr) = std::env::var(METRICS_ADDR_ENV)
        && !addr.is_empty()
    {
        match tokio::net::TcpListener::bind(&addr).await {
            Ok(listener) => {
                tokio::spawn(serve_metrics(
                    listener,
                    busy.clone(),
                    finished.clone(),
                    drain_requests.clone(),
                ));
            }
            Err(e) => {
                eprintln!("lane_worker: error: {METRICS_ADDR_ENV}={addr}: {e}");
                return ExitCode::FAILURE;
            }
        }
    }
    println!(
        "{}: {} worker of pool {}, lanes {} (in this order), queue http://{}",
        config.name,
        config.role,
        config.pool,
        config.lanes.join(","),
        config.queue
    );
    let mut queue = Queue::new(&config.queue);
    let take_path = format!(
        "/take?lanes={}&worker={}",
        config.lanes.join(","),
        config.name
    );

    let mut was_draining = false;
    loop {
        if *stop.borrow() {
            break;
        }
        // Draining: no new job until the drain ends (or SIGTERM, or a new request).
        let until = drain
            .borrow_and_update()
            .filter(|until| *until > Instant::now());
        if let Some(until) = until {
            if !was_draining {
                println!("{}: draining: no new jobs", config.name);
            }
            was_draining = true;
            tokio::select! {
                _ = stop.changed() => break,
                _ = drain.changed() => {}
                _ = tokio::time::sleep_until(until.into()) => {}
            }
            continue;
        }
        if was_draining {
            println!("{}: drain over: taking jobs again", config.name);
            was_draining = false;
        }
        // While waiting for a job there is nothing to finish: SIGTERM or a drain request ends
        // the wait at once. A job the queue handed out just then goes back to its lane when the
        // connection closes.
        let answer = tokio::select! {
            _ = stop.changed() => break,
            _ = drain.changed() => {
                queue.close();
                continue;
            }
            answer = queue.request("GET", &take_path) => answer,
        };
        let job: Job = match answer {
            Ok((200, body)) => match serde_json::from_str(&body) {
                Ok(job) => job,
                Err(e) => {
                    eprintln!(
                        "{}: the queue sent a job this worker cannot read: {e}: {body}",
                        config.name
                    );
                    tokio::time::sleep(RETRY_AFTER).await;
                    continue;
                }
            },
            // The long poll ended with nothing in our lanes: ask again.
            Ok((204, _)) => continue,
            Ok((status, body)) => {
                eprintln!("{}: take refused ({status}): {}", config.name, body.trim());
                tokio::time::sleep(RETRY_AFTER).await;
                continue;
            }
            Err(e) => {
                eprintln!(
                    "{}: queue unreachable at http://{}: {e}",
                    config.name, config.queue
                );
                tokio::time::sleep(RETRY_AFTER).await;
                continue;
            }
        };

        // Run the job to its end, even if SIGTERM arrives meanwhile: no preemption. A real
        // worker does its work here; the demo's jobs only take time.
        let since_epoch = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap_or_default();
        *lock(&busy) = Some((job.lane.clone(), since_epoch.as_secs_f64()));
        let started = Instant::now();
        tokio::time::sleep(Duration::from_millis(job.job_ms)).await;
        let seconds = started.elapsed().as_secs_f64();
        {
            let mut finished = lock(&finished);
            let (count, sum) = finished.entry(job.lane.clone()).or_default();
            *count += 1;
            *sum += seconds;
        }
        println!(
            "{}: {} job {} done in {:.1} ms (waited {:.1} ms)",
            config.name,
            job.lane,
            job.id,
            seconds * 1000.0,
            job.waited_ms
        );
        match queue
            .request("POST", &format!("/done?id={}&seconds={seconds:.6}", job.id))
            .await
        {
            Ok((200, _)) => {}
            Ok((status, body)) => eprintln!(
                "{}: done of job {} refused ({status}): {}",
                config.name,
                job.id,
                body.trim()
            ),
            Err(e) => eprintln!("{}: reporting job {} done: {e}", config.name, job.id),
        }
        *lock(&busy) = None;
    }
    println!("{}: SIGTERM: no job in hand, exiting", config.name);
    ExitCode::SUCCESS
}

/// Serves `lanepool_worker_busy`, `lanepool_worker_job_started_timestamp_seconds`,
/// `lanepool_worker_draining` and `lanepool_job_duration_seconds` on every GET, and takes drain requests (`POST /drain?seconds=N`,
/// answered with the same gauges): the pod's namespace, pool and name come from Prometheus's
/// target labels (or, to the operator asking the Pod itself, from the Pod), not from the worker.
async fn serve_metrics(
    listener: tokio::net::TcpListener,
    busy: Arc<Mutex<Option<(String, f64)>>>,
    finished: Arc<Mutex<Finished>>,
    drain: Arc<watch::Sender<Option<Instant>>>,
) {
    loop {
        let Ok((mut stream, _)) = listener.accept().await else {
            continue;
        };
        let busy = busy.clone();
        let finished = finished.clone();
        let drain = drain.clone();
        tokio::spawn(async move {
            // The request head, which may come in several pieces (up to 1 KiB, for 2 s).
            let mut request = [0u8; 1024];
            let mut read = 0;
            let deadline = tokio::time::Instant::now() + Duration::from_secs(2);
            while read < request.len() && !request[..read].windows(4).any(|w| w == b"\r\n\r\n") {
                match tokio::time::timeout_at(deadline, stream.read(&mut request[read..])).await {
                    Ok(Ok(n)) if n > 0 => read += n,
                    _ => break,
                }
            }
            let head = String::from_utf8_lossy(&request[..read]);
            let mut words = head.split_whitespace();
            let (method, target) = (words.next().unwrap_or(""), words.next().unwrap_or(""));
            let status = match method {
                "POST" => match drain_request(target) {
                    Some(Ok(seconds)) => {
                        let until = (!seconds.is_zero()).then(|| Instant::now() + seconds);
                        drain.send_replace(until);
                        "200 OK"
                    }
                    Some(Err(())) => "400 Bad Request",
                    None => "404 Not Found",
                },
                _ => "200 OK",
            };
            let body = if status == "200 OK" {
                let draining = drain.borrow().is_some_and(|until| until > Instant::now());
                let mut text = gauges(lock(&busy).as_ref(), draining);
                text.push_str(&job_durations(&lock(&finished)));
                text
            } else {
                "POST /drain?seconds=N (0 to 3600) stops taking jobs for N seconds\n".to_string()
            };
            let response = format!(
                "HTTP/1.1 {status}\r\nContent-Type: text/plain; version=0.0.4\r\n\
                 Content-Length: {}\r\nConnection: close\r\n\r\n{body}",
                body.len()
            );
            let _ = stream.write_all(response.as_bytes()).await;
        });
    }
}

/// `/drain?seconds=N` → how long to drain (`0`: stop draining); `None`: another path;
/// `Err`: a drain request without a number of seconds from 0 to [`LONGEST_DRAIN`].
fn drain_request(target: &str) -> Option<Result<Duration, ()>> {
    let query = target.strip_prefix("/drain")?;
    let seconds = query
        .strip_prefix('?')
        .into_iter()
        .flat_map(|q| q.split('&'))
        .find_map(|pair| pair.strip_prefix("seconds="))
        .and_then(|s| s.parse::<f64>().ok())
        .filter(|s| s.is_finite() && *s >= 0.0 && *s <= LONGEST_DRAIN.as_secs_f64());
    Some(seconds.map(Duration::from_secs_f64).ok_or(()))
}

/// The worker's gauges in the Prometheus text format.
fn gauges(busy: Option<&(String, f64)>, draining: bool) -> String {
    let sample = match busy {
        Some((lane, _)) => format!("lanepool_worker_busy{{lane=\"{lane}\"}} 1"),
        None => "lanepool_worker_busy 0".to_string(),
    };
    let started = match busy {
        Some((lane, at)) => {
            format!("lanepool_worker_job_started_timestamp_seconds{{lane=\"{lane}\"}} {at:.3}\n")
        }
        None => String::new(),
    };
    format!(
        "# HELP lanepool_worker_busy 1 while the worker runs a job (of lane), 0 while it waits\n\
         # TYPE lanepool_worker_busy gauge\n{sample}\n\
         # HELP lanepool_worker_job_started_timestamp_seconds When the job in hand started\n\
         # TYPE lanepool_worker_job_started_timestamp_seconds gauge\n{started}\
         # HELP lanepool_worker_draining 1 while the worker takes no new job (POST /drain)\n\
         # TYPE lanepool_worker_draining gauge\nlanepool_worker_draining {}\n",
        u8::from(draining)
    )
}

/// Jobs finished and the seconds they ran, per lane.
type Finished = std::collections::BTreeMap<String, (u64, f64)>;

/// `lanepool_job_duration_seconds` as a histogram with only its `+Inf` bucket: the count and sum
/// per lane are all the operator reads (declared even before the first job, so that "no job
/// finished yet" reads as zero jobs, not as a worker that does not count).
fn job_durations(finished: &Finished) -> String {
    let mut text = "# HELP lanepool_job_duration_seconds Time this worker spent running each job
                    # TYPE lanepool_job_duration_seconds histogram
"
    .to_string();
    for (lane, (count, sum)) in finished {
        text.push_str(&format!(
            "lanepool_job_duration_seconds_bucket{{lane=\"{lane}\",le=\"+Inf\"}} {count}\n\
             lanepool_job_duration_seconds_sum{{lane=\"{lane}\"}} {sum:.6}\n\
             lanepool_job_duration_seconds_count{{lane=\"{lane}\"}} {count}\n"
        ));
    }
    text
}

fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(|p| p.into_inner())
}

/// A channel that turns true on SIGTERM (Kubernetes stopping the pod) or SIGINT (Ctrl-C).
fn stop_on_sigterm() -> std::io::Result<watch::Receiver<bool>> {
    use tokio::signal::unix::{SignalKind, signal};
    let mut term = signal(SignalKind::terminate())?;
    let mut interrupt = signal(SignalKind::interrupt())?;
    let (stop, stopped) = watch::channel(false);
    tokio::spawn(async move {
        tokio::select! {
            _ = term.recv() => {}
            _ = interrupt.recv() => {}
        }
        let _ = stop.send(true);
    });
    Ok(stopped)
}

/// One kept-alive HTTP/1.1 connection to the queue, opened again after any error.
struct Queue {
    addr: String,
    connection: Option<BufReader<TcpStream>>,
}

impl Queue {
    fn new(addr: &str) -> Self {
        Self {
            addr: addr.to_string(),
            connection: None,
        }
    }

    /// Drops the connection (a request in flight on it is abandoned; the queue puts back a job
    /// it handed out on it).
    fn close(&mut self) {
        self.connection = None;
    }

    /// Sends a request without a body; returns the status and the body.
    async fn request(&mut self, method: &str, path: &str) -> std::io::Result<(u16, String)> {
        let answer = tokio::time::timeout(REQUEST_TIMEOUT, self.exchange(method, path))
            .await
            .unwrap_or_else(|_| {
                Err(std::io::Error::new(
                    std::io::ErrorKind::TimedOut,
                    "no answer in 10 s",
                ))
            });
        if answer.is_err() {
            // The connection's state is unknown: start afresh next time.
            self.connection = None;
        }
        answer
    }

    async fn exchange(&mut self, method: &str, path: &str) -> std::io::Result<(u16, String)> {
        if self.connection.is_none() {
            let stream = TcpStream::connect(&self.addr).await?;
            stream.set_nodelay(true)?;
            self.connection = Some(BufReader::new(stream));
        }
        let Some(connection) = self.connection.as_mut() else {
            unreachable!("connected just above");
        };
        let head = format!(
            "{method} {path} HTTP/1.1\r\nHost: {}\r\nContent-Length: 0\r\n\r\n",
            self.addr
        );
        connection.get_mut().write_all(head.as_bytes()).await?;

        let mut status_line = String::new();
        if connection.read_line(&mut status_line).await? == 0 {
            return Err(std::io::ErrorKind::UnexpectedEof.into());
        }
        let status: u16 = status_line
            .split_whitespace()
            .nth(1)
            .and_then(|s| s.parse().ok())
            .ok_or_else(|| std::io::Error::other(format!("not an HTTP answer: {status_line:?}")))?;
        let mut content_length = 0usize;
        let mut close = false;
        loop {
            let mut header = String::new();
            if connection.read_line(&mut header).await? == 0 {
                return Err(std::io::ErrorKind::UnexpectedEof.into());
            }
            let header = header.trim_end();
            if header.is_empty() {
                break;
            }
            if let Some((name, value)) = header.split_once(':') {
                if name.eq_ignore_ascii_case("content-length") {
                    content_length = value.trim().parse().unwrap_or(0);
                } else if name.eq_ignore_ascii_case("connection") {
                    close = value.trim().eq_ignore_ascii_case("close");
                }
            }
        }
        let mut body = vec![0; content_length];
        connection.read_exact(&mut body).await?;
        if close {
            self.connection = None;
        }
        Ok((status, String::from_utf8_lossy(&body).into_owned()))
    }
}
