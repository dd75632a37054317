//! `lanepool-scale`: the scale benchmark. Starts the local control plane (kube-controller-manager
//! makes each pool's Pods from its ReplicaSets), kwok as the kubelet of one fake Node (every Pod
//! Running and Ready at a loopback address of its own, nothing run), one process answering as
//! every Pod's worker, Prometheus with an exporter giving every pool and lane its own rate, N
//! LanePools of 10 workers over 10 namespaces (two reserve lanes each, the operator's and the
//! CRD's defaults otherwise: interval 5 s, worker reads on), and the release `lanepool run`
//! binary. Prints how long until every reserve is right, how long a rate change takes to reach
//! every pool, the operator's RSS and CPU, its reconcile latency, its Prometheus queries, the API
//! server's LISTs (of Pods, and all) and the GETs at the Pods per interval in steady state.
//! Run by tests/scale.sh.

use std::collections::BTreeMap;
use std::net::IpAddr;
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use clap::Parser;
use futures::StreamExt;
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, ListParams, PostParams};
use kube::runtime::{WatchStreamExt, reflector, watcher};
use kube::{Client, ResourceExt};
use lanepool::api::{LanePool, POOL_LABEL};
use lanepool_testenv::{
    ControlPlane, Controllers, Kwok, PodWorkers, SimulatedWorkers, TestPrometheus, free_port,
};

#[derive(Parser)]
#[command(name = "lanepool-scale", about)]
struct Args {
    /// How many LanePools.
    #[arg(long, default_value_t = 1000)]
    pools: usize,
    /// The `lanepool` binary to run (a release build).
    #[arg(long, default_value = "target/release/lanepool")]
    operator: std::path::PathBuf,
    /// How long to measure steady state.
    #[arg(long, default_value = "60")]
    steady_seconds: u64,
    /// Each pool's `spec.interval` (the CRD's default, 5s, when not given).
    #[arg(long)]
    interval: Option<String>,
    /// Where to keep the operator's metrics as scraped at the steady window's start and end and
    /// once every pool followed the change (steady-start.txt, steady-end.txt, changed.txt), and
    /// the API server's at the last two.
    #[arg(long)]
    metrics_out: Option<std::path::PathBuf>,
    /// More flags for `lanepool run`, after `--`.
    #[arg(last = true)]
    operator_args: Vec<String>,
}

const NAMESPACES: usize = 10;
const LANES: [&str; 2] = ["urgent", "high"];
/// Each pool's workers, and so its Pods.
const WORKERS: usize = 10;
const RESERVE_MAX: i32 = 4;
const JOB_SECONDS: f64 = 0.020;
const NODE: &str = "kwok-0";

/// The reserve the default rule (wait p99 ≤ job time) gives a rate, within the spec's bounds.
fn reserve_for(rate: f64) -> i32 {
    // The batch lane has no measured job time here, so the shared workers' help is not counted.
    lanepool::sizing::wait_within_job_time(rate, JOB_SECONDS, 1.0, None)
        .unwrap_or(RESERVE_MAX)
        .clamp(1, RESERVE_MAX)
}

/// The reserves that are right for a rate, as the operator moves: the rule's for any rate within
/// its tolerance. Growth needs 2 σ of one read's Poisson count (`NOISE_SIGMAS`, at least 10 %,
/// at most 50 %), a shrink 10 % (`TOLERANCE`).
fn right_reserves(rate: f64, interval_seconds: f64) -> (i32, i32) {
    use lanepool::sizing::{MOST_TOLERANCE, NOISE_SIGMAS, TOLERANCE};
    let growth = (NOISE_SIGMAS / (rate * interval_seconds).sqrt()).clamp(TOLERANCE, MOST_TOLERANCE);
    // 2 % more either way for the measurement itself: a read of 79.9/s for a lane at 80/s is
    // right, whichever side of a boundary the tolerance puts it.
    let slack = 1.02;
    (
        reserve_for(rate / (1.0 + growth) / slack),
        reserve_for(rate * (1.0 + TOLERANCE) * slack),
    )
}

