//! Waiting for a condition with a deadline instead of sleeping for a fixed time.

use std::time::Duration;

use super::DEADLINE;

/// How often a condition that offers no notification is checked.
pub const POLL: Duration = Duration::from_millis(5);

/// Waits until `done` holds, checking every [`POLL`], or panics after [`DEADLINE`]. It reads
/// tokio's clock, so it also works on paused time.
pub async fn wait_until(what: &str, mut done: impl FnMut() -> bool) {
    let end = tokio::time::Instant::now() + DEADLINE;
    while !done() {
        assert!(
            tokio::time::Instant::now() < end,
            "timed out waiting for {what}"
        );
        tokio::time::sleep(POLL).await;
    }
}

/// Asks `probe` every `every` until it gives `Ok`, and returns what it gave; panics after
/// [`DEADLINE`], saying `what` and what the last `Err` said (the state it saw). For a condition
/// read through an async call (a scrape, an admin request); it reads tokio's clock too.
pub async fn until_ok<T>(
    what: &str,
    every: Duration,
    mut probe: impl AsyncFnMut() -> Result<T, String>,
) -> T {
    let end = tokio::time::Instant::now() + DEADLINE;
    loop {
        match probe().await {
            Ok(value) => return value,
            Err(seen) => assert!(
                tokio::time::Instant::now() < end,
                "timed out waiting for {what}: {seen}"
            ),
        }
        tokio::time::sleep(every).await;
    }
}

/// Waits until `done` holds, checking every 10 ms on the calling thread (for a test that drives
/// processes from outside a runtime), or panics after [`DEADLINE`].
pub fn block_until(what: &str, mut done: impl FnMut() -> bool) {
    let end = std::time::Instant::now() + DEADLINE;
    while !done() {
        assert!(
            std::time::Instant::now() < end,
            "no {what} within {DEADLINE:?}"
        );
        std::thread::sleep(Duration::from_millis(10));
    }
}
