//! `lanepool replay` against a real Prometheus holding a recorded day: a synthetic day of the
//! guide's pool (testenv's `synthetic_day`: the day shape peaking at 60/s with two spikes, the
//! pool created an hour in, Prometheus down for 30 minutes) backfilled with `promtool tsdb
//! create-blocks-from openmetrics`. One Prometheus serves every test of this binary.

use std::process::Command;
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use lanepool::prometheus::range::Range;
use lanepool::prometheus::{Clients, Connection};
use lanepool_testenv::{self as testenv, DAY_CREATED, DAY_OUTAGE, Lifetime, TestPrometheus};
use serde_json::Value;

/// The recording's pool: `examples/lanepool.yaml` in this namespace.
const NAMESPACE: &str = "replay";

struct Recorded {
    prometheus: TestPrometheus,
    /// The window's start and end, Unix seconds.
    start: i64,
    end: i64,
}

fn recorded() -> &'static Recorded {
    static RECORDED: OnceLock<Recorded> = OnceLock::new();
    RECORDED.get_or_init(|| {
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_secs() as i64;
        let end = now / 3600 * 3600;
        let recording = testenv::synthetic_day(NAMESPACE, "jobs", end);
        let dir = std::path::Path::new(env!("CARGO_TARGET_TMPDIR")).join("replay-history");
        let prometheus = TestPrometheus::start_on_history_in(&recording, &dir, Lifetime::Process)
            .expect("Prometheus starts on the recorded day");
        Recorded {
            prometheus,
            start: end - 24 * 3600,
            end,
        }
    })
}

fn rfc3339(second: i64) -> String {
    k8s_openapi::jiff::Timestamp::from_second(second)
        .unwrap()
        .to_string()
}

const EXAMPLE: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/examples/lanepool.yaml");

/// `lanepool replay -f examples/lanepool.yaml -n replay` on the recording, from `from` to `to`
/// seconds into its window, with `extra` flags: (exit code, stdout, stderr).
fn replay(from: i64, to: i64, extra: &[&str]) -> (i32, String, String) {
    let day = recorded();
    let url = day.prometheus.url();
    let (from, to) = (rfc3339(day.start + from), rfc3339(day.start + to));
    let mut args = vec![
        "replay", "-f", EXAMPLE, "-n", NAMESPACE, "--from", &from, "--to", &to,
    ];
    if !extra.contains(&"--prometheus-url") {
        args.extend(["--prometheus-url", url.as_str()]);
    }
    args.extend(extra);
    lanepool(&args, &[])
}

fn lanepool(args: &[&str], env: &[(&str, &str)]) -> (i32, String, String) {
    let output = Command::new(env!("CARGO_BIN_EXE_lanepool"))
        .args(args)
        .envs(env.iter().copied())
        .env_remove("LANEPOOL_PROMETHEUS_URL")
        .output()
        .expect("lanepool runs");
    (
        output.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&output.stdout).into_owned(),
        String::from_utf8_lossy(&output.stderr).into_owned(),
    )
}

fn client(url: &str) -> lanepool::prometheus::Client {
    let clients = Clients::new(2, Arc::new(lanepool::metrics::Metrics::default()));
    clients
        .get(&Connection {
            url: url.into(),
            timeout: Duration::from_secs(30),
            bearer_token: None,
            basic_auth: None,
            ca_pem: None,
            client_certificate: None,
            headers: Default::default(),
        })
        .unwrap()
}

/// The recorded urgent rate over the operator's 1m window ending `seconds` into the day: the
/// mean of the four 15 s scrape intervals, as `rate(...[1m])` reads it.
fn recorded_rate(seconds: i64) -> f64 {
    (0..4)
        .map(|k| testenv::day_urgent_rate(seconds - 15 * k))
        .sum::<f64>()
        / 4.0
}

