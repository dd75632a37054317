//! The Helm chart in charts/lanepool: it lints, its schema refuses typos, it renders what the
//! values ask for and nothing else, the operator runs locked down, and — installed into the real
//! kube-apiserver — the RBAC it creates is enough for the operator to size a pool, and no more.

use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;
use std::process::Command;
use std::time::Duration;

use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::authorization::v1::SelfSubjectAccessReview;
use k8s_openapi::api::core::v1::{Pod, Secret, ServiceAccount};
use k8s_openapi::api::events::v1::Event;
use k8s_openapi::api::networking::v1::NetworkPolicy;
use k8s_openapi::api::rbac::v1::ClusterRole;
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams, PostParams};
use kube::config::{KubeConfigOptions, Kubeconfig};
use kube::{Client, Config, ResourceExt};
use lanepool::api::LanePool;
use lanepool::crd::{lanepool_crd, lanepool_crd_chart_template};
use lanepool::prometheus::AllowedUrls;
use lanepool_testenv::{self as testenv, InProcessOperator, SimulatedWorkers, TestPrometheus};
use serde_json::{Value, json};
use testenv::until;

const CHART: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/charts/lanepool");
/// `helm template` assumes Kubernetes 1.20 unless told; the chart requires 1.30 or later.
const KUBE_VERSION: &str = "1.34.0";

/// Runs the pinned helm with its cache, config and data kept under target/, away from $HOME.
fn helm(args: &[&str]) -> (bool, String, String) {
    let home = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("helm-home");
    let output = Command::new(testenv::tool("helm").expect("helm is built by tests/setup.sh"))
        .args(args)
        .env("HELM_CACHE_HOME", home.join("cache"))
        .env("HELM_CONFIG_HOME", home.join("config"))
        .env("HELM_DATA_HOME", home.join("data"))
        .env_remove("KUBECONFIG")
        .output()
        .expect("helm runs");
    (
        output.status.success(),
        String::from_utf8_lossy(&output.stdout).into_owned(),
        String::from_utf8_lossy(&output.stderr).into_owned(),
    )
}

/// `helm template` of the chart with `sets` (each passed as --set), as JSON documents.
fn template(sets: &[&str]) -> Result<Vec<Value>, String> {
    let mut args = vec![
        "template",
        "lanepool",
        CHART,
        "--namespace",
        "lanepool-system",
        "--kube-version",
        KUBE_VERSION,
    ];
    for set in sets {
        args.extend(["--set", set]);
    }
    let (ok, stdout, stderr) = helm(&args);
    if !ok {
        return Err(stderr);
    }
    let mut documents = Vec::new();
    for document in serde_yaml::Deserializer::from_str(&stdout) {
        let value: Value = serde::Deserialize::deserialize(document).expect("helm renders YAML");
        if !value.is_null() {
            documents.push(value);
        }
    }
    Ok(documents)
}

fn kinds(documents: &[Value]) -> BTreeSet<String> {
    documents
        .iter()
        .map(|d| d["kind"].as_str().unwrap_or_default().to_string())
        .collect()
}

fn of_kind<'a>(documents: &'a [Value], kind: &str) -> Vec<&'a Value> {
    documents.iter().filter(|d| d["kind"] == kind).collect()
}

/// The rules the operator needs (docs/operations.md, "RBAC", plus leader election's leases).
fn operator_rules() -> Value {
    json!([
        {"apiGroups": ["lanepool.dev"], "resources": ["lanepools"], "verbs": ["get", "list", "watch"]},
        {"apiGroups": ["lanepool.dev"], "resources": ["lanepools/status"], "verbs": ["get", "patch", "update"]},
        {"apiGroups": ["apps"], "resources": ["deployments"],
         "verbs": ["get", "list", "watch", "create", "patch", "update", "delete"]},
        {"apiGroups": ["apps"], "resources": ["replicasets"], "verbs": ["list", "watch"]},
        {"apiGroups": ["autoscaling"], "resources": ["horizontalpodautoscalers"], "verbs": ["get", "list", "watch"]},
        {"apiGroups": [""], "resources": ["pods"], "verbs": ["list", "watch", "patch"]},
        {"apiGroups": [""], "resources": ["pods/status"], "verbs": ["patch"]},
        {"apiGroups": [""], "resources": ["secrets"], "verbs": ["get", "create", "patch"]},
        {"apiGroups": ["", "events.k8s.io"], "resources": ["events"], "verbs": ["create", "patch"]},
    ])
}

#[test]
fn the_chart_lints_and_carries_the_repositorys_crd() {
    let (ok, stdout, stderr) = helm(&["lint", "--strict", CHART]);
    assert!(ok, "helm lint --strict:\n{stdout}\n{stderr}");
    let (ok, stdout, stderr) = helm(&[
        "lint",
        "--strict",
        CHART,
        "--set",
        "watchNamespaces={a,b},serviceMonitor.enabled=true,prometheusRule.enabled=true,podDisruptionBudget.enabled=true,networkPolicy.enabled=true",
    ]);
    assert!(
        ok,
        "helm lint --strict, everything enabled:\n{stdout}\n{stderr}"
    );

    // The chart's CRD template is `lanepool crd --chart`: the generated CRD, wrapped.
    let template_file = std::fs::read_to_string(format!("{CHART}/templates/crd.yaml")).unwrap();
    assert!(
        template_file == lanepool_crd_chart_template().unwrap(),
        "charts/lanepool/templates/crd.yaml differs from what the code generates; refresh it with: \
         cargo run -- crd --chart > charts/lanepool/templates/crd.yaml"
    );
    // ... and renders to exactly the repository's CRD (crds/), plus the chart's metadata.
    let documents = template(&[]).unwrap();
    let crds = of_kind(&documents, "CustomResourceDefinition");
    assert_eq!(crds.len(), 1);
    let mut rendered = crds[0].clone();
    let metadata = rendered["metadata"].as_object_mut().unwrap();
    let labels = metadata.remove("labels").expect("the chart's labels");
    assert_eq!(labels["app.kubernetes.io/instance"], "lanepool");
    let annotations = metadata.remove("annotations").expect("keep, by default");
    assert_eq!(annotations, json!({"helm.sh/resource-policy": "keep"}));
    let checked_in: Value = serde_yaml::from_str(
        &std::fs::read_to_string(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/crds/lanepool.dev_lanepools.yaml"
        ))
        .unwrap(),
    )
    .unwrap();
    assert!(
        rendered == checked_in,
        "the chart's CRD renders other than crds/lanepool.dev_lanepools.yaml"
    );
}

#[test]
fn a_typo_or_a_wrong_value_fails_naming_the_key() {
    template(&["replicaCount=1"]).expect("replicaCount is a value");
    for (sets, named) in [
        (&["replicaCount=1", "nonsense=1"][..], "nonsense"),
        (&["image.tagg=0.2.0"][..], "tagg"),
        (&["serviceMonitor.enable=true"][..], "enable"),
        (&["crds.keeep=false"][..], "keeep"),
        (&["crds.enabled=no"][..], "enabled"),
        (&["podSecurityContext.runAsRoot=true"][..], "runAsRoot"),
        (&["logFormat=xml"][..], "logFormat"),
        (&["image.pullPolicy=Sometimes"][..], "pullPolicy"),
        (&["replicaCount=6"][..], "replicaCount"),
        (&["prometheusUrl=prometheus:9090"][..], "prometheusUrl"),
        (
            &["watchNamespaces={Not_A_Namespace}"][..],
            "watchNamespaces",
        ),
        (&["networkPolicy.enable=true"][..], "enable"),
        (
            &["networkPolicy.metricsFrom[0].podSelektor.matchLabels.app=x"][..],
            "podSelektor",
        ),
        (&["networkPolicy.apiServer.cidrs={10.0.0.1}"][..], "cidrs"),
        (&["networkPolicy.workers.ports={0}"][..], "ports"),
    ] {
        let error = template(sets).expect_err(&format!("{sets:?} must be refused"));
        assert!(
            error.contains("schema") && error.contains(named),
            "{sets:?}: the error names {named}:\n{error}"
        );
    }
}

#[test]
fn every_object_of_the_values_schema_refuses_unknown_keys() {
    let schema: Value = serde_json::from_str(
        &std::fs::read_to_string(format!("{CHART}/values.schema.json")).unwrap(),
    )
    .unwrap();
    // Every object either lists its keys and refuses others, or is a map whose values are typed
    // (labels, annotations, resource quantities). `global` is Helm's own, for parent charts.
    fn walk(path: &str, node: &Value, loose: &mut Vec<String>) {
        if node["type"] == "object" {
            match &node["additionalProperties"] {
                Value::Bool(false) => {}
                Value::Object(map) if map.contains_key("type") => {}
                _ if path == "/global" => {}
                _ => loose.push(path.to_string()),
            }
        }
        if let Some(properties) = node["properties"].as_object() {
            for (key, child) in properties {
                walk(&format!("{path}/{key}"), child, loose);
            }
        }
        for key in ["items", "additionalProperties"] {
            if node[key].is_object() {
                walk(&format!("{path}/{key}"), &node[key], loose);
            }
        }
        // What `$ref` points at (a NetworkPolicy peer, a label selector) is held to the same.
        if let Some(definitions) = node["definitions"].as_object() {
            for (key, child) in definitions {
                walk(&format!("{path}/definitions/{key}"), child, loose);
            }
        }
    }
    let mut loose = Vec::new();
    walk("", &schema, &mut loose);
    assert!(loose.is_empty(), "objects accepting any key: {loose:?}");

    // Every value in values.yaml is described by the schema (so none is refused by default).
    let values: Value =
        serde_yaml::from_str(&std::fs::read_to_string(format!("{CHART}/values.yaml")).unwrap())
            .unwrap();
    fn covered(path: &str, value: &Value, schema: &Value, missing: &mut Vec<String>) {
        if let Some(map) = value.as_object() {
            for (key, child) in map {
                match schema["properties"].get(key) {
                    Some(s) => covered(&format!("{path}.{key}"), child, s, missing),
                    None if schema["additionalProperties"].is_object() => {}
                    None => missing.push(format!("{path}.{key}")),
                }
            }
        }
    }
    let mut missing = Vec::new();
    covered("", &values, &schema, &mut missing);
    assert!(missing.is_empty(), "values without a schema: {missing:?}");

    // Every key of the chart (not the entries of a map such as resources.requests) has a
    // comment on the line above it in values.yaml.
    let text = std::fs::read_to_string(format!("{CHART}/values.yaml")).unwrap();
    let mut stack: Vec<(usize, String)> = Vec::new();
    let mut previous = "";
    let mut undocumented = Vec::new();
    for line in text.lines() {
        let trimmed = line.trim_start();
        let indent = line.len() - trimmed.len();
        if let Some((key, _)) = trimmed.split_once(':')
            && !trimmed.starts_with('#')
            && !trimmed.starts_with('-')
            && key.chars().all(|c| c.is_ascii_alphanumeric())
        {
            stack.retain(|(i, _)| *i < indent);
            stack.push((indent, key.to_string()));
            let mut node = &schema;
            let mut declared = true;
            for (_, key) in &stack {
                match node["properties"].get(key) {
                    Some(child) => node = child,
                    None => {
                        declared = false;
                        break;
                    }
                }
            }
            if declared && !previous.trim_start().starts_with('#') {
                let path: Vec<&str> = stack.iter().map(|(_, k)| k.as_str()).collect();
                undocumented.push(path.join("."));
            }
        }
        if !trimmed.is_empty() {
            previous = line;
        }
    }
    assert!(
        undocumented.is_empty(),
        "values.yaml keys without a comment: {undocumented:?}"
    );
}

