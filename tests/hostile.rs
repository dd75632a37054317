//! Hostile worker Pods against the operator on a real API server (no controller-manager: the
//! tests make the ReplicaSets and Pods themselves, owned by a pool's Deployment or by nothing,
//! and play the kubelet by setting their address and readiness). Whatever such a Pod answers,
//! the operator reads a capped answer, follows no redirect, counts only the pool's own workers,
//! drops claims no worker could make, and keeps every pool beside it on its interval.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use k8s_openapi::api::apps::v1::{Deployment, ReplicaSet};
use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, Patch, PatchParams, PostParams};
use kube::{Client, ResourceExt};
use lanepool::api::LanePool;
use lanepool_testenv::{
    self as testenv, DeploymentReadiness, InProcessOperator, SimulatedWorkers, TestPrometheus,
};
use serde_json::json;
use testenv::until;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// One test's world: a namespace of the shared control plane, simulated workers that
/// Prometheus scrapes, and a running operator.
struct World {
    client: Client,
    namespace: String,
    workers: SimulatedWorkers,
    operator: InProcessOperator,
    prometheus: TestPrometheus,
    _readiness: DeploymentReadiness,
}

impl World {
    async fn start(prefix: &str) -> Self {
        let plane = testenv::shared().expect("the control plane starts");
        let client = plane.client().await.unwrap();
        let namespace = plane.namespace(&client, prefix).await.unwrap();
        let workers = SimulatedWorkers::start().unwrap();
        let prometheus = TestPrometheus::start(&[workers.addr()]).unwrap();
        let settings = InProcessOperator::settings(prometheus.url());
        let operator =
            InProcessOperator::start_with(client.clone(), vec![namespace.clone()], settings);
        let readiness = DeploymentReadiness::start(client.clone(), &namespace, Duration::ZERO);
        Self {
            client,
            namespace,
            workers,
            operator,
            prometheus,
            _readiness: readiness,
        }
    }

    /// The example pool as `name`, sized every 5 s, its workers serving a port named `metrics`.
    async fn apply_pool(&self, name: &str) {
        let mut manifest = lanepool_testenv::formula_pool();
        manifest["metadata"]["name"] = json!(name);
        let spec = &mut manifest["spec"];
        spec["interval"] = json!("5s");
        spec["template"]["spec"]["containers"][0]["ports"] =
            json!([{"name": "metrics", "containerPort": 9100}]);
        spec.as_object_mut().unwrap().remove("prometheus");
        let pool: LanePool = serde_json::from_value(manifest).unwrap();
        Api::<LanePool>::namespaced(self.client.clone(), &self.namespace)
            .create(&PostParams::default(), &pool)
            .await
            .unwrap();
    }

    /// The pool `name` at 30/s (30/s × 20 ms × 1.5 = 0.9 → 1 reserved), once sized, and a
    /// ReplicaSet of its shared Deployment for the test's own Pods.
    async fn sized_pool(&self, name: &str) -> ReplicaSet {
        self.urgent(name, 30.0);
        self.apply_pool(name).await;
        let reserved = format!("{name}-urgent-reserved");
        until(40, "1 reserved", || async {
            self.replicas(&reserved).await == Some(1)
        })
        .await;
        self.replicaset_of(name, &format!("{name}-shared")).await
    }

    fn urgent(&self, pool: &str, rate: f64) {
        self.workers
            .set_lane(&self.namespace, pool, "urgent", rate, 0.020);
    }

    async fn replicas(&self, deployment: &str) -> Option<i32> {
        Api::<Deployment>::namespaced(self.client.clone(), &self.namespace)
            .get_opt(deployment)
            .await
            .unwrap()
            .and_then(|d| d.spec?.replicas)
    }

    /// The status's recent arrival rate of the pool's urgent lane: only worker reads set it (the
    /// test operator asks Prometheus for no recent window).
    async fn recent_rate(&self, pool: &str) -> Option<String> {
        let pool = Api::<LanePool>::namespaced(self.client.clone(), &self.namespace)
            .get(pool)
            .await
            .unwrap();
        pool.status?.lanes.first()?.recent_arrival_rate.clone()
    }

