//! HTTP/3 on a TLS listener: one QUIC connection served by hyperium's `h3`, each request
//! handed to the same [`Proxy::handle`] as HTTP/1.1 and HTTP/2 requests (routing, pools,
//! health, retries, access log with protocol `HTTP/3.0`, metrics).
//!
//! The endpoint and its accept loop (the UDP socket, Retry under load, the configuration in
//! force) are the supervisor's (`supervisor/http3.rs`); this module serves what it accepted.
//! - A connection is counted open (`capataz_client_connections_open`, by the accept loop's
//!   guard) from its first packet taken to its end, accepted once its handshake is done, its bytes (QUIC's UDP payloads) added to the listener's byte counters at its end.
//! - Each request runs on its own task (`request.rs`), its head read within the listener's
//!   `header_read_timeout` (and, for a request that may have no body, the stream's end or its
//!   body's first bytes within it too); a client that resets its stream, or whose connection closes,
//!   before its answer is a client going away: the proxy's future is dropped, as hyper drops
//!   an HTTP/2 stream's, so nothing is charged to a backend and the access log blames the
//!   client.
//! - Idle: no request for the listener's `idle_timeout` ends the connection with a GOAWAY
//!   (QUIC's own idle timeout, the same value, ends one that stopped sending packets).
//! - Shutdown (a stop): a GOAWAY at once, the requests in progress finish (within the
//!   shutdown's deadline, which closes what is left), then the connection closes. The old
//!   process of an upgrade drains the same way, on the datagrams the new process passes on to
//!   it (`cid.rs`: connection IDs that name their process; `handoff.rs`: the socket that
//!   passes them on, and reads them; `supervisor/http3.rs`).

mod body;
mod capped;
pub(crate) mod cid;
pub(crate) mod handoff;
mod malformed;
pub(crate) mod quic;
mod request;

use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use tokio::sync::{watch, Notify};
use tokio::time::{Instant, MissedTickBehavior};

use crate::downstream::boxed_in_place;
use crate::proxy::{ClientInfo, Proxy};
use crate::tls::TlsInfo;

/// The limits one connection is served with, read from its listener when it was accepted.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Limits {
    /// No request for this long closes the connection.
    pub(crate) idle_timeout: Duration,
    /// The longest wait for a request's head once its stream opened.
    pub(crate) header_read_timeout: Duration,
    /// The largest request head (QPACK-decoded field section) accepted.
    pub(crate) max_header_bytes: u64,
    /// Requests in progress at once (`max_streams`).
    pub(crate) max_streams: u32,
    /// Backend connections (HTTP/1.1 pools) the connection's requests may hold at once (the
    /// listener's `http2.max_backend_connections`).
    pub(crate) max_backend_connections: u32,
}

/// The most idle backend connections one HTTP/3 connection keeps for itself (as many as its
/// requests may use at once, up to this), as an HTTP/2 connection does.
const MAX_PRIVATE: usize = 128;

/// How long a connection whose requests are all done waits for its last bytes to be
/// acknowledged, or its client to close, before closing it (as an HTTP/2 connection's GOAWAY
/// grace).
const CLOSE_GRACE: Duration = Duration::from_secs(1);

/// HTTP/3's code for a connection closed without error (RFC 9114 section 8.1).
pub(crate) const H3_NO_ERROR: quinn::VarInt = quinn::VarInt::from_u32(0x100);

/// How often a connection closes its idle backend connections that timed out.
const REAP_PERIOD: Duration = Duration::from_secs(1);

/// Requests in progress on one connection, and a wake-up when one ends.
#[derive(Default)]
struct Active {
    count: AtomicUsize,
    ended: Notify,
}

/// Held by a request's task: counted in progress until dropped.
struct InFlight(Arc<Active>);

impl InFlight {
    fn new(active: &Arc<Active>) -> InFlight {
        active.count.fetch_add(1, Ordering::Relaxed);
        InFlight(active.clone())
    }
}

impl Drop for InFlight {
    fn drop(&mut self) {
        self.0.count.fetch_sub(1, Ordering::Relaxed);
        self.0.ended.notify_one();
    }
}

