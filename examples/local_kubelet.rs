//! Stands in for a kubelet (and the scheduler) on this machine, for the demo: it registers the
//! Node `local`, binds the pending Pods labelled `lanepool.dev/pool` in a namespace to it, runs
//! each Pod's first container as a local process (its `command` and `args` when it sets a
//! `command`, `$(VAR)` expanded and found on this machine's PATH, in its `workingDir`; the lane
//! worker otherwise) with the Pod's env (values,
//! `$(VAR)` references and downward-API `fieldRef`s such as `metadata.name` and `status.podIP`;
//! `HOSTNAME` is the Pod's name), gives each Pod an address of its own on the loopback
//! (127.1.x.y; `--ip-block` changes the 1, so kubelets side by side never share an address), and
//! reports it Running and Ready. A container's Secret volumes (the pool's worker credential) are
//! written as files under `<log-dir>/volumes/<pod uid>/<volume>/`, refreshed every
//! [`VOLUME_REFRESH`] as a kubelet refreshes them (atomically, so a reader sees the old file or
//! the new one), and an env value under a mount path points into that folder instead (the
//! processes share this machine's file system). A Pod being deleted is stopped the kubelet's
//! way: SIGTERM, up to its grace period, SIGKILL, then the Pod is removed (delete with grace 0).
//! A running Pod fails its readiness probe while the file `<log-dir>/unready/<pod name>` exists:
//! it is reported not Ready until the file goes (a test's way to fail a worker's probe).
//! Prometheus finds the workers through a file_sd file this writes (`--pod-targets`): each Pod's
//! address at its container port named `metrics`, labelled `namespace`, `pool` and `pod`. Its
//! workers never outlive it: stopped on SIGTERM/Ctrl-C, killed by the kernel if it dies.
//!
//!     cargo run --example local_kubelet -- --namespace demo \
//!         --queue-url http://127.0.0.1:9464 --log-dir target/demo/workers \
//!         --pod-targets "$LANEPOOL_POD_TARGETS"

use std::collections::{BTreeMap, HashMap};
use std::fs::{File, OpenOptions};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitCode, Stdio};
use std::time::{Duration, Instant};

use clap::Parser;
use k8s_openapi::api::core::v1::{Container, Node, Pod, Secret};
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams, PostParams, Preconditions};
use kube::{Client, ResourceExt};
use serde_json::json;

const POOL_LABEL: &str = "lanepool.dev/pool";
/// The grace period of a Pod that names none, as the API server defaults it.
const DEFAULT_GRACE: Duration = Duration::from_secs(30);
/// How often Secret volumes are written again from their Secrets (a kubelet's sync period and
/// cache TTL make it a minute or two; shorter here, so the tests of a rotation are short).
const VOLUME_REFRESH: Duration = Duration::from_secs(2);
/// How long the workers get when this kubelet itself is stopped.
const SHUTDOWN_GRACE: Duration = Duration::from_secs(10);

/// Runs the Pods of lanepool's Deployments as local processes.
#[derive(Parser)]
struct Args {
    /// Namespace of the Pods.
    #[arg(long, default_value = "demo")]
    namespace: String,
    /// The Node to register and bind Pods to.
    #[arg(long, default_value = "local")]
    node: String,
    /// LANEPOOL_QUEUE_URL for workers whose Pod does not set it.
    #[arg(long, default_value = "http://127.0.0.1:9464")]
    queue_url: String,
    /// The worker program; by default `lane_worker` beside this program.
    #[arg(long)]
    worker: Option<PathBuf>,
    /// Where each Deployment's workers append their output, one file per Deployment.
    #[arg(long, default_value = "target/demo/workers")]
    log_dir: PathBuf,
    /// The Prometheus file_sd file to keep the running Pods in (none: not written).
    #[arg(long, env = "LANEPOOL_POD_TARGETS")]
    pod_targets: Option<PathBuf>,
    /// How often to list the Pods.
    #[arg(long, default_value = "250ms", value_parser = interval)]
    interval: Duration,
    /// The second byte of the Pods' loopback addresses, 127.N.x.y: kubelets running side by
    /// side (tests in parallel, beside the demo) each need their own.
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u8).range(1..))]
    ip_block: u8,
    /// How long a bound Pod takes to start its worker and become Ready (an image pull and a
    /// container start, which a cluster takes seconds for); a restarted worker starts at once.
    #[arg(long, default_value = "0s", value_parser = interval)]
    pod_start: Duration,
    /// A label selector of other Pods to run beside the pools' (such as the workers' Deployment
    /// a pool is migrated from): `app=celery-workers`.
    #[arg(long, value_name = "SELECTOR")]
    also_run: Option<String>,
}

