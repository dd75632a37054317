//! The LanePool API against a real kube-apiserver: the CRD installs, the example is accepted and
//! read back intact, every field round-trips, and bad manifests are refused naming the field.

use std::collections::BTreeMap;

use kube::api::{Api, DynamicObject, PostParams};
use kube::core::{ApiResource, Status};
use kube::{Client, Resource};
use lanepool::api::*;
use lanepool::duration::KubeDuration;
use lanepool_testenv as testenv;
use serde_json::{Value, json};

async fn client_and_namespace() -> (Client, String) {
    let plane = testenv::shared().expect("the control plane starts");
    let client = plane.client().await.expect("a client");
    let namespace = plane.namespace(&client, "api").await.expect("a namespace");
    (client, namespace)
}

fn example() -> Value {
    let yaml = std::fs::read_to_string(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/examples/lanepool.yaml"
    ))
    .expect("examples/lanepool.yaml");
    serde_yaml::from_str(&yaml).expect("the example is YAML")
}

fn lanepools(client: &Client, namespace: &str) -> Api<DynamicObject> {
    Api::namespaced_with(
        client.clone(),
        namespace,
        &ApiResource::erase::<LanePool>(&()),
    )
}

async fn create(
    client: &Client,
    namespace: &str,
    manifest: Value,
) -> Result<DynamicObject, kube::Error> {
    let object: DynamicObject = serde_json::from_value(manifest).expect("a manifest");
    lanepools(client, namespace)
        .create(&PostParams::default(), &object)
        .await
}

/// Applies `change` to the example's spec and returns what the API server says.
async fn refused(
    client: &Client,
    namespace: &str,
    name: &str,
    change: impl FnOnce(&mut Value),
) -> Status {
    let mut manifest = example();
    manifest["metadata"]["name"] = json!(name);
    change(&mut manifest["spec"]);
    match create(client, namespace, manifest).await {
        Err(kube::Error::Api(response)) => *response,
        other => panic!("{name}: expected the API server to refuse it, got {other:?}"),
    }
}

#[tokio::test]
async fn a_name_longer_than_a_label_value_is_refused_and_63_is_accepted() {
    let (client, namespace) = client_and_namespace().await;
    let name = "p".repeat(64);
    let error = refused(&client, &namespace, &name, |_| {}).await;
    assert_eq!(error.code, 422, "{error:?}");
    assert!(error.message.contains("at most 63 characters"), "{error:?}");
    let mut longest = example();
    longest["metadata"]["name"] = json!("p".repeat(63));
    create(&client, &namespace, longest)
        .await
        .expect("a 63-character name is a valid label value");
}

#[tokio::test]
async fn the_python_worker_examples_are_accepted_as_shipped() {
    let (client, namespace) = client_and_namespace().await;
    for file in ["lanepool-rq.yaml", "lanepool-celery.yaml"] {
        let path = format!("{}/examples/redis/{file}", env!("CARGO_MANIFEST_DIR"));
        let yaml = std::fs::read_to_string(&path).expect("the example");
        let mut manifest: Value = serde_yaml::from_str(&yaml).expect("YAML");
        // Applied in the test's namespace (as shipped it names the demo's), under a name each.
        manifest["metadata"]["namespace"] = json!(namespace);
        manifest["metadata"]["name"] = json!(file.trim_end_matches(".yaml"));
        let created = create(&client, &namespace, manifest.clone())
            .await
            .unwrap_or_else(|e| panic!("{file} refused: {e:?}"));
        let spec: LanePoolSpec = serde_json::from_value(created.data["spec"].clone()).unwrap();
        let shipped: LanePoolSpec = serde_json::from_value(manifest["spec"].clone()).unwrap();
        assert_eq!(spec, shipped, "{file}");
    }
}

