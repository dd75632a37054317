//! Idle workers go first: just before a Deployment shrinks, its Pods get the annotation
//! `controller.kubernetes.io/pod-deletion-cost` from what each worker is doing, so the ReplicaSet
//! controller removes idle workers first, then those whose jobs should end soonest. Each Pod is
//! asked itself, at its container port named `metrics` (the freshest answer: a scrape is up to a
//! scrape interval old, longer than many jobs); a Pod that does not answer in time is read from
//! the pool's Prometheus instead. Both give the workers' `lanepool_worker_busy` gauge (by `pod`
//! and the `lane` of the job in hand) and `lanepool_worker_job_started_timestamp_seconds`. Only
//! Pods of a Deployment about to shrink are read or written, and only those whose cost changes;
//! a failure here never holds a shrink back. Workers drained before the shrink (`drain.rs`) cost
//! least of all.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::time::{SystemTime, UNIX_EPOCH};

use k8s_openapi::api::core::v1::Pod;
use kube::ResourceExt;
use tracing::{info, warn};

use super::context::Context;
use super::pods::PoolPods;
use crate::api::LanePool;
use crate::prometheus::Connection;

/// The annotation the ReplicaSet controller reads: of two Pods otherwise alike (both running
/// and ready), the one with the lower cost is deleted first.
pub const DELETION_COST: &str = "controller.kubernetes.io/pod-deletion-cost";
/// The gauge a worker sets to 1 while it runs a job and to 0 while it waits for one.
pub const BUSY_METRIC: &str = "lanepool_worker_busy";
/// The gauge a worker sets, while it runs a job, to when that job started (Unix seconds).
pub const STARTED_METRIC: &str = "lanepool_worker_job_started_timestamp_seconds";
/// A worker running a job of a lane whose job time is not known (or that names no lane); one
/// on a lane with a measured mean job time costs 1 + the time its job has left in milliseconds.
pub const BUSY_COST: i32 = 1000;
/// The highest cost: a lane's jobs of 11 days and more all cost the same.
const MAX_COST: i32 = 1_000_000_000;
/// A worker waiting for a job, or one whose work is not known (just started, not scraped).
pub const IDLE_COST: i32 = 0;
/// A worker drained for this shrink: idle, and taking no new job, so it goes before any other.
pub const DRAINED_COST: i32 = -1;
/// The container port a worker serves its gauges on, as Prometheus scrapes them.
pub const METRICS_PORT: &str = "metrics";
/// The most busy and job-start series kept of one worker's answer.
const MOST_SERIES: usize = 64;

/// Most Pod patches in flight at once for one Deployment.
pub(super) const PATCHES_IN_FLIGHT: usize = 8;

/// What a worker reports: idle, or busy with a job of a lane (`None`: it names none) that
/// started at `started` (Unix seconds; `None`: not reported).
#[derive(Clone, Debug, PartialEq)]
pub enum Work {
    Idle,
    Busy {
        lane: Option<String>,
        started: Option<f64>,
    },
}

/// One series of an answer: its labels and value.
pub type Sample = (BTreeMap<String, String>, f64);

/// Each worker's work, by pod name, from the busy gauge's series and the job-start gauge's. A
/// series without a `pod` label, or a value that is not finite, says nothing; of two busy
/// series of one pod (the lane changed between scrapes), a busy one wins; a start time joins
/// the busy series of its pod and lane (the latest, if several).
pub fn busy_pods(busy: &[Sample], started: &[Sample]) -> HashMap<String, Work> {
    let mut work: HashMap<String, Work> = HashMap::new();
    for (labels, value) in busy.iter().filter(|(_, value)| value.is_finite()) {
        let Some(pod) = labels.get("pod") else {
            continue;
        };
        let this = if *value > 0.0 {
            Work::Busy {
                lane: lane_of(labels),
                started: None,
            }
        } else {
            Work::Idle
        };
        if this != Work::Idle || !work.contains_key(pod) {
            work.insert(pod.clone(), this);
        }
    }
    for (labels, value) in started.iter().filter(|(_, value)| value.is_finite()) {
        let Some(Work::Busy { lane, started }) = labels.get("pod").and_then(|p| work.get_mut(p))
        else {
            continue;
        };
        if *lane == lane_of(labels) && started.is_none_or(|s| s < *value) {
            *started = Some(*value);
        }
    }
    work
}

