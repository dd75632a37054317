//! `lanepool-scale`: the scale benchmark. Starts the local control plane and Prometheus, an
//! exporter giving every pool and lane its own rate, N LanePools over 10 namespaces (two reserve
//! lanes each, the default metric convention, interval 15 s), and the release `lanepool run`
//! binary; then prints how long until every reserve is right, how long a rate change takes to
//! reach every pool, the operator's RSS and CPU, its reconcile latency, and its Prometheus
//! queries and the API server's LISTs per interval in steady state. Run by tests/scale.sh.

use std::collections::BTreeMap;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use clap::Parser;
use k8s_openapi::api::apps::v1::Deployment;
use kube::api::{Api, ListParams, PostParams};
use kube::{Client, ResourceExt};
use lanepool::api::LanePool;
use lanepool_testenv::{ControlPlane, SimulatedWorkers, TestPrometheus, free_port};

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
}

const NAMESPACES: usize = 10;
const INTERVAL_SECONDS: f64 = 15.0;
const LANES: [&str; 2] = ["urgent", "high"];

/// Reserved workers for a rate: rate × 20 ms × headroom 1 (the spec below), within [1, 20].
fn reserve_for(rate: f64) -> i32 {
    ((rate * 0.020 - 1e-9).ceil() as i32).clamp(1, 20)
}

/// The reserves that are right for a rate: the formula's, or any the 10 % tolerance keeps.
fn right_reserves(rate: f64) -> (i32, i32) {
    (reserve_for(rate / 1.1), reserve_for(rate * 1.1))
}

fn rate_of(pool: usize, lane: usize, high: bool) -> f64 {
    let base = 20.0 + ((pool * 7 + lane * 13) % 9) as f64 * 25.0;
    if high { base * 2.0 } else { base }
}

