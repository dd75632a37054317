//! The images images/build.sh builds, run the way a cluster runs them: the operator's own binary,
//! from its image, as user 65532 on a read-only root, sizes a pool on the real API server from the
//! real Prometheus; the worker's binary, from its image, takes jobs from the example queue; and
//! neither image holds anything but its binary (no shell, no package manager). The Python
//! workers' image runs its RQ worker the same way, against a real Redis.
//!
//! buildah runs them (`buildah run --isolation chroot`, no daemon). It cannot make a container's
//! root read-only itself, so `run_from_image` does what a runtime does for readOnlyRootFilesystem:
//! in a mount namespace of its own it makes the mount points, bind-mounts the container's root
//! onto itself read-only, and puts a tmpfs on /run (where buildah writes /run/.containerenv).

mod common;

use std::collections::BTreeSet;
use std::io::{BufRead, BufReader};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use common::{poll_blocking, until};
use k8s_openapi::api::apps::v1::Deployment;
use kube::Api;
use kube::api::PostParams;
use lanepool::api::LanePool;
use lanepool_testenv::{self as testenv, SimulatedWorkers, TestPrometheus};
use serde_json::{Value, json};

const ROOT: &str = env!("CARGO_MANIFEST_DIR");
const VERSION: &str = env!("CARGO_PKG_VERSION");
/// The chart's runAsUser and the images' USER.
const USER: &str = "65532";

/// The registry this test binary pushes the images and the chart to: started once, with the
/// first build of the images, and kept for the binary's life.
fn registry() -> &'static testenv::TestRegistry {
    static REGISTRY: OnceLock<testenv::TestRegistry> = OnceLock::new();
    REGISTRY.get_or_init(|| testenv::TestRegistry::start().expect("the registry starts"))
}

/// Runs images/build.sh once per test binary (cargo makes it a no-op when nothing changed),
/// pushing the images to [`registry`], and returns target/images/.
fn images() -> &'static Path {
    static BUILT: OnceLock<PathBuf> = OnceLock::new();
    BUILT.get_or_init(|| {
        let buildah = Command::new("buildah").arg("--version").output();
        assert!(
            buildah.is_ok_and(|o| o.status.success()),
            "buildah is not installed: run ./tests/setup.sh (it installs Debian's buildah)"
        );
        let dir = testenv::build_and_push_images(&registry().host()).expect("images/build.sh");
        // A storage of this run's own, so no container of an earlier run is in the way.
        let _ = std::fs::remove_dir_all(storage());
        dir
    })
}

/// The size in bytes of the archive images/build.sh wrote for `image`, once its OCI index says
/// it is `ghcr.io/lanepool/<image>:<the crate's version>`.
fn archive_tagged_with_the_version(image: &str) -> u64 {
    let archive = images().join(format!("{image}.tar"));
    let index = Command::new("tar")
        .arg("-xOf")
        .arg(&archive)
        .arg("index.json")
        .output()
        .unwrap();
    let index: Value = serde_json::from_slice(&index.stdout).expect("an OCI index.json");
    assert_eq!(
        index["manifests"][0]["annotations"]["org.opencontainers.image.ref.name"],
        format!("ghcr.io/lanepool/{image}:{VERSION}")
    );
    std::fs::metadata(&archive).unwrap().len()
}

fn storage() -> PathBuf {
    PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("images-buildah")
}

/// buildah with the test's own vfs storage.
fn buildah() -> Command {
    let storage = storage();
    let mut command = Command::new("buildah");
    command
        .arg("--root")
        .arg(storage.join("root"))
        .arg("--runroot")
        .arg(storage.join("run"))
        .args(["--storage-driver", "vfs"]);
    command
}

