//! A real Prometheus (Debian's package) scraping given targets every second, and the worker Pods
//! a process kubelet lists in its file_sd file ([`TestPrometheus::pod_targets`]) every 15 s, as
//! a cluster's Prometheus commonly scrapes pods (`LANEPOOL_POD_SCRAPE_INTERVAL` changes it), with
//! its own data directory and port. It can be stopped and started again on the same port, so tests
//! can prove what the operator does while Prometheus is down. [`TestPrometheus::start_guarded`]
//! serves its API over TLS only, behind basic auth or client certificates, from Prometheus's own
//! web config (`--web.config.file`), the way a managed Prometheus guards it.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::certs::{TlsMaterial, tls_material};
use super::process::{Lifetime, Process, which};
use crate::error::{Result, TestEnvError, io};
use crate::tools::tool;
use crate::wait::free_port;

const READY_TIMEOUT: Duration = Duration::from_secs(30);
/// The file_sd file of worker Pods, in Prometheus's directory.
const POD_TARGETS: &str = "pod-targets.json";
/// How often the worker Pods are scraped, unless `LANEPOOL_POD_SCRAPE_INTERVAL` says otherwise: a
/// common interval for a cluster's pod monitors (kube-prometheus uses 30 s), not the 1 s of the
/// queue's metrics here, so what the operator reads of a Pod is as old as it would be there.
const POD_SCRAPE_INTERVAL: &str = "15s";

/// The username a [`Guard::BasicAuth`] Prometheus accepts.
pub const BASIC_AUTH_USERNAME: &str = "lanepool";
/// Its password.
pub const BASIC_AUTH_PASSWORD: &str = "lanepool-test-password";
/// [`BASIC_AUTH_PASSWORD`] as the web config holds it: bcrypt at cost 4 (the lowest, so each
/// check is quick), made with `python3 -c 'import crypt; print(crypt.crypt(PASSWORD,
/// crypt.mksalt(crypt.METHOD_BLOWFISH, rounds=16)))'`.
const BASIC_AUTH_BCRYPT: &str = "$2b$04$3eeO8NX9DKNZUjBwx2K3DOD.ZYH2kxr3B7p5pSZa.zBs8iQ/GtO96";

/// What a Prometheus started with [`TestPrometheus::start_guarded`] asks of every request, on
/// top of TLS with a certificate of its own CA.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Guard {
    /// HTTP basic auth as [`BASIC_AUTH_USERNAME`] with [`BASIC_AUTH_PASSWORD`].
    BasicAuth,
    /// A client certificate its CA signed (`RequireAndVerifyClientCert`).
    ClientCertificate,
}

/// The TLS side of a guarded Prometheus.
struct Tls {
    guard: Guard,
    material: TlsMaterial,
    /// Its `--web.config.file`.
    web_config: PathBuf,
}

/// A Prometheus server on 127.0.0.1.
pub struct TestPrometheus {
    process: Option<Process>,
    args: Vec<String>,
    dir: PathBuf,
    port: u16,
    lifetime: Lifetime,
    tls: Option<Tls>,
    /// The pinned build, or `None` for Debian's on the PATH.
    program: Option<PathBuf>,
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

    /// Starts Prometheus in a temporary directory, scraping `targets` every second, with its API
    /// served over TLS only and `guard` asked of every request ([`Self::ca_pem`] signs its
    /// certificate, for 127.0.0.1 and localhost).
    pub fn start_guarded(targets: &[SocketAddr], guard: Guard) -> Result<Self> {
        let temp = tempfile::Builder::new()
            .prefix("lanepool-prometheus-")
            .tempdir()
            .map_err(io("creating a temporary directory"))?;
        let material = tls_material("lanepool-test-prometheus")?;
        let files = [
            ("ca.crt", &material.ca_pem),
            ("server.crt", &material.serving_cert_pem),
            ("server.key", &material.serving_key_pem),
        ];
        for (name, pem) in files {
            std::fs::write(temp.path().join(name), pem).map_err(io(format!("writing {name}")))?;
        }
        let file = |name: &str| temp.path().join(name).display().to_string();
        let mut web = format!(
            "tls_server_config:\n  cert_file: {}\n  key_file: {}\n",
            file("server.crt"),
            file("server.key")
        );
        match guard {
            Guard::ClientCertificate => web.push_str(&format!(
                "  client_auth_type: RequireAndVerifyClientCert\n  client_ca_file: {}\n",
                file("ca.crt")
            )),
            Guard::BasicAuth => web.push_str(&format!(
                "basic_auth_users:\n  {BASIC_AUTH_USERNAME}: {BASIC_AUTH_BCRYPT}\n"
            )),
        }
        let web_config = temp.path().join("web.yml");
        std::fs::write(&web_config, web).map_err(io("writing web.yml"))?;
        let tls = Tls {
            guard,
            material,
            web_config,
        };
        let mut prometheus = Self::configured(
            temp.path(),
            "workers",
            targets,
            "",
            Lifetime::Process,
            Some(tls),
        )?;
        prometheus._temp = Some(temp);
        Ok(prometheus)
    }

