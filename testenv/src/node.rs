//! A real Kubernetes node on this machine: the pinned kubelet, kube-proxy and kube-scheduler
//! (tests/tools/build.sh), Debian's containerd and runc, and the bridge CNI plugin, beside a
//! control plane started for it ([`Controllers::Node`]). Pods run as containers from images,
//! pulled from a registry (the tests' own on 127.0.0.1 is reached over plain HTTP, as containerd
//! allows for a loopback registry); Pods get addresses on a bridge the host routes to, and reach
//! the host at [`TestNode::host`], never at 127.0.0.1 (that is the Pod itself).
//!
//! There is one node per machine: kube-proxy's iptables rules and the bridge are the machine's
//! (its Pods' cgroups are under a root of its own, [`CGROUP_ROOT`]). Its state lives in `target/node/`, so a run that died
//! without cleaning up is cleaned up by the next ([`TestNode::start`] does it first).
//!
//! What runs it needs: root, `containerd`, `runc` and `/usr/lib/cni` (Debian's containerd, runc
//! and containernetworking-plugins: `./tests/setup.sh` installs them), and `cc` for the sandbox
//! image's one static binary.

use std::net::{IpAddr, UdpSocket};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::Node;
use kube::Api;

use crate::certs::NODE_NAME;
use crate::control_plane::{ControlPlane, Controllers};
use crate::error::{Result, TestEnvError, io};
use crate::process::{Lifetime, Process, which};
use crate::tools::tool;
use crate::wait::{free_port, on_a_thread_of_its_own};

/// The Pods' address block, on the bridge [`BRIDGE`].
pub const NODE_POD_CIDR: &str = "10.88.0.0/16";
/// The bridge the node's Pods are attached to.
const BRIDGE: &str = "lanepool0";
/// The cgroup the kubelet puts the node's Pods under (its `cgroupRoot`), in every hierarchy: a
/// clean-up kills what is in it and nothing of another kubelet's on the machine.
const CGROUP_ROOT: &str = "lanepool-node";
/// The sandbox image, imported into containerd (nothing is pulled for it).
const PAUSE_IMAGE: &str = "localhost/lanepool-pause:1";
const READY_TIMEOUT: Duration = Duration::from_secs(60);

/// A control plane and a real node registered with it, its kubelet running Pods in containerd.
pub struct TestNode {
    plane: ControlPlane,
    dir: PathBuf,
    host: IpAddr,
    /// containerd, the kubelet and kube-proxy, in the order they started; behind a lock so the
    /// shared node can be stopped at exit.
    processes: Mutex<Vec<Process>>,
    /// How each of them was started (name, program, arguments), to start it again.
    commands: Mutex<Vec<(String, PathBuf, Vec<String>)>>,
    pub startup: Duration,
}

impl TestNode {
    /// Cleans up what an earlier run left in `target/node/`, starts a control plane for a node
    /// and the node itself, and returns once the Node is Ready.
    pub async fn start() -> Result<Self> {
        let began = Instant::now();
        let dir = node_dir();
        let programs = Programs::find()?;
        clean(&dir, &programs, true);
        std::fs::create_dir_all(&dir).map_err(io(format!("creating {}", dir.display())))?;
        let host = host_address()?;
        let plane = ControlPlane::start_in(
            &dir.join("control-plane"),
            Lifetime::Process,
            Controllers::Node { host },
        )
        .await?;
        let mut node = Self {
            plane,
            dir,
            host,
            processes: Mutex::new(Vec::new()),
            commands: Mutex::new(Vec::new()),
            startup: Duration::ZERO,
        };
        node.start_node(&programs).await?;
        node.startup = began.elapsed();
        Ok(node)
    }

    /// The control plane the node is registered with.
    pub fn plane(&self) -> &ControlPlane {
        &self.plane
    }

    /// The host's address: where Pods reach the API server and any service of the test, which
    /// must listen on it (or on every address), not on 127.0.0.1 alone.
    pub fn host(&self) -> IpAddr {
        self.host
    }

