//! Template changes, without I/O: when a Deployment's pod template changes (the pool's template,
//! its lanes, the operator's own additions), its Deployment controller starts workers of the new
//! template and stops those of the old one. The new workers carry a readiness gate
//! (`deployments.rs`), so none counts as available, and no old worker is stopped for it (no old
//! worker goes before a new one is available), until the operator opens its gate. It opens one
//! gate for each old worker drained and known idle: the rollover is a drain, as a shrink of the
//! old workers by as many as wait for their gate, and the Deployment controller then stops the
//! idle ones (cost -1 first). Gates of workers that only grow a Deployment open at once. The
//! gates are planned in `plan/gates.rs`.

use super::drain::Drain;
use super::shrink::Shrink;
use std::time::Duration;

/// The drain a rollover stands for: the `old` workers of a Deployment's older templates shrink
/// by as many as `waiting` new workers wait for their gate (all of them, at most).
pub(in crate::controller) fn rollover(
    deployment: &str,
    old: usize,
    waiting: usize,
    lanes: Vec<String>,
) -> Shrink {
    let live = i32::try_from(old).unwrap_or(i32::MAX);
    let by = i32::try_from(waiting.min(old)).unwrap_or(i32::MAX);
    Shrink {
        deployment: deployment.to_string(),
        live,
        to: live - by,
        lanes,
    }
}

/// How many of the waiting new workers' gates open now: one for each old worker the drain lets
/// go (its [`Drain::floor`]: drained and known idle, or ranked only when none drains; none
/// before it chose its workers), and no more than wait. With no old worker left, every waiting gate opens.
pub(in crate::controller) fn gates_to_open(
    rollover: &Shrink,
    drain: &Drain,
    waiting: usize,
    now: Duration,
) -> usize {
    if rollover.live == 0 {
        return waiting;
    }
    // A drain that has not chosen its workers yet has confirmed nothing.
    if !drain.started {
        return 0;
    }
    let may_go = rollover.live - drain.floor(rollover, now);
    usize::try_from(may_go).unwrap_or(0).min(waiting)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::controller::rollout::drain::{Candidate, DrainAnswer};
    use std::collections::BTreeMap;

    #[test]
    fn a_gate_opens_only_for_an_old_worker_drained_and_known_idle() {
        let s = Duration::from_secs;
        // 4 old workers, 2 new ones waiting: a drain of the old ones by 2.
        let shrink = rollover("jobs-shared", 4, 2, vec!["batch".into()]);
        assert_eq!((shrink.live, shrink.to), (4, 2));
        let mut drain = Drain::default();
        assert_eq!(
            gates_to_open(&shrink, &drain, 2, s(0)),
            0,
            "nothing read yet"
        );
        let candidates = [
            Candidate::ready_at("a", 3001),
            Candidate::ready_at("b", 1501),
            Candidate::ready_at("c", 0),
            Candidate::ready_at("d", 2001),
        ];
        drain.start(&shrink, &candidates, &[3.0], s(120), s(0));
        let chosen: Vec<String> = drain.pods.keys().cloned().collect();
        assert_eq!(
            chosen,
            ["b", "c"],
            "the idle one, then the one nearest done"
        );
        drain.answered(
            BTreeMap::from([
                ("b".to_string(), DrainAnswer::Draining { busy: true }),
                ("c".to_string(), DrainAnswer::Draining { busy: false }),
            ]),
            Duration::ZERO,
        );
        assert_eq!(gates_to_open(&shrink, &drain, 2, s(1)), 0, "b still busy");
        // Past the drain timeout a busy worker keeps its place: only the idle one's gate opens.
        assert_eq!(gates_to_open(&shrink, &drain, 2, s(10)), 1);
        drain.answered(
            BTreeMap::from([("b".to_string(), DrainAnswer::Draining { busy: false })]),
            Duration::ZERO,
        );
        assert_eq!(gates_to_open(&shrink, &drain, 2, s(11)), 2);
        // Never more than wait.
        assert_eq!(gates_to_open(&shrink, &drain, 1, s(11)), 1);
    }

    #[test]
    fn gates_open_at_once_without_old_workers_and_as_ranked_when_none_drains() {
        let s = Duration::from_secs;
        let growth = rollover("jobs-shared", 0, 3, vec![]);
        assert_eq!(gates_to_open(&growth, &Drain::default(), 3, s(0)), 3);
        let shrink = rollover("jobs-shared", 2, 5, vec![]);
        assert_eq!((shrink.live, shrink.to), (2, 0));
        let mut drain = Drain::default();
        drain.start(
            &shrink,
            &[Candidate::ready_at("a", 0), Candidate::ready_at("b", 0)],
            &[],
            s(120),
            s(0),
        );
        drain.answered(
            BTreeMap::from([
                ("a".to_string(), DrainAnswer::Refused),
                ("b".to_string(), DrainAnswer::Refused),
            ]),
            Duration::ZERO,
        );
        // Both refused: another would be chosen in their place, but none is left.
        drain.start(&shrink, &[], &[], s(120), s(1));
        assert_eq!(gates_to_open(&shrink, &drain, 5, s(1)), 2);
        // Unknown holds: a worker not heard from keeps its gate shut, even past the timeout.
        let mut silent = Drain::default();
        silent.start(
            &shrink,
            &[Candidate::ready_at("a", 0), Candidate::ready_at("b", 0)],
            &[],
            s(120),
            s(0),
        );
        silent.answered(
            BTreeMap::from([
                ("a".to_string(), DrainAnswer::Unreachable),
                ("b".to_string(), DrainAnswer::Draining { busy: false }),
            ]),
            Duration::ZERO,
        );
        assert_eq!(
            gates_to_open(&shrink, &silent, 5, s(1)),
            0,
            "within the timeout"
        );
        assert_eq!(gates_to_open(&shrink, &silent, 5, s(200)), 1, "b only");
    }
}
