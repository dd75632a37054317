//! The worker Pod template of the pool: the Deployment's own (labels, env, resources, volumes
//! kept), with the worker container's new command and what the operator needs of a worker: a
//! port named `metrics` that the worker serves (LANEPOOL_METRICS_ADDR), and for RQ its Redis as
//! lanepool-rq-worker reads it. It never adds what the operator sets itself (LANEPOOL_LANES,
//! LANEPOOL_ROLE, LANEPOOL_POOL, LANEPOOL_SLOTS, the credential). Pure.

use k8s_openapi::api::core::v1::{
    Container, ContainerPort, EnvVar, EnvVarSource, ObjectFieldSelector, PodTemplateSpec,
};

use super::command::{Framework, Rewritten};

/// The name of the port the operator reads, drains and asks stand-ins at
/// (docs/worker-protocol.md, "The metrics port").
pub const METRICS_PORT: &str = "metrics";

/// The port the worker package serves by default (LANEPOOL_METRICS_ADDR's default).
pub const DEFAULT_METRICS_PORT: i32 = 9100;
const METRICS_ADDR_ENV: &str = "LANEPOOL_METRICS_ADDR";
const REDIS_URL_ENV: &str = "LANEPOOL_REDIS_URL";
/// Where `rq worker` reads its Redis from when no `--url` names it, before its defaults.
const RQ_URL_ENVS: [&str; 2] = ["RQ_REDIS_URL", "REDIS_URL"];
/// RQ's settings read from the environment, one piece of the Redis each.
const RQ_REDIS_PIECES: [&str; 5] = [
    "REDIS_HOST",
    "REDIS_PORT",
    "REDIS_DB",
    "REDIS_PASSWORD",
    "REDIS_SSL",
];
/// An annotation `kubectl rollout restart` leaves on a template: the pool's workers are new.
const RESTARTED_AT: &str = "kubectl.kubernetes.io/restartedAt";
/// Kubernetes' default terminationGracePeriodSeconds.
const DEFAULT_GRACE_SECONDS: i64 = 30;

/// The pool's template and what changed in it that the steps must mention.
#[derive(Clone, Debug)]
pub struct Edited {
    pub template: PodTemplateSpec,
    /// The worker's `metrics` port.
    pub metrics_port: i32,
    /// The container had a port named `metrics` already: whatever served it must move.
    pub metrics_port_existed: bool,
    /// What to do about the RQ worker's Redis, when the template cannot say it.
    pub redis: Option<String>,
    pub grace_seconds: i64,
}

/// The Deployment's template with container `at` running `rewritten` (or its own command when
/// `None`) and, with `image`, that image.
pub fn edit(
    template: &PodTemplateSpec,
    at: usize,
    rewritten: Option<&Rewritten>,
    image: Option<&str>,
) -> Edited {
    let mut template = template.clone();
    if let Some(annotations) = template
        .metadata
        .as_mut()
        .and_then(|m| m.annotations.as_mut())
    {
        annotations.remove(RESTARTED_AT);
    }
    let spec = template.spec.get_or_insert_with(Default::default);
    let grace_seconds = spec
        .termination_grace_period_seconds
        .unwrap_or(DEFAULT_GRACE_SECONDS);
    let used_ports: Vec<i32> = spec
        .containers
        .iter()
        .flat_map(|c| c.ports.iter().flatten().map(|p| p.container_port))
        .collect();
    let container = &mut spec.containers[at];
    if let Some(rewritten) = rewritten {
        set_command(container, rewritten);
    }
    if let Some(image) = image {
        container.image = Some(image.to_string());
    }
    let (metrics_port, metrics_port_existed) = metrics_port(container, &used_ports);
    let redis = match rewritten {
        Some(rq) if rq.framework == Framework::Rq && !rq.redis_named => rq_redis(container),
        _ => None,
    };
    Edited {
        template,
        metrics_port,
        metrics_port_existed,
        redis,
        grace_seconds,
    }
}

/// The program words become the command and the rest its args, as the examples write them; a
/// container that had only args (the image's entrypoint runs them) keeps only args.
fn set_command(container: &mut Container, rewritten: &Rewritten) {
    let argv = rewritten.argv.clone();
    if container.command.is_some() {
        let (program, args) = argv.split_at(rewritten.program_words);
        container.command = Some(program.to_vec());
        container.args = (!args.is_empty()).then(|| args.to_vec());
    } else {
        container.args = Some(argv);
    }
}

fn env<'c>(container: &'c Container, name: &str) -> Option<&'c EnvVar> {
    container.env.iter().flatten().find(|var| var.name == name)
}

fn push_env(container: &mut Container, var: EnvVar) {
    container.env.get_or_insert_with(Vec::new).push(var);
}

