//! How a lane's reserve is explained in the status and the events: the arithmetic, then each
//! step from it to the reserve (the tolerance, an unconfirmed growth, the bounds, the scale-down
//! window). Text only: the steps themselves are `decide.rs`'s.

use std::time::Duration;

use super::settings::{LaneSizing, PoolSizing, Rule};
use crate::duration::{human_seconds, trim};

/// "30/s × 20 ms × 2 = 1.2": the rate (recent, when the reserve followed it), the job time and
/// the rule's arithmetic; a recent rate's window follows ("the recent rate over 5 s"), since the
/// fewer jobs it counted, the noisier it is (a worker read spans the interval, Prometheus's
/// recent rate one scrape interval, 5 s at least).
pub(super) fn arithmetic(
    sizing: &PoolSizing,
    lane: &LaneSizing,
    rate: f64,
    recent: Option<Duration>,
    job: f64,
    needed: f64,
) -> String {
    let shown_rate = match recent {
        Some(_) => format!("{}/s (recent)", trim(rate)),
        None => format!("{}/s", trim(rate)),
    };
    let arithmetic = match lane.rule {
        Rule::Formula => format!(
            "{shown_rate} × {} × {} = {}",
            human_seconds(job),
            trim(sizing.headroom),
            trim(needed)
        ),
        Rule::Queueing if sizing.headroom == 1.0 => {
            format!("{shown_rate} × {}, wait p99 ≤ job time", human_seconds(job))
        }
        Rule::Queueing => format!(
            "{shown_rate} × {} × {}, wait p99 ≤ job time",
            human_seconds(job),
            trim(sizing.headroom)
        ),
        Rule::LatencyTarget { p99_seconds } => format!(
            "{shown_rate} × {}, p99 ≤ {}",
            human_seconds(job),
            human_seconds(p99_seconds)
        ),
    };
    let arithmetic = match sizing.slots_per_worker {
        1 => arithmetic,
        slots => format!("{arithmetic}, {slots} slots a worker"),
    };
    match recent {
        Some(window) => format!(
            "{arithmetic}; the recent rate over {}",
            human_seconds(window.as_secs_f64())
        ),
        None => arithmetic,
    }
}

/// The steps from a lane's arithmetic to its reserve.
pub(super) struct Steps {
    /// The tolerance the rate was moved back by.
    pub(super) tolerance: f64,
    /// What the arithmetic asked for, when the tolerance kept the current count.
    pub(super) tolerated: Option<i32>,
    /// What the rate asked for after the tolerance.
    pub(super) wanted: i32,
    /// The long rate that did not confirm a growth, when one did not.
    pub(super) unconfirmed_by: Option<f64>,
    /// The count after both.
    pub(super) ceiling: i32,
    /// A new leader's growth held: the recent rate below the long one, and the count held at.
    pub(super) fallen_back: Option<(f64, i32)>,
    /// Within the lane's bounds.
    pub(super) recommended: i32,
    pub(super) max: i32,
    /// The scale-down is paused, and held the count.
    pub(super) paused: bool,
    pub(super) window: Duration,
    pub(super) reserve: i32,
}

/// "urgent 30/s × 20 ms × 2 = 1.2 → 2 → 2 reserved", with each step that moved the count.
pub(super) fn reserve(lane: &str, arithmetic: &str, steps: &Steps) -> String {
    let Steps {
        tolerance,
        tolerated,
        wanted,
        unconfirmed_by,
        ceiling,
        fallen_back,
        recommended,
        max,
        paused,
        window,
        reserve,
    } = *steps;
    let mut explanation = format!("{lane} {arithmetic} → ");
    let within = |asked: i32, to: i32| {
        format!(
            "{asked}, within the {}% tolerance: {to}",
            (tolerance * 100.0).round()
        )
    };
    match (tolerated, unconfirmed_by) {
        (Some(asked), Some(long)) => explanation.push_str(&format!(
            "{}, unconfirmed by the {}/s long rate: {ceiling}",
            within(asked, wanted),
            trim(long)
        )),
        (Some(asked), None) => explanation.push_str(&within(asked, ceiling)),
        (None, Some(long)) => explanation.push_str(&format!(
            "{wanted}, unconfirmed by the {}/s long rate: {ceiling}",
            trim(long)
        )),
        (None, None) => explanation.push_str(&ceiling.to_string()),
    }
    let ceiling = match fallen_back {
        Some((recent, held)) => {
            explanation.push_str(&format!(
                ", held at {held}: the recent {}/s is below the long rate (a first decision)",
                trim(recent)
            ));
            held
        }
        None => ceiling,
    };
    if ceiling != recommended {
        let bound = if ceiling > max { "max" } else { "min" };
        explanation.push_str(&format!(", {bound} {recommended}"));
    }
    if paused {
        explanation.push_str(&format!(", held at {reserve} (scale-down paused)"));
    } else if reserve != recommended {
        explanation.push_str(&format!(
            ", held at {reserve} (highest in the {}s scale-down window)",
            window.as_secs()
        ));
    }
    explanation.push_str(&format!(" → {reserve} reserved"));
    explanation
}
