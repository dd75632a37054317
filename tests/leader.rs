//! Leader election between two real `lanepool run` processes on the real API server: only the
//! Lease holder runs the controller, and when it stops the other takes over.

use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::coordination::v1::Lease;
use kube::Api;
use kube::api::PostParams;
use lanepool::api::LanePool;
use lanepool_testenv as testenv;
use testenv::until;

/// An operator process, stopped when the test ends however it ends.
struct Operator {
    child: Child,
    log: std::path::PathBuf,
}

impl Operator {
    fn start(identity: &str, namespace: &str, kubeconfig: &std::path::Path) -> Self {
        Self::start_with(identity, namespace, kubeconfig, &[])
    }

    fn start_with(
        identity: &str,
        namespace: &str,
        kubeconfig: &std::path::Path,
        extra: &[&str],
    ) -> Self {
        let log = std::path::PathBuf::from(env!("CARGO_TARGET_TMPDIR"))
            .join(format!("{namespace}-{identity}.log"));
        // The watches' retries are logged, so a run that fails shows what the operator waited on.
        let level = ["--log-level", "info,kube_runtime=debug"];
        let level = if extra.contains(&"--log-level") {
            &[][..]
        } else {
            &level[..]
        };
        let child = Command::new(env!("CARGO_BIN_EXE_lanepool"))
            .args(["run", "--identity", identity, "--namespaces", namespace])
            .args(level)
            .args(extra)
            .args([
                "--leader-election-namespace",
                namespace,
                "--leader-election-lease-duration",
                "3s",
            ])
            .args([
                "--metrics-addr",
                "127.0.0.1:0",
                "--prometheus-url",
                "http://127.0.0.1:9",
            ])
            .env("KUBECONFIG", kubeconfig)
            .stdout(std::fs::File::create(&log).unwrap())
            .stderr(Stdio::inherit())
            .spawn()
            .unwrap();
        Self { child, log }
    }

    fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    fn terminate(&mut self) {
        // SAFETY: kill(2) on our own child.
        unsafe { libc_kill(self.child.id() as i32, 15) };
        let _ = self.child.wait();
    }
}

unsafe extern "C" {
    #[link_name = "kill"]
    fn libc_kill(pid: i32, signal: i32) -> i32;
}

