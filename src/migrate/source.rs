//! The Deployment to migrate and what sizes it: from a manifest (several documents, or a `List`
//! as `kubectl get -o yaml` writes one) or from the cluster, with the HorizontalPodAutoscalers
//! and KEDA ScaledObjects that target it. It only reads; nothing is written anywhere.

use std::path::{Path, PathBuf};

use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::autoscaling::v2::HorizontalPodAutoscaler;
use kube::api::{Api, ListParams};
use serde::Deserialize;
use serde_yaml::Value;

use super::error::MigrateError;

/// The Deployment and what else its source says about it.
#[derive(Clone, Debug)]
pub struct Source {
    pub deployment: Deployment,
    /// The manifest it came from; `None`: the cluster.
    pub file: Option<PathBuf>,
    /// The autoscalers that size it, or why they could not be looked for.
    pub autoscalers: Result<Vec<Autoscaler>, String>,
    /// The manifest's other Deployments, which may take from the same queues.
    pub others: Vec<Deployment>,
}

/// An HPA or a KEDA ScaledObject whose target is the Deployment.
#[derive(Clone, Debug, PartialEq)]
pub struct Autoscaler {
    /// `HorizontalPodAutoscaler` or `ScaledObject`.
    pub kind: &'static str,
    pub name: String,
    pub min: Option<i64>,
    pub max: Option<i64>,
}

/// KEDA's label on the HPA it makes for a ScaledObject.
const SCALED_OBJECT_LABEL: &str = "scaledobject.keda.sh/name";

/// A Deployment's `namespace/name`, or its name alone when the manifest names no namespace.
pub fn shown(deployment: &Deployment) -> String {
    let name = deployment.metadata.name.as_deref().unwrap_or("(no name)");
    match &deployment.metadata.namespace {
        Some(namespace) => format!("{namespace}/{name}"),
        None => name.to_string(),
    }
}

/// `NAMESPACE/NAME` or `NAME`.
fn split_name(chosen: &str) -> (Option<&str>, &str) {
    match chosen.split_once('/') {
        Some((namespace, name)) => (Some(namespace), name),
        None => (None, chosen),
    }
}

/// Reads the manifest at `path` and picks its Deployment (`chosen` when it has several).
pub fn from_file(path: &Path, chosen: Option<&str>) -> Result<Source, MigrateError> {
    let text = std::fs::read_to_string(path).map_err(|e| MigrateError::Manifest {
        path: path.to_path_buf(),
        reason: e.to_string(),
    })?;
    from_manifest(&text, path, chosen)
}

/// [`from_file`] on the manifest's text.
pub fn from_manifest(
    text: &str,
    path: &Path,
    chosen: Option<&str>,
) -> Result<Source, MigrateError> {
    let manifest = |reason: String| MigrateError::Manifest {
        path: path.to_path_buf(),
        reason,
    };
    let mut objects = Vec::new();
    for (index, document) in serde_yaml::Deserializer::from_str(text).enumerate() {
        let value = Value::deserialize(document)
            .map_err(|e| manifest(format!("document {}: {e}", index + 1)))?;
        match value.get("kind").and_then(Value::as_str) {
            Some("List") => {
                let items = value.get("items").and_then(Value::as_sequence);
                objects.extend(
                    items
                        .into_iter()
                        .flatten()
                        .map(|item| (index, item.clone())),
                );
            }
            _ if value.is_mapping() => objects.push((index, value)),
            _ => {} // an empty document, or a comment alone
        }
    }
    let mut deployments = Vec::new();
    let mut autoscalers = Vec::new();
    for (index, object) in objects {
        let kind = object
            .get("kind")
            .and_then(Value::as_str)
            .map(str::to_string);
        match kind.as_deref() {
            Some("Deployment") => {
                let name = object["metadata"]["name"]
                    .as_str()
                    .unwrap_or("(no name)")
                    .to_string();
                let deployment: Deployment = serde_yaml::from_value(object).map_err(|e| {
                    manifest(format!("Deployment {name} (document {}): {e}", index + 1))
                })?;
                deployments.push(deployment);
            }
            Some("HorizontalPodAutoscaler") => {
                autoscalers.push(("HorizontalPodAutoscaler", object))
            }
            Some("ScaledObject") => autoscalers.push(("ScaledObject", object)),
            _ => {}
        }
    }
    let names = || deployments.iter().map(shown).collect::<Vec<_>>().join(", ");
    let at = match chosen {
        Some(chosen) => {
            let (namespace, name) = split_name(chosen);
            let found = deployments.iter().position(|d| {
                d.metadata.name.as_deref() == Some(name)
                    && namespace.is_none_or(|ns| {
                        d.metadata.namespace.as_deref().is_none_or(|own| own == ns)
                    })
            });
            found.ok_or_else(|| {
                MigrateError::Choice(if deployments.is_empty() {
                    format!("{} has no Deployment (kind: Deployment)", path.display())
                } else {
                    format!(
                        "--deployment {chosen}: {} has no such Deployment; it has {}",
                        path.display(),
                        names()
                    )
                })
            })?
        }
        None => match deployments.len() {
            0 => {
                return Err(MigrateError::Choice(format!(
                    "{} has no Deployment (kind: Deployment)",
                    path.display()
                )));
            }
            1 => 0,
            n => {
                return Err(MigrateError::Choice(format!(
                    "{} has {n} Deployments ({}): choose one with --deployment NAME",
                    path.display(),
                    names()
                )));
            }
        },
    };
    let deployment = deployments.remove(at);
    let autoscalers = autoscalers
        .into_iter()
        .filter_map(|(kind, object)| manifest_autoscaler(kind, &object, &deployment))
        .collect();
    Ok(Source {
        deployment,
        file: Some(path.to_path_buf()),
        autoscalers: Ok(autoscalers),
        others: deployments,
    })
}

