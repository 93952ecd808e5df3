//! A tcp listener's accepted connection handed to its session's task: a PROXY protocol header
//! read first from a trusted source (within `header_read_timeout`, as an HTTP listener does),
//! then the session.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use capataz_proxy_protocol::{Addresses, Rewind};
use tokio::net::TcpStream;

use super::TcpRelay;
use crate::config::ListenerConfig;

/// Spawns the session of `stream`, accepted from `peer` on `local` (the address it reached,
/// when known), with the settings of `config`, the listener's in force; `guard` lives as long
/// as the session (the balancer's count of open connections).
pub(crate) fn spawn<G: Send + 'static>(
    relay: Arc<TcpRelay>,
    config: &ListenerConfig,
    stream: TcpStream,
    (peer, local): (SocketAddr, Option<SocketAddr>),
    guard: G,
) {
    let destination = local.unwrap_or_else(|| unspecified(peer));
    let trusted = config
        .proxy_protocol
        .as_ref()
        .is_some_and(|pp| pp.trusted.iter().any(|block| block.contains(peer.ip())));
    if !trusted {
        tokio::spawn(async move {
            let _guard = guard;
            relay.serve(stream, peer, destination).await;
        });
        return;
    }
    let timeout = config.header_read_timeout;
    tokio::spawn(async move {
        let _guard = guard;
        proxied(relay, stream, (peer, destination), timeout).await;
    });
}

/// A connection from a trusted proxy: its header read within `timeout`, then the session of
/// the client it names (a LOCAL or UNKNOWN header keeps the connection's own addresses).
async fn proxied(
    relay: Arc<TcpRelay>,
    mut stream: TcpStream,
    (peer, destination): (SocketAddr, SocketAddr),
    timeout: Duration,
) {
    let read = tokio::time::timeout(timeout, capataz_proxy_protocol::read_header(&mut stream));
    match read.await {
        Ok(Ok((header, rest))) => {
            let (client, destination) = match header.addresses {
                Addresses::Proxied {
                    source,
                    destination,
                } => (source, destination),
                Addresses::Local => (peer, destination),
            };
            Box::pin(relay.serve(Rewind::new(rest, stream), client, destination)).await;
        }
        Ok(Err(error)) => tracing::debug!(%peer, %error, "PROXY protocol header refused"),
        Err(_) => tracing::debug!(%peer, "PROXY protocol header timed out"),
    }
}

/// The unspecified address of `peer`'s family, port 0: the destination when not known.
fn unspecified(peer: SocketAddr) -> SocketAddr {
    match peer {
        SocketAddr::V4(_) => SocketAddr::from(([0, 0, 0, 0], 0)),
        SocketAddr::V6(_) => SocketAddr::from(([0u16; 8], 0)),
    }
}
