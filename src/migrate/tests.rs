//! `lanepool migrate` end to end on realistic manifests, without a cluster: what it prints parses
//! back as a LanePool that keeps the CRD's rules, and a bad input is refused naming its field.

use std::path::Path;

use k8s_openapi::api::core::v1::Container;
use serde_yaml::Value;

use super::source::from_manifest;
use super::{MigrateArgs, MigrateError, Migration, from_source};
use crate::api::LanePool;
use crate::sizing::PoolSizing;

/// An RQ worker Deployment as a team runs one: a Secret's Redis URL, resources, a volume, a
/// log-shipping sidecar, a scheduler in the workers.
const RQ: &str = r#"
apiVersion: apps/v1
kind: Deployment
metadata:
  name: rq-worker
  namespace: media
  labels: {app: rq-worker, team: media}
spec:
  replicas: 10
  selector:
    matchLabels: {app: rq-worker}
  template:
    metadata:
      labels: {app: rq-worker, tier: jobs}
      annotations:
        kubectl.kubernetes.io/restartedAt: "2026-11-30T10:00:00Z"
    spec:
      serviceAccountName: jobs
      terminationGracePeriodSeconds: 60
      dnsPolicy: ClusterFirst
      securityContext: {}
      containers:
        - name: worker
          image: registry.example.com/media/jobs:4.2.0
          terminationMessagePath: /dev/termination-log
          command: [rq, worker]
          args: [--url, $(REDIS_URL), --path, /app, --with-scheduler, urgent, batch]
          env:
            - name: REDIS_URL
              valueFrom:
                secretKeyRef: {name: redis, key: url}
            - name: SENTRY_DSN
              value: https://key@sentry.example.com/1
          resources:
            requests: {cpu: 250m, memory: 256Mi}
            limits: {memory: 512Mi}
          volumeMounts:
            - {name: media, mountPath: /media}
        - name: log-shipper
          image: fluent/fluent-bit:3.2
      volumes:
        - name: media
          persistentVolumeClaim: {claimName: media}
"#;

/// A Celery worker Deployment: four jobs at once per worker, the broker from the app's settings.
const CELERY: &str = r#"
apiVersion: apps/v1
kind: Deployment
metadata:
  name: celery-worker
  namespace: shop
spec:
  replicas: 4
  selector:
    matchLabels: {app: celery-worker}
  template:
    metadata:
      labels: {app: celery-worker}
    spec:
      containers:
        - name: celery
          image: shop/app:2026.11
          command: [celery, -A, shop.tasks:app, worker, -Q, "urgent,batch", -c, "4", --loglevel=INFO]
          env:
            - name: CELERY_BROKER_URL
              valueFrom:
                secretKeyRef: {name: broker, key: url}
"#;

fn path() -> &'static Path {
    Path::new("workers.yaml")
}

fn migrate(manifest: &str, args: MigrateArgs) -> Result<Migration, MigrateError> {
    let source = from_manifest(manifest, path(), args.deployment.as_deref())?;
    from_source(&args, &source)
}

fn defaults() -> MigrateArgs {
    MigrateArgs::default()
}

fn migrated(manifest: &str, args: MigrateArgs) -> (LanePool, Migration) {
    let migration = migrate(manifest, args).unwrap_or_else(|e| panic!("{e}"));
    let pool = keeps_the_crds_rules(&migration.yaml);
    (pool, migration)
}

fn refused(manifest: &str, args: MigrateArgs) -> String {
    migrate(manifest, args).expect_err("refused").to_string()
}

/// The lane name's schema in the generated CRD: its pattern and most characters.
fn lane_name_schema() -> (regex::Regex, usize) {
    let crd: Value =
        serde_yaml::from_str(&crate::crd::lanepool_crd_yaml().expect("the CRD")).expect("CRD YAML");
    let name = &crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]["properties"]
        ["lanes"]["items"]["properties"]["name"];
    let pattern = name["pattern"].as_str().expect("a lane name pattern");
    let most = name["maxLength"].as_u64().expect("a lane name's maxLength");
    (
        regex::Regex::new(pattern).expect("the pattern compiles"),
        most as usize,
    )
}

