//! The Deployments a LanePool runs: one of reserved workers per reserve lane, taking only that
//! lane, and one of shared workers taking every lane in priority order. Pure: built from the
//! spec and the replica counts, so the same input always gives the same objects.

use std::collections::BTreeMap;

use k8s_openapi::api::apps::v1::{
    Deployment, DeploymentSpec, DeploymentStatus, DeploymentStrategy, RollingUpdateDeployment,
};
use k8s_openapi::api::core::v1::{EnvVar, PodReadinessGate, PodSpec, PodTemplateSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{LabelSelector, ObjectMeta};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use kube::{Resource, ResourceExt};
use serde::Deserialize;

use super::credential;
use super::protocol::{METRICS_PORT, TAKEOVER_CONDITION};
use crate::api::{LANE_LABEL, Lane, LanePool, POOL_LABEL, ROLE_LABEL};
use crate::sizing::Replicas;

/// The env var telling a worker which lanes to take, in preference order.
pub const LANES_ENV: &str = "LANEPOOL_LANES";
/// The env var telling a worker whether it is `reserved` or `shared`.
pub const ROLE_ENV: &str = "LANEPOOL_ROLE";
/// The env var naming the worker's LanePool.
pub const POOL_ENV: &str = "LANEPOOL_POOL";
/// The env var telling a worker how many jobs to run at once (`spec.slotsPerWorker`).
pub const SLOTS_ENV: &str = "LANEPOOL_SLOTS";
/// The env var telling a worker the queue of each of its lanes that takes another queue than
/// its name (`spec.lanes[].queue`), as `lane=queue,…` in priority order.
pub const QUEUES_ENV: &str = "LANEPOOL_QUEUES";

/// Deployment annotation: a hash of the pod template as applied, so an unchanged Deployment is
/// not written again.
pub const TEMPLATE_HASH: &str = "lanepool.dev/template-hash";

/// Which kind of worker a Deployment runs.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Role {
    /// Takes only this lane.
    Reserved { lane: String },
    /// Takes every lane in priority order.
    Shared,
}

impl Role {
    pub fn label(&self) -> &'static str {
        match self {
            Role::Reserved { .. } => "reserved",
            Role::Shared => "shared",
        }
    }
}

/// Whether the pod template serves a `metrics` port: only then are its workers read, drained
/// and gated (see [`takeover`]).
pub(super) fn serves_metrics(spec: Option<&PodSpec>) -> bool {
    spec.is_some_and(|spec| {
        spec.containers
            .iter()
            .flat_map(|c| c.ports.iter().flatten())
            .any(|p| p.name.as_deref() == Some(METRICS_PORT))
    })
}

/// How the Deployment of a template that serves a `metrics` port rolls a new template out: a
/// new worker counts as available only once the operator sets its readiness gate
/// [`TAKEOVER_CONDITION`] (after one worker of the old template drained and is idle), and no
/// old worker goes before a new one is available, so the Deployment controller stops only
/// workers that finished their jobs. `None` (the Deployment's defaults) for a template without
/// the port: its workers cannot be drained.
fn takeover(spec: &mut PodSpec) -> Option<DeploymentStrategy> {
    if !serves_metrics(Some(spec)) {
        return None;
    }
    let gates = spec.readiness_gates.get_or_insert_with(Vec::new);
    if !gates.iter().any(|g| g.condition_type == TAKEOVER_CONDITION) {
        gates.push(PodReadinessGate {
            condition_type: TAKEOVER_CONDITION.into(),
        });
    }
    Some(DeploymentStrategy {
        type_: Some("RollingUpdate".into()),
        rolling_update: Some(RollingUpdateDeployment {
            max_surge: Some(IntOrString::String("25%".into())),
            max_unavailable: Some(IntOrString::Int(0)),
        }),
    })
}

/// The replicas a Deployment's spec asks for.
pub(super) fn spec_replicas(deployment: &Deployment) -> Option<i32> {
    deployment.spec.as_ref()?.replicas
}

/// The name of the Deployment running `role` for `pool`.
pub fn deployment_name(pool: &str, role: &Role) -> String {
    match role {
        Role::Reserved { lane } => format!("{pool}-{lane}-reserved"),
        Role::Shared => format!("{pool}-shared"),
    }
}

