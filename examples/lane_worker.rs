//! An example lane worker: the program a LanePool's pods run, written to be copied.
//!
//! The operator runs two kinds of Deployment per pool and tells each worker what it is through
//! its environment (see `src/controller/deployments.rs`):
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
//! understood.
//!
//! And the stand-in request, `POST /stand-in?lanes=L1,L2&seconds=N`: for N seconds take jobs from
//! these lanes, in this order, instead of `LANEPOOL_LANES`, then from its own again. When workers
//! move between roles, the new Pods take a pod start to be ready; meanwhile the workers a shrink
//! will stop stand in for them (shared workers take only `urgent` while the urgent lane's reserve
//! grows), and are drained once the new Pods are ready. The request may name only the worker's own
//! lanes (`LANEPOOL_LANES`, in any order and any part of them): any other lane is refused with
//! `403`, naming it, so whoever can reach the port cannot turn a worker onto a lane it was never
//! given. A new request replaces the last one, `seconds=0` ends it at once, a drain ends it
//! (calling that drain off brings back the worker's own lanes), and one the operator forgets
//! lapses by itself. The job in hand is finished first; a wait for a job ends at once, so the next
//! take asks for the new lanes. It answers with its gauges, `lanepool_worker_standing_in 1` among
//! them (0 after `seconds=0`).
//!
//! Only the operator may steer a worker: every `POST` (drain, stand-in, any path) must carry
//! `Authorization: Bearer <token>`, the pool's credential, which the operator mounts from its
//! Secret at the file named by `LANEPOOL_CREDENTIAL_FILE`. The worker reads that file at each
//! `POST` (the kubelet rewrites it when the operator rotates the credential, with no restart) and
//! compares in constant time. Anything else (no header, another scheme, a wrong token, no
//! variable, a missing, unreadable or empty file) gets `401` with `WWW-Authenticate: Bearer
//! realm="lanepool"` and changes nothing, before the path or query is even looked at.
//! `GET /metrics` stays open and never shows the token; its `lanepool_worker_credential_required
//! 1` tells the operator that this worker checks the credential. The port serves at most 64
//! connections at once (one past that is closed at once), each for at most a few seconds, and a
//! request head of at most 4 KiB.
//!
//! It also exports `lanepool_job_duration_seconds`, its own count and sum of the jobs it finished
//! per lane: the operator reads the count there each interval, so the reserve follows the lane's
//! rate seconds old instead of waiting for Prometheus's next scrape. A worker that runs against a
//! queue that cannot count (SQS, Redis lists…) needs it for the job time too, and leaves the
//! submission count and queue depth to the producer and the queue.
//!
//!     LANEPOOL_LANES=urgent,batch LANEPOOL_ROLE=shared LANEPOOL_POOL=jobs \
//!     LANEPOOL_QUEUE_URL=http://127.0.0.1:9464 \
//!     LANEPOOL_METRICS_ADDR=127.0.0.1:9100 LANEPOOL_CREDENTIAL_FILE=/tmp/token \
//!     cargo run --example lane_worker

use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::TcpStream;
use tokio::sync::{Semaphore, watch};

const LANES_ENV: &str = "LANEPOOL_LANES";
const ROLE_ENV: &str = "LANEPOOL_ROLE";
const POOL_ENV: &str = "LANEPOOL_POOL";
const QUEUE_URL_ENV: &str = "LANEPOOL_QUEUE_URL";
const METRICS_ADDR_ENV: &str = "LANEPOOL_METRICS_ADDR";
/// The file holding the pool's credential, mounted by the operator from its Secret.
const CREDENTIAL_FILE_ENV: &str = "LANEPOOL_CREDENTIAL_FILE";

