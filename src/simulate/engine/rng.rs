//! A small seeded random number generator (PCG32, XSH-RR), so a simulation is reproducible from
//! its seed on every platform without a dependency. Not for anything that needs secrecy.

/// PCG32: 64-bit state, 32-bit output. Each stream is independent for the same seed, so urgent
/// arrivals and batch job times never shift each other when one arrangement draws more.
#[derive(Clone, Debug)]
pub struct Pcg32 {
    state: u64,
    increment: u64,
}

const MULTIPLIER: u64 = 6_364_136_223_846_793_005;

impl Pcg32 {
    pub fn new(seed: u64, stream: u64) -> Self {
        let mut rng = Self {
            state: 0,
            increment: (stream << 1) | 1,
        };
        rng.next_u32();
        rng.state = rng.state.wrapping_add(seed);
        rng.next_u32();
        rng
    }

    pub fn next_u32(&mut self) -> u32 {
        let old = self.state;
        self.state = old.wrapping_mul(MULTIPLIER).wrapping_add(self.increment);
        let xorshifted = (((old >> 18) ^ old) >> 27) as u32;
        xorshifted.rotate_right((old >> 59) as u32)
    }

    /// Uniform in [0, 1), with 53 bits.
    pub fn unit(&mut self) -> f64 {
        let high = u64::from(self.next_u32()) << 21;
        let low = u64::from(self.next_u32()) >> 11;
        (high | low) as f64 / (1u64 << 53) as f64
    }

    /// Uniform in [low, high], both included.
    pub fn between(&mut self, low: u64, high: u64) -> u64 {
        if high <= low {
            return low;
        }
        low + (self.unit() * (high - low + 1) as f64) as u64
    }

    /// Exponential with mean 1: the gap between Poisson arrivals at rate 1.
    pub fn exponential(&mut self) -> f64 {
        -(1.0 - self.unit()).ln()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_same_seed_gives_the_same_draws() {
        let mut a = Pcg32::new(7, 1);
        let mut b = Pcg32::new(7, 1);
        for _ in 0..100 {
            assert_eq!(a.next_u32(), b.next_u32());
        }
    }

    #[test]
    fn streams_differ() {
        let mut a = Pcg32::new(7, 1);
        let mut b = Pcg32::new(7, 2);
        assert!((0..10).any(|_| a.next_u32() != b.next_u32()));
    }

    #[test]
    fn draws_stay_in_range_and_average_out() {
        let mut rng = Pcg32::new(1, 1);
        let n = 20_000;
        let mut sum = 0.0;
        for _ in 0..n {
            let x = rng.between(100, 300);
            assert!((100..=300).contains(&x));
            sum += rng.exponential();
        }
        assert!((sum / f64::from(n) - 1.0).abs() < 0.05);
    }
}
