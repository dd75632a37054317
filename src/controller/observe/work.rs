//! What a pool's workers are doing, for the steps that choose whom to drain, stand in or stop:
//! each worker's own gauges (its `/metrics` answer, asked at most once per reconcile and shared
//! with the load reads), and for those that do not answer, the pool's Prometheus (a scrape old),
//! asked at most once per reconcile. Read when a step first needs it: a reconcile that stops no
//! one asks nothing, and one that drains, ranks and opens gates asks each worker once.

use std::collections::BTreeMap;
use std::time::{SystemTime, UNIX_EPOCH};

use tokio::sync::OnceCell;

use super::measure::busy_workers;
use crate::api::LanePool;
use crate::controller::context::Context;
use crate::controller::pods::{PoolPods, Worker, gauge_values, parse_gauges};
use crate::controller::protocol::{DRAINING_METRIC, STANDING_IN_METRIC};
use crate::controller::rollout::cost::{Labelled, Reading, busy_pods};
use crate::controller::rollout::drain::Candidate;
use crate::controller::rollout::inherited::Inherited;
use crate::prometheus::Connection;

/// What the pool's last measurement knows that the work reads need: how to reach its Prometheus
/// (for workers that do not answer) and every lane's mean job time.
#[derive(Clone, Copy, Debug)]
pub(in crate::controller) struct LastMeasured<'m> {
    pub(in crate::controller) connection: Option<&'m Connection>,
    pub(in crate::controller) job_seconds: &'m BTreeMap<String, f64>,
}

/// One reconcile's observation of one pool's workers: the pool, the snapshot of its Pods, and what
/// they said, each read once. Every step that acts on workers gets it in place of the four
/// things it holds.
pub(in crate::controller) struct Observed<'a> {
    pub(in crate::controller) pool: &'a LanePool,
    pub(in crate::controller) ctx: &'a Context,
    pub(in crate::controller) pods: &'a PoolPods<'a>,
    pub(in crate::controller) measured: LastMeasured<'a>,
    /// Prometheus's busy and job-start gauges for the whole pool (`None`: it could not say),
    /// asked once, the first time a worker does not answer.
    scraped: OnceCell<Option<(Vec<Labelled>, Vec<Labelled>)>>,
}

impl<'a> Observed<'a> {
    pub(in crate::controller) fn new(
        pool: &'a LanePool,
        ctx: &'a Context,
        pods: &'a PoolPods<'a>,
        measured: LastMeasured<'a>,
    ) -> Self {
        Self {
            pool,
            ctx,
            pods,
            measured,
            scraped: OnceCell::new(),
        }
    }

    /// What each of `live` is doing (Prometheus for those that do not answer); `None` when no
    /// one could say. `deployment` names the step it is for in a warning.
    pub(in crate::controller) async fn work(
        &self,
        deployment: &str,
        live: &[&Worker],
    ) -> Option<Reading> {
        let (busy, job_started) = self.gauges(live).await;
        let mut work = busy_pods(&busy, &job_started);
        let answered = work.len();
        if live.iter().any(|w| !work.contains_key(&w.name)) {
            match self.scraped(deployment).await {
                Some((busy, job_started)) => {
                    for (pod, scraped) in busy_pods(busy, job_started) {
                        work.entry(pod).or_insert(scraped);
                    }
                }
                None if answered == 0 => return None,
                None => {}
            }
        }
        let now = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .unwrap_or_default()
            .as_secs_f64();
        Some(Reading {
            work,
            job_seconds: self.measured.job_seconds.clone(),
            now,
            answered,
        })
    }

    /// Each of `workers` that has a metrics port, asked for its gauges (once per reconcile):
    /// busy and job-start samples, labelled by pod name.
    async fn gauges(&self, workers: &[&Worker]) -> (Vec<Labelled>, Vec<Labelled>) {
        self.pods.metrics_texts(workers).await.into_iter().fold(
            Default::default(),
            |(mut busy, mut started), (name, answered)| {
                let (b, s) = parse_gauges(&answered.text, &name);
                busy.extend(b);
                started.extend(s);
                (busy, started)
            },
        )
    }

    async fn scraped(&self, deployment: &str) -> Option<&(Vec<Labelled>, Vec<Labelled>)> {
        let (ctx, connection, pool) = (self.ctx, self.measured.connection, self.pool);
        self.scraped
            .get_or_init(|| busy_workers(ctx, connection, pool, deployment))
            .await
            .as_ref()
    }

    /// Which workers say they drain or stand in: what an earlier leader (or this process before
    /// a restart) left in them. A worker that does not answer says nothing.
    pub(in crate::controller) async fn inherited(&self) -> Inherited {
        let workers: Vec<&Worker> = self.pods.workers().iter().collect();
        let deployment: BTreeMap<&str, &str> = workers
            .iter()
            .map(|w| (w.name.as_str(), w.deployment.as_str()))
            .collect();
        let mut inherited = Inherited::default();
        for (name, answered) in self.pods.metrics_texts(&workers).await {
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
}

/// The workers of `live` as a drain or the stand-ins choose among them: ready or not, and their
/// idle-first cost in `reading`; `chosen` names those already chosen (they stay first).
pub(in crate::controller) fn candidates(
    reading: &Reading,
    live: &[&Worker],
    chosen: impl Fn(&str) -> bool,
) -> Vec<Candidate> {
    live.iter()
        .map(|w| Candidate {
            name: w.name.clone(),
            ready: w.ready,
            cost: reading.cost(&w.name),
            draining: chosen(&w.name),
        })
        .collect()
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
