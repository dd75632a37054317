//! The controller against a real kube-apiserver and a real Prometheus scraping simulated
//! workers: Deployments appear as the guide arranges them, the reserve follows the urgent
//! arrival rate, and failures (Prometheus down, bad PromQL, hand-scaling, missing Secrets) are
//! handled the way the README promises. A Prometheus behind TLS with basic auth or client
//! certificates is reached with the pool's Secrets.

mod common;

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::{Event, Pod, Secret};
use kube::api::{Api, ListParams, Patch, PatchParams, PostParams};
use kube::{Client, ResourceExt};
use lanepool::api::LanePool;
use lanepool::prometheus::AllowedUrls;
use lanepool_testenv::{
    self as testenv, BASIC_AUTH_PASSWORD, BASIC_AUTH_USERNAME, DeploymentReadiness, Guard,
    InProcessOperator, SimulatedWorkers, TestPrometheus,
};
use serde_json::json;

/// One test's world: its namespace, simulated workers, Prometheus and a running controller.
struct World {
    client: Client,
    namespace: String,
    workers: SimulatedWorkers,
    prometheus: TestPrometheus,
    /// Stopped when the world is dropped.
    operator: Option<InProcessOperator>,
    /// Pods become ready at once: shrinks that wait for growth (a surge) go ahead.
    _readiness: DeploymentReadiness,
}

impl World {
    async fn start(prefix: &str) -> Self {
        Self::start_with(prefix, |_| {}, Duration::ZERO).await
    }

    /// A world whose operator settings are changed by `settings` and whose new pods take
    /// `pod_start` to be ready.
    async fn start_with(
        prefix: &str,
        settings: impl FnOnce(&mut lanepool::controller::Settings),
        pod_start: Duration,
    ) -> Self {
        Self::start_on(prefix, None, settings, pod_start).await
    }

    /// A world whose Prometheus serves TLS only and asks every request for `guard`.
    async fn start_guarded(prefix: &str, guard: Guard) -> Self {
        Self::start_on(prefix, Some(guard), |_| {}, Duration::ZERO).await
    }

    async fn start_on(
        prefix: &str,
        guard: Option<Guard>,
        settings: impl FnOnce(&mut lanepool::controller::Settings),
        pod_start: Duration,
    ) -> Self {
        let plane = testenv::shared().expect("the control plane starts");
        let (client, namespace) = {
            let client = plane.client().await.unwrap();
            let namespace = plane.namespace(&client, prefix).await.unwrap();
            (client, namespace)
        };
        let workers = SimulatedWorkers::start().unwrap();
        let prometheus = match guard {
            None => TestPrometheus::start(&[workers.addr()]),
            Some(guard) => TestPrometheus::start_guarded(&[workers.addr()], guard),
        }
        .unwrap();
        let mut operator_settings = InProcessOperator::settings(prometheus.url());
        settings(&mut operator_settings);
        let operator = InProcessOperator::start_with(
            client.clone(),
            vec![namespace.clone()],
            operator_settings,
        );
        let readiness = DeploymentReadiness::start(client.clone(), &namespace, pod_start);
        Self {
            client,
            namespace,
            workers,
            prometheus,
            operator: Some(operator),
            _readiness: readiness,
        }
    }

    /// Kills the operator the way SIGKILL would and starts a new one: nothing carries over but
    /// what is in the API server.
    fn restart_operator(&mut self) {
        if let Some(operator) = self.operator.take() {
            operator.kill();
        }
        self.operator = Some(InProcessOperator::start(
            self.client.clone(),
            vec![self.namespace.clone()],
            self.prometheus.url(),
        ));
    }

    fn urgent(&self, rate: f64, job_seconds: f64) {
        self.workers
            .set_lane(&self.namespace, "jobs", "urgent", rate, job_seconds);
    }

    async fn apply_pool(&self, change: impl FnOnce(&mut serde_json::Value)) {
        self.apply_named("jobs", change).await
    }

    /// The pool with two reserve lanes in 12 workers, loaded so that 30/s × 20 ms × 1.5 → 1
    /// reserved for urgent and 20/s × 50 ms × 1.5 → 2 for critical, 9 shared.
    async fn two_reserve_lanes(&self) {
        self.urgent(30.0, 0.020);
        self.workers
            .set_lane(&self.namespace, "jobs", "critical", 20.0, 0.050);
        self.apply_pool(|spec| {
            let lanes = spec["lanes"].as_array_mut().unwrap();
            lanes.insert(
                1,
                json!({"name": "critical", "reserve": {"max": 3, "sizing": "Formula"}}),
            );
            spec["totalWorkers"] = json!(12);
        })
        .await;
    }

    /// Applies the example pool as `name`, changed by `change` (server-side, as `kubectl apply
    /// --server-side` would: applied again, it replaces what the test set before).
    async fn apply_named(&self, name: &str, change: impl FnOnce(&mut serde_json::Value)) {
        let mut manifest = lanepool_testenv::formula_pool();
        manifest["metadata"]["name"] = json!(name);
        let spec = &mut manifest["spec"];
        spec["interval"] = json!("5s");
        spec["scaleDown"]["stabilizationWindow"] = json!("20s");
        spec.as_object_mut().unwrap().remove("prometheus");
        change(spec);
        Api::<LanePool>::namespaced(self.client.clone(), &self.namespace)
            .patch(
                name,
                &PatchParams::apply("test").force(),
                &Patch::Apply(&manifest),
            )
            .await
            .unwrap();
    }

    /// Creates or replaces the Secret `name` of the world's namespace, of `type_`, holding `data`.
    async fn secret(&self, name: &str, type_: &str, data: &[(&str, &str)]) {
        let secret: Secret = serde_json::from_value(json!({
            "metadata": {"name": name},
            "type": type_,
            "stringData": data.iter().copied().collect::<BTreeMap<_, _>>(),
        }))
        .unwrap();
        Api::<Secret>::namespaced(self.client.clone(), &self.namespace)
            .patch(
                name,
                &PatchParams::apply("test").force(),
                &Patch::Apply(&secret),
            )
            .await
            .unwrap();
    }

    fn deployments(&self) -> Api<Deployment> {
        Api::namespaced(self.client.clone(), &self.namespace)
    }

    async fn replicas(&self, name: &str) -> Option<i32> {
        self.deployments().get_opt(name).await.ok()??.spec?.replicas
    }

    async fn pool(&self) -> LanePool {
        Api::<LanePool>::namespaced(self.client.clone(), &self.namespace)
            .get("jobs")
            .await
            .unwrap()
    }

    /// What the pool's status says of each reserve lane.
    async fn lanes(&self) -> Vec<lanepool::api::LaneStatus> {
        self.pool()
            .await
            .status
            .map(|s| s.lanes)
            .unwrap_or_default()
    }

    async fn condition(&self, type_: &str) -> Option<(String, String, String)> {
        self.condition_of("jobs", type_).await
    }

    async fn condition_of(&self, pool: &str, type_: &str) -> Option<(String, String, String)> {
        let pool = Api::<LanePool>::namespaced(self.client.clone(), &self.namespace)
            .get(pool)
            .await
            .unwrap();
        let c = pool
            .status?
            .conditions
            .into_iter()
            .find(|c| c.type_ == type_)?;
        Some((c.status, c.reason, c.message))
    }

    async fn condition_is(&self, type_: &str, status: &str) -> bool {
        self.condition(type_).await.is_some_and(|c| c.0 == status)
    }

    async fn events(&self) -> Vec<(String, String)> {
        let events: Api<Event> = Api::namespaced(self.client.clone(), &self.namespace);
        let list = events.list(&ListParams::default()).await.unwrap();
        list.items
            .into_iter()
            .map(|e| (e.reason.unwrap_or_default(), e.message.unwrap_or_default()))
            .collect()
    }

