//! Keep-alive connections to one backend, and one HTTP/1.1 exchange on one of them.
//!
//! The connections are TCP or TLS streams ([`BackendStream`]; the HTTP/1.1 client runs over
//! any [`Transport`]): capataz speaks HTTP/1.1 to backends itself (see
//! `h1`), so an idle connection holds no buffer, no task and no channel, only its socket (and,
//! over TLS, its session). A TLS handshake is part of connecting: it runs within the connect
//! deadline, and its failure ([`AttemptError::TlsHandshake`]) sent nothing of the request.
//! Where an idle connection waits depends on the pool's reuse policy: by default in the set of
//! the client connection whose request it carried ([`PrivateIdle`]), never given to another
//! client; with `connection_reuse = "shared"` in a stack per backend that every client draws
//! from. Either way it is reused most-recent first, and one the backend closed meanwhile (or
//! sent stray bytes on) is noticed before use and dropped.
//!
//! A connection is handed back only once the response it carried has been read to its end
//! (see `body::Lease`), so an idle connection is always ready for the next request.
//!
//! A pool with `send_proxy_protocol` writes a PROXY protocol header naming the client first on
//! each new connection (before TLS), within the connect deadline; such a pool reuses
//! connections privately only (the config refuses shared reuse and HTTP/2 with it), so a
//! connection only ever carries the client it names.

use std::net::SocketAddr;
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

mod error;
mod exchange;
mod h2;
mod private;
mod response;
mod slots;
pub mod transport;
mod unix;

pub use error::{AttemptError, AttemptPhase, Fault};
pub use exchange::{exchange, ExchangeError, ExchangeTimeouts, Outgoing};
pub use h2::{classify as classify_h2, exchange_h2, H2Failure, Phase};
pub use h2::{H2Body, H2Conns};
pub use private::PrivateIdle;
pub(crate) use response::ResponseStream;
pub use slots::{BackendSlots, Slot};
pub use transport::{BackendStream, Transport};

use tokio::io::AsyncWriteExt;
use tokio::net::TcpStream;
use tokio_rustls::client::TlsStream;

use crate::lockstat::{self, Site};
use capataz_proxy_protocol::Version as ProxyVersion;
use capataz_tls::backend::Connector;

/// The client a request comes from, as a PROXY protocol header to a backend names it: its
/// address and the address it connected to; `None` for no client (a `LOCAL` header).
pub(crate) type ClientAddrs = Option<(SocketAddr, SocketAddr)>;

/// The most idle connections kept per backend.
const MAX_IDLE: usize = 512;
/// The largest response head accepted from a backend.
const MAX_HEAD: usize = 65536;
/// How much is read from a backend at a time.
pub(crate) const READ_SIZE: usize = 8192;
/// How much is read for the start of an answer.
const FIRST_READ: usize = 2048;

/// A connection ready to carry one request.
pub struct Conn {
    /// The connection (TCP or TLS).
    pub stream: BackendStream,
    /// Whether it came from the idle set (it may have been closed by the backend meanwhile).
    pub reused: bool,
}

/// The keep-alive connections to one backend.
#[derive(Debug)]
pub struct Upstream {
    /// Unique in the process, never reused: what a client connection's idle set knows this
    /// backend by.
    id: u64,
    addr: SocketAddr,
    connect_timeout: Duration,
    idle_timeout: Duration,
    idle: Mutex<Vec<(BackendStream, Instant)>>,
    /// The TLS handshake run on each new connection, when the pool speaks TLS.
    tls: Option<Connector>,
    /// The multiplexed connection, when the pool speaks HTTP/2 (the idle set is then unused).
    h2: Option<H2Conns>,
    /// The PROXY protocol header version written first on each new connection, if the pool
    /// sends one (HTTP/1.1 pools with private reuse only: see `send_proxy_protocol`).
    send_proxy: Option<ProxyVersion>,
    /// The socket path of a Unix socket backend (`unix.rs`); `addr` is then unused.
    unix: Option<Arc<Path>>,
}

/// The next `Upstream::id`.
static NEXT_ID: AtomicU64 = AtomicU64::new(0);

impl Upstream {
    /// An empty connection set for `addr`.
    pub fn new(addr: SocketAddr, connect_timeout: Duration, idle_timeout: Duration) -> Upstream {
        Upstream {
            id: NEXT_ID.fetch_add(1, Ordering::Relaxed),
            addr,
            connect_timeout,
            idle_timeout,
            idle: Mutex::new(Vec::new()),
            tls: None,
            h2: None,
            send_proxy: None,
            unix: None,
        }
    }

    /// The same, writing a PROXY protocol header of `version` first on each new connection.
    pub fn with_proxy_protocol(mut self, version: Option<ProxyVersion>) -> Upstream {
        self.send_proxy = version;
        self
    }

    /// The PROXY protocol version sent on new connections, if any.
    pub fn proxy_protocol(&self) -> Option<ProxyVersion> {
        self.send_proxy
    }

    /// The same, speaking HTTP/2 (over TLS if set up with [`Upstream::with_tls`], else h2c).
    pub fn with_h2(mut self) -> Upstream {
        self.h2 = Some(H2Conns::default());
        self
    }

    /// The HTTP/2 connection, when the pool speaks HTTP/2.
    pub fn h2(&self) -> Option<&H2Conns> {
        self.h2.as_ref()
    }

    /// The same, with a TLS handshake by `connector` on each new connection.
    pub fn with_tls(mut self, connector: Connector) -> Upstream {
        self.tls = Some(connector);
        self
    }

    /// The TLS handshake of new connections, if the pool speaks TLS.
    pub fn tls(&self) -> Option<&Connector> {
        self.tls.as_ref()
    }

    /// The connect deadline (TCP and TLS handshakes together).
    pub fn connect_timeout(&self) -> Duration {
        self.connect_timeout
    }