fn lane_of(labels: &BTreeMap<String, String>) -> Option<String> {
    labels.get("lane").filter(|l| !l.is_empty()).cloned()
}

/// How long a busy worker's job should still run, in seconds: its lane's mean job time less
/// the time since it started (0 once past the mean), or the whole mean when its start is not
/// known. `None`: idle or unknown, or its lane's job time is not known.
pub fn expected_left(
    work: Option<&Work>,
    job_seconds: &BTreeMap<String, f64>,
    now: f64,
) -> Option<f64> {
    let Some(Work::Busy { lane, started }) = work else {
        return None;
    };
    let mean = lane
        .as_ref()
        .and_then(|lane| job_seconds.get(lane))
        .filter(|s| s.is_finite() && **s >= 0.0)?;
    let ran = started
        .filter(|s| s.is_finite())
        .map_or(0.0, |s| (now - s).max(0.0));
    Some((mean - ran).max(0.0))
}

/// A worker's deletion cost: [`IDLE_COST`] idle or unknown; busy, 1 + the time its job should
/// still run in milliseconds (see [`expected_left`]: a worker 20 ms from done goes before one
/// 3 s from done), or [`BUSY_COST`] when its lane's job time is not known.
pub fn cost(work: Option<&Work>, job_seconds: &BTreeMap<String, f64>, now: f64) -> i32 {
    match work {
        None | Some(Work::Idle) => IDLE_COST,
        Some(Work::Busy { .. }) => expected_left(work, job_seconds, now)
            .map_or(BUSY_COST, |left| {
                (1.0 + left * 1000.0).min(f64::from(MAX_COST)) as i32
            }),
    }
}

/// The Pods whose annotation must change, with their new cost (see [`cost`]; [`DRAINED_COST`]
/// for the `drained` ones). `pods` are (name, the annotation now).
pub fn cost_changes(
    pods: &[(String, Option<String>)],
    work: &HashMap<String, Work>,
    job_seconds: &BTreeMap<String, f64>,
    drained: &BTreeSet<String>,
    now: f64,
) -> Vec<(String, i32)> {
    pods.iter()
        .filter_map(|(name, current)| {
            let cost = if drained.contains(name) {
                DRAINED_COST
            } else {
                cost(work.get(name), job_seconds, now)
            };
            let unchanged = current.as_deref().and_then(|v| v.parse::<i32>().ok()) == Some(cost)
                || (current.is_none() && cost == IDLE_COST);
            (!unchanged).then(|| (name.clone(), cost))
        })
        .collect()
}

/// The PromQL for a pool's busy gauges, by pod and lane.
pub fn busy_query(namespace: &str, pool: &str) -> String {
    format!(
        "max by (pod, lane) ({BUSY_METRIC}{{namespace={:?},pool={:?}}})",
        namespace, pool
    )
}

/// The PromQL for a pool's job start times, by pod and lane.
pub fn started_query(namespace: &str, pool: &str) -> String {
    format!(
        "max by (pod, lane) ({STARTED_METRIC}{{namespace={:?},pool={:?}}})",
        namespace, pool
    )
}

/// Where a Pod serves its gauges: `ip:port` of its container port named [`METRICS_PORT`].
pub fn metrics_address(pod: &Pod) -> Option<String> {
    let ip = pod
        .status
        .as_ref()?
        .pod_ip
        .as_deref()
        .filter(|ip| !ip.is_empty())?;
    let port = pod
        .spec
        .as_ref()?
        .containers
        .iter()
        .flat_map(|c| c.ports.iter().flatten())
        .find(|p| p.name.as_deref() == Some(METRICS_PORT))?
        .container_port;
    Some(if ip.contains(':') {
        format!("[{ip}]:{port}")
    } else {
        format!("{ip}:{port}")
    })
}

