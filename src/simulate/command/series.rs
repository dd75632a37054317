//! The time series of a run as CSV, one row per window: urgent arrival rate, reserve, urgent
//! completions and percentiles, batch throughput. Empty windows leave percentiles blank.

use crate::simulate::engine::outcome::Outcome;

pub const HEADER: &str =
    "start_s,urgent_rate,reserve,urgent_completed,urgent_p50_ms,urgent_p99_ms,batch_per_s";

pub fn csv(outcome: &Outcome) -> String {
    let mut rows = vec![HEADER.to_string()];
    let blank = |v: Option<f64>| v.map_or(String::new(), |v| format!("{v:.3}"));
    for point in outcome.series() {
        let s = point.summary;
        rows.push(format!(
            "{},{:.3},{:.3},{},{},{},{:.3}",
            point.start_s,
            point.urgent_rate,
            point.reserve,
            s.urgent_completed,
            blank(s.p50_ms),
            blank(s.p99_ms),
            s.batch_per_second
        ));
    }
    rows.push(String::new());
    rows.join("\n")
}
