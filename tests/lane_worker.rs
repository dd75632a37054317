//! The example lane worker (`examples/lane_worker.rs`) against the example queue
//! (`examples/lane_queue`), both as real processes: a shared worker takes urgent jobs before
//! batch ones, a reserved worker never takes batch, SIGTERM lets a job finish, a killed worker's
//! job goes back to its lane, a drained worker finishes its job and takes no new one until its
//! drain ends, a worker asked to stand in takes the lanes asked for (in their order, waking from
//! its wait) until the stand-in ends, lapses or a drain ends it, a malformed stand-in is refused
//! naming what is wrong, and a bad environment is refused naming the variable. Only the pool's
//! credential steers a worker: a POST without it (or with the variable unset, the file missing,
//! empty or unreadable) gets 401 and changes nothing, a rotated file counts at the next POST, a
//! stand-in naming a lane not the worker's own gets 403, `/metrics` stays open and never shows the
//! token; connections past the cap are closed at once, and a worker out of file descriptors backs
//! off instead of spinning.

mod common;

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use common::poll_blocking;
use lanepool_testenv::example;

/// A process killed when the test ends, with its stdout collected line by line.
struct Running {
    child: Child,
    lines: Arc<Mutex<Vec<String>>>,
}

impl Running {
    fn start(mut command: Command) -> Self {
        let mut child = command
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("starting an example");
        let lines = Arc::new(Mutex::new(Vec::new()));
        let collected = lines.clone();
        let stdout = child.stdout.take().expect("piped stdout");
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                collected.lock().unwrap().push(line);
            }
        });
        Self { child, lines }
    }

    fn lines(&self) -> Vec<String> {
        self.lines.lock().unwrap().clone()
    }

    /// Waits until some line satisfies `found`, and returns it.
    fn wait_for_line(&self, what: &str, found: impl Fn(&str) -> bool) -> String {
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            if let Some(line) = self.lines().into_iter().find(|l| found(l)) {
                return line;
            }
            assert!(
                Instant::now() < deadline,
                "no {what} in 10 s; output: {:?}",
                self.lines()
            );
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    fn signal(&self, signal: &str) {
        let status = Command::new("kill")
            .args([&format!("-{signal}"), &self.child.id().to_string()])
            .status()
            .expect("running kill");
        assert!(status.success());
    }

    fn wait_exit(&mut self, within: Duration) -> ExitStatus {
        let deadline = Instant::now() + within;
        loop {
            if let Some(status) = self.child.try_wait().expect("waiting for a child") {
                return status;
            }
            assert!(Instant::now() < deadline, "still running after {within:?}");
            std::thread::sleep(Duration::from_millis(10));
        }
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A lane queue on a free port with no producers but the given batch backlog.
fn queue(batch_backlog: u32, batch_ms: &str, long_poll: &str) -> (Running, SocketAddr) {
    let mut command = Command::new(example("lane_queue"));
    command.args([
        "--listen=127.0.0.1:0",
        "--urgent-profile=0s=0",
        &format!("--batch-backlog={batch_backlog}"),
        "--batch-rate=0",
        &format!("--batch-ms={batch_ms}"),
        &format!("--long-poll={long_poll}"),
    ]);
    let queue = Running::start(command);
    let line = queue.wait_for_line("listening line", |l| l.contains("listening on http://"));
    let addr = line
        .rsplit("http://")
        .next()
        .and_then(|a| a.parse().ok())
        .expect("the queue's address");
    (queue, addr)
}

/// The pool's credential as the operator mounts it (64 lowercase hex characters).
const TOKEN: &str = "9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08";
/// The token a rotation brings.
const ROTATED: &str = "60303ae22b998861bce3b28f33eec1be758a213c86c93c076dbe9f558c11c752";
/// What the worker answers on its challenge header to every request it refuses for want of the
/// credential.
const CHALLENGE: &str = "WWW-Authenticate: Bearer realm=\"lanepool\"";

/// `answer` refused a request (`what`) for want of the pool's credential: 401 with the challenge.
fn assert_unauthenticated(answer: &Answer, what: &str) {
    assert_eq!(answer.status, 401, "{what}: {}", answer.body);
    assert!(
        answer.head.lines().any(|l| l == CHALLENGE),
        "{what}: no challenge in {}",
        answer.head
    );
}

/// The credential file the operator mounts into a worker, in a directory of its own that goes
/// when the test ends; a test rewrites it as the kubelet does when the Secret changes.
struct Credential {
    dir: PathBuf,
}

impl Credential {
    /// A file holding `content` (the kubelet writes the Secret's bytes as they are).
    fn holding(content: &str) -> Self {
        let credential = Self::not_yet_written();
        credential.rewrite(content);
        credential
    }

    /// A file named but not there (yet): the Secret not created, a mount not made.
    fn not_yet_written() -> Self {
        static NEXT: AtomicUsize = AtomicUsize::new(0);
        let dir = std::env::temp_dir().join(format!(
            "lane-worker-credential-{}-{}",
            std::process::id(),
            NEXT.fetch_add(1, Ordering::Relaxed)
        ));
        std::fs::create_dir_all(&dir).expect("a directory for the credential");
        Self { dir }
    }

    fn file(&self) -> PathBuf {
        self.dir.join("token")
    }

    fn rewrite(&self, content: &str) {
        std::fs::write(self.file(), content).expect("writing the credential file");
    }
}

impl Drop for Credential {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// A worker's metrics port, and the credential file its worker reads (holding [`TOKEN`]).
struct MetricsPort {
    addr: SocketAddr,
    credential: Credential,
}

impl MetricsPort {
    /// A request as the operator sends it: with `Authorization: Bearer` and [`TOKEN`].
    fn post(&self, path: &str) -> (u16, String) {
        let answer = send(
            self.addr,
            "POST",
            path,
            &[&format!("Authorization: Bearer {TOKEN}")],
        );
        (answer.status, answer.body)
    }

    /// `GET /metrics`, open to anyone.
    fn gauges(&self) -> String {
        http(self.addr, "GET", "/metrics").1
    }
}

/// The environment the operator gives a worker, and nothing else.
fn worker_env(command: &mut Command, addr: SocketAddr, role: &str, lanes: &str, name: &str) {
    command
        .env_clear()
        .env("LANEPOOL_LANES", lanes)
        .env("LANEPOOL_ROLE", role)
        .env("LANEPOOL_POOL", "jobs")
        .env("LANEPOOL_QUEUE_URL", format!("http://{addr}"))
        .env("HOSTNAME", name);
}

fn worker_command(addr: SocketAddr, role: &str, lanes: &str, name: &str) -> Command {
    let mut command = Command::new(example("lane_worker"));
    worker_env(&mut command, addr, role, lanes, name);
    command
}

fn worker(addr: SocketAddr, role: &str, lanes: &str, name: &str) -> Running {
    Running::start(worker_command(addr, role, lanes, name))
}

/// A free loopback port.
fn free_port() -> SocketAddr {
    let probe = std::net::TcpListener::bind("127.0.0.1:0").expect("a free port");
    probe.local_addr().unwrap()
}

/// A worker that serves its gauges and takes the operator's requests at a free loopback port,
/// reading the pool's credential from `credential_file` (`None`: the variable unset).
fn worker_serving(
    addr: SocketAddr,
    role: &str,
    lanes: &str,
    name: &str,
    credential_file: Option<&Path>,
) -> (Running, SocketAddr) {
    let metrics = free_port();
    let mut command = worker_command(addr, role, lanes, name);
    command.env("LANEPOOL_METRICS_ADDR", metrics.to_string());
    if let Some(file) = credential_file {
        command.env("LANEPOOL_CREDENTIAL_FILE", file);
    }
    let worker = Running::start(command);
    let started = format!("{role} worker of pool jobs");
    worker.wait_for_line("start line", |l| l.contains(&started));
    (worker, metrics)
}

/// A worker as the operator runs it when its pool has a metrics port: with the credential
/// mounted, holding [`TOKEN`] (and a newline, as a file written by hand has).
fn worker_with_metrics(
    addr: SocketAddr,
    role: &str,
    lanes: &str,
    name: &str,
) -> (Running, MetricsPort) {
    let credential = Credential::holding(&format!("{TOKEN}\n"));
    let (worker, addr) = worker_serving(addr, role, lanes, name, Some(&credential.file()));
    (worker, MetricsPort { addr, credential })
}

/// An HTTP answer. `status` 0: the connection closed (or was reset) with no answer at all.
struct Answer {
    status: u16,
    /// The status line and header lines.
    head: String,
    body: String,
}

/// One request with the given header lines, on a connection of its own.
fn send(addr: SocketAddr, method: &str, path: &str, headers: &[&str]) -> Answer {
    let mut stream = TcpStream::connect(addr).expect("connecting");
    stream
        .set_read_timeout(Some(Duration::from_secs(10)))
        .unwrap();
    let headers: String = headers.iter().map(|h| format!("{h}\r\n")).collect();
    // A connection closed unread may be reset while the request is written or read: that is
    // an answer too (none), which the caller asserts on.
    let _ = write!(
        stream,
        "{method} {path} HTTP/1.1\r\nHost: {addr}\r\n{headers}Connection: close\r\n\r\n"
    );
    let mut response = Vec::new();
    let _ = stream.read_to_end(&mut response);
    let response = String::from_utf8_lossy(&response).into_owned();
    let (head, body) = response
        .split_once("\r\n\r\n")
        .map_or((response.as_str(), ""), |(h, b)| (h, b));
    Answer {
        status: head
            .split_whitespace()
            .nth(1)
            .and_then(|s| s.parse().ok())
            .unwrap_or(0),
        head: head.to_string(),
        body: body.to_string(),
    }
}

fn http(addr: SocketAddr, method: &str, path: &str) -> (u16, String) {
    let answer = send(addr, method, path, &[]);
    (answer.status, answer.body)
}

/// A series' value from the queue's /metrics, such as ("lanepool_jobs_completed_total", "batch").
fn metric(addr: SocketAddr, name: &str, lane: &str) -> f64 {
    let (_, body) = http(addr, "GET", "/metrics");
    body.lines()
        .find(|l| l.starts_with(&format!("{name}{{")) && l.contains(&format!("lane=\"{lane}\"")))
        .and_then(|l| l.rsplit(' ').next())
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| panic!("no {name} for lane {lane} in:\n{body}"))
}

fn wait_for_metric(addr: SocketAddr, name: &str, lane: &str, value: f64) {
    let reached = poll_blocking(Duration::from_secs(10), Duration::from_millis(20), || {
        metric(addr, name, lane) == value
    });
    assert!(
        reached.is_some(),
        "{name}{{lane={lane}}} never reached {value}"
    );
}

/// Waits until `done` holds, for at most 10 s.
fn wait_until(what: &str, done: impl Fn() -> bool) {
    let held = poll_blocking(Duration::from_secs(10), Duration::from_millis(10), done);
    assert!(held.is_some(), "no {what} in 10 s");
}

/// Puts `count` jobs of `job_ms` in `lane`, as a producer would.
fn submit(addr: SocketAddr, lane: &str, job_ms: u32, count: u32) {
    for _ in 0..count {
        let (status, body) = http(
            addr,
            "POST",
            &format!("/submit?lane={lane}&job_ms={job_ms}"),
        );
        assert_eq!(status, 200, "{body}");
    }
}

/// The lanes of the jobs a worker reported, in the order it ran them.
fn lanes_run(worker: &Running) -> Vec<String> {
    lanes_of(&worker.lines())
}

/// The lanes of the jobs a worker reported after its first line that ends with `marker`.
fn lanes_run_after(worker: &Running, marker: &str) -> Vec<String> {
    let lines = worker.lines();
    let from = lines
        .iter()
        .position(|l| l.ends_with(marker))
        .unwrap_or_else(|| panic!("no line ends with {marker:?}: {lines:?}"));
    lanes_of(&lines[from..])
}

fn lanes_of(lines: &[String]) -> Vec<String> {
    lines
        .iter()
        .filter(|l| l.contains(" done in "))
        .filter_map(|l| {
            l.split_once(": ")?
                .1
                .split_once(" job ")
                .map(|(lane, _)| lane.to_string())
        })
        .collect()
}

#[test]
fn the_shared_worker_takes_urgent_before_batch_and_the_reserved_worker_never_takes_batch() {
    let (_queue, addr) = queue(6, "50..50", "200ms");
    for _ in 0..30 {
        assert_eq!(http(addr, "POST", "/submit?lane=urgent&job_ms=20").0, 200);
    }
    // The shared worker starts first, so it surely meets urgent jobs; then the reserved one.
    let mut shared = worker(addr, "shared", "urgent,batch", "jobs-shared-1");
    shared.wait_for_line("first urgent job", |l| l.contains(": urgent job "));
    let mut reserved = worker(addr, "reserved", "urgent", "jobs-urgent-reserved-1");

    wait_for_metric(addr, "lanepool_jobs_completed_total", "urgent", 30.0);
    wait_for_metric(addr, "lanepool_jobs_completed_total", "batch", 6.0);
    std::thread::sleep(Duration::from_millis(300)); // a batch job taken by mistake would show now

    let by_shared = lanes_run(&shared);
    let first_batch = by_shared
        .iter()
        .position(|l| l == "batch")
        .expect("shared ran batch");
    assert!(
        first_batch > 0,
        "the shared worker ran batch first: {by_shared:?}"
    );
    assert!(
        by_shared[first_batch..].iter().all(|l| l == "batch"),
        "the shared worker ran an urgent job after a batch one while urgent jobs waited: {by_shared:?}"
    );
    assert_eq!(by_shared.iter().filter(|l| *l == "batch").count(), 6);
    let by_reserved = lanes_run(&reserved);
    assert!(!by_reserved.is_empty(), "the reserved worker ran nothing");
    assert!(
        by_reserved.iter().all(|l| l == "urgent"),
        "reserved ran batch: {by_reserved:?}"
    );
    assert_eq!(
        by_shared.len() + by_reserved.len(),
        36,
        "a job ran twice or never"
    );

    for worker in [&mut shared, &mut reserved] {
        worker.signal("TERM");
        assert!(worker.wait_exit(Duration::from_secs(3)).success());
    }
}

#[test]
fn on_sigterm_a_worker_finishes_its_job_reports_it_and_exits() {
    let (_queue, addr) = queue(1, "1500..1500", "1s");
    let mut shared = worker(addr, "shared", "urgent,batch", "jobs-shared-1");
    wait_for_metric(addr, "lanepool_job_wait_seconds_count", "batch", 1.0); // taken
    std::thread::sleep(Duration::from_millis(200));
    let terminated = Instant::now();
    shared.signal("TERM");
    let status = shared.wait_exit(Duration::from_secs(5));
    assert!(status.success(), "{status}");
    assert!(
        terminated.elapsed() >= Duration::from_millis(800),
        "exited {:?} after SIGTERM, before its 1.5 s job could end",
        terminated.elapsed()
    );
    assert_eq!(metric(addr, "lanepool_jobs_completed_total", "batch"), 1.0);
    assert!(
        shared
            .lines()
            .iter()
            .any(|l| l.contains(": batch job 1 done"))
    );
}

#[test]
fn a_worker_waiting_for_a_job_exits_at_once_on_sigterm() {
    let (_queue, addr) = queue(0, "100..100", "5s");
    let mut reserved = worker(addr, "reserved", "urgent", "jobs-urgent-reserved-1");
    reserved.wait_for_line("start line", |l| l.contains("reserved worker of pool jobs"));
    std::thread::sleep(Duration::from_millis(300)); // inside its 5 s long poll
    let terminated = Instant::now();
    reserved.signal("TERM");
    assert!(reserved.wait_exit(Duration::from_secs(2)).success());
    assert!(terminated.elapsed() < Duration::from_secs(2));
}

#[test]
fn the_job_of_a_killed_worker_goes_back_to_its_lane() {
    let (_queue, addr) = queue(1, "1000..1000", "1s");
    let mut first = worker(addr, "shared", "urgent,batch", "jobs-shared-1");
    wait_for_metric(addr, "lanepool_job_wait_seconds_count", "batch", 1.0);
    first.signal("KILL");
    first.wait_exit(Duration::from_secs(2));
    wait_for_metric(addr, "lanepool_queue_depth", "batch", 1.0); // back in its lane
    let second = worker(addr, "shared", "urgent,batch", "jobs-shared-2");
    second.wait_for_line("the job run again", |l| l.contains(": batch job 1 done"));
    wait_for_metric(addr, "lanepool_jobs_completed_total", "batch", 1.0);
    assert_eq!(metric(addr, "lanepool_jobs_cut_short_total", "batch"), 1.0);
}

#[test]
fn requests_that_end_waits_while_jobs_arrive_give_back_what_they_catch_and_cut_nothing_short() {
    // Short jobs arriving while the worker's waits are ended over and over (stand-ins flipping
    // its lanes, drains called on and off): each wait is cancelled at the queue, a job it caught
    // just then is given back, never run and never counted as cut short.
    let (_queue, addr) = queue(0, "1..1", "1s");
    let (mut shared, metrics) =
        worker_with_metrics(addr, "shared", "urgent,batch", "jobs-shared-1");
    let submitted = 300;
    let producer = std::thread::spawn(move || {
        for _ in 0..submitted {
            submit(addr, "batch", 2, 1);
            std::thread::sleep(Duration::from_millis(3));
        }
    });
    let requests = [
        "/stand-in?lanes=urgent&seconds=60",
        "/stand-in?seconds=0",
        "/drain?seconds=60",
        "/drain?seconds=0",
    ];
    let mut asked = 0;
    while !producer.is_finished() {
        assert_eq!(metrics.post(requests[asked % requests.len()]).0, 200);
        asked += 1;
        std::thread::sleep(Duration::from_millis(2));
    }
    producer.join().unwrap();
    metrics.post("/drain?seconds=0");
    metrics.post("/stand-in?seconds=0");
    wait_for_metric(
        addr,
        "lanepool_jobs_completed_total",
        "batch",
        f64::from(submitted),
    );
    let gave_back = shared
        .lines()
        .iter()
        .filter(|l| l.contains("gave back"))
        .count();
    println!("{asked} requests; {gave_back} jobs given back and run later");
    assert_eq!(metric(addr, "lanepool_jobs_cut_short_total", "batch"), 0.0);
    assert_eq!(metric(addr, "lanepool_queue_depth", "batch"), 0.0);
    shared.signal("TERM");
    assert!(shared.wait_exit(Duration::from_secs(3)).success());
}

#[test]
fn a_drained_worker_finishes_its_job_takes_no_new_one_and_takes_jobs_again_when_the_drain_ends() {
    let (_queue, addr) = queue(3, "800..800", "1s");
    let (shared, metrics) = worker_with_metrics(addr, "shared", "urgent,batch", "jobs-shared-1");
    wait_for_metric(addr, "lanepool_job_wait_seconds_count", "batch", 1.0); // taken
    let asked = Instant::now();
    let (status, gauges) = metrics.post("/drain?seconds=3");
    assert_eq!(status, 200, "{gauges}");
    assert!(gauges.contains("lanepool_worker_draining 1"), "{gauges}");
    assert!(
        gauges.contains("lanepool_worker_busy{lane=\"batch\"} 1"),
        "{gauges}"
    );
    // The job in hand ends; no other starts while the drain lasts.
    wait_for_metric(addr, "lanepool_jobs_completed_total", "batch", 1.0);
    std::thread::sleep(Duration::from_secs(2).saturating_sub(asked.elapsed()));
    let gauges = metrics.gauges();
    assert!(
        gauges.contains("lanepool_worker_busy 0") && gauges.contains("lanepool_worker_draining 1"),
        "{gauges}"
    );
    assert_eq!(
        metric(addr, "lanepool_job_wait_seconds_count", "batch"),
        1.0
    );
    assert_eq!(metric(addr, "lanepool_queue_depth", "batch"), 2.0);
    // After 3 s without being stopped, it takes jobs again.
    wait_for_metric(addr, "lanepool_job_wait_seconds_count", "batch", 2.0);
    assert!(
        asked.elapsed() >= Duration::from_millis(2900),
        "took a job {:?} after a 3 s drain began",
        asked.elapsed()
    );
    shared.wait_for_line("drain over", |l| l.contains("drain over"));

    // seconds=0 ends a drain at once (the operator called the shrink off).
    wait_for_metric(addr, "lanepool_jobs_completed_total", "batch", 2.0);
    assert_eq!(metrics.post("/drain?seconds=60").0, 200);
    std::thread::sleep(Duration::from_millis(300));
    let (_, gauges) = metrics.post("/drain?seconds=0");
    assert!(gauges.contains("lanepool_worker_draining 0"), "{gauges}");
    let resumed = Instant::now();
    wait_for_metric(addr, "lanepool_job_wait_seconds_count", "batch", 3.0);
    assert!(resumed.elapsed() < Duration::from_secs(2));

    // Anything else is refused: an old operator or a typo never stops a worker by mistake.
    assert_eq!(metrics.post("/drain?seconds=-1").0, 400);
    assert_eq!(metrics.post("/drain").0, 400);
    assert_eq!(metrics.post("/other").0, 404);
    let gauges = metrics.gauges();
    assert!(gauges.contains("lanepool_worker_draining 0"), "{gauges}");
}

#[test]
fn a_shared_worker_standing_in_takes_only_the_lanes_asked_for_until_the_stand_in_is_called_off() {
    // A stand-in narrows or reorders a worker's own lanes (a reserved worker has one, and is never
    // asked): here batch alone, so urgent jobs wait for the shared worker's own order to return.
    let (_queue, addr) = queue(50, "100..100", "1s");
    let (shared, metrics) = worker_with_metrics(addr, "shared", "urgent,batch", "jobs-shared-1");
    let (status, gauges) = metrics.post("/stand-in?lanes=batch&seconds=30");
    assert_eq!(status, 200, "{gauges}");
    assert!(gauges.contains("lanepool_worker_standing_in 1"), "{gauges}");
    let started = ": standing in: lanes batch (for 30 s)";
    shared.wait_for_line("stand-in start", |l| l.ends_with(started));
    let before = lanes_run(&shared).len();
    submit(addr, "urgent", 20, 3);
    wait_until("two batch jobs run after the urgent jobs came", || {
        lanes_run(&shared).len() >= before + 2
    });
    let during = lanes_run_after(&shared, started);
    assert!(
        during.iter().all(|l| l == "batch"),
        "took urgent while standing in for batch: {during:?}"
    );
    assert_eq!(metric(addr, "lanepool_queue_depth", "urgent"), 3.0);

    // seconds=0: its own lanes again, urgent first, once the job in hand is done.
    let (status, gauges) = metrics.post("/stand-in?seconds=0");
    assert_eq!(status, 200, "{gauges}");
    assert!(gauges.contains("lanepool_worker_standing_in 0"), "{gauges}");
    let over = ": stand-in over: lanes urgent,batch again";
    shared.wait_for_line("stand-in over", |l| l.ends_with(over));
    let batch_left = metric(addr, "lanepool_queue_depth", "batch");
    assert!(batch_left > 0.0, "the backlog ran out during the stand-in");
    wait_until("three jobs run after the stand-in", || {
        lanes_run_after(&shared, over).len() >= 3
    });
    assert_eq!(lanes_run_after(&shared, over)[..3], ["urgent"; 3]);
    assert_eq!(metric(addr, "lanepool_queue_depth", "urgent"), 0.0);
}

#[test]
fn a_shared_worker_standing_in_takes_only_urgent_and_batch_again_at_once_when_it_ends() {
    let (_queue, addr) = queue(0, "100..100", "5s");
    let (shared, metrics) = worker_with_metrics(addr, "shared", "urgent,batch", "jobs-shared-1");
    let (status, gauges) = metrics.post("/stand-in?lanes=urgent&seconds=30");
    assert_eq!(status, 200, "{gauges}");
    assert!(gauges.contains("lanepool_worker_standing_in 1"), "{gauges}");
    shared.wait_for_line("stand-in start", |l| {
        l.ends_with(": standing in: lanes urgent (for 30 s)")
    });
    submit(addr, "batch", 100, 2);
    submit(addr, "urgent", 20, 2);
    wait_until("two urgent jobs run", || lanes_run(&shared).len() >= 2);
    std::thread::sleep(Duration::from_millis(300)); // a batch job taken by mistake would show now
    assert_eq!(lanes_run(&shared), ["urgent"; 2]);
    assert_eq!(metric(addr, "lanepool_queue_depth", "batch"), 2.0);

    // It now waits in a 5 s long poll on urgent alone: the end of the stand-in ends that wait.
    let ended = Instant::now();
    let (status, gauges) = metrics.post("/stand-in?seconds=0");
    assert_eq!(status, 200, "{gauges}");
    assert!(gauges.contains("lanepool_worker_standing_in 0"), "{gauges}");
    wait_until("both batch jobs run", || lanes_run(&shared).len() >= 4);
    assert!(
        ended.elapsed() < Duration::from_secs(2),
        "batch taken {:?} after the stand-in ended: the wait was not cut short",
        ended.elapsed()
    );
    assert_eq!(lanes_run(&shared), ["urgent", "urgent", "batch", "batch"]);
    shared.wait_for_line("stand-in over", |l| {
        l.ends_with(": stand-in over: lanes urgent,batch again")
    });
}

#[test]
fn a_worker_waiting_on_an_empty_lane_is_woken_by_a_stand_in_request() {
    let (_queue, addr) = queue(0, "100..100", "5s");
    let (shared, metrics) = worker_with_metrics(addr, "shared", "urgent,batch", "jobs-shared-1");
    assert_eq!(metrics.post("/stand-in?lanes=urgent&seconds=30").0, 200);
    shared.wait_for_line("stand-in start", |l| {
        l.ends_with(": standing in: lanes urgent (for 30 s)")
    });
    submit(addr, "batch", 100, 1);
    std::thread::sleep(Duration::from_millis(300)); // inside its 5 s long poll on urgent alone
    assert_eq!(metric(addr, "lanepool_queue_depth", "batch"), 1.0);
    let asked = Instant::now();
    let (status, gauges) = metrics.post("/stand-in?lanes=batch&seconds=30");
    assert_eq!(status, 200, "{gauges}");
    shared.wait_for_line("the batch job run", |l| l.contains(": batch job 1 done"));
    assert!(
        asked.elapsed() < Duration::from_secs(2),
        "the batch job ran {:?} after the stand-in request: the wait was not cut short",
        asked.elapsed()
    );
}

#[test]
fn a_new_stand_in_replaces_the_lanes_and_time_of_the_last_and_lapses_by_itself() {
    let (_queue, addr) = queue(0, "100..100", "5s");
    let (shared, metrics) = worker_with_metrics(addr, "shared", "urgent,batch", "jobs-shared-1");
    assert_eq!(metrics.post("/stand-in?lanes=batch&seconds=60").0, 200);
    shared.wait_for_line("first stand-in", |l| {
        l.ends_with(": standing in: lanes batch (for 60 s)")
    });
    let replaced = Instant::now();
    let (status, gauges) = metrics.post("/stand-in?lanes=urgent&seconds=2");
    assert_eq!(status, 200, "{gauges}");
    assert!(gauges.contains("lanepool_worker_standing_in 1"), "{gauges}");
    shared.wait_for_line("second stand-in", |l| {
        l.ends_with(": standing in: lanes urgent (for 2 s)")
    });
    submit(addr, "batch", 100, 1);
    submit(addr, "urgent", 20, 1);
    wait_until("the urgent job run", || !lanes_run(&shared).is_empty());

    // The batch job waits for the stand-in to lapse; the lapse ends its 5 s wait on urgent.
    wait_until("the batch job run", || lanes_run(&shared).len() >= 2);
    let lapsed = replaced.elapsed();
    assert_eq!(lanes_run(&shared), ["urgent", "batch"]);
    assert!(
        lapsed >= Duration::from_secs(2) && lapsed < Duration::from_secs(3),
        "batch taken {lapsed:?} after a 2 s stand-in on urgent began"
    );
    shared.wait_for_line("stand-in over", |l| {
        l.ends_with(": stand-in over: lanes urgent,batch again")
    });
    let gauges = metrics.gauges();
    assert!(gauges.contains("lanepool_worker_standing_in 0"), "{gauges}");
}

#[test]
fn a_stand_in_asked_during_a_drain_takes_its_lanes_in_their_order_once_the_drain_ends() {
    let (_queue, addr) = queue(0, "50..50", "1s");
    let (shared, metrics) = worker_with_metrics(addr, "shared", "urgent,batch", "jobs-shared-1");
    assert_eq!(metrics.post("/drain?seconds=60").0, 200);
    shared.wait_for_line("drain start", |l| l.ends_with(": draining: no new jobs"));
    let (status, gauges) = metrics.post("/stand-in?lanes=batch,urgent&seconds=30");
    assert_eq!(status, 200, "{gauges}");
    assert!(
        gauges.contains("lanepool_worker_standing_in 1")
            && gauges.contains("lanepool_worker_draining 1"),
        "{gauges}"
    );
    submit(addr, "urgent", 20, 2);
    submit(addr, "batch", 50, 2);
    std::thread::sleep(Duration::from_millis(300)); // a job taken while draining would show now
    assert!(lanes_run(&shared).is_empty(), "{:?}", shared.lines());

    let (_, gauges) = metrics.post("/drain?seconds=0");
    assert!(
        gauges.contains("lanepool_worker_draining 0")
            && gauges.contains("lanepool_worker_standing_in 1"),
        "{gauges}"
    );
    wait_until("all four jobs run", || lanes_run(&shared).len() >= 4);
    assert_eq!(lanes_run(&shared), ["batch", "batch", "urgent", "urgent"]);
}

#[test]
fn a_drain_ends_a_stand_in_and_calling_the_drain_off_brings_back_the_workers_own_lanes() {
    let (_queue, addr) = queue(0, "100..100", "1s");
    let (shared, metrics) = worker_with_metrics(addr, "shared", "urgent,batch", "jobs-shared-1");
    assert_eq!(metrics.post("/stand-in?lanes=batch&seconds=60").0, 200);
    shared.wait_for_line("stand-in start", |l| {
        l.ends_with(": standing in: lanes batch (for 60 s)")
    });
    let (status, gauges) = metrics.post("/drain?seconds=60");
    assert_eq!(status, 200, "{gauges}");
    assert!(
        gauges.contains("lanepool_worker_draining 1")
            && gauges.contains("lanepool_worker_standing_in 0"),
        "{gauges}"
    );
    shared.wait_for_line("stand-in over", |l| {
        l.ends_with(": stand-in over: lanes urgent,batch again")
    });
    submit(addr, "batch", 100, 1);
    submit(addr, "urgent", 20, 1);
    std::thread::sleep(Duration::from_millis(300)); // a job taken while draining would show now
    assert!(lanes_run(&shared).is_empty(), "{:?}", shared.lines());

    // Its own order, urgent first; the stand-in's (batch alone) would never take urgent.
    let gauges = metrics.post("/drain?seconds=0").1;
    assert!(
        gauges.contains("lanepool_worker_draining 0")
            && gauges.contains("lanepool_worker_standing_in 0"),
        "{gauges}"
    );
    wait_until("both jobs run", || lanes_run(&shared).len() >= 2);
    assert_eq!(lanes_run(&shared), ["urgent", "batch"]);
}

#[test]
fn a_malformed_stand_in_request_is_refused_naming_what_is_wrong_and_changes_nothing() {
    let (_queue, addr) = queue(0, "100..100", "1s");
    let (shared, metrics) = worker_with_metrics(addr, "shared", "urgent,batch", "jobs-shared-1");
    assert_eq!(metrics.post("/stand-in?lanes=batch&seconds=60").0, 200);
    shared.wait_for_line("stand-in start", |l| l.contains(": standing in: "));

    let seventeen: Vec<String> = (1..=17).map(|i| format!("lane-{i}")).collect();
    let seventeen = seventeen.join(",");
    let too_long = "a".repeat(64);
    let cases: Vec<(String, &str)> = vec![
        ("/stand-in".into(), "seconds is missing"),
        ("/stand-in?lanes=urgent".into(), "seconds is missing"),
        ("/stand-in?lanes=urgent&seconds=".into(), "seconds=\"\""),
        (
            "/stand-in?lanes=urgent&seconds=3601".into(),
            "seconds=\"3601\"",
        ),
        ("/stand-in?lanes=urgent&seconds=-1".into(), "seconds=\"-1\""),
        (
            "/stand-in?lanes=urgent&seconds=1.5".into(),
            "seconds=\"1.5\"",
        ),
        ("/stand-in?seconds=30".into(), "lanes is missing"),
        ("/stand-in?lanes=&seconds=30".into(), "lane \"\""),
        (
            "/stand-in?lanes=Urgent&seconds=30".into(),
            "lane \"Urgent\"",
        ),
        (
            "/stand-in?lanes=-urgent&seconds=30".into(),
            "lane \"-urgent\"",
        ),
        (
            "/stand-in?lanes=urgent-&seconds=30".into(),
            "lane \"urgent-\"",
        ),
        (
            "/stand-in?lanes=urgent,,batch&seconds=30".into(),
            "lane \"\"",
        ),
        (format!("/stand-in?lanes={too_long}&seconds=30"), &too_long),
        (
            format!("/stand-in?lanes={seventeen}&seconds=30"),
            "17 lanes",
        ),
        (
            "/stand-in?lanes=urgent,batch,urgent&seconds=30".into(),
            "lane \"urgent\" is named twice",
        ),
        ("/stand-in?lanes=Urgent&seconds=0".into(), "lane \"Urgent\""),
        (
            "/stand-in?lanes=urgent&seconds=30&seconds=0".into(),
            "seconds is given twice",
        ),
        ("/stand-in?lane=urgent&seconds=30".into(), "\"lane\""),
        // What is wrong with a request comes before whose lanes it names.
        (
            "/stand-in?lanes=elsewhere&seconds=3601".into(),
            "seconds=\"3601\"",
        ),
    ];
    for (path, named) in &cases {
        let (status, body) = metrics.post(path);
        assert_eq!(status, 400, "{path}: {body}");
        assert!(
            body.ends_with('\n') && body.lines().count() == 1 && body.contains(named),
            "{path}: not one line naming {named:?}: {body:?}"
        );
    }
    let (status, help) = metrics.post("/stand-ins?lanes=urgent&seconds=30");
    assert_eq!(status, 404, "{help}");
    assert!(
        help.contains("POST /stand-in?lanes=L1,L2&seconds=N") && help.contains("POST /drain"),
        "{help}"
    );

    // Still standing in for batch alone, as first asked: urgent waits.
    let gauges = metrics.gauges();
    assert!(gauges.contains("lanepool_worker_standing_in 1"), "{gauges}");
    submit(addr, "urgent", 20, 1);
    submit(addr, "batch", 100, 1);
    shared.wait_for_line("the batch job run", |l| l.contains(": batch job "));
    std::thread::sleep(Duration::from_millis(300)); // an urgent job taken by mistake would show now
    assert_eq!(lanes_run(&shared), ["batch"]);
    assert_eq!(metric(addr, "lanepool_queue_depth", "urgent"), 1.0);
    let stand_in_lines: Vec<String> = shared
        .lines()
        .into_iter()
        .filter(|l| l.contains("standing in") || l.contains("stand-in over"))
        .collect();
    assert_eq!(
        stand_in_lines,
        ["jobs-shared-1: standing in: lanes batch (for 60 s)"]
    );
}

#[test]
fn the_longest_stand_in_request_and_form_encoded_commas_are_understood() {
    let (_queue, addr) = queue(0, "100..100", "1s");
    // 16 lanes of its own, the 14 after urgent and batch as long as a lane in LANEPOOL_LANES may be
    // (40 bytes): a stand-in may name all of them.
    let long: Vec<String> = (0..14)
        .map(|i| format!("{}{i:02}", "l".repeat(38)))
        .collect();
    let own = format!("urgent,batch,{}", long.join(","));
    let (shared, metrics) = worker_with_metrics(addr, "shared", &own, "jobs-shared-1");
    let last_first: Vec<&str> = own.split(',').rev().collect();
    let last_first = last_first.join(",");
    let (status, gauges) = metrics.post(&format!("/stand-in?lanes={last_first}&seconds=3600"));
    assert_eq!(status, 200, "{gauges}");
    assert!(gauges.contains("lanepool_worker_standing_in 1"), "{gauges}");
    let started = format!(": standing in: lanes {last_first} (for 3600 s)");
    shared.wait_for_line("the long stand-in", |l| l.ends_with(&started));

    // 16 lanes of 63 bytes: a request line longer than 1 KiB, read whole (one cut short is a
    // 400) and refused for its first lane, which is not this worker's.
    let foreign: Vec<String> = (0..16)
        .map(|i| format!("{}{i:02}", "l".repeat(61)))
        .collect();
    let (status, body) = metrics.post(&format!(
        "/stand-in?lanes={}&seconds=3600",
        foreign.join(",")
    ));
    assert_eq!(status, 403, "{body}");
    assert!(body.contains(&format!("lane {:?}", foreign[0])), "{body}");

    // reqwest's `.query()` sends a comma as %2C.
    let (status, gauges) = metrics.post("/stand-in?lanes=batch%2Curgent&seconds=30");
    assert_eq!(status, 200, "{gauges}");
    shared.wait_for_line("the encoded stand-in", |l| {
        l.ends_with(": standing in: lanes batch,urgent (for 30 s)")
    });
    submit(addr, "batch", 100, 1);
    shared.wait_for_line("the batch job run", |l| l.contains(": batch job "));
}

#[test]
fn a_missing_or_malformed_variable_is_refused_by_name() {
    let good = [
        ("LANEPOOL_LANES", "urgent,batch"),
        ("LANEPOOL_ROLE", "shared"),
        ("LANEPOOL_POOL", "jobs"),
        ("LANEPOOL_QUEUE_URL", "http://127.0.0.1:9"),
    ];
    let cases: [(&str, Option<&str>); 7] = [
        ("LANEPOOL_LANES", None),
        ("LANEPOOL_LANES", Some("urgent,,batch")),
        ("LANEPOOL_LANES", Some("Urgent")),
        ("LANEPOOL_ROLE", Some("dedicated")),
        ("LANEPOOL_POOL", None),
        ("LANEPOOL_QUEUE_URL", None),
        ("LANEPOOL_QUEUE_URL", Some("127.0.0.1:9464")),
    ];
    for (name, value) in cases {
        let mut command = Command::new(example("lane_worker"));
        command.env_clear();
        for (var, good_value) in good {
            if var != name {
                command.env(var, good_value);
            }
        }
        if let Some(value) = value {
            command.env(name, value);
        }
        let output = command.output().expect("running lane_worker");
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert_eq!(output.status.code(), Some(2), "{name}={value:?}: {stderr}");
        assert!(
            stderr.contains(name),
            "{name}={value:?} not named: {stderr}"
        );
    }
    // A reserved worker takes exactly its lane.
    let output = Command::new(example("lane_worker"))
        .env_clear()
        .envs(good)
        .env("LANEPOOL_ROLE", "reserved")
        .output()
        .expect("running lane_worker");
    assert_eq!(output.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&output.stderr).contains("LANEPOOL_ROLE=reserved"));
}

#[test]
fn a_post_without_the_pools_credential_gets_401_whatever_it_asks_and_changes_nothing() {
    let (_queue, addr) = queue(0, "100..100", "1s");
    let (shared, metrics) = worker_with_metrics(addr, "shared", "urgent,batch", "jobs-shared-1");
    // Each would be followed (or refused as a bad request) with the right credential.
    let paths = [
        "/drain?seconds=60",
        "/stand-in?lanes=batch&seconds=60",
        "/drain",
        "/stand-in?lanes=Batch&seconds=60",
        "/stand-in?lanes=elsewhere&seconds=60",
        "/nowhere",
    ];
    let last_differs = format!("Authorization: Bearer {}0", &TOKEN[..63]);
    let prefix = format!("Authorization: Bearer {}", &TOKEN[..63]);
    let longer = format!("Authorization: Bearer {TOKEN}0");
    let basic_with_the_token = format!("Authorization: Basic {TOKEN}");
    let no_scheme = format!("Authorization: {TOKEN}");
    let another_header = format!("X-Authorization: Bearer {TOKEN}");
    let right = format!("Authorization: Bearer {TOKEN}");
    let credentials: [&[&str]; 10] = [
        &[],
        &[&last_differs],
        &[&prefix],
        &[&longer],
        &[&basic_with_the_token],
        &["Authorization: Basic bGFuZXBvb2w6c2VjcmV0"],
        &["Authorization: Bearer"],
        &[&no_scheme],
        &[&another_header],
        // Which of two to believe? Neither.
        &[&last_differs, &right],
    ];
    let mut bodies = std::collections::BTreeSet::new();
    for path in paths {
        for headers in credentials {
            let answer = send(metrics.addr, "POST", path, headers);
            assert_unauthenticated(&answer, &format!("{path} with {headers:?}"));
            assert!(
                answer.body.ends_with('\n') && answer.body.lines().count() == 1,
                "{path} with {headers:?}: not one line: {:?}",
                answer.body
            );
            bodies.insert(answer.body);
        }
    }
    assert_eq!(bodies.len(), 1, "a 401 says why: {bodies:?}");

    // Nothing changed: no drain, no stand-in for batch (urgent jobs are still taken).
    let gauges = metrics.gauges();
    assert!(
        gauges.contains("lanepool_worker_draining 0")
            && gauges.contains("lanepool_worker_standing_in 0"),
        "{gauges}"
    );
    submit(addr, "urgent", 20, 2);
    wait_until("two urgent jobs run", || lanes_run(&shared).len() >= 2);
    assert_eq!(lanes_run(&shared), ["urgent"; 2]);
    assert!(
        !shared
            .lines()
            .iter()
            .any(|l| l.contains("draining") || l.contains("standing in")),
        "{:?}",
        shared.lines()
    );

    // The right token is followed, whatever the header name's case.
    let lowercase = format!("authorization: Bearer {TOKEN}");
    let answer = send(metrics.addr, "POST", "/drain?seconds=60", &[&lowercase]);
    assert_eq!(answer.status, 200, "{}", answer.body);
    assert!(
        answer.body.contains("lanepool_worker_draining 1"),
        "{}",
        answer.body
    );
    let uppercase = format!("AUTHORIZATION: Bearer {TOKEN}");
    let answer = send(metrics.addr, "POST", "/drain?seconds=0", &[&uppercase]);
    assert_eq!(answer.status, 200, "{}", answer.body);
    assert!(
        answer.body.contains("lanepool_worker_draining 0"),
        "{}",
        answer.body
    );
}

#[test]
fn a_worker_without_the_credential_variable_refuses_every_post_says_so_once_and_keeps_working() {
    let (_queue, addr) = queue(0, "100..100", "1s");
    let (shared, metrics) = worker_serving(addr, "shared", "urgent,batch", "jobs-shared-1", None);
    let refused = "jobs-shared-1: LANEPOOL_CREDENTIAL_FILE is not set: drain and stand-in \
                   requests are refused (no credential)";
    shared.wait_for_line("the refusal said at start", |l| l == refused);
    let bearer = format!("Authorization: Bearer {TOKEN}");
    for (path, headers) in [
        ("/drain?seconds=60", &[bearer.as_str()][..]),
        ("/stand-in?lanes=batch&seconds=60", &[bearer.as_str()]),
        ("/drain?seconds=60", &["Authorization: Bearer"]),
        ("/drain?seconds=60", &[]),
    ] {
        let answer = send(metrics, "POST", path, headers);
        assert_unauthenticated(&answer, &format!("{path} with {headers:?}"));
    }
    let (status, gauges) = http(metrics, "GET", "/metrics");
    assert_eq!(status, 200, "{gauges}");
    assert!(
        gauges.contains("lanepool_worker_credential_required 1")
            && gauges.contains("lanepool_worker_draining 0")
            && gauges.contains("lanepool_worker_standing_in 0"),
        "{gauges}"
    );
    submit(addr, "urgent", 20, 1);
    submit(addr, "batch", 20, 1);
    wait_until("both jobs run", || lanes_run(&shared).len() >= 2);
    assert_eq!(lanes_run(&shared), ["urgent", "batch"]);
    let said = shared.lines().iter().filter(|l| *l == refused).count();
    assert_eq!(said, 1, "{:?}", shared.lines());
}

#[test]
fn a_missing_empty_or_unreadable_credential_file_refuses_every_post_until_it_holds_the_token() {
    let (_queue, addr) = queue(0, "100..100", "1s");
    let credential = Credential::not_yet_written();
    let (shared, metrics) = worker_serving(
        addr,
        "shared",
        "urgent,batch",
        "jobs-shared-1",
        Some(&credential.file()),
    );
    let bearer = format!("Authorization: Bearer {TOKEN}");
    let drain = |headers: &[&str]| send(metrics, "POST", "/drain?seconds=60", headers);

    let answer = drain(&[&bearer]);
    assert_eq!(answer.status, 401, "no file: {}", answer.body);
    for empty in ["", "\n", " \t\n"] {
        credential.rewrite(empty);
        for headers in [&[bearer.as_str()][..], &["Authorization: Bearer"], &[]] {
            let answer = drain(headers);
            assert_eq!(
                answer.status, 401,
                "file {empty:?}, {headers:?}: {}",
                answer.body
            );
        }
    }
    // A file that cannot be read (here a directory: root reads any file).
    std::fs::remove_file(credential.file()).unwrap();
    std::fs::create_dir(credential.file()).unwrap();
    let answer = drain(&[&bearer]);
    assert_eq!(answer.status, 401, "unreadable: {}", answer.body);
    assert!(
        !shared.lines().iter().any(|l| l.contains("draining")),
        "{:?}",
        shared.lines()
    );

    // The file is read at each request: once it holds the token, the token is followed.
    std::fs::remove_dir(credential.file()).unwrap();
    credential.rewrite(TOKEN);
    let answer = drain(&[&bearer]);
    assert_eq!(answer.status, 200, "{}", answer.body);
    assert!(
        answer.body.contains("lanepool_worker_draining 1"),
        "{}",
        answer.body
    );
    shared.wait_for_line("drain start", |l| l.ends_with(": draining: no new jobs"));
}

#[test]
fn a_rotated_credential_is_followed_at_the_next_post_and_the_old_one_is_refused() {
    let (_queue, addr) = queue(0, "100..100", "1s");
    let (_shared, metrics) = worker_with_metrics(addr, "shared", "urgent,batch", "jobs-shared-1");
    assert_eq!(metrics.post("/drain?seconds=0").0, 200);
    let old = format!("Authorization: Bearer {TOKEN}");
    let new = format!("Authorization: Bearer {ROTATED}");

    // Rewritten in place, as by hand.
    metrics.credential.rewrite(&format!("{ROTATED}\n"));
    let answer = send(metrics.addr, "POST", "/drain?seconds=60", &[&new]);
    assert_eq!(answer.status, 200, "{}", answer.body);
    assert!(
        answer.body.contains("lanepool_worker_draining 1"),
        "{}",
        answer.body
    );
    let answer = send(metrics.addr, "POST", "/drain?seconds=0", &[&old]);
    assert_eq!(answer.status, 401, "{}", answer.body);
    assert!(
        metrics.gauges().contains("lanepool_worker_draining 1"),
        "the old token ended the drain"
    );

    // Replaced by a rename, as the kubelet swaps a Secret volume's files.
    let next = metrics.credential.dir.join("token.next");
    std::fs::write(&next, TOKEN).unwrap();
    std::fs::rename(&next, metrics.credential.file()).unwrap();
    let answer = send(metrics.addr, "POST", "/drain?seconds=0", &[&new]);
    assert_eq!(answer.status, 401, "{}", answer.body);
    let (status, gauges) = metrics.post("/drain?seconds=0");
    assert_eq!(status, 200, "{gauges}");
    assert!(gauges.contains("lanepool_worker_draining 0"), "{gauges}");
}

#[test]
fn a_stand_in_naming_a_lane_not_its_own_gets_403_naming_it_and_changes_nothing() {
    let (_queue, addr) = queue(0, "100..100", "1s");
    let (reserved, metrics) =
        worker_with_metrics(addr, "reserved", "urgent", "jobs-urgent-reserved-1");
    for path in [
        "/stand-in?lanes=batch&seconds=30",
        "/stand-in?lanes=urgent,batch&seconds=30",
        "/stand-in?lanes=batch%2Curgent&seconds=30",
        "/stand-in?lanes=batch&seconds=0",
    ] {
        let (status, body) = metrics.post(path);
        assert_eq!(status, 403, "{path}: {body}");
        assert!(
            body.ends_with('\n') && body.lines().count() == 1 && body.contains("\"batch\""),
            "{path}: not one line naming \"batch\": {body:?}"
        );
    }
    // The syntax is checked first.
    let (status, body) = metrics.post("/stand-in?lanes=batch&seconds=3601");
    assert_eq!(status, 400, "{body}");

    assert!(metrics.gauges().contains("lanepool_worker_standing_in 0"));
    submit(addr, "batch", 100, 1);
    submit(addr, "urgent", 20, 1);
    wait_until("the urgent job run", || !lanes_run(&reserved).is_empty());
    std::thread::sleep(Duration::from_millis(300)); // a batch job taken by mistake would show now
    assert_eq!(lanes_run(&reserved), ["urgent"]);
    assert_eq!(metric(addr, "lanepool_queue_depth", "batch"), 1.0);
    assert!(
        !reserved.lines().iter().any(|l| l.contains("standing in")),
        "{:?}",
        reserved.lines()
    );

    // Its own lane is fine.
    let (status, gauges) = metrics.post("/stand-in?lanes=urgent&seconds=30");
    assert_eq!(status, 200, "{gauges}");
    assert!(gauges.contains("lanepool_worker_standing_in 1"), "{gauges}");
}

#[test]
fn the_metrics_stay_open_say_that_the_credential_is_required_and_never_show_the_token() {
    let (_queue, addr) = queue(0, "100..100", "1s");
    let (shared, metrics) = worker_with_metrics(addr, "shared", "urgent,batch", "jobs-shared-1");
    let (status, gauges) = http(metrics.addr, "GET", "/metrics");
    assert_eq!(status, 200, "{gauges}");
    let lines: Vec<&str> = gauges.lines().collect();
    assert!(
        lines.contains(&"# TYPE lanepool_worker_credential_required gauge")
            && lines.contains(&"lanepool_worker_credential_required 1"),
        "{gauges}"
    );
    // A GET steers nothing, whatever it carries.
    let wrong = format!("Authorization: Bearer {ROTATED}");
    let answer = send(metrics.addr, "GET", "/drain?seconds=60", &[&wrong]);
    assert_eq!(answer.status, 200, "{}", answer.body);
    assert!(
        answer.body.contains("lanepool_worker_draining 0"),
        "{}",
        answer.body
    );

    let (_, followed) = metrics.post("/drain?seconds=0");
    let refused = send(metrics.addr, "POST", "/drain?seconds=0", &[&wrong]);
    for (what, text) in [
        ("GET /metrics", gauges),
        ("an answer to a drain", followed),
        ("a 401's head", refused.head),
        ("a 401's body", refused.body),
        ("the log", shared.lines().join("\n")),
    ] {
        assert!(!text.contains(TOKEN), "{what} shows the token: {text}");
    }
}

/// Whether the worker closed `stream` without a byte of answer. Past the cap it does so at once;
/// a connection within the cap is answered (400, after its head deadline) or still open.
fn closed_unanswered(stream: &TcpStream) -> bool {
    stream.set_nonblocking(true).unwrap();
    match stream.peek(&mut [0u8; 1]) {
        Ok(n) => n == 0,
        Err(e) => e.kind() != std::io::ErrorKind::WouldBlock,
    }
}

#[test]
fn connections_past_the_cap_are_closed_at_once_and_the_operator_is_answered_once_they_end() {
    let (_queue, addr) = queue(0, "100..100", "1s");
    let (shared, metrics) = worker_with_metrics(addr, "shared", "urgent,batch", "jobs-shared-1");
    let flood: Vec<TcpStream> = (0..100)
        .map(|_| TcpStream::connect(metrics.addr).expect("connecting"))
        .collect();
    // The operator's drain, behind the flood: past the cap too, so closed unread.
    let (status, body) = metrics.post("/drain?seconds=60");
    assert_eq!(status, 0, "answered past the cap: {body}");

    wait_until("the connections past the cap closed", || {
        flood.iter().filter(|s| closed_unanswered(s)).count() >= 36
    });
    std::thread::sleep(Duration::from_millis(100)); // one more closed would show now
    let closed = flood.iter().filter(|s| closed_unanswered(s)).count();
    assert_eq!(closed, 100 - 64, "of 100 idle connections, not 64 kept");

    // Once the flood ends its connections' slots are free: the drain is answered.
    drop(flood);
    let mut answer = (0, String::new());
    let answered = poll_blocking(Duration::from_secs(10), Duration::from_millis(20), || {
        answer = metrics.post("/drain?seconds=60");
        answer.0 != 0
    });
    assert!(answered.is_some(), "no answer to the drain after the flood");
    assert_eq!(answer.0, 200, "{}", answer.1);
    assert!(
        answer.1.contains("lanepool_worker_draining 1"),
        "{}",
        answer.1
    );
    shared.wait_for_line("drain start", |l| l.ends_with(": draining: no new jobs"));
    assert_eq!(metrics.post("/drain?seconds=0").0, 200);
    submit(addr, "urgent", 20, 1);
    wait_until("the urgent job run", || !lanes_run(&shared).is_empty());
}

/// The CPU time `pid` has used, in clock ticks.
fn cpu_ticks(pid: u32) -> u64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).expect("the worker's stat");
    // utime and stime: fields 14 and 15, counted from the state after the command's ')'.
    let fields: Vec<&str> = stat
        .rsplit_once(')')
        .map_or("", |(_, rest)| rest)
        .split_whitespace()
        .collect();
    fields[11].parse::<u64>().unwrap() + fields[12].parse::<u64>().unwrap()
}