/// Longest the worker waits for any answer; the queue's long poll is about 1 s.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(10);
/// Pause before trying again when the queue is unreachable (starting, restarting).
const RETRY_AFTER: Duration = Duration::from_secs(1);
/// The longest drain a request can ask for: a drain the operator forgot must still end. A
/// stand-in has the same limit.
const LONGEST_DRAIN: Duration = Duration::from_secs(3600);
/// The most lanes a stand-in request may name.
const MOST_STAND_IN_LANES: usize = 16;
/// The longest request head the metrics port reads: a stand-in's 16 lanes of 63 bytes fit.
const LONGEST_REQUEST_HEAD: usize = 4096;
/// How long a connection to the metrics port may take to send its request head: one that sends
/// nothing holds a connection slot no longer.
const HEAD_DEADLINE: Duration = Duration::from_secs(2);
/// How long a connection to the metrics port may last in all, answer included: a caller that
/// never reads its answer cannot keep its slot either.
const CONNECTION_DEADLINE: Duration = Duration::from_secs(5);
/// The most connections the metrics port serves at once: each holds a file descriptor and a task,
/// so a flood of idle connections must not exhaust either. One past the cap is closed at once.
const MOST_CONNECTIONS: usize = 64;
/// The pause after a failed accept (out of file descriptors, say): the listener stays readable
/// while the cause lasts, and trying again at once would spin a core.
const ACCEPT_BACKOFF: Duration = Duration::from_millis(50);
/// The most of the credential file read: the operator's token is 64 bytes, and a file longer than
/// this is no credential (nor worth reading whole at every request).
const LONGEST_CREDENTIAL: usize = 4096;
/// The one-line body of every 401: it says nothing about what was wrong with the request.
const UNAUTHENTICATED: &str = "this worker takes POST requests only with its pool's credential\n";
/// What the metrics port answers to a bad drain request.
const DRAIN_USAGE: &str = "POST /drain?seconds=N (0 to 3600) stops taking jobs for N seconds\n";
/// With [`DRAIN_USAGE`], what the metrics port answers to a path it does not know.
const STAND_IN_USAGE: &str = "POST /stand-in?lanes=L1,L2&seconds=N (0 to 3600) takes jobs from \
                              these lanes, in this order, instead of its own for N seconds\n";

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

/// A lane in a stand-in request: a DNS label (`^[a-z0-9]([-a-z0-9]*[a-z0-9])?$`, at most 63 bytes).
fn is_dns_label(lane: &str) -> bool {
    let alphanumeric = |b: u8| b.is_ascii_lowercase() || b.is_ascii_digit();
    let bytes = lane.as_bytes();
    match (bytes.first(), bytes.last()) {
        (Some(&first), Some(&last)) => {
            bytes.len() <= 63
                && alphanumeric(first)
                && alphanumeric(last)
                && bytes.iter().all(|&b| alphanumeric(b) || b == b'-')
        }
        _ => false,
    }
}

/// What the operator asked of this worker at its metrics port.
#[derive(Clone, Default)]
struct Requests {
    /// Until when to take no new job (`POST /drain`); `None`: not draining.
    drain_until: Option<Instant>,
    /// Other lanes to take jobs from for a while (`POST /stand-in`); `None`: its own.
    stand_in: Option<StandIn>,
}

/// Take jobs from `lanes`, in this order, instead of the worker's own until `until`.
#[derive(Clone, PartialEq)]
struct StandIn {
    lanes: Vec<String>,
    /// As asked, for the log.
    seconds: u64,
    until: Instant,
}

impl Requests {
    fn draining(&self, now: Instant) -> Option<Instant> {
        self.drain_until.filter(|until| *until > now)
    }

    fn standing_in(&self, now: Instant) -> Option<&StandIn> {
        self.stand_in
            .as_ref()
            .filter(|stand_in| stand_in.until > now)
    }
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
    // The operator's drain and stand-in requests. The sender lives as long as the worker, so
    // `changed()` only ever wakes for a new request.
    let (requests, mut asked) = watch::channel(Requests::default());
    let port = Arc::new(MetricsPort {
        busy: busy.clone(),
        finished: finished.clone(),
        requests,
        own_lanes: config.lanes.clone(),
        credential_file: std::env::var_os(CREDENTIAL_FILE_ENV)
            .filter(|path| !path.is_empty())
            .map(PathBuf::from),
    });
    let serving = match std::env::var(METRICS_ADDR_ENV) {
        Ok(addr) if !addr.is_empty() => match tokio::net::TcpListener::bind(&addr).await {
            Ok(listener) => {
                tokio::spawn(serve_metrics(listener, port.clone()));
                true
            }
            Err(e) => {
                eprintln!("lane_worker: error: {METRICS_ADDR_ENV}={addr}: {e}");
                return ExitCode::FAILURE;
            }
        },
        _ => false,
    };
    println!(
        "{}: {} worker of pool {}, lanes {} (in this order), queue http://{}",
        config.name,
        config.role,
        config.pool,
        config.lanes.join(","),
        config.queue
    );
    // Without the credential every POST is refused: said once, so that a pool whose workers never
    // drain or stand in shows why. (A worker without a metrics port takes no requests at all.)
    if serving && port.credential_file.is_none() {
        println!(
            "{}: {CREDENTIAL_FILE_ENV} is not set: drain and stand-in requests are refused \
             (no credential)",
            config.name
        );
    }
    let mut queue = Queue::new(&config.queue);

