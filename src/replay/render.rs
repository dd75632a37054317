//! How a replay is shown: one table in the guide's words, or one JSON object for scripts
//! (with the `lanepool simulate` flags that rerun any static row).

use serde_json::{Value, json};

use super::history::History;
use super::run::{Policy, Replay, Row, profile_text};
use crate::duration::{compact, trim};

/// What the replay was of, for the heading.
pub struct Heading<'a> {
    pub pool: &'a str,
    pub history: &'a History,
}

fn mean_and_peak(history: &History) -> (f64, f64) {
    let rates: Vec<f64> = history.rates.iter().flatten().copied().collect();
    let mean = rates.iter().sum::<f64>() / rates.len().max(1) as f64;
    (mean, rates.iter().copied().fold(0.0, f64::max))
}

fn ms(value: Option<f64>) -> String {
    value.map_or("—".into(), |v| format!("{} ms", trim(v)))
}

fn p99_text(row: &Row) -> String {
    if row.unfinished() > 0.01 {
        format!("∞ ({:.0} % unfinished)", row.unfinished() * 100.0)
    } else {
        ms(row.p99_ms)
    }
}

/// The `lanepool simulate` flags of the replay's runs, without `--reserved`.
pub fn simulate_flags(replay: &Replay) -> String {
    let base = &replay.base;
    format!(
        "--arrangement reserved-shared --urgent-ms {} --batch-ms {}..{} --handoff-ms {} --backlog {} --duration {}s --arrivals poisson --seed {} --urgent-profile {}",
        base.urgent_job as f64 / 1e6,
        base.batch_job.0 as f64 / 1e6,
        base.batch_job.1 as f64 / 1e6,
        base.handoff as f64 / 1e6,
        base.backlog,
        base.duration / 1_000_000_000,
        base.seed,
        profile_text(&base.profile)
    )
}

/// The workers of the static split with `reserved` workers.
pub fn static_workers(replay: &Replay, reserved: u32) -> u32 {
    replay
        .shared_replicas
        .map_or(replay.base.workers, |replicas| replicas + reserved)
}

pub fn text(heading: &Heading, replay: &Replay) -> String {
    let history = heading.history;
    let covered: usize = history.covered().iter().map(|(a, b)| b - a).sum();
    let mut lines = vec![format!(
        "lanepool replay {}, lane {}: {}, step {} ({} steps, {} with an arrival rate)",
        heading.pool,
        history.lane,
        history.describe((0, history.rates.len())),
        compact(std::time::Duration::from_secs(history.range.step)),
        history.rates.len(),
        covered
    )];
    for span in history.skipped() {
        lines.push(format!(
            "skipped {}: no arrival rate (Prometheus had no samples, or the lane did not exist yet)",
            history.describe(span)
        ));
    }
    let (mean, peak) = mean_and_peak(history);
    let base = &replay.base;
    lines.push(format!(
        "measured: arrival rate {}/s mean, {}/s peak; job time {} mean; batch job time {}",
        trim(mean),
        trim(peak),
        ms(Some(replay.job_ms)),
        history.batch_job_seconds.map_or_else(
            || "given by --batch-ms".to_string(),
            |s| format!("{} mean", ms(Some(s * 1e3)))
        )
    ));
    let pool = match replay.shared_replicas {
        Some(replicas) => format!("{replicas} shared workers plus the reserve"),
        None => format!("{} workers", base.workers),
    };
    lines.push(format!(
        "replayed: the covered steps end to end ({}), {pool}, Poisson arrivals at the measured rates (seed {}), batch jobs {}–{} ms always waiting; {} runs in {:.1} s",
        compact(std::time::Duration::from_nanos(base.duration)),
        base.seed,
        trim(base.batch_job.0 as f64 / 1e6),
        trim(base.batch_job.1 as f64 / 1e6),
        replay.rows.len() - super::run::TARGETS.len(),
        replay.simulated_in.as_secs_f64()
    ));
    lines.push(String::new());
    let header = [
        "policy",
        "urgent p99",
        "wait p99 / job time",
        "batch jobs/s",
        "reserve changes/h",
        "mean reserve",
        "worker-s",
        "of hindsight ref",
    ];
    let mut table: Vec<[String; 8]> = vec![header.map(String::from)];
    for row in &replay.rows {
        let changes = if row.reserve_changes_per_hour.is_nan() {
            "—".into()
        } else {
            trim(row.reserve_changes_per_hour)
        };
        table.push([
            row.policy.name(),
            p99_text(row),
            row.wait_over_job(replay.job_ms).map_or("—".into(), |w| {
                if w.is_finite() { trim(w) } else { "∞".into() }
            }),
            trim(row.batch_per_second),
            changes,
            trim(row.mean_reserve),
            format!("{:.0}", row.worker_seconds),
            row.share_of_hindsight
                .map_or("—".into(), |s| format!("{:.1} %", s * 100.0)),
        ]);
    }
    let widths: Vec<usize> = (0..8)
        .map(|c| {
            table
                .iter()
                .map(|r| r[c].chars().count())
                .max()
                .unwrap_or(0)
        })
        .collect();
    for row in &table {
        let cells: Vec<String> = row
            .iter()
            .enumerate()
            .map(|(c, cell)| {
                let pad = widths[c] - cell.chars().count();
                if c == 0 {
                    format!("{cell}{}", " ".repeat(pad))
                } else {
                    format!("{}{cell}", " ".repeat(pad))
                }
            })
            .collect();
        lines.push(cells.join("  ").trim_end().to_string());
    }
    lines.push(String::new());
    lines.push(format!("recommendation: {}", replay.recommendation.words));
    for field in &replay.recommendation.fields {
        lines.push(format!("  {field}"));
    }
    lines.push("Nothing was written to the cluster.".into());
    lines.join("\n")
}

