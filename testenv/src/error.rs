//! Why the local control plane, or a tool beside it, could not start.

use std::path::PathBuf;

/// Why the control plane could not start.
#[derive(thiserror::Error)]
pub enum TestEnvError {
    #[error("{tool} is not built at {path}: run ./tests/setup.sh")]
    ToolMissing { tool: String, path: PathBuf },
    #[error("{what} is not installed (Debian's package {package}): run ./tests/setup.sh")]
    PackageMissing { what: String, package: String },
    #[error("{what}: {source}")]
    Io {
        what: String,
        #[source]
        source: std::io::Error,
    },
    #[error("generating certificates: {0}")]
    Certificates(#[from] rcgen::Error),
    #[error("{what} did not become ready within {seconds} s; the end of its log:\n{log}")]
    NotReady {
        what: String,
        seconds: u64,
        log: String,
    },
    #[error("kube client: {0}")]
    Kube(#[from] kube::Error),
    #[error("kubeconfig: {0}")]
    Kubeconfig(#[from] kube::config::KubeconfigError),
}

/// `expect` shows Debug: make it the sentence that says what to do ("run ./tests/setup.sh").
impl std::fmt::Debug for TestEnvError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        std::fmt::Display::fmt(self, f)
    }
}

pub type Result<T, E = TestEnvError> = std::result::Result<T, E>;

pub(crate) fn io(what: impl Into<String>) -> impl FnOnce(std::io::Error) -> TestEnvError {
    let what = what.into();
    move |source| TestEnvError::Io { what, source }
}
