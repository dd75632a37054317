//! What one pool's reconciles remember between runs, without I/O: whether the pool is due for a
//! measurement, which source says what its Deployments were last given, what to remember after
//! each stage, and when to come back. The reconcile walks it forward: [`PoolMemory::start`], then
//! [`PoolMemory::measured`] and [`PoolMemory::decided`] (when due), the rollout's plan (`plan/`),
//! [`PoolMemory::rolled_out`] and [`PoolMemory::requeue_after`]; it is written back once.

pub(super) mod pools;
pub(super) mod worker_reads;

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::jiff::Timestamp;

use super::credential::CredentialMemory;
use super::deployments::{Role, pool_roles, spec_replicas};
use super::plan::Steering;
use super::rollout::Release;
use super::status::METRICS_AVAILABLE;
use crate::api::{Lane, LanePool, LanePoolStatus};
use crate::prometheus::Connection;
use crate::sizing::{Decision, History, Outage, Replicas};
use worker_reads::WorkerReads;

/// What one pool's reconciles remember between runs. Times are since the process started.
#[derive(Clone, Debug, Default, PartialEq)]
pub(super) struct PoolMemory {
    /// The recommendations the scale-down window looks back over.
    pub(super) history: History,
    pub(super) measured_at: Option<Duration>,
    /// The spec generation the last decision was made for.
    pub(super) generation: Option<i64>,
    /// The last decision.
    pub(super) replicas: Option<Replicas>,
    /// What was last applied to the Deployments: the decision, or a step of a surge towards it.
    pub(super) applied: Option<Replicas>,
    pub(super) failures: u32,
    /// How the pool last reached Prometheus: its client stays cached while the pool lives.
    pub(super) connection: Option<Connection>,
    /// The spec generation for which every Deployment labelled as the pool's was looked at (and
    /// a removed lane's removed): none yet after a start.
    pub(super) swept: Option<i64>,
    /// When this process last wrote the pool's status after a decision.
    pub(super) status_written: Option<Duration>,
    /// The status as this process last wrote or found it after a decision: what a change of
    /// what runs between decisions is written over.
    pub(super) shown: Option<LanePoolStatus>,
    /// Decisions in a row with some lane's metrics unavailable.
    pub(super) failed_intervals: u32,
    /// The Deployments no lane runs any more that still wait to go: looked up by name until they
    /// are removed.
    pub(super) leaving: BTreeSet<String>,
    /// What the rollout carries: the surge's wait, the drains and the stand-ins.
    pub(super) steering: Steering,
    /// The workers' finished-job counts read so far.
    pub(super) worker_reads: WorkerReads,
    /// Every lane's mean job time at the last measurement: drains and rankings go by it.
    pub(super) job_seconds: BTreeMap<String, f64>,
    /// The workers' credential, as this process knows it.
    pub(super) credential: CredentialMemory,
    /// The pool's workers that last answered `/metrics` without
    /// `lanepool_worker_credential_required 1` (an image that predates the credential), by name;
    /// `None` before any worker answered.
    pub(super) unchecked_workers: Option<Vec<String>>,
}

/// How old the measurements in a status may get while they stay within their tolerance.
pub(super) const STATUS_REFRESH: Duration = Duration::from_secs(300);

/// The largest share of the interval a pool's period is longer by.
pub(super) const MOST_JITTER: f64 = 0.08;

/// A pool's own jitter in `[0, MOST_JITTER)`, stable for its uid.
fn jitter(uid: &str) -> f64 {
    use std::hash::{Hash, Hasher};
    let mut hasher = std::hash::DefaultHasher::new();
    uid.hash(&mut hasher);
    (hasher.finish() % 1000) as f64 / 1000.0 * MOST_JITTER
}

/// How often the pool with `uid` is measured: its `interval`, later by its own [`jitter`], so
/// pools started together drift apart instead of querying together forever, and no pool's
/// workers are asked more often than once an interval.
pub(super) fn period(interval: Duration, uid: &str) -> Duration {
    interval.mul_f64(1.0 + jitter(uid))
}