    /// Starts Prometheus in a temporary directory, scraping `targets` every second as the job
    /// `job` and evaluating the rules file `rules` (YAML) every second.
    pub fn start_with_rules(job: &str, targets: &[SocketAddr], rules: &str) -> Result<Self> {
        let temp = tempfile::Builder::new()
            .prefix("lanepool-prometheus-")
            .tempdir()
            .map_err(io("creating a temporary directory"))?;
        let file = temp.path().join("rules.yml");
        std::fs::write(&file, rules).map_err(io("writing rules.yml"))?;
        let extra = format!("rule_files: [\"{}\"]\n", file.display());
        let mut prometheus =
            Self::configured(temp.path(), job, targets, &extra, Lifetime::Process, None)?;
        prometheus._temp = Some(temp);
        Ok(prometheus)
    }

    /// Starts the pinned Prometheus (`target/tools/prometheus`, built with Kubernetes service
    /// discovery, which Debian's leaves out) in a temporary directory with `scrape_configs`
    /// (the YAML list under `scrape_configs:`, each job scraping every second unless it says
    /// otherwise), listening on every address, so the Pods of a real node reach it at the
    /// host's.
    pub fn start_scraping(scrape_configs: &str) -> Result<Self> {
        let temp = tempfile::Builder::new()
            .prefix("lanepool-prometheus-")
            .tempdir()
            .map_err(io("creating a temporary directory"))?;
        let dir = temp.path();
        let config = dir.join("prometheus.yml");
        std::fs::write(
            &config,
            format!(
                "global:\n  scrape_interval: 1s\n  evaluation_interval: 1s\n\
                 scrape_configs:\n{scrape_configs}"
            ),
        )
        .map_err(io("writing prometheus.yml"))?;
        let port = free_port()?;
        let mut prometheus = Self {
            process: None,
            args: vec![
                format!("--config.file={}", config.display()),
                format!("--storage.tsdb.path={}", dir.join("data").display()),
                format!("--web.listen-address=0.0.0.0:{port}"),
                "--log.level=warn".into(),
            ],
            dir: dir.to_path_buf(),
            port,
            lifetime: Lifetime::Process,
            tls: None,
            program: Some(tool("prometheus")?),
            _temp: Some(temp),
        };
        prometheus.resume()?;
        Ok(prometheus)
    }

    /// Its port.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// Starts Prometheus with its data and configuration in `dir`.
    pub fn start_in(dir: &Path, targets: &[SocketAddr], lifetime: Lifetime) -> Result<Self> {
        Self::configured(dir, "workers", targets, "", lifetime, None)
    }

