//! Queueing arithmetic: the guide's formula, and the M/D/c wait a reserve is sized by (Poisson
//! arrivals, a fixed job time, the reserved workers; the shared workers, which take a waiting
//! urgent job whenever they finish one of their own, shorten the wait's tail).

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
    predicted_wait_p99_helped(arrival_rate, job_seconds, reserve, None)
}

/// [`predicted_wait_p99`] with the shared workers' help, when it is known.
pub fn predicted_wait_p99_helped(
    arrival_rate: f64,
    job_seconds: f64,
    reserve: i32,
    help: Option<SharedHelp>,
) -> f64 {
    let mut blocking = 1.0;
    for k in 1..=reserve.max(0) {
        blocking = erlang_b_step(arrival_rate * job_seconds, k, blocking);
    }
    let free_ups = help.map_or(0.0, |help| help.free_ups(reserve));
    wait_p99(arrival_rate, job_seconds, reserve, blocking, free_ups)
}

/// The shared workers a lane can count on while its reserved workers are all busy: each takes
/// a waiting job of the lane as soon as it finishes its own (shared workers serve the reserve
/// lanes first), so together they free up `workers / job_seconds` times a second. The lane's
/// reserve still has to keep up with its load alone; the shared workers only cut the tail of
/// the wait, and in a large pool they free up every few milliseconds.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct SharedHelp {
    /// Mean time of the jobs shared workers run when no reserve lane waits.
    pub job_seconds: f64,
    /// Workers not reserved by the other lanes: the shared ones are these minus this lane's
    /// reserve, never fewer than `least` (0 and the replicas for a fixed number of shared
    /// workers).
    pub unreserved: i32,
    pub least: i32,
}

impl SharedHelp {
    /// How often a shared worker frees up, per second, beside a reserve of `reserve`.
    pub fn free_ups(&self, reserve: i32) -> f64 {
        if !(self.job_seconds.is_finite() && self.job_seconds > 0.0) {
            return 0.0;
        }
        let shared = self
            .unreserved
            .saturating_sub(reserve)
            .max(self.least)
            .max(0);
        f64::from(shared) / self.job_seconds
    }
}

/// Erlang B for `servers` from its value for one fewer (the recurrence, stable for any size).
fn erlang_b_step(offered: f64, servers: i32, blocking: f64) -> f64 {
    offered * blocking / (f64::from(servers) + offered * blocking)
}

/// The wait p99 from Erlang B at `reserve` servers, with shared workers freeing up `free_ups`
/// times a second. A job that finds every reserved worker busy waits for the first of a reserved
/// worker or a shared one to free up; the shared ones free up at random moments of their own
/// jobs, so their rate adds to the tail's decay once (a fixed job time doubles the reserve's).
fn wait_p99(
    arrival_rate: f64,
    job_seconds: f64,
    reserve: i32,
    blocking: f64,
    free_ups: f64,
) -> f64 {
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
    let decay = 2.0 * (servers / job_seconds - arrival_rate) + free_ups.max(0.0);
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
    smallest_reserve_helped(arrival_rate, job_seconds, wait_seconds, None)
}

/// [`smallest_reserve`] with the shared workers' help, when it is known.
pub fn smallest_reserve_helped(
    arrival_rate: f64,
    job_seconds: f64,
    wait_seconds: f64,
    help: Option<SharedHelp>,
) -> Option<i32> {
    let offered = arrival_rate * job_seconds;
    if !offered.is_finite() || wait_seconds.is_nan() || wait_seconds < 0.0 {
        return None;
    }
    let mut blocking = 1.0;
    for reserve in 0..=MOST_SEARCHED {
        if reserve > 0 {
            blocking = erlang_b_step(offered, reserve, blocking);
        }
        let free_ups = help.map_or(0.0, |help| help.free_ups(reserve));
        if wait_p99(arrival_rate, job_seconds, reserve, blocking, free_ups) <= wait_seconds {
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

/// How long a worker is away between two jobs beyond the job's own time: reporting one done and
/// asking for the next, at least a round trip each to its queue. Measured on the demo's lane
/// queue and workers over loopback HTTP (`lane_queue --job-log`: 0.3-0.4 ms; the simulator's
/// `QUEUE_HANDOFF`). Workers measure their jobs' run time only, so the default rule adds this
/// to each job a reserved worker serves; a 5 ms job keeps its worker 8 % longer.
pub const HANDOFF_SECONDS: f64 = 0.0004;

/// The default rule: the smallest reserve whose predicted wait p99 is at most the job time, for
/// the arrival rate × `headroom`, each job keeping its worker for the job time and a hand-off
/// ([`HANDOFF_SECONDS`]): what the guide's test of a working pool ("urgent p99 close to the
/// job's own duration") and the `LanePoolReserveTooSmall` alert ask. `None` when the load is
/// endless.
pub fn wait_within_job_time(
    arrival_rate: f64,
    job_seconds: f64,
    headroom: f64,
    help: Option<SharedHelp>,
) -> Option<i32> {
    let served = job_seconds + HANDOFF_SECONDS;
    smallest_reserve_helped(arrival_rate * headroom, served, job_seconds, help)
}