/// 5–45 jobs/s, 90 when `high`: a reserve of 1 to 4 at 20 ms.
fn rate_of(pool: usize, lane: usize, high: bool) -> f64 {
    let base = 5.0 + ((pool * 7 + lane * 13) % 9) as f64 * 5.0;
    if high { base * 2.0 } else { base }
}

fn manifest(name: &str, interval: Option<&str>, metrics_port: u16) -> LanePool {
    let reserve =
        serde_json::json!({"min": 1, "max": RESERVE_MAX, "jobTime": {"fallback": "20ms"}});
    let mut spec = serde_json::json!({
        "lanes": [
            {"name": "urgent", "reserve": reserve},
            {"name": "high", "reserve": reserve},
            {"name": "batch"}
        ],
        "totalWorkers": WORKERS,
        "shared": {"minReplicas": 2},
        "template": {"spec": {
            "nodeName": NODE,
            "containers": [{
                "name": "worker",
                "image": "worker:1",
                "ports": [{"name": "metrics", "containerPort": metrics_port}]
            }]
        }}
    });
    if let Some(interval) = interval {
        spec["interval"] = interval.into();
    }
    serde_json::from_value(serde_json::json!({
        "apiVersion": "lanepool.dev/v1alpha1",
        "kind": "LanePool",
        "metadata": {"name": name},
        "spec": spec
    }))
    .expect("the benchmark's LanePool")
}

/// Keeps `workers` told which Pod runs at which address, from a watch of the pools' Pods.
async fn follow_pods(client: Client, workers: Arc<PodWorkers>) {
    let pods: Api<Pod> = Api::all(client);
    let mut events = std::pin::pin!(watcher(pods, watcher::Config::default().labels(POOL_LABEL)));
    while let Some(event) = events.next().await {
        let (pod, gone) = match event {
            Ok(watcher::Event::Apply(pod) | watcher::Event::InitApply(pod)) => (pod, false),
            Ok(watcher::Event::Delete(pod)) => (pod, true),
            _ => continue,
        };
        let status = pod.status.as_ref();
        let Some(ip) = status
            .and_then(|s| s.pod_ip.as_deref())
            .and_then(|ip| ip.parse::<IpAddr>().ok())
        else {
            continue;
        };
        let running = status.and_then(|s| s.phase.as_deref()) == Some("Running");
        if gone || !running || pod.metadata.deletion_timestamp.is_some() {
            workers.remove_pod(ip);
        } else if let Some(pool) = pod.labels().get(POOL_LABEL) {
            workers.add_pod(ip, &pod.namespace().unwrap_or_default(), pool);
        }
    }
}

/// An object's "namespace/name", the key every map here is by.
fn key_of(object: &impl ResourceExt) -> String {
    format!(
        "{}/{}",
        object.namespace().unwrap_or_default(),
        object.name_any()
    )
}

/// How much a counter (summed over the lines matching every filter) grew between two scrapes.
fn grew(before: &str, after: &str, name: &str, filters: &[&str]) -> f64 {
    sum_metric(after, name, filters) - sum_metric(before, name, filters)
}

/// The `ps`-quantiles of a histogram between two scrapes (the upper bounds of their buckets),
/// times `unit`, as "a / b / c"; "-" for one without observations.
fn quantiles(before: &str, after: &str, name: &str, ps: &[f64], unit: f64) -> String {
    ps.iter()
        .map(|&p| {
            quantile(before, after, name, p)
                .map_or("-".into(), |v| lanepool::duration::trim(v * unit))
        })
        .collect::<Vec<_>>()
        .join(" / ")
}

