use std::collections::BTreeMap;
use std::time::Duration;

use super::decide::reserve_for;
use super::*;
use proptest::prelude::*;

fn pool(size: PoolSize, window_secs: u64) -> PoolSizing {
    let lanes = vec![LaneSizing {
        name: "urgent".into(),
        min: 1,
        max: 6,
        rule: Rule::Formula,
    }];
    PoolSizing {
        stabilization_window: Duration::from_secs(window_secs),
        ..PoolSizing::new(lanes, 1.5, size)
    }
}

/// The budget of [`budget`] without a scale-down window: every recommendation goes out at once.
fn budget_at_once() -> PoolSizing {
    pool(
        PoolSize::Budget {
            total: 10,
            shared_min: 2,
        },
        0,
    )
}

fn budget() -> PoolSizing {
    pool(
        PoolSize::Budget {
            total: 10,
            shared_min: 2,
        },
        300,
    )
}

fn loads(rate: f64, job: f64) -> BTreeMap<String, std::result::Result<LaneLoad, String>> {
    BTreeMap::from([(
        "urgent".to_string(),
        Ok(LaneLoad {
            arrival_rate: rate,
            recent_arrival_rate: None,
            job_seconds: Some(job),
        }),
    )])
}

fn replicas(reserved: i32, shared: i32) -> Replicas {
    Replicas {
        reserved: BTreeMap::from([("urgent".to_string(), reserved)]),
        shared,
    }
}

/// Runs one evaluation at `now` seconds.
fn at(
    sizing: &PoolSizing,
    loads: &BTreeMap<String, std::result::Result<LaneLoad, String>>,
    current: Option<&Replicas>,
    history: &History,
    now: u64,
) -> Decision {
    decide(
        sizing,
        Inputs {
            loads,
            current,
            history,
            now: Duration::from_secs(now),
            outage: Outage::default(),
            shared_job_seconds: None,
        },
    )
}

#[test]
fn the_guides_example_reserves_one_worker() {
    assert_eq!(formula(30.0, 0.020, 1.5).1, 1);
    let decision = at(&budget(), &loads(30.0, 0.020), None, &History::new(), 0);
    assert_eq!(decision.lanes[0].reserve, 1);
    assert_eq!(decision.shared, 9);
    assert_eq!(
        decision.lanes[0].explanation,
        "urgent 30/s × 20 ms × 1.5 = 0.9 → 1 → 1 reserved"
    );
}

#[test]
fn the_ceiling_forgives_floating_point_noise() {
    // 100 × 0.02 × 1.5 is 3.0000000000000004 in f64.
    assert_eq!(formula(100.0, 0.020, 1.5).1, 3);
    assert_eq!(formula(150.0, 0.020, 1.5).1, 5);
    assert_eq!(formula(92.0, 0.021, 1.5).1, 3);
}

#[test]
fn no_arrivals_gives_the_minimum() {
    let sizing = budget();
    let no_jobs = BTreeMap::from([(
        "urgent".to_string(),
        lane_load("urgent", &Ok(vec![0.0]), &Ok(vec![f64::NAN]), None),
    )]);
    let decision = at(&sizing, &no_jobs, None, &History::new(), 0);
    assert!(
        decision.unavailable.is_empty(),
        "{:?}",
        decision.unavailable
    );
    assert_eq!(decision.lanes[0].reserve, 1);
}

#[test]
fn malformed_answers_are_unavailable_never_zero() {
    let cases: [(&str, QueryAnswer); 6] = [
        ("NaN", Ok(vec![f64::NAN])),
        ("+Inf", Ok(vec![f64::INFINITY])),
        ("-Inf", Ok(vec![f64::NEG_INFINITY])),
        ("negative", Ok(vec![-1.0])),
        ("empty", Ok(vec![])),
        ("two series", Ok(vec![1.0, 2.0])),
    ];
    for (name, answer) in cases {
        let load = lane_load("urgent", &answer, &Ok(vec![0.02]), None);
        assert!(load.is_err(), "{name} read as {load:?}");
    }
    let err = lane_load(
        "urgent",
        &Err("connection refused".into()),
        &Ok(vec![0.02]),
        None,
    );
    assert_eq!(
        err,
        Err("lane urgent arrival rate: connection refused".to_string())
    );
}

#[test]
fn a_job_time_fallback_covers_a_window_without_finished_jobs() {
    let load = lane_load("urgent", &Ok(vec![30.0]), &Ok(vec![f64::NAN]), Some(0.02));
    assert_eq!(
        load,
        Ok(LaneLoad {
            arrival_rate: 30.0,
            recent_arrival_rate: None,
            job_seconds: Some(0.02)
        })
    );
    let without = lane_load("urgent", &Ok(vec![30.0]), &Ok(vec![]), None);
    assert!(without.unwrap_err().contains("jobTime.fallback"));
}

#[test]
fn unavailable_metrics_hold_the_current_counts() {
    let sizing = budget();
    let broken = BTreeMap::from([("urgent".to_string(), Err("prometheus down".to_string()))]);
    let now = replicas(4, 6);
    let decision = at(&sizing, &broken, Some(&now), &History::new(), 0);
    assert_eq!(decision.lanes[0].reserve, 4);
    assert_eq!(decision.shared, 6);
    assert_eq!(decision.unavailable, vec!["prometheus down".to_string()]);

    // A pool created while metrics are down starts at min, never at zero.
    let fresh = at(&sizing, &broken, None, &History::new(), 0);
    assert_eq!(fresh.lanes[0].reserve, 1);
    assert_eq!(fresh.shared, 9);
}

#[test]
fn a_fixed_reserve_applies_within_the_lane_bounds() {
    let mut sizing = budget();
    sizing.on_unavailable = UnavailablePolicy::FixedReserve(9);
    sizing.failure_threshold = 1;
    let broken = BTreeMap::from([("urgent".to_string(), Err("timeout".to_string()))]);
    let decision = at(&sizing, &broken, Some(&replicas(2, 8)), &History::new(), 0);
    assert_eq!(decision.lanes[0].reserve, 6, "clamped to reserve.max");
    assert_eq!(decision.shared, 4);
}

#[test]
fn scale_up_is_immediate() {
    let sizing = budget();
    let calm = at(&sizing, &loads(30.0, 0.02), None, &History::new(), 0);
    let spike = at(
        &sizing,
        &loads(150.0, 0.02),
        Some(&calm.replicas()),
        &calm.history,
        30,
    );
    assert_eq!(spike.lanes[0].reserve, 5);
    assert_eq!(spike.shared, 5);
}

