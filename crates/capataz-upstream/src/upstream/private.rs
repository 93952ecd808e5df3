//! The idle backend connections of one client connection (the default reuse policy,
//! `connection_reuse = "private"`).
//!
//! A backend connection that carried a request of client connection C goes back, once its
//! answer has been read to its end, to C's own small set, and only C's later requests may use
//! it; it is closed with C. So whatever a backend writes on a connection after an answer (a
//! body after a HEAD answer, bytes after a complete body or a 204, whether they arrive before
//! or after the reuse) can only ever be read as an answer to the same client connection, never
//! to another client's request. A new client connection always opens fresh backend
//! connections, as HAProxy's default `http-reuse safe` does for a session's first request.
//!
//! Each set holds at most [`MAX_PRIVATE`] connections (the oldest is closed to make room), or
//! for an HTTP/2 client connection as many as its streams may hold at once (at most
//! `MAX_PRIVATE_H2` in `client`), so a client connection holds at most that many backend
//! sockets while it is idle, and none
//! longer than the backend's `timeouts.idle`: the client connection's watcher reaps the set on
//! its periodic look ([`PrivateIdle::reap`]), as the health runtime reaps the shared sets. A
//! connection is still checked before reuse: not idle too long and nothing unread on it (a
//! connection with stray bytes is dropped).

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Mutex;

use crate::lockstat::{self, Site};
use std::time::{Duration, Instant};

use super::{BackendStream, Upstream};

/// The most idle backend connections one client connection keeps.
pub(crate) const MAX_PRIVATE: usize = 8;

/// The idle backend connections private to one client connection.
#[derive(Debug)]
pub struct PrivateIdle {
    /// Oldest first.
    conns: Mutex<Vec<Parked>>,
    /// The most kept: [`MAX_PRIVATE`], or more for a client connection that carries requests
    /// side by side (HTTP/2 streams), set once it is known.
    capacity: AtomicUsize,
}

impl Default for PrivateIdle {
    fn default() -> PrivateIdle {
        PrivateIdle {
            conns: Mutex::new(Vec::new()),
            capacity: AtomicUsize::new(MAX_PRIVATE),
        }
    }
}

/// One idle connection.
#[derive(Debug)]
struct Parked {
    /// The backend's `Upstream::id`.
    backend: u64,
    stream: BackendStream,
    /// When its last answer arrived.
    since: Instant,
    /// The backend's `timeouts.idle`.
    idle_timeout: Duration,
}

impl Parked {
    fn usable(&mut self, now: Instant) -> bool {
        super::usable(&mut self.stream, self.since, self.idle_timeout, now)
    }
}

impl PrivateIdle {
    /// An empty set.
    pub fn new() -> PrivateIdle {
        PrivateIdle::default()
    }

    /// Keeps up to `capacity` connections (at least [`MAX_PRIVATE`]): as many as the client
    /// connection may have requests in progress at once, so that its requests side by side
    /// do not open and close a backend connection each.
    pub fn set_capacity(&self, capacity: usize) {
        self.capacity
            .store(capacity.max(MAX_PRIVATE), Ordering::Relaxed);
    }

    /// The most recent idle connection to `upstream` that is still usable at `now`; unusable
    /// ones to it are dropped on the way.
    pub(crate) fn take(&self, upstream: &Upstream, now: Instant) -> Option<BackendStream> {
        let mut conns = lockstat::lock(&self.conns, Site::PrivateIdle);
        while let Some(at) = conns.iter().rposition(|p| p.backend == upstream.id) {
            let mut parked = conns.remove(at);
            if parked.usable(now) {
                return Some(parked.stream);
            }
        }
        None
    }

    /// Keeps `stream`, a connection to `upstream` whose answer arrived at `since`.
    pub(crate) fn park(&self, upstream: &Upstream, stream: BackendStream, since: Instant) {
        let mut conns = lockstat::lock(&self.conns, Site::PrivateIdle);
        if conns.len() >= self.capacity.load(Ordering::Relaxed) {
            conns.remove(0);
        }
        if conns.capacity() == 0 {
            // Room for one: an HTTP/1 client connection keeps one backend connection at a
            // time (a first push would make room for four, 216 bytes more for each idle client).
            conns.reserve_exact(1);
        }
        conns.push(Parked {
            backend: upstream.id,
            stream,
            since,
            idle_timeout: upstream.idle_timeout,
        });
    }

    /// Closes the connections that sat idle too long or that the backend closed (or sent
    /// stray bytes on). The clock is read only when some connection is kept.
    pub fn reap(&self) {
        let mut conns = lockstat::lock(&self.conns, Site::PrivateIdle);
        if !conns.is_empty() {
            let now = Instant::now();
            conns.retain_mut(|p| p.usable(now));
        }
    }
}