fn interval(value: &str) -> Result<Duration, String> {
    lanepool::duration::parse(value).map_err(|e| e.to_string())
}

/// A Pod this kubelet runs.
struct Running {
    name: String,
    child: Child,
    ip: String,
    /// The file_sd entry: `ip:port` and the labels; none without a port named `metrics`.
    target: Option<(String, BTreeMap<String, String>)>,
    /// When SIGTERM was sent, and the SIGKILL deadline.
    stopping: Option<(Instant, Instant)>,
    restarts: i32,
}

struct Kubelet {
    args: Args,
    worker: PathBuf,
    pods: Api<Pod>,
    /// By Pod uid.
    running: HashMap<String, Running>,
    /// When each bound Pod not started yet was first seen, by uid: it starts `--pod-start` later.
    starting: HashMap<String, Instant>,
    next_ip: u32,
    written_targets: String,
    secrets: Api<Secret>,
    /// The Secrets read in this pass, by name: a pool's Pods share one, read once.
    secrets_read: HashMap<String, Option<Secret>>,
    /// When the Secret volumes were last written again.
    volumes_refreshed: Instant,
}

// One thread (current_thread) forks every worker: PR_SET_PDEATHSIG fires when the forking
// *thread* exits, so a worker forked from a short-lived thread would die early.
#[tokio::main(flavor = "current_thread")]
async fn main() -> ExitCode {
    let args = Args::parse();
    let worker = match args.worker.clone().map_or_else(beside_this_program, Ok) {
        Ok(worker) if worker.is_file() => worker,
        Ok(worker) => {
            eprintln!(
                "local_kubelet: error: the worker program {} does not exist: build it with \
                 `cargo build --example lane_worker`, or pass --worker",
                worker.display()
            );
            return ExitCode::from(2);
        }
        Err(e) => {
            eprintln!("local_kubelet: error: finding the worker program: {e}");
            return ExitCode::from(2);
        }
    };
    if let Err(e) = std::fs::create_dir_all(&args.log_dir) {
        eprintln!(
            "local_kubelet: error: --log-dir {}: {e}",
            args.log_dir.display()
        );
        return ExitCode::from(2);
    }
    let client = match Client::try_default().await {
        Ok(client) => client,
        Err(e) => {
            eprintln!("local_kubelet: error: kube client (KUBECONFIG): {e}");
            return ExitCode::FAILURE;
        }
    };
    if let Err(e) = register_node(&client, &args.node).await {
        eprintln!("local_kubelet: error: registering Node {}: {e}", args.node);
        return ExitCode::FAILURE;
    }
    let mut kubelet = Kubelet {
        secrets: Api::namespaced(client.clone(), &args.namespace),
        secrets_read: HashMap::new(),
        volumes_refreshed: Instant::now(),
        pods: Api::namespaced(client, &args.namespace),
        worker,
        args,
        running: HashMap::new(),
        starting: HashMap::new(),
        next_ip: 0,
        written_targets: String::new(),
    };
    eprintln!(
        "local_kubelet: Node {}: running {} for the Pods labelled {POOL_LABEL} in {}",
        kubelet.args.node,
        kubelet.worker.display(),
        kubelet.args.namespace
    );
    kubelet.write_targets();

    use tokio::signal::unix::{SignalKind, signal};
    let (Ok(mut term), Ok(mut interrupt)) = (
        signal(SignalKind::terminate()),
        signal(SignalKind::interrupt()),
    ) else {
        eprintln!("local_kubelet: error: installing signal handlers");
        return ExitCode::FAILURE;
    };
    let mut tick = tokio::time::interval(kubelet.args.interval);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = tick.tick() => kubelet.sync().await,
            _ = term.recv() => break,
            _ = interrupt.recv() => break,
        }
    }
    kubelet.stop_everything();
    ExitCode::SUCCESS
}

