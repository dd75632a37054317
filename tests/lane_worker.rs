//! The example lane worker (`examples/lane_worker.rs`) against the example queue
//! (`examples/lane_queue`), both as real processes: a shared worker takes urgent jobs before
//! batch ones, a reserved worker never takes batch, SIGTERM lets a job finish, a killed worker's
//! job goes back to its lane, a drained worker finishes its job and takes no new one until its
//! drain ends, a worker asked to stand in takes the lanes asked for (in their order, waking from
//! its wait) until the stand-in ends, lapses or a drain ends it, a malformed stand-in is refused
//! naming what is wrong, and a bad environment is refused naming the variable.

mod common;

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::process::{Child, Command, ExitStatus, Stdio};
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

fn worker(addr: SocketAddr, role: &str, lanes: &str, name: &str) -> Running {
    let mut command = Command::new(example("lane_worker"));
    command
        .env_clear()
        .env("LANEPOOL_LANES", lanes)
        .env("LANEPOOL_ROLE", role)
        .env("LANEPOOL_POOL", "jobs")
        .env("LANEPOOL_QUEUE_URL", format!("http://{addr}"))
        .env("HOSTNAME", name);
    Running::start(command)
}

/// A worker that serves its gauges and takes the operator's requests at a free loopback port.
fn worker_with_metrics(
    addr: SocketAddr,
    role: &str,
    lanes: &str,
    name: &str,
) -> (Running, SocketAddr) {
    let metrics: SocketAddr = {
        let probe = std::net::TcpListener::bind("127.0.0.1:0").expect("a free port");
        probe.local_addr().unwrap()
    };
    let mut command = Command::new(example("lane_worker"));
    command
        .env_clear()
        .env("LANEPOOL_LANES", lanes)
        .env("LANEPOOL_ROLE", role)
        .env("LANEPOOL_POOL", "jobs")
        .env("LANEPOOL_QUEUE_URL", format!("http://{addr}"))
        .env("LANEPOOL_METRICS_ADDR", metrics.to_string())
        .env("HOSTNAME", name);
    let worker = Running::start(command);
    let started = format!("{role} worker of pool jobs");
    worker.wait_for_line("start line", |l| l.contains(&started));
    (worker, metrics)
}

fn http(addr: SocketAddr, method: &str, path: &str) -> (u16, String) {
    let mut stream = TcpStream::connect(addr).expect("connecting to the queue");
    write!(
        stream,
        "{method} {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n"
    )
    .unwrap();
    let mut response = String::new();
    stream.read_to_string(&mut response).unwrap();
    let status = response
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or(0);
    let body = response
        .split_once("\r\n\r\n")
        .map_or(String::new(), |(_, b)| b.to_string());
    (status, body)
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
        assert_eq!(
            http(metrics, "POST", requests[asked % requests.len()]).0,
            200
        );
        asked += 1;
        std::thread::sleep(Duration::from_millis(2));
    }
    producer.join().unwrap();
    http(metrics, "POST", "/drain?seconds=0");
    http(metrics, "POST", "/stand-in?seconds=0");
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
    let (status, gauges) = http(metrics, "POST", "/drain?seconds=3");
    assert_eq!(status, 200, "{gauges}");
    assert!(gauges.contains("lanepool_worker_draining 1"), "{gauges}");
    assert!(
        gauges.contains("lanepool_worker_busy{lane=\"batch\"} 1"),
        "{gauges}"
    );
    // The job in hand ends; no other starts while the drain lasts.
    wait_for_metric(addr, "lanepool_jobs_completed_total", "batch", 1.0);
    std::thread::sleep(Duration::from_secs(2).saturating_sub(asked.elapsed()));
    let (_, gauges) = http(metrics, "GET", "/metrics");
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
    assert_eq!(http(metrics, "POST", "/drain?seconds=60").0, 200);
    std::thread::sleep(Duration::from_millis(300));
    let (_, gauges) = http(metrics, "POST", "/drain?seconds=0");
    assert!(gauges.contains("lanepool_worker_draining 0"), "{gauges}");
    let resumed = Instant::now();
    wait_for_metric(addr, "lanepool_job_wait_seconds_count", "batch", 3.0);
    assert!(resumed.elapsed() < Duration::from_secs(2));

    // Anything else is refused: an old operator or a typo never stops a worker by mistake.
    assert_eq!(http(metrics, "POST", "/drain?seconds=-1").0, 400);
    assert_eq!(http(metrics, "POST", "/drain").0, 400);
    assert_eq!(http(metrics, "POST", "/other").0, 404);
    let (_, gauges) = http(metrics, "GET", "/metrics");
    assert!(gauges.contains("lanepool_worker_draining 0"), "{gauges}");
}

