//! A new user's path on a real node: the images and the chart from an OCI registry, `helm
//! install` as the README says, the operator running as two Pods with the chart's defaults, a
//! Prometheus that finds the workers with examples/prometheus/scrape-config.yaml, and the
//! README's first LanePool (RQ workers on Redis, in containers of the Python worker image) sized
//! from its load, reached through kubectl. Then day 2: the leader's container killed, a pool whose image does
//! not exist, `helm upgrade` to a new chart version and `helm uninstall`.
//!
//! The node is the pinned kubelet with Debian's containerd and runc ([`testenv::TestNode`]):
//! every Pod here is a container pulled from the registry.

use std::collections::BTreeMap;
use std::net::IpAddr;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use k8s_openapi::jiff::Timestamp;
use lanepool_testenv::{self as testenv, TestNode, TestPrometheus, TestRedis, TestRegistry};
use serde_json::Value;

mod common;
use common::Killed;
use common::node::{Kubectl, pool_scrape_configs};

const ROOT: &str = env!("CARGO_MANIFEST_DIR");
const VERSION: &str = env!("CARGO_PKG_VERSION");
/// The release namespace of the README's install.
const SYSTEM: &str = "lanepool-system";
/// The README's first pool is applied as shipped: into the default namespace.
const POOLS: &str = "default";
/// The example's urgent job time (its jobTime fallback) and the batch jobs of produce.py.
const URGENT_MS: u64 = 50;
const BATCH_MS: &str = "2000..4000";
/// The urgent lane's arrival rate (the long window's) in a LanePool's status.
const URGENT_RATE: &str = "{.status.lanes[?(@.name==\"urgent\")].arrivalRatePerSecond}";
/// The urgent lane's reserve in a LanePool's status.
const URGENT_RESERVE: &str = "{.status.lanes[?(@.name==\"urgent\")].reserve}";

/// The node's smallest proof: a Pod of the sandbox image runs as a container, reaches Running,
/// and its container is a containerd task.
#[tokio::test]
async fn the_node_runs_a_pod_as_a_container() {
    let node = testenv::shared_node().expect("the node starts");
    let kubectl = Kubectl(node);
    let manifest = node.dir().join("smoke.yaml");
    std::fs::write(
        &manifest,
        "apiVersion: v1\nkind: Pod\nmetadata: {name: smoke, namespace: default}\n\
         spec:\n  automountServiceAccountToken: false\n  containers:\n  \
         - {name: pause, image: 'localhost/lanepool-pause:1', imagePullPolicy: Never}\n",
    )
    .unwrap();
    kubectl.ok(&["apply", "-f", &manifest.display().to_string()]);
    let took = testenv::until(60, "the smoke Pod Running", || async {
        kubectl.get("pod/smoke", POOLS, "{.status.phase}") == "Running"
    })
    .await;
    eprintln!(
        "node up in {:.1?}; a Pod Running after {took:.1?}",
        node.startup
    );
    let id = kubectl.get(
        "pod/smoke",
        POOLS,
        "{.status.containerStatuses[0].containerID}",
    );
    let id = id
        .strip_prefix("containerd://")
        .expect("a containerd container");
    let (ok, tasks) = node.ctr(&["tasks", "list", "--quiet"]);
    assert!(ok && tasks.lines().any(|t| t == id), "{id} not in {tasks}");
    kubectl.ok(&["delete", "pod", "smoke", "-n", POOLS, "--wait=false"]);
}

/// What the README's install needs beside the cluster: a registry (the images and the chart),
/// Redis (the broker the workers and the producer share) and Prometheus, the last two reachable
/// from Pods at the host's address.
struct World {
    node: &'static TestNode,
    kubectl: Kubectl,
    registry: TestRegistry,
    redis: TestRedis,
    prometheus: TestPrometheus,
    producer_metrics: u16,
    helm_home: PathBuf,
}