#[test]
fn scale_down_waits_for_the_stabilization_window() {
    let sizing = budget();
    let mut decision = at(&sizing, &loads(150.0, 0.02), None, &History::new(), 0);
    assert_eq!(decision.lanes[0].reserve, 5);
    for now in (30..300).step_by(30) {
        decision = at(
            &sizing,
            &loads(30.0, 0.02),
            Some(&decision.replicas()),
            &decision.history,
            now,
        );
        assert_eq!(decision.lanes[0].reserve, 5, "scaled down at {now}s");
        assert!(decision.lanes[0].explanation.contains("held at 5"));
    }
    decision = at(
        &sizing,
        &loads(30.0, 0.02),
        Some(&decision.replicas()),
        &decision.history,
        300,
    );
    assert_eq!(decision.lanes[0].reserve, 1);
    assert_eq!(decision.shared, 9);
}

#[test]
fn a_zero_window_scales_down_at_once() {
    let sizing = pool(PoolSize::Shared { replicas: 8 }, 0);
    let decision = at(
        &sizing,
        &loads(30.0, 0.02),
        Some(&replicas(5, 8)),
        &History::new(),
        0,
    );
    assert_eq!(decision.lanes[0].reserve, 1);
    assert_eq!(decision.shared, 8);
}

#[test]
fn a_restart_does_not_shorten_the_scale_down_wait() {
    let sizing = budget();
    let running = replicas(5, 5);
    let decision = at(
        &sizing,
        &loads(30.0, 0.02),
        Some(&running),
        &History::new(),
        1000,
    );
    assert_eq!(decision.lanes[0].reserve, 5);
}

#[test]
fn a_reserve_above_max_is_capped_and_reported() {
    let sizing = budget();
    let decision = at(&sizing, &loads(400.0, 0.02), None, &History::new(), 0);
    assert_eq!(decision.lanes[0].reserve, 6);
    assert_eq!(decision.shared, 4);
    assert_eq!(decision.limited.len(), 1);
    assert!(decision.lanes[0].explanation.contains("max 6"));
}

#[test]
fn shared_mode_adds_the_reserve_on_top() {
    let sizing = pool(PoolSize::Shared { replicas: 8 }, 300);
    let decision = at(&sizing, &loads(150.0, 0.02), None, &History::new(), 0);
    assert_eq!(decision.lanes[0].reserve, 5);
    assert_eq!(decision.shared, 8);
}

fn arbitrary_pool() -> impl Strategy<Value = PoolSizing> {
    (
        0i32..5,
        0i32..20,
        0i32..4,
        0.1f64..10.0,
        any::<bool>(),
        0u64..600,
    )
        .prop_map(|(min, extra, shared_min, headroom, budget_mode, window)| {
            let max = (min + extra).max(1);
            let lanes = vec![LaneSizing {
                name: "urgent".into(),
                min,
                max,
                rule: Rule::Formula,
            }];
            let size = if budget_mode {
                PoolSize::Budget {
                    total: max + shared_min + 3,
                    shared_min,
                }
            } else {
                PoolSize::Shared { replicas: 4 }
            };
            PoolSizing {
                stabilization_window: Duration::from_secs(window),
                ..PoolSizing::new(lanes, headroom, size)
            }
        })
}

proptest! {
    #[test]
    fn the_reserve_stays_within_its_bounds_and_the_budget(
        sizing in arbitrary_pool(),
        rates in prop::collection::vec(0.0f64..1000.0, 1..20),
        job in 0.0f64..2.0,
    ) {
        let lane = &sizing.lanes[0];
        let mut current: Option<Replicas> = None;
        let mut history = History::new();
        for (step, rate) in rates.iter().enumerate() {
            let d = at(&sizing, &loads(*rate, job), current.as_ref(), &history, step as u64 * 30);
            let reserve = d.lanes[0].reserve;
            prop_assert!(lane.min <= reserve && reserve <= lane.max);
            if let PoolSize::Budget { total, shared_min } = sizing.size {
                prop_assert_eq!(reserve + d.shared, total);
                prop_assert!(d.shared >= shared_min);
            }
            current = Some(d.replicas());
            history = d.history;
        }
    }

    #[test]
    fn the_reserve_grows_with_arrival_rate_and_job_time(
        sizing in arbitrary_pool(),
        rate in 0.0f64..500.0,
        more_rate in 0.0f64..500.0,
        job in 0.0f64..1.0,
        more_job in 0.0f64..1.0,
    ) {
        let fresh = |r: f64, j: f64| at(&sizing, &loads(r, j), None, &History::new(), 0).lanes[0].reserve;
        prop_assert!(fresh(rate, job) <= fresh(rate + more_rate, job));
        prop_assert!(fresh(rate, job) <= fresh(rate, job + more_job));
    }

    #[test]
    fn constant_load_settles_and_stays(
        sizing in arbitrary_pool(),
        rate in 0.0f64..500.0,
        job in 0.0f64..1.0,
        start in 0i32..30,
    ) {
        let mut current = Some(replicas(start.clamp(sizing.lanes[0].min, sizing.lanes[0].max), 4));
        let mut history = History::new();
        let mut seen = Vec::new();
        for step in 0..60u64 {
            let d = at(&sizing, &loads(rate, job), current.as_ref(), &history, step * 30);
            seen.push(d.lanes[0].reserve);
            current = Some(d.replicas());
            history = d.history;
        }
        // Once it moves toward the recommendation it never turns back.
        let changes = seen.windows(2).filter(|w| w[0] != w[1]).count();
        prop_assert!(changes <= 1, "reserve changed {} times: {:?}", changes, seen);
        // It settles on a reserve the rate asks for within the tolerance: the one nearest to
        // where it started.
        let (min, max) = (sizing.lanes[0].min, sizing.lanes[0].max);
        let bound = |r: f64| formula(r, job, sizing.headroom).1.clamp(min, max);
        let (low, high) = (bound(rate / (1.0 + TOLERANCE)), bound(rate * (1.0 + TOLERANCE)));
        let last = *seen.last().unwrap();
        prop_assert!(low <= last && last <= high, "{:?} not in {}..={}", seen, low, high);
        prop_assert_eq!(last, start.clamp(min, max).clamp(low, high));
    }
}

#[test]
fn the_predicted_p99_falls_as_the_reserve_grows_and_is_infinite_when_overloaded() {
    assert!(predicted_p99(30.0, 0.020, 0).is_infinite());
    let p99: Vec<f64> = (1..=5).map(|r| predicted_p99(30.0, 0.020, r)).collect();
    assert!(p99.windows(2).all(|w| w[1] <= w[0]), "{p99:?}");
    assert!(p99[0] > 0.1, "one worker at 60% busy waits long: {p99:?}");
    assert_eq!(p99[4], 0.020);
    assert!(predicted_p99(150.0, 0.020, 3).is_infinite());
}

