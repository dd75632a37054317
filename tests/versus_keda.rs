//! lanepool against KEDA on the real node (issue 51): the same RQ workload on the same Redis,
//! image and node, twice. KEDA's arm is two Deployments of plain `rq worker`s, urgent-only and
//! batch-only, each sized by a ScaledObject on its Redis list as KEDA's docs write it
//! (examples/redis/keda-rq.yaml); lanepool's is the README's first pool
//! (examples/redis/lanepool-rq.yaml) sized by `lanepool run` at its defaults. Each arm prints the
//! urgent wait p99 (from the jobs' own RQ records), the batch jobs done, the worker-seconds (from
//! its Pods' lifetimes in the API server) and its jobs' ledger; the table is also written to
//! target/versus-keda/table.md, which examples/versus_keda.sh prints.
//!
//! It asserts what holds whatever the tuning: both arms ran and resized, no job was lost, and
//! lanepool cut none short. The figures compared are findings, printed, not asserted.

use std::collections::BTreeMap;
use std::net::{IpAddr, SocketAddr};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use futures::StreamExt;
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::Api;
use kube::runtime::{WatchStreamExt, watcher};
use lanepool_testenv::{
    self as testenv, FINISHED, Keda, Reply, SUBMITTED, TestNode, TestPrometheus, TestRedis,
    TestRegistry,
};

mod common;
use common::node::{Kubectl, pool_scrape_configs};
use common::{Killed, is_ready};

const ROOT: &str = env!("CARGO_MANIFEST_DIR");
const VERSION: &str = env!("CARGO_PKG_VERSION");
/// The workers of either arm: the pool's totalWorkers, and KEDA's two maxima added up.
const WORKERS: usize = 10;
/// How often the jobs' RQ records are read during a run: well within RQ's result TTL (500 s),
/// after which a finished job's record is gone.
const RECORD_READS: Duration = Duration::from_secs(30);

/// The workload both arms get, from the environment (examples/versus_keda.sh sets it).
#[derive(Clone, Debug)]
struct Workload {
    /// produce.py's urgent rate profile, such as `0s=14,40s=48,70s=14`.
    urgent_profile: String,
    /// Seconds of urgent arrivals: the run.
    duration: u64,
    urgent_ms: u64,
    batch_ms: String,
    batch_backlog: u32,
    /// minReplicaCount of both ScaledObjects.
    keda_min_replicas: u32,
}

impl Workload {
    fn from_env() -> Self {
        let var = |name: &str, default: &str| {
            std::env::var(format!("VERSUS_KEDA_{name}")).unwrap_or_else(|_| default.to_owned())
        };
        let number = |name: &str, default: &str| {
            var(name, default)
                .parse::<u64>()
                .unwrap_or_else(|e| panic!("VERSUS_KEDA_{name}: {e}"))
        };
        Self {
            urgent_profile: var("PROFILE", "0s=14,40s=48,70s=14"),
            duration: number("DURATION", "130"),
            urgent_ms: number("URGENT_MS", "70"),
            batch_ms: var("BATCH_MS", "2000..4000"),
            batch_backlog: number("BATCH_BACKLOG", "600") as u32,
            keda_min_replicas: number("MIN_REPLICAS", "1") as u32,
        }
    }

    /// The profile's steps: (from second, jobs per second).
    fn steps(&self) -> Vec<(f64, f64)> {
        if !self.urgent_profile.contains('=') {
            return vec![(0.0, self.urgent_profile.parse().expect("a rate"))];
        }
        let mut steps: Vec<(f64, f64)> = self
            .urgent_profile
            .split(',')
            .map(|step| {
                let (at, rate) = step.split_once('=').expect("`at=rate`");
                (
                    at.trim_end_matches('s').parse().expect("seconds"),
                    rate.parse().expect("a rate"),
                )
            })
            .collect();
        steps.sort_by(|a, b| a.0.total_cmp(&b.0));
        steps
    }

    /// The windows the waits are reported over, in seconds from the first arrival: the whole
    /// run, before the spike (the step of the highest rate), the spike, and after it.
    fn windows(&self) -> Vec<(&'static str, f64, f64)> {
        let steps = self.steps();
        let end = self.duration as f64;
        let spike = (0..steps.len())
            .max_by(|&a, &b| steps[a].1.total_cmp(&steps[b].1))
            .unwrap_or(0);
        let spike_end = steps.get(spike + 1).map_or(end, |s| s.0).min(end);
        vec![
            ("whole run", 0.0, end),
            ("before the spike", 0.0, steps[spike].0),
            ("spike", steps[spike].0, spike_end),
            ("after it", spike_end, end),
        ]
    }
}