/// Parses `yaml` as a LanePool and checks what the API server would check that needs no server:
/// the schema's lane names, the CEL rules on lanes and on totalWorkers, the name's length, and
/// the operator's own checks of a spec (`PoolSizing::from_spec`).
fn keeps_the_crds_rules(yaml: &str) -> LanePool {
    let pool: LanePool = serde_yaml::from_str(yaml).unwrap_or_else(|e| panic!("{e}\n{yaml}"));
    let raw: Value = serde_yaml::from_str(yaml).expect("YAML");
    assert_eq!(
        (raw["apiVersion"].as_str(), raw["kind"].as_str()),
        (Some("lanepool.dev/v1alpha1"), Some("LanePool"))
    );
    let name = pool.metadata.name.as_deref().expect("a name");
    assert!(name.len() <= 63, "{name}");
    let lanes = &pool.spec.lanes;
    assert!((1..=16).contains(&lanes.len()));
    let (pattern, most) = lane_name_schema();
    let queue_pattern = regex::Regex::new(crate::api::QUEUE_PATTERN).expect("the queue pattern");
    for lane in lanes {
        assert!(
            pattern.is_match(&lane.name) && lane.name.len() <= most,
            "{}",
            lane.name
        );
        assert_eq!(
            lanes.iter().filter(|l| l.name == lane.name).count(),
            1,
            "unique"
        );
        if let Some(queue) = &lane.queue {
            assert!(
                queue_pattern.is_match(queue) && queue.len() <= 255,
                "{queue}"
            );
        }
        assert_eq!(
            lanes.iter().filter(|l| l.queue() == lane.queue()).count(),
            1,
            "no two lanes on one queue"
        );
    }
    assert!(
        lanes.iter().any(|l| l.reserve.is_some()),
        "a lane with a reserve"
    );
    assert!(lanes.iter().any(|l| l.reserve.is_none()), "a lane without");
    let total = pool.spec.total_workers.expect("totalWorkers");
    assert!(pool.spec.shared.is_none(), "exactly one pool size");
    let least: i32 = pool.spec.reserve_lanes().map(|(_, r)| r.min).sum::<i32>() + 1;
    assert!(total >= least, "totalWorkers {total} < {least}");
    PoolSizing::from_spec(&pool.spec).expect("the operator takes the spec");
    pool
}

fn worker<'p>(pool: &'p LanePool, name: &str) -> &'p Container {
    let spec = pool.spec.template.spec.as_ref().expect("a pod spec");
    spec.containers
        .iter()
        .find(|c| c.name == name)
        .expect("the container")
}

fn env_names(container: &Container) -> Vec<&str> {
    container
        .env
        .iter()
        .flatten()
        .map(|var| var.name.as_str())
        .collect()
}

#[test]
fn an_rq_deployment_becomes_a_pool_of_lanepool_rq_workers_with_its_own_template() {
    let (pool, migration) = migrated(RQ, defaults());
    assert_eq!(pool.metadata.name.as_deref(), Some("rq-worker"));
    assert_eq!(pool.metadata.namespace.as_deref(), Some("media"));
    assert_eq!(pool.metadata.labels.as_ref().unwrap()["team"], "media");
    let lanes: Vec<&str> = pool.spec.lanes.iter().map(|l| l.name.as_str()).collect();
    assert_eq!(lanes, ["urgent", "batch"]);
    let reserve = pool.spec.lanes[0].reserve.as_ref().unwrap();
    assert_eq!((reserve.min, reserve.max), (1, 6));
    assert_eq!(pool.spec.total_workers, Some(10));

    let worker = worker(&pool, "worker");
    assert_eq!(worker.command.as_deref().unwrap(), ["lanepool-rq-worker"]);
    assert_eq!(
        worker.args.as_deref().unwrap(),
        [
            "--url",
            "$(REDIS_URL)",
            "--path",
            "/app",
            "--worker-class",
            "fork"
        ]
    );
    assert_eq!(
        worker.image.as_deref(),
        Some("registry.example.com/media/jobs:4.2.0")
    );
    assert_eq!(
        env_names(worker),
        ["REDIS_URL", "SENTRY_DSN", "POD_IP", "LANEPOOL_METRICS_ADDR"]
    );
    let port = &worker.ports.as_ref().unwrap()[0];
    assert_eq!(
        (port.name.as_deref(), port.container_port),
        (Some("metrics"), 9100)
    );
    assert!(worker.resources.as_ref().unwrap().limits.is_some());
    assert_eq!(
        worker.volume_mounts.as_ref().unwrap()[0].mount_path,
        "/media"
    );
    let spec = pool.spec.template.spec.as_ref().unwrap();
    assert_eq!(spec.volumes.as_ref().unwrap()[0].name, "media");
    assert_eq!(spec.service_account_name.as_deref(), Some("jobs"));
    let sidecar = &spec.containers[1];
    assert!(sidecar.command.is_none() && sidecar.ports.is_none() && sidecar.env.is_none());
    let metadata = pool.spec.template.metadata.as_ref().unwrap();
    assert_eq!(metadata.labels.as_ref().unwrap()["tier"], "jobs");
    assert!(metadata.annotations.as_ref().is_none_or(|a| a.is_empty()));

    // The defaults the CRD fills in are left out, as in the README's first pool.
    for default in [
        "dnsPolicy:",
        "securityContext:",
        "terminationMessagePath:",
        "headroom:",
        "slotsPerWorker:",
        "interval:",
        "sizing:",
        "min:",
        "status:",
    ] {
        assert!(
            !migration.yaml.contains(default),
            "{default}\n{}",
            migration.yaml
        );
    }
    assert!(
        migration
            .yaml
            .starts_with("# Made by `lanepool migrate` from Deployment media/rq-worker")
    );
}