fn beside_this_program() -> std::io::Result<PathBuf> {
    let me = std::env::current_exe()?;
    Ok(me.with_file_name("lane_worker"))
}

/// Creates the Node (if it is not there) and reports it Ready.
async fn register_node(client: &Client, name: &str) -> kube::Result<()> {
    let nodes: Api<Node> = Api::all(client.clone());
    if nodes.get_opt(name).await?.is_none() {
        let node: Node =
            serde_json::from_value(json!({"metadata": {"name": name}})).expect("a Node literal");
        nodes.create(&PostParams::default(), &node).await?;
    }
    let now = k8s_openapi::jiff::Timestamp::now().to_string();
    let status = json!({"status": {
        "conditions": [{"type": "Ready", "status": "True", "reason": "KubeletReady",
                        "message": "local_kubelet runs Pods as processes",
                        "lastHeartbeatTime": now, "lastTransitionTime": now}],
        "addresses": [{"type": "InternalIP", "address": "127.0.0.1"}],
    }});
    nodes
        .patch_status(name, &PatchParams::default(), &Patch::Merge(&status))
        .await?;
    Ok(())
}

/// Whether the Pod's condition `type_` is True.
fn condition_true(pod: &Pod, type_: &str) -> bool {
    pod.status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .into_iter()
        .flatten()
        .any(|c| c.type_ == type_ && c.status == "True")
}

/// Whether every readiness gate of the Pod has its condition True (true without gates).
fn gates_open(pod: &Pod) -> bool {
    pod.spec
        .as_ref()
        .and_then(|s| s.readiness_gates.as_ref())
        .into_iter()
        .flatten()
        .all(|gate| condition_true(pod, &gate.condition_type))
}

impl Kubelet {
    /// One pass: bind, start, stop and remove, as the Pods are now.
    async fn sync(&mut self) {
        let mut listed = Vec::new();
        for selector in std::iter::once(POOL_LABEL).chain(self.args.also_run.as_deref()) {
            match self
                .pods
                .list(&ListParams::default().labels(selector))
                .await
            {
                Ok(list) => listed.extend(list.items),
                Err(e) => {
                    // Keep the workers as they are: an unreachable API server is no reason to
                    // stop.
                    eprintln!("local_kubelet: listing Pods: {e}");
                    return;
                }
            }
        }
        self.secrets_read.clear();
        let refresh = self.volumes_refreshed.elapsed() >= VOLUME_REFRESH;
        if refresh {
            self.volumes_refreshed = Instant::now();
        }
        let mut seen = Vec::new();
        for pod in &listed {
            let uid = pod.uid().unwrap_or_default();
            seen.push(uid.clone());
            let node = pod.spec.as_ref().and_then(|s| s.node_name.clone());
            if pod.metadata.deletion_timestamp.is_some() {
                self.terminate(pod, &uid).await;
            } else if node.is_none() {
                self.bind(pod).await;
            } else if node.as_deref() == Some(self.args.node.as_str()) {
                if refresh && self.running.contains_key(&uid) {
                    self.write_secret_volumes(pod, &uid).await;
                }
                self.keep_running(pod, &uid).await;
            }
        }
        self.starting.retain(|uid, _| seen.contains(uid));
        // Pods removed behind our back (force-deleted): their processes go at once.
        let gone: Vec<String> = self
            .running
            .keys()
            .filter(|uid| !seen.contains(uid))
            .cloned()
            .collect();
        for uid in gone {
            if let Some(mut running) = self.running.remove(&uid) {
                eprintln!("local_kubelet: {}: Pod gone, killing it", running.name);
                let _ = running.child.kill();
                let _ = running.child.wait();
            }
        }
        self.write_targets();
    }