/// Applies `yaml`, kept as `name` beside the run's logs.
fn apply(kubectl: &Kubectl, namespace: &str, name: &str, yaml: &str) {
    let file = out_dir().join(name);
    std::fs::write(&file, yaml).unwrap();
    kubectl.ok(&["apply", "-n", namespace, "-f", &file.display().to_string()]);
}

/// Where the run's logs and table go.
fn out_dir() -> PathBuf {
    let dir = Path::new(ROOT).join("target/versus-keda");
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// What both arms share: the node, its registry holding the Python worker image (already pulled
/// by the node, so each arm's Pods start the same way), KEDA, and a Prometheus that finds the
/// pool's workers with examples/prometheus/scrape-config.yaml and scrapes them and the producer
/// every 15 s (the operator's default `--scrape-interval`, and the example's).
struct World {
    node: &'static TestNode,
    kubectl: Kubectl,
    image: String,
    prometheus: TestPrometheus,
    producer_metrics: u16,
    _registry: TestRegistry,
    _keda: Keda,
}

impl World {
    async fn start() -> Self {
        let node = testenv::shared_node().expect("the node starts");
        let kubectl = Kubectl(node);
        let registry = TestRegistry::start().expect("the registry starts");
        testenv::build_and_push_python_worker_image(&registry.host())
            .expect("images/build.sh builds and pushes the Python worker image");
        let image = format!("{}/lanepool/python-worker:{VERSION}", registry.host());
        let keda = node.plane().start_keda().await.expect("KEDA starts");
        let crd = Path::new(ROOT).join("crds/lanepool.dev_lanepools.yaml");
        kubectl.ok(&["apply", "--server-side", "-f", &crd.display().to_string()]);
        let producer_metrics = testenv::free_port().unwrap();
        let prometheus =
            TestPrometheus::start_scraping(&pool_scrape_configs(node, producer_metrics, "15s"))
                .expect("prometheus starts");
        let world = Self {
            node,
            kubectl,
            image,
            prometheus,
            producer_metrics,
            _registry: registry,
            _keda: keda,
        };
        world.pull_the_image().await;
        world
    }

    fn host(&self) -> IpAddr {
        self.node.host()
    }

    /// Runs one Pod of the worker image to its end, so that neither arm's Pods pull it.
    async fn pull_the_image(&self) {
        let pod = serde_json::json!({
            "apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": "pull", "namespace": "default"},
            "spec": {
                "restartPolicy": "Never",
                "containers": [{"name": "pull", "image": self.image, "command": ["python3", "-c", "pass"]}],
            },
        });
        apply(&self.kubectl, "default", "pull.json", &pod.to_string());
        testenv::until(180, "the worker image pulled and run", || async {
            self.kubectl.get("pod/pull", "default", "{.status.phase}") == "Succeeded"
        })
        .await;
        self.kubectl
            .ok(&["delete", "pod", "pull", "-n", "default", "--wait=false"]);
    }

    /// Starts produce.py on `redis`: the urgent profile for the workload's duration, or, with
    /// `backlog_only`, the batch backlog alone (it returns once submitted); with `plain`, as a
    /// producer no one changed (`Queue.enqueue`, nothing counted). The same seed in every arm:
    /// the same arrivals and job times.
    fn produce(
        &self,
        redis: &TestRedis,
        namespace: &str,
        work: &Workload,
        (backlog_only, plain): (bool, bool),
    ) -> Child {
        let python = testenv::python_program("python").expect("./tests/setup.sh made it");
        let log = out_dir().join(format!("produce-{namespace}.log"));
        let mut command = Command::new(python);
        command
            .arg(Path::new(ROOT).join("examples/redis/produce.py"))
            .args(["--queue", "rq", "--url", &redis.url(), "--seed", "1"])
            .args(["--namespace", namespace, "--pool", "jobs"])
            .args(["--metrics-port", &self.producer_metrics.to_string()]);
        if plain {
            command.arg("--plain");
        }
        if backlog_only {
            command
                .args(["--duration", "0", "--lane", "batch", "--rate", "0"])
                .args(["--backlog", &work.batch_backlog.to_string()])
                .args(["--job-ms", &work.batch_ms]);
        } else {
            command
                .args(["--duration", &work.duration.to_string()])
                .args(["--lane", "urgent", "--rate", &work.urgent_profile])
                .args(["--job-ms", &work.urgent_ms.to_string()]);
        }
        command
            .stdin(Stdio::null())
            .stdout(std::fs::File::create(&log).unwrap())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("starting produce.py")
    }
}

