//! Whole reconciles without a server, for unit tests: an in-memory API behind a real
//! `kube::Client` (a `tower` service in place of the HTTP connection) that keeps the pool's
//! Deployments and Pods, feeds its writes back to the watch caches as a watch would, and records
//! every request; and workers on 127.0.0.1 that answer `/metrics`, `/drain` and `/stand-in` as the
//! protocol says. The reconcile under test is the operator's own, unchanged.

use std::collections::BTreeMap;
use std::convert::Infallible;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::FutureExt;
use futures::future::BoxFuture;
use http_body_util::{BodyExt, Full};
use hyper::body::Bytes;
use k8s_openapi::api::apps::v1::ReplicaSet;
use k8s_openapi::api::core::v1::Pod;
use kube::ResourceExt;
use kube::core::PartialObjectMeta;
use kube::runtime::reflector::{self, store::Writer};
use kube::runtime::watcher::Event;
use serde_json::{Value, json};

use super::cached_pod::CachedPod;
use super::caches::Caches;
use super::context::Context;
use super::deployments::{CachedDeployment, worker_deployments};
use super::pool_index::PoolIndex;
use super::protocol::DELETION_COST;
use super::settings::Settings;
use super::state::pools::PoolKey;
use super::worker_http::{REQUEST_TIMEOUT, Refused, WorkerHttp};
use crate::api::{LanePool, POOL_LABEL};
use crate::leader::Fence;
use crate::prometheus::{AllowedUrls, QueryWindows};
use crate::sizing::Replicas;

/// One request the API got: its method, path and body.
#[derive(Clone, Debug)]
pub(super) struct Request {
    pub(super) method: String,
    pub(super) path: String,
    pub(super) body: Value,
}

impl Request {
    /// A write: anything but a GET.
    pub(super) fn writes(&self) -> bool {
        self.method != "GET"
    }

    /// The Deployment count it applies, when it applies `deployment`.
    pub(super) fn applies(&self, deployment: &str) -> Option<i64> {
        let path = format!("/deployments/{deployment}?");
        (self.method == "PATCH" && self.path.contains(&path))
            .then(|| self.body["spec"]["replicas"].as_i64())
            .flatten()
    }
}

/// A worker Pod's process: idle or busy with a job, draining or standing in as asked.
#[derive(Default)]
pub(super) struct FakeWorker {
    pub(super) busy: AtomicBool,
    pub(super) draining: AtomicBool,
    pub(super) standing_in: AtomicBool,
    /// It stopped answering (its server is gone).
    pub(super) silent: AtomicBool,
    /// It takes each drain or stand-in request but answers too late: the operator hears
    /// nothing.
    pub(super) late: AtomicBool,
    /// It does not take drain requests: `POST /drain` answers 404, as a worker that does not
    /// speak that part of the protocol does.
    pub(super) refuses_drain: AtomicBool,
    pub(super) asked: AtomicUsize,
    /// Drain and stand-in requests it answered.
    pub(super) posted: AtomicUsize,
    /// Drain requests (`POST /drain` of more than 0 s) it was sent.
    pub(super) drains_asked: AtomicUsize,
    /// The token it takes requests with, when it holds another than the pool's Secret (one
    /// the operator has not seen): a request with any other is answered 401.
    pub(super) holds_token: Mutex<Option<String>>,
    /// The tokens its requests carried, in the order sent.
    pub(super) tokens: Mutex<Vec<String>>,
}

impl FakeWorker {
    fn metrics(&self) -> String {
        let gauge = |on: &AtomicBool| u8::from(on.load(Ordering::SeqCst));
        format!(
            "lanepool_worker_busy{{lane=\"batch\"}} {}\nlanepool_worker_draining {}\nlanepool_worker_standing_in {}\nlanepool_worker_credential_required 1\n",
            gauge(&self.busy),
            gauge(&self.draining),
            gauge(&self.standing_in),
        )
    }

