//! What an earlier leader left in the workers: drains and stand-ins it asked for and never
//! ended (it lost its lease, froze, restarted). The workers keep that state on the cluster and
//! say it at their `metrics` port (`lanepool_worker_draining 1`, `lanepool_worker_standing_in
//! 1`), so the first reconcile of a pool in this process reads it: a drain or stand-in this
//! process wants takes those workers first (they stopped taking jobs, or serve the lanes
//! already), and the rest are ended at once, a drained one's deletion cost -1 lowered first, so
//! no earlier leader's pick lingers until its lapse or decides which Pod a later shrink stops.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use super::drain::{Drain, Drained};
use super::stand_in::StandIns;

/// The workers that say they drain or stand in, by Deployment, as this process found them.
#[derive(Clone, Debug, Default, PartialEq)]
pub(in crate::controller) struct Inherited {
    pub(in crate::controller) draining: BTreeMap<String, BTreeSet<String>>,
    pub(in crate::controller) standing_in: BTreeMap<String, BTreeSet<String>>,
}

impl Inherited {
    /// Takes the inherited drains and stand-ins over as this process's own, not yet started, for
    /// the Deployments that have none: the next steps treat them as any drain or stand-in of
    /// theirs. One whose Deployment shrinks now is started with its workers chosen first (see
    /// `rollout::drain::choose`); the others are called off, and their workers asked at once to
    /// take their own lanes' jobs again (`seconds=0`).
    pub(in crate::controller) fn adopt(
        self,
        drains: &mut BTreeMap<String, Drain>,
        stand_ins: &mut BTreeMap<String, StandIns>,
        now: Duration,
    ) {
        for (deployment, pods) in self.draining {
            let drain = drains.entry(deployment).or_default();
            if drain.started {
                continue;
            }
            for pod in pods {
                let drained = Drained {
                    asked_at: now,
                    idle: false,
                };
                drain.pods.entry(pod).or_insert(drained);
            }
        }
        for (deployment, pods) in self.standing_in {
            let set = stand_ins.entry(deployment).or_default();
            if !set.started {
                set.pods.extend(pods);
            }
        }
    }

    /// How many workers drain or stand in.
    pub(in crate::controller) fn len(&self) -> usize {
        self.draining
            .values()
            .chain(self.standing_in.values())
            .map(BTreeSet::len)
            .sum()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn inherited_drains_and_stand_ins_become_unstarted_ones_of_deployments_without_their_own() {
        let s = Duration::from_secs;
        let set = |names: &[&str]| names.iter().map(|n| n.to_string()).collect::<BTreeSet<_>>();
        let inherited = Inherited {
            draining: BTreeMap::from([
                ("jobs-shared".to_string(), set(&["a", "b"])),
                ("jobs-urgent-reserved".to_string(), set(&["c"])),
            ]),
            standing_in: BTreeMap::from([("jobs-shared".to_string(), set(&["d"]))]),
        };
        assert_eq!(inherited.len(), 4);
        // The reserve's drain is this process's own already: it is left as it is.
        let own = Drain {
            started: true,
            ..Drain::default()
        };
        let mut drains = BTreeMap::from([("jobs-urgent-reserved".to_string(), own.clone())]);
        let mut stand_ins = BTreeMap::new();
        inherited.adopt(&mut drains, &mut stand_ins, s(7));
        assert_eq!(drains["jobs-urgent-reserved"], own);
        let shared = &drains["jobs-shared"];
        assert!(!shared.started, "chosen anew by the next step");
        assert_eq!(
            shared.pods.keys().cloned().collect::<BTreeSet<_>>(),
            set(&["a", "b"])
        );
        assert!(
            shared.pods.values().all(|d| !d.idle && d.asked_at == s(7)),
            "unknown is never idle"
        );
        assert_eq!(stand_ins["jobs-shared"].pods, set(&["d"]));
        assert!(!stand_ins["jobs-shared"].started);
    }
}