#[tokio::test]
async fn the_replayed_rates_are_the_recorded_ones_and_the_gaps_are_skipped() {
    let day = recorded();
    let pool: lanepool::api::LanePool =
        serde_yaml::from_str(&std::fs::read_to_string(EXAMPLE).unwrap()).unwrap();
    let mut pool = pool;
    pool.metadata.namespace = Some(NAMESPACE.into());
    let range = Range {
        start: day.start + 15,
        end: day.end,
        step: 15,
    };
    let windows = lanepool::replay::history::windows("1m", "5m", 15);
    let history = lanepool::replay::history::read(
        &pool,
        None,
        &client(&day.prometheus.url()),
        range,
        &windows,
    )
    .await
    .expect("the history is read");
    assert_eq!(history.rates.len(), 5760, "a day at 15 s");

    // Every step away from a gap's edge is the recorded rate, within 0.1 %.
    let near_a_gap = |seconds: i64| {
        seconds < DAY_CREATED + 120 || (DAY_OUTAGE.0 - 60..DAY_OUTAGE.1 + 120).contains(&seconds)
    };
    let mut compared = 0;
    for (i, rate) in history.rates.iter().enumerate() {
        let seconds = 15 * (i as i64 + 1);
        if near_a_gap(seconds) {
            continue;
        }
        let rate = rate.unwrap_or_else(|| panic!("no rate {seconds} s into the day"));
        let recorded = recorded_rate(seconds);
        assert!(
            (rate - recorded).abs() <= recorded * 1e-3,
            "{seconds} s: replayed {rate}/s, recorded {recorded}/s"
        );
        compared += 1;
    }
    assert!(compared > 5300, "{compared} steps compared");
    for job in history.job_seconds.iter().flatten() {
        assert!((job - 0.020).abs() < 1e-9, "job time {job}");
    }
    let batch = history
        .batch_job_seconds
        .expect("the batch lane's job time");
    assert!((batch - 0.200).abs() < 1e-9, "batch job time {batch}");

    // Skipped: the hour before the pool existed, and the outage (a 1m window's answer outlives
    // the last sample by up to a minute, and needs two samples after it).
    let skipped: Vec<(i64, i64)> = history
        .skipped()
        .into_iter()
        .map(|(a, b)| (15 * a as i64, 15 * b as i64))
        .collect();
    assert_eq!(skipped.len(), 2, "{skipped:?}");
    assert_eq!(skipped[0], (0, DAY_CREATED), "{skipped:?}");
    let (from, to) = skipped[1];
    assert!(
        (DAY_OUTAGE.0..=DAY_OUTAGE.0 + 60).contains(&from),
        "{skipped:?}"
    );
    assert!(
        (DAY_OUTAGE.1..=DAY_OUTAGE.1 + 60).contains(&to),
        "{skipped:?}"
    );
}

fn json(stdout: &str) -> Value {
    serde_json::from_str(stdout).unwrap_or_else(|e| panic!("{e}: {stdout}"))
}

#[test]
fn the_static_rows_equal_lanepool_simulate_on_the_same_profile_and_seed() {
    // 09:00 to 10:00 of the day: 48/s with the 3-minute spike to 200/s at 09:30.
    let (code, stdout, stderr) = replay(9 * 3600, 10 * 3600, &["--output", "json"]);
    assert_eq!(code, 0, "{stderr}");
    let replayed = json(&stdout);
    assert_eq!(replayed["skipped"].as_array().map(Vec::len), Some(0));
    let flags = replayed["simulated"]["simulate_flags"].as_str().unwrap();
    let rows = replayed["rows"].as_array().unwrap();
    let statics: Vec<&Value> = rows.iter().filter(|r| r["kind"] == "static").collect();
    assert_eq!(statics.len(), 7, "static 0 to reserve.max 6");
    for row in statics {
        let reserved = row["reserved"].as_u64().unwrap().to_string();
        let workers = row["workers"].as_u64().unwrap().to_string();
        let mut args = vec!["simulate", "--workers", &workers, "--reserved", &reserved];
        args.extend(flags.split(' '));
        args.extend(["--output", "json"]);
        let (code, out, err) = lanepool(&args, &[]);
        assert_eq!(code, 0, "{err}");
        let simulated = json(&out);
        for (what, theirs, ours) in [
            (
                "p99",
                &simulated["urgent"]["p99_ms"],
                &row["urgent"]["p99_ms"],
            ),
            (
                "urgent completed",
                &simulated["urgent"]["completed"],
                &row["urgent"]["completed"],
            ),
            (
                "urgent submitted",
                &simulated["urgent"]["submitted"],
                &row["urgent"]["submitted"],
            ),
            (
                "batch throughput",
                &simulated["batch"]["throughput_per_s"],
                &row["batch"]["throughput_per_s"],
            ),
        ] {
            assert_eq!(theirs, ours, "static {reserved}: {what}");
        }
    }
    // The replay saw the spike: its peak is the recorded 200/s (the 1m window full of it).
    let peak = replayed["measured"]["arrival_rate_peak"].as_f64().unwrap();
    assert!((peak - 200.0).abs() < 0.2, "peak {peak}");
    assert!(replayed["recommendation"]["words"].as_str().is_some());
}