    /// Binds a pending Pod to this Node: the scheduler's job, with one Node to choose from.
    async fn bind(&self, pod: &Pod) {
        let name = pod.name_any();
        let binding = json!({
            "apiVersion": "v1", "kind": "Binding",
            "metadata": {"name": name},
            "target": {"apiVersion": "v1", "kind": "Node", "name": self.args.node},
        });
        if let Err(e) = self
            .pods
            .create_subresource::<_, serde_json::Value>(
                "binding",
                &name,
                &PostParams::default(),
                &binding,
            )
            .await
        {
            eprintln!("local_kubelet: {name}: binding: {e}");
        }
    }

    /// Starts the Pod's worker if it is not running (or exited: `restartPolicy: Always`) and
    /// reports it Running and Ready.
    async fn keep_running(&mut self, pod: &Pod, uid: &str) {
        let name = pod.name_any();
        if let Some(running) = self.running.get_mut(uid) {
            match running.child.try_wait() {
                Ok(None) => return self.follow_gates(pod).await,
                Ok(Some(status)) => {
                    eprintln!("local_kubelet: {name}: worker exited ({status}); restarting it");
                    running.restarts += 1;
                }
                Err(_) => return,
            }
        }
        let first_start = !self.running.contains_key(uid);
        let seen = *self
            .starting
            .entry(uid.to_string())
            .or_insert_with(Instant::now);
        if first_start && seen.elapsed() < self.args.pod_start {
            return;
        }
        self.starting.remove(uid);
        let restarts = self.running.remove(uid).map_or(0, |r| r.restarts);
        let ip = self.running_ip(uid);
        let Some(container) = pod.spec.as_ref().and_then(|s| s.containers.first()) else {
            return;
        };
        self.write_secret_volumes(pod, uid).await;
        let mut env = pod_env(pod, container, &ip, &self.args.node);
        self.point_into_volumes(pod, container, uid, &mut env);
        let child = match start_worker(&self.worker, &name, container, &env, &self.args) {
            Ok(child) => child,
            Err(e) => {
                eprintln!("local_kubelet: {name}: starting its worker: {e}");
                return;
            }
        };
        let target = metrics_port(container).map(|port| {
            let labels = BTreeMap::from([
                ("namespace".to_string(), self.args.namespace.clone()),
                (
                    "pool".to_string(),
                    pod.labels().get(POOL_LABEL).cloned().unwrap_or_default(),
                ),
                ("pod".to_string(), name.clone()),
            ]);
            (format!("{ip}:{port}"), labels)
        });
        eprintln!("local_kubelet: {name}: started at {ip}");
        self.running.insert(
            uid.to_string(),
            Running {
                name: name.clone(),
                child,
                ip: ip.clone(),
                target,
                stopping: None,
                restarts,
            },
        );
        let now = k8s_openapi::jiff::Timestamp::now().to_string();
        let container_name = pod
            .spec
            .as_ref()
            .and_then(|s| s.containers.first())
            .map_or_else(String::new, |c| c.name.clone());
        let condition = |type_: &str, ready: bool| {
            let status = if ready { "True" } else { "False" };
            json!({"type": type_, "status": status, "lastTransitionTime": now})
        };
        let condition = |type_: &str| match type_ {
            "Ready" => condition(type_, gates_open(pod)),
            _ => condition(type_, true),
        };
        let status = json!({"status": {
            "phase": "Running",
            "hostIP": "127.0.0.1",
            "hostIPs": [{"ip": "127.0.0.1"}],
            "podIP": ip,
            "podIPs": [{"ip": ip}],
            "startTime": now,
            "conditions": [condition("PodScheduled"), condition("Initialized"),
                           condition("ContainersReady"), condition("Ready")],
            "containerStatuses": [{
                "name": container_name, "image": container.image.clone().unwrap_or_default(),
                "imageID": "", "ready": true, "started": true, "restartCount": restarts,
                "state": {"running": {"startedAt": now}},
            }],
        }});
        // Strategic: conditions merge by type, so a readiness gate's condition set by someone
        // else stays.
        if let Err(e) = self
            .pods
            .patch_status(&name, &PatchParams::default(), &Patch::Strategic(&status))
            .await
        {
            eprintln!("local_kubelet: {name}: writing status: {e}");
        }
    }