    /// `common::until` naming the pool's status when it fails.
    async fn until<F, Fut>(&self, seconds: u64, what: &str, check: F) -> Duration
    where
        F: FnMut() -> Fut,
        Fut: Future<Output = bool>,
    {
        common::until(seconds, what, check, || async {
            format!("status: {:?}", self.pool().await.status)
        })
        .await
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_example_gets_reserved_and_shared_deployments() {
    let world = World::start("deploy").await;
    world.urgent(30.0, 0.020);
    world.apply_pool(|_| {}).await;
    world
        .until(30, "both Deployments", || async {
            world.replicas("jobs-urgent-reserved").await == Some(1)
                && world.replicas("jobs-shared").await == Some(9)
        })
        .await;
    let pool = world.pool().await;
    for (name, lanes, role) in [
        ("jobs-urgent-reserved", "urgent", "reserved"),
        ("jobs-shared", "urgent,batch", "shared"),
    ] {
        let deployment = world.deployments().get(name).await.unwrap();
        let template = deployment.spec.unwrap().template;
        let labels = template.metadata.unwrap().labels.unwrap();
        assert_eq!(labels["lanepool.dev/pool"], "jobs");
        assert_eq!(labels["lanepool.dev/role"], role);
        let env = template.spec.unwrap().containers[0].env.clone().unwrap();
        let value = |n: &str| {
            env.iter()
                .find(|e| e.name == n)
                .and_then(|e| e.value.clone())
        };
        assert_eq!(value("LANEPOOL_LANES").as_deref(), Some(lanes));
        assert_eq!(value("LANEPOOL_ROLE").as_deref(), Some(role));
        assert_eq!(value("LANEPOOL_POOL").as_deref(), Some("jobs"));
        let owner = &deployment.metadata.owner_references.unwrap()[0];
        assert_eq!(
            (owner.kind.as_str(), owner.uid.as_str(), owner.controller),
            ("LanePool", pool.uid().unwrap().as_str(), Some(true))
        );
    }
    world
        .until(30, "MetricsAvailable and a decision in words", || async {
            let status = world.pool().await.status.unwrap_or_default();
            status
                .last_decision
                .is_some_and(|d| d.starts_with("urgent 30/s × 20 ms × 1.5"))
                && world.condition_is("MetricsAvailable", "True").await
        })
        .await;

    // A deleted Deployment comes back.
    world
        .deployments()
        .delete("jobs-shared", &Default::default())
        .await
        .unwrap();
    world
        .until(20, "the shared Deployment recreated", || async {
            world.replicas("jobs-shared").await == Some(9)
        })
        .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_reserve_follows_the_urgent_rate_and_scale_down_waits() {
    let world = World::start("follow").await;
    world.urgent(30.0, 0.020);
    world.apply_pool(|_| {}).await;
    world
        .until(40, "1 reserved at 30/s", || async {
            world.condition_is("MetricsAvailable", "True").await
                && world.replicas("jobs-urgent-reserved").await == Some(1)
        })
        .await;

    world.urgent(150.0, 0.020);
    let grew = world
        .until(40, "5 reserved at 150/s", || async {
            world.replicas("jobs-urgent-reserved").await == Some(5)
        })
        .await;
    world
        .until(
            10,
            "the budget of 10 kept once the new workers are ready",
            || async { world.replicas("jobs-shared").await == Some(5) },
        )
        .await;
    eprintln!(
        "reaction 30/s → 150/s: {:.1} s (interval 5 s, scrape 1 s, rate window 5 s)",
        grew.as_secs_f64()
    );
    world
        .until(10, "a Scaled event in the guide's words", || async {
            world.events().await.iter().any(|(reason, note)| {
                // The 5 s window can catch the rise half-way: 1 → 3, then 3 → 5.
                reason == "Scaled"
                    && note.starts_with("reserved urgent ")
                    && note.contains(" → 5: ")
                    && note.contains("× 1.5 = ")
            })
        })
        .await;

    world.urgent(30.0, 0.020);
    let dropped = Instant::now();
    let shrank = world
        .until(60, "back to 1 reserved", || async {
            world.replicas("jobs-urgent-reserved").await == Some(1)
        })
        .await;
    assert!(
        shrank >= Duration::from_secs(15),
        "scaled down after {shrank:?}, inside the 20 s window"
    );
    // Shared workers grew first: the reserve shrank only once they were ready.
    assert_eq!(world.replicas("jobs-shared").await, Some(9));
    eprintln!(
        "scale-down after the drop: {:.1} s (window 20 s)",
        dropped.elapsed().as_secs_f64()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn prometheus_down_holds_the_counts_and_scaling_resumes_after() {
    let mut world = World::start("down").await;
    world.urgent(150.0, 0.020);
    world.apply_pool(|_| {}).await;
    world
        .until(40, "5 reserved and 5 shared", || async {
            world.replicas("jobs-urgent-reserved").await == Some(5)
                && world.replicas("jobs-shared").await == Some(5)
        })
        .await;

    world.prometheus.stop();
    world
        .until(30, "MetricsAvailable=False", || async {
            world.condition_is("MetricsAvailable", "False").await
        })
        .await;
    tokio::time::sleep(Duration::from_secs(6)).await;
    assert_eq!(
        world.replicas("jobs-urgent-reserved").await,
        Some(5),
        "held, not zero"
    );
    assert_eq!(world.replicas("jobs-shared").await, Some(5));
    let events = world.events().await;
    assert!(
        events
            .iter()
            .any(|(reason, _)| reason == "MetricsUnavailable"),
        "{events:?}"
    );

    world.urgent(90.0, 0.020);
    world.prometheus.resume().unwrap();
    world
        .until(
            60,
            "scaling resumes: 90/s × 20 ms × 1.5 → 3 after the window",
            || async {
                world.condition_is("MetricsAvailable", "True").await
                    && world.replicas("jobs-urgent-reserved").await == Some(3)
            },
        )
        .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hand_scaled_reserve_is_restored() {
    let world = World::start("restore").await;
    world.urgent(30.0, 0.020);
    world.apply_pool(|_| {}).await;
    world
        .until(30, "1 reserved", || async {
            world.condition_is("Ready", "True").await
                && world.replicas("jobs-urgent-reserved").await == Some(1)
        })
        .await;
    world
        .deployments()
        .patch(
            "jobs-urgent-reserved",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"replicas": 4}})),
        )
        .await
        .unwrap();
    world
        .until(20, "restored to 1", || async {
            world.replicas("jobs-urgent-reserved").await == Some(1)
        })
        .await;
    let events = world.events().await;
    assert!(
        events
            .iter()
            .any(|(reason, note)| reason == "ReplicasRestored" && note.contains("scaled to 4")),
        "{events:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_promql_syntax_error_is_reported_with_prometheus_message() {
    let world = World::start("promql").await;
    world
        .apply_pool(|spec| {
            spec["lanes"][0]["reserve"]["arrivalRate"] = json!({"query": "sum(rate(oops[1m]"})
        })
        .await;
    world
        .until(
            30,
            "MetricsAvailable=False with the parse error",
            || async {
                world
                    .condition("MetricsAvailable")
                    .await
                    .is_some_and(|(status, _, message)| {
                        status == "False" && message.contains("parse error")
                    })
            },
        )
        .await;
    assert_eq!(
        world.replicas("jobs-urgent-reserved").await,
        Some(1),
        "starts at min, never zero"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_missing_secret_makes_the_pool_not_ready_and_others_carry_on() {
    // Credentials go only to a URL the operator was told of.
    let world = World::start_with(
        "secret",
        |settings| {
            settings.allowed_prometheus_urls = AllowedUrls::parse("https://127.0.0.1:9").unwrap()
        },
        Duration::ZERO,
    )
    .await;
    world
        .apply_pool(|spec| {
            // https: a token is never read for a URL in clear.
            spec["prometheus"] = json!({
                "url": "https://127.0.0.1:9",
                "bearerTokenSecret": {"name": "absent", "key": "token"}
            })
        })
        .await;
    world
        .until(30, "Ready=False naming the Secret", || async {
            world
                .condition("Ready")
                .await
                .is_some_and(|(status, reason, message)| {
                    status == "False" && reason == "MissingSecret" && message.contains("absent")
                })
        })
        .await;
    assert_eq!(
        world.replicas("jobs-shared").await,
        None,
        "nothing is applied from an invalid pool"
    );
}

/// `spec.prometheus` for the world's guarded Prometheus: its URL, its CA from the Secret
/// `prometheus-ca`, and `auth` (basicAuth, clientCertificateSecret) merged in.
fn guarded_source(world: &World, auth: serde_json::Value) -> serde_json::Value {
    let mut source = json!({
        "url": world.prometheus.url(),
        "caSecret": {"name": "prometheus-ca", "key": "ca.crt"},
    });
    for (field, value) in auth.as_object().unwrap() {
        source[field] = value.clone();
    }
    source
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn basic_auth_sizes_the_reserve_a_wrong_password_fails_its_pool_only_until_the_secret_is_fixed()
 {
    let world = World::start_guarded("basic", Guard::BasicAuth).await;
    let ca = world.prometheus.ca_pem().unwrap();
    world
        .secret("prometheus-ca", "Opaque", &[("ca.crt", ca)])
        .await;
    // As `kubectl create secret --from-file` writes it: the password ends in a newline.
    let password = format!("{BASIC_AUTH_PASSWORD}\n");
    let good = [("username", BASIC_AUTH_USERNAME), ("password", &password)];
    world.secret("prometheus-auth", "Opaque", &good).await;
    let wrong = [
        ("username", BASIC_AUTH_USERNAME),
        ("password", "not-the-password"),
    ];
    world.secret("prometheus-wrong", "Opaque", &wrong).await;
    let basic_auth = |secret: &str| {
        json!({"basicAuth": {
            "usernameSecret": {"name": secret, "key": "username"},
            "passwordSecret": {"name": secret, "key": "password"},
        }})
    };
    for pool in ["jobs", "wrong"] {
        world
            .workers
            .set_lane(&world.namespace, pool, "urgent", 150.0, 0.020);
    }
    let source = guarded_source(&world, basic_auth("prometheus-auth"));
    world
        .apply_named("jobs", |spec| spec["prometheus"] = source)
        .await;
    let source = guarded_source(&world, basic_auth("prometheus-wrong"));
    world
        .apply_named("wrong", |spec| spec["prometheus"] = source)
        .await;

    let sized = world
        .until(60, "5 reserved at 150/s through basic auth", || async {
            world.condition_is("MetricsAvailable", "True").await
                && world.replicas("jobs-urgent-reserved").await == Some(5)
        })
        .await;
    world
        .until(40, "the wrong password named as refused", || async {
            world
                .condition_of("wrong", "MetricsAvailable")
                .await
                .is_some_and(|(status, _, message)| {
                    status == "False"
                        && message.contains("HTTP 401")
                        && message.contains("basicAuth")
                })
        })
        .await;
    let (_, _, message) = world
        .condition_of("wrong", "MetricsAvailable")
        .await
        .unwrap();
    eprintln!(
        "through basic auth, 5 reserved after {:.1} s; a wrong password: {message}",
        sized.as_secs_f64()
    );
    let pool = Api::<LanePool>::namespaced(world.client.clone(), &world.namespace)
        .get("wrong")
        .await
        .unwrap();
    let written = format!("{:?} {:?}", pool.status, world.events().await);
    for credential in [BASIC_AUTH_PASSWORD, "not-the-password"] {
        assert!(
            !written.contains(credential),
            "a password in the status or events"
        );
    }
    assert!(
        world.condition_is("MetricsAvailable", "True").await,
        "the pool beside it still measures"
    );

    // The Secret fixed: the next interval reads it and connects with the new password.
    world.secret("prometheus-wrong", "Opaque", &good).await;
    let fixed = world
        .until(
            40,
            "the fixed Secret used from the next interval",
            || async {
                world
                    .condition_of("wrong", "MetricsAvailable")
                    .await
                    .is_some_and(|(status, _, _)| status == "True")
                    && world.replicas("wrong-urgent-reserved").await == Some(5)
            },
        )
        .await;
    eprintln!(
        "the fixed password measured and sized after {:.1} s (interval 5 s)",
        fixed.as_secs_f64()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_certificate_sizes_the_reserve_and_without_one_or_with_a_bad_one_its_pool_fails() {
    let world = World::start_guarded("mtls", Guard::ClientCertificate).await;
    let ca = world.prometheus.ca_pem().unwrap();
    let (certificate, key) = world.prometheus.client_certificate().unwrap();
    world
        .secret("prometheus-ca", "Opaque", &[("ca.crt", ca)])
        .await;
    // What cert-manager writes for a Certificate.
    let tls = [("tls.crt", certificate), ("tls.key", key), ("ca.crt", ca)];
    world
        .secret("prometheus-client", "kubernetes.io/tls", &tls)
        .await;
    let broken = [("tls.crt", certificate), ("tls.key", "not a key")];
    world.secret("broken-client", "Opaque", &broken).await;
    // A key that parses but is not the certificate's.
    let mismatched = [("tls.crt", ca), ("tls.key", key)];
    world
        .secret("mismatched-client", "Opaque", &mismatched)
        .await;
    let no_key = [("tls.crt", certificate)];
    world.secret("keyless-client", "Opaque", &no_key).await;
    let with_certificate = |secret: &str| json!({"clientCertificateSecret": {"name": secret}});
    for pool in ["jobs", "nocert"] {
        world
            .workers
            .set_lane(&world.namespace, pool, "urgent", 150.0, 0.020);
    }
    let pools = [
        ("jobs", with_certificate("prometheus-client")),
        ("nocert", json!({})),
        ("broken", with_certificate("broken-client")),
        ("mismatched", with_certificate("mismatched-client")),
        ("keyless", with_certificate("keyless-client")),
    ];
    for (name, auth) in pools {
        let source = guarded_source(&world, auth);
        world
            .apply_named(name, |spec| spec["prometheus"] = source)
            .await;
    }
    let mut untrusting = guarded_source(&world, with_certificate("prometheus-client"));
    untrusting.as_object_mut().unwrap().remove("caSecret");
    world
        .apply_named("noca", |spec| spec["prometheus"] = untrusting)
        .await;

    let sized = world
        .until(60, "5 reserved at 150/s through mTLS", || async {
            world.condition_is("MetricsAvailable", "True").await
                && world.replicas("jobs-urgent-reserved").await == Some(5)
        })
        .await;
    let condition_is =
        |pool: &'static str, type_: &'static str, check: fn(&str, &str, &str) -> bool| {
            let world = &world;
            async move {
                world
                    .condition_of(pool, type_)
                    .await
                    .is_some_and(|(status, reason, message)| check(&status, &reason, &message))
            }
        };
    world
        .until(30, "without a certificate: the handshake refused", || {
            condition_is("nocert", "MetricsAvailable", |status, _, message| {
                status == "False"
                    && message.contains("refused the TLS handshake")
                    && message.contains("spec.prometheus.clientCertificateSecret")
            })
        })
        .await;
    world
        .until(
            30,
            "without the CA: the server's certificate not trusted",
            || {
                condition_is("noca", "MetricsAvailable", |status, _, message| {
                    status == "False"
                        && message.contains("invalid peer certificate")
                        && message.contains("spec.prometheus.caSecret")
                })
            },
        )
        .await;
    world
        .until(30, "a key that does not parse: the field named", || {
            condition_is("broken", "Ready", |status, reason, message| {
                status == "False"
                    && reason == "InvalidSpec"
                    && message.contains("spec.prometheus.clientCertificateSecret")
                    && message.contains("tls.key")
            })
        })
        .await;
    world
        .until(30, "a key not the certificate's: the field named", || {
            condition_is("mismatched", "Ready", |status, reason, message| {
                status == "False"
                    && reason == "InvalidSpec"
                    && message.contains("spec.prometheus.clientCertificateSecret")
                    && message.contains("tls.key: ")
            })
        })
        .await;
    world
        .until(30, "a missing tls.key: the field and key named", || {
            condition_is("keyless", "Ready", |status, reason, message| {
                status == "False"
                    && reason == "MissingSecret"
                    && message.contains("spec.prometheus.clientCertificateSecret")
                    && message.contains("\"tls.key\"")
            })
        })
        .await;
    eprintln!(
        "through a client certificate, 5 reserved after {:.1} s",
        sized.as_secs_f64()
    );
    for pool in ["nocert", "noca", "broken", "mismatched", "keyless"] {
        let condition = world.condition_of(pool, "Ready").await;
        let metrics = world.condition_of(pool, "MetricsAvailable").await;
        eprintln!("{pool}: Ready {condition:?}; MetricsAvailable {metrics:?}");
    }
    assert!(
        world.condition_is("MetricsAvailable", "True").await,
        "the pool beside them still measures"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_paused_pool_is_left_alone() {
    let world = World::start("paused").await;
    world.apply_pool(|spec| spec["paused"] = json!(true)).await;
    world
        .until(30, "Paused=True", || async {
            world.condition_is("Paused", "True").await
        })
        .await;
    assert_eq!(world.replicas("jobs-shared").await, None);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_latency_target_reserves_enough_for_the_p99() {
    let world = World::start("target").await;
    world.urgent(30.0, 0.020);
    world
        .apply_pool(|spec| {
            spec["lanes"][0]["reserve"]["sizing"] = json!("LatencyTarget");
            spec["lanes"][0]["reserve"]["targetP99"] = json!("25ms");
        })
        .await;
    // The formula gives 1 at 30/s × 20 ms; a 25 ms p99 with Poisson arrivals needs 3.
    world
        .until(40, "3 reserved for p99 ≤ 25 ms at 30/s", || async {
            let decision = world.pool().await.status.and_then(|s| s.last_decision);
            // The status restates a rate within 10 % of the one it shows, so its figure may
            // be 29.6/s as well as 30/s.
            decision.is_some_and(|d| {
                d.starts_with("urgent ") && d.contains("/s × 20 ms, p99 ≤ 25 ms → 3")
            }) && world.replicas("jobs-urgent-reserved").await == Some(3)
        })
        .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_template_change_reaches_both_deployments() {
    let world = World::start("template").await;
    world.urgent(30.0, 0.020);
    world.apply_pool(|_| {}).await;
    world
        .until(30, "both Deployments", || async {
            world.replicas("jobs-shared").await.is_some()
                && world.replicas("jobs-urgent-reserved").await.is_some()
        })
        .await;
    let pools: Api<LanePool> = Api::namespaced(world.client.clone(), &world.namespace);
    let patch = json!({"spec": {"template": {"spec": {"containers": [
        {"name": "worker", "image": "ghcr.io/lanepool/lane-worker:0.2.0"}
    ]}}}});
    pools
        .patch("jobs", &PatchParams::default(), &Patch::Merge(&patch))
        .await
        .unwrap();
    world
        .until(20, "the new image on both Deployments", || async {
            let mut images = Vec::new();
            for name in ["jobs-urgent-reserved", "jobs-shared"] {
                let d = world.deployments().get(name).await.unwrap();
                let spec = d.spec.unwrap().template.spec.unwrap();
                images.push(spec.containers[0].image.clone().unwrap_or_default());
            }
            images.iter().all(|i| i.ends_with(":0.2.0"))
        })
        .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_autoscaler_on_a_lanepool_deployment_is_reported() {
    use k8s_openapi::api::autoscaling::v2::HorizontalPodAutoscaler;
    let world = World::start("hpa").await;
    world.urgent(30.0, 0.020);
    world.apply_pool(|_| {}).await;
    let hpa: HorizontalPodAutoscaler = serde_json::from_value(json!({
        "metadata": {"name": "fights-lanepool"},
        "spec": {
            "scaleTargetRef": {"apiVersion": "apps/v1", "kind": "Deployment", "name": "jobs-shared"},
            "minReplicas": 2, "maxReplicas": 20,
            "metrics": [{"type": "Resource", "resource": {"name": "cpu",
                "target": {"type": "Utilization", "averageUtilization": 80}}}]
        }
    }))
    .unwrap();
    Api::<HorizontalPodAutoscaler>::namespaced(world.client.clone(), &world.namespace)
        .create(&PostParams::default(), &hpa)
        .await
        .unwrap();
    world
        .until(30, "ScalingLimited=True naming the autoscaler", || async {
            world
                .condition("ScalingLimited")
                .await
                .is_some_and(|(status, reason, message)| {
                    status == "True"
                        && reason == "HorizontalPodAutoscaler"
                        && message.contains("fights-lanepool")
                })
        })
        .await;
}

/// Samples (reserved, shared) every 100 ms until `until` holds; returns every sample.
async fn watch_counts(
    world: &World,
    seconds: u64,
    until: impl Fn(i32, i32) -> bool,
) -> Vec<(i32, i32)> {
    let mut seen = Vec::new();
    let started = Instant::now();
    while started.elapsed() < Duration::from_secs(seconds) {
        let reserved = world.replicas("jobs-urgent-reserved").await.unwrap_or(-1);
        let shared = world.replicas("jobs-shared").await.unwrap_or(-1);
        if seen.last() != Some(&(reserved, shared)) {
            seen.push((reserved, shared));
        }
        if until(reserved, shared) {
            return seen;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    panic!(
        "not within {seconds} s; counts seen: {seen:?}; status: {:?}",
        world.pool().await.status
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_spike_grows_the_reserve_before_shared_shrinks_and_it_is_back_within_the_hold() {
    // A long window of 20 s beside a recent one of 5 s; pods take 3 s to be ready.
    let world = World::start_with(
        "spike",
        |settings| {
            settings.windows.arrival_rate = "20s".into();
            settings.windows.recent_arrival_rate = Some("5s".into());
            // The simulated workers' counters are exact, so their 1 s irate is as steady as a
            // Poisson count over the default 15 s: the 10 % tolerance, not a noise-wide one.
            settings.windows.scrape_interval = Duration::from_secs(15);
        },
        Duration::from_secs(3),
    )
    .await;
    world.urgent(30.0, 0.020);
    world.apply_pool(|_| {}).await;
    watch_counts(&world, 40, |r, s| r == 1 && s == 9).await;
    world
        .until(30, "metrics available", || async {
            world.condition_is("MetricsAvailable", "True").await
        })
        .await;

    world.urgent(150.0, 0.020);
    let spiked = Instant::now();
    let growing = watch_counts(&world, 40, |r, s| r == 5 && s == 5).await;
    let grew = spiked.elapsed();
    // Reserved grew (to 5, or first to 2 when a scrape caught the spike's first second) while
    // the 9 shared workers stayed until the new ones were ready, and the pool never had fewer
    // than its 10 workers asked for.
    let first_change = growing.iter().find(|&&counts| counts != (1, 9));
    assert!(
        first_change.is_some_and(|&(r, s)| r > 1 && s == 9),
        "{growing:?}"
    );
    assert!(growing.iter().all(|(r, s)| r + s >= 10), "{growing:?}");
    // Each role change's surge is measured: its reserved Pods took their 3 s to be ready.
    let text = world.operator.as_ref().unwrap().metrics().render();
    let value = |name: &str| {
        text.lines()
            .find_map(|line| line.strip_prefix(name)?.trim().parse::<f64>().ok())
            .unwrap_or(0.0)
    };
    let surges = value("lanepool_operator_surge_duration_seconds_count");
    let waited = value("lanepool_operator_surge_duration_seconds_sum");
    assert!(surges >= 1.0, "no surge measured:\n{text}");
    assert!(
        (3.0..40.0).contains(&(waited / surges)),
        "{surges} surges waited {waited} s"
    );
    world
        .until(10, "a Scaled event from the recent rate", || async {
            world.events().await.iter().any(|(reason, note)| {
                reason == "Scaled" && note.contains("/s (recent) × 20 ms × 1.5")
            })
        })
        .await;
    let lanes = world.lanes().await;
    assert!(
        lanes
            .first()
            .is_some_and(|l| l.recent_arrival_rate.is_some()),
        "status shows the recent rate: {lanes:?}"
    );
    eprintln!(
        "30/s → 150/s: 5 reserved and 5 shared after {:.1} s",
        grew.as_secs_f64()
    );

    world.urgent(30.0, 0.020);
    let dropped = Instant::now();
    let shrinking = watch_counts(&world, 60, |r, s| r == 1 && s == 9).await;
    let back = dropped.elapsed();
    assert!(shrinking.iter().all(|(r, s)| r + s >= 10), "{shrinking:?}");
    // Each step down grows shared workers first; reserved ones leave once those are ready.
    assert!(
        shrinking.get(1).is_some_and(|(r, s)| *r == 5 && *s > 5),
        "shared grew first: {shrinking:?}"
    );
    // The recent rate sees the drop within a scrape or two; the pool's 20 s window then holds
    // the last high recommendation, made up to one 5 s interval before the drop. Following the
    // 20 s long window instead would take up to 20 s more.
    assert!(
        back >= Duration::from_secs(15),
        "back after {back:?}, inside the hold"
    );
    assert!(back <= Duration::from_secs(35), "back after {back:?}");
    eprintln!(
        "150/s → 30/s: back to 1 reserved after {:.1} s",
        back.as_secs_f64()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_held_shrink_shows_what_runs_what_it_waits_for_and_until_when() {
    // New workers take 8 s to be ready: each shrink waits for the Deployment taking over.
    let world = World::start_with("held", |_| {}, Duration::from_secs(8)).await;
    world.urgent(30.0, 0.020);
    world.apply_pool(|_| {}).await;
    watch_counts(&world, 40, |r, s| r == 1 && s == 9).await;
    let status = || async { world.pool().await.status.unwrap_or_default() };
    world
        .until(30, "settled: nothing waits", || async {
            let status = status().await;
            status.rollout.is_none() && status.reserves.as_deref() == Some("urgent 1")
        })
        .await;

    world.urgent(150.0, 0.020);
    world
        .until(30, "the shared shrink waits for the reserve", || async {
            status().await.rollout.is_some_and(|r| {
                r.starts_with("Deployment jobs-shared runs 9, shrinks to 5 once jobs-urgent-reserved is ready (")
                    && r.contains(" of 5), by 20")
            })
        })
        .await;
    let waiting = status().await;
    assert_eq!(
        waiting.lanes[0].running,
        Some(5),
        "the reserve grew at once"
    );
    assert_eq!(waiting.shared, 5, "what was decided");
    eprintln!("rollout: {}", waiting.rollout.unwrap_or_default());
    world
        .until(30, "the shrink went: nothing waits", || async {
            status().await.rollout.is_none()
        })
        .await;
    assert_eq!(world.replicas("jobs-shared").await, Some(5));

    // Back down: shared grows first, and the reserve runs 5 while it waits to shrink to 1.
    world.urgent(30.0, 0.020);
    world
        .until(60, "the reserve shrink waits for the shared workers", || async {
            let status = status().await;
            status.reserves.as_deref() == Some("urgent 5 → 1")
                && status.lanes[0].running == Some(5)
                && status.rollout.is_some_and(|r| {
                    r.starts_with("Deployment jobs-urgent-reserved runs 5, shrinks to 1 once jobs-shared is ready (")
                })
        })
        .await;
    world
        .until(30, "settled again", || async {
            let status = status().await;
            status.rollout.is_none() && status.reserves.as_deref() == Some("urgent 1")
        })
        .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_removed_lanes_workers_leave_once_shared_workers_took_their_place() {
    // New workers take 8 s to be ready. Two reserve lanes: urgent 1 and critical 2, shared 9.
    let world = World::start_with("leaving", |_| {}, Duration::from_secs(8)).await;
    world.two_reserve_lanes().await;
    world
        .until(60, "1 + 2 reserved and 9 shared, ready", || async {
            world.replicas("jobs-critical-reserved").await == Some(2)
                && world.replicas("jobs-shared").await == Some(9)
                && world
                    .pool()
                    .await
                    .status
                    .is_some_and(|s| s.rollout.is_none())
        })
        .await;
    tokio::time::sleep(Duration::from_secs(9)).await;

    // The lane removed: shared grows to 11 at once; the lane's 2 workers stay until then.
    world
        .apply_pool(|spec| spec["totalWorkers"] = json!(12))
        .await;
    world
        .until(
            20,
            "shared grown, the removed lane's workers still there",
            || async {
                world.replicas("jobs-shared").await == Some(11)
                    && world.replicas("jobs-critical-reserved").await == Some(2)
            },
        )
        .await;
    // The status is written after the growth goes out: wait for it rather than race it.
    world
        .until(10, "status.rollout naming the removed lane's shrink", || async {
            world.pool().await.status.is_some_and(|s| {
                s.rollout.as_deref().is_some_and(|r| {
                    r.contains(
                        "Deployment jobs-critical-reserved runs 2, shrinks to 0 once jobs-shared is ready (",
                    )
                })
            })
        })
        .await;
    let removed = world
        .until(30, "the removed lane's Deployment gone", || async {
            world.replicas("jobs-critical-reserved").await.is_none()
        })
        .await;
    assert!(
        removed >= Duration::from_secs(4),
        "it left only once shared was ready: after {removed:?}"
    );
    assert_eq!(world.replicas("jobs-shared").await, Some(11));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rate_on_an_integer_boundary_does_not_flap() {
    let world = World::start("boundary").await;
    // 10/s × 50 ms × 2 = 1.0 exactly; Prometheus's rate() reads it a little above or below.
    world.urgent(10.0, 0.050);
    world
        .apply_pool(|spec| {
            spec["headroom"] = json!(2);
            spec["scaleDown"]["stabilizationWindow"] = json!("0s");
        })
        .await;
    world
        .until(40, "metrics available", || async {
            world.condition_is("MetricsAvailable", "True").await
        })
        .await;
    let mut seen = std::collections::BTreeSet::new();
    let started = Instant::now();
    while started.elapsed() < Duration::from_secs(40) {
        seen.insert(world.replicas("jobs-urgent-reserved").await);
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    assert_eq!(seen, [Some(1)].into(), "8 evaluations at 1.0 ± noise");
    let rates: Vec<f64> = world
        .pool()
        .await
        .status
        .into_iter()
        .flat_map(|s| s.lanes)
        .filter_map(|l| l.arrival_rate_per_second)
        .collect();
    eprintln!("the rate read at the end: {rates:?}/s");
}

/// A worker Pod of pool `jobs` that is ready and serves, at a loopback port, its own count of
/// urgent jobs finished: `rate()` jobs per second since it started. As the Deployment and
/// ReplicaSet controllers would (none runs here), the test makes it a Pod of a ReplicaSet of the
/// pool's Deployment `jobs-shared`; as a kubelet would, it binds the Pod and gives it its address,
/// its readiness and its container's start time.
async fn counting_worker(world: &World, name: &str, rate: Arc<std::sync::Mutex<f64>>) {
    let deployments: Api<Deployment> = Api::namespaced(world.client.clone(), &world.namespace);
    world
        .until(30, "Deployment jobs-shared", || async {
            deployments.get_opt("jobs-shared").await.unwrap().is_some()
        })
        .await;
    let deployment = deployments.get("jobs-shared").await.unwrap();
    let labels = json!({"lanepool.dev/pool": "jobs", "lanepool.dev/role": "shared"});
    let replicaset: k8s_openapi::api::apps::v1::ReplicaSet = serde_json::from_value(json!({
        "metadata": {"name": format!("{name}-rs"), "labels": labels,
            "ownerReferences": [{"apiVersion": "apps/v1", "kind": "Deployment",
                "name": "jobs-shared", "uid": deployment.uid().unwrap(), "controller": true}]},
        "spec": {"replicas": 0, "selector": {"matchLabels": labels},
            "template": {"metadata": {"labels": labels},
                "spec": {"containers": [{"name": "worker", "image": "lane-worker"}]}}},
    }))
    .unwrap();
    let replicaset = Api::namespaced(world.client.clone(), &world.namespace)
        .create(&PostParams::default(), &replicaset)
        .await
        .unwrap();
    let counted = Arc::new(std::sync::Mutex::new((0.0_f64, Instant::now())));
    let addr = testenv::serve_metrics(move || {
        let per_second = *rate.lock().unwrap_or_else(|p| p.into_inner());
        let mut counted = counted.lock().unwrap_or_else(|p| p.into_inner());
        let now = Instant::now();
        counted.0 += per_second * now.duration_since(counted.1).as_secs_f64();
        counted.1 = now;
        let count = counted.0.floor();
        format!(
            "# TYPE lanepool_job_duration_seconds histogram\n\
             lanepool_job_duration_seconds_bucket{{lane=\"urgent\",le=\"+Inf\"}} {count}\n\
             lanepool_job_duration_seconds_sum{{lane=\"urgent\"}} {}\n\
             lanepool_job_duration_seconds_count{{lane=\"urgent\"}} {count}\n",
            count * 0.02
        )
    })
    .unwrap();
    let pods: Api<Pod> = Api::namespaced(world.client.clone(), &world.namespace);
    let pod: Pod = serde_json::from_value(json!({
        "metadata": {"name": name, "labels": labels,
            "ownerReferences": [{"apiVersion": "apps/v1", "kind": "ReplicaSet",
                "name": replicaset.name_any(), "uid": replicaset.uid().unwrap(), "controller": true}]},
        "spec": {"nodeName": "local", "containers": [{"name": "worker", "image": "lane-worker",
            "ports": [{"name": "metrics", "containerPort": addr.port()}]}]},
    }))
    .unwrap();
    pods.create(&PostParams::default(), &pod).await.unwrap();
    let now = k8s_openapi::jiff::Timestamp::now().to_string();
    let status = json!({"status": {
        "phase": "Running",
        "podIP": "127.0.0.1",
        "podIPs": [{"ip": "127.0.0.1"}],
        "conditions": [{"type": "Ready", "status": "True"}],
        "containerStatuses": [{"name": "worker", "image": "lane-worker", "imageID": "",
            "ready": true, "restartCount": 0, "state": {"running": {"startedAt": now}}}],
    }});
    pods.patch_status(name, &PatchParams::default(), &Patch::Merge(&status))
        .await
        .unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_workers_own_counts_grow_the_reserve_for_a_spike_prometheus_has_not_seen() {
    // A 20 s long window (the default is 1 m), so growth waits for the long rate to confirm it.
    let world = World::start_with(
        "reads",
        |settings| settings.windows.arrival_rate = "20s".into(),
        Duration::ZERO,
    )
    .await;
    // Prometheus sees 30/s throughout: 30/s × 20 ms × 1.5 = 0.9 → 1 reserved, never more.
    world.urgent(30.0, 0.020);
    let rate = Arc::new(std::sync::Mutex::new(30.0));
    world
        .apply_pool(|spec| {
            spec["template"]["spec"]["containers"][0]["ports"] =
                json!([{"name": "metrics", "containerPort": 9100}]);
        })
        .await;
    counting_worker(&world, "jobs-shared-counting", rate.clone()).await;
    watch_counts(&world, 40, |r, s| r == 1 && s == 9).await;
    world
        .until(60, "Prometheus's long rate at 30/s", || async {
            world
                .lanes()
                .await
                .first()
                .and_then(|l| l.arrival_rate_per_second)
                .is_some_and(|r| r >= 27.0)
        })
        .await;

    // The workers finish 150/s now; Prometheus still says 30/s.
    *rate.lock().unwrap() = 150.0;
    let spiked = Instant::now();
    let growing = watch_counts(&world, 20, |r, _| r >= 2).await;
    let grew = spiked.elapsed();
    // Read within one 5 s interval, applied at once: Prometheus alone would hold 1 for good.
    assert!(
        grew <= Duration::from_secs(12),
        "grew after {grew:?}: {growing:?}"
    );
    // The status is written after the Deployments (growth goes first, then the drains and the
    // ranking of the shared workers that shrink): it follows within the reconcile.
    world
        .until(10, "the status shows the workers' rate", || async {
            let lanes = world.lanes().await;
            let recent = lanes.first().and_then(|l| l.recent_arrival_rate.clone());
            recent
                .as_deref()
                .is_some_and(|r| r.starts_with("14") || r.starts_with("15"))
        })
        .await;
    // The first step is what twice the long rate confirms; the reads' own long rate (once they
    // span half the 20 s window) confirms the rest as the spike goes on: 150/s × 20 ms × 1.5 = 4.5
    // → 5.
    let confirmed = watch_counts(&world, 60, |r, s| r == 5 && s == 5).await;
    assert!(confirmed.iter().all(|(r, s)| r + s >= 10), "{confirmed:?}");
    eprintln!(
        "workers at 150/s, Prometheus at 30/s: 2 reserved after {:.1} s, 5 after {:.1} s",
        grew.as_secs_f64(),
        spiked.elapsed().as_secs_f64()
    );

    // Back to 30/s: the reserve follows the workers down, within the pool's 20 s hold.
    *rate.lock().unwrap() = 30.0;
    let dropped = Instant::now();
    watch_counts(&world, 60, |r, s| r == 1 && s == 9).await;
    eprintln!(
        "back to 1 reserved after {:.1} s",
        dropped.elapsed().as_secs_f64()
    );
}

// ---- Hardening: one bad pool never hurts the others, credentials never leave ----

/// A TCP server on 127.0.0.1 that hands every connection to `serve`, and counts connections.
async fn hostile_server<F, Fut>(serve: F) -> (String, Arc<AtomicUsize>)
where
    F: Fn(tokio::net::TcpStream) -> Fut + Send + Sync + 'static,
    Fut: std::future::Future<Output = ()> + Send,
{
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    let connections = Arc::new(AtomicUsize::new(0));
    let counted = connections.clone();
    let serve = Arc::new(serve);
    tokio::spawn(async move {
        while let Ok((stream, _)) = listener.accept().await {
            counted.fetch_add(1, Ordering::SeqCst);
            let serve = serve.clone();
            tokio::spawn(async move { serve(stream).await });
        }
    });
    (url, connections)
}

/// Streams an instant vector that never ends, as fast as the reader takes it.
async fn endless_answer(mut stream: tokio::net::TcpStream) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut request = [0u8; 4096];
    let _ = stream.read(&mut request).await;
    let head =
        "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n";
    let start = r#"{"status":"success","data":{"resultType":"vector","result":["#;
    let series = r#"{"metric":{"lane":"urgent"},"value":[1,"1"]},"#.repeat(1024);
    let chunk = |text: &str| format!("{:x}\r\n{text}\r\n", text.len());
    if stream.write_all(head.as_bytes()).await.is_err()
        || stream.write_all(chunk(start).as_bytes()).await.is_err()
    {
        return;
    }
    let body = chunk(&series);
    while stream.write_all(body.as_bytes()).await.is_ok() {}
}

/// Accepts, reads the request, and never answers.
async fn never_answers(mut stream: tokio::net::TcpStream) {
    use tokio::io::AsyncReadExt;
    let mut request = [0u8; 4096];
    let _ = stream.read(&mut request).await;
    tokio::time::sleep(Duration::from_secs(600)).await;
}

/// The peak resident memory of this process (the operator runs in it), in MiB.
fn peak_rss_mib() -> f64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap();
    let kib: f64 = status
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))
        .and_then(|v| v.split_whitespace().next()?.parse().ok())
        .unwrap();
    kib / 1024.0
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_endless_or_hung_prometheus_fails_its_pool_only() {
    let world = World::start("hostile").await;
    world.urgent(30.0, 0.020);
    world.apply_pool(|_| {}).await;
    world
        .until(40, "the healthy pool sized: 1 reserved", || async {
            world.replicas("jobs-urgent-reserved").await == Some(1)
        })
        .await;
    let before = peak_rss_mib();

    let (endless, _) = hostile_server(endless_answer).await;
    let (hung, _) = hostile_server(never_answers).await;
    world
        .apply_named("endless", |spec| {
            spec["prometheus"] = json!({"url": endless, "timeout": "4s"})
        })
        .await;
    world
        .apply_named("hung", |spec| {
            spec["prometheus"] = json!({"url": hung, "timeout": "4s"})
        })
        .await;
    // The hung server is given up on at the query's timeout or the reconcile's deadline.
    for (pool, says) in [
        ("endless", ["longer than 1024 KiB", "longer than 1024 KiB"]),
        ("hung", ["timed out", "deadline"]),
    ] {
        world
            .until(
                30,
                &format!("{pool}: MetricsAvailable=False, {says:?}"),
                || async {
                    world
                        .condition_of(pool, "MetricsAvailable")
                        .await
                        .is_some_and(|(status, _, message)| {
                            status == "False" && says.iter().any(|s| message.contains(s))
                        })
                },
            )
            .await;
    }

    // The healthy pool keeps its interval (5 s) while the others fail: a rise reaches it.
    world.urgent(150.0, 0.020);
    let took = world
        .until(20, "the healthy pool follows 150/s: 5 reserved", || async {
            world.replicas("jobs-urgent-reserved").await == Some(5)
        })
        .await;
    let after = peak_rss_mib();
    println!(
        "healthy pool resized {:.1} s after the rise; peak RSS {before:.0} MiB before the hostile pools, {after:.0} MiB after",
        took.as_secs_f64()
    );
    assert!(
        after - before < 64.0,
        "the endless answer is read at most 1 MiB at a time: {before:.0} → {after:.0} MiB"
    );
    // The hostile pools hold their counts (Hold starts at min), never zero.
    assert_eq!(world.replicas("endless-urgent-reserved").await, Some(1));
    assert_eq!(world.replicas("hung-urgent-reserved").await, Some(1));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_prometheus_url_not_allowed_is_never_connected_to() {
    let (elsewhere, connections) = hostile_server(never_answers).await;
    let world = World::start_with(
        "allowed",
        |settings| {
            settings.allowed_prometheus_urls =
                AllowedUrls::parse("http://prometheus.monitoring:9090").unwrap()
        },
        Duration::ZERO,
    )
    .await;
    world
        .apply_pool(|spec| {
            spec["prometheus"] = json!({
                "url": elsewhere,
                "headers": {"Metadata-Flavor": "Google"}
            })
        })
        .await;
    world
        .until(30, "Ready=False, PrometheusURLNotAllowed", || async {
            world
                .condition("Ready")
                .await
                .is_some_and(|(status, reason, message)| {
                    status == "False"
                        && reason == "PrometheusURLNotAllowed"
                        && message.contains("--allowed-prometheus-urls")
                })
        })
        .await;
    tokio::time::sleep(Duration::from_secs(6)).await;
    assert_eq!(
        connections.load(Ordering::SeqCst),
        0,
        "no connection was made"
    );
    assert_eq!(
        world.replicas("jobs-shared").await,
        None,
        "nothing was written"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_a_list_credentials_go_only_to_the_operators_own_url() {
    // The chart's defaults list no URL: a pool may name any, but its Secret goes nowhere else.
    let (elsewhere, connections) = hostile_server(never_answers).await;
    let world = World::start("credentials").await;
    world
        .secret(
            "token",
            "Opaque",
            &[("token", "the tenant may not read this")],
        )
        .await;
    let https = elsewhere.replace("http://", "https://");
    world
        .apply_pool(|spec| {
            spec["prometheus"] = json!({
                "url": https,
                "bearerTokenSecret": {"name": "token", "key": "token"}
            })
        })
        .await;
    world
        .until(30, "Ready=False, PrometheusURLNotAllowed", || async {
            world
                .condition("Ready")
                .await
                .is_some_and(|(status, reason, message)| {
                    status == "False"
                        && reason == "PrometheusURLNotAllowed"
                        && message.contains("--prometheus-url")
                })
        })
        .await;
    tokio::time::sleep(Duration::from_secs(6)).await;
    assert_eq!(
        connections.load(Ordering::SeqCst),
        0,
        "the token went nowhere"
    );
    // Without credentials the same URL is asked (and never answers): no Secret is at stake.
    world
        .apply_pool(|spec| spec["prometheus"] = json!({"url": elsewhere, "timeout": "1s"}))
        .await;
    world
        .until(30, "the unnamed URL asked without credentials", || async {
            connections.load(Ordering::SeqCst) > 0
        })
        .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_deployment_of_the_same_name_that_is_not_the_pools_is_left_alone() {
    let world = World::start("conflict").await;
    world.urgent(30.0, 0.020);
    // Someone else's Deployment under the name the pool's reserved workers would get (as pool
    // "jobs-urgent" with lane "reserved"... or a hand-made one).
    let foreign: Deployment = serde_json::from_value(json!({
        "metadata": {"name": "jobs-urgent-reserved", "labels": {"app": "theirs"}},
        "spec": {
            "replicas": 7,
            "selector": {"matchLabels": {"app": "theirs"}},
            "template": {
                "metadata": {"labels": {"app": "theirs"}},
                "spec": {"containers": [{"name": "c", "image": "theirs:1"}]}
            }
        }
    }))
    .unwrap();
    world
        .deployments()
        .create(&PostParams::default(), &foreign)
        .await
        .unwrap();
    world.apply_pool(|_| {}).await;
    world
        .until(30, "Ready=False, NameConflict", || async {
            world
                .condition("Ready")
                .await
                .is_some_and(|(status, reason, message)| {
                    status == "False"
                        && reason == "NameConflict"
                        && message.contains("jobs-urgent-reserved")
                })
        })
        .await;
    let theirs = world
        .deployments()
        .get("jobs-urgent-reserved")
        .await
        .unwrap();
    assert_eq!(theirs.spec.as_ref().unwrap().replicas, Some(7));
    assert_eq!(
        theirs.labels().get("app").map(String::as_str),
        Some("theirs")
    );
    assert!(theirs.owner_references().is_empty());
    assert_eq!(
        world.replicas("jobs-shared").await,
        None,
        "nothing written before the check"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_operator_killed_mid_scale_down_keeps_the_window_after_restart() {
    let mut world = World::start("killed").await;
    world.urgent(150.0, 0.020);
    world.apply_pool(|_| {}).await;
    world
        .until(40, "5 reserved", || async {
            world.replicas("jobs-urgent-reserved").await == Some(5)
        })
        .await;
    // The load falls; the 20 s window holds 5. Kill the operator before the window ends.
    world.urgent(30.0, 0.020);
    tokio::time::sleep(Duration::from_secs(8)).await;
    assert_eq!(
        world.replicas("jobs-urgent-reserved").await,
        Some(5),
        "held by the window"
    );
    world.restart_operator();
    let killed = Instant::now();
    // The new operator never shrinks sooner than the window after it starts.
    let dropped = world
        .until(60, "the reserve falls to 1 after the window", || async {
            world.replicas("jobs-urgent-reserved").await == Some(1)
        })
        .await;
    let held = killed.elapsed().as_secs_f64();
    println!(
        "after the kill the reserve was held {held:.1} s (window 20 s), dropped within {:.1} s of polling",
        dropped.as_secs_f64()
    );
    assert!(
        held >= 19.0,
        "the restart shortened the window: held {held:.1} s"
    );
}

/// More pools waiting when the operator starts than it reconciles at once: every one is sized.
/// (Reconciles once waited for the Deployment cache's first list; a full set of them stalled
/// the watch that fills it, and the cache's readiness woke only its last waiter.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pools_waiting_at_start_beyond_the_concurrent_reconciles_are_all_sized() {
    let mut world = World::start("backlog").await;
    world.operator.take().expect("an operator").kill();
    // "jobs" among them, the pool a failed wait reports the status of.
    let names: Vec<String> = (0..12)
        .map(|i| {
            if i == 0 {
                "jobs".into()
            } else {
                format!("jobs-{i}")
            }
        })
        .collect();
    for name in &names {
        world
            .workers
            .set_lane(&world.namespace, name, "urgent", 30.0, 0.020);
        world.apply_named(name, |_| {}).await;
    }
    let mut settings = InProcessOperator::settings(world.prometheus.url());
    settings.concurrent_reconciles = 2;
    world.operator = Some(InProcessOperator::start_with(
        world.client.clone(),
        vec![world.namespace.clone()],
        settings,
    ));
    let shared = ListParams::default().labels("lanepool.dev/role=shared");
    world
        .until(30, "every pool's shared Deployment", || async {
            let list = world.deployments().list(&shared).await.unwrap();
            list.items.len() == names.len()
        })
        .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_kubectl_set_image_on_a_managed_deployment_is_undone_once() {
    let world = World::start("drift").await;
    world.urgent(30.0, 0.020);
    world.apply_pool(|_| {}).await;
    world
        .until(30, "both Deployments", || async {
            world.replicas("jobs-shared").await.is_some()
        })
        .await;
    let image = |d: Deployment| {
        d.spec.unwrap().template.spec.unwrap().containers[0]
            .image
            .clone()
            .unwrap_or_default()
    };
    let ours = image(world.deployments().get("jobs-shared").await.unwrap());
    // What `kubectl set image deployment/jobs-shared worker=…:debug` sends.
    let patch = json!({"spec": {"template": {"spec": {"containers": [
        {"name": "worker", "image": "ghcr.io/lanepool/lane-worker:debug"}
    ]}}}});
    world
        .deployments()
        .patch(
            "jobs-shared",
            &PatchParams {
                field_manager: Some("kubectl-set".into()),
                ..Default::default()
            },
            &Patch::Strategic(&patch),
        )
        .await
        .unwrap();
    world
        .until(20, "the pool's image is back", || async {
            image(world.deployments().get("jobs-shared").await.unwrap()) == ours
        })
        .await;
    // Applied once, not on every reconcile after: the spec's generation stands still.
    let generation = |d: Deployment| d.metadata.generation;
    let after = generation(world.deployments().get("jobs-shared").await.unwrap());
    tokio::time::sleep(Duration::from_secs(12)).await;
    assert_eq!(
        generation(world.deployments().get("jobs-shared").await.unwrap()),
        after
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_deleted_pool_stops_being_exported() {
    let world = World::start("deleted").await;
    world.urgent(30.0, 0.020);
    world.apply_pool(|_| {}).await;
    let metrics = world.operator.as_ref().unwrap().metrics();
    let exported = || {
        let text = metrics.render();
        text.contains(&format!("namespace=\"{}\"", world.namespace))
            && text.contains("pool=\"jobs\"")
    };
    world
        .until(30, "the pool's series exported", || async { exported() })
        .await;
    // Its conditions too, as its status holds them, so their removal is what is checked below.
    let ready = format!(
        "lanepool_operator_pool_condition{{namespace=\"{}\",pool=\"jobs\",type=\"Ready\",status=\"True\"}} 1",
        world.namespace
    );
    world
        .until(30, "the pool's Ready condition exported", || async {
            metrics.render().lines().any(|line| line == ready)
        })
        .await;
    Api::<LanePool>::namespaced(world.client.clone(), &world.namespace)
        .delete("jobs", &Default::default())
        .await
        .unwrap();
    // The sweep runs every 30 s.
    let took = world
        .until(45, "the deleted pool's series gone", || async {
            !exported()
        })
        .await;
    println!(
        "a deleted pool's series were gone {:.1} s after the delete",
        took.as_secs_f64()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn events_whose_notes_carry_multibyte_text_are_published() {
    // The API server counts bytes: at most 1,024 in an event's note and 128 in its action
    // (which carries the note's start). A query of 1,000 "é" makes a MetricsUnavailable note of
    // over 2,000 bytes that quotes it: cut by bytes, at a character boundary, it is published.
    let world = World::start("bytes").await;
    world
        .apply_pool(|spec| {
            spec["lanes"][0]["name"] = json!("critical");
            spec["lanes"][0]["reserve"]["arrivalRate"] = json!({"query": "é".repeat(1000)});
            spec["headroom"] = json!(2);
            spec.as_object_mut().unwrap().remove("totalWorkers");
            spec["shared"] = json!({"replicas": 3});
        })
        .await;
    world
        .until(
            30,
            "a MetricsUnavailable event quoting the query",
            || async {
                world.events().await.iter().any(|(reason, note)| {
                    reason == "MetricsUnavailable"
                        && note.contains("(query: éé")
                        && note.len() <= 1024
                })
            },
        )
        .await;
    world
        .until(10, "a Scaled event with → in it", || async {
            world
                .events()
                .await
                .iter()
                .any(|(reason, note)| reason == "Scaled" && note.contains('→'))
        })
        .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_identical_event_joins_its_series_and_a_different_one_does_not() {
    use k8s_openapi::api::events::v1::Event as SeriesEvent;
    use kube::runtime::events::EventType;
    use lanepool::controller::{PoolEvent, Recorder};

    let world = World::start("series").await;
    world.apply_pool(|_| {}).await;
    let pool = world.pool().await;
    let recorder = Recorder::new(world.client.clone(), Some("lanepool-test-0".into()));
    let said = PoolEvent {
        type_: EventType::Warning,
        reason: "SeriesTest",
        action: "held",
        note: "urgent held at 2 → 2 reserved",
    };
    for _ in 0..3 {
        recorder.publish(&pool, said).await.unwrap();
    }
    let other = PoolEvent {
        note: "urgent held at 3 → 3 reserved",
        ..said
    };
    recorder.publish(&pool, other).await.unwrap();

    let events: Api<SeriesEvent> = Api::namespaced(world.client.clone(), &world.namespace);
    let mut ours: Vec<(String, i32, String)> = events
        .list(&ListParams::default())
        .await
        .unwrap()
        .items
        .into_iter()
        .filter(|e| e.reason.as_deref() == Some("SeriesTest"))
        .map(|e| {
            let count = e.series.as_ref().map_or(1, |s| s.count);
            assert_eq!(e.reporting_instance.as_deref(), Some("lanepool-test-0"));
            assert_eq!(
                e.regarding.as_ref().and_then(|r| r.uid.clone()),
                pool.metadata.uid
            );
            (
                e.note.unwrap_or_default(),
                count,
                e.type_.unwrap_or_default(),
            )
        })
        .collect();
    ours.sort();
    assert_eq!(
        ours,
        [
            (
                "urgent held at 2 → 2 reserved".to_string(),
                3,
                "Warning".to_string()
            ),
            (
                "urgent held at 3 → 3 reserved".to_string(),
                1,
                "Warning".to_string()
            ),
        ]
    );
}

/// Runs the pinned kubectl against the test API server.
fn kubectl(args: &[&str]) -> (bool, String) {
    let plane = testenv::shared().expect("the control plane starts");
    plane
        .kubectl(args)
        .expect("kubectl is built by tests/setup.sh")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kubectl_scale_sizes_the_whole_pool_and_lanepool_splits_it() {
    let world = World::start("scale").await;
    world.two_reserve_lanes().await;
    world
        .until(40, "1 + 2 reserved and 9 shared, measured", || async {
            world.replicas("jobs-urgent-reserved").await == Some(1)
                && world.replicas("jobs-critical-reserved").await == Some(2)
                && world.replicas("jobs-shared").await == Some(9)
                && world.condition_is("MetricsAvailable", "True").await
        })
        .await;
    let ns = world.namespace.as_str();

    // What an HPA or KEDA reads and writes: the /scale subresource.
    let (ok, out) = kubectl(&["scale", "lp/jobs", "--replicas", "14", "-n", ns]);
    assert!(ok, "{out}");
    assert_eq!(world.pool().await.spec.total_workers, Some(14));
    world
        .until(30, "the reserves kept, shared grown to 11", || async {
            world.replicas("jobs-urgent-reserved").await == Some(1)
                && world.replicas("jobs-critical-reserved").await == Some(2)
                && world.replicas("jobs-shared").await == Some(11)
                && world.pool().await.status.is_some_and(|s| s.replicas == 14)
        })
        .await;
    let path = format!("/apis/lanepool.dev/v1alpha1/namespaces/{ns}/lanepools/jobs/scale");
    let (ok, out) = kubectl(&["get", "--raw", &path]);
    assert!(ok, "{out}");
    let scale: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(scale["spec"]["replicas"], 14, "{scale}");
    assert_eq!(scale["status"]["replicas"], 14, "{scale}");
    assert_eq!(
        scale["status"]["selector"], "lanepool.dev/pool=jobs",
        "{scale}"
    );

    let (ok, wide) = kubectl(&["get", "lp", "-o", "wide", "-n", ns]);
    assert!(ok, "{wide}");
    let header: Vec<&str> = wide.lines().next().unwrap().split_whitespace().collect();
    for column in [
        "RESERVES", "RESERVED", "SHARED", "METRICS", "PAUSED", "READY", "URGENT",
    ] {
        assert!(header.contains(&column), "{column} missing: {wide}");
    }
    assert!(wide.contains("urgent 1, critical 2"), "{wide}");
    eprintln!("kubectl get lp -o wide:\n{wide}");

    // Below what the reserves ask plus shared.minReplicas (1 + 2 + 2 = 5) the total is taken
    // down to the reserves' floor (1 + 1 + 2 = 4): shared keeps its minimum, urgent (the first
    // lane) keeps its 1 and critical gets 1 of the 2 it asks, and the pool says so.
    let (ok, out) = kubectl(&["scale", "lp/jobs", "--replicas", "4", "-n", ns]);
    assert!(ok, "{out}");
    world
        .until(30, "urgent 1, critical cut to 1, shared 2", || async {
            world.replicas("jobs-urgent-reserved").await == Some(1)
                && world.replicas("jobs-critical-reserved").await == Some(1)
                && world.replicas("jobs-shared").await == Some(2)
        })
        .await;
    // The status is written after the Deployments: wait for it rather than race it.
    world
        .until(10, "ScalingLimited=True, TotalBelowReserves", || async {
            world
                .condition("ScalingLimited")
                .await
                .is_some_and(|(status, reason, _)| {
                    status == "True" && reason == "TotalBelowReserves"
                })
        })
        .await;
    let (status, reason, message) = world.condition("ScalingLimited").await.unwrap();
    assert_eq!(
        (status.as_str(), reason.as_str()),
        ("True", "TotalBelowReserves"),
        "{message}"
    );
    assert!(
        message
            .contains("lane critical asks 2 reserved workers and gets 1: totalWorkers 4 leaves 2"),
        "{message}"
    );
    world
        .until(10, "a TotalBelowReserves event", || async {
            world.events().await.iter().any(|(reason, note)| {
                reason == "TotalBelowReserves" && note.contains("lane critical asks 2")
            })
        })
        .await;

    // Below the reserves' minimums plus shared.minReplicas, or to zero: refused, the pool
    // untouched.
    for replicas in ["3", "0"] {
        let (ok, out) = kubectl(&["scale", "lp/jobs", "--replicas", replicas, "-n", ns]);
        assert!(!ok, "--replicas {replicas} accepted: {out}");
        assert!(out.contains("spec.totalWorkers"), "{out}");
    }
    assert_eq!(world.pool().await.spec.total_workers, Some(4));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_outage_acts_only_after_the_failure_threshold() {
    let mut world = World::start("threshold").await;
    world.urgent(150.0, 0.020);
    world
        .apply_pool(|spec| {
            spec["scaleDown"]["stabilizationWindow"] = json!("0s");
            spec["onMetricsUnavailable"] =
                json!({"action": "FixedReserve", "reserve": 2, "failureThreshold": 3});
        })
        .await;
    world
        .until(40, "5 reserved", || async {
            world.replicas("jobs-urgent-reserved").await == Some(5)
        })
        .await;

    world.prometheus.stop();
    let stopped = Instant::now();
    world
        .until(30, "the first failed interval, held", || async {
            world
                .condition("MetricsAvailable")
                .await
                .is_some_and(|c| c.0 == "False" && c.2.contains("failed interval 1 of 3"))
        })
        .await;
    assert_eq!(
        world.replicas("jobs-urgent-reserved").await,
        Some(5),
        "held"
    );
    world
        .until(30, "the fixed reserve after 3 failed intervals", || async {
            world.replicas("jobs-urgent-reserved").await == Some(2)
        })
        .await;
    let acted = stopped.elapsed();
    // Three 5 s intervals: the third failure is at least 10 s after the first.
    assert!(acted >= Duration::from_secs(10), "acted after {acted:?}");
    let (_, _, message) = world.condition("MetricsAvailable").await.unwrap();
    assert!(message.contains("failureThreshold reached"), "{message}");
    let events = world.events().await;
    let stages: Vec<_> = events
        .iter()
        .filter(|(reason, _)| reason == "MetricsUnavailable")
        .collect();
    assert!(stages.len() >= 2, "an event per stage: {events:?}");
    world.prometheus.resume().unwrap();
    world
        .until(40, "measured again", || async {
            world.condition_is("MetricsAvailable", "True").await
                && world.replicas("jobs-urgent-reserved").await == Some(5)
        })
        .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_paused_scale_down_holds_the_reserve_while_growth_goes_on() {
    let world = World::start("holddown").await;
    world.urgent(30.0, 0.020);
    world
        .apply_pool(|spec| {
            spec["scaleDown"] = json!({"stabilizationWindow": "0s", "paused": true});
        })
        .await;
    world
        .until(30, "1 reserved", || async {
            world.replicas("jobs-urgent-reserved").await == Some(1)
        })
        .await;
    world.urgent(150.0, 0.020);
    world
        .until(40, "growth goes on: 5 reserved", || async {
            world.replicas("jobs-urgent-reserved").await == Some(5)
        })
        .await;
    world.urgent(30.0, 0.020);
    // Three intervals at 30/s: without the pause it would be back at 1 (window 0s).
    tokio::time::sleep(Duration::from_secs(15)).await;
    assert_eq!(world.replicas("jobs-urgent-reserved").await, Some(5));
    let status = world.pool().await.status.unwrap();
    assert_eq!(status.scale_down.as_deref(), Some("Paused"));
    assert!(
        status
            .last_decision
            .as_deref()
            .unwrap_or_default()
            .contains("scale-down paused"),
        "{status:?}"
    );
    Api::<LanePool>::namespaced(world.client.clone(), &world.namespace)
        .patch(
            "jobs",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"scaleDown": {"paused": false}}})),
        )
        .await
        .unwrap();
    world
        .until(30, "unpaused, it shrinks to 1", || async {
            world.replicas("jobs-urgent-reserved").await == Some(1)
        })
        .await;
}