#[test]
fn a_latency_target_reserves_more_than_the_formula_for_poisson_arrivals() {
    // The formula's 1 worker at 30/s leaves a p99 far above the job time.
    assert_eq!(latency_target(30.0, 0.020, 0.025, 10), Some(3));
    assert_eq!(latency_target(0.0, 0.020, 0.025, 10), Some(0));
    assert_eq!(latency_target(150.0, 0.020, 0.025, 3), None);
    let mut sizing = budget();
    sizing.lanes[0].rule = Rule::LatencyTarget { p99_seconds: 0.025 };
    let decision = at(&sizing, &loads(30.0, 0.020), None, &History::new(), 0);
    assert_eq!(decision.lanes[0].reserve, 3);
    assert_eq!(
        decision.lanes[0].explanation,
        "urgent 30/s × 20 ms, p99 ≤ 25 ms → 3 → 3 reserved"
    );
    let capped = at(&sizing, &loads(400.0, 0.020), None, &History::new(), 0);
    assert_eq!(capped.lanes[0].reserve, 6);
    assert_eq!(capped.limited.len(), 1);
}

#[test]
fn a_latency_target_in_the_spec_becomes_the_lanes_rule() {
    let yaml = include_str!("../../examples/lanepool.yaml");
    let mut pool: crate::api::LanePool = serde_yaml::from_str(yaml).unwrap();
    let reserve = pool.spec.lanes[0].reserve.as_mut().unwrap();
    reserve.sizing = crate::api::SizingMode::LatencyTarget;
    reserve.target_p99 = Some(crate::duration::KubeDuration::new("25ms"));
    let sizing = PoolSizing::from_spec(&pool.spec).unwrap();
    assert_eq!(
        sizing.lanes[0].rule,
        Rule::LatencyTarget { p99_seconds: 0.025 }
    );

    pool.spec.lanes[0].reserve.as_mut().unwrap().target_p99 = None;
    let error = PoolSizing::from_spec(&pool.spec).unwrap_err().to_string();
    assert!(error.contains("spec.lanes[0].reserve.targetP99"), "{error}");
}

fn with_recent(
    rate: f64,
    recent: f64,
    job: f64,
) -> BTreeMap<String, std::result::Result<LaneLoad, String>> {
    counted_over(rate, recent, 15, job)
}

/// A long rate and a recent one counted over `window_secs`.
fn counted_over(
    rate: f64,
    recent: f64,
    window_secs: u64,
    job: f64,
) -> BTreeMap<String, std::result::Result<LaneLoad, String>> {
    BTreeMap::from([(
        "urgent".to_string(),
        Ok(LaneLoad {
            arrival_rate: rate,
            recent_arrival_rate: Some(RecentRate {
                per_second: recent,
                window: Duration::from_secs(window_secs),
            }),
            job_seconds: Some(job),
        }),
    )])
}

#[test]
fn the_recent_rate_moves_the_reserve_both_ways_before_the_long_window() {
    let sizing = budget_at_once();
    // A spike the 1 m window has seen for a while: the last scrape interval says 150/s.
    let up = at(
        &sizing,
        &with_recent(110.0, 150.0, 0.02),
        Some(&replicas(1, 9)),
        &History::new(),
        0,
    );
    assert_eq!(up.lanes[0].reserve, 5);
    // With the window it was counted over: how many jobs, and so how noisy.
    assert!(
        up.lanes[0]
            .explanation
            .contains("150/s (recent) × 20 ms × 1.5 = 4.5; the recent rate over 15 s"),
        "{}",
        up.lanes[0].explanation
    );
    // And it is over while the long window still remembers it.
    let down = at(
        &sizing,
        &with_recent(120.0, 25.0, 0.02),
        Some(&up.replicas()),
        &up.history,
        10,
    );
    assert_eq!(down.lanes[0].reserve, 1);
}

#[test]
fn a_first_decision_does_not_grow_on_a_long_rate_the_recent_rate_is_below() {
    let sizing = budget_at_once();
    // A new leader a minute after a spike: the long window still says 14.9/s (3 reserved:
    // 14.9 × 0.1 × 1.5 = 2.2), while the last 5 s counted 60 jobs (12/s): within two standard
    // deviations of the 74.5 the long rate expects, so not followed, but below it. The load fell
    // back: no growth.
    let fallen = at(
        &sizing,
        &counted_over(14.9, 12.0, 5, 0.1),
        Some(&replicas(2, 8)),
        &History::new(),
        0,
    );
    assert_eq!(fallen.lanes[0].reserve, 2);
    assert!(
        fallen.lanes[0]
            .explanation
            .contains("3, held at 2: the recent 12/s is below the long rate (a first decision)"),
        "{}",
        fallen.lanes[0].explanation
    );
    // The same long rate with a recent count at or above it grows, as before.
    for recent in [14.9, 16.0] {
        let risen = at(
            &sizing,
            &counted_over(14.9, recent, 5, 0.1),
            Some(&replicas(2, 8)),
            &History::new(),
            0,
        );
        assert_eq!(risen.lanes[0].reserve, 3, "recent {recent}/s");
    }
    // A leader that has decided before follows the long rate as before: it saw the load.
    let later = at(
        &sizing,
        &counted_over(14.9, 12.0, 5, 0.1),
        Some(&replicas(2, 8)),
        &fallen.history,
        5,
    );
    assert_eq!(later.lanes[0].reserve, 3);
}

#[test]
fn growth_the_long_rate_does_not_confirm_waits_for_it() {
    let sizing = budget_at_once();
    // A spike the 1 m window has barely seen: 150/s recent asks for 5, but twice the 30/s long
    // rate asks for 2 (2 × 30/s × 20 ms × 1.5 = 1.8).
    let barely = at(
        &sizing,
        &with_recent(30.0, 150.0, 0.02),
        Some(&replicas(1, 9)),
        &History::new(),
        0,
    );
    assert_eq!(barely.lanes[0].reserve, 2);
    assert!(
        barely.lanes[0]
            .explanation
            .contains("5, unconfirmed by the 30/s long rate: 2"),
        "{}",
        barely.lanes[0].explanation
    );
    // Seen for longer, the long rate confirms the rest.
    let confirmed = at(
        &sizing,
        &with_recent(100.0, 150.0, 0.02),
        Some(&barely.replicas()),
        &barely.history,
        10,
    );
    assert_eq!(confirmed.lanes[0].reserve, 5);
    // A new pool (no current count) takes what the rate asks.
    let new = at(
        &sizing,
        &with_recent(40.0, 150.0, 0.02),
        None,
        &History::new(),
        0,
    );
    assert_eq!(new.lanes[0].reserve, 5);
}

