//! Why a migration could not be made, naming what to change: a flag, the manifest, a field of the
//! Deployment, or a queue no lane can take. Never a panic on what came from the user or the
//! cluster.

use std::path::PathBuf;

#[derive(Debug, thiserror::Error)]
pub enum MigrateError {
    /// A flag out of range, or flags that do not go together.
    #[error("{flag}: {reason}")]
    Flag { flag: &'static str, reason: String },

    /// The manifest could not be read or is not YAML.
    #[error("reading {path}: {reason}")]
    Manifest { path: PathBuf, reason: String },

    /// No Deployment, several and none chosen, or the one named is not there.
    #[error("{0}")]
    Choice(String),

    /// The cluster could not be reached or refused a read.
    #[error("the cluster: {0}")]
    Cluster(String),

    /// A field of the Deployment that a LanePool cannot be made from.
    #[error("Deployment {deployment}: {field}: {reason}")]
    Field {
        deployment: String,
        field: String,
        reason: String,
    },

    /// A queue no lane can take (`spec.lanes[].queue`'s rules), or one named twice.
    #[error(
        "queue {queue:?} ({from}) cannot be a lane's queue: {reason}; rename the queue (or give \
         --lanes with the queues to migrate)"
    )]
    Queue {
        queue: String,
        from: String,
        reason: String,
    },

    /// What migrate made breaks a rule of the CRD: a fault of migrate's, never of the input.
    #[error("the LanePool made would be refused: {0}")]
    Refused(String),

    #[error("writing the LanePool as YAML: {0}")]
    Yaml(#[from] serde_yaml::Error),
}

impl MigrateError {
    pub fn flag(flag: &'static str, reason: impl Into<String>) -> Self {
        Self::Flag {
            flag,
            reason: reason.into(),
        }
    }

    /// 2 for a bad flag, as clap does for its own errors; 1 otherwise.
    pub fn exit_code(&self) -> u8 {
        match self {
            Self::Flag { .. } => 2,
            _ => 1,
        }
    }
}
