//! The request path's mutexes are taken through [`lock`], which counts, per [`Site`] and per
//! thread, the acquisitions that found the lock held (a `try_lock` that failed before the
//! waiting `lock`: the same compare-and-swap `lock` starts with, so an uncontended acquisition
//! costs what it did, and only a contended one, already waiting, pays a thread-local add). A
//! debug build also counts every acquisition, so the contention test
//! (`tests/it/contention.rs`) shows from counts which locks a request takes and how few wait;
//! a release build counts none.
//!
//! None of them may be held across an await: the workspace denies `clippy::await_holding_lock`,
//! and a `std::sync::MutexGuard` is not `Send`, so a spawned future holding one over an await
//! does not compile.

use std::cell::Cell;
use std::sync::{Mutex, MutexGuard, PoisonError, TryLockError};

/// Where a request-path mutex is taken.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Site {
    /// A client connection's own idle backend connections (`upstream::PrivateIdle`): taken
    /// and parked once per request, reaped by the connection watcher.
    PrivateIdle,
    /// A backend's shared idle connections (`connection_reuse = "shared"`).
    SharedIdle,
    /// A pool's queue (`max_connections`/`max_requests` with every backend full).
    Queue,
    /// A client connection's task waker (registered once, taken by the watcher's wakes).
    ConnWaker,
    /// A listener watcher's list of new connections (once per accepted connection).
    Watcher,
    /// A pool's retry budget window (once per retry asked for).
    Budget,
    /// A pool's recording tap (only while something records).
    Tap,
    /// A route's rate limit shard (routes with a rate limit).
    RateLimit,
    /// A backend's HTTP/2 connection (HTTP/2 pools).
    H2Conn,
    /// A pool's health engine (`health::PoolRt`): on the request path only for an answer the
    /// fast path cannot settle (an error, or a backend with an error streak or an ejection);
    /// otherwise taken by probes, timers and the admin API.
    Engine,
}

impl Site {
    /// Every site, in the order of their indexes.
    pub const ALL: [Site; SITES] = [
        Site::PrivateIdle,
        Site::SharedIdle,
        Site::Queue,
        Site::ConnWaker,
        Site::Watcher,
        Site::Budget,
        Site::Tap,
        Site::RateLimit,
        Site::H2Conn,
        Site::Engine,
    ];

    /// The site's name, as a test reports it.
    pub fn name(self) -> &'static str {
        match self {
            Site::PrivateIdle => "private_idle",
            Site::SharedIdle => "shared_idle",
            Site::Queue => "queue",
            Site::ConnWaker => "conn_waker",
            Site::Watcher => "watcher",
            Site::Budget => "budget",
            Site::Tap => "tap",
            Site::RateLimit => "rate_limit",
            Site::H2Conn => "h2_conn",
            Site::Engine => "engine",
        }
    }
}

/// How many sites there are.
pub const SITES: usize = 10;

thread_local! {
    static ACQUIRED: [Cell<u64>; SITES] = const { [const { Cell::new(0) }; SITES] };
    static CONTENDED: [Cell<u64>; SITES] = const { [const { Cell::new(0) }; SITES] };
}

/// Locks `mutex`, a request-path mutex taken at `site` (a poisoned lock's data taken as is).
#[inline]
pub fn lock<T>(mutex: &Mutex<T>, site: Site) -> MutexGuard<'_, T> {
    match try_first(mutex, site) {
        Some(guard) => guard,
        None => mutex.lock().unwrap_or_else(PoisonError::into_inner),
    }
}

/// Counts an acquisition at `site` (debug builds) and takes `mutex` if it is free; if it is
/// held, counts the acquisition as contended and returns `None` (the caller then waits).
#[inline]
fn try_first<T>(mutex: &Mutex<T>, site: Site) -> Option<MutexGuard<'_, T>> {
    let i = site as usize;
    #[cfg(debug_assertions)]
    ACQUIRED.with(|a| a[i].set(a[i].get() + 1));
    match mutex.try_lock() {
        Ok(guard) => Some(guard),
        Err(TryLockError::Poisoned(poisoned)) => Some(poisoned.into_inner()),
        Err(TryLockError::WouldBlock) => {
            CONTENDED.with(|c| c[i].set(c[i].get() + 1));
            None
        }
    }
}

/// Acquisitions (counted in debug builds only) and contended acquisitions, by site index
/// ([`Site::ALL`]).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Counts {
    /// Every acquisition (zero in a release build).
    pub acquired: [u64; SITES],
    /// Acquisitions that found the lock held and waited.
    pub contended: [u64; SITES],
}

impl Counts {
    /// Adds `other`'s counts to these.
    pub fn add(&mut self, other: &Counts) {
        for i in 0..SITES {
            self.acquired[i] += other.acquired[i];
            self.contended[i] += other.contended[i];
        }
    }
}

/// This thread's counts since its last call, which starts them again from zero.
pub fn take_thread() -> Counts {
    let mut counts = Counts::default();
    ACQUIRED.with(|a| {
        for (n, cell) in counts.acquired.iter_mut().zip(a) {
            *n = cell.replace(0);
        }
    });
    CONTENDED.with(|c| {
        for (n, cell) in counts.contended.iter_mut().zip(c) {
            *n = cell.replace(0);
        }
    });
    counts
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A lock held elsewhere is counted as contended, a free one is not.
    #[test]
    fn a_held_lock_counts_as_contended() {
        take_thread();
        let mutex = Mutex::new(0);
        *lock(&mutex, Site::Queue) += 1;
        let held = mutex.lock().unwrap();
        assert!(try_first(&mutex, Site::Queue).is_none());
        drop(held);
        let q = Site::Queue as usize;
        let counts = take_thread();
        let acquired = if cfg!(debug_assertions) { 2 } else { 0 };
        assert_eq!((counts.acquired[q], counts.contended[q]), (acquired, 1));
        assert_eq!(counts.acquired.iter().sum::<u64>(), acquired);
        assert_eq!(counts.contended.iter().sum::<u64>(), 1);
        assert_eq!(take_thread(), Counts::default());
    }
}
