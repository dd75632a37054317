//! `--plot FILE.svg`: stacked panels over time (urgent rate, reserve, urgent p99 per window,
//! batch throughput), written as plain SVG so no plotting library is needed. [`chart`] draws any
//! such panels, one or more lines each, broken where a line has gaps; `lanepool replay` uses it
//! too.

use std::fmt::Write as _;

use crate::duration::trim;
use crate::simulate::engine::outcome::{Outcome, SeriesPoint};

const WIDTH: f64 = 800.0;
const PANEL: f64 = 130.0;
const GAP: f64 = 30.0;
const LEFT: f64 = 70.0;
const RIGHT: f64 = 20.0;

/// One line of a panel: a label for the legend and its points, in runs (a gap between runs is
/// drawn as a break, not a line across it).
pub struct Line {
    pub label: String,
    pub colour: &'static str,
    pub runs: Vec<Vec<(f64, f64)>>,
}

/// One panel: a title, the unit of its values and its lines, all on one scale from 0.
pub struct Panel {
    pub title: String,
    pub unit: &'static str,
    pub lines: Vec<Line>,
}

struct SimulatePanel {
    title: &'static str,
    unit: &'static str,
    colour: &'static str,
    value: fn(&SeriesPoint) -> Option<f64>,
}

const PANELS: [SimulatePanel; 4] = [
    SimulatePanel {
        title: "urgent arrival rate",
        unit: "/s",
        colour: "#d62728",
        value: |p| Some(p.urgent_rate),
    },
    SimulatePanel {
        title: "reserved workers",
        unit: "",
        colour: "#1f77b4",
        value: |p| Some(p.reserve),
    },
    SimulatePanel {
        title: "urgent p99 per window",
        unit: " ms",
        colour: "#ff7f0e",
        value: |p| p.summary.p99_ms,
    },
    SimulatePanel {
        title: "batch throughput",
        unit: "/s",
        colour: "#2ca02c",
        value: |p| Some(p.summary.batch_per_second),
    },
];

pub fn svg(outcome: &Outcome) -> String {
    let points = outcome.series();
    let panels: Vec<Panel> = PANELS
        .iter()
        .map(|panel| Panel {
            title: panel.title.to_string(),
            unit: panel.unit,
            lines: vec![Line {
                label: String::new(),
                colour: panel.colour,
                runs: vec![
                    points
                        .iter()
                        .filter_map(|p| (panel.value)(p).map(|v| (p.start_s, v)))
                        .collect(),
                ],
            }],
        })
        .collect();
    let end = outcome.duration as f64 / 1e9;
    chart(&panels, end, &format!("time (s), 0 to {}", trim(end)))
}

/// Stacked `panels` over x from 0 to `x_end`, with `x_label` under them.
pub fn chart(panels: &[Panel], x_end: f64, x_label: &str) -> String {
    let height = GAP + panels.len() as f64 * (PANEL + GAP);
    let x = |t: f64| LEFT + (WIDTH - LEFT - RIGHT) * t / x_end.max(1e-9);
    let mut out = String::new();
    let _ = writeln!(
        out,
        r#"<svg xmlns="http://www.w3.org/2000/svg" width="{WIDTH}" height="{height}" font-family="sans-serif" font-size="12">"#
    );
    let _ = writeln!(out, r#"<rect width="100%" height="100%" fill="white"/>"#);
    for (i, panel) in panels.iter().enumerate() {
        let top = GAP + i as f64 * (PANEL + GAP);
        let bottom = top + PANEL;
        let high = panel
            .lines
            .iter()
            .flat_map(|line| line.runs.iter().flatten())
            .map(|(_, v)| *v)
            .filter(|v| v.is_finite())
            .fold(0.0, f64::max)
            .max(1e-9);
        let y = |v: f64| bottom - PANEL * v.min(high) / high;
        let legend: Vec<String> = panel
            .lines
            .iter()
            .filter(|line| !line.label.is_empty())
            .map(|line| {
                format!(
                    r#"<tspan fill="{}">■ {}</tspan>"#,
                    line.colour,
                    escape(&line.label)
                )
            })
            .collect();
        let legend = if legend.is_empty() {
            String::new()
        } else {
            format!(" {}", legend.join(" "))
        };
        let _ = writeln!(
            out,
            r#"<text x="{LEFT}" y="{}">{} (max {}{}){legend}</text>"#,
            top - 6.0,
            escape(&panel.title),
            trim(high),
            panel.unit,
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
        for line in &panel.lines {
            for run in &line.runs {
                let path: Vec<String> = run
                    .iter()
                    .filter(|(_, v)| v.is_finite())
                    .map(|(t, v)| format!("{:.1},{:.1}", x(*t), y(*v)))
                    .collect();
                let _ = writeln!(
                    out,
                    r#"<polyline fill="none" stroke="{}" stroke-width="1.5" points="{}"/>"#,
                    line.colour,
                    path.join(" ")
                );
            }
        }
    }
    let _ = writeln!(
        out,
        r#"<text x="{LEFT}" y="{}">{}</text>"#,
        height - 8.0,
        escape(x_label)
    );
    out.push_str("</svg>\n");
    out
}

fn escape(text: &str) -> String {
    text.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
}
