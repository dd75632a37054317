//! Why a replay could not run, naming what to change: a flag, a field of the pool, the pool
//! itself, or the Prometheus that was asked. Never a panic on what came from the user, the
//! cluster or Prometheus.

use std::path::PathBuf;

#[derive(Debug, thiserror::Error)]
pub enum ReplayError {
    /// A flag out of range, or flags that do not go together.
    #[error("{flag}: {reason}")]
    Flag { flag: &'static str, reason: String },

    #[error("LanePool {namespace}/{name} not found")]
    UnknownPool { namespace: String, name: String },

    #[error("reading {path}: {reason}")]
    Manifest { path: PathBuf, reason: String },

    /// The pool's spec (or the operator's checks on it) refused.
    #[error(transparent)]
    Pool(#[from] crate::Error),

    #[error("the cluster: {0}")]
    Cluster(String),

    /// Prometheus did not answer a lane's question.
    #[error("lane {lane}, {what}: {reason}")]
    Prometheus {
        lane: String,
        what: &'static str,
        reason: String,
    },

    /// Prometheus answered, but with nothing to replay.
    #[error("{0}")]
    NoData(String),

    #[error("writing {path}: {source}")]
    Write {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
}

impl ReplayError {
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
