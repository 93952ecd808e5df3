//! A listener's `max_connections`: the count it bounds, and the accept loops' wait for room.
//!
//! The count is the listener's `capataz_client_connections_open` gauge itself: a connection is
//! [`Held`] from its accept (a TLS or QUIC handshake, a PROXY header and an SNI inspection
//! included) to its close (an upgraded connection's tunnel included), and a connection is held only if the gauge was below the limit in
//! force (one atomic step), so what the metrics show is what decides. A TCP or Unix socket
//! loop that takes a connection at the limit keeps it unserved and accepts nothing more
//! until a held connection closes (or a reload raises or removes the limit): the next
//! connections wait in the kernel's accept backlog, as HAProxy's do at a frontend's `maxconn`.
//! A QUIC loop refuses the connections that come meanwhile instead (its packets are queued
//! by no kernel backlog but by the endpoint).

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use arc_swap::ArcSwap;
use tokio::sync::{watch, Notify};

use super::listener::{shutting_down, ListenerState};
use crate::instruments::OpenConnection;
use crate::workers::Placed;

/// One client connection a listener holds: counted in the balancer's open connections and in
/// its listener's open gauge until dropped, then waking the listener's accept loops (a
/// reload may give a limit to a listener that had none: its loop waits for the connections
/// taken before too).
pub(super) struct Held {
    // Dropped in this order: the counts first, then the wake-up, so a woken loop sees them.
    _open: OpenConnection,
    _counted: Counted,
    /// The worker serving it, where it counts as open (`Workers::place`); none with one
    /// worker, or for an HTTP/3 connection.
    _placed: Option<Placed>,
    _freed: Freed,
}

impl Held {
    /// Counts a connection `state`'s listener takes, if it has room for it (below its
    /// `max_connections`, or without one); `connections` is the balancer's count of open
    /// client connections.
    pub(super) fn new(state: &ListenerState, connections: &Arc<AtomicUsize>) -> Option<Held> {
        let max = state.config.max_connections;
        let open = state.proxy.metrics().open(max)?;
        connections.fetch_add(1, Ordering::Relaxed);
        Some(Held {
            _open: open,
            _counted: Counted(connections.clone()),
            _placed: None,
            _freed: Freed(state.room.clone()),
        })
    }

    /// Counts it open on the worker `placed` names too, for as long as it is held.
    pub(super) fn on_worker(mut self, placed: Placed) -> Held {
        self._placed = Some(placed);
        self
    }
}

/// Counted in the balancer's open client connections until dropped.
struct Counted(Arc<AtomicUsize>);

impl Drop for Counted {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::Relaxed);
    }
}

/// Wakes a listener's accept loops waiting for room when dropped (none but at a limit).
struct Freed(Arc<Notify>);

impl Drop for Freed {
    fn drop(&mut self) {
        self.0.notify_waiters();
    }
}

/// Holds the connection the listener of `state` just took: at once if it has room; else
/// counts the listener full and holds it, unserved, once it has room (the next connections
/// wait in the kernel's backlog meanwhile). `None` if the listener stops (`stop`) or shutdown
/// begins (`down`) first: the connection is then closed unserved.
pub(super) async fn admit(
    state: &ArcSwap<ListenerState>,
    connections: &Arc<AtomicUsize>,
    (stop, down): (&mut watch::Receiver<bool>, &mut watch::Receiver<bool>),
) -> Option<Held> {
    if let Some(held) = Held::new(&state.load(), connections) {
        return Some(held);
    }
    count_full(&state.load());
    tokio::select! {
        biased;
        _ = stop.changed() => None,
        _ = shutting_down(down) => None,
        held = room(state, connections) => Some(held),
    }
}

/// Counts that the listener of `state` was full when it took a connection.
fn count_full(state: &ListenerState) {
    if let Some(reached) = &state.limit_reached {
        reached.inc();
    }
    tracing::debug!(listener = %state.config.name, "at max_connections: a connection waits");
}

/// Holds a connection the listener of `state` took while full once it has room: when a held
/// connection closes, or a reload stores a state whose limit leaves room.
async fn room(state: &ArcSwap<ListenerState>, connections: &Arc<AtomicUsize>) -> Held {
    loop {
        let now = state.load_full();
        let room = now.room.clone();
        // Registered before the count is read: a connection closing in between still wakes it.
        let freed = room.notified();
        tokio::pin!(freed);
        freed.as_mut().enable();
        if let Some(held) = Held::new(&now, connections) {
            return held;
        }
        drop(now);
        freed.await;
    }
}