#[tokio::test]
async fn the_example_is_accepted_and_read_back_intact() {
    let (client, namespace) = client_and_namespace().await;
    let created = create(&client, &namespace, example())
        .await
        .expect("the example is accepted");
    let api: Api<LanePool> = Api::namespaced(client, &namespace);
    let pool = api
        .get(&created.metadata.name.clone().unwrap())
        .await
        .expect("read back");
    let expected: LanePoolSpec = serde_json::from_value(example()["spec"].clone()).unwrap();
    assert_eq!(pool.spec, expected);
    assert_eq!(
        pool.spec.lanes[0].reserve.as_ref().unwrap().sizing,
        SizingMode::Queueing
    );
}

#[tokio::test]
async fn defaults_are_filled_in_by_the_api_server() {
    let (client, namespace) = client_and_namespace().await;
    let manifest = json!({
        "apiVersion": "lanepool.dev/v1alpha1", "kind": "LanePool",
        "metadata": {"name": "minimal"},
        "spec": {
            "lanes": [{"name": "urgent", "reserve": {"max": 4}}, {"name": "batch"}],
            "shared": {"replicas": 8},
            "template": {"spec": {"containers": [{"name": "w", "image": "w:1"}]}}
        }
    });
    let created = create(&client, &namespace, manifest)
        .await
        .expect("accepted");
    let spec = &created.data["spec"];
    assert_eq!(spec["headroom"].as_f64(), Some(1.0));
    assert_eq!(spec["interval"], json!("5s"));
    assert_eq!(spec["lanes"][0]["reserve"]["min"], json!(1));
    assert_eq!(spec["lanes"][0]["reserve"]["sizing"], json!("Queueing"));
    assert_eq!(spec["shared"]["minReplicas"], json!(1));
    assert_eq!(spec["slotsPerWorker"], json!(1));
}

#[tokio::test]
async fn every_field_round_trips_through_the_api() {
    let (client, namespace) = client_and_namespace().await;
    let template = serde_json::from_value(json!({
        "metadata": {"labels": {"app": "worker"}, "annotations": {"a": "b"}},
        "spec": {"containers": [{"name": "worker", "image": "w:1", "args": ["--x"],
                 "env": [{"name": "K", "value": "V"}]}]}
    }))
    .unwrap();
    let secret = |name: &str| k8s_openapi::api::core::v1::SecretKeySelector {
        name: name.into(),
        key: "key".into(),
        optional: Some(false),
    };
    let spec = LanePoolSpec {
        lanes: vec![
            Lane {
                name: "urgent".into(),
                queue: Some("high_priority".into()),
                reserve: Some(Reserve {
                    min: 2,
                    max: 7,
                    sizing: SizingMode::LatencyTarget,
                    target_p99: Some(KubeDuration::new("25ms")),
                    arrival_rate: Some(MetricQuery {
                        query: Some("sum(rate(x[1m]))".into()),
                    }),
                    job_time: Some(JobTimeQuery {
                        query: Some("avg(y)".into()),
                        fallback: Some(KubeDuration::new("25ms")),
                    }),
                }),
            },
            Lane {
                name: "interactive".into(),
                queue: None,
                reserve: Some(Reserve {
                    min: 0,
                    max: 1,
                    sizing: SizingMode::Formula,
                    target_p99: None,
                    arrival_rate: None,
                    job_time: None,
                }),
            },
            Lane {
                name: "batch".into(),
                queue: Some("rq:low.priority/€".into()),
                reserve: None,
            },
        ],
        headroom: 1.25,
        total_workers: Some(20),
        shared: Some(SharedWorkers {
            replicas: None,
            min_replicas: 3,
        }),
        slots_per_worker: 4,
        template,
        prometheus: Some(PrometheusSource {
            url: Some("https://prometheus.example:9090".into()),
            timeout: Some(KubeDuration::new("2s")),
            bearer_token_secret: Some(secret("token")),
            ca_secret: Some(secret("ca")),
            basic_auth: None,
            client_certificate_secret: Some(ClientCertificateSecret {
                name: "prometheus-client".into(),
            }),
            headers: BTreeMap::from([("X-Scope-OrgID".to_string(), "team-a".to_string())]),
        }),
        interval: KubeDuration::new("45m30s"),
        scale_down: Some(ScaleDown {
            stabilization_window: KubeDuration::new("0"),
            paused: true,
        }),
        on_metrics_unavailable: Some(OnMetricsUnavailable {
            action: MetricsUnavailableAction::FixedReserve,
            reserve: Some(3),
            failure_threshold: 5,
            hold_limit: KubeDuration::new("2h"),
        }),
        paused: true,
    };
    let api: Api<LanePool> = Api::namespaced(client, &namespace);
    let mut pool = LanePool::new("everything", spec.clone());
    pool.meta_mut().namespace = Some(namespace.clone());
    api.create(&PostParams::default(), &pool)
        .await
        .expect("accepted");
    let read = api.get("everything").await.expect("read back");
    assert_eq!(read.spec, spec);

    // Basic auth is the bearer token's alternative: the same pool with it instead.
    let mut basic = spec.clone();
    let prometheus = basic.prometheus.as_mut().unwrap();
    prometheus.bearer_token_secret = None;
    prometheus.basic_auth = Some(PrometheusBasicAuth {
        username_secret: secret("user"),
        password_secret: secret("password"),
    });
    let mut pool = LanePool::new("basic-auth", basic.clone());
    pool.meta_mut().namespace = Some(namespace);
    api.create(&PostParams::default(), &pool)
        .await
        .expect("accepted");
    assert_eq!(api.get("basic-auth").await.expect("read back").spec, basic);
}