/// An HPA (any autoscaling version) or ScaledObject of a manifest, when it targets `deployment`.
fn manifest_autoscaler(
    kind: &'static str,
    object: &Value,
    deployment: &Deployment,
) -> Option<Autoscaler> {
    let spec = &object["spec"];
    let target = &spec["scaleTargetRef"];
    // A ScaledObject's target is a Deployment unless it says otherwise.
    let target_kind = target["kind"].as_str().unwrap_or("Deployment");
    let namespace = object["metadata"]["namespace"].as_str();
    let same_namespace = match (namespace, deployment.metadata.namespace.as_deref()) {
        (Some(a), Some(b)) => a == b,
        _ => true,
    };
    if target_kind != "Deployment"
        || target["name"].as_str() != deployment.metadata.name.as_deref()
        || !same_namespace
    {
        return None;
    }
    let (min, max) = match kind {
        "ScaledObject" => ("minReplicaCount", "maxReplicaCount"),
        _ => ("minReplicas", "maxReplicas"),
    };
    Some(Autoscaler {
        kind,
        name: object["metadata"]["name"]
            .as_str()
            .unwrap_or("(no name)")
            .to_string(),
        min: spec[min].as_i64(),
        max: spec[max].as_i64(),
    })
}

/// Reads `NAMESPACE/NAME` (or `NAME` in `namespace`) from the cluster, and the HPAs of its
/// namespace that target it (KEDA's own HPAs named by their ScaledObject).
pub async fn from_cluster(chosen: &str, namespace: &str) -> Result<Source, MigrateError> {
    let (own, name) = split_name(chosen);
    let namespace = own.unwrap_or(namespace);
    let client = kube::Client::try_default()
        .await
        .map_err(|e| MigrateError::Cluster(format!("no kubeconfig or in-cluster config: {e}")))?;
    let deployments: Api<Deployment> = Api::namespaced(client.clone(), namespace);
    let deployment = match deployments.get_opt(name).await {
        Ok(Some(deployment)) => deployment,
        Ok(None) => {
            return Err(MigrateError::Choice(format!(
                "--deployment: Deployment {namespace}/{name} not found"
            )));
        }
        Err(e) => {
            return Err(MigrateError::Cluster(format!(
                "reading Deployment {namespace}/{name}: {e}"
            )));
        }
    };
    let hpas: Api<HorizontalPodAutoscaler> = Api::namespaced(client, namespace);
    let autoscalers = match hpas.list(&ListParams::default()).await {
        Ok(list) => Ok(list
            .items
            .iter()
            .filter_map(|hpa| cluster_autoscaler(hpa, name))
            .collect()),
        Err(e) => Err(format!(
            "the HorizontalPodAutoscalers of namespace {namespace} could not be listed ({e})"
        )),
    };
    Ok(Source {
        deployment,
        file: None,
        autoscalers,
        others: Vec::new(),
    })
}