    /// A running Pod is Ready only while every readiness gate's condition is True and its
    /// readiness probe passes (see [`Self::probe_fails`]), as a kubelet reports it.
    async fn follow_gates(&self, pod: &Pod) {
        let want = gates_open(pod) && !self.probe_fails(&pod.name_any());
        if condition_true(pod, "Ready") == want {
            return;
        }
        let status = if want { "True" } else { "False" };
        let now = k8s_openapi::jiff::Timestamp::now().to_string();
        let patch = json!({"status": {"conditions": [
            {"type": "Ready", "status": status, "lastTransitionTime": now},
        ]}});
        let name = pod.name_any();
        if let Err(e) = self
            .pods
            .patch_status(&name, &PatchParams::default(), &Patch::Strategic(&patch))
            .await
        {
            eprintln!("local_kubelet: {name}: writing readiness: {e}");
        }
    }

    /// Whether the Pod's readiness probe fails now: the file `<log-dir>/unready/<pod>` exists.
    fn probe_fails(&self, pod: &str) -> bool {
        self.args.log_dir.join("unready").join(pod).exists()
    }

    /// The address a Pod keeps while it runs (and across restarts of its worker).
    fn running_ip(&mut self, uid: &str) -> String {
        if let Some(running) = self.running.get(uid) {
            return running.ip.clone();
        }
        self.next_ip += 1;
        let n = self.next_ip;
        format!(
            "127.{}.{}.{}",
            self.args.ip_block,
            (n / 250) % 250,
            n % 250 + 1
        )
    }

    /// Where the Pod's volume `volume` is written.
    fn volume_dir(&self, uid: &str, volume: &str) -> PathBuf {
        self.args.log_dir.join("volumes").join(uid).join(volume)
    }

    /// Writes each Secret volume of the Pod as files (its `items`, or every key), each replaced
    /// atomically; an optional volume whose Secret is missing is an empty folder. A Secret that
    /// cannot be read leaves the files as they were.
    async fn write_secret_volumes(&mut self, pod: &Pod, uid: &str) {
        let volumes = pod.spec.as_ref().and_then(|s| s.volumes.as_ref());
        for volume in volumes.into_iter().flatten() {
            let Some(source) = &volume.secret else {
                continue;
            };
            let name = source.secret_name.clone().unwrap_or_default();
            let secret = match self.secret(&name).await {
                Ok(secret) => secret,
                Err(e) => {
                    eprintln!(
                        "local_kubelet: {}: reading Secret {name}: {e}",
                        pod.name_any()
                    );
                    continue;
                }
            };
            let data = secret.and_then(|s| s.data).unwrap_or_default();
            let files: Vec<(String, Vec<u8>)> = match &source.items {
                Some(items) => items
                    .iter()
                    .filter_map(|i| Some((i.path.clone(), data.get(&i.key)?.0.clone())))
                    .collect(),
                None => data.into_iter().map(|(k, v)| (k, v.0)).collect(),
            };
            let dir = self.volume_dir(uid, &volume.name);
            if let Err(e) = write_files(&dir, &files) {
                eprintln!(
                    "local_kubelet: {}: writing {}: {e}",
                    pod.name_any(),
                    dir.display()
                );
            }
        }
    }

    /// The Secret `name` (`None`: there is none), read from the API server once per pass.
    async fn secret(&mut self, name: &str) -> kube::Result<Option<Secret>> {
        if let Some(secret) = self.secrets_read.get(name) {
            return Ok(secret.clone());
        }
        let secret = self.secrets.get_opt(name).await?;
        self.secrets_read.insert(name.to_string(), secret.clone());
        Ok(secret)
    }

