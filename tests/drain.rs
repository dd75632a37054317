//! Drained scale-downs against real components: kube-controller-manager makes the Pods, the
//! process kubelet (`examples/local_kubelet.rs`) runs each as a real `lane_worker` taking real
//! jobs from `lane_queue`, with a grace period shorter than a job. The reserve grows in a
//! saturated pool, so the shared Deployment shrinks under busy workers: with draining no job is
//! cut short and the reserve grows as fast as without; without it, the stopped workers' jobs are.
//! Where Pods take seconds to start, the shared workers that will stop stand in for the new
//! reserved ones meanwhile, and are the ones drained.

mod common;

use std::collections::BTreeSet;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use common::Killed;
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{Event, Pod};
use kube::Client;
use kube::api::{Api, ListParams, Patch, PatchParams, PostParams};
use lanepool::api::LanePool;
use lanepool_testenv::{
    self as testenv, ControlPlane, Controllers, InProcessOperator, LaneQueue, TestPrometheus,
    example, http_get,
};
use serde_json::json;
use testenv::until;

/// Each batch job: long enough that a drained worker is still busy well after the new reserved
/// workers are ready, ten times the grace period.
const BATCH_SECONDS: f64 = 10.0;
const GRACE_SECONDS: i64 = 1;
const SHARED: &str = "lanepool.dev/pool=jobs,lanepool.dev/role=shared";

/// One test's world: a namespace of the shared control plane (with its controller-manager), a
/// lane queue with a batch backlog of long jobs, Prometheus, a process kubelet and the operator.
struct World {
    /// A control plane of this test's own (one it may freeze), or none: the shared one.
    plane: Option<ControlPlane>,
    client: Client,
    /// Where the process kubelet keeps the workers' output (and reads which probes fail).
    logs: PathBuf,
    namespace: String,
    queue: SocketAddr,
    _kubelet: Killed,
    _queue: LaneQueue,
    _prometheus: TestPrometheus,
    operators: Operators,
}

/// Who runs the controller: one in-process operator, or two `lanepool run` processes that elect
/// a leader.
enum Operators {
    InProcess(InProcessOperator),
    Elected([Elected; 2]),
}

/// A `lanepool run` process campaigning for the Lease `lanepool-operator` of its namespace,
/// killed when dropped.
struct Elected {
    identity: String,
    child: Child,
    log: PathBuf,
}

impl Elected {
    fn start(identity: &str, namespace: &str, prometheus: &str, kubeconfig: &Path) -> Self {
        let log =
            PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join(format!("{namespace}-{identity}.log"));
        let child = Command::new(env!("CARGO_BIN_EXE_lanepool"))
            .args(["run", "--identity", identity, "--namespaces", namespace])
            .args(["--leader-election-namespace", namespace])
            .args(["--leader-election-lease-duration", "3s"])
            .args([
                "--prometheus-url",
                prometheus,
                "--metrics-addr",
                "127.0.0.1:0",
            ])
            // As the in-process operator's settings: the test Prometheus scrapes every second.
            .args(["--rate-window", "5s", "--job-time-window", "5s"])
            .args(["--scrape-interval", "1s"])
            .env("KUBECONFIG", kubeconfig)
            .stdout(std::fs::File::create(&log).unwrap())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("starting lanepool run");
        Self {
            identity: identity.to_string(),
            child,
            log,
        }
    }

    fn signal(&self, signal: i32) {
        // SAFETY: kill(2) on our own child.
        unsafe { libc_kill(self.child.id() as i32, signal) };
    }

    fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }
}

unsafe extern "C" {
    #[link_name = "kill"]
    fn libc_kill(pid: i32, signal: i32) -> i32;
}

const SIGKILL: i32 = 9;
const SIGCONT: i32 = 18;
const SIGSTOP: i32 = 19;

/// Sends `signal` to the process `pid` (a control plane's, in fault tests).
fn signal(pid: u32, signal: i32) {
    // SAFETY: kill(2) on a process this test started.
    unsafe { libc_kill(pid as i32, signal) };
}

