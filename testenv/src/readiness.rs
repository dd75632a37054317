//! Stands in for the deployment controller and the kubelet, which the local control plane does
//! not run: a Deployment's `status.readyReplicas` follows its `spec.replicas`, rising `start`
//! after the count grew (a pod starting) and falling at once (pods stopping). Stopped on drop.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use k8s_openapi::api::apps::v1::Deployment;
use kube::api::{Api, ListParams, Patch, PatchParams};
use kube::{Client, ResourceExt};
use serde_json::json;
use tokio::task::JoinHandle;

/// Marks the Deployments of one namespace ready, as pods would become.
pub struct DeploymentReadiness {
    task: JoinHandle<()>,
}

impl DeploymentReadiness {
    /// Starts following the Deployments of `namespace`; new replicas are ready after `start`.
    pub fn start(client: Client, namespace: &str, start: Duration) -> Self {
        let api: Api<Deployment> = Api::namespaced(client, namespace);
        let task = tokio::spawn(async move {
            // When each Deployment's current count was first seen, by name.
            let mut seen: HashMap<String, (i32, Instant)> = HashMap::new();
            loop {
                if let Ok(list) = api.list(&ListParams::default()).await {
                    for deployment in list {
                        follow(&api, &mut seen, &deployment, start).await;
                    }
                }
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
        });
        Self { task }
    }
}

async fn follow(
    api: &Api<Deployment>,
    seen: &mut HashMap<String, (i32, Instant)>,
    deployment: &Deployment,
    start: Duration,
) {
    let name = deployment.name_any();
    let want = deployment
        .spec
        .as_ref()
        .and_then(|s| s.replicas)
        .unwrap_or(1);
    let ready = deployment
        .status
        .as_ref()
        .and_then(|s| s.ready_replicas)
        .unwrap_or(0);
    let since = match seen.get(&name) {
        Some((count, since)) if *count == want => *since,
        _ => {
            seen.insert(name.clone(), (want, Instant::now()));
            Instant::now()
        }
    };
    let now_ready = if want < ready || since.elapsed() >= start {
        want
    } else {
        ready
    };
    if now_ready != ready {
        let status = json!({"status": {
            "replicas": want,
            "readyReplicas": now_ready,
            "availableReplicas": now_ready,
            "updatedReplicas": want,
        }});
        let _ = api
            .patch_status(&name, &PatchParams::default(), &Patch::Merge(&status))
            .await;
    }
}

impl Drop for DeploymentReadiness {
    fn drop(&mut self) {
        self.task.abort();
    }
}
