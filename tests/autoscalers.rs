//! The pool's size left to real autoscalers through the LanePool's `/scale` subresource: KEDA
//! (its operator and its external metrics API server behind the aggregation layer) and
//! kube-controller-manager's HPA controller, on one shared control plane. The ScaledObject and
//! the HPA are the ones in docs/operations.md, read from it with only the addresses changed.
//! Workers are real `lane_worker`s run by the process kubelet where the behaviour needs them.

mod common;

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use common::Killed;
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::Event;
use kube::Client;
use kube::api::{Api, ListParams, PostParams};
use lanepool::api::LanePool;
use lanepool_testenv::{
    self as testenv, Controllers, HPA_DOWNSCALE_STABILIZATION, HPA_SYNC_PERIOD, InProcessOperator,
    LaneQueue, TestPrometheus, example, http_get,
};
use serde_json::json;
use testenv::until;

/// The pool's interval: lanepool decides (and restores its Deployments) this often.
const INTERVAL: Duration = Duration::from_secs(5);
/// Each batch job, in milliseconds: a backlog of 100 per worker drains in 20 s.
const BATCH_MS: u64 = 200;

/// One test's world: a namespace of the shared control plane, a lane queue (urgent at 30/s,
/// batch only as the test submits it), Prometheus scraping it and the workers, optionally a
/// process kubelet running real workers, and the operator.
struct World {
    client: Client,
    namespace: String,
    queue: SocketAddr,
    prometheus: TestPrometheus,
    _kubelet: Option<Killed>,
    _queue: LaneQueue,
    _operator: InProcessOperator,
}

impl World {
    async fn start(prefix: &str, workers: bool) -> Self {
        let plane =
            testenv::shared_with(Controllers::Autoscalers).expect("the control plane starts");
        let client = plane.client().await.unwrap();
        let namespace = plane.namespace(&client, prefix).await.unwrap();
        let queue_process = start_queue(&namespace);
        let queue = queue_process.addr();
        let prometheus = TestPrometheus::start(&[queue]).unwrap();
        let kubelet = workers.then(|| {
            let logs: PathBuf = plane.dir().join(format!("workers-{namespace}"));
            // A loopback block of its own, so parallel tests never share an address.
            let block = 2 + namespace.bytes().map(u32::from).sum::<u32>() % 240;
            Killed(
                Command::new(example("local_kubelet"))
                    .args(["--namespace", &namespace, "--node", &namespace])
                    .args(["--queue-url", &format!("http://{queue}")])
                    .arg("--worker")
                    .arg(example("lane_worker"))
                    .arg("--log-dir")
                    .arg(&logs)
                    .arg("--pod-targets")
                    .arg(prometheus.pod_targets())
                    .args(["--ip-block", &block.to_string()])
                    .env("KUBECONFIG", plane.kubeconfig())
                    .stdin(Stdio::null())
                    .stdout(Stdio::null())
                    .stderr(Stdio::inherit())
                    .spawn()
                    .expect("starting local_kubelet"),
            )
        });
        let operator = InProcessOperator::start_with(
            client.clone(),
            vec![namespace.clone()],
            InProcessOperator::settings(prometheus.url()),
        );
        Self {
            client,
            namespace,
            queue,
            prometheus,
            _kubelet: kubelet,
            _queue: queue_process,
            _operator: operator,
        }
    }

