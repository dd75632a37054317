//! The LanePool made from a worker Deployment: its worker container chosen and its command
//! recognised, its lanes and size, its template, checked against the CRD's rules, and written as
//! YAML without the fields that only repeat a default. Pure: a Deployment in, a LanePool out.

use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::Container;
use serde_yaml::Value;

use super::args::MigrateArgs;
use super::command::{self, Framework, Recognised, Rewritten};
use super::error::MigrateError;
use super::lanes;
use super::source::{self, Source};
use super::template::{self, Edited};
use crate::api::{LanePool, LanePoolSpec};
use crate::sizing::PoolSizing;

/// A LanePool's name is the value of its workers' `lanepool.dev/pool` label.
const MOST_POOL_CHARACTERS: usize = 63;

/// What the worker container runs in the pool.
#[derive(Clone, Debug)]
pub enum Worker {
    /// An RQ or Celery worker, rewritten.
    Rewritten(Rewritten),
    /// A command migrate does not recognise, kept as it was (`--lanes` named the lanes): why it
    /// was not recognised.
    Kept(String),
}

/// The LanePool and what the steps need to say about how it was made.
#[derive(Clone, Debug)]
pub struct Migrated {
    pub pool: LanePool,
    /// The Deployment, `namespace/name`.
    pub deployment: String,
    pub container: String,
    /// The worker container's command line in the Deployment.
    pub old_command: Vec<String>,
    pub worker: Worker,
    /// The command's queues that `--lanes` left out.
    pub queues_left_out: Option<Vec<String>>,
    /// Whether totalWorkers is the Deployment's replicas (not a flag).
    pub total_from_replicas: bool,
    /// The template's changes the steps mention.
    pub edited: Edited,
    /// The worker container's image, and whether `--image` set it.
    pub image: Option<String>,
    pub image_given: bool,
    /// The manifest's other Deployments that take from the pool's lanes, with those lanes.
    pub others_on_the_lanes: Vec<(String, Vec<String>)>,
}

impl Migrated {
    pub fn name(&self) -> &str {
        self.pool.metadata.name.as_deref().unwrap_or_default()
    }

    pub fn namespace(&self) -> Option<&str> {
        self.pool.metadata.namespace.as_deref()
    }

    /// The queues the pool's lanes take, in priority order.
    pub fn queues(&self) -> impl Iterator<Item = &str> {
        self.pool.spec.lanes.iter().map(|lane| lane.queue())
    }

    pub fn framework(&self) -> Option<Framework> {
        match &self.worker {
            Worker::Rewritten(rewritten) => Some(rewritten.framework),
            Worker::Kept(_) => None,
        }
    }
}

/// A container's command line: its command followed by its args.
fn command_line(container: &Container) -> Vec<String> {
    container
        .command
        .iter()
        .flatten()
        .chain(container.args.iter().flatten())
        .cloned()
        .collect()
}

