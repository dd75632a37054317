//! kwok (sigs.k8s.io/kwok) as the kubelet of one fake Node, for the scale benchmark: it marks the
//! Pods bound to that Node Running and Ready and gives each an address of its own from the Node's
//! Pod CIDR, and runs nothing. The Pods' workers are answered by [`super::PodWorkers`].

use std::path::Path;

use k8s_openapi::api::core::v1::Node;
use kube::Client;
use kube::api::{Api, PostParams};

use super::process::{Lifetime, Process};
use crate::error::Result;
use crate::tools::tool;

/// The loopback block the Pods' addresses come from: a million addresses, none of them 127.0.0.1.
pub const POD_CIDR: &str = "127.16.0.0/12";

/// A running kwok and the Node it plays.
pub struct Kwok {
    pub node: String,
    _process: Process,
}

impl Kwok {
    /// Registers the Node `node` (room for a million Pods) and starts kwok for it.
    pub async fn start(client: &Client, kubeconfig: &Path, dir: &Path, node: &str) -> Result<Self> {
        let manifest: Node = serde_json::from_value(serde_json::json!({
            "apiVersion": "v1",
            "kind": "Node",
            "metadata": {"name": node, "annotations": {"kwok.x-k8s.io/node": "fake"}},
            "spec": {"podCIDR": POD_CIDR, "podCIDRs": [POD_CIDR]},
            "status": {
                "capacity": {"cpu": "100k", "memory": "1000Ti", "pods": "1M"},
                "allocatable": {"cpu": "100k", "memory": "1000Ti", "pods": "1M"}
            }
        }))
        .expect("the fake Node's manifest");
        Api::<Node>::all(client.clone())
            .create(&PostParams::default(), &manifest)
            .await?;
        let args = vec![
            format!("--kubeconfig={}", kubeconfig.display()),
            format!("--manage-single-node={node}"),
            format!("--cidr={POD_CIDR}"),
            format!("--config={}", tool("kwok-stages.yaml")?.display()),
            "--v=WARN".into(),
        ];
        let process = Process::start(
            "kwok",
            &tool("kwok")?,
            &args,
            dir.join("kwok.log"),
            Lifetime::Process,
        )?;
        Ok(Self {
            node: node.into(),
            _process: process,
        })
    }
}
