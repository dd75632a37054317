//! A real OCI registry (CNCF distribution's `registry`, pinned in tests/tools/registry) on
//! 127.0.0.1, plain HTTP, storing in a directory of its own: where `images/build.sh` pushes the
//! images and `helm push` the chart, and what `helm install oci://…` and a kubelet pull from. It
//! must never outlive the process that started it ([`Lifetime::Process`]).

use std::net::SocketAddr;
use std::path::Path;
use std::time::{Duration, Instant};

use super::process::{Lifetime, Process};
use crate::error::{Result, TestEnvError, io};
use crate::prometheus::http_get;
use crate::tools::tool;
use crate::wait::free_port;

const READY_TIMEOUT: Duration = Duration::from_secs(20);

/// A registry on 127.0.0.1.
pub struct TestRegistry {
    process: Option<Process>,
    port: u16,
    _temp: Option<tempfile::TempDir>,
}

impl TestRegistry {
    /// Starts a registry in a directory of its own, removed with it.
    pub fn start() -> Result<Self> {
        let temp = tempfile::Builder::new()
            .prefix("lanepool-registry-")
            .tempdir()
            .map_err(io("creating the registry's directory"))?;
        let mut registry = Self::start_in(temp.path(), free_port()?, Lifetime::Process)?;
        registry._temp = Some(temp);
        Ok(registry)
    }

    /// Starts a registry storing in `dir`, on `port`, and waits until it answers `/v2/`.
    pub fn start_in(dir: &Path, port: u16, lifetime: Lifetime) -> Result<Self> {
        std::fs::create_dir_all(dir).map_err(io(format!("creating {}", dir.display())))?;
        let config = dir.join("config.yml");
        // Deletes allowed, so a test can take an image away; no auth, no TLS: 127.0.0.1 only.
        let yaml = format!(
            "version: 0.1\n\
             log:\n  level: warn\n  accesslog:\n    disabled: true\n\
             storage:\n  filesystem:\n    rootdirectory: {}\n  delete:\n    enabled: true\n\
             http:\n  addr: 127.0.0.1:{port}\n",
            dir.join("data").display()
        );
        std::fs::write(&config, yaml).map_err(io(format!("writing {}", config.display())))?;
        let mut process = Process::start(
            "registry",
            &tool("registry")?,
            &["serve".into(), config.display().to_string()],
            dir.join("registry.log"),
            lifetime,
        )?;
        let addr = SocketAddr::from(([127, 0, 0, 1], port));
        let deadline = Instant::now() + READY_TIMEOUT;
        loop {
            if http_get(addr, "/v2/").is_ok_and(|(status, _)| status == 200) {
                break;
            }
            if process.exited() || Instant::now() > deadline {
                return Err(TestEnvError::NotReady {
                    what: "the registry".into(),
                    seconds: READY_TIMEOUT.as_secs(),
                    log: process.log_tail(),
                });
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        Ok(Self {
            process: Some(process),
            port,
            _temp: None,
        })
    }

    /// `127.0.0.1:PORT`, as image references and `oci://` URLs name it.
    pub fn host(&self) -> String {
        format!("127.0.0.1:{}", self.port)
    }

    pub fn addr(&self) -> SocketAddr {
        SocketAddr::from(([127, 0, 0, 1], self.port))
    }

    /// The digest the registry serves for `repository:reference` (an OCI or Docker manifest),
    /// `None` when it has none.
    pub fn digest(&self, repository: &str, reference: &str) -> Option<String> {
        let path = format!("/v2/{repository}/manifests/{reference}");
        let (status, headers) = head(self.addr(), &path).ok()?;
        (status == 200).then(|| {
            headers
                .lines()
                .find_map(|l| {
                    let (name, value) = l.split_once(':')?;
                    name.eq_ignore_ascii_case("docker-content-digest")
                        .then(|| value.trim().to_string())
                })
                .unwrap_or_default()
        })
    }

    /// Lets the registry go on running after this value is dropped (for `lanepool-testenv up`).
    pub fn detach(mut self) {
        if let Some(process) = self.process.take() {
            std::mem::forget(process);
        }
    }
}

/// A `HEAD` of `path` asking for any manifest type: the status and the response's headers.
fn head(addr: SocketAddr, path: &str) -> std::io::Result<(u16, String)> {
    use std::io::{Read, Write};
    let mut stream = std::net::TcpStream::connect_timeout(&addr, Duration::from_secs(2))?;
    stream.set_read_timeout(Some(Duration::from_secs(5)))?;
    let accept = [
        "application/vnd.oci.image.index.v1+json",
        "application/vnd.oci.image.manifest.v1+json",
        "application/vnd.docker.distribution.manifest.v2+json",
        "application/vnd.docker.distribution.manifest.list.v2+json",
    ]
    .join(", ");
    write!(
        stream,
        "HEAD {path} HTTP/1.1\r\nHost: {addr}\r\nAccept: {accept}\r\nConnection: close\r\n\r\n"
    )?;
    let mut answer = String::new();
    stream.read_to_string(&mut answer)?;
    let status = answer
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or(0);
    Ok((status, answer))
}