impl Drop for Elected {
    fn drop(&mut self) {
        self.signal(SIGCONT);
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl World {
    async fn start(prefix: &str, drain_timeout: Duration, pod_start: Duration) -> Self {
        Self::start_with(prefix, drain_timeout, pod_start, false).await
    }

    /// `elected`: two operator processes electing a leader, with the default drain timeout.
    async fn start_with(
        prefix: &str,
        drain_timeout: Duration,
        pod_start: Duration,
        elected: bool,
    ) -> Self {
        let plane = testenv::shared_with(Controllers::Pods).expect("the control plane starts");
        Self::start_on(plane, prefix, drain_timeout, pod_start, elected).await
    }

    /// Two elected operators on a control plane of the test's own, whose
    /// kube-controller-manager it may freeze without holding up other tests.
    async fn start_private(prefix: &str) -> Self {
        let plane = ControlPlane::start_with(Controllers::Pods)
            .await
            .expect("the control plane starts");
        let drain_timeout = lanepool::controller::DEFAULT_DRAIN_TIMEOUT;
        let mut world = Self::start_on(&plane, prefix, drain_timeout, Duration::ZERO, true).await;
        world.plane = Some(plane);
        world
    }

    async fn start_on(
        plane: &ControlPlane,
        prefix: &str,
        drain_timeout: Duration,
        pod_start: Duration,
        elected: bool,
    ) -> Self {
        let client = plane.client().await.unwrap();
        let namespace = plane.namespace(&client, prefix).await.unwrap();
        let queue_process = start_queue(&namespace);
        let queue = queue_process.addr();
        let prometheus = TestPrometheus::start(&[queue]).unwrap();
        let logs: PathBuf = plane.dir().join(format!("workers-{namespace}"));
        // A loopback block of its own, so parallel tests and the demo never share an address.
        let block = 2 + namespace.bytes().map(u32::from).sum::<u32>() % 240;
        let kubelet = Command::new(example("local_kubelet"))
            .args(["--namespace", &namespace, "--node", &namespace])
            .args(["--queue-url", &format!("http://{queue}")])
            .arg("--worker")
            .arg(example("lane_worker"))
            .arg("--log-dir")
            .arg(&logs)
            .arg("--pod-targets")
            .arg(prometheus.pod_targets())
            .args(["--ip-block", &block.to_string()])
            .args(["--pod-start", &format!("{}ms", pod_start.as_millis())])
            .env("KUBECONFIG", plane.kubeconfig())
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("starting local_kubelet");
        let operators = if elected {
            let start = |identity| {
                Elected::start(identity, &namespace, &prometheus.url(), plane.kubeconfig())
            };
            Operators::Elected([start("a"), start("b")])
        } else {
            let mut settings = InProcessOperator::settings(prometheus.url());
            settings.drain_timeout = drain_timeout;
            let operator =
                InProcessOperator::start_with(client.clone(), vec![namespace.clone()], settings);
            Operators::InProcess(operator)
        };
        Self {
            plane: None,
            logs,
            client,
            namespace,
            queue,
            _kubelet: Killed(kubelet),
            _queue: queue_process,
            _prometheus: prometheus,
            operators,
        }
    }

    /// How many workers the in-process operator's shrinks stopped busy, as its metric says.
    fn busy_stopped(&self) -> u64 {
        let Operators::InProcess(operator) = &self.operators else {
            panic!("only the in-process operator's metrics are read");
        };
        operator
            .metrics()
            .busy_workers_stopped(&self.namespace, "jobs")
    }

    /// The elected operator that holds the Lease now.
    async fn leader(&self) -> Option<&Elected> {
        let Operators::Elected(elected) = &self.operators else {
            return None;
        };
        let lease = Api::<Lease>::namespaced(self.client.clone(), &self.namespace)
            .get_opt("lanepool-operator")
            .await
            .ok()??;
        let holder = lease.spec?.holder_identity?;
        elected.iter().find(|e| e.identity == holder)
    }

    /// The pool `jobs`: 5 workers, 1–4 reserved for urgent (which barely arrives: 1 reserved),
    /// the rest shared and saturated by the batch backlog; a grace period of 1 s.
    async fn apply_pool(&self) {
        let pool: LanePool = serde_json::from_value(json!({
            "apiVersion": "lanepool.dev/v1alpha1",
            "kind": "LanePool",
            "metadata": {"name": "jobs"},
            "spec": {
                "lanes": lanes(1),
                "headroom": 1.5,
                "totalWorkers": 5,
                "shared": {"minReplicas": 1},
                "interval": "5s",
                "template": {"spec": {
                    "terminationGracePeriodSeconds": GRACE_SECONDS,
                    "containers": [{
                        "name": "worker",
                        "image": "ghcr.io/lanepool/lane-worker:0.1.0",
                        "ports": [{"name": "metrics", "containerPort": 9100}],
                        "env": [
                            {"name": "LANEPOOL_QUEUE_URL", "value": format!("http://{}", self.queue)},
                            {"name": "POD_IP", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}},
                            {"name": "LANEPOOL_METRICS_ADDR", "value": "$(POD_IP):9100"},
                        ],
                    }],
                }},
            },
        }))
        .unwrap();
        Api::<LanePool>::namespaced(self.client.clone(), &self.namespace)
            .create(&PostParams::default(), &pool)
            .await
            .unwrap();
    }

    /// Raises the reserve's minimum: the reserve grows at once and the shared workers shrink.
    async fn raise_reserve(&self, min: i32) {
        Api::<LanePool>::namespaced(self.client.clone(), &self.namespace)
            .patch(
                "jobs",
                &PatchParams::default(),
                &Patch::Merge(json!({"spec": {"lanes": lanes(min)}})),
            )
            .await
            .unwrap();
    }

    async fn deployment(&self, name: &str) -> Option<Deployment> {
        Api::<Deployment>::namespaced(self.client.clone(), &self.namespace)
            .get_opt(name)
            .await
            .unwrap()
    }

    /// `spec.replicas` and `status.readyReplicas` of a Deployment (0 when it is missing).
    async fn counts(&self, name: &str) -> (i32, i32) {
        let deployment = self.deployment(name).await;
        let spec = deployment
            .as_ref()
            .and_then(|d| d.spec.as_ref()?.replicas)
            .unwrap_or(0);
        let ready = deployment
            .as_ref()
            .and_then(|d| d.status.as_ref()?.ready_replicas)
            .unwrap_or(0);
        (spec, ready)
    }

    async fn pods(&self, selector: &str) -> Vec<Pod> {
        Api::<Pod>::namespaced(self.client.clone(), &self.namespace)
            .list(&ListParams::default().labels(selector))
            .await
            .unwrap()
            .items
    }

    /// The names of the Pods `selector` selects that are not being deleted.
    async fn pod_names(&self, selector: &str) -> BTreeSet<String> {
        self.pods(selector)
            .await
            .into_iter()
            .filter(|p| p.metadata.deletion_timestamp.is_none())
            .filter_map(|p| p.metadata.name)
            .collect()
    }

    /// Each shared worker's answer at its metrics port, `None` for one not answering.
    async fn shared_answers(&self) -> Vec<Option<String>> {
        self.pods(SHARED)
            .await
            .iter()
            .map(|pod| {
                let ip = pod.status.as_ref()?.pod_ip.clone()?;
                let (_, text) = http_get(format!("{ip}:9100").parse().ok()?, "/metrics").ok()?;
                Some(text)
            })
            .collect()
    }

    /// How long ago each shared worker's job started, `None` for one idle or not answering.
    async fn shared_job_ages(&self) -> Vec<Option<f64>> {
        let now = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .unwrap()
            .as_secs_f64();
        self.shared_answers()
            .await
            .into_iter()
            .map(|text| {
                let started = text?
                    .lines()
                    .find(|l| l.starts_with("lanepool_worker_job_started_timestamp_seconds{"))?
                    .rsplit(' ')
                    .next()?
                    .parse::<f64>()
                    .ok()?;
                Some(now - started)
            })
            .collect()
    }

    /// How many shared workers set `gauge` to 1: a drain keeps them from taking jobs
    /// (`lanepool_worker_draining`), or they stand in (`lanepool_worker_standing_in`).
    async fn shared_saying(&self, gauge: &str) -> usize {
        let says = |text: &str| {
            text.lines()
                .filter(|l| !l.starts_with('#'))
                .filter_map(|l| l.strip_prefix(gauge))
                .any(|rest| rest.ends_with(" 1"))
        };
        self.shared_answers()
            .await
            .iter()
            .filter(|text| text.as_deref().is_some_and(says))
            .count()
    }

    /// The queue's count of batch jobs taken back from a worker that died holding one.
    fn cut_short(&self) -> f64 {
        let (_, metrics) = http_get(self.queue, "/metrics").unwrap();
        metrics
            .lines()
            .find(|l| {
                l.starts_with("lanepool_jobs_cut_short_total{") && l.contains("lane=\"batch\"")
            })
            .and_then(|l| l.rsplit(' ').next()?.parse().ok())
            .unwrap_or_else(|| panic!("no cut-short count in:\n{metrics}"))
    }

    async fn events(&self, reason: &str) -> Vec<String> {
        Api::<Event>::namespaced(self.client.clone(), &self.namespace)
            .list(&ListParams::default())
            .await
            .unwrap()
            .items
            .into_iter()
            .filter(|e| e.reason.as_deref() == Some(reason))
            .filter_map(|e| e.message)
            .collect()
    }
}

fn lanes(reserve_min: i32) -> serde_json::Value {
    json!([
        {"name": "urgent", "reserve": {"min": reserve_min, "max": 4, "sizing": "Formula", "jobTime": {"fallback": "20ms"}}},
        {"name": "batch"},
    ])
}

/// The lane queue: urgent jobs at 5/s (a reserve of 1) and a backlog of 10 s batch jobs.
fn start_queue(namespace: &str) -> LaneQueue {
    let ms = (BATCH_SECONDS * 1000.0) as u64;
    LaneQueue::start(&[
        "--pool=jobs".into(),
        "--urgent-profile=0s=5".into(),
        format!("--namespace={namespace}"),
        "--batch-backlog=200".into(),
        "--batch-rate=0".into(),
        format!("--batch-ms={ms}..{ms}"),
    ])
}

/// What one saturated shrink did.
struct Shrunk {
    /// From raising the reserve to its new workers ready.
    growth: Duration,
    /// From raising the reserve to the shared Deployment's shrink.
    shrink: Duration,
    cut_short: f64,
    /// The most shared workers seen draining before the new reserved workers were ready.
    drained_before_ready: usize,
    /// The most shared workers seen standing in before the new reserved workers were ready.
    standing_in_before_ready: usize,
}

/// Applies the pool and waits until its 1 reserved and 4 shared workers are ready and every
/// shared worker is 2 s or less into a 10 s batch job.
async fn busy_pool(world: &World) {
    world.apply_pool().await;
    until(90, "1 reserved and 4 shared workers ready", || async {
        world.counts("jobs-urgent-reserved").await.1 == 1
            && world.counts("jobs-shared").await.1 == 4
    })
    .await;
    until(
        60,
        "every shared worker 2 s or less into its job",
        || async {
            let ages = world.shared_job_ages().await;
            ages.len() == 4 && ages.iter().all(|age| age.is_some_and(|a| a < 2.0))
        },
    )
    .await;
}

/// Grows the reserve from 1 to 3 in a budget of 5 just after every shared worker took a fresh
/// 10 s job, so the shared Deployment shrinks from 4 to 2 with every worker 8 s or more from done.
async fn saturated_shrink(world: &World) -> Shrunk {
    busy_pool(world).await;
    let raised = Instant::now();
    world.raise_reserve(3).await;
    let (mut growth, mut shrink) = (None, None);
    let (mut drained_before_ready, mut standing_in_before_ready) = (0, 0);
    while shrink.is_none() || growth.is_none() {
        assert!(
            raised.elapsed() < Duration::from_secs(60),
            "the reserve did not grow, or shared did not shrink, within 60 s"
        );
        if growth.is_none() {
            // Drains seen before a read that finds the new workers not all ready yet came before
            // they were ready.
            let draining = world.shared_saying("lanepool_worker_draining").await;
            let standing_in = world.shared_saying("lanepool_worker_standing_in").await;
            if world.counts("jobs-urgent-reserved").await.1 >= 3 {
                growth = Some(raised.elapsed());
            } else {
                drained_before_ready = drained_before_ready.max(draining);
                standing_in_before_ready = standing_in_before_ready.max(standing_in);
            }
        }
        if shrink.is_none() && world.counts("jobs-shared").await.0 == 2 {
            shrink = Some(raised.elapsed());
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    // The stopped workers are gone (finished, or killed at the end of their grace period).
    until(30, "two shared Pods left", || async {
        world.pods(SHARED).await.len() == 2
    })
    .await;
    Shrunk {
        growth: growth.unwrap_or_default(),
        shrink: shrink.unwrap_or_default(),
        cut_short: world.cut_short(),
        drained_before_ready,
        standing_in_before_ready,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn drained_workers_finish_their_jobs_before_the_shrink_and_the_reserve_grows_at_once() {
    let world = World::start(
        "drain",
        lanepool::controller::DEFAULT_DRAIN_TIMEOUT,
        Duration::ZERO,
    )
    .await;
    let shrunk = saturated_shrink(&world).await;
    assert_eq!(
        shrunk.cut_short, 0.0,
        "a drained worker's job was cut short"
    );
    assert_eq!(
        world.busy_stopped(),
        0,
        "the operator says it stopped busy workers"
    );
    // Until their replacements are ready the shared workers take jobs as usual.
    assert_eq!(
        shrunk.drained_before_ready, 0,
        "shared workers drained while the new reserved workers started"
    );
    assert!(
        shrunk.growth < Duration::from_secs(6),
        "the reserve took {:?} to grow: it waited for the drain",
        shrunk.growth
    );
    // The shrink waited for the jobs in hand (8 s or more), well after the reserve grew.
    assert!(
        shrunk.shrink >= Duration::from_secs(7),
        "shared shrank {:?} after the reserve was raised, before its workers' jobs could end",
        shrunk.shrink
    );
    let draining = world.events("Draining").await;
    assert!(
        draining
            .iter()
            .any(|note| note.starts_with("2 shared workers finish their jobs")),
        "{draining:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_a_drain_a_saturated_shrink_cuts_the_stopped_workers_jobs_short() {
    // The premise of the test above: the same shrink with draining off stops two workers 8 s
    // from the end of their jobs, and a grace period of 1 s kills them mid-job.
    let world = World::start("no-drain", Duration::ZERO, Duration::ZERO).await;
    let shrunk = saturated_shrink(&world).await;
    assert!(
        shrunk.cut_short >= 1.0,
        "no job cut short: the scenario does not stop busy workers"
    );
    // The operator knew: its ranking read the workers it stopped busy.
    assert_eq!(world.busy_stopped() as f64, shrunk.cut_short);
    assert!(
        shrunk.shrink < Duration::from_secs(7),
        "shared shrank {:?} after the reserve was raised",
        shrunk.shrink
    );
    assert!(world.events("Draining").await.is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn while_new_reserved_workers_start_the_shared_workers_they_replace_stand_in_and_then_drain()
{
    // Pods start in 4 s: the reserve's growth 1 → 3 waits for them, and meanwhile the 2 shared
    // workers the shrink will stop take only the urgent lane (once their batch job is done).
    let world = World::start(
        "stand-in",
        lanepool::controller::DEFAULT_DRAIN_TIMEOUT,
        Duration::from_secs(4),
    )
    .await;
    let shrunk = saturated_shrink(&world).await;
    assert_eq!(
        shrunk.standing_in_before_ready, 2,
        "the shared workers to stop did not stand in while the new reserved workers started"
    );
    assert_eq!(shrunk.drained_before_ready, 0);
    println!("stand-in world: {} batch jobs cut short", shrunk.cut_short);
    assert_eq!(shrunk.cut_short, 0.0, "a stand-in's job was cut short");
    assert_eq!(
        world.busy_stopped(),
        0,
        "the operator says it stopped busy workers"
    );
    assert!(
        shrunk.growth >= Duration::from_secs(4),
        "the new reserved workers were ready after {:?}, before their pod start",
        shrunk.growth
    );
    // The workers that stood in are the ones drained and stopped.
    let stood_in = world.events("StandingIn").await;
    let drained = world.events("Draining").await;
    assert!(
        stood_in
            .iter()
            .any(|note| note.starts_with("2 shared workers serve lane urgent until")),
        "{stood_in:?}"
    );
    assert_eq!(stood_in.len(), 1, "{stood_in:?}");
    assert_eq!(drained.len(), 1, "{drained:?}");
    assert_eq!(named(&stood_in[0]), named(&drained[0]));
    let left: Vec<String> = world
        .pods(SHARED)
        .await
        .iter()
        .map(|p| p.metadata.name.clone().unwrap_or_default())
        .collect();
    assert!(
        named(&stood_in[0]).iter().all(|n| !left.contains(n)),
        "a worker that stood in is still running: {left:?}"
    );
}

/// Two `lanepool run` processes electing a leader (a 3 s Lease) run the pool; the reserve is
/// raised as in [`saturated_shrink`], and the leader is frozen (SIGSTOP) as soon as its drain of
/// 2 of the 4 busy shared workers (8 s or more from done) has begun. Returns the frozen leader
/// and when it froze, since the raise.
async fn leader_frozen_mid_drain(world: &World) -> (&Elected, Instant) {
    busy_pool(world).await;
    let raised = Instant::now();
    world.raise_reserve(3).await;
    drain_begins(world, 20).await;
    let leader = world.leader().await.expect("a leader holds the Lease");
    leader.signal(SIGSTOP);
    println!(
        "leader {} frozen {:.1} s after the reserve was raised",
        leader.identity,
        raised.elapsed().as_secs_f64()
    );
    (leader, raised)
}

/// Waits until `leader`, thawed, exits: it sees another holder of the Lease.
async fn exits(leader: &Elected) {
    leader.signal(SIGCONT);
    let pid = leader.child.id();
    until(15, "the thawed leader exits", || async {
        std::fs::read_to_string(format!("/proc/{pid}/stat"))
            .map_or(true, |s| s.split_whitespace().nth(2) == Some("Z"))
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_leader_frozen_mid_drain_leaves_the_shrink_to_the_standby_and_no_job_is_cut_short() {
    let world = World::start_with(
        "leader-drain",
        lanepool::controller::DEFAULT_DRAIN_TIMEOUT,
        Duration::ZERO,
        true,
    )
    .await;
    let (leader, raised) = leader_frozen_mid_drain(&world).await;
    until(40, "the shared Deployment shrinks to 2", || async {
        world.counts("jobs-shared").await.0 == 2
    })
    .await;
    let shrink = raised.elapsed();
    let standby = world.leader().await.expect("the standby holds the Lease");
    assert_ne!(
        standby.identity, leader.identity,
        "the frozen leader still leads"
    );
    until(30, "two shared Pods left", || async {
        world.pods(SHARED).await.len() == 2
    })
    .await;
    let cut_short = world.cut_short();
    let still_draining = world.shared_saying("lanepool_worker_draining").await;
    println!(
        "standby {} shrank shared {:.1} s after the raise; {cut_short} batch jobs cut short; \
         drains: {:?}",
        standby.identity,
        shrink.as_secs_f64(),
        world.events("Draining").await
    );
    assert_eq!(cut_short, 0.0, "a drained worker's job was cut short");
    assert_eq!(still_draining, 0, "a worker left is still draining");
    assert!(
        shrink >= Duration::from_secs(7),
        "shared shrank {shrink:?} after the reserve was raised, before its workers' jobs could end"
    );
    exits(leader).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_drain_a_frozen_leader_left_is_ended_by_the_standby_when_the_shrink_is_called_off() {
    let world = World::start_with(
        "leader-called-off",
        lanepool::controller::DEFAULT_DRAIN_TIMEOUT,
        Duration::ZERO,
        true,
    )
    .await;
    let (leader, _) = leader_frozen_mid_drain(&world).await;
    // While the leader is frozen the pool gets 2 more workers: the reserve grows 1 → 3 and the
    // shared workers stay 4, so nothing shrinks any more, and the drained workers would sit
    // idle until their drain lapses (the drain timeout and 15 s).
    Api::<LanePool>::namespaced(world.client.clone(), &world.namespace)
        .patch(
            "jobs",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"totalWorkers": 7}})),
        )
        .await
        .unwrap();
    let took_over = until(20, "the standby leads", || async {
        world
            .leader()
            .await
            .is_some_and(|l| l.identity != leader.identity)
    })
    .await;
    let back = testenv::poll_until(Duration::from_secs(15), || async {
        world.shared_saying("lanepool_worker_draining").await == 0
    })
    .await;
    let standby = world.leader().await.expect("the standby holds the Lease");
    let back = back.unwrap_or_else(|| {
        panic!(
            "shared workers still draining 15 s after the standby led:\n{}",
            standby.log()
        )
    });
    let cut_short = world.cut_short();
    println!(
        "standby led {:.1} s after the freeze; the frozen leader's drain ended {:.1} s later; \
         {cut_short} batch jobs cut short",
        took_over.as_secs_f64(),
        back.as_secs_f64()
    );
    assert_eq!(world.counts("jobs-shared").await.0, 4, "shared shrank");
    assert_eq!(cut_short, 0.0);
    exits(leader).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_shrink_during_a_rollover_waits_for_it_and_cuts_no_job_short() {
    // Issue 50, item 3: the pod template changes under load and, while the new workers take
    // over, the reserve grows and shared shrinks 4 → 2. The Deployment controller would take the
    // shrink from both ReplicaSets in proportion, not from drained workers: the shrink waits for
    // the rollover, which drains its own, and then drains as any other.
    let world = World::start(
        "rollshrink",
        lanepool::controller::DEFAULT_DRAIN_TIMEOUT,
        Duration::ZERO,
    )
    .await;
    busy_pool(&world).await;
    let old: BTreeSet<String> = world.pod_names(SHARED).await;
    change_template(&world).await;
    until(30, "a shared worker of the new template", || async {
        !world.pod_names(SHARED).await.is_subset(&old)
    })
    .await;
    world.raise_reserve(3).await;
    until(
        180,
        "3 reserved and 2 shared workers, of the new template",
        || async {
            let now = world.pod_names(SHARED).await;
            world.counts("jobs-urgent-reserved").await.1 == 3
                && now.len() == 2
                && now.is_disjoint(&old)
        },
    )
    .await;
    let cut_short = world.cut_short();
    println!(
        "shrink during a rollover: {cut_short} jobs cut short; busy workers stopped: {}",
        world.busy_stopped()
    );
    assert_eq!(cut_short, 0.0, "a job was cut short");
    assert_eq!(world.busy_stopped(), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_hour_long_drain_timeout_drains_before_the_shrink_and_cuts_no_job_short() {
    // Issue 50, item 1: `--drain-timeout 1h`, and the shrink comes before any batch job has
    // finished (its job time is not known yet), so the drain waits its whole limit. Asking the
    // workers for the limit and the margin (3,615 s) was answered 400, a refusal, and the shrink
    // stopped them busy.
    let world = World::start("hour", Duration::from_secs(3600), Duration::ZERO).await;
    let shrunk = saturated_shrink(&world).await;
    println!(
        "an hour's drain timeout: shrank {:.1} s after the raise; {} jobs cut short",
        shrunk.shrink.as_secs_f64(),
        shrunk.cut_short
    );
    assert_eq!(
        shrunk.cut_short, 0.0,
        "a drained worker's job was cut short"
    );
    assert_eq!(world.busy_stopped(), 0);
    assert!(
        shrunk.shrink >= Duration::from_secs(7),
        "shared shrank {:?} after the raise, before its workers' jobs could end",
        shrunk.shrink
    );
}

/// Waits at most `seconds` for the pool's first `Draining` event.
async fn drain_begins(world: &World, seconds: u64) {
    until(seconds, "the drain", || async {
        !world.events("Draining").await.is_empty()
    })
    .await;
}

/// The Pod names a `Draining` or `StandingIn` note ends with.
fn named(note: &str) -> BTreeSet<String> {
    note.rsplit(": ")
        .next()
        .unwrap_or_default()
        .split(", ")
        .map(str::to_string)
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_busy_worker_that_fails_its_readiness_probe_is_not_stopped_in_place_of_a_drained_one() {
    // Issue 50, item 7: once the drain chose its workers, a busy shared worker it did not choose
    // fails its readiness probe. The ReplicaSet controller deletes a Pod that is not ready before
    // it looks at deletion costs: the shrink must not go while that worker is busy, and the
    // drain takes it.
    let world = World::start(
        "flap",
        lanepool::controller::DEFAULT_DRAIN_TIMEOUT,
        Duration::ZERO,
    )
    .await;
    busy_pool(&world).await;
    world.raise_reserve(3).await;
    drain_begins(&world, 30).await;
    let drained = named(&world.events("Draining").await[0]);
    let flapping = world
        .pod_names(SHARED)
        .await
        .into_iter()
        .find(|pod| !drained.contains(pod))
        .expect("a shared worker not drained");
    // Its readiness probe fails from now on (the process kubelet reports it not Ready).
    let unready = world.logs.join("unready");
    std::fs::create_dir_all(&unready).unwrap();
    std::fs::write(unready.join(&flapping), "").unwrap();
    until(90, "shared shrinks to 2", || async {
        world.counts("jobs-shared").await.0 == 2
    })
    .await;
    until(30, "two shared Pods left", || async {
        world.pods(SHARED).await.len() == 2
    })
    .await;
    let cut_short = world.cut_short();
    println!(
        "a busy worker failing its probe: {cut_short} jobs cut short; busy workers stopped: {}; drains: {:?}",
        world.busy_stopped(),
        world.events("Draining").await
    );
    assert_eq!(cut_short, 0.0, "a job was cut short");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_shrink_the_controller_manager_carries_out_late_after_a_new_leader_cuts_no_job_short() {
    // Issue 50, item 2: kube-controller-manager is frozen from just before the shrink is written
    // until a minute after, past the drained workers' lapse, and the leader that wrote it is
    // killed in that window. The drained workers must still be draining (renewed by the new
    // leader, not called off) when the ReplicaSet controller at last stops them.
    let world = World::start_private("late-rs").await;
    let plane = world.plane.as_ref().expect("the test's own control plane");
    let manager = plane
        .controller_manager_pid()
        .expect("kube-controller-manager runs");
    busy_pool(&world).await;
    world.raise_reserve(3).await;
    // The drain starts once the new reserved workers are ready: nothing needs the controller
    // manager from here to the shrink.
    drain_begins(&world, 30).await;
    signal(manager, SIGSTOP);
    let frozen = Instant::now();
    until(30, "the shrink written", || async {
        world.counts("jobs-shared").await.0 == 2
    })
    .await;
    let writer = world.leader().await.expect("a leader wrote the shrink");
    writer.signal(SIGKILL);
    let killed = writer.identity.clone();
    until(20, "the standby leads", || async {
        world.leader().await.is_some_and(|l| l.identity != killed)
    })
    .await;
    tokio::time::sleep_until((frozen + Duration::from_secs(60)).into()).await;
    let still_draining = world.shared_saying("lanepool_worker_draining").await;
    signal(manager, SIGCONT);
    until(60, "two shared Pods left", || async {
        world.pods(SHARED).await.len() == 2
    })
    .await;
    let cut_short = world.cut_short();
    let standby = world.leader().await.expect("the standby leads");
    println!(
        "the controller-manager frozen 60 s over the shrink and a new leader: {still_draining} \
         workers still draining at the thaw; {cut_short} jobs cut short"
    );
    assert_eq!(
        still_draining,
        2,
        "the drained workers are draining when the ReplicaSet controller acts:\n{}",
        standby.log()
    );
    assert_eq!(cut_short, 0.0, "a job was cut short");
}

/// Changes the shared workers' pod template (an environment variable added).
async fn change_template(world: &World) {
    Api::<LanePool>::namespaced(world.client.clone(), &world.namespace)
        .patch(
            "jobs",
            &PatchParams::default(),
            &Patch::Json::<()>(
                serde_json::from_value(json!([{
                    "op": "add",
                    "path": "/spec/template/spec/containers/0/env/-",
                    "value": {"name": "ROLLOVER", "value": "1"},
                }]))
                .unwrap(),
            ),
        )
        .await
        .unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_template_change_under_load_rolls_workers_over_only_once_they_are_idle() {
    // Every shared worker 2 s or less into a 10 s job when the pod template changes: the new
    // workers wait behind their readiness gate, each old one is drained, and a new one counts
    // as available (so the Deployment controller stops an old one) only once one is idle.
    let world = World::start(
        "rollover",
        lanepool::controller::DEFAULT_DRAIN_TIMEOUT,
        Duration::ZERO,
    )
    .await;
    busy_pool(&world).await;
    let old: BTreeSet<String> = world.pod_names(SHARED).await;
    let changed = Instant::now();
    change_template(&world).await;
    let first_gone = std::sync::Mutex::new(None);
    let rolled = until(150, "every shared worker of the new template", || async {
        let now = world.pod_names(SHARED).await;
        {
            let mut first = first_gone.lock().unwrap();
            if first.is_none() && !old.is_subset(&now) {
                *first = Some(changed.elapsed());
            }
        }
        now.is_disjoint(&old) && now.len() == 4 && world.counts("jobs-shared").await.1 == 4
    })
    .await;
    let first_gone = first_gone.into_inner().unwrap();
    // The old workers' processes are gone (finished, or killed at the end of their grace).
    until(30, "the old shared Pods removed", || async {
        world.pods(SHARED).await.len() == 4
    })
    .await;
    let cut_short = world.cut_short();
    let draining = world.events("Draining").await;
    println!(
        "rollover of 4 busy shared workers: the first stopped {:.1} s after the change, all \
         replaced in {:.1} s; {cut_short} batch jobs cut short; busy workers stopped: {}; \
         drains: {draining:?}",
        first_gone.unwrap_or_default().as_secs_f64(),
        rolled.as_secs_f64(),
        world.busy_stopped(),
    );
    assert_eq!(cut_short, 0.0, "a job was cut short by the rollover");
    assert_eq!(world.busy_stopped(), 0);
    // The first old worker went only once its job (8 s or more from done) had ended.
    assert!(
        first_gone.is_some_and(|t| t >= Duration::from_secs(7)),
        "an old worker stopped {first_gone:?} after the change, before its job could end"
    );
    assert!(
        draining
            .iter()
            .any(|note| note.contains("new template take their place")),
        "{draining:?}"
    );
}
