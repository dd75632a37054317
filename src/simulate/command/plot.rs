//! `--plot FILE.svg`: four stacked panels over time (urgent rate, reserve, urgent p99 per window,
//! batch throughput), written as plain SVG so no plotting library is needed.

use std::fmt::Write as _;

use crate::duration::trim;
use crate::simulate::engine::outcome::{Outcome, SeriesPoint};

const WIDTH: f64 = 800.0;
const PANEL: f64 = 130.0;
const GAP: f64 = 30.0;
const LEFT: f64 = 70.0;
const RIGHT: f64 = 20.0;

struct Panel {
    title: &'static str,
    unit: &'static str,
    colour: &'static str,
    value: fn(&SeriesPoint) -> Option<f64>,
}

const PANELS: [Panel; 4] = [
    Panel {
        title: "urgent arrival rate",
        unit: "/s",
        colour: "#d62728",
        value: |p| Some(p.urgent_rate),
    },
    Panel {
        title: "reserved workers",
        unit: "",
        colour: "#1f77b4",
        value: |p| Some(p.reserve),
    },
    Panel {
        title: "urgent p99 per window",
        unit: " ms",
        colour: "#ff7f0e",
        value: |p| p.summary.p99_ms,
    },
    Panel {
        title: "batch throughput",
        unit: "/s",
        colour: "#2ca02c",
        value: |p| Some(p.summary.batch_per_second),
    },
];

pub fn svg(outcome: &Outcome) -> String {
    let points = outcome.series();
    let height = GAP + PANELS.len() as f64 * (PANEL + GAP);
    let end = outcome.duration as f64 / 1e9;
    let x = |t: f64| LEFT + (WIDTH - LEFT - RIGHT) * t / end.max(1e-9);
    let mut out = String::new();
    let _ = writeln!(
        out,
        r#"<svg xmlns="http://www.w3.org/2000/svg" width="{WIDTH}" height="{height}" font-family="sans-serif" font-size="12">"#
    );
    let _ = writeln!(out, r#"<rect width="100%" height="100%" fill="white"/>"#);
    for (i, panel) in PANELS.iter().enumerate() {
        let top = GAP + i as f64 * (PANEL + GAP);
        let bottom = top + PANEL;
        let values: Vec<(f64, f64)> = points
            .iter()
            .filter_map(|p| (panel.value)(p).map(|v| (p.start_s, v)))
            .collect();
        let high = values.iter().map(|(_, v)| *v).fold(0.0, f64::max).max(1e-9);
        let y = |v: f64| bottom - PANEL * v / high;
        let _ = writeln!(
            out,
            r#"<text x="{LEFT}" y="{}">{} (max {}{})</text>"#,
            top - 6.0,
            panel.title,
            trim(high),
            panel.unit
        );
        let _ = writeln!(
            out,
            r##"<rect x="{LEFT}" y="{top}" width="{}" height="{PANEL}" fill="none" stroke="#999"/>"##,
            WIDTH - LEFT - RIGHT
        );
        let _ = writeln!(
            out,
            r#"<text x="4" y="{}">{}</text>"#,
            top + 12.0,
            trim(high)
        );
        let _ = writeln!(out, r#"<text x="4" y="{bottom}">0</text>"#);
        let path: Vec<String> = values
            .iter()
            .map(|(t, v)| format!("{:.1},{:.1}", x(*t), y(*v)))
            .collect();
        let _ = writeln!(
            out,
            r#"<polyline fill="none" stroke="{}" stroke-width="1.5" points="{}"/>"#,
            panel.colour,
            path.join(" ")
        );
    }
    let _ = writeln!(
        out,
        r#"<text x="{LEFT}" y="{}">time (s), 0 to {}</text>"#,
        height - 8.0,
        trim(end)
    );
    out.push_str("</svg>\n");
    out
}