    /// Its answer to `method` `target` (carrying `token` on a POST): status and text.
    fn answer(&self, method: &str, target: &str, token: Option<&str>) -> (u16, String) {
        self.asked.fetch_add(1, Ordering::SeqCst);
        if method == "POST" {
            self.posted.fetch_add(1, Ordering::SeqCst);
            self.tokens.lock().unwrap().extend(token.map(String::from));
            let held = self.holds_token.lock().unwrap().clone();
            if held.is_some_and(|held| Some(held.as_str()) != token) {
                return (401, "the pool's credential is required\n".into());
            }
        }
        let seconds = |t: &str| {
            t.split(['?', '&'])
                .find_map(|p| p.strip_prefix("seconds="))
                .and_then(|s| s.parse::<u64>().ok())
                .unwrap_or(0)
        };
        let path = target.split('?').next().unwrap_or_default();
        if (method, path) == ("POST", "/drain") && seconds(target) > 0 {
            self.drains_asked.fetch_add(1, Ordering::SeqCst);
        }
        match (method, path) {
            ("POST", "/drain") if self.refuses_drain.load(Ordering::SeqCst) => {
                return (404, "not found\n".into());
            }
            ("POST", "/drain") => {
                let draining = seconds(target) > 0;
                self.draining.store(draining, Ordering::SeqCst);
                // A drain ends a stand-in: the worker is about to be stopped.
                if draining {
                    self.standing_in.store(false, Ordering::SeqCst);
                }
            }
            ("POST", "/stand-in") => self
                .standing_in
                .store(seconds(target) > 0, Ordering::SeqCst),
            _ => {}
        }
        (200, self.metrics())
    }
}

/// The workers by address, answering the operator's requests in memory: the [`WorkerHttp`] the
/// context of a [`FakeCluster`] holds in place of the network. A silent worker, or an address no
/// worker has, gives no answer within the client's timeout.
#[derive(Default)]
struct FakeWorkers {
    by_address: Mutex<BTreeMap<String, Arc<FakeWorker>>>,
}

impl FakeWorkers {
    async fn answer(
        &self,
        method: &str,
        address: &str,
        path: &str,
        token: Option<&str>,
    ) -> Result<(u16, String), Refused> {
        let worker = self.by_address.lock().unwrap().get(address).cloned();
        match worker.filter(|w| !w.silent.load(Ordering::SeqCst)) {
            Some(worker) if method == "POST" && worker.late.load(Ordering::SeqCst) => {
                worker.answer(method, path, token);
                tokio::time::sleep(REQUEST_TIMEOUT).await;
                Err(Refused::Timeout)
            }
            Some(worker) => Ok(worker.answer(method, path, token)),
            None => {
                tokio::time::sleep(REQUEST_TIMEOUT).await;
                Err(Refused::Timeout)
            }
        }
    }
}

impl WorkerHttp for FakeWorkers {
    fn get<'a>(
        &'a self,
        address: &'a str,
        path: &'a str,
    ) -> BoxFuture<'a, Result<String, Refused>> {
        async move {
            match self.answer("GET", address, path, None).await? {
                (200, text) => Ok(text),
                (status, _) => Err(Refused::Status(status)),
            }
        }
        .boxed()
    }

    fn post<'a>(
        &'a self,
        address: &'a str,
        path: &'a str,
        token: &'a str,
    ) -> BoxFuture<'a, Result<(u16, String), Refused>> {
        self.answer("POST", address, path, Some(token)).boxed()
    }
}

/// The in-memory cluster of one pool: its Deployments, ReplicaSets and Pods, the caches the
/// operator reads them from, the requests it sent, and its workers by Pod name.
pub(super) struct FakeCluster {
    pub(super) pool: Arc<LanePool>,
    pub(super) ctx: Arc<Context>,
    pub(super) requests: Arc<Mutex<Vec<Request>>>,
    pub(super) workers: BTreeMap<String, Arc<FakeWorker>>,
    deployments: Arc<Deployments>,
    pods: Arc<PoolIndex<CachedPod>>,
}

const NAMESPACE: &str = "team";

/// The Deployments' watch cache writer, and each Deployment as the API keeps it.
type Deployments = Mutex<(Writer<CachedDeployment>, BTreeMap<String, Value>)>;

/// The guide's pool (`examples/lanepool.yaml`) in namespace `team`, measured every `interval`,
/// its workers serving their gauges at a port named `metrics`.
pub(super) fn pool(interval: &str) -> LanePool {
    let mut pool: LanePool =
        serde_yaml::from_str(include_str!("../../examples/lanepool.yaml")).unwrap();
    pool.metadata.namespace = Some(NAMESPACE.into());
    pool.metadata.uid = Some("pool-uid".into());
    pool.metadata.generation = Some(1);
    pool.spec.interval = serde_json::from_value(json!(interval)).unwrap();
    let container = &mut pool.spec.template.spec.as_mut().unwrap().containers[0];
    container.ports = Some(vec![
        serde_json::from_value(json!({"name": "metrics", "containerPort": 9100})).unwrap(),
    ]);
    pool
}

