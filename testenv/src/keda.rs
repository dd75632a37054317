//! KEDA beside the control plane, as a cluster runs it: its CRDs, its operator, and its external
//! metrics API server registered as `v1beta1.external.metrics.k8s.io` through the aggregation
//! layer. The API server reaches it through an ExternalName Service for localhost, whose name
//! its serving certificate carries. It must never run without the control plane it serves.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use base64::Engine;

use super::certs::{CertFiles, KEDA_METRICS_SERVICE};
use super::process::{Lifetime, Process};
use crate::error::{Result, TestEnvError, io};
use crate::tools::{tool, tools_dir};
use crate::wait::free_port;

const READY_TIMEOUT: Duration = Duration::from_secs(90);
/// The namespace KEDA runs "in": where it keeps cluster-wide objects and its metrics Service.
const NAMESPACE: &str = KEDA_METRICS_SERVICE.0;
/// The external metrics API KEDA serves.
pub const EXTERNAL_METRICS_API: &str = "v1beta1.external.metrics.k8s.io";

/// KEDA's binaries and CRDs, built by tests/tools/build.sh.
pub struct Binaries {
    operator: PathBuf,
    adapter: PathBuf,
    crds: PathBuf,
}

impl Binaries {
    pub fn find() -> Result<Self> {
        let crds = tools_dir().join("keda-crds");
        if !crds.join("keda.sh_scaledobjects.yaml").is_file() {
            return Err(TestEnvError::ToolMissing {
                tool: "KEDA's CRDs".into(),
                path: crds,
            });
        }
        Ok(Self {
            operator: tool("keda-operator")?,
            adapter: tool("keda-adapter")?,
            crds,
        })
    }
}

/// The API server KEDA is installed into, by its kubeconfig.
struct Plane<'a> {
    kubeconfig: &'a Path,
}

impl Plane<'_> {
    fn kubeconfig(&self) -> &Path {
        self.kubeconfig
    }

    fn kubectl(&self, args: &[&str]) -> Result<(bool, String)> {
        super::kubectl::kubectl(self.kubeconfig, args)
    }
}

