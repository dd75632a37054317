//! What the Pod watch cache keeps of one Pod labelled with a pool ([`CachedPod`]): its name, the
//! ReplicaSet that controls it, whether it is going, whether the ReplicaSet controller counts it as
//! ready, where it serves its metrics, when its newest container started and its deletion cost.
//! The Pod object itself is not kept. Pure: read from a Pod, tested with plain objects.

use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use k8s_openapi::jiff::Timestamp;

use kube::runtime::reflector::ObjectRef;

use crate::api::{LanePool, POOL_LABEL};
use crate::controller::cut::truncate_bytes;
use crate::controller::protocol::{DELETION_COST, METRICS_PORT, TAKEOVER_CONDITION};

/// What the Pod watch cache keeps of a Pod labelled with a pool: what [`Worker`] and the
/// ownership check read, and nothing else (no labels, managed fields, environment, volumes or
/// images), so 10,000 cached Pods take a few MB.
#[derive(Clone, Debug, Default, PartialEq)]
pub(crate) struct CachedPod {
    pub(crate) name: String,
    /// The uid of its controller, when that is a ReplicaSet.
    pub(crate) replicaset: Option<String>,
    /// Its deletion has begun.
    pub(crate) terminating: bool,
    /// It has Failed or Succeeded (evicted, its node shut down): the ReplicaSet controller no
    /// longer counts it, and the address it keeps until garbage collection may be another Pod's.
    pub(crate) finished: bool,
    /// Bound, Running and Ready.
    pub(crate) ready: bool,
    /// `ip:port` of its container port named [`METRICS_PORT`].
    pub(crate) address: Option<String>,
    /// When its newest container started: its counters count from then.
    pub(crate) started: Option<Timestamp>,
    /// Its deletion-cost annotation as it is.
    pub(crate) deletion_cost: Option<String>,
    /// It waits for the operator to set its readiness gate [`TAKEOVER_CONDITION`]: its spec has
    /// the gate, and the condition is not True yet.
    pub(crate) awaiting_takeover: bool,
    /// Its containers are ready (`ContainersReady`): all a gated Pod lacks is its gate.
    pub(crate) containers_ready: bool,
    /// Why it cannot start, when a container waits for a reason of [`CANNOT_START`] (an image
    /// that cannot be pulled, a missing Secret, a crash loop): the reason, and the kubelet's
    /// message cut to [`WAITING_MESSAGE_BYTES`].
    pub(crate) cannot_start: Option<(&'static str, String)>,
}

/// The reasons a container waits for that it will not get past by itself: the pool says so
/// in its status. (`ContainerCreating` and `PodInitializing` pass.)
pub(in crate::controller) const CANNOT_START: [&str; 8] = [
    "ErrImagePull",
    "ImagePullBackOff",
    "InvalidImageName",
    "ErrImageNeverPull",
    "CreateContainerConfigError",
    "CreateContainerError",
    "RunContainerError",
    "CrashLoopBackOff",
];

/// The most of a waiting container's message kept: whoever can write the Pod's status writes
/// it, and it goes into the pool's status.
pub(in crate::controller) const WAITING_MESSAGE_BYTES: usize = 300;

impl CachedPod {
    pub(in crate::controller) fn of(mut pod: Pod) -> Self {
        Self {
            replicaset: controller_uid(&pod.metadata, "ReplicaSet").map(str::to_owned),
            terminating: pod.metadata.deletion_timestamp.is_some(),
            finished: matches!(phase(&pod), Some("Failed" | "Succeeded")),
            ready: ready(&pod),
            address: metrics_address(&pod),
            started: started(&pod),
            awaiting_takeover: awaiting_takeover(&pod),
            containers_ready: condition(&pod, "ContainersReady"),
            cannot_start: cannot_start(&pod),
            deletion_cost: pod
                .metadata
                .annotations
                .as_mut()
                .and_then(|a| a.remove(DELETION_COST)),
            name: pod.metadata.name.unwrap_or_default(),
        }
    }
}

/// The uid of the object's controller, when it is of `kind` in `apps/v1`.
pub(super) fn controller_uid<'a>(meta: &'a ObjectMeta, kind: &str) -> Option<&'a str> {
    meta.owner_references
        .iter()
        .flatten()
        .find(|o| o.controller == Some(true))
        .filter(|o| o.kind == kind && o.api_version == "apps/v1")
        .map(|o| o.uid.as_str())
}