/// The operator's settings in these tests: its defaults, with short timeouts.
pub(super) fn settings() -> Settings {
    Settings {
        default_prometheus_url: None,
        windows: QueryWindows {
            arrival_rate: "30s".into(),
            recent_arrival_rate: None,
            scrape_interval: Duration::from_secs(15),
            job_time: "5m".into(),
        },
        write_timeout: Duration::from_secs(5),
        surge_timeout: Duration::from_secs(120),
        allowed_prometheus_urls: AllowedUrls::any(),
        prometheus_concurrency: 10,
        concurrent_reconciles: 4,
        idle_workers_first: true,
        drain_timeout: Duration::from_secs(30),
        worker_reads: true,
        credential_max_age: super::settings::DEFAULT_CREDENTIAL_MAX_AGE,
    }
}

/// The API server's answer to a read of something it does not have.
fn not_found() -> Value {
    json!({"apiVersion": "v1", "kind": "Status", "status": "Failure", "message": "not found",
        "reason": "NotFound", "code": 404})
}

/// The in-memory API: what it keeps, and every request it got.
struct Api {
    requests: Arc<Mutex<Vec<Request>>>,
    deployments: Arc<Deployments>,
    pods: Arc<PoolIndex<CachedPod>>,
    pod_objects: Mutex<BTreeMap<String, Pod>>,
    /// The pool, as a status write answers it.
    pool: Value,
}

impl Api {
    /// The API's answer to one request: (status, body). Writes to Deployments and Pods reach
    /// the watch caches at once, as a watch would deliver them.
    fn answer(&self, method: &str, path: &str, body: Value) -> (u16, Value) {
        self.requests.lock().unwrap().push(Request {
            method: method.to_string(),
            path: path.to_string(),
            body: body.clone(),
        });
        let (deployments, pods, pod_objects) = (&self.deployments, &self.pods, &self.pod_objects);
        let name = |kind: &str| {
            path.split(&format!("/{kind}/"))
                .nth(1)
                .and_then(|rest| rest.split(['/', '?']).next())
                .unwrap_or_default()
                .to_string()
        };
        match method {
            "PATCH" if path.contains("/deployments/") => {
                let name = name("deployments");
                let mut held = deployments.lock().unwrap();
                let mut value = held.1.get(&name).cloned().unwrap_or(body.clone());
                value["spec"] = body["spec"].clone();
                let cached: CachedDeployment = serde_json::from_value(value.clone()).unwrap();
                held.0.apply_watcher_event(&Event::Apply(cached));
                held.1.insert(name, value.clone());
                (200, value)
            }
            "PATCH" if path.contains("/pods/") => {
                let name = name("pods");
                let mut objects = pod_objects.lock().unwrap();
                let Some(pod) = objects.get_mut(&name) else {
                    return (404, not_found());
                };
                if let Some(cost) = body["metadata"]["annotations"][DELETION_COST].as_str() {
                    pod.metadata
                        .annotations
                        .get_or_insert_default()
                        .insert(DELETION_COST.into(), cost.into());
                }
                pods.apply(Event::Apply(pod.clone()), CachedPod::of);
                (200, serde_json::to_value(&*pod).unwrap())
            }
            "PATCH" if path.contains("/lanepools/") => {
                let mut pool = self.pool.clone();
                pool["status"] = body["status"].clone();
                (200, pool)
            }
            "POST" => (201, body),
            _ => (404, not_found()),
        }
    }
}

