//! Stands in for the kubelet in the demo, whose control plane has none: every 500 ms it lists the
//! Deployments labelled `lanepool.dev/pool` in a namespace and keeps exactly `spec.replicas` local
//! processes of the lane worker running for each, with the env of the first container
//! (`LANEPOOL_LANES`, `LANEPOOL_ROLE`, `LANEPOOL_POOL`, `LANEPOOL_QUEUE_URL`…). Scaling down
//! sends SIGTERM, so a worker finishes its job first. Its workers never outlive it: stopped on
//! SIGTERM/Ctrl-C, killed by the kernel if it dies.
//!
//!     cargo run --example local_kubelet -- --namespace demo \
//!         --queue-url http://127.0.0.1:9464 --log-dir target/demo/workers

use std::collections::BTreeMap;
use std::fs::{File, OpenOptions};
use std::os::unix::process::CommandExt;
use std::path::PathBuf;
use std::process::{Child, Command, ExitCode, Stdio};
use std::time::{Duration, Instant};

use clap::Parser;
use k8s_openapi::api::apps::v1::Deployment;
use kube::api::{Api, ListParams, Patch, PatchParams};
use kube::{Client, ResourceExt};

const POOL_LABEL: &str = "lanepool.dev/pool";
/// How long a stopping worker may take before SIGKILL: its job plus the report, with room.
const STOP_GRACE: Duration = Duration::from_secs(10);

/// Runs the lane workers of lanepool's Deployments as local processes.
#[derive(Parser)]
struct Args {
    /// Namespace of the Deployments.
    #[arg(long, default_value = "demo")]
    namespace: String,
    /// LANEPOOL_QUEUE_URL for workers whose pod template does not set it.
    #[arg(long, default_value = "http://127.0.0.1:9464")]
    queue_url: String,
    /// The worker program; by default `lane_worker` beside this program.
    #[arg(long)]
    worker: Option<PathBuf>,
    /// Where each Deployment's workers append their output, one file per Deployment.
    #[arg(long, default_value = "target/demo/workers")]
    log_dir: PathBuf,
    /// How often to list the Deployments.
    #[arg(long, default_value = "500ms", value_parser = interval)]
    interval: Duration,
}

fn interval(value: &str) -> Result<Duration, String> {
    lanepool::duration::parse(value).map_err(|e| e.to_string())
}

/// The local "pods" of one Deployment.
#[derive(Default)]
struct Workers {
    /// The env they were started with; a different one replaces them all (a rollout).
    env: Vec<(String, String)>,
    running: Vec<(String, Child)>,
    /// Sent SIGTERM, finishing their job: (name, process, SIGKILL deadline).
    stopping: Vec<(String, Child, Instant)>,
    started: u64,
    /// replicas last written to the Deployment's status.
    reported: Option<i32>,
}

struct Kubelet {
    args: Args,
    worker: PathBuf,
    api: Api<Deployment>,
    deployments: BTreeMap<String, Workers>,
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
    let mut kubelet = Kubelet {
        api: Api::namespaced(client, &args.namespace),
        worker,
        args,
        deployments: BTreeMap::new(),
    };
    eprintln!(
        "local_kubelet: running {} for the Deployments labelled {POOL_LABEL} in {}",
        kubelet.worker.display(),
        kubelet.args.namespace
    );

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

impl Kubelet {
    /// One pass: match the processes to the Deployments as they are now.
    async fn sync(&mut self) {
        let listed = match self
            .api
            .list(&ListParams::default().labels(POOL_LABEL))
            .await
        {
            Ok(list) => list.items,
            Err(e) => {
                // Keep the workers as they are: an unreachable API server is no reason to stop.
                eprintln!("local_kubelet: listing Deployments: {e}");
                return;
            }
        };
        let mut seen = Vec::new();
        for deployment in &listed {
            let name = deployment.name_any();
            let replicas = deployment
                .spec
                .as_ref()
                .and_then(|s| s.replicas)
                .unwrap_or(1)
                .max(0) as usize;
            let env = first_container_env(deployment);
            self.reconcile(&name, replicas, env);
            let generation = deployment.metadata.generation;
            self.report(&name, generation).await;
            seen.push(name);
        }
        let gone: Vec<String> = self
            .deployments
            .keys()
            .filter(|name| !seen.contains(name))
            .cloned()
            .collect();
        for name in gone {
            self.reconcile(&name, 0, Vec::new());
            if self.deployments[&name].stopping.is_empty() {
                self.deployments.remove(&name);
            }
        }
    }

