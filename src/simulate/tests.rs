//! Invariants of the simulation, named after what they prove.

use clap::Parser;
use proptest::prelude::*;

use super::command::args::SimulateArgs;
use super::engine::arrivals::ArrivalKind;
use super::engine::autoscale::lanepool_defaults as default_autoscale;
use super::engine::profile::RateProfile;
use super::engine::scenario::{Arrangement, Scenario};
use super::studies::{guide, tradeoff};
use super::*;

fn guide(arrangement: Arrangement, rate: f64) -> Summary {
    run(&Scenario::guide(arrangement, rate)).summary()
}

#[derive(Parser)]
struct Flags {
    #[command(flatten)]
    args: SimulateArgs,
}

fn flags(line: &str) -> Result<String, String> {
    let words = std::iter::once("simulate").chain(line.split_whitespace());
    let flags = Flags::try_parse_from(words).map_err(|e| e.to_string())?;
    command::run(&flags.args).map_err(|e| e.to_string())
}

#[test]
fn fifo_finishes_no_urgent_job_behind_the_backlog() {
    for rate in [30.0, 150.0] {
        let s = guide(Arrangement::Fifo, rate);
        assert_eq!(s.urgent_completed, 0);
        assert!(s.urgent_submitted > 0);
        // All ten workers stay on batch work.
        assert!(s.batch_per_second > 48.0, "{s:?}");
    }
}

#[test]
fn strict_priority_serves_every_urgent_job_but_waits_for_batch_jobs() {
    let s = guide(Arrangement::Strict, 30.0);
    assert_eq!(s.urgent_completed, 240);
    // Non-preemption: the tail is set by batch jobs, not by the 20 ms job.
    assert!(s.p99_ms.is_some_and(|p99| p99 > 60.0), "{s:?}");
}

#[test]
fn dedicated_caps_urgent_throughput_at_reserved_over_job_time() {
    let s = guide(Arrangement::Dedicated, 150.0);
    // 2 workers × 8 s ÷ 20 ms = 800.
    assert!(s.urgent_completed <= 800, "{s:?}");
    assert!(s.urgent_completed >= 790, "{s:?}");
    assert!(s.p99_ms.is_some_and(|p99| p99 > 2000.0), "{s:?}");
}

#[test]
fn a_hand_off_keeps_each_worker_away_between_two_jobs() {
    let dedicated = Scenario::guide(Arrangement::Dedicated, 150.0);
    let handing_off = run(&Scenario {
        handoff: 5_000_000,
        ..dedicated.clone()
    })
    .summary();
    // 2 workers × 8 s ÷ (20 ms + 5 ms) = 640, not the 800 of 20 ms alone.
    assert!(handing_off.urgent_completed <= 640, "{handing_off:?}");
    assert!(handing_off.urgent_completed >= 630, "{handing_off:?}");
    // The hand-off comes after the job: a job's own latency is unchanged when none waits.
    let calm = run(&Scenario {
        handoff: 5_000_000,
        ..Scenario::guide(Arrangement::ReservedShared, 30.0)
    })
    .summary();
    assert_eq!(calm.p99_ms, Some(20.0));
}

#[test]
fn reserved_shared_completes_every_urgent_job_at_150_per_second() {
    let s = guide(Arrangement::ReservedShared, 150.0);
    // Only jobs still running at the 8 s mark may be missing.
    assert!(s.urgent_completed + 3 >= s.urgent_submitted, "{s:?}");
    assert!(s.p99_ms.is_some_and(|p99| p99 < 100.0), "{s:?}");
    let calm = guide(Arrangement::ReservedShared, 30.0);
    assert_eq!(calm.p99_ms, Some(20.0));
    assert!(s.batch_per_second < calm.batch_per_second);
}

#[test]
fn guide_table_within_10_percent_on_shared_figures() {
    for figure in guide::figures().iter().filter(|f| f.shared) {
        assert!(
            figure.difference().abs() <= 0.10,
            "{figure:?} differs by {:.1}%",
            figure.difference() * 100.0
        );
    }
}