    /// The Node's name.
    pub fn name(&self) -> &'static str {
        NODE_NAME
    }

    /// The directory holding the node's configuration, state and logs.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    fn processes(&self) -> std::sync::MutexGuard<'_, Vec<Process>> {
        self.processes.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Runs `ctr` against the node's containerd, in the Kubernetes namespace: whether it
    /// succeeded, and its output.
    pub fn ctr(&self, args: &[&str]) -> (bool, String) {
        ctr(&self.dir, args)
    }

    async fn start_node(&self, programs: &Programs) -> Result<()> {
        let dir = self.dir.clone();
        let containerd_config = write_containerd_config(&dir)?;
        self.spawn(
            "containerd",
            &programs.containerd,
            vec![format!("--config={}", containerd_config.display())],
        )?;
        self.wait_for("containerd", 30, || ctr(&dir, &["version"]).0)
            .await?;
        import_pause_image(&dir)?;

        make_cgroup_root()?;
        let kubelet_config = write_kubelet_config(&dir, self.plane.dir())?;
        let kubelet_kubeconfig = write_kubelet_kubeconfig(&dir, &self.plane)?;
        self.spawn(
            "kubelet",
            &programs.kubelet,
            vec![
                format!("--config={}", kubelet_config.display()),
                format!("--kubeconfig={}", kubelet_kubeconfig.display()),
                format!("--root-dir={}", dir.join("kubelet").display()),
                format!("--cert-dir={}", dir.join("kubelet/pki").display()),
                format!("--hostname-override={NODE_NAME}"),
                format!("--node-ip={}", self.host),
                "--v=1".into(),
            ],
        )?;

        let proxy_config = write_proxy_config(&dir, self.plane.kubeconfig())?;
        self.processes().push(Process::start(
            "kube-proxy",
            &programs.kube_proxy,
            &[
                format!("--config={}", proxy_config.display()),
                "--v=0".into(),
            ],
            dir.join("kube-proxy.log"),
            Lifetime::Process,
        )?);

        let nodes = Api::<Node>::all(self.plane.client().await?);
        let deadline = Instant::now() + READY_TIMEOUT;
        loop {
            let ready = nodes
                .get_opt(NODE_NAME)
                .await
                .ok()
                .flatten()
                .is_some_and(|node| {
                    node.status
                        .and_then(|s| s.conditions)
                        .unwrap_or_default()
                        .iter()
                        .any(|c| c.type_ == "Ready" && c.status == "True")
                });
            if ready {
                return Ok(());
            }
            self.fail_if_exited()?;
            if Instant::now() > deadline {
                return Err(TestEnvError::NotReady {
                    what: format!("the node {NODE_NAME}"),
                    seconds: READY_TIMEOUT.as_secs(),
                    log: self.processes()[1].log_tail(),
                });
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }

    /// Starts `program` as the node's process `name`, its output in `<name>.log`.
    fn spawn(&self, name: &str, program: &Path, args: Vec<String>) -> Result<()> {
        let log = self.dir.join(format!("{name}.log"));
        let process = Process::start(name, program, &args, log, Lifetime::Process)?;
        self.processes().push(process);
        let command = (name.to_owned(), program.to_owned(), args);
        self.commands
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .push(command);
        Ok(())
    }

    /// Kills the node's process `name` (`containerd`, `kubelet` or `kube-proxy`) with SIGKILL,
    /// leaves it down for `down_for`, and starts it again as it was started (its output then in
    /// `<name>-restarted.log`). The Pods' containers are not its children: they run on.
    pub async fn restart(&self, name: &str, down_for: Duration) -> Result<()> {
        let (program, args) = {
            let commands = self.commands.lock().unwrap_or_else(|p| p.into_inner());
            let (_, program, args) = commands
                .iter()
                .find(|(n, _, _)| n == name)
                .unwrap_or_else(|| panic!("the node runs no {name}"));
            (program.clone(), args.clone())
        };
        {
            let mut processes = self.processes();
            let process = processes
                .iter_mut()
                .find(|p| p.name == name)
                .expect("a process for every command");
            let _ = process.child.kill();
            let _ = process.child.wait();
        }
        tokio::time::sleep(down_for).await;
        let log = self.dir.join(format!("{name}-restarted.log"));
        let process = Process::start(name, &program, &args, log, Lifetime::Process)?;
        let mut processes = self.processes();
        let slot = processes
            .iter_mut()
            .find(|p| p.name == name)
            .expect("a process for every command");
        *slot = process;
        Ok(())
    }

    async fn wait_for(
        &self,
        what: &str,
        seconds: u64,
        mut ready: impl FnMut() -> bool,
    ) -> Result<()> {
        let deadline = Instant::now() + Duration::from_secs(seconds);
        while !ready() {
            self.fail_if_exited()?;
            if Instant::now() > deadline {
                return Err(TestEnvError::NotReady {
                    what: what.into(),
                    seconds,
                    log: self
                        .processes()
                        .last()
                        .map(Process::log_tail)
                        .unwrap_or_default(),
                });
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        Ok(())
    }

    fn fail_if_exited(&self) -> Result<()> {
        let mut processes = self.processes();
        let dead = processes
            .iter_mut()
            .find_map(|p| p.exited().then(|| (p.name.clone(), p.log_tail())));
        match dead {
            Some((name, log)) => Err(TestEnvError::NotReady {
                what: format!("{name} (it exited)"),
                seconds: 0,
                log,
            }),
            None => Ok(()),
        }
    }

    /// Stops the node and cleans up after it: its Pods' containers, their mounts, kube-proxy's
    /// and the kubelet's iptables rules and the bridge. The control plane stops when dropped.
    pub fn stop(&self) {
        let mut processes = self.processes();
        // Pods deleted through the API are stopped by the kubelet, which tears their network
        // down through the CNI plugin; whatever is left is killed below.
        if processes.len() > 1 && !processes[1].exited() {
            let _ = self.plane.kubectl(&[
                "delete",
                "pods",
                "--all",
                "--all-namespaces",
                "--grace-period=0",
                "--force",
                "--wait=false",
                "--request-timeout=10s",
            ]);
            let deadline = Instant::now() + Duration::from_secs(30);
            while Instant::now() < deadline && !tasks(&self.dir).is_empty() {
                std::thread::sleep(Duration::from_millis(250));
            }
        }
        for mut process in processes.drain(..).rev() {
            process.stop(Duration::from_secs(5));
        }
        if let Ok(programs) = Programs::find() {
            clean(&self.dir, &programs, false);
        }
    }
}

impl Drop for TestNode {
    fn drop(&mut self) {
        self.stop();
    }
}

/// The programs the node runs, or a clear error naming the one that is missing.
struct Programs {
    containerd: PathBuf,
    kubelet: PathBuf,
    kube_proxy: PathBuf,
}

impl Programs {
    fn find() -> Result<Self> {
        let installed = |name: &str, package: &str| {
            which(name).ok_or_else(|| TestEnvError::PackageMissing {
                what: name.into(),
                package: package.into(),
            })
        };
        installed("runc", "runc")?;
        installed("ctr", "containerd")?;
        if !Path::new("/usr/lib/cni/bridge").is_file() {
            return Err(TestEnvError::PackageMissing {
                what: "the CNI bridge plugin (/usr/lib/cni/bridge)".into(),
                package: "containernetworking-plugins".into(),
            });
        }
        Ok(Self {
            containerd: installed("containerd", "containerd")?,
            kubelet: tool("kubelet")?,
            kube_proxy: tool("kube-proxy")?,
        })
    }
}

/// `target/node/`: fixed, so a later run finds what an earlier one left.
fn node_dir() -> PathBuf {
    std::env::var_os("LANEPOOL_NODE_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            // Normalized (no `..`): the kubelet refuses paths that are not.
            let testenv = Path::new(env!("CARGO_MANIFEST_DIR"));
            testenv.parent().unwrap_or(testenv).join("target/node")
        })
}

/// The address of the interface the default route leaves through: the node's InternalIP, and
/// where Pods reach the host. (Connecting a UDP socket sends nothing; it only picks a route.)
fn host_address() -> Result<IpAddr> {
    let socket = UdpSocket::bind("0.0.0.0:0").map_err(io("binding a UDP socket"))?;
    socket
        .connect("192.0.2.1:9")
        .or_else(|_| socket.connect("1.1.1.1:9"))
        .map_err(io("finding the host's address (no default route?)"))?;
    let address = socket
        .local_addr()
        .map_err(io("finding the host's address"))?
        .ip();
    if address.is_loopback() || address.is_unspecified() {
        return Err(TestEnvError::Io {
            what: "finding the host's address".into(),
            source: std::io::Error::other(format!("only {address}: Pods could not reach it")),
        });
    }
    Ok(address)
}

fn socket(dir: &Path) -> PathBuf {
    dir.join("containerd/containerd.sock")
}

fn ctr(dir: &Path, args: &[&str]) -> (bool, String) {
    let output = Command::new("ctr")
        .arg(format!("--address={}", socket(dir).display()))
        .args(["--namespace", "k8s.io", "--timeout", "10s"])
        .args(args)
        .output();
    match output {
        Ok(o) => (
            o.status.success(),
            String::from_utf8_lossy(&o.stdout).into_owned() + &String::from_utf8_lossy(&o.stderr),
        ),
        Err(e) => (false, e.to_string()),
    }
}

/// The containers containerd runs for the node's Pods.
fn tasks(dir: &Path) -> Vec<String> {
    if !socket(dir).exists() {
        return Vec::new();
    }
    match ctr(dir, &["tasks", "list", "--quiet"]) {
        (true, out) => out.lines().map(str::to_owned).collect(),
        (false, _) => Vec::new(),
    }
}

fn write(path: PathBuf, text: String) -> Result<PathBuf> {
    if let Some(parent) = path.parent() {
        std::fs::create_dir_all(parent).map_err(io(format!("creating {}", parent.display())))?;
    }
    std::fs::write(&path, text).map_err(io(format!("writing {}", path.display())))?;
    Ok(path)
}

fn write_containerd_config(dir: &Path) -> Result<PathBuf> {
    let cni = write(
        dir.join("cni/net.d/10-lanepool.conflist"),
        format!(
            r#"{{
  "cniVersion": "0.4.0",
  "name": "lanepool",
  "plugins": [
    {{
      "type": "bridge",
      "bridge": "{BRIDGE}",
      "isGateway": true,
      "ipMasq": false,
      "hairpinMode": true,
      "ipam": {{
        "type": "host-local",
        "ranges": [[{{ "subnet": "{NODE_POD_CIDR}" }}]],
        "routes": [{{ "dst": "0.0.0.0/0" }}],
        "dataDir": "{ipam}"
      }}
    }},
    {{ "type": "loopback" }}
  ]
}}
"#,
            ipam = dir.join("cni/ipam").display()
        ),
    )?;
    let d = |p: &str| dir.join(p).display().to_string();
    // restrict_oom_score_adj: a sandbox without CAP_SYS_RESOURCE cannot lower a score; cgroupfs
    // (no systemd here); overlayfs snapshots; no AppArmor profile to load.
    write(
        dir.join("containerd/config.toml"),
        format!(
            r#"version = 2
root = "{root}"
state = "{state}"

[grpc]
  address = "{socket}"

[ttrpc]
  address = ""

[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = "{PAUSE_IMAGE}"
  restrict_oom_score_adj = true
  disable_apparmor = true
  [plugins."io.containerd.grpc.v1.cri".containerd]
    snapshotter = "overlayfs"
    default_runtime_name = "runc"
    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
        SystemdCgroup = false
  [plugins."io.containerd.grpc.v1.cri".cni]
    bin_dir = "/usr/lib/cni"
    conf_dir = "{cni}"
"#,
            root = d("containerd/root"),
            state = d("containerd/state"),
            socket = socket(dir).display(),
            cni = cni.parent().expect("a file in a directory").display(),
        ),
    )
}

/// Builds the sandbox image (a static `pause`, nothing else) with buildah and imports it into
/// containerd, so no Pod waits for a pull of it.
fn import_pause_image(dir: &Path) -> Result<()> {
    let work = dir.join("pause");
    std::fs::create_dir_all(&work).map_err(io(format!("creating {}", work.display())))?;
    let source = work.join("pause.c");
    std::fs::write(&source, include_str!("node/pause.c")).map_err(io("writing pause.c"))?;
    let binary = work.join("pause");
    run(Command::new("cc")
        .args(["-Os", "-static", "-o"])
        .arg(&binary)
        .arg(&source))?;
    let storage = work.join("storage");
    let buildah = || {
        let mut command = Command::new("buildah");
        command
            .arg(format!("--root={}", storage.join("root").display()))
            .arg(format!("--runroot={}", storage.join("run").display()))
            .arg("--storage-driver=vfs");
        command
    };
    let container = run(buildah().args(["from", "scratch"]))?;
    let container = container.trim();
    run(buildah()
        .arg("copy")
        .arg(container)
        .arg(&binary)
        .arg("/pause"))?;
    run(buildah().args([
        "config",
        "--entrypoint",
        r#"["/pause"]"#,
        "--cmd",
        "",
        "--user",
        "65535:65535",
        container,
    ]))?;
    run(buildah().args(["commit", "--quiet", container, PAUSE_IMAGE]))?;
    let archive = work.join("pause.tar");
    run(buildah()
        .args(["push", "--quiet", PAUSE_IMAGE])
        .arg(format!("oci-archive:{}:{PAUSE_IMAGE}", archive.display())))?;
    let archive = archive.display().to_string();
    match ctr(dir, &["images", "import", &archive]) {
        (true, _) => Ok(()),
        (false, out) => Err(TestEnvError::Io {
            what: "importing the pause image into containerd".into(),
            source: std::io::Error::other(out),
        }),
    }
}

/// Runs `command`; its stdout, or an error with its stderr.
fn run(command: &mut Command) -> Result<String> {
    let what = format!("{command:?}");
    let output = command.output().map_err(io(what.clone()))?;
    if output.status.success() {
        Ok(String::from_utf8_lossy(&output.stdout).into_owned())
    } else {
        Err(TestEnvError::Io {
            what,
            source: std::io::Error::other(String::from_utf8_lossy(&output.stderr).into_owned()),
        })
    }
}

fn write_kubelet_config(dir: &Path, plane_dir: &Path) -> Result<PathBuf> {
    let port = free_port()?;
    let healthz = free_port()?;
    // cgroup v1 without systemd: the cgroupfs driver, and v1 allowed (1.34 refuses it by
    // default). No swap check, no eviction and no image garbage collection in a test.
    write(
        dir.join("kubelet/config.yaml"),
        format!(
            "apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
failCgroupV1: false
cgroupDriver: cgroupfs
failSwapOn: false
cgroupRoot: /{CGROUP_ROOT}
containerRuntimeEndpoint: unix://{socket}
address: 0.0.0.0
port: {port}
readOnlyPort: 0
healthzBindAddress: 127.0.0.1
healthzPort: {healthz}
authentication:
  anonymous: {{enabled: false}}
  webhook: {{enabled: false}}
  x509: {{clientCAFile: {ca}}}
authorization:
  mode: AlwaysAllow
imageGCHighThresholdPercent: 100
imageGCLowThresholdPercent: 99
evictionHard: {{}}
evictionPressureTransitionPeriod: 0s
podLogsDir: {logs}
serializeImagePulls: false
resolvConf: /etc/resolv.conf
clusterDomain: cluster.local
protectKernelDefaults: false
makeIPTablesUtilChains: false
nodeStatusUpdateFrequency: 2s
syncFrequency: 10s
",
            socket = socket(dir).display(),
            ca = plane_dir.join("ca.crt").display(),
            logs = dir.join("pod-logs").display(),
        ),
    )
}

fn write_kubelet_kubeconfig(dir: &Path, plane: &ControlPlane) -> Result<PathBuf> {
    let certs = plane.dir();
    write(
        dir.join("kubelet/kubeconfig"),
        format!(
            "apiVersion: v1
kind: Config
clusters:
- name: testenv
  cluster: {{server: {url}, certificate-authority: {ca}}}
users:
- name: system:node:{NODE_NAME}
  user: {{client-certificate: {cert}, client-key: {key}}}
contexts:
- name: testenv
  context: {{cluster: testenv, user: system:node:{NODE_NAME}}}
current-context: testenv
",
            url = plane.url(),
            ca = certs.join("ca.crt").display(),
            cert = certs.join("kubelet.crt").display(),
            key = certs.join("kubelet.key").display(),
        ),
    )
}

fn write_proxy_config(dir: &Path, kubeconfig: &Path) -> Result<PathBuf> {
    // The conntrack sizes at 0: kube-proxy leaves the machine's sysctls alone.
    write(
        dir.join("kube-proxy/config.yaml"),
        format!(
            "apiVersion: kubeproxy.config.k8s.io/v1alpha1
kind: KubeProxyConfiguration
mode: iptables
clusterCIDR: {NODE_POD_CIDR}
hostnameOverride: {NODE_NAME}
clientConnection: {{kubeconfig: {kubeconfig}}}
bindAddress: 0.0.0.0
healthzBindAddress: 127.0.0.1:{healthz}
metricsBindAddress: 127.0.0.1:{metrics}
conntrack: {{maxPerCore: 0, min: 0, tcpEstablishedTimeout: 0s, tcpCloseWaitTimeout: 0s}}
",
            kubeconfig = kubeconfig.display(),
            healthz = free_port()?,
            metrics = free_port()?,
        ),
    )
}

/// Removes what a node left: its containers (through containerd when it answers, then by their
/// cgroups), containerd's shims, the mounts under `dir`, kube-proxy's and the kubelet's
/// iptables rules and the bridge; and with `remove`, `dir` itself (a stopped node keeps its logs
/// there until the next starts).
fn clean(dir: &Path, programs: &Programs, remove: bool) {
    if !dir.exists() {
        return;
    }
    for task in tasks(dir) {
        let _ = ctr(dir, &["tasks", "kill", "--signal", "SIGKILL", &task]);
    }
    // Whatever a dead containerd's shims still run: every process in the node's cgroups.
    for _ in 0..3 {
        if kill_cgroup_members(CGROUP_ROOT) == 0 {
            break;
        }
        std::thread::sleep(Duration::from_millis(300));
    }
    remove_cgroups(CGROUP_ROOT);
    let socket = socket(dir).display().to_string();
    for pid in pids_whose_command_line_has(&socket) {
        crate::process::terminate_pid(pid, Duration::from_secs(2));
    }
    unmount_under(dir);
    let _ = Command::new(&programs.kube_proxy).arg("--cleanup").output();
    for iptables in ["iptables", "ip6tables"] {
        for chain in ["INPUT", "OUTPUT"] {
            while Command::new(iptables)
                .args(["-D", chain, "-j", "KUBE-FIREWALL"])
                .output()
                .is_ok_and(|o| o.status.success())
            {}
        }
        let _ = Command::new(iptables)
            .args(["-F", "KUBE-FIREWALL"])
            .output();
        let _ = Command::new(iptables)
            .args(["-X", "KUBE-FIREWALL"])
            .output();
    }
    let _ = Command::new("ip").args(["link", "delete", BRIDGE]).output();
    if remove && let Err(e) = std::fs::remove_dir_all(dir) {
        eprintln!("testenv: could not remove {}: {e}", dir.display());
    }
}

/// The cgroup hierarchies: `/sys/fs/cgroup` itself on cgroup v2, each controller's (and the
/// named and unified ones) on v1.
fn cgroup_hierarchies() -> Vec<PathBuf> {
    let root = Path::new("/sys/fs/cgroup");
    if root.join("cgroup.procs").is_file() {
        return vec![root.to_path_buf()];
    }
    std::fs::read_dir(root)
        .into_iter()
        .flatten()
        .flatten()
        .map(|e| e.path())
        .filter(|p| p.join("cgroup.procs").is_file())
        .collect()
}

/// Makes [`CGROUP_ROOT`] in every hierarchy (the kubelet wants its cgroupRoot to exist), with
/// the parent's CPUs and memory nodes for cpuset's, which starts empty on v1.
fn make_cgroup_root() -> Result<()> {
    for hierarchy in cgroup_hierarchies() {
        let cgroup = hierarchy.join(CGROUP_ROOT);
        std::fs::create_dir_all(&cgroup).map_err(io(format!("creating {}", cgroup.display())))?;
        for file in ["cpuset.cpus", "cpuset.mems"] {
            let own = std::fs::read_to_string(cgroup.join(file)).unwrap_or_default();
            if cgroup.join(file).is_file() && own.trim().is_empty() {
                let parent = std::fs::read_to_string(hierarchy.join(file)).unwrap_or_default();
                std::fs::write(cgroup.join(file), parent.trim())
                    .map_err(io(format!("writing {}", cgroup.join(file).display())))?;
            }
        }
    }
    Ok(())
}

/// Every cgroup `name` (and below) of every hierarchy, parents before children.
fn cgroups_under(name: &str) -> Vec<PathBuf> {
    let mut found = Vec::new();
    let mut stack: Vec<PathBuf> = cgroup_hierarchies()
        .into_iter()
        .map(|h| h.join(name))
        .filter(|p| p.is_dir())
        .collect();
    while let Some(cgroup) = stack.pop() {
        stack.extend(
            std::fs::read_dir(&cgroup)
                .into_iter()
                .flatten()
                .flatten()
                .map(|e| e.path())
                .filter(|p| p.is_dir()),
        );
        found.push(cgroup);
    }
    found
}

/// Removes the (empty) cgroups `name` and below, children first.
fn remove_cgroups(name: &str) {
    let mut cgroups = cgroups_under(name);
    cgroups.sort_by_key(|p| std::cmp::Reverse(p.components().count()));
    for cgroup in cgroups {
        let _ = std::fs::remove_dir(cgroup);
    }
}

/// SIGKILLs every process in the cgroup `name` (and below) of every hierarchy; how many there
/// were.
fn kill_cgroup_members(name: &str) -> usize {
    let mut killed = 0;
    for cgroup in cgroups_under(name) {
        if let Ok(procs) = std::fs::read_to_string(cgroup.join("cgroup.procs")) {
            for pid in procs.lines().filter_map(|l| l.trim().parse::<i32>().ok()) {
                // SAFETY: kill(2) on a process of the node's own Pods.
                unsafe { libc::kill(pid, libc::SIGKILL) };
                killed += 1;
            }
        }
    }
    killed
}

fn pids_whose_command_line_has(needle: &str) -> Vec<u32> {
    std::fs::read_dir("/proc")
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|entry| {
            let pid: u32 = entry.file_name().to_str()?.parse().ok()?;
            let command_line = std::fs::read(entry.path().join("cmdline")).ok()?;
            String::from_utf8_lossy(&command_line)
                .contains(needle)
                .then_some(pid)
        })
        .filter(|&pid| pid != std::process::id())
        .collect()
}

