//! What a team runs without lanepool: KEDA ScaledObjects on Redis list lengths, whose
//! Deployments the HPA controller sizes. A model of the upstream behaviour with its defaults;
//! each assumption sits beside its formula with its source. It never sees lanepool's sizing.
//!
//! Sources (KEDA 2.21, Kubernetes 1.34):
//! - KEDA's Redis Lists scaler (keda.sh/docs/2.21/scalers/redis-lists): the metric is the list's
//!   `LLEN`, the target `listLength` (default 5) per replica as an `AverageValue`, a trigger is
//!   active while `LLEN` > `activationListLength` (default 0).
//! - KEDA's ScaledObject spec (keda.sh/docs/2.21/reference/scaledobject-spec): `pollingInterval`
//!   (default 30 s) is how often the operator checks each trigger; it acts itself only between 0
//!   and 1 replica, and scales to 0 once no trigger was active for `cooldownPeriod` (default
//!   300 s); from 1 to N the HPA decides. `minReplicaCount` 0 means the HPA's minimum is 1.
//! - KEDA's metrics server asks the scaler on every HPA request unless `useCachedMetrics` is set
//!   (default false; kedacore/keda#2282): the HPA sees `LLEN` as of its own sync, not the poll.
//! - The HPA (kubernetes.io/docs/tasks/run-application/horizontal-pod-autoscale, "Algorithm
//!   details" and "Default behavior"): every 15 s (`--horizontal-pod-autoscaler-sync-period`),
//!   desired = ceil(metric ÷ target) unless metric ÷ (target × replicas) is within 10 % of 1; the
//!   largest over the triggers; scale-down stabilized over 300 s (the highest recommendation in
//!   the window), scale-up by at most max(100 %, 4 Pods) per 15 s; within [min, max].
//! - Scale-down deletes Pods as the ReplicaSet ranks them (no deletion cost is written): a busy
//!   worker gets SIGTERM, finishes its job (RQ's and Celery's warm shutdown) and is killed at the
//!   end of its grace period (`terminationGracePeriodSeconds`, default 30 s): a job still running
//!   then is cut short.

use std::collections::VecDeque;

use super::scenario::{Arm, Deployment, Lists, Nanos, Preference, ScaledObject};
#[cfg(test)]
use super::scenario::{COOLDOWN, Knobs};

const SECOND: Nanos = 1_000_000_000;
/// kube-controller-manager's `--horizontal-pod-autoscaler-sync-period` default.
pub const HPA_SYNC: Nanos = 15 * SECOND;
/// `--horizontal-pod-autoscaler-tolerance` default.
pub const HPA_TOLERANCE: f64 = 0.1;
/// `behavior.scaleDown.stabilizationWindowSeconds` default.
pub const SCALE_DOWN_STABILIZATION: Nanos = 300 * SECOND;

/// The lists' lengths as `LLEN` answers them.
#[derive(Clone, Copy, Debug, Default)]
pub struct Lengths {
    pub urgent: u64,
    pub batch: u64,
}

/// One ScaledObject's state: its Deployment's replicas, the HPA's recent recommendations and
/// when a trigger was last active.
#[derive(Clone, Debug)]
struct Scaler {
    object: ScaledObject,
    replicas: u32,
    /// (when, recommendation before stabilization), the last 300 s.
    recommendations: VecDeque<(Nanos, u32)>,
    last_active: Nanos,
}

impl Scaler {
    fn lengths(&self, lengths: Lengths) -> Vec<u64> {
        match self.object.lists {
            Lists::Urgent => vec![lengths.urgent],
            Lists::Batch => vec![lengths.batch],
            Lists::Both => vec![lengths.urgent, lengths.batch],
        }
    }

    /// The KEDA operator's poll: 0 → 1 when a trigger is active, 1 → 0 after the cooldown.
    fn poll(&mut self, at: Nanos, active: bool) {
        if self.replicas == 0 && active {
            self.replicas = self.object.min.max(1);
        } else if self.replicas > 0
            && self.object.min == 0
            && !active
            && at.saturating_sub(self.last_active) >= self.object.cooldown
        {
            self.replicas = 0;
            self.recommendations.clear();
        }
    }

