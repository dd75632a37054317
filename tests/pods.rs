//! The operator against a control plane with kube-controller-manager: Deployments become
//! ReplicaSets and Pods, the garbage collector removes what a deleted LanePool owned, a
//! shrinking Deployment loses its idle workers before its busy ones, and a drain neither waits
//! for a worker that does not drain nor past its timeout for one that never finishes.

use std::collections::BTreeSet;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use k8s_openapi::api::apps::v1::{Deployment, ReplicaSet};
use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams, PostParams};
use kube::{Client, ResourceExt};
use lanepool::api::LanePool;
use lanepool::controller::{BUSY_COST, DELETION_COST, GRACE_PERIOD_TOO_SHORT};
use lanepool_testenv::{
    self as testenv, Controllers, InProcessOperator, SimulatedWorkers, TestPrometheus,
};
use serde_json::json;
use testenv::until;

/// One test's world: a namespace of the shared control plane (with its controller-manager),
/// simulated workers, Prometheus and a running controller.
struct World {
    client: Client,
    namespace: String,
    workers: SimulatedWorkers,
    _prometheus: TestPrometheus,
    _operator: InProcessOperator,
}

impl World {
    async fn start(prefix: &str, idle_workers_first: bool) -> Self {
        let plane = testenv::shared_with(Controllers::Pods).expect("the control plane starts");
        let client = plane.client().await.unwrap();
        let namespace = plane.namespace(&client, prefix).await.unwrap();
        let workers = SimulatedWorkers::start().unwrap();
        let prometheus = TestPrometheus::start(&[workers.addr()]).unwrap();
        let mut settings = InProcessOperator::settings(prometheus.url());
        settings.idle_workers_first = idle_workers_first;
        // No kubelet runs here, so no Pod is ever ready: a shrink must not wait for readiness.
        settings.surge_timeout = Duration::ZERO;
        let operator =
            InProcessOperator::start_with(client.clone(), vec![namespace.clone()], settings);
        Self {
            client,
            namespace,
            workers,
            _prometheus: prometheus,
            _operator: operator,
        }
    }

    /// The example pool `jobs` with a reserve of 1–4 urgent workers and one fixed shared
    /// worker, sized every 5 s, shrinking at once.
    async fn apply_pool(&self) {
        self.apply_pool_with(|_| {}).await
    }

    /// [`Self::apply_pool`], its spec changed by `change` first.
    async fn apply_pool_with(&self, change: impl FnOnce(&mut serde_json::Value)) {
        let mut manifest = lanepool_testenv::formula_pool();
        let spec = &mut manifest["spec"];
        spec["interval"] = json!("5s");
        spec["lanes"][0]["reserve"]["max"] = json!(4);
        spec["shared"] = json!({"replicas": 1});
        let spec = spec.as_object_mut().unwrap();
        spec.remove("totalWorkers");
        spec.remove("prometheus");
        change(&mut manifest["spec"]);
        let pool: LanePool = serde_json::from_value(manifest).unwrap();
        self.pools()
            .create(&PostParams::default(), &pool)
            .await
            .unwrap();
    }

    fn pools(&self) -> Api<LanePool> {
        Api::namespaced(self.client.clone(), &self.namespace)
    }

    fn urgent(&self, rate: f64) {
        self.workers
            .set_lane(&self.namespace, "jobs", "urgent", rate, 0.020);
    }

    /// The live (not terminating) Pods labelled with `selector`.
    async fn pods(&self, selector: &str) -> Vec<Pod> {
        Api::<Pod>::namespaced(self.client.clone(), &self.namespace)
            .list(&ListParams::default().labels(selector))
            .await
            .unwrap()
            .items
            .into_iter()
            .filter(|p| p.metadata.deletion_timestamp.is_none())
            .collect()
    }

    /// Gives `pod` an address of its own on the loopback (as a kubelet gives it its IP, with
    /// the phase Running: only a Running Pod is ever asked) where its worker answers every
    /// request (`/metrics`, a drain) with `gauges`, for the rest of the test process. The
    /// requests' first lines, as they come, with when they came.
    async fn answers_itself(&self, pod: &str, gauges: &'static str) -> Requests {
        self.answers_itself_with(pod, Arc::new(Mutex::new(gauges.to_string())))
            .await
    }

    /// Reports every Pod of `selector` Running, as a kubelet would once their containers run
    /// (the ReplicaSet controller deletes Pending Pods before Running ones, whatever their cost).
    async fn running(&self, selector: &str) {
        let pods = Api::<Pod>::namespaced(self.client.clone(), &self.namespace);
        for pod in self.pods(selector).await {
            let status = json!({"status": {"phase": "Running"}});
            pods.patch_status(
                &pod.name_any(),
                &PatchParams::default(),
                &Patch::Merge(&status),
            )
            .await
            .unwrap();
        }
    }

