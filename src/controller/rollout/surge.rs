//! Role changes that never dip a pool's capacity: a Deployment that grows gets its new count at
//! once, and one that shrinks keeps its count until the Deployments that take over its capacity
//! (those growing in this surge) are ready at their new counts, or until the surge timeout. A
//! Deployment that does not change is never waited for: one of its Pods stuck Pending holds no
//! shrink. Pure; it never decides counts, only the order in which decided counts reach the
//! Deployments.

use std::time::Duration;

/// How long a shrink waits for the growing Deployments by default: long enough for a pod to be
/// scheduled and pulled, short enough that a surge that cannot fit (no room for the new pods)
/// still ends. Waiting costs no capacity: the old workers keep working.
pub const DEFAULT_SURGE_TIMEOUT: Duration = Duration::from_secs(120);

/// One Deployment's counts.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Counts {
    /// What the decision asks for.
    pub target: i32,
    /// `spec.replicas` now; `None` when the Deployment does not exist yet.
    pub live: Option<i32>,
    /// `status.readyReplicas` now.
    pub ready: i32,
    /// It grows in this surge: its new workers take over a shrinking Deployment's capacity, so
    /// a shrink waits for them.
    pub takes_over: bool,
}

impl Counts {
    /// Whether the decision shrinks this Deployment.
    pub fn shrinks(&self) -> bool {
        self.live.is_some_and(|live| self.target < live)
    }
}

/// The counts to apply now, and whether a shrink is waiting for the others to be ready.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Step {
    pub apply: Vec<i32>,
    pub waiting: bool,
}

/// `waited`: how long shrinks have been waiting already (`None`: they were not waiting).
pub fn step(deployments: &[Counts], waited: Option<Duration>, timeout: Duration) -> Step {
    let others_ready = deployments
        .iter()
        .filter(|c| !c.shrinks() && c.takes_over)
        .all(|c| c.ready >= c.target);
    let timed_out = waited.unwrap_or_default() >= timeout;
    let waiting = deployments.iter().any(Counts::shrinks) && !others_ready && !timed_out;
    let apply = deployments
        .iter()
        .map(|c| match c.live {
            Some(live) if waiting && c.target < live => live,
            _ => c.target,
        })
        .collect();
    Step { apply, waiting }
}

#[cfg(test)]
mod tests {
    use super::*;

    const TIMEOUT: Duration = Duration::from_secs(120);

    /// A Deployment at `live` going to `target`: it takes over when it grows.
    fn counts(target: i32, live: i32, ready: i32) -> Counts {
        Counts {
            target,
            live: Some(live),
            ready,
            takes_over: target > live,
        }
    }

    /// One that grew earlier in this surge and is at its new count, not yet ready.
    fn grown(target: i32, ready: i32) -> Counts {
        Counts {
            takes_over: true,
            ..counts(target, target, ready)
        }
    }

    #[test]
    fn the_reserve_grows_at_once_and_shared_shrinks_once_the_new_workers_are_ready() {
        // Reserve 1 → 3 in a budget of 10: shared 9 → 7.
        let starting = [counts(3, 1, 1), counts(7, 9, 9)];
        let first = step(&starting, None, TIMEOUT);
        assert_eq!(first.apply, vec![3, 9]);
        assert!(first.waiting);
        let half = [grown(3, 2), counts(7, 9, 9)];
        assert_eq!(
            step(&half, Some(Duration::from_secs(5)), TIMEOUT).apply,
            vec![3, 9]
        );
        let ready = [grown(3, 3), counts(7, 9, 9)];
        let done = step(&ready, Some(Duration::from_secs(10)), TIMEOUT);
        assert_eq!(done.apply, vec![3, 7]);
        assert!(!done.waiting);
    }

    #[test]
    fn the_reserve_shrinks_only_once_shared_workers_took_its_place() {
        let start = [counts(1, 3, 3), counts(9, 7, 7)];
        assert_eq!(step(&start, None, TIMEOUT).apply, vec![3, 9]);
        let ready = [counts(1, 3, 3), grown(9, 9)];
        assert_eq!(
            step(&ready, Some(Duration::from_secs(10)), TIMEOUT).apply,
            vec![1, 9]
        );
    }

    #[test]
    fn a_surge_that_never_gets_ready_ends_at_the_timeout() {
        let stuck = [grown(3, 1), counts(7, 9, 9)];
        assert!(step(&stuck, Some(Duration::from_secs(119)), TIMEOUT).waiting);
        let over = step(&stuck, Some(TIMEOUT), TIMEOUT);
        assert_eq!(over.apply, vec![3, 7]);
        assert!(!over.waiting);
        // A zero timeout turns the surge off.
        assert_eq!(step(&stuck, None, Duration::ZERO).apply, vec![3, 7]);
    }

    #[test]
    fn new_deployments_and_pure_growth_never_wait() {
        let new = [
            Counts {
                target: 2,
                live: None,
                ready: 0,
                takes_over: true,
            },
            counts(8, 8, 0),
        ];
        let first = step(&new, None, TIMEOUT);
        assert_eq!(first.apply, vec![2, 8]);
        assert!(!first.waiting);
        // Fixed shared workers: only the reserve moves, down at once when nothing grows.
        let down = [counts(1, 3, 3), counts(8, 8, 8)];
        assert_eq!(step(&down, None, TIMEOUT).apply, vec![1, 8]);
    }

    #[test]
    fn a_shrink_waits_only_for_the_deployments_that_take_over_its_capacity() {
        // Fixed shared workers, one of them stuck Pending (a full cluster): the reserve shrinks
        // at once; nothing takes over its capacity, and the stuck Pod is no reason to wait.
        let stuck_shared = [counts(1, 3, 3), counts(8, 8, 7)];
        let step_now = step(&stuck_shared, None, TIMEOUT);
        assert_eq!(step_now.apply, vec![1, 8]);
        assert!(!step_now.waiting);
        // Two reserve lanes trade places: the shrink waits for the growing lane alone, not for
        // the shared Deployment that does not change (and is not ready).
        let trade = [counts(1, 3, 3), counts(3, 1, 1), counts(6, 6, 5)];
        assert_eq!(step(&trade, None, TIMEOUT).apply, vec![3, 3, 6]);
        let grown_ready = [counts(1, 3, 3), grown(3, 3), counts(6, 6, 5)];
        assert_eq!(
            step(&grown_ready, Some(Duration::from_secs(3)), TIMEOUT).apply,
            vec![1, 3, 6]
        );
    }
}
