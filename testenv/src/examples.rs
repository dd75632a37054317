//! The lanepool examples a test runs as real processes (the lane queue, the lane worker and the
//! process kubelet), built once per test process in the test's own profile: a plain `cargo test`
//! has built them already, and then the build is a no-op.

use std::path::PathBuf;
use std::process::Command;
use std::sync::OnceLock;

/// The examples built together.
const EXAMPLES: [&str; 3] = ["lane_queue", "lane_worker", "local_kubelet"];

/// The path of the example `name`'s binary (one of [`EXAMPLES`]).
pub fn example(name: &str) -> PathBuf {
    static BUILT: OnceLock<PathBuf> = OnceLock::new();
    let dir = BUILT.get_or_init(|| {
        let exe = std::env::current_exe().expect("the test's own path");
        let profile_dir = exe
            .parent()
            .and_then(|deps| deps.parent())
            .expect("tests run from <target>/<profile>/deps")
            .to_path_buf();
        let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
        let mut build = Command::new(cargo);
        build
            .args(["build", "--quiet"])
            .args(EXAMPLES.iter().flat_map(|e| ["--example", e]))
            .current_dir(concat!(env!("CARGO_MANIFEST_DIR"), "/.."));
        // Without the variables cargo set for this test (CARGO_PKG_*, CARGO_MANIFEST_DIR…): some
        // build scripts rerun when they change, and the outer build would then be redone.
        for (name, _) in std::env::vars_os() {
            let name = name.to_string_lossy();
            if name.starts_with("CARGO_") && name != "CARGO_HOME" && name != "CARGO_TARGET_DIR" {
                build.env_remove(&*name);
            }
        }
        if profile_dir.ends_with("release") {
            build.arg("--release");
        }
        let status = build
            .status()
            .expect("running cargo build for the examples");
        assert!(status.success(), "cargo build of the examples failed");
        profile_dir.join("examples")
    });
    dir.join(name)
}