#[test]
fn optional_resources_render_only_when_enabled() {
    let default = template(&[]).unwrap();
    assert_eq!(
        kinds(&default),
        BTreeSet::from(
            [
                "CustomResourceDefinition",
                "ServiceAccount",
                "ClusterRole",
                "ClusterRoleBinding",
                "Role",
                "RoleBinding",
                "Deployment",
                "Service",
                "ValidatingAdmissionPolicy",
                "ValidatingAdmissionPolicyBinding",
            ]
            .map(String::from)
        )
    );
    let enabled = template(&[
        "serviceMonitor.enabled=true",
        "prometheusRule.enabled=true",
        "podDisruptionBudget.enabled=true",
        "networkPolicy.enabled=true",
    ])
    .unwrap();
    for kind in [
        "ServiceMonitor",
        "PrometheusRule",
        "PodDisruptionBudget",
        "NetworkPolicy",
    ] {
        assert_eq!(of_kind(&enabled, kind).len(), 1, "{kind} rendered once");
    }

    let monitor = of_kind(&enabled, "ServiceMonitor")[0];
    let service = of_kind(&enabled, "Service")[0];
    assert_eq!(
        monitor["spec"]["selector"]["matchLabels"],
        service["spec"]["selector"]
    );
    assert_eq!(monitor["spec"]["endpoints"][0]["port"], "metrics");

    let rule = of_kind(&enabled, "PrometheusRule")[0];
    let alerts: BTreeMap<String, String> = rule["spec"]["groups"][0]["rules"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| {
            (
                r["alert"].as_str().unwrap().to_string(),
                r["expr"].as_str().unwrap().to_string(),
            )
        })
        .collect();
    assert!(
        alerts["LanePoolReconcileErrors"]
            .contains("rate(lanepool_operator_reconcile_errors_total{"),
        "{alerts:?}"
    );
    assert!(
        alerts["LanePoolPrometheusQueryFailures"]
            .contains("rate(lanepool_operator_prometheus_query_failures_total{"),
        "{alerts:?}"
    );
    // The operator's own series by the release namespace, not by the job name a scrape config
    // gives it; what every replica always exports tells whether it is scraped at all.
    assert_eq!(
        alerts["LanePoolOperatorDown"],
        "absent(lanepool_operator_build_info{namespace=\"lanepool-system\"})",
        "{alerts:?}"
    );
    let chosen = template(&[
        "prometheusRule.enabled=true",
        "prometheusRule.selector=cluster=\"eu-1\"",
    ])
    .unwrap();
    assert_eq!(
        alerts_of(&chosen)["LanePoolOperatorDown"]["expr"],
        "absent(lanepool_operator_build_info{cluster=\"eu-1\"})",
        "prometheusRule.selector replaces the namespace"
    );

    let pdb = of_kind(&enabled, "PodDisruptionBudget")[0];
    assert_eq!(pdb["spec"]["maxUnavailable"], 1);
    let pdb = template(&[
        "podDisruptionBudget.enabled=true",
        "podDisruptionBudget.minAvailable=50%",
    ])
    .unwrap();
    let pdb = of_kind(&pdb, "PodDisruptionBudget")[0];
    assert_eq!(pdb["spec"]["minAvailable"], "50%");
    assert!(pdb["spec"].get("maxUnavailable").is_none());
}

/// Every alert of the PrometheusRule in `documents`, by name, across its groups.
fn alerts_of(documents: &[Value]) -> BTreeMap<String, Value> {
    of_kind(documents, "PrometheusRule")[0]["spec"]["groups"]
        .as_array()
        .unwrap()
        .iter()
        .flat_map(|group| group["rules"].as_array().unwrap())
        .map(|rule| (rule["alert"].as_str().unwrap().to_string(), rule.clone()))
        .collect()
}

/// GitHub's anchor for a markdown heading (as tests/docs.rs spells it): lower case, spaces to
/// `-`, every other character but letters, digits, `-` and `_` dropped.
fn github_anchor(heading: &str) -> String {
    heading
        .trim()
        .to_lowercase()
        .chars()
        .filter_map(|c| match c {
            ' ' => Some('-'),
            c if c.is_alphanumeric() || c == '-' || c == '_' => Some(c),
            _ => None,
        })
        .collect()
}

#[test]
fn every_alert_links_a_runbook_section_that_exists() {
    const BASE: &str = "https://github.com/lanepool/lanepool/blob/main/";
    let alerts = alerts_of(&template(&["prometheusRule.enabled=true"]).unwrap());
    assert!(alerts.len() >= 9, "{:?}", alerts.keys());
    for (name, rule) in &alerts {
        let url = rule["annotations"]["runbook_url"]
            .as_str()
            .unwrap_or_default();
        let (page, anchor) = url
            .strip_prefix(BASE)
            .and_then(|rest| rest.split_once('#'))
            .unwrap_or_else(|| panic!("{name}: runbook_url {url:?} is not {BASE}<page>#<anchor>"));
        let path = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join(page);
        let markdown = std::fs::read_to_string(&path)
            .unwrap_or_else(|e| panic!("{name}: {url} names {}: {e}", path.display()));
        let headings: BTreeSet<String> = markdown
            .lines()
            .filter(|line| line.starts_with('#'))
            .map(|line| github_anchor(line.trim_start_matches('#')))
            .collect();
        assert!(
            headings.contains(anchor),
            "{name}: no heading #{anchor} in {page}"
        );
        assert_eq!(anchor, name.to_lowercase(), "{name}: its own section");
    }
    // The page is a value, for runbooks kept elsewhere.
    let moved = template(&[
        "prometheusRule.enabled=true",
        "prometheusRule.runbookBaseUrl=https://runbooks.example.com/lanepool",
    ])
    .unwrap();
    assert_eq!(
        alerts_of(&moved)["LanePoolNotReady"]["annotations"]["runbook_url"],
        "https://runbooks.example.com/lanepool#lanepoolnotready"
    );
}

#[test]
fn no_alert_depends_on_the_job_a_scrape_config_names() {
    for (name, rule) in alerts_of(&template(&["prometheusRule.enabled=true"]).unwrap()) {
        let expr = rule["expr"].as_str().unwrap();
        // No matcher on `job` (`job=`, `job=~`, `job!=`, `job!~`).
        assert!(
            !expr.contains("job=") && !expr.contains("job!"),
            "{name}: {expr}"
        );
        // Each reads operator series by name, and the operator's own by the release namespace.
        if let Some(own) = ["build_info", "reconcile_errors", "query_failures"]
            .iter()
            .find(|metric| expr.contains(*metric))
        {
            assert!(
                expr.contains("{namespace=\"lanepool-system\"}"),
                "{name} reads {own} in the release namespace: {expr}"
            );
        }
    }
}

/// The rule groups the chart's PrometheusRule renders, as a Prometheus rules file.
fn rendered_rules() -> Value {
    let documents = template(&["prometheusRule.enabled=true"]).unwrap();
    json!({ "groups": of_kind(&documents, "PrometheusRule")[0]["spec"]["groups"] })
}

/// `promtool` from the Prometheus the tests run: `check rules` or `test rules` on `file`.
fn promtool(command: &str, file: &std::path::Path) -> (bool, String) {
    let output = Command::new("promtool")
        .args([command, "rules"])
        .arg(file)
        .output()
        .expect("promtool comes with Prometheus (tests/setup.sh installs it)");
    (
        output.status.success(),
        format!(
            "{}{}",
            String::from_utf8_lossy(&output.stdout),
            String::from_utf8_lossy(&output.stderr)
        ),
    )
}

/// Series one minute apart for `promtool test rules`: a pool whose urgent lane waits ~0.5 s for
/// 20 ms jobs on a capped reserve, whose batch lane completes nothing with 50 jobs waiting, and
/// whose metrics have failed one more interval every minute; Ready=False from the start, scraped
/// from the leader `a` until 20m and from `b`, the new leader, after; a shrink held from 5m. The
/// operator is scraped under a job name of the user's own, not the chart's.
const POOL_SERIES: &str = r#"
- series: 'lanepool_job_wait_seconds_bucket{namespace="team",pool="jobs",lane="urgent",le="0.1"}'
  values: '0+0x60'
- series: 'lanepool_job_wait_seconds_bucket{namespace="team",pool="jobs",lane="urgent",le="0.5"}'
  values: '0+60x60'
- series: 'lanepool_job_wait_seconds_bucket{namespace="team",pool="jobs",lane="urgent",le="+Inf"}'
  values: '0+60x60'
- series: 'lanepool_job_duration_seconds_sum{namespace="team",pool="jobs",lane="urgent"}'
  values: '0+1.2x60'
- series: 'lanepool_job_duration_seconds_count{namespace="team",pool="jobs",lane="urgent"}'
  values: '0+60x60'
- series: 'lanepool_job_duration_seconds_count{namespace="team",pool="jobs",lane="batch"}'
  values: '100+0x60'
- series: 'lanepool_queue_depth{namespace="team",pool="jobs",lane="batch"}'
  values: '50+0x60'
- series: 'lanepool_queue_depth{namespace="team",pool="jobs",lane="urgent"}'
  values: '0+0x60'
- series: 'lanepool_operator_reserved_workers{job="my-scrape",namespace="team",pool="jobs",lane="urgent"}'
  values: '4+0x60'
- series: 'lanepool_operator_reserve_capped{job="my-scrape",namespace="team",pool="jobs",lane="urgent"}'
  values: '1+0x60'
- series: 'lanepool_operator_metrics_failed_intervals{job="my-scrape",namespace="team",pool="jobs"}'
  values: '0+1x60'
- series: 'lanepool_operator_pool_condition{job="my-scrape",instance="a",namespace="team",pool="jobs",type="Ready",status="False"}'
  values: '1x19'
- series: 'lanepool_operator_pool_condition{job="my-scrape",instance="a",namespace="team",pool="jobs",type="Ready",status="True"}'
  values: '0x19'
- series: 'lanepool_operator_pool_condition{job="my-scrape",instance="b",namespace="team",pool="jobs",type="Ready",status="False"}'
  values: '_x20 1x39'
- series: 'lanepool_operator_pool_condition{job="my-scrape",instance="b",namespace="team",pool="jobs",type="Ready",status="True"}'
  values: '_x20 0x39'
- series: 'lanepool_operator_pool_condition{job="my-scrape",instance="a",namespace="team",pool="jobs",type="ScalingLimited",status="True"}'
  values: '1x59'
- series: 'lanepool_operator_shrink_held{job="my-scrape",instance="a",namespace="team",pool="jobs"}'
  values: '0x4 1x55'
"#;

/// What every replica of the operator exports, scraped under a job name of the user's own.
const BUILD_INFO: &str = r#"
series: 'lanepool_operator_build_info{job="my-scrape",namespace="lanepool-system",version="0.1.0"}'
values: '1x59'
"#;

