//! `lanepool replay`: what each sizing would have done on a pool's own past traffic. It reads
//! one reserve lane's arrival rate and job time from Prometheus over a past window (the pool's
//! own queries, connection and bounds), replays them through the simulator with each policy,
//! and prints one table and a recommendation. It only reads: nothing is written to the cluster.
//!
//! - [`args`]: the flags and the window; [`pool`]: the LanePool and its connection;
//! - [`history`]: the range queries; [`run`]: the simulation of each policy (pure);
//! - [`render`] and [`plot`]: the table, the JSON and the SVG.

pub mod args;
pub mod error;
pub mod history;
pub mod plot;
pub mod pool;
pub mod render;
pub mod run;

use std::sync::Arc;

pub use args::ReplayArgs;
pub use error::ReplayError;

use crate::prometheus::{AllowedUrls, Clients};
use args::OutputArg;

/// Runs `lanepool replay` and returns what to print.
pub async fn replay(args: &ReplayArgs) -> Result<String, ReplayError> {
    let range = args::window(args, k8s_openapi::jiff::Timestamp::now())?;
    let batch_job = match &args.batch_ms {
        Some(text) => {
            let (low, high) = crate::simulate::command::args::parse_millis_range(text)
                .map_err(|e| ReplayError::flag("--batch-ms", e.to_string()))?;
            Some(((low * 1e6).round() as u64, (high * 1e6).round() as u64))
        }
        None => None,
    };
    let pool = pool::load(args).await?;
    let name = format!(
        "{}/{}",
        pool.metadata.namespace.as_deref().unwrap_or_default(),
        pool.metadata.name.as_deref().unwrap_or_default()
    );
    let allowed = args
        .allowed_prometheus_urls
        .clone()
        .unwrap_or_else(AllowedUrls::any);
    let connection = pool::connection(
        &pool,
        args.prometheus_url.as_deref(),
        &allowed,
        args.timeout,
    )
    .await?;
    let clients = Clients::new(2, Arc::new(crate::metrics::Metrics::default()));
    let client = clients.get(&connection)?;
    let windows = history::windows(&args.rate_window, &args.job_time_window, range.step);
    tracing::info!(pool = %name, url = %connection.url, step = range.step, points = range.points(), "reading the history");
    let history = history::read(&pool, args.lane.as_deref(), &client, range, &windows).await?;
    let parse = |window: &str| crate::duration::parse(window).unwrap_or_default();
    let world = run::World {
        rate_window: parse(&args.rate_window),
        job_time_window: parse(&args.job_time_window),
        scrape_interval: args.scrape_interval,
        pod_start: args.pod_start,
        batch_job,
        seed: args.seed,
    };
    let spec = pool.spec.clone();
    let replayed = {
        let history = history.clone();
        tokio::task::spawn_blocking(move || run::replay(&history, &spec, &world))
            .await
            .map_err(|e| ReplayError::NoData(format!("the simulation stopped: {e}")))??
    };
    tracing::info!(pool = %name, seconds = replayed.simulated_in.as_secs_f64(), "replayed");
    if let Some(path) = &args.plot {
        let recommended = replayed
            .recommendation
            .policy
            .as_ref()
            .map_or_else(String::new, run::Policy::name);
        let svg = plot::svg(&history, &replayed, &recommended);
        std::fs::write(path, svg).map_err(|source| ReplayError::Write {
            path: path.clone(),
            source,
        })?;
    }
    let heading = render::Heading {
        pool: &name,
        history: &history,
    };
    Ok(match args.output {
        OutputArg::Text => render::text(&heading, &replayed),
        OutputArg::Json => render::json(&heading, &replayed),
    })
}
