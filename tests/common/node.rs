//! What the tests on the real node share: kubectl against its API server, and a Prometheus
//! configuration that finds a pool's workers through the relabelling docs/worker-protocol.md
//! documents and scrapes the producer beside them.

use std::path::Path;

use lanepool_testenv::TestNode;
use serde_json::Value;

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

/// The relabelling of docs/worker-protocol.md, as written there (indented for a job).
pub fn documented_relabelling() -> String {
    let doc = std::fs::read_to_string(
        Path::new(env!("CARGO_MANIFEST_DIR")).join("docs/worker-protocol.md"),
    )
    .unwrap();
    let start = doc
        .find("relabel_configs:\n")
        .expect("the documented relabelling");
    let block: Vec<&str> = doc[start..]
        .lines()
        .skip(1)
        .take_while(|line| !line.starts_with("```"))
        .collect();
    assert!(block.len() >= 4, "the relabelling block: {block:?}");
    block
        .iter()
        .map(|line| format!("  {line}"))
        .collect::<Vec<_>>()
        .join("\n")
}

/// Scrape jobs for `TestPrometheus::start_scraping`: the node's Pods through the documented
/// relabelling, and the producer's metrics at `producer_port` (its own labels kept), each every
/// `scrape_interval` when given (Prometheus's global 1 s otherwise).
pub fn pool_scrape_configs(
    node: &TestNode,
    producer_port: u16,
    scrape_interval: Option<&str>,
) -> String {
    let every = scrape_interval.map_or(String::new(), |i| format!("\n  scrape_interval: {i}"));
    format!(
        "- job_name: lanepool-workers{every}
  kubernetes_sd_configs:
  - role: pod
    kubeconfig_file: {kubeconfig}
  relabel_configs:
{relabelling}
- job_name: producer{every}
  honor_labels: true
  static_configs:
  - targets: ['127.0.0.1:{producer_port}']
",
        kubeconfig = node.plane().kubeconfig().display(),
        relabelling = documented_relabelling(),
    )
}
