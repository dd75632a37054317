//! How a run is shown: the JSON object scripts rely on (its shape is an interface: urgent
//! submitted/completed/p50_ms/p99_ms, batch completed/throughput_per_s, pods worker_seconds and
//! cut_short over the whole run, and reserve for autoscaled runs) and the same figures as text for people.

use serde::Serialize;

use crate::duration::trim;
use crate::simulate::engine::outcome::{Outcome, Summary};
use crate::simulate::engine::scenario::{Nanos, Scenario};

#[derive(Serialize)]
struct Json {
    urgent: UrgentJson,
    batch: BatchJson,
    pods: PodsJson,
    #[serde(skip_serializing_if = "Option::is_none")]
    reserve: Option<ReserveJson>,
}

/// What the Pods cost over the whole run, and the jobs their deletion cut short.
#[derive(Serialize)]
struct PodsJson {
    worker_seconds: f64,
    cut_short: u64,
}

#[derive(Serialize)]
struct UrgentJson {
    submitted: u64,
    completed: u64,
    p50_ms: Option<f64>,
    p99_ms: Option<f64>,
}

#[derive(Serialize)]
struct BatchJson {
    completed: u64,
    throughput_per_s: f64,
}

#[derive(Serialize)]
struct ReserveJson {
    mean: f64,
    changes: usize,
}

/// Microsecond precision is all a millisecond figure needs.
fn round(value: f64) -> f64 {
    (value * 1000.0).round() / 1000.0
}

/// The run's figures from `from` on (`--warm-up`).
pub fn json(outcome: &Outcome, from: Nanos) -> String {
    let s = outcome.summary_from(from);
    let object = Json {
        urgent: UrgentJson {
            submitted: s.urgent_submitted,
            completed: s.urgent_completed,
            p50_ms: s.p50_ms.map(round),
            p99_ms: s.p99_ms.map(round),
        },
        batch: BatchJson {
            completed: s.batch_completed,
            throughput_per_s: round(s.batch_per_second),
        },
        pods: PodsJson {
            worker_seconds: round(outcome.worker_seconds),
            cut_short: outcome.cut_short,
        },
        reserve: outcome.autoscaled.then(|| ReserveJson {
            mean: round(outcome.mean_reserve(from, outcome.duration)),
            changes: outcome.reserve_changes_from(from),
        }),
    };
    serde_json::to_string(&object).unwrap_or_default()
}

/// "20.2 / 21.4 ms", or "none done".
pub fn latency(summary: &Summary) -> String {
    match (summary.p50_ms, summary.p99_ms) {
        (Some(p50), Some(p99)) => format!("{} / {} ms", trim(p50), trim(p99)),
        _ => "none done".to_string(),
    }
}

pub fn text(scenario: &Scenario, outcome: &Outcome, from: Nanos) -> String {
    let s = outcome.summary_from(from);
    let counted = if from > 0 {
        format!(", counted after {} s", trim(from as f64 / 1e9))
    } else {
        String::new()
    };
    let mut lines = vec![
        format!(
            "{} workers, {}{}, {} s{counted}",
            scenario.workers,
            scenario.arrangement.name(),
            if scenario.keda.is_some() {
                " sized by KEDA"
            } else {
                ""
            },
            trim(outcome.duration as f64 / 1e9)
        ),
        format!(
            "urgent: {} of {} done, p50 / p99 {}",
            s.urgent_completed,
            s.urgent_submitted,
            latency(&s)
        ),
        format!(
            "batch:  {} done, {} jobs/s",
            s.batch_completed,
            trim(s.batch_per_second)
        ),
    ];
    lines.push(format!(
        "pods:   {} worker-seconds over the run (mean {}), {} jobs cut short",
        trim(outcome.worker_seconds.round()),
        trim(
            (outcome.worker_seconds / (outcome.duration as f64 / 1e9).max(1e-9) * 100.0).round()
                / 100.0
        ),
        outcome.cut_short
    ));
    if outcome.autoscaled {
        lines.push(format!(
            "reserve: mean {}, {} changes",
            trim(outcome.mean_reserve(from, outcome.duration)),
            outcome.reserve_changes_from(from)
        ));
    }
    lines.join("\n")
}