    /// A ReplicaSet controlled by the pool's Deployment `deployment`, as the Deployment
    /// controller would make it (none runs here, so it never makes Pods of its own).
    async fn replicaset_of(&self, pool: &str, deployment: &str) -> ReplicaSet {
        let deployments: Api<Deployment> = Api::namespaced(self.client.clone(), &self.namespace);
        until(30, &format!("Deployment {deployment}"), || async {
            deployments.get_opt(deployment).await.unwrap().is_some()
        })
        .await;
        let uid = deployments.get(deployment).await.unwrap().uid().unwrap();
        let labels = json!({"lanepool.dev/pool": pool});
        let replicaset: ReplicaSet = serde_json::from_value(json!({
            "metadata": {"name": format!("{deployment}-hand"), "labels": labels,
                "ownerReferences": [{"apiVersion": "apps/v1", "kind": "Deployment",
                    "name": deployment, "uid": uid, "controller": true}]},
            "spec": {"replicas": 0, "selector": {"matchLabels": labels},
                "template": {"metadata": {"labels": labels},
                    "spec": {"containers": [{"name": "worker", "image": "lane-worker"}]}}},
        }))
        .unwrap();
        Api::namespaced(self.client.clone(), &self.namespace)
            .create(&PostParams::default(), &replicaset)
            .await
            .unwrap()
    }

    /// A Pod labelled as `pool`'s `role` worker, its `metrics` port at `at`; controlled by
    /// `owner` (or by nothing), Running and Ready or not, as a kubelet would report it.
    async fn pod(
        &self,
        name: &str,
        labels: serde_json::Value,
        owner: Option<&ReplicaSet>,
        at: SocketAddr,
        ready: bool,
    ) {
        let owners: Vec<serde_json::Value> = owner
            .map(|rs| {
                json!({"apiVersion": "apps/v1", "kind": "ReplicaSet", "name": rs.name_any(),
                    "uid": rs.uid().unwrap(), "controller": true})
            })
            .into_iter()
            .collect();
        let pod: Pod = serde_json::from_value(json!({
            "metadata": {"name": name, "labels": labels, "ownerReferences": owners},
            "spec": {"nodeName": "local", "containers": [{"name": "worker", "image": "lane-worker",
                "ports": [{"name": "metrics", "containerPort": at.port()}]}]},
        }))
        .unwrap();
        let pods: Api<Pod> = Api::namespaced(self.client.clone(), &self.namespace);
        pods.create(&PostParams::default(), &pod).await.unwrap();
        let ip = at.ip().to_string();
        let status = json!({"status": {
            "phase": "Running",
            "podIP": ip,
            "podIPs": [{"ip": ip}],
            "conditions": [{"type": "Ready", "status": if ready { "True" } else { "False" }}],
            "containerStatuses": [{"name": "worker", "image": "lane-worker", "imageID": "",
                "ready": ready, "restartCount": 0,
                "state": {"running": {"startedAt": "2020-01-01T00:00:00Z"}}}],
        }});
        pods.patch_status(name, &PatchParams::default(), &Patch::Merge(&status))
            .await
            .unwrap();
    }

    fn rejected(&self, reason: &'static str) -> u64 {
        self.operator.metrics().worker_reads_rejected(reason)
    }
}

fn labels(pool: &str, role: &str) -> serde_json::Value {
    json!({"lanepool.dev/pool": pool, "lanepool.dev/role": role})
}

/// How a hostile worker answers.
#[derive(Clone)]
enum Behaviour {
    /// A `/metrics` text that never ends.
    Endless,
    /// Every request redirected to `to` (302 for a GET, 307 for a POST: it keeps the POST).
    Redirect(SocketAddr),
    /// Accepts, reads the request, never answers.
    Silent,
    /// Finished urgent jobs: `step` more at each request.
    Counting(f64),
}

/// What a hostile worker saw: each request's first line.
type Seen = Arc<Mutex<Vec<String>>>;

