//! What a reconcile keeps of one worker Pod: its name, the Deployment it is a worker of, whether
//! the ReplicaSet controller counts it as ready, where it serves its metrics, when its newest
//! container started and its deletion cost. Read from the reconcile's one Pod LIST; the Pod
//! object itself is not kept.

use k8s_openapi::api::core::v1::{
    Container, ContainerState, ContainerStateRunning, ContainerStatus, Pod, PodCondition, PodSpec,
    PodStatus,
};
use k8s_openapi::jiff::Timestamp;
use kube::ResourceExt;

use crate::api::POOL_LABEL;
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

/// What the Pod watch cache keeps of a Pod: what [`Worker::new`] and the ownership check read
/// (name, namespace, the pool label, the deletion cost, owners, deletion time; the node, the
/// metrics port; phase, Ready, IP, running containers' start times), and nothing else: no
/// managed fields, environment, volumes or images, so a cache of many Pods stays small.
pub(in crate::controller) fn keep_what_is_read(pod: &mut Pod) {
    let meta = &mut pod.metadata;
    meta.managed_fields = None;
    meta.generate_name = None;
    if let Some(labels) = &mut meta.labels {
        labels.retain(|key, _| key == POOL_LABEL);
    }
    if let Some(annotations) = &mut meta.annotations {
        annotations.retain(|key, _| key == DELETION_COST);
    }
    if let Some(spec) = pod.spec.take() {
        let containers = spec
            .containers
            .into_iter()
            .map(|c| Container {
                name: c.name,
                ports: c.ports.map(|ports| {
                    ports
                        .into_iter()
                        .filter(|p| p.name.as_deref() == Some(METRICS_PORT))
                        .collect()
                }),
                ..Default::default()
            })
            .collect();
        pod.spec = Some(PodSpec {
            node_name: spec.node_name,
            containers,
            ..Default::default()
        });
    }
    if let Some(status) = pod.status.take() {
        let conditions = status.conditions.map(|conditions| {
            conditions
                .into_iter()
                .filter(|c| c.type_ == "Ready")
                .map(|c| PodCondition {
                    type_: c.type_,
                    status: c.status,
                    ..Default::default()
                })
                .collect()
        });
        let container_statuses = status.container_statuses.map(|statuses| {
            statuses
                .into_iter()
                .map(|c| ContainerStatus {
                    name: c.name,
                    state: c
                        .state
                        .and_then(|s| s.running)
                        .map(|running| ContainerState {
                            running: Some(ContainerStateRunning {
                                started_at: running.started_at,
                            }),
                            ..Default::default()
                        }),
                    ..Default::default()
                })
                .collect()
        });
        pod.status = Some(PodStatus {
            phase: status.phase,
            pod_ip: status.pod_ip,
            conditions,
            container_statuses,
            ..Default::default()
        });
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
    fn the_cache_keeps_what_a_worker_is_read_by_and_nothing_else() {
        let mut pod: Pod = serde_json::from_value(serde_json::json!({
            "metadata": {
                "name": "jobs-shared-abc", "namespace": "team",
                "labels": {"lanepool.dev/pool": "jobs", "lanepool.dev/role": "shared", "app": "x"},
                "annotations": {DELETION_COST: "1000", "big": "x".repeat(10_000)},
                "ownerReferences": [{"apiVersion": "apps/v1", "kind": "ReplicaSet", "name": "rs",
                    "uid": "rs-uid", "controller": true}],
                "managedFields": [{"manager": "kubelet", "operation": "Update"}],
            },
            "spec": {
                "nodeName": "node-1",
                "containers": [
                    {"name": "worker", "image": "worker:1",
                     "env": [{"name": "SECRET_LOOKING", "value": "y".repeat(10_000)}],
                     "ports": [{"name": "metrics", "containerPort": 9100},
                               {"name": "http", "containerPort": 8080}]},
                ],
                "volumes": [{"name": "v", "emptyDir": {}}],
            },
            "status": {
                "phase": "Running", "podIP": "10.0.0.7",
                "conditions": [{"type": "Ready", "status": "True", "message": "z".repeat(1000)},
                               {"type": "PodScheduled", "status": "True"}],
                "containerStatuses": [{"name": "worker", "image": "worker:1", "imageID": "sha",
                    "ready": true, "restartCount": 0,
                    "state": {"running": {"startedAt": "2026-12-02T03:00:00Z"}}}],
            },
        }))
        .unwrap();
        let before = Worker::new(&pod, "jobs-shared".into());
        keep_what_is_read(&mut pod);
        assert_eq!(Worker::new(&pod, "jobs-shared".into()), before);
        assert_eq!(before.address.as_deref(), Some("10.0.0.7:9100"));
        assert!(before.ready && before.started.is_some());
        assert_eq!(before.deletion_cost.as_deref(), Some("1000"));
        let kept = serde_json::to_string(&pod).unwrap();
        assert!(kept.len() < 1000, "{} bytes kept: {kept}", kept.len());
        assert_eq!(
            pod.owner_references().len(),
            1,
            "ownership is still checked"
        );
        assert_eq!(
            pod.labels().get(POOL_LABEL).map(String::as_str),
            Some("jobs")
        );
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