#[test]
fn the_pool_alerts_pass_promtool_and_fire_on_the_guides_symptoms() {
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("promtool");
    std::fs::create_dir_all(&dir).unwrap();
    let rules = rendered_rules();
    let file = dir.join("rules.yaml");
    std::fs::write(&file, serde_yaml::to_string(&rules).unwrap()).unwrap();
    let (ok, out) = promtool("check", &file);
    assert!(ok, "promtool check rules: {out}");

    // promtool compares annotations too; their templates were checked above, so the copy under
    // test leaves them out and the test states what fires, on which labels, and when.
    let mut bare = rules.clone();
    for group in bare["groups"].as_array_mut().unwrap() {
        for rule in group["rules"].as_array_mut().unwrap() {
            rule.as_object_mut().unwrap().remove("annotations");
        }
    }
    let bare_file = dir.join("bare.yaml");
    std::fs::write(&bare_file, serde_yaml::to_string(&bare).unwrap()).unwrap();
    let lane = |lane: &str| json!({"namespace": "team", "pool": "jobs", "lane": lane, "severity": "warning"});
    let operator = |mut labels: Value| {
        labels["job"] = json!("my-scrape");
        labels
    };
    let firing = |alert: &str, at: &str, labels: Vec<Value>| {
        json!({
            "eval_time": at,
            "alertname": alert,
            "exp_alerts": labels.into_iter().map(|l| json!({"exp_labels": l})).collect::<Vec<_>>(),
        })
    };
    let pool =
        json!({"namespace": "team", "pool": "jobs", "severity": "warning", "job": "my-scrape"});
    // The condition alerts keep only the pool: the same alert whichever replica leads.
    let pool_only = json!({"namespace": "team", "pool": "jobs", "severity": "warning"});
    let series: Vec<Value> = serde_yaml::from_str(POOL_SERIES).unwrap();
    let mut scraped = series.clone();
    scraped.push(serde_yaml::from_str(BUILD_INFO).unwrap());
    let tests = json!({
        "rule_files": [bare_file],
        "evaluation_interval": "1m",
        "tests": [{
            "interval": "1m",
            "input_series": series,
            "alert_rule_test": [
                // Nothing of the operator in the release namespace: it is down, at 5m.
                firing("LanePoolOperatorDown", "4m", vec![]),
                firing("LanePoolOperatorDown", "5m", vec![
                    json!({"namespace": "lanepool-system", "severity": "critical"}),
                ]),
            ],
        }, {
            "interval": "1m",
            "input_series": scraped,
            "alert_rule_test": [
                firing("LanePoolOperatorDown", "30m", vec![]),
                // Ready=False for notReadyFor (10m); still firing at 25m, after the new leader
                // took over at 20m, though its own series is only 5 minutes old.
                firing("LanePoolNotReady", "9m", vec![]),
                firing("LanePoolNotReady", "10m", vec![pool_only.clone()]),
                firing("LanePoolNotReady", "25m", vec![pool_only.clone()]),
                // Held from 5m, for shrinkHeldFor (15m).
                firing("LanePoolShrinkHeld", "19m", vec![]),
                firing("LanePoolShrinkHeld", "20m", vec![pool_only]),
                // Each holds for `for` (15m) before firing; none fires before.
                firing("LanePoolReserveTooSmall", "10m", vec![]),
                firing("LanePoolReserveTooSmall", "30m", vec![lane("urgent")]),
                firing("LanePoolBatchStalled", "10m", vec![]),
                firing("LanePoolBatchStalled", "30m", vec![lane("batch")]),
                firing("LanePoolReserveAtMax", "30m", vec![operator(lane("urgent"))]),
                // After 5 failed intervals, at once.
                firing("LanePoolMetricsUnavailable", "4m", vec![]),
                firing("LanePoolMetricsUnavailable", "5m", vec![pool]),
            ],
        }],
    });
    let tests_file = dir.join("tests.yaml");
    std::fs::write(&tests_file, serde_yaml::to_string(&tests).unwrap()).unwrap();
    let (ok, out) = promtool("test", &tests_file);
    assert!(ok, "promtool test rules: {out}");
}

#[test]
fn the_crd_renders_unless_disabled_and_is_kept_unless_told_otherwise() {
    let disabled = template(&["crds.enabled=false"]).unwrap();
    assert!(of_kind(&disabled, "CustomResourceDefinition").is_empty());
    assert_eq!(
        of_kind(&disabled, "Deployment").len(),
        1,
        "the rest renders"
    );
    let dropped = template(&["crds.keep=false"]).unwrap();
    let crd = of_kind(&dropped, "CustomResourceDefinition")[0];
    assert!(
        crd["metadata"].get("annotations").is_none(),
        "no keep policy: {}",
        crd["metadata"]
    );
}

#[test]
fn the_chart_renders_without_being_told_the_kubernetes_version() {
    // tests/tools/build.sh links helm with the Kubernetes version, as helm's releases are.
    let (ok, stdout, stderr) = helm(&["template", "lanepool", CHART]);
    assert!(ok, "helm template without --kube-version:\n{stderr}");
    assert!(stdout.contains("kind: Deployment"), "{stdout}");
    // The chart's kubeVersion (>=1.30) is still enforced.
    let (ok, _, stderr) = helm(&["template", "lanepool", CHART, "--kube-version", "1.29.0"]);
    assert!(!ok && stderr.contains("kubeVersion"), "{stderr}");
}

#[test]
fn the_operator_runs_lanepool_run_locked_down() {
    let documents = template(&[
        "prometheusUrl=http://prometheus.monitoring.svc:9090",
        "watchNamespaces={team-a,team-b}",
        "logFormat=json",
        "logLevel=lanepool=debug",
    ])
    .unwrap();
    let deployment = of_kind(&documents, "Deployment")[0];
    assert_eq!(deployment["spec"]["replicas"], 1);
    assert_eq!(deployment["spec"]["strategy"]["type"], "RollingUpdate");
    assert_eq!(
        deployment["spec"]["strategy"]["rollingUpdate"]["maxUnavailable"],
        0
    );
    let pod = &deployment["spec"]["template"]["spec"];
    let sa = of_kind(&documents, "ServiceAccount")[0];
    assert_eq!(pod["serviceAccountName"], sa["metadata"]["name"]);
    assert_eq!(
        pod["securityContext"],
        json!({"runAsNonRoot": true, "runAsUser": 65532, "runAsGroup": 65532,
               "seccompProfile": {"type": "RuntimeDefault"}})
    );
    let container = &pod["containers"][0];
    assert_eq!(
        container["securityContext"],
        json!({"allowPrivilegeEscalation": false, "readOnlyRootFilesystem": true,
               "runAsNonRoot": true, "capabilities": {"drop": ["ALL"]}})
    );
    assert_eq!(container["image"], "ghcr.io/lanepool/lanepool:0.1.0");
    assert_eq!(container["imagePullPolicy"], "IfNotPresent");
    assert_eq!(
        container["args"],
        json!([
            "run",
            "--prometheus-url=http://prometheus.monitoring.svc:9090",
            "--allowed-prometheus-urls=http://prometheus.monitoring.svc:9090",
            "--namespaces=team-a,team-b",
            "--metrics-addr=0.0.0.0:8080",
            "--log-format=json",
            "--log-level=lanepool=debug",
        ])
    );
    assert_eq!(
        container["env"][0],
        json!({"name": "POD_NAME", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}})
    );
    assert_eq!(container["ports"][0]["containerPort"], 8080);
    assert_eq!(container["livenessProbe"]["httpGet"]["path"], "/healthz");
    assert_eq!(container["readinessProbe"]["httpGet"]["path"], "/readyz");
    assert_eq!(container["livenessProbe"]["httpGet"]["port"], "metrics");
    assert!(container["resources"]["requests"]["memory"].is_string());

    // Defaults leave out what is not set: no --prometheus-url, no --namespaces.
    let documents = template(&["image.tag=0.2.0", "metrics.port=9100"]).unwrap();
    let container =
        &of_kind(&documents, "Deployment")[0]["spec"]["template"]["spec"]["containers"][0];
    assert_eq!(container["image"], "ghcr.io/lanepool/lanepool:0.2.0");
    assert_eq!(
        container["args"],
        json!([
            "run",
            "--metrics-addr=0.0.0.0:9100",
            "--log-format=text",
            "--log-level=info"
        ])
    );
    let service = of_kind(&documents, "Service")[0];
    assert_eq!(service["spec"]["ports"][0]["targetPort"], "metrics");
}

/// The ClusterRoles the operator is bound to: not the aggregated ones for people.
fn operator_cluster_roles(documents: &[Value]) -> Vec<&Value> {
    of_kind(documents, "ClusterRole")
        .into_iter()
        .filter(|r| {
            !r["metadata"]["labels"]
                .as_object()
                .unwrap()
                .keys()
                .any(|k| k.starts_with("rbac.authorization.k8s.io/aggregate-to-"))
        })
        .collect()
}

#[test]
fn lanepools_join_the_built_in_edit_and_view_roles_without_secrets() {
    let documents = template(&[]).unwrap();
    let aggregated = |label: &str| -> Vec<&Value> {
        of_kind(&documents, "ClusterRole")
            .into_iter()
            .filter(|r| r["metadata"]["labels"][label] == "true")
            .collect()
    };
    let edit = aggregated("rbac.authorization.k8s.io/aggregate-to-edit");
    let admin = aggregated("rbac.authorization.k8s.io/aggregate-to-admin");
    let view = aggregated("rbac.authorization.k8s.io/aggregate-to-view");
    assert_eq!((edit.len(), admin.len(), view.len()), (1, 1, 1));
    assert_eq!(edit[0]["metadata"]["name"], admin[0]["metadata"]["name"]);
    let verbs = |role: &Value, resource: &str| -> BTreeSet<String> {
        role["rules"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|r| {
                r["resources"]
                    .as_array()
                    .unwrap()
                    .iter()
                    .any(|x| x == resource)
            })
            .flat_map(|r| {
                r["verbs"]
                    .as_array()
                    .unwrap()
                    .iter()
                    .map(|v| v.as_str().unwrap().to_string())
            })
            .collect()
    };
    assert!(verbs(edit[0], "lanepools").is_superset(&BTreeSet::from(
        ["create", "update", "patch", "delete"].map(String::from)
    )));
    assert_eq!(
        verbs(view[0], "lanepools"),
        BTreeSet::from(["get", "list", "watch"].map(String::from))
    );
    for role in [edit[0], view[0]] {
        let text = role["rules"].to_string();
        assert!(!text.contains("secrets") && !text.contains('*'), "{text}");
    }
    let none = template(&["rbac.aggregateToDefaultRoles=false"]).unwrap();
    assert_eq!(
        of_kind(&none, "ClusterRole").len(),
        1,
        "only the operator's"
    );
}

#[test]
fn rbac_is_exactly_what_the_operator_needs() {
    // Every namespace: one ClusterRole, bound to the ServiceAccount.
    let documents = template(&[]).unwrap();
    let cluster_roles = operator_cluster_roles(&documents);
    assert_eq!(cluster_roles.len(), 1);
    let cluster_role = cluster_roles[0];
    assert_eq!(cluster_role["rules"], operator_rules());
    let binding = of_kind(&documents, "ClusterRoleBinding")[0];
    assert_eq!(binding["roleRef"]["name"], cluster_role["metadata"]["name"]);
    assert_eq!(
        binding["subjects"],
        json!([{"kind": "ServiceAccount", "name": "lanepool", "namespace": "lanepool-system"}])
    );
    let leases = json!([{"apiGroups": ["coordination.k8s.io"], "resources": ["leases"],
                         "verbs": ["get", "create", "update", "patch"]}]);
    let roles = of_kind(&documents, "Role");
    assert_eq!(roles.len(), 1, "only leader election's Role");
    assert_eq!(roles[0]["metadata"]["namespace"], "lanepool-system");
    assert_eq!(roles[0]["rules"], leases);

    // Some namespaces: a Role and a RoleBinding in each, no cluster-wide grant.
    let documents = template(&["watchNamespaces={team-a,team-b}"]).unwrap();
    assert!(operator_cluster_roles(&documents).is_empty());
    assert!(of_kind(&documents, "ClusterRoleBinding").is_empty());
    for namespace in ["team-a", "team-b"] {
        let role = of_kind(&documents, "Role")
            .into_iter()
            .find(|r| r["metadata"]["namespace"] == namespace)
            .unwrap_or_else(|| panic!("a Role in {namespace}"));
        assert_eq!(role["rules"], operator_rules());
        let binding = of_kind(&documents, "RoleBinding")
            .into_iter()
            .find(|r| r["metadata"]["namespace"] == namespace)
            .unwrap_or_else(|| panic!("a RoleBinding in {namespace}"));
        assert_eq!(binding["roleRef"]["kind"], "Role");
        assert_eq!(binding["roleRef"]["name"], role["metadata"]["name"]);
        assert_eq!(binding["subjects"][0]["namespace"], "lanepool-system");
    }

    // rbac.create=false: none at all.
    let documents = template(&["rbac.create=false"]).unwrap();
    for kind in ["ClusterRole", "ClusterRoleBinding", "Role", "RoleBinding"] {
        assert!(of_kind(&documents, kind).is_empty(), "{kind}");
    }
}