fn phase(pod: &Pod) -> Option<&str> {
    pod.status.as_ref()?.phase.as_deref()
}

/// Whether the Pod's condition `type_` is True.
fn condition(pod: &Pod, type_: &str) -> bool {
    pod.status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .into_iter()
        .flatten()
        .any(|c| c.type_ == type_ && c.status == "True")
}

/// The first of the Pod's containers (init containers first) that waits for a reason of
/// [`CANNOT_START`]: that reason (the constant, not the Pod's text) and its message, cut.
fn cannot_start(pod: &Pod) -> Option<(&'static str, String)> {
    let status = pod.status.as_ref()?;
    let containers = status.init_container_statuses.iter().flatten();
    containers
        .chain(status.container_statuses.iter().flatten())
        .find_map(|c| {
            let waiting = c.state.as_ref()?.waiting.as_ref()?;
            let reason = waiting.reason.as_deref()?;
            let reason = CANNOT_START.into_iter().find(|r| *r == reason)?;
            let message = waiting.message.as_deref().unwrap_or_default();
            let message = truncate_bytes(message, WAITING_MESSAGE_BYTES);
            Some((reason, message.to_owned()))
        })
}

/// Whether the ReplicaSet controller counts the Pod as ready: bound, Running and Ready.
fn ready(pod: &Pod) -> bool {
    let bound = pod.spec.as_ref().is_some_and(|s| s.node_name.is_some());
    let running = phase(pod) == Some("Running");
    bound && running && condition(pod, "Ready")
}

/// The pool whose Pod `pod` is, when all the Pod waits for is its readiness gate
/// [`TAKEOVER_CONDITION`] (its containers are ready): that pool's reconcile opens it.
pub(in crate::controller) fn waits_for_its_gate(pod: &Pod) -> Option<ObjectRef<LanePool>> {
    if !awaiting_takeover(pod) || !condition(pod, "ContainersReady") {
        return None;
    }
    let pool = pod.metadata.labels.as_ref()?.get(POOL_LABEL)?;
    Some(ObjectRef::new(pool).within(pod.metadata.namespace.as_deref()?))
}

/// Whether the Pod has the readiness gate [`TAKEOVER_CONDITION`] and it is not True yet.
fn awaiting_takeover(pod: &Pod) -> bool {
    let gated = pod
        .spec
        .as_ref()
        .and_then(|s| s.readiness_gates.as_ref())
        .into_iter()
        .flatten()
        .any(|g| g.condition_type == TAKEOVER_CONDITION);
    gated && !condition(pod, TAKEOVER_CONDITION)
}