/// Every sample of a `/metrics` text (the Prometheus text format): name, labels and value.
pub(super) fn sample_lines(
    text: &str,
) -> impl Iterator<Item = (&str, BTreeMap<String, String>, f64)> {
    text.lines()
        .map(str::trim)
        .filter(|line| !line.starts_with('#'))
        .filter_map(parse_sample_line)
        .filter_map(|(name, labels, rest)| {
            let value = rest.split_whitespace().next()?.parse::<f64>().ok()?;
            Some((name, labels, value))
        })
}

/// The values of `metric`'s series in a worker's `/metrics` text (the Prometheus text format).
pub fn gauge_values(text: &str, metric: &str) -> Vec<f64> {
    sample_lines(text)
        .filter(|(name, _, _)| *name == metric)
        .map(|(_, _, value)| value)
        .collect()
}

/// The busy and job-start series of a worker's `/metrics` text (the Prometheus text format),
/// each labelled `pod` as Prometheus would label them.
/// An answer with more than [`MOST_SERIES`] of them says nothing (a worker runs one job at a
/// time: a few series are all it has).
pub fn parse_gauges(text: &str, pod: &str) -> (Vec<Sample>, Vec<Sample>) {
    let (mut busy, mut started) = (Vec::new(), Vec::new());
    for (name, mut labels, value) in sample_lines(text) {
        labels.insert("pod".into(), pod.into());
        match name {
            BUSY_METRIC => busy.push((labels, value)),
            STARTED_METRIC => started.push((labels, value)),
            _ => continue,
        }
        if busy.len() + started.len() > MOST_SERIES {
            return Default::default();
        }
    }
    (busy, started)
}

/// `name{label="value",…} rest` → (name, labels, rest); `None` if it is not such a line.
fn parse_sample_line(line: &str) -> Option<(&str, BTreeMap<String, String>, &str)> {
    let end = line.find(|c: char| c == '{' || c.is_whitespace())?;
    let (name, mut rest) = line.split_at(end);
    let mut labels = BTreeMap::new();
    if let Some(inner) = rest.strip_prefix('{') {
        let mut chars = inner.char_indices().peekable();
        loop {
            // A label name, `=`, a quoted value with \\ \" \n escapes; then `,` or `}`.
            while chars
                .next_if(|(_, c)| *c == ',' || c.is_whitespace())
                .is_some()
            {}
            let (start, c) = chars.next()?;
            if c == '}' {
                rest = &inner[start + 1..];
                break;
            }
            let mut key = String::from(c);
            while let Some((_, c)) = chars.next_if(|(_, c)| *c != '=') {
                key.push(c);
            }
            chars.next()?; // '='
            if chars.next()?.1 != '"' {
                return None;
            }
            let mut value = String::new();
            loop {
                match chars.next()?.1 {
                    '"' => break,
                    '\\' => match chars.next()?.1 {
                        'n' => value.push('\n'),
                        other => value.push(other),
                    },
                    other => value.push(other),
                }
            }
            labels.insert(key.trim().to_string(), value);
        }
    }
    Some((name, labels, rest))
}

/// Asks each Pod that has a metrics port for its gauges; the answers, labelled by pod name.
async fn ask_workers(workers: &PoolPods<'_>, pods: &[&Pod]) -> (Vec<Sample>, Vec<Sample>) {
    workers.metrics_texts(pods).await.into_iter().fold(
        Default::default(),
        |(mut busy, mut started), (name, text)| {
            let (b, s) = parse_gauges(&text, &name);
            busy.extend(b);
            started.extend(s);
            (busy, started)
        },
    )
}

/// The pool's gauges from Prometheus (`None`: not reachable).
async fn ask_prometheus(
    ctx: &Context,
    connection: Option<&Connection>,
    namespace: &str,
    pool: &str,
    deployment: &str,
) -> Option<(Vec<Sample>, Vec<Sample>)> {
    let connection = connection?;
    let client = ctx
        .prometheus
        .get(connection)
        .map_err(|error| warn!(deployment, %error, "Prometheus not asked for busy workers"))
        .ok()?;
    let (busy_promql, started_promql) =
        (busy_query(namespace, pool), started_query(namespace, pool));
    let (busy, started) = futures::join!(
        client.query_labelled(&busy_promql),
        client.query_labelled(&started_promql),
    );
    let busy = busy
        .map_err(|error| warn!(deployment, %error, "Prometheus not asked for busy workers"))
        .ok()?;
    // Workers that export no start times are ranked by their lanes' whole job times.
    Some((busy, started.unwrap_or_default()))
}