    /// [`Self::answers_itself`], with gauges the test changes as it goes.
    async fn answers_itself_with(&self, pod: &str, gauges: Arc<Mutex<String>>) -> Requests {
        use std::io::{Read, Write};
        let listener = (0..20)
            .find_map(|_| {
                let [a, b, c, _] = rand_bytes();
                std::net::TcpListener::bind((format!("127.{a}.{b}.{}", c | 1), OWN_METRICS_PORT))
                    .ok()
            })
            .expect("a free loopback address");
        let ip = listener.local_addr().unwrap().ip().to_string();
        let requests = Requests::default();
        let seen = requests.clone();
        std::thread::spawn(move || {
            for mut stream in listener.incoming().flatten() {
                let mut head = [0u8; 1024];
                let read = stream.read(&mut head).unwrap_or(0);
                let line = String::from_utf8_lossy(&head[..read])
                    .lines()
                    .next()
                    .unwrap_or_default()
                    .to_string();
                seen.lock().unwrap().push((Instant::now(), line));
                let gauges = gauges.lock().unwrap().clone();
                let _ = write!(
                    stream,
                    "HTTP/1.1 200 OK\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{gauges}",
                    gauges.len()
                );
            }
        });
        let status = json!({"status": {"phase": "Running", "podIP": ip, "podIPs": [{"ip": ip}]}});
        Api::<Pod>::namespaced(self.client.clone(), &self.namespace)
            .patch_status(pod, &PatchParams::default(), &Patch::Merge(&status))
            .await
            .unwrap();
        requests
    }

    async fn count<K>(&self) -> usize
    where
        K: kube::Resource<Scope = k8s_openapi::NamespaceResourceScope, DynamicType = ()>
            + Clone
            + serde::de::DeserializeOwned
            + std::fmt::Debug,
    {
        Api::<K>::namespaced(self.client.clone(), &self.namespace)
            .list(&ListParams::default().labels("lanepool.dev/pool=jobs"))
            .await
            .unwrap()
            .items
            .len()
    }
}

/// The first lines of the requests a Pod's worker answered, with when they came.
type Requests = Arc<Mutex<Vec<(Instant, String)>>>;

const RESERVED: &str = "lanepool.dev/pool=jobs,lanepool.dev/role=reserved";
/// The container port named `metrics` where a worker answers for itself.
const OWN_METRICS_PORT: u16 = 9100;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn deleting_a_lanepool_deletes_its_deployments_replicasets_and_pods() {
    let world = World::start("gc", true).await;
    world.urgent(30.0);
    world.apply_pool().await;
    // 30/s × 20 ms × 1.5 = 0.9 → 1 reserved, plus 1 shared: two of each kind.
    until(
        60,
        "two Deployments, two ReplicaSets and two Pods",
        || async {
            world.count::<Deployment>().await == 2
                && world.count::<ReplicaSet>().await == 2
                && world.count::<Pod>().await == 2
        },
    )
    .await;

    world
        .pools()
        .delete("jobs", &DeleteParams::default())
        .await
        .unwrap();
    until(60, "the garbage collector removes everything", || async {
        world.count::<Deployment>().await == 0
            && world.count::<ReplicaSet>().await == 0
            && world.count::<Pod>().await == 0
    })
    .await;
}

/// The example pool at 50/s (× 20 ms × 1.5 = 1.5 → 2 reserved), its workers serving their gauges
/// at the port named `metrics`: the names of its two reserved Pods, once both are there.
async fn two_reserved_pods_serving_metrics(world: &World) -> BTreeSet<String> {
    world.urgent(50.0);
    world
        .apply_pool_with(|spec| {
            spec["template"]["spec"]["containers"][0]["ports"] =
                json!([{"name": "metrics", "containerPort": OWN_METRICS_PORT}]);
        })
        .await;
    until(60, "two reserved Pods", || async {
        world.pods(RESERVED).await.len() == 2
    })
    .await;
    world
        .pods(RESERVED)
        .await
        .iter()
        .map(|p| p.name_any())
        .collect()
}

