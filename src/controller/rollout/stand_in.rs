//! Stand-ins while a surge waits, without I/O: a Deployment that shrinks by k once the
//! Deployments taking over are ready has its k workers that will stop (the drain's pick) serve
//! the new workers' lanes until then (`POST /stand-in`), when those are among their own (shared
//! workers for a growing reserve), so a reserve grows at once rather than a pod start later. A
//! stand-in never holds anything back, and one the operator forgets lapses in the worker. The
//! requests are planned in `plan/stand_ins.rs`.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use super::drain::{Candidate, choose};
use super::shrink::StandIn;
use crate::controller::protocol::request_seconds;

/// How much longer than the surge's own limit a stand-in lasts in the worker: the reconcile that
/// ends the surge and the drain that follows, with room to spare.
const LAPSE_MARGIN: Duration = Duration::from_secs(15);

/// One shrinking Deployment's stand-ins, remembered between reconciles.
#[derive(Clone, Debug, Default, PartialEq)]
pub(crate) struct StandIns {
    /// The count the Deployment shrinks to, and the lanes its stand-ins serve, when they were
    /// chosen.
    pub(crate) to: i32,
    pub(crate) serves: Vec<String>,
    /// The workers standing in, by Pod name.
    pub(crate) pods: BTreeSet<String>,
    /// Pods that answered without standing in: not asked again for this surge.
    pub(crate) refused: BTreeSet<String>,
    /// Pods asked that gave no answer in time: they may have taken the request all the same,
    /// so they are sent back to their own lanes when the stand-in ends (not asked again).
    pub(crate) unheard: BTreeSet<String>,
    pub(crate) started: bool,
}

impl StandIns {
    /// Whether the workers are (re)chosen now: at the start, or when the count the Deployment
    /// shrinks to or the lanes to serve changed.
    pub(crate) fn starting(&self, stand_in: &StandIn) -> bool {
        !self.started || self.to != stand_in.shrink.to || self.serves != stand_in.serves
    }

    /// Chooses the workers for `stand_in` among `candidates`, as the drain will choose them once
    /// the surge is over (the k the ReplicaSet controller will delete; those standing in already
    /// first). Returns the workers to ask (all chosen: the lanes may have changed) and those
    /// standing in before that are no longer chosen (to be sent back to their own lanes).
    pub(crate) fn start(
        &mut self,
        stand_in: &StandIn,
        candidates: &[Candidate],
    ) -> (Vec<String>, Vec<String>) {
        let candidates: Vec<Candidate> = candidates
            .iter()
            .filter(|c| !self.refused.contains(&c.name))
            .map(|c| Candidate {
                draining: c.draining || self.pods.contains(&c.name),
                ..c.clone()
            })
            .collect();
        let shrink = &stand_in.shrink;
        let k = usize::try_from(shrink.live - shrink.to).unwrap_or(0);
        let chosen: BTreeSet<String> = choose(&candidates, k).into_iter().collect();
        let called_back = self.pods.difference(&chosen).cloned().collect();
        self.pods = chosen.clone();
        self.to = shrink.to;
        self.serves = stand_in.serves.clone();
        self.started = true;
        (chosen.into_iter().collect(), called_back)
    }

    /// Records the answers (`true`: standing in); a worker that refused is not asked again.
    pub(crate) fn answered(&mut self, answers: BTreeMap<String, bool>) {
        for (name, standing_in) in answers {
            if !standing_in && self.pods.remove(&name) {
                self.refused.insert(name);
            }
        }
    }

    /// Forgets the workers that are gone.
    pub(crate) fn keep_live<'a>(&mut self, live: impl IntoIterator<Item = &'a str>) {
        let live: BTreeSet<&str> = live.into_iter().collect();
        self.pods.retain(|name| live.contains(name.as_str()));
        self.unheard.retain(|name| live.contains(name.as_str()));
    }

    /// The workers that may be standing in: those that said so, and those not heard from.
    pub(crate) fn maybe_standing_in(self) -> BTreeSet<String> {
        self.pods.into_iter().chain(self.unheard).collect()
    }
}