    /// The backend's TCP address (`0.0.0.0:0` for a Unix socket backend: see
    /// [`Upstream::unix_path`]).
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// An idle connection if one is still open, else a fresh one (a failed connect sent
    /// nothing): from `private` when given (the client connection's own set), else from the
    /// backend's shared set. `now` is the caller's reading of the clock, to judge idle time
    /// without another. `client` (source, destination) is what a PROXY protocol header on a
    /// fresh connection names, when the pool sends one.
    pub async fn acquire(
        &self,
        now: Instant,
        private: Option<&PrivateIdle>,
        client: ClientAddrs,
    ) -> Result<Conn, AttemptError> {
        let idle = match private {
            Some(private) => private.take(self, now),
            None => self.pop_idle(now),
        };
        if let Some(stream) = idle {
            return Ok(Conn {
                stream,
                reused: true,
            });
        }
        self.connect(client).await
    }

    /// A fresh connection, never a pooled one; it starts with a PROXY protocol header naming
    /// `client` when the pool sends one.
    pub async fn connect(&self, client: ClientAddrs) -> Result<Conn, AttemptError> {
        if let Some(path) = &self.unix {
            return self.connect_unix(path, client).await;
        }
        let started = tokio::time::Instant::now();
        let mut tcp = self.connect_tcp().await?;
        if let Some(version) = self.send_proxy {
            let header = proxy_header(version, client);
            let deadline = started + self.connect_timeout;
            // Part of connecting: within the connect deadline, and nothing of the request is
            // sent if it fails.
            match tokio::time::timeout_at(deadline, tcp.write_all(&header)).await {
                Err(_) => return Err(AttemptError::ConnectTimeout),
                Ok(Err(e)) => return Err(AttemptError::of_connect(&e)),
                Ok(Ok(())) => {}
            }
        }
        let stream = match &self.tls {
            None => BackendStream::Tcp(tcp),
            Some(tls) => BackendStream::Tls(Box::new(self.handshake(tls, tcp, started).await?)),
        };
        Ok(Conn {
            stream,
            reused: false,
        })
    }

    /// A TCP connection within the connect deadline.
    pub(crate) async fn connect_tcp(&self) -> Result<TcpStream, AttemptError> {
        let stream =
            match tokio::time::timeout(self.connect_timeout, TcpStream::connect(self.addr)).await {
                Err(_) => return Err(AttemptError::ConnectTimeout),
                Ok(Err(e)) => return Err(AttemptError::of_connect(&e)),
                Ok(Ok(stream)) => stream,
            };
        let _ = stream.set_nodelay(true);
        Ok(stream)
    }

    /// A TLS session by `tls`: the TCP connect and the handshake within one connect deadline.
    pub(crate) async fn connect_tls(
        &self,
        tls: &Connector,
    ) -> Result<TlsStream<TcpStream>, AttemptError> {
        let started = tokio::time::Instant::now();
        let tcp = self.connect_tcp().await?;
        self.handshake(tls, tcp, started).await
    }

    /// The TLS handshake on `tcp`, within the connect deadline counted from `started`.
    async fn handshake(
        &self,
        tls: &Connector,
        tcp: TcpStream,
        started: tokio::time::Instant,
    ) -> Result<TlsStream<TcpStream>, AttemptError> {
        let deadline = started + self.connect_timeout;
        match tokio::time::timeout_at(deadline, tls.connect(tcp)).await {
            Err(_) => Err(AttemptError::ConnectTimeout),
            Ok(Ok(stream)) => Ok(stream),
            Ok(Err(error)) => {
                tracing::debug!(backend = %self.addr, %error, "TLS handshake failed");
                Err(AttemptError::TlsHandshake)
            }
        }
    }

    fn pop_idle(&self, now: Instant) -> Option<BackendStream> {
        let mut idle = lockstat::lock(&self.idle, Site::SharedIdle);
        while let Some((mut stream, since)) = idle.pop() {
            if usable(&mut stream, since, self.idle_timeout, now) {
                return Some(stream);
            }
        }
        None
    }

    /// Hands back a connection whose response was read to its end, to `private` when given,
    /// else to the shared set; its idle time counts from `since` (when its response arrived:
    /// close enough, and no clock read).
    pub(crate) fn release(
        &self,
        stream: BackendStream,
        since: Instant,
        private: Option<&PrivateIdle>,
    ) {
        if let Some(private) = private {
            private.park(self, stream, since);
            return;
        }
        let mut idle = lockstat::lock(&self.idle, Site::SharedIdle);
        if idle.len() < MAX_IDLE {
            idle.push((stream, since));
        }
    }

    /// Drops idle connections that were closed or sat idle longer than the idle timeout.
    pub fn reap(&self) {
        let now = Instant::now();
        let mut idle = lockstat::lock(&self.idle, Site::SharedIdle);
        idle.retain_mut(|(stream, since)| usable(stream, *since, self.idle_timeout, now));
    }
}

/// The PROXY protocol header naming `client`, or `LOCAL` for none.
fn proxy_header(version: ProxyVersion, client: ClientAddrs) -> Vec<u8> {
    match client {
        Some((source, destination)) => version.encode(source, destination),
        None => capataz_proxy_protocol::encode_local(version),
    }
}

/// Whether an idle connection, idle since `since`, may still carry a request at `now`: idle
/// less than `idle_timeout`, and neither closed by the backend nor holding stray bytes.
fn usable(
    stream: &mut BackendStream,
    since: Instant,
    idle_timeout: Duration,
    now: Instant,
) -> bool {
    now.saturating_duration_since(since) < idle_timeout && stream.still_open()
}

#[cfg(test)]
mod tests;
#[cfg(test)]
mod tls_tests;