/// Makes the LanePool for the Deployment of `source`, as the flags say.
pub fn build(args: &MigrateArgs, source: &Source) -> Result<Migrated, MigrateError> {
    let deployment = &source.deployment;
    let shown = source::shown(deployment);
    let field = |field: &str, reason: String| MigrateError::Field {
        deployment: shown.clone(),
        field: field.to_string(),
        reason,
    };
    let template = deployment
        .spec
        .as_ref()
        .map(|spec| &spec.template)
        .ok_or_else(|| field("spec", "missing: a Deployment has a pod template".into()))?;
    let containers = template
        .spec
        .as_ref()
        .map(|spec| spec.containers.as_slice())
        .unwrap_or_default();
    let (at, recognised) = choose_container(args, containers, &shown)?;
    let container = &containers[at];
    let command_field = format!("spec.template.spec.containers[{}].command", container.name);
    let worker = match recognised {
        Err(reason) => return Err(field(&command_field, reason)),
        Ok(Recognised::Known(rewritten)) => Worker::Rewritten(rewritten),
        Ok(Recognised::Unknown(why)) if !args.lanes.is_empty() => Worker::Kept(why),
        Ok(Recognised::Unknown(why)) => {
            return Err(field(
                &command_field,
                format!(
                    "{why}: give the lanes with --lanes urgent,batch to keep the command as it is \
                     (its worker must then speak the worker protocol: docs/workers.md)"
                ),
            ));
        }
    };
    let (lane_names, from, queues_left_out) = match (&worker, args.lanes.is_empty()) {
        (Worker::Rewritten(rewritten), true) => {
            if rewritten.queues.is_empty() {
                return Err(field(
                    &command_field,
                    "celery worker has no -Q: it takes every queue of its app, in no order; give \
                     the lanes in priority order with --lanes urgent,batch"
                        .into(),
                ));
            }
            let from = format!("{} worker's queues", rewritten.framework.name());
            (rewritten.queues.clone(), from, None)
        }
        (Worker::Rewritten(rewritten), false) => {
            let left_out: Vec<String> = rewritten
                .queues
                .iter()
                .filter(|queue| !args.lanes.contains(queue))
                .cloned()
                .collect();
            let replaced = (!left_out.is_empty()).then_some(left_out);
            (args.lanes.clone(), "--lanes".to_string(), replaced)
        }
        (Worker::Kept(_), _) => (args.lanes.clone(), "--lanes".to_string(), None),
    };
    let named = lanes::check(&lane_names, &from)?;

    let replicas = deployment
        .spec
        .as_ref()
        .and_then(|spec| spec.replicas)
        .unwrap_or(1);
    let total_workers = match args.total_workers {
        Some(total) => total,
        None if replicas >= 2 => replicas,
        None => {
            return Err(field(
                "spec.replicas",
                format!(
                    "{replicas}: a LanePool needs at least 2 workers (1 reserved for the urgent \
                     lane and 1 shared); give --total-workers"
                ),
            ));
        }
    };
    let reserve_max = args
        .reserve_max
        .unwrap_or_else(|| lanes::default_reserve_max(total_workers));
    let concurrency = match &worker {
        Worker::Rewritten(rewritten) => rewritten.concurrency,
        Worker::Kept(_) => None,
    };
    let slots_per_worker = args.slots_per_worker.or(concurrency).unwrap_or(1);
    if slots_per_worker > 1
        && matches!(&worker, Worker::Rewritten(r) if r.framework == Framework::Rq)
    {
        return Err(MigrateError::flag(
            "--slots-per-worker",
            format!(
                "{slots_per_worker}: lanepool-rq-worker runs one job at a time; run more workers \
                 (--total-workers) instead"
            ),
        ));
    }

    let name = pool_name(args, deployment, source, &named[0].name, &shown)?;
    let rewritten = match &worker {
        Worker::Rewritten(rewritten) => Some(rewritten),
        Worker::Kept(_) => None,
    };
    let edited = template::edit(template, at, rewritten, args.image.as_deref());
    let spec = LanePoolSpec {
        lanes: lanes::lanes(&named, reserve_max, &args.job_time),
        headroom: crate::api::DEFAULT_HEADROOM,
        total_workers: Some(total_workers),
        shared: None,
        slots_per_worker,
        template: edited.template.clone(),
        prometheus: None,
        interval: crate::duration::KubeDuration::new(crate::api::DEFAULT_INTERVAL),
        scale_down: None,
        on_metrics_unavailable: None,
        paused: false,
    };
    PoolSizing::from_spec(&spec).map_err(|e| MigrateError::Refused(e.to_string()))?;
    let mut pool = LanePool::new(&name, spec);
    pool.metadata.namespace = deployment
        .metadata
        .namespace
        .clone()
        .or_else(|| args.namespace.clone());
    pool.metadata.labels = deployment.metadata.labels.clone();
    let image = edited
        .template
        .spec
        .as_ref()
        .and_then(|spec| spec.containers[at].image.clone());
    Ok(Migrated {
        deployment: shown,
        container: container.name.clone(),
        old_command: command_line(container),
        others_on_the_lanes: others_on_the_lanes(&source.others, &lane_names),
        pool,
        worker,
        queues_left_out,
        total_from_replicas: args.total_workers.is_none(),
        edited,
        image,
        image_given: args.image.is_some(),
    })
}

