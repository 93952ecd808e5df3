//! The QUIC families of HTTP/3 listeners: handshakes by result, Retry packets sent (address
//! validation under load), handshakes in progress now, and the datagrams a process that took
//! over from an upgrading one passes on to it.

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;

use super::ListenerLabels;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct HandshakeLabels {
    listener: String,
    result: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ForwardedLabels {
    listener: String,
    result: &'static str,
}

/// `capataz_quic_handshakes_total`, `capataz_quic_retries_sent_total`,
/// `capataz_quic_handshakes_in_progress` and `capataz_quic_upgrade_datagrams_total`. Clones
/// share the families.
#[derive(Clone, Debug, Default)]
pub struct QuicFamilies {
    handshakes: Family<HandshakeLabels, Counter>,
    retries: Family<ListenerLabels, Counter>,
    in_progress: Family<ListenerLabels, Gauge>,
    forwarded: Family<ForwardedLabels, Counter>,
}

/// One HTTP/3 listener's QUIC series, every one present (at 0) from their resolution on.
#[derive(Clone, Debug)]
pub struct QuicMetrics {
    /// Handshakes completed.
    pub ok: Counter,
    /// Handshakes that failed (a TLS or QUIC error, the client closing or going silent).
    pub failed: Counter,
    /// Handshakes not done within the listener's `header_read_timeout`.
    pub timeout: Counter,
    /// Connections refused before any handshake: the listener was at its `max_connections`.
    pub refused: Counter,
    /// Retry packets sent instead of starting a handshake.
    pub retries: Counter,
    /// Handshakes under way now.
    pub in_progress: Gauge,
    /// Datagrams of the old process's connections passed on to it (after an upgrade).
    pub forwarded: Counter,
    /// Datagrams of the old process's connections dropped: its channel was full, or it had
    /// gone.
    pub forward_dropped: Counter,
}

impl QuicFamilies {
    pub(super) fn register(registry: &mut Registry) -> QuicFamilies {
        let families = QuicFamilies::default();
        registry.register(
            "capataz_quic_handshakes",
            "QUIC handshakes of HTTP/3 listeners, by result (ok, failed, timeout, refused)",
            families.handshakes.clone(),
        );
        registry.register(
            "capataz_quic_retries_sent",
            "QUIC Retry packets sent to validate a client's address before any handshake state",
            families.retries.clone(),
        );
        registry.register(
            "capataz_quic_handshakes_in_progress",
            "QUIC handshakes of HTTP/3 listeners under way now",
            families.in_progress.clone(),
        );
        registry.register(
            "capataz_quic_upgrade_datagrams",
            "QUIC datagrams of an upgrading process's connections that the new process read, by result (forwarded, dropped)",
            families.forwarded.clone(),
        );
        families
    }

    /// The series of listener `listener`, created at 0 if new.
    pub fn listener(&self, listener: &str) -> QuicMetrics {
        let result = |result| {
            self.handshakes.get_or_create_owned(&HandshakeLabels {
                listener: listener.to_owned(),
                result,
            })
        };
        let forwarded = |result| {
            self.forwarded.get_or_create_owned(&ForwardedLabels {
                listener: listener.to_owned(),
                result,
            })
        };
        let labels = ListenerLabels {
            listener: listener.into(),
        };
        QuicMetrics {
            ok: result("ok"),
            failed: result("failed"),
            timeout: result("timeout"),
            refused: result("refused"),
            retries: self.retries.get_or_create_owned(&labels),
            in_progress: self.in_progress.get_or_create_owned(&labels),
            forwarded: forwarded("forwarded"),
            forward_dropped: forwarded("dropped"),
        }
    }
}
