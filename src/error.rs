//! The one error type of the crate. Each variant names itself as a metric label, so a failing
//! reconcile is counted by kind of failure.

use crate::duration::InvalidDuration;

/// Everything that can go wrong in lanepool.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A LanePool the CRD should have refused, or an input flag out of range.
    #[error("invalid {field}: {reason}")]
    Invalid { field: String, reason: String },

    #[error("invalid {field}: {source}")]
    Duration {
        field: String,
        #[source]
        source: InvalidDuration,
    },

    #[error("serializing {what}: {source}")]
    Serialize {
        what: &'static str,
        #[source]
        source: serde_yaml::Error,
    },
}

impl Error {
    pub fn invalid(field: impl Into<String>, reason: impl Into<String>) -> Self {
        Self::Invalid {
            field: field.into(),
            reason: reason.into(),
        }
    }

    /// A short, stable name for metrics labels.
    pub fn metric_label(&self) -> &'static str {
        match self {
            Self::Invalid { .. } => "invalid",
            Self::Duration { .. } => "invalid_duration",
            Self::Serialize { .. } => "serialize",
        }
    }
}

pub type Result<T, E = Error> = std::result::Result<T, E>;