/// `text` with `from`, which must be in it exactly `times` times, replaced.
fn replace(text: &str, from: &str, to: &str, times: usize) -> String {
    assert_eq!(text.matches(from).count(), times, "{from:?} in {text}");
    text.replace(from, to)
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Arm {
    Keda,
    LanePool,
    /// A team's plain RQ Deployment (examples/redis/rq-today.yaml) and an unchanged producer,
    /// turned into a LanePool by `lanepool migrate` ten seconds into the urgent profile.
    Migrated,
}

impl Arm {
    fn name(self) -> &'static str {
        match self {
            Arm::Keda => "KEDA 2.21",
            Arm::LanePool => "lanepool",
            Arm::Migrated => "lanepool, migrated, producer unchanged",
        }
    }

    /// Whether the arm's producer is left as a team has it (no counter, no stamp).
    fn plain_producer(self) -> bool {
        self == Arm::Migrated
    }

    /// The Deployments whose replicas show the arm resizing: the urgent lane's first.
    fn deployments(self) -> [&'static str; 2] {
        match self {
            Arm::Keda => ["rq-urgent", "rq-batch"],
            Arm::LanePool | Arm::Migrated => ["jobs-urgent-reserved", "jobs-shared"],
        }
    }

    /// The arm's workers, as shipped with only the image and Redis's address changed.
    fn manifest(self, world: &World, redis: &TestRedis, work: &Workload) -> String {
        let url = redis.url_at(world.host());
        let image = format!("image: {}", world.image);
        match self {
            Arm::Keda => {
                let shipped =
                    std::fs::read_to_string(Path::new(ROOT).join("examples/redis/keda-rq.yaml"))
                        .unwrap();
                let yaml = replace(&shipped, "image: lanepool-python-worker", &image, 2);
                let yaml = replace(&yaml, "redis://127.0.0.1:6379/0", &url, 2);
                let address = SocketAddr::new(world.host(), redis.addr().port());
                let address = format!("address: {address}");
                let yaml = replace(&yaml, "address: 127.0.0.1:6379", &address, 2);
                let min = format!("minReplicaCount: {}", work.keda_min_replicas);
                replace(&yaml, "minReplicaCount: 1", &min, 2)
            }
            Arm::Migrated => {
                let shipped =
                    std::fs::read_to_string(Path::new(ROOT).join("examples/redis/rq-today.yaml"))
                        .unwrap();
                let yaml = replace(&shipped, "image: lanepool-python-worker", &image, 1);
                replace(&yaml, "redis://127.0.0.1:6379/0", &url, 1)
            }
            Arm::LanePool => {
                let shipped = std::fs::read_to_string(
                    Path::new(ROOT).join("examples/redis/lanepool-rq.yaml"),
                )
                .unwrap();
                let yaml = replace(&shipped, "image: lanepool-python-worker", &image, 1);
                replace(
                    &yaml,
                    "value: redis://127.0.0.1:6379/0",
                    &format!("value: {url}"),
                    1,
                )
            }
        }
    }
}

/// One job's RQ record: its lane and its times (Unix seconds).
#[derive(Clone, Debug, Default)]
struct Record {
    origin: String,
    enqueued: Option<f64>,
    started: Option<f64>,
    ended: Option<f64>,
}

/// Reads the RQ records of the jobs in `set` not read yet.
fn read_records(redis: &TestRedis, set: &str, records: &mut BTreeMap<String, Record>) {
    let Ok(Reply::Array(ids)) = redis.command(&["SMEMBERS", set]) else {
        panic!("no ledger set {set}");
    };
    for id in ids {
        let Reply::Bulk(Some(id)) = id else { continue };
        if records.get(&id).is_some_and(|r| r.ended.is_some()) {
            continue;
        }
        let key = format!("rq:job:{id}");
        let fields = ["origin", "enqueued_at", "started_at", "ended_at"];
        let Ok(Reply::Array(values)) = redis.command(&[&["HMGET", &key][..], &fields[..]].concat())
        else {
            continue;
        };
        let text: Vec<Option<String>> = values
            .into_iter()
            .map(|v| match v {
                Reply::Bulk(v) => v,
                _ => None,
            })
            .collect();
        let unix = |t: &Option<String>| {
            t.as_deref()
                .and_then(|t| t.parse::<k8s_openapi::jiff::Timestamp>().ok())
                .map(|t| t.as_microsecond() as f64 / 1e6)
        };
        let Some(origin) = text[0].clone() else {
            continue;
        };
        records.insert(
            id,
            Record {
                origin,
                enqueued: unix(&text[1]),
                started: unix(&text[2]),
                ended: unix(&text[3]),
            },
        );
    }
}