#[test]
fn a_reserved_worker_standing_in_takes_the_lanes_asked_for_until_the_stand_in_is_called_off() {
    let (_queue, addr) = queue(50, "100..100", "1s");
    let (reserved, metrics) =
        worker_with_metrics(addr, "reserved", "urgent", "jobs-urgent-reserved-1");
    let (status, gauges) = http(metrics, "POST", "/stand-in?lanes=urgent,batch&seconds=30");
    assert_eq!(status, 200, "{gauges}");
    assert!(gauges.contains("lanepool_worker_standing_in 1"), "{gauges}");
    reserved.wait_for_line("stand-in start", |l| {
        l.ends_with(": standing in: lanes urgent,batch (for 30 s)")
    });
    wait_until("two batch jobs run by the reserved worker", || {
        lanes_run(&reserved)
            .iter()
            .filter(|l| *l == "batch")
            .count()
            >= 2
    });

    // seconds=0: its own lane again once the job in hand is done.
    let (status, gauges) = http(metrics, "POST", "/stand-in?seconds=0");
    assert_eq!(status, 200, "{gauges}");
    assert!(gauges.contains("lanepool_worker_standing_in 0"), "{gauges}");
    let over = ": stand-in over: lanes urgent again";
    reserved.wait_for_line("stand-in over", |l| l.ends_with(over));
    let batch_left = metric(addr, "lanepool_queue_depth", "batch");
    assert!(batch_left > 0.0, "the backlog ran out during the stand-in");
    submit(addr, "urgent", 20, 3);
    wait_until("three urgent jobs run after the stand-in", || {
        lanes_run_after(&reserved, over).len() >= 3
    });
    std::thread::sleep(Duration::from_millis(300)); // a batch job taken by mistake would show now
    assert_eq!(lanes_run_after(&reserved, over), ["urgent"; 3]);
    assert_eq!(metric(addr, "lanepool_queue_depth", "batch"), batch_left);
}

#[test]
fn a_shared_worker_standing_in_takes_only_urgent_and_batch_again_at_once_when_it_ends() {
    let (_queue, addr) = queue(0, "100..100", "5s");
    let (shared, metrics) = worker_with_metrics(addr, "shared", "urgent,batch", "jobs-shared-1");
    let (status, gauges) = http(metrics, "POST", "/stand-in?lanes=urgent&seconds=30");
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
    let (status, gauges) = http(metrics, "POST", "/stand-in?seconds=0");
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
    let (_queue, addr) = queue(1, "100..100", "5s");
    let (reserved, metrics) =
        worker_with_metrics(addr, "reserved", "urgent", "jobs-urgent-reserved-1");
    std::thread::sleep(Duration::from_millis(300)); // inside its 5 s long poll on urgent
    let asked = Instant::now();
    let (status, gauges) = http(metrics, "POST", "/stand-in?lanes=batch&seconds=30");
    assert_eq!(status, 200, "{gauges}");
    reserved.wait_for_line("the batch job run", |l| l.contains(": batch job 1 done"));
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
    assert_eq!(
        http(metrics, "POST", "/stand-in?lanes=batch&seconds=60").0,
        200
    );
    shared.wait_for_line("first stand-in", |l| {
        l.ends_with(": standing in: lanes batch (for 60 s)")
    });
    let replaced = Instant::now();
    let (status, gauges) = http(metrics, "POST", "/stand-in?lanes=urgent&seconds=2");
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
    let (_, gauges) = http(metrics, "GET", "/metrics");
    assert!(gauges.contains("lanepool_worker_standing_in 0"), "{gauges}");
}