    fn reconcile(&mut self, name: &str, replicas: usize, env: Vec<(String, String)>) {
        let workers = self.deployments.entry(name.to_string()).or_default();
        reap(workers, name);
        if workers.env != env && !workers.running.is_empty() {
            eprintln!("local_kubelet: {name}: the pod template changed, replacing its workers");
            let all = workers.running.len();
            stop_newest(workers, all);
        }
        workers.env = env;
        let before = workers.running.len();
        if before > replicas {
            stop_newest(workers, before - replicas);
        }
        while workers.running.len() < replicas {
            workers.started += 1;
            let pod = format!("{name}-{}", workers.started);
            match start_worker(&self.worker, &pod, &workers.env, &self.args) {
                Ok(child) => workers.running.push((pod, child)),
                Err(e) => {
                    eprintln!("local_kubelet: {name}: starting a worker: {e}");
                    break;
                }
            }
        }
        if workers.running.len() != before {
            eprintln!(
                "local_kubelet: {name}: {before} → {} workers ({} stopping)",
                workers.running.len(),
                workers.stopping.len()
            );
        }
    }

    /// Writes the running count into the Deployment's status, as a kubelet and the Deployment
    /// controller would, so `kubectl get deployments` shows the workers that really run.
    async fn report(&mut self, name: &str, generation: Option<i64>) {
        let Some(workers) = self.deployments.get_mut(name) else {
            return;
        };
        let running = i32::try_from(workers.running.len()).unwrap_or(i32::MAX);
        if workers.reported == Some(running) {
            return;
        }
        let status = serde_json::json!({"status": {
            "observedGeneration": generation,
            "replicas": running,
            "updatedReplicas": running,
            "readyReplicas": running,
            "availableReplicas": running,
        }});
        match self
            .api
            .patch_status(name, &PatchParams::default(), &Patch::Merge(&status))
            .await
        {
            Ok(_) => workers.reported = Some(running),
            Err(e) => eprintln!("local_kubelet: {name}: writing status: {e}"),
        }
    }

    /// SIGTERM to every worker, then SIGKILL to any still there after the grace period.
    fn stop_everything(&mut self) {
        let total: usize = self.deployments.values().map(|w| w.running.len()).sum();
        eprintln!("local_kubelet: stopping {total} workers");
        for workers in self.deployments.values_mut() {
            let all = workers.running.len();
            stop_newest(workers, all);
        }
        let deadline = Instant::now() + STOP_GRACE;
        while Instant::now() < deadline {
            for (name, workers) in &mut self.deployments {
                reap(workers, name);
            }
            if self.deployments.values().all(|w| w.stopping.is_empty()) {
                return;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        for workers in self.deployments.values_mut() {
            for (_, child, _) in &mut workers.stopping {
                let _ = child.kill();
                let _ = child.wait();
            }
        }
    }
}

/// The first container's plain env values (valueFrom has no meaning without a cluster).
fn first_container_env(deployment: &Deployment) -> Vec<(String, String)> {
    deployment
        .spec
        .as_ref()
        .and_then(|s| s.template.spec.as_ref())
        .and_then(|p| p.containers.first())
        .and_then(|c| c.env.as_ref())
        .map(|env| {
            env.iter()
                .filter_map(|var| var.value.clone().map(|value| (var.name.clone(), value)))
                .collect()
        })
        .unwrap_or_default()
}

fn start_worker(
    program: &std::path::Path,
    pod: &str,
    env: &[(String, String)],
    args: &Args,
) -> std::io::Result<Child> {
    let deployment = pod.rsplit_once('-').map_or(pod, |(d, _)| d);
    let log = log_file(&args.log_dir.join(format!("{deployment}.log")))?;
    let mut command = Command::new(program);
    command
        .env_clear()
        .env("LANEPOOL_QUEUE_URL", &args.queue_url)
        .envs(env.iter().map(|(k, v)| (k.as_str(), v.as_str())))
        .env("HOSTNAME", pod)
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

fn log_file(path: &std::path::Path) -> std::io::Result<File> {
    // Append: each worker writes whole lines, so the Deployment's workers share one file.
    OpenOptions::new().create(true).append(true).open(path)
}

/// SIGTERM to the `count` most recently started workers; they finish their job and exit.
fn stop_newest(workers: &mut Workers, count: usize) {
    let deadline = Instant::now() + STOP_GRACE;
    for _ in 0..count {
        let Some((name, child)) = workers.running.pop() else {
            return;
        };
        // SAFETY: kill(2) on a child we started and have not reaped, so the pid is still ours.
        unsafe { libc::kill(child.id() as i32, libc::SIGTERM) };
        workers.stopping.push((name, child, deadline));
    }
}

/// Forgets workers that exited; kills stopping ones past their deadline. A running worker that
/// exited on its own is replaced at the next pass, as a pod with `restartPolicy: Always`.
fn reap(workers: &mut Workers, deployment: &str) {
    workers
        .running
        .retain_mut(|(name, child)| match child.try_wait() {
            Ok(None) => true,
            Ok(Some(status)) => {
                eprintln!(
                    "local_kubelet: {deployment}: worker {name} exited ({status}); restarting it"
                );
                false
            }
            Err(_) => false,
        });
    let now = Instant::now();
    workers.stopping.retain_mut(|(_, child, deadline)| {
        if now > *deadline {
            let _ = child.kill();
        }
        matches!(child.try_wait(), Ok(None))
    });
}