    /// Env values under a Secret volume's mount path point into the folder it is written to.
    fn point_into_volumes(
        &self,
        pod: &Pod,
        container: &Container,
        uid: &str,
        env: &mut [(String, String)],
    ) {
        let volumes = pod.spec.as_ref().and_then(|s| s.volumes.as_ref());
        for mount in container.volume_mounts.iter().flatten() {
            let secret = volumes
                .into_iter()
                .flatten()
                .any(|v| v.name == mount.name && v.secret.is_some());
            if !secret {
                continue;
            }
            let dir = self.volume_dir(uid, &mount.name);
            for (_, value) in env.iter_mut() {
                if let Some(rest) = value.strip_prefix(mount.mount_path.as_str()) {
                    *value = format!("{}{rest}", dir.display());
                }
            }
        }
    }

    /// A Pod being deleted: SIGTERM once, SIGKILL after its grace period, and the Pod removed
    /// once its worker is gone.
    async fn terminate(&mut self, pod: &Pod, uid: &str) {
        let name = pod.name_any();
        if let Some(running) = self.running.get_mut(uid) {
            let now = Instant::now();
            let (since, deadline) = *running.stopping.get_or_insert_with(|| {
                // SAFETY: kill(2) on a child we started and have not reaped.
                unsafe { libc::kill(running.child.id() as i32, libc::SIGTERM) };
                (now, now + grace(pod))
            });
            if matches!(running.child.try_wait(), Ok(None)) {
                if now < deadline {
                    return;
                }
                eprintln!(
                    "local_kubelet: {name}: still running {:.1} s after SIGTERM: SIGKILL",
                    since.elapsed().as_secs_f64()
                );
                let _ = running.child.kill();
                let _ = running.child.wait();
            } else {
                eprintln!(
                    "local_kubelet: {name}: exited {:.1} s after SIGTERM",
                    since.elapsed().as_secs_f64()
                );
            }
            self.running.remove(uid);
        }
        let _ = std::fs::remove_dir_all(self.args.log_dir.join("volumes").join(uid));
        let params = DeleteParams {
            grace_period_seconds: Some(0),
            preconditions: Some(Preconditions {
                uid: Some(uid.to_string()),
                resource_version: None,
            }),
            ..DeleteParams::default()
        };
        if let Err(e) = self.pods.delete(&name, &params).await
            && !matches!(&e, kube::Error::Api(s) if s.code == 404 || s.code == 409)
        {
            eprintln!("local_kubelet: {name}: removing the Pod: {e}");
        }
    }

    /// Rewrites the file_sd file when the running Pods changed: one target per Pod with a
    /// `metrics` port, terminating ones included (they still work and report).
    fn write_targets(&mut self) {
        let Some(path) = self.args.pod_targets.clone() else {
            return;
        };
        let mut targets: Vec<_> = self
            .running
            .values()
            .filter_map(|r| r.target.clone())
            .map(|(target, labels)| json!({"targets": [target], "labels": labels}))
            .collect();
        targets.sort_by_key(|t| t["targets"][0].as_str().unwrap_or_default().to_string());
        let text = serde_json::Value::Array(targets).to_string();
        if text == self.written_targets {
            return;
        }
        // Written aside and renamed, so Prometheus never reads half a file.
        let aside = path.with_extension("json.tmp");
        match std::fs::write(&aside, &text).and_then(|()| std::fs::rename(&aside, &path)) {
            Ok(()) => self.written_targets = text,
            Err(e) => eprintln!("local_kubelet: writing {}: {e}", path.display()),
        }
    }