fn unix(time: &Time) -> f64 {
    time.0.as_microsecond() as f64 / 1e6
}

/// What one arm did over its run.
#[derive(Debug)]
struct Figures {
    arm: Arm,
    /// Per window of [`Workload::windows`]: the urgent jobs that arrived in it and their wait
    /// p99, in seconds.
    urgent_p99: Vec<Option<(f64, usize)>>,
    /// Urgent jobs submitted that never started.
    urgent_not_started: usize,
    batch_done: usize,
    worker_seconds: f64,
    /// Each Deployment of [`Arm::deployments`]: its lowest and highest spec.replicas in the run.
    replicas: Vec<(i32, i32)>,
    /// The most workers that ran at once (started, not yet deleted).
    most_at_once: usize,
    /// The medians of the arm's Pods' creation → container running and creation → Ready, in
    /// seconds, and over how many Pods.
    pod_start: (f64, f64, usize),
    /// When KEDA's HPA last scaled rq-urgent (its status.lastScaleTime); none for lanepool.
    hpa_last_scale: Option<String>,
    ledger: testenv::Ledger,
    load: String,
    /// A migrated arm's switch: when its LanePool was applied and its old Deployment deleted,
    /// in seconds from the first urgent arrival.
    switch: Option<(f64, f64)>,
    /// And the urgent wait p99 (and jobs) before the pool was applied, during the switch, and
    /// from the switch to the spike.
    across_switch: Option<[Option<(f64, usize)>; 3]>,
}

/// The load average, as `uptime` prints it.
fn load() -> String {
    let text = std::fs::read_to_string("/proc/loadavg").unwrap_or_default();
    let parts: Vec<&str> = text.split_whitespace().take(3).collect();
    parts.join(" ")
}