impl FakeCluster {
    /// `pool` running `live` (every Pod Running and Ready, its worker answering), having decided
    /// `decided` at this process's start (so the next reconcile is not due for an interval),
    /// with this process's writes fenced by `fence`.
    pub(super) async fn start(
        pool: LanePool,
        live: &Replicas,
        decided: &Replicas,
        fence: Fence,
    ) -> Self {
        let requests: Arc<Mutex<Vec<Request>>> = Arc::default();
        let (deployment_store, deployment_writer) = reflector::store();
        let (autoscaler_store, mut autoscaler_writer) = reflector::store();
        let pods = Arc::new(PoolIndex::default());
        let replicasets = Arc::new(PoolIndex::default());
        let deployments = Arc::new(Mutex::new((deployment_writer, BTreeMap::new())));
        let api = Arc::new(Api {
            requests: requests.clone(),
            deployments: deployments.clone(),
            pods: pods.clone(),
            pod_objects: Mutex::default(),
            pool: serde_json::to_value(&pool).unwrap(),
        });
        let serving = api.clone();
        let service = tower::service_fn(move |request: hyper::Request<kube::client::Body>| {
            let api = serving.clone();
            async move {
                let (parts, body) = request.into_parts();
                let bytes = body
                    .collect()
                    .await
                    .map(|b| b.to_bytes())
                    .unwrap_or_default();
                let body: Value = serde_json::from_slice(&bytes).unwrap_or(Value::Null);
                let (status, answer) =
                    api.answer(parts.method.as_ref(), &parts.uri.to_string(), body);
                let response = hyper::Response::builder()
                    .status(status)
                    .header("content-type", "application/json")
                    .body(Full::new(Bytes::from(answer.to_string())))
                    .unwrap();
                Ok::<_, Infallible>(response)
            }
        });
        let client = kube::Client::new(service, NAMESPACE);
        let answering = Arc::new(FakeWorkers::default());
        let ctx = Context::new(client, Arc::default(), settings())
            .with_fence(fence)
            .with_worker_http(answering.clone());
        autoscaler_writer.apply_watcher_event(&Event::Init);
        autoscaler_writer.apply_watcher_event(&Event::InitDone);
        replicasets.apply::<PartialObjectMeta<ReplicaSet>>(Event::Init, |r| r);
        pods.apply::<Pod>(Event::Init, CachedPod::of);
        let mut workers = BTreeMap::new();
        for deployment in worker_deployments(&pool, live) {
            let name = deployment.name_any();
            let count = deployment
                .spec
                .as_ref()
                .and_then(|s| s.replicas)
                .unwrap_or(0);
            let mut value = serde_json::to_value(&deployment).unwrap();
            value["metadata"]["uid"] = json!(format!("{name}-uid"));
            value["status"] = json!({"replicas": count, "readyReplicas": count});
            let replicaset = serde_json::from_value(json!({
                "apiVersion": "apps/v1", "kind": "ReplicaSet",
                "metadata": {
                    "name": format!("{name}-1"), "namespace": NAMESPACE, "uid": format!("{name}-rs"),
                    "labels": {POOL_LABEL: "jobs"},
                    "annotations": {"deployment.kubernetes.io/revision": "1"},
                    "ownerReferences": [{"apiVersion": "apps/v1", "kind": "Deployment",
                        "name": name, "uid": format!("{name}-uid"), "controller": true}],
                },
            }))
            .unwrap();
            replicasets.apply::<PartialObjectMeta<ReplicaSet>>(Event::InitApply(replicaset), |r| r);
            for i in 0..count {
                let worker = Arc::new(FakeWorker::default());
                let port = {
                    let mut answering = answering.by_address.lock().unwrap();
                    let port = 10_000 + answering.len();
                    answering.insert(format!("127.0.0.1:{port}"), worker.clone());
                    port
                };
                let pod_name = format!("{name}-{i}");
                let pod: Pod = serde_json::from_value(json!({
                    "apiVersion": "v1", "kind": "Pod",
                    "metadata": {
                        "name": pod_name, "namespace": NAMESPACE, "labels": {POOL_LABEL: "jobs"},
                        "ownerReferences": [{"apiVersion": "apps/v1", "kind": "ReplicaSet",
                            "name": format!("{name}-1"), "uid": format!("{name}-rs"), "controller": true}],
                    },
                    "spec": {"nodeName": "node", "containers": [{"name": "worker", "image": "w",
                        "ports": [{"name": "metrics", "containerPort": port}]}]},
                    "status": {"phase": "Running", "podIP": "127.0.0.1",
                        "conditions": [{"type": "Ready", "status": "True"},
                                       {"type": "ContainersReady", "status": "True"}]},
                }))
                .unwrap();
                pods.apply(Event::InitApply(pod.clone()), CachedPod::of);
                api.pod_objects
                    .lock()
                    .unwrap()
                    .insert(pod_name.clone(), pod);
                workers.insert(pod_name, worker);
            }
            let mut held = deployments.lock().unwrap();
            let cached: CachedDeployment = serde_json::from_value(value.clone()).unwrap();
            held.0.apply_watcher_event(&Event::InitApply(cached));
            held.1.insert(name, value);
        }
        deployments
            .lock()
            .unwrap()
            .0
            .apply_watcher_event(&Event::InitDone);
        replicasets.apply::<PartialObjectMeta<ReplicaSet>>(Event::InitDone, |r| r);
        pods.apply::<Pod>(Event::InitDone, CachedPod::of);
        ctx.caches.set(vec![Caches {
            deployments: deployment_store,
            autoscalers: autoscaler_store,
            pods: pods.clone(),
            replicasets,
        }]);
        ctx.remember(PoolKey::of(&pool), |memory| {
            memory.replicas = Some(decided.clone());
            memory.applied = Some(live.clone());
            memory.measured_at = Some(Duration::ZERO);
            memory.generation = pool.metadata.generation;
            memory.swept = pool.metadata.generation;
            memory.job_seconds = BTreeMap::from([("urgent".into(), 0.02), ("batch".into(), 1.0)]);
        });
        Self {
            pool: Arc::new(pool),
            ctx: Arc::new(ctx),
            requests,
            workers,
            deployments,
            pods,
        }
    }

