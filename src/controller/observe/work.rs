//! What a pool's workers are doing, for the rollout's plan to choose whom to drain, stand in or
//! stop: each worker's own gauges (its `/metrics` answer, asked at most once per reconcile and
//! shared with the load reads) and the pool's Prometheus (a scrape old) for those that do not
//! answer; and what an earlier leader left in them. Between measurements only the workers of the
//! Deployments in motion (`plan::in_motion`) are read: a pool at rest asks nothing here.

use std::collections::{BTreeMap, BTreeSet, HashSet};
use std::time::{SystemTime, UNIX_EPOCH};

use super::measure::busy_workers;
use crate::api::LanePool;
use crate::controller::context::Context;
use crate::controller::plan::inherited::Inherited;
use crate::controller::pods::{PoolPods, gauge_values, parse_gauges};
use crate::controller::protocol::{DRAINING_METRIC, STANDING_IN_METRIC};
use crate::controller::rollout::cost::{Reading, busy_pods};
use crate::controller::worker::Worker;
use crate::prometheus::Connection;

/// What the workers of `deployments` (`None`: every one of the pool) are doing: their own answers (asked once per reconcile, usually
/// already), and Prometheus's busy gauges for those that gave none. Every lane's job time is
/// `job_seconds`.
pub(in crate::controller) async fn read(
    (pool, ctx, pods): (&LanePool, &Context, &PoolPods<'_>),
    deployments: Option<&BTreeSet<String>>,
    connection: Option<&Connection>,
    job_seconds: &BTreeMap<String, f64>,
) -> Reading {
    let live: Vec<&Worker> = pods
        .workers()
        .iter()
        .filter(|w| deployments.is_none_or(|d| d.contains(&w.deployment)))
        .collect();
    let texts = pods.metrics_texts(&live).await;
    let (mut busy, mut started) = (Vec::new(), Vec::new());
    for (name, answered) in &texts {
        let (b, s) = parse_gauges(&answered.text, name);
        busy.extend(b);
        started.extend(s);
    }
    let mut work = busy_pods(&busy, &started);
    let heard: HashSet<String> = work.keys().cloned().collect();
    let silent = live.iter().any(|w| !heard.contains(&w.name));
    let scraped = match silent {
        true => Some(busy_workers(ctx, connection, pool, "the pool's rollout").await),
        false => None,
    };
    let scraped = scraped.map(|answer| match answer {
        Some((busy, started)) => {
            for (pod, scraped) in busy_pods(&busy, &started) {
                work.entry(pod).or_insert(scraped);
            }
            true
        }
        None => false,
    });
    let now = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap_or_default()
        .as_secs_f64();
    Reading {
        work,
        job_seconds: job_seconds.clone(),
        now,
        heard,
        scraped,
    }
}

/// Which workers say they drain or stand in: what an earlier leader (or this process before a
/// restart) left in them. A worker that does not answer says nothing.
pub(in crate::controller) async fn inherited(pods: &PoolPods<'_>) -> Inherited {
    let workers: Vec<&Worker> = pods.workers().iter().collect();
    let deployment: BTreeMap<&str, &str> = workers
        .iter()
        .map(|w| (w.name.as_str(), w.deployment.as_str()))
        .collect();
    let mut inherited = Inherited::default();
    for (name, answered) in pods.metrics_texts(&workers).await {
        let Some(deployment) = deployment.get(name.as_str()) else {
            continue;
        };
        for (gauge, found) in [
            (DRAINING_METRIC, &mut inherited.draining),
            (STANDING_IN_METRIC, &mut inherited.standing_in),
        ] {
            if says(&answered.text, gauge) {
                found
                    .entry(deployment.to_string())
                    .or_default()
                    .insert(name.clone());
            }
        }
    }
    inherited
}

/// Whether a worker's `/metrics` text sets `gauge` above 0.
fn says(text: &str, gauge: &str) -> bool {
    gauge_values(text, gauge).iter().any(|v| *v > 0.0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_worker_says_it_drains_only_with_the_gauge_itself_above_zero() {
        assert!(says("lanepool_worker_draining 1\n", DRAINING_METRIC));
        assert!(!says("lanepool_worker_draining 0\n", DRAINING_METRIC));
        assert!(!says("lanepool_worker_draining_total 1\n", DRAINING_METRIC));
        assert!(says("lanepool_worker_standing_in 1\n", STANDING_IN_METRIC));
    }
}