    let mut was_draining = false;
    // The stand-in the last take served; `None`: the worker's own lanes.
    let mut standing_in: Option<StandIn> = None;
    loop {
        if *stop.borrow() {
            break;
        }
        let current = asked.borrow_and_update().clone();
        let now = Instant::now();
        let stand_in = current.standing_in(now).cloned();
        if stand_in != standing_in {
            match &stand_in {
                Some(stand_in) => println!(
                    "{}: standing in: lanes {} (for {} s)",
                    config.name,
                    stand_in.lanes.join(","),
                    stand_in.seconds
                ),
                None => println!(
                    "{}: stand-in over: lanes {} again",
                    config.name,
                    config.lanes.join(",")
                ),
            }
            standing_in = stand_in;
        }
        // Draining: no new job until the drain ends (or SIGTERM, or a new request).
        if let Some(until) = current.draining(now) {
            if !was_draining {
                println!("{}: draining: no new jobs", config.name);
            }
            was_draining = true;
            tokio::select! {
                _ = stop.changed() => break,
                _ = asked.changed() => {}
                _ = tokio::time::sleep_until(until.into()) => {}
            }
            continue;
        }
        if was_draining {
            println!("{}: drain over: taking jobs again", config.name);
            was_draining = false;
        }
        let lanes = standing_in.as_ref().map_or(&config.lanes, |s| &s.lanes);
        let take_path = format!("/take?lanes={}&worker={}", lanes.join(","), config.name);
        let lapses = standing_in.as_ref().map(|stand_in| stand_in.until);
        // While waiting for a job there is nothing to finish: SIGTERM, a drain or stand-in
        // request, or the stand-in's end ends the wait at once (the queue is asked to cancel the
        // take), so the next take asks for the lanes now wanted. A job the queue handed out just
        // then is given back, never run: the worker said it had none.
        let (answer, cancelled, stopping) = {
            let take = queue.request("GET", &take_path);
            tokio::pin!(take);
            let (mut cancelled, mut stopping) = (false, false);
            let lapse = tokio::time::sleep_until(lapses.unwrap_or(now).into());
            tokio::pin!(lapse);
            let answer = loop {
                tokio::select! {
                    answer = &mut take => break answer,
                    _ = stop.changed(), if !stopping => stopping = true,
                    _ = asked.changed(), if !cancelled => {}
                    _ = &mut lapse, if lapses.is_some() && !cancelled => {}
                }
                if !cancelled {
                    cancelled = true;
                    cancel_take(&config).await;
                }
            };
            (answer, cancelled, stopping)
        };
        if cancelled {
            if let Ok((200, body)) = &answer
                && let Ok(job) = serde_json::from_str::<Job>(body)
            {
                give_back(&mut queue, &config, &job).await;
            }
            if stopping {
                break;
            }
            continue;
        }
        let job: Option<Job> = match answer {
            Ok((200, body)) => match serde_json::from_str(&body) {
                Ok(job) => Some(job),
                Err(e) => {
                    eprintln!(
                        "{}: the queue sent a job this worker cannot read: {e}: {body}",
                        config.name
                    );
                    None
                }
            },
            // The long poll ended with nothing in our lanes: ask again.
            Ok((204, _)) => continue,
            Ok((status, body)) => {
                eprintln!("{}: take refused ({status}): {}", config.name, body.trim());
                None
            }
            Err(e) => {
                eprintln!(
                    "{}: queue unreachable at http://{}: {e}",
                    config.name, config.queue
                );
                None
            }
        };
        let Some(job) = job else {
            // A pause before asking again, which a request ends too: a stand-in naming lanes the
            // queue refuses is followed at once by the one that corrects it.
            tokio::select! {
                _ = stop.changed() => break,
                _ = asked.changed() => {}
                _ = tokio::time::sleep(RETRY_AFTER) => {}
            }
            continue;
        };

        // Run the job to its end, even if SIGTERM arrives meanwhile: no preemption. A real
        // worker does its work here; the demo's jobs only take time.
        let since_epoch = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap_or_default();
        *lock(&busy) = Some((job.lane.clone(), since_epoch.as_secs_f64()));
        // A drain answered between the take's answer and the line above said "busy 0": then
        // this job is given back, not run, so that answer stays true. (The metrics port reads
        // `busy` after it records a drain; this reads the drain after it records `busy`: one of
        // the two sees the other.)
        if asked.borrow().draining(Instant::now()).is_some() {
            *lock(&busy) = None;
            give_back(&mut queue, &config, &job).await;
            continue;
        }
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

/// What the metrics port reads and changes, shared by its connections.
struct MetricsPort {
    /// The lane of the job in hand and when it started (Unix seconds); `None` while waiting.
    busy: Arc<Mutex<Option<(String, f64)>>>,
    finished: Arc<Mutex<Finished>>,
    /// The operator's drain and stand-in requests, read by the worker's loop.
    requests: watch::Sender<Requests>,
    /// `LANEPOOL_LANES`: the only lanes a stand-in may name.
    own_lanes: Vec<String>,
    /// `LANEPOOL_CREDENTIAL_FILE`; `None`: every POST is refused.
    credential_file: Option<PathBuf>,
}

impl MetricsPort {
    /// `lanepool_worker_busy` and the other gauges, then `lanepool_job_duration_seconds`.
    fn gauges(&self) -> String {
        let now = Instant::now();
        let (draining, standing_in) = {
            let current = self.requests.borrow();
            (
                current.draining(now).is_some(),
                current.standing_in(now).is_some(),
            )
        };
        let mut text = gauges(lock(&self.busy).as_ref(), draining, standing_in);
        text.push_str(&job_durations(&lock(&self.finished)));
        text
    }
}

/// Serves `lanepool_worker_busy`, `lanepool_worker_job_started_timestamp_seconds`,
/// `lanepool_worker_draining`, `lanepool_worker_standing_in`,
/// `lanepool_worker_credential_required` and `lanepool_job_duration_seconds` on every GET, and
/// takes drain requests (`POST /drain?seconds=N`) and stand-in requests
/// (`POST /stand-in?lanes=L1,L2&seconds=N`) that carry the pool's credential, answered with the
/// same gauges: the pod's namespace, pool and name come from Prometheus's target labels (or, to
/// the operator asking the Pod itself, from the Pod), not from the worker.
async fn serve_metrics(listener: tokio::net::TcpListener, port: Arc<MetricsPort>) {
    let slots = Arc::new(Semaphore::new(MOST_CONNECTIONS));
    let mut accept_failing = false;
    loop {
        let stream = match listener.accept().await {
            Ok((stream, _)) => {
                accept_failing = false;
                stream
            }
            Err(e) => {
                // Said once per run of failures: out of descriptors, it fails 20 times a second.
                if !accept_failing {
                    eprintln!("lane_worker: metrics port: accepting connections: {e}");
                }
                accept_failing = true;
                tokio::time::sleep(ACCEPT_BACKOFF).await;
                continue;
            }
        };
        // Past the cap the connection is closed unread: queueing it would hold its descriptor
        // for as long as the flood lasts. The operator retries a request that got no answer.
        let Ok(slot) = slots.clone().try_acquire_owned() else {
            drop(stream);
            continue;
        };
        let port = port.clone();
        tokio::spawn(async move {
            let _ =
                tokio::time::timeout(CONNECTION_DEADLINE, answer_connection(stream, &port)).await;
            drop(slot);
        });
    }
}

/// Reads one request from `stream`, follows it, answers it, and closes the connection.
async fn answer_connection(mut stream: TcpStream, port: &MetricsPort) {
    let head = request_head(&mut stream).await;
    let response = match answer(&head, port).await {
        Ok(()) => http_response("200 OK", "", &port.gauges()),
        Err(Refusal::Unauthenticated) => http_response(
            "401 Unauthorized",
            "WWW-Authenticate: Bearer realm=\"lanepool\"\r\n",
            UNAUTHENTICATED,
        ),
        Err(Refusal::Invalid(status, body)) => http_response(status, "", &body),
    };
    let _ = stream.write_all(response.as_bytes()).await;
}

/// The request head, which may come in several pieces: up to [`LONGEST_REQUEST_HEAD`] bytes, for
/// up to [`HEAD_DEADLINE`]; what came by then (possibly nothing) when either runs out.
async fn request_head(stream: &mut TcpStream) -> Vec<u8> {
    let mut head = vec![0u8; LONGEST_REQUEST_HEAD];
    let mut read = 0;
    let deadline = tokio::time::Instant::now() + HEAD_DEADLINE;
    while read < head.len() && !head[..read].windows(4).any(|w| w == b"\r\n\r\n") {
        match tokio::time::timeout_at(deadline, stream.read(&mut head[read..])).await {
            Ok(Ok(n)) if n > 0 => read += n,
            _ => break,
        }
    }
    head.truncate(read);
    head
}

/// Why a request is answered without the gauges.
enum Refusal {
    /// `401`: a POST without this pool's credential. Which part was wrong is never said.
    Unauthenticated,
    /// Any other status, with a one-line body that names what is wrong.
    Invalid(&'static str, String),
}

/// Authenticates a POST, then follows the request. Authentication comes first: a caller without
/// the credential learns nothing about which paths and queries the worker would take.
async fn answer(head: &[u8], port: &MetricsPort) -> Result<(), Refusal> {
    let text = String::from_utf8_lossy(head);
    let request_line = text.split_once('\n').map(|(line, _)| line);
    let method = request_line
        .unwrap_or(&text)
        .split_whitespace()
        .next()
        .unwrap_or("");
    if method == "POST" && !authenticated(head, port.credential_file.as_deref()).await {
        return Err(Refusal::Unauthenticated);
    }
    // A request cut short could name fewer lanes than were sent.
    let line = request_line.ok_or_else(|| {
        Refusal::Invalid(
            "400 Bad Request",
            "the request line is incomplete or longer than 4 KiB\n".to_string(),
        )
    })?;
    follow_request(line, &port.requests, &port.own_lanes)
        .map_err(|(status, body)| Refusal::Invalid(status, body))
}

/// Whether the request head carries `Authorization: Bearer <token>` with the token the
/// credential file holds now. No file named, or none to read: nothing is authenticated.
async fn authenticated(head: &[u8], credential_file: Option<&Path>) -> bool {
    let (Some(token), Some(file)) = (bearer_token(head), credential_file) else {
        return false;
    };
    match current_credential(file.to_path_buf()).await {
        Some(credential) => same_secret(token, &credential),
        None => false,
    }
}

/// The token of the head's `Authorization: Bearer` header. `None`: no such header, another
/// scheme (`Basic`…), no token, or more than one `Authorization` header (which one to believe?).
fn bearer_token(head: &[u8]) -> Option<&[u8]> {
    let mut authorizations = header_fields(head)
        .filter(|(name, _)| name.eq_ignore_ascii_case(b"authorization"))
        .map(|(_, value)| value);
    let value = authorizations.next()?;
    if authorizations.next().is_some() {
        return None;
    }
    let space = value.iter().position(|&b| b == b' ')?;
    let (scheme, token) = (&value[..space], value[space..].trim_ascii());
    // The scheme is case-insensitive (RFC 9110), the token is not.
    (scheme.eq_ignore_ascii_case(b"bearer") && !token.is_empty()).then_some(token)
}

/// The head's header fields as (name, value without the surrounding whitespace), up to the blank
/// line that ends the head; a field's name is matched without regard to case by the caller.
fn header_fields(head: &[u8]) -> impl Iterator<Item = (&[u8], &[u8])> {
    head.split(|&b| b == b'\n')
        .skip(1)
        .map(|line| line.strip_suffix(b"\r").unwrap_or(line))
        .take_while(|line| !line.is_empty())
        .filter_map(|line| {
            let colon = line.iter().position(|&b| b == b':')?;
            Some((&line[..colon], line[colon + 1..].trim_ascii()))
        })
}

/// The credential as the file holds it now, without trailing whitespace (a file written by hand
/// ends with a newline). Read at every POST, never kept: the kubelet rewrites the file in place
/// when the operator rotates the Secret, and the new token must count at once. `None`: the file
/// is missing, unreadable, empty or longer than [`LONGEST_CREDENTIAL`].
async fn current_credential(file: PathBuf) -> Option<Vec<u8>> {
    // On the blocking pool: a slow volume must not stall the port's other connections.
    let read = tokio::task::spawn_blocking(move || {
        use std::io::Read;
        let mut content = Vec::new();
        std::fs::File::open(&file)
            .ok()?
            .take(LONGEST_CREDENTIAL as u64 + 1)
            .read_to_end(&mut content)
            .ok()?;
        Some(content)
    });
    let content = read.await.ok().flatten()?;
    let credential = content.trim_ascii_end();
    (!credential.is_empty() && content.len() <= LONGEST_CREDENTIAL).then(|| credential.to_vec())
}

/// Whether `given` and `expected` are the same bytes, in a time that depends only on their
/// length: every byte pair is compared, with no early exit, so the time an answer takes tells a
/// caller nothing about how much of its guess was right. A length that differs is simply unequal
/// (the operator's tokens all have the same length).
fn same_secret(given: &[u8], expected: &[u8]) -> bool {
    if given.len() != expected.len() {
        return false;
    }
    let difference = given
        .iter()
        .zip(expected)
        .fold(0u8, |difference, (a, b)| difference | (a ^ b));
    // Keeps the optimiser from turning the fold back into a comparison that stops early.
    std::hint::black_box(difference) == 0
}

/// An HTTP/1.1 answer that closes the connection; `headers`: more header lines, each ending in
/// CRLF.
fn http_response(status: &str, headers: &str, body: &str) -> String {
    format!(
        "HTTP/1.1 {status}\r\nContent-Type: text/plain; version=0.0.4\r\n{headers}\
         Content-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    )
}

/// Acts on a request line (a POST's only once it is authenticated): a drain or stand-in request
/// changes `requests`, any GET only reads. `Err`: the status and body to answer instead of the
/// gauges.
fn follow_request(
    line: &str,
    requests: &watch::Sender<Requests>,
    own_lanes: &[String],
) -> Result<(), (&'static str, String)> {
    let mut words = line.split_whitespace();
    let (method, target) = (words.next().unwrap_or(""), words.next().unwrap_or(""));
    if method != "POST" {
        return Ok(());
    }
    if let Some(drain) = drain_request(target) {
        let seconds = drain.map_err(|()| ("400 Bad Request", DRAIN_USAGE.to_string()))?;
        let until = (!seconds.is_zero()).then(|| Instant::now() + seconds);
        requests.send_modify(|current| {
            current.drain_until = until;
            // The worker is about to be stopped: calling this drain off brings back its own
            // lanes, not a stand-in's.
            if until.is_some() {
                current.stand_in = None;
            }
        });
        return Ok(());
    }
    if let Some(stand_in) = stand_in_request(target) {
        let (lanes, seconds) = stand_in
            .map_err(|reason| ("400 Bad Request", format!("POST /stand-in: {reason}\n")))?;
        if let Some(foreign) = lanes.iter().find(|lane| !own_lanes.contains(lane)) {
            return Err(("403 Forbidden", not_own_lane(foreign, own_lanes)));
        }
        let stand_in = (seconds > 0).then(|| StandIn {
            lanes,
            seconds,
            until: Instant::now() + Duration::from_secs(seconds),
        });
        requests.send_modify(|current| current.stand_in = stand_in);
        return Ok(());
    }
    Err(("404 Not Found", format!("{DRAIN_USAGE}{STAND_IN_USAGE}")))
}

/// The one-line answer to a stand-in that names a lane the worker was not given: the operator
/// only ever narrows or reorders a worker's lanes, so anything else is not the operator's.
fn not_own_lane(lane: &str, own_lanes: &[String]) -> String {
    format!(
        "POST /stand-in: lane {lane:?} is not one of this worker's lanes ({})\n",
        own_lanes.join(",")
    )
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

/// `/stand-in?lanes=L1,L2&seconds=N` → the lanes to take jobs from, in this order, and for how
/// many seconds (`0`: its own lanes again at once; `lanes` may then be left out); `None`: another
/// path; `Err`: what is wrong with the request, in one line.
fn stand_in_request(target: &str) -> Option<Result<(Vec<String>, u64), String>> {
    let (path, query) = target.split_once('?').unwrap_or((target, ""));
    (path == "/stand-in").then(|| stand_in_query(query))
}

fn stand_in_query(query: &str) -> Result<(Vec<String>, u64), String> {
    const EXPECTED: &str = "expected lanes=L1,L2&seconds=N";
    let (mut lanes, mut seconds) = (None, None);
    for pair in query.split('&').filter(|pair| !pair.is_empty()) {
        let (name, value) = pair.split_once('=').unwrap_or((pair, ""));
        let slot = match name {
            "lanes" => &mut lanes,
            "seconds" => &mut seconds,
            _ => return Err(format!("unknown parameter {name:?}, {EXPECTED}")),
        };
        if slot.replace(value).is_some() {
            return Err(format!("{name} is given twice"));
        }
    }
    let longest = LONGEST_DRAIN.as_secs();
    let Some(seconds_text) = seconds else {
        return Err(format!(
            "seconds is missing: a whole number from 0 to {longest}, {EXPECTED}"
        ));
    };
    let seconds = Some(seconds_text)
        .filter(|s| !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit()))
        .and_then(|s| s.parse::<u64>().ok())
        .filter(|s| *s <= longest)
        .ok_or_else(|| {
            format!("seconds={seconds_text:?} is not a whole number from 0 to {longest}")
        })?;
    let lanes = match lanes {
        Some(text) => stand_in_lanes(text)?,
        None if seconds == 0 => Vec::new(),
        None => {
            return Err(format!(
                "lanes is missing: a stand-in for {seconds} s needs the lanes to take jobs from, \
                 {EXPECTED}"
            ));
        }
    };
    Ok((lanes, seconds))
}

/// `L1,L2`: 1 to [`MOST_STAND_IN_LANES`] distinct DNS labels.
fn stand_in_lanes(text: &str) -> Result<Vec<String>, String> {
    // A client that form-encodes its query (reqwest's `.query()`) sends each comma as %2C.
    let text = text.replace("%2C", ",").replace("%2c", ",");
    let lanes: Vec<String> = text.split(',').map(str::to_string).collect();
    if lanes.len() > MOST_STAND_IN_LANES {
        return Err(format!(
            "lanes names {} lanes, at most {MOST_STAND_IN_LANES}",
            lanes.len()
        ));
    }
    for (i, lane) in lanes.iter().enumerate() {
        if !is_dns_label(lane) {
            return Err(format!(
                "lane {lane:?} is not a lane name (lowercase letters, digits and '-', \
                 a letter or digit first and last, at most 63 bytes)"
            ));
        }
        if lanes[..i].contains(lane) {
            return Err(format!("lane {lane:?} is named twice"));
        }
    }
    Ok(lanes)
}

/// The worker's gauges in the Prometheus text format. `lanepool_worker_credential_required` is
/// always 1: it is how the operator tells this worker from one built before the credential.
fn gauges(busy: Option<&(String, f64)>, draining: bool, standing_in: bool) -> String {
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
         # TYPE lanepool_worker_draining gauge\nlanepool_worker_draining {}\n\
         # HELP lanepool_worker_standing_in 1 while a stand-in request has the worker take other \
         lanes than its own (POST /stand-in)\n\
         # TYPE lanepool_worker_standing_in gauge\nlanepool_worker_standing_in {}\n\
         # HELP lanepool_worker_credential_required 1: this worker takes POST requests only with \
         its pool's credential\n\
         # TYPE lanepool_worker_credential_required gauge\n\
         lanepool_worker_credential_required 1\n",
        u8::from(draining),
        u8::from(standing_in)
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

/// Asks the queue to end this worker's waiting take, on a connection of its own (the take's
/// is busy with it). Best effort: a take not cancelled ends with its long poll.
async fn cancel_take(config: &Config) {
    let mut queue = Queue::new(&config.queue);
    let path = format!("/cancel?worker={}", config.name);
    if let Err(e) = queue.request("POST", &path).await {
        eprintln!("{}: cancelling the take: {e}", config.name);
    }
}

/// Gives a job got but not started back to the front of its lane.
async fn give_back(queue: &mut Queue, config: &Config, job: &Job) {
    match queue
        .request("POST", &format!("/release?id={}", job.id))
        .await
    {
        Ok((200, _)) => println!("{}: gave back {} job {}", config.name, job.lane, job.id),
        Ok((status, body)) => eprintln!(
            "{}: giving back job {} refused ({status}): {}",
            config.name,
            job.id,
            body.trim()
        ),
        // The connection is gone: the queue puts the job back itself.
        Err(e) => eprintln!("{}: giving back job {}: {e}", config.name, job.id),
    }
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