/// Where a reconcile starts from.
#[derive(Clone, Debug, PartialEq)]
pub(super) struct Start {
    /// Measure and decide now; otherwise re-apply the last decision without querying.
    pub(super) due: bool,
    /// The replica counts the decision starts from: this process's last decision, or after a
    /// restart what the status or the Deployments say; `None` for a new pool.
    pub(super) current: Option<Replicas>,
    /// How long past its [`period`] the pool is measured, when it is due by time alone (not new,
    /// not its spec changed): zero when on time, more when reconciles queue behind others.
    pub(super) late: Option<Duration>,
}

impl PoolMemory {
    /// Whether the pool is due and what it runs now. A pool is due on its first reconcile here,
    /// when its spec changed, and once 90 % of its [`period`] has passed since the last
    /// measurement (so a requeue that fires a little early still measures).
    pub(super) fn start(
        &self,
        generation: Option<i64>,
        period: Duration,
        now: Duration,
        recorded: impl FnOnce() -> Option<Replicas>,
    ) -> Start {
        let period = self.read_period(period);
        let since = self.measured_at.map(|at| now.saturating_sub(at));
        let by_time = since.is_none_or(|since| since + period / 10 >= period);
        let fresh = self.replicas.is_none() || self.generation != generation;
        Start {
            due: fresh || by_time,
            current: self.replicas.clone().or_else(recorded),
            late: since
                .filter(|_| !fresh && by_time)
                .map(|since| since.saturating_sub(period)),
        }
    }

    /// The pool's `period`, or [`worker_reads::FIRST_RATE_READS`] while its first rate from the
    /// workers' reads is awaited.
    fn read_period(&self, period: Duration) -> Duration {
        match self.worker_reads.awaiting_first_rate() {
            true => period.min(worker_reads::FIRST_RATE_READS),
            false => period,
        }
    }

    /// Remembers how the pool was measured: the connection it was reached through and each
    /// lane's mean job time. A lane not measured this time keeps its last known job time (a
    /// failed query must not shorten a drain to its floor); a lane no longer in `lanes` is
    /// forgotten.
    pub(super) fn measured(
        &mut self,
        connection: Option<Connection>,
        job_seconds: BTreeMap<String, f64>,
        lanes: &[Lane],
    ) {
        self.connection = connection;
        self.job_seconds.extend(job_seconds);
        self.job_seconds
            .retain(|lane, _| lanes.iter().any(|l| l.name == *lane));
    }

    /// Remembers a decision made at `now` for the spec's `generation`.
    pub(super) fn decided(&mut self, decision: &Decision, generation: Option<i64>, now: Duration) {
        self.history = decision.history.clone();
        self.measured_at = Some(now);
        self.generation = generation;
        self.replicas = Some(decision.replicas());
        self.failed_intervals = decision.failed_intervals;
    }

    /// The metrics outage a decision at `now` (at `wall` on the clock the status is written
    /// by) continues: the failed decisions this process counted, and its start from the
    /// status's MetricsAvailable=False transition, which outlives a restart.
    pub(super) fn outage(&self, status: &LanePoolStatus, now: Duration, wall: Timestamp) -> Outage {
        let since = status
            .conditions
            .iter()
            .find(|c| c.type_ == METRICS_AVAILABLE && c.status == "False")
            .map(|c| {
                let ago = wall.duration_since(c.last_transition_time.0);
                now.saturating_sub(ago.try_into().unwrap_or_default())
            });
        Outage {
            failed_before: self.failed_intervals,
            since,
        }
    }

    /// The counts the Deployments should reach: the last decision.
    pub(super) fn target(&self) -> Replicas {
        self.replicas.clone().unwrap_or_default()
    }

    /// Remembers what the Deployments were given for the spec's `generation` (every Deployment
    /// labelled as the pool's was looked at for it).
    pub(super) fn rolled_out(&mut self, release: Release, generation: Option<i64>) {
        self.leaving = release.staying.into_iter().collect();
        self.applied = Some(release.replicas);
        self.swept = generation;
    }

