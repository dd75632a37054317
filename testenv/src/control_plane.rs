//! etcd plus kube-apiserver with TLS, RBAC, the aggregation layer and the LanePool CRD installed,
//! and on request kube-controller-manager (Deployments become ReplicaSets and Pods; owners'
//! deletions and namespaces are garbage-collected), with its HPA controller and KEDA beside it
//! for [`Controllers::Autoscalers`]. No scheduler and no kubelet, so Pods never run by
//! themselves, except with [`Controllers::Node`], for the real node of [`crate::TestNode`].

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use k8s_openapi::api::core::v1::Namespace;
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{Api, DeleteParams, PostParams};
use kube::config::{KubeConfigOptions, Kubeconfig};
use kube::{Client, Config};

use super::certs::{self, CertFiles};
use super::process::{Lifetime, Process};
use crate::error::{Result, TestEnvError, io};
use crate::tools::tool;
use crate::wait::{free_port, on_a_thread_of_its_own};
use lanepool::crd::lanepool_crd;

const READY_TIMEOUT: Duration = Duration::from_secs(60);

/// Which controllers run beside the API server.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Controllers {
    /// None: Deployments are stored and validated, nothing acts on them; a test (or
    /// [`super::DeploymentReadiness`]) writes their status.
    #[default]
    None,
    /// kube-controller-manager with the deployment, replicaset, garbagecollector and namespace
    /// controllers: Deployments make ReplicaSets and Pods, and what a deleted object owned goes.
    Pods,
    /// [`Self::Pods`], plus the horizontal-pod-autoscaler controller and KEDA (its operator and
    /// its external metrics API server, registered through the aggregation layer).
    Autoscalers,
    /// A cluster for a real node ([`crate::TestNode`] starts the node itself): every controller
    /// of kube-controller-manager (ServiceAccounts, Services' endpoints, node lifecycle…),
    /// kube-scheduler, and an API server that Pods reach through the `kubernetes` Service
    /// (listening on every address and advertising the host's), that mounts ServiceAccount
    /// tokens into Pods, authorizes kubelets as nodes, and reaches them with a client
    /// certificate (`kubectl logs`, `exec`). The LanePool CRD is not installed: the chart does.
    Node { host: std::net::IpAddr },
}

/// How often the HPA controller evaluates every HPA: kube-controller-manager's default.
pub const HPA_SYNC_PERIOD: Duration = Duration::from_secs(15);
/// The HPA's scale-down stabilization here. The default is 300 s; a test cannot wait that long
/// for every shrink, and the window only delays the shrink, it does not change its size.
pub const HPA_DOWNSCALE_STABILIZATION: Duration = Duration::from_secs(30);

/// KEDA started by [`ControlPlane::start_keda`]: its operator and metrics API server, stopped
/// when dropped.
pub struct Keda {
    _processes: Vec<Process>,
}

/// A running etcd and kube-apiserver, and kube-controller-manager with [`Controllers::Pods`].
pub struct ControlPlane {
    dir: PathBuf,
    // Held so the directory and the processes live as long as the control plane.
    _temp: Option<tempfile::TempDir>,
    processes: Vec<Process>,
    /// How the API server was started, to start it again after a kill.
    api_server: (PathBuf, Vec<String>, Lifetime),
    url: String,
    kubeconfig: PathBuf,
    /// Its certificates, for what starts beside it later ([`Self::start_keda`]).
    certs: CertFiles,
    pub startup: Duration,
}

impl ControlPlane {
    /// Starts etcd and kube-apiserver in a new temporary directory and installs the CRD.
    pub async fn start() -> Result<Self> {
        Self::start_with(Controllers::None).await
    }

    /// [`Self::start`], with `controllers` beside the API server.
    pub async fn start_with(controllers: Controllers) -> Result<Self> {
        let temp = tempfile::Builder::new()
            .prefix("lanepool-testenv-")
            .tempdir()
            .map_err(io("creating a temporary directory"))?;
        let dir = temp.path().to_path_buf();
        let mut plane = Self::start_in(&dir, Lifetime::Process, controllers).await?;
        plane._temp = Some(temp);
        Ok(plane)
    }

