//! TCP (layer 4) mode: what a `mode = "tcp"` listener relays and for how long.

use std::time::Duration;

/// The TCP side of a listener with `mode = "tcp"` (HAProxy `mode tcp`, nginx `stream`, Envoy
/// `tcp_proxy`): every accepted connection is relayed, byte for byte, to a backend of one
/// pool. The listener's `idle_timeout` closes a session that moved no byte either way for that
/// long.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TcpListenerConfig {
    /// The index of the pool in [`Config::pools`](crate::Config::pools); its `protocol` is
    /// `"tcp"`. With `sni`, the pool of the sessions no route takes (no SNI, or none that
    /// matches); `None` only with `sni`: such sessions are closed.
    pub pool: Option<usize>,
    /// The longest a session may last, however busy (`session_timeout`; default `None`: no
    /// limit).
    pub session_timeout: Option<Duration>,
    /// TLS passthrough by SNI (`[[listeners.sni_routes]]`); `None`: every session goes to
    /// `pool`.
    pub sni: Option<crate::SniRouting>,
}
