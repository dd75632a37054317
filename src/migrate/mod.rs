//! `lanepool migrate`: a worker Deployment as a LanePool. It reads the Deployment (a manifest or
//! the cluster), recognises its worker's command (`rq worker`, `celery … worker`), makes the
//! pool (the same Pod template, lanes from the queues, the command lanepool's), and says what
//! else to change. It only reads: nothing is written to the cluster, and the Deployment keeps
//! running until the steps retire it, after the pool's workers are ready.
//!
//! - [`args`]: the flags; [`source`]: the Deployment and its autoscalers (the only I/O);
//! - [`command`]: the worker's command recognised and rewritten; [`lanes`]: lanes and size;
//! - [`template`]: the pool's Pod template; [`pool`]: the LanePool, checked, and its YAML;
//! - [`steps`]: what else to change, in order.

pub mod args;
pub mod command;
pub mod error;
pub mod lanes;
pub mod pool;
pub mod source;
pub mod steps;
pub mod template;

#[cfg(test)]
mod tests;

pub use args::MigrateArgs;
pub use error::MigrateError;

/// What `lanepool migrate` prints: the LanePool for stdout, the steps for stderr.
#[derive(Clone, Debug)]
pub struct Migration {
    pub yaml: String,
    pub steps: String,
}

/// Runs `lanepool migrate`.
pub async fn migrate(args: &MigrateArgs) -> Result<Migration, MigrateError> {
    let source = match &args.from_file {
        Some(path) => source::from_file(path, args.deployment.as_deref())?,
        None => {
            let chosen = args.deployment.as_deref().ok_or_else(|| {
                MigrateError::flag("--deployment", "give NAMESPACE/NAME, or --from-file")
            })?;
            source::from_cluster(chosen, args.namespace.as_deref().unwrap_or("default")).await?
        }
    };
    from_source(args, &source)
}

/// [`migrate`] once the Deployment is read: no I/O.
pub fn from_source(args: &MigrateArgs, source: &source::Source) -> Result<Migration, MigrateError> {
    let migrated = pool::build(args, source)?;
    Ok(Migration {
        yaml: pool::render(&migrated)?,
        steps: steps::steps(&migrated, source),
    })
}
