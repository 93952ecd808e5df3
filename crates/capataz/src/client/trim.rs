//! Giving the memory of released connections back to the system.
//!
//! A connection that parks frees hyper's state, its two 8 KB buffers included, but glibc keeps
//! freed memory in its heap: after a burst of keep-alive clients that then sit idle, the
//! process's resident memory would stay at the burst's peak. Once [`ENOUGH`] connections have
//! parked, a watcher asks glibc to give the free pages back (`malloc_trim`, on a blocking
//! thread), at most once per [`MIN_GAP`]. HAProxy trims its heap too when it releases its
//! pools. Nothing happens under steady load (a busy keep-alive connection never parks) nor for
//! connections that close.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

/// Connections parked since the last trim.
static PARKED: AtomicU64 = AtomicU64::new(0);

/// When the last trim started, in milliseconds since [`epoch`] (0: never).
static LAST: AtomicU64 = AtomicU64::new(0);

/// About a megabyte of hyper's connection state (two 8 KB buffers and 1.5 KB of state each).
const ENOUGH: u64 = 64;

/// The shortest time between two trims.
const MIN_GAP: Duration = Duration::from_secs(5);

fn epoch() -> Instant {
    static EPOCH: OnceLock<Instant> = OnceLock::new();
    *EPOCH.get_or_init(Instant::now)
}

/// A connection parked (its HTTP state released).
pub(super) fn parked() {
    PARKED.fetch_add(1, Ordering::Relaxed);
}

/// Trims the heap if enough was released since the last trim and that was long enough ago.
/// Called by the watchers after each look; cheap when there is nothing to do.
pub(super) fn maybe() {
    if PARKED.load(Ordering::Relaxed) < ENOUGH {
        return;
    }
    // Never 0 once started, so that 0 keeps meaning "never".
    let now = u64::try_from(epoch().elapsed().as_millis())
        .unwrap_or(u64::MAX)
        .max(1);
    let last = LAST.load(Ordering::Relaxed);
    if !due(last, now) {
        return;
    }
    // One watcher wins the slot; the others see the new `LAST`.
    if LAST
        .compare_exchange(last, now, Ordering::AcqRel, Ordering::Relaxed)
        .is_err()
    {
        return;
    }
    PARKED.store(0, Ordering::Relaxed);
    // On a blocking thread: it walks the heap's free chunks under the allocator's lock.
    drop(tokio::task::spawn_blocking(trim));
}

/// Whether a trim may start at `now`, the last one having started at `last` (both in
/// milliseconds since the epoch; `last` 0 for never).
fn due(last: u64, now: u64) -> bool {
    last == 0 || now.saturating_sub(last) >= MIN_GAP.as_millis() as u64
}

#[cfg(all(target_os = "linux", target_env = "gnu"))]
fn trim() {
    extern "C" {
        fn malloc_trim(pad: usize) -> std::ffi::c_int;
    }
    // SAFETY: glibc's `malloc_trim` takes a byte count and only releases free memory; it is
    // thread-safe (it takes each arena's lock).
    unsafe {
        malloc_trim(0);
    }
}

#[cfg(not(all(target_os = "linux", target_env = "gnu")))]
fn trim() {}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_trim_is_due_at_first_then_once_per_gap() {
        assert!(due(0, 1));
        assert!(!due(1_000, 5_999));
        assert!(due(1_000, 6_000));
        // A clock that went back (it cannot, `Instant` is monotonic) never trims in a loop.
        assert!(!due(5_000, 4_000));
    }
}