#[test]
fn a_stand_in_asked_during_a_drain_takes_its_lanes_in_their_order_once_the_drain_ends() {
    let (_queue, addr) = queue(0, "50..50", "1s");
    let (shared, metrics) = worker_with_metrics(addr, "shared", "urgent,batch", "jobs-shared-1");
    assert_eq!(http(metrics, "POST", "/drain?seconds=60").0, 200);
    shared.wait_for_line("drain start", |l| l.ends_with(": draining: no new jobs"));
    let (status, gauges) = http(metrics, "POST", "/stand-in?lanes=batch,urgent&seconds=30");
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

    let (_, gauges) = http(metrics, "POST", "/drain?seconds=0");
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
    let (reserved, metrics) =
        worker_with_metrics(addr, "reserved", "urgent", "jobs-urgent-reserved-1");
    assert_eq!(
        http(metrics, "POST", "/stand-in?lanes=batch&seconds=60").0,
        200
    );
    reserved.wait_for_line("stand-in start", |l| {
        l.ends_with(": standing in: lanes batch (for 60 s)")
    });
    let (status, gauges) = http(metrics, "POST", "/drain?seconds=60");
    assert_eq!(status, 200, "{gauges}");
    assert!(
        gauges.contains("lanepool_worker_draining 1")
            && gauges.contains("lanepool_worker_standing_in 0"),
        "{gauges}"
    );
    reserved.wait_for_line("stand-in over", |l| {
        l.ends_with(": stand-in over: lanes urgent again")
    });

    let (_, gauges) = http(metrics, "POST", "/drain?seconds=0");
    assert!(
        gauges.contains("lanepool_worker_draining 0")
            && gauges.contains("lanepool_worker_standing_in 0"),
        "{gauges}"
    );
    submit(addr, "batch", 100, 1);
    submit(addr, "urgent", 20, 1);
    wait_until("the urgent job run", || !lanes_run(&reserved).is_empty());
    std::thread::sleep(Duration::from_millis(300)); // a batch job taken by mistake would show now
    assert_eq!(lanes_run(&reserved), ["urgent"]);
    assert_eq!(metric(addr, "lanepool_queue_depth", "batch"), 1.0);
}

#[test]
fn a_malformed_stand_in_request_is_refused_naming_what_is_wrong_and_changes_nothing() {
    let (_queue, addr) = queue(0, "100..100", "1s");
    let (reserved, metrics) =
        worker_with_metrics(addr, "reserved", "urgent", "jobs-urgent-reserved-1");
    assert_eq!(
        http(metrics, "POST", "/stand-in?lanes=batch&seconds=60").0,
        200
    );
    reserved.wait_for_line("stand-in start", |l| l.contains(": standing in: "));

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
    ];
    for (path, named) in &cases {
        let (status, body) = http(metrics, "POST", path);
        assert_eq!(status, 400, "{path}: {body}");
        assert!(
            body.ends_with('\n') && body.lines().count() == 1 && body.contains(named),
            "{path}: not one line naming {named:?}: {body:?}"
        );
    }
    let (status, help) = http(metrics, "POST", "/stand-ins?lanes=urgent&seconds=30");
    assert_eq!(status, 404, "{help}");
    assert!(
        help.contains("POST /stand-in?lanes=L1,L2&seconds=N") && help.contains("POST /drain"),
        "{help}"
    );

    // Still standing in for batch, as first asked.
    let (_, gauges) = http(metrics, "GET", "/metrics");
    assert!(gauges.contains("lanepool_worker_standing_in 1"), "{gauges}");
    submit(addr, "batch", 100, 1);
    reserved.wait_for_line("the batch job run", |l| l.contains(": batch job "));
    let stand_in_lines: Vec<String> = reserved
        .lines()
        .into_iter()
        .filter(|l| l.contains("standing in") || l.contains("stand-in over"))
        .collect();
    assert_eq!(
        stand_in_lines,
        ["jobs-urgent-reserved-1: standing in: lanes batch (for 60 s)"]
    );
}

#[test]
fn the_longest_stand_in_request_and_form_encoded_commas_are_understood() {
    let (_queue, addr) = queue(0, "100..100", "1s");
    let (reserved, metrics) =
        worker_with_metrics(addr, "reserved", "urgent", "jobs-urgent-reserved-1");
    // 16 lanes of 63 bytes: a request line longer than 1 KiB.
    let lanes: Vec<String> = (0..16)
        .map(|i| format!("{}{i:02}", "l".repeat(61)))
        .collect();
    let lanes = lanes.join(",");
    let (status, gauges) = http(
        metrics,
        "POST",
        &format!("/stand-in?lanes={lanes}&seconds=3600"),
    );
    assert_eq!(status, 200, "{gauges}");
    assert!(gauges.contains("lanepool_worker_standing_in 1"), "{gauges}");
    let started = format!(": standing in: lanes {lanes} (for 3600 s)");
    reserved.wait_for_line("the long stand-in", |l| l.ends_with(&started));

    // reqwest's `.query()` sends a comma as %2C.
    let (status, gauges) = http(metrics, "POST", "/stand-in?lanes=batch%2Curgent&seconds=30");
    assert_eq!(status, 200, "{gauges}");
    reserved.wait_for_line("the encoded stand-in", |l| {
        l.ends_with(": standing in: lanes batch,urgent (for 30 s)")
    });
    submit(addr, "batch", 100, 1);
    reserved.wait_for_line("the batch job run", |l| l.contains(": batch job "));
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