impl World {
    fn start() -> Self {
        let node = testenv::shared_node().expect("the node starts");
        let registry = TestRegistry::start().expect("the registry starts");
        let redis = TestRedis::start_reachable_at(node.host()).expect("redis-server starts");
        let producer_metrics = testenv::free_port().unwrap();
        let prometheus =
            TestPrometheus::start_scraping(&pool_scrape_configs(node, producer_metrics, "1s"))
                .expect("prometheus starts");
        Self {
            node,
            kubectl: Kubectl(node),
            registry,
            redis,
            prometheus,
            producer_metrics,
            helm_home: node.dir().join("helm-home"),
        }
    }

    fn host(&self) -> IpAddr {
        self.node.host()
    }

    /// `helm` with the node's kubeconfig; its stdout, or a panic with what it said.
    fn helm(&self, args: &[&str]) -> String {
        let kubeconfig = self.node.plane().kubeconfig().display().to_string();
        let args = [args, &["--kubeconfig", &kubeconfig]].concat();
        let (ok, stdout, stderr) = testenv::helm(&self.helm_home, &args);
        assert!(ok, "helm {}: {stderr}\n{stdout}", args.join(" "));
        stdout
    }

    /// Starts produce.py: urgent jobs at `urgent_rate` (a profile such as `0s=10,60s=40`)
    /// beside a batch backlog, for `seconds`; it counts what it submits for Prometheus.
    fn produce(&self, urgent_rate: &str, seconds: u64) -> Killed {
        let python = testenv::python_program("python").expect("./tests/setup.sh made it");
        let child = Command::new(python)
            .arg(Path::new(ROOT).join("examples/redis/produce.py"))
            .args(["--queue", "rq", "--url", &self.redis.url()])
            .args(["--namespace", POOLS, "--pool", "jobs"])
            .args(["--duration", &seconds.to_string()])
            .args(["--metrics-port", &self.producer_metrics.to_string()])
            .args(["--lane", "urgent", "--rate", urgent_rate])
            .args(["--job-ms", &URGENT_MS.to_string()])
            .args(["--lane", "batch", "--rate", "0", "--backlog", "200"])
            .args(["--job-ms", BATCH_MS])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("starting produce.py");
        Killed(child)
    }

    /// The pool's reserve for urgent as its status says, and the reserved Deployment's
    /// replicas.
    fn reserve(&self) -> (String, String) {
        (
            self.kubectl.get("lanepool/jobs", POOLS, URGENT_RESERVE),
            self.kubectl
                .get("deployment/jobs-urgent-reserved", POOLS, "{.spec.replicas}"),
        )
    }

    /// The Pods labelled with `pool`, as kubectl gives them.
    fn pods_of(&self, pool: &str) -> Vec<Value> {
        let selector = format!("lanepool.dev/pool={pool}");
        let pods = self
            .kubectl
            .json(&["get", "pods", "-n", POOLS, "-l", &selector]);
        pods["items"].as_array().cloned().unwrap_or_default()
    }

    /// The restarts of every container of `pool`'s Pods, summed.
    fn container_restarts(&self, pool: &str) -> i64 {
        self.pods_of(pool)
            .iter()
            .flat_map(|pod| {
                pod["status"]["containerStatuses"]
                    .as_array()
                    .cloned()
                    .unwrap_or_default()
            })
            .map(|c| c["restartCount"].as_i64().unwrap_or(0))
            .sum()
    }

    /// The names of the ReplicaSets of the pool `jobs`.
    fn pool_replicasets(&self) -> Vec<String> {
        let (_, names) = self.kubectl.run(&[
            "get",
            "replicasets",
            "-n",
            POOLS,
            "-l",
            "lanepool.dev/pool=jobs",
            "-o",
            "name",
        ]);
        let mut names: Vec<String> = names.lines().map(str::to_owned).collect();
        names.sort();
        names
    }