    /// Sets a Deployment's ready count, as its ReplicaSet's Pods becoming Ready would.
    pub(super) fn ready(&self, deployment: &str, ready: i64) {
        let mut held = self.deployments.lock().unwrap();
        let mut value = held.1[deployment].clone();
        value["status"] = json!({"replicas": ready, "readyReplicas": ready});
        let cached: CachedDeployment = serde_json::from_value(value.clone()).unwrap();
        held.0.apply_watcher_event(&Event::Apply(cached));
        held.1.insert(deployment.into(), value);
    }

    /// The requests sent so far, emptied.
    pub(super) fn take_requests(&self) -> Vec<Request> {
        std::mem::take(&mut *self.requests.lock().unwrap())
    }

    /// How many drain and stand-in requests the workers answered.
    pub(super) fn worker_posts(&self) -> usize {
        self.workers
            .values()
            .map(|w| w.posted.load(Ordering::SeqCst))
            .sum()
    }

    /// The workers of `deployment` that were asked to drain, and still are.
    pub(super) fn draining(&self, deployment: &str) -> Vec<String> {
        self.workers
            .iter()
            .filter(|(name, w)| {
                name.starts_with(&format!("{deployment}-")) && w.draining.load(Ordering::SeqCst)
            })
            .map(|(name, _)| name.clone())
            .collect()
    }

    /// The deletion cost the Pod cache shows for `pod`.
    pub(super) fn cost(&self, pod: &str) -> Option<String> {
        self.pods
            .pool(NAMESPACE, "jobs")
            .iter()
            .find(|p| p.name == pod)
            .and_then(|p| p.deletion_cost.clone())
    }

    /// One reconcile of the pool, which must succeed.
    pub(super) async fn reconcile(&self) {
        self.try_reconcile().await.unwrap();
    }

    pub(super) async fn try_reconcile(&self) -> crate::Result<kube::runtime::controller::Action> {
        super::reconcile(self.pool.clone(), self.ctx.clone()).await
    }

    /// The ReplicaSet controller stops `pod`: it leaves the Pod cache.
    pub(super) fn stop(&self, pod: &str) {
        let gone: Pod = serde_json::from_value(json!({
            "apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": pod, "namespace": NAMESPACE, "labels": {POOL_LABEL: "jobs"}},
        }))
        .unwrap();
        self.pods.apply(Event::Delete(gone), CachedPod::of);
    }

    /// The worker of Pod `pod`.
    pub(super) fn worker(&self, pod: &str) -> &FakeWorker {
        &self.workers[pod]
    }
}

/// Replicas of `reserved` urgent workers and `shared` shared ones.
pub(super) fn replicas(reserved: i32, shared: i32) -> Replicas {
    Replicas {
        reserved: BTreeMap::from([("urgent".to_string(), reserved)]),
        shared,
    }
}
