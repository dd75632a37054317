//! Queueing arithmetic: the guide's formula, and the M/D/c wait a reserve is sized by (Poisson
//! arrivals, a fixed job time, the reserved workers alone; shared workers only shorten the wait).

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

/// The most reserves [`smallest_reserve`] tries: a bound on its work, far above any pool.
const MOST_SEARCHED: i32 = 1_000_000;

/// Predicted p99 of the wait, submission to start, in seconds, for Poisson arrivals served by
/// `reserve` workers with a fixed job time (M/D/c). Erlang C gives the chance of waiting; a
/// fixed job time makes the wait's tail decay about twice as fast as the M/M/c one. Infinite
/// when the reserve cannot keep up.
pub fn predicted_wait_p99(arrival_rate: f64, job_seconds: f64, reserve: i32) -> f64 {
    let mut blocking = 1.0;
    for k in 1..=reserve.max(0) {
        blocking = erlang_b_step(arrival_rate * job_seconds, k, blocking);
    }
    wait_p99(arrival_rate, job_seconds, reserve, blocking)
}

/// Erlang B for `servers` from its value for one fewer (the recurrence, stable for any size).
fn erlang_b_step(offered: f64, servers: i32, blocking: f64) -> f64 {
    offered * blocking / (f64::from(servers) + offered * blocking)
}

/// The wait p99 from Erlang B at `reserve` servers.
fn wait_p99(arrival_rate: f64, job_seconds: f64, reserve: i32, blocking: f64) -> f64 {
    let offered = arrival_rate * job_seconds;
    if offered <= 0.0 || job_seconds <= 0.0 {
        return 0.0;
    }
    let servers = f64::from(reserve.max(0));
    if offered >= servers {
        return f64::INFINITY;
    }
    let busy = offered / servers;
    let waits = blocking / (1.0 - busy + busy * blocking);
    if waits <= 0.01 {
        return 0.0;
    }
    let decay = 2.0 * (servers / job_seconds - arrival_rate);
    (waits / 0.01).ln() / decay
}

/// Predicted p99 of submission to completion: the job time plus the wait's p99.
pub fn predicted_p99(arrival_rate: f64, job_seconds: f64, reserve: i32) -> f64 {
    job_seconds.max(0.0) + predicted_wait_p99(arrival_rate, job_seconds, reserve)
}

/// The smallest reserve whose predicted wait p99 is at most `wait_seconds`, or `None` when
/// none up to a million is (an overflowing or endless load). One pass of the Erlang B
/// recurrence: the work grows with the answer, never with the bound.
pub fn smallest_reserve(arrival_rate: f64, job_seconds: f64, wait_seconds: f64) -> Option<i32> {
    let offered = arrival_rate * job_seconds;
    if !offered.is_finite() || wait_seconds.is_nan() || wait_seconds < 0.0 {
        return None;
    }
    let mut blocking = 1.0;
    for reserve in 0..=MOST_SEARCHED {
        if reserve > 0 {
            blocking = erlang_b_step(offered, reserve, blocking);
        }
        if wait_p99(arrival_rate, job_seconds, reserve, blocking) <= wait_seconds {
            return Some(reserve);
        }
    }
    None
}

/// The smallest reserve whose predicted p99 (submission to completion) meets the target, or
/// `None` when no reserve up to `most` does.
pub fn latency_target(
    arrival_rate: f64,
    job_seconds: f64,
    p99_seconds: f64,
    most: i32,
) -> Option<i32> {
    smallest_reserve(
        arrival_rate,
        job_seconds,
        p99_seconds - job_seconds.max(0.0),
    )
    .filter(|reserve| *reserve <= most.max(0))
}

/// The default rule: the smallest reserve whose predicted wait p99 is at most the job time, for
/// the arrival rate × `headroom`: what the guide's test of a working pool ("urgent p99 close
/// to the job's own duration") and the `LanePoolReserveTooSmall` alert ask. `None` when the
/// load is endless.
pub fn wait_within_job_time(arrival_rate: f64, job_seconds: f64, headroom: f64) -> Option<i32> {
    smallest_reserve(arrival_rate * headroom, job_seconds, job_seconds)
}