    /// The pool `jobs`'s decisions as its `Scaled` events say them, oldest first, with when: what
    /// a failed assertion of an undisturbed pool prints, so a resize shows which rate it
    /// followed and over what window.
    fn decisions(&self) -> String {
        let (_, events) = self.kubectl.run(&[
            "get",
            "events",
            "-n",
            POOLS,
            "--field-selector",
            "involvedObject.name=jobs,reason=Scaled",
            "--sort-by",
            ".metadata.creationTimestamp",
            "-o",
            "custom-columns=AT:.metadata.creationTimestamp,MESSAGE:.message",
        ]);
        events
    }

    /// The uids of the running worker Pods of the pool `jobs`.
    fn worker_uids(&self) -> Vec<String> {
        let mut uids: Vec<String> = self
            .pods_of("jobs")
            .iter()
            .filter(|pod| pod["metadata"]["deletionTimestamp"].is_null())
            .map(|pod| pod["metadata"]["uid"].as_str().unwrap().to_owned())
            .collect();
        uids.sort();
        uids
    }

    /// Pushes the chart again as the next patch version (its appVersion and images the same),
    /// as a release of a chart-only change would; returns that version.
    fn push_next_chart_version(&self, registry: &str) -> String {
        let (major_minor, patch) = VERSION.rsplit_once('.').unwrap();
        let next = format!("{major_minor}.{}", patch.parse::<u32>().unwrap() + 1);
        let copy = self.node.dir().join("chart-next");
        let _ = std::fs::remove_dir_all(&copy);
        let status = Command::new("cp")
            .args(["-r", &format!("{ROOT}/charts/lanepool")])
            .arg(&copy)
            .status()
            .unwrap();
        assert!(status.success());
        let chart_yaml = copy.join("Chart.yaml");
        let text = std::fs::read_to_string(&chart_yaml).unwrap();
        let text = replace_once(
            &text,
            &format!("\nversion: {VERSION}\n"),
            &format!("\nversion: {next}\n"),
        );
        std::fs::write(&chart_yaml, text).unwrap();
        let out = self.node.dir().display().to_string();
        let (ok, _, stderr) = testenv::helm(
            &self.helm_home,
            &[
                "package",
                &copy.display().to_string(),
                "--destination",
                &out,
            ],
        );
        assert!(ok, "helm package: {stderr}");
        let package = format!("{out}/lanepool-{next}.tgz");
        let (ok, _, stderr) = testenv::helm(
            &self.helm_home,
            &[
                "push",
                &package,
                &format!("oci://{registry}/charts"),
                "--plain-http",
            ],
        );
        assert!(ok, "helm push: {stderr}");
        next
    }

    /// The worker Pods of `pool` that run, are ready, and are not leaving.
    /// Runs a Pod of `image` in `namespace` that sends `POST /drain?seconds=3600`,
    /// `/stand-in?lanes=batch&seconds=3600` and `/drain?seconds=0` to each of `addresses`, with
    /// no credential: what the workers answered, counted (`401 x30`; `unreachable` for no
    /// answer), from the Pod's termination message.
    async fn steer_from_a_pod(&self, namespace: &str, image: &str, addresses: &[String]) -> String {
        let script = r#"
import collections, sys, urllib.error, urllib.request
answers = collections.Counter()
for address in sys.argv[1:]:
    for path in ("/drain?seconds=3600", "/stand-in?lanes=batch&seconds=3600", "/drain?seconds=0"):
        request = urllib.request.Request(f"http://{address}{path}", data=b"", method="POST")
        try:
            answers[urllib.request.urlopen(request, timeout=3).status] += 1
        except urllib.error.HTTPError as error:
            answers[error.code] += 1
        except OSError:
            answers["unreachable"] += 1
with open("/dev/termination-log", "w") as log:
    log.write(", ".join(f"{k} x{v}" for k, v in sorted(answers.items(), key=str)))
"#;
        let mut command = vec!["python3", "-c", script];
        command.extend(addresses.iter().map(String::as_str));
        let pod = serde_json::json!({
            "apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": "steer", "namespace": namespace},
            "spec": {
                "restartPolicy": "Never",
                "containers": [{
                    "name": "steer", "image": image,
                    "command": command,
                }],
            },
        });
        let file = self.node.dir().join(format!("steer-{namespace}.json"));
        std::fs::write(&file, pod.to_string()).unwrap();
        self.kubectl
            .ok(&["apply", "-f", &file.display().to_string()]);
        let phase = "{.status.phase}";
        testenv::until(120, "the steering Pod ran", || async {
            self.kubectl.get("pod/steer", namespace, phase) == "Succeeded"
        })
        .await;
        let message = "{.status.containerStatuses[0].state.terminated.message}";
        let answers = self.kubectl.get("pod/steer", namespace, message);
        self.kubectl
            .ok(&["delete", "pod", "steer", "-n", namespace, "--wait=false"]);
        answers
    }

    fn running_workers(&self, pool: &str) -> usize {
        self.pods_of(pool)
            .iter()
            .filter(|pod| pod["metadata"]["deletionTimestamp"].is_null())
            .filter(|pod| {
                pod["status"]["containerStatuses"]
                    .as_array()
                    .is_some_and(|c| c.iter().all(|c| c["ready"] == true))
            })
            .count()
    }
}