/// Unmounts every mount point under `dir`, deepest first (lazily when busy).
fn unmount_under(dir: &Path) {
    let Ok(dir) = dir.canonicalize() else { return };
    let mounts = std::fs::read_to_string("/proc/self/mountinfo").unwrap_or_default();
    let mut points: Vec<PathBuf> = mounts
        .lines()
        .filter_map(|line| line.split(' ').nth(4))
        .map(|point| PathBuf::from(point.replace("\\040", " ")))
        .filter(|point| point.starts_with(&dir) && point != &dir)
        .collect();
    points.sort_by_key(|p| std::cmp::Reverse(p.components().count()));
    for point in points {
        let path = std::ffi::CString::new(point.as_os_str().as_encoded_bytes().to_vec());
        if let Ok(path) = path {
            // SAFETY: umount2(2) with a valid C string.
            unsafe {
                if libc::umount2(path.as_ptr(), 0) != 0 {
                    libc::umount2(path.as_ptr(), libc::MNT_DETACH);
                }
            }
        }
    }
}

static SHARED: std::sync::Mutex<Option<&'static TestNode>> = std::sync::Mutex::new(None);

/// The node shared by every test in this test binary, started on first use and stopped (its
/// Pods' containers and network cleaned up) when the binary exits.
pub fn shared_node() -> Result<&'static TestNode> {
    let mut slot = SHARED.lock().unwrap_or_else(|p| p.into_inner());
    if let Some(node) = *slot {
        return Ok(node);
    }
    let node = on_a_thread_of_its_own(TestNode::start)?;
    let node: &'static TestNode = Box::leak(Box::new(node));
    *slot = Some(node);
    extern "C" fn stop_shared() {
        if let Ok(slot) = SHARED.lock()
            && let Some(node) = *slot
        {
            node.stop();
        }
    }
    // SAFETY: registering a plain extern "C" function with no arguments.
    unsafe { libc::atexit(stop_shared) };
    Ok(node)
}