/// Every Deployment of the pool: its name, role and replica count. A reserve lane missing from
/// `replicas` gets its `reserve.min`. The one place that maps replica counts to Deployments.
pub fn pool_roles(pool: &LanePool, replicas: &Replicas) -> Vec<(String, Role, i32)> {
    let name = pool.name_any();
    let mut roles: Vec<(String, Role, i32)> = pool
        .spec
        .reserve_lanes()
        .map(|(lane, reserve)| {
            let count = replicas
                .reserved
                .get(&lane.name)
                .copied()
                .unwrap_or(reserve.min);
            let role = Role::Reserved {
                lane: lane.name.clone(),
            };
            (deployment_name(&name, &role), role, count)
        })
        .collect();
    roles.push((
        deployment_name(&name, &Role::Shared),
        Role::Shared,
        replicas.shared,
    ));
    roles
}

/// Whether this pool (this very object, by uid) controls the Deployment.
pub(super) fn owned_by(pool: &LanePool, deployment: &Deployment) -> bool {
    let uid = pool.uid().unwrap_or_default();
    deployment
        .owner_references()
        .iter()
        .any(|o| o.uid == uid && o.controller == Some(true))
}

/// The pool's Deployments among `live` that no lane runs any more (a lane removed, renamed or
/// without its reserve), each with the lane it ran: they leave the way a shrink to 0 does.
pub(super) fn leaving<'a>(
    pool: &LanePool,
    live: impl IntoIterator<Item = &'a Deployment>,
) -> Vec<(String, Role)> {
    let ours: Vec<String> = pool_roles(pool, &Replicas::default())
        .into_iter()
        .map(|(name, _, _)| name)
        .collect();
    let prefix = format!("{}-", pool.name_any());
    live.into_iter()
        .filter(|d| owned_by(pool, d))
        .map(|d| d.name_any())
        .filter(|name| !ours.contains(name))
        .map(|name| {
            let lane = name
                .strip_prefix(&prefix)
                .and_then(|rest| rest.strip_suffix("-reserved"))
                .unwrap_or(&name)
                .to_string();
            (name, Role::Reserved { lane })
        })
        .collect()
}

/// Replica counts by Deployment name; empty without counts.
pub(super) fn counts_by_name(
    pool: &LanePool,
    replicas: Option<&Replicas>,
) -> BTreeMap<String, i32> {
    replicas
        .map(|r| pool_roles(pool, r))
        .unwrap_or_default()
        .into_iter()
        .map(|(name, _, count)| (name, count))
        .collect()
}

/// Every Deployment of the pool with its replica count.
pub fn worker_deployments(pool: &LanePool, replicas: &Replicas) -> Vec<Deployment> {
    pool_roles(pool, replicas)
        .iter()
        .map(|(_, role, count)| deployment(pool, role, *count))
        .collect()
}

