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

    /// A Secret the LanePool refers to is missing, or lacks a key. One message for both, naming
    /// every key the field needs: a pool's author learns nothing of a Secret they may not read
    /// (whether it exists, which of its keys do).
    #[error("{field}: Secret {name:?} does not exist or lacks one of the keys {keys}")]
    MissingSecret {
        field: &'static str,
        name: String,
        keys: String,
    },

    /// The pool names a Prometheus the operator may not send its credentials to.
    #[error(
        "spec.prometheus.url {url:?} is not allowed by the operator's --allowed-prometheus-urls ({allowed}); no connection was made"
    )]
    PrometheusUrlNotAllowed { url: String, allowed: String },

    /// The pool would send credentials to a URL the installer did not name.
    #[error(
        "spec.prometheus.url {url:?} has credentials (a bearer token, basic auth or a client certificate) but the installer named no such URL: credentials go only to the operator's --prometheus-url or a URL --allowed-prometheus-urls allows (the chart's prometheusUrl, allowedPrometheusUrls); no Secret was read and no connection made"
    )]
    CredentialsNotAllowed { url: String },

    /// A Deployment the pool would write exists and belongs to something else.
    #[error(
        "Deployment {name:?} exists and is not this pool's ({owner}); nothing was written to it: rename the pool or the lane, or delete that Deployment"
    )]
    NameConflict { name: String, owner: String },

    /// The API server refused or failed a request.
    #[error("{action}: {source}")]
    Kube {
        action: String,
        #[source]
        source: kube::Error,
    },

    /// The API server did not answer in time.
    #[error("{action}: no answer within {seconds} s")]
    Timeout { action: String, seconds: u64 },

    #[error(
        "{action}: not written: this replica's leader lease was not seen renewed in time, so \
         another replica may hold it"
    )]
    NotLeader { action: String },

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

    /// A PascalCase reason for conditions and events.
    pub fn reason(&self) -> &'static str {
        match self {
            Self::Invalid { .. } | Self::Duration { .. } => "InvalidSpec",
            Self::MissingSecret { .. } => "MissingSecret",
            Self::PrometheusUrlNotAllowed { .. } | Self::CredentialsNotAllowed { .. } => {
                "PrometheusURLNotAllowed"
            }
            Self::NameConflict { .. } => "NameConflict",
            Self::Kube { .. } => "ApiServerRefused",
            Self::Timeout { .. } => "ApiServerTimeout",
            Self::NotLeader { .. } => "NotLeader",
            Self::Serialize { .. } => "InternalError",
        }
    }

    /// A short, stable name for metrics labels.
    pub fn metric_label(&self) -> &'static str {
        match self {
            Self::Invalid { .. } => "invalid",
            Self::Duration { .. } => "invalid_duration",
            Self::Serialize { .. } => "serialize",
            Self::MissingSecret { .. } => "missing_secret",
            Self::PrometheusUrlNotAllowed { .. } => "prometheus_url_not_allowed",
            Self::CredentialsNotAllowed { .. } => "credentials_not_allowed",
            Self::NameConflict { .. } => "name_conflict",
            Self::Kube { .. } => "kube",
            Self::Timeout { .. } => "timeout",
            Self::NotLeader { .. } => "not_leader",
        }
    }
}

pub type Result<T, E = Error> = std::result::Result<T, E>;