#[test]
fn the_admission_policies_bind_the_operator_only_and_turn_off_with_one_value() {
    let documents = template(&["serviceAccount.name=steward"]).unwrap();
    let policies = of_kind(&documents, "ValidatingAdmissionPolicy");
    let bindings = of_kind(&documents, "ValidatingAdmissionPolicyBinding");
    let names = |documents: &[&Value]| -> BTreeSet<String> {
        documents
            .iter()
            .map(|d| d["metadata"]["name"].as_str().unwrap().to_string())
            .collect()
    };
    assert_eq!(
        names(&policies),
        BTreeSet::from(
            [
                "lanepool-pod-deletion-cost-only",
                "lanepool-pool-deployments-only",
                "lanepool-worker-credential-only",
            ]
            .map(String::from)
        )
    );
    assert_eq!(names(&bindings), names(&policies), "one binding each");
    for binding in &bindings {
        assert_eq!(binding["spec"]["policyName"], binding["metadata"]["name"]);
        assert_eq!(binding["spec"]["validationActions"], json!(["Deny"]));
    }
    let resources = |policy: &Value| policy["spec"]["matchConstraints"]["resourceRules"].clone();
    for policy in &policies {
        assert_eq!(policy["spec"]["failurePolicy"], "Fail");
        assert_eq!(
            policy["spec"]["matchConditions"],
            json!([{"name": "the-operator", "expression":
                "request.userInfo.username == \"system:serviceaccount:lanepool-system:steward\""}]),
            "{}: the operator's ServiceAccount and nobody else",
            policy["metadata"]["name"]
        );
    }
    let by_name = |name: &str| {
        *policies
            .iter()
            .find(|p| p["metadata"]["name"] == name)
            .unwrap()
    };
    assert_eq!(
        resources(by_name("lanepool-pool-deployments-only")),
        json!([{"apiGroups": ["apps"], "apiVersions": ["v1"],
                "operations": ["CREATE", "UPDATE", "DELETE"], "resources": ["deployments"]}])
    );
    assert_eq!(
        resources(by_name("lanepool-worker-credential-only")),
        json!([{"apiGroups": [""], "apiVersions": ["v1"],
                "operations": ["CREATE", "UPDATE", "DELETE"], "resources": ["secrets"]}])
    );
    assert_eq!(
        resources(by_name("lanepool-pod-deletion-cost-only")),
        json!([{"apiGroups": [""], "apiVersions": ["v1"],
                "operations": ["UPDATE"], "resources": ["pods", "pods/status"]}])
    );

    let off = template(&["rbac.podAdmissionPolicy=false"]).unwrap();
    assert!(of_kind(&off, "ValidatingAdmissionPolicy").is_empty());
    assert!(of_kind(&off, "ValidatingAdmissionPolicyBinding").is_empty());
}

#[test]
fn the_network_policy_opens_only_what_its_values_name() {
    assert!(of_kind(&template(&[]).unwrap(), "NetworkPolicy").is_empty());

    // The defaults: scraped from the namespace `monitoring`; out to the API server anywhere on
    // 443 and 6443, DNS anywhere, Prometheus in `monitoring` on 9090, and every namespace's
    // pool-labelled Pods on 9100.
    let documents = template(&["networkPolicy.enabled=true"]).unwrap();
    let policies = of_kind(&documents, "NetworkPolicy");
    assert_eq!(policies.len(), 1);
    let policy = policies[0];
    let deployment = of_kind(&documents, "Deployment")[0];
    assert_eq!(policy["metadata"]["namespace"], "lanepool-system");
    assert_eq!(
        policy["spec"]["podSelector"]["matchLabels"], deployment["spec"]["selector"]["matchLabels"],
        "it selects the operator's Pods"
    );
    assert_eq!(policy["spec"]["policyTypes"], json!(["Ingress", "Egress"]));
    let tcp = |port: u16| json!({"port": port, "protocol": "TCP"});
    let namespace = |name: &str| json!({"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": name}}});
    let dns = json!([{"port": 53, "protocol": "UDP"}, {"port": 53, "protocol": "TCP"}]);
    let pool_pods =
        json!({"matchExpressions": [{"key": "lanepool.dev/pool", "operator": "Exists"}]});
    assert_eq!(
        policy["spec"]["ingress"],
        json!([{"from": [namespace("monitoring")], "ports": [tcp(8080)]}])
    );
    assert_eq!(
        policy["spec"]["egress"],
        json!([
            {"to": [{"ipBlock": {"cidr": "0.0.0.0/0"}}, {"ipBlock": {"cidr": "::/0"}}],
             "ports": [tcp(443), tcp(6443)]},
            {"ports": dns},
            {"to": [namespace("monitoring")], "ports": [tcp(9090)]},
            {"to": [{"podSelector": pool_pods, "namespaceSelector": {}}], "ports": [tcp(9100)]},
        ])
    );

    // Every peer and port is a value; the workers are those of the namespaces watched.
    let documents = template(&[
        "networkPolicy.enabled=true",
        "metrics.port=9000",
        "watchNamespaces={team-a,team-b}",
        "networkPolicy.metricsFrom[0].podSelector.matchLabels.app=prometheus",
        "networkPolicy.metricsFrom[0].namespaceSelector.matchLabels.team=observability",
        "networkPolicy.apiServer.cidrs={10.0.0.1/32}",
        "networkPolicy.apiServer.ports={6443}",
        "networkPolicy.dns.to[0].namespaceSelector.matchLabels.kubernetes\\.io/metadata\\.name=kube-system",
        "networkPolicy.prometheus.to=null",
        "networkPolicy.prometheus.ports={9091,9092}",
        "networkPolicy.workers.ports={9100,9200}",
    ])
    .unwrap();
    let policy = of_kind(&documents, "NetworkPolicy")[0];
    assert_eq!(
        policy["spec"]["ingress"],
        json!([{"from": [{"podSelector": {"matchLabels": {"app": "prometheus"}},
                          "namespaceSelector": {"matchLabels": {"team": "observability"}}}],
                "ports": [tcp(9000)]}])
    );
    let watched = json!({"matchExpressions": [{"key": "kubernetes.io/metadata.name",
                                               "operator": "In", "values": ["team-a", "team-b"]}]});
    assert_eq!(
        policy["spec"]["egress"],
        json!([
            {"to": [{"ipBlock": {"cidr": "10.0.0.1/32"}}], "ports": [tcp(6443)]},
            {"to": [namespace("kube-system")], "ports": dns},
            {"ports": [tcp(9091), tcp(9092)]},
            {"to": [{"podSelector": pool_pods, "namespaceSelector": watched}],
             "ports": [tcp(9100), tcp(9200)]},
        ])
    );

    // Empty lists close what they name: no ingress at all, no Prometheus, no worker.
    let documents = template(&[
        "networkPolicy.enabled=true",
        "networkPolicy.metricsFrom=null",
        "networkPolicy.prometheus.ports=null",
        "networkPolicy.workers.ports=null",
    ])
    .unwrap();
    let policy = of_kind(&documents, "NetworkPolicy")[0];
    assert_eq!(policy["spec"]["policyTypes"], json!(["Ingress", "Egress"]));
    assert_eq!(policy["spec"]["ingress"], json!([]));
    let egress = policy["spec"]["egress"].as_array().unwrap();
    assert_eq!(egress.len(), 2, "the API server and DNS only: {egress:?}");
}

// ---- Installed into the real API server ----

/// The two installs run one at a time: a cluster-wide operator would also reconcile the other
/// test's pool.
static INSTALLS: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// A client acting as the chart's ServiceAccount: every request is authorized by its RBAC only.
async fn impersonating(plane: &testenv::ControlPlane, user: &str) -> Client {
    let kubeconfig = Kubeconfig::read_from(plane.kubeconfig()).unwrap();
    let mut config = Config::from_custom_kubeconfig(kubeconfig, &KubeConfigOptions::default())
        .await
        .unwrap();
    config.auth_info.impersonate = Some(user.to_string());
    Client::try_from(config).unwrap()
}

async fn allowed(
    client: &Client,
    verb: &str,
    group: &str,
    resource: &str,
    namespace: Option<&str>,
) -> bool {
    let review: SelfSubjectAccessReview = serde_json::from_value(json!({
        "spec": {"resourceAttributes": {
            "verb": verb, "group": group, "resource": resource, "namespace": namespace,
        }}
    }))
    .unwrap();
    let review = Api::<SelfSubjectAccessReview>::all(client.clone())
        .create(&PostParams::default(), &review)
        .await
        .expect("a SelfSubjectAccessReview");
    review.status.is_some_and(|s| s.allowed)
}

fn forbidden<T: std::fmt::Debug>(result: kube::Result<T>, what: &str) {
    match result {
        Err(kube::Error::Api(status)) if status.is_forbidden() => {}
        other => panic!("{what}: expected 403 Forbidden, got {other:?}"),
    }
}

/// A request the chart's admission policy `policy` refused: the API server names the policy and
/// quotes the validation's `message`.
fn refused_by<T: std::fmt::Debug>(
    result: kube::Result<T>,
    policy: &str,
    message: &str,
    what: &str,
) {
    match result {
        Err(kube::Error::Api(status)) => assert!(
            status
                .message
                .contains(&format!("ValidatingAdmissionPolicy '{policy}'"))
                && status.message.contains(message),
            "{what}: expected {policy} to refuse it with {message:?}, got {status:?}"
        ),
        other => panic!("{what}: expected {policy} to refuse it, got {other:?}"),
    }
}

/// A controller ownerReference to the LanePool `pool`. The policies read the reference, not the
/// pool: no such LanePool need exist (and no garbage collector runs here to remove what it owns).
fn controlled_by(pool: &str) -> Value {
    json!({"apiVersion": "lanepool.dev/v1alpha1", "kind": "LanePool", "name": pool,
           "uid": "5f0c3c1e-7d1a-4b8e-9c55-0a1b2c3d4e5f", "controller": true})
}

/// A Deployment of no workers named `name`, with `labels` and the ownerReferences `owners`.
fn deployment_of(name: &str, labels: Value, owners: Value) -> Deployment {
    serde_json::from_value(json!({
        "metadata": {"name": name, "labels": labels, "ownerReferences": owners},
        "spec": {
            "replicas": 0,
            "selector": {"matchLabels": {"app": name}},
            "template": {
                "metadata": {"labels": {"app": name}},
                "spec": {"containers": [{"name": "worker", "image": "worker"}]},
            },
        },
    }))
    .unwrap()
}