/// Where a Pod serves its gauges: `ip:port` of its container port named [`METRICS_PORT`], only
/// while it is Running. A Pod that Failed or Succeeded keeps its `podIP` until it is collected,
/// and the address may by then be another Pod's, another tenant's: EndpointSlices leave such
/// Pods out, and so does this.
fn metrics_address(pod: &Pod) -> Option<String> {
    if phase(pod) != Some("Running") {
        return None;
    }
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
    fn a_container_that_cannot_start_is_named_with_a_known_reason_and_a_bounded_message() {
        let waiting = |init: bool, reason: &str, message: &str| -> Pod {
            let statuses = serde_json::json!([
                {"name": "worker", "image": "w", "imageID": "", "ready": false,
                 "restartCount": 0, "state": {"waiting": {"reason": reason, "message": message}}}
            ]);
            let field = if init {
                "initContainerStatuses"
            } else {
                "containerStatuses"
            };
            serde_json::from_value(serde_json::json!({
                "metadata": {"name": "p"},
                "status": {"phase": "Pending", field: statuses},
            }))
            .unwrap()
        };
        let pulled = cannot_start(&waiting(
            false,
            "ImagePullBackOff",
            "Back-off pulling image",
        ));
        assert_eq!(
            pulled,
            Some(("ImagePullBackOff", "Back-off pulling image".into()))
        );
        let init = cannot_start(&waiting(true, "CrashLoopBackOff", "back-off 10s"));
        assert_eq!(init, Some(("CrashLoopBackOff", "back-off 10s".into())));
        // On the way up, not stuck.
        for passing in ["ContainerCreating", "PodInitializing"] {
            assert_eq!(cannot_start(&waiting(false, passing, "")), None);
        }
        // A reason the operator does not know is not copied, whoever wrote the Pod's status.
        assert_eq!(cannot_start(&waiting(false, "Hostile\nReason", "x")), None);
        // A message of any length is cut by bytes at a character boundary.
        let long = "é".repeat(1_000);
        let (_, message) = cannot_start(&waiting(false, "ErrImagePull", &long)).unwrap();
        assert!(
            message.len() <= WAITING_MESSAGE_BYTES && message.len() >= WAITING_MESSAGE_BYTES - 1
        );
        assert!(long.starts_with(&message));
    }

    #[test]
    fn a_pod_is_asked_at_its_metrics_port() {
        let in_phase = |ip: &str, port_name: &str, phase: &str| -> Pod {
            serde_json::from_value(serde_json::json!({
                "metadata": {"name": "p"},
                "spec": {"containers": [
                    {"name": "side", "ports": [{"name": "http", "containerPort": 8080}]},
                    {"name": "worker", "ports": [{"name": port_name, "containerPort": 9100}]},
                ]},
                "status": {"podIP": ip, "phase": phase},
            }))
            .unwrap()
        };
        let pod = |ip: &str, port_name: &str| in_phase(ip, port_name, "Running");
        // An evicted Pod's address may already be someone else's; a Pending one has no worker yet.
        for phase in ["Failed", "Succeeded", "Pending", "Unknown"] {
            assert_eq!(
                metrics_address(&in_phase("10.1.2.3", "metrics", phase)),
                None
            );
        }
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
    fn the_cache_keeps_what_a_worker_is_read_by_and_whose_it_is() {
        let pod = |deleting: bool| -> Pod {
            serde_json::from_value(serde_json::json!({
                "metadata": {
                    "name": "jobs-shared-abc", "namespace": "team",
                    "labels": {"lanepool.dev/pool": "jobs", "app": "x"},
                    "annotations": {DELETION_COST: "1000", "big": "x".repeat(10_000)},
                    "ownerReferences": [{"apiVersion": "apps/v1", "kind": "ReplicaSet", "name": "rs",
                        "uid": "rs-uid", "controller": true}],
                    "deletionTimestamp": deleting.then_some("2026-12-02T03:05:00Z"),
                },
                "spec": {
                    "nodeName": "node-1",
                    "containers": [{"name": "worker", "image": "worker:1",
                        "ports": [{"name": "metrics", "containerPort": 9100}]}],
                },
                "status": {
                    "phase": "Running", "podIP": "10.0.0.7",
                    "conditions": [{"type": "Ready", "status": "True"}],
                    "containerStatuses": [{"name": "worker", "image": "worker:1", "imageID": "sha",
                        "ready": true, "restartCount": 0,
                        "state": {"running": {"startedAt": "2026-12-02T03:00:00Z"}}}],
                },
            }))
            .unwrap()
        };
        let cached = CachedPod::of(pod(false));
        assert_eq!(
            cached,
            CachedPod {
                name: "jobs-shared-abc".into(),
                replicaset: Some("rs-uid".into()),
                terminating: false,
                finished: false,
                ready: true,
                address: Some("10.0.0.7:9100".into()),
                started: Some("2026-12-02T03:00:00Z".parse().unwrap()),
                deletion_cost: Some("1000".into()),
                awaiting_takeover: false,
                containers_ready: false,
                cannot_start: None,
            }
        );
        assert!(CachedPod::of(pod(true)).terminating);
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