/// The worker's container: `--container`, else the one that runs an RQ or Celery worker, else
/// the only one. With it, what its command is.
fn choose_container(
    args: &MigrateArgs,
    containers: &[Container],
    shown: &str,
) -> Result<(usize, Result<Recognised, String>), MigrateError> {
    let names = || {
        containers
            .iter()
            .map(|c| c.name.as_str())
            .collect::<Vec<_>>()
            .join(", ")
    };
    if containers.is_empty() {
        return Err(MigrateError::Field {
            deployment: shown.to_string(),
            field: "spec.template.spec.containers".into(),
            reason: "none: the pool needs the worker's container".into(),
        });
    }
    if let Some(name) = &args.container {
        let at = containers
            .iter()
            .position(|c| &c.name == name)
            .ok_or_else(|| {
                MigrateError::flag(
                    "--container",
                    format!(
                        "{name}: the Pod of {shown} has no such container; it has {}",
                        names()
                    ),
                )
            })?;
        return Ok((at, command::recognise(&command_line(&containers[at]))));
    }
    let recognised: Vec<_> = containers
        .iter()
        .map(|c| command::recognise(&command_line(c)))
        .collect();
    // A command that is a worker but cannot be read counts as the worker: its error is the answer.
    let workers: Vec<usize> = (0..containers.len())
        .filter(|&at| !matches!(recognised[at], Ok(Recognised::Unknown(_))))
        .collect();
    let at = match (workers.as_slice(), containers.len()) {
        ([at], _) => *at,
        ([], 1) => 0,
        ([], _) => {
            return Err(MigrateError::flag(
                "--container",
                format!(
                    "no container of {shown} ({}) runs `rq worker` or `celery … worker`: name the \
                     worker's with --container (and its lanes with --lanes)",
                    names()
                ),
            ));
        }
        (several, _) => {
            let named: Vec<&str> = several
                .iter()
                .map(|&at| containers[at].name.as_str())
                .collect();
            return Err(MigrateError::flag(
                "--container",
                format!(
                    "containers {} of {shown} each run a worker: name the one to migrate",
                    named.join(", ")
                ),
            ));
        }
    };
    let recognised = recognised
        .into_iter()
        .nth(at)
        .expect("a container's command");
    Ok((at, recognised))
}

/// `--name` or the Deployment's, checked as the API server and the operator will check it.
fn pool_name(
    args: &MigrateArgs,
    deployment: &Deployment,
    source: &Source,
    urgent_lane: &str,
    shown: &str,
) -> Result<String, MigrateError> {
    let name = args
        .name
        .clone()
        .or_else(|| deployment.metadata.name.clone())
        .filter(|name| !name.is_empty())
        .ok_or_else(|| MigrateError::Field {
            deployment: shown.to_string(),
            field: "metadata.name".into(),
            reason: "missing: give the pool's with --name".into(),
        })?;
    if name.len() > MOST_POOL_CHARACTERS {
        let reason = format!(
            "{name:?} is {} characters: a LanePool's name is at most {MOST_POOL_CHARACTERS} (it is \
             its workers' lanepool.dev/pool label)",
            name.len()
        );
        return Err(match args.name {
            Some(_) => MigrateError::flag("--name", reason),
            None => MigrateError::Field {
                deployment: shown.to_string(),
                field: "metadata.name".into(),
                reason: format!("{reason}: give a shorter one with --name"),
            },
        });
    }
    // The operator refuses to write a Deployment of the pool's name that is someone else's.
    let written: Vec<String> = std::iter::once(format!("{name}-shared"))
        .chain(std::iter::once(format!("{name}-{urgent_lane}-reserved")))
        .collect();
    let existing = std::iter::once(deployment).chain(&source.others);
    if let Some(clash) = existing
        .filter_map(|d| d.metadata.name.as_ref())
        .find(|existing| written.contains(existing))
    {
        return Err(MigrateError::flag(
            "--name",
            format!(
                "{name}: the pool's Deployment {clash} would have the name of the Deployment \
                 {clash} that runs now; choose another pool name"
            ),
        ));
    }
    Ok(name)
}

/// The other Deployments of the manifest whose workers take from the pool's lanes, with those.
fn others_on_the_lanes(others: &[Deployment], lanes: &[String]) -> Vec<(String, Vec<String>)> {
    others
        .iter()
        .filter_map(|deployment| {
            let containers = &deployment.spec.as_ref()?.template.spec.as_ref()?.containers;
            let shared: Vec<String> = containers
                .iter()
                .filter_map(|c| match command::recognise(&command_line(c)) {
                    Ok(Recognised::Known(rewritten)) => Some(rewritten.queues),
                    _ => None,
                })
                .flatten()
                .filter(|queue| lanes.contains(queue))
                .collect();
            (!shared.is_empty()).then(|| (source::shown(deployment), shared))
        })
        .collect()
}

