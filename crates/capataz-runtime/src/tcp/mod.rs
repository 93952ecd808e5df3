//! TCP (layer 4) mode: a `mode = "tcp"` listener relays each accepted connection, byte for
//! byte, to a backend of its one `protocol = "tcp"` pool (HAProxy `mode tcp`, nginx `stream`,
//! Envoy `tcp_proxy`).
//!
//! The health side is the HTTP path's: the backend is picked from the pool's `Snapshot` (the
//! engine's eligibility, weights, slow start, all-down policy) by the same algorithm
//! (`connect.rs`); connect failures, and a backend that breaks a session before sending a
//! byte, go to the pool's passive side; a session that ends cleanly is a success. A session
//! counts in its backend's in-flight count while it lasts (what `least_request` compares).
//! Established sessions outlive their backend's fall from eligibility (ejection, drain,
//! DOWN), as HAProxy's do, unless the pool has `close_tunnels_on_down`, whose signal closes
//! them when the verdict goes DOWN. `relay.rs` moves the bytes.
//!
//! Invariants: a client's failure is never charged to a backend; a session never holds more
//! than two buffers of `relay::BUFFER` bytes; every session ends (idle timeout).

mod accept;
mod connect;
mod relay;

use std::net::SocketAddr;
use std::sync::atomic::Ordering;
use std::sync::Arc;

use capataz_health::Outcome;
use tokio::io::{AsyncRead, AsyncWrite};

use crate::balance::PoolHandle;
use crate::config::ListenerConfig;
use crate::instruments::ListenerMetrics;
pub(crate) use accept::spawn;
use connect::connect;
pub(crate) use relay::{End, Relayed, Side};

/// What a tcp listener's connections read when accepted (a reload applies to the next one).
#[derive(Debug)]
pub(crate) struct TcpRelay {
    pool: Arc<PoolHandle>,
    limits: relay::Limits,
    metrics: Arc<ListenerMetrics>,
}

impl TcpRelay {
    /// The relay of `listener` (a tcp one) to its pool among `pools`, counting into
    /// `metrics`, the listener's.
    pub(crate) fn new(
        listener: &ListenerConfig,
        pools: &[Arc<PoolHandle>],
        metrics: Arc<ListenerMetrics>,
    ) -> Option<TcpRelay> {
        let tcp = listener.tcp?;
        Some(TcpRelay {
            pool: pools.get(tcp.pool)?.clone(),
            limits: relay::Limits {
                idle: listener.idle_timeout,
                session: tcp.session_timeout,
            },
            metrics,
        })
    }

    /// Serves one accepted connection from `peer` to `destination` (the address it reached)
    /// until its session ends.
    pub(crate) async fn serve<C>(
        self: Arc<Self>,
        mut client: C,
        peer: SocketAddr,
        destination: SocketAddr,
    ) where
        C: AsyncRead + AsyncWrite + Unpin,
    {
        let _open = self.metrics.connection();
        let pool = &self.pool;
        let connected = match connect(pool, (peer, destination)).await {
            Ok(connected) => connected,
            Err((why, _, _)) => {
                tracing::debug!(pool = %pool.name, %peer, ?why, "TCP session got no backend");
                return;
            }
        };
        let backend = &pool.backends[connected.index];
        let attempts = connected.attempts;
        let _in_flight = InFlight::new(pool, connected.index);
        let closing = backend
            .tunnels
            .as_ref()
            .filter(|_| pool.config.close_tunnels_on_down)
            .map(|tunnels| tunnels.subscribe());
        let mut stream = connected.stream;
        let relayed = relay::relay(&mut client, &mut stream, self.limits, closing).await;
        self.metrics
            .add_bytes(relayed.from_client, relayed.from_backend);
        if let Some(outcome) = judge(&relayed) {
            pool.observe(connected.index, outcome);
        }
        tracing::trace!(pool = %pool.name, backend = %backend.name, %peer, attempts, ?relayed, "TCP session ended");
    }
}

/// What a session tells the backend's passive side: a backend that broke the session before
/// sending a byte is an error (`Reset`), a session that ended with both sides closing is a
/// success (`Connected`); nothing for the rest (the client's failures, the timeouts, a close
/// capataz decided, a backend that broke the session after it had sent data).
pub(crate) fn judge(relayed: &Relayed) -> Option<Outcome> {
    match relayed.end {
        End::Broke {
            side: Side::Backend,
        } if relayed.from_backend == 0 => Some(Outcome::Reset),
        End::Closed { .. } => Some(Outcome::Connected),
        _ => None,
    }
}

/// A session counted in its backend's in-flight count while it lasts.
struct InFlight<'a> {
    pool: &'a PoolHandle,
    index: usize,
}

impl<'a> InFlight<'a> {
    fn new(pool: &'a PoolHandle, index: usize) -> InFlight<'a> {
        pool.backends[index]
            .in_flight
            .fetch_add(1, Ordering::Relaxed);
        InFlight { pool, index }
    }
}

impl Drop for InFlight<'_> {
    fn drop(&mut self) {
        self.pool.backends[self.index]
            .in_flight
            .fetch_sub(1, Ordering::Relaxed);
    }
}