fn buildah_output(args: &[&str]) -> String {
    let output = buildah().args(args).output().expect("running buildah");
    assert!(
        output.status.success(),
        "buildah {args:?}: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    String::from_utf8_lossy(&output.stdout).trim().to_string()
}

/// A working container made from an OCI archive in target/images/, removed when dropped.
struct Container {
    name: String,
    /// Its root on this machine (vfs: a plain directory).
    root: PathBuf,
}

impl Container {
    fn from_archive(image: &str) -> Self {
        let archive = images().join(format!("{image}.tar"));
        Self::from_image(image, &format!("oci-archive:{}", archive.display()))
    }

    /// From `from`, an image in the test's storage or a transport's reference (oci-archive:…).
    fn from_image(prefix: &str, from: &str) -> Self {
        let name = testenv::unique_name(prefix);
        buildah_output(&["from", "--quiet", "--name", &name, from]);
        let root = PathBuf::from(buildah_output(&["mount", &name]));
        Self { name, root }
    }

    /// The image's configuration (OCIv1 config: User, Entrypoint, Cmd…).
    fn config(&self) -> Value {
        let inspect: Value =
            serde_json::from_str(&buildah_output(&["inspect", &self.name])).unwrap();
        inspect["OCIv1"]["config"].clone()
    }

    /// Every path in the root, relative to it, and the bytes of its files.
    fn files(&self) -> (BTreeSet<String>, u64) {
        fn walk(dir: &Path, root: &Path, paths: &mut BTreeSet<String>, bytes: &mut u64) {
            for entry in std::fs::read_dir(dir).unwrap() {
                let path = entry.unwrap().path();
                let metadata = std::fs::symlink_metadata(&path).unwrap();
                let relative = path.strip_prefix(root).unwrap().display().to_string();
                paths.insert(relative);
                if metadata.is_dir() {
                    walk(&path, root, paths, bytes);
                } else {
                    *bytes += metadata.len();
                }
            }
        }
        let (mut paths, mut bytes) = (BTreeSet::new(), 0);
        walk(&self.root, &self.root, &mut paths, &mut bytes);
        (paths, bytes)
    }
}

impl Drop for Container {
    fn drop(&mut self) {
        let _ = buildah().args(["rm", &self.name]).output();
    }
}

/// A command from a container's root, run by `buildah run` as user 65532 on a read-only root;
/// `volumes` are (host directory, directory under /run) pairs, mounted read-only. Its output is
/// collected; the whole process group is killed when dropped.
struct FromImage {
    child: Child,
    output: Arc<Mutex<Vec<String>>>,
}

fn run_from_image(
    container: &Container,
    volumes: &[(&Path, &str)],
    env: &[(&str, String)],
    argv: &[String],
) -> FromImage {
    // Mount points first (as a runtime makes them before it makes the root read-only), then the
    // read-only root and a tmpfs for /run, then buildah, all in a private mount namespace that
    // ends with the process.
    let mut script = String::from(
        "set -e; root=$1; shift
         mkdir -p \"$root/proc\" \"$root/dev\" \"$root/sys\" \"$root/run\" \"$root/etc\"
         for f in hosts hostname resolv.conf; do [ -e \"$root/etc/$f\" ] || : > \"$root/etc/$f\"; done
         mount --bind \"$root\" \"$root\"
         mount -o remount,bind,ro \"$root\"
         mount -t tmpfs -o size=1m,mode=0755 tmpfs \"$root/run\"\n",
    );
    for (_, under_run) in volumes {
        script.push_str(&format!("mkdir -p \"$root/run/{under_run}\"\n"));
    }
    script.push_str("exec \"$@\"");
    let mut command = Command::new("unshare");
    command
        .args([
            "--mount",
            "--propagation",
            "private",
            "sh",
            "-c",
            &script,
            "sh",
        ])
        .arg(&container.root)
        .arg("buildah")
        .arg("--root")
        .arg(storage().join("root"))
        .arg("--runroot")
        .arg(storage().join("run"))
        .args(["--storage-driver", "vfs", "run", "--isolation", "chroot"])
        .args(["--network", "host", "--user", &format!("{USER}:{USER}")]);
    for (host, under_run) in volumes {
        command
            .arg("--volume")
            .arg(format!("{}:/run/{under_run}:ro", host.display()));
    }
    for (name, value) in env {
        command.arg("--env").arg(format!("{name}={value}"));
    }
    command.arg(&container.name).arg("--").args(argv);
    std::os::unix::process::CommandExt::process_group(&mut command, 0);
    let mut child = command
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("starting unshare and buildah run");
    let output = Arc::new(Mutex::new(Vec::new()));
    for stream in [
        Box::new(child.stdout.take().unwrap()) as Box<dyn std::io::Read + Send>,
        Box::new(child.stderr.take().unwrap()),
    ] {
        let output = output.clone();
        std::thread::spawn(move || {
            for line in BufReader::new(stream).lines().map_while(Result::ok) {
                output.lock().unwrap().push(line);
            }
        });
    }
    FromImage { child, output }
}

impl FromImage {
    fn output(&self) -> String {
        self.output.lock().unwrap().join("\n")
    }

    /// The process named `comm` that buildah started (same process group), once it runs.
    fn process(&self, comm: &str) -> u32 {
        let group = self.child.id();
        let mut found = None;
        poll_blocking(Duration::from_secs(20), Duration::from_millis(100), || {
            found = std::fs::read_dir("/proc").unwrap().find_map(|entry| {
                let pid: u32 = entry.ok()?.file_name().to_str()?.parse().ok()?;
                let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
                let (name, rest) = stat.split_once(" (")?.1.rsplit_once(") ")?;
                let pgrp: u32 = rest.split(' ').nth(2)?.parse().ok()?;
                (name == comm && pgrp == group).then_some(pid)
            });
            found.is_some()
        });
        found.unwrap_or_else(|| {
            panic!(
                "no process {comm} from the image; buildah said:\n{}",
                self.output()
            )
        })
    }

    /// Signals the whole group (buildah and the image's process).
    fn signal(&self, signal: i32) {
        // SAFETY: kill(2) on the process group this test started.
        unsafe { libc::kill(-(self.child.id() as i32), signal) };
    }
}

impl Drop for FromImage {
    fn drop(&mut self) {
        self.signal(libc::SIGKILL);
        let _ = self.child.wait();
    }
}

/// What the kernel says of a process: it runs as 65532 and its root is mounted read-only.
fn assert_runs_as_65532_on_a_read_only_root(pid: u32) {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let uids = status.lines().find(|l| l.starts_with("Uid:")).unwrap();
    assert_eq!(
        uids.split_whitespace().skip(1).collect::<Vec<_>>(),
        [USER; 4],
        "real, effective, saved and filesystem uid"
    );
    let mountinfo = std::fs::read_to_string(format!("/proc/{pid}/mountinfo")).unwrap();
    // The last mount on / is the one the process sees: fields 5 (mount point) and 6 (options).
    let root = mountinfo
        .lines()
        .rfind(|l| l.split(' ').nth(4) == Some("/"))
        .expect("a mount on /");
    let options = root.split(' ').nth(5).unwrap();
    assert!(
        options.split(',').any(|o| o == "ro"),
        "the root is mounted read-only: {root}"
    );
}

// ---- What the images hold ----

#[test]
fn each_image_holds_its_static_binary_and_nothing_else() {
    for (image, binary, expected) in [
        (
            "lanepool",
            "lanepool",
            &[
                "etc",
                "etc/ssl",
                "etc/ssl/certs",
                "etc/ssl/certs/ca-certificates.crt",
                "lanepool",
            ][..],
        ),
        ("lane-worker", "lane-worker", &["lane-worker"][..]),
    ] {
        let container = Container::from_archive(image);
        let (files, bytes) = container.files();
        // No shell, no package manager, no libc: nothing but what the Dockerfile copies.
        for absent in [
            "bin/sh",
            "bin/bash",
            "bin/busybox",
            "usr/bin/apt",
            "usr/bin/dpkg",
            "sbin/apk",
        ] {
            assert!(!files.contains(absent), "{image} holds {absent}");
        }
        assert_eq!(
            files,
            expected
                .iter()
                .map(|s| s.to_string())
                .collect::<BTreeSet<_>>(),
            "{image}'s files"
        );

        let config = container.config();
        assert_eq!(config["User"], format!("{USER}:{USER}"), "{image}");
        assert_eq!(
            config["Entrypoint"],
            json!([format!("/{binary}")]),
            "{image}"
        );

        // The archive is tagged with the crate's version, which is the chart's appVersion: the
        // chart installs the image this builds.
        let size = archive_tagged_with_the_version(image);
        eprintln!(
            "{image}: archive {:.1} MiB, unpacked {:.1} MiB",
            size as f64 / 1048576.0,
            bytes as f64 / 1048576.0
        );
        if image == "lanepool" {
            assert!(
                bytes < 40 << 20,
                "the operator image unpacks to {bytes} bytes"
            );
        }
    }
    let chart = std::fs::read_to_string(format!("{ROOT}/charts/lanepool/Chart.yaml")).unwrap();
    assert!(
        chart.contains(&format!("appVersion: \"{VERSION}\"")),
        "the chart's appVersion is the crate's version {VERSION}"
    );
}

// ---- The operator from its image ----

/// A kubeconfig with the credentials inside it, readable by 65532, in a directory of its own.
fn kubeconfig_for_the_image(plane: &testenv::ControlPlane) -> PathBuf {
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join(testenv::unique_name("kube"));
    std::fs::create_dir_all(&dir).unwrap();
    let flattened = Command::new(testenv::tool("kubectl").unwrap())
        .args(["config", "view", "--raw", "--flatten", "--kubeconfig"])
        .arg(plane.kubeconfig())
        .output()
        .unwrap();
    assert!(flattened.status.success(), "kubectl config view --flatten");
    std::fs::write(dir.join("kubeconfig"), flattened.stdout).unwrap();
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o755)).unwrap();
    std::fs::set_permissions(
        dir.join("kubeconfig"),
        std::fs::Permissions::from_mode(0o644),
    )
    .unwrap();
    dir
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_operator_from_its_image_sizes_a_pool_as_65532_on_a_read_only_root() {
    let plane = testenv::shared().expect("the control plane starts");
    let client = plane.client().await.unwrap();
    let namespace = plane.namespace(&client, "image").await.unwrap();
    let workers = SimulatedWorkers::start().unwrap();
    let prometheus = TestPrometheus::start(&[workers.addr()]).unwrap();
    workers.set_lane(&namespace, "jobs", "urgent", 30.0, 0.020);
    let kube_dir = kubeconfig_for_the_image(plane);
    let metrics_port = testenv::free_port().unwrap();

    let container = Container::from_archive("lanepool");
    let config = container.config();
    // The image's own entrypoint, with the flags a test needs: its namespace, short windows
    // (Prometheus scrapes every second), and Prometheus by name (localhost: the static binary
    // resolves names without glibc's NSS libraries, which the image does not hold).
    let mut argv: Vec<String> = serde_json::from_value(config["Entrypoint"].clone()).unwrap();
    argv.extend(
        [
            "run",
            &format!("--namespaces={namespace}"),
            &format!("--leader-election-namespace={namespace}"),
            "--identity=from-image",
            &format!(
                "--prometheus-url={}",
                prometheus.url().replace("127.0.0.1", "localhost")
            ),
            &format!("--metrics-addr=127.0.0.1:{metrics_port}"),
            "--rate-window=5s",
            "--recent-rate-lookback=5s",
            "--scrape-interval=1s",
            "--job-time-window=5s",
        ]
        .map(String::from),
    );
    let operator = run_from_image(
        &container,
        &[(&kube_dir, "kube")],
        &[("KUBECONFIG", "/run/kube/kubeconfig".into())],
        &argv,
    );
    let pid = operator.process("lanepool");
    assert_runs_as_65532_on_a_read_only_root(pid);

    let metrics: SocketAddr = format!("127.0.0.1:{metrics_port}").parse().unwrap();
    let operator_said = || async { format!("the operator said:\n{}", operator.output()) };
    until(
        30,
        "/readyz answers 200",
        || async { testenv::http_get(metrics, "/readyz").is_ok_and(|(status, _)| status == 200) },
        operator_said,
    )
    .await;

    let yaml = std::fs::read_to_string(format!("{ROOT}/tests/fixtures/formula-pool.yaml")).unwrap();
    let mut manifest: Value = serde_yaml::from_str(&yaml).unwrap();
    manifest["spec"]["interval"] = json!("5s");
    manifest["spec"]
        .as_object_mut()
        .unwrap()
        .remove("prometheus");
    let pool: LanePool = serde_json::from_value(manifest).unwrap();
    Api::<LanePool>::namespaced(client.clone(), &namespace)
        .create(&PostParams::default(), &pool)
        .await
        .unwrap();

    // 30 jobs/s × 20 ms × 1.5 → 1 reserved worker; the other 9 of 10 shared.
    let deployments = Api::<Deployment>::namespaced(client.clone(), &namespace);
    let replicas = |name: &'static str| {
        let deployments = deployments.clone();
        async move { deployments.get_opt(name).await.ok()??.spec?.replicas }
    };
    until(
        60,
        "jobs-urgent-reserved 1 and jobs-shared 9",
        || async {
            replicas("jobs-urgent-reserved").await == Some(1)
                && replicas("jobs-shared").await == Some(9)
        },
        operator_said,
    )
    .await;
    // And a measured rate, which only a working Prometheus connection gives.
    let pools = Api::<LanePool>::namespaced(client.clone(), &namespace);
    until(
        30,
        "a measured arrival rate in the status",
        || async {
            let pool = pools.get("jobs").await.unwrap();
            pool.status.is_some_and(|s| {
                s.lanes
                    .iter()
                    .any(|l| l.arrival_rate_per_second.is_some_and(|r| r > 0.0))
            })
        },
        operator_said,
    )
    .await;

    // SIGTERM ends the operator (the process the image runs, not only buildah).
    operator.signal(libc::SIGTERM);
    let stopped = poll_blocking(Duration::from_secs(15), Duration::from_millis(100), || {
        !Path::new(&format!("/proc/{pid}")).exists()
    });
    assert!(
        stopped.is_some(),
        "the operator did not stop on SIGTERM:\n{}",
        operator.output()
    );
    drop(operator);
    let _ = std::fs::remove_dir_all(&kube_dir);
}