/// Installs KEDA's CRDs, starts its operator and metrics API server, and returns once the API
/// server says the external metrics API is available.
pub async fn start(
    dir: &Path,
    kubeconfig: &Path,
    binaries: &Binaries,
    certs: &CertFiles,
    lifetime: Lifetime,
) -> Result<Vec<Process>> {
    let plane = &Plane { kubeconfig };
    kubectl(
        plane,
        &["apply", "--server-side", "-f", &display(&binaries.crds)],
    )?;
    // Polled rather than `kubectl wait`, which fails on a CRD that has no status yet.
    let established = "-o=jsonpath={.status.conditions[?(@.type==\"Established\")].status}";
    let deadline = Instant::now() + READY_TIMEOUT;
    for crd in ["scaledobjects.keda.sh", "triggerauthentications.keda.sh"] {
        while !plane
            .kubectl(&["get", "crd", crd, established])?
            .1
            .contains("True")
        {
            if Instant::now() > deadline {
                return Err(TestEnvError::NotReady {
                    what: format!("the CRD {crd}"),
                    seconds: READY_TIMEOUT.as_secs(),
                    log: String::new(),
                });
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
    let adapter_port = free_port()?;
    let manifest = dir.join("keda.yaml");
    std::fs::write(&manifest, registration(certs, adapter_port)?)
        .map_err(io(format!("writing {}", manifest.display())))?;
    kubectl(plane, &["apply", "-f", &display(&manifest)])?;

    let grpc = format!("127.0.0.1:{}", free_port()?);
    let kubeconfig = display(plane.kubeconfig());
    let certs_dir = display(&certs.keda_dir);
    let env = [
        ("KUBECONFIG", kubeconfig.clone()),
        ("KEDA_CLUSTER_OBJECT_NAMESPACE", NAMESPACE.to_string()),
        ("POD_NAMESPACE", NAMESPACE.to_string()),
        // Every namespace: the tests' namespaces are made as they go.
        ("WATCH_NAMESPACE", String::new()),
    ];
    let operator = Process::start_with_env(
        "keda-operator",
        &binaries.operator,
        &[
            format!("--metrics-bind-address=127.0.0.1:{}", free_port()?),
            format!("--health-probe-bind-address=127.0.0.1:{}", free_port()?),
            format!("--metrics-service-bind-address={grpc}"),
            // Certificates from the harness's CA, not KEDA's own rotation (which patches the
            // APIService and webhooks of an in-cluster install).
            "--enable-cert-rotation=false".into(),
            format!("--cert-dir={certs_dir}"),
            format!("--ca-dir={certs_dir}"),
        ],
        &env,
        dir.join("keda-operator.log"),
        lifetime,
    )?;
    let adapter = Process::start_with_env(
        "keda-adapter",
        &binaries.adapter,
        &[
            format!("--secure-port={adapter_port}"),
            "--bind-address=127.0.0.1".into(),
            format!("--tls-cert-file={certs_dir}/tls.crt"),
            format!("--tls-private-key-file={certs_dir}/tls.key"),
            format!("--cert-dir={certs_dir}"),
            format!("--metrics-service-address={grpc}"),
            format!("--port={}", free_port()?),
            // Who asks is checked with the API server (delegated authentication and
            // authorization), as any aggregated API server does.
            format!("--authentication-kubeconfig={kubeconfig}"),
            format!("--authorization-kubeconfig={kubeconfig}"),
            format!("--lister-kubeconfig={kubeconfig}"),
        ],
        &env,
        dir.join("keda-adapter.log"),
        lifetime,
    )?;
    let mut processes = vec![operator, adapter];
    wait_available(plane, &mut processes).await?;
    Ok(processes)
}

/// KEDA's namespace, the Service the aggregation layer resolves to localhost, and the
/// APIService that sends external.metrics.k8s.io there, trusting the harness's CA.
fn registration(certs: &CertFiles, port: u16) -> Result<String> {
    let ca = std::fs::read(&certs.ca).map_err(io("reading the CA"))?;
    let ca = base64::engine::general_purpose::STANDARD.encode(ca);
    let (namespace, service) = KEDA_METRICS_SERVICE;
    Ok(format!(
        "apiVersion: v1
kind: Namespace
metadata: {{name: {namespace}}}
---
apiVersion: v1
kind: Service
metadata: {{name: {service}, namespace: {namespace}}}
spec:
  type: ExternalName
  externalName: localhost
---
apiVersion: apiregistration.k8s.io/v1
kind: APIService
metadata: {{name: {EXTERNAL_METRICS_API}}}
spec:
  group: external.metrics.k8s.io
  version: v1beta1
  service: {{name: {service}, namespace: {namespace}, port: {port}}}
  caBundle: {ca}
  groupPriorityMinimum: 100
  versionPriority: 100
"
    ))
}

async fn wait_available(plane: &Plane<'_>, processes: &mut [Process]) -> Result<()> {
    let deadline = Instant::now() + READY_TIMEOUT;
    let jsonpath = "-o=jsonpath={.status.conditions[?(@.type==\"Available\")].status}";
    loop {
        let (ok, out) = plane.kubectl(&["get", "apiservice", EXTERNAL_METRICS_API, jsonpath])?;
        if ok && out.trim() == "True" {
            return Ok(());
        }
        if let Some(dead) = processes.iter_mut().find_map(|p| p.exited().then_some(p)) {
            return Err(TestEnvError::NotReady {
                what: format!("{} (it exited)", dead.name),
                seconds: 0,
                log: dead.log_tail(),
            });
        }
        if Instant::now() > deadline {
            return Err(TestEnvError::NotReady {
                what: format!("{EXTERNAL_METRICS_API} (KEDA's metrics API server)"),
                seconds: READY_TIMEOUT.as_secs(),
                log: processes[1].log_tail(),
            });
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}

fn kubectl(plane: &Plane<'_>, args: &[&str]) -> Result<String> {
    let (ok, out) = plane.kubectl(args)?;
    if ok {
        Ok(out)
    } else {
        Err(TestEnvError::NotReady {
            what: format!("kubectl {}", args.join(" ")),
            seconds: 0,
            log: out,
        })
    }
}

fn display(path: &Path) -> String {
    path.display().to_string()
}