/// An Opaque Secret holding a token, named `name`, with `labels` and the ownerReferences `owners`.
fn secret_of(name: &str, labels: Value, owners: Value) -> Secret {
    serde_json::from_value(json!({
        "metadata": {"name": name, "labels": labels, "ownerReferences": owners},
        "type": "Opaque",
        // "token", base64.
        "data": {"token": "dG9rZW4="},
    }))
    .unwrap()
}

/// As the chart's operator (`operator_client`), in a namespace it watches (`pools`): it creates,
/// changes and deletes only Deployments a LanePool controls and labels with its name (the
/// admission policy), and none at all in a namespace it does not watch (RBAC, for a namespaced
/// install).
async fn only_its_pools_deployments(
    operator_client: &Client,
    admin: &Client,
    pools: &str,
    elsewhere: &str,
    release: &str,
    namespaced: bool,
) {
    let create = PostParams::default();
    let no_params = PatchParams::default();
    let merge = |patch: Value| Patch::Merge(patch);
    let pool = |name: &str| json!({"lanepool.dev/pool": name});
    let deployments_policy = format!("{release}-pool-deployments-only");
    let not_a_pools = "lanepool writes only a Deployment a LanePool controls, labelled \
                       lanepool.dev/pool with the LanePool's name";
    let adopts_none = "lanepool changes or deletes only a Deployment a LanePool already controls";
    let operator_deployments = Api::<Deployment>::namespaced(operator_client.clone(), pools);
    let admin_deployments = Api::<Deployment>::namespaced(admin.clone(), pools);
    // Each policy loads as the Pods' did: until it has, a create goes through (and is undone).
    until_the_policy_loads(
        "the operator's unowned Deployment refused",
        (&operator_deployments, &admin_deployments),
        |name| deployment_of(&format!("unowned-{name}"), json!({}), json!([])),
    )
    .await;
    let mut owned_not_controlled = controlled_by("ghost");
    owned_not_controlled["controller"] = json!(false);
    let mut another_kind = controlled_by("ghost");
    another_kind["apiVersion"] = json!("example.com/v1");
    for (what, labels, owners) in [
        ("no owner", pool("ghost"), json!([])),
        (
            "a LanePool owner that is not its controller",
            pool("ghost"),
            json!([owned_not_controlled]),
        ),
        (
            "a controller LanePool of another API group",
            pool("ghost"),
            json!([another_kind]),
        ),
        (
            "labelled with another pool",
            pool("other"),
            json!([controlled_by("ghost")]),
        ),
        ("not labelled", json!({}), json!([controlled_by("ghost")])),
    ] {
        refused_by(
            operator_deployments
                .create(&create, &deployment_of("ghost-shared", labels, owners))
                .await,
            &deployments_policy,
            not_a_pools,
            what,
        );
    }
    let elsewhere_deployment = Api::<Deployment>::namespaced(operator_client.clone(), elsewhere)
        .create(&create, &deployment_of("unowned", json!({}), json!([])))
        .await;
    if namespaced {
        assert!(
            !allowed(
                operator_client,
                "create",
                "apps",
                "deployments",
                Some(elsewhere)
            )
            .await,
            "a namespaced install cannot create deployments in {elsewhere}"
        );
        forbidden(
            elsewhere_deployment,
            "creating a Deployment outside the watched namespace",
        );
    } else {
        refused_by(
            elsewhere_deployment,
            &deployments_policy,
            not_a_pools,
            "an unowned Deployment in another namespace",
        );
    }
    // A pool's Deployment: created, scaled and deleted; never moved to another pool.
    operator_deployments
        .create(
            &create,
            &deployment_of(
                "ghost-shared",
                pool("ghost"),
                json!([controlled_by("ghost")]),
            ),
        )
        .await
        .expect("the operator creates a Deployment its LanePool controls and labels");
    operator_deployments
        .patch(
            "ghost-shared",
            &no_params,
            &merge(json!({"spec": {"replicas": 2}})),
        )
        .await
        .expect("the operator scales a pool's Deployment");
    refused_by(
        operator_deployments
            .patch(
                "ghost-shared",
                &no_params,
                &merge(json!({"metadata": {"labels": pool("other")}})),
            )
            .await,
        &deployments_policy,
        not_a_pools,
        "relabelled with another pool",
    );
    refused_by(
        operator_deployments
            .patch(
                "ghost-shared",
                &no_params,
                &merge(json!({"metadata": {"labels": pool("phantom"),
                                           "ownerReferences": [controlled_by("phantom")]}})),
            )
            .await,
        &deployments_policy,
        "lanepool moves no Deployment from one LanePool to another",
        "handed to another LanePool",
    );
    // A pool's Deployment whose label someone removed is still the pool's: the operator puts
    // the label back.
    admin_deployments
        .patch(
            "ghost-shared",
            &no_params,
            &merge(json!({"metadata": {"labels": {"lanepool.dev/pool": null}}})),
        )
        .await
        .unwrap();
    operator_deployments
        .patch(
            "ghost-shared",
            &no_params,
            &merge(json!({"metadata": {"labels": pool("ghost")}})),
        )
        .await
        .expect("the operator relabels its pool's Deployment");
    // Someone else's Deployment: the operator can neither adopt it nor delete it.
    admin_deployments
        .create(
            &create,
            &deployment_of("someone-elses", json!({}), json!([])),
        )
        .await
        .expect("the admin is not bound by the operator's policy");
    refused_by(
        operator_deployments
            .patch(
                "someone-elses",
                &no_params,
                &merge(json!({"metadata": {"labels": pool("ghost"),
                                           "ownerReferences": [controlled_by("ghost")]}})),
            )
            .await,
        &deployments_policy,
        adopts_none,
        "adopting someone else's Deployment",
    );
    refused_by(
        operator_deployments
            .delete("someone-elses", &DeleteParams::default())
            .await,
        &deployments_policy,
        adopts_none,
        "deleting someone else's Deployment",
    );
    assert!(
        admin_deployments
            .get_opt("someone-elses")
            .await
            .unwrap()
            .is_some()
    );
    operator_deployments
        .delete("ghost-shared", &DeleteParams::default())
        .await
        .expect("the operator deletes a pool's Deployment");
}

/// Creates `object(n)` as the operator (`apis.0`) for n = 1, 2, … until one is refused: a new
/// admission policy takes a moment to load, and until it has a create goes through (undone at
/// once by the admin, `apis.1`).
async fn until_the_policy_loads<K>(what: &str, apis: (&Api<K>, &Api<K>), object: impl Fn(u32) -> K)
where
    K: kube::Resource + Clone + std::fmt::Debug + serde::Serialize + serde::de::DeserializeOwned,
{
    let (operator, admin) = apis;
    let mut tries = 0;
    until(20, what, || {
        tries += 1;
        let object = object(tries);
        async move {
            let name = object.meta().name.clone().unwrap_or_default();
            match operator.create(&PostParams::default(), &object).await {
                Ok(_) => {
                    admin.delete(&name, &DeleteParams::default()).await.unwrap();
                    false
                }
                Err(_) => true,
            }
        }
    })
    .await;
}

/// As the chart's operator (`operator_client`), in a namespace it watches (`pools`): it creates
/// and patches only an Opaque `<pool>-worker-credential` the LanePool `<pool>` controls and labels
/// (the admission policy), adopts none, changes no Secret it only reads, and deletes none (RBAC).
async fn only_its_pools_credentials(
    operator_client: &Client,
    admin: &Client,
    pools: &str,
    release: &str,
) {
    let create = PostParams::default();
    let no_params = PatchParams::default();
    let merge = |patch: Value| Patch::Merge(patch);
    let pool = |name: &str| json!({"lanepool.dev/pool": name});
    let secrets_policy = format!("{release}-worker-credential-only");
    let not_a_credential = "lanepool writes only the Secret <pool>-worker-credential that the \
                            LanePool <pool> controls, labelled lanepool.dev/pool=<pool>";
    let operator_secrets = Api::<Secret>::namespaced(operator_client.clone(), pools);
    let admin_secrets = Api::<Secret>::namespaced(admin.clone(), pools);
    // The policy loads as the Pods' did: until it has, a create goes through (and is undone).
    until_the_policy_loads(
        "the operator's Secret of another name refused",
        (&operator_secrets, &admin_secrets),
        |name| {
            let name = format!("ghost-token-{name}");
            secret_of(&name, pool("ghost"), json!([controlled_by("ghost")]))
        },
    )
    .await;
    let credential = "ghost-worker-credential";
    let mut owned_not_controlled = controlled_by("ghost");
    owned_not_controlled["controller"] = json!(false);
    for (what, name, labels, owners) in [
        (
            "another name",
            "ghost-token",
            pool("ghost"),
            json!([controlled_by("ghost")]),
        ),
        ("no owner", credential, pool("ghost"), json!([])),
        (
            "another pool's owner",
            credential,
            pool("ghost"),
            json!([controlled_by("phantom")]),
        ),
        (
            "owned, not controlled",
            credential,
            pool("ghost"),
            json!([owned_not_controlled]),
        ),
        (
            "not labelled",
            credential,
            json!({}),
            json!([controlled_by("ghost")]),
        ),
        (
            "labelled with another pool",
            credential,
            pool("phantom"),
            json!([controlled_by("ghost")]),
        ),
    ] {
        refused_by(
            operator_secrets
                .create(&create, &secret_of(name, labels, owners))
                .await,
            &secrets_policy,
            not_a_credential,
            what,
        );
    }
    // A ServiceAccount token Secret the operator could read back would be a token of that
    // ServiceAccount: refused, however it is named and owned.
    let mut account_token = secret_of(credential, pool("ghost"), json!([controlled_by("ghost")]));
    account_token.type_ = Some("kubernetes.io/service-account-token".into());
    account_token.metadata.annotations = Some(BTreeMap::from([(
        "kubernetes.io/service-account.name".to_string(),
        "default".to_string(),
    )]));
    refused_by(
        operator_secrets.create(&create, &account_token).await,
        &secrets_policy,
        "lanepool writes only Secrets of type Opaque",
        "a service-account-token Secret",
    );
    // The pool's credential: created, then rotated by merge patches.
    operator_secrets
        .create(
            &create,
            &secret_of(credential, pool("ghost"), json!([controlled_by("ghost")])),
        )
        .await
        .expect("the operator creates a pool's worker credential");
    operator_secrets
        .patch(
            credential,
            &no_params,
            &merge(json!({"data": {"token": "bmV3", "previous": "dG9rZW4="},
                          "metadata": {"annotations": {"lanepool.dev/rotated-at": "2026-12-05T00:00:00Z"}}})),
        )
        .await
        .expect("the operator rotates a pool's worker credential");
    refused_by(
        operator_secrets
            .patch(
                credential,
                &no_params,
                &merge(json!({"metadata": {"labels": {"lanepool.dev/pool": null}}})),
            )
            .await,
        &secrets_policy,
        not_a_credential,
        "unlabelling a worker credential",
    );
    // Secrets it only reads (a pool's bearer token): never changed, never deleted, never adopted.
    admin_secrets
        .create(
            &create,
            &secret_of("prometheus-token", json!({}), json!([])),
        )
        .await
        .unwrap();
    refused_by(
        operator_secrets
            .patch(
                "prometheus-token",
                &no_params,
                &merge(json!({"data": {"token": "c3RvbGVu"}})),
            )
            .await,
        &secrets_policy,
        not_a_credential,
        "changing a Secret the operator reads",
    );
    for name in ["prometheus-token", credential] {
        forbidden(
            operator_secrets
                .delete(name, &DeleteParams::default())
                .await,
            &format!("deleting the Secret {name}"),
        );
    }
    admin_secrets
        .create(
            &create,
            &secret_of("orphan-worker-credential", json!({}), json!([])),
        )
        .await
        .unwrap();
    refused_by(
        operator_secrets
            .patch(
                "orphan-worker-credential",
                &no_params,
                &merge(json!({"metadata": {"labels": pool("orphan"),
                                           "ownerReferences": [controlled_by("orphan")]}})),
            )
            .await,
        &secrets_policy,
        "lanepool changes only a Secret that already is a LanePool's worker credential: it \
         adopts none",
        "adopting a Secret",
    );
    let read_only = admin_secrets.get("prometheus-token").await.unwrap();
    assert_eq!(
        serde_json::to_value(read_only.data).unwrap(),
        json!({"token": "dG9rZW4="}),
        "the Secret the operator reads is as its owner wrote it"
    );
}