/// The LanePool as YAML, without the fields that repeat a default, under a line that says where
/// it came from.
pub fn render(migrated: &Migrated) -> Result<String, MigrateError> {
    let mut value = serde_yaml::to_value(&migrated.pool)?;
    without_defaults(&mut value);
    in_reading_order(&mut value);
    let from = command::shown(&migrated.old_command).replace('\n', " ");
    Ok(format!(
        "# Made by `lanepool migrate` from Deployment {} ({from}). What else to change is on stderr.\n{}",
        migrated.deployment,
        serde_yaml::to_string(&value)?
    ))
}

/// Takes out what the CRD fills in anyway, so the manifest reads like the README's first pool.
fn without_defaults(pool: &mut Value) {
    if let Some(root) = pool.as_mapping_mut() {
        root.remove("status");
    }
    let Some(spec) = pool.get_mut("spec").and_then(Value::as_mapping_mut) else {
        return;
    };
    let defaults = [
        ("headroom", Value::from(crate::api::DEFAULT_HEADROOM)),
        ("slotsPerWorker", Value::from(1)),
        ("interval", Value::from(crate::api::DEFAULT_INTERVAL)),
    ];
    remove_when_default(spec, &defaults);
    let reserves = spec
        .get_mut("lanes")
        .and_then(Value::as_sequence_mut)
        .into_iter()
        .flatten()
        .filter_map(|lane| lane.get_mut("reserve").and_then(Value::as_mapping_mut));
    for reserve in reserves {
        remove_when_default(
            reserve,
            &[("min", Value::from(1)), ("sizing", Value::from("Queueing"))],
        );
    }
    without_api_server_defaults(&mut pool["spec"]["template"]["spec"]);
}

/// What the API server writes into a Deployment read from the cluster that the user never did:
/// the pool's template reads as the Deployment's manifest did.
fn without_api_server_defaults(pod: &mut Value) {
    let Some(pod) = pod.as_mapping_mut() else {
        return;
    };
    remove_when_default(
        pod,
        &[
            ("dnsPolicy", Value::from("ClusterFirst")),
            ("restartPolicy", Value::from("Always")),
            ("schedulerName", Value::from("default-scheduler")),
            (
                "securityContext",
                Value::Mapping(serde_yaml::Mapping::new()),
            ),
        ],
    );
    let containers = pod
        .get_mut("containers")
        .and_then(Value::as_sequence_mut)
        .into_iter()
        .flatten()
        .filter_map(Value::as_mapping_mut);
    for container in containers {
        remove_when_default(
            container,
            &[
                (
                    "terminationMessagePath",
                    Value::from("/dev/termination-log"),
                ),
                ("terminationMessagePolicy", Value::from("File")),
            ],
        );
    }
}

fn remove_when_default(mapping: &mut serde_yaml::Mapping, defaults: &[(&str, Value)]) {
    for (key, default) in defaults {
        if mapping.get(*key) == Some(default) {
            mapping.remove(*key);
        }
    }
}

/// Puts the keys a reader looks for first, as the examples write them: a name before the rest,
/// the lanes and the size before the template, a container's image and command before its env.
fn in_reading_order(pool: &mut Value) {
    put_first(&mut pool["metadata"], &["name", "namespace"]);
    put_first(
        &mut pool["spec"],
        &["lanes", "totalWorkers", "slotsPerWorker"],
    );
    let containers = pool["spec"]["template"]["spec"]
        .get_mut("containers")
        .and_then(Value::as_sequence_mut);
    for container in containers.into_iter().flatten() {
        put_first(container, &["name", "image", "command", "args"]);
    }
}

fn put_first(value: &mut Value, keys: &[&str]) {
    let Some(mapping) = value.as_mapping_mut() else {
        return;
    };
    let mut ordered = serde_yaml::Mapping::new();
    for key in keys {
        if let Some(found) = mapping.remove(*key) {
            ordered.insert(Value::from(*key), found);
        }
    }
    ordered.extend(std::mem::take(mapping));
    *mapping = ordered;
}
