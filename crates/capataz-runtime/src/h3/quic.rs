//! The QUIC server configuration of an HTTP/3 listener, built from what its TCP side serves:
//! the same rustls configuration (certificate resolver, SNI, stapling, client certificates),
//! ALPN `h3` only, no 0-RTT, and the listener's limits; and the key its Retry tokens are
//! sealed with, one per endpoint for its whole life (a reload builds a new configuration with
//! the same key).

use std::sync::Arc;

use quinn::crypto::rustls::QuicServerConfig;
use quinn::{IdleTimeout, TransportConfig, VarInt};

use crate::config::{Http3Config, ListenerConfig};
use crate::instruments::QuicMetrics;

/// The ALPN protocol id of HTTP/3 (RFC 9114 section 3.1).
pub(super) const ALPN_H3: &[u8] = b"h3";

/// Unidirectional streams a client may open: HTTP/3's control stream and QPACK's two, and room
/// for the GREASE streams clients send (RFC 9114 section 6.2.3); push is never enabled.
const MAX_UNI_STREAMS: u32 = 8;

/// Answer bytes sent ahead of the client's acknowledgements, per stream the connection may
/// have (as HTTP/2's send buffer per stream).
const MAX_SEND_PER_STREAM: u64 = 64 * 1024;

/// Connections waiting to be accepted (their first packet in, not yet handed to the accept
/// loop) before the endpoint refuses new ones (quinn's default is 65,536).
const MAX_INCOMING: usize = 4096;

/// Why no QUIC configuration could be built.
#[derive(Debug, thiserror::Error)]
pub(crate) enum QuicConfigError {
    /// The listener has no loaded TLS or no `[listeners.tls.http3]`.
    #[error("the listener has no loaded TLS certificates or no [listeners.tls.http3]")]
    NotHttp3,
    /// rustls's configuration does not suit QUIC (no TLS 1.3 suite QUIC can start with).
    #[error("its TLS configuration cannot serve QUIC: {0}")]
    Tls(String),
    /// The system's random number generator failed (no Retry token key could be made).
    #[error("the system's random number generator failed")]
    Random,
}

/// The key an HTTP/3 endpoint seals its Retry tokens with (quinn's address validation
/// tokens: the client's address and the time, AEAD-sealed under a key derived from this one).
/// Made at random when the endpoint starts and kept for its life: every configuration a reload
/// builds for the endpoint carries it, so a client sent a Retry just before a reload is
/// validated by the token it echoes just after (quinn makes a new key with each configuration
/// unless given one). A new process (the SIGUSR2 upgrade) makes its own.
#[derive(Clone)]
pub(crate) struct TokenKey(Arc<dyn quinn::crypto::HandshakeTokenKey>);

impl TokenKey {
    /// A key from 64 random bytes, extracted with HKDF-SHA256 as quinn does for its own.
    pub(crate) fn random() -> Result<TokenKey, QuicConfigError> {
        use ring::rand::SecureRandom;
        let mut master = [0u8; 64];
        ring::rand::SystemRandom::new()
            .fill(&mut master)
            .map_err(|_| QuicConfigError::Random)?;
        let key = ring::hkdf::Salt::new(ring::hkdf::HKDF_SHA256, &[]).extract(&master);
        Ok(TokenKey(Arc::new(key)))
    }
}

impl std::fmt::Debug for TokenKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("TokenKey(..)")
    }
}

/// The QUIC server configuration for `listener` as configured now (a reload that changes its
/// certificates or limits applies to the connections that start after it), sealing Retry
/// tokens with its endpoint's `key`.
pub(crate) fn server_config(
    listener: &ListenerConfig,
    key: &TokenKey,
) -> Result<quinn::ServerConfig, QuicConfigError> {
    let tls = listener.tls.as_ref().ok_or(QuicConfigError::NotHttp3)?;
    let http3 = tls.http3.as_ref().ok_or(QuicConfigError::NotHttp3)?;
    let loaded = tls.loaded.as_ref().ok_or(QuicConfigError::NotHttp3)?;
    // The TCP side's configuration, shared resolver and ticketer included; only what QUIC
    // needs differently changes.
    let mut rustls = rustls::ServerConfig::clone(loaded.server_config());
    rustls.alpn_protocols = vec![ALPN_H3.to_vec()];
    // No 0-RTT: early data can be replayed by anyone who saw it.
    rustls.max_early_data_size = 0;
    let crypto = QuicServerConfig::try_from(Arc::new(rustls))
        .map_err(|e| QuicConfigError::Tls(e.to_string()))?;
    let mut config = quinn::ServerConfig::new(Arc::new(crypto), key.0.clone());
    config.transport_config(Arc::new(transport(listener, http3)));
    config.max_incoming(MAX_INCOMING);
    Ok(config)
}

/// The transport limits of each connection.
fn transport(listener: &ListenerConfig, http3: &Http3Config) -> TransportConfig {
    let mut transport = TransportConfig::default();
    // Request bodies buffered ahead of their forwarding, and answers ahead of the client's
    // acknowledgements, are bounded as on HTTP/2: the listener's HTTP/2 windows for the
    // former, 64 KiB per stream for the latter.
    let http2 = &listener.http2;
    let send_window = u64::from(http3.max_streams) * MAX_SEND_PER_STREAM;
    transport
        .stream_receive_window(VarInt::from_u32(http2.initial_stream_window_size))
        .receive_window(VarInt::from_u32(http2.initial_connection_window_size))
        .send_window(send_window)
        .max_concurrent_bidi_streams(VarInt::from_u32(http3.max_streams))
        .max_concurrent_uni_streams(VarInt::from_u32(MAX_UNI_STREAMS))
        // No datagrams: HTTP/3 datagrams (RFC 9297) are not served.
        .datagram_receive_buffer_size(None);
    // The listener's `idle_timeout`, as QUIC's: no packet for that long closes the connection
    // silently. Past QUIC's limit (2^62 ms) it is capped there.
    let idle = IdleTimeout::try_from(listener.idle_timeout)
        .unwrap_or_else(|_| IdleTimeout::from(VarInt::MAX));
    transport.max_idle_timeout(Some(idle));
    transport
}

/// A handshake under way, counted in its listener's `capataz_quic_handshakes_in_progress`
/// until it ends (its result counted) or is dropped (a shutdown during it: no result).
#[derive(Debug)]
pub(crate) struct Handshake(Option<QuicMetrics>);

/// How a handshake ended.
#[derive(Clone, Copy, Debug)]
pub(crate) enum Outcome {
    Ok,
    Failed,
    Timeout,
}

impl Handshake {
    /// Counts one more handshake in progress on the listener `metrics` belongs to.
    pub(crate) fn start(metrics: QuicMetrics) -> Handshake {
        metrics.in_progress.inc();
        Handshake(Some(metrics))
    }

    /// Ends the handshake with `outcome`, counted.
    pub(crate) fn end(mut self, outcome: Outcome) {
        if let Some(metrics) = self.0.take() {
            metrics.in_progress.dec();
            match outcome {
                Outcome::Ok => metrics.ok.inc(),
                Outcome::Failed => metrics.failed.inc(),
                Outcome::Timeout => metrics.timeout.inc(),
            };
        }
    }
}

impl Drop for Handshake {
    fn drop(&mut self) {
        if let Some(metrics) = self.0.take() {
            metrics.in_progress.dec();
        }
    }
}