    /// The HPA's sync: a recommendation from the lists, stabilized and rate-limited.
    fn sync(&mut self, at: Nanos, lists: &[u64]) {
        if self.replicas == 0 {
            // The HPA is disabled at 0 replicas; KEDA's poll brings it back.
            return;
        }
        let current = self.replicas;
        let recommendation = self.recommend(lists);
        let (floor, most) = self.bounds();
        self.recommendations
            .retain(|(when, _)| at.saturating_sub(*when) < SCALE_DOWN_STABILIZATION);
        self.recommendations.push_back((at, recommendation));
        // Scale-up has no stabilization window by default; scale-down takes the highest
        // recommendation of the window.
        let down = self
            .recommendations
            .iter()
            .map(|(_, r)| *r)
            .max()
            .unwrap_or(recommendation);
        let mut desired = current.max(recommendation).min(down);
        // Default scale-up policies: 100 % or 4 Pods per 15 s, whichever allows more.
        let up_limit = current.saturating_mul(2).max(current.saturating_add(4));
        desired = desired.min(up_limit).clamp(floor, most);
        self.replicas = desired;
    }

    /// The HPA's minimum (at least 1) and maximum.
    fn bounds(&self) -> (u32, u32) {
        let floor = self.object.min.max(1);
        (floor, self.object.max.max(floor))
    }

    /// The HPA's count for the lists before stabilization: ceil(LLEN ÷ listLength) per trigger,
    /// the current replicas while within the tolerance, the largest over the triggers.
    fn recommend(&self, lists: &[u64]) -> u32 {
        let o = &self.object;
        let current = self.replicas;
        let (floor, most) = self.bounds();
        lists
            .iter()
            .map(|&length| {
                let metric = length as f64;
                let ratio = metric / (o.list_length * f64::from(current));
                if (ratio - 1.0).abs() <= HPA_TOLERANCE {
                    current
                } else {
                    (metric / o.list_length).ceil().min(f64::from(u32::MAX)) as u32
                }
            })
            .max()
            .unwrap_or(current)
            .clamp(floor, most)
    }
}

/// KEDA and the HPA over one arm's ScaledObjects.
#[derive(Clone, Debug)]
pub struct Keda {
    scalers: Vec<Scaler>,
}

impl Keda {
    /// As if it had been running at the opening lists: each Deployment at what its HPA
    /// recommends for them.
    pub fn start(arm: &Arm, lengths: Lengths) -> Self {
        let scalers = arm
            .objects
            .iter()
            .map(|object| {
                let mut scaler = Scaler {
                    object: object.clone(),
                    replicas: object.min.max(1),
                    recommendations: VecDeque::new(),
                    last_active: 0,
                };
                let lists = scaler.lengths(lengths);
                scaler.replicas = scaler.recommend(&lists);
                scaler.recommendations.push_back((0, scaler.replicas));
                scaler
            })
            .collect();
        Self { scalers }
    }

    /// Each Deployment's replicas and its workers' lanes.
    pub fn replicas(&self) -> Vec<(Deployment, Preference, usize)> {
        self.scalers
            .iter()
            .map(|s| (s.object.deployment, s.object.role, s.replicas as usize))
            .collect()
    }

    /// The first moment after `at` when KEDA polls or an HPA syncs.
    pub fn next_tick(&self, at: Nanos) -> Nanos {
        self.scalers
            .iter()
            .flat_map(|s| [s.object.polling.max(1), HPA_SYNC])
            .map(|every| (at / every + 1) * every)
            .min()
            .unwrap_or(at + HPA_SYNC)
    }