/// A metric's value summed over the lines of a text exposition that match every filter.
fn sum_metric(text: &str, name: &str, filters: &[&str]) -> f64 {
    text.lines()
        .filter(|l| l.starts_with(name) && filters.iter().all(|f| l.contains(f)))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

/// The p-quantile of a Prometheus histogram over the time between two scrapes of it, from its
/// cumulative buckets: the upper bound of the first bucket holding that share.
fn quantile(before: &str, after: &str, name: &str, p: f64) -> Option<f64> {
    let bucket = format!("{name}_bucket{{le=\"");
    let read = |text: &str| -> Vec<(f64, f64)> {
        text.lines()
            .filter_map(|l| {
                let rest = l.strip_prefix(&bucket)?;
                let (le, value) = rest.split_once("\"} ")?;
                let le = if le == "+Inf" {
                    f64::INFINITY
                } else {
                    le.parse().ok()?
                };
                Some((le, value.trim().parse().ok()?))
            })
            .collect()
    };
    let earlier = read(before);
    let buckets: Vec<(f64, f64)> = read(after)
        .into_iter()
        .map(|(le, count)| {
            let was = earlier
                .iter()
                .find(|(l, _)| *l == le)
                .map_or(0.0, |(_, c)| *c);
            (le, count - was)
        })
        .collect();
    let total = buckets.last()?.1;
    if total <= 0.0 {
        return None;
    }
    buckets
        .iter()
        .find(|(_, count)| *count >= p * total)
        .map(|(le, _)| *le)
}

fn proc_status(pid: u32, field: &str) -> f64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .unwrap_or_default()
        .lines()
        .find_map(|l| l.strip_prefix(field))
        .and_then(|v| v.split_whitespace().next()?.parse().ok())
        .unwrap_or(0.0)
}

/// CPU seconds the process used (user + system).
fn cpu_seconds(pid: u32) -> f64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    let fields: Vec<&str> = stat
        .rsplit_once(')')
        .map(|(_, rest)| rest.split_whitespace().collect())
        .unwrap_or_default();
    let ticks = |i: usize| {
        fields
            .get(i)
            .and_then(|v| v.parse::<f64>().ok())
            .unwrap_or(0.0)
    };
    (ticks(11) + ticks(12)) / 100.0
}

async fn text(client: &Client, path: &str) -> String {
    let request = http::Request::get(path).body(Vec::new()).unwrap();
    client.request_text(request).await.unwrap_or_default()
}

async fn operator_metrics(port: u16) -> String {
    let addr = std::net::SocketAddr::from(([127, 0, 0, 1], port));
    tokio::task::spawn_blocking(move || {
        lanepool_testenv::http_get(addr, "/metrics")
            .map(|(_, body)| body)
            .unwrap_or_default()
    })
    .await
    .unwrap_or_default()
}

/// The reserved Deployments and the pools, from watch caches: the benchmark asks every 500 ms
/// which are right, and LISTing 2,000 Deployments and 1,000 statuses that often would load the
/// API server (and the 2 cores) it measures.
struct Watched {
    deployments: reflector::Store<Deployment>,
    pools: reflector::Store<LanePool>,
}

impl Watched {
    async fn start(client: &Client) -> Self {
        let reserved = watcher::Config::default().labels("lanepool.dev/role=reserved");
        let deployments = cache(Api::all(client.clone()), reserved);
        let pools = cache(Api::all(client.clone()), watcher::Config::default());
        deployments
            .wait_until_ready()
            .await
            .expect("the Deployment cache");
        pools.wait_until_ready().await.expect("the LanePool cache");
        Self { deployments, pools }
    }

    /// The reserve lanes whose Deployment is not yet right, with its replicas.
    fn wrong(&self, expected: &BTreeMap<String, (i32, i32)>) -> Vec<(String, i32)> {
        let replicas: BTreeMap<String, i32> = self
            .deployments
            .state()
            .iter()
            .map(|d| {
                (
                    key_of(d.as_ref()),
                    d.spec.as_ref().and_then(|s| s.replicas).unwrap_or(0),
                )
            })
            .collect();
        expected
            .iter()
            .filter_map(|(key, (low, high))| {
                let r = replicas.get(key).copied().unwrap_or(0);
                (r < *low || r > *high).then(|| (key.clone(), r))
            })
            .collect()
    }

