//! TCP (layer 4) mode: a `mode = "tcp"` listener relays each accepted connection, byte for
//! byte, to a backend of its one `protocol = "tcp"` pool (HAProxy `mode tcp`, nginx `stream`,
//! Envoy `tcp_proxy`).
//!
//! The health side is the HTTP path's: the backend is picked from the pool's `Snapshot` (the
//! engine's eligibility, weights, slow start, all-down policy) by the same algorithm
//! (`connect.rs`); connect failures, and a backend that breaks a session before sending a
//! byte, go to the pool's passive side; a session that ends cleanly is a success. A session
//! holds a slot on its backend while it lasts (`slot.rs`: its count in `in_flight`, what
//! `least_request` compares); in a pool with `max_connections` the slot is taken below the
//! backend's limit or waited for in the pool's queue, and a session the queue refuses (full,
//! or its timeout) is closed, charged to no backend.
//! Established sessions outlive their backend's fall from eligibility (ejection, drain,
//! DOWN), as HAProxy's do, unless the pool has `close_tunnels_on_down`, whose signal closes
//! them when the verdict goes DOWN. `relay.rs` moves the bytes.
//! A listener with `sni_routes` passes TLS through to a pool chosen by the ClientHello's
//! server name (`sni.rs`), read before any backend is picked.
//!
//! Invariants: a client's failure is never charged to a backend; a session never holds more
//! than two buffers of `relay::BUFFER` bytes; every session ends (idle timeout).

mod accept;
mod connect;
mod relay;
mod slot;
mod sni;

use std::net::SocketAddr;
use std::sync::Arc;

use capataz_health::Outcome;
use tokio::io::{AsyncRead, AsyncWrite};

use crate::access_log::{AccessLog, AccessRecord, EndedBy, Phase, Termination};
use crate::balance::PoolHandle;
use crate::config::ListenerConfig;
use crate::instruments::{Families, ListenerMetrics, TcpBackendMetrics};
use crate::tls::TlsInfo;
pub(crate) use accept::spawn;
use connect::{connect, NoBackend};
pub(crate) use relay::{End, Relayed, Side};

/// What a tcp listener's connections read when accepted (a reload applies to the next one).
#[derive(Debug)]
pub(crate) struct TcpRelay {
    /// The listener's `pool`: every session's, or with `sni` those no route takes (`None`
    /// only with `sni`: those are closed).
    default: Option<Target>,
    /// TLS passthrough by SNI (`[[listeners.sni_routes]]`).
    sni: Option<Box<sni::SniRoutes>>,
    limits: relay::Limits,
    metrics: Arc<ListenerMetrics>,
    /// The listener's access log: one line per session.
    access_log: Option<Arc<AccessLog>>,
}

/// A pool sessions are relayed to, and the counters of its backends, by index.
#[derive(Debug)]
pub(crate) struct Target {
    pool: Arc<PoolHandle>,
    backends: Vec<TcpBackendMetrics>,
}

impl Target {
    /// The pool at `index` among `pools`, counting into `families`.
    fn new(pools: &[Arc<PoolHandle>], index: usize, families: &Families) -> Option<Target> {
        let pool = pools.get(index)?;
        Some(Target {
            backends: pool
                .backends
                .iter()
                .map(|backend| families.tcp().backend(&pool.name, &backend.name))
                .collect(),
            pool: pool.clone(),
        })
    }
}