fn deployment(pool: &LanePool, role: &Role, replicas: i32) -> Deployment {
    let pool_name = pool.name_any();
    // The lanes the role's workers take, in priority order: a stand-in names only these.
    let own_lanes: Vec<&Lane> = match role {
        Role::Reserved { lane } => pool.spec.lanes.iter().filter(|l| l.name == *lane).collect(),
        Role::Shared => pool.spec.lanes.iter().collect(),
    };
    let lanes = match role {
        Role::Reserved { lane } => lane.clone(),
        Role::Shared => pool
            .spec
            .lanes
            .iter()
            .map(|l| l.name.as_str())
            .collect::<Vec<_>>()
            .join(","),
    };
    let mut selector = BTreeMap::from([
        (POOL_LABEL.to_string(), pool_name.clone()),
        (ROLE_LABEL.to_string(), role.label().to_string()),
    ]);
    if let Role::Reserved { lane } = role {
        selector.insert(LANE_LABEL.to_string(), lane.clone());
    }

    let mut template: PodTemplateSpec = pool.spec.template.clone();
    let meta = template.metadata.get_or_insert_with(ObjectMeta::default);
    meta.labels
        .get_or_insert_with(BTreeMap::new)
        .extend(selector.clone());
    let mut env = vec![
        (LANES_ENV, lanes),
        (ROLE_ENV, role.label().to_string()),
        (POOL_ENV, pool_name.clone()),
    ];
    // Only when it is not the default: a pool of one-job workers keeps the template it had
    // before the field existed, so upgrading the operator rolls no worker over.
    if pool.spec.slots_per_worker != 1 {
        env.push((SLOTS_ENV, pool.spec.slots_per_worker.to_string()));
    }
    // The same: only workers with a lane whose queue is not its name have it, so a pool of
    // lanes named as their queues keeps its template, and a queue set on one lane rolls over
    // only the workers that take that lane.
    if let Some(queues) = queues(&own_lanes) {
        env.push((QUEUES_ENV, queues));
    }
    if let Some(spec) = template.spec.as_mut() {
        for container in &mut spec.containers {
            let vars = container.env.get_or_insert_with(Vec::new);
            // The operator's values win over any the template set under the same names.
            vars.retain(|var| !env.iter().any(|(name, _)| var.name == *name));
            vars.extend(env.iter().map(|(name, value)| EnvVar {
                name: (*name).to_string(),
                value: Some(value.clone()),
                value_from: None,
            }));
        }
    }

    // Only a worker the operator talks to (its template serves a metrics port) is given the
    // credential that steers it.
    if let Some(spec) = template.spec.as_mut().filter(|s| serves_metrics(Some(s))) {
        credential::mount(&pool_name, spec);
    }
    let strategy = template.spec.as_mut().and_then(takeover);
    // The strategy follows from the template alone: the template's hash covers it.
    let template_hash = hash(&serde_json::to_string(&template).unwrap_or_default());
    Deployment {
        metadata: ObjectMeta {
            name: Some(deployment_name(&pool_name, role)),
            namespace: pool.namespace(),
            labels: Some(selector.clone()),
            annotations: Some(BTreeMap::from([(TEMPLATE_HASH.to_string(), template_hash)])),
            owner_references: pool.controller_owner_ref(&()).map(|owner| vec![owner]),
            ..ObjectMeta::default()
        },
        spec: Some(DeploymentSpec {
            replicas: Some(replicas),
            selector: LabelSelector {
                match_labels: Some(selector),
                match_expressions: None,
            },
            template,
            strategy,
            ..DeploymentSpec::default()
        }),
        status: None,
    }
}

/// `lane=queue,…` for each of `lanes` whose queue is not its name, in priority order; None when
/// every one takes the queue of its name. The CRD keeps `,` and `=` out of a queue's name and
/// a lane's name, so the text splits back unambiguously.
fn queues(lanes: &[&Lane]) -> Option<String> {
    let renamed: Vec<String> = lanes
        .iter()
        .filter(|lane| lane.queue() != lane.name)
        .map(|lane| format!("{}={}", lane.name, lane.queue()))
        .collect();
    (!renamed.is_empty()).then(|| renamed.join(","))
}

/// FNV-1a: stable across Rust releases and processes, unlike `DefaultHasher`.
fn hash(text: &str) -> String {
    let mut hash: u64 = 0xcbf2_9ce4_8422_2325;
    for byte in text.bytes() {
        hash ^= u64::from(byte);
        hash = hash.wrapping_mul(0x0100_0000_01b3);
    }
    format!("{hash:016x}")
}

/// What the watch cache keeps of a Deployment: what a reconcile reads (name, labels, owners,
/// this operator's annotations, replicas, the pod template as JSON text, the ready count).
/// k8s-openapi's `Deployment` holds every field of its PodSpec and containers inline, 2.4 kB
/// before any text, once per Deployment of every pool; this is a fifth of that, and the pod
/// template is never parsed into types (it is only ever compared as JSON).
#[derive(Clone, Debug, Deserialize, kube::Resource)]
#[resource(inherit = Deployment)]
pub(super) struct CachedDeployment {
    pub(super) metadata: ObjectMeta,
    pub(super) spec: Option<CachedSpec>,
    pub(super) status: Option<CachedStatus>,
}

#[derive(Clone, Debug, Deserialize)]
pub(super) struct CachedSpec {
    pub(super) replicas: Option<i32>,
    /// The pod template as JSON text.
    #[serde(default, deserialize_with = "json_text")]
    pub(super) template: String,
}

#[derive(Clone, Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
pub(super) struct CachedStatus {
    pub(super) observed_generation: Option<i64>,
    pub(super) replicas: Option<i32>,
    pub(super) ready_replicas: Option<i32>,
    pub(super) updated_replicas: Option<i32>,
    pub(super) available_replicas: Option<i32>,
}

fn json_text<'de, D: serde::Deserializer<'de>>(deserializer: D) -> Result<String, D::Error> {
    let value = serde_json::Value::deserialize(deserializer)?;
    serde_json::to_string(&value).map_err(serde::de::Error::custom)
}