proptest! {
    #[test]
    fn confirmation_only_holds_growth_back_and_never_shrinks(
        long in 0.0f64..300.0,
        recent in 0.0f64..300.0,
        current in 1i32..=6,
    ) {
        // Where the recent rate is within its noise of the long one, the long one decides.
        let (expected, counted) = (long * 15.0, recent * 15.0);
        prop_assume!((counted - expected).abs() > NOISE_SIGMAS * expected.max(1.0).sqrt());
        let sizing = pool(PoolSize::Budget { total: 10, shared_min: 2 }, 0);
        let decided = |long: f64| {
            at(&sizing, &with_recent(long, recent, 0.02), Some(&replicas(current, 10 - current)), &History::new(), 0)
                .lanes[0]
                .reserve
        };
        let held = decided(long);
        // The same recent rate with a long rate that confirms anything.
        let free = decided(1e6);
        prop_assert!(held <= free.max(current));
        prop_assert!(held >= free.min(current));
        // A shrink never waits for confirmation.
        if free < current {
            prop_assert_eq!(held, free);
        }
    }
}

#[test]
fn without_a_recent_rate_the_long_window_decides() {
    let sizing = budget_at_once();
    let decision = at(
        &sizing,
        &loads(150.0, 0.02),
        Some(&replicas(1, 9)),
        &History::new(),
        0,
    );
    assert_eq!(decision.lanes[0].reserve, 5);
    assert!(!decision.lanes[0].explanation.contains("recent"));
}

#[test]
fn a_change_inside_the_tolerance_is_not_made() {
    let sizing = budget_at_once();
    // 1.5 × 20 ms × 36/s = 1.08: 2 by the ceiling, but within 10 % of the 1 running.
    let kept = at(
        &sizing,
        &loads(36.0, 0.02),
        Some(&replicas(1, 9)),
        &History::new(),
        0,
    );
    assert_eq!(kept.lanes[0].reserve, 1);
    assert!(
        kept.lanes[0]
            .explanation
            .contains("within the 10% tolerance"),
        "{}",
        kept.lanes[0].explanation
    );
    // 1.5 × 20 ms × 40/s = 1.2: more than 10 % above 1, so it grows.
    let grown = at(
        &sizing,
        &loads(40.0, 0.02),
        Some(&replicas(1, 9)),
        &History::new(),
        0,
    );
    assert_eq!(grown.lanes[0].reserve, 2);
    // Running 2, 0.95 asks for 1 but 0.95 × 1.1 still asks for 2: kept.
    let held = at(
        &sizing,
        &loads(31.7, 0.02),
        Some(&replicas(2, 8)),
        &History::new(),
        0,
    );
    assert_eq!(held.lanes[0].reserve, 2);
    let shrunk = at(
        &sizing,
        &loads(25.0, 0.02),
        Some(&replicas(2, 8)),
        &History::new(),
        0,
    );
    assert_eq!(shrunk.lanes[0].reserve, 1);
    // Without a current count (a new pool) the ceiling stands.
    let new = at(&sizing, &loads(36.0, 0.02), None, &History::new(), 0);
    assert_eq!(new.lanes[0].reserve, 2);
}

proptest! {
    #[test]
    fn rate_noise_around_an_integer_boundary_never_flaps(
        noise in prop::collection::vec(-0.05f64..0.05, 1..40),
        boundary in 1i32..5,
    ) {
        // 10/s × 50 ms × 2 = 1.0 per boundary unit: the rate read back is off by up to 5 %.
        let mut sizing = pool(PoolSize::Shared { replicas: 8 }, 0);
        sizing.headroom = 2.0;
        let rate = 10.0 * f64::from(boundary);
        let mut decision = at(&sizing, &loads(rate, 0.05), None, &History::new(), 0);
        let first = decision.lanes[0].reserve;
        for (i, n) in noise.iter().enumerate() {
            decision = at(
                &sizing,
                &with_recent(rate, rate * (1.0 + n), 0.05),
                Some(&decision.replicas()),
                &decision.history,
                10 * (i as u64 + 1),
            );
            prop_assert_eq!(decision.lanes[0].reserve, first);
        }
    }
}

#[test]
fn a_rate_counted_over_few_arrivals_gets_a_wider_tolerance() {
    let mut sizing = pool(PoolSize::Shared { replicas: 8 }, 0);
    sizing.headroom = 1.0;
    sizing.lanes[0].max = 20;
    let rate = |long: f64, window_secs: u64| counted_over(long, 5.9, window_secs, 1.0);
    // 5.9/s over 15 s is 88 arrivals where the long rate of 4/s expects 60: the load moved. It
    // is ±21 % at two standard deviations, and 5.9/s moved back by that (4.9/s) asks for the 5
    // running.
    let noisy = at(
        &sizing,
        &rate(4.0, 15),
        Some(&replicas(5, 8)),
        &History::new(),
        0,
    );
    assert_eq!(noisy.lanes[0].reserve, 5);
    assert!(
        noisy.lanes[0]
            .explanation
            .contains("within the 21% tolerance"),
        "{}",
        noisy.lanes[0].explanation
    );
    // Over 5 minutes the same rate is 1,770 arrivals: the 10 % tolerance, and it grows.
    let counted = at(
        &sizing,
        &rate(4.0, 300),
        Some(&replicas(5, 8)),
        &History::new(),
        0,
    );
    assert_eq!(counted.lanes[0].reserve, 6);
}

#[test]
fn a_recent_rate_within_its_noise_of_the_long_one_leaves_the_long_one_to_decide() {
    let mut sizing = pool(PoolSize::Shared { replicas: 8 }, 0);
    sizing.headroom = 1.0;
    sizing.lanes[0].max = 20;
    let load = |long: f64, recent: f64| counted_over(long, recent, 5, 0.5);
    // 6/s over a 5 s read expects 30 arrivals, ±11 at two standard deviations: a read of 4/s
    // (20) is noise, and the reserve the long rate asks for stays.
    let steady = at(
        &sizing,
        &load(6.0, 4.0),
        Some(&replicas(3, 8)),
        &History::new(),
        0,
    );
    assert_eq!(
        steady.lanes[0].reserve, 3,
        "{}",
        steady.lanes[0].explanation
    );
    assert!(
        steady.lanes[0]
            .explanation
            .starts_with("urgent 6/s × 500 ms × 1 = 3 → 3 → "),
        "{}",
        steady.lanes[0].explanation
    );
    // A read of 1/s (5 arrivals) is a load that fell: followed at once.
    let fell = at(
        &sizing,
        &load(6.0, 1.0),
        Some(&replicas(3, 8)),
        &History::new(),
        0,
    );
    assert!(fell.lanes[0].reserve < 3, "{}", fell.lanes[0].explanation);
    assert!(fell.lanes[0].explanation.contains("1/s (recent)"));
}

