//! Why a simulation could not run: a flag out of range (the user's to fix, exit code 2) or an
//! output file that could not be written. Never a panic on user input.

use std::path::PathBuf;

#[derive(Debug, thiserror::Error)]
pub enum SimulateError {
    #[error("{flag}: {reason}")]
    Flag { flag: &'static str, reason: String },

    #[error("writing {path}: {source}")]
    Write {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
}

impl SimulateError {
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
            Self::Write { .. } => 1,
        }
    }
}