impl CachedDeployment {
    /// Drops what no reconcile reads: managed fields and annotations not this operator's (such
    /// as kubectl's last-applied copy).
    pub(super) fn keep_what_is_read(&mut self) {
        self.metadata.managed_fields = None;
        if let Some(annotations) = self.metadata.annotations.as_mut() {
            annotations.retain(|key, _| key == TEMPLATE_HASH);
        }
    }

    /// The Deployment a reconcile reads: the pod template as JSON text in [`LIVE_TEMPLATE`].
    pub(super) fn deployment(&self) -> Deployment {
        let mut metadata = self.metadata.clone();
        let spec = self.spec.as_ref().map(|spec| {
            metadata
                .annotations
                .get_or_insert_default()
                .insert(LIVE_TEMPLATE.into(), spec.template.clone());
            DeploymentSpec {
                replicas: spec.replicas,
                ..DeploymentSpec::default()
            }
        });
        let status = self.status.as_ref().map(|s| DeploymentStatus {
            observed_generation: s.observed_generation,
            replicas: s.replicas,
            ready_replicas: s.ready_replicas,
            updated_replicas: s.updated_replicas,
            available_replicas: s.available_replicas,
            ..DeploymentStatus::default()
        });
        Deployment {
            metadata,
            spec,
            status,
        }
    }
}

/// The annotation a cached Deployment carries its live pod template in, as JSON text (see
/// [`CachedDeployment`]). Only in the operator's watch cache: never written to the API server.
pub(super) const LIVE_TEMPLATE: &str = "lanepool.dev/live-template";