#[test]
fn a_reserve_grown_for_a_spike_comes_back_under_a_boundary_even_when_counted_over_a_read() {
    // The guide's pool after a spike: 30/s read over 5 s (150 arrivals, ±16 % at two standard
    // deviations) × 20 ms × 1.5 = 0.9. Growth would need the wide tolerance; shrinking to the 1
    // the rate asks for takes the plain 10 % (0.9 × 1.1 = 0.99 still asks for 1).
    let sizing = pool(PoolSize::Shared { replicas: 8 }, 0);
    let read = BTreeMap::from([(
        "urgent".to_string(),
        Ok(LaneLoad {
            arrival_rate: 60.0,
            recent_arrival_rate: Some(RecentRate {
                per_second: 30.0,
                window: Duration::from_secs(5),
            }),
            job_seconds: Some(0.02),
        }),
    )]);
    let back = at(&sizing, &read, Some(&replicas(2, 8)), &History::new(), 0);
    assert_eq!(back.lanes[0].reserve, 1, "{}", back.lanes[0].explanation);
    // The same reading does not grow a reserve of 1 that sits just under it.
    let held = at(&sizing, &read, Some(&replicas(1, 8)), &History::new(), 0);
    assert_eq!(held.lanes[0].reserve, 1, "{}", held.lanes[0].explanation);
}

#[test]
fn a_product_that_overflows_is_capped_at_max_never_read_as_no_load() {
    let sizing = budget();
    let loads = loads(1e300, 1e300);
    let decision = decide(
        &sizing,
        Inputs {
            loads: &loads,
            current: None,
            history: &History::new(),
            now: Duration::ZERO,
            outage: Outage::default(),
            shared_job_seconds: None,
        },
    );
    assert_eq!(decision.lanes[0].reserve, sizing.lanes[0].max);
    assert!(!decision.limited.is_empty(), "reported as ScalingLimited");
}

/// Any float a server could send: ordinary, tiny, huge, negative, NaN and infinities.
fn any_float() -> impl Strategy<Value = f64> {
    prop_oneof![
        0.0f64..1e4,
        prop::num::f64::ANY,
        Just(f64::NAN),
        Just(f64::INFINITY),
        Just(f64::NEG_INFINITY),
        Just(f64::MAX),
        Just(f64::MIN_POSITIVE),
    ]
}

proptest! {
    #[test]
    fn any_answer_is_a_load_or_a_reason_and_any_load_a_bounded_decision(
        sizing in arbitrary_pool(),
        rate_series in prop::collection::vec(any_float(), 0..4),
        job_series in prop::collection::vec(any_float(), 0..4),
        fallback in prop::option::of(0.001f64..10.0),
    ) {
        let load = lane_load("urgent", &Ok(rate_series.clone()), &Ok(job_series), fallback);
        if let Ok(load) = &load {
            prop_assert_eq!(rate_series.len(), 1, "one series, or no load");
            prop_assert!(load.arrival_rate.is_finite() && load.arrival_rate >= 0.0);
            prop_assert!(load.job_seconds.is_none_or(|j| j.is_finite() && j >= 0.0));
        }
        let loads = BTreeMap::from([("urgent".to_string(), load)]);
        let decision = at(&sizing, &loads, None, &History::new(), 0);
        let lane = &sizing.lanes[0];
        let reserve = decision.lanes[0].reserve;
        prop_assert!(lane.min <= reserve && reserve <= lane.max);
        if let PoolSize::Budget { total, shared_min } = sizing.size {
            prop_assert_eq!(reserve + decision.shared, total);
            prop_assert!(decision.shared >= shared_min);
        }
    }
}

proptest! {
    /// The window kept as a sliding maximum decides exactly what keeping every recommendation
    /// would, and holds at most one recommendation per reserve count however long the window.
    #[test]
    fn the_window_is_a_sliding_maximum_of_bounded_size(
        sizing in arbitrary_pool(),
        rates in prop::collection::vec(0.0f64..1000.0, 1..120),
        step_secs in 1u64..60,
    ) {
        let lane = &sizing.lanes[0];
        let window = sizing.stabilization_window;
        let mut current: Option<Replicas> = None;
        let mut history = History::new();
        let mut every: Vec<(u64, i32)> = Vec::new();
        for (i, rate) in rates.iter().enumerate() {
            let now = i as u64 * step_secs;
            let d = at(&sizing, &loads(*rate, 0.02), current.as_ref(), &history, now);
            // Without a past, the first current count stands in for one: there is none here.
            every.push((now, d.lanes[0].recommended));
            let naive = every
                .iter()
                .filter(|(at, _)| Duration::from_secs(now - at) < window || *at == now)
                .map(|(_, r)| *r)
                .max()
                .unwrap();
            prop_assert_eq!(d.lanes[0].reserve, naive.clamp(lane.min, lane.max));
            let kept = d.history.get("urgent").map_or(0, Vec::len);
            prop_assert!(kept <= (lane.max + 2) as usize, "{} kept", kept);
            current = Some(d.replicas());
            history = d.history;
        }
    }
}

#[test]
fn a_fixed_reserve_lowers_the_reserve_only_through_the_window() {
    let mut sizing = pool(PoolSize::Shared { replicas: 8 }, 60);
    sizing.on_unavailable = UnavailablePolicy::FixedReserve(1);
    sizing.failure_threshold = 1;
    // 150/s × 20 ms × 1.5 = 4.5 → 5 reserved, then Prometheus goes away.
    let measured = at(&sizing, &loads(150.0, 0.02), None, &History::new(), 0);
    assert_eq!(measured.lanes[0].reserve, 5);
    let gone = BTreeMap::from([("urgent".to_string(), Err("down".to_string()))]);
    let during = at(
        &sizing,
        &gone,
        Some(&measured.replicas()),
        &measured.history,
        30,
    );
    assert_eq!(
        during.lanes[0].reserve, 5,
        "{}",
        during.lanes[0].explanation
    );
    assert!(
        during.lanes[0]
            .explanation
            .contains("held by the scale-down window")
    );
    let after = at(
        &sizing,
        &gone,
        Some(&during.replicas()),
        &during.history,
        61,
    );
    assert_eq!(after.lanes[0].reserve, 1, "{}", after.lanes[0].explanation);
}

