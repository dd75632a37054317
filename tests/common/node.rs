//! What the tests on the real node share: kubectl against its API server, and a Prometheus
//! configuration that finds a pool's workers with the job of examples/prometheus/scrape-config.yaml
//! (the file users are given, not a copy) and scrapes the producer beside them.

use std::path::Path;

use lanepool_testenv::TestNode;
use serde_json::{Value, json};

/// kubectl against the node's API server, as the admin.
pub struct Kubectl(pub &'static TestNode);

impl Kubectl {
    pub fn run(&self, args: &[&str]) -> (bool, String) {
        self.0.plane().kubectl(args).expect("kubectl runs")
    }

    pub fn ok(&self, args: &[&str]) -> String {
        let (ok, out) = self.run(args);
        assert!(ok, "kubectl {}: {out}", args.join(" "));
        out
    }

    /// A field of one object by JSONPath; empty when the object or the field is missing.
    pub fn get(&self, object: &str, namespace: &str, path: &str) -> String {
        let jsonpath = format!("jsonpath={path}");
        let (ok, out) = self.run(&["get", object, "-n", namespace, "-o", &jsonpath]);
        if ok {
            out.trim().to_owned()
        } else {
            String::new()
        }
    }

    pub fn json(&self, args: &[&str]) -> Value {
        let args = [args, &["-o", "json"]].concat();
        serde_json::from_str(&self.ok(&args)).expect("kubectl's JSON")
    }
}

/// The workers' job of examples/prometheus/scrape-config.yaml, as shipped: what a user adds to
/// their prometheus.yml.
pub fn example_workers_job() -> Value {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("examples/prometheus/scrape-config.yaml");
    let text = std::fs::read_to_string(&path).expect("examples/prometheus/scrape-config.yaml");
    let config: Value = serde_yaml::from_str(&text).expect("the example scrape config's YAML");
    let jobs = config["scrape_configs"]
        .as_array()
        .expect("the example's scrape_configs");
    assert_eq!(jobs.len(), 1, "one job in the example: {jobs:?}");
    let job = jobs[0].clone();
    assert_eq!(
        job["kubernetes_sd_configs"],
        json!([{"role": "pod"}]),
        "the example finds Pods in every namespace"
    );
    assert!(
        job["relabel_configs"]
            .as_array()
            .is_some_and(|r| !r.is_empty()),
        "the example's relabel_configs: {job}"
    );
    job
}

/// Scrape jobs for `TestPrometheus::start_scraping`, each every `scrape_interval`: the workers'
/// job of examples/prometheus/scrape-config.yaml, its relabelling untouched, finding Pods through
/// the node's API server (Prometheus runs outside the cluster), and the producer's metrics at
/// `producer_port` (its own `namespace` and `pool` kept).
pub fn pool_scrape_configs(node: &TestNode, producer_port: u16, scrape_interval: &str) -> String {
    let mut workers = example_workers_job();
    workers["scrape_interval"] = json!(scrape_interval);
    workers["kubernetes_sd_configs"][0]["kubeconfig_file"] =
        json!(node.plane().kubeconfig().display().to_string());
    let producer = json!({
        "job_name": "producer",
        "scrape_interval": scrape_interval,
        "honor_labels": true,
        "static_configs": [{"targets": [format!("127.0.0.1:{producer_port}")]}],
    });
    serde_yaml::to_string(&[workers, producer]).expect("the scrape jobs as YAML")
}