/// Replaces `from`, which must be in `text` exactly once.
fn replace_once(text: &str, from: &str, to: &str) -> String {
    assert_eq!(text.matches(from).count(), 1, "{from:?} once in {text}");
    text.replace(from, to)
}

/// The README's first LanePool, changed only where the README says to change it for a
/// cluster: the image (the Python worker image from the registry) and LANEPOOL_REDIS_URL.
fn readme_pool(image: &str, redis_url: &str) -> String {
    let shipped =
        std::fs::read_to_string(Path::new(ROOT).join("examples/redis/lanepool-rq.yaml")).unwrap();
    let readme = std::fs::read_to_string(Path::new(ROOT).join("README.md")).unwrap();
    assert!(
        readme.contains("kubectl apply -f examples/redis/lanepool-rq.yaml"),
        "the README's first pool is examples/redis/lanepool-rq.yaml"
    );
    let replace_once = |text: &str, from: &str, to: &str| {
        assert_eq!(
            text.matches(from).count(),
            1,
            "{from:?} once in the example"
        );
        text.replace(from, to)
    };
    let pool = replace_once(
        &shipped,
        "image: lanepool-python-worker",
        &format!("image: {image}"),
    );
    replace_once(
        &pool,
        "value: redis://127.0.0.1:6379/0",
        &format!("value: {redis_url}"),
    )
}