    /// Starts in `dir`, which is kept; with `Lifetime::Detached` the processes outlive us.
    pub async fn start_in(
        dir: &Path,
        lifetime: Lifetime,
        controllers: Controllers,
    ) -> Result<Self> {
        let began = Instant::now();
        let etcd_bin = tool("etcd")?;
        let apiserver_bin = tool("kube-apiserver")?;
        let controller_manager_bin = match controllers {
            Controllers::None => None,
            _ => Some(tool("kube-controller-manager")?),
        };
        let scheduler_bin = match controllers {
            Controllers::Node { .. } => Some(tool("kube-scheduler")?),
            _ => None,
        };
        let host = match controllers {
            Controllers::Node { host } => Some(host),
            _ => None,
        };
        let keda = match controllers {
            Controllers::Autoscalers => Some(super::keda::Binaries::find()?),
            _ => None,
        };
        std::fs::create_dir_all(dir).map_err(io(format!("creating {}", dir.display())))?;
        let certs = certs::write(dir, host)?;

        let etcd_port = free_port()?;
        let peer_port = free_port()?;
        let etcd_url = format!("http://127.0.0.1:{etcd_port}");
        let peer_url = format!("http://127.0.0.1:{peer_port}");
        let etcd = Process::start(
            "etcd",
            &etcd_bin,
            &[
                "--name=testenv".into(),
                format!("--data-dir={}", dir.join("etcd").display()),
                format!("--listen-client-urls={etcd_url}"),
                format!("--advertise-client-urls={etcd_url}"),
                format!("--listen-peer-urls={peer_url}"),
                format!("--initial-advertise-peer-urls={peer_url}"),
                format!("--initial-cluster=testenv={peer_url}"),
                // A test cluster needs no durability; fsync is most of etcd's write latency.
                "--unsafe-no-fsync".into(),
                "--log-level=warn".into(),
            ],
            dir.join("etcd.log"),
            lifetime,
        )?;

        let port = free_port()?;
        let args = apiserver_args(&certs, &etcd_url, port, dir, host);
        let apiserver = Process::start(
            "kube-apiserver",
            &apiserver_bin,
            &args,
            dir.join("kube-apiserver.log"),
            lifetime,
        )?;

        let url = format!("https://127.0.0.1:{port}");
        let kubeconfig = dir.join("kubeconfig");
        std::fs::write(&kubeconfig, kubeconfig_yaml(&url, &certs))
            .map_err(io(format!("writing {}", kubeconfig.display())))?;
        let mut plane = Self {
            dir: dir.to_path_buf(),
            _temp: None,
            processes: vec![etcd, apiserver],
            api_server: (apiserver_bin, args, lifetime),
            url,
            kubeconfig,
            certs: certs.clone(),
            startup: Duration::ZERO,
        };
        if lifetime == Lifetime::Detached {
            let pids: Vec<String> = plane.pids().iter().map(u32::to_string).collect();
            std::fs::write(dir.join("pids"), pids.join("\n") + "\n")
                .map_err(io("writing the pid file"))?;
        }
        plane.wait_ready().await?;
        // Started once the API server answers, and not waited for: it lists and watches on its
        // own, and a test waits for the Pods it needs anyway.
        if let Some(program) = controller_manager_bin {
            plane.processes.push(Process::start(
                "kube-controller-manager",
                &program,
                &controller_manager_args(&certs, &plane.kubeconfig, controllers),
                dir.join("kube-controller-manager.log"),
                lifetime,
            )?);
        }
        if let Some(program) = scheduler_bin {
            let kubeconfig = plane.kubeconfig.display().to_string();
            plane.processes.push(Process::start(
                "kube-scheduler",
                &program,
                &[
                    format!("--kubeconfig={kubeconfig}"),
                    format!("--authentication-kubeconfig={kubeconfig}"),
                    format!("--authorization-kubeconfig={kubeconfig}"),
                    "--leader-elect=false".into(),
                    "--secure-port=0".into(),
                    "--v=0".into(),
                ],
                dir.join("kube-scheduler.log"),
                lifetime,
            )?);
        }
        if lifetime == Lifetime::Detached {
            let pids: Vec<String> = plane.pids().iter().map(u32::to_string).collect();
            std::fs::write(dir.join("pids"), pids.join("\n") + "\n")
                .map_err(io("writing the pid file"))?;
        }
        // A node's cluster gets its CRD the way users install it: from the chart.
        if host.is_none() {
            plane.install_crd().await?;
        }
        if let Some(keda) = keda {
            let processes =
                super::keda::start(&plane.dir, &plane.kubeconfig, &keda, &certs, lifetime).await?;
            plane.processes.extend(processes);
            if lifetime == Lifetime::Detached {
                let pids: Vec<String> = plane.pids().iter().map(u32::to_string).collect();
                std::fs::write(dir.join("pids"), pids.join("\n") + "\n")
                    .map_err(io("writing the pid file"))?;
            }
        }
        plane.startup = began.elapsed();
        Ok(plane)
    }

