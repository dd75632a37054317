//! Which of the pools' Deployment events reconcile their pool at once, before its next interval.
//! A Deployment that appears, goes or has its spec changed (its generation: another writer's
//! edit, or this operator's own apply) does; a change of its status does only while its pool's
//! shrink waits for the growing Deployments to be ready (`rollout/surge.rs`), and only when its
//! ready count moved. kube-controller-manager rewrites a Deployment's status several times while
//! its Pods start, and a reconcile asked for now goes ahead of pools whose interval is already
//! up: at 1,000 pools those status events kept the pools that were due from being measured.

use std::collections::HashMap;

use kube::runtime::watcher::Event;

use super::deployments::CachedDeployment;

/// What was last seen of each Deployment, by uid.
#[derive(Default)]
pub(super) struct Triggers {
    seen: HashMap<String, Seen>,
    /// What a relist has shown so far: it replaces `seen` when the relist is done, so a
    /// Deployment deleted while the watch was away is not remembered.
    relisting: Option<HashMap<String, Seen>>,
}

#[derive(Clone, Copy, PartialEq)]
struct Seen {
    generation: Option<i64>,
    ready: Option<i32>,
}

impl Seen {
    fn of(deployment: &CachedDeployment) -> Self {
        Self {
            generation: deployment.metadata.generation,
            ready: deployment.status.as_ref().and_then(|s| s.ready_replicas),
        }
    }
}

impl Triggers {
    /// The Deployment whose pool `event` reconciles now, if any. `waiting`: whether the pool
    /// owning a Deployment has a shrink waiting for its growing Deployments to be ready.
    pub(super) fn wakes(
        &mut self,
        event: Event<CachedDeployment>,
        waiting: impl FnOnce(&CachedDeployment) -> bool,
    ) -> Option<CachedDeployment> {
        match event {
            Event::Apply(deployment) | Event::InitApply(deployment) => {
                let uid = deployment.metadata.uid.clone().unwrap_or_default();
                let now = Seen::of(&deployment);
                let was = match self.relisting.as_mut() {
                    Some(next) => {
                        next.insert(uid.clone(), now);
                        self.seen.get(&uid).copied()
                    }
                    None => self.seen.insert(uid, now),
                };
                let wakes = match was {
                    None => true,
                    Some(was) if was.generation != now.generation => true,
                    Some(was) => was.ready != now.ready && waiting(&deployment),
                };
                wakes.then_some(deployment)
            }
            Event::Delete(deployment) => {
                self.seen
                    .remove(deployment.metadata.uid.as_deref().unwrap_or_default());
                Some(deployment)
            }
            Event::Init => {
                self.relisting = Some(HashMap::new());
                None
            }
            Event::InitDone => {
                if let Some(next) = self.relisting.take() {
                    self.seen = next;
                }
                None
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::controller::deployments::CachedStatus;
    use kube::api::ObjectMeta;

    fn deployment(uid: &str, generation: i64, ready: i32) -> CachedDeployment {
        CachedDeployment {
            metadata: ObjectMeta {
                uid: Some(uid.into()),
                generation: Some(generation),
                ..Default::default()
            },
            spec: None,
            status: Some(CachedStatus {
                observed_generation: Some(generation),
                replicas: Some(ready),
                ready_replicas: Some(ready),
                updated_replicas: Some(ready),
                available_replicas: Some(ready),
            }),
        }
    }

    fn wakes(triggers: &mut Triggers, event: Event<CachedDeployment>, waiting: bool) -> bool {
        triggers.wakes(event, |_| waiting).is_some()
    }

    #[test]
    fn a_new_changed_or_deleted_deployment_wakes_its_pool() {
        let mut triggers = Triggers::default();
        assert!(wakes(
            &mut triggers,
            Event::InitApply(deployment("a", 1, 0)),
            false
        ));
        assert!(!wakes(&mut triggers, Event::InitDone, false));
        assert!(!wakes(
            &mut triggers,
            Event::Apply(deployment("a", 1, 0)),
            false
        ));
        assert!(
            wakes(&mut triggers, Event::Apply(deployment("a", 2, 0)), false),
            "a spec change"
        );
        assert!(wakes(
            &mut triggers,
            Event::Delete(deployment("a", 2, 0)),
            false
        ));
        assert!(
            wakes(&mut triggers, Event::Apply(deployment("a", 2, 0)), false),
            "made again after it went"
        );
    }

    #[test]
    fn a_status_change_wakes_only_a_pool_whose_shrink_waits_and_only_when_ready_moved() {
        let mut triggers = Triggers::default();
        wakes(&mut triggers, Event::Apply(deployment("a", 1, 0)), false);
        assert!(!wakes(
            &mut triggers,
            Event::Apply(deployment("a", 1, 1)),
            false
        ));
        assert!(wakes(
            &mut triggers,
            Event::Apply(deployment("a", 1, 2)),
            true
        ));
        let mut same_ready = deployment("a", 1, 2);
        same_ready.status.as_mut().unwrap().available_replicas = Some(1);
        assert!(
            !wakes(&mut triggers, Event::Apply(same_ready), true),
            "ready did not move"
        );
    }

    #[test]
    fn a_relist_wakes_only_what_changed_while_the_watch_was_away() {
        let mut triggers = Triggers::default();
        wakes(&mut triggers, Event::Apply(deployment("a", 1, 3)), false);
        wakes(&mut triggers, Event::Apply(deployment("b", 1, 3)), false);
        assert!(!wakes(&mut triggers, Event::Init, false));
        assert!(!wakes(
            &mut triggers,
            Event::InitApply(deployment("a", 1, 3)),
            false
        ));
        assert!(wakes(
            &mut triggers,
            Event::InitApply(deployment("b", 2, 3)),
            false
        ));
        assert!(!wakes(&mut triggers, Event::InitDone, false));
        assert!(!wakes(
            &mut triggers,
            Event::Apply(deployment("b", 2, 3)),
            false
        ));
        assert_eq!(triggers.seen.len(), 2);
        triggers.wakes(Event::Init, |_| false);
        triggers.wakes(Event::InitApply(deployment("a", 1, 3)), |_| false);
        triggers.wakes(Event::InitDone, |_| false);
        assert_eq!(triggers.seen.len(), 1, "b went while the watch was away");
    }
}
