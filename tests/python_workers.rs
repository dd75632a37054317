//! Python workers as Pods, on a real broker: kube-controller-manager makes the Pods, the process
//! kubelet (`examples/local_kubelet.rs`) runs each container's own command, `lanepool-rq-worker`
//! or `celery` (4 jobs a worker) with the Python package, taking jobs from a real Redis; the
//! producer (`examples/redis/produce.py`) submits Poisson arrivals and counts them for
//! Prometheus, or Prometheus sees only the workers' own series. The
//! guide's verification on the pool the operator sizes: at normal load the urgent wait p99 stays
//! within the urgent job time, a spike above the reserve completes every urgent job while batch
//! slows and recovers, and the scale-downs between stop no busy worker and lose no job (counted
//! in Redis by every job's own ledger).

mod common;

use std::collections::{BTreeMap, BTreeSet};
use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use base64::Engine as _;
use common::{Killed, is_ready};
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::{Pod, Secret};
use kube::Client;
use kube::api::{Api, Patch, PatchParams, PostParams};
use lanepool::api::LanePool;
use lanepool_testenv::{
    self as testenv, Controllers, InProcessOperator, TestPrometheus, TestRedis, example, now_unix,
    p99, python_program, until,
};
use serde_json::{Value, json};

/// The urgent lane's job time: what its wait p99 must stay within.
const URGENT_MS: u64 = 50;
/// Batch jobs: much longer than the grace period, so a shrink that stopped a busy worker would
/// cut its job short.
const BATCH_MS: u64 = 3000;
const GRACE_SECONDS: i64 = 1;

fn examples_dir() -> PathBuf {
    PathBuf::from(concat!(env!("CARGO_MANIFEST_DIR"), "/examples/redis"))
}

/// A free port on 127.0.0.1.
fn free_addr() -> SocketAddr {
    let probe = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    probe.local_addr().unwrap()
}

/// One test's world: a namespace of the shared control plane, Redis, the producer's metrics
/// port scraped by Prometheus, a process kubelet and the operator.
struct World {
    client: Client,
    namespace: String,
    redis: TestRedis,
    producer_metrics: SocketAddr,
    _kubelet: Killed,
    _prometheus: TestPrometheus,
    _operator: InProcessOperator,
}

impl World {
    /// With `scrape_producer`, Prometheus scrapes the producer's counter; without, it sees only
    /// the workers.
    async fn start(prefix: &str, scrape_producer: bool) -> Self {
        let plane = testenv::shared_with(Controllers::Pods).expect("the control plane starts");
        let client = plane.client().await.unwrap();
        let namespace = plane.namespace(&client, prefix).await.unwrap();
        let redis = TestRedis::start().expect("redis-server starts");
        let producer_metrics = free_addr();
        let scraped = if scrape_producer {
            vec![producer_metrics]
        } else {
            Vec::new()
        };
        let prometheus = TestPrometheus::start(&scraped).unwrap();
        let logs: PathBuf = plane.dir().join(format!("workers-{namespace}"));
        // A loopback block of its own, so parallel tests and the demo never share an address.
        let block = 2 + namespace.bytes().map(u32::from).sum::<u32>() % 240;
        let kubelet = Command::new(example("local_kubelet"))
            .args(["--namespace", &namespace, "--node", &namespace])
            .arg("--log-dir")
            .arg(&logs)
            .arg("--pod-targets")
            .arg(prometheus.pod_targets())
            .args(["--ip-block", &block.to_string()])
            // The workers' Deployment a pool is migrated from runs here too.
            .args(["--also-run", "app=plain-workers"])
            .env("KUBECONFIG", plane.kubeconfig())
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("starting local_kubelet");
        let operator =
            InProcessOperator::start(client.clone(), vec![namespace.clone()], prometheus.url());
        Self {
            client,
            namespace,
            redis,
            producer_metrics,
            _kubelet: Killed(kubelet),
            _prometheus: prometheus,
            _operator: operator,
        }
    }

    /// The pool `jobs` of RQ workers: 5 in all, 1–4 reserved for urgent, the rest shared; a
    /// grace period far shorter than a batch job; the default queries.
    async fn apply_pool(&self) {
        let worker = python_program("lanepool-rq-worker").expect("./tests/setup.sh made it");
        let urgent = json!({"min": 1, "max": 4});
        let size = json!({"totalWorkers": 5});
        let command = json!({"command": [worker], "args": ["--path", examples_dir()]});
        self.create_pool(urgent, size, command).await;
    }