/// Grows the reserve from 2 to 4 (the two newer Pods a second younger, so the ReplicaSet
/// controller, left to itself, would remove them first), marks those two busy, and shrinks the
/// reserve back to 2: which Pods are left. With `own_answers`, one new and one old Pod get an
/// address where they answer for themselves (the new one busy, the old one idle) while
/// Prometheus, a scrape behind, says the opposite of both; the other two are known to
/// Prometheus alone (the new one busy, the old one idle).
async fn shrink_with_the_newest_pods_busy(
    world: &World,
    own_answers: bool,
) -> (BTreeSet<String>, BTreeSet<String>) {
    let older = two_reserved_pods_serving_metrics(world).await;
    // The ReplicaSet controller compares how long Pods have been ready in logarithmic buckets
    // (LogarithmicScaleDown): two ages within a factor of two tie, and a tie goes by uid. So the
    // old Pods must have been ready more than twice as long as the new ones when the shrink
    // comes, up to about 12 s after the new ones are ready (the 2 s below, an interval, the
    // test's 5 s rate window).
    tokio::time::sleep(Duration::from_secs(20)).await;
    // 120/s × 20 ms × 1.5 = 3.6 → 4 reserved.
    world.urgent(120.0);
    until(60, "four reserved Pods", || async {
        world.pods(RESERVED).await.len() == 4
    })
    .await;
    let busy: BTreeSet<String> = world
        .pods(RESERVED)
        .await
        .iter()
        .map(|p| p.name_any())
        .filter(|name| !older.contains(name))
        .collect();
    assert_eq!(busy.len(), 2);
    world.running(RESERVED).await;
    for pod in &older {
        world.workers.set_busy(&world.namespace, "jobs", pod, false);
    }
    for pod in &busy {
        world.workers.set_busy(&world.namespace, "jobs", pod, true);
    }
    if own_answers {
        let (new, old) = (busy.first().unwrap(), older.first().unwrap());
        world.answers_itself(new, "lanepool_worker_busy 1\n").await;
        world.answers_itself(old, "lanepool_worker_busy 0\n").await;
        world.workers.set_busy(&world.namespace, "jobs", new, false);
        world.workers.set_busy(&world.namespace, "jobs", old, true);
    }
    // Prometheus scrapes every second: let it see the gauges before the rate drops.
    tokio::time::sleep(Duration::from_secs(2)).await;
    world.urgent(50.0);
    until(60, "the reserve shrinks back to two Pods", || async {
        world.pods(RESERVED).await.len() == 2
    })
    .await;
    let left = world
        .pods(RESERVED)
        .await
        .iter()
        .map(|p| p.name_any())
        .collect();
    (busy, left)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_shrinking_deployment_loses_its_idle_workers_and_keeps_the_busy_ones() {
    // Two of the four Pods answer for themselves, and their answers beat Prometheus's.
    let world = World::start("idle-first", true).await;
    let (busy, left) = shrink_with_the_newest_pods_busy(&world, true).await;
    assert_eq!(left, busy, "the busy workers stay, the idle ones go");
    for pod in world.pods(RESERVED).await {
        assert_eq!(
            pod.annotations().get(DELETION_COST),
            Some(&BUSY_COST.to_string()),
            "{} was marked busy",
            pod.name_any()
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_idle_first_the_replicaset_removes_the_newest_workers_busy_or_not() {
    // The premise of the test above: left to itself, the ReplicaSet controller takes the
    // youngest Pods, here the busy ones, and nothing is annotated.
    let world = World::start("newest-first", false).await;
    let (busy, left) = shrink_with_the_newest_pods_busy(&world, false).await;
    assert!(left.is_disjoint(&busy), "left {left:?}, busy {busy:?}");
    for pod in world.pods(RESERVED).await {
        assert_eq!(pod.annotations().get(DELETION_COST), None);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_grace_period_shorter_than_a_lanes_job_time_is_a_condition_and_a_warning() {
    let world = World::start("grace", true).await;
    world.urgent(30.0);
    // The batch lane has no reserve: its job time comes from the same shared query.
    world
        .workers
        .set_lane(&world.namespace, "jobs", "batch", 2.0, 3.0);
    world
        .apply_pool_with(|spec| {
            spec["template"]["spec"]["terminationGracePeriodSeconds"] = json!(1);
        })
        .await;
    let condition = || async {
        let pool = world.pools().get("jobs").await.unwrap();
        pool.status?
            .conditions
            .into_iter()
            .find(|c| c.type_ == GRACE_PERIOD_TOO_SHORT)
    };
    until(60, "GracePeriodTooShort=True", || async {
        condition().await.is_some_and(|c| c.status == "True")
    })
    .await;
    let message = condition().await.unwrap().message;
    assert!(message.contains("lane batch"), "{message}");
    let events = Api::<k8s_openapi::api::core::v1::Event>::namespaced(
        world.client.clone(),
        &world.namespace,
    )
    .list(&ListParams::default())
    .await
    .unwrap();
    assert!(
        events
            .items
            .iter()
            .any(|e| e.reason.as_deref() == Some("JobLongerThanGracePeriod")
                && e.type_.as_deref() == Some("Warning")),
        "a warning event"
    );

    // Raised above the job time, the condition clears.
    world
        .pools()
        .patch(
            "jobs",
            &kube::api::PatchParams::default(),
            &kube::api::Patch::Merge(json!({"spec": {"template": {"spec": {
                "terminationGracePeriodSeconds": 10}}}})),
        )
        .await
        .unwrap();
    until(60, "GracePeriodTooShort=False", || async {
        condition().await.is_some_and(|c| c.status == "False")
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_worker_that_does_not_drain_is_ranked_only_and_a_busy_drained_one_keeps_its_place_until_idle()
 {
    let world = World::start("drain-bounds", true).await;
    // 50/s × 20 ms × 1.5 = 1.5 → 2 reserved, then 120/s → 4.
    let older = two_reserved_pods_serving_metrics(&world).await;
    world.urgent(120.0);
    until(60, "four reserved Pods", || async {
        world.pods(RESERVED).await.len() == 4
    })
    .await;
    let newer: Vec<String> = world
        .pods(RESERVED)
        .await
        .iter()
        .map(|p| p.name_any())
        .filter(|name| !older.contains(name))
        .collect();
    // The older two are busy (Prometheus says so: the costliest), the newer two answer
    // themselves: one idle that does not drain (an older worker: its gauges answer a drain
    // request too, without `lanepool_worker_draining`), one that drains and stays busy until
    // the test lets it finish.
    world.running(RESERVED).await;
    for pod in &older {
        world.workers.set_busy(&world.namespace, "jobs", pod, true);
    }
    let (no_drain, stuck) = (&newer[0], &newer[1]);
    let no_drain_requests = world
        .answers_itself(no_drain, "lanepool_worker_busy 0\n")
        .await;
    let stuck_gauges = Arc::new(Mutex::new(
        "lanepool_worker_busy{lane=\"urgent\"} 1\nlanepool_worker_draining 1\n".to_string(),
    ));
    let stuck_requests = world.answers_itself_with(stuck, stuck_gauges.clone()).await;
    tokio::time::sleep(Duration::from_secs(2)).await;
    world.urgent(50.0);
    // The worker that does not drain goes at once; the busy drained one keeps its place past
    // its drain timeout (3 × 20 ms, so the shortest: 2 s) while it says it is busy.
    until(60, "the reserve shrinks to three Pods", || async {
        world.pods(RESERVED).await.len() == 3
    })
    .await;
    let first_drain = |requests: &Requests| {
        requests
            .lock()
            .unwrap()
            .iter()
            .find(|(_, line)| line.starts_with("POST /drain?seconds="))
            .map(|(at, _)| *at)
    };
    assert!(first_drain(&no_drain_requests).is_some(), "never asked");
    let asked = first_drain(&stuck_requests).expect("the busy worker was asked to drain");
    tokio::time::sleep(Duration::from_secs(8)).await;
    let held: BTreeSet<String> = world
        .pods(RESERVED)
        .await
        .iter()
        .map(|p| p.name_any())
        .collect();
    let mut expected = older.clone();
    expected.insert(stuck.clone());
    assert_eq!(
        held,
        expected,
        "{:?} past the drain timeout: the busy drained worker and the busy older ones stay",
        asked.elapsed()
    );
    let replicas = Api::<Deployment>::namespaced(world.client.clone(), &world.namespace)
        .get("jobs-urgent-reserved")
        .await
        .unwrap()
        .spec
        .and_then(|s| s.replicas);
    assert_eq!(replicas, Some(3), "one kept for the busy drained worker");
    // It finishes its job: the shrink takes it, and only it.
    *stuck_gauges.lock().unwrap() =
        "lanepool_worker_busy 0\nlanepool_worker_draining 1\n".to_string();
    let idle_at = Instant::now();
    until(30, "the reserve shrinks to two Pods", || async {
        world.pods(RESERVED).await.len() == 2
    })
    .await;
    let left: BTreeSet<String> = world
        .pods(RESERVED)
        .await
        .iter()
        .map(|p| p.name_any())
        .collect();
    println!(
        "held {:.1} s past the drain's start; shrunk {:.1} s after the worker said idle",
        asked.elapsed().as_secs_f64() - idle_at.elapsed().as_secs_f64(),
        idle_at.elapsed().as_secs_f64()
    );
    assert_eq!(
        left, older,
        "the idle and the drained worker went, the busy ones stay"
    );
    let draining = Api::<k8s_openapi::api::core::v1::Event>::namespaced(
        world.client.clone(),
        &world.namespace,
    )
    .list(&ListParams::default())
    .await
    .unwrap()
    .items
    .into_iter()
    .filter(|e| e.reason.as_deref() == Some("Draining"))
    .filter_map(|e| e.message)
    .collect::<Vec<_>>();
    assert!(
        draining.iter().any(|note| note.contains(stuck.as_str())),
        "{draining:?}"
    );
}

/// Four bytes that differ from one call to the next (no random-number crate needed).
fn rand_bytes() -> [u8; 4] {
    use std::hash::{BuildHasher, RandomState};
    (RandomState::new().hash_one(std::time::SystemTime::now()) as u32).to_le_bytes()
}