/// Runs one arm in a namespace of its own, on a Redis of its own: workers up, the batch
/// backlog queued and the arm settled on it, then the urgent profile; then every job's ledger.
async fn run_arm(world: &World, arm: Arm, work: &Workload) -> Figures {
    let began = Instant::now();
    let namespace = testenv::unique_name(match arm {
        Arm::Keda => "keda",
        Arm::LanePool => "lanepool",
        Arm::Migrated => "migrated",
    });
    let kubectl = &world.kubectl;
    kubectl.ok(&["create", "namespace", &namespace]);
    let redis = TestRedis::start_reachable_at(world.host()).expect("redis-server starts");
    let client = world.node.plane().client().await.unwrap();

    // Every Pod of the arm as last seen (a deleted one with its deletionTimestamp), and each
    // Deployment's replicas every second.
    let pods: Arc<Mutex<BTreeMap<String, Pod>>> = Arc::default();
    let seen = pods.clone();
    let pod_api = Api::<Pod>::namespaced(client.clone(), &namespace);
    let watching = tokio::spawn(async move {
        let mut stream = watcher(pod_api, watcher::Config::default())
            .default_backoff()
            .touched_objects()
            .boxed();
        while let Some(event) = stream.next().await {
            if let Ok(pod) = event
                && let Some(uid) = pod.metadata.uid.clone()
            {
                seen.lock().unwrap().insert(uid, pod);
            }
        }
    });
    let samples: Arc<Mutex<Vec<(f64, usize, i32)>>> = Arc::default();
    let sampled = samples.clone();
    let deployments = Api::<Deployment>::namespaced(client.clone(), &namespace);
    let names = arm.deployments();
    let sampling = tokio::spawn(async move {
        loop {
            for (i, name) in names.iter().enumerate() {
                if let Ok(Some(d)) = deployments.get_opt(name).await {
                    let replicas = d.spec.and_then(|s| s.replicas).unwrap_or(0);
                    sampled
                        .lock()
                        .unwrap()
                        .push((testenv::now_unix(), i, replicas));
                }
            }
            tokio::time::sleep(Duration::from_secs(1)).await;
        }
    });

    let operator = (arm != Arm::Keda).then(|| start_operator(world, &namespace));
    apply(
        kubectl,
        &namespace,
        &format!("{namespace}.yaml"),
        &arm.manifest(world, &redis, work),
    );
    let mut backlog = world.produce(&redis, &namespace, work, (true, arm.plain_producer()));
    assert!(
        backlog.wait().unwrap().success(),
        "produce.py queued the backlog"
    );

    // Settled on the backlog: KEDA's batch workers at their maximum, lanepool's pool whole.
    let settled = testenv::until(180, "the arm settled on the batch backlog", || async {
        match arm {
            Arm::Keda => {
                let ready = |d: &str| {
                    kubectl.get(
                        &format!("deployment/{d}"),
                        &namespace,
                        "{.status.readyReplicas}",
                    )
                };
                ready("rq-batch") == (WORKERS - 6).to_string()
                    && ready("rq-urgent").parse::<u32>().unwrap_or(0) >= work.keda_min_replicas
            }
            Arm::LanePool => {
                kubectl.get("lanepool/jobs", &namespace, "{.status.replicas}")
                    == WORKERS.to_string()
                    && ready_pods(&pods) == WORKERS
            }
            Arm::Migrated => ready_pods(&pods) == WORKERS,
        }
    })
    .await;
    eprintln!(
        "[{:.0?}] {}: settled on the backlog in {settled:.0?}; the urgent profile {} for {} s",
        began.elapsed(),
        arm.name(),
        work.urgent_profile,
        work.duration
    );

    // The run.
    let mut producer =
        Killed(world.produce(&redis, &namespace, work, (false, arm.plain_producer())));
    let run_start = testenv::now_unix();
    let migration = (arm == Arm::Migrated).then(|| migrate(world.node, &namespace, &pods));
    let mut records = BTreeMap::new();
    let mut last_read = Instant::now();
    loop {
        if producer.0.try_wait().unwrap().is_some() {
            break;
        }
        if last_read.elapsed() >= RECORD_READS {
            read_records(&redis, FINISHED, &mut records);
            last_read = Instant::now();
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    let run_end = testenv::now_unix();
    let switch = migration.map(|m| m.join().expect("the migration"));
    let load = load();
    let ledger = redis.settle("rq:queue:urgent", "rq:queue:batch").await;
    read_records(&redis, SUBMITTED, &mut records);
    sampling.abort();
    eprintln!(
        "[{:.0?}] {}: ran {:.0} s; {ledger:?}; {} jobs' records",
        began.elapsed(),
        arm.name(),
        run_end - run_start,
        records.len()
    );

    // Seconds from the first urgent arrival, the profile's 0 s.
    let first = records
        .values()
        .filter(|r| r.origin == "urgent")
        .filter_map(|r| r.enqueued)
        .fold(f64::INFINITY, f64::min);
    assert!(first.is_finite(), "{}: no urgent job ran", arm.name());
    // The urgent jobs that arrived between `from` and `to` (Unix seconds): their wait p99 and
    // how many.
    let urgent_p99_in = |from: f64, to: f64| {
        let waits: Vec<f64> = records
            .values()
            .filter(|r| r.origin == "urgent")
            .filter_map(|r| Some((r.enqueued?, r.started?)))
            .filter(|(enqueued, _)| (from..to).contains(enqueued))
            .map(|(enqueued, started)| started - enqueued)
            .collect();
        let n = waits.len();
        (n > 0).then(|| (testenv::p99(waits), n))
    };
    let urgent_p99 = work
        .windows()
        .iter()
        .map(|&(_, from, to)| urgent_p99_in(first + from, first + to))
        .collect();
    let spike_start = first + work.windows()[2].1;
    let across_switch = switch.map(|(applied, switched)| {
        eprintln!(
            "{}: the LanePool applied {:.0} s and the old Deployment deleted {:.0} s after the \
             first urgent arrival",
            arm.name(),
            applied - first,
            switched - first
        );
        [
            urgent_p99_in(first, applied),
            urgent_p99_in(applied, switched),
            urgent_p99_in(switched, spike_start),
        ]
    });
    let urgent_not_started = records
        .values()
        .filter(|r| r.origin == "urgent" && r.started.is_none())
        .count();
    let run_end_s = first + work.duration as f64;
    let batch_done = records
        .values()
        .filter(|r| r.origin == "batch")
        .filter_map(|r| r.ended)
        .filter(|&ended| (first..run_end_s).contains(&ended))
        .count();

    let pods_seen: Vec<Pod> = pods.lock().unwrap().values().cloned().collect();
    let lifetimes: Vec<(f64, f64)> = pods_seen
        .iter()
        .filter_map(|pod| {
            let started = unix(pod.status.as_ref()?.start_time.as_ref()?);
            let ended = pod
                .metadata
                .deletion_timestamp
                .as_ref()
                .map_or(f64::INFINITY, unix);
            Some((started, ended))
        })
        .collect();
    // Each Pod's start to its deletion, or the run's end, within the run.
    let worker_seconds = lifetimes
        .iter()
        .map(|&(started, ended)| (ended.min(run_end_s) - started.max(first)).max(0.0))
        .sum();
    let most_at_once = lifetimes
        .iter()
        .map(|&(at, _)| {
            lifetimes
                .iter()
                .filter(|&&(s, e)| s <= at && at < e)
                .count()
        })
        .max()
        .unwrap_or(0);
    let median = |mut values: Vec<f64>| {
        values.sort_by(f64::total_cmp);
        values.get(values.len() / 2).copied().unwrap_or(f64::NAN)
    };
    let created = |pod: &Pod| pod.metadata.creation_timestamp.as_ref().map(unix);
    let running: Vec<f64> = pods_seen
        .iter()
        .filter_map(|pod| {
            let container = pod.status.as_ref()?.container_statuses.as_ref()?.first()?;
            let state = container.state.as_ref()?;
            let started = match (&state.running, &state.terminated) {
                (Some(running), _) => running.started_at.as_ref()?,
                (_, Some(terminated)) => terminated.started_at.as_ref()?,
                _ => return None,
            };
            Some(unix(started) - created(pod)?)
        })
        .collect();
    let ready: Vec<f64> = pods_seen
        .iter()
        .filter_map(|pod| {
            let ready = pod
                .status
                .as_ref()?
                .conditions
                .as_ref()?
                .iter()
                .find(|c| c.type_ == "Ready" && c.status == "True")?;
            Some(unix(ready.last_transition_time.as_ref()?) - created(pod)?)
        })
        .collect();
    let pod_start = (median(running), median(ready.clone()), ready.len());
    let samples = samples.lock().unwrap().clone();
    let replicas = (0..2)
        .map(|i| {
            let during = samples
                .iter()
                .filter(|(at, d, _)| *d == i && (first..run_end_s).contains(at))
                .map(|(_, _, r)| *r);
            let low = during.clone().min().unwrap_or(-1);
            (low, during.max().unwrap_or(-1))
        })
        .collect();
    eprintln!(
        "{}: replicas, at seconds from the first urgent arrival: {}",
        arm.name(),
        timeline(&samples, arm, first)
    );
    let hpa_last_scale = (arm == Arm::Keda).then(|| {
        kubectl.get(
            "hpa/keda-hpa-rq-urgent",
            &namespace,
            "{.status.lastScaleTime}",
        )
    });

    // Down before the next arm: the workers are idle (settle took the batch backlog away).
    match arm {
        Arm::Keda => {
            kubectl.ok(&["delete", "scaledobjects", "--all", "-n", &namespace]);
            kubectl.ok(&["delete", "deployments", "--all", "-n", &namespace]);
        }
        Arm::LanePool => {
            kubectl.ok(&["delete", "lanepool", "jobs", "-n", &namespace]);
        }
        Arm::Migrated => {
            kubectl.ok(&["delete", "lanepool", "jobs", "-n", &namespace]);
            kubectl.ok(&["delete", "deployments", "--all", "-n", &namespace]);
        }
    }
    testenv::until(120, "the arm's Pods gone", || async {
        kubectl
            .ok(&["get", "pods", "-n", &namespace, "-o", "name"])
            .trim()
            .is_empty()
    })
    .await;
    drop(operator);
    watching.abort();
    kubectl.ok(&["delete", "namespace", &namespace, "--wait=false"]);
    Figures {
        arm,
        urgent_p99,
        urgent_not_started,
        batch_done,
        worker_seconds,
        replicas,
        most_at_once,
        pod_start,
        hpa_last_scale,
        ledger,
        load,
        switch: switch.map(|(applied, switched)| (applied - first, switched - first)),
        across_switch,
    }
}

/// Ten seconds into the run, what a user does: `lanepool migrate` of the running Deployment
/// `rq-workers` into a LanePool `jobs`, applied as it printed it; once the pool's workers are all
/// Ready beside the old ones, the old Deployment deleted (its workers finish the job in hand in
/// their grace period). The wall-clock times the pool was applied and the old Deployment
/// deleted.
fn migrate(
    node: &'static TestNode,
    namespace: &str,
    pods: &Arc<Mutex<BTreeMap<String, Pod>>>,
) -> std::thread::JoinHandle<(f64, f64)> {
    let (namespace, pods) = (namespace.to_owned(), pods.clone());
    std::thread::spawn(move || {
        std::thread::sleep(Duration::from_secs(10));
        let output = Command::new(env!("CARGO_BIN_EXE_lanepool"))
            .args([
                "migrate",
                "--deployment",
                &format!("{namespace}/rq-workers"),
            ])
            .args(["--name", "jobs"])
            .env("KUBECONFIG", node.plane().kubeconfig())
            .output()
            .expect("running lanepool migrate");
        let said = String::from_utf8_lossy(&output.stderr);
        assert!(output.status.success(), "lanepool migrate: {said}");
        eprintln!("lanepool migrate said:\n{said}");
        let pool = String::from_utf8(output.stdout).expect("YAML");
        apply(&Kubectl(node), &namespace, "migrated-pool.yaml", &pool);
        let applied = testenv::now_unix();
        let pool_ready = || {
            let pods = pods.lock().unwrap();
            pods.values()
                .filter(|pod| {
                    pod.metadata
                        .labels
                        .as_ref()
                        .is_some_and(|l| l.contains_key("lanepool.dev/pool"))
                })
                .filter(|pod| is_ready(pod))
                .count()
        };
        let deadline = Instant::now() + Duration::from_secs(120);
        while pool_ready() < WORKERS {
            assert!(
                Instant::now() < deadline,
                "the migrated pool's workers never all Ready"
            );
            std::thread::sleep(Duration::from_millis(500));
        }
        Kubectl(node).ok(&[
            "delete",
            "deployment",
            "rq-workers",
            "-n",
            &namespace,
            "--wait=false",
        ]);
        (applied, testenv::now_unix())
    })
}

/// Each Deployment's spec.replicas where it changed, as `name: replicas@second …`, the seconds
/// from the first urgent arrival.
fn timeline(samples: &[(f64, usize, i32)], arm: Arm, first: f64) -> String {
    let mut lines = Vec::new();
    for (i, name) in arm.deployments().iter().enumerate() {
        let mut last = None;
        let mut changes = Vec::new();
        for &(at, d, replicas) in samples {
            if d == i && last != Some(replicas) {
                last = Some(replicas);
                changes.push(format!("{replicas}@{:.0}", at - first));
            }
        }
        lines.push(format!("{name}: {}", changes.join(" ")));
    }
    lines.join("; ")
}

/// The Pods seen running and Ready, not being deleted.
fn ready_pods(pods: &Mutex<BTreeMap<String, Pod>>) -> usize {
    pods.lock()
        .unwrap()
        .values()
        .filter(|pod| is_ready(pod))
        .count()
}

/// `lanepool run` at its defaults (as the chart runs it: a 15 s scrape interval, worker reads,
/// drains), watching `namespace`; its log in target/versus-keda/.
fn start_operator(world: &World, namespace: &str) -> Killed {
    let log = out_dir().join(format!("operator-{namespace}.log"));
    let child = Command::new(env!("CARGO_BIN_EXE_lanepool"))
        .args(["run", "--namespaces", namespace])
        .args(["--prometheus-url", &world.prometheus.url()])
        .args([
            "--leader-election",
            "false",
            "--metrics-addr",
            "127.0.0.1:0",
        ])
        .env("KUBECONFIG", world.node.plane().kubeconfig())
        .stdin(Stdio::null())
        .stdout(std::fs::File::create(&log).unwrap())
        .stderr(std::fs::File::create(log.with_extension("err")).unwrap())
        .spawn()
        .expect("starting lanepool run");
    Killed(child)
}

/// The comparison as a markdown table, one column per arm.
fn table(work: &Workload, arms: &[Figures]) -> String {
    let ms = work.urgent_ms as f64;
    let mut rows: Vec<(String, Vec<String>)> = Vec::new();
    for (i, (name, from, to)) in work.windows().iter().enumerate() {
        let label = format!("urgent wait p99, {name} ({from:.0}–{to:.0} s)");
        let cells = arms
            .iter()
            .map(|f| match f.urgent_p99[i] {
                Some((p99, n)) => format!(
                    "{:.0} ms = {:.1} × job ({n} jobs)",
                    p99 * 1000.0,
                    p99 * 1000.0 / ms
                ),
                None => "–".into(),
            })
            .collect();
        rows.push((label, cells));
    }
    let mut row = |label: &str, cell: &dyn Fn(&Figures) -> String| {
        rows.push((label.to_owned(), arms.iter().map(cell).collect()));
    };
    for (i, name) in [
        "before the pool",
        "during the switch",
        "after it, before the spike",
    ]
    .iter()
    .enumerate()
    {
        row(
            &format!("urgent wait p99 {name} (a migration)"),
            &|f| match (f.switch, f.across_switch.map(|w| w[i])) {
                (Some(_), Some(Some((p99, n)))) => format!(
                    "{:.0} ms = {:.1} × job ({n} jobs)",
                    p99 * 1000.0,
                    p99 * 1000.0 / ms
                ),
                (Some(_), _) => "no jobs".into(),
                (None, _) => "–".into(),
            },
        );
    }
    row(
        "the switch (pool applied → old Deployment deleted)",
        &|f| {
            f.switch
                .map_or("–".into(), |(a, d)| format!("{a:.0} s → {d:.0} s"))
        },
    );
    row("urgent jobs never started", &|f| {
        f.urgent_not_started.to_string()
    });
    row("batch jobs done in the run", &|f| f.batch_done.to_string());
    row("worker-seconds (Pods' start → deletion)", &|f| {
        format!(
            "{:.0} ({:.1} workers on average)",
            f.worker_seconds,
            f.worker_seconds / work.duration as f64
        )
    });
    row("jobs cut short / lost", &|f| {
        format!("{} / {}", f.ledger.cut_short, f.ledger.lost)
    });
    row("urgent workers (lowest–highest)", &|f| {
        format!(
            "{}–{} ({})",
            f.replicas[0].0,
            f.replicas[0].1,
            f.arm.deployments()[0]
        )
    });
    row("other workers (lowest–highest)", &|f| {
        format!(
            "{}–{} ({})",
            f.replicas[1].0,
            f.replicas[1].1,
            f.arm.deployments()[1]
        )
    });
    row("most workers at once", &|f| f.most_at_once.to_string());
    row(
        "Pod start, created → container running / Ready (medians)",
        &|f| {
            format!(
                "{:.1} s / {:.1} s over {} Pods",
                f.pod_start.0, f.pod_start.1, f.pod_start.2
            )
        },
    );
    row("load average at the run's end", &|f| f.load.clone());
    let mut text = format!(
        "| urgent {} /s × {} ms, batch {} ms (backlog {}), {WORKERS} workers | {} |\n| --- |{}\n",
        work.urgent_profile,
        work.urgent_ms,
        work.batch_ms,
        work.batch_backlog,
        arms.iter()
            .map(|f| f.arm.name())
            .collect::<Vec<_>>()
            .join(" | "),
        " --- |".repeat(arms.len()),
    );
    for (label, cells) in rows {
        text.push_str(&format!("| {label} | {} |\n", cells.join(" | ")));
    }
    text
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lanepool_and_keda_run_the_same_rq_workload_on_the_real_node() {
    let began = Instant::now();
    let work = Workload::from_env();
    let world = World::start().await;
    eprintln!(
        "[{:.0?}] the node, KEDA, the image and Prometheus ready",
        began.elapsed()
    );
    let keda = run_arm(&world, Arm::Keda, &work).await;
    let lanepool = run_arm(&world, Arm::LanePool, &work).await;
    let migrated = run_arm(&world, Arm::Migrated, &work).await;
    let arms = [keda, lanepool, migrated];
    let table = table(&work, &arms);
    std::fs::write(out_dir().join("table.md"), &table).unwrap();
    eprintln!("[{:.0?}] the arms ran\n\n{table}", began.elapsed());

    let [keda, lanepool, migrated] = &arms;
    for figures in &arms {
        let name = figures.arm.name();
        assert!(
            figures.ledger.settled,
            "{name}: the jobs in hand did not finish: {figures:?}"
        );
        assert_eq!(figures.ledger.lost, 0, "{name} lost jobs: {figures:?}");
        assert_eq!(figures.urgent_not_started, 0, "{name}: {figures:?}");
        assert!(
            figures.batch_done > 0,
            "{name} ran no batch job: {figures:?}"
        );
    }
    // KEDA scaled: its HPA took the urgent Deployment above its minimum.
    let (low, high) = keda.replicas[0];
    assert!(
        high > low && high > work.keda_min_replicas as i32,
        "KEDA never grew rq-urgent: {keda:?}"
    );
    assert!(
        keda.hpa_last_scale
            .as_ref()
            .is_some_and(|at| !at.is_empty()),
        "KEDA's HPA never scaled rq-urgent: {keda:?}"
    );
    // lanepool resized the reserve, and its drains cut no job short.
    let (low, high) = lanepool.replicas[0];
    assert!(
        high > low,
        "lanepool never resized the reserve: {lanepool:?}"
    );
    assert_eq!(lanepool.ledger.cut_short, 0, "{lanepool:?}");
    // The migration: the pool took over before the spike with no job cut short (the old
    // workers finished theirs in their grace period), and its reserve followed the spike from
    // the workers and the queue alone, the producer unchanged.
    let spike = work.windows()[2].1;
    assert!(
        migrated.switch.is_some_and(|(_, deleted)| deleted < spike),
        "the migrated pool did not take over before the spike: {migrated:?}"
    );
    assert_eq!(migrated.ledger.cut_short, 0, "{migrated:?}");
    let (_, high) = migrated.replicas[0];
    assert!(
        high >= 3,
        "the migrated pool's reserve did not follow the spike: {migrated:?}"
    );
}
