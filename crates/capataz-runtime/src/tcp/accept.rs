//! A tcp listener's accepted connection handed to its session's task: a PROXY protocol header
//! read first from a trusted source, then the TLS handshake on a listener with
//! `[listeners.tls]` (both within `header_read_timeout`, as an HTTP listener does), then the
//! session.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use capataz_proxy_protocol::{Addresses, Rewind};
use tokio::net::TcpStream;

use super::TcpRelay;
use crate::config::ListenerConfig;
use crate::instruments::HandshakeFailures;
use crate::tls::acme::ACME_TLS_ALPN;
use crate::tls::ServerTls;

/// Spawns the session of `stream`, accepted from `peer` on `local` (the address it reached,
/// when known), with the settings of `config`, the listener's in force; a failed handshake is
/// counted in `failures`; `guard` lives as long as the session (the balancer's count of open
/// connections).
pub(crate) fn spawn<G: Send + 'static>(
    relay: Arc<TcpRelay>,
    config: &ListenerConfig,
    stream: TcpStream,
    (peer, local): (SocketAddr, Option<SocketAddr>),
    (failures, guard): (HandshakeFailures, G),
) {
    let destination = local.unwrap_or_else(|| unspecified(peer));
    let trusted = config
        .proxy_protocol
        .as_ref()
        .is_some_and(|pp| pp.trusted.iter().any(|block| block.contains(peer.ip())));
    let tls = config.tls.as_ref().and_then(|tls| tls.loaded.clone());
    if !trusted && tls.is_none() {
        // The plain path: the session's future alone.
        tokio::spawn(async move {
            let _guard = guard;
            relay.serve(stream, peer, destination, None).await;
        });
        return;
    }
    let timeout = config.header_read_timeout;
    tokio::spawn(async move {
        let _guard = guard;
        let addresses = (peer, destination);
        let Some((stream, (peer, destination))) =
            proxied(stream, addresses, trusted, timeout).await
        else {
            return;
        };
        match tls {
            None => Box::pin(relay.serve(stream, peer, destination, None)).await,
            Some(tls) => {
                let Some((stream, info)) = handshake(&tls, stream, timeout, &failures).await else {
                    return;
                };
                // A TLS-ALPN-01 validation ends with its handshake: it carries no session.
                if info.alpn.as_deref().map(str::as_bytes) == Some(ACME_TLS_ALPN) {
                    return;
                }
                let serve = relay.serve(Box::new(stream), peer, destination, Some(info));
                Box::pin(serve).await;
            }
        }
    });
}

/// The stream, and the client's and its destination's addresses: those a trusted proxy's
/// header names (read within `timeout`; a LOCAL or UNKNOWN header keeps the connection's own),
/// else the connection's own. `None` when a trusted source's header was refused or late.
async fn proxied(
    mut stream: TcpStream,
    (peer, destination): (SocketAddr, SocketAddr),
    trusted: bool,
    timeout: Duration,
) -> Option<(Rewind<TcpStream>, (SocketAddr, SocketAddr))> {
    if !trusted {
        return Some((Rewind::new(Bytes::new(), stream), (peer, destination)));
    }
    let read = tokio::time::timeout(timeout, capataz_proxy_protocol::read_header(&mut stream));
    match read.await {
        Ok(Ok((header, rest))) => {
            let addresses = match header.addresses {
                Addresses::Proxied {
                    source,
                    destination,
                } => (source, destination),
                Addresses::Local => (peer, destination),
            };
            Some((Rewind::new(rest, stream), addresses))
        }
        Ok(Err(error)) => {
            tracing::debug!(%peer, %error, "PROXY protocol header refused");
            None
        }
        Err(_) => {
            tracing::debug!(%peer, "PROXY protocol header timed out");
            None
        }
    }
}

/// The server side of the TLS handshake within `timeout`; a failure is counted by reason and
/// logged at debug, and the connection dropped, having reached no backend.
async fn handshake(
    tls: &ServerTls,
    stream: Rewind<TcpStream>,
    timeout: Duration,
    failures: &HandshakeFailures,
) -> Option<(
    tokio_rustls::server::TlsStream<Rewind<TcpStream>>,
    crate::tls::TlsInfo,
)> {
    let reason = match tokio::time::timeout(timeout, tls.accept(stream)).await {
        Ok(Ok(done)) => {
            if crate::tls::resumed(&done.0) {
                failures.count_resumed();
            }
            return Some(done);
        }
        Ok(Err(error)) => {
            let reason = crate::tls::failure_reason(&error);
            tracing::debug!(%error, reason, "TLS handshake failed");
            reason
        }
        Err(_) => {
            tracing::debug!("TLS handshake timed out");
            "timeout"
        }
    };
    failures.count(reason);
    None
}

/// The unspecified address of `peer`'s family, port 0: the destination when not known.
fn unspecified(peer: SocketAddr) -> SocketAddr {
    match peer {
        SocketAddr::V4(_) => SocketAddr::from(([0, 0, 0, 0], 0)),
        SocketAddr::V6(_) => SocketAddr::from(([0u16; 8], 0)),
    }
}