    /// The polls and syncs due at `at`, with the lists as they are now.
    pub fn tick(&mut self, at: Nanos, lengths: Lengths) {
        for scaler in &mut self.scalers {
            let lists = scaler.lengths(lengths);
            // activationListLength 0: active while any list holds a job.
            let active = lists.iter().any(|&l| l > 0);
            if active {
                scaler.last_active = at;
            }
            if at.is_multiple_of(scaler.object.polling.max(1)) {
                scaler.poll(at, active);
            }
            if at.is_multiple_of(HPA_SYNC) {
                scaler.sync(at, &lists);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn urgent(knobs: Knobs) -> Keda {
        let arm = Arm::two_lists(10, 5, knobs, 10 * SECOND);
        Keda::start(&arm, Lengths::default())
    }

    fn urgent_replicas(keda: &Keda) -> usize {
        keda.replicas()[0].2
    }

    #[test]
    fn the_hpa_scales_up_to_the_lists_length_over_its_target_at_its_sync() {
        let mut keda = urgent(Knobs::DEFAULT);
        assert_eq!(urgent_replicas(&keda), 1);
        let long = Lengths {
            urgent: 17,
            batch: 0,
        };
        keda.tick(14 * SECOND, long);
        assert_eq!(urgent_replicas(&keda), 1, "not a sync");
        keda.tick(15 * SECOND, long);
        // ceil(17 / 5) = 4, within the urgent maximum of 5.
        assert_eq!(urgent_replicas(&keda), 4);
        keda.tick(
            30 * SECOND,
            Lengths {
                urgent: 100,
                batch: 0,
            },
        );
        assert_eq!(urgent_replicas(&keda), 5, "the ScaledObject's maximum");
    }

    #[test]
    fn a_length_within_the_tolerance_keeps_the_replicas() {
        let mut keda = urgent(Knobs::DEFAULT);
        keda.tick(
            15 * SECOND,
            Lengths {
                urgent: 15,
                batch: 0,
            },
        );
        assert_eq!(urgent_replicas(&keda), 3);
        // 16 ÷ (5 × 3) = 1.07: within 10 %.
        keda.tick(
            30 * SECOND,
            Lengths {
                urgent: 16,
                batch: 0,
            },
        );
        assert_eq!(urgent_replicas(&keda), 3);
    }

    #[test]
    fn scale_up_is_limited_to_double_or_four_pods_a_sync() {
        let arm = Arm::two_lists(40, 30, Knobs::DEFAULT, 0);
        let mut keda = Keda::start(&arm, Lengths::default());
        keda.tick(
            15 * SECOND,
            Lengths {
                urgent: 1_000,
                batch: 0,
            },
        );
        assert_eq!(urgent_replicas(&keda), 5, "1 + 4 Pods");
        keda.tick(
            30 * SECOND,
            Lengths {
                urgent: 1_000,
                batch: 0,
            },
        );
        assert_eq!(urgent_replicas(&keda), 10, "doubled");
    }

    #[test]
    fn scale_down_waits_for_the_stabilization_window() {
        let mut keda = urgent(Knobs::DEFAULT);
        keda.tick(
            15 * SECOND,
            Lengths {
                urgent: 25,
                batch: 0,
            },
        );
        assert_eq!(urgent_replicas(&keda), 5);
        let empty = Lengths::default();
        let mut at = 30 * SECOND;
        while at < 15 * SECOND + SCALE_DOWN_STABILIZATION {
            keda.tick(at, empty);
            assert_eq!(urgent_replicas(&keda), 5, "at {} s", at / SECOND);
            at += HPA_SYNC;
        }
        keda.tick(at, empty);
        assert_eq!(urgent_replicas(&keda), 1, "the 5 left the window");
    }

    #[test]
    fn min_zero_scales_to_zero_after_the_cooldown_and_back_at_a_poll() {
        let knobs = Knobs {
            min: 0,
            ..Knobs::DEFAULT
        };
        let mut keda = urgent(knobs);
        let empty = Lengths::default();
        let mut at = 0;
        while at <= COOLDOWN {
            keda.tick(at, empty);
            at = keda.next_tick(at);
        }
        assert_eq!(urgent_replicas(&keda), 0, "idle for the cooldown");
        let one = Lengths {
            urgent: 1,
            batch: 0,
        };
        // The HPA's sync does not wake a Deployment at zero; KEDA's poll does.
        let sync_only = 345 * SECOND;
        keda.tick(sync_only, one);
        assert_eq!(urgent_replicas(&keda), 0);
        keda.tick(360 * SECOND, one);
        assert_eq!(urgent_replicas(&keda), 1);
    }

    #[test]
    fn two_triggers_take_the_larger_count_and_the_strict_arm_fills_the_pool() {
        let arm = Arm::strict(10, Knobs::DEFAULT, 0);
        let mut keda = Keda::start(
            &arm,
            Lengths {
                urgent: 0,
                batch: 1_000_000,
            },
        );
        assert_eq!(
            keda.replicas(),
            vec![(Deployment::Shared, Preference::UrgentFirst, 10)]
        );
        keda.tick(
            15 * SECOND,
            Lengths {
                urgent: 12,
                batch: 0,
            },
        );
        assert_eq!(keda.replicas()[0].2, 10, "scale-down is stabilized");
    }

    #[test]
    fn the_two_deployments_never_exceed_the_pool_together() {
        for workers in [2, 3, 10, 40, 100] {
            for urgent_max in [0, 1, workers / 2, workers] {
                let arm = Arm::two_lists(workers, urgent_max, Knobs::DEFAULT, 0);
                let maxima: u32 = arm.objects.iter().map(|o| o.max).sum();
                assert_eq!(
                    maxima, workers,
                    "{workers} workers, urgent max {urgent_max}"
                );
            }
        }
    }
}
