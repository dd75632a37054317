//! Urgent arrival times drawn from a rate profile: evenly spaced (the guide's runs) or Poisson.
//! A job arrives each time the profile's cumulative rate grows by one (even) or by an
//! exponential draw (Poisson), so rate steps are followed exactly.

use super::profile::RateProfile;
use super::rng::Pcg32;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ArrivalKind {
    Even,
    Poisson,
}

pub struct Arrivals<'a> {
    profile: &'a RateProfile,
    kind: ArrivalKind,
    rng: Pcg32,
    /// Cumulative rate (expected arrivals) at each step's start.
    cumulative: Vec<f64>,
    /// Cumulative rate at the next arrival; whole numbers for even arrivals, so that the k-th
    /// arrival lands at exactly k / rate without drift.
    target: f64,
    step: usize,
    started: bool,
}

impl<'a> Arrivals<'a> {
    pub fn new(profile: &'a RateProfile, kind: ArrivalKind, rng: Pcg32) -> Self {
        let mut cumulative = vec![0.0];
        for pair in profile.steps.windows(2) {
            let (start, rate) = pair[0];
            let last = cumulative.last().copied().unwrap_or(0.0);
            cumulative.push(last + rate * (pair[1].0 - start));
        }
        Self {
            profile,
            kind,
            rng,
            cumulative,
            target: 0.0,
            step: 0,
            started: false,
        }
    }

    /// The next arrival in seconds, or `None` when the rate stays at zero for ever.
    pub fn next_seconds(&mut self) -> Option<f64> {
        let gap = match self.kind {
            // Even arrivals start at 0, as the guide's 240 jobs in 8 s at 30/s.
            ArrivalKind::Even if !self.started => 0.0,
            ArrivalKind::Even => 1.0,
            ArrivalKind::Poisson => self.rng.exponential(),
        };
        self.started = true;
        self.target += gap;
        let steps = &self.profile.steps;
        while self.step + 1 < steps.len() && self.cumulative[self.step + 1] <= self.target {
            self.step += 1;
        }
        // Skip steps at rate 0: no arrival can land in them.
        while steps[self.step].1 <= 0.0 {
            if self.step + 1 >= steps.len() {
                return None;
            }
            self.step += 1;
        }
        let (start, rate) = steps[self.step];
        Some(start + (self.target - self.cumulative[self.step]) / rate)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn count(profile: &RateProfile, kind: ArrivalKind, until: f64) -> usize {
        let mut arrivals = Arrivals::new(profile, kind, Pcg32::new(1, 1));
        std::iter::from_fn(|| arrivals.next_seconds())
            .take_while(|t| *t < until)
            .count()
    }

    #[test]
    fn even_arrivals_give_the_guides_240_jobs_in_8_seconds() {
        assert_eq!(
            count(&RateProfile::constant(30.0), ArrivalKind::Even, 8.0),
            240
        );
        assert_eq!(
            count(&RateProfile::constant(150.0), ArrivalKind::Even, 8.0),
            1200
        );
    }

    #[test]
    fn arrivals_follow_rate_steps() {
        let profile = RateProfile::parse("0s=10,10s=100,20s=0,30s=50").unwrap();
        assert_eq!(count(&profile, ArrivalKind::Even, 30.0), 1100);
        let poisson = count(&profile, ArrivalKind::Poisson, 40.0);
        assert!((1450..1750).contains(&poisson), "{poisson}");
    }

    #[test]
    fn a_rate_of_zero_for_ever_ends_the_arrivals() {
        let profile = RateProfile::parse("0s=10,1s=0").unwrap();
        assert_eq!(count(&profile, ArrivalKind::Even, 1e9), 10);
    }
}
