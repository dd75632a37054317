//! A recorded history for `lanepool replay`: a pool's per-lane counters of the metric
//! convention (`lanepool_jobs_submitted_total`, `lanepool_job_duration_seconds_sum` and
//! `_count`), sampled every scrape interval over a span, written as OpenMetrics text and
//! backfilled into a Prometheus data directory with `promtool tsdb create-blocks-from
//! openmetrics`. The rates are exact per scrape interval, so a test knows what was recorded.

use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::process::Command;

use super::process::{Lifetime, which};
use super::prometheus::TestPrometheus;
use crate::error::{Result, TestEnvError, io};

/// One lane's load: jobs per second in the scrape interval ending at each Unix second, and the
/// mean job time.
pub struct RecordedLane {
    pub lane: String,
    pub job_seconds: f64,
    pub rate: Box<dyn Fn(i64) -> f64 + Send + Sync>,
}

/// What was recorded of one pool.
pub struct Recording {
    pub namespace: String,
    pub pool: String,
    /// The first and last sample, Unix seconds (on whole scrape intervals).
    pub start: i64,
    pub end: i64,
    pub scrape_interval: i64,
    pub lanes: Vec<RecordedLane>,
    /// `[from, to)` spans with no samples (Prometheus down); the counters go on counting.
    pub outages: Vec<(i64, i64)>,
}

impl Recording {
    /// The sample times, outages left out.
    pub fn sample_times(&self) -> impl Iterator<Item = i64> + '_ {
        (self.start..=self.end)
            .step_by(self.scrape_interval as usize)
            .filter(|t| !self.outages.iter().any(|(a, b)| (*a..*b).contains(t)))
    }

    /// The counters as OpenMetrics text, one family at a time, each series in time order.
    pub fn openmetrics(&self) -> String {
        let mut out = String::new();
        let families = [
            ("lanepool_jobs_submitted", "counter", "_total"),
            ("lanepool_job_duration_seconds", "summary", "_sum"),
            ("lanepool_job_duration_seconds", "summary", "_count"),
        ];
        let mut typed = std::collections::HashSet::new();
        for (family, kind, suffix) in families {
            if typed.insert(family) {
                let _ = writeln!(out, "# TYPE {family} {kind}");
            }
            for lane in &self.lanes {
                let labels = format!(
                    r#"{{namespace="{}",pool="{}",lane="{}"}}"#,
                    self.namespace, self.pool, lane.lane
                );
                let mut jobs = 0.0;
                let mut t = self.start;
                let samples: Vec<i64> = self.sample_times().collect();
                for sample in samples {
                    // Count every interval since the last sample, outages included.
                    while t < sample {
                        t += self.scrape_interval;
                        jobs += (lane.rate)(t) * self.scrape_interval as f64;
                    }
                    let value = match suffix {
                        "_sum" => jobs * lane.job_seconds,
                        _ => jobs,
                    };
                    let _ = writeln!(out, "{family}{suffix}{labels} {value} {sample}");
                }
            }
        }
        out.push_str("# EOF\n");
        out
    }

    /// Writes the counters into `dir`/data as TSDB blocks, with promtool.
    pub fn backfill(&self, dir: &Path) -> Result<PathBuf> {
        std::fs::create_dir_all(dir).map_err(io(format!("creating {}", dir.display())))?;
        let input = dir.join("history.om");
        std::fs::write(&input, self.openmetrics()).map_err(io("writing history.om"))?;
        let data = dir.join("data");
        let promtool = which("promtool").ok_or_else(|| TestEnvError::ToolMissing {
            tool: "promtool".into(),
            path: PathBuf::from("/usr/bin/promtool"),
        })?;
        let output = Command::new(promtool)
            .args(["tsdb", "create-blocks-from", "openmetrics"])
            .arg(&input)
            .arg(&data)
            .output()
            .map_err(io("running promtool"))?;
        if !output.status.success() {
            return Err(TestEnvError::Io {
                what: "promtool tsdb create-blocks-from openmetrics".into(),
                source: std::io::Error::other(String::from_utf8_lossy(&output.stderr).into_owned()),
            });
        }
        Ok(data)
    }
}

