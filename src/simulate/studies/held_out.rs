//! `--suite --held-out`: traffic the sizing was never tuned on. Each family draws its whole
//! shape (widths, heights, gaps, volatility) from seeds kept apart from the suite's, so a
//! sizing fitted to the suite's fixed shapes shows here as a gap. Never tune on these.

use super::suite::{Set, Shape, steps};
use crate::simulate::engine::profile::RateProfile;
use crate::simulate::engine::rng::Pcg32;

/// The held-out seeds: not the suite's, and not to be looked at while tuning. Drawn anew when
/// the default became `Queueing`, because 9,001–9,003 had been read while `CONFIRMING_SHARE`
/// and the default interval were chosen; these were first run after the sizing was final.
pub const SEEDS: [u64; 3] = [73_001, 73_002, 73_003];

/// The lowest and highest rates any family reaches, as the suite's (10/s to 180/s).
const LOW: f64 = 10.0;
const HIGH: f64 = 180.0;

/// A draw between `low` and `high`.
fn draw(rng: &mut Pcg32, low: f64, high: f64) -> f64 {
    low + (high - low) * rng.unit()
}

/// Rounded points, starts strictly increasing and inside the run, rates within [LOW, HIGH].
fn profile(points: Vec<(f64, f64)>, seconds: f64) -> RateProfile {
    let mut kept: Vec<(f64, f64)> = Vec::new();
    for (at, rate) in points {
        let at = at.round();
        let rate = rate.round().clamp(LOW, HIGH);
        match kept.last_mut() {
            Some(last) if at <= last.0 => last.1 = rate,
            _ if at < seconds => kept.push((at, rate)),
            _ => {}
        }
    }
    steps(&kept)
}

/// Spikes of random width (10–90 s) and height over a random base, at random gaps.
fn spike_train(seconds: f64, seed: u64) -> RateProfile {
    let mut rng = Pcg32::new(seed, 21);
    let base = draw(&mut rng, 15.0, 60.0);
    let mut points = vec![(0.0, base)];
    let mut at = draw(&mut rng, 30.0, 200.0);
    while at < seconds {
        let width = draw(&mut rng, 10.0, 90.0);
        points.push((at, draw(&mut rng, 80.0, 180.0)));
        points.push((at + width, base));
        at += width + draw(&mut rng, 40.0, 300.0);
    }
    profile(points, seconds)
}

/// A regular spike train whose width (10–90 s), height, period and base the seed picks.
fn spike_regular(seconds: f64, seed: u64) -> RateProfile {
    let mut rng = Pcg32::new(seed, 22);
    let base = draw(&mut rng, 15.0, 60.0);
    let peak = draw(&mut rng, 90.0, 180.0);
    let width = draw(&mut rng, 10.0, 90.0);
    let period = width + draw(&mut rng, 60.0, 300.0);
    let mut points = vec![(0.0, base)];
    let mut at = draw(&mut rng, 30.0, period);
    while at < seconds {
        points.push((at, peak));
        points.push((at + width, base));
        at += period;
    }
    profile(points, seconds)
}

/// A new level anywhere in the range every 1–5 minutes.
fn random_steps(seconds: f64, seed: u64) -> RateProfile {
    let mut rng = Pcg32::new(seed, 23);
    let mut points = Vec::new();
    let mut at = 0.0;
    while at < seconds {
        points.push((at, draw(&mut rng, LOW, 170.0)));
        at += draw(&mut rng, 60.0, 300.0);
    }
    profile(points, seconds)
}

/// A random walk whose step (5–60 s) and volatility (5–50/s a step) the seed picks.
fn random_walk(seconds: f64, seed: u64) -> RateProfile {
    let mut rng = Pcg32::new(seed, 24);
    let step = draw(&mut rng, 5.0, 60.0);
    let volatility = draw(&mut rng, 5.0, 50.0);
    let mut rate = draw(&mut rng, LOW, 170.0);
    let mut points = Vec::new();
    let mut at = 0.0;
    while at < seconds {
        points.push((at, rate));
        rate = (rate + volatility * (2.0 * rng.unit() - 1.0)).clamp(LOW, 170.0);
        at += step;
    }
    profile(points, seconds)
}

/// Straight lines between random levels, each over 1–7 minutes, in 15 s steps.
fn random_ramps(seconds: f64, seed: u64) -> RateProfile {
    let mut rng = Pcg32::new(seed, 25);
    let mut from = draw(&mut rng, LOW, 170.0);
    let mut points = Vec::new();
    let mut start = 0.0;
    while start < seconds {
        let to = draw(&mut rng, LOW, 170.0);
        let length = draw(&mut rng, 60.0, 420.0);
        let mut at = start;
        while at < start + length {
            points.push((at, from + (to - from) * (at - start) / length));
            at += 15.0;
        }
        from = to;
        start += length;
    }
    profile(points, seconds)
}