    /// Creates the pool `jobs` of Python workers on this world's Redis: lanes urgent (its
    /// `reserve`, with the urgent job time as its fallback) and batch, the pool's `size`, and
    /// a container running `command` with its `metrics` port; a grace period far shorter than
    /// a batch job.
    async fn create_pool(&self, mut reserve: Value, size: Value, command: Value) {
        reserve["jobTime"] = json!({"fallback": format!("{URGENT_MS}ms")});
        let mut container = json!({
            "name": "worker",
            "image": "lanepool-python-worker",
            "ports": [{"name": "metrics", "containerPort": 9100}],
            "env": [
                {"name": "LANEPOOL_REDIS_URL", "value": self.redis.url()},
                {"name": "POD_NAME", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}},
                {"name": "POD_IP", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}},
                {"name": "LANEPOOL_METRICS_ADDR", "value": "$(POD_IP):9100"},
            ],
        });
        container
            .as_object_mut()
            .unwrap()
            .extend(command.as_object().unwrap().clone());
        let mut spec = json!({
            "lanes": [{"name": "urgent", "reserve": reserve}, {"name": "batch"}],
            "interval": "5s",
            "template": {"spec": {
                "terminationGracePeriodSeconds": GRACE_SECONDS,
                "containers": [container],
            }},
        });
        spec.as_object_mut()
            .unwrap()
            .extend(size.as_object().unwrap().clone());
        let pool: LanePool = serde_json::from_value(json!({
            "apiVersion": "lanepool.dev/v1alpha1",
            "kind": "LanePool",
            "metadata": {"name": "jobs"},
            "spec": spec,
        }))
        .unwrap();
        Api::<LanePool>::namespaced(self.client.clone(), &self.namespace)
            .create(&PostParams::default(), &pool)
            .await
            .unwrap();
    }

    /// Starts the producer: urgent jobs at `urgent_rate` (a profile, `0s=10,40s=60`), a batch
    /// backlog that keeps every shared worker busy, for `seconds`.
    fn produce(&self, urgent_rate: &str, seconds: u64) -> Killed {
        self.produce_for("rq", urgent_rate, seconds)
    }

    /// [`Self::produce`] for `queue`'s jobs (`rq` or `celery`).
    fn produce_for(&self, queue: &str, urgent_rate: &str, seconds: u64) -> Killed {
        self.produce_as(queue, urgent_rate, seconds, false)
    }

    /// [`Self::produce_for`]; with `plain`, as a producer no one changed for lanepool
    /// (`produce.py --plain`: nothing counted or stamped).
    fn produce_as(&self, queue: &str, urgent_rate: &str, seconds: u64, plain: bool) -> Killed {
        let python = python_program("python").expect("./tests/setup.sh made it");
        let child = Command::new(python)
            .arg(examples_dir().join("produce.py"))
            .args(plain.then_some("--plain"))
            .args(["--queue", queue])
            .args(["--url", &self.redis.url()])
            .args(["--namespace", &self.namespace, "--pool", "jobs"])
            .args(["--duration", &seconds.to_string()])
            .args(["--metrics-port", &self.producer_metrics.port().to_string()])
            .args(["--lane", "urgent", "--rate", urgent_rate])
            .args(["--job-ms", &URGENT_MS.to_string()])
            .args(["--lane", "batch", "--rate", "0", "--backlog", "200"])
            .args(["--job-ms", &BATCH_MS.to_string()])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("starting produce.py");
        Killed(child)
    }

    async fn replicas(&self, name: &str) -> i32 {
        Api::<Deployment>::namespaced(self.client.clone(), &self.namespace)
            .get_opt(name)
            .await
            .unwrap()
            .and_then(|d| d.spec?.replicas)
            .unwrap_or(0)
    }

    /// How many urgent jobs the live workers started so far waited at most the job time, and
    /// how many they started, from their own wait histograms.
    async fn urgent_waits_so_far(&self) -> (f64, f64) {
        let bucket = format!(
            r#"lanepool_job_wait_seconds_bucket{{lane="urgent",le="{}"}}"#,
            URGENT_MS as f64 / 1000.0
        );
        let count = r#"lanepool_job_wait_seconds_count{lane="urgent"}"#;
        let (mut within, mut all) = (0.0, 0.0);
        for text in self.worker_answers().await {
            let value = |series: &str| {
                text.lines()
                    .find(|l| l.starts_with(series))
                    .and_then(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
                    .unwrap_or(0.0)
            };
            within += value(&bucket);
            all += value(count);
        }
        (within, all)
    }

    /// Every worker's `/metrics` answer now.
    async fn worker_answers(&self) -> Vec<String> {
        let pods: Api<k8s_openapi::api::core::v1::Pod> =
            Api::namespaced(self.client.clone(), &self.namespace);
        let mut answers = Vec::new();
        for pod in pods.list(&Default::default()).await.unwrap() {
            let Some(ip) = pod.status.and_then(|s| s.pod_ip) else {
                continue;
            };
            if let Ok((_, text)) =
                testenv::http_get(format!("{ip}:9100").parse().unwrap(), "/metrics")
            {
                answers.push(text);
            }
        }
        answers
    }

    /// The most jobs in hand on one of the pool's workers now, from their own `/metrics`.
    async fn busiest_worker(&self) -> f64 {
        let mut most = 0.0_f64;
        for text in self.worker_answers().await {
            let busy: f64 = text
                .lines()
                .filter(|l| {
                    l.starts_with("lanepool_worker_busy{") || l.starts_with("lanepool_worker_busy ")
                })
                .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
                .sum();
            most = most.max(busy);
        }
        most
    }
}