impl TestPrometheus {
    /// Starts Prometheus in a temporary directory holding `recording`, backfilled, and scraping
    /// nothing of its own.
    pub fn start_on_history(recording: &Recording) -> Result<Self> {
        let temp = tempfile::Builder::new()
            .prefix("lanepool-prometheus-history-")
            .tempdir()
            .map_err(io("creating a temporary directory"))?;
        recording.backfill(temp.path())?;
        let mut prometheus = Self::start_in(temp.path(), &[], Lifetime::Process)?;
        prometheus.keep_dir(temp);
        Ok(prometheus)
    }

    /// Starts Prometheus in `dir` (emptied first) holding `recording`; with
    /// [`Lifetime::Detached`] it is left running after this process (for a person, or a
    /// documentation run), stopped by its pid.
    pub fn start_on_history_in(
        recording: &Recording,
        dir: &Path,
        lifetime: Lifetime,
    ) -> Result<Self> {
        let _ = std::fs::remove_dir_all(dir);
        recording.backfill(dir)?;
        Self::start_in(dir, &[], lifetime)
    }
}

/// The urgent lane's share of its peak rate, hour by hour: the simulator's day shape.
const DAY_SHAPE: [f64; 24] = [
    0.1, 0.1, 0.1, 0.1, 0.15, 0.2, 0.4, 0.7, 1.0, 0.8, 0.6, 0.7, 1.0, 0.6, 0.5, 0.6, 0.8, 1.0, 0.6,
    0.4, 0.3, 0.2, 0.15, 0.1,
];

/// The peak of the synthetic day's urgent lane, jobs per second.
pub const DAY_PEAK: f64 = 60.0;
/// Its spikes: (seconds from the window's start, length in seconds, jobs per second).
pub const DAY_SPIKES: [(i64, i64, f64); 2] =
    [(9 * 3600 + 1800, 180, 200.0), (17 * 3600 + 600, 120, 250.0)];
/// The hour the pool was created, and the outage (from, to) in seconds from the window's start.
pub const DAY_CREATED: i64 = 3600;
pub const DAY_OUTAGE: (i64, i64) = (12 * 3600, 12 * 3600 + 1800);

/// The urgent lane's recorded rate `seconds` after the window's start.
pub fn day_urgent_rate(seconds: i64) -> f64 {
    if let Some((_, _, rate)) = DAY_SPIKES
        .iter()
        .find(|(at, length, _)| (*at..at + length).contains(&(seconds - 1)))
    {
        return *rate;
    }
    let hour = ((seconds - 1).max(0) / 3600) as usize % 24;
    DAY_SHAPE[hour] * DAY_PEAK
}

/// A day of the guide's pool `namespace/pool` ending at `end` (Unix seconds, on a whole 15 s):
/// the urgent lane at the day shape peaking at 60/s with spikes to 200/s and 250/s, 20 ms jobs;
/// the batch lane finishing 30 jobs/s of 200 ms. The pool was created an hour into the window
/// and Prometheus was down from 12:00 to 12:30 of it.
pub fn synthetic_day(namespace: &str, pool: &str, end: i64) -> Recording {
    let start = end - 24 * 3600;
    Recording {
        namespace: namespace.into(),
        pool: pool.into(),
        start: start + DAY_CREATED,
        end,
        scrape_interval: 15,
        lanes: vec![
            RecordedLane {
                lane: "urgent".into(),
                job_seconds: 0.020,
                rate: Box::new(move |t| day_urgent_rate(t - start)),
            },
            RecordedLane {
                lane: "batch".into(),
                job_seconds: 0.200,
                rate: Box::new(|_| 30.0),
            },
        ],
        outages: vec![(start + DAY_OUTAGE.0, start + DAY_OUTAGE.1)],
    }
}