impl TcpRelay {
    /// The relay of `listener` (a tcp one) to its pools among `pools`, counting into
    /// `metrics`, the listener's, and `families` (its backends' sessions and bytes), and
    /// logging each session to `access_log`.
    pub(crate) fn new(
        listener: &ListenerConfig,
        pools: &[Arc<PoolHandle>],
        (metrics, families): (Arc<ListenerMetrics>, &Families),
        access_log: Option<Arc<AccessLog>>,
    ) -> Option<TcpRelay> {
        let tcp = listener.tcp.as_ref()?;
        let default = match tcp.pool {
            Some(index) => Some(Target::new(pools, index, families)?),
            None => None,
        };
        let sni = match &tcp.sni {
            Some(routing) => Some(Box::new(sni::SniRoutes::new(routing, pools, families)?)),
            None => None,
        };
        if default.is_none() && sni.is_none() {
            return None;
        }
        Some(TcpRelay {
            default,
            sni,
            limits: relay::Limits {
                idle: listener.idle_timeout,
                session: tcp.session_timeout,
            },
            metrics,
            access_log,
        })
    }

    /// Serves one accepted connection from `peer` to `destination` (the address it reached)
    /// until its session ends, then logs it.
    pub(crate) async fn serve<C>(
        self: Arc<Self>,
        client: C,
        peer: SocketAddr,
        destination: SocketAddr,
        tls: Option<TlsInfo>,
    ) where
        C: AsyncRead + AsyncWrite + Unpin,
    {
        self.metrics.count_accepted();
        let mut record = self.access_log.as_ref().map(|_| {
            let pool = match &self.default {
                Some(target) => target.pool.name.clone(),
                // A listener with routes only: set once its session is routed.
                None => "-".into(),
            };
            Box::new(AccessRecord::session(peer, pool))
        });
        if let (Some(record), Some(tls)) = (&mut record, &tls) {
            record.set_tls(tls.version, tls.sni.as_deref());
        }
        match (&self.sni, &self.default) {
            (Some(routes), _) => {
                let serve = sni::serve(&self, routes, client, (peer, destination), record);
                Box::pin(serve).await;
            }
            (None, Some(target)) => {
                self.relay_to(target, client, (peer, destination), record)
                    .await;
            }
            // `new` makes no relay with neither.
            (None, None) => {}
        }
    }

    /// Relays `client` to a backend of `target`'s pool until the session ends, then logs it
    /// in `record` (started when the client connected, its pool already `target`'s). False
    /// when no backend was connected: nothing was read from `client` then.
    async fn relay_to<C>(
        &self,
        target: &Target,
        mut client: C,
        (peer, destination): (SocketAddr, SocketAddr),
        mut record: Option<Box<AccessRecord>>,
    ) -> bool
    where
        C: AsyncRead + AsyncWrite + Unpin,
    {
        let pool = &target.pool;
        let (mut queued, mut affinity) = (None, None);
        let connected = connect(pool, (peer, destination), &mut queued, &mut affinity).await;
        if let Some(record) = &mut record {
            record.queued = queued;
            record.affinity = affinity;
        }
        let connected = match connected {
            Ok(connected) => connected,
            Err((why, last, attempts)) => {
                tracing::debug!(pool = %pool.name, %peer, ?why, "TCP session got no backend");
                if let Some(record) = &mut record {
                    record.backend = last.map(|index| pool.backends[index].name.clone());
                    record.attempts = attempts;
                    record.termination = match why {
                        NoBackend::Rejected => REJECTED,
                        NoBackend::QueueFull | NoBackend::QueueTimeout => QUEUE_REFUSED,
                        NoBackend::Failed(error) => Termination::of(error),
                    };
                }
                self.log(record);
                return false;
            }
        };
        // The session's slot (its count in `in_flight`) is held until it ends.
        let (index, slot) = (connected.slot.index(), connected.slot);
        let backend = &pool.backends[index];
        let closing = backend
            .tunnels
            .as_ref()
            .filter(|_| pool.config.close_tunnels_on_down)
            .map(|tunnels| tunnels.subscribe());
        let mut stream = connected.stream;
        let relayed = relay::relay(&mut client, &mut stream, self.limits, closing).await;
        // Both connections are closed before the line is written.
        drop((client, stream, slot));
        self.metrics
            .add_bytes(relayed.from_client, relayed.from_backend);
        target.backends[index].session(relayed.from_client, relayed.from_backend);
        if let Some(outcome) = judge(&relayed) {
            pool.observe(index, outcome);
        }
        if let Some(record) = &mut record {
            record.backend = Some(backend.name.clone());
            record.attempts = connected.attempts;
            record.bytes = relayed.from_backend;
            record.bytes_in = Some(relayed.from_client);
            record.termination = termination(relayed.end);
        }
        self.log(record);
        true
    }

