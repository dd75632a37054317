//! A real Prometheus (Debian's package) scraping given targets every second, and the worker Pods
//! a process kubelet lists in its file_sd file ([`TestPrometheus::pod_targets`]) every 15 s, as
//! a cluster's Prometheus commonly scrapes pods (`LANEPOOL_POD_SCRAPE_INTERVAL` changes it), with
//! its own data directory and port. It can be stopped and started again on the same port, so tests can prove
//! what the operator does while Prometheus is down.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use super::process::{Lifetime, Process};
use super::{Result, TestEnvError, free_port, io};

const READY_TIMEOUT: Duration = Duration::from_secs(30);
/// The file_sd file of worker Pods, in Prometheus's directory.
const POD_TARGETS: &str = "pod-targets.json";
/// How often the worker Pods are scraped, unless `LANEPOOL_POD_SCRAPE_INTERVAL` says otherwise: a
/// common interval for a cluster's pod monitors (kube-prometheus uses 30 s), not the 1 s of the
/// queue's metrics here, so what the operator reads of a Pod is as old as it would be there.
const POD_SCRAPE_INTERVAL: &str = "15s";

/// A Prometheus server on 127.0.0.1.
pub struct TestPrometheus {
    process: Option<Process>,
    args: Vec<String>,
    dir: PathBuf,
    port: u16,
    lifetime: Lifetime,
    _temp: Option<tempfile::TempDir>,
}

impl TestPrometheus {
    /// Starts Prometheus in a temporary directory, scraping `targets` every second.
    pub fn start(targets: &[SocketAddr]) -> Result<Self> {
        let temp = tempfile::Builder::new()
            .prefix("lanepool-prometheus-")
            .tempdir()
            .map_err(io("creating a temporary directory"))?;
        let mut prometheus = Self::start_in(temp.path(), targets, Lifetime::Process)?;
        prometheus._temp = Some(temp);
        Ok(prometheus)
    }

    /// Starts Prometheus with its data and configuration in `dir`.
    pub fn start_in(dir: &Path, targets: &[SocketAddr], lifetime: Lifetime) -> Result<Self> {
        std::fs::create_dir_all(dir).map_err(io(format!("creating {}", dir.display())))?;
        let config = dir.join("prometheus.yml");
        let targets: Vec<String> = targets.iter().map(|t| format!("\"{t}\"")).collect();
        // Pods carry their namespace, pool and pod as target labels, as the README's relabelling
        // gives them in a cluster; a worker's own labels never override those.
        let pod_targets = dir.join(POD_TARGETS);
        std::fs::write(&pod_targets, "[]\n").map_err(io("writing the pod targets file"))?;
        std::fs::write(
            &config,
            format!(
                "global:\n  scrape_interval: 1s\n  evaluation_interval: 1s\n\
                 scrape_configs:\n- job_name: workers\n  honor_labels: true\n  \
                 static_configs:\n  - targets: [{}]\n\
                 - job_name: pods\n  scrape_interval: {}\n  file_sd_configs:\n  \
                 - files: [\"{}\"]\n    refresh_interval: 1s\n",
                targets.join(", "),
                std::env::var("LANEPOOL_POD_SCRAPE_INTERVAL")
                    .ok()
                    .filter(|i| !i.is_empty())
                    .unwrap_or_else(|| POD_SCRAPE_INTERVAL.into()),
                pod_targets.display()
            ),
        )
        .map_err(io("writing prometheus.yml"))?;
        let port = free_port()?;
        let args = vec![
            format!("--config.file={}", config.display()),
            format!("--storage.tsdb.path={}", dir.join("data").display()),
            format!("--web.listen-address=127.0.0.1:{port}"),
            "--log.level=warn".into(),
        ];
        let mut prometheus = Self {
            process: None,
            args,
            dir: dir.to_path_buf(),
            port,
            lifetime,
            _temp: None,
        };
        prometheus.resume()?;
        Ok(prometheus)
    }

    /// Its base URL, such as http://127.0.0.1:41234.
    pub fn url(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    /// The file_sd file Prometheus reads worker Pods from (JSON, rewritten whole), scraped
    /// every second as the job `pods`.
    pub fn pod_targets(&self) -> PathBuf {
        self.dir.join(POD_TARGETS)
    }

    /// Its pid, while it runs.
    pub fn pid(&self) -> Option<u32> {
        self.process.as_ref().map(|p| p.child.id())
    }

    /// Stops Prometheus; its port and data stay for [`Self::resume`].
    pub fn stop(&mut self) {
        if let Some(mut process) = self.process.take() {
            process.stop(Duration::from_secs(10));
        }
    }

    /// Starts Prometheus again on the same port and data, and waits until it is ready.
    pub fn resume(&mut self) -> Result<()> {
        let program = which("prometheus").ok_or_else(|| TestEnvError::ToolMissing {
            tool: "prometheus".into(),
            path: PathBuf::from("/usr/bin/prometheus"),
        })?;
        let process = Process::start(
            "prometheus",
            &program,
            &self.args,
            self.dir.join("prometheus.log"),
            self.lifetime,
        )?;
        self.process = Some(process);
        self.wait_ready()
    }

    /// Lets Prometheus go on running after this value is dropped.
    pub fn detach(mut self) {
        if let Some(process) = self.process.take() {
            std::mem::forget(process);
        }
    }

    fn wait_ready(&mut self) -> Result<()> {
        let deadline = Instant::now() + READY_TIMEOUT;
        let addr = SocketAddr::from(([127, 0, 0, 1], self.port));
        loop {
            if http_get(addr, "/-/ready").is_ok_and(|(status, _)| status == 200) {
                return Ok(());
            }
            let process = self.process.as_mut().expect("resume sets the process");
            if process.exited() || Instant::now() > deadline {
                return Err(TestEnvError::NotReady {
                    what: "prometheus".into(),
                    seconds: READY_TIMEOUT.as_secs(),
                    log: process.log_tail(),
                });
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }
}

/// A bare HTTP/1.0 GET, enough for readiness checks without pulling in a client.
pub fn http_get(addr: SocketAddr, path: &str) -> std::io::Result<(u16, String)> {
    let mut stream = TcpStream::connect_timeout(&addr, Duration::from_secs(1))?;
    stream.set_read_timeout(Some(Duration::from_secs(2)))?;
    write!(stream, "GET {path} HTTP/1.0\r\nHost: {addr}\r\n\r\n")?;
    let mut response = String::new();
    stream.read_to_string(&mut response)?;
    let status = response
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or(0);
    let body = response
        .split_once("\r\n\r\n")
        .map_or(String::new(), |(_, b)| b.to_string());
    Ok((status, body))
}

fn which(program: &str) -> Option<PathBuf> {
    std::env::var_os("PATH").and_then(|paths| {
        std::env::split_paths(&paths)
            .map(|dir| dir.join(program))
            .find(|candidate| candidate.is_file())
    })
}