fn manifest(name: &str) -> LanePool {
    serde_json::from_value(serde_json::json!({
        "apiVersion": "lanepool.dev/v1alpha1",
        "kind": "LanePool",
        "metadata": {"name": name},
        "spec": {
            "lanes": [
                {"name": "urgent", "reserve": {"min": 1, "max": 20, "jobTime": {"fallback": "20ms"}}},
                {"name": "high", "reserve": {"min": 1, "max": 20, "jobTime": {"fallback": "20ms"}}},
                {"name": "batch"}
            ],
            "headroom": 1,
            "shared": {"replicas": 2},
            "interval": "15s",
            "template": {"spec": {"containers": [{"name": "worker", "image": "worker:1"}]}}
        }
    }))
    .expect("the benchmark's LanePool")
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

/// How many reserve lanes are at a right count.
async fn right(client: &Client, expected: &BTreeMap<String, (i32, i32)>) -> usize {
    let all: Api<Deployment> = Api::all(client.clone());
    let Ok(list) = all
        .list(&ListParams::default().labels("lanepool.dev/role=reserved"))
        .await
    else {
        return 0;
    };
    list.items
        .iter()
        .filter(|d| {
            let key = format!("{}/{}", d.namespace().unwrap_or_default(), d.name_any());
            let replicas = d.spec.as_ref().and_then(|s| s.replicas);
            expected
                .get(&key)
                .zip(replicas)
                .is_some_and(|((low, high), r)| *low <= r && r <= *high)
        })
        .count()
}

async fn until_all_right(client: &Client, expected: &BTreeMap<String, (i32, i32)>) -> Duration {
    let started = Instant::now();
    while right(client, expected).await < expected.len() {
        if started.elapsed() > Duration::from_secs(600) {
            break;
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    started.elapsed()
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
    let plane = ControlPlane::start()
        .await
        .expect("the control plane starts");
    let client = plane.client().await.unwrap();
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
                workers.set_lane(namespace, &name, lane, rate, 0.020);
                expected.insert(
                    format!("{namespace}/{name}-{lane}-reserved"),
                    right_reserves(rate),
                );
            }
        }
    };
    set_rates(false, &mut expected);
    for pool in 0..args.pools {
        let namespace = &namespaces[pool % NAMESPACES];
        Api::<LanePool>::namespaced(client.clone(), namespace)
            .create(&PostParams::default(), &manifest(&format!("pool-{pool}")))
            .await
            .unwrap();
    }
    // Let Prometheus hold 30 s of every series before the operator starts.
    tokio::time::sleep(Duration::from_secs(35)).await;

    let metrics_port = free_port().unwrap();
    let operator = Stop(
        Command::new(&args.operator)
            .args(["run", "--leader-election=false", "--log-level=warn"])
            .args(["--prometheus-url", &prometheus.url()])
            .args(["--metrics-addr", &format!("127.0.0.1:{metrics_port}")])
            .args(["--rate-window", "30s", "--job-time-window", "30s"])
            // The test Prometheus scrapes every second; the operator is told 15 s, a common
            // production scrape interval, which sets how long shared answers are reused.
            .args(["--scrape-interval", "15s"])
            .env("KUBECONFIG", plane.kubeconfig())
            .stdout(Stdio::null())
            .spawn()
            .expect("starting the operator: build it with cargo build --release"),
    );
    let pid = operator.0.id();
    let start = until_all_right(&client, &expected).await;

    // Steady state: nothing polled by the benchmark while it is measured.
    tokio::time::sleep(Duration::from_secs(20)).await;
    let before_api = text(&client, "/metrics").await;
    let before_op = operator_metrics(metrics_port).await;
    let cpu_before = cpu_seconds(pid);
    tokio::time::sleep(Duration::from_secs(args.steady_seconds)).await;
    let after_api = text(&client, "/metrics").await;
    let after_op = operator_metrics(metrics_port).await;
    let cpu_after = cpu_seconds(pid);
    let intervals = args.steady_seconds as f64 / INTERVAL_SECONDS;
    let per_interval = |before: &str, after: &str, name: &str, filters: &[&str]| {
        (sum_metric(after, name, filters) - sum_metric(before, name, filters)) / intervals
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
    let reconciles = per_interval(
        &before_op,
        &after_op,
        "lanepool_operator_reconciles_total",
        &[],
    );
    let rss = proc_status(pid, "VmRSS:") / 1024.0;
    let (anon, file) = (
        proc_status(pid, "RssAnon:") / 1024.0,
        proc_status(pid, "RssFile:") / 1024.0,
    );
    let histogram = "lanepool_operator_reconcile_duration_seconds";
    let p50 = quantile(&before_op, &after_op, histogram, 0.5);
    let p99 = quantile(&before_op, &after_op, histogram, 0.99);

    // Every rate doubles: how long until every reserve follows.
    set_rates(true, &mut expected);
    let change = until_all_right(&client, &expected).await;

    println!("pools                                  {}", args.pools);
    println!("reserve lanes                          {}", expected.len());
    println!(
        "every reserve right after start        {:.1} s",
        start.as_secs_f64()
    );
    println!(
        "a rate change reaches every pool       {:.1} s (interval 15 s, rate window 30 s)",
        change.as_secs_f64()
    );
    println!(
        "operator RSS                           {rss:.0} MiB ({anon:.0} MiB heap and stacks, {file:.0} MiB the binary's pages)"
    );
    println!(
        "CPU seconds per interval               {:.2}",
        (cpu_after - cpu_before) / intervals
    );
    println!("reconciles per interval                {reconciles:.0}");
    println!(
        "steady reconcile p50 / p99 (≤ bucket)  {} / {} ms",
        p50.map_or("-".into(), |v| format!("{:.0}", v * 1e3)),
        p99.map_or("-".into(), |v| format!("{:.0}", v * 1e3))
    );
    println!("Prometheus queries per interval        {queries:.1}");
    println!("API server LISTs per interval          {lists:.1}");
    println!(
        "API server requests per interval       {}",
        requests
            .iter()
            .map(|(verb, count)| format!("{verb} {count:.1}"))
            .collect::<Vec<_>>()
            .join(", ")
    );
}