/// Installs the chart (release `release`, watching `watch` or every namespace), runs the
/// operator in-process as the chart's ServiceAccount with the flags of the installed
/// Deployment, and checks that it sizes the example pool in `pools` and can do nothing else.
async fn install_and_size_a_pool(release: &str, namespaced: bool) {
    let _one_at_a_time = INSTALLS.lock().await;
    let plane = testenv::shared().expect("the control plane starts");
    let admin = plane.client().await.unwrap();
    let system = plane.namespace(&admin, "lanepool-system").await.unwrap();
    let pools = plane.namespace(&admin, "pools").await.unwrap();
    let elsewhere = plane.namespace(&admin, "elsewhere").await.unwrap();

    let workers = SimulatedWorkers::start().unwrap();
    let prometheus = TestPrometheus::start(&[workers.addr()]).unwrap();
    workers.set_lane(&pools, "jobs", "urgent", 30.0, 0.020);

    let kubeconfig = plane.kubeconfig().display().to_string();
    let prometheus_url = format!("prometheusUrl={}", prometheus.url());
    let watch = format!("watchNamespaces={{{pools}}}");
    let mut args = vec![
        "install",
        release,
        CHART,
        "--namespace",
        &system,
        "--kubeconfig",
        &kubeconfig,
        // The test environment installed the CRD already (not Helm's to own: the chart's CRD
        // test adopts it); no pod ever runs, so no --wait.
        "--set",
        "crds.enabled=false",
        "--set",
        &prometheus_url,
        // The API server must take the NetworkPolicy (no network plugin here enforces it).
        "--set",
        "networkPolicy.enabled=true",
    ];
    if namespaced {
        args.extend(["--set", &watch]);
    }
    let (ok, stdout, stderr) = helm(&args);
    assert!(ok, "helm install:\n{stdout}\n{stderr}");
    // NOTES.txt points to a pool to start from and how to watch it, never to a manifest whose
    // image is unpublished.
    assert!(
        stdout.contains("kubectl get lanepools"),
        "NOTES.txt:\n{stdout}"
    );
    assert!(
        !stdout.contains("examples/lanepool.yaml"),
        "NOTES.txt:\n{stdout}"
    );

    // What the chart installed: one ServiceAccount and the operator's Deployment.
    let accounts = Api::<ServiceAccount>::namespaced(admin.clone(), &system)
        .list(&ListParams::default().labels(&format!("app.kubernetes.io/instance={release}")))
        .await
        .unwrap();
    assert_eq!(accounts.items.len(), 1);
    let account = accounts.items[0].metadata.name.clone().unwrap();
    let operator = Api::<Deployment>::namespaced(admin.clone(), &system)
        .list(&ListParams::default().labels(&format!("app.kubernetes.io/instance={release}")))
        .await
        .unwrap();
    assert_eq!(operator.items.len(), 1);
    let pod = operator.items[0]
        .spec
        .clone()
        .unwrap()
        .template
        .spec
        .unwrap();
    assert_eq!(pod.service_account_name.as_deref(), Some(account.as_str()));
    // ... and the NetworkPolicy, stored, selecting the operator's Pods and reaching the workers
    // of the namespaces watched.
    let network_policies = Api::<NetworkPolicy>::namespaced(admin.clone(), &system)
        .list(&ListParams::default().labels(&format!("app.kubernetes.io/instance={release}")))
        .await
        .unwrap();
    assert_eq!(network_policies.items.len(), 1);
    let network_policy = serde_json::to_value(&network_policies.items[0].spec).unwrap();
    let pod_labels = serde_json::to_value(&operator.items[0].spec.as_ref().unwrap().template)
        .unwrap()["metadata"]["labels"]
        .clone();
    let selected = network_policy["podSelector"]["matchLabels"]
        .as_object()
        .cloned()
        .unwrap_or_default();
    assert!(
        !selected.is_empty() && selected.iter().all(|(k, v)| &pod_labels[k] == v),
        "{network_policy} selects the operator's Pods ({pod_labels})"
    );
    let workers =
        network_policy["egress"].as_array().unwrap().last().unwrap()["to"][0]["namespaceSelector"]
            .clone();
    assert_eq!(
        workers,
        if namespaced {
            json!({"matchExpressions": [{"key": "kubernetes.io/metadata.name",
                                         "operator": "In", "values": [pools]}]})
        } else {
            json!({})
        }
    );
    let args = pod.containers[0].args.clone().unwrap();
    let namespaces: Vec<String> = args
        .iter()
        .find_map(|a| a.strip_prefix("--namespaces="))
        .map(|list| list.split(',').map(String::from).collect())
        .unwrap_or_default();
    assert_eq!(
        namespaces,
        if namespaced {
            vec![pools.clone()]
        } else {
            vec![]
        }
    );
    assert!(args.contains(&format!("--prometheus-url={}", prometheus.url())));
    // Credentials go to the chart's Prometheus and nowhere else.
    let allowed_urls = args
        .iter()
        .find_map(|a| a.strip_prefix("--allowed-prometheus-urls="))
        .expect("the chart limits the Prometheus URLs to its prometheusUrl");
    assert_eq!(allowed_urls, prometheus.url());

    // The operator, in-process, with nothing but the chart's RBAC and its URL list.
    let user = format!("system:serviceaccount:{system}:{account}");
    let operator_client = impersonating(plane, &user).await;
    let mut settings = InProcessOperator::settings(prometheus.url());
    settings.allowed_prometheus_urls = AllowedUrls::parse(allowed_urls).unwrap();
    let operator = InProcessOperator::start_with(operator_client.clone(), namespaces, settings);

    // The example pool, created by the admin; fast intervals, the test Prometheus.
    let mut manifest = testenv::formula_pool();
    manifest["spec"]["interval"] = json!("5s");
    manifest["spec"]
        .as_object_mut()
        .unwrap()
        .remove("prometheus");
    let pool: LanePool = serde_json::from_value(manifest).unwrap();
    let lanepools = Api::<LanePool>::namespaced(admin.clone(), &pools);
    lanepools
        .create(&PostParams::default(), &pool)
        .await
        .unwrap();

    let deployments = Api::<Deployment>::namespaced(admin.clone(), &pools);
    let replicas = |name: &'static str| {
        let deployments = deployments.clone();
        async move { deployments.get_opt(name).await.ok()??.spec?.replicas }
    };
    until(40, "jobs-urgent-reserved and jobs-shared", || async {
        replicas("jobs-urgent-reserved").await == Some(1)
            && replicas("jobs-shared").await == Some(9)
    })
    .await;
    until(40, "the LanePool Ready=True", || async {
        let pool = lanepools.get("jobs").await.unwrap();
        pool.status.is_some_and(|s| {
            s.conditions
                .iter()
                .any(|c| c.type_ == "Ready" && c.status == "True")
        })
    })
    .await;
    let events = Api::<Event>::namespaced(admin.clone(), &pools);
    until(20, "a Scaled event (events.k8s.io)", || async {
        events
            .list(&ListParams::default())
            .await
            .unwrap()
            .items
            .iter()
            .any(|e| e.reason.as_deref() == Some("Scaled"))
    })
    .await;

    // Each rule the operator needs is granted where it works...
    let scope = Some(pools.as_str());
    for (verb, group, resource) in [
        ("get", "lanepool.dev", "lanepools"),
        ("list", "lanepool.dev", "lanepools"),
        ("watch", "lanepool.dev", "lanepools"),
        ("patch", "lanepool.dev", "lanepools/status"),
        ("create", "apps", "deployments"),
        ("patch", "apps", "deployments"),
        ("delete", "apps", "deployments"),
        ("list", "autoscaling", "horizontalpodautoscalers"),
        ("list", "apps", "replicasets"),
        ("list", "", "pods"),
        ("watch", "", "pods"),
        ("patch", "", "pods"),
        ("get", "", "secrets"),
        // The worker credentials; the admission policy narrows both to those.
        ("create", "", "secrets"),
        ("patch", "", "secrets"),
        ("create", "events.k8s.io", "events"),
        ("patch", "", "events"),
    ] {
        assert!(
            allowed(&operator_client, verb, group, resource, scope).await,
            "{verb} {group}/{resource} in {pools} is granted"
        );
    }
    for verb in ["get", "create", "update", "patch"] {
        assert!(
            allowed(
                &operator_client,
                verb,
                "coordination.k8s.io",
                "leases",
                Some(&system)
            )
            .await,
            "{verb} leases in {system} (leader election)"
        );
    }
    // ... and nothing else: the test fails if the chart granted "*".
    for (verb, group, resource) in [
        ("list", "", "secrets"),
        ("watch", "", "secrets"),
        ("update", "", "secrets"),
        ("delete", "", "secrets"),
        ("deletecollection", "", "secrets"),
        ("get", "", "pods"),
        ("delete", "", "pods"),
        ("create", "", "pods/eviction"),
        ("delete", "apps", "replicasets"),
        ("create", "lanepool.dev", "lanepools"),
        ("delete", "lanepool.dev", "lanepools"),
        ("update", "lanepool.dev", "lanepools"),
        ("deletecollection", "apps", "deployments"),
        ("create", "autoscaling", "horizontalpodautoscalers"),
        ("delete", "", "events"),
        ("delete", "coordination.k8s.io", "leases"),
        ("escalate", "rbac.authorization.k8s.io", "roles"),
    ] {
        assert!(
            !allowed(&operator_client, verb, group, resource, scope).await,
            "{verb} {group}/{resource} in {pools} must be refused"
        );
    }
    forbidden(
        Api::<Secret>::all(operator_client.clone())
            .list(&ListParams::default())
            .await,
        "listing Secrets cluster-wide",
    );
    forbidden(
        Api::<Secret>::namespaced(operator_client.clone(), &pools)
            .list(&ListParams::default())
            .await,
        "listing Secrets in the watched namespace",
    );
    let role: ClusterRole =
        serde_json::from_value(json!({"metadata": {"name": format!("{release}-escalated")},
                                      "rules": [{"apiGroups": ["*"], "resources": ["*"], "verbs": ["*"]}]}))
        .unwrap();
    forbidden(
        Api::<ClusterRole>::all(operator_client.clone())
            .create(&PostParams::default(), &role)
            .await,
        "creating a ClusterRole",
    );
    // Reading a Secret by name is allowed (a missing one is a 404, not a 403).
    match Api::<Secret>::namespaced(operator_client.clone(), &pools)
        .get("absent")
        .await
    {
        Err(kube::Error::Api(status)) if status.is_not_found() => {}
        other => panic!("get Secret absent: expected 404, got {other:?}"),
    }
    let outside = allowed(
        &operator_client,
        "list",
        "lanepool.dev",
        "lanepools",
        Some(&elsewhere),
    )
    .await;
    if namespaced {
        assert!(!outside, "a namespaced install reaches only {pools}");
        forbidden(
            Api::<LanePool>::all(operator_client.clone())
                .list(&ListParams::default())
                .await,
            "listing LanePools cluster-wide",
        );
        forbidden(
            Api::<Deployment>::namespaced(operator_client.clone(), &elsewhere)
                .list(&ListParams::default())
                .await,
            "listing Deployments outside the watched namespace",
        );
    } else {
        assert!(outside, "a cluster-wide install reaches every namespace");
    }

    // A Pod the operator may give a deletion cost and change nothing else of: RBAC grants
    // "patch pods", the chart's ValidatingAdmissionPolicy narrows it.
    let admin_pods = Api::<Pod>::namespaced(admin.clone(), &pools);
    let pod: Pod = serde_json::from_value(json!({
        "metadata": {"name": "guarded", "labels": {"app": "x"}, "annotations": {"note": "kept"}},
        "spec": {"containers": [{"name": "c", "image": "before"}]},
    }))
    .unwrap();
    admin_pods
        .create(&PostParams::default(), &pod)
        .await
        .unwrap();
    let operator_pods = Api::<Pod>::namespaced(operator_client.clone(), &pools);
    let patch = |patch: Value| {
        let operator_pods = operator_pods.clone();
        async move {
            operator_pods
                .patch("guarded", &PatchParams::default(), &Patch::Merge(&patch))
                .await
        }
    };
    // The API server loads a new policy within a second or so: until then a change goes through
    // (each try sets a new value, so none is a no-op).
    let mut tries = 0;
    until(20, "the operator's label change refused", || {
        tries += 1;
        let label = json!({"metadata": {"labels": {"app": format!("try-{tries}")}}});
        async { patch(label).await.is_err() }
    })
    .await;
    let cost =
        json!({"metadata": {"annotations": {"controller.kubernetes.io/pod-deletion-cost": "-1"}}});
    patch(cost)
        .await
        .expect("the deletion cost is the operator's to set");
    for (what, change) in [
        (
            "image",
            json!({"spec": {"containers": [{"name": "c", "image": "after"}]}}),
        ),
        (
            "annotation",
            json!({"metadata": {"annotations": {"note": "changed"}}}),
        ),
        (
            "removed annotation",
            json!({"metadata": {"annotations": {"note": null}}}),
        ),
        (
            "finalizer",
            json!({"metadata": {"finalizers": ["example.com/hold"]}}),
        ),
    ] {
        match patch(change).await {
            Err(kube::Error::Api(status)) => {
                assert!(
                    status.message.contains("lanepool changes no Pod"),
                    "{what}: {status:?}"
                )
            }
            other => panic!("{what}: expected a refusal, got {other:?}"),
        }
    }
    // In the Pod's status: the readiness gate's condition, and nothing else.
    let status = |patch: Value| {
        let operator_pods = operator_pods.clone();
        async move {
            operator_pods
                .patch_status(
                    "guarded",
                    &PatchParams::default(),
                    &Patch::Strategic(&patch),
                )
                .await
        }
    };
    let condition = |type_: &str| {
        json!({"status": {"conditions": [{"type": type_, "status": "True",
            "lastTransitionTime": "2026-12-05T00:00:00Z"}]}})
    };
    status(condition("lanepool.dev/takeover"))
        .await
        .expect("the takeover condition is the operator's to set");
    for (what, change) in [
        ("Ready condition", condition("Ready")),
        ("phase", json!({"status": {"phase": "Failed"}})),
        ("podIP", json!({"status": {"podIP": "10.9.9.9"}})),
        // The rest of the status too, whatever field: none but the gate's condition changes.
        ("another condition", condition("example.com/other")),
        ("hostIP", json!({"status": {"hostIP": "10.9.9.8"}})),
        ("message", json!({"status": {"message": "moved"}})),
        ("reason", json!({"status": {"reason": "Moved"}})),
        (
            "nominatedNodeName",
            json!({"status": {"nominatedNodeName": "elsewhere"}}),
        ),
    ] {
        match status(change).await {
            Err(kube::Error::Api(status)) => {
                assert!(
                    status.message.contains("lanepool changes no Pod status"),
                    "{what}: {status:?}"
                )
            }
            other => panic!("{what}: expected a refusal, got {other:?}"),
        }
    }
    let guarded = admin_pods.get("guarded").await.unwrap();
    let conditions = guarded.status.as_ref().and_then(|s| s.conditions.clone());
    assert_eq!(
        conditions
            .unwrap_or_default()
            .iter()
            .map(|c| c.type_.as_str())
            .collect::<Vec<_>>(),
        ["lanepool.dev/takeover"]
    );
    assert_eq!(
        guarded.spec.as_ref().unwrap().containers[0]
            .image
            .as_deref(),
        Some("before")
    );
    assert_eq!(
        guarded.annotations().get("note").map(String::as_str),
        Some("kept")
    );
    // The policy is the operator's only: anyone else changes the Pod as before.
    admin_pods
        .patch(
            "guarded",
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"labels": {"app": "admin"}}})),
        )
        .await
        .expect("the admin is not bound by the operator's policy");
    // A condition someone else set stays as they set it; the gate's changes beside it.
    admin_pods
        .patch_status(
            "guarded",
            &PatchParams::default(),
            &Patch::Strategic(condition("example.com/other")),
        )
        .await
        .unwrap();
    let other_condition_false = json!({"status": {"conditions": [{"type": "example.com/other",
        "status": "False", "lastTransitionTime": "2026-12-05T00:00:01Z"}]}});
    match status(other_condition_false).await {
        Err(kube::Error::Api(status)) => assert!(
            status.message.contains("lanepool changes no Pod status"),
            "{status:?}"
        ),
        other => panic!("another's condition: expected a refusal, got {other:?}"),
    }
    let gate_false = json!({"status": {"conditions": [{"type": "lanepool.dev/takeover",
        "status": "False", "lastTransitionTime": "2026-12-05T00:00:02Z"}]}});
    status(gate_false)
        .await
        .expect("the takeover condition changes beside another's");

    // Deployments and Secrets: the operator writes only its pools'.
    only_its_pools_deployments(
        &operator_client,
        &admin,
        &pools,
        &elsewhere,
        release,
        namespaced,
    )
    .await;
    // With every policy in force, the operator still writes its own pool's: a Deployment of the
    // pool deleted is created again.
    deployments
        .delete("jobs-shared", &DeleteParams::default())
        .await
        .unwrap();
    until(40, "jobs-shared created again by the operator", || async {
        replicas("jobs-shared").await == Some(9)
    })
    .await;

    only_its_pools_credentials(&operator_client, &admin, &pools, release).await;

    // The operator's own writes pass every policy: once the pool's workers serve a `metrics`
    // port, it creates the pool's credential and updates both Deployments to mount it.
    let mut template =
        serde_json::to_value(&lanepools.get("jobs").await.unwrap().spec.template).unwrap();
    template["spec"]["containers"][0]["ports"] =
        json!([{"name": "metrics", "containerPort": 9100, "protocol": "TCP"}]);
    lanepools
        .patch(
            "jobs",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"template": template}})),
        )
        .await
        .unwrap();
    let jobs_uid = lanepools.get("jobs").await.unwrap().uid().unwrap();
    let admin_secrets = Api::<Secret>::namespaced(admin.clone(), &pools);
    until(
        40,
        "jobs-worker-credential, written by the operator",
        || async {
            admin_secrets
                .get_opt("jobs-worker-credential")
                .await
                .unwrap()
                .is_some()
        },
    )
    .await;
    let written = admin_secrets.get("jobs-worker-credential").await.unwrap();
    assert_eq!(written.type_.as_deref(), Some("Opaque"));
    assert_eq!(
        written
            .labels()
            .get("lanepool.dev/pool")
            .map(String::as_str),
        Some("jobs")
    );
    let owner = written.owner_references().first().cloned().unwrap();
    assert_eq!(
        (owner.kind.as_str(), owner.uid.as_str(), owner.controller),
        ("LanePool", jobs_uid.as_str(), Some(true))
    );
    for name in ["jobs-urgent-reserved", "jobs-shared"] {
        until(40, &format!("{name} mounts the credential"), || async {
            deployments
                .get(name)
                .await
                .unwrap()
                .spec
                .and_then(|spec| spec.template.spec)
                .is_some_and(|pod| {
                    pod.volumes.unwrap_or_default().iter().any(|v| {
                        v.secret.as_ref().and_then(|s| s.secret_name.as_deref())
                            == Some("jobs-worker-credential")
                    })
                })
        })
        .await;
    }

    // Clean up: stop the operator; delete the pool so that no later operator reconciles it.
    assert!(
        operator.stop(Duration::from_secs(10)).await,
        "the controller stops"
    );
    lanepools
        .delete("jobs", &DeleteParams::default())
        .await
        .unwrap();
    let (ok, stdout, stderr) = helm(&[
        "uninstall",
        release,
        "--namespace",
        &system,
        "--kubeconfig",
        &kubeconfig,
    ]);
    assert!(ok, "helm uninstall:\n{stdout}\n{stderr}");
    drop(prometheus);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn installed_for_one_namespace_its_role_is_enough_and_no_more() {
    install_and_size_a_pool("lanepool", true).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn installed_cluster_wide_its_cluster_role_is_enough_and_no_more() {
    // A release name of its own: ClusterRoles are not namespaced.
    install_and_size_a_pool("lanepool-cluster-wide", false).await;
}

// ---- NetworkPolicies, as the API server takes them ----

/// The example NetworkPolicy for a pool's workers and the chart's own, with peers of every kind
/// its values take, are valid NetworkPolicies: the API server takes them by server-side apply
/// and stores them as written. No network plugin here enforces them; what they select is
/// checked against the chart's labels.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_worker_and_operator_network_policies_apply_server_side() {
    let plane = testenv::shared().expect("the control plane starts");
    let admin = plane.client().await.unwrap();
    let namespace = plane.namespace(&admin, "netpol").await.unwrap();
    let policies = Api::<NetworkPolicy>::namespaced(admin.clone(), &namespace);
    let apply = PatchParams::apply("lanepool-chart-test");
    let stored_as_written = |stored: NetworkPolicy, written: &Value, what: &str| {
        assert_eq!(
            serde_json::to_value(stored.spec).unwrap(),
            written["spec"],
            "{what}: stored as written"
        );
    };

    let example: Value = serde_yaml::from_str(
        &std::fs::read_to_string(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/examples/networkpolicy-workers.yaml"
        ))
        .unwrap(),
    )
    .unwrap();
    let stored = policies
        .patch("jobs-workers", &apply, &Patch::Apply(&example))
        .await
        .expect("the API server takes examples/networkpolicy-workers.yaml");
    stored_as_written(stored, &example, "the example");
    // It selects the pool's workers and lets in, on their port named metrics, the chart's
    // operator Pods in the namespace the chart's README installs it in, and Prometheus.
    let spec = &example["spec"];
    assert_eq!(
        spec["podSelector"],
        json!({"matchLabels": {"lanepool.dev/pool": "jobs"}})
    );
    assert_eq!(spec["policyTypes"], json!(["Ingress"]));
    let rules = spec["ingress"].as_array().unwrap();
    assert_eq!(rules.len(), 1);
    assert_eq!(
        rules[0]["ports"],
        json!([{"port": "metrics", "protocol": "TCP"}])
    );
    let peers = rules[0]["from"].as_array().unwrap();
    assert_eq!(peers.len(), 2, "the operator and Prometheus: {peers:?}");
    let documents = template(&[]).unwrap();
    let operator_pod_labels =
        &of_kind(&documents, "Deployment")[0]["spec"]["template"]["metadata"]["labels"];
    let operator = &peers[0];
    assert_eq!(
        operator["namespaceSelector"],
        json!({"matchLabels": {"kubernetes.io/metadata.name": "lanepool-system"}})
    );
    let selected = operator["podSelector"]["matchLabels"].as_object().unwrap();
    assert!(!selected.is_empty());
    for (label, value) in selected {
        assert_eq!(
            &operator_pod_labels[label], value,
            "the example's {label} selects the chart's operator Pods ({operator_pod_labels})"
        );
    }
    assert_eq!(
        peers[1],
        json!({"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "monitoring"}}})
    );

    // The chart's, with a peer of each kind (an ipBlock with an exception, selectors by label
    // and by expression) and a list of namespaces watched.
    let documents = template(&[
        "networkPolicy.enabled=true",
        "watchNamespaces={team-a,team-b}",
        "networkPolicy.metricsFrom[0].ipBlock.cidr=10.1.0.0/16",
        "networkPolicy.metricsFrom[0].ipBlock.except={10.1.2.0/24}",
        "networkPolicy.metricsFrom[1].podSelector.matchExpressions[0].key=app",
        "networkPolicy.metricsFrom[1].podSelector.matchExpressions[0].operator=In",
        "networkPolicy.metricsFrom[1].podSelector.matchExpressions[0].values={prometheus,vmagent}",
        "networkPolicy.apiServer.cidrs={192.168.10.4/32,fd00::4/128}",
        "networkPolicy.dns.to[0].namespaceSelector.matchLabels.kubernetes\\.io/metadata\\.name=kube-system",
        "networkPolicy.dns.to[0].podSelector.matchLabels.k8s-app=kube-dns",
    ])
    .unwrap();
    let mut chart_policy = of_kind(&documents, "NetworkPolicy")[0].clone();
    chart_policy["metadata"]["namespace"] = json!(namespace);
    let name = chart_policy["metadata"]["name"]
        .as_str()
        .unwrap()
        .to_string();
    let stored = policies
        .patch(&name, &apply, &Patch::Apply(&chart_policy))
        .await
        .expect("the API server takes the chart's NetworkPolicy");
    stored_as_written(stored, &chart_policy, "the chart's");
    plane.delete_namespace(&admin, &namespace).await.unwrap();
}

// ---- The CRD as a template of the chart ----

/// The chart owns the CRD: `helm install` takes over the one in the API server, `helm upgrade`
/// with a changed CRD changes it there, and `helm uninstall` leaves it (crds.keep).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_chart_upgrade_that_changes_the_crd_changes_it_in_the_api_server() {
    let _one_at_a_time = INSTALLS.lock().await;
    let plane = testenv::shared().expect("the control plane starts");
    let admin = plane.client().await.unwrap();
    let system = plane.namespace(&admin, "lanepool-system").await.unwrap();
    let kubeconfig = plane.kubeconfig().display().to_string();
    let release = "lanepool-crds";
    let crds = Api::<CustomResourceDefinition>::all(admin.clone());
    let name = "lanepools.lanepool.dev";
    let short_names = |crd: &CustomResourceDefinition| crd.spec.names.short_names.clone();

    // The test environment created the CRD, as `kubectl apply -f crds/` would have: it is handed
    // to the release the way docs/operations.md tells, with Helm's ownership label and annotations.
    let adopt = json!({"metadata": {
        "labels": {"app.kubernetes.io/managed-by": "Helm"},
        "annotations": {"meta.helm.sh/release-name": release,
                        "meta.helm.sh/release-namespace": system},
    }});
    crds.patch(name, &PatchParams::default(), &Patch::Merge(&adopt))
        .await
        .unwrap();
    let (ok, stdout, stderr) = helm(&[
        "install",
        release,
        CHART,
        "--namespace",
        &system,
        "--kubeconfig",
        &kubeconfig,
    ]);
    assert!(ok, "helm install:\n{stdout}\n{stderr}");
    let installed = crds.get(name).await.unwrap();
    assert_eq!(short_names(&installed), Some(vec!["lp".to_string()]));
    assert_eq!(
        installed.metadata.labels.unwrap_or_default()["app.kubernetes.io/instance"],
        release,
        "the chart's labels: the release applied its CRD"
    );
    assert_eq!(
        installed.metadata.annotations.unwrap_or_default()["helm.sh/resource-policy"],
        "keep"
    );

    // The chart's next version changes the CRD: one more short name.
    let upgraded = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join(testenv::unique_name("chart"));
    let copied = Command::new("cp")
        .arg("-r")
        .arg(CHART)
        .arg(&upgraded)
        .status()
        .unwrap();
    assert!(copied.success(), "cp -r {CHART}");
    let crd_template = upgraded.join("templates/crd.yaml");
    let text = std::fs::read_to_string(&crd_template).unwrap();
    let changed = text.replacen(
        "    shortNames:\n    - lp\n",
        "    shortNames:\n    - lp\n    - lpnext\n",
        1,
    );
    assert_ne!(changed, text, "the CRD template lists the short name lp");
    std::fs::write(&crd_template, changed).unwrap();
    let upgraded_chart = upgraded.display().to_string();
    let (ok, stdout, stderr) = helm(&[
        "upgrade",
        release,
        &upgraded_chart,
        "--namespace",
        &system,
        "--kubeconfig",
        &kubeconfig,
    ]);
    assert!(ok, "helm upgrade:\n{stdout}\n{stderr}");
    let after_upgrade = crds.get(name).await.unwrap();
    assert_eq!(
        short_names(&after_upgrade),
        Some(vec!["lp".to_string(), "lpnext".to_string()]),
        "helm upgrade changed the CRD in the API server"
    );
    // LanePools are still served (the CRD was changed, not replaced).
    Api::<LanePool>::namespaced(admin.clone(), &system)
        .list(&ListParams::default())
        .await
        .expect("LanePools are served after the upgrade");

    let (ok, stdout, stderr) = helm(&[
        "uninstall",
        release,
        "--namespace",
        &system,
        "--kubeconfig",
        &kubeconfig,
    ]);
    assert!(ok, "helm uninstall:\n{stdout}\n{stderr}");
    assert!(
        stdout.contains("kept due to the resource policy") || stderr.contains("resource policy"),
        "helm says what it kept:\n{stdout}\n{stderr}"
    );
    let kept = crds
        .get_opt(name)
        .await
        .unwrap()
        .expect("crds.keep: the CRD outlives the release");
    assert_eq!(short_names(&kept), short_names(&after_upgrade));

    // The other tests' CRD again, as the test environment installed it.
    let mut pristine = lanepool_crd();
    pristine.metadata.resource_version = kept.metadata.resource_version;
    crds.replace(name, &PostParams::default(), &pristine)
        .await
        .unwrap();
    let _ = std::fs::remove_dir_all(&upgraded);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_chart_rules_load_into_prometheus_and_an_outage_alert_fires_from_the_operator() {
    let plane = testenv::shared().expect("the control plane starts");
    let client = plane.client().await.unwrap();
    let namespace = plane.namespace(&client, "alert").await.unwrap();
    // Nothing listens on port 9: every measurement of every pool fails.
    let operator = InProcessOperator::start(
        client.clone(),
        vec![namespace.clone()],
        "http://127.0.0.1:9".into(),
    );
    let metrics = operator.metrics();
    let target = testenv::serve_metrics(move || metrics.render()).unwrap();
    // A static target has no namespace label: the operator's own series are told by its address.
    let selector = format!("prometheusRule.selector=instance=\"{target}\"");
    let documents = template(&[
        "prometheusRule.enabled=true",
        "prometheusRule.metricsFailedIntervals=2",
        "prometheusRule.notReadyFor=2s",
        &selector,
    ])
    .unwrap();
    let rules = json!({ "groups": of_kind(&documents, "PrometheusRule")[0]["spec"]["groups"] });
    // A scrape job of the user's own, not the chart's ServiceMonitor's "<release>-metrics".
    let prometheus = TestPrometheus::start_with_rules(
        "my-own-scrape",
        &[target],
        &serde_yaml::to_string(&rules).unwrap(),
    )
    .unwrap();
    let addr: std::net::SocketAddr = prometheus
        .url()
        .trim_start_matches("http://")
        .parse()
        .unwrap();

    let mut pool: LanePool =
        serde_yaml::from_str(include_str!("fixtures/formula-pool.yaml")).unwrap();
    pool.spec.interval = lanepool::duration::KubeDuration::new("5s");
    pool.spec.prometheus = None;
    // A second pool that cannot be Ready: it names a Secret that does not exist.
    let mut unready = pool.clone();
    unready.metadata.name = Some("unready".into());
    unready.spec.prometheus = Some(
        serde_json::from_value(json!({
            "url": "https://127.0.0.1:9",
            "bearerTokenSecret": {"name": "missing", "key": "token"},
        }))
        .unwrap(),
    );
    let lanepools = Api::<LanePool>::namespaced(client.clone(), &namespace);
    for pool in [&pool, &unready] {
        lanepools
            .create(&PostParams::default(), pool)
            .await
            .unwrap();
    }

    let firing = move |name: &'static str| {
        let (_, body) = testenv::http_get(addr, "/api/v1/alerts").unwrap_or_default();
        let alerts: Value = serde_json::from_str(&body).unwrap_or_default();
        alerts["data"]["alerts"]
            .as_array()
            .into_iter()
            .flatten()
            .find(|a| a["labels"]["alertname"] == name && a["state"] == "firing")
            .cloned()
    };
    let ns = namespace.clone();
    until(60, "LanePoolMetricsUnavailable firing", || {
        let ns = ns.clone();
        async move {
            firing("LanePoolMetricsUnavailable")
                .is_some_and(|a| a["labels"]["namespace"] == ns.as_str())
        }
    })
    .await;
    // The operator's Ready=False, through its condition metric, fires the alert on that pool.
    let ns = namespace.clone();
    until(60, "LanePoolNotReady firing", || {
        let ns = ns.clone();
        async move {
            firing("LanePoolNotReady").is_some_and(|a| {
                a["labels"]["namespace"] == ns.as_str() && a["labels"]["pool"] == "unready"
            })
        }
    })
    .await;
    let not_ready = firing("LanePoolNotReady").unwrap();
    assert!(
        not_ready["annotations"]["runbook_url"]
            .as_str()
            .is_some_and(|url| url.ends_with("/docs/operations.md#lanepoolnotready")),
        "{not_ready}"
    );
    let alert = firing("LanePoolMetricsUnavailable").unwrap();
    assert_eq!(alert["labels"]["pool"], "jobs", "{alert}");
    assert!(
        alert["annotations"]["description"]
            .as_str()
            .unwrap_or_default()
            .contains("onMetricsUnavailable"),
        "{alert}"
    );
    eprintln!("firing: {alert}");

    // Every rule of the chart loaded and evaluated without error against live series.
    let (_, body) = testenv::http_get(addr, "/api/v1/rules").unwrap();
    let loaded: Value = serde_json::from_str(&body).unwrap();
    let rules: Vec<&Value> = loaded["data"]["groups"]
        .as_array()
        .unwrap()
        .iter()
        .flat_map(|g| g["rules"].as_array().unwrap())
        .collect();
    assert_eq!(rules.len(), 9, "{body}");
    for rule in &rules {
        assert_eq!(rule["health"], "ok", "{rule}");
    }
    // The operator is scraped, under a job name the chart never heard of: it is not down.
    let down = rules
        .iter()
        .find(|rule| rule["name"] == "LanePoolOperatorDown")
        .unwrap();
    assert_eq!(down["state"], "inactive", "{down}");
}
