//! The CustomResourceDefinition as installed: the derived one, minus the descriptions inside the
//! embedded pod template. Those descriptions are Kubernetes' own documentation of PodSpec and
//! would make the CRD too large for `kubectl apply`'s last-applied annotation (256 KiB).

use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::{
    CustomResourceDefinition, JSONSchemaProps,
};
use kube::CustomResourceExt;

use crate::api::LanePool;
use crate::{Error, Result};

/// The LanePool CRD.
pub fn lanepool_crd() -> CustomResourceDefinition {
    let mut crd = LanePool::crd();
    for version in &mut crd.spec.versions {
        let template = version
            .schema
            .as_mut()
            .and_then(|s| s.open_api_v3_schema.as_mut())
            .and_then(|root| root.properties.as_mut())
            .and_then(|p| p.get_mut("spec"))
            .and_then(|spec| spec.properties.as_mut())
            .and_then(|p| p.get_mut("template"));
        if let Some(template) = template {
            strip_descriptions(template);
            template.description =
                Some("The worker pod template (a core/v1 PodTemplateSpec).".into());
        }
    }
    crd
}

/// The CRD as YAML, as checked in under crds/.
pub fn lanepool_crd_yaml() -> Result<String> {
    serde_yaml::to_string(&lanepool_crd()).map_err(|source| Error::Serialize {
        what: "the LanePool CRD",
        source,
    })
}

fn strip_descriptions(schema: &mut JSONSchemaProps) {
    schema.description = None;
    let children = schema
        .properties
        .iter_mut()
        .flat_map(|p| p.values_mut())
        .chain(schema.items.iter_mut().filter_map(|items| match items {
            k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::JSONSchemaPropsOrArray::Schema(s) => Some(s.as_mut()),
            _ => None,
        }))
        .chain(
            schema
                .additional_properties
                .iter_mut()
                .filter_map(|extra| match extra {
                    k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::JSONSchemaPropsOrBool::Schema(s) => Some(s.as_mut()),
                    _ => None,
                }),
        );
    for child in children {
        strip_descriptions(child);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_checked_in_crd_is_what_the_code_generates() {
        let checked_in = include_str!("../crds/lanepool.dev_lanepools.yaml");
        let generated = lanepool_crd_yaml().expect("the CRD serializes");
        assert!(
            checked_in == generated,
            "crds/lanepool.dev_lanepools.yaml is stale: run `cargo run -- crd > crds/lanepool.dev_lanepools.yaml`"
        );
    }

    #[test]
    fn the_crd_fits_in_kubectl_applys_annotation() {
        let yaml = lanepool_crd_yaml().expect("the CRD serializes");
        assert!(yaml.len() < 256 * 1024, "the CRD is {} bytes", yaml.len());
    }
}