#[test]
fn the_same_seed_gives_the_same_run() {
    let scenario = Scenario {
        arrivals: ArrivalKind::Poisson,
        ..Scenario::guide(Arrangement::ReservedShared, 150.0)
    };
    let (a, b) = (run(&scenario), run(&scenario));
    assert_eq!(a.urgent_latencies, b.urgent_latencies);
    assert_eq!(a.batch_completed, b.batch_completed);
    let other = run(&Scenario {
        seed: 2,
        ..scenario
    });
    assert_ne!(a.urgent_latencies, other.urgent_latencies);
}

/// The default rule's reserves at the spike's 20/s and 150/s of 20 ms jobs, beside the shared
/// workers of a 10-worker budget finishing 200 ms batch jobs.
fn spike_reserves() -> (u32, u32) {
    let help = crate::sizing::SharedHelp {
        job_seconds: 0.2,
        unreserved: 10,
        least: 1,
    };
    let at = |rate: f64| {
        crate::sizing::wait_within_job_time(rate, 0.020, 1.0, Some(help))
            .map_or(0, |r| r.unsigned_abs())
    };
    (at(20.0), at(150.0))
}

fn spike(duration_secs: u64) -> Scenario {
    Scenario {
        arrivals: ArrivalKind::Poisson,
        profile: RateProfile::parse("0s=20,60s=150,240s=20").unwrap_or_else(|e| panic!("{e}")),
        backlog: 1_000_000,
        duration: duration_secs * 1_000_000_000,
        autoscale: Some(default_autoscale(10)),
        window: 30_000_000_000,
        ..Scenario::guide(Arrangement::ReservedShared, 30.0)
    }
}

#[test]
fn autoscale_follows_a_spike_up_and_back_down_within_the_reaction_time() {
    let outcome = run(&spike(700));
    let steps = &outcome.reserve_steps;
    // The wait within the 20 ms job time: 2 reserved at 20/s, 5 at 150/s.
    let (base, peak) = spike_reserves();
    assert_eq!((base, peak), (2, 5));
    assert_eq!(steps[0], (0, base));
    let highest = steps.iter().map(|(_, r)| *r).max().unwrap_or(0);
    assert_eq!(highest, peak, "{steps:?}");
    // The spike starts at 60 s: seen after the 15 s scrape delay and one 15 s scrape interval,
    // at the next 10 s evaluation.
    let grew_at = steps
        .iter()
        .find(|(_, r)| *r == peak)
        .map_or(0, |(at, _)| *at);
    assert!(grew_at <= 100_000_000_000, "{steps:?}");
    // It ends at 240 s; the reserve is back to 2 as soon as the recent rate shows it.
    assert_eq!(steps.last().map(|(_, r)| *r), Some(base), "{steps:?}");
    let back_at = steps.last().map_or(0, |(at, _)| *at);
    assert!(back_at <= 280_000_000_000, "{steps:?}");
    let s = outcome.summary();
    assert_eq!(s.urgent_completed, s.urgent_submitted);
}

#[test]
fn a_stabilization_window_holds_the_reserve_after_the_spike() {
    let mut scenario = spike(700);
    if let Some(a) = scenario.autoscale.as_mut() {
        a.sizing.stabilization_window = std::time::Duration::from_secs(300);
    }
    let outcome = run(&scenario);
    let steps = &outcome.reserve_steps;
    let (base, peak) = spike_reserves();
    let grew_at = steps
        .iter()
        .find(|(_, r)| *r == peak)
        .map_or(0, |(at, _)| *at);
    let back_at = steps.last().map_or(0, |(at, _)| *at);
    assert_eq!(steps.last().map(|(_, r)| *r), Some(base), "{steps:?}");
    // The last recommendation of 3 comes a little after the spike ends; it is held 5 minutes.
    assert!(back_at - grew_at >= 300_000_000_000, "{steps:?}");
}