    /// When to reconcile again: when the pool's [`period`] since the last measurement ends; or
    /// sooner when a waiting shrink's timeout ends first (readiness arrives as Deployment events,
    /// the timeout has to be watched for); never sooner than a second, except to follow a drain
    /// (see `Steering::requeue`).
    pub(super) fn requeue_after(
        &self,
        period: Duration,
        surge_timeout: Duration,
        now: Duration,
    ) -> Duration {
        let period = self.read_period(period);
        let measured_at = self.measured_at.unwrap_or(now);
        let wait = period.saturating_sub(now.saturating_sub(measured_at));
        let wait = wait.max(Duration::from_secs(1));
        let rollout = self.steering.requeue(surge_timeout, now);
        rollout.map_or(wait, |soon| soon.min(wait))
    }
}

/// What the pool runs, read after a restart: per lane the larger of the status and the live
/// Deployment (a restart mid-scale, before the status caught up, must not lose a grown reserve
/// and so skip the scale-down window); shared workers as the Deployment has them, else as the
/// status says. `None` when neither has every count.
pub(super) fn recorded_replicas(
    pool: &LanePool,
    status: &LanePoolStatus,
    existing: &BTreeMap<String, Deployment>,
) -> Option<Replicas> {
    let from_status =
        (status.observed_generation.is_some() && !status.lanes.is_empty()).then(|| Replicas {
            reserved: status
                .lanes
                .iter()
                .map(|l| (l.name.clone(), l.reserve))
                .collect(),
            shared: status.shared,
        });
    let mut live = Replicas::default();
    let mut live_shared = None;
    for (name, role, _) in pool_roles(pool, &Replicas::default()) {
        let Some(count) = existing.get(&name).and_then(spec_replicas) else {
            continue;
        };
        match role {
            Role::Reserved { lane } => {
                live.reserved.insert(lane, count);
            }
            Role::Shared => live_shared = Some(count),
        }
    }
    let Some(mut recorded) = from_status else {
        live.shared = live_shared?;
        return Some(live);
    };
    for (lane, count) in live.reserved {
        let reserve = recorded.reserved.entry(lane).or_insert(count);
        *reserve = (*reserve).max(count);
    }
    if let Some(shared) = live_shared {
        recorded.shared = shared;
    }
    Some(recorded)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::LaneStatus;
    use crate::controller::rollout::Rollout;
    use crate::controller::rollout::drain::{self, Drain};
    use crate::sizing::{LaneDecision, Recommendation};
    use k8s_openapi::api::apps::v1::DeploymentSpec;

    const INTERVAL: Duration = Duration::from_secs(10);

    fn secs(s: u64) -> Duration {
        Duration::from_secs(s)
    }

    #[test]
    fn a_lane_not_measured_this_time_keeps_its_last_job_time_and_a_removed_lane_is_forgotten() {
        let lane = |name: &str| Lane {
            name: name.into(),
            queue: None,
            reserve: None,
        };
        let mut memory = PoolMemory::default();
        let both = BTreeMap::from([("urgent".into(), 0.02), ("batch".into(), 30.0)]);
        memory.measured(None, both, &[lane("urgent"), lane("batch")]);
        // The batch lane's query failed: its 30 s jobs must not be forgotten (a drain of shared
        // workers would fall to 3 × 20 ms).
        let urgent = BTreeMap::from([("urgent".into(), 0.03)]);
        memory.measured(None, urgent.clone(), &[lane("urgent"), lane("batch")]);
        assert_eq!(
            memory.job_seconds,
            BTreeMap::from([("urgent".into(), 0.03), ("batch".into(), 30.0)])
        );
        memory.measured(None, urgent.clone(), &[lane("urgent")]);
        assert_eq!(memory.job_seconds, urgent);
    }

    #[test]
    fn an_outage_starts_when_the_status_says_metrics_became_unavailable() {
        use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
        let wall = Timestamp::from_second(1_800_000_000).unwrap();
        let condition = |status: &str| Condition {
            type_: METRICS_AVAILABLE.into(),
            status: status.into(),
            last_transition_time: Time(wall - k8s_openapi::jiff::SignedDuration::from_secs(90)),
            reason: "QueryFailed".into(),
            message: String::new(),
            observed_generation: None,
        };
        let memory = PoolMemory {
            failed_intervals: 2,
            ..Default::default()
        };
        let down = LanePoolStatus {
            conditions: vec![condition("False")],
            ..Default::default()
        };
        // 90 s before a decision 1,000 s after this process started (a restart keeps it).
        assert_eq!(
            memory.outage(&down, secs(1000), wall),
            Outage {
                failed_before: 2,
                since: Some(secs(910))
            }
        );
        let up = LanePoolStatus {
            conditions: vec![condition("True")],
            ..Default::default()
        };
        assert_eq!(memory.outage(&up, secs(1000), wall).since, None);
    }

    fn replicas(reserved: i32, shared: i32) -> Replicas {
        Replicas {
            reserved: BTreeMap::from([("urgent".to_string(), reserved)]),
            shared,
        }
    }

    fn decision(reserved: i32, shared: i32, at: Duration) -> Decision {
        Decision {
            lanes: vec![LaneDecision {
                name: "urgent".into(),
                load: None,
                needed: None,
                recommended: reserved,
                reserve: reserved,
                capped: false,
                arithmetic: None,
                explanation: String::new(),
            }],
            shared,
            history: BTreeMap::from([(
                "urgent".to_string(),
                vec![Recommendation {
                    at,
                    reserve: reserved,
                }],
            )]),
            unavailable: vec![],
            limited: vec![],
            below_total: vec![],
            failed_intervals: 0,
            outage: None,
        }
    }

    /// Memory after one decision of 2 reserved + 8 shared at `at`, generation 1.
    fn waiting(waiting: bool) -> Rollout {
        Rollout {
            step: Replicas::default(),
            waiting,
            taking_over: BTreeSet::from(["jobs-urgent-reserved".to_string()]),
            shrinks: vec![],
            stand_ins: vec![],
            growth: None,
            not_ready: vec![],
            leaving: vec![],
            decided: Replicas::default(),
            rules: crate::controller::rollout::Rules {
                surge_timeout: Duration::from_secs(120),
                rank: true,
                drain: true,
            },
        }
    }

    fn after_decision(at: Duration) -> PoolMemory {
        let mut memory = PoolMemory::default();
        memory.decided(&decision(2, 8, at), Some(1), at);
        memory
    }

    fn example() -> LanePool {
        serde_yaml::from_str(include_str!("../../../examples/lanepool.yaml")).unwrap()
    }

    fn deployment(replicas: i32) -> Deployment {
        Deployment {
            spec: Some(DeploymentSpec {
                replicas: Some(replicas),
                ..Default::default()
            }),
            ..Default::default()
        }
    }

    #[test]
    fn a_pool_new_to_this_process_is_due_and_starts_from_what_was_recorded() {
        let start =
            PoolMemory::default().start(Some(1), INTERVAL, secs(0), || Some(replicas(3, 7)));
        assert_eq!(
            start,
            Start {
                due: true,
                current: Some(replicas(3, 7)),
                late: None,
            }
        );
    }

    #[test]
    fn this_process_trusts_its_own_decision_over_the_record() {
        let memory = after_decision(secs(0));
        let start = memory.start(Some(1), INTERVAL, secs(5), || {
            panic!("the record is not read once there is a decision")
        });
        assert_eq!(start.current, Some(replicas(2, 8)));
        assert!(!start.due);
    }

    #[test]
    fn due_once_nine_tenths_of_the_interval_passed_or_the_spec_changed() {
        let memory = after_decision(secs(100));
        let due_at =
            |now: Duration, generation| memory.start(generation, INTERVAL, now, || None).due;
        assert!(!due_at(secs(100), Some(1)));
        assert!(!due_at(Duration::from_millis(108_999), Some(1)));
        assert!(due_at(secs(109), Some(1)));
        assert!(
            due_at(secs(101), Some(2)),
            "a new generation is measured at once"
        );
        assert!(due_at(secs(200), Some(1)));
    }

    #[test]
    fn a_measurement_due_by_time_says_how_late_it_is() {
        let memory = after_decision(secs(100));
        let late_at =
            |now: Duration, generation| memory.start(generation, INTERVAL, now, || None).late;
        assert_eq!(late_at(secs(105), Some(1)), None, "not due");
        assert_eq!(
            late_at(secs(109), Some(1)),
            Some(Duration::ZERO),
            "early by less than a tenth"
        );
        assert_eq!(late_at(secs(110), Some(1)), Some(Duration::ZERO));
        assert_eq!(late_at(secs(137), Some(1)), Some(secs(27)));
        assert_eq!(late_at(secs(137), Some(2)), None, "a new spec is not late");
    }

    #[test]
    fn a_decision_is_remembered_whole() {
        let memory = after_decision(secs(30));
        assert_eq!(memory.measured_at, Some(secs(30)));
        assert_eq!(memory.generation, Some(1));
        assert_eq!(memory.target(), replicas(2, 8));
        assert_eq!(memory.history["urgent"][0].at, secs(30));
        assert_eq!(memory.applied, None, "deciding is not applying");
    }

    #[test]
    fn a_waiting_shrink_keeps_the_time_it_started_waiting() {
        let mut memory = after_decision(secs(0));
        assert_eq!(memory.steering.surge_wait.waited(secs(3)), None);
        assert_eq!(
            memory.steering.surge_wait.follow(&waiting(true), secs(3)),
            None
        );
        assert_eq!(
            memory.steering.surge_wait.follow(&waiting(true), secs(8)),
            None
        );
        assert_eq!(memory.steering.surge_wait.since, Some(secs(3)));
        assert_eq!(memory.steering.surge_wait.waited(secs(8)), Some(secs(5)));
        assert_eq!(
            memory.steering.surge_wait.surge(secs(8)).taking_over.len(),
            1,
            "what it waits for"
        );
        assert_eq!(
            memory.steering.surge_wait.follow(&waiting(false), secs(9)),
            Some(secs(6)),
            "the wait ends"
        );
        assert_eq!(memory.steering.surge_wait.since, None);
        assert!(memory.steering.surge_wait.taking_over.is_empty());
        assert_eq!(
            memory.steering.surge_wait.follow(&waiting(false), secs(10)),
            None,
            "and ends once"
        );
        memory.steering.surge_wait.follow(&waiting(true), secs(12));
        assert_eq!(
            memory.steering.surge_wait.since,
            Some(secs(12)),
            "a new wait starts afresh"
        );
    }

    #[test]
    fn a_jittered_period_is_late_by_less_than_a_tenth_and_measures_on_time() {
        let memory = after_decision(secs(100));
        let uids = (0..200).map(|i| format!("uid-{i}"));
        let jitters: Vec<f64> = uids.clone().map(|u| jitter(&u)).collect();
        assert!(jitters.iter().all(|j| (0.0..MOST_JITTER).contains(j)));
        assert!(jitters.iter().any(|j| *j > MOST_JITTER / 2.0), "spread out");
        assert_eq!(jitter("same"), jitter("same"));
        for uid in uids {
            let period = period(INTERVAL, &uid);
            assert!(INTERVAL <= period && period < INTERVAL.mul_f64(1.0 + MOST_JITTER));
            let wait = memory.requeue_after(period, secs(120), secs(100));
            assert_eq!(wait, period, "never asked sooner than its period");
            let start = memory.start(Some(1), period, secs(100) + wait, || None);
            assert!(
                start.due,
                "a requeue {wait:?} after the measurement measures"
            );
            assert_eq!(
                start.late,
                Some(Duration::ZERO),
                "on time by its own period"
            );
        }
    }

    #[test]
    fn requeue_at_the_next_measurement_or_the_surge_timeout_whichever_is_first() {
        let mut memory = after_decision(secs(100));
        let timeout = secs(120);
        assert_eq!(memory.requeue_after(INTERVAL, timeout, secs(100)), secs(10));
        assert_eq!(memory.requeue_after(INTERVAL, timeout, secs(104)), secs(6));
        assert_eq!(
            memory.requeue_after(INTERVAL, timeout, secs(130)),
            secs(1),
            "overdue: soon, but not in a loop"
        );
        memory.steering.surge_wait.follow(&waiting(true), secs(100));
        let short = secs(3);
        assert_eq!(memory.requeue_after(INTERVAL, short, secs(101)), secs(2));
        assert_eq!(memory.requeue_after(INTERVAL, short, secs(104)), secs(1));
        assert_eq!(memory.requeue_after(INTERVAL, timeout, secs(101)), secs(9));
    }

    #[test]
    fn a_busy_drained_worker_brings_the_reconcile_back_within_a_second() {
        let mut memory = after_decision(secs(100));
        let busy = drain::Drained {
            asked_at: secs(100),
            idle: false,
            answered: None,
        };
        memory.steering.drains.insert(
            "jobs-shared".into(),
            Drain {
                timeout: secs(9),
                pods: BTreeMap::from([("jobs-shared-a".to_string(), busy)]),
                ..Default::default()
            },
        );
        let timeout = secs(120);
        assert_eq!(
            memory.requeue_after(INTERVAL, timeout, secs(101)),
            drain::DRAIN_POLL
        );
        // Idle (or out of time): renewed before it lapses, not polled.
        memory
            .steering
            .drains
            .get_mut("jobs-shared")
            .unwrap()
            .pods
            .get_mut("jobs-shared-a")
            .unwrap()
            .idle = true;
        assert_eq!(
            memory.requeue_after(INTERVAL, timeout, secs(101)),
            drain::DRAIN_RENEW
        );
        assert_eq!(
            memory.requeue_after(INTERVAL, timeout, secs(108)),
            secs(2),
            "the next measurement comes first"
        );
    }

    #[test]
    fn a_restart_mid_scale_keeps_the_grown_reserve_the_status_has_not_caught_up_with() {
        let pool = example();
        let status = LanePoolStatus {
            observed_generation: Some(3),
            shared: 8,
            lanes: vec![LaneStatus {
                name: "urgent".into(),
                reserve: 2,
                ..Default::default()
            }],
            ..Default::default()
        };
        // The operator grew the reserve to 5 and shrank shared to 5, then died before the status.
        let existing = BTreeMap::from([
            ("jobs-urgent-reserved".to_string(), deployment(5)),
            ("jobs-shared".to_string(), deployment(5)),
        ]);
        assert_eq!(
            recorded_replicas(&pool, &status, &existing),
            Some(replicas(5, 5))
        );
    }

    #[test]
    fn after_a_restart_the_status_is_the_record_when_it_has_lanes() {
        let pool = example();
        let status = LanePoolStatus {
            observed_generation: Some(3),
            shared: 6,
            lanes: vec![LaneStatus {
                name: "urgent".into(),
                reserve: 4,
                ..Default::default()
            }],
            ..Default::default()
        };
        // The Deployments were shrunk by hand while the operator was away: the status is higher.
        let existing = BTreeMap::from([("jobs-urgent-reserved".to_string(), deployment(1))]);
        assert_eq!(
            recorded_replicas(&pool, &status, &existing),
            Some(replicas(4, 6))
        );
    }

    #[test]
    fn without_a_status_the_deployments_are_the_record_and_need_the_shared_one() {
        let pool = example();
        let status = LanePoolStatus::default();
        let both = BTreeMap::from([
            ("jobs-urgent-reserved".to_string(), deployment(1)),
            ("jobs-shared".to_string(), deployment(9)),
        ]);
        assert_eq!(
            recorded_replicas(&pool, &status, &both),
            Some(replicas(1, 9))
        );
        let reserved_only = BTreeMap::from([("jobs-urgent-reserved".to_string(), deployment(1))]);
        assert_eq!(recorded_replicas(&pool, &status, &reserved_only), None);
        assert_eq!(recorded_replicas(&pool, &status, &BTreeMap::new()), None);
    }
}
