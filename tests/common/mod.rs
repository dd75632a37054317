//! What more than one test binary needs: a child process killed when dropped, and waits that
//! say more than `testenv::until` when they time out. A test file takes it with `mod common;`
//! (a directory module: Cargo does not build it as a test binary of its own).

// Each test binary that says `mod common;` uses a part of this module, not all of it: what one
// binary leaves unused would be dead code in that binary.
#![allow(dead_code)]

pub mod node;

use std::process::Child;

use k8s_openapi::api::core::v1::Pod;
use std::time::{Duration, Instant};

/// Whether `pod` is Ready and not being deleted.
pub fn is_ready(pod: &Pod) -> bool {
    pod.metadata.deletion_timestamp.is_none()
        && pod
            .status
            .as_ref()
            .and_then(|s| s.conditions.as_ref())
            .is_some_and(|c| c.iter().any(|c| c.type_ == "Ready" && c.status == "True"))
}

/// A child process killed and reaped when dropped (with what dies with it: a process kubelet's
/// workers die with their kubelet).
pub struct Killed(pub Child);

impl Drop for Killed {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// `testenv::until` that says more when it fails: polls `check` every 250 ms until it is true
/// and returns how long that took; after `seconds`, fails the test with
/// "`what`: not within `seconds` s; " and what `context` says then (the pool's status, the
/// operator's output: what shows why).
pub async fn until<F, Fut, C, CFut>(seconds: u64, what: &str, check: F, context: C) -> Duration
where
    F: FnMut() -> Fut,
    Fut: Future<Output = bool>,
    C: FnOnce() -> CFut,
    CFut: Future<Output = String>,
{
    match lanepool_testenv::poll_until(Duration::from_secs(seconds), check).await {
        Some(took) => took,
        None => panic!("{what}: not within {seconds} s; {}", context().await),
    }
}

/// `testenv::poll_until` for a wait that blocks its thread (a `#[test]` without a runtime, a
/// synchronous helper): polls `check` every `every` until it is true: how long that took, or
/// `None` after `timeout`. The caller fails the test with its own message.
pub fn poll_blocking(
    timeout: Duration,
    every: Duration,
    mut check: impl FnMut() -> bool,
) -> Option<Duration> {
    let started = Instant::now();
    while !check() {
        if started.elapsed() >= timeout {
            return None;
        }
        std::thread::sleep(every);
    }
    Some(started.elapsed())
}