    /// The guide's pool `jobs` (examples/lanepool.yaml: urgent reserved 1–6, sized by
    /// Queueing; 30/s × 20 ms asks 2) at `total` workers, with `extra` merged into its spec.
    async fn apply_pool(&self, total: i32, extra: serde_json::Value) {
        let mut pool = json!({
            "apiVersion": "lanepool.dev/v1alpha1",
            "kind": "LanePool",
            "metadata": {"name": "jobs"},
            "spec": {
                "lanes": [
                    {"name": "urgent", "reserve": {"min": 1, "max": 6, "jobTime": {"fallback": "20ms"}}},
                    {"name": "batch"},
                ],
                "totalWorkers": total,
                "interval": format!("{}s", INTERVAL.as_secs()),
                "template": {"spec": {
                    "terminationGracePeriodSeconds": 1,
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
        });
        if let (Some(spec), Some(extra)) = (pool["spec"].as_object_mut(), extra.as_object()) {
            spec.extend(extra.clone());
        }
        let pool: LanePool = serde_json::from_value(pool).unwrap();
        Api::<LanePool>::namespaced(self.client.clone(), &self.namespace)
            .create(&PostParams::default(), &pool)
            .await
            .unwrap();
    }

    /// Applies YAML with kubectl in this namespace, with the docs' addresses made this world's.
    fn apply_docs_yaml(&self, yaml: &str) {
        let yaml = yaml
            .replace("http://prometheus.monitoring:9090", &self.prometheus.url())
            .replace(
                "namespace=\"team\"",
                &format!("namespace=\"{}\"", self.namespace),
            );
        let plane = testenv::shared_with(Controllers::Autoscalers).unwrap();
        let file = plane.dir().join(format!("{}.yaml", self.namespace));
        std::fs::write(&file, yaml).unwrap();
        let (ok, out) = plane
            .kubectl(&[
                "apply",
                "-n",
                &self.namespace,
                "-f",
                &file.display().to_string(),
            ])
            .unwrap();
        assert!(ok, "kubectl apply: {out}");
    }

    fn kubectl(&self, args: &[&str]) -> String {
        let plane = testenv::shared_with(Controllers::Autoscalers).unwrap();
        let mut all = vec!["-n", &self.namespace];
        all.extend_from_slice(args);
        let (ok, out) = plane.kubectl(&all).unwrap();
        assert!(ok, "kubectl {}: {out}", args.join(" "));
        out
    }

    async fn pool(&self) -> LanePool {
        Api::<LanePool>::namespaced(self.client.clone(), &self.namespace)
            .get("jobs")
            .await
            .unwrap()
    }

    async fn total(&self) -> i32 {
        self.pool().await.spec.total_workers.unwrap_or(0)
    }

    /// `spec.replicas` of a Deployment (0 when it is missing).
    async fn replicas(&self, name: &str) -> i32 {
        Api::<Deployment>::namespaced(self.client.clone(), &self.namespace)
            .get_opt(name)
            .await
            .unwrap()
            .and_then(|d| d.spec?.replicas)
            .unwrap_or(0)
    }

    /// Submits `jobs` batch jobs to the queue, as a producer outside it does.
    fn submit_batch(&self, jobs: usize) {
        for _ in 0..jobs {
            let mut stream = TcpStream::connect(self.queue).unwrap();
            write!(
                stream,
                "POST /submit?lane=batch&job_ms={BATCH_MS} HTTP/1.1\r\nHost: q\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"
            )
            .unwrap();
            let mut answer = String::new();
            let _ = stream.read_to_string(&mut answer);
            assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
        }
    }

    /// Batch jobs waiting in the queue.
    fn batch_depth(&self) -> f64 {
        let (_, metrics) = http_get(self.queue, "/metrics").unwrap();
        metrics
            .lines()
            .find(|l| l.starts_with("lanepool_queue_depth{") && l.contains("lane=\"batch\""))
            .and_then(|l| l.rsplit(' ').next()?.parse().ok())
            .unwrap_or_else(|| panic!("no batch depth in:\n{metrics}"))
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

    /// The pool's condition `type_`: (status, reason, message).
    async fn condition(&self, type_: &str) -> Option<(String, String, String)> {
        let pool = self.pool().await;
        let status = pool.status?;
        let condition = status.conditions.into_iter().find(|c| c.type_ == type_)?;
        Some((condition.status, condition.reason, condition.message))
    }
}

/// The lane queue: urgent jobs at 30/s × 20 ms (the guide's load: a reserve of 2) and no
/// batch jobs until the test submits them.
fn start_queue(namespace: &str) -> LaneQueue {
    LaneQueue::start(&[
        "--pool=jobs".into(),
        "--urgent-profile=0s=30".into(),
        format!("--namespace={namespace}"),
        "--batch-backlog=0".into(),
        "--batch-rate=0".into(),
        format!("--batch-ms={BATCH_MS}..{BATCH_MS}"),
    ])
}

/// The `n`th YAML block of docs/operations.md's section on sizing the whole pool.
fn docs_yaml(n: usize) -> String {
    let docs = include_str!("../docs/operations.md");
    let section = docs
        .split("## Size the whole pool with an HPA or KEDA")
        .nth(1)
        .expect("the section");
    section
        .split("```yaml\n")
        .nth(n + 1)
        .and_then(|block| block.split("```").next())
        .unwrap_or_else(|| panic!("no YAML block {n} in the section"))
        .to_string()
}

/// What the pool did while a backlog built and drained under an autoscaler.
#[derive(Debug, Default)]
struct Followed {
    /// From the submission to the first total above the minimum, and to the largest total.
    first_growth: Duration,
    to_largest: Duration,
    largest: i32,
    /// The urgent reserve seen at each sample, while the total was above its minimum.
    reserves: Vec<i32>,
    /// Changes of spec.totalWorkers (the autoscaler's writes) from the submission to the end.
    total_writes: u32,
    /// From the backlog drained to the total back at its minimum.
    shrink_after_drain: Duration,
}

/// Submits `jobs` batch jobs and samples the pool once a second until the backlog drained and
/// the total is back at `min`.
async fn follow_a_backlog(world: &World, min: i32, jobs: usize) -> Followed {
    let submitted = Instant::now();
    world.submit_batch(jobs);
    let mut followed = Followed::default();
    let mut last_total = world.total().await;
    let mut drained: Option<Instant> = None;
    loop {
        assert!(
            submitted.elapsed() < Duration::from_secs(240),
            "the total did not grow and shrink back within 240 s: {followed:?}"
        );
        let total = world.total().await;
        if total != last_total {
            followed.total_writes += 1;
            last_total = total;
        }
        if total > min {
            if followed.first_growth.is_zero() {
                followed.first_growth = submitted.elapsed();
            }
            followed
                .reserves
                .push(world.replicas("jobs-urgent-reserved").await);
        }
        if total > followed.largest {
            followed.largest = total;
            followed.to_largest = submitted.elapsed();
        }
        if drained.is_none() && !followed.first_growth.is_zero() && world.batch_depth() == 0.0 {
            drained = Some(Instant::now());
        }
        if let Some(at) = drained
            && total == min
        {
            followed.shrink_after_drain = at.elapsed();
            return followed;
        }
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
}

/// Waits for the reserve its load puts it at (30/s × 20 ms: 2) and the pool's status at `total`.
async fn settled_at(world: &World, total: i32) -> i32 {
    until(
        120,
        "the reserve sized and status.replicas at the total",
        || async {
            let reserved = world.replicas("jobs-urgent-reserved").await;
            let pool = world.pool().await;
            let ready = pool.status.as_ref().map_or(0, |s| s.replicas);
            reserved >= 2 && ready == total
        },
    )
    .await;
    world.replicas("jobs-urgent-reserved").await
}

/// How long until the urgent reserve is `reserve` and, separately, the total is `total`.
async fn reserve_and_total(
    world: &World,
    seconds: u64,
    reserve: i32,
    total: i32,
) -> (Duration, Duration) {
    let began = Instant::now();
    let (mut reserve_at, mut total_at) = (None, None);
    while reserve_at.is_none() || total_at.is_none() {
        assert!(
            began.elapsed() < Duration::from_secs(seconds),
            "reserve {reserve} after {reserve_at:?}, total {total} after {total_at:?}: not both within {seconds} s"
        );
        if reserve_at.is_none() && world.replicas("jobs-urgent-reserved").await == reserve {
            reserve_at = Some(began.elapsed());
        }
        if total_at.is_none() && world.total().await == total {
            total_at = Some(began.elapsed());
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    (reserve_at.unwrap_or_default(), total_at.unwrap_or_default())
}

fn assert_followed(followed: &Followed, reserve: i32, min: i32) {
    eprintln!("followed: {followed:?}");
    assert!(
        followed.largest >= min + 4,
        "the backlog did not grow the pool: {followed:?}"
    );
    assert!(
        followed.first_growth <= HPA_SYNC_PERIOD * 2 + Duration::from_secs(10),
        "the total took {:?} to grow",
        followed.first_growth
    );
    // lanepool kept the reserve where its load put it while the autoscaler grew the total.
    assert!(
        followed.reserves.iter().all(|r| (r - reserve).abs() <= 1),
        "the reserve moved with the total: {:?} from {reserve}",
        followed.reserves
    );
    assert!(
        followed.shrink_after_drain
            <= HPA_DOWNSCALE_STABILIZATION + HPA_SYNC_PERIOD * 2 + Duration::from_secs(10),
        "the total took {:?} to shrink after the backlog drained",
        followed.shrink_after_drain
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_docs_scaled_object_grows_the_total_with_the_backlog_and_leaves_the_reserve_to_its_load()
 {
    let world = World::start("keda", true).await;
    world.apply_pool(3, json!({})).await;
    let reserve = settled_at(&world, 3).await;
    world.apply_docs_yaml(&docs_yaml(0));
    until(60, "KEDA's HPA for the LanePool", || async {
        world
            .kubectl(&["get", "hpa", "-o", "name"])
            .contains("keda-hpa-jobs")
    })
    .await;
    let followed = follow_a_backlog(&world, 3, 1500).await;
    assert_followed(&followed, reserve, 3);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_hpa_on_kedas_external_metric_grows_and_shrinks_the_total_the_same_way() {
    let world = World::start("hpa", true).await;
    world.apply_pool(3, json!({})).await;
    let reserve = settled_at(&world, 3).await;
    // The docs' steps: the ScaledObject, reconciled by KEDA, then paused; then the HPA.
    world.apply_docs_yaml(&docs_yaml(1));
    until(60, "KEDA's reconcile of the ScaledObject", || async {
        world
            .kubectl(&[
                "get",
                "so",
                "jobs-backlog",
                "-o=jsonpath={.status.scaleTargetGVKR.kind}",
            ])
            .contains("LanePool")
    })
    .await;
    world.kubectl(&[
        "annotate",
        "so",
        "jobs-backlog",
        "autoscaling.keda.sh/paused=true",
    ]);
    until(
        60,
        "KEDA's own HPA deleted for the paused ScaledObject",
        || async {
            !world
                .kubectl(&["get", "hpa", "-o", "name"])
                .contains("keda-hpa-jobs-backlog")
        },
    )
    .await;
    world.apply_docs_yaml(&docs_yaml(2));
    let metric = format!(
        "/apis/external.metrics.k8s.io/v1beta1/namespaces/{}/s0-prometheus?labelSelector=scaledobject.keda.sh%2Fname%3Djobs-backlog",
        world.namespace
    );
    let plane = testenv::shared_with(Controllers::Autoscalers).unwrap();
    let (ok, answer) = plane.kubectl(&["get", "--raw", &metric]).unwrap();
    assert!(ok && answer.contains("\"metricName\""), "{answer}");
    let hpas = world.kubectl(&["get", "hpa", "-o", "name"]);
    assert_eq!(
        hpas.trim(),
        "horizontalpodautoscaler.autoscaling/jobs",
        "only the HPA of our own"
    );
    let followed = follow_a_backlog(&world, 3, 1500).await;
    assert_followed(&followed, reserve, 3);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn during_a_prometheus_outage_kedas_fallback_sizes_the_total_and_lanepools_policy_the_reserve()
 {
    // No workers: lanepool measures the urgent lane in Prometheus alone, as KEDA does the
    // backlog, so the outage takes both their measurements away.
    let mut world = World::start("fallback", false).await;
    world
        .apply_pool(
            3,
            json!({"onMetricsUnavailable": {"action": "FixedReserve", "reserve": 3, "failureThreshold": 3}}),
        )
        .await;
    until(60, "the reserve sized from its load", || async {
        world.replicas("jobs-urgent-reserved").await == 2
    })
    .await;
    world.apply_docs_yaml(&docs_yaml(3));
    until(60, "KEDA's HPA for the LanePool", || async {
        world
            .kubectl(&["get", "hpa", "-o", "name"])
            .contains("keda-hpa-jobs")
    })
    .await;
    // Settled at the minimum: no backlog.
    tokio::time::sleep(HPA_SYNC_PERIOD).await;
    assert_eq!(world.total().await, 3);

    world.prometheus.stop();
    let stopped = Instant::now();
    // lanepool's FixedReserve of 3 acts first (3 intervals), but the total of 3 leaves 2 for
    // reserves after shared.minReplicas: the reserve stays at 2, and the pool says why.
    until(40, "FixedReserve 3 cut to 2 by the total of 3", || async {
        world
            .condition("ScalingLimited")
            .await
            .is_some_and(|(s, r, m)| {
                s == "True"
                    && r == "TotalBelowReserves"
                    && m.contains("lane urgent asks 3 reserved workers and gets 2")
            })
    })
    .await;
    let cut = stopped.elapsed();
    assert_eq!(world.replicas("jobs-urgent-reserved").await, 2);
    assert_eq!(
        world.total().await,
        3,
        "KEDA's fallback came before lanepool's policy"
    );
    let (reserve_acted, fallback) = reserve_and_total(&world, 120, 3, 6).await;
    let (reserve_acted, fallback) = (cut + reserve_acted, cut + fallback);
    eprintln!("outage: lanepool's FixedReserve 3 cut to 2 by totalWorkers 3 after {cut:?}");
    until(
        30,
        "3 reserved and 3 shared in the fallback total",
        || async {
            world.replicas("jobs-urgent-reserved").await == 3
                && world.replicas("jobs-shared").await == 3
        },
    )
    .await;
    let (status, reason, _) = world.condition("MetricsAvailable").await.unwrap();
    assert_eq!((status.as_str(), reason.as_str()), ("False", "QueryFailed"));
    eprintln!(
        "outage: lanepool's FixedReserve 3 after {reserve_acted:?}, KEDA's fallback total 6 after {fallback:?}"
    );

    world.prometheus.resume().unwrap();
    let (reserve_back, total_back) = reserve_and_total(
        &world,
        (HPA_DOWNSCALE_STABILIZATION + HPA_SYNC_PERIOD * 4).as_secs(),
        2,
        3,
    )
    .await;
    // The reserve is 2 again no later than the total is 3 (3 − shared.minReplicas 1 leaves 2).
    eprintln!("recovery: total 3 after {total_back:?}, reserve 2 after {reserve_back:?}");
    assert!(!world.events("MetricsUnavailable").await.is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_scaled_object_on_a_lanepool_deployment_is_reported_and_undone_at_most_once_an_interval()
{
    use futures::StreamExt;
    use kube::runtime::{WatchStreamExt, watcher};

    // No workers: the backlog never drains, so the autoscaler keeps asking for more.
    let world = World::start("own-deployment", false).await;
    // A reserve fixed at 1 (no Pod here ever becomes ready, so a surge would hold the shared
    // workers): lanepool's count for the shared Deployment is 3 − 1 = 2.
    let fixed = json!({"lanes": [
        {"name": "urgent", "reserve": {"min": 1, "max": 1, "jobTime": {"fallback": "20ms"}}},
        {"name": "batch"},
    ]});
    world.apply_pool(3, fixed).await;
    until(60, "1 reserved and 2 shared", || async {
        world.replicas("jobs-urgent-reserved").await == 1
            && world.replicas("jobs-shared").await == 2
    })
    .await;
    world.submit_batch(500);
    // The docs' ScaledObject aimed at the shared Deployment instead of the LanePool.
    let aimed = docs_yaml(0).replace(
        "{apiVersion: lanepool.dev/v1alpha1, kind: LanePool, name: jobs}",
        "{apiVersion: apps/v1, kind: Deployment, name: jobs-shared}",
    );
    assert_ne!(aimed, docs_yaml(0));
    world.apply_docs_yaml(&aimed);

    // Every change of the shared Deployment's replicas, as the API server stores them.
    let deployments = Api::<Deployment>::namespaced(world.client.clone(), &world.namespace);
    let config = watcher::Config::default().fields("metadata.name=jobs-shared");
    let changes = std::sync::Arc::new(std::sync::Mutex::new(Vec::<(Instant, i32)>::new()));
    let seen = changes.clone();
    let watching = tokio::spawn(async move {
        let mut stream = watcher(deployments, config).applied_objects().boxed();
        let mut last = None;
        while let Some(Ok(deployment)) = stream.next().await {
            let replicas = deployment.spec.and_then(|s| s.replicas).unwrap_or(0);
            if last != Some(replicas) {
                last = Some(replicas);
                seen.lock().unwrap().push((Instant::now(), replicas));
            }
        }
    });
    until(
        60,
        "ScalingLimited=True, reason HorizontalPodAutoscaler",
        || async {
            world
                .condition("ScalingLimited")
                .await
                .is_some_and(|(s, r, _)| s == "True" && r == "HorizontalPodAutoscaler")
        },
    )
    .await;
    let (_, _, message) = world.condition("ScalingLimited").await.unwrap();
    assert!(message.contains("keda-hpa-jobs"), "{message}");

    let window = Duration::from_secs(60);
    let began = Instant::now();
    tokio::time::sleep(window).await;
    watching.abort();
    let changes: Vec<(Instant, i32)> = changes
        .lock()
        .unwrap()
        .iter()
        .filter(|(at, _)| *at >= began)
        .copied()
        .collect();
    // Each time away from lanepool's 2 (the autoscaler's writes) and how long until restored.
    let mut away = Vec::new();
    for pair in changes.windows(2) {
        if pair[0].1 != 2 && pair[1].1 == 2 {
            away.push(pair[1].0 - pair[0].0);
        }
    }
    let intervals = window.as_secs_f64() / INTERVAL.as_secs_f64();
    let writes_per_interval = changes.len() as f64 / intervals;
    eprintln!(
        "own Deployment: {} replica changes in {window:?} ({writes_per_interval:.2} per {INTERVAL:?} interval): {:?}; restored after {away:?}",
        changes.len(),
        changes.iter().map(|(_, r)| r).collect::<Vec<_>>()
    );
    assert!(
        !away.is_empty(),
        "the autoscaler never changed the Deployment: the test proves nothing"
    );
    assert!(
        writes_per_interval <= 1.0,
        "{} changes in {window:?}: the two write back and forth more than once an interval",
        changes.len()
    );
    assert!(
        away.iter().all(|d| *d < INTERVAL),
        "not undone within an interval: {away:?}"
    );
    assert_eq!(world.replicas("jobs-shared").await, 2);
    assert!(!world.events("ReplicasRestored").await.is_empty());
}