/// The `metrics` port the worker serves, added (with LANEPOOL_METRICS_ADDR on the Pod's IP, as
/// the README's first pool) unless the container names one already.
fn metrics_port(container: &mut Container, used: &[i32]) -> (i32, bool) {
    let named = container
        .ports
        .iter()
        .flatten()
        .find(|port| port.name.as_deref() == Some(METRICS_PORT))
        .map(|port| port.container_port);
    let port = named.unwrap_or_else(|| {
        (DEFAULT_METRICS_PORT..)
            .find(|port| !used.contains(port))
            .expect("a free port above 9100")
    });
    if named.is_none() {
        container
            .ports
            .get_or_insert_with(Vec::new)
            .push(ContainerPort {
                name: Some(METRICS_PORT.into()),
                container_port: port,
                ..Default::default()
            });
    }
    if env(container, METRICS_ADDR_ENV).is_none() {
        let pod_ip = pod_ip_env(container);
        push_env(
            container,
            EnvVar {
                name: METRICS_ADDR_ENV.into(),
                value: Some(format!("$({pod_ip}):{port}")),
                value_from: None,
            },
        );
    }
    (port, named.is_some())
}

/// A variable holding the Pod's IP, added unless the container has one: `POD_IP`, or
/// `LANEPOOL_POD_IP` when `POD_IP` means something else there.
fn pod_ip_env(container: &mut Container) -> &'static str {
    let is_pod_ip = |var: &EnvVar| {
        var.value_from
            .as_ref()
            .and_then(|from| from.field_ref.as_ref())
            .is_some_and(|field| field.field_path == "status.podIP")
    };
    let name = match env(container, "POD_IP") {
        Some(var) if is_pod_ip(var) => return "POD_IP",
        Some(_) => "LANEPOOL_POD_IP",
        None => "POD_IP",
    };
    push_env(
        container,
        EnvVar {
            name: name.into(),
            value: None,
            value_from: Some(EnvVarSource {
                field_ref: Some(ObjectFieldSelector {
                    field_path: "status.podIP".into(),
                    api_version: None,
                }),
                ..Default::default()
            }),
        },
    );
    name
}

