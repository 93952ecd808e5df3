//! What the proxy knows of a client connection.

use std::net::SocketAddr;
use std::sync::Arc;

use http::header::HeaderValue;

use crate::tls::TlsInfo;
use crate::upstream::{BackendSlots, PrivateIdle};

/// What the proxy knows of a client connection, computed once per connection, and the idle
/// backend connections private to it (closed when it closes). 136 bytes, at most 144 so that
/// its `Arc` is 160 (a smaller size class of the allocator than 192, for every connection's
/// whole life): hence [`ClientInfo::unix`] a method, and no [`BodyReadHook`] here.
#[derive(Debug)]
pub struct ClientInfo {
    /// The peer address.
    pub addr: SocketAddr,
    /// Its IP address as a header value (for `X-Forwarded-For`).
    pub(super) ip: HeaderValue,
    /// The idle backend connections only this client connection may use (see
    /// `upstream::PrivateIdle`).
    pub private: Arc<PrivateIdle>,
    /// What its TLS handshake settled, when the listener terminates TLS.
    pub tls: Option<Box<TlsInfo>>,
    /// The address the client connected to (from a PROXY protocol header when one named it),
    /// if known.
    pub destination: Option<SocketAddr>,
    /// The backend connections its requests may hold at once (limited for HTTP/2).
    pub backend_slots: BackendSlots,
}

/// Told when an HTTP/1 request's body has been read to its end: the client connection puts it
/// in the extensions of a request that has a body, and the proxy gives it to the body it sends
/// on. In the request rather than in [`ClientInfo`], which would keep it (a fat pointer) for
/// the connection's whole life.
#[derive(Clone)]
pub(crate) struct BodyReadHook(pub(crate) Arc<dyn crate::body::BodyRead>);

/// Held by the tunnel an HTTP/2 stream becomes (a WebSocket by extended CONNECT, RFC 8441)
/// for as long as it lives: the client connection puts it in the extensions of an extended
/// CONNECT, and the proxy gives it to the tunnel it opens. The connection counts the tunnel as
/// a stream in progress: not idle while it lives (the tunnel times its own idleness), and
/// drained as a stream is.
#[derive(Clone)]
pub(crate) struct TunnelHold {
    /// Never read: its drop is what counts.
    _held: Arc<dyn Send + Sync>,
}

impl TunnelHold {
    pub(crate) fn new(held: Arc<dyn Send + Sync>) -> TunnelHold {
        TunnelHold { _held: held }
    }
}

impl ClientInfo {
    /// The info for a client at `addr`.
    pub fn new(addr: SocketAddr) -> ClientInfo {
        // Copied to its length: `to_string`'s buffer has room to spare (16 bytes for an IPv4
        // address), and a value made from it would keep a 32-byte record of that on the heap
        // beside it for the connection's whole life (`Bytes::from` a `Vec` not full).
        let ip = HeaderValue::from_str(&addr.ip().to_string())
            // An IP address is always a valid header value.
            .unwrap_or_else(|_| HeaderValue::from_static("unknown"));
        ClientInfo {
            addr,
            ip,
            private: Arc::new(PrivateIdle::new()),
            tls: None,
            destination: None,
            backend_slots: BackendSlots::default(),
        }
    }

    /// Whether it is a Unix socket listener's client (`addr` is then
    /// [`UNIX_CLIENT`](crate::config::UNIX_CLIENT)): no forwarded address is added for it,
    /// and a PROXY header to a backend is `LOCAL`.
    pub fn unix(&self) -> bool {
        self.addr == crate::config::UNIX_CLIENT
    }

    /// The address the client connected to, for a PROXY protocol header to a backend: the
    /// unspecified address of the client's family, port 0, when not known.
    pub fn destination(&self) -> SocketAddr {
        self.destination.unwrap_or_else(|| match self.addr {
            SocketAddr::V4(_) => SocketAddr::from(([0, 0, 0, 0], 0)),
            SocketAddr::V6(_) => SocketAddr::from(([0u16; 8], 0)),
        })
    }

    /// The info for a client at `addr` whose connection is TLS, as `tls` says.
    pub fn with_tls(addr: SocketAddr, tls: TlsInfo) -> ClientInfo {
        ClientInfo {
            tls: Some(Box::new(tls)),
            ..ClientInfo::new(addr)
        }
    }
}
