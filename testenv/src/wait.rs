//! Small things every starter needs: a free port, and polling until something holds.

use std::net::TcpListener;

use crate::error::{Result, io};

/// A port on 127.0.0.1 that was free a moment ago.
pub fn free_port() -> Result<u16> {
    let listener = TcpListener::bind("127.0.0.1:0").map_err(io("finding a free port"))?;
    Ok(listener
        .local_addr()
        .map_err(io("finding a free port"))?
        .port())
}

/// Polls `check` every 250 ms until it is true: how long that took, or `None` after `timeout`.
pub async fn poll_until<F, Fut>(
    timeout: std::time::Duration,
    mut check: F,
) -> Option<std::time::Duration>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = bool>,
{
    let started = std::time::Instant::now();
    while !check().await {
        if started.elapsed() >= timeout {
            return None;
        }
        tokio::time::sleep(std::time::Duration::from_millis(250)).await;
    }
    Some(started.elapsed())
}

/// Polls `check` every 250 ms until it is true: how long that took. Fails the test, naming
/// `what`, after `seconds`.
pub async fn until<F, Fut>(seconds: u64, what: &str, check: F) -> std::time::Duration
where
    F: FnMut() -> Fut,
    Fut: Future<Output = bool>,
{
    poll_until(std::time::Duration::from_secs(seconds), check)
        .await
        .unwrap_or_else(|| panic!("{what}: not within {seconds} s"))
}

/// Runs the future `start` makes to its end on a thread and a runtime of its own, and returns
/// what it returned: the caller may be inside a tokio runtime, where blocking on another is
/// refused. A panic in it is the caller's.
pub(crate) fn on_a_thread_of_its_own<T, F, Fut>(start: F) -> Result<T>
where
    T: Send + 'static,
    F: FnOnce() -> Fut + Send + 'static,
    Fut: Future<Output = Result<T>>,
{
    std::thread::spawn(move || {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .map_err(io("building a runtime"))?
            .block_on(start())
    })
    .join()
    .unwrap_or_else(|panic| std::panic::resume_unwind(panic))
}