/// A slow, low walk with spikes of random width and height on top of it.
fn mixture(seconds: f64, seed: u64) -> RateProfile {
    let mut rng = Pcg32::new(seed, 26);
    let volatility = draw(&mut rng, 5.0, 20.0);
    let mut walk = Vec::new();
    let mut rate = draw(&mut rng, 15.0, 70.0);
    let mut at = 0.0;
    while at < seconds {
        walk.push((at, rate));
        rate = (rate + volatility * (2.0 * rng.unit() - 1.0)).clamp(LOW, 80.0);
        at += 30.0;
    }
    let mut spikes = Vec::new();
    let mut at = draw(&mut rng, 30.0, 200.0);
    while at < seconds {
        let width = draw(&mut rng, 10.0, 90.0);
        spikes.push((at, at + width, draw(&mut rng, 50.0, 120.0)));
        at += width + draw(&mut rng, 40.0, 300.0);
    }
    let base_at = |t: f64| {
        walk.iter()
            .take_while(|(at, _)| *at <= t)
            .last()
            .map_or(LOW, |(_, r)| *r)
    };
    let extra_at = |t: f64| {
        spikes
            .iter()
            .find(|(from, to, _)| *from <= t && t < *to)
            .map_or(0.0, |(_, _, e)| *e)
    };
    let mut moments: Vec<f64> = walk
        .iter()
        .map(|(at, _)| *at)
        .chain(spikes.iter().flat_map(|(from, to, _)| [*from, *to]))
        .collect();
    moments.sort_by(f64::total_cmp);
    let points = moments
        .into_iter()
        .map(|t| (t, base_at(t) + extra_at(t)))
        .collect();
    profile(points, seconds)
}

/// Long surges (2–8 minutes) to a random height over a random base.
fn surges(seconds: f64, seed: u64) -> RateProfile {
    let mut rng = Pcg32::new(seed, 27);
    let base = draw(&mut rng, 15.0, 50.0);
    let mut points = vec![(0.0, base)];
    let mut at = draw(&mut rng, 30.0, 240.0);
    while at < seconds {
        let length = draw(&mut rng, 120.0, 480.0);
        points.push((at, draw(&mut rng, 80.0, 170.0)));
        points.push((at + length, base));
        at += length + draw(&mut rng, 60.0, 300.0);
    }
    profile(points, seconds)
}

/// The held-out families.
pub fn shapes() -> Vec<Shape> {
    vec![
        Shape {
            name: "h-spikes",
            what: "spikes 10–90 s wide, random heights and gaps",
            profile: spike_train,
        },
        Shape {
            name: "h-regular",
            what: "a regular spike train, width/period/height drawn",
            profile: spike_regular,
        },
        Shape {
            name: "h-steps",
            what: "a random level every 1–5 min",
            profile: random_steps,
        },
        Shape {
            name: "h-walk",
            what: "random walk, random step and volatility",
            profile: random_walk,
        },
        Shape {
            name: "h-ramps",
            what: "ramps between random levels, 1–7 min each",
            profile: random_ramps,
        },
        Shape {
            name: "h-mixture",
            what: "a low walk with random spikes on top",
            profile: mixture,
        },
        Shape {
            name: "h-surges",
            what: "surges of 2–8 min to random heights",
            profile: surges,
        },
    ]
}

/// The held-out set: every family with the held-out seeds.
pub fn set() -> Set {
    Set {
        shapes: shapes(),
        seeds: SEEDS.to_vec(),
        workers: super::suite::WORKERS,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_held_out_shape_is_a_valid_profile_that_follows_its_seed() {
        for shape in shapes() {
            for seed in [1, 2, 3, 4, 5] {
                let profile = shape.profile(1200.0, seed);
                assert_eq!(profile.steps[0].0, 0.0, "{}", shape.name);
                assert!(
                    profile.steps.windows(2).all(|w| w[0].0 < w[1].0),
                    "{}",
                    shape.name
                );
                assert!(
                    profile
                        .steps
                        .iter()
                        .all(|(at, r)| *at < 1200.0 && (LOW..=HIGH).contains(r)),
                    "{}: {:?}",
                    shape.name,
                    profile.steps
                );
                assert_eq!(profile, shape.profile(1200.0, seed));
            }
            assert_ne!(shape.profile(1200.0, 1), shape.profile(1200.0, 2));
        }
    }

    #[test]
    fn the_held_out_seeds_are_not_the_suites() {
        assert!(
            SEEDS
                .iter()
                .all(|s| !super::super::suite::SEEDS.contains(s))
        );
    }
}