/// Runs evaluations every 30 s from `start` while `loads` say, carrying the outage forward as
/// the controller does; returns the last decision.
fn outage_run(
    sizing: &PoolSizing,
    loads: &BTreeMap<String, std::result::Result<LaneLoad, String>>,
    mut decision: Decision,
    start: u64,
    evaluations: u64,
) -> Decision {
    let since = Duration::from_secs(start);
    for i in 0..evaluations {
        decision = decide(
            sizing,
            Inputs {
                loads,
                current: Some(&decision.replicas()),
                history: &decision.history,
                now: since + Duration::from_secs(30 * i),
                outage: Outage {
                    failed_before: decision.failed_intervals,
                    since: (decision.failed_intervals > 0).then_some(since),
                },
                shared_job_seconds: None,
            },
        );
    }
    decision
}

#[test]
fn the_action_waits_for_the_failure_threshold() {
    let mut sizing = pool(PoolSize::Shared { replicas: 8 }, 0);
    sizing.on_unavailable = UnavailablePolicy::FixedReserve(1);
    let measured = at(&sizing, &loads(150.0, 0.02), None, &History::new(), 0);
    assert_eq!(
        (measured.lanes[0].reserve, measured.failed_intervals),
        (5, 0)
    );
    let gone = BTreeMap::from([("urgent".to_string(), Err("down".to_string()))]);
    for failed in 1..=2 {
        let held = outage_run(&sizing, &gone, measured.clone(), 30, failed);
        assert_eq!(held.failed_intervals, failed as u32);
        assert_eq!(held.lanes[0].reserve, 5, "{}", held.lanes[0].explanation);
        assert_eq!(
            held.outage.as_deref(),
            Some(
                format!("failed interval {failed} of 3 before onMetricsUnavailable acts: holding")
                    .as_str()
            )
        );
    }
    let acted = outage_run(&sizing, &gone, measured.clone(), 30, 3);
    assert_eq!(acted.lanes[0].reserve, 1, "{}", acted.lanes[0].explanation);
    assert_eq!(
        acted.outage.as_deref(),
        Some("failureThreshold reached: fixed reserve")
    );

    // One good measurement ends the outage: the count starts again.
    let back = outage_run(&sizing, &loads(150.0, 0.02), acted, 120, 1);
    assert_eq!((back.failed_intervals, back.outage), (0, None));
    assert_eq!(back.lanes[0].reserve, 5);
}

#[test]
fn hold_keeps_counts_up_to_its_limit_then_falls_back() {
    let mut sizing = budget_at_once();
    sizing.on_unavailable = UnavailablePolicy::Hold {
        limit: Duration::from_secs(600),
        fallback: None,
    };
    let measured = at(&sizing, &loads(150.0, 0.02), None, &History::new(), 0);
    assert_eq!(measured.lanes[0].reserve, 5);
    let gone = BTreeMap::from([("urgent".to_string(), Err("down".to_string()))]);
    // 20 evaluations 30 s apart: the last at 570 s, inside the 10 m limit.
    let held = outage_run(&sizing, &gone, measured.clone(), 0, 20);
    assert_eq!((held.lanes[0].reserve, held.shared), (5, 5));
    assert_eq!(
        held.outage.as_deref(),
        Some("holding for at most the holdLimit of 10m")
    );
    // The 21st, at 600 s, falls back to reserve.min: the shared workers get the rest.
    let expired = outage_run(&sizing, &gone, measured.clone(), 0, 21);
    assert_eq!(
        (expired.lanes[0].reserve, expired.shared),
        (1, 9),
        "{}",
        expired.lanes[0].explanation
    );
    assert!(
        expired.lanes[0]
            .explanation
            .contains("held for the holdLimit of 10m: falling back")
    );

    // A fallback reserve set by the user, within the lane's bounds.
    sizing.on_unavailable = UnavailablePolicy::Hold {
        limit: Duration::from_secs(600),
        fallback: Some(3),
    };
    let expired = outage_run(&sizing, &gone, measured, 0, 21);
    assert_eq!(expired.lanes[0].reserve, 3);
}

#[test]
fn a_paused_scale_down_holds_every_reserve_while_growth_goes_on() {
    let mut sizing = budget();
    sizing.stabilization_window = Duration::ZERO;
    sizing.scale_down_paused = true;
    let calm = at(&sizing, &loads(30.0, 0.02), None, &History::new(), 0);
    let spike = at(
        &sizing,
        &loads(150.0, 0.02),
        Some(&calm.replicas()),
        &calm.history,
        30,
    );
    assert_eq!(spike.lanes[0].reserve, 5, "growth goes on");
    let after = at(
        &sizing,
        &loads(30.0, 0.02),
        Some(&spike.replicas()),
        &spike.history,
        60,
    );
    assert_eq!((after.lanes[0].reserve, after.shared), (5, 5));
    assert!(
        after.lanes[0]
            .explanation
            .contains("held at 5 (scale-down paused)"),
        "{}",
        after.lanes[0].explanation
    );
}

proptest! {
    /// Whatever the loads and outages, a paused scale-down never lowers a reserve.
    #[test]
    fn a_paused_scale_down_never_lowers_a_reserve(
        steps in prop::collection::vec((0.0f64..400.0, 0.001f64..0.2, prop::bool::weighted(0.2)), 1..40),
        fixed in 0i32..8,
    ) {
        let mut sizing = budget();
        sizing.scale_down_paused = true;
        sizing.failure_threshold = 1;
        sizing.on_unavailable = if fixed % 2 == 0 {
            UnavailablePolicy::FixedReserve(fixed)
        } else {
            UnavailablePolicy::Hold { limit: Duration::from_secs(60), fallback: None }
        };
        let mut decision = at(&sizing, &loads(30.0, 0.02), None, &History::new(), 0);
        for (i, (rate, job, down)) in steps.into_iter().enumerate() {
            let observed = if down {
                BTreeMap::from([("urgent".to_string(), Err("down".to_string()))])
            } else {
                loads(rate, job)
            };
            let before = decision.lanes[0].reserve;
            decision = decide(&sizing, Inputs {
                loads: &observed,
                current: Some(&decision.replicas()),
                history: &decision.history,
                now: Duration::from_secs(30 * (i as u64 + 1)),
                outage: Outage { failed_before: decision.failed_intervals, since: Some(Duration::ZERO) },
                shared_job_seconds: None,
            });
            prop_assert!(decision.lanes[0].reserve >= before, "{}", decision.lanes[0].explanation);
        }
    }
}

#[test]
fn new_settings_are_what_a_spec_that_sets_nothing_more_gives() {
    let spec: crate::api::LanePoolSpec = serde_yaml::from_str(
        "lanes: [{name: urgent, reserve: {max: 6}}, {name: batch}]\n\
         totalWorkers: 10\n\
         template: {}\n",
    )
    .unwrap();
    let read = PoolSizing::from_spec(&spec).unwrap();
    assert_eq!(
        PoolSizing::new(read.lanes.clone(), read.headroom, read.size),
        read
    );
}

