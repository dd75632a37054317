//! `lanepool plan`: the guide's step 5 as a command. Shows the reserve a measured load calls for
//! and the arithmetic behind it, with the same formula the operator runs.

use crate::duration::{human_seconds, trim};
use crate::sizing::formula;

/// A load to size a reserve for.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct PlanInput {
    pub arrival_rate: f64,
    pub job_seconds: f64,
    pub headroom: f64,
    pub min: i32,
    pub max: Option<i32>,
}

/// The reserve and the lines that explain it.
#[derive(Clone, Debug, PartialEq)]
pub struct Plan {
    pub reserve: i32,
    pub lines: Vec<String>,
}

pub fn plan(input: PlanInput) -> Plan {
    let busy = input.arrival_rate * input.job_seconds;
    let (needed, ceiling) = formula(input.arrival_rate, input.job_seconds, input.headroom);
    let reserve = ceiling.clamp(input.min, input.max.unwrap_or(i32::MAX).max(input.min));
    let mut lines = vec![
        format!(
            "busy workers  = arrival rate × job time = {}/s × {} = {}",
            trim(input.arrival_rate),
            human_seconds(input.job_seconds),
            trim(busy)
        ),
        format!(
            "with headroom = {} × {} = {} → ceil → {}",
            trim(busy),
            trim(input.headroom),
            trim(needed),
            ceiling
        ),
    ];
    if reserve != ceiling {
        lines.push(format!(
            "within bounds = [{}, {}] → {}",
            input.min,
            input.max.map_or("∞".to_string(), |m| m.to_string()),
            reserve
        ));
    }
    lines.push(format!(
        "reserved      = {reserve} worker{}; reserved capacity {}/s (reserved ÷ job time)",
        if reserve == 1 { "" } else { "s" },
        if input.job_seconds > 0.0 {
            trim(f64::from(reserve) / input.job_seconds)
        } else {
            "∞".to_string()
        }
    ));
    Plan { reserve, lines }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn guide(rate: f64) -> PlanInput {
        PlanInput {
            arrival_rate: rate,
            job_seconds: 0.020,
            headroom: 1.5,
            min: 1,
            max: None,
        }
    }

    #[test]
    fn reproduces_the_guides_arithmetic() {
        let plan = plan(guide(30.0));
        assert_eq!(plan.reserve, 1);
        assert_eq!(
            plan.lines[0],
            "busy workers  = arrival rate × job time = 30/s × 20 ms = 0.6"
        );
        assert_eq!(plan.lines[1], "with headroom = 0.6 × 1.5 = 0.9 → ceil → 1");
        assert!(plan.lines[2].contains("reserved capacity 50/s"));
    }

    #[test]
    fn the_spike_needs_five() {
        assert_eq!(plan(guide(150.0)).reserve, 5);
    }

    #[test]
    fn bounds_are_shown_when_they_apply() {
        let capped = plan(PlanInput {
            max: Some(2),
            ..guide(150.0)
        });
        assert_eq!(capped.reserve, 2);
        assert_eq!(capped.lines[2], "within bounds = [1, 2] → 2");
    }
}