    /// Starts Prometheus in `dir`, scraping `targets` as `job`, with `extra` top-level config,
    /// and with `tls` its web config.
    fn configured(
        dir: &Path,
        job: &str,
        targets: &[SocketAddr],
        extra: &str,
        lifetime: Lifetime,
        tls: Option<Tls>,
    ) -> Result<Self> {
        std::fs::create_dir_all(dir).map_err(io(format!("creating {}", dir.display())))?;
        let config = dir.join("prometheus.yml");
        let targets: Vec<String> = targets.iter().map(|t| format!("\"{t}\"")).collect();
        // Pods carry their namespace, pool and pod as target labels, as the job of
        // examples/prometheus/scrape-config.yaml gives them in a cluster; a worker's own labels
        // never override those.
        let pod_targets = dir.join(POD_TARGETS);
        std::fs::write(&pod_targets, "[]\n").map_err(io("writing the pod targets file"))?;
        std::fs::write(
            &config,
            format!(
                "global:\n  scrape_interval: 1s\n  evaluation_interval: 1s\n{extra}\
                 scrape_configs:\n- job_name: {job}\n  honor_labels: true\n  \
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
        let mut args = vec![
            format!("--config.file={}", config.display()),
            format!("--storage.tsdb.path={}", dir.join("data").display()),
            format!("--web.listen-address=127.0.0.1:{port}"),
            "--log.level=warn".into(),
        ];
        if let Some(tls) = &tls {
            args.push(format!("--web.config.file={}", tls.web_config.display()));
        }
        let mut prometheus = Self {
            process: None,
            args,
            dir: dir.to_path_buf(),
            port,
            lifetime,
            tls,
            program: None,
            _temp: None,
        };
        prometheus.resume()?;
        Ok(prometheus)
    }

    /// Keeps `temp` (its data directory) as long as this Prometheus.
    pub(crate) fn keep_dir(&mut self, temp: tempfile::TempDir) {
        self._temp = Some(temp);
    }

    /// Its base URL, such as http://127.0.0.1:41234 (https:// when guarded).
    pub fn url(&self) -> String {
        let scheme = if self.tls.is_some() { "https" } else { "http" };
        format!("{scheme}://127.0.0.1:{}", self.port)
    }

    /// The PEM CA that signs a guarded Prometheus's certificate (and the client certificate).
    pub fn ca_pem(&self) -> Option<&str> {
        self.tls.as_ref().map(|tls| tls.material.ca_pem.as_str())
    }

    /// A PEM client certificate and key that a [`Guard::ClientCertificate`] Prometheus accepts.
    pub fn client_certificate(&self) -> Option<(&str, &str)> {
        self.tls.as_ref().map(|tls| {
            (
                tls.material.client_cert_pem.as_str(),
                tls.material.client_key_pem.as_str(),
            )
        })
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
        let program = match &self.program {
            Some(pinned) => pinned.clone(),
            None => which("prometheus").ok_or_else(|| TestEnvError::ToolMissing {
                tool: "prometheus".into(),
                path: PathBuf::from("/usr/bin/prometheus"),
            })?,
        };
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
            let ready = match &self.tls {
                None => http_get(addr, "/-/ready"),
                Some(tls) => https_get(addr, "/-/ready", tls),
            };
            if ready.is_ok_and(|(status, _)| status == 200) {
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
    get(&mut stream, addr, path, "")
}

/// The same over TLS, trusting the guarded Prometheus's CA and passing its guard.
fn https_get(addr: SocketAddr, path: &str, tls: &Tls) -> std::io::Result<(u16, String)> {
    let failed = |e: rustls::Error| std::io::Error::other(e.to_string());
    let provider = Arc::new(rustls::crypto::aws_lc_rs::default_provider());
    let mut roots = rustls::RootCertStore::empty();
    roots.add(tls.material.ca_der.clone()).map_err(failed)?;
    let config = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(failed)?
        .with_root_certificates(roots);
    let (config, authorization) = match tls.guard {
        Guard::ClientCertificate => {
            let config = config
                .with_client_auth_cert(
                    vec![tls.material.client_cert_der.clone()],
                    tls.material.client_key_der.clone_key().into(),
                )
                .map_err(failed)?;
            (config, String::new())
        }
        Guard::BasicAuth => {
            use base64::Engine as _;
            let credentials = base64::engine::general_purpose::STANDARD
                .encode(format!("{BASIC_AUTH_USERNAME}:{BASIC_AUTH_PASSWORD}"));
            let header = format!("Authorization: Basic {credentials}\r\n");
            (config.with_no_client_auth(), header)
        }
    };
    let name = rustls::pki_types::ServerName::IpAddress(addr.ip().into());
    let connection = rustls::ClientConnection::new(Arc::new(config), name).map_err(failed)?;
    let tcp = TcpStream::connect_timeout(&addr, Duration::from_secs(1))?;
    tcp.set_read_timeout(Some(Duration::from_secs(2)))?;
    let mut stream = rustls::StreamOwned::new(connection, tcp);
    get(&mut stream, addr, path, &authorization)
}

/// Sends a GET with `headers` (each ending in CRLF) and reads the whole answer.
fn get(
    stream: &mut (impl Read + Write),
    addr: SocketAddr,
    path: &str,
    headers: &str,
) -> std::io::Result<(u16, String)> {
    request(stream, "GET", addr, path, headers)
}

/// `POST {path}` at `addr` over plain HTTP with `headers` (each ending in `\r\n`) and no body:
/// the status and the body of the answer.
pub fn http_post(addr: SocketAddr, path: &str, headers: &str) -> std::io::Result<(u16, String)> {
    let mut stream = TcpStream::connect_timeout(&addr, Duration::from_secs(1))?;
    stream.set_read_timeout(Some(Duration::from_secs(2)))?;
    request(
        &mut stream,
        "POST",
        addr,
        path,
        &format!("{headers}Content-Length: 0\r\n"),
    )
}

fn request(
    stream: &mut (impl Read + Write),
    method: &str,
    addr: SocketAddr,
    path: &str,
    headers: &str,
) -> std::io::Result<(u16, String)> {
    write!(
        stream,
        "{method} {path} HTTP/1.0\r\nHost: {addr}\r\n{headers}\r\n"
    )?;
    stream.flush()?;
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
