//! The pinned tools tests/tools/build.sh builds and the Python workers' virtualenv: where they
//! are, or a clear error saying how to make them.

use std::path::PathBuf;

use crate::error::{Result, TestEnvError};

/// Where tests/tools/build.sh puts the pinned binaries.
pub fn tools_dir() -> PathBuf {
    std::env::var_os("LANEPOOL_TOOLS_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../target/tools"))
}

/// The virtualenv of the Python workers (`tests/python.sh` makes it): `LANEPOOL_PYTHON_VENV` or
/// `target/python`.
pub fn python_venv() -> PathBuf {
    std::env::var_os("LANEPOOL_PYTHON_VENV")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../target/python"))
}

/// A program of the Python workers' virtualenv (`python`, `lanepool-rq-worker`, `celery`…), or
/// a clear error when it has not been made.
pub fn python_program(name: &str) -> Result<PathBuf> {
    let path = python_venv().join("bin").join(name);
    if path.is_file() {
        Ok(path)
    } else {
        Err(TestEnvError::ToolMissing {
            tool: format!("{name} (the Python workers' virtualenv)"),
            path,
        })
    }
}

/// A pinned tool, or a clear error when it has not been built.
pub fn tool(name: &str) -> Result<PathBuf> {
    let path = tools_dir().join(name);
    if path.is_file() {
        Ok(path)
    } else {
        Err(TestEnvError::ToolMissing {
            tool: name.into(),
            path,
        })
    }
}