/// What a Deployment's workers are doing, read just now.
pub(super) struct Reading {
    pub(super) work: HashMap<String, Work>,
    /// Every lane's mean job time.
    pub(super) job_seconds: BTreeMap<String, f64>,
    /// Unix seconds when read.
    pub(super) now: f64,
    /// How many workers answered themselves.
    pub(super) answered: usize,
}

impl Reading {
    /// A Pod's cost (see [`cost`]).
    pub(super) fn cost(&self, pod: &str) -> i32 {
        cost(self.work.get(pod), &self.job_seconds, self.now)
    }
}

/// Asks each of `live` (and Prometheus for those that do not answer) what it is doing; `None`
/// when no one could say.
pub(super) async fn read_work(
    pool: &LanePool,
    ctx: &Context,
    workers: &PoolPods<'_>,
    connection: Option<&Connection>,
    deployment: &str,
    live: &[&Pod],
) -> Option<Reading> {
    let namespace = pool.namespace().unwrap_or_default();
    // Each worker asked now, and Prometheus (a scrape old) only for those that did not answer.
    let (busy, job_started) = ask_workers(workers, live).await;
    let mut work = busy_pods(&busy, &job_started);
    let answered = work.len();
    if live.iter().any(|p| !work.contains_key(&p.name_any())) {
        match ask_prometheus(ctx, connection, &namespace, &pool.name_any(), deployment).await {
            Some((busy, job_started)) => {
                for (pod, scraped) in busy_pods(&busy, &job_started) {
                    work.entry(pod).or_insert(scraped);
                }
            }
            None if answered == 0 => return None,
            None => {}
        }
    }
    // Every lane's mean job time, from the shared job-time query the reserve lanes already ask.
    let job_seconds =
        super::grace::served_job_seconds(pool, ctx, connection, &Default::default()).await;
    let now = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap_or_default()
        .as_secs_f64();
    Some(Reading {
        work,
        job_seconds,
        now,
        answered,
    })
}

/// Ranks the workers of `deployment` (the Pods of `selector` it controls) for deletion, the
/// `drained` ones first of all: no other Pod is asked or annotated. Logs and gives up on any failure: the shrink goes ahead either way, as it would
/// without this step.
pub(super) async fn rank_before_shrink(
    pool: &LanePool,
    ctx: &Context,
    workers: &PoolPods<'_>,
    connection: Option<&Connection>,
    deployment: &str,
    selector: &str,
    drained: &BTreeSet<String>,
) {
    let started = std::time::Instant::now();
    let listed = match workers.workers_of(deployment, selector).await {
        Ok(listed) => listed,
        Err(error) => {
            warn!(deployment, %error, "Pods not ranked before the shrink");
            return;
        }
    };
    let live: Vec<&Pod> = listed.iter().collect();
    if live.is_empty() {
        return;
    }
    let Some(reading) = read_work(pool, ctx, workers, connection, deployment, &live).await else {
        warn!(
            deployment,
            "Pods not ranked before the shrink: no worker answered"
        );
        return;
    };
    let Reading {
        work,
        job_seconds,
        now,
        answered,
    } = &reading;
    let names: Vec<(String, Option<String>)> = live
        .iter()
        .map(|p| (p.name_any(), p.annotations().get(DELETION_COST).cloned()))
        .collect();
    let changes = cost_changes(&names, work, job_seconds, drained, *now);
    let busy_count = names
        .iter()
        .filter(|(name, _)| matches!(work.get(name), Some(Work::Busy { .. })))
        .count();
    let grace = super::grace::grace_seconds(pool) as f64;
    let ending = names
        .iter()
        .filter(|(name, _)| {
            expected_left(work.get(name), job_seconds, *now).is_some_and(|left| left <= grace)
        })
        .count();
    let patched = workers.set_deletion_costs(changes).await;
    info!(
        deployment,
        pods = live.len(),
        busy = busy_count,
        patched,
        ms = started.elapsed().as_millis() as u64,
        answered,
        ending_within_grace = ending,
        drained = drained.len(),
        "Pods ranked before the shrink: idle workers go first"
    );
}