#[tokio::test]
async fn a_lane_takes_a_queue_that_is_no_dns_label_of_at_most_255_bytes_not_characters() {
    let (client, namespace) = client_and_namespace().await;
    let with_queue = |name: &str, queue: Value| {
        let mut manifest = example();
        manifest["metadata"]["name"] = json!(name);
        manifest["spec"]["lanes"][0]["queue"] = queue;
        manifest
    };
    let api: Api<LanePool> = Api::namespaced(client.clone(), &namespace);
    let accepted = [
        ("high-priority", "high_priority".to_string()),
        ("ascii-255", "q".repeat(255)),
        // 128 characters, 255 bytes.
        ("two-byte-255", format!("{}q", "é".repeat(127))),
        // 85 characters, 255 bytes.
        ("three-byte-255", "€".repeat(85)),
    ];
    for (name, queue) in accepted {
        create(&client, &namespace, with_queue(name, json!(queue)))
            .await
            .unwrap_or_else(|e| panic!("{name}: {e:?}"));
        let lane = &api.get(name).await.expect("read back").spec.lanes[0];
        assert_eq!(
            (lane.name.as_str(), lane.queue()),
            ("urgent", queue.as_str())
        );
    }
    // Left out (or null), the lane takes the queue of its name: nothing is filled in.
    for (name, queue) in [("absent", None), ("null", Some(Value::Null))] {
        let mut manifest = example();
        manifest["metadata"]["name"] = json!(name);
        if let Some(queue) = queue {
            manifest["spec"]["lanes"][0]["queue"] = queue;
        }
        let created = create(&client, &namespace, manifest)
            .await
            .unwrap_or_else(|e| panic!("{name}: {e:?}"));
        let lane = &created.data["spec"]["lanes"][0];
        assert!(
            lane.get("queue").is_none_or(Value::is_null),
            "{name}: {lane}"
        );
        let read = &api.get(name).await.expect("read back").spec.lanes[0];
        assert_eq!((read.queue.as_deref(), read.queue()), (None, "urgent"));
    }

    // One byte more: 256 characters are refused by the schema, and 128 or 86 characters of 256
    // or 258 bytes by the CEL rule, naming bytes.
    let error = refused(&client, &namespace, "ascii-256", |s| {
        s["lanes"][0]["queue"] = json!("q".repeat(256))
    })
    .await;
    assert_eq!(error.code, 422, "{error:?}");
    assert!(error.message.contains("spec.lanes[0].queue"), "{error:?}");
    assert!(error.message.contains("255"), "{error:?}");
    for (name, queue) in [
        ("two-byte-256", "é".repeat(128)),
        ("three-byte-258", "€".repeat(86)),
    ] {
        let error = refused(&client, &namespace, name, |s| {
            s["lanes"][0]["queue"] = json!(queue)
        })
        .await;
        assert_eq!(error.code, 422, "{name}: {error:?}");
        assert!(
            error.message.contains("spec.lanes[0].queue")
                && error.message.contains("at most 255 bytes"),
            "{name}: {error:?}"
        );
    }
}

