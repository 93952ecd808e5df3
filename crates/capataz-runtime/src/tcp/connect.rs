//! A session's backend: picked from the pool's snapshot as an HTTP request's is (the same
//! algorithm, eligibility and all-down policy), connected within the pool's connect timeout,
//! and on a refused or timed-out connect another backend not yet tried, within the pool's
//! `retries` and retry budget, as the HTTP planner does for a request that was not sent.
//! Every failed connect is charged to its backend's passive side. In a pool with limits the
//! backend is the one whose slot the session got (`slot.rs`), waited for in the queue by the
//! first attempt; a refusal by the queue is charged to no backend.

use std::net::SocketAddr;
use std::sync::atomic::Ordering;
use std::time::Duration;

use super::slot::{self, Slot, Unslotted};
use crate::balance::placement::Home;
use crate::balance::ring::client_key;
use crate::balance::PoolHandle;
use crate::upstream::{AttemptError, BackendStream};

/// The most backends one session tries (first attempt plus retries), as for a request.
const MAX_TRIES: usize = 11;

/// Why a session got no backend connection.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum NoBackend {
    /// No backend is eligible (the pool rejects while all are down, or has none in rotation).
    Rejected,
    /// Every backend tried failed to connect; the last one's error.
    Failed(AttemptError),
    /// Every eligible backend was at its limit and the pool's queue was full.
    QueueFull,
    /// The session waited the pool's `queue_timeout` in its queue without a slot.
    QueueTimeout,
}

/// A connected backend.
pub(crate) struct Connected<'a> {
    /// The session's slot on it (its index in the pool), held while the session lasts.
    pub(crate) slot: Slot<'a>,
    /// The connection.
    pub(crate) stream: BackendStream,
    /// Backends tried, this one included.
    pub(crate) attempts: u32,
}

/// What a session's connecting came to: a connection, or why none (and the last backend
/// tried, and how many were).
pub(crate) type Connecting<'a> = Result<Connected<'a>, (NoBackend, Option<usize>, u32)>;

/// Picks and connects a backend of `pool` for the client `addresses` (source, destination:
/// what a PROXY protocol header names, when the pool sends one); the time the session waited
/// in the pool's queue goes to `queued`, and, in a hashing pool, how the backend connected
/// stands to the client's owner on the ring to `affinity` (the access log's `affinity=`:
/// `-` when none was connected).
pub(crate) async fn connect<'a>(
    pool: &'a PoolHandle,
    addresses: (SocketAddr, SocketAddr),
    queued: &mut Option<Duration>,
    affinity: &mut Option<&'static str>,
) -> Connecting<'a> {
    let mut tried = [0usize; MAX_TRIES];
    let mut count = 0;
    let mut retries_left = pool.config.retries.attempts;
    let mut last: Option<AttemptError> = None;
    // A hashing pool (`hash_key = "client_ip"`, the only key a session has) sends a client's
    // sessions where its address hashes on the ring, as an HTTP request's (HAProxy's
    // `balance source`); retries go on clockwise.
    let hashed = pool
        .config
        .affinity
        .hash
        .as_ref()
        .map(|hash| (client_key(addresses.0.ip()), hash.balance_factor));
    // The client's owner on the ring, once the first pick has read it, and why it was left.
    let mut home = Home::NO_KEY;
    if hashed.is_some() {
        *affinity = Some("-");
    }
    pool.budget.on_request();
    loop {
        let snapshot = pool.snapshot();
        let in_flight = |b: usize| pool.backends[b].in_flight.load(Ordering::Relaxed);
        let picked = match hashed {
            Some((key, factor)) => {
                let picked = snapshot.pick_by_key(key, &tried[..count], factor, in_flight);
                if count == 0 {
                    home = pool.key_home(&snapshot, key, picked);
                } else {
                    home.retried(&tried[..count]);
                }
                picked
            }
            None if pool.limits.is_some() => None,
            None => snapshot.pick(
                pool.config.algorithm,
                &pool.cursor,
                &tried[..count],
                in_flight,
            ),
        };
        drop(snapshot);
        let slot = match &pool.limits {
            None => slot::counted(pool, picked),
            Some(limits) => slot::admitted(pool, limits, picked, &tried[..count], queued).await,
        };
        let slot = match slot {
            Ok(slot) => slot,
            Err(unslotted) => {
                let why = match (unslotted, last) {
                    (Unslotted::QueueFull, _) => NoBackend::QueueFull,
                    (Unslotted::QueueTimeout, _) => NoBackend::QueueTimeout,
                    (Unslotted::NoBackend, Some(error)) => NoBackend::Failed(error),
                    (Unslotted::NoBackend, None) => {
                        pool.metrics.reject();
                        NoBackend::Rejected
                    }
                };
                let last_index = count.checked_sub(1).map(|at| tried[at]);
                return Err((why, last_index, count as u32));
            }
        };
        let index = slot.index();
        if let Some(picked) = picked.filter(|&p| p != index) {
            // The ring's pick had no free slot: the queue gave another.
            home.at_limit(picked);
        }
        tried[count] = index;
        count += 1;
        let backend = &pool.backends[index];
        // A Unix socket's client has no address to name: a LOCAL header.
        let named = (addresses.0 != crate::config::UNIX_CLIENT).then_some(addresses);
        match backend.upstream.connect(named).await {
            Ok(conn) => {
                if hashed.is_some() {
                    *affinity = Some(home.placement(index).as_str());
                }
                return Ok(Connected {
                    slot,
                    stream: conn.stream,
                    attempts: count as u32,
                });
            }
            Err(error) => {
                // Given back before a retry looks for another.
                drop(slot);
                pool.charge(index, error);
                last = Some(error);
            }
        }
        let untried = pool
            .snapshot()
            .eligible
            .iter()
            .any(|b| !tried[..count].contains(b));
        if !(retries_left > 0 && count < MAX_TRIES && untried && pool.budget.try_spend()) {
            return Err((NoBackend::Failed(error_of(last)), Some(index), count as u32));
        }
        pool.metrics.retry();
        retries_left -= 1;
    }
}

/// The error noted last (always set once a connect failed).
fn error_of(last: Option<AttemptError>) -> AttemptError {
    last.unwrap_or(AttemptError::ConnectRefused)
}
