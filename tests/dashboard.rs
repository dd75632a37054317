//! The Grafana dashboard: every query is valid PromQL to a real Prometheus, and every metric it
//! reads is one the operator exports or the worker convention (docs/worker-protocol.md) names.

use std::collections::BTreeSet;

use lanepool::metrics::Metrics;
use lanepool_testenv::{SimulatedWorkers, TestPrometheus};
use serde_json::Value;

const DASHBOARD: &str = include_str!("../charts/lanepool/dashboards/lanepool.json");
const WORKER_PROTOCOL: &str = include_str!("../docs/worker-protocol.md");

fn queries() -> Vec<String> {
    let dashboard: Value = serde_json::from_str(DASHBOARD).expect("the dashboard is JSON");
    let panels = dashboard["panels"].as_array().expect("panels");
    panels
        .iter()
        .flat_map(|panel| panel["targets"].as_array().cloned().unwrap_or_default())
        .map(|target| {
            target["expr"]
                .as_str()
                .expect("every target has an expr")
                .to_string()
        })
        .collect()
}

/// Grafana's variables, replaced the way Grafana would with "All" selected.
fn as_grafana_sends_it(query: &str) -> String {
    query
        .replace("$namespace", ".*")
        .replace("$pool", ".*")
        .replace("$__rate_interval", "1m")
}

fn metric_names(query: &str) -> BTreeSet<String> {
    let mut names = BTreeSet::new();
    let mut rest = query;
    while let Some(start) = rest.find("lanepool_") {
        let tail = &rest[start..];
        let end = tail
            .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
            .unwrap_or(tail.len());
        names.insert(tail[..end].to_string());
        rest = &tail[end..];
    }
    names
}

/// The operator's metrics with one sample each, so every family shows in the exposition.
fn exported() -> String {
    use lanepool::sizing::*;
    use std::collections::BTreeMap;
    use std::time::Duration;
    let metrics = Metrics::default();
    let lane = LaneSizing {
        name: "urgent".into(),
        min: 1,
        max: 4,
        rule: Rule::Formula,
    };
    let sizing = PoolSizing::new(vec![lane], 1.5, PoolSize::Shared { replicas: 8 });
    let loads = BTreeMap::from([(
        "urgent".to_string(),
        Ok(LaneLoad {
            arrival_rate: 30.0,
            recent_arrival_rate: None,
            job_seconds: Some(0.02),
        }),
    )]);
    let inputs = Inputs {
        loads: &loads,
        current: None,
        history: &History::new(),
        now: Duration::ZERO,
        outage: Outage::default(),
        shared_job_seconds: None,
    };
    metrics.decided("ns", "jobs", &decide(&sizing, inputs));
    metrics.reconciled("ns", "jobs", Duration::from_millis(5));
    metrics.reconcile_failed("kube");
    metrics.observe_query(Duration::from_millis(3), Some("failed"));
    metrics.wrote("success");
    metrics.drain_answered("ns", "jobs", "busy");
    metrics.stand_in_answered("ns", "jobs", "standing_in");
    metrics.stopped_busy("ns", "jobs", 1);
    metrics.render()
}

#[test]
fn every_metric_on_the_dashboard_exists() {
    let exported = exported();
    let mut unknown = Vec::new();
    for query in queries() {
        for name in metric_names(&query) {
            let base = ["_bucket", "_sum", "_count", "_total"]
                .iter()
                .find_map(|suffix| name.strip_suffix(suffix))
                .unwrap_or(&name);
            let known = if base.starts_with("lanepool_operator_") {
                exported.contains(&format!("# TYPE {base} "))
            } else {
                WORKER_PROTOCOL.contains(&format!("`{base}`"))
                    || WORKER_PROTOCOL.contains(&format!("`{name}`"))
            };
            if !known {
                unknown.push(name);
            }
        }
    }
    assert!(
        unknown.is_empty(),
        "metrics neither exported nor in the worker convention: {unknown:?}"
    );
    assert!(queries().len() >= 10);
}

#[tokio::test]
async fn every_dashboard_query_is_valid_promql() {
    let workers = SimulatedWorkers::start().unwrap();
    workers.set_lane("ns", "jobs", "urgent", 30.0, 0.02);
    let prometheus = TestPrometheus::start(&[workers.addr()]).unwrap();
    let client = prometheus_http_query::Client::try_from(prometheus.url().as_str()).unwrap();
    let mut refused = Vec::new();
    for query in queries() {
        let sent = as_grafana_sends_it(&query);
        if let Err(error) = client.query(sent.as_str()).get().await {
            refused.push(format!("{query}\n  → {error}"));
        }
    }
    assert!(
        refused.is_empty(),
        "Prometheus refused:\n{}",
        refused.join("\n")
    );
}
