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