/// A profile: `normal` s at 10/s, `spike` s at 60/s, `after` s at 10/s again.
#[derive(Clone, Copy)]
struct Profile {
    normal: u64,
    spike: u64,
    after: u64,
}

impl Profile {
    fn rates(&self) -> String {
        format!("0s=10,{}s=60,{}s=10", self.normal, self.normal + self.spike)
    }

    fn seconds(&self) -> u64 {
        self.normal + self.spike + self.after
    }

    /// The 2 s samples of each phase, less its first 10 s (the reserve follows in between).
    fn samples(&self) -> [(usize, usize); 3] {
        let at = |s: u64| (s / 2) as usize;
        let (a, b, c) = (self.normal, self.normal + self.spike, self.seconds());
        [
            (at(10), at(a) - 1),
            (at(a + 10), at(b) - 1),
            (at(b + 10), at(c) - 1),
        ]
    }
}

/// What one run of the profile showed.
struct Run {
    profile: Profile,
    reserved: Vec<i32>,
    shared: Vec<i32>,
    /// Batch jobs finished, every 2 s.
    batch_done: Vec<i64>,
    /// Urgent waits in the normal phase's last 25 s, and after the spike, in seconds.
    normal: Vec<f64>,
    after: Vec<f64>,
    settled: bool,
    cut_short: i64,
    lost: i64,
}

impl Run {
    /// Seconds from the spike's start to the first 2 s sample with 3 reserved or more.
    fn followed_the_spike_in(&self) -> Option<u64> {
        let start = (self.profile.normal / 2) as usize;
        let after = self.reserved.iter().skip(start).position(|r| *r >= 3)?;
        Some((start + after + 1) as u64 * 2 - self.profile.normal)
    }

    /// Batch jobs finished per second in each phase (see [`Profile::samples`]).
    fn batch_rates(&self) -> [f64; 3] {
        self.profile.samples().map(|(from, to)| {
            let to = to.min(self.batch_done.len() - 1);
            (self.batch_done[to] - self.batch_done[from]) as f64 / ((to - from) * 2) as f64
        })
    }

    fn print(&self, what: &str) {
        println!(
            "{what}: reserved {:?}\nshared {:?}\nurgent wait p99 {:.1} ms at 10/s (job {URGENT_MS} \
             ms, {} jobs in its last 25 s), {:.1} ms after the spike; batch done/s before {:.2}, during {:.2}, \
             after {:.2}; cut short {}, lost {}; 3 reserved {:?} s into the spike",
            self.reserved,
            self.shared,
            p99(self.normal.clone()) * 1000.0,
            self.normal.len(),
            p99(self.after.clone()) * 1000.0,
            self.batch_rates()[0],
            self.batch_rates()[1],
            self.batch_rates()[2],
            self.cut_short,
            self.lost,
            self.followed_the_spike_in(),
        );
    }

    /// The guide's verification, and the scale-downs' promise.
    fn assert_the_guides_verification(&self) {
        assert!(self.settled, "the jobs in hand did not finish");
        assert_eq!(self.cut_short, 0, "a job was cut short");
        assert_eq!(self.lost, 0, "a job was lost");
        assert!(
            p99(self.normal.clone()) <= URGENT_MS as f64 / 1000.0,
            "urgent wait p99 above the job time at normal load"
        );
        assert!(
            self.reserved.iter().any(|r| *r >= 3),
            "the reserve followed the spike"
        );
        assert!(
            *self.reserved.last().unwrap() <= 2,
            "and came back after it"
        );
        let [before, during, after] = self.batch_rates();
        assert!(during < before, "batch gave way to the spike");
        assert!(after > during, "and recovered");
    }
}