// ---- The example worker from its image ----

/// The example queue (examples/lane_queue), built for this test's profile, with a batch backlog.
struct Queue {
    child: Child,
    addr: SocketAddr,
}

impl Queue {
    fn start(batch_backlog: u32) -> Self {
        let mut build = Command::new(std::env::var("CARGO").unwrap_or_else(|_| "cargo".into()));
        build
            .args(["build", "--quiet", "--example", "lane_queue"])
            .current_dir(ROOT);
        testenv::without_cargos_test_variables(&mut build);
        let exe = std::env::current_exe().unwrap();
        let profile = exe.parent().and_then(Path::parent).unwrap();
        if profile.ends_with("release") {
            build.arg("--release");
        }
        let status = build.status().unwrap();
        assert!(status.success(), "cargo build --example lane_queue");
        let mut child = Command::new(profile.join("examples/lane_queue"))
            .args([
                "--listen=127.0.0.1:0",
                "--urgent-profile=0s=0",
                &format!("--batch-backlog={batch_backlog}"),
                "--batch-rate=0",
                "--batch-ms=5..5",
                "--long-poll=200ms",
            ])
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .unwrap();
        let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
        let addr = lines
            .find_map(|line| {
                let line = line.ok()?;
                line.rsplit_once("listening on http://")?.1.parse().ok()
            })
            .expect("the queue's listening line");
        std::thread::spawn(move || for _ in lines {});
        Self { child, addr }
    }