#[cfg(test)]
mod tests {
    use super::*;

    fn series(pod: &str, lane: &str, value: f64) -> Sample {
        let mut labels = BTreeMap::from([("pod".to_string(), pod.to_string())]);
        if !lane.is_empty() {
            labels.insert("lane".into(), lane.into());
        }
        (labels, value)
    }

    const NOW: f64 = 1_800_000_000.0;

    #[test]
    fn idle_workers_cost_least_and_busy_ones_by_their_lanes_job_time() {
        let work = busy_pods(
            &[
                series("batch", "batch", 1.0),
                series("urgent", "urgent", 1.0),
                series("nameless", "", 1.0),
                series("idle", "", 0.0),
                series("nan", "", f64::NAN),
                // The lane changed between scrapes: the busy series wins.
                series("moved", "", 0.0),
                series("moved", "batch", 1.0),
            ],
            &[],
        );
        assert_eq!(work.get("nan"), None, "NaN says nothing");
        let times = BTreeMap::from([("urgent".to_string(), 0.02), ("batch".to_string(), 3.0)]);
        let cost_of = |pod: &str| cost(work.get(pod), &times, NOW);
        assert_eq!(cost_of("idle"), IDLE_COST);
        assert_eq!(cost_of("nan"), IDLE_COST);
        assert_eq!(cost_of("urgent"), 21);
        assert_eq!(cost_of("batch"), 3001);
        assert_eq!(cost_of("moved"), 3001);
        assert_eq!(cost_of("nameless"), BUSY_COST);
        assert!(IDLE_COST < cost_of("urgent") && cost_of("urgent") < cost_of("batch"));
    }

    #[test]
    fn busy_workers_go_by_the_time_their_jobs_have_left() {
        let work = busy_pods(
            &[
                series("fresh", "batch", 1.0),
                series("halfway", "batch", 1.0),
                series("overdue", "batch", 1.0),
                series("unstarted", "batch", 1.0),
                series("other-lane", "batch", 1.0),
                series("idle", "", 0.0),
            ],
            &[
                series("fresh", "batch", NOW - 0.5),
                // Two start times (a scrape before and after a new job): the latest counts.
                series("halfway", "batch", NOW - 2.5),
                series("halfway", "batch", NOW - 1.5),
                series("overdue", "batch", NOW - 7.0),
                // A start time of another lane's job belongs to another series.
                series("other-lane", "urgent", NOW - 2.9),
                // An idle worker's stale start time says nothing.
                series("idle", "batch", NOW - 2.9),
            ],
        );
        let times = BTreeMap::from([("batch".to_string(), 3.0)]);
        let left = |pod: &str| expected_left(work.get(pod), &times, NOW);
        assert_eq!(left("fresh"), Some(2.5));
        assert_eq!(left("halfway"), Some(1.5));
        assert_eq!(left("overdue"), Some(0.0));
        assert_eq!(left("unstarted"), Some(3.0));
        assert_eq!(left("other-lane"), Some(3.0));
        assert_eq!(left("idle"), None);
        let cost_of = |pod: &str| cost(work.get(pod), &times, NOW);
        assert_eq!(cost_of("overdue"), 1);
        assert_eq!(cost_of("halfway"), 1501);
        assert!(cost_of("idle") < cost_of("overdue"));
        assert!(cost_of("overdue") < cost_of("halfway"));
        assert!(cost_of("halfway") < cost_of("fresh"));
        assert!(cost_of("fresh") < cost_of("unstarted"));
        // A clock behind the worker's: the job has run no time, never a negative one.
        assert_eq!(
            expected_left(work.get("fresh"), &times, NOW - 60.0),
            Some(3.0)
        );
    }