#[test]
fn a_spec_that_sets_no_sizing_gets_the_queueing_rule() {
    let spec: crate::api::LanePoolSpec = serde_yaml::from_str(
        "lanes: [{name: urgent, reserve: {max: 6}}, {name: batch}]\n\
         totalWorkers: 10\n\
         template: {}\n",
    )
    .unwrap();
    let read = PoolSizing::from_spec(&spec).unwrap();
    assert_eq!(read.lanes[0].rule, Rule::Queueing);
    assert_eq!(read.headroom, 1.0);
}

#[test]
fn the_guides_normal_load_gets_two_reserved_where_the_formula_gives_one() {
    // 30/s × 20 ms is 0.6 busy workers: one reserved worker is busy 60 % of the time, and an
    // urgent job that finds it busy waits for it (or for a batch job to end).
    assert_eq!(wait_within_job_time(30.0, 0.020, 1.0, None), Some(2));
    assert_eq!(formula(30.0, 0.020, 1.0).1, 1);
    let mut sizing = budget();
    sizing.headroom = 1.0;
    sizing.lanes[0].rule = Rule::Queueing;
    let decision = at(&sizing, &loads(30.0, 0.020), None, &History::new(), 0);
    assert_eq!(decision.lanes[0].reserve, 2);
    assert_eq!(
        decision.lanes[0].explanation,
        "urgent 30/s × 20 ms, wait p99 ≤ job time → 2 → 2 reserved"
    );
    sizing.headroom = 1.5;
    let planned = at(&sizing, &loads(30.0, 0.020), None, &History::new(), 0);
    assert!(
        planned.lanes[0]
            .explanation
            .starts_with("urgent 30/s × 20 ms × 1.5, wait p99 ≤ job time → "),
        "{}",
        planned.lanes[0].explanation
    );
}

#[test]
fn the_queueing_rule_reserves_what_its_own_prediction_needs_and_no_more() {
    for job in [0.005, 0.020, 0.5, 2.0] {
        for busy in [0.01, 0.3, 0.6, 0.99, 1.0, 2.5, 9.7, 40.0, 180.0] {
            let rate = busy / job;
            let reserve = wait_within_job_time(rate, job, 1.0, None).unwrap();
            assert!(f64::from(reserve) > busy, "{rate}/s × {job} s → {reserve}");
            // Each job keeps its worker for the job time and the hand-off.
            let served = job + HANDOFF_SECONDS;
            assert!(predicted_wait_p99(rate, served, reserve) <= job);
            assert!(
                predicted_wait_p99(rate, served, reserve - 1) > job,
                "{rate}/s × {job} s: {} would do",
                reserve - 1
            );
        }
    }
    // Square-root staffing: the spare workers grow far slower than the load.
    let spare = |busy: f64| f64::from(wait_within_job_time(busy, 1.0, 1.0, None).unwrap()) - busy;
    assert!(
        spare(400.0) < 4.0 * spare(4.0),
        "{} {}",
        spare(400.0),
        spare(4.0)
    );
    assert_eq!(wait_within_job_time(0.0, 0.020, 1.0, None), Some(0));
}

#[test]
fn short_jobs_are_sized_for_the_hand_off_between_two_jobs() {
    // 1000/s × 5 ms: the 0.4 ms hand-off makes 5 busy workers 5.4.
    let alone = smallest_reserve(1000.0, 0.005, 0.005).unwrap();
    let with_hand_off = wait_within_job_time(1000.0, 0.005, 1.0, None).unwrap();
    assert!(with_hand_off > alone, "{with_hand_off} vs {alone}");
    // A 2 s job barely notices it.
    assert_eq!(
        wait_within_job_time(2.5, 2.0, 1.0, None),
        smallest_reserve(2.5, 2.0, 2.0)
    );
}

#[test]
fn shared_workers_freeing_up_often_let_a_large_pool_reserve_less_but_never_below_the_load() {
    // 300/s × 20 ms in a 100-worker budget, shared workers finishing 200 ms batch jobs: about
    // 90 shared workers free up 450 times a second.
    let help = SharedHelp {
        job_seconds: 0.2,
        unreserved: 100,
        least: 1,
    };
    let alone = wait_within_job_time(300.0, 0.020, 1.0, None).unwrap();
    let helped = wait_within_job_time(300.0, 0.020, 1.0, Some(help)).unwrap();
    assert!(helped < alone, "{helped} vs {alone}");
    assert!(
        f64::from(helped) > 300.0 * (0.020 + HANDOFF_SECONDS),
        "{helped}"
    );
    // In a pool of 4, one shared worker on 2 s batch jobs helps too seldom to matter.
    let small = SharedHelp {
        job_seconds: 2.0,
        unreserved: 4,
        least: 1,
    };
    assert_eq!(
        wait_within_job_time(30.0, 0.020, 1.0, Some(small)),
        wait_within_job_time(30.0, 0.020, 1.0, None)
    );
    // The operator's decision credits them when the shared lanes' job time is measured.
    let mut sizing = pool(
        PoolSize::Budget {
            total: 100,
            shared_min: 1,
        },
        0,
    );
    sizing.lanes[0].max = 99;
    sizing.headroom = 1.0;
    sizing.lanes[0].rule = Rule::Queueing;
    let decide_with = |sizing: &PoolSizing, shared_job_seconds| {
        decide(
            sizing,
            Inputs {
                loads: &loads(300.0, 0.020),
                current: None,
                history: &History::new(),
                now: Duration::ZERO,
                outage: Outage::default(),
                shared_job_seconds,
            },
        )
        .lanes[0]
            .reserve
    };
    assert_eq!(decide_with(&sizing, None), alone);
    assert_eq!(decide_with(&sizing, Some(0.2)), helped);
    // A fixed number of shared workers helps as that many, whatever the reserve.
    let fixed = SharedHelp {
        job_seconds: 0.2,
        unreserved: 0,
        least: 8,
    };
    assert_eq!(fixed.free_ups(2), 40.0);
    assert_eq!(fixed.free_ups(7), 40.0);
    sizing.size = PoolSize::Shared { replicas: 8 };
    let shared = decide_with(&sizing, Some(0.2));
    assert_eq!(
        Some(shared),
        wait_within_job_time(300.0, 0.020, 1.0, Some(fixed))
    );
    assert!(shared >= helped, "{shared} vs {helped}");
}