/// `rq worker` without `--url` reads RQ_REDIS_URL, then REDIS_URL, then REDIS_HOST and the
/// like; lanepool-rq-worker reads `--url` or LANEPOOL_REDIS_URL. A URL variable is copied to
/// LANEPOOL_REDIS_URL; what cannot be copied is said.
fn rq_redis(container: &mut Container) -> Option<String> {
    if env(container, REDIS_URL_ENV).is_some() {
        return None;
    }
    if let Some(var) = RQ_URL_ENVS.iter().find_map(|name| env(container, name)) {
        let copy = EnvVar {
            name: REDIS_URL_ENV.into(),
            ..var.clone()
        };
        push_env(container, copy);
        return None;
    }
    let pieces: Vec<&str> = RQ_REDIS_PIECES
        .into_iter()
        .filter(|name| env(container, name).is_some())
        .collect();
    if !pieces.is_empty() {
        return Some(format!(
            "RQ read its Redis from {}; lanepool-rq-worker reads only --url and \
             LANEPOOL_REDIS_URL: set LANEPOOL_REDIS_URL (redis://HOST:PORT/DB) in the pool's \
             template",
            pieces.join(", ")
        ));
    }
    if container
        .env_from
        .as_ref()
        .is_some_and(|from| !from.is_empty())
    {
        return Some(
            "if the container's envFrom sets RQ_REDIS_URL or REDIS_URL, add LANEPOOL_REDIS_URL \
             with the same value to the pool's template: lanepool-rq-worker reads only --url and \
             LANEPOOL_REDIS_URL (otherwise redis://127.0.0.1:6379/0, as RQ's own default)"
                .into(),
        );
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::migrate::command::{Recognised, recognise};

    fn template(yaml: &str) -> PodTemplateSpec {
        serde_yaml::from_str(yaml).expect("a pod template")
    }

    fn rewritten(line: &str) -> Rewritten {
        let words: Vec<String> = line.split_whitespace().map(str::to_string).collect();
        match recognise(&words) {
            Ok(Recognised::Known(rewritten)) => rewritten,
            other => panic!("{other:?}"),
        }
    }

    fn env_of(edited: &Edited) -> Vec<(String, Option<String>)> {
        let spec = edited.template.spec.as_ref().unwrap();
        spec.containers[0]
            .env
            .iter()
            .flatten()
            .map(|var| (var.name.clone(), var.value.clone()))
            .collect()
    }

    #[test]
    fn the_command_is_split_as_the_examples_write_it_and_the_metrics_port_added() {
        let original = template(
            "metadata:\n  labels: {app: rq}\n  annotations: {kubectl.kubernetes.io/restartedAt: x, team: jobs}\n\
             spec:\n  containers:\n  - name: worker\n    image: jobs:1\n    command: [rq, worker]\n    args: [--url, 'redis://r:6379/0', urgent, batch]\n",
        );
        let edited = edit(
            &original,
            0,
            Some(&rewritten("rq worker --url redis://r:6379/0 urgent batch")),
            None,
        );
        let spec = edited.template.spec.as_ref().unwrap();
        let worker = &spec.containers[0];
        assert_eq!(worker.command.as_deref().unwrap(), ["lanepool-rq-worker"]);
        assert_eq!(
            worker.args.as_deref().unwrap(),
            ["--url", "redis://r:6379/0", "--worker-class", "fork"]
        );
        let port = &worker.ports.as_ref().unwrap()[0];
        assert_eq!(
            (port.name.as_deref(), port.container_port),
            (Some("metrics"), 9100)
        );
        assert_eq!(
            env_of(&edited),
            [
                ("POD_IP".to_string(), None),
                (
                    "LANEPOOL_METRICS_ADDR".to_string(),
                    Some("$(POD_IP):9100".to_string())
                )
            ]
        );
        let annotations = edited
            .template
            .metadata
            .as_ref()
            .unwrap()
            .annotations
            .as_ref()
            .unwrap();
        assert!(!annotations.contains_key(RESTARTED_AT) && annotations.contains_key("team"));
        assert_eq!((edited.grace_seconds, edited.redis.clone()), (30, None));
    }

    #[test]
    fn a_container_with_args_alone_keeps_its_entrypoint() {
        let original = template(
            "spec:\n  containers:\n  - name: worker\n    args: [rq, worker, urgent, batch]\n",
        );
        let edited = edit(
            &original,
            0,
            Some(&rewritten("rq worker urgent batch")),
            Some("jobs:2"),
        );
        let worker = &edited.template.spec.as_ref().unwrap().containers[0];
        assert!(worker.command.is_none());
        assert_eq!(worker.args.as_deref().unwrap()[0], "lanepool-rq-worker");
        assert_eq!(worker.image.as_deref(), Some("jobs:2"));
    }

    #[test]
    fn a_port_taken_moves_the_metrics_port_and_a_named_one_is_kept() {
        let taken = template(
            "spec:\n  containers:\n  - name: worker\n    command: [rq, worker, a, b]\n    ports: [{containerPort: 9100}]\n  - name: exporter\n    ports: [{containerPort: 9101}]\n",
        );
        let edited = edit(&taken, 0, Some(&rewritten("rq worker a b")), None);
        assert_eq!(
            (edited.metrics_port, edited.metrics_port_existed),
            (9102, false)
        );
        let named = template(
            "spec:\n  containers:\n  - name: worker\n    command: [rq, worker, a, b]\n    ports: [{name: metrics, containerPort: 8000}]\n    env: [{name: POD_IP, value: x}]\n",
        );
        let edited = edit(&named, 0, Some(&rewritten("rq worker a b")), None);
        assert_eq!(
            (edited.metrics_port, edited.metrics_port_existed),
            (8000, true)
        );
        let env = env_of(&edited);
        assert_eq!(
            env[1].0, "LANEPOOL_POD_IP",
            "POD_IP means something else here"
        );
        assert_eq!(env[2].1.as_deref(), Some("$(LANEPOOL_POD_IP):8000"));
    }

    #[test]
    fn rqs_redis_from_the_environment_is_copied_or_said() {
        let from_url = template(
            "spec:\n  containers:\n  - name: worker\n    command: [rq, worker, a, b]\n    env:\n    - name: RQ_REDIS_URL\n      valueFrom: {secretKeyRef: {name: redis, key: url}}\n",
        );
        let edited = edit(&from_url, 0, Some(&rewritten("rq worker a b")), None);
        let copied = edited.template.spec.as_ref().unwrap().containers[0]
            .env
            .iter()
            .flatten()
            .find(|var| var.name == REDIS_URL_ENV)
            .cloned()
            .expect("LANEPOOL_REDIS_URL");
        let secret = copied
            .value_from
            .and_then(|from| from.secret_key_ref)
            .unwrap();
        assert_eq!(
            (secret.name.as_str(), secret.key.as_str()),
            ("redis", "url")
        );
        assert!(edited.redis.is_none());
        let pieces = template(
            "spec:\n  containers:\n  - name: worker\n    command: [rq, worker, a, b]\n    env: [{name: REDIS_HOST, value: redis}]\n",
        );
        let edited = edit(&pieces, 0, Some(&rewritten("rq worker a b")), None);
        assert!(
            edited
                .redis
                .unwrap()
                .starts_with("RQ read its Redis from REDIS_HOST")
        );
        let celery = template(
            "spec:\n  containers:\n  - name: worker\n    command: [celery, -A, app, worker, -Q, 'a,b']\n    envFrom: [{secretRef: {name: app}}]\n",
        );
        let edited = edit(
            &celery,
            0,
            Some(&rewritten("celery -A app worker -Q a,b")),
            None,
        );
        assert!(edited.redis.is_none(), "Celery's broker is the app's");
    }
}