/// A Deployment's pod template as JSON: from the cache's text, or the typed template of a
/// Deployment read directly.
pub(super) fn template_json(deployment: &Deployment) -> Option<serde_json::Value> {
    let cached = deployment
        .metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get(LIVE_TEMPLATE));
    match cached {
        Some(text) => serde_json::from_str(text).ok(),
        None => deployment
            .spec
            .as_ref()
            .and_then(|spec| serde_json::to_value(&spec.template).ok()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::LanePoolSpec;

    fn example() -> LanePool {
        let yaml = include_str!("../../examples/lanepool.yaml");
        let mut pool: LanePool = serde_yaml::from_str(yaml).expect("the example parses");
        pool.metadata.namespace = Some("team".into());
        pool.metadata.uid = Some("1234".into());
        pool
    }

    #[test]
    fn the_cache_keeps_the_pod_template_as_json_text_that_compares_the_same() {
        let pool = example();
        let replicas = Replicas {
            reserved: BTreeMap::from([("urgent".into(), 1)]),
            shared: 9,
        };
        let mut desired = worker_deployments(&pool, &replicas).remove(0);
        desired.status = Some(DeploymentStatus {
            ready_replicas: Some(1),
            ..DeploymentStatus::default()
        });
        let mut live = serde_json::to_value(&desired).unwrap();
        live["metadata"]["annotations"]["kubectl.kubernetes.io/last-applied-configuration"] =
            serde_json::json!("{}");
        live["metadata"]["managedFields"] = serde_json::json!([{"manager": "kubectl"}]);
        let mut cached: CachedDeployment = serde_json::from_value(live).unwrap();
        cached.keep_what_is_read();
        let read = cached.deployment();
        assert_eq!(
            read.spec.as_ref().unwrap().template,
            Default::default(),
            "the typed template is never built"
        );
        assert_eq!(template_json(&read), template_json(&desired));
        assert_eq!(spec_replicas(&read), Some(1));
        assert_eq!(read.status.as_ref().unwrap().ready_replicas, Some(1));
        assert_eq!(
            read.metadata.owner_references,
            desired.metadata.owner_references
        );
        assert_eq!(read.labels(), desired.labels());
        assert!(read.metadata.managed_fields.is_none());
        let annotations = read.metadata.annotations.as_ref().unwrap();
        assert!(annotations.contains_key(TEMPLATE_HASH));
        assert!(!annotations.contains_key("kubectl.kubernetes.io/last-applied-configuration"));
        assert!(
            std::mem::size_of::<CachedDeployment>() * 4 < std::mem::size_of::<Deployment>(),
            "{} bytes",
            std::mem::size_of::<CachedDeployment>()
        );
    }

    fn env_of(deployment: &Deployment) -> BTreeMap<String, String> {
        let spec = deployment
            .spec
            .as_ref()
            .unwrap()
            .template
            .spec
            .as_ref()
            .unwrap();
        env_of_spec(spec)
    }

    fn env_of_spec(spec: &PodSpec) -> BTreeMap<String, String> {
        spec.containers[0]
            .env
            .iter()
            .flatten()
            .map(|v| (v.name.clone(), v.value.clone().unwrap_or_default()))
            .collect()
    }

    #[test]
    fn reserved_workers_take_only_their_lane_and_shared_take_all_in_order() {
        let pool = example();
        let replicas = Replicas {
            reserved: BTreeMap::from([("urgent".into(), 3)]),
            shared: 7,
        };
        let deployments = worker_deployments(&pool, &replicas);
        let names: Vec<_> = deployments.iter().map(|d| d.name_any()).collect();
        assert_eq!(names, ["jobs-urgent-reserved", "jobs-shared"]);

        let reserved = env_of(&deployments[0]);
        assert_eq!(reserved[LANES_ENV], "urgent");
        assert_eq!(reserved[ROLE_ENV], "reserved");
        assert_eq!(reserved[POOL_ENV], "jobs");
        assert_eq!(env_of(&deployments[1])[LANES_ENV], "urgent,batch");
        assert!(!reserved.contains_key(SLOTS_ENV), "{reserved:?}");
        assert_eq!(deployments[0].spec.as_ref().unwrap().replicas, Some(3));
        assert_eq!(deployments[1].spec.as_ref().unwrap().replicas, Some(7));
    }

    #[test]
    fn only_workers_the_operator_talks_to_get_the_credential_so_other_pools_never_roll_over() {
        let replicas = Replicas {
            reserved: BTreeMap::from([("urgent".into(), 1)]),
            shared: 2,
        };
        // Without a metrics port the operator never sends a worker anything: the template is the
        // one it was before the credential existed, and upgrading the operator restarts no one.
        for deployment in worker_deployments(&example(), &replicas) {
            let spec = deployment.spec.unwrap().template.spec.unwrap();
            assert!(spec.volumes.is_none(), "{:?}", spec.volumes);
            assert!(!env_of_spec(&spec).contains_key(credential::CREDENTIAL_FILE_ENV));
        }
        let mut pool = example();
        let container = &mut pool.spec.template.spec.as_mut().unwrap().containers[0];
        container.ports = Some(vec![
            serde_json::from_value(serde_json::json!({"name": "metrics", "containerPort": 9100}))
                .unwrap(),
        ]);
        for deployment in worker_deployments(&pool, &replicas) {
            let spec = deployment.spec.unwrap().template.spec.unwrap();
            let volume = &spec.volumes.as_ref().unwrap()[0];
            let secret = volume.secret.as_ref().unwrap();
            assert_eq!(
                secret.secret_name.as_deref(),
                Some("jobs-worker-credential")
            );
            assert_eq!(
                env_of_spec(&spec)[credential::CREDENTIAL_FILE_ENV],
                "/var/run/secrets/lanepool.dev/worker/token"
            );
        }
    }

    #[test]
    fn workers_of_several_slots_are_told_how_many_jobs_to_run_at_once() {
        let mut pool = example();
        pool.spec.slots_per_worker = 4;
        let replicas = Replicas {
            reserved: BTreeMap::from([("urgent".into(), 1)]),
            shared: 2,
        };
        for deployment in worker_deployments(&pool, &replicas) {
            assert_eq!(env_of(&deployment)[SLOTS_ENV], "4");
        }
    }

    #[test]
    fn pods_carry_the_pool_and_role_labels_and_match_the_selector() {
        let deployments = worker_deployments(&example(), &Replicas::default());
        for deployment in &deployments {
            let spec = deployment.spec.as_ref().unwrap();
            let labels = spec
                .template
                .metadata
                .as_ref()
                .unwrap()
                .labels
                .clone()
                .unwrap();
            assert_eq!(labels[POOL_LABEL], "jobs");
            for (key, value) in spec.selector.match_labels.as_ref().unwrap() {
                assert_eq!(
                    labels.get(key),
                    Some(value),
                    "selector {key} not on the pods"
                );
            }
        }
        let owner = &deployments[0].metadata.owner_references.as_ref().unwrap()[0];
        assert_eq!(
            (owner.kind.as_str(), owner.controller),
            ("LanePool", Some(true))
        );
    }

    /// A pool of one-job workers with a metrics port, every lane taking the queue of its name.
    fn pool_of_today() -> LanePool {
        let mut pool: LanePool = serde_yaml::from_str(
            "apiVersion: lanepool.dev/v1alpha1
kind: LanePool
metadata: {name: jobs, namespace: team, uid: '1234'}
spec:
  lanes:
    - {name: urgent, reserve: {max: 4}}
    - {name: batch}
  totalWorkers: 6
  template:
    spec:
      containers:
        - name: worker
          image: worker:1
          ports: [{name: metrics, containerPort: 9100}]
          env: [{name: LANEPOOL_METRICS_ADDR, value: '0.0.0.0:9100'}]
",
        )
        .expect("the pool parses");
        pool.metadata.uid = Some("1234".into());
        pool
    }

    #[test]
    fn an_upgrade_leaves_the_pod_templates_of_existing_pools_as_they_were() {
        // A changed template rolls every worker of the pool over: the operator's own additions
        // (LANEPOOL_QUEUES, LANEPOOL_SLOTS, ...) appear only where a pool asks for them. The
        // hashes are those of the templates before spec.lanes[].queue existed.
        let replicas = Replicas {
            reserved: BTreeMap::from([("urgent".into(), 2)]),
            shared: 4,
        };
        let hashes: Vec<String> = worker_deployments(&pool_of_today(), &replicas)
            .iter()
            .map(|d| d.annotations()[TEMPLATE_HASH].clone())
            .collect();
        assert_eq!(hashes, ["e508c580132ccf9a", "272a803b6778aa4d"]);
    }

    #[test]
    fn a_worker_learns_the_queue_of_each_of_its_lanes_that_takes_another_than_its_name() {
        let replicas = Replicas {
            reserved: BTreeMap::from([("urgent".into(), 1)]),
            shared: 2,
        };
        let mut pool = pool_of_today();
        pool.spec.lanes[0].queue = Some("high_priority".into());
        let deployments = worker_deployments(&pool, &replicas);
        let names: Vec<_> = deployments.iter().map(|d| d.name_any()).collect();
        assert_eq!(
            names,
            ["jobs-urgent-reserved", "jobs-shared"],
            "named by lane"
        );
        for deployment in &deployments {
            assert_eq!(env_of(deployment)[QUEUES_ENV], "urgent=high_priority");
        }
        assert_eq!(env_of(&deployments[0])[LANES_ENV], "urgent");
        assert_eq!(deployments[0].labels()[LANE_LABEL], "urgent");
        assert_eq!(env_of(&deployments[1])[LANES_ENV], "urgent,batch");

        // A stand-in names only the worker's own lanes: the reserved workers never take batch,
        // and a queue set on batch alone leaves their template as it was.
        pool.spec.lanes[1].queue = Some("rq:low".into());
        let deployments = worker_deployments(&pool, &replicas);
        assert_eq!(env_of(&deployments[0])[QUEUES_ENV], "urgent=high_priority");
        assert_eq!(
            env_of(&deployments[1])[QUEUES_ENV],
            "urgent=high_priority,batch=rq:low"
        );
        pool.spec.lanes[0].queue = None;
        let deployments = worker_deployments(&pool, &replicas);
        assert_eq!(
            deployments[0],
            worker_deployments(&pool_of_today(), &replicas)[0]
        );
        assert_eq!(env_of(&deployments[1])[QUEUES_ENV], "batch=rq:low");

        // A queue named as its lane is the default said aloud: nothing changes.
        let mut said = pool_of_today();
        said.spec.lanes[0].queue = Some("urgent".into());
        assert_eq!(
            worker_deployments(&said, &replicas),
            worker_deployments(&pool_of_today(), &replicas)
        );
        assert!(!env_of(&worker_deployments(&said, &replicas)[1]).contains_key(QUEUES_ENV));
    }

    #[test]
    fn the_operator_env_replaces_template_values_of_the_same_name() {
        let mut pool = example();
        let spec: &mut LanePoolSpec = &mut pool.spec;
        let container = &mut spec.template.spec.as_mut().unwrap().containers[0];
        container.env = Some(vec![
            EnvVar {
                name: LANES_ENV.into(),
                value: Some("batch".into()),
                value_from: None,
            },
            EnvVar {
                name: "KEEP".into(),
                value: Some("me".into()),
                value_from: None,
            },
        ]);
        let env = env_of(&worker_deployments(&pool, &Replicas::default())[0]);
        assert_eq!(env[LANES_ENV], "urgent");
        assert_eq!(env["KEEP"], "me");
    }
}