    /// SIGTERM to every worker, then SIGKILL to any still there after the grace period. The
    /// Pods stay: the demo's control plane goes down next.
    fn stop_everything(&mut self) {
        eprintln!("local_kubelet: stopping {} workers", self.running.len());
        for running in self.running.values() {
            // SAFETY: kill(2) on a child we started and have not reaped.
            unsafe { libc::kill(running.child.id() as i32, libc::SIGTERM) };
        }
        let deadline = Instant::now() + SHUTDOWN_GRACE;
        while Instant::now() < deadline {
            self.running
                .retain(|_, r| matches!(r.child.try_wait(), Ok(None)));
            if self.running.is_empty() {
                return;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        for running in self.running.values_mut() {
            let _ = running.child.kill();
            let _ = running.child.wait();
        }
    }
}

/// The Pod's grace period: what the deletion set, else its spec, else 30 s.
fn grace(pod: &Pod) -> Duration {
    pod.metadata
        .deletion_grace_period_seconds
        .or_else(|| pod.spec.as_ref()?.termination_grace_period_seconds)
        .map_or(DEFAULT_GRACE, |s| Duration::from_secs(s.max(0) as u64))
}

/// The container port named `metrics`.
fn metrics_port(container: &Container) -> Option<i32> {
    container
        .ports
        .iter()
        .flatten()
        .find(|p| p.name.as_deref() == Some("metrics"))
        .map(|p| p.container_port)
}

/// Makes `dir` hold exactly `files`, each written beside and renamed over the last.
fn write_files(dir: &Path, files: &[(String, Vec<u8>)]) -> std::io::Result<()> {
    std::fs::create_dir_all(dir)?;
    for entry in std::fs::read_dir(dir)? {
        let entry = entry?;
        let name = entry.file_name().to_string_lossy().to_string();
        if !files.iter().any(|(file, _)| *file == name) {
            std::fs::remove_file(entry.path())?;
        }
    }
    for (file, bytes) in files {
        // A key or item path is a file name here: nothing may be written outside `dir`.
        if file.contains('/') || file.starts_with('.') {
            continue;
        }
        let path = dir.join(file);
        if std::fs::read(&path).is_ok_and(|old| old == *bytes) {
            continue;
        }
        let new = dir.join(format!(".{file}.new"));
        std::fs::write(&new, bytes)?;
        std::fs::rename(&new, &path)?;
    }
    Ok(())
}

/// The container's env as the kubelet builds it: in order, `$(VAR)` expanded from the vars
/// before it, `fieldRef`s from the Pod; `HOSTNAME` is the Pod's name.
fn pod_env(pod: &Pod, container: &Container, ip: &str, node: &str) -> Vec<(String, String)> {
    let mut env: Vec<(String, String)> = vec![("HOSTNAME".into(), pod.name_any())];
    for var in container.env.iter().flatten() {
        let value = if let Some(value) = &var.value {
            expand(value, &env)
        } else if let Some(field) = var.value_from.as_ref().and_then(|f| f.field_ref.as_ref()) {
            match field.field_path.as_str() {
                "metadata.name" => pod.name_any(),
                "metadata.namespace" => pod.namespace().unwrap_or_default(),
                "metadata.uid" => pod.uid().unwrap_or_default(),
                "status.podIP" => ip.to_string(),
                "status.hostIP" => "127.0.0.1".to_string(),
                "spec.nodeName" => node.to_string(),
                other => {
                    eprintln!(
                        "local_kubelet: {}: fieldRef {other} is not supported",
                        pod.name_any()
                    );
                    continue;
                }
            }
        } else {
            continue;
        };
        env.retain(|(name, _)| *name != var.name);
        env.push((var.name.clone(), value));
    }
    env
}

/// `$(NAME)` replaced by NAME's value when it is defined; left as it is otherwise, as the
/// kubelet does.
fn expand(value: &str, env: &[(String, String)]) -> String {
    let mut out = String::new();
    let mut rest = value;
    while let Some(start) = rest.find("$(") {
        out.push_str(&rest[..start]);
        let after = &rest[start + 2..];
        match after.find(')') {
            Some(end) => {
                let name = &after[..end];
                match env.iter().rev().find(|(n, _)| n == name) {
                    Some((_, v)) => out.push_str(v),
                    None => out.push_str(&rest[start..start + 3 + end]),
                }
                rest = &after[end + 1..];
            }
            None => {
                out.push_str(&rest[start..]);
                rest = "";
            }
        }
    }
    out.push_str(rest);
    out
}

/// The program and arguments to run for `container`: its `command` and `args`, `$(VAR)`
/// expanded as the kubelet does; the lane worker when it sets no `command` (the example worker's
/// image has it as its entrypoint).
fn container_command(
    worker: &Path,
    container: &Container,
    env: &[(String, String)],
) -> (PathBuf, Vec<String>) {
    let expanded = |words: &Option<Vec<String>>| -> Vec<String> {
        words.iter().flatten().map(|w| expand(w, env)).collect()
    };
    let mut command = expanded(&container.command);
    if command.is_empty() {
        return (worker.to_path_buf(), expanded(&container.args));
    }
    let program = PathBuf::from(command.remove(0));
    command.extend(expanded(&container.args));
    (program, command)
}

fn start_worker(
    worker: &Path,
    pod: &str,
    container: &Container,
    env: &[(String, String)],
    args: &Args,
) -> std::io::Result<Child> {
    // <deployment>-<replicaset hash>-<suffix>: one log file per Deployment.
    let deployment = pod.rsplitn(3, '-').nth(2).unwrap_or(pod);
    let log = log_file(&args.log_dir.join(format!("{deployment}.log")))?;
    let (program, program_args) = container_command(worker, container, env);
    let mut command = Command::new(program);
    command.args(program_args).env_clear();
    // A container's image brings its own PATH; here the programs are this machine's, so a
    // command like `lanepool-rq-worker` is found where the kubelet's own PATH finds it (a
    // Pod's env may set PATH itself, and then wins).
    if let Some(path) = std::env::var_os("PATH") {
        command.env("PATH", path);
    }
    if let Some(dir) = container.working_dir.as_deref() {
        command.current_dir(dir);
    }
    command
        .env("LANEPOOL_QUEUE_URL", &args.queue_url)
        .envs(env.iter().map(|(k, v)| (k.as_str(), v.as_str())))
        .stdin(Stdio::null())
        .stdout(log.try_clone()?)
        .stderr(log)
        // Its own process group: a Ctrl-C in the terminal reaches this kubelet, which stops the
        // workers in order, rather than every worker at once.
        .process_group(0);
    // SAFETY: prctl is async-signal-safe and touches no memory of the parent.
    unsafe {
        command.pre_exec(|| {
            if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
    command.spawn()
}

fn log_file(path: &Path) -> std::io::Result<File> {
    // Append: each worker writes whole lines, so the Deployment's workers share one file.
    OpenOptions::new().create(true).append(true).open(path)
}

#[cfg(test)]
mod tests {
    use super::{container_command, expand};
    use k8s_openapi::api::core::v1::Container;
    use std::path::Path;

    #[test]
    fn a_container_with_a_command_runs_it_with_its_args_and_one_without_runs_the_lane_worker() {
        let env = [("LANEPOOL_LANES".to_string(), "urgent".to_string())];
        let worker = Path::new("/bin/lane_worker");
        let rq = Container {
            command: Some(vec!["lanepool-rq-worker".into(), "--url".into()]),
            args: Some(vec![
                "redis://127.0.0.1:6379".into(),
                "$(LANEPOOL_LANES)".into(),
            ]),
            ..Container::default()
        };
        let (program, args) = container_command(worker, &rq, &env);
        assert_eq!(program, Path::new("lanepool-rq-worker"));
        assert_eq!(args, ["--url", "redis://127.0.0.1:6379", "urgent"]);
        let plain = Container {
            args: Some(vec!["--flag".into()]),
            ..Container::default()
        };
        assert_eq!(
            container_command(worker, &plain, &env),
            (worker.to_path_buf(), vec!["--flag".to_string()])
        );
    }

    #[test]
    fn references_to_earlier_vars_are_expanded_and_unknown_ones_kept() {
        let env = [("POD_IP".to_string(), "127.1.0.2".to_string())];
        assert_eq!(expand("$(POD_IP):9100", &env), "127.1.0.2:9100");
        assert_eq!(expand("$(NOPE):1", &env), "$(NOPE):1");
        assert_eq!(expand("plain", &env), "plain");
    }
}