/// Runs `profile` on the pool (urgent jobs of 50 ms: the spike's 60/s keeps 3 urgent workers
/// busy on average, the reserve's max 4 and more) beside a batch backlog; then the batch jobs
/// still queued are taken away and the rest runs to its end. The urgent waits are those of the
/// normal phase's last 25 s and the last phase's last 15 s.
async fn run_profile(world: &World, profile: Profile) -> Run {
    let profile_started = Instant::now();
    let started_at = now_unix();
    let producer = world.produce(&profile.rates(), profile.seconds());
    let (mut reserved, mut shared) = (Vec::new(), Vec::new());
    let mut batch_done = Vec::new();
    while profile_started.elapsed() < Duration::from_secs(profile.seconds()) {
        tokio::time::sleep(Duration::from_secs(2)).await;
        reserved.push(world.replicas("jobs-urgent-reserved").await);
        shared.push(world.replicas("jobs-shared").await);
        batch_done.push(world.redis.integer(&["ZCARD", "rq:finished:batch"]));
    }
    drop(producer);
    let ledger = world
        .redis
        .settle("rq:queue:urgent", "rq:queue:batch")
        .await;
    let (normal_end, end) = (profile.normal as f64, profile.seconds() as f64);
    Run {
        profile,
        reserved,
        shared,
        batch_done,
        normal: world
            .redis
            .rq_urgent_waits(started_at + normal_end - 25.0, started_at + normal_end),
        after: world
            .redis
            .rq_urgent_waits(started_at + end - 15.0, started_at + end),
        settled: ledger.settled,
        cut_short: ledger.cut_short,
        lost: ledger.lost,
    }
}

/// The tests of this file one at a time: each runs ten Python workers and a producer, and a
/// wait p99 of 50 ms is measured on two cores.
static ONE_AT_A_TIME: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// What requests to the pool's workers from outside the operator were answered, and how a
/// rotation of the credential went.
#[derive(Debug, Default)]
struct Steering {
    /// Requests without the pool's credential (none, a wrong token, another scheme), by the
    /// status answered, and the workers they went to.
    without: BTreeMap<u16, usize>,
    workers_tried: BTreeSet<String>,
    /// A stand-in for a lane the pool does not have, with the credential: statuses answered.
    foreign_lane: BTreeMap<u16, usize>,
    /// After the rotation, once the kubelet refreshed the file: the old token's answers and the
    /// new one's (a stand-in for a lane the pool lacks: 403 once the token is taken).
    old_token: BTreeMap<u16, usize>,
    new_token: BTreeMap<u16, usize>,
    /// The Secret kept the old token as `previous` for the workers not refreshed yet.
    previous_kept: bool,
}

/// The pool's credential Secret's `key`, as its namespace's admin reads it.
async fn credential(world: &World, key: &str) -> Option<String> {
    let secrets: Api<Secret> = Api::namespaced(world.client.clone(), &world.namespace);
    let secret = secrets.get_opt("jobs-worker-credential").await.ok()??;
    let bytes = secret.data?.get(key)?.0.clone();
    String::from_utf8(bytes).ok()
}