#[test]
fn an_endless_load_asks_for_every_worker_it_can_and_says_capped() {
    assert_eq!(wait_within_job_time(f64::MAX, 1.0, 10.0, None), None);
    assert_eq!(smallest_reserve(f64::NAN, 1.0, 1.0), None);
    let mut sizing = budget();
    sizing.headroom = 1.0;
    sizing.lanes[0].rule = Rule::Queueing;
    let decision = at(&sizing, &loads(1e300, 1e300), None, &History::new(), 0);
    assert_eq!(decision.lanes[0].reserve, 6);
    assert!(decision.lanes[0].capped);
    let capped = at(&sizing, &loads(400.0, 0.020), None, &History::new(), 0);
    assert_eq!(capped.lanes[0].reserve, 6);
    assert_eq!(
        capped.limited,
        vec![format!(
            "lane urgent needs {} reserved workers but reserve.max is 6; shared workers absorb the rest",
            wait_within_job_time(400.0, 0.020, 1.0, None).unwrap()
        )]
    );
}

/// Two Formula lanes, urgent first: 60/s × 50 ms × 1.5 asks 5 and 40/s × 50 ms × 1.5 asks 3.
fn two_lanes_in(total: i32) -> (PoolSizing, Loads) {
    let lane = |name: &str| LaneSizing {
        name: name.into(),
        min: 1,
        max: 6,
        rule: Rule::Formula,
    };
    let sizing = PoolSizing {
        stabilization_window: Duration::ZERO,
        ..PoolSizing::new(
            vec![lane("urgent"), lane("critical")],
            1.5,
            PoolSize::Budget {
                total,
                shared_min: 1,
            },
        )
    };
    let load = |rate: f64| {
        Ok(LaneLoad {
            arrival_rate: rate,
            recent_arrival_rate: None,
            job_seconds: Some(0.050),
        })
    };
    let loads = BTreeMap::from([
        ("urgent".to_string(), load(60.0)),
        ("critical".to_string(), load(40.0)),
    ]);
    (sizing, loads)
}

#[test]
fn a_total_below_what_the_reserves_ask_cuts_them_in_priority_order_above_their_minimums() {
    // 5 + 3 + shared 1 = 9 fits; at 7 urgent keeps its 5 and critical gets 1 of 3 (its min);
    // at 3 each keeps its min.
    for (total, urgent, critical) in [(9, 5, 3), (7, 5, 1), (5, 3, 1), (3, 1, 1)] {
        let (sizing, loads) = two_lanes_in(total);
        let decision = at(&sizing, &loads, None, &History::new(), 0);
        let got: Vec<i32> = decision.lanes.iter().map(|l| l.reserve).collect();
        assert_eq!(got, vec![urgent, critical], "total {total}");
        assert_eq!(decision.shared, 1, "total {total}");
        assert_eq!(decision.reserved_total() + decision.shared, total.max(3));
        assert_eq!(decision.below_total.is_empty(), total >= 9, "total {total}");
    }
    let (sizing, loads) = two_lanes_in(7);
    let decision = at(&sizing, &loads, None, &History::new(), 0);
    assert_eq!(
        decision.below_total,
        vec![
            "lane critical asks 3 reserved workers and gets 1: totalWorkers 7 leaves 6 for \
             reserves after shared.minReplicas 1, lanes in priority order"
        ]
    );
    assert!(
        decision.lanes[1]
            .explanation
            .ends_with("→ 3, cut to 1 by totalWorkers 7 → 1 reserved"),
        "{}",
        decision.lanes[1].explanation
    );
    // The recommendation is remembered uncut: the reserve grows back as soon as the total does.
    let (sizing, loads) = two_lanes_in(9);
    let grown = at(
        &sizing,
        &loads,
        Some(&decision.replicas()),
        &decision.history,
        5,
    );
    assert_eq!(grown.lanes[1].reserve, 3);
}

/// A pool like [`budget`] whose lane is sized by `rule`, with `slots` jobs a worker.
fn slotted(rule: Rule, slots: i32) -> PoolSizing {
    let lanes = vec![LaneSizing {
        name: "urgent".into(),
        min: 0,
        max: 1000,
        rule,
    }];
    PoolSizing {
        slots_per_worker: slots,
        ..PoolSizing::new(lanes, 1.0, PoolSize::Shared { replicas: 4 })
    }
}

#[test]
fn a_worker_of_four_slots_serves_as_four_servers_and_the_reserve_rounds_up_to_workers() {
    // 100/s × 100 ms: 10 busy slots on average; the queueing rule asks for 12 one-job workers.
    let one = at(
        &slotted(Rule::Queueing, 1),
        &loads(100.0, 0.1),
        None,
        &History::new(),
        0,
    );
    let four = at(
        &slotted(Rule::Queueing, 4),
        &loads(100.0, 0.1),
        None,
        &History::new(),
        0,
    );
    assert_eq!(one.lanes[0].reserve, 12);
    assert_eq!(four.lanes[0].reserve, 3, "12 slots are 3 workers of 4");
    assert_eq!(
        four.lanes[0].explanation,
        "urgent 100/s × 100 ms, wait p99 ≤ job time, 4 slots a worker → 3 → 3 reserved"
    );
    let formula = at(
        &slotted(Rule::Formula, 4),
        &loads(100.0, 0.1),
        None,
        &History::new(),
        0,
    );
    assert_eq!(formula.lanes[0].reserve, 3, "ceil(10 / 4)");
    assert_eq!(
        formula.lanes[0].explanation,
        "urgent 100/s × 100 ms × 1 = 10, 4 slots a worker → 3 → 3 reserved"
    );
}

proptest! {
    /// Sized in slots, then rounded up: a pool of `slots`-job workers reserves exactly the
    /// fewest workers holding the slots a pool of one-job workers reserves, for every rule.
    #[test]
    fn a_reserve_of_slotted_workers_holds_the_slots_one_job_workers_need(
        rate in 0.0f64..2_000.0,
        job in 0.001f64..2.0,
        slots in 1i32..64,
        rule in prop_oneof![
            Just(Rule::Queueing),
            Just(Rule::Formula),
            (0.01f64..5.0).prop_map(|p99_seconds| Rule::LatencyTarget { p99_seconds }),
        ],
    ) {
        let needed = |slots: i32| {
            let sizing = slotted(rule, slots);
            reserve_for(&sizing, &sizing.lanes[0], None, rate, job).1
        };
        let one_job = needed(1);
        let workers = needed(slots);
        if one_job <= 1000 {
            prop_assert_eq!(workers, (one_job + slots - 1) / slots);
        } else {
            // Beyond reserve.max (LatencyTarget) or the load's reach: capped either way.
            prop_assert!(workers > 1000 / slots || workers == i32::MAX, "{workers}");
        }
    }
}