    /// How many reserve lanes the operator has not yet decided right: the reserve in each
    /// pool's status, which the Deployments follow once the rollout allows (a reserve grows into
    /// room the shared workers leave when they have drained, within `totalWorkers`).
    fn undecided(&self, expected: &BTreeMap<String, (i32, i32)>) -> usize {
        let decided: BTreeMap<String, i32> = self
            .pools
            .state()
            .iter()
            .flat_map(|pool| {
                let prefix = key_of(pool.as_ref());
                let lanes = pool.status.iter().flat_map(|s| s.lanes.iter());
                lanes
                    .map(|lane| (format!("{prefix}-{}-reserved", lane.name), lane.reserve))
                    .collect::<Vec<_>>()
            })
            .collect();
        expected
            .iter()
            .filter(|(key, (low, high))| {
                decided
                    .get(*key)
                    .is_none_or(|reserve| reserve < low || reserve > high)
            })
            .count()
    }
}

/// A store kept by a watch of `api`, run for as long as the benchmark.
fn cache<K>(api: Api<K>, config: watcher::Config) -> reflector::Store<K>
where
    K: kube::Resource<DynamicType = ()> + Clone + std::fmt::Debug,
    K: k8s_openapi::serde::de::DeserializeOwned,
    K: Send + Sync + 'static,
{
    let (reader, writer) = reflector::store();
    let stream = reflector(writer, watcher(api, config).default_backoff());
    tokio::spawn(stream.for_each(|_| futures::future::ready(())));
    reader
}

/// How a change reached the pools (see [`until_all_right`]).
struct Followed {
    took: Duration,
    /// When every pool's status had decided right, if that came within the wait.
    decided: Option<Duration>,
    curve: Vec<usize>,
    last: Vec<String>,
}