/// `POST`s each of `paths` with each of `headers` to every worker now running, off the runtime's
/// threads (each answer may take a second): the statuses answered, and the workers asked.
async fn post_to_every_worker(
    world: &World,
    paths: &[&str],
    headers: &[String],
) -> (BTreeMap<u16, usize>, BTreeSet<String>) {
    let pods: Api<Pod> = Api::namespaced(world.client.clone(), &world.namespace);
    let workers: Vec<(String, SocketAddr)> = pods
        .list(&Default::default())
        .await
        .unwrap()
        .into_iter()
        .filter(|p| p.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Running"))
        .filter_map(|p| {
            let ip = p.status.as_ref()?.pod_ip.clone()?;
            Some((p.metadata.name.clone()?, format!("{ip}:9100").parse().ok()?))
        })
        .collect();
    let requests: Vec<(SocketAddr, String, String)> = workers
        .iter()
        .flat_map(|(_, addr)| {
            paths.iter().flat_map(move |path| {
                headers
                    .iter()
                    .map(move |header| (*addr, path.to_string(), header.clone()))
            })
        })
        .collect();
    let statuses = tokio::task::spawn_blocking(move || {
        let mut statuses = BTreeMap::new();
        for (addr, path, header) in requests {
            // A worker that just stopped answers nothing: not an answer to count.
            if let Ok((status, _)) = testenv::http_post(addr, &path, &header) {
                *statuses.entry(status).or_insert(0) += 1;
            }
        }
        statuses
    })
    .await
    .unwrap();
    (
        statuses,
        workers.into_iter().map(|(name, _)| name).collect(),
    )
}

/// Tries to steer the pool's workers as any Pod that reaches their port could, all through the
/// normal phase and into the spike: drains of an hour, stand-ins pointing reserved workers at
/// batch, without the credential or with a wrong one; a stand-in for a lane the pool lacks with
/// the right one. Then rotates the credential (as a user would, by annotating the pool) just
/// before the spike, so the spike's stand-ins and the drains after it carry the new token.
async fn try_to_steer(world: &World, profile: Profile) -> Steering {
    let started = Instant::now();
    let mut steering = Steering::default();
    let hostile_paths = [
        "/drain?seconds=3600",
        "/stand-in?lanes=batch&seconds=3600",
        "/stand-in?lanes=urgent,batch&seconds=3600",
        "/drain?seconds=0",
    ];
    let basic = base64::engine::general_purpose::STANDARD.encode("lanepool:lanepool");
    let wrong = [
        String::new(),
        format!("Authorization: Bearer {}\r\n", "0".repeat(64)),
        format!("Authorization: Basic {basic}\r\n"),
        "Authorization: Bearer\r\n".to_string(),
        format!("Authorization: Bearer {}\r\n", "a".repeat(5000)),
    ];
    tokio::time::sleep(Duration::from_secs(8)).await;
    let rotate_at = Duration::from_secs(profile.normal.saturating_sub(4));
    while started.elapsed() < rotate_at {
        let (statuses, tried) = post_to_every_worker(world, &hostile_paths, &wrong).await;
        for (status, count) in statuses {
            *steering.without.entry(status).or_insert(0) += count;
        }
        steering.workers_tried.extend(tried);
        if steering.foreign_lane.is_empty()
            && let Some(token) = credential(world, "token").await
        {
            let header = [format!("Authorization: Bearer {token}\r\n")];
            let lane = ["/stand-in?lanes=another-teams-queue&seconds=5"];
            steering.foreign_lane = post_to_every_worker(world, &lane, &header).await.0;
        }
        tokio::time::sleep(Duration::from_secs(2)).await;
    }
    let old = credential(world, "token")
        .await
        .expect("the pool has a credential");
    let pools: Api<LanePool> = Api::namespaced(world.client.clone(), &world.namespace);
    let rotate = json!({"metadata": {"annotations": {"lanepool.dev/rotate-credential": "1"}}});
    pools
        .patch("jobs", &PatchParams::default(), &Patch::Merge(&rotate))
        .await
        .unwrap();
    until(20, "the operator rotates the credential", || async {
        credential(world, "token").await.is_some_and(|t| t != old)
    })
    .await;
    let new = credential(world, "token").await.unwrap();
    steering.previous_kept = credential(world, "previous").await.as_deref() == Some(&old);
    // The process kubelet writes Secret volumes again every 2 s; a real one within a minute or two.
    tokio::time::sleep(Duration::from_secs(5)).await;
    let probe = ["/stand-in?lanes=another-teams-queue&seconds=1"];
    let with = |token: &str| [format!("Authorization: Bearer {token}\r\n")];
    steering.old_token = post_to_every_worker(world, &probe, &with(&old)).await.0;
    steering.new_token = post_to_every_worker(world, &probe, &with(&new)).await.0;
    steering
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rq_workers_as_pods_keep_the_urgent_wait_within_the_job_time_and_no_shrink_cuts_a_job_though_pods_without_the_credential_try_to_steer_them()
 {
    let _alone = ONE_AT_A_TIME.lock().await;
    let world = World::start("python-rq", true).await;
    world.apply_pool().await;
    let profile = Profile {
        normal: 40,
        spike: 30,
        after: 30,
    };
    let (run, steering) = tokio::join!(run_profile(&world, profile), try_to_steer(&world, profile));
    run.print("the producer's counter");
    println!("{steering:?}");
    // Only the operator steers a worker: every request without its credential was refused and
    // changed nothing (the urgent lane kept its promise, no job was cut short), on every worker.
    assert_eq!(
        steering.without.keys().collect::<Vec<_>>(),
        [&401],
        "{steering:?}"
    );
    assert!(steering.workers_tried.len() >= 5, "{steering:?}");
    assert_eq!(steering.foreign_lane.keys().collect::<Vec<_>>(), [&403]);
    // The rotation reached every worker with no restart: the old token refused, the new taken.
    assert!(steering.previous_kept, "{steering:?}");
    assert_eq!(steering.old_token.keys().collect::<Vec<_>>(), [&401]);
    assert_eq!(steering.new_token.keys().collect::<Vec<_>>(), [&403]);
    // The operator's own stand-ins and drains carried the new token: the reserve followed the
    // spike and came back, and no shrink cut a job short.
    run.assert_the_guides_verification();
    let pool = Api::<LanePool>::namespaced(world.client.clone(), &world.namespace)
        .get("jobs")
        .await
        .unwrap();
    let conditions = pool.status.map(|s| s.conditions).unwrap_or_default();
    let credential = conditions.iter().find(|c| c.type_ == "WorkerCredential");
    assert_eq!(
        credential.map(|c| (c.status.as_str(), c.reason.as_str())),
        Some(("True", "Checked")),
        "{conditions:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pool_sized_from_its_workers_alone_follows_the_spike_without_the_producers_counter() {
    let _alone = ONE_AT_A_TIME.lock().await;
    // Prometheus never sees the producer, and the pool names no query: the default's arrival
    // rate is the workers' finished jobs plus the change in the lane's depth (docs/workers.md),
    // and until Prometheus has scraped them twice the operator's own reads of the workers
    // measure the lane alone, seconds after they start.
    let world = World::start("python-rq-workers", false).await;
    world.apply_pool().await;
    // The reads' long rate needs half a minute of them: each phase is given longer than with
    // the producer's counter, which sees each job as it is sent.
    let profile = Profile {
        normal: 60,
        spike: 40,
        after: 80,
    };
    let run = run_profile(&world, profile).await;
    run.print("the workers' own series");
    run.assert_the_guides_verification();
    // With the producer's counter (the test above, the same rates) 3 were reserved 6 s into
    // the spike; the workers' series may come a scrape interval (15 s) later at most.
    let followed = run.followed_the_spike_in();
    assert!(followed.is_some_and(|s| s <= 6 + 15), "{followed:?}");
}

/// What a run of Celery workers of 4 slots showed.
struct CeleryRun {
    reserved: Vec<i32>,
    most_busy: f64,
    /// The share of urgent jobs started from 13 s to 38 s (at 20/s) that waited at most the job
    /// time, and how many jobs.
    within: Option<(f64, f64)>,
    decision: String,
    settled: bool,
    cut_short: i64,
    lost: i64,
}

/// A pool of 4 Celery workers of 4 slots each: 20/s × 50 ms urgent jobs (one busy slot: a
/// reserved worker of 4 slots keeps the wait p99 within the job time), 100/s (5 busy slots,
/// 8 or more wanted: 2 workers of 4 and more), back to 20/s, beside 3 s batch jobs and a grace
/// period of 1 s.
async fn celery_run(world: &World) -> CeleryRun {
    let celery = python_program("celery").expect("./tests/setup.sh made it");
    let urgent = json!({"min": 1, "max": 3});
    let size = json!({"totalWorkers": 4, "slotsPerWorker": 4});
    let command = json!({"command": [celery], "args": ["--workdir", examples_dir(), "-A",
        "celery_app", "worker", "-n", "celery@$(POD_NAME)", "--loglevel=INFO"]});
    world.create_pool(urgent, size, command).await;
    let pools: Api<LanePool> = Api::namespaced(world.client.clone(), &world.namespace);
    let started = Instant::now();
    let producer = world.produce_for("celery", "0s=20,40s=100,75s=20", 110);
    let (mut reserved, mut most_busy) = (Vec::new(), 0.0_f64);
    // The normal phase's waits from 13 s on, when the workers have started and taken the jobs
    // queued meanwhile: a difference of the workers' cumulative histograms (no worker comes or
    // goes in this phase).
    let (mut warm, mut within) = (None, None);
    while started.elapsed() < Duration::from_secs(110) {
        tokio::time::sleep(Duration::from_secs(2)).await;
        reserved.push(world.replicas("jobs-urgent-reserved").await);
        most_busy = most_busy.max(world.busiest_worker().await);
        let elapsed = started.elapsed();
        if warm.is_none() && elapsed >= Duration::from_secs(13) {
            warm = Some(world.urgent_waits_so_far().await);
        } else if let (Some((warm_within, warm_all)), None) = (warm, within)
            && elapsed >= Duration::from_secs(38)
        {
            let (now_within, now_all) = world.urgent_waits_so_far().await;
            let jobs = now_all - warm_all;
            within = Some(((now_within - warm_within) / jobs, jobs));
        }
    }
    drop(producer);
    // Celery's queue is the lane's list, the key of the lane's name.
    let ledger = world.redis.settle("urgent", "batch").await;
    let decision = pools
        .get("jobs")
        .await
        .unwrap()
        .status
        .and_then(|s| s.last_decision)
        .unwrap_or_default();
    let run = CeleryRun {
        reserved,
        most_busy,
        within,
        decision,
        settled: ledger.settled,
        cut_short: ledger.cut_short,
        lost: ledger.lost,
    };
    println!(
        "celery, 4 slots a worker: reserved {:?}; most jobs in hand on one worker {}; urgent \
         jobs within the job time at 20/s (share, of): {:?}; last decision {:?}; cut short {}, \
         lost {}",
        run.reserved, run.most_busy, run.within, run.decision, run.cut_short, run.lost
    );
    run
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn celery_workers_of_four_slots_keep_the_urgent_wait_and_are_sized_and_drained_by_slots() {
    let _alone = ONE_AT_A_TIME.lock().await;
    let world = World::start("python-celery", true).await;
    let run = celery_run(&world).await;
    assert!(run.settled, "the jobs in hand did not finish");
    assert_eq!(run.cut_short, 0, "a job was cut short");
    assert_eq!(run.lost, 0, "a job was lost");
    assert!(run.most_busy >= 4.0, "a worker ran 4 jobs at once");
    assert!(
        run.decision.contains("4 slots a worker"),
        "{}",
        run.decision
    );
    assert!(
        run.reserved.iter().any(|r| *r >= 2),
        "the reserve followed the spike in workers of 4 slots"
    );
    assert_eq!(*run.reserved.last().unwrap(), 1, "and came back after it");
    assert!(
        run.within
            .is_some_and(|(share, jobs)| share >= 0.99 && jobs >= 300.0),
        "urgent wait p99 above the job time at 20/s: {:?}",
        run.within
    );
}

/// Celery workers as a team runs them (a Deployment of `celery worker -Q urgent,batch -c 4`, a
/// producer calling `apply_async(queue=...)` and nothing else), turned into a LanePool by
/// `lanepool migrate --deployment` while urgent tasks arrive: the old Deployment deleted once
/// the pool's workers are all Ready, no task lost or cut short, and the pool's reserve follows a
/// spike from the workers and the queue alone.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_plain_celery_deployment_migrated_under_load_becomes_a_pool_whose_reserve_follows_a_spike()
 {
    let _alone = ONE_AT_A_TIME.lock().await;
    let world = World::start("python-celery-migrated", false).await;
    let celery = python_program("celery").expect("./tests/setup.sh made it");
    let deployment: Deployment = serde_json::from_value(json!({
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": "celery-workers"},
        "spec": {
            "replicas": 4,
            "selector": {"matchLabels": {"app": "plain-workers"}},
            "template": {
                "metadata": {"labels": {"app": "plain-workers"}},
                // Kubernetes' default grace period (30 s), longer than a batch task.
                "spec": {
                    "containers": [{
                        "name": "worker",
                        "image": "lanepool-python-worker",
                        "command": [celery],
                        "args": ["--workdir", examples_dir(), "-A", "celery_app", "worker",
                            "-n", "celery@$(POD_NAME)", "-Q", "urgent,batch", "-c", "4",
                            "--loglevel=INFO"],
                        "env": [
                            {"name": "LANEPOOL_REDIS_URL", "value": world.redis.url()},
                            {"name": "POD_NAME",
                             "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}},
                        ],
                    }],
                },
            },
        },
    }))
    .unwrap();
    let deployments: Api<Deployment> = Api::namespaced(world.client.clone(), &world.namespace);
    deployments
        .create(&PostParams::default(), &deployment)
        .await
        .unwrap();
    let pods: Api<Pod> = Api::namespaced(world.client.clone(), &world.namespace);
    let ready = |selector: &'static str| {
        let pods = pods.clone();
        async move {
            pods.list(&kube::api::ListParams::default().labels(selector))
                .await
                .map(|list| list.items.iter().filter(|p| is_ready(p)).count())
                .unwrap_or(0)
        }
    };
    testenv::until(60, "the plain Celery workers run", || async {
        ready("app=plain-workers").await == 4
    })
    .await;

    let started = Instant::now();
    let started_at = now_unix();
    let producer = world.produce_as("celery", "0s=20,40s=100,75s=20", 110, true);
    tokio::time::sleep(Duration::from_secs(8)).await;
    // What a user does: lanepool migrate, its pool applied as printed.
    let output = Command::new(env!("CARGO_BIN_EXE_lanepool"))
        .args(["migrate", "--deployment"])
        .arg(format!("{}/celery-workers", world.namespace))
        .args(["--name", "jobs"])
        .env(
            "KUBECONFIG",
            testenv::shared_with(Controllers::Pods)
                .unwrap()
                .kubeconfig(),
        )
        .output()
        .expect("running lanepool migrate");
    let said = String::from_utf8_lossy(&output.stderr);
    assert!(output.status.success(), "lanepool migrate: {said}");
    println!("lanepool migrate said:\n{said}");
    let pool: LanePool = serde_yaml::from_slice(&output.stdout).expect("a LanePool");
    Api::<LanePool>::namespaced(world.client.clone(), &world.namespace)
        .create(&PostParams::default(), &pool)
        .await
        .unwrap();
    let applied = now_unix();
    testenv::until(
        90,
        "the pool's 4 workers Ready beside the old ones",
        || async { ready("lanepool.dev/pool=jobs").await == 4 },
    )
    .await;
    deployments
        .delete("celery-workers", &Default::default())
        .await
        .unwrap();
    let switched = now_unix();

    let mut reserved = Vec::new();
    while started.elapsed() < Duration::from_secs(110) {
        tokio::time::sleep(Duration::from_secs(2)).await;
        reserved.push((
            started.elapsed().as_secs(),
            world.replicas("jobs-urgent-reserved").await,
        ));
    }
    drop(producer);
    let ledger = world.redis.settle("urgent", "batch").await;
    let waits = world.redis.celery_urgent_waits();
    let p99_in = |from: f64, to: f64| {
        let inside: Vec<f64> = waits
            .iter()
            .filter(|(sent, _)| (from..to).contains(sent))
            .map(|(_, waited)| *waited)
            .collect();
        let n = inside.len();
        (n > 0).then(|| (testenv::p99(inside) * 1000.0, n))
    };
    let spike = started_at + 40.0;
    let by_5s: Vec<(u64, usize, u64)> = (0..22)
        .filter_map(|i| {
            let from = started_at + 5.0 * i as f64;
            let inside: Vec<f64> = waits
                .iter()
                .filter(|(sent, _)| (from..from + 5.0).contains(sent))
                .map(|(_, waited)| *waited)
                .collect();
            let most = inside.iter().copied().fold(0.0, f64::max);
            (!inside.is_empty()).then(|| (i * 5, inside.len(), (most * 1000.0) as u64))
        })
        .collect();
    println!(
        "celery, migrated: urgent tasks by 5 s from the start (s, tasks, longest wait ms): {by_5s:?}"
    );
    println!(
        "celery, migrated: the pool applied {:.0} s and the old Deployment deleted {:.0} s in; \
         reserved (s, n) {reserved:?}; urgent wait p99 (ms, jobs) before the pool {:?}, during \
         the switch {:?}, after it to the spike {:?}, in the spike {:?}, after it {:?}; {ledger:?}",
        applied - started_at,
        switched - started_at,
        p99_in(started_at, applied),
        p99_in(applied, switched),
        p99_in(switched, spike),
        p99_in(spike, started_at + 75.0),
        p99_in(started_at + 85.0, started_at + 110.0),
    );
    assert!(ledger.settled, "the tasks in hand did not finish");
    assert_eq!(ledger.cut_short, 0, "a task was cut short");
    assert_eq!(ledger.lost, 0, "a task was lost");
    assert!(switched < spike, "the pool took over before the spike");
    // Once the old workers' tasks in hand are done (3 s batch tasks) and the urgent ones queued
    // meanwhile taken, the pool keeps the urgent wait within the job time: ten seconds after
    // the switch up to the spike.
    let settled_in = p99_in(switched + 10.0, spike);
    assert!(
        settled_in.is_some_and(|(p99, n)| p99 <= URGENT_MS as f64 && n >= 200),
        "urgent wait p99 after the switch: {settled_in:?}"
    );
    assert!(
        reserved
            .iter()
            .any(|(at, r)| *at >= 40 && *at <= 75 && *r >= 2),
        "the reserve followed the spike (4 slots a worker: 2 workers for 100/s × 50 ms)"
    );
}
