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

/// The example lane queue as a process of the test, killed when dropped.
pub struct LaneQueue {
    child: std::process::Child,
    addr: std::net::SocketAddr,
}

impl LaneQueue {
    /// Starts `lane_queue --listen=127.0.0.1:0` with `args`, and waits for the address it prints
    /// on its first line.
    pub fn start(args: &[String]) -> Self {
        use std::io::BufRead;
        use std::process::Stdio;
        let mut child = Command::new(example("lane_queue"))
            .arg("--listen=127.0.0.1:0")
            .args(args)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .expect("starting lane_queue");
        let stdout = child.stdout.take().expect("piped stdout");
        let mut line = String::new();
        std::io::BufReader::new(stdout)
            .read_line(&mut line)
            .expect("the queue's first line");
        let addr = line
            .trim()
            .rsplit("http://")
            .next()
            .and_then(|a| a.parse().ok())
            .unwrap_or_else(|| panic!("no address in {line:?}"));
        Self { child, addr }
    }

    /// Where it listens.
    pub fn addr(&self) -> std::net::SocketAddr {
        self.addr
    }
}

impl Drop for LaneQueue {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The tests' pool, `tests/fixtures/formula-pool.yaml`, as JSON for a test to change: the
/// guide's pool sized by the formula, whose arithmetic the integration tests assert.
pub fn formula_pool() -> serde_json::Value {
    let yaml = include_str!("../../tests/fixtures/formula-pool.yaml");
    serde_yaml::from_str(yaml).expect("tests/fixtures/formula-pool.yaml is YAML")
}