    /// Starts KEDA beside this control plane, as [`Controllers::Autoscalers`] does (its CRDs, its
    /// operator and its metrics API server behind the aggregation layer), for a plane started
    /// without it: the real node's. KEDA's processes stop when the returned value is dropped,
    /// and die with this process.
    pub async fn start_keda(&self) -> Result<Keda> {
        let binaries = super::keda::Binaries::find()?;
        let processes = super::keda::start(
            &self.dir,
            &self.kubeconfig,
            &binaries,
            &self.certs,
            Lifetime::Process,
        )
        .await?;
        Ok(Keda {
            _processes: processes,
        })
    }

    /// The API server's URL.
    pub fn url(&self) -> &str {
        &self.url
    }

    /// A kubeconfig file for kubectl and kube clients, as the admin user.
    pub fn kubeconfig(&self) -> &Path {
        &self.kubeconfig
    }

    /// Runs the pinned kubectl against this API server: whether it succeeded, and its stdout
    /// (on failure, its stderr after it).
    pub fn kubectl(&self, args: &[&str]) -> Result<(bool, String)> {
        crate::kubectl::kubectl(&self.kubeconfig, args)
    }

    /// The directory holding certificates, data and logs.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// The pids of etcd, kube-apiserver and (when they run) kube-controller-manager and KEDA.
    pub fn pids(&self) -> Vec<u32> {
        self.processes.iter().map(|p| p.child.id()).collect()
    }

    /// kube-controller-manager's pid (`None` without it), to freeze and thaw it in fault tests.
    pub fn controller_manager_pid(&self) -> Option<u32> {
        self.processes
            .iter()
            .find(|p| p.log.to_string_lossy().contains("controller-manager"))
            .map(|p| p.child.id())
    }

    /// The kube-apiserver's pid, to freeze (SIGSTOP) and thaw (SIGCONT) it in fault tests.
    pub fn api_server_pid(&self) -> u32 {
        self.processes[1].child.id()
    }

    /// Kills the API server (SIGKILL), leaves it down for `down_for`, and starts it again on
    /// the same port and etcd; returns once it answers.
    pub async fn restart_api_server(&mut self, down_for: Duration) -> Result<()> {
        let old = &mut self.processes[1];
        let _ = old.child.kill();
        let _ = old.child.wait();
        tokio::time::sleep(down_for).await;
        let (program, args, lifetime) = self.api_server.clone();
        self.processes[1] = Process::start(
            "kube-apiserver",
            &program,
            &args,
            self.dir.join("kube-apiserver-restarted.log"),
            lifetime,
        )?;
        self.wait_ready().await
    }

    /// Lets the processes go on running after this value is dropped.
    pub fn detach(mut self) {
        for process in std::mem::take(&mut self.processes) {
            std::mem::forget(process);
        }
    }

    /// A new client as the admin user. Make one per test: a client belongs to the tokio
    /// runtime it was made in.
    pub async fn client(&self) -> Result<Client> {
        let kubeconfig = Kubeconfig::read_from(&self.kubeconfig)?;
        let config =
            Config::from_custom_kubeconfig(kubeconfig, &KubeConfigOptions::default()).await?;
        Ok(Client::try_from(config)?)
    }

    /// Creates a namespace with a unique name starting with `prefix`.
    pub async fn namespace(&self, client: &Client, prefix: &str) -> Result<String> {
        let name = unique_name(prefix);
        let namespace: Namespace = serde_json::from_value(serde_json::json!({
            "metadata": { "name": name }
        }))
        .expect("a namespace literal");
        Api::<Namespace>::all(client.clone())
            .create(&PostParams::default(), &namespace)
            .await?;
        Ok(name)
    }

    /// Deletes a namespace made by [`Self::namespace`]; without a namespace controller, its
    /// objects stay in etcd, which dies with the control plane.
    pub async fn delete_namespace(&self, client: &Client, name: &str) -> Result<()> {
        Api::<Namespace>::all(client.clone())
            .delete(name, &DeleteParams::default())
            .await?;
        Ok(())
    }