    #[test]
    fn only_changed_costs_are_written() {
        let work = busy_pods(
            &[
                series("a", "", 1.0),
                series("b", "", 0.0),
                series("e", "", 0.0),
            ],
            &[],
        );
        let pods = [
            ("a".to_string(), None),                        // busy, unmarked: write
            ("b".to_string(), Some(BUSY_COST.to_string())), // idle now: lower it
            ("c".to_string(), None),                        // unknown, unmarked: leave
            ("d".to_string(), Some(BUSY_COST.to_string())), // gone from Prometheus: idle
            ("e".to_string(), Some("0".to_string())),       // idle and marked so: leave
        ];
        assert_eq!(
            cost_changes(&pods, &work, &BTreeMap::new(), &BTreeSet::new(), NOW),
            vec![
                ("a".to_string(), BUSY_COST),
                ("b".to_string(), IDLE_COST),
                ("d".to_string(), IDLE_COST)
            ]
        );
        // A drained worker goes before every idle one, even one not marked yet.
        let drained = BTreeSet::from(["c".to_string(), "e".to_string()]);
        assert_eq!(
            cost_changes(&pods, &work, &BTreeMap::new(), &drained, NOW),
            vec![
                ("a".to_string(), BUSY_COST),
                ("b".to_string(), IDLE_COST),
                ("c".to_string(), DRAINED_COST),
                ("d".to_string(), IDLE_COST),
                ("e".to_string(), DRAINED_COST)
            ]
        );
        const { assert!(DRAINED_COST < IDLE_COST) };
    }

    #[test]
    fn the_queries_name_the_pool_and_group_by_pod_and_lane() {
        assert_eq!(
            busy_query("team", "jobs"),
            r#"max by (pod, lane) (lanepool_worker_busy{namespace="team",pool="jobs"})"#
        );
        assert_eq!(
            started_query("team", "jobs"),
            r#"max by (pod, lane) (lanepool_worker_job_started_timestamp_seconds{namespace="team",pool="jobs"})"#
        );
    }

    #[test]
    fn a_workers_own_answer_is_read_as_prometheus_would_label_it() {
        let text = "# HELP lanepool_worker_busy 1 while the worker runs a job\n\
                    # TYPE lanepool_worker_busy gauge\n\
                    lanepool_worker_busy{lane=\"batch\"} 1\n\
                    lanepool_worker_job_started_timestamp_seconds{lane=\"batch\",note=\"a \\\"q\\\", b}\"} 1800000000.250 1700000000000\n\
                    lanepool_worker_busy_other 7\n\
                    lanepool_worker_busy{broken 1\n";
        let (busy, started) = parse_gauges(text, "jobs-shared-x");
        assert_eq!(busy, vec![series("jobs-shared-x", "batch", 1.0)]);
        let mut expected = series("jobs-shared-x", "batch", 1_800_000_000.25);
        expected.0.insert("note".into(), "a \"q\", b}".into());
        assert_eq!(started, vec![expected]);
        let (busy, started) = parse_gauges("lanepool_worker_busy 0\n", "idle");
        assert_eq!(busy, vec![series("idle", "", 0.0)]);
        assert!(started.is_empty());
        let work = busy_pods(&busy, &started);
        assert_eq!(work.get("idle"), Some(&Work::Idle));
        let many = "lanepool_worker_busy{lane=\"x\"} 1\n".repeat(MOST_SERIES + 1);
        assert_eq!(
            parse_gauges(&many, "p"),
            Default::default(),
            "too many series"
        );
    }

    #[test]
    fn a_pod_is_asked_at_its_metrics_port() {
        let pod = |ip: &str, port_name: &str| -> Pod {
            serde_json::from_value(serde_json::json!({
                "metadata": {"name": "p"},
                "spec": {"containers": [
                    {"name": "side", "ports": [{"name": "http", "containerPort": 8080}]},
                    {"name": "worker", "ports": [{"name": port_name, "containerPort": 9100}]},
                ]},
                "status": {"podIP": ip},
            }))
            .unwrap()
        };
        assert_eq!(
            metrics_address(&pod("10.1.2.3", "metrics")).as_deref(),
            Some("10.1.2.3:9100")
        );
        assert_eq!(
            metrics_address(&pod("fd00::5", "metrics")).as_deref(),
            Some("[fd00::5]:9100")
        );
        assert_eq!(metrics_address(&pod("10.1.2.3", "prom")), None);
        assert_eq!(metrics_address(&pod("", "metrics")), None);
    }
}