/// Serves one QUIC connection whose handshake is under way (`connecting`) until it ends,
/// an idle timeout or shutdown closes it. `handshake` ends (counted by its result) once the
/// handshake is over, `guard` is dropped at the end (it counts the connection open).
pub(crate) async fn serve(
    connecting: quinn::Connecting,
    limits: Limits,
    proxy: impl Fn() -> Arc<Proxy> + Send + Sync + 'static,
    (mut shutdown, handshake): (watch::Receiver<bool>, quic::Handshake),
    guard: impl Send + 'static,
) {
    let _guard = guard;
    // The handshake is bounded as the TCP side's is (`header_read_timeout`).
    let done = tokio::time::timeout(limits.header_read_timeout, connecting);
    let connection = tokio::select! {
        done = done => match done {
            Ok(Ok(connection)) => connection,
            Ok(Err(error)) => {
                tracing::debug!(%error, "QUIC handshake failed");
                handshake.end(quic::Outcome::Failed);
                return;
            }
            Err(_) => {
                tracing::debug!("QUIC handshake timed out");
                handshake.end(quic::Outcome::Timeout);
                return;
            }
        },
        _ = shutting_down(&mut shutdown) => return,
    };
    handshake.end(quic::Outcome::Ok);
    let metrics = proxy().metrics().clone();
    metrics.count_accepted();
    let client = client_info(&connection);
    client
        .backend_slots
        .limit(limits.max_backend_connections as usize);
    client
        .private
        .set_capacity((limits.max_streams as usize).min(MAX_PRIVATE));
    let client = Arc::new(client);
    let quic = connection.clone();
    let built = h3::server::builder()
        .max_field_section_size(limits.max_header_bytes)
        .build::<_, Bytes>(capped::Connection::new(connection, frame_limit(limits)))
        .await;
    if let Ok(mut h3) = built {
        requests(&mut h3, &client, limits, &proxy, &mut shutdown).await;
        // The last answers' bytes may still be on their way: the client closes, or
        // `CLOSE_GRACE` passes, before the connection is closed (which would abandon them).
        let _ = tokio::time::timeout(CLOSE_GRACE, quic.closed()).await;
    }
    quic.close(H3_NO_ERROR, b"");
    let stats = quic.stats();
    metrics.add_bytes(stats.udp_rx.bytes, stats.udp_tx.bytes);
}

/// Accepts and spawns the connection's requests until it ends.
async fn requests(
    h3: &mut h3::server::Connection<capped::Connection, Bytes>,
    client: &Arc<ClientInfo>,
    limits: Limits,
    proxy: &(impl Fn() -> Arc<Proxy> + Send + Sync + 'static),
    shutdown: &mut watch::Receiver<bool>,
) {
    let active = Arc::new(Active::default());
    let mut closing = false;
    let mut quiet_since = Instant::now();
    let mut reap = tokio::time::interval(REAP_PERIOD);
    reap.set_missed_tick_behavior(MissedTickBehavior::Delay);
    loop {
        // After our GOAWAY, `accept` waits on for streams the client may no longer open: the
        // connection is done once its last request is.
        if closing && active.count.load(Ordering::Relaxed) == 0 {
            return;
        }
        let idle = tokio::time::sleep_until(quiet_since + limits.idle_timeout);
        let accepted = tokio::select! {
            accepted = h3.accept() => accepted,
            _ = shutting_down(shutdown), if !closing => {
                // GOAWAY: the requests accepted so far finish, then `accept` ends.
                closing = true;
                let _ = h3.shutdown(0).await;
                continue;
            }
            _ = idle, if !closing => {
                if active.count.load(Ordering::Relaxed) == 0 {
                    closing = true;
                    let _ = h3.shutdown(0).await;
                } else {
                    quiet_since = Instant::now();
                }
                continue;
            }
            // A request ended: the idle time counts from now.
            _ = active.ended.notified() => {
                quiet_since = Instant::now();
                continue;
            }
            _ = reap.tick() => {
                client.private.reap();
                continue;
            }
        };
        match accepted {
            Ok(Some(resolver)) => {
                quiet_since = Instant::now();
                let task = request::Request {
                    proxy: proxy(),
                    client: client.clone(),
                    limits,
                    _in_flight: InFlight::new(&active),
                };
                // Boxed in place, as an HTTP/2 stream's future is: the request's future
                // (several KB: the proxy's path inline) is not moved, where `spawn` would
                // move it twice and size the task's cell by it.
                tokio::spawn(boxed_in_place(|| task.serve(resolver)));
            }
            // The client's GOAWAY, every request done.
            Ok(None) => return,
            Err(error) => {
                tracing::debug!(%error, "HTTP/3 connection ended");
                return;
            }
        }
    }
}

/// The longest frame other than DATA a client may send: a request head QPACK-encoded is no
/// longer than decoded (`max_header_bytes`), with room for the encoding's prefixes.
fn frame_limit(limits: Limits) -> u64 {
    limits.max_header_bytes.saturating_add(FRAME_SLACK)
}

/// What a HEADERS frame may hold beyond `max_header_bytes`.
const FRAME_SLACK: u64 = 16 * 1024;

/// What the proxy knows of the client: its address and its TLS, as a TLS listener's.
fn client_info(connection: &quinn::Connection) -> ClientInfo {
    let peer: SocketAddr = connection.remote_address();
    let sni = connection
        .handshake_data()
        .and_then(|data| data.downcast::<quinn::crypto::rustls::HandshakeData>().ok())
        .and_then(|data| data.server_name);
    let info = TlsInfo {
        version: "TLSv1.3",
        sni,
        alpn: Some("h3".to_owned()),
        client_certificate: connection.peer_identity().is_some(),
    };
    ClientInfo::with_tls(peer, info)
}

/// Resolves once the balancer shuts down (never, should the sender be gone).
async fn shutting_down(shutdown: &mut watch::Receiver<bool>) {
    if shutdown.wait_for(|down| *down).await.is_err() {
        std::future::pending::<()>().await;
    }
}