/// How long until every reserve lane is right (at most 10 minutes); how many were wrong at each
/// 5 s mark; and what the last ones to get there showed when 20 or fewer were left: key,
/// replicas, the right range, and the pool's last decision (three of them).
async fn until_all_right(
    client: &Client,
    watched: &Watched,
    expected: &BTreeMap<String, (i32, i32)>,
) -> Followed {
    let started = Instant::now();
    let mut curve = Vec::new();
    let mut last = Vec::new();
    let mut decided = None;
    loop {
        let wrong = watched.wrong(expected);
        if decided.is_none() && watched.undecided(expected) == 0 {
            decided = Some(started.elapsed());
        }
        if started.elapsed() >= Duration::from_secs(5 * curve.len() as u64) {
            curve.push(wrong.len());
        }
        if wrong.is_empty() || started.elapsed() > Duration::from_secs(600) {
            return Followed {
                took: started.elapsed(),
                decided,
                curve,
                last,
            };
        }
        if wrong.len() <= 20 && last.is_empty() {
            for (key, replicas) in wrong.into_iter().take(3) {
                let (namespace, deployment) = key.split_once('/').unwrap_or_default();
                let pool = deployment.split('-').take(2).collect::<Vec<_>>().join("-");
                let status = Api::<LanePool>::namespaced(client.clone(), namespace)
                    .get(&pool)
                    .await
                    .ok()
                    .and_then(|p| p.status)
                    .unwrap_or_default();
                let decision = format!(
                    "{}; rollout: {}",
                    status.last_decision.unwrap_or_default(),
                    status.rollout.as_deref().unwrap_or("none")
                );
                let (low, high) = expected[&key];
                last.push(format!(
                    "{key} at {replicas} (right: {low}–{high}) after {:.1} s: {decision}",
                    started.elapsed().as_secs_f64()
                ));
            }
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

/// The operator's events published so far, by reason: each event counted once more for every
/// repeat its series has. kube-controller-manager's own (it is still publishing the Pods'
/// SuccessfulCreate long after it made them) are not counted.
async fn events_by_reason(client: &Client) -> BTreeMap<String, i64> {
    use k8s_openapi::api::events::v1::Event;
    let mut counts = BTreeMap::new();
    let Ok(list) = Api::<Event>::all(client.clone())
        .list(&ListParams::default())
        .await
    else {
        return counts;
    };
    for event in list.items {
        if event.reporting_controller.as_deref() != Some("lanepool") {
            continue;
        }
        let repeats = event.series.as_ref().map_or(1, |s| i64::from(s.count));
        *counts.entry(event.reason.unwrap_or_default()).or_default() += repeats;
    }
    counts
}

/// Every pool's status, by namespace/name, with its resourceVersion.
async fn statuses(client: &Client) -> BTreeMap<String, (String, serde_json::Value)> {
    let Ok(list) = Api::<LanePool>::all(client.clone())
        .list(&ListParams::default())
        .await
    else {
        return BTreeMap::new();
    };
    list.items
        .into_iter()
        .map(|pool| {
            let key = key_of(&pool);
            let version = pool.resource_version().unwrap_or_default();
            let status = serde_json::to_value(&pool.status).unwrap_or_default();
            (key, (version, status))
        })
        .collect()
}

/// What changed between two statuses of one pool: the paths of the differing leaves.
fn changed(
    before: &serde_json::Value,
    after: &serde_json::Value,
    path: &str,
    out: &mut Vec<String>,
) {
    use serde_json::Value;
    match (before, after) {
        (Value::Object(a), Value::Object(b)) => {
            for key in a.keys().chain(b.keys().filter(|k| !a.contains_key(*k))) {
                let null = Value::Null;
                let (x, y) = (a.get(key).unwrap_or(&null), b.get(key).unwrap_or(&null));
                changed(x, y, &format!("{path}.{key}"), out);
            }
        }
        (Value::Array(a), Value::Array(b)) if a.len() == b.len() => {
            for (i, (x, y)) in a.iter().zip(b).enumerate() {
                changed(x, y, &format!("{path}[{i}]"), out);
            }
        }
        (a, b) if a != b => out.push(format!("{path}: {a} → {b}")),
        _ => {}
    }
}

struct Stop(Child);

impl Drop for Stop {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

#[tokio::main]
async fn main() {
    let args = Args::parse();
    let interval_seconds = args.interval.as_deref().map_or(5.0, |i| {
        lanepool::duration::parse(i)
            .expect("--interval")
            .as_secs_f64()
    });
    let plane = ControlPlane::start_with(Controllers::Pods)
        .await
        .expect("the control plane starts");
    let client = plane.client().await.unwrap();
    let _kwok = Kwok::start(&client, plane.kubeconfig(), plane.dir(), NODE)
        .await
        .expect("kwok starts: build it with tests/tools/build.sh kwok");
    let pod_workers = Arc::new(PodWorkers::start(free_port().unwrap()).await.unwrap());
    tokio::spawn(follow_pods(client.clone(), pod_workers.clone()));
    let workers = SimulatedWorkers::start().unwrap();
    let prometheus = TestPrometheus::start(&[workers.addr()]).unwrap();
    let mut namespaces = Vec::new();
    for _ in 0..NAMESPACES {
        namespaces.push(plane.namespace(&client, "scale").await.unwrap());
    }
    let mut expected = BTreeMap::new();
    let set_rates = |high: bool, expected: &mut BTreeMap<String, (i32, i32)>| {
        for pool in 0..args.pools {
            let namespace = &namespaces[pool % NAMESPACES];
            let name = format!("pool-{pool}");
            for (l, lane) in LANES.iter().enumerate() {
                let rate = rate_of(pool, l, high);
                workers.set_lane(namespace, &name, lane, rate, JOB_SECONDS);
                pod_workers.set_lane(namespace, &name, lane, rate);
                expected.insert(
                    format!("{namespace}/{name}-{lane}-reserved"),
                    right_reserves(rate, interval_seconds),
                );
            }
        }
    };
    set_rates(false, &mut expected);
    for pool in 0..args.pools {
        let namespace = &namespaces[pool % NAMESPACES];
        let pool = manifest(
            &format!("pool-{pool}"),
            args.interval.as_deref(),
            pod_workers.port(),
        );
        Api::<LanePool>::namespaced(client.clone(), namespace)
            .create(&PostParams::default(), &pool)
            .await
            .unwrap();
    }
    // Let Prometheus hold 30 s of every series before the operator starts.
    tokio::time::sleep(Duration::from_secs(35)).await;

    let watched = Watched::start(&client).await;
    let metrics_port = free_port().unwrap();
    let operator = Stop(
        Command::new(&args.operator)
            .args(["run", "--leader-election=false", "--log-level=warn"])
            .args(["--prometheus-url", &prometheus.url()])
            .args(["--metrics-addr", &format!("127.0.0.1:{metrics_port}")])
            // The test Prometheus scrapes every second; the operator is told 15 s, a common
            // production scrape interval, which sets how long shared answers are reused.
            .args(["--scrape-interval", "15s"])
            .args(&args.operator_args)
            .env("KUBECONFIG", plane.kubeconfig())
            .stdout(Stdio::null())
            .spawn()
            .expect("starting the operator: build it with cargo build --release"),
    );
    let pid = operator.0.id();
    let started = Instant::now();
    let start = until_all_right(&client, &watched, &expected).await.took;
    let pods = args.pools * WORKERS;
    while pod_workers.requests().pods < pods && started.elapsed() < Duration::from_secs(900) {
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    let all_pods = started.elapsed();

    // Steady state: nothing polled by the benchmark while it is measured.
    tokio::time::sleep(Duration::from_secs(20)).await;
    let before_api = text(&client, "/metrics").await;
    let before_op = operator_metrics(metrics_port).await;
    let before_gets = pod_workers.gets_by_pod();
    let before_pods = pod_workers.requests();
    let events_before = events_by_reason(&client).await;
    let statuses_before = statuses(&client).await;
    let cpu_before = cpu_seconds(pid);
    tokio::time::sleep(Duration::from_secs(args.steady_seconds)).await;
    let after_api = text(&client, "/metrics").await;
    let after_op = operator_metrics(metrics_port).await;
    let after_gets = pod_workers.gets_by_pod();
    let after_pods = pod_workers.requests();
    let cpu_after = cpu_seconds(pid);
    let events_after = events_by_reason(&client).await;
    let statuses_after = statuses(&client).await;
    let intervals = args.steady_seconds as f64 / interval_seconds;
    let per_interval = |before: &str, after: &str, name: &str, filters: &[&str]| {
        grew(before, after, name, filters) / intervals
    };
    let queries = per_interval(
        &before_op,
        &after_op,
        "lanepool_operator_prometheus_query_duration_seconds_count",
        &[],
    );
    let lists = per_interval(
        &before_api,
        &after_api,
        "apiserver_request_total{",
        &["verb=\"LIST\""],
    );
    let pod_lists = per_interval(
        &before_api,
        &after_api,
        "apiserver_request_total{",
        &["verb=\"LIST\"", "resource=\"pods\""],
    );
    // Every request the API server served, by verb (the watches are long-running, counted once).
    let requests: Vec<(&str, f64)> = [
        "GET", "LIST", "WATCH", "APPLY", "PATCH", "POST", "PUT", "DELETE",
    ]
    .into_iter()
    .map(|verb| {
        let filter = format!("verb=\"{verb}\"");
        let count = per_interval(
            &before_api,
            &after_api,
            "apiserver_request_total{",
            &[&filter],
        );
        (verb, count)
    })
    .filter(|(_, count)| *count > 0.0)
    .collect();
    // What the writes were: the operator's own (events, statuses) and the Pods its scaling made.
    let writes: Vec<String> = [
        ("POST", "events"),
        ("POST", "pods"),
        ("APPLY", "deployments"),
        ("APPLY", "lanepools"),
    ]
    .into_iter()
    .map(|(verb, resource)| {
        let verb_is = format!("verb=\"{verb}\"");
        let resource_is = format!("resource=\"{resource}\"");
        let count = per_interval(
            &before_api,
            &after_api,
            "apiserver_request_total{",
            &[&verb_is, &resource_is],
        );
        format!("{verb} {resource} {count:.1}")
    })
    .collect();
    // GETs at the Pods that ran through the whole window.
    let gets: Vec<u64> = after_gets
        .iter()
        .filter_map(|(ip, after)| Some(after - before_gets.get(ip)?))
        .collect();
    let mean_gets = gets.iter().sum::<u64>() as f64 / gets.len().max(1) as f64 / intervals;
    let most_gets = gets.iter().max().copied().unwrap_or(0) as f64 / intervals;
    let reconciles = per_interval(
        &before_op,
        &after_op,
        "lanepool_operator_reconciles_total",
        &[],
    );
    let rss = proc_status(pid, "VmRSS:") / 1024.0;
    let peak = proc_status(pid, "VmHWM:") / 1024.0;
    let (anon, file) = (
        proc_status(pid, "RssAnon:") / 1024.0,
        proc_status(pid, "RssFile:") / 1024.0,
    );
    let histogram = "lanepool_operator_reconcile_duration_seconds";
    let steady_reconcile = quantiles(&before_op, &after_op, histogram, &[0.5, 0.99], 1e3);
    let lateness = "lanepool_operator_measurement_lateness_seconds";
    let late =
        |before: &str, after: &str| quantiles(before, after, lateness, &[0.5, 0.99, 1.0], 1.0);
    let steady_late = late(&before_op, &after_op);
    // Where a worker read's time goes: waiting for one of the operator's slots, then the request.
    let worker_ms =
        |histogram: &str| quantiles(&before_op, &after_op, histogram, &[0.5, 0.99], 1e3);
    let slot_wait = worker_ms("lanepool_operator_worker_request_wait_seconds");
    let request_time = worker_ms("lanepool_operator_worker_request_duration_seconds");

    // Every rate doubles: how long until every reserve follows.
    set_rates(true, &mut expected);
    let Followed {
        took: change,
        decided,
        curve,
        last: last_to_change,
    } = until_all_right(&client, &watched, &expected).await;
    let changed_op = operator_metrics(metrics_port).await;
    let change_late = late(&after_op, &changed_op);
    // What the reconciles did while the change went out: how many, how long, and their writes.
    let change_reconciles = grew(
        &after_op,
        &changed_op,
        "lanepool_operator_reconciles_total",
        &[],
    );
    let change_reconcile = quantiles(&after_op, &changed_op, histogram, &[0.5, 0.99], 1e3);
    let change_writes: Vec<String> = ["success", "failure", "timeout", "fenced"]
        .into_iter()
        .map(|result| {
            let filter = format!("result=\"{result}\"");
            let writes = "lanepool_operator_kube_writes_total";
            let count = grew(&after_op, &changed_op, writes, &[&filter]);
            format!("{result} {count:.0}")
        })
        .collect();
    if let Some(dir) = &args.metrics_out {
        std::fs::create_dir_all(dir).expect("--metrics-out");
        let changed_api = text(&client, "/metrics").await;
        for (name, text) in [
            ("steady-start", &before_op),
            ("steady-end", &after_op),
            ("changed", &changed_op),
            ("apiserver-steady-end", &after_api),
            ("apiserver-changed", &changed_api),
        ] {
            std::fs::write(dir.join(format!("{name}.txt")), text).expect("--metrics-out");
        }
    }

    println!("pools                                  {}", args.pools);
    println!("reserve lanes                          {}", expected.len());
    println!(
        "Pods                                   {pods} ({} running when measured)",
        before_pods.pods
    );
    println!(
        "every reserve right after start        {:.1} s (every Pod running: {:.1} s)",
        start.as_secs_f64(),
        all_pods.as_secs_f64()
    );
    println!(
        "a rate change reaches every pool       {:.1} s = {:.1} intervals of {interval_seconds} s",
        change.as_secs_f64(),
        change.as_secs_f64() / interval_seconds
    );
    println!(
        "  lanes still wrong every 5 s           {}",
        curve
            .iter()
            .map(|n| n.to_string())
            .collect::<Vec<_>>()
            .join(" ")
    );
    for lane in &last_to_change {
        println!("  among the last: {lane}");
    }
    if let Some(decided) = decided {
        println!(
            "  every pool decided right after {:.1} s (its status; the Deployments follow as the rollout allows)",
            decided.as_secs_f64()
        );
    }
    println!(
        "operator RSS                           {rss:.0} MiB, peak {peak:.0} MiB ({anon:.0} MiB heap and stacks, {file:.0} MiB the binary's pages)"
    );
    println!(
        "CPU seconds per interval               {:.2} ({:.2} of a core)",
        (cpu_after - cpu_before) / intervals,
        (cpu_after - cpu_before) / args.steady_seconds as f64
    );
    println!("reconciles per interval                {reconciles:.0}");
    println!(
        "while the change went out              {change_reconciles:.0} reconciles, p50 / p99 (≤ bucket) {change_reconcile} ms; writes {}",
        change_writes.join(", ")
    );
    println!("steady reconcile p50 / p99 (≤ bucket)  {steady_reconcile} ms");
    println!(
        "measured late p50 / p99 / most (≤ bucket) {steady_late} s steady, {change_late} s after the change"
    );
    println!(
        "worker request p50 / p99 (≤ bucket)    {slot_wait} ms waiting for a slot, {request_time} ms sent"
    );
    println!("Prometheus queries per interval        {queries:.1}");
    println!("API server Pod LISTs per interval      {pod_lists:.1}");
    println!("API server LISTs per interval          {lists:.1}");
    println!(
        "API server requests per interval       {}",
        requests
            .iter()
            .map(|(verb, count)| format!("{verb} {count:.1}"))
            .collect::<Vec<_>>()
            .join(", ")
    );
    println!(
        "  of which                              {}",
        writes.join(", ")
    );
    let events: Vec<String> = events_after
        .iter()
        .map(|(reason, after)| {
            let new = after - events_before.get(reason).copied().unwrap_or(0);
            (reason, new)
        })
        .filter(|(_, new)| *new > 0)
        .map(|(reason, new)| format!("{reason} {:.1}", new as f64 / intervals))
        .collect();
    println!(
        "events per interval, by reason         {}",
        if events.is_empty() {
            "none".to_string()
        } else {
            events.join(", ")
        }
    );
    // The statuses written in the window, and what changed in a few of them.
    let mut rewritten = 0;
    let mut fields: BTreeMap<String, usize> = BTreeMap::new();
    let mut samples = Vec::new();
    for (key, (version, after)) in &statuses_after {
        let Some((old_version, before)) = statuses_before.get(key) else {
            continue;
        };
        if old_version == version {
            continue;
        }
        rewritten += 1;
        let mut diff = Vec::new();
        changed(before, after, "status", &mut diff);
        for line in &diff {
            let field = line.split(':').next().unwrap_or_default();
            let field: String = field
                .split('.')
                .map(|part| part.split('[').next().unwrap_or(part))
                .collect::<Vec<_>>()
                .join(".");
            *fields.entry(field).or_default() += 1;
        }
        if samples.len() < 3 {
            samples.push(format!("{key}: {}", diff.join("; ")));
        }
    }
    println!(
        "statuses written in the window         {rewritten} of {} pools; fields changed: {}",
        statuses_after.len(),
        fields
            .iter()
            .map(|(field, n)| format!("{field} {n}"))
            .collect::<Vec<_>>()
            .join(", ")
    );
    for sample in samples {
        println!("  for example {sample}");
    }
    println!(
        "GETs at each Pod per interval          {mean_gets:.2} mean, {most_gets:.2} most ({} Pods through the window)",
        gets.len()
    );
    println!(
        "drain requests, requests to no Pod     {}, {}",
        after_pods.drains - before_pods.drains,
        after_pods.strays - before_pods.strays
    );
}
