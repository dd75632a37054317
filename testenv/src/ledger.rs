//! The demo jobs' ledger in Redis (examples/redis/jobs.py): every job is added to a set when it
//! is submitted, when it starts and when it finishes, so a run ends with how many jobs a worker
//! stopped mid-job (cut short) and how many went missing (lost); and the urgent waits RQ records
//! in its own job hashes, or the Celery app (examples/redis/celery_app.py) in its own.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use crate::redis::{Reply, TestRedis};
use crate::wait::poll_until;

pub const SUBMITTED: &str = "lanepool-demo:submitted";
pub const STARTED: &str = "lanepool-demo:started";
pub const FINISHED: &str = "lanepool-demo:finished";
/// The Celery app's hashes of when each task was sent (`lane time`) and started (Unix seconds):
/// a Celery message carries no time it was sent.
const CELERY_SENT_AT: &str = "lanepool-demo:sent-at";
const CELERY_STARTED_AT: &str = "lanepool-demo:started-at";

/// Every job's ledger at the end of a run: cut short = started and never finished; lost =
/// submitted, not finished and not still queued.
#[derive(Clone, Copy, Debug)]
pub struct Ledger {
    /// The jobs in hand and the urgent ones queued all finished.
    pub settled: bool,
    pub cut_short: i64,
    pub lost: i64,
}

impl TestRedis {
    /// The end of a run, once the producer stopped: the batch jobs still queued (the list
    /// `batch_list`) are taken away at once (RENAME is atomic: no worker takes one between the
    /// count and the taking away) and counted, and the urgent ones and the jobs in hand run to
    /// their end (30 s at most); then every job's ledger.
    pub async fn settle(&self, urgent_list: &str, batch_list: &str) -> Ledger {
        let left = format!("left:{batch_list}");
        // A list already empty is no key: RENAME answers an error, and nothing is left.
        let _ = self.command(&["RENAME", batch_list, &left]);
        let queued: BTreeSet<String> = self.members(&["LRANGE", &left, "0", "-1"]);
        let settled = poll_until(Duration::from_secs(30), || async {
            self.integer(&["LLEN", urgent_list]) == 0
                && self.members(&["SDIFF", STARTED, FINISHED]).is_empty()
        })
        .await;
        // By job id, not by count: a producer stopped between putting a job on its queue and
        // adding it to the submitted set leaves a job that runs and finishes unsubmitted, which
        // a count would take for a lost one found (lost -1), or hide a lost one behind.
        let count = |ids: BTreeSet<String>| i64::try_from(ids.len()).unwrap_or(i64::MAX);
        let unfinished = self.members(&["SDIFF", SUBMITTED, FINISHED]);
        Ledger {
            settled: settled.is_some(),
            cut_short: count(self.members(&["SDIFF", STARTED, FINISHED])),
            lost: count(&unfinished - &queued),
        }
    }

    /// The job ids an array answer names (`SDIFF`, `LRANGE`; a missing key answers an empty
    /// one). Any other answer fails the test: a ledger that cannot be read is never clean.
    fn members(&self, command: &[&str]) -> BTreeSet<String> {
        match self.command(command) {
            Ok(Reply::Array(ids)) => ids
                .into_iter()
                .filter_map(|id| match id {
                    Reply::Bulk(id) => id,
                    _ => None,
                })
                .collect(),
            other => panic!("{}: {other:?}", command.join(" ")),
        }
    }

    /// The waits (enqueued to started) of the urgent jobs that started between `from` and `to`
    /// (Unix seconds), in seconds, from RQ's own job records.
    pub fn rq_urgent_waits(&self, from: f64, to: f64) -> Vec<f64> {
        let Ok(Reply::Array(ids)) = self.command(&["SMEMBERS", STARTED]) else {
            panic!("no ledger of started jobs");
        };
        let mut waits = Vec::new();
        for id in ids {
            let Reply::Bulk(Some(id)) = id else { continue };
            let key = format!("rq:job:{id}");
            let Ok(Reply::Array(fields)) =
                self.command(&["HMGET", &key, "origin", "enqueued_at", "started_at"])
            else {
                continue;
            };
            let text: Vec<Option<String>> = fields
                .into_iter()
                .map(|f| match f {
                    Reply::Bulk(v) => v,
                    _ => None,
                })
                .collect();
            let [Some(origin), Some(enqueued), Some(started)] = &text[..] else {
                continue;
            };
            let (Some(enqueued), Some(started)) = (unix(enqueued), unix(started)) else {
                continue;
            };
            if origin == "urgent" && started >= from && started < to {
                waits.push(started - enqueued);
            }
        }
        waits
    }

    /// Each urgent Celery task that started: when it was sent (Unix seconds) and how long it
    /// waited, from the Celery app's own ledger.
    pub fn celery_urgent_waits(&self) -> Vec<(f64, f64)> {
        let started = self.hash(CELERY_STARTED_AT);
        self.hash(CELERY_SENT_AT)
            .into_iter()
            .filter_map(|(id, sent)| {
                let sent = sent.strip_prefix("urgent ")?.parse::<f64>().ok()?;
                let began = started.get(&id)?.parse::<f64>().ok()?;
                Some((sent, began - sent))
            })
            .collect()
    }

    /// A hash's fields and values (a missing key is an empty one).
    fn hash(&self, key: &str) -> BTreeMap<String, String> {
        let Ok(Reply::Array(items)) = self.command(&["HGETALL", key]) else {
            panic!("HGETALL {key}: no answer");
        };
        let text = |r: &Reply| match r {
            Reply::Bulk(Some(s)) => s.clone(),
            _ => String::new(),
        };
        items
            .chunks(2)
            .map(|pair| (text(&pair[0]), text(&pair[1])))
            .collect()
    }
}

/// An RQ timestamp (`2026-12-05T00:01:02.123456Z`) as Unix seconds.
fn unix(text: &str) -> Option<f64> {
    let at: k8s_openapi::jiff::Timestamp = text.parse().ok()?;
    Some(at.as_millisecond() as f64 / 1000.0)
}

/// Now, in Unix seconds.
pub fn now_unix() -> f64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0.0, |d| d.as_secs_f64())
}

/// The 99th percentile of `values` (the value at rank ⌈0.99 n⌉); panics on none.
pub fn p99(mut values: Vec<f64>) -> f64 {
    assert!(!values.is_empty(), "no values");
    values.sort_by(f64::total_cmp);
    values[(values.len() * 99).div_ceil(100) - 1]
}