fn cluster_autoscaler(hpa: &HorizontalPodAutoscaler, deployment: &str) -> Option<Autoscaler> {
    let spec = hpa.spec.as_ref()?;
    let target = &spec.scale_target_ref;
    if target.kind != "Deployment" || target.name != deployment {
        return None;
    }
    let scaled_object = hpa
        .metadata
        .labels
        .as_ref()
        .and_then(|labels| labels.get(SCALED_OBJECT_LABEL));
    Some(Autoscaler {
        kind: match scaled_object {
            Some(_) => "ScaledObject",
            None => "HorizontalPodAutoscaler",
        },
        name: scaled_object
            .cloned()
            .or_else(|| hpa.metadata.name.clone())
            .unwrap_or_default(),
        min: spec.min_replicas.map(i64::from),
        max: Some(i64::from(spec.max_replicas)),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    const TWO: &str = "\
apiVersion: apps/v1
kind: Deployment
metadata: {name: rq-urgent, namespace: team}
spec:
  selector: {matchLabels: {app: rq-urgent}}
  template:
    metadata: {labels: {app: rq-urgent}}
    spec:
      containers: [{name: worker, image: jobs:1, command: [rq, worker, urgent]}]
---
# the batch queue's workers
---
apiVersion: apps/v1
kind: Deployment
metadata: {name: rq-batch, namespace: team}
spec:
  selector: {matchLabels: {app: rq-batch}}
  template:
    metadata: {labels: {app: rq-batch}}
    spec:
      containers: [{name: worker, image: jobs:1, command: [rq, worker, batch]}]
---
apiVersion: keda.sh/v1alpha1
kind: ScaledObject
metadata: {name: rq-urgent}
spec:
  scaleTargetRef: {name: rq-urgent}
  minReplicaCount: 1
  maxReplicaCount: 6
---
apiVersion: autoscaling/v2
kind: HorizontalPodAutoscaler
metadata: {name: batch, namespace: team}
spec:
  scaleTargetRef: {apiVersion: apps/v1, kind: Deployment, name: rq-batch}
  maxReplicas: 4
";

    fn path() -> &'static Path {
        Path::new("workers.yaml")
    }

    #[test]
    fn several_deployments_need_a_choice_that_names_them() {
        let error = from_manifest(TWO, path(), None).unwrap_err().to_string();
        assert_eq!(
            error,
            "workers.yaml has 2 Deployments (team/rq-urgent, team/rq-batch): choose one with --deployment NAME"
        );
        let error = from_manifest(TWO, path(), Some("rq-slow"))
            .unwrap_err()
            .to_string();
        assert!(
            error.contains("--deployment rq-slow") && error.contains("team/rq-batch"),
            "{error}"
        );
        let error = from_manifest(TWO, path(), Some("other/rq-batch"))
            .unwrap_err()
            .to_string();
        assert!(error.contains("no such Deployment"), "{error}");
    }

    #[test]
    fn the_chosen_deployment_comes_with_its_own_autoscalers_and_the_others() {
        let source = from_manifest(TWO, path(), Some("team/rq-batch")).unwrap();
        assert_eq!(shown(&source.deployment), "team/rq-batch");
        assert_eq!(
            source.autoscalers.unwrap(),
            [Autoscaler {
                kind: "HorizontalPodAutoscaler",
                name: "batch".into(),
                min: None,
                max: Some(4)
            }]
        );
        assert_eq!(source.others.len(), 1);
        let urgent = from_manifest(TWO, path(), Some("rq-urgent")).unwrap();
        assert_eq!(urgent.autoscalers.unwrap()[0].kind, "ScaledObject");
    }

    #[test]
    fn a_list_is_read_like_documents() {
        let list = "apiVersion: v1\nkind: List\nitems:\n- apiVersion: apps/v1\n  kind: Deployment\n  metadata: {name: jobs}\n  spec:\n    selector: {}\n    template: {spec: {containers: [{name: w}]}}\n";
        let source = from_manifest(list, path(), None).unwrap();
        assert_eq!(shown(&source.deployment), "jobs");
    }

    #[test]
    fn no_deployment_or_a_broken_one_is_refused_naming_the_file_and_document() {
        let error = from_manifest("kind: Service\nmetadata: {name: x}\n", path(), None);
        assert_eq!(
            error.unwrap_err().to_string(),
            "workers.yaml has no Deployment (kind: Deployment)"
        );
        let broken = "---\nkind: Service\n---\napiVersion: apps/v1\nkind: Deployment\nmetadata: {name: jobs}\nspec: {replicas: many}\n";
        let error = from_manifest(broken, path(), None).unwrap_err().to_string();
        assert!(
            error.starts_with("reading workers.yaml: Deployment jobs (document 2)"),
            "{error}"
        );
        let error = from_manifest("a: [", path(), None).unwrap_err().to_string();
        assert!(
            error.starts_with("reading workers.yaml: document 1"),
            "{error}"
        );
    }
}