/// Microsecond precision for milliseconds, thousandths for the rest: as `lanepool simulate
/// --output json` rounds them, so the two compare exactly.
fn round(value: f64) -> f64 {
    (value * 1000.0).round() / 1000.0
}

fn number(value: f64) -> Value {
    if value.is_finite() {
        json!(value)
    } else {
        Value::Null
    }
}

pub fn json(heading: &Heading, replay: &Replay) -> String {
    let history = heading.history;
    let at = |second: i64| {
        k8s_openapi::jiff::Timestamp::from_second(second)
            .map_or_else(|_| second.to_string(), |t| t.to_string())
    };
    let span = |(first, end): (usize, usize)| json!({"from": at(history.step_start(first)), "to": at(history.step_start(end))});
    let rows: Vec<Value> = replay
        .rows
        .iter()
        .map(|row| {
            let (kind, extra) = match &row.policy {
                Policy::Current => ("current", json!({})),
                Policy::Defaults => ("defaults", json!({})),
                Policy::LatencyTarget { millis } => {
                    ("latency_target", json!({"target_p99_ms": millis}))
                }
                Policy::Static { reserved } => (
                    "static",
                    json!({"reserved": reserved, "workers": static_workers(replay, *reserved)}),
                ),
                Policy::Hindsight { millis } => ("hindsight", json!({"target_p99_ms": millis})),
            };
            let hindsight = matches!(row.policy, Policy::Hindsight { .. });
            let mut value = json!({
                "policy": row.policy.name(),
                "kind": kind,
                "urgent": {
                    // The hindsight reference takes its jobs from the static splits.
                    "submitted": (!hindsight).then_some(row.urgent_submitted),
                    "completed": (!hindsight).then_some(row.urgent_completed),
                    "p99_ms": row.p99_ms.map(round),
                    "wait_p99_over_job_time": row.wait_over_job(replay.job_ms).map(number),
                },
                "batch": {"throughput_per_s": round(row.batch_per_second)},
                "reserve": {
                    "mean": row.mean_reserve,
                    "changes_per_hour": number(row.reserve_changes_per_hour),
                },
                "worker_seconds": row.worker_seconds,
                "share_of_hindsight_reference": row.share_of_hindsight,
            });
            if let (Some(object), Value::Object(extra)) = (value.as_object_mut(), extra) {
                object.extend(extra);
            }
            value
        })
        .collect();
    let (mean, peak) = mean_and_peak(history);
    json!({
        "pool": heading.pool,
        "lane": history.lane,
        "window": span((0, history.rates.len())),
        "step_seconds": history.range.step,
        "steps": history.rates.len(),
        "covered": history.covered().into_iter().map(span).collect::<Vec<_>>(),
        "skipped": history.skipped().into_iter().map(span).collect::<Vec<_>>(),
        "queries": history.queries,
        "measured": {
            "arrival_rate_mean": mean,
            "arrival_rate_peak": peak,
            "job_time_ms": replay.job_ms,
            "batch_job_time_ms": history.batch_job_seconds.map(|s| s * 1e3),
            "rates": history.rates,
        },
        "simulated": {
            "workers": replay.base.workers,
            "shared_replicas": replay.shared_replicas,
            "seconds": replay.base.duration as f64 / 1e9,
            "batch_job_ms": [replay.base.batch_job.0 as f64 / 1e6, replay.base.batch_job.1 as f64 / 1e6],
            "seed": replay.base.seed,
            "simulate_flags": simulate_flags(replay),
            "run_seconds": replay.simulated_in.as_secs_f64(),
        },
        "rows": rows,
        "recommendation": {
            "policy": replay.recommendation.policy.as_ref().map(Policy::name),
            "words": replay.recommendation.words,
            "fields": replay.recommendation.fields,
        },
    })
    .to_string()
}