/// Serves `behaviour` on a port of 127.0.0.1: its address and the requests it saw.
async fn serve(behaviour: Behaviour) -> (SocketAddr, Seen) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let seen = Seen::default();
    let requests = seen.clone();
    let count = Arc::new(Mutex::new(0.0_f64));
    tokio::spawn(async move {
        while let Ok((mut stream, _)) = listener.accept().await {
            let (behaviour, requests, count) = (behaviour.clone(), requests.clone(), count.clone());
            tokio::spawn(async move {
                let mut head = [0u8; 2048];
                let read = stream.read(&mut head).await.unwrap_or(0);
                let line = String::from_utf8_lossy(&head[..read])
                    .lines()
                    .next()
                    .unwrap_or_default()
                    .to_string();
                let post = line.starts_with("POST");
                requests.lock().unwrap().push(line);
                match behaviour {
                    Behaviour::Endless => {
                        let start = "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n";
                        let series =
                            "lanepool_job_duration_seconds_count{lane=\"urgent\"} 1\n".repeat(512);
                        let chunk = format!("{:x}\r\n{series}\r\n", series.len());
                        if stream.write_all(start.as_bytes()).await.is_ok() {
                            while stream.write_all(chunk.as_bytes()).await.is_ok() {}
                        }
                    }
                    Behaviour::Redirect(to) => {
                        let (status, path) = if post {
                            ("307 Temporary Redirect", "/-/quit")
                        } else {
                            ("302 Found", "/metrics")
                        };
                        let answer = format!(
                            "HTTP/1.1 {status}\r\nLocation: http://{to}{path}\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"
                        );
                        let _ = stream.write_all(answer.as_bytes()).await;
                    }
                    Behaviour::Silent => tokio::time::sleep(Duration::from_secs(600)).await,
                    Behaviour::Counting(step) => {
                        let value = {
                            let mut count = count.lock().unwrap();
                            *count += step;
                            *count
                        };
                        let body = format!(
                            "# TYPE lanepool_job_duration_seconds histogram\n\
                             lanepool_job_duration_seconds_count{{lane=\"urgent\"}} {value}\n"
                        );
                        let answer = format!(
                            "HTTP/1.1 200 OK\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
                            body.len()
                        );
                        let _ = stream.write_all(answer.as_bytes()).await;
                    }
                }
            });
        }
    });
    (addr, seen)
}

/// A listener that only counts the connections it gets: where a redirect would lead.
async fn target() -> (SocketAddr, Arc<AtomicUsize>) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let connections = Arc::new(AtomicUsize::new(0));
    let counted = connections.clone();
    tokio::spawn(async move {
        while let Ok((_stream, _)) = listener.accept().await {
            counted.fetch_add(1, Ordering::SeqCst);
        }
    });
    (addr, connections)
}

/// The peak resident memory of this process (the operator runs in it), in MiB.
fn peak_rss_mib() -> f64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap();
    let kib: f64 = status
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))
        .and_then(|v| v.split_whitespace().next()?.parse().ok())
        .unwrap();
    kib / 1024.0
}