#[test]
fn an_outage_is_said_and_only_the_covered_steps_are_replayed() {
    // 11:50 to 12:40: Prometheus was down from 12:00 to 12:30.
    let svg = std::path::Path::new(env!("CARGO_TARGET_TMPDIR")).join("replay-outage.svg");
    let svg_arg = svg.display().to_string();
    let (code, stdout, stderr) = replay(
        11 * 3600 + 3000,
        12 * 3600 + 2400,
        &["--output", "json", "--plot", &svg_arg],
    );
    assert_eq!(code, 0, "{stderr}");
    let replayed = json(&stdout);
    let skipped = replayed["skipped"].as_array().unwrap();
    assert_eq!(skipped.len(), 1, "{skipped:?}");
    let outage_from = rfc3339(recorded().start + DAY_OUTAGE.0 + 30);
    assert_eq!(skipped[0]["from"], outage_from.as_str(), "{skipped:?}");
    let covered: usize = replayed["measured"]["rates"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|r| !r.is_null())
        .count();
    assert_eq!(
        replayed["simulated"]["seconds"].as_f64(),
        Some(15.0 * covered as f64),
        "only covered steps are simulated"
    );
    assert!(covered < 50 * 4 - 100, "{covered} steps covered of 200");
    let drawn = std::fs::read_to_string(&svg).unwrap();
    assert!(drawn.starts_with("<svg") && drawn.contains("arrival rate, measured"));
    // Its runs break at the gap: the measured rate is two polylines.
    let rate_panel = drawn.split("reserved workers").next().unwrap();
    assert_eq!(rate_panel.matches("<polyline").count(), 2, "{rate_panel}");

    let (code, text, stderr) = replay(11 * 3600 + 3000, 12 * 3600 + 2400, &[]);
    assert_eq!(code, 0, "{stderr}");
    assert!(
        text.contains(&format!("skipped {outage_from} to")),
        "{text}"
    );
    assert!(
        text.contains("Nothing was written to the cluster."),
        "{text}"
    );
}

#[test]
fn a_window_with_no_data_says_so() {
    // The two days before the recording.
    let (code, _, stderr) = replay(-48 * 3600, -24 * 3600, &[]);
    assert_eq!(code, 1, "{stderr}");
    assert!(
        stderr.contains("lane urgent: no arrival rate in the window"),
        "{stderr}"
    );
}

#[test]
fn a_window_too_long_for_the_bounds_names_the_flag() {
    let (code, _, stderr) = lanepool(
        &[
            "replay",
            "-f",
            EXAMPLE,
            "--since",
            "800h",
            "--prometheus-url",
            "http://127.0.0.1:9",
        ],
        &[],
    );
    assert_eq!(code, 2, "{stderr}");
    assert!(stderr.starts_with("error: --since:"), "{stderr}");
    let (code, _, stderr) = replay(0, 24 * 3600, &["--step", "5s"]);
    assert_eq!(code, 2, "{stderr}");
    assert!(
        stderr.contains("--step") && stderr.contains("--step 8s or more"),
        "{stderr}"
    );
}

#[test]
fn an_unreachable_or_refused_prometheus_is_named_and_never_asked() {
    let port = testenv::free_port().unwrap().to_string();
    let url = format!("http://127.0.0.1:{port}");
    let (code, _, stderr) = replay(0, 3600, &["--prometheus-url", &url]);
    assert_eq!(code, 1, "{stderr}");
    assert!(stderr.contains("lane urgent, arrival rate:"), "{stderr}");
    assert!(stderr.contains(&url), "names the URL: {stderr}");

    let (code, _, stderr) = replay(
        0,
        3600,
        &[
            "--allowed-prometheus-urls",
            "http://prometheus.monitoring:9090",
        ],
    );
    assert_eq!(code, 1, "{stderr}");
    assert!(stderr.contains("is not allowed"), "{stderr}");
}

#[tokio::test]
async fn an_unknown_pool_is_named_and_a_pool_from_the_cluster_is_replayed() {
    let plane = testenv::shared().expect("the control plane starts");
    let kubeconfig = plane.kubeconfig().display().to_string();
    let env = [("KUBECONFIG", kubeconfig.as_str())];
    let (code, _, stderr) = lanepool(
        &["replay", "-n", NAMESPACE, "nosuch", "--since", "1h"],
        &env,
    );
    assert_eq!(code, 1, "{stderr}");
    assert!(
        stderr.contains(&format!("LanePool {NAMESPACE}/nosuch not found")),
        "{stderr}"
    );

    let (ok, out) = plane.kubectl(&["create", "namespace", NAMESPACE]).unwrap();
    assert!(ok || out.contains("AlreadyExists"), "{out}");
    let (ok, out) = plane
        .kubectl(&["-n", NAMESPACE, "apply", "--server-side", "-f", EXAMPLE])
        .unwrap();
    assert!(ok, "{out}");
    let day = recorded();
    let (from, to) = (
        rfc3339(day.start + 2 * 3600),
        rfc3339(day.start + 2 * 3600 + 900),
    );
    let url = day.prometheus.url();
    let (code, stdout, stderr) = lanepool(
        &[
            "replay",
            "-n",
            NAMESPACE,
            "jobs",
            "--from",
            &from,
            "--to",
            &to,
            "--prometheus-url",
            &url,
        ],
        &env,
    );
    assert_eq!(code, 0, "{stderr}");
    assert!(
        stdout.starts_with(&format!("lanepool replay {NAMESPACE}/jobs, lane urgent")),
        "{stdout}"
    );
    // Nothing was written: the pool has no status, and no Deployment exists.
    let (_, deployments) = plane
        .kubectl(&["-n", NAMESPACE, "get", "deployments", "-o", "name"])
        .unwrap();
    assert!(
        deployments.trim().is_empty() || deployments.contains("No resources"),
        "{deployments}"
    );
}