    /// lanepool_jobs_completed_total{lane=...} from the queue's /metrics.
    fn completed(&self, lane: &str) -> f64 {
        let (_, body) = testenv::http_get(self.addr, "/metrics").unwrap();
        body.lines()
            .find(|l| {
                l.starts_with("lanepool_jobs_completed_total{")
                    && l.contains(&format!("lane=\"{lane}\""))
            })
            .and_then(|l| l.rsplit(' ').next())
            .and_then(|v| v.parse().ok())
            .unwrap_or(0.0)
    }
}

impl Drop for Queue {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

#[test]
fn the_worker_from_its_image_takes_jobs_from_the_example_queue() {
    let queue = Queue::start(20);
    let container = Container::from_archive("lane-worker");
    let argv: Vec<String> =
        serde_json::from_value(container.config()["Entrypoint"].clone()).unwrap();
    let worker = run_from_image(
        &container,
        &[],
        &[
            ("LANEPOOL_LANES", "urgent,batch".into()),
            ("LANEPOOL_ROLE", "shared".into()),
            ("LANEPOOL_POOL", "jobs".into()),
            ("LANEPOOL_QUEUE_URL", format!("http://{}", queue.addr)),
            ("HOSTNAME", "worker-from-image".into()),
        ],
        &argv,
    );
    let pid = worker.process("lane-worker");
    assert_runs_as_65532_on_a_read_only_root(pid);

    let done = poll_blocking(Duration::from_secs(20), Duration::from_millis(100), || {
        queue.completed("batch") >= 20.0
    });
    assert!(
        done.is_some(),
        "{} of 20 batch jobs done; the worker said:\n{}",
        queue.completed("batch"),
        worker.output()
    );
    let output = worker.output();
    assert!(
        output.contains("worker-from-image: batch job"),
        "the worker from the image reported its jobs:\n{output}"
    );
}

// ---- The Python workers from their image ----

impl FromImage {
    /// Waits for the command to end (a command that runs to its end, not a worker).
    fn finished(&mut self, seconds: u64) -> bool {
        // An error from try_wait ends the wait as a timeout does.
        let mut exited = Ok(None);
        poll_blocking(
            Duration::from_secs(seconds),
            Duration::from_millis(100),
            || {
                exited = self.child.try_wait();
                !matches!(exited, Ok(None))
            },
        );
        match exited {
            Ok(Some(status)) => status.success(),
            _ => panic!("still running after {seconds} s:\n{}", self.output()),
        }
    }
}

/// The value of the first series of `metrics` whose line starts with `series` (name and labels).
fn sample(metrics: &str, series: &str) -> Option<f64> {
    metrics
        .lines()
        .find(|l| l.starts_with(series) && l[series.len()..].starts_with(' '))
        .and_then(|l| l.rsplit(' ').next()?.parse().ok())
}

#[test]
fn the_python_worker_image_holds_the_package_its_commands_and_the_demo_jobs() {
    let container = Container::from_archive("python-worker");
    let (files, bytes) = container.files();
    for present in [
        "opt/lanepool/bin/lanepool-rq-worker",
        "opt/lanepool/bin/lanepool-redis-worker",
        "opt/lanepool/bin/celery",
        "app/examples/redis/jobs.py",
        "app/examples/redis/celery_app.py",
    ] {
        assert!(files.contains(present), "python-worker lacks {present}");
    }
    // No pip cache, no compiler, no build backend: only what runs the workers.
    for absent in [
        "root/.cache/pip",
        "usr/bin/gcc",
        "usr/bin/cc",
        "tmp/lanepool-worker",
    ] {
        assert!(!files.contains(absent), "python-worker holds {absent}");
    }
    assert!(
        !files
            .iter()
            .any(|f| f.contains("site-packages/setuptools/")),
        "python-worker holds setuptools"
    );

    let config = container.config();
    assert_eq!(config["User"], format!("{USER}:{USER}"));
    assert_eq!(config["WorkingDir"], "/app");
    assert!(config["ExposedPorts"]["9100/tcp"].is_object(), "{config}");
    // What examples/redis/lanepool-rq.yaml runs, from the working directory.
    assert_eq!(
        config["Cmd"],
        json!(["lanepool-rq-worker", "--path", "examples/redis"])
    );

    let size = archive_tagged_with_the_version("python-worker");
    eprintln!(
        "python-worker: archive {:.1} MiB, unpacked {:.1} MiB",
        size as f64 / 1048576.0,
        bytes as f64 / 1048576.0
    );
    assert!(
        bytes < 250 << 20,
        "the Python image unpacks to {bytes} bytes"
    );
}

#[test]
fn the_rq_worker_from_its_image_takes_an_urgent_job_and_serves_the_lane_metrics() {
    let redis = testenv::TestRedis::start().expect("redis-server starts");
    let container = Container::from_archive("python-worker");
    let metrics_port = testenv::free_port().unwrap();
    // The image's own command, as examples/redis/lanepool-rq.yaml runs it.
    let argv: Vec<String> = serde_json::from_value(container.config()["Cmd"].clone()).unwrap();
    let worker = run_from_image(
        &container,
        &[],
        &[
            ("LANEPOOL_LANES", "urgent,batch".into()),
            ("LANEPOOL_ROLE", "shared".into()),
            ("LANEPOOL_POOL", "jobs".into()),
            ("LANEPOOL_REDIS_URL", redis.url()),
            ("LANEPOOL_METRICS_ADDR", format!("127.0.0.1:{metrics_port}")),
            ("HOSTNAME", "worker-from-image".into()),
        ],
        &argv,
    );
    // The comm of a script run by its #! line: its name, cut to 15 bytes.
    let pid = worker.process("lanepool-rq-wor");
    assert_runs_as_65532_on_a_read_only_root(pid);
    let metrics: SocketAddr = format!("127.0.0.1:{metrics_port}").parse().unwrap();
    let served = poll_blocking(Duration::from_secs(30), Duration::from_millis(200), || {
        testenv::http_get(metrics, "/metrics").is_ok_and(|(status, _)| status == 200)
    });
    assert!(
        served.is_some(),
        "no /metrics within 30 s; the worker said:\n{}",
        worker.output()
    );

    // One urgent job of the demo (examples/redis/jobs.py), enqueued by the image's own RQ.
    let enqueue = format!(
        "from redis import Redis\nfrom rq import Queue\n\
         print(Queue('urgent', connection=Redis.from_url('{}')).enqueue('jobs.sleep_job', 0.05).id)",
        redis.url()
    );
    let mut producer = run_from_image(
        &container,
        &[],
        &[],
        &["python3".into(), "-c".into(), enqueue],
    );
    assert!(producer.finished(30), "enqueue: {}", producer.output());
    // The job's id (a UUID), once the reading thread has it.
    let (mut output, mut job_id) = (String::new(), None);
    poll_blocking(Duration::from_secs(5), Duration::from_millis(50), || {
        output = producer.output();
        job_id = output
            .lines()
            .find(|l| l.len() == 36 && l.matches('-').count() == 4)
            .map(String::from);
        job_id.is_some()
    });
    let job_id = job_id.unwrap_or_else(|| panic!("no job id from the enqueue: {output}"));

    let mut done = String::new();
    let counted = poll_blocking(Duration::from_secs(20), Duration::from_millis(200), || {
        done = testenv::http_get(metrics, "/metrics").unwrap().1;
        sample(
            &done,
            "lanepool_job_duration_seconds_count{lane=\"urgent\"}",
        ) == Some(1.0)
    });
    assert!(
        counted.is_some(),
        "the urgent job not counted within 20 s:\n{done}\nthe worker said:\n{}",
        worker.output()
    );
    assert_eq!(
        sample(&done, "lanepool_job_wait_seconds_count{lane=\"urgent\"}"),
        Some(1.0)
    );
    assert_eq!(
        sample(&done, "lanepool_job_duration_seconds_count{lane=\"batch\"}"),
        Some(0.0)
    );
    assert_eq!(sample(&done, "lanepool_worker_busy"), Some(0.0));
    assert_eq!(
        sample(&done, "lanepool_queue_depth{lane=\"urgent\"}"),
        Some(0.0)
    );
    // The job itself ran: the demo's ledger has it finished.
    assert_eq!(
        redis.integer(&["SISMEMBER", "lanepool-demo:finished", &job_id]),
        1,
        "job {job_id} finished; the worker said:\n{}",
        worker.output()
    );

    // SIGTERM to the worker (as the kubelet sends it): RQ's warm shutdown, and it ends.
    // SAFETY: kill(2) on the worker this test started.
    unsafe { libc::kill(pid as i32, libc::SIGTERM) };
    let stopped = poll_blocking(Duration::from_secs(15), Duration::from_millis(100), || {
        !Path::new(&format!("/proc/{pid}")).exists()
    });
    assert!(
        stopped.is_some(),
        "the worker did not stop on SIGTERM:\n{}",
        worker.output()
    );
    assert!(
        worker.output().contains("warm shut down requested"),
        "{}",
        worker.output()
    );
}

// ---- Images a team builds its own way ----

/// The Debian root images/python-base.sh made for the Python image (kept in target/images/) as
/// an image in the test's storage: a base made on this machine, where no registry need serve one.
fn local_base() -> &'static str {
    static BASE: OnceLock<String> = OnceLock::new();
    BASE.get_or_init(|| {
        let rootfs = images().join("debian-bookworm-python3.tar");
        assert!(
            rootfs.exists(),
            "{} is missing (images/build.sh makes it unless LANEPOOL_PYTHON_BASE is set)",
            rootfs.display()
        );
        let name = "localhost/lanepool-test/debian-base:bookworm";
        let container = buildah_output(&["from", "--quiet", "scratch"]);
        buildah_output(&[
            "add",
            "--quiet",
            &container,
            &rootfs.display().to_string(),
            "/",
        ]);
        buildah_output(&[
            "config",
            "--env",
            "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
            &container,
        ]);
        buildah_output(&["commit", "--quiet", "--rm", &container, name]);
        name.to_string()
    })
}