#[test]
fn the_rq_steps_retire_the_deployment_only_after_the_pools_workers_are_ready() {
    let (_, migration) = migrated(RQ, defaults());
    let steps = &migration.steps;
    let at = |text: &str| {
        steps
            .find(text)
            .unwrap_or_else(|| panic!("{text:?} not in\n{steps}"))
    };
    assert!(at("--with-scheduler: no RQ scheduler runs") < at("Apply the pool"));
    assert!(at("pip install './python[rq]'") < at("Apply the pool"));
    assert!(at("The producer needs no change") < at("Apply the pool"));
    let wait = at(
        "kubectl -n media wait --for=condition=Available deployment/rq-worker-urgent-reserved deployment/rq-worker-shared",
    );
    let scale = at("kubectl -n media scale deployment/rq-worker --replicas 0");
    assert!(wait < scale && scale < at("kubectl -n media delete deployment/rq-worker"));
    assert!(at("If an HPA or a KEDA ScaledObject outside the manifest") < scale);
    assert!(steps.contains("(60 s here"), "{steps}");
    assert!(
        steps.contains("LANEPOOL_NAMESPACE=media and LANEPOOL_POOL=rq-worker set in the producer"),
        "{steps}"
    );
    // Numbered from 1, one number per step.
    let numbers: Vec<&str> = steps
        .lines()
        .filter_map(|line| line.trim_start().split_once(". ").map(|(n, _)| n))
        .filter(|n| n.chars().all(|c| c.is_ascii_digit()))
        .collect();
    let expected: Vec<String> = (1..=numbers.len()).map(|n| n.to_string()).collect();
    assert_eq!(numbers, expected, "{steps}");
}

#[test]
fn a_celery_deployment_keeps_its_command_without_the_queues_and_its_concurrency_as_slots() {
    let (pool, migration) = migrated(CELERY, defaults());
    assert_eq!(pool.spec.slots_per_worker, 4);
    assert_eq!(pool.spec.total_workers, Some(4));
    assert_eq!(
        pool.spec.lanes[0].reserve.as_ref().unwrap().max,
        3,
        "3 of 4, as the example"
    );
    let worker = worker(&pool, "celery");
    assert_eq!(worker.command.as_deref().unwrap(), ["celery"]);
    assert_eq!(
        worker.args.as_deref().unwrap(),
        ["-A", "shop.tasks:app", "worker", "--loglevel=INFO"]
    );
    assert_eq!(
        env_names(worker),
        ["CELERY_BROKER_URL", "POD_IP", "LANEPOOL_METRICS_ADDR"],
        "no LANEPOOL_REDIS_URL: the broker is the app's"
    );
    let steps = &migration.steps;
    assert!(
        steps.contains("in the module that -A shop.tasks:app names, add"),
        "{steps}"
    );
    assert!(steps.contains("configure(app)   # after app = Celery(...)"));
    assert!(steps.contains("install_celery_hook()"));
    assert!(!steps.contains("sets no --concurrency"));
}