fn requests(seen: &Seen, starting: &str) -> usize {
    seen.lock()
        .unwrap()
        .iter()
        .filter(|l| l.starts_with(starting))
        .count()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_endless_answer_is_cut_at_its_cap_and_no_redirect_is_followed_on_get_drain_or_stand_in()
{
    let world = World::start("hostile-answers").await;
    // The hostile pool: 50/s × 20 ms × 1.5 = 1.5 → 2 reserved; the calm one beside it 30/s → 1.
    world.urgent("hostile", 50.0);
    world.urgent("calm", 30.0);
    world.apply_pool("hostile").await;
    world.apply_pool("calm").await;
    until(40, "both pools sized", || async {
        world.replicas("hostile-urgent-reserved").await == Some(2)
            && world.replicas("calm-urgent-reserved").await == Some(1)
    })
    .await;
    let before = peak_rss_mib();
    let (to, reached) = target().await;
    let (endless, endless_seen) = serve(Behaviour::Endless).await;
    let (redirect, redirect_seen) = serve(Behaviour::Redirect(to)).await;
    let shared = world.replicaset_of("hostile", "hostile-shared").await;
    let reserved = world
        .replicaset_of("hostile", "hostile-urgent-reserved")
        .await;
    let shared_labels = labels("hostile", "shared");
    world
        .pod("endless", shared_labels, Some(&shared), endless, true)
        .await;
    let reserved_labels = json!({"lanepool.dev/pool": "hostile", "lanepool.dev/role": "reserved",
        "lanepool.dev/lane": "urgent"});
    world
        .pod("redirect", reserved_labels, Some(&reserved), redirect, true)
        .await;
    let read = until(
        30,
        "the endless and the redirecting workers read twice",
        || async {
            requests(&endless_seen, "GET /metrics") >= 2 && requests(&redirect_seen, "GET") >= 2
        },
    )
    .await;
    // The reserve shrinks 2 → 1: its one worker, the redirecting one, is asked to drain.
    world.urgent("hostile", 30.0);
    until(40, "the hostile pool's reserve shrinks to 1", || async {
        world.replicas("hostile-urgent-reserved").await == Some(1)
    })
    .await;
    assert!(
        requests(&redirect_seen, "POST /drain") >= 1,
        "asked to drain"
    );
    // The reserve grows 1 → 5: the shared workers the shrink will stop, the endless one and a
    // redirecting one among them, are asked to stand in for the new reserved workers.
    let shared_labels = labels("hostile", "shared");
    world
        .pod(
            "redirect-shared",
            shared_labels,
            Some(&shared),
            redirect,
            true,
        )
        .await;
    world.urgent("hostile", 150.0);
    until(40, "the hostile pool's reserve grows to 5", || async {
        world.replicas("hostile-urgent-reserved").await == Some(5)
    })
    .await;
    until(
        20,
        "both hostile shared workers asked to stand in",
        || async {
            requests(&redirect_seen, "POST /stand-in?lanes=urgent&seconds=") >= 1
                && requests(&endless_seen, "POST /stand-in?lanes=urgent&seconds=") >= 1
        },
    )
    .await;
    // The calm pool keeps its interval beside them: a rise reaches it within about one.
    world.urgent("calm", 150.0);
    let rise = until(20, "the calm pool follows 150/s: 5 reserved", || async {
        world.replicas("calm-urgent-reserved").await == Some(5)
    })
    .await;
    let after = peak_rss_mib();
    let gets = requests(&endless_seen, "GET /metrics");
    println!(
        "endless: {gets} reads (too_large {}), redirect: {} GETs, {} stand-ins and {} drains \
         refused (redirect {}), its target reached {} times; both read twice within {:.1} s; \
         calm pool resized {:.1} s after its rise; peak RSS {before:.0} → {after:.0} MiB",
        world.rejected("too_large"),
        requests(&redirect_seen, "GET"),
        requests(&redirect_seen, "POST /stand-in"),
        requests(&redirect_seen, "POST /drain"),
        world.rejected("redirect"),
        reached.load(Ordering::SeqCst),
        read.as_secs_f64(),
        rise.as_secs_f64(),
    );
    assert_eq!(reached.load(Ordering::SeqCst), 0, "no redirect followed");
    assert!(
        world.rejected("redirect") >= 4,
        "the GETs, the stand-in and the drain refused"
    );
    assert!(
        world.rejected("too_large") >= 2,
        "the endless answers refused"
    );
    assert!(rise <= Duration::from_secs(12), "{rise:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn inflated_counts_move_no_reserve_from_a_stranger_nor_from_an_owned_worker() {
    let world = World::start("hostile-counts").await;
    // Prometheus: 30/s × 20 ms × 1.5 = 0.9 → 1 reserved.
    let shared = world.sized_pool("jobs").await;
    // An honest worker at 150 jobs per read (30/s): the reads are taken while it is alone.
    let (honest, _) = serve(Behaviour::Counting(150.0)).await;
    world
        .pod(
            "honest",
            labels("jobs", "shared"),
            Some(&shared),
            honest,
            true,
        )
        .await;
    until(30, "the honest worker's reads in the status", || async {
        world.recent_rate("jobs").await.is_some()
    })
    .await;
    // A hand-made Pod with the pool's labels and no owner, and an owned worker: each claims a
    // million more jobs at every read.
    let (stranger, stranger_seen) = serve(Behaviour::Counting(1e6)).await;
    let (liar, liar_seen) = serve(Behaviour::Counting(1e6)).await;
    world
        .pod("stranger", labels("jobs", "shared"), None, stranger, true)
        .await;
    world
        .pod("liar", labels("jobs", "shared"), Some(&shared), liar, true)
        .await;
    let mut seen = std::collections::BTreeSet::new();
    let started = Instant::now();
    while started.elapsed() < Duration::from_secs(20) {
        seen.insert(world.replicas("jobs-urgent-reserved").await);
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    let liar_reads = requests(&liar_seen, "GET /metrics");
    println!(
        "over 20 s: reserve {seen:?}; the stranger asked {} times, the liar {liar_reads} times, \
         implausible claims dropped {}",
        requests(&stranger_seen, "GET"),
        world.rejected("implausible"),
    );
    assert_eq!(
        seen,
        [Some(1)].into(),
        "a million jobs a read would pin reserve.max (6)"
    );
    assert_eq!(
        requests(&stranger_seen, "GET"),
        0,
        "not a worker: never asked"
    );
    assert!(liar_reads >= 3, "the liar was read");
    assert!(
        world.rejected("implausible") >= 2,
        "its claims dropped and counted"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_silent_ready_worker_is_missing_whoever_else_answers() {
    let world = World::start("hostile-missing").await;
    let shared = world.sized_pool("jobs").await;
    // The one ready worker is silent; a worker still starting (not ready) and a stranger (no
    // owner, not ready) answer with 150 jobs a read (30/s each).
    let (silent, silent_seen) = serve(Behaviour::Silent).await;
    let (starting, starting_seen) = serve(Behaviour::Counting(150.0)).await;
    let (stranger, stranger_seen) = serve(Behaviour::Counting(150.0)).await;
    world
        .pod(
            "silent",
            labels("jobs", "shared"),
            Some(&shared),
            silent,
            true,
        )
        .await;
    world
        .pod(
            "starting",
            labels("jobs", "shared"),
            Some(&shared),
            starting,
            false,
        )
        .await;
    world
        .pod("stranger", labels("jobs", "shared"), None, stranger, false)
        .await;
    let mut recent = std::collections::BTreeSet::new();
    let started = Instant::now();
    while started.elapsed() < Duration::from_secs(20) {
        recent.insert(world.recent_rate("jobs").await);
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    println!(
        "over 20 s: the status's read rates {recent:?}; asked: silent {}, starting {}, stranger {}",
        requests(&silent_seen, "GET"),
        requests(&starting_seen, "GET"),
        requests(&stranger_seen, "GET"),
    );
    assert!(
        requests(&silent_seen, "GET") >= 3,
        "the ready worker was asked"
    );
    assert!(
        requests(&starting_seen, "GET") >= 3,
        "the starting one answered"
    );
    assert_eq!(
        requests(&stranger_seen, "GET"),
        0,
        "not a worker: never asked"
    );
    assert_eq!(
        recent,
        [None].into(),
        "no read is a rate without the ready worker"
    );
}

/// The operator's reconciles that took longer than `seconds` (a bucket bound of its histogram).
/// Every Pod LIST the API server has answered, as its own metrics count them.
async fn pod_lists(client: &Client) -> f64 {
    let request = hyper::Request::get("/metrics").body(Vec::new()).unwrap();
    let text = client.request_text(request).await.unwrap();
    text.lines()
        .filter(|l| l.starts_with("apiserver_request_total{"))
        .filter(|l| l.contains("resource=\"pods\"") && l.contains("verb=\"LIST\""))
        .filter(|l| l.contains("subresource=\"\""))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

fn reconciles_over(world: &World, seconds: &str) -> u64 {
    observed_over(
        world,
        "lanepool_operator_reconcile_duration_seconds",
        seconds,
    )
}

/// How many of the operator's observations of `histogram` were over the bucket `seconds`.
fn observed_over(world: &World, histogram: &str, seconds: &str) -> u64 {
    let text = world.operator.metrics().render();
    let value = |prefix: &str| -> Option<u64> {
        text.lines()
            .find_map(|l| l.strip_prefix(prefix))
            .and_then(|v| v.split_whitespace().last()?.parse().ok())
    };
    let count = value(&format!("{histogram}_count")).unwrap();
    let within = value(&format!("{histogram}_bucket{{le=\"{seconds}"))
        .unwrap_or_else(|| panic!("no bucket {seconds} of {histogram} in {text}"));
    count - within
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn silent_workers_cost_their_pool_its_budget_and_the_pool_beside_keeps_its_interval() {
    let world = World::start("hostile-silent").await;
    world.urgent("silent", 30.0);
    world.urgent("calm", 30.0);
    world.apply_pool("silent").await;
    world.apply_pool("calm").await;
    until(40, "both pools sized", || async {
        world.replicas("silent-urgent-reserved").await == Some(1)
            && world.replicas("calm-urgent-reserved").await == Some(1)
    })
    .await;
    // 150 ready workers of the silent pool that accept a connection and never answer.
    let (silent, silent_seen) = serve(Behaviour::Silent).await;
    let shared = world.replicaset_of("silent", "silent-shared").await;
    let made = Instant::now();
    futures::future::join_all((0..150).map(|i| {
        let (world, shared) = (&world, &shared);
        async move {
            world
                .pod(
                    &format!("silent-{i}"),
                    labels("silent", "shared"),
                    Some(shared),
                    silent,
                    true,
                )
                .await
        }
    }))
    .await;
    println!(
        "150 silent Pods made in {:.1} s",
        made.elapsed().as_secs_f64()
    );
    until(20, "the silent workers asked", || async {
        requests(&silent_seen, "GET") >= 16
    })
    .await;
    let lists_before = pod_lists(&world.client).await;
    tokio::time::sleep(Duration::from_secs(10)).await;
    world.urgent("calm", 150.0);
    let rise = until(20, "the calm pool follows 150/s: 5 reserved", || async {
        world.replicas("calm-urgent-reserved").await == Some(5)
    })
    .await;
    let lists = pod_lists(&world.client).await - lists_before;
    let over = reconciles_over(&world, "2.04");
    println!(
        "silent workers asked {} times; calm pool resized {:.1} s after its rise; reconciles \
         over 2.048 s: {over}; Pod LISTs at the API server over {:.0} s: {lists}",
        requests(&silent_seen, "GET"),
        rise.as_secs_f64(),
        (Duration::from_secs(10) + rise).as_secs_f64()
    );
    // The pools' Pods come from a watch cache: two pools measured every 5 s list nothing (a
    // test starting beside this one lists once, as its operator's watch starts).
    assert!(
        lists <= 2.0,
        "{lists} Pod LISTs while two pools were measured"
    );
    assert_eq!(
        over, 0,
        "no reconcile waits on silent Pods beyond its budget"
    );
    // Each request to a silent worker runs to its 500 ms timeout, and shows as one that took it.
    let slow = observed_over(
        &world,
        "lanepool_operator_worker_request_duration_seconds",
        "0.256",
    );
    assert!(slow >= 16, "{slow} worker requests over 256 ms");
    assert!(rise <= Duration::from_secs(12), "{rise:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_evicted_worker_whose_address_answers_for_someone_else_is_never_asked() {
    let world = World::start("hostile-evicted").await;
    let shared = world.sized_pool("jobs").await;
    let (honest, honest_seen) = serve(Behaviour::Counting(150.0)).await;
    let (evicted, evicted_seen) = serve(Behaviour::Counting(150.0)).await;
    for (name, at) in [("honest", honest), ("evicted", evicted)] {
        world
            .pod(name, labels("jobs", "shared"), Some(&shared), at, true)
            .await;
    }
    until(30, "both owned workers read", || async {
        requests(&honest_seen, "GET") > 0 && requests(&evicted_seen, "GET") > 0
    })
    .await;
    // Evicted, as the kubelet reports it: Failed, not ready, its podIP kept until the Pod is
    // collected. The address now belongs to someone else (the same listener stands in for them).
    let status = json!({"status": {
        "phase": "Failed", "reason": "Evicted",
        "message": "The node was low on resource: memory.",
        "conditions": [{"type": "Ready", "status": "False"}],
    }});
    Api::<Pod>::namespaced(world.client.clone(), &world.namespace)
        .patch_status("evicted", &PatchParams::default(), &Patch::Merge(&status))
        .await
        .unwrap();
    // The watch takes the change within a moment; what it saw before is not counted.
    tokio::time::sleep(Duration::from_secs(2)).await;
    let before = evicted_seen.lock().unwrap().len();
    let honest_before = requests(&honest_seen, "GET");
    // The pool shrinks by one shared worker: its drain picks among live workers only, never the
    // Failed one (not ready, so it would go first, while the ReplicaSet deletes a live one).
    Api::<LanePool>::namespaced(world.client.clone(), &world.namespace)
        .patch(
            "jobs",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"totalWorkers": 9}})),
        )
        .await
        .unwrap();
    let started = Instant::now();
    while started.elapsed() < Duration::from_secs(25) {
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    let after: Vec<String> = evicted_seen.lock().unwrap()[before..].to_vec();
    println!(
        "over 25 s after the eviction: the evicted Pod's address got {after:?}; the live worker \
         {} GETs, {} POSTs",
        requests(&honest_seen, "GET") - honest_before,
        requests(&honest_seen, "POST"),
    );
    assert!(
        after.is_empty(),
        "an evicted Pod's address was asked: {after:?}"
    );
    assert!(
        requests(&honest_seen, "GET") - honest_before >= 3,
        "the live worker was still read"
    );
    assert_eq!(world.replicas("jobs-shared").await, Some(8));
    assert!(
        requests(&honest_seen, "POST /drain") >= 1,
        "the shrink drained the live worker, not the evicted one"
    );
}

/// A worker that takes drain requests, whose state and manner the test sets: busy with a batch
/// job or idle, answering at once, late (past the operator's 500 ms) or never.
#[derive(Clone, Default)]
struct Drainable {
    busy: Arc<std::sync::atomic::AtomicBool>,
    /// How long every answer waits, in ms; `u64::MAX`: it never answers.
    delay_ms: Arc<std::sync::atomic::AtomicU64>,
    seen: Seen,
}

impl Drainable {
    async fn serve(&self) -> SocketAddr {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let worker = self.clone();
        tokio::spawn(async move {
            while let Ok((mut stream, _)) = listener.accept().await {
                let worker = worker.clone();
                tokio::spawn(async move {
                    let mut head = [0u8; 2048];
                    let read = stream.read(&mut head).await.unwrap_or(0);
                    let line = String::from_utf8_lossy(&head[..read])
                        .lines()
                        .next()
                        .unwrap_or_default()
                        .to_string();
                    let draining = line.starts_with("POST /drain") && !line.contains("seconds=0 ");
                    worker.seen.lock().unwrap().push(line);
                    match worker.delay_ms.load(Ordering::SeqCst) {
                        u64::MAX => {
                            tokio::time::sleep(Duration::from_secs(600)).await;
                            return;
                        }
                        ms => tokio::time::sleep(Duration::from_millis(ms)).await,
                    }
                    let busy = if worker.busy.load(Ordering::SeqCst) {
                        "lanepool_worker_busy{lane=\"batch\"} 1\n\
                         lanepool_worker_job_started_timestamp_seconds{lane=\"batch\"} 1.0e9\n"
                    } else {
                        "lanepool_worker_busy 0\n"
                    };
                    let body = format!("{busy}lanepool_worker_draining {}\n", u8::from(draining));
                    let answer = format!(
                        "HTTP/1.1 200 OK\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
                        body.len()
                    );
                    let _ = stream.write_all(answer.as_bytes()).await;
                });
            }
        });
        addr
    }

    fn set(&self, busy: bool, delay_ms: u64) {
        self.busy.store(busy, Ordering::SeqCst);
        self.delay_ms.store(delay_ms, Ordering::SeqCst);
    }
}

/// The lowest `spec.replicas` of `deployment` seen over `seconds`, polled every 250 ms.
async fn lowest_over(world: &World, deployment: &str, seconds: u64) -> Option<i32> {
    let mut lowest = None;
    let started = Instant::now();
    while started.elapsed() < Duration::from_secs(seconds) {
        let now = world.replicas(deployment).await;
        lowest = match (lowest, now) {
            (Some(a), Some(b)) => Some(std::cmp::min(a, b)),
            (a, b) => a.or(b),
        };
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    lowest
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_drained_worker_late_silent_or_busy_holds_its_shrink_until_it_answers_idle() {
    let mut world = World::start("hostile-drain").await;
    world.urgent("jobs", 30.0);
    world.urgent("calm", 30.0);
    world.apply_pool("jobs").await;
    world.apply_pool("calm").await;
    until(40, "both pools sized", || async {
        world.replicas("jobs-urgent-reserved").await == Some(1)
            && world.replicas("calm-urgent-reserved").await == Some(1)
    })
    .await;
    let shared = world.replicaset_of("jobs", "jobs-shared").await;
    let worker = Drainable::default();
    worker.set(true, 0);
    let at = worker.serve().await;
    world
        .pod("drained", labels("jobs", "shared"), Some(&shared), at, true)
        .await;
    until(20, "the worker read", || async {
        requests(&worker.seen, "GET") > 0
    })
    .await;
    // Its answers come 700 ms late: past the operator's 500 ms, so it is not heard from.
    worker.set(true, 700);
    let asked = Instant::now();
    Api::<LanePool>::namespaced(world.client.clone(), &world.namespace)
        .patch(
            "jobs",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"totalWorkers": 9}})),
        )
        .await
        .unwrap();
    until(20, "the drain asked", || async {
        requests(&worker.seen, "POST /drain") > 0
    })
    .await;
    let late = lowest_over(&world, "jobs-shared", 12).await;
    // Then silent, then answering at once but busy: still unknown, then known busy.
    worker.set(true, u64::MAX);
    let silent = lowest_over(&world, "jobs-shared", 8).await;
    // Every read fails as well: Prometheus stopped while the worker says nothing.
    world.prometheus.stop();
    let unread = lowest_over(&world, "jobs-shared", 8).await;
    world.prometheus.resume().unwrap();
    worker.set(true, 0);
    let busy = lowest_over(&world, "jobs-shared", 8).await;
    worker.set(false, 0);
    let shrunk = until(20, "the shrink once the worker is idle", || async {
        world.replicas("jobs-shared").await == Some(8)
    })
    .await;
    println!(
        "jobs-shared 9 → 8: lowest while late {late:?}, silent {silent:?}, unread {unread:?}, \
         busy {busy:?}; shrunk {:.1} s after the worker said idle, {:.0} s after the decision; \
         drain requests {}",
        shrunk.as_secs_f64(),
        asked.elapsed().as_secs_f64(),
        requests(&worker.seen, "POST /drain"),
    );
    for (phase, lowest) in [
        ("late", late),
        ("silent", silent),
        ("unread", unread),
        ("busy", busy),
    ] {
        assert_eq!(
            lowest,
            Some(9),
            "shrunk while the drained worker was {phase}"
        );
    }
    assert!(
        requests(&worker.seen, "POST /drain") >= 4,
        "the drained worker was asked again and again"
    );
    let answers = |outcome| {
        world
            .operator
            .metrics()
            .drain_answers(&world.namespace, "jobs", outcome)
    };
    println!(
        "drain answers: {} unreachable, {} busy, {} idle, {} refused",
        answers("unreachable"),
        answers("busy"),
        answers("idle"),
        answers("refused")
    );
    assert!(answers("unreachable") >= 2 && answers("busy") >= 1 && answers("idle") >= 1);
    assert_eq!(
        answers("refused"),
        0,
        "a late or silent worker is not a refusal"
    );
    // The pool beside was never held: its shared workers are as sized.
    assert_eq!(world.replicas("calm-shared").await, Some(9));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn silent_pods_of_other_shrinking_pools_never_delay_a_calm_pools_drain() {
    // Ten pools shrink by 16 shared workers each, every one a Pod that takes the connection
    // and never answers: each of their reconciles asks 16 at once, reads and drain requests
    // alike, more than the operator's 64 shared places. A calm pool beside them drains one
    // worker that answers at once.
    const HOSTILE: usize = 10;
    let world = World::start("hostile-crowd").await;
    let (silent, silent_seen) = serve(Behaviour::Silent).await;
    let calm_shared = world.sized_pool("calm").await;
    let mut hostile = Vec::new();
    for p in 0..HOSTILE {
        let name = format!("crowd-{p}");
        hostile.push((name.clone(), world.sized_pool(&name).await));
    }
    let made = Instant::now();
    futures::future::join_all(hostile.iter().flat_map(|(pool, shared)| {
        let world = &world;
        (0..16).map(move |i| async move {
            let labels = labels(pool, "shared");
            let name = format!("{pool}-silent-{i}");
            world.pod(&name, labels, Some(shared), silent, true).await
        })
    }))
    .await;
    let worker = Drainable::default();
    worker.set(false, 0);
    let at = worker.serve().await;
    world
        .pod(
            "calm-worker",
            labels("calm", "shared"),
            Some(&calm_shared),
            at,
            true,
        )
        .await;
    println!(
        "{} silent Pods made in {:.1} s",
        HOSTILE * 16,
        made.elapsed().as_secs_f64()
    );
    let pools = Api::<LanePool>::namespaced(world.client.clone(), &world.namespace);
    let total = |n: i32| Patch::Merge(json!({"spec": {"totalWorkers": n}}));
    // Each crowd pool grows to 19 shared workers, then shrinks to 3: a drain of 16.
    for (pool, _) in &hostile {
        pools
            .patch(pool, &PatchParams::default(), &total(20))
            .await
            .unwrap();
    }
    for (pool, _) in &hostile {
        let shared = format!("{pool}-shared");
        until(30, "the crowd pools grown", || async {
            world.replicas(&shared).await == Some(19)
        })
        .await;
    }
    for (pool, _) in &hostile {
        pools
            .patch(pool, &PatchParams::default(), &total(4))
            .await
            .unwrap();
    }
    until(20, "the crowd's drains asked", || async {
        requests(&silent_seen, "POST /drain") >= 16 * HOSTILE
    })
    .await;
    let asked = Instant::now();
    pools
        .patch("calm", &PatchParams::default(), &total(9))
        .await
        .unwrap();
    let shrunk = until(30, "the calm pool's shrink", || async {
        world.replicas("calm-shared").await == Some(8)
    })
    .await;
    let unreachable =
        world
            .operator
            .metrics()
            .drain_answers(&world.namespace, "calm", "unreachable");
    let crowd_held = futures::future::join_all(hostile.iter().map(|(pool, _)| {
        let world = &world;
        async move { world.replicas(&format!("{pool}-shared")).await }
    }))
    .await;
    println!(
        "calm pool shrank {:.1} s after its decision ({} drain requests, {unreachable} \
         unreachable); silent Pods asked {} GETs and {} drains; crowd pools' shared replicas \
         {crowd_held:?}",
        shrunk.as_secs_f64(),
        requests(&worker.seen, "POST /drain"),
        requests(&silent_seen, "GET"),
        requests(&silent_seen, "POST /drain"),
    );
    assert_eq!(unreachable, 0, "the calm pool's worker was not reached");
    // One interval (5 s, later by its jitter) and a drain round at most.
    assert!(
        shrunk <= Duration::from_secs(8),
        "the calm pool's shrink waited {shrunk:?} behind silent Pods of other pools"
    );
    // The crowd pools hold: their silent workers are unknown, never idle.
    assert!(crowd_held.iter().all(|r| *r == Some(19)), "{crowd_held:?}");
    println!("total {:?}", asked.elapsed());
}
