//! The test environment itself: the API server reports the pinned version, kubectl reads the
//! LanePool printer columns, and Prometheus sees a simulated load through real PromQL.

use std::time::{Duration, Instant};

use lanepool_testenv::{self as testenv, SimulatedWorkers, TestPrometheus};

#[tokio::test]
async fn the_api_server_is_the_pinned_version_with_rbac() {
    let plane = testenv::shared().expect("the control plane starts");
    let client = plane.client().await.unwrap();
    let version = client.apiserver_version().await.unwrap();
    assert_eq!(version.git_version, "v1.34.4");
    let roles = client
        .list_api_group_resources("rbac.authorization.k8s.io/v1")
        .await
        .unwrap();
    assert!(roles.resources.iter().any(|r| r.name == "clusterroles"));
}

#[tokio::test]
async fn kubectl_shows_the_printer_columns() {
    let plane = testenv::shared().expect("the control plane starts");
    let client = plane.client().await.unwrap();
    let namespace = plane.namespace(&client, "kubectl").await.unwrap();
    let example = concat!(env!("CARGO_MANIFEST_DIR"), "/examples/lanepool.yaml");
    let run = |args: &[&str]| {
        let args = [&["-n", namespace.as_str()], args].concat();
        let (ok, out) = plane.kubectl(&args).unwrap();
        assert!(ok, "kubectl {args:?}: {out}");
        out
    };
    run(&["apply", "--server-side", "-f", example]);
    let table = run(&["get", "lp"]);
    let header = table.lines().next().unwrap();
    for column in [
        "NAME", "RESERVES", "RESERVED", "SHARED", "METRICS", "PAUSED", "READY", "AGE",
    ] {
        assert!(header.contains(column), "{column} missing from {header:?}");
    }
    assert!(!header.contains("URGENT RATE"), "a wide column: {header:?}");
    assert!(table.contains("jobs"));
    let wide = run(&["get", "lp", "-o", "wide"]);
    let header = wide.lines().next().unwrap();
    for column in ["URGENT RATE", "JOB TIME", "SCALE DOWN"] {
        assert!(header.contains(column), "{column} missing from {header:?}");
    }
}

#[tokio::test]
async fn prometheus_sees_the_simulated_load_through_promql() {
    let workers = SimulatedWorkers::start().unwrap();
    workers.set_lane("ns", "jobs", "urgent", 150.0, 0.020);
    let prometheus = TestPrometheus::start(&[workers.addr()]).unwrap();
    let client = prometheus_http_query::Client::try_from(prometheus.url().as_str()).unwrap();
    let selector = r#"{namespace="ns",pool="jobs",lane="urgent"}"#;
    let rate = format!("sum(rate(lanepool_jobs_submitted_total{selector}[5s]))");
    let job = format!(
        "sum(rate(lanepool_job_duration_seconds_sum{selector}[5s])) / sum(rate(lanepool_job_duration_seconds_count{selector}[5s]))"
    );
    let deadline = Instant::now() + Duration::from_secs(30);
    let value = |query: String| {
        let client = client.clone();
        async move {
            let answer = client.query(query).get().await.ok()?;
            let vector = answer.data().as_vector()?;
            vector.first().map(|sample| sample.sample().value())
        }
    };
    loop {
        if let (Some(r), Some(j)) = (value(rate.clone()).await, value(job.clone()).await)
            && (r - 150.0).abs() < 15.0
        {
            assert!((j - 0.020).abs() < 1e-6, "job time {j}");
            break;
        }
        assert!(Instant::now() < deadline, "Prometheus never saw 150/s");
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

/// The jobs' ledger counts by job id: a job that finished without being recorded as submitted
/// (its producer stopped between queueing it and recording it) is neither lost nor hides one,
/// and a submitted job neither finished nor still queued is lost.
#[tokio::test]
async fn the_ledger_counts_jobs_by_id() {
    use lanepool_testenv::{FINISHED, STARTED, SUBMITTED, TestRedis};
    let redis = TestRedis::start().expect("redis-server starts");
    let run = |words: &[&str]| {
        redis.command(words).expect("redis answers");
    };
    run(&["SADD", SUBMITTED, "a", "b", "c", "lost"]);
    run(&["SADD", STARTED, "a", "b", "unrecorded"]);
    run(&["SADD", FINISHED, "a", "b", "unrecorded"]);
    run(&["RPUSH", "rq:queue:batch", "c"]);
    let ledger = redis.settle("rq:queue:urgent", "rq:queue:batch").await;
    assert!(ledger.settled);
    assert_eq!((ledger.cut_short, ledger.lost), (0, 1), "{ledger:?}");
}
