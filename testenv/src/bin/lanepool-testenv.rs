//! `lanepool-testenv`: leaves a local control plane (etcd, kube-apiserver with the LanePool CRD,
//! kube-controller-manager), Prometheus and, when asked, Redis running for a person or the demo,
//! and stops them again. Used by
//! tests/cluster/up.sh and down.sh.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::Duration;

use clap::{Parser, Subcommand};
use lanepool_testenv::{
    ControlPlane, Controllers, Lifetime, TestPrometheus, TestRedis, process_alive, terminate_pid,
};

#[derive(Parser)]
#[command(name = "lanepool-testenv", about)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Start etcd, kube-apiserver, kube-controller-manager and Prometheus in DIR and leave them
    /// running.
    Up {
        /// Where certificates, data, logs, the kubeconfig and the pid file go.
        #[arg(long, default_value = "target/cluster")]
        dir: PathBuf,
        /// A host:port Prometheus scrapes every second (repeatable).
        #[arg(long = "scrape", value_name = "HOST:PORT")]
        scrape: Vec<SocketAddr>,
        /// Run no kube-controller-manager: Deployments stay Deployments, nothing makes Pods.
        #[arg(long)]
        no_controller_manager: bool,
        /// Also start Redis (Debian's redis-server) on 127.0.0.1 at this port, exported as
        /// REDIS_URL: the broker of the Python workers.
        #[arg(long, value_name = "PORT")]
        redis: Option<u16>,
    },
    /// Start a Prometheus in DIR holding a recorded synthetic day of the pool NAMESPACE/jobs
    /// (testenv's `synthetic_day`), ending at the last whole hour, for `lanepool replay`; leave
    /// it running (stop it with `down`).
    History {
        #[arg(long, default_value = "target/replay-history")]
        dir: PathBuf,
        #[arg(long, default_value = "replay")]
        namespace: String,
    },
    /// Stop what `up` or `history` started in DIR.
    Down {
        #[arg(long, default_value = "target/cluster")]
        dir: PathBuf,
    },
}

#[tokio::main(flavor = "current_thread")]
async fn main() -> ExitCode {
    let result = match Cli::parse().command {
        Command::Up {
            dir,
            scrape,
            no_controller_manager,
            redis,
        } => {
            let controllers = if no_controller_manager {
                Controllers::None
            } else {
                Controllers::Pods
            };
            up(&dir, &scrape, controllers, redis).await
        }
        Command::History { dir, namespace } => history(&dir, &namespace),
        Command::Down { dir } => down(&dir),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(message) => {
            eprintln!("error: {message}");
            ExitCode::FAILURE
        }
    }
}

async fn up(
    dir: &Path,
    scrape: &[SocketAddr],
    controllers: Controllers,
    redis_port: Option<u16>,
) -> Result<(), String> {
    if pids(dir).iter().any(|pid| process_alive(*pid)) {
        return Err(format!(
            "a control plane is already running in {}: run down first",
            dir.display()
        ));
    }
    let _ = std::fs::remove_dir_all(dir);
    let dir = std::path::absolute(dir).map_err(|e| e.to_string())?;
    let plane = ControlPlane::start_in(&dir.join("control-plane"), Lifetime::Detached, controllers)
        .await
        .map_err(|e| e.to_string())?;
    let prometheus = TestPrometheus::start_in(&dir.join("prometheus"), scrape, Lifetime::Detached)
        .map_err(|e| e.to_string())?;
    let redis = redis_port
        .map(|port| TestRedis::start_on(&dir.join("redis"), port, Lifetime::Detached))
        .transpose()
        .map_err(|e| e.to_string())?;
    let mut all: Vec<u32> = plane.pids();
    all.extend(prometheus.pid());
    all.extend(redis.as_ref().and_then(TestRedis::pid));
    std::fs::write(
        dir.join("pids"),
        all.iter().map(|p| format!("{p}\n")).collect::<String>(),
    )
    .map_err(|e| e.to_string())?;
    let mut env = format!(
        "export KUBECONFIG={}\nexport PROMETHEUS_URL={}\nexport LANEPOOL_POD_TARGETS={}\n",
        plane.kubeconfig().display(),
        prometheus.url(),
        prometheus.pod_targets().display()
    );
    if let Some(redis) = &redis {
        env.push_str(&format!("export REDIS_URL={}\n", redis.url()));
    }
    std::fs::write(dir.join("env"), &env).map_err(|e| e.to_string())?;
    eprintln!(
        "control plane up in {:.1} s (logs in {})",
        plane.startup.as_secs_f64(),
        dir.display()
    );
    print!("{env}");
    plane.detach();
    prometheus.detach();
    if let Some(redis) = redis {
        redis.detach();
    }
    Ok(())
}

fn history(dir: &Path, namespace: &str) -> Result<(), String> {
    if pids(dir).iter().any(|pid| process_alive(*pid)) {
        return Err(format!(
            "a Prometheus is already running in {}: run down first",
            dir.display()
        ));
    }
    let _ = std::fs::remove_dir_all(dir);
    let dir = std::path::absolute(dir).map_err(|e| e.to_string())?;
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_err(|e| e.to_string())?
        .as_secs() as i64;
    let end = now / 3600 * 3600;
    let recording = lanepool_testenv::synthetic_day(namespace, "jobs", end);
    let prometheus = TestPrometheus::start_on_history_in(&recording, &dir, Lifetime::Detached)
        .map_err(|e| e.to_string())?;
    std::fs::write(
        dir.join("pids"),
        prometheus
            .pid()
            .map(|p| format!("{p}\n"))
            .unwrap_or_default(),
    )
    .map_err(|e| e.to_string())?;
    println!("export PROMETHEUS_URL={}", prometheus.url());
    println!("export HISTORY_END={end}");
    prometheus.detach();
    Ok(())
}

fn down(dir: &Path) -> Result<(), String> {
    let pids = pids(dir);
    if pids.is_empty() {
        eprintln!("nothing is running in {}", dir.display());
    }
    for pid in pids {
        terminate_pid(pid, Duration::from_secs(10));
    }
    Ok(())
}

fn pids(dir: &Path) -> Vec<u32> {
    std::fs::read_to_string(dir.join("pids"))
        .unwrap_or_default()
        .lines()
        .filter_map(|l| l.trim().parse().ok())
        .collect()
}