/// Takes out the stand-ins of Deployments whose shrink no longer waits for the surge (it goes
/// now, or was called off): their workers are to be drained, or to serve their own lanes again.
pub(crate) fn ended(
    stand_ins: &mut BTreeMap<String, StandIns>,
    waiting: &[StandIn],
) -> Vec<(String, StandIns)> {
    super::shrink::take_out_others(stand_ins, |d| {
        waiting.iter().any(|s| s.shrink.deployment == d)
    })
}

/// How long to ask a worker to stand in for: until the surge's limit (`surge_ends`) and
/// [`LAPSE_MARGIN`] beyond, in whole seconds.
pub(crate) fn lapse(surge_ends: Duration, now: Duration) -> u64 {
    // A stand-in past the protocol's hour lapses in the worker, which then serves its own lanes
    // again, as any worker not standing in does.
    request_seconds(surge_ends.saturating_sub(now) + LAPSE_MARGIN)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::controller::rollout::Shrink;

    fn stand_in(live: i32, to: i32) -> StandIn {
        StandIn {
            shrink: Shrink {
                deployment: "jobs-shared".into(),
                live,
                to,
                lanes: vec!["urgent".into(), "batch".into()],
            },
            serves: vec!["urgent".into()],
        }
    }

    #[test]
    fn the_workers_that_stand_in_are_the_ones_the_drain_will_stop() {
        let pods = [
            Candidate::ready_at("deep", 2900),
            Candidate::ready_at("idle", 0),
            Candidate::ready_at("ending", 200),
        ];
        let mut stand_ins = StandIns::default();
        let wanted = stand_in(3, 1);
        assert!(stand_ins.starting(&wanted));
        let (asked, called_back) = stand_ins.start(&wanted, &pods);
        assert_eq!(asked, ["ending", "idle"]);
        assert!(called_back.is_empty());
        assert!(!stand_ins.starting(&wanted));
        // The shrink grows to 3 → 2 meanwhile: the one standing in the longest stays, even if
        // another is idle now.
        let pods = [
            Candidate::ready_at("deep", 0),
            Candidate::ready_at("idle", 0),
            Candidate::ready_at("ending", 900),
        ];
        let (asked, called_back) = stand_ins.start(&stand_in(3, 2), &pods);
        assert_eq!(asked.len(), 1);
        assert!(["idle", "ending"].contains(&asked[0].as_str()));
        assert_eq!(called_back.len(), 1);
    }

    #[test]
    fn a_worker_that_refuses_is_not_asked_again_and_a_shrink_that_goes_ends_the_stand_ins() {
        let pods = [
            Candidate::ready_at("a", 0),
            Candidate::ready_at("b", 0),
            Candidate::ready_at("c", 5),
        ];
        let mut stand_ins = StandIns::default();
        let wanted = stand_in(3, 1);
        stand_ins.start(&wanted, &pods);
        stand_ins.answered(BTreeMap::from([("a".into(), false), ("b".into(), true)]));
        assert_eq!(stand_ins.pods, BTreeSet::from(["b".to_string()]));
        let (asked, _) = stand_ins.start(&stand_in(3, 2), &pods);
        assert!(!asked.contains(&"a".to_string()));
        let mut all = BTreeMap::from([("jobs-shared".to_string(), stand_ins)]);
        assert!(ended(&mut all, &[wanted]).is_empty());
        let gone = ended(&mut all, &[]);
        assert_eq!(gone.len(), 1);
        assert!(all.is_empty());
    }

    #[test]
    fn a_stand_in_lapses_after_the_surge_limit_and_its_margin() {
        let s = Duration::from_secs;
        assert_eq!(lapse(s(120), s(0)), 135);
        assert_eq!(lapse(s(120), Duration::from_millis(119_500)), 16);
        assert_eq!(lapse(s(120), s(500)), 15);
        // A surge timeout of hours: the protocol's hour at most, never a request refused.
        assert_eq!(lapse(s(7200), s(0)), 3600);
    }
}