fn elapsed(since: Instant) -> String {
    format!("{:.0} s", since.elapsed().as_secs_f64())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_new_user_installs_from_the_registry_and_the_first_pool_sizes_itself_on_a_real_node() {
    let began = Instant::now();
    let world = World::start();
    let kubectl = &world.kubectl;
    let registry = world.registry.host();

    // The release: images and chart pushed as the README says (REGISTRY=127.0.0.1:PORT).
    let images = testenv::build_and_push_images(&registry).expect("images/build.sh");
    testenv::push_chart(&registry).expect("charts/push.sh");
    let worker_digest = std::fs::read_to_string(images.join("python-worker.digest"))
        .expect("images/build.sh pushed the Python worker image");
    eprintln!("[{}] images and chart in the registry", elapsed(began));

    // helm install, as the README's: only the registry's address and Prometheus's differ,
    // --plain-http for a registry on this machine, and its scrape interval; two replicas elect a
    // leader.
    let chart = format!("oci://{registry}/charts/lanepool");
    let prometheus_url = format!("http://{}:{}", world.host(), world.prometheus.port());
    world.helm(&[
        "install",
        "lanepool",
        &chart,
        "--version",
        VERSION,
        "--plain-http",
        "-n",
        SYSTEM,
        "--create-namespace",
        "--set",
        &format!("image.repository={registry}/lanepool/lanepool"),
        "--set",
        &format!("prometheusUrl={prometheus_url}"),
        "--set",
        "replicaCount=2",
        // How often this Prometheus scrapes (every second, where the flag's default is 15 s):
        // the operator judges a recent rate's noise by it.
        "--set",
        "extraArgs={--scrape-interval=1s}",
        "--wait",
        "--timeout",
        "120s",
    ]);
    let operator = kubectl.json(&["get", "deployment", "lanepool", "-n", SYSTEM]);
    assert_eq!(operator["status"]["readyReplicas"], 2, "{operator:#}");
    let pod_spec = &operator["spec"]["template"]["spec"];
    assert_eq!(pod_spec["securityContext"]["runAsNonRoot"], true);
    assert_eq!(
        pod_spec["containers"][0]["securityContext"]["readOnlyRootFilesystem"],
        true
    );
    let leader = testenv::until(60, "a replica holds the Lease", || async {
        !kubectl
            .get("lease/lanepool-operator", SYSTEM, "{.spec.holderIdentity}")
            .is_empty()
    })
    .await;
    eprintln!(
        "[{}] the operator runs as 2 Pods; a leader {leader:.0?} after",
        elapsed(began)
    );

    // The README's first LanePool, sized from its load.
    let image = format!("{registry}/lanepool/python-worker:{VERSION}");
    let pool = readme_pool(&image, &world.redis.url_at(world.host()));
    let file = world.node.dir().join("lanepool-rq.yaml");
    std::fs::write(&file, pool).unwrap();
    let _normal = world.produce("10", 600);
    kubectl.ok(&["apply", "-f", &file.display().to_string()]);
    testenv::until(120, "the pool's 10 workers run in containers", || async {
        world.running_workers("jobs") == 10
    })
    .await;
    let pods = world.pods_of("jobs");
    let first = &pods[0]["status"]["containerStatuses"][0];
    assert!(
        first["imageID"]
            .as_str()
            .is_some_and(|id| id.ends_with(worker_digest.trim())),
        "the worker runs the pushed image: {first:#}"
    );
    eprintln!("[{}] 10 workers run", elapsed(began));
    // Pods without the pool's credential, one in another namespace and one in the pool's own,
    // try to stop every worker for an hour and point it at batch: every answer is 401, and the
    // rest of this test (the urgent wait at 10/s, the reserve's growth) runs on those workers.
    let addresses: Vec<String> = pods
        .iter()
        .filter(|pod| pod["metadata"]["deletionTimestamp"].is_null())
        .filter(|pod| pod["status"]["phase"] == "Running")
        .filter_map(|pod| {
            pod["status"]["podIP"]
                .as_str()
                .map(|ip| format!("{ip}:9100"))
        })
        .collect();
    kubectl.ok(&["create", "namespace", "intruder"]);
    for namespace in ["intruder", POOLS] {
        let answers = world.steer_from_a_pod(namespace, &image, &addresses).await;
        // Every answer is a 401; a worker stopped meanwhile (a scale-down) answers nothing.
        let counts: BTreeMap<&str, usize> = answers
            .split(", ")
            .filter_map(|part| part.split_once(" x"))
            .map(|(what, n)| (what, n.parse().unwrap_or(0)))
            .collect();
        assert!(
            counts
                .keys()
                .all(|what| ["401", "unreachable"].contains(what))
                && counts.get("401").copied().unwrap_or(0) >= 3 * 9,
            "a Pod in {namespace} without the credential: {answers}"
        );
        eprintln!(
            "[{}] a Pod in {namespace} sent /drain and /stand-in to every worker: {answers}",
            elapsed(began)
        );
    }
    let calm = testenv::until(120, "urgent measured at about 10/s", || async {
        let rate = kubectl.get("lanepool/jobs", POOLS, URGENT_RATE);
        rate.parse::<f64>().is_ok_and(|r| (7.0..=13.0).contains(&r))
    })
    .await;
    let (calm_reserve, _) = world.reserve();
    // 20 s at 10/s with that reserve: the urgent wait p99 against the job time, in containers.
    let from = testenv::now_unix();
    tokio::time::sleep(Duration::from_secs(20)).await;
    let calm_p99 = testenv::p99(world.redis.rq_urgent_waits(from, testenv::now_unix()));
    eprintln!(
        "[{}] at 10/s: reserve {calm_reserve} ({calm:.0?} to measure); urgent wait p99 \
         {:.1} ms (job {URGENT_MS} ms)",
        elapsed(began),
        calm_p99 * 1000.0
    );
    assert_eq!(
        kubectl.get(
            "lanepool/jobs",
            POOLS,
            "{.status.conditions[?(@.type==\"Ready\")].status}"
        ),
        "True"
    );

    // A spike: urgent at 40/s; the reserve grows to carry it.
    drop(_normal);
    let _spike = world.produce("40", 600);
    let calm_n: i32 = calm_reserve.parse().unwrap_or(0);
    let grew = testenv::until(90, "the reserve grows for 40/s", || async {
        let (status, replicas) = world.reserve();
        status.parse::<i32>().is_ok_and(|r| r > calm_n) && status == replicas
    })
    .await;
    let (spike_reserve, _) = world.reserve();
    let from = testenv::now_unix();
    tokio::time::sleep(Duration::from_secs(10)).await;
    let spike_p99 = testenv::p99(world.redis.rq_urgent_waits(from, testenv::now_unix()));
    eprintln!(
        "[{}] at 40/s: reserve {spike_reserve} ({grew:.0?} to grow); urgent wait p99 {:.1} ms \
         over the next 10 s",
        elapsed(began),
        spike_p99 * 1000.0
    );
    drop(_spike);
    let _calm_again = world.produce("10", 600);

    // A pool whose image does not exist says so in its status.
    let missing = readme_pool(
        &format!("{registry}/lanepool/no-such-worker:{VERSION}"),
        &world.redis.url_at(world.host()),
    );
    let missing = replace_once(&missing, "\n  name: jobs\n", "\n  name: missing\n");
    let missing = replace_once(&missing, "totalWorkers: 10", "totalWorkers: 2");
    let file = world.node.dir().join("missing.yaml");
    std::fs::write(&file, missing).unwrap();
    kubectl.ok(&["apply", "-f", &file.display().to_string()]);
    let ready = "{.status.conditions[?(@.type==\"Ready\")]}";
    let said = testenv::until(90, "the pool with no image says so", || async {
        let ready = kubectl.get("lanepool/missing", POOLS, ready);
        ready.contains("\"status\":\"False\"") && ready.contains("no-such-worker")
    })
    .await;
    let condition = kubectl.get("lanepool/missing", POOLS, ready);
    eprintln!(
        "[{}] the pool with no image, {said:.0?} after: {condition}",
        elapsed(began)
    );
    assert!(
        condition.contains("ErrImagePull") || condition.contains("ImagePullBackOff"),
        "{condition}"
    );

    // The leader's container killed (SIGKILL: it cannot hand the Lease over): the kubelet
    // restarts it, a live replica renews the Lease (the standby once the Lease runs out, or the
    // restarted container, whose identity is its Pod's, at once), and the first pool goes on
    // being sized: back at 10/s, its reserve comes down.
    let lease = "lease/lanepool-operator";
    let holder = kubectl.get(lease, SYSTEM, "{.spec.holderIdentity}");
    let container = kubectl.get(
        &format!("pod/{holder}"),
        SYSTEM,
        "{.status.containerStatuses[0].containerID}",
    );
    let container = container
        .strip_prefix("containerd://")
        .expect("a container");
    let (ok, out) = world
        .node
        .ctr(&["tasks", "kill", "--signal", "SIGKILL", container]);
    assert!(ok, "ctr tasks kill: {out}");
    let killed_at = Timestamp::now();
    let restarted = testenv::until(60, "the killed operator container restarts", || async {
        let pod = format!("pod/{holder}");
        kubectl.get(&pod, SYSTEM, "{.status.containerStatuses[0].restartCount}") == "1"
            && kubectl.get(&pod, SYSTEM, "{.status.containerStatuses[0].ready}") == "true"
    })
    .await;
    let renewed = testenv::until(60, "a live replica renews the Lease", || async {
        let renewed = kubectl.get(lease, SYSTEM, "{.spec.renewTime}");
        renewed
            .parse::<Timestamp>()
            .is_ok_and(|at| at > killed_at + Duration::from_secs(1))
    })
    .await;
    let new_holder = kubectl.get(lease, SYSTEM, "{.spec.holderIdentity}");
    let who = match new_holder == holder {
        true => "the restarted replica leads again",
        false => "the standby leads",
    };
    eprintln!(
        "[{}] leader {holder} killed: restarted {restarted:.0?} after, Lease renewed \
         {renewed:.0?} later; {who} ({new_holder})",
        elapsed(began),
    );
    let spike_n: i32 = spike_reserve.parse().unwrap();
    let shrank = testenv::until(120, "the reserve comes down at 10/s", || async {
        let (status, replicas) = world.reserve();
        status.parse::<i32>().is_ok_and(|r| r < spike_n) && status == replicas
    })
    .await;
    eprintln!(
        "[{}] back at 10/s: reserve {} ({shrank:.0?} to come down)",
        elapsed(began),
        world.reserve().0
    );
    testenv::until(60, "10 workers, none leaving", || async {
        world.running_workers("jobs") == 10
    })
    .await;

    // Steady again: the spike out of the 1m window too, the reserve at 2, the 10 workers
    // settled. What follows (a node fault, an upgrade) is judged against a pool at rest.
    testenv::until(150, "the 1m rate back at about 10/s, reserve 2", || async {
        let rate = kubectl.get("lanepool/jobs", POOLS, URGENT_RATE);
        let (status, replicas) = world.reserve();
        rate.parse::<f64>().is_ok_and(|r| (7.0..=13.0).contains(&r))
            && status == "2"
            && replicas == "2"
            && world.running_workers("jobs") == 10
    })
    .await;

    // The node's own processes killed (SIGKILL) and started again, 3 s down each: containerd,
    // then the kubelet. The workers' containers are not their children: the same Pods run on,
    // none restarted, and the node reports Ready again.
    let workers = world.worker_uids();
    let restarts = world.container_restarts("jobs");
    let killed_at = Timestamp::now();
    for process in ["containerd", "kubelet"] {
        world
            .node
            .restart(process, Duration::from_secs(3))
            .await
            .unwrap_or_else(|e| panic!("restarting {process}: {e}"));
    }
    let node = format!("node/{}", world.node.name());
    let heartbeat = "{.status.conditions[?(@.type==\"Ready\")].lastHeartbeatTime}";
    let back = testenv::until(60, "the restarted kubelet reports Ready", || async {
        let ready = "{.status.conditions[?(@.type==\"Ready\")].status}";
        kubectl.get(&node, "", ready) == "True"
            && kubectl
                .get(&node, "", heartbeat)
                .parse::<Timestamp>()
                .is_ok_and(|at| at > killed_at + Duration::from_secs(6))
    })
    .await;
    testenv::until(30, "10 workers, none leaving", || async {
        world.running_workers("jobs") == 10
    })
    .await;
    assert_eq!(
        world.worker_uids(),
        workers,
        "the same workers; the pool's decisions:\n{}",
        world.decisions()
    );
    assert_eq!(
        world.container_restarts("jobs"),
        restarts,
        "no container restarted"
    );
    eprintln!(
        "[{}] containerd and the kubelet killed and restarted: Ready {back:.0?} after; the 10 \
         workers ran on",
        elapsed(began)
    );

    // helm upgrade to a new chart version: the CRD is upgraded with the release, the pool's
    // workers are left as they run (no new ReplicaSet, no Pod replaced).
    let replicasets = world.pool_replicasets();
    let workers_before = world.worker_uids();
    let next = world.push_next_chart_version(&registry);
    world.helm(&[
        "upgrade",
        "lanepool",
        &chart,
        "--version",
        &next,
        "--plain-http",
        "-n",
        SYSTEM,
        "--reuse-values",
        "--wait",
        "--timeout",
        "120s",
    ]);
    let crd = "crd/lanepools.lanepool.dev";
    let chart_label = "{.metadata.labels.helm\\.sh/chart}";
    assert_eq!(
        kubectl.get(crd, "", chart_label),
        format!("lanepool-{next}")
    );
    testenv::until(60, "the upgraded operator leads", || async {
        let holder = kubectl.get(lease, SYSTEM, "{.spec.holderIdentity}");
        let ready = kubectl.get(
            &format!("pod/{holder}"),
            SYSTEM,
            "{.status.containerStatuses[0].ready}",
        );
        ready == "true"
            && kubectl.get(
                &format!("pod/{holder}"),
                SYSTEM,
                "{.metadata.labels.helm\\.sh/chart}",
            ) == format!("lanepool-{next}")
    })
    .await;
    // Two intervals of the upgraded operator.
    tokio::time::sleep(Duration::from_secs(12)).await;
    assert_eq!(
        world.pool_replicasets(),
        replicasets,
        "no worker rollout; the pool's decisions:\n{}",
        world.decisions()
    );
    assert_eq!(
        world.worker_uids(),
        workers_before,
        "no worker replaced; the pool's decisions:\n{}",
        world.decisions()
    );
    eprintln!(
        "[{}] upgraded to {next}; the pool undisturbed; its decisions:\n{}",
        elapsed(began),
        world.decisions()
    );

    // helm uninstall: nothing of the operator is left; the CRD is kept (crds.keep) and with
    // it the pools, whose Deployments go on running as they were, unmanaged.
    world.helm(&["uninstall", "lanepool", "-n", SYSTEM, "--wait"]);
    for kind in [
        "deployment",
        "serviceaccount",
        "service",
        "role",
        "rolebinding",
        "lease",
    ] {
        let (ok, left) = kubectl.run(&[
            "get",
            kind,
            "-n",
            SYSTEM,
            "-l",
            "app.kubernetes.io/instance=lanepool",
            "-o",
            "name",
        ]);
        assert!(ok && left.trim().is_empty(), "{kind} left: {left}");
    }
    for kind in [
        "clusterrole",
        "clusterrolebinding",
        "validatingadmissionpolicy",
    ] {
        let (ok, left) = kubectl.run(&[
            "get",
            kind,
            "-l",
            "app.kubernetes.io/instance=lanepool",
            "-o",
            "name",
        ]);
        assert!(ok && left.trim().is_empty(), "{kind} left: {left}");
    }
    assert_eq!(
        kubectl.get("deployment/lanepool", SYSTEM, "{.metadata.name}"),
        ""
    );
    assert_eq!(
        kubectl.get(crd, "", "{.metadata.name}"),
        "lanepools.lanepool.dev"
    );
    assert_eq!(
        kubectl.get("lanepool/jobs", POOLS, "{.metadata.name}"),
        "jobs"
    );
    assert_eq!(world.worker_uids(), workers_before, "the workers run on");
    eprintln!("[{}] uninstalled", elapsed(began));

    // Every job's ledger: the shrinks of this run (the reserve back from the spike, the
    // restarts around it) cut no job short and lost none.
    drop(_calm_again);
    let ledger = world
        .redis
        .settle("rq:queue:urgent", "rq:queue:batch")
        .await;
    eprintln!("[{}] {ledger:?}", elapsed(began));
    assert!(
        ledger.settled,
        "the jobs in hand did not finish: {ledger:?}"
    );
    assert_eq!((ledger.cut_short, ledger.lost), (0, 0), "{ledger:?}");
}