    async fn wait_ready(&mut self) -> Result<()> {
        let client = self.client().await?;
        let deadline = Instant::now() + READY_TIMEOUT;
        loop {
            let request = http::Request::get("/readyz")
                .body(Vec::new())
                .expect("a static request");
            if let Ok(body) = client.request_text(request).await
                && body.trim() == "ok"
            {
                return Ok(());
            }
            if let Some(dead) = self
                .processes
                .iter_mut()
                .find_map(|p| p.exited().then_some(p))
            {
                return Err(TestEnvError::NotReady {
                    what: format!("{} (it exited)", dead.name),
                    seconds: 0,
                    log: dead.log_tail(),
                });
            }
            if Instant::now() > deadline {
                return Err(TestEnvError::NotReady {
                    what: "kube-apiserver".into(),
                    seconds: READY_TIMEOUT.as_secs(),
                    log: self.processes[1].log_tail(),
                });
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    async fn install_crd(&self) -> Result<()> {
        let client = self.client().await?;
        let crds = Api::<CustomResourceDefinition>::all(client);
        let crd = lanepool_crd();
        let name = crd.metadata.name.clone().unwrap_or_default();
        crds.create(&PostParams::default(), &crd).await?;
        let deadline = Instant::now() + READY_TIMEOUT;
        while Instant::now() < deadline {
            let established = crds
                .get(&name)
                .await?
                .status
                .and_then(|s| s.conditions)
                .unwrap_or_default()
                .iter()
                .any(|c| c.type_ == "Established" && c.status == "True");
            if established {
                return Ok(());
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        Err(TestEnvError::NotReady {
            what: format!("the CRD {name}"),
            seconds: READY_TIMEOUT.as_secs(),
            log: String::new(),
        })
    }
}

fn apiserver_args(
    certs: &CertFiles,
    etcd_url: &str,
    port: u16,
    dir: &Path,
    node_host: Option<std::net::IpAddr>,
) -> Vec<String> {
    let path = |p: &Path| p.display().to_string();
    let mut args = vec![
        format!("--etcd-servers={etcd_url}"),
        format!("--secure-port={port}"),
        format!("--cert-dir={}", dir.join("apiserver-certs").display()),
        format!("--tls-cert-file={}", path(&certs.serving_cert)),
        format!("--tls-private-key-file={}", path(&certs.serving_key)),
        format!("--client-ca-file={}", path(&certs.ca)),
        format!(
            "--service-account-key-file={}",
            path(&certs.service_account_public_key)
        ),
        format!(
            "--service-account-signing-key-file={}",
            path(&certs.service_account_key)
        ),
        "--service-account-issuer=https://kubernetes.default.svc".into(),
        "--service-cluster-ip-range=10.0.0.0/24".into(),
        "--allow-privileged=true".into(),
        "--enable-priority-and-fairness=false".into(),
        // The aggregation layer: the API server proxies external.metrics.k8s.io to KEDA's
        // metrics API server with this client certificate, and tells it who asked in these
        // headers, which that server believes of a certificate the request-header CA signed.
        format!("--requestheader-client-ca-file={}", path(&certs.ca)),
        "--requestheader-allowed-names=front-proxy-client".into(),
        "--requestheader-username-headers=X-Remote-User".into(),
        "--requestheader-group-headers=X-Remote-Group".into(),
        "--requestheader-extra-headers-prefix=X-Remote-Extra-".into(),
        format!("--proxy-client-cert-file={}", path(&certs.front_proxy_cert)),
        format!("--proxy-client-key-file={}", path(&certs.front_proxy_key)),
        "--profiling=false".into(),
        "--v=0".into(),
    ];
    match node_host {
        None => args.extend([
            "--bind-address=127.0.0.1".into(),
            "--advertise-address=127.0.0.1".into(),
            "--authorization-mode=RBAC".into(),
            // The controller-manager, when it runs, runs no serviceaccount or endpoint
            // controllers: nothing would create service-account tokens or the kubernetes
            // Service endpoints.
            "--disable-admission-plugins=ServiceAccount".into(),
            "--endpoint-reconciler-type=none".into(),
        ]),
        Some(host) => args.extend([
            // Pods reach the API server at the `kubernetes` Service, which kube-proxy sends to
            // the advertised address: the host's, since 127.0.0.1 in a Pod is the Pod.
            "--bind-address=0.0.0.0".into(),
            format!("--advertise-address={host}"),
            "--endpoint-reconciler-type=lease".into(),
            "--authorization-mode=Node,RBAC".into(),
            "--enable-admission-plugins=NodeRestriction".into(),
            // `kubectl logs` and `exec` go through the kubelet, which trusts the cluster's CA.
            format!("--kubelet-client-certificate={}", path(&certs.admin_cert)),
            format!("--kubelet-client-key={}", path(&certs.admin_key)),
            "--kubelet-preferred-address-types=InternalIP,Hostname".into(),
        ]),
    }
    args
}

fn controller_manager_args(
    certs: &CertFiles,
    kubeconfig: &Path,
    controllers: Controllers,
) -> Vec<String> {
    let path = |p: &Path| p.display().to_string();
    let mut names = match controllers {
        // Every controller but node IPAM (the node's bridge plugin hands out the addresses).
        Controllers::Node { .. } => "*,-nodeipam".to_string(),
        _ => "deployment,replicaset,garbagecollector,namespace".to_string(),
    };
    let mut hpa = Vec::new();
    if controllers == Controllers::Autoscalers {
        names.push_str(",horizontalpodautoscaling");
        hpa = vec![
            format!(
                "--horizontal-pod-autoscaler-sync-period={}s",
                HPA_SYNC_PERIOD.as_secs()
            ),
            format!(
                "--horizontal-pod-autoscaler-downscale-stabilization={}s",
                HPA_DOWNSCALE_STABILIZATION.as_secs()
            ),
        ];
    }
    let mut args = vec![
        format!("--kubeconfig={}", path(kubeconfig)),
        format!("--controllers={names}"),
        format!(
            "--service-account-private-key-file={}",
            path(&certs.service_account_key)
        ),
        format!("--root-ca-file={}", path(&certs.ca)),
        // One controller-manager per control plane: nothing to elect, and no wait for a Lease.
        "--leader-elect=false".into(),
        // No health or metrics port: nothing here scrapes it, and no port to collide on.
        "--secure-port=0".into(),
        // The controllers act as the admin of the kubeconfig rather than per-controller service
        // accounts, whose tokens no controller here would create.
        "--use-service-account-credentials=false".into(),
        // The client's default 20 requests/s would take 17 minutes to make the scale benchmark's
        // 20,000 Pods; no test comes near this.
        "--kube-api-qps=500".into(),
        "--kube-api-burst=1000".into(),
        "--v=0".into(),
    ];
    args.extend(hpa);
    args
}

fn kubeconfig_yaml(url: &str, certs: &CertFiles) -> String {
    format!(
        "apiVersion: v1
kind: Config
clusters:
- name: testenv
  cluster:
    server: {url}
    certificate-authority: {ca}
users:
- name: admin
  user:
    client-certificate: {cert}
    client-key: {key}
contexts:
- name: testenv
  context:
    cluster: testenv
    user: admin
current-context: testenv
",
        ca = certs.ca.display(),
        cert = certs.admin_cert.display(),
        key = certs.admin_key.display(),
    )
}

/// A name no other test in this run has: `prefix`, the process id and a counter.
pub fn unique_name(prefix: &str) -> String {
    static COUNTER: AtomicU32 = AtomicU32::new(0);
    let nanos = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.subsec_nanos());
    format!(
        "{prefix}-{:x}{:x}-{}",
        std::process::id() & 0xfff,
        nanos & 0xfff,
        COUNTER.fetch_add(1, Ordering::Relaxed)
    )
}

static SHARED: std::sync::Mutex<Option<&'static ControlPlane>> = std::sync::Mutex::new(None);

/// The control plane shared by every test in this test binary, started on first use. It is
/// stopped when the binary exits (an `atexit` hook), or killed by the kernel if the binary dies.
pub fn shared() -> Result<&'static ControlPlane> {
    shared_with(Controllers::None)
}

/// [`shared`], with `controllers`. A test binary asks for one kind: the first call decides.
pub fn shared_with(controllers: Controllers) -> Result<&'static ControlPlane> {
    let mut slot = SHARED.lock().unwrap_or_else(|p| p.into_inner());
    if let Some(plane) = *slot {
        return Ok(plane);
    }
    let plane = on_a_thread_of_its_own(move || ControlPlane::start_with(controllers))?;
    let plane: &'static ControlPlane = Box::leak(Box::new(plane));
    *slot = Some(plane);
    extern "C" fn stop_shared() {
        if let Ok(slot) = SHARED.lock()
            && let Some(plane) = *slot
        {
            for pid in plane.pids() {
                super::process::terminate_pid(pid, Duration::from_secs(5));
            }
            let _ = std::fs::remove_dir_all(plane.dir());
        }
    }
    // SAFETY: registering a plain extern "C" function with no arguments.
    unsafe { libc::atexit(stop_shared) };
    Ok(plane)
}