impl Drop for Operator {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

async fn holder(leases: &Api<Lease>) -> Option<String> {
    leases
        .get_opt("lanepool-operator")
        .await
        .ok()??
        .spec?
        .holder_identity
}

/// The example pool, named `name`.
fn example_pool(name: &str) -> LanePool {
    let mut pool: LanePool =
        serde_yaml::from_str(include_str!("fixtures/formula-pool.yaml")).unwrap();
    pool.metadata.name = Some(name.into());
    pool
}

async fn create_pool(pools: &Api<LanePool>, name: &str) {
    pools
        .create(&PostParams::default(), &example_pool(name))
        .await
        .unwrap();
}

/// Whether the Deployment `name` exists.
async fn exists(deployments: &Api<Deployment>, name: &str) -> bool {
    deployments.get_opt(name).await.ok().flatten().is_some()
}

/// The tests here stop the API server and read timings: one at a time.
static ONE_AT_A_TIME: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn only_the_leader_reconciles_and_the_standby_takes_over() {
    let _alone = ONE_AT_A_TIME.lock().await;
    let plane = testenv::shared().expect("the control plane starts");
    let client = plane.client().await.unwrap();
    let namespace = plane.namespace(&client, "leader").await.unwrap();
    let leases: Api<Lease> = Api::namespaced(client.clone(), &namespace);
    let pools: Api<LanePool> = Api::namespaced(client.clone(), &namespace);
    let deployments: Api<Deployment> = Api::namespaced(client.clone(), &namespace);

    let mut first = Operator::start("first", &namespace, plane.kubeconfig());
    until(20, "first holds the lease", || async {
        holder(&leases).await.as_deref() == Some("first")
    })
    .await;
    let second = Operator::start("second", &namespace, plane.kubeconfig());

    create_pool(&pools, "jobs").await;
    until(20, "the leader creates the Deployments", || async {
        exists(&deployments, "jobs-shared").await
    })
    .await;
    tokio::time::sleep(Duration::from_secs(4)).await;
    assert_eq!(
        holder(&leases).await.as_deref(),
        Some("first"),
        "the leader renews its lease"
    );
    assert!(
        second.log().contains("waiting for the leader lease"),
        "{}",
        second.log()
    );
    assert!(
        !second.log().contains("became the leader"),
        "two leaders: {}",
        second.log()
    );

    // SIGTERM: the leader releases the lease and the standby takes over well before expiry
    // would have let it.
    let handover = Instant::now();
    first.terminate();
    assert!(
        first.log().contains("released the leader lease"),
        "{}",
        first.log()
    );
    until(15, "second holds the lease", || async {
        holder(&leases).await.as_deref() == Some("second")
    })
    .await;
    eprintln!(
        "lease handed over in {:.1} s (lease duration 3 s)",
        handover.elapsed().as_secs_f64()
    );
    create_pool(&pools, "later").await;
    until(20, "the new leader reconciles", || async {
        exists(&deployments, "later-shared").await
    })
    .await;
    assert!(second.log().contains("became the leader"));

    // The API server frozen for 20 s (SIGSTOP): the leader cannot see its lease renewed and
    // stops within the renew deadline, before the lease expires and another may take over; once
    // the API server thaws, the standby takes the lease and reconciles.
    let mut second = second;
    let third = Operator::start("third", &namespace, plane.kubeconfig());
    until(20, "third waits as a standby", || async {
        third.log().contains("waiting for the leader lease")
    })
    .await;
    let api_server = plane.api_server_pid() as i32;
    let frozen = Instant::now();
    // SAFETY: kill(2) on the test's own API server process.
    unsafe { libc_kill(api_server, 19) }; // SIGSTOP
    let exited = loop {
        if let Some(status) = second.child.try_wait().unwrap() {
            break Some((status, frozen.elapsed()));
        }
        if frozen.elapsed() > Duration::from_secs(20) {
            break None;
        }
        std::thread::sleep(Duration::from_millis(100));
    };
    let left = Duration::from_secs(20).saturating_sub(frozen.elapsed());
    tokio::time::sleep(left).await;
    // SAFETY: as above.
    unsafe { libc_kill(api_server, 18) }; // SIGCONT
    let thawed = Instant::now();
    let (status, took) = exited
        .unwrap_or_else(|| panic!("the leader went on through a 20 s freeze: {}", second.log()));
    assert!(!status.success(), "a lost lease exits with failure");
    assert!(
        took < Duration::from_secs(3),
        "stopped within the 3 s lease: {took:?}"
    );
    assert!(second.log().contains("renew deadline"), "{}", second.log());
    until(30, "third holds the lease after the thaw", || async {
        holder(&leases).await.as_deref() == Some("third")
    })
    .await;
    create_pool(&pools, "thawed").await;
    let reconciled = testenv::poll_until(Duration::from_secs(30), || async {
        exists(&deployments, "thawed-shared").await
    })
    .await;
    assert!(
        reconciled.is_some(),
        "the new leader reconciles after the thaw: not within 30 s; its log:\n{}",
        third.log()
    );
    let thaw_to_reconciled = thawed.elapsed();

    // The leader SIGKILLed: it writes nothing more, and the standby takes over once the lease
    // expires.
    let mut third = third;
    let fourth = Operator::start("fourth", &namespace, plane.kubeconfig());
    until(20, "fourth waits as a standby", || async {
        fourth.log().contains("waiting for the leader lease")
    })
    .await;
    let killed = Instant::now();
    let _ = third.child.kill();
    let _ = third.child.wait();
    until(15, "fourth holds the lease after the kill", || async {
        holder(&leases).await.as_deref() == Some("fourth")
    })
    .await;
    let took_over = killed.elapsed();
    create_pool(&pools, "after-kill").await;
    until(20, "the new leader reconciles after the kill", || async {
        exists(&deployments, "after-kill-shared").await
    })
    .await;
    eprintln!(
        "leader SIGKILLed: the standby took the lease {:.1} s later (lease 3 s)",
        took_over.as_secs_f64()
    );
    eprintln!(
        "API server frozen 20 s: the leader stopped {:.1} s into the freeze (lease 3 s); the standby led and reconciled {:.1} s after the thaw",
        took.as_secs_f64(),
        thaw_to_reconciled.as_secs_f64()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn json_logs_name_the_pool_on_every_reconcile_line_and_each_failure_once() {
    let _alone = ONE_AT_A_TIME.lock().await;
    let plane = testenv::shared().expect("the control plane starts");
    let client = plane.client().await.unwrap();
    let namespace = plane.namespace(&client, "logs").await.unwrap();
    let pools: Api<LanePool> = Api::namespaced(client.clone(), &namespace);
    let operator = Operator::start_with(
        "logs",
        &namespace,
        plane.kubeconfig(),
        &[
            "--log-format",
            "json",
            "--log-level",
            "info",
            // Credentials go only to a URL the installer named.
            "--allowed-prometheus-urls",
            "https://prometheus.invalid:9090,http://127.0.0.1:9",
        ],
    );
    create_pool(&pools, "jobs").await;
    // A pool whose bearer token Secret does not exist: every reconcile fails, with backoff.
    let mut broken = example_pool("broken");
    broken.spec.prometheus = Some(lanepool::api::PrometheusSource {
        url: Some("https://prometheus.invalid:9090".into()),
        bearer_token_secret: Some(k8s_openapi::api::core::v1::SecretKeySelector {
            name: "no-such-secret".into(),
            key: "token".into(),
            optional: None,
        }),
        ..Default::default()
    });
    pools.create(&PostParams::default(), &broken).await.unwrap();

    let retried = |log: &str| {
        log.lines()
            .filter(|l| l.contains("reconcile failed; retrying") && l.contains("\"broken\""))
            .count()
    };
    // Failures come 5 s and then 10 s apart.
    until(30, "the broken pool's reconcile fails twice", || async {
        retried(&operator.log()) >= 2
    })
    .await;
    let log = operator.log();
    let lines: Vec<serde_json::Value> = log
        .lines()
        .map(|line| serde_json::from_str(line).unwrap_or_else(|e| panic!("not JSON ({e}): {line}")))
        .collect();
    let pool_of = |line: &serde_json::Value| {
        line["span"]["pool"]
            .as_str()
            .or(line["fields"]["pool"].as_str())
            .map(str::to_string)
    };
    let mut reconciled = std::collections::BTreeSet::new();
    for line in &lines {
        let target = line["target"].as_str().unwrap_or_default();
        if target.starts_with("lanepool::controller") {
            let pool = pool_of(line)
                .unwrap_or_else(|| panic!("a controller line without its pool: {line}"));
            reconciled.insert(pool);
        }
    }
    assert!(reconciled.contains("broken"), "{reconciled:?}\n{log}");
    // Each failure once: every line that names the missing Secret is one retry's line.
    let naming = lines
        .iter()
        .filter(|l| l.to_string().contains("no-such-secret"))
        .count();
    let failures = retried(&log);
    assert!(
        naming == failures,
        "{naming} lines name the error for {failures} failed reconciles:\n{log}"
    );
    eprintln!(
        "{failures} failed reconciles logged once each; controller lines for pools {reconciled:?}"
    );
}

/// A replica frozen past its renew deadline (a paused process, a starved node) thaws with its
/// watchdog not yet run: its fence, closed at ¾ of a lease after the last renewal it saw, keeps
/// every write from going out (Deployments, status, events), until a renewal is seen again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replica_past_its_renew_deadline_writes_nothing() {
    use k8s_openapi::api::events::v1::Event;
    use k8s_openapi::jiff::{SignedDuration, Timestamp};
    use lanepool::leader::Fence;

    let _alone = ONE_AT_A_TIME.lock().await;
    let plane = testenv::shared().expect("the control plane starts");
    let client = plane.client().await.unwrap();
    let namespace = plane.namespace(&client, "fenced").await.unwrap();
    let pools: Api<LanePool> = Api::namespaced(client.clone(), &namespace);
    let deployments: Api<Deployment> = Api::namespaced(client.clone(), &namespace);
    let events: Api<Event> = Api::namespaced(client.clone(), &namespace);
    create_pool(&pools, "jobs").await;

    // The last renewal it saw: 4 s ago, with a 4 s lease (its deadline was 1 s ago).
    let fence = Fence::closed();
    fence.extend_to(Timestamp::now() - SignedDuration::from_secs(1));
    let settings = testenv::InProcessOperator::settings("http://127.0.0.1:9".into());
    let operator = testenv::InProcessOperator::start_fenced(
        client.clone(),
        vec![namespace.clone()],
        settings,
        fence.clone(),
    );
    let fenced = || {
        let text = operator.metrics().render();
        text.lines()
            .find(|l| l.starts_with("lanepool_operator_kube_writes_total{result=\"fenced\"}"))
            .and_then(|l| l.split_whitespace().last()?.parse::<f64>().ok())
            .unwrap_or(0.0)
    };
    until(20, "writes refused at the fence", || async {
        fenced() >= 3.0
    })
    .await;
    assert!(
        !exists(&deployments, "jobs-shared").await,
        "no Deployment written"
    );
    let pool = pools.get("jobs").await.unwrap();
    assert!(
        pool.status.is_none(),
        "no status written: {:?}",
        pool.status
    );
    let said = events.list(&Default::default()).await.unwrap();
    assert!(said.items.is_empty(), "no event written: {:?}", said.items);

    // A renewal seen again: the same replica writes.
    fence.extend_to(Timestamp::now() + SignedDuration::from_secs(3600));
    until(
        20,
        "writes go on once the lease is seen renewed",
        || async { exists(&deployments, "jobs-shared").await },
    )
    .await;
    eprintln!("{} writes refused while fenced", fenced());
}
