//! The urgent lane's arrival rate over time: a constant, a list of steps
//! (`0s=30,120s=150,180s=30`), or `day`, a day's shape squeezed into the run's duration.
//! Parsing only; it never draws arrivals.

use crate::duration;
use crate::simulate::error::SimulateError;

/// Piecewise-constant rate: `steps[i]` holds from its start until the next step's start; the
/// last holds for ever.
#[derive(Clone, Debug, PartialEq)]
pub struct RateProfile {
    /// (start in seconds, jobs per second), starts strictly increasing, the first at 0.
    pub steps: Vec<(f64, f64)>,
}

/// Fraction of the peak rate, hour by hour: quiet night, morning and afternoon peaks.
const DAY_SHAPE: [f64; 24] = [
    0.1, 0.1, 0.1, 0.1, 0.15, 0.2, 0.4, 0.7, 1.0, 0.8, 0.6, 0.7, 1.0, 0.6, 0.5, 0.6, 0.8, 1.0, 0.6,
    0.4, 0.3, 0.2, 0.15, 0.1,
];

impl RateProfile {
    pub fn constant(rate: f64) -> Self {
        Self {
            steps: vec![(0.0, rate)],
        }
    }

    /// The day shape, each hour lasting `duration / 24`, peaking at `peak`.
    pub fn day(peak: f64, duration_seconds: f64) -> Self {
        let hour = duration_seconds / 24.0;
        Self {
            steps: DAY_SHAPE
                .iter()
                .enumerate()
                .map(|(i, share)| (i as f64 * hour, share * peak))
                .collect(),
        }
    }

    /// Parses `0s=30,120s=150,180s=30`.
    pub fn parse(text: &str) -> Result<Self, SimulateError> {
        let bad = |reason: String| SimulateError::flag("--urgent-profile", reason);
        let mut steps: Vec<(f64, f64)> = Vec::new();
        for part in text.split(',') {
            let (at, rate) = part
                .split_once('=')
                .ok_or_else(|| bad(format!("{part:?} is not TIME=RATE, such as 120s=150")))?;
            let at = duration::parse(at.trim()).map_err(|e| bad(e.to_string()))?;
            let rate: f64 = rate
                .trim()
                .parse()
                .map_err(|_| bad(format!("{rate:?} is not a rate in jobs per second")))?;
            if !(rate.is_finite() && rate >= 0.0) {
                return Err(bad(format!("rate {rate} must be 0 or more")));
            }
            let at = at.as_secs_f64();
            if let Some((last, _)) = steps.last()
                && at <= *last
            {
                return Err(bad(format!("times must increase; {at}s follows {last}s")));
            }
            steps.push((at, rate));
        }
        match steps.first() {
            Some((start, _)) if *start == 0.0 => Ok(Self { steps }),
            _ => Err(bad("the first step must start at 0s".into())),
        }
    }

    pub fn rate_at(&self, seconds: f64) -> f64 {
        self.steps
            .iter()
            .rev()
            .find(|(start, _)| *start <= seconds)
            .map_or(0.0, |(_, rate)| *rate)
    }

    pub fn peak(&self) -> f64 {
        self.steps.iter().map(|(_, rate)| *rate).fold(0.0, f64::max)
    }

    /// The steps cut to `[0, end)`: (start, end, rate), for phase-by-phase comparisons.
    pub fn phases(&self, end: f64) -> Vec<(f64, f64, f64)> {
        let mut phases = Vec::new();
        for (i, (start, rate)) in self.steps.iter().enumerate() {
            let stop = self.steps.get(i + 1).map_or(end, |(next, _)| next.min(end));
            if *start < stop {
                phases.push((*start, stop, *rate));
            }
        }
        phases
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_the_issue_example() {
        let profile = RateProfile::parse("0s=30,120s=150,180s=30,300s=90").unwrap();
        assert_eq!(profile.rate_at(0.0), 30.0);
        assert_eq!(profile.rate_at(150.0), 150.0);
        assert_eq!(profile.rate_at(1e6), 90.0);
        assert_eq!(profile.phases(200.0).len(), 3);
    }

    #[test]
    fn refuses_profiles_that_do_not_start_at_zero_or_go_back() {
        for bad in ["10s=30", "0s=30,5s=10,5s=20", "0s=-1", "0s", "0s=x", "x=3"] {
            let err = RateProfile::parse(bad).unwrap_err().to_string();
            assert!(err.starts_with("--urgent-profile"), "{bad}: {err}");
        }
    }

    #[test]
    fn the_day_peaks_at_the_given_rate() {
        let day = RateProfile::day(150.0, 2400.0);
        assert_eq!(day.peak(), 150.0);
        assert_eq!(day.steps.len(), 24);
        assert_eq!(day.rate_at(2399.0), 15.0);
    }
}