#[test]
fn a_celery_worker_without_concurrency_is_told_to_set_its_slots() {
    let manifest = CELERY.replace(r#", -c, "4""#, "");
    let (pool, migration) = migrated(&manifest, defaults());
    assert_eq!(pool.spec.slots_per_worker, 1);
    assert!(
        migration.steps.contains("sets no --concurrency"),
        "{}",
        migration.steps
    );
    let (pool, migration) = migrated(
        &manifest,
        MigrateArgs {
            slots_per_worker: Some(8),
            ..defaults()
        },
    );
    assert_eq!(pool.spec.slots_per_worker, 8);
    assert!(!migration.steps.contains("sets no --concurrency"));
}

#[test]
fn the_readmes_first_pool_comes_out_of_the_deployment_it_replaces() {
    let deployment = r#"
apiVersion: apps/v1
kind: Deployment
metadata: {name: jobs}
spec:
  replicas: 10
  selector: {matchLabels: {app: jobs}}
  template:
    metadata: {labels: {app: jobs}}
    spec:
      terminationGracePeriodSeconds: 30
      containers:
        - name: worker
          image: lanepool-python-worker
          command: [rq, worker, --worker-class, rq.worker.SimpleWorker, --path, examples/redis]
          args: [urgent, batch]
          env:
            - {name: RQ_REDIS_URL, value: "redis://127.0.0.1:6379/0"}
"#;
    let (pool, _) = migrated(deployment, defaults());
    let example = std::fs::read_to_string(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/examples/redis/lanepool-rq.yaml"
    ))
    .expect("the example");
    let first: LanePool = serde_yaml::from_str(&example).expect("the example pool");
    assert_eq!(pool.spec.lanes, first.spec.lanes);
    assert_eq!(pool.spec.total_workers, first.spec.total_workers);
    let (ours, theirs) = (worker(&pool, "worker"), worker(&first, "worker"));
    assert_eq!(ours.command, theirs.command);
    assert_eq!(ours.args, theirs.args);
    assert_eq!(ours.ports, theirs.ports);
    let value = |container: &Container, name: &str| {
        container
            .env
            .iter()
            .flatten()
            .find(|v| v.name == name)
            .and_then(|v| v.value.clone())
    };
    for name in ["LANEPOOL_REDIS_URL", "LANEPOOL_METRICS_ADDR"] {
        assert_eq!(value(ours, name), value(theirs, name), "{name}");
    }
}

#[test]
fn kedas_two_deployments_become_one_pool_with_lanes_named_and_both_retired() {
    let keda = std::fs::read_to_string(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/examples/redis/keda-rq.yaml"
    ))
    .expect("the KEDA example");
    assert!(refused(&keda, defaults()).contains("2 Deployments (rq-urgent, rq-batch)"));
    let one_lane = refused(
        &keda,
        MigrateArgs {
            deployment: Some("rq-urgent".into()),
            ..defaults()
        },
    );
    assert!(
        one_lane.starts_with("--lanes: 1 lane (urgent) from RQ worker's queues"),
        "{one_lane}"
    );
    let (pool, migration) = migrated(
        &keda,
        MigrateArgs {
            deployment: Some("rq-urgent".into()),
            name: Some("jobs".into()),
            lanes: vec!["urgent".into(), "batch".into()],
            total_workers: Some(10),
            ..defaults()
        },
    );
    assert_eq!(pool.spec.lanes[0].reserve.as_ref().unwrap().max, 6);
    let worker = worker(&pool, "worker");
    assert_eq!(
        worker.args.as_deref().unwrap(),
        [
            "--path",
            "examples/redis",
            "--url",
            "redis://127.0.0.1:6379/0"
        ]
    );
    let steps = &migration.steps;
    assert!(
        steps.contains("kubectl delete scaledobject rq-urgent"),
        "{steps}"
    );
    assert!(
        !steps.contains("no lane of --lanes"),
        "every queue is a lane: {steps}"
    );
    assert!(
        steps.contains(
            "Deployment rq-batch of the manifest also takes from the pool's lanes (batch)"
        )
    );
}

#[test]
fn a_queue_that_lanes_leave_out_is_said_to_be_taken_by_no_one() {
    let (pool, migration) = migrated(
        RQ,
        MigrateArgs {
            lanes: vec!["urgent".into(), "bulk".into()],
            ..defaults()
        },
    );
    assert_eq!(pool.spec.lanes[1].name, "bulk");
    assert!(
        migration.steps.contains(
            "The command's queue batch is no lane of --lanes urgent,bulk: every worker of the pool \
             takes exactly its lanes, so once the Deployment is retired no one takes it."
        ),
        "{}",
        migration.steps
    );
}

