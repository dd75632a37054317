//! The project's release as a user meets it: images/build.sh builds the images and pushes them
//! to a registry, charts/push.sh pushes the chart, and the pinned helm installs it.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;
use std::time::Instant;

use crate::error::{Result, TestEnvError, io};
use crate::tools::{tool, tools_dir};

/// The repository's root.
fn root() -> &'static Path {
    let testenv = Path::new(env!("CARGO_MANIFEST_DIR"));
    testenv.parent().unwrap_or(testenv)
}

/// Runs images/build.sh once per process with buildah, pushing every image to `registry`
/// (`HOST:PORT`, the same on every call); returns target/images/, which holds each image's
/// archive and digest.
pub fn build_and_push_images(registry: &str) -> Result<PathBuf> {
    static BUILT: OnceLock<(String, std::result::Result<PathBuf, String>)> = OnceLock::new();
    let (pushed_to, built) =
        BUILT.get_or_init(|| (registry.to_owned(), build_and_push(registry, None)));
    // Once per process, to one registry: another would hold none of the images.
    assert_eq!(
        pushed_to, registry,
        "the images were pushed to another registry"
    );
    built.clone().map_err(|e| TestEnvError::Io {
        what: "building the images".into(),
        source: std::io::Error::other(e),
    })
}

/// Runs images/build.sh for the Python workers' image alone (`LANEPOOL_IMAGES=python-worker`: no
/// release build of the Rust binaries) and pushes it to `registry`; returns target/images/, which
/// holds its archive and digest. For a test that runs no other image of the project.
pub fn build_and_push_python_worker_image(registry: &str) -> Result<PathBuf> {
    build_and_push(registry, Some("python-worker")).map_err(|e| TestEnvError::Io {
        what: "building the Python workers' image".into(),
        source: std::io::Error::other(e),
    })
}

/// Runs images/build.sh with buildah, pushing to `registry` the images named (`LANEPOOL_IMAGES`)
/// or every image; returns target/images/.
fn build_and_push(registry: &str, images: Option<&str>) -> std::result::Result<PathBuf, String> {
    let mut build = Command::new(root().join("images/build.sh"));
    build
        .env("LANEPOOL_IMAGE_BUILDER", "buildah")
        .env("LANEPOOL_IMAGE_PUSH", registry);
    if let Some(images) = images {
        build.env("LANEPOOL_IMAGES", images);
    }
    without_cargos_test_variables(&mut build);
    let started = Instant::now();
    let status = build
        .status()
        .map_err(|e| format!("images/build.sh: {e}"))?;
    if !status.success() {
        return Err(format!("images/build.sh failed ({status})"));
    }
    let which = images.map_or(String::new(), |i| format!(" ({i})"));
    eprintln!("images/build.sh{which} took {:.0?}", started.elapsed());
    Ok(root().join("target/images"))
}

/// Without the variables cargo set for a test (CARGO_PKG_*, CARGO_MANIFEST_DIR…): some build
/// scripts rerun when they change, and the outer build would then be redone.
pub fn without_cargos_test_variables(command: &mut Command) {
    for (name, _) in std::env::vars_os() {
        let name = name.to_string_lossy();
        if name.starts_with("CARGO_") && name != "CARGO_HOME" && name != "CARGO_TARGET_DIR" {
            command.env_remove(&*name);
        }
    }
}

/// Runs charts/push.sh: the chart as `oci://<registry>/charts/lanepool`.
pub fn push_chart(registry: &str) -> Result<()> {
    let output = Command::new(root().join("charts/push.sh"))
        .arg(registry)
        .env("LANEPOOL_TOOLS_DIR", tools_dir())
        .output()
        .map_err(io("running charts/push.sh"))?;
    if output.status.success() {
        Ok(())
    } else {
        Err(TestEnvError::Io {
            what: "charts/push.sh".into(),
            source: std::io::Error::other(String::from_utf8_lossy(&output.stderr).into_owned()),
        })
    }
}

/// The pinned helm with its cache, configuration and data under `home`: (success, stdout,
/// stderr).
pub fn helm(home: &Path, args: &[&str]) -> (bool, String, String) {
    let helm = match tool("helm") {
        Ok(helm) => helm,
        Err(e) => return (false, String::new(), e.to_string()),
    };
    match Command::new(helm)
        .args(args)
        .env("HELM_CACHE_HOME", home.join("cache"))
        .env("HELM_CONFIG_HOME", home.join("config"))
        .env("HELM_DATA_HOME", home.join("data"))
        .output()
    {
        Ok(output) => (
            output.status.success(),
            String::from_utf8_lossy(&output.stdout).into_owned(),
            String::from_utf8_lossy(&output.stderr).into_owned(),
        ),
        Err(e) => (false, String::new(), format!("helm: {e}")),
    }
}