    /// Writes a session's line, its duration taken now.
    fn log(&self, record: Option<Box<AccessRecord>>) {
        if let (Some(log), Some(mut record)) = (&self.access_log, record) {
            record.duration = record.started.elapsed();
            log.emit(record);
        }
    }
}

/// No backend was eligible: capataz closed the connection.
const REJECTED: Termination = Termination {
    ended_by: EndedBy::Capataz,
    phase: Phase::Connect,
};

/// Every eligible backend was at its limit and the queue full, or the session waited the
/// queue's timeout: capataz closed the connection.
const QUEUE_REFUSED: Termination = Termination {
    ended_by: EndedBy::Capataz,
    phase: Phase::Queue,
};

/// Who ended a relayed session, and where (the access log's `ended_by` and `phase`): the side
/// that closed first of a clean close (phase `-`), the side whose connection failed, the
/// timeout, or capataz closing a DOWN backend's sessions.
pub(crate) fn termination(end: End) -> Termination {
    let (ended_by, phase) = match end {
        End::Closed { first } => (side(first), Phase::Done),
        End::Broke { side: broke } => (side(broke), Phase::Session),
        End::Idle => (EndedBy::Timeout, Phase::Idle),
        End::SessionLimit => (EndedBy::Timeout, Phase::Session),
        End::BackendDown => (EndedBy::Capataz, Phase::Session),
    };
    Termination { ended_by, phase }
}

/// The access log's name for a side.
fn side(side: Side) -> EndedBy {
    match side {
        Side::Client => EndedBy::Client,
        Side::Backend => EndedBy::Backend,
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

#[cfg(test)]
mod tests {
    use super::*;

    fn relayed(end: End, from_backend: u64) -> Relayed {
        Relayed {
            end,
            from_client: 10,
            from_backend,
        }
    }

    #[test]
    fn only_the_backends_own_failures_before_its_first_byte_are_charged() {
        let broke = |side| End::Broke { side };
        assert_eq!(
            judge(&relayed(broke(Side::Backend), 0)),
            Some(Outcome::Reset)
        );
        assert_eq!(judge(&relayed(broke(Side::Backend), 1)), None, "after data");
        assert_eq!(
            judge(&relayed(broke(Side::Client), 0)),
            None,
            "the client's"
        );
        let closed = End::Closed {
            first: Side::Backend,
        };
        assert_eq!(judge(&relayed(closed, 0)), Some(Outcome::Connected));
        for end in [End::Idle, End::SessionLimit, End::BackendDown] {
            assert_eq!(judge(&relayed(end, 0)), None, "{end:?}");
        }
    }

    #[test]
    fn each_end_is_logged_as_documented() {
        let at = |end| {
            let t = termination(end);
            (t.ended_by.as_str(), t.phase.as_str())
        };
        let first = Side::Backend;
        assert_eq!(at(End::Closed { first }), ("backend", "-"));
        let side = Side::Client;
        assert_eq!(at(End::Broke { side }), ("client", "session"));
        assert_eq!(at(End::Idle), ("timeout", "idle"));
        assert_eq!(at(End::SessionLimit), ("timeout", "session"));
        assert_eq!(at(End::BackendDown), ("capataz", "session"));
        assert_eq!(
            (REJECTED.ended_by.as_str(), REJECTED.phase.as_str()),
            ("capataz", "connect")
        );
        assert_eq!(
            (
                QUEUE_REFUSED.ended_by.as_str(),
                QUEUE_REFUSED.phase.as_str()
            ),
            ("capataz", "queue")
        );
    }
}
