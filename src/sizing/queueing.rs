//! Queueing arithmetic: the guide's formula and the M/D/c prediction a latency target sizes by.

/// The guide's formula: arrival rate × job time × headroom, and its ceiling. The ceiling
/// forgives floating-point noise, so 100/s × 20 ms × 1.5 is 3, not 4.
pub fn formula(arrival_rate: f64, job_seconds: f64, headroom: f64) -> (f64, i32) {
    let needed = arrival_rate * job_seconds * headroom;
    if !needed.is_finite() {
        // Finite inputs whose product overflows: as much as can be asked, never "no load".
        return (needed, i32::MAX);
    }
    let ceiling = (needed - 1e-9 * needed.max(1.0)).ceil();
    (needed, ceiling.clamp(0.0, i32::MAX as f64) as i32)
}

/// Predicted p99 of submission to completion, in seconds, for Poisson arrivals served by
/// `reserve` workers with a fixed job time (M/D/c). Erlang C gives the chance of waiting; a
/// fixed job time makes the wait's tail decay about twice as fast as the M/M/c one.
/// Infinite when the reserve cannot keep up.
pub fn predicted_p99(arrival_rate: f64, job_seconds: f64, reserve: i32) -> f64 {
    let offered = arrival_rate * job_seconds;
    if offered <= 0.0 || job_seconds <= 0.0 {
        return job_seconds.max(0.0);
    }
    let servers = f64::from(reserve.max(0));
    if offered >= servers {
        return f64::INFINITY;
    }
    // Erlang B by recurrence (stable for large reserves), then Erlang C.
    let mut blocking = 1.0;
    for k in 1..=reserve {
        blocking = offered * blocking / (f64::from(k) + offered * blocking);
    }
    let busy = offered / servers;
    let waits = blocking / (1.0 - busy + busy * blocking);
    if waits <= 0.01 {
        return job_seconds;
    }
    let decay = 2.0 * (servers / job_seconds - arrival_rate);
    job_seconds + (waits / 0.01).ln() / decay
}

/// The smallest reserve whose predicted p99 meets the target, or `None` when no reserve up to
/// `most` does.
pub fn latency_target(
    arrival_rate: f64,
    job_seconds: f64,
    p99_seconds: f64,
    most: i32,
) -> Option<i32> {
    (0..=most.max(0)).find(|r| predicted_p99(arrival_rate, job_seconds, *r) <= p99_seconds)
}