#[test]
#[ignore = "the simulator runs the operator's rollout now, which lets a shrink go at its 120 s \
            surge timeout: a 1 h pod start passes it (a_shrink_waits_for_new_workers_no_longer_\
            than_the_surge_timeout checks that). The claim itself is checked directly by \
            no_rollout_leaves_fewer_workers_taking_jobs_than_the_budget_while_new_ones_start; \
            this proxy (batch throughput at least the quick start's) misses by 0-5 of about \
            7,000 jobs at a 90 s start on seeds 1-10, a difference in the transitions not \
            explained"]
fn in_budget_mode_a_role_change_never_dips_capacity_while_the_new_worker_starts() {
    let quick = run(&spike(240)).summary();
    let mut slow = spike(240);
    if let Some(a) = slow.autoscale.as_mut() {
        a.pod_start = 3_600_000_000_000;
    }
    let slow = run(&slow).summary();
    // New reserved workers never get ready within the run, so no shared worker ever leaves:
    // batch throughput does not drop, and urgent jobs are still served by the shared workers.
    assert!(
        slow.batch_per_second >= quick.batch_per_second,
        "{slow:?} vs {quick:?}"
    );
    assert!(slow.p99_ms.is_some_and(|p| p < 150.0), "{slow:?}");
}

#[test]
fn no_rollout_leaves_fewer_workers_taking_jobs_than_the_budget_while_new_ones_start() {
    let timeout =
        crate::simulate::engine::scenario::nanos(crate::controller::DEFAULT_SURGE_TIMEOUT);
    // Pods that start in 10 s, and in 90 s: three growths of the reserve 10 s apart during the
    // spike, each one's stand-ins serving at once, the shared workers leaving only once drained
    // after the new ones are ready. The surge's timeout counts from the first growth of the
    // chain: Pods starting in 110 s would have the last one still starting when it ends.
    for pod_start in [10_000_000_000, timeout - 30_000_000_000] {
        let mut scenario = spike(240);
        if let Some(a) = scenario.autoscale.as_mut() {
            a.pod_start = pod_start;
        }
        let outcome = run(&scenario);
        assert!(
            outcome.reserve_steps.len() >= 3,
            "{:?}",
            outcome.reserve_steps
        );
        assert_eq!(outcome.fewest_taking, Some(10), "pod start {pod_start} ns");
    }
    // Pods that never start: at the surge timeout the shrink goes without them.
    let mut never = spike(240);
    if let Some(a) = never.autoscale.as_mut() {
        a.pod_start = 3_600_000_000_000;
    }
    assert!(run(&never).fewest_taking.is_some_and(|n| n < 10));
}

#[test]
fn a_shrink_waits_for_new_workers_no_longer_than_the_surge_timeout() {
    let timeout =
        crate::simulate::engine::scenario::nanos(crate::controller::DEFAULT_SURGE_TIMEOUT);
    let run_for = |pod_start| {
        let mut scenario = spike(240);
        if let Some(a) = scenario.autoscale.as_mut() {
            a.pod_start = pod_start;
        }
        run(&scenario).summary()
    };
    // New workers that never start: the shared workers they replace wait 120 s for them, then
    // go, as the operator lets a shrink go at its surge timeout (a Pod that cannot start must
    // not hold a pool's size for ever). Ten seconds less, and they are still there at the end.
    let never = run_for(3_600_000_000_000);
    let just_in_time = run_for(timeout - 10_000_000_000);
    assert!(
        never.batch_per_second < just_in_time.batch_per_second,
        "{never:?} vs {just_in_time:?}"
    );
}

#[test]
fn shared_pool_size_adds_reserved_workers_on_top() {
    let mut scenario = spike(240);
    if let Some(a) = scenario.autoscale.as_mut() {
        a.sizing.size = crate::sizing::PoolSize::Shared { replicas: 9 };
    }
    let shared = run(&scenario).summary();
    let budget = run(&spike(240)).summary();
    // Nine shared workers throughout: the spike's reserve costs no batch workers.
    assert!(shared.batch_per_second > budget.batch_per_second);
}

#[test]
fn json_output_has_exactly_the_interface_fields() {
    let text = flags("--output json").unwrap_or_else(|e| panic!("{e}"));
    let value: serde_json::Value = serde_json::from_str(&text).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(value["urgent"]["submitted"], 240);
    assert_eq!(value["urgent"]["completed"], 240);
    assert_eq!(value["urgent"]["p50_ms"], 20.0);
    assert_eq!(value["urgent"]["p99_ms"], 20.0);
    assert!(value["batch"]["completed"].is_u64());
    assert!(value["batch"]["throughput_per_s"].is_f64());
    assert!(value.get("reserve").is_none());
    let fifo = flags("--arrangement fifo --output json").unwrap_or_else(|e| panic!("{e}"));
    let fifo: serde_json::Value = serde_json::from_str(&fifo).unwrap_or_else(|e| panic!("{e}"));
    assert!(fifo["urgent"]["p50_ms"].is_null());
}

#[test]
fn autoscale_json_adds_the_reserve() {
    let text = flags(
        "--autoscale --backlog 100000 --urgent-profile 0s=30,60s=150,90s=30 --duration 3m \
         --arrivals poisson --output json",
    )
    .unwrap_or_else(|e| panic!("{e}"));
    let value: serde_json::Value = serde_json::from_str(&text).unwrap_or_else(|e| panic!("{e}"));
    assert!(value["reserve"]["mean"].as_f64().is_some_and(|m| m >= 1.0));
    assert!(value["reserve"]["changes"].as_u64().is_some_and(|c| c >= 1));
}

#[test]
fn bad_flags_are_refused_with_the_flag_named() {
    for (line, flag) in [
        ("--workers 0", "--workers"),
        ("--reserved 11", "--reserved"),
        ("--arrangement strict --reserved 2", "--reserved"),
        ("--batch-ms 300..100", "--batch-ms"),
        ("--urgent-ms -1", "--urgent-ms"),
        ("--urgent-rate -3", "--urgent-rate"),
        ("--urgent-profile 5s=30", "--urgent-profile"),
        ("--urgent-rate 5 --urgent-profile 0s=30", "--urgent-rate"),
        ("--autoscale --arrangement strict", "--autoscale"),
        ("--autoscale --reserve-max 10", "--reserve-max"),
        ("--autoscale --headroom 0", "--headroom"),
        ("--duration 0", "--duration"),
        ("--arrivals sometimes", "--arrivals"),
        ("--warm-up 8s", "--warm-up"),
        ("--warm-up 1.5s", "--warm-up"),
        ("--autoscale --warm-up 3s", "--warm-up"),
        ("--suite --steady --pod-start 2s", "--pod-start"),
    ] {
        let err = flags(line).expect_err(line);
        assert!(err.contains(flag), "{line}: {err}");
    }
}

#[test]
fn a_warm_up_counts_the_same_run_from_its_end() {
    // A spike for the first 2 s that one reserved worker cannot serve alone; calm by 4 s.
    let run = "--urgent-profile 0s=150,2s=20 --reserved 1 --duration 8s --arrivals poisson";
    let json = |extra: &str| -> serde_json::Value {
        let out = flags(&format!("{run} --output json {extra}")).unwrap_or_else(|e| panic!("{e}"));
        serde_json::from_str(&out).unwrap_or_else(|e| panic!("{e}: {out}"))
    };
    let (whole, after) = (json(""), json("--warm-up 4s"));
    let urgent = |v: &serde_json::Value, key: &str| v["urgent"][key].as_f64().unwrap_or(f64::NAN);
    // The same arrivals: 4 s at 20/s are about 80 of them; the spike's came in the warm-up.
    let counted = urgent(&after, "submitted");
    assert!((50.0..120.0).contains(&counted), "{after}");
    assert!(urgent(&whole, "submitted") > counted + 300.0, "{whole}");
    assert!(
        urgent(&after, "p99_ms") < urgent(&whole, "p99_ms"),
        "{whole} {after}"
    );
    let text = flags(&format!("{run} --warm-up 4s")).unwrap_or_else(|e| panic!("{e}"));
    assert!(text.contains("8 s, counted after 4 s"), "{text}");
}

#[test]
fn plot_and_series_files_are_written() {
    let dir = std::env::temp_dir().join(format!("lanepool-simulate-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap_or_else(|e| panic!("{e}"));
    let (svg, csv) = (dir.join("run.svg"), dir.join("run.csv"));
    flags(&format!(
        "--urgent-rate 150 --plot {} --series {}",
        svg.display(),
        csv.display()
    ))
    .unwrap_or_else(|e| panic!("{e}"));
    let svg = std::fs::read_to_string(svg).unwrap_or_default();
    let csv = std::fs::read_to_string(csv).unwrap_or_default();
    assert!(svg.starts_with("<svg") && svg.matches("<polyline").count() == 4);
    assert_eq!(csv.lines().count(), 1 + 8);
    let _ = std::fs::remove_dir_all(dir);
}

fn arrangement() -> impl Strategy<Value = Arrangement> {
    prop::sample::select(Arrangement::ALL.to_vec())
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(48))]

    #[test]
    fn no_run_invents_or_loses_work(
        arrangement in arrangement(),
        workers in 1u32..8,
        reserved in 0u32..4,
        rate in 0.0f64..300.0,
        backlog in 0u64..500,
        seed in 0u64..1000,
        poisson in any::<bool>(),
    ) {
        let scenario = Scenario {
            workers,
            reserved: if arrangement.reserves() { reserved.min(workers) } else { 0 },
            backlog,
            duration: 2_000_000_000,
            seed,
            arrivals: if poisson { ArrivalKind::Poisson } else { ArrivalKind::Even },
            ..Scenario::guide(arrangement, rate)
        };
        let outcome = run(&scenario);
        let s = outcome.summary();
        prop_assert!(s.urgent_completed <= s.urgent_submitted);
        prop_assert!(s.batch_completed <= backlog);
        prop_assert!(outcome.urgent_latencies.iter().all(|l| *l >= scenario.urgent_job));
        // No worker can finish more than duration ÷ job time urgent jobs.
        let takers = match arrangement {
            Arrangement::Dedicated => scenario.reserved,
            _ => workers,
        };
        prop_assert!(s.urgent_completed <= u64::from(takers) * 100);
        let windows: u64 = outcome.windows.iter().map(|w| w.urgent_completed).sum();
        prop_assert_eq!(windows, s.urgent_completed);
    }
}

#[test]
fn autoscaled_latency_target_beats_every_static_split_on_a_shifting_profile() {
    let base = Scenario {
        workers: 6,
        reserved: 1,
        arrivals: ArrivalKind::Poisson,
        profile: RateProfile::parse("0s=20,600s=120,1200s=20").unwrap_or_else(|e| panic!("{e}")),
        backlog: 1_000_000,
        duration: 1_800_000_000_000,
        window: 30_000_000_000,
        ..Scenario::guide(Arrangement::ReservedShared, 20.0)
    };
    let config = default_autoscale(6);
    let splits = tradeoff::static_splits(&base);
    let auto = tradeoff::autoscaled(&base, &config);
    let target = auto
        .iter()
        .find(|p| p.policy == "autoscale p99≤30ms")
        .unwrap_or_else(|| panic!("{auto:?}"));
    let best = tradeoff::best_static(&splits, target.p99_ms).unwrap_or(0.0);
    assert!(target.batch_per_second > best, "{target:?} vs {splits:?}");
}

#[test]
fn suite_seeds_replace_the_sets_own_and_need_the_suite() {
    let parse = |line: &str| {
        Flags::try_parse_from(std::iter::once("simulate").chain(line.split_whitespace()))
            .map(|flags| flags.args.suite_seeds)
    };
    assert_eq!(
        parse("--suite --held-out --suite-seeds 117162,112983").ok(),
        Some(vec![117_162, 112_983])
    );
    assert_eq!(parse("--suite").ok(), Some(Vec::new()));
    assert!(parse("--suite-seeds 5").is_err());
}

#[test]
fn suite_shapes_choose_from_the_set_and_name_the_flag_when_unknown() {
    let args = |line: &str| {
        Flags::try_parse_from(std::iter::once("simulate").chain(line.split_whitespace()))
            .unwrap()
            .args
    };
    let error = super::command::run(&args("--suite --suite-shapes spikes-20s,nope")).unwrap_err();
    let message = error.to_string();
    assert!(
        message.starts_with("--suite-shapes: no shape \"nope\""),
        "{message}"
    );
    assert!(message.contains("walk-slow"), "{message}");
    assert!(
        Flags::try_parse_from(["simulate", "--suite-shapes", "busy"]).is_err(),
        "needs --suite"
    );
}

#[test]
fn the_suite_runs_in_the_world_its_pod_start_names() {
    let run = "--suite --suite-shapes spikes-20s --suite-seeds 1 --workers 4";
    let usual = flags(run).unwrap_or_else(|e| panic!("{e}"));
    let fast = flags(&format!("{run} --pod-start 1s")).unwrap_or_else(|e| panic!("{e}"));
    assert!(
        usual.contains(" 4 workers: mean margin"),
        "the simulator's own world is not named: {usual}"
    );
    assert!(
        fast.contains(" 4 workers, pods starting in 1 s: mean margin"),
        "{fast}"
    );
    let row = |table: &str| table.lines().nth(1).unwrap_or_default().to_string();
    assert_ne!(row(&usual), row(&fast), "the pod start changed nothing");
}

#[test]
fn a_static_pool_pays_for_every_worker_the_whole_run_and_its_batch_work() {
    let scenario = Scenario::guide(Arrangement::ReservedShared, 30.0);
    let outcome = run(&scenario);
    assert!(
        (outcome.worker_seconds - 80.0).abs() < 1e-9,
        "10 workers × 8 s"
    );
    // 8 shared workers on a backlog that never runs out, less their urgent jobs.
    let batch = outcome.batch_busy_seconds;
    assert!(batch > 60.0 && batch < 64.0, "{batch}");
    assert_eq!(outcome.cut_short, 0);
}

#[test]
fn keda_grows_the_urgent_deployment_at_an_hpa_sync_once_the_list_is_long() {
    let line = "--versus keda --workers 10 --urgent-profile 0s=20,30s=200 --duration 60s \
                --arrivals even --pod-start 5s --output json";
    let json: serde_json::Value =
        serde_json::from_str(&flags(line).unwrap_or_else(|e| panic!("{e}"))).unwrap_or_default();
    // 1 urgent worker (50/s) until the list is long at 45 s (the 30 s sync sees a list of a few
    // jobs: ceil(n ÷ 5) = 1), then 5 more start by 50 s: the spike's jobs wait seconds.
    let p99 = json["urgent"]["p99_ms"].as_f64().unwrap_or(0.0);
    assert!(p99 > 5_000.0, "{json}");
    let paid = json["pods"]["worker_seconds"].as_f64().unwrap_or(0.0);
    // 1 urgent + 5 batch for 45 s, then up to 5 urgent: between 6 and 10 Pods.
    assert!(paid > 6.0 * 60.0 && paid < 10.0 * 60.0, "{json}");
}

#[test]
fn a_busy_worker_deleted_by_a_scale_down_is_cut_short_after_its_grace() {
    // 3 batch workers (the batch maximum of 4 workers), 12 jobs: the list of 9 asks for 2 from
    // the first sync on, and once the 300 s stabilization passes the ReplicaSet deletes one of
    // three busy workers; its grace period (30 s) ends long before its job.
    let run = |batch_ms: u32| {
        let line = format!(
            "--versus keda --workers 4 --keda-urgent-max 1 --urgent-profile 0s=1 \
             --batch-ms {batch_ms} --backlog 12 --duration 800s --arrivals even --output json"
        );
        let json = flags(&line).unwrap_or_else(|e| panic!("{e}"));
        serde_json::from_str::<serde_json::Value>(&json).unwrap_or_default()
    };
    let long = run(400_000);
    assert!(
        long["pods"]["cut_short"].as_u64().is_some_and(|n| n >= 1),
        "{long}"
    );
    // Jobs shorter than the grace period finish.
    let short = run(20_000);
    assert_eq!(short["pods"]["cut_short"], 0, "{short}");
    assert_eq!(short["batch"]["completed"], 12, "{short}");
}