/// `buildah bud -f dockerfile` on `context`, tagged `tag`, with `--build-arg`s.
fn build(dockerfile: &Path, context: &Path, tag: &str, build_args: &[(&str, &str)]) {
    let mut command = buildah();
    command
        .args(["bud", "--quiet", "--isolation", "chroot", "-f"])
        .arg(dockerfile)
        .args(["-t", tag]);
    for (name, value) in build_args {
        command.arg("--build-arg").arg(format!("{name}={value}"));
    }
    let output = command.arg(context).output().expect("running buildah bud");
    assert!(
        output.status.success(),
        "buildah bud -f {}: {}",
        dockerfile.display(),
        String::from_utf8_lossy(&output.stderr)
    );
}

/// A directory of the test's own under its target tmpdir.
fn scratch_dir(prefix: &str) -> PathBuf {
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join(testenv::unique_name(prefix));
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// Runs `argv` from `container` as 65532 on its read-only root, to its end; its output once the
/// reading threads have `expected` in it (or whatever they have after 5 s).
fn run_to_the_end(container: &Container, argv: &[&str], expected: &str) -> String {
    let argv: Vec<String> = argv.iter().map(|a| a.to_string()).collect();
    let mut command = run_from_image(container, &[], &[], &argv);
    assert!(command.finished(60), "{argv:?}: {}", command.output());
    let mut output = String::new();
    poll_blocking(Duration::from_secs(5), Duration::from_millis(50), || {
        output = command.output();
        output.contains(expected)
    });
    output
}

/// images/lanepool-from-source.Dockerfile with its build stage (`FROM ${BUILDER} AS build` and the
/// compile under it) replaced by `FROM <binary_image> AS build`; the global ARGs and the runtime
/// stage are the file's own lines.
fn with_build_stage_from(dockerfile: &str, binary_image: &str) -> String {
    let lines: Vec<&str> = dockerfile.lines().collect();
    let froms: Vec<usize> = (0..lines.len())
        .filter(|&i| lines[i].starts_with("FROM "))
        .collect();
    assert_eq!(froms.len(), 2, "a build stage and a runtime stage");
    assert_eq!(lines[froms[0]], "FROM ${BUILDER} AS build");
    assert_eq!(lines[froms[1]], "FROM ${BASE}");
    let mut derived: Vec<String> = lines[..froms[0]].iter().map(|l| l.to_string()).collect();
    derived.push(format!("FROM {binary_image} AS build"));
    derived.extend(lines[froms[1]..].iter().map(|l| l.to_string()));
    derived.join("\n") + "\n"
}

#[test]
fn the_operator_built_from_source_runs_its_binary_as_65532_on_the_base_it_is_given() {
    let base = local_base();
    let shipped =
        std::fs::read_to_string(format!("{ROOT}/images/lanepool-from-source.Dockerfile")).unwrap();
    // The Rust stage compiles for ten minutes and more on two cores: the binary images/build.sh
    // compiled (the same static release build, at /lanepool) stands in for its output.
    let binary_image = format!("oci-archive:{}", images().join("lanepool.tar").display());
    let dir = scratch_dir("from-source");
    let dockerfile = dir.join("lanepool-from-source.Dockerfile");
    std::fs::write(&dockerfile, with_build_stage_from(&shipped, &binary_image)).unwrap();
    let tag = "localhost/lanepool-test/lanepool-from-source:latest";
    build(
        &dockerfile,
        Path::new(ROOT),
        tag,
        &[("BASE", base), ("VERSION", VERSION)],
    );

    let container = Container::from_image("from-source", tag);
    let config = container.config();
    assert_eq!(config["User"], format!("{USER}:{USER}"));
    assert_eq!(config["Entrypoint"], json!(["/lanepool"]));
    // The chart passes `run` and its flags as args: the entrypoint must be the binary alone.
    assert_eq!(config["Cmd"], json!(["run"]));
    assert_eq!(
        config["Labels"]["org.opencontainers.image.version"],
        VERSION
    );
    let (files, _) = container.files();
    for present in ["lanepool", "etc/debian_version", "usr/bin/python3"] {
        assert!(files.contains(present), "the image lacks {present}");
    }

    let output = run_to_the_end(
        &container,
        &["/lanepool", "--version"],
        &format!("lanepool {VERSION}"),
    );
    assert!(
        output.lines().any(|l| l == format!("lanepool {VERSION}")),
        "/lanepool --version said: {output}"
    );
    drop(container);
    let _ = buildah().args(["rmi", tag]).output();
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn a_team_adds_its_jobs_to_the_python_worker_image_with_from_and_copy() {
    // The image by the name a team pulls it by.
    let image = format!("ghcr.io/lanepool/python-worker:{VERSION}");
    let archive = images().join("python-worker.tar");
    buildah_output(&[
        "pull",
        "--quiet",
        &format!("oci-archive:{}", archive.display()),
    ]);
    let dir = scratch_dir("team-jobs");
    std::fs::write(
        dir.join("team_jobs.py"),
        "def double(n):\n    return 2 * n\n",
    )
    .unwrap();
    std::fs::write(
        dir.join("Containerfile"),
        format!("FROM {image}\nCOPY team_jobs.py /app/\n"),
    )
    .unwrap();
    let tag = "localhost/lanepool-test/team-workers:latest";
    build(&dir.join("Containerfile"), &dir, tag, &[]);

    let container = Container::from_image("team-workers", tag);
    let config = container.config();
    assert_eq!(config["User"], format!("{USER}:{USER}"));
    assert_eq!(config["WorkingDir"], "/app");
    assert_eq!(
        config["Cmd"],
        json!(["lanepool-rq-worker", "--path", "examples/redis"])
    );
    // RQ finds a job's function by its dotted name from the working directory, as
    // `lanepool-rq-worker --path .` would; the package beside it.
    let output = run_to_the_end(
        &container,
        &[
            "python3",
            "-c",
            "import lanepool_worker\nfrom rq.utils import import_attribute\n\
             print('double(21) =', import_attribute('team_jobs.double')(21))",
        ],
        "double(21) = 42",
    );
    assert!(output.contains("double(21) = 42"), "{output}");
    let output = run_to_the_end(
        &container,
        &["lanepool-rq-worker", "--help"],
        "usage: lanepool-rq-worker",
    );
    assert!(output.contains("usage: lanepool-rq-worker"), "{output}");
    drop(container);
    let _ = buildah().args(["rmi", tag]).output();
    let _ = std::fs::remove_dir_all(&dir);
}

/// `helm` (the pinned one) with a home of this test's own; (success, stdout, stderr).
fn helm(args: &[&str]) -> (bool, String, String) {
    let home = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("images-helm-home");
    testenv::helm(&home, args)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_chart_and_images_install_from_the_registry_by_digest() {
    let dir = images();
    let registry = registry();
    // The images are in the registry under the crate's version, at the digests the build wrote.
    for name in ["lanepool", "lane-worker", "python-worker"] {
        let written = std::fs::read_to_string(dir.join(format!("{name}.digest")))
            .unwrap_or_else(|e| panic!("target/images/{name}.digest: {e}"));
        let served = registry.digest(&format!("lanepool/{name}"), VERSION);
        assert_eq!(served.as_deref(), Some(written.trim()), "{name}:{VERSION}");
    }
    let push = Command::new(format!("{ROOT}/charts/push.sh"))
        .arg(registry.host())
        .env("LANEPOOL_TOOLS_DIR", testenv::tools_dir())
        .output()
        .expect("running charts/push.sh");
    assert!(
        push.status.success(),
        "charts/push.sh: {}",
        String::from_utf8_lossy(&push.stderr)
    );
    let chart = format!("oci://{}/charts/lanepool", registry.host());
    // `helm show readme` says what the chart's README says: how to install it from a registry.
    let (ok, readme, stderr) = helm(&[
        "show",
        "readme",
        &chart,
        "--version",
        VERSION,
        "--plain-http",
    ]);
    assert!(ok, "helm show readme: {stderr}");
    assert!(
        readme.starts_with("# lanepool") && readme.contains("helm install lanepool oci://"),
        "{readme}"
    );
    let (ok, values, stderr) = helm(&[
        "show",
        "chart",
        &chart,
        "--version",
        VERSION,
        "--plain-http",
    ]);
    assert!(ok, "helm show chart: {stderr}");
    assert!(
        values.contains(&format!("appVersion: {VERSION}")),
        "{values}"
    );

    // Installed from the registry into the real API server, pinned to the pushed digest.
    let plane = testenv::shared().expect("the control plane starts");
    let client = plane.client().await.unwrap();
    let namespace = plane.namespace(&client, "oci-install").await.unwrap();
    let digest = std::fs::read_to_string(dir.join("lanepool.digest")).unwrap();
    let repository = format!("{}/lanepool/lanepool", registry.host());
    let kubeconfig = plane.kubeconfig().display().to_string();
    let (ok, stdout, stderr) = helm(&[
        "install",
        "lanepool",
        &chart,
        "--version",
        VERSION,
        "--plain-http",
        "--namespace",
        &namespace,
        "--kubeconfig",
        &kubeconfig,
        "--set",
        &format!("image.repository={repository}"),
        "--set",
        &format!("image.digest={}", digest.trim()),
        "--set",
        "prometheusUrl=http://127.0.0.1:9",
        "--set",
        "rbac.podAdmissionPolicy=false",
        "--set",
        // The shared control plane has the CRD already (as a cluster whose CRD is managed apart).
        "crds.enabled=false",
    ]);
    assert!(ok, "helm install from {chart}: {stderr}\n{stdout}");
    let deployment = Api::<Deployment>::namespaced(client.clone(), &namespace)
        .get("lanepool")
        .await
        .expect("the operator's Deployment");
    let image = deployment.spec.unwrap().template.spec.unwrap().containers[0]
        .image
        .clone()
        .unwrap();
    assert_eq!(image, format!("{repository}@{}", digest.trim()));
    let (ok, _, stderr) = helm(&[
        "uninstall",
        "lanepool",
        "--namespace",
        &namespace,
        "--kubeconfig",
        &kubeconfig,
    ]);
    assert!(ok, "helm uninstall: {stderr}");
}