#[test]
fn a_worker_out_of_file_descriptors_backs_off_instead_of_spinning_and_answers_once_they_free() {
    const DESCRIPTORS: usize = 24;
    let (_queue, addr) = queue(0, "100..100", "1s");
    let credential = Credential::holding(TOKEN);
    let metrics = free_port();
    let mut command = Command::new("/bin/sh");
    command
        .arg("-c")
        .arg(format!("ulimit -n {DESCRIPTORS} && exec \"$0\""))
        .arg(example("lane_worker"));
    worker_env(
        &mut command,
        addr,
        "shared",
        "urgent,batch",
        "jobs-shared-1",
    );
    command
        .env("LANEPOOL_METRICS_ADDR", metrics.to_string())
        .env("LANEPOOL_CREDENTIAL_FILE", credential.file());
    let shared = Running::start(command);
    shared.wait_for_line("start line", |l| l.contains("shared worker of pool jobs"));
    let pid = shared.child.id();

    let flood: Vec<TcpStream> = (0..2 * DESCRIPTORS)
        .map(|_| TcpStream::connect(metrics).expect("connecting"))
        .collect();
    std::thread::sleep(Duration::from_millis(300));
    // Every descriptor below the limit in use (one inherited above it does not count).
    let below_the_limit = std::fs::read_dir(format!("/proc/{pid}/fd"))
        .unwrap()
        .filter_map(|entry| entry.ok()?.file_name().to_str()?.parse::<usize>().ok())
        .filter(|fd| *fd < DESCRIPTORS)
        .count();
    assert_eq!(
        below_the_limit, DESCRIPTORS,
        "the worker is not out of descriptors"
    );
    let before = cpu_ticks(pid);
    std::thread::sleep(Duration::from_secs(1));
    let used = cpu_ticks(pid) - before;
    let per_second: u64 = Command::new("getconf")
        .arg("CLK_TCK")
        .output()
        .ok()
        .and_then(|o| String::from_utf8_lossy(&o.stdout).trim().parse().ok())
        .unwrap_or(100);
    assert!(
        used * 5 < per_second,
        "the worker used {used} of {per_second} ticks in a second failing to accept: it spins"
    );

    drop(flood);
    let bearer = format!("Authorization: Bearer {TOKEN}");
    let mut answer = Answer {
        status: 0,
        head: String::new(),
        body: String::new(),
    };
    let answered = poll_blocking(Duration::from_secs(10), Duration::from_millis(20), || {
        answer = send(metrics, "POST", "/drain?seconds=60", &[&bearer]);
        answer.status == 200
    });
    assert!(
        answered.is_some(),
        "no drain followed after the flood: {} {}",
        answer.status,
        answer.body
    );
    shared.wait_for_line("drain start", |l| l.ends_with(": draining: no new jobs"));
}
