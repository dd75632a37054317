//! The pinned kubectl, run against one API server's kubeconfig.

use std::path::Path;

use crate::error::{Result, io};
use crate::tools::tool;

/// Runs the pinned kubectl with `kubeconfig`: whether it succeeded, and its stdout (on failure,
/// its stderr after it).
pub fn kubectl(kubeconfig: &Path, args: &[&str]) -> Result<(bool, String)> {
    let output = std::process::Command::new(tool("kubectl")?)
        .arg("--kubeconfig")
        .arg(kubeconfig)
        .args(args)
        .output()
        .map_err(io("running kubectl"))?;
    let mut text = String::from_utf8_lossy(&output.stdout).into_owned();
    if !output.status.success() {
        text.push_str(&String::from_utf8_lossy(&output.stderr));
    }
    Ok((output.status.success(), text))
}
