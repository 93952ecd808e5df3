//! TCP mode's families: sessions and bytes per backend of a `tcp` pool. The client side's
//! connections and bytes are the listener's (`capataz_client_connections`, `_bytes`), counted
//! for tcp listeners as for HTTP ones.

use std::sync::Arc;

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::registry::Registry;

/// The labels of a byte counter: the backend, and which way the bytes went.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct BytesLabels {
    pool: Arc<str>,
    backend: Arc<str>,
    /// `to_backend` (read from the client) or `to_client` (read from the backend).
    direction: &'static str,
}

/// TCP mode's families.
#[derive(Clone, Debug)]
pub struct TcpFamilies {
    sessions: Family<super::BackendLabels, Counter>,
    bytes: Family<BytesLabels, Counter>,
}

impl TcpFamilies {
    /// Registers the families into `registry`.
    pub(super) fn register(registry: &mut Registry) -> TcpFamilies {
        let sessions = Family::default();
        registry.register(
            "capataz_tcp_sessions",
            "TCP sessions relayed to a backend (its connect succeeded), counted when they end",
            sessions.clone(),
        );
        let bytes = Family::default();
        registry.register(
            "capataz_tcp_bytes",
            "Bytes relayed by TCP sessions, by backend and direction (to_backend, to_client)",
            bytes.clone(),
        );
        TcpFamilies { sessions, bytes }
    }

    /// The handles of backend `backend` of pool `pool`, resolved once.
    pub fn backend(&self, pool: &Arc<str>, backend: &Arc<str>) -> TcpBackendMetrics {
        let bytes = |direction| {
            self.bytes.get_or_create_owned(&BytesLabels {
                pool: pool.clone(),
                backend: backend.clone(),
                direction,
            })
        };
        TcpBackendMetrics {
            sessions: self.sessions.get_or_create_owned(&super::BackendLabels {
                pool: pool.clone(),
                backend: backend.clone(),
            }),
            to_backend: bytes("to_backend"),
            to_client: bytes("to_client"),
        }
    }
}

/// One backend's TCP counters.
#[derive(Clone, Debug)]
pub struct TcpBackendMetrics {
    sessions: Counter,
    to_backend: Counter,
    to_client: Counter,
}

impl TcpBackendMetrics {
    /// Counts one session that ended, with the bytes it moved each way.
    pub fn session(&self, to_backend: u64, to_client: u64) {
        self.sessions.inc();
        self.to_backend.inc_by(to_backend);
        self.to_client.inc_by(to_client);
    }
}
