//! What a reconcile keeps of one worker Pod: its name, the Deployment it is a worker of, whether
//! the ReplicaSet controller counts it as ready, where it serves its metrics, when its newest
//! container started and its deletion cost. Read from the reconcile's one Pod LIST; the Pod
//! object itself is not kept.

use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::jiff::Timestamp;
use kube::ResourceExt;

use crate::controller::protocol::{DELETION_COST, METRICS_PORT};

/// One of the pool's workers.
#[derive(Clone, Debug, PartialEq)]
pub(in crate::controller) struct Worker {
    pub(in crate::controller) name: String,
    /// The pool's Deployment whose ReplicaSet controls it.
    pub(in crate::controller) deployment: String,
    /// Bound, Running and Ready.
    pub(in crate::controller) ready: bool,
    /// `ip:port` of its container port named [`METRICS_PORT`].
    pub(in crate::controller) address: Option<String>,
    /// When its newest container started: its counters count from then.
    pub(in crate::controller) started: Option<Timestamp>,
    /// Its deletion-cost annotation as it is.
    pub(in crate::controller) deletion_cost: Option<String>,
}

impl Worker {
    pub(in crate::controller) fn new(pod: &Pod, deployment: String) -> Self {
        Self {
            name: pod.name_any(),
            deployment,
            ready: ready(pod),
            address: metrics_address(pod),
            started: started(pod),
            deletion_cost: pod.annotations().get(DELETION_COST).cloned(),
        }
    }
}

/// Whether the ReplicaSet controller counts the Pod as ready: bound, Running and Ready.
fn ready(pod: &Pod) -> bool {
    let bound = pod.spec.as_ref().is_some_and(|s| s.node_name.is_some());
    let status = pod.status.as_ref();
    let running = status.and_then(|s| s.phase.as_deref()) == Some("Running");
    let ready = status
        .and_then(|s| s.conditions.as_ref())
        .into_iter()
        .flatten()
        .any(|c| c.type_ == "Ready" && c.status == "True");
    bound && running && ready
}

/// Where a Pod serves its gauges: `ip:port` of its container port named [`METRICS_PORT`].
fn metrics_address(pod: &Pod) -> Option<String> {
    let ip = pod
        .status
        .as_ref()?
        .pod_ip
        .as_deref()
        .filter(|ip| !ip.is_empty())?;
    let port = pod
        .spec
        .as_ref()?
        .containers
        .iter()
        .flat_map(|c| c.ports.iter().flatten())
        .find(|p| p.name.as_deref() == Some(METRICS_PORT))?
        .container_port;
    Some(if ip.contains(':') {
        format!("[{ip}]:{port}")
    } else {
        format!("{ip}:{port}")
    })
}

/// When the Pod's newest container started.
fn started(pod: &Pod) -> Option<Timestamp> {
    pod.status
        .as_ref()?
        .container_statuses
        .iter()
        .flatten()
        .filter_map(|c| c.state.as_ref()?.running.as_ref()?.started_at.as_ref())
        .map(|t| t.0)
        .max()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_pod_is_asked_at_its_metrics_port() {
        let pod = |ip: &str, port_name: &str| -> Pod {
            serde_json::from_value(serde_json::json!({
                "metadata": {"name": "p"},
                "spec": {"containers": [
                    {"name": "side", "ports": [{"name": "http", "containerPort": 8080}]},
                    {"name": "worker", "ports": [{"name": port_name, "containerPort": 9100}]},
                ]},
                "status": {"podIP": ip},
            }))
            .unwrap()
        };
        assert_eq!(
            metrics_address(&pod("10.1.2.3", "metrics")).as_deref(),
            Some("10.1.2.3:9100")
        );
        assert_eq!(
            metrics_address(&pod("fd00::5", "metrics")).as_deref(),
            Some("[fd00::5]:9100")
        );
        assert_eq!(metrics_address(&pod("10.1.2.3", "prom")), None);
        assert_eq!(metrics_address(&pod("", "metrics")), None);
    }

    #[test]
    fn a_worker_is_ready_only_bound_running_and_ready() {
        let pod = |node: Option<&str>, phase: &str, ready: &str| -> Pod {
            serde_json::from_value(serde_json::json!({
                "metadata": {"name": "p"},
                "spec": {"containers": [], "nodeName": node},
                "status": {"phase": phase, "conditions": [{"type": "Ready", "status": ready}]},
            }))
            .unwrap()
        };
        assert!(ready(&pod(Some("n"), "Running", "True")));
        assert!(!ready(&pod(None, "Running", "True")));
        assert!(!ready(&pod(Some("n"), "Pending", "True")));
        assert!(!ready(&pod(Some("n"), "Running", "False")));
    }
}