#[tokio::test]
async fn bad_manifests_are_refused_with_the_field_named() {
    let (client, ns) = client_and_namespace().await;
    type Change = Box<dyn FnOnce(&mut Value)>;
    let cases: Vec<(&str, Change, &[&str])> = vec![
        (
            "zero-headroom",
            Box::new(|s| s["headroom"] = json!(0)),
            &["spec.headroom"],
        ),
        (
            "negative-headroom",
            Box::new(|s| s["headroom"] = json!(-1.5)),
            &["spec.headroom"],
        ),
        (
            "huge-headroom",
            Box::new(|s| s["headroom"] = json!(11)),
            &["spec.headroom"],
        ),
        (
            "no-slots",
            Box::new(|s| s["slotsPerWorker"] = json!(0)),
            &["spec.slotsPerWorker"],
        ),
        (
            "too-many-slots",
            Box::new(|s| s["slotsPerWorker"] = json!(1025)),
            &["spec.slotsPerWorker"],
        ),
        (
            "min-above-max",
            Box::new(|s| s["lanes"][0]["reserve"]["min"] = json!(7)),
            &[
                "spec.lanes[0].reserve",
                "reserve.min must not exceed reserve.max",
            ],
        ),
        (
            "duplicate-lanes",
            Box::new(|s| s["lanes"][1]["name"] = json!("urgent")),
            &["spec.lanes", "lane names must be unique"],
        ),
        (
            "no-reserve-lane",
            Box::new(|s| {
                s["lanes"][0]
                    .as_object_mut()
                    .unwrap()
                    .remove("reserve")
                    .map(drop)
                    .unwrap_or(())
            }),
            &["spec.lanes", "at least one lane needs a reserve"],
        ),
        (
            "every-lane-reserved",
            Box::new(|s| s["lanes"][1]["reserve"] = json!({"max": 1})),
            &["spec.lanes", "at least one lane must have no reserve"],
        ),
        (
            "both-pool-sizes",
            Box::new(|s| s["shared"]["replicas"] = json!(8)),
            &["spec.totalWorkers", "exactly one pool size"],
        ),
        (
            "no-pool-size",
            Box::new(|s| {
                s.as_object_mut().unwrap().remove("totalWorkers");
            }),
            &["spec.totalWorkers", "exactly one pool size"],
        ),
        (
            // Below reserve.min (1) + shared.minReplicas (1); 2 to 6, below reserve.max, is allowed.
            "budget-too-small",
            Box::new(|s| s["totalWorkers"] = json!(1)),
            &["spec.totalWorkers", "at least the sum"],
        ),
        (
            "host-header",
            Box::new(|s| s["prometheus"]["headers"] = json!({"Host": "metadata.internal"})),
            &["spec.prometheus.headers", "Host, Authorization"],
        ),
        (
            "authorization-header",
            Box::new(|s| {
                s["prometheus"]["headers"] =
                    json!({"X-Scope-OrgID": "a", "AUTHORIZATION": "Bearer x"})
            }),
            &["spec.prometheus.headers", "bearerTokenSecret or basicAuth"],
        ),
        (
            "unknown-sizing-mode",
            Box::new(|s| s["lanes"][0]["reserve"]["sizing"] = json!("Guess")),
            &["spec.lanes[0].reserve.sizing", "Unsupported value"],
        ),
        (
            "no-shared-workers",
            Box::new(|s| {
                s.as_object_mut().unwrap().remove("totalWorkers");
                s["shared"] = json!({"replicas": 0});
            }),
            &["spec.shared.replicas"],
        ),
        (
            "shared-minimum-zero",
            Box::new(|s| s["shared"]["minReplicas"] = json!(0)),
            &["spec.shared.minReplicas"],
        ),
        (
            "malformed-interval",
            Box::new(|s| s["interval"] = json!("30")),
            &["spec.interval"],
        ),
        (
            "interval-too-short",
            Box::new(|s| s["interval"] = json!("1s")),
            &["spec.interval", "between 5s and 1h"],
        ),
        (
            "empty-lanes",
            Box::new(|s| s["lanes"] = json!([])),
            &["spec.lanes"],
        ),
        (
            "lane-not-a-dns-label",
            Box::new(|s| s["lanes"][0]["name"] = json!("Urgent_Lane")),
            &["spec.lanes[0].name"],
        ),
        (
            "empty-queue",
            Box::new(|s| s["lanes"][0]["queue"] = json!("")),
            &["spec.lanes[0].queue"],
        ),
        (
            "queue-with-a-comma",
            Box::new(|s| s["lanes"][0]["queue"] = json!("high,priority")),
            &["spec.lanes[0].queue", "should match"],
        ),
        (
            "queue-with-an-equals-sign",
            Box::new(|s| s["lanes"][0]["queue"] = json!("priority=high")),
            &["spec.lanes[0].queue", "should match"],
        ),
        (
            "queue-with-a-space",
            Box::new(|s| s["lanes"][0]["queue"] = json!("high priority")),
            &["spec.lanes[0].queue", "should match"],
        ),
        (
            "queue-with-a-newline",
            Box::new(|s| s["lanes"][0]["queue"] = json!("high\npriority")),
            &["spec.lanes[0].queue", "should match"],
        ),
        (
            "two-lanes-one-queue",
            Box::new(|s| {
                s["lanes"][0]["queue"] = json!("jobs");
                s["lanes"][1]["queue"] = json!("jobs");
            }),
            &["spec.lanes", "two lanes may not take the same queue"],
        ),
        (
            // batch takes the queue of its name, which urgent names too.
            "a-queue-named-as-another-lane",
            Box::new(|s| s["lanes"][0]["queue"] = json!("batch")),
            &["spec.lanes", "two lanes may not take the same queue"],
        ),
        (
            "fixed-reserve-without-reserve",
            Box::new(|s| s["onMetricsUnavailable"] = json!({"action": "FixedReserve"})),
            &["spec.onMetricsUnavailable.reserve", "FixedReserve"],
        ),
        (
            "zero-failure-threshold",
            Box::new(|s| {
                s["onMetricsUnavailable"] = json!({"action": "Hold", "failureThreshold": 0})
            }),
            &["spec.onMetricsUnavailable.failureThreshold"],
        ),
        (
            "short-hold-limit",
            Box::new(|s| s["onMetricsUnavailable"] = json!({"action": "Hold", "holdLimit": "30s"})),
            &["spec.onMetricsUnavailable.holdLimit", "between 1m and 24h"],
        ),
        (
            "prometheus-not-http",
            Box::new(|s| s["prometheus"]["url"] = json!("ftp://prometheus")),
            &["spec.prometheus.url"],
        ),
        (
            "negative-window",
            Box::new(|s| s["scaleDown"]["stabilizationWindow"] = json!("-5m")),
            &["spec.scaleDown.stabilizationWindow"],
        ),
        (
            "zero-fallback",
            Box::new(|s| s["lanes"][0]["reserve"]["jobTime"]["fallback"] = json!("0s")),
            &["spec.lanes[0].reserve.jobTime.fallback"],
        ),
        (
            "seventeen-headers",
            Box::new(|s| {
                s["prometheus"]["headers"] = json!(
                    (0..17)
                        .map(|i| (format!("X-H{i}"), "v"))
                        .collect::<BTreeMap<_, _>>()
                )
            }),
            &["spec.prometheus.headers"],
        ),
        (
            "token-in-clear",
            Box::new(|s| {
                s["prometheus"]["url"] = json!("http://prometheus.monitoring:9090");
                s["prometheus"]["bearerTokenSecret"] = json!({"name": "prom", "key": "token"});
            }),
            &["spec.prometheus.url", "https://"],
        ),
        (
            "ca-in-clear",
            Box::new(|s| {
                s["prometheus"]["url"] = json!("http://prometheus.monitoring:9090");
                s["prometheus"]["caSecret"] = json!({"name": "prom", "key": "ca.crt"});
            }),
            &["spec.prometheus.url", "https://"],
        ),
        (
            "basic-auth-in-clear",
            Box::new(|s| {
                s["prometheus"]["url"] = json!("http://prometheus.monitoring:9090");
                s["prometheus"]["basicAuth"] = json!({
                    "usernameSecret": {"name": "prom", "key": "username"},
                    "passwordSecret": {"name": "prom", "key": "password"},
                });
            }),
            &["spec.prometheus.url", "https://", "basic auth"],
        ),
        (
            "client-certificate-in-clear",
            Box::new(|s| {
                s["prometheus"]["url"] = json!("http://prometheus.monitoring:9090");
                s["prometheus"]["clientCertificateSecret"] = json!({"name": "prom-client"});
            }),
            &["spec.prometheus.url", "https://", "client certificate"],
        ),
        (
            "basic-auth-and-bearer-token",
            Box::new(|s| {
                s["prometheus"]["url"] = json!("https://prometheus.monitoring:9090");
                s["prometheus"]["bearerTokenSecret"] = json!({"name": "prom", "key": "token"});
                s["prometheus"]["basicAuth"] = json!({
                    "usernameSecret": {"name": "prom", "key": "username"},
                    "passwordSecret": {"name": "prom", "key": "password"},
                });
            }),
            &[
                "spec.prometheus.basicAuth",
                "at most one of prometheus.bearerTokenSecret and prometheus.basicAuth",
            ],
        ),
        (
            "basic-auth-without-password",
            Box::new(|s| {
                s["prometheus"]["url"] = json!("https://prometheus.monitoring:9090");
                s["prometheus"]["basicAuth"] = json!({
                    "usernameSecret": {"name": "prom", "key": "username"},
                });
            }),
            &["spec.prometheus.basicAuth.passwordSecret", "Required"],
        ),
        (
            "client-certificate-without-name",
            Box::new(|s| {
                s["prometheus"]["url"] = json!("https://prometheus.monitoring:9090");
                s["prometheus"]["clientCertificateSecret"] = json!({});
            }),
            &["spec.prometheus.clientCertificateSecret.name", "Required"],
        ),
        (
            "timeout-not-below-interval",
            Box::new(|s| {
                s["interval"] = json!("10s");
                s["prometheus"]["timeout"] = json!("10s");
            }),
            &["spec.prometheus.timeout", "shorter than spec.interval"],
        ),
    ];
    assert!(cases.len() >= 12);
    let mut failures = Vec::new();
    for (name, change, expected) in cases {
        let error = refused(&client, &ns, name, change).await;
        if error.code != 422 || !expected.iter().all(|e| error.message.contains(e)) {
            failures.push(format!(
                "{name}: code {} message {:?}, wanted {expected:?}",
                error.code, error.message
            ));
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}