#[test]
fn an_unrecognised_command_needs_lanes_and_is_then_kept_as_it_is() {
    let manifest = RQ.replace(
        "command: [rq, worker]\n          args: [--url, $(REDIS_URL), --path, /app, --with-scheduler, urgent, batch]",
        "command: [python, -m, jobs.worker]",
    );
    let error = refused(&manifest, defaults());
    assert!(
        error.contains("--container"),
        "two containers, none a worker: {error}"
    );
    let error = refused(
        &manifest,
        MigrateArgs {
            container: Some("worker".into()),
            ..defaults()
        },
    );
    assert_eq!(
        error,
        "Deployment media/rq-worker: spec.template.spec.containers[worker].command: \
         `python -m jobs.worker` is neither `rq worker` nor `celery … worker`: give the lanes with \
         --lanes urgent,batch to keep the command as it is (its worker must then speak the \
         worker protocol: docs/workers.md)"
    );
    let (pool, migration) = migrated(
        &manifest,
        MigrateArgs {
            container: Some("worker".into()),
            lanes: vec!["urgent".into(), "batch".into()],
            ..defaults()
        },
    );
    assert_eq!(
        worker(&pool, "worker").command.as_deref().unwrap(),
        ["python", "-m", "jobs.worker"]
    );
    assert!(
        migration.steps.contains("kept as it is"),
        "{}",
        migration.steps
    );
}

#[test]
fn a_queue_that_cannot_be_a_lanes_name_is_taken_by_a_lane_named_after_it() {
    let (pool, migration) = migrated(
        &RQ.replace("urgent, batch]", "high_priority, batch]"),
        defaults(),
    );
    let lanes: Vec<(&str, &str)> = pool
        .spec
        .lanes
        .iter()
        .map(|lane| (lane.name.as_str(), lane.queue()))
        .collect();
    assert_eq!(
        lanes,
        [("high-priority", "high_priority"), ("batch", "batch")]
    );
    assert!(pool.spec.lanes[1].queue.is_none());
    assert!(
        migration.yaml.contains("queue: high_priority"),
        "{}",
        migration.yaml
    );
    assert!(
        migration
            .steps
            .contains("lanes high-priority (queue high_priority, a reserve of 1 to 6), batch;"),
        "{}",
        migration.steps
    );
}

#[test]
fn bad_input_is_refused_naming_the_field_flag_or_queue() {
    let queue = refused(&RQ.replace("urgent, batch]", "\"a=b\", batch]"), defaults());
    assert!(
        queue.starts_with("queue \"a=b\" (RQ worker's queues) cannot be a lane's queue"),
        "{queue}"
    );
    let one = refused(&RQ.replace("replicas: 10", "replicas: 1"), defaults());
    assert!(
        one.starts_with(
            "Deployment media/rq-worker: spec.replicas: 1: a LanePool needs at least 2"
        ),
        "{one}"
    );
    let no_queues = refused(&CELERY.replace(r#"-Q, "urgent,batch", "#, ""), defaults());
    assert!(no_queues.contains("celery worker has no -Q"), "{no_queues}");
    let slots = refused(
        RQ,
        MigrateArgs {
            slots_per_worker: Some(2),
            ..defaults()
        },
    );
    assert!(
        slots.starts_with("--slots-per-worker: 2: lanepool-rq-worker runs one job"),
        "{slots}"
    );
    let unknown = refused(&RQ.replace("--with-scheduler", "--sentry-dsn"), defaults());
    assert!(
        unknown.starts_with("Deployment media/rq-worker: spec.template.spec.containers[worker].command: rq worker option --sentry-dsn"),
        "{unknown}"
    );
    let no_container = refused(
        "apiVersion: apps/v1\nkind: Deployment\nmetadata: {name: x}\nspec:\n  selector: {}\n  template: {spec: {containers: []}}\n",
        defaults(),
    );
    assert_eq!(
        no_container,
        "Deployment x: spec.template.spec.containers: none: the pool needs the worker's container"
    );
    let long = refused(
        RQ,
        MigrateArgs {
            name: Some("n".repeat(64)),
            ..defaults()
        },
    );
    assert!(long.starts_with("--name: "), "{long}");
    let exit = migrate(
        RQ,
        MigrateArgs {
            slots_per_worker: Some(2),
            ..defaults()
        },
    )
    .unwrap_err();
    assert_eq!(
        exit.exit_code(),
        2,
        "a bad flag exits as clap's own errors do"
    );
}

#[test]
fn a_pool_name_whose_deployment_would_be_the_old_ones_is_refused() {
    let manifest = RQ.replace(
        "name: rq-worker\n  namespace",
        "name: jobs-shared\n  namespace",
    );
    let error = refused(
        &manifest,
        MigrateArgs {
            name: Some("jobs".into()),
            ..defaults()
        },
    );
    assert!(
        error.starts_with("--name: jobs: the pool's Deployment jobs-shared"),
        "{error}"
    );
}
