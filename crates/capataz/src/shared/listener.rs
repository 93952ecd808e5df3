//! The client listeners: binding, the accept loop, and what each connection reads per request.

use std::io;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use arc_swap::ArcSwap;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;
use tokio::task::JoinHandle;
use tokio_rustls::server::TlsStream;

use super::{Shared, StartError};
use crate::balance::PoolHandle;
use crate::client;
use crate::config::ListenerConfig;
use crate::health::PoolRt;
use crate::instruments::HandshakeFailures;
use crate::proxy::{ClientInfo, Proxy};
use crate::tls::{ServerTls, TlsInfo};

/// One client-facing listener at run time.
#[derive(Debug)]
pub(super) struct ListenerRt {
    pub(super) address: SocketAddr,
    pub(super) local: SocketAddr,
    pub(super) state: Arc<ArcSwap<ListenerState>>,
    pub(super) stop: watch::Sender<bool>,
    pub(super) task: JoinHandle<()>,
}

/// What a listener's connections read per request: its settings and its routes.
#[derive(Debug)]
pub(super) struct ListenerState {
    pub(super) config: ListenerConfig,
    pub(super) proxy: Arc<Proxy>,
}

/// The request path's handles of `pools`, what a listener's `Proxy` routes to.
pub(super) fn handles(pools: &[Arc<PoolRt>]) -> Vec<Arc<PoolHandle>> {
    pools.iter().map(|pool| pool.handle().clone()).collect()
}

impl Shared {
    pub(super) fn spawn_listener(
        &self,
        listener: &ListenerConfig,
        socket: TcpListener,
        pools: &[Arc<PoolRt>],
    ) -> ListenerRt {
        let local = socket.local_addr().unwrap_or(listener.address);
        let state = Arc::new(ArcSwap::from_pointee(ListenerState {
            config: listener.clone(),
            proxy: Arc::new(Proxy::new(
                listener,
                &handles(pools),
                self.metrics.families().listener(&listener.name),
            )),
        }));
        let (stop, stop_rx) = watch::channel(false);
        tracing::info!(listener = %listener.name, address = %local, "listening");
        let task = tokio::spawn(accept_loop(
            socket,
            state.clone(),
            stop_rx,
            self.shutdown.subscribe(),
            self.connections.clone(),
            self.metrics
                .families()
                .tls()
                .handshake_failures(&listener.name, listener.tls.is_some()),
        ));
        ListenerRt {
            address: listener.address,
            local,
            state,
            stop,
            task,
        }
    }
}

/// Binds `listener`'s address; `index` is its place in the config, for the error.
pub(crate) fn bind_listener(
    index: usize,
    listener: &ListenerConfig,
) -> Result<TcpListener, StartError> {
    bind(listener.address).map_err(|error| StartError::Bind {
        name: listener.name.clone(),
        key: format!("listeners[{index}].address"),
        address: listener.address,
        error,
    })
}

/// Binds `address` (with `SO_REUSEADDR`), listening with a backlog of 1024.
pub(crate) fn bind(address: SocketAddr) -> io::Result<TcpListener> {
    let socket = match address {
        SocketAddr::V4(_) => tokio::net::TcpSocket::new_v4()?,
        SocketAddr::V6(_) => tokio::net::TcpSocket::new_v6()?,
    };
    socket.set_reuseaddr(true)?;
    socket.bind(address)?;
    socket.listen(1024)
}

async fn accept_loop(
    socket: TcpListener,
    state: Arc<ArcSwap<ListenerState>>,
    mut stop: watch::Receiver<bool>,
    shutdown: watch::Receiver<bool>,
    connections: Arc<AtomicUsize>,
    failures: HandshakeFailures,
) {
    loop {
        let accepted = tokio::select! {
            accepted = socket.accept() => accepted,
            _ = stop.changed() => return,
        };
        let (stream, peer) = match accepted {
            Ok(pair) => pair,
            Err(error) => {
                // Out of descriptors and the like: back off briefly instead of spinning.
                tracing::warn!(%error, "accept failed");
                tokio::time::sleep(Duration::from_millis(50)).await;
                continue;
            }
        };
        let _ = stream.set_nodelay(true);
        let state = state.clone();
        let shutdown = shutdown.clone();
        let connections = connections.clone();
        connections.fetch_add(1, Ordering::Relaxed);
        let (limits, protocol, tls) = {
            let current = state.load();
            let config = &current.config;
            let limits = client::Limits {
                idle_timeout: config.idle_timeout,
                header_read_timeout: config.header_read_timeout,
                max_buf: config.max_header_bytes.max(8192),
                max_header_list: u32::try_from(config.max_header_bytes).unwrap_or(u32::MAX),
                http2: config.http2,
            };
            let protocol = if config.h2c {
                client::Protocol::Auto
            } else {
                client::Protocol::Http1
            };
            // The certificates in force now: a reload applies to the next handshake.
            let tls = config.tls.as_ref().and_then(|t| t.loaded.clone());
            (limits, protocol, tls)
        };
        // The routes in force now: a reload applies to the next request on every connection.
        let proxy = move || state.load().proxy.clone();
        let failures = failures.clone();
        tokio::spawn(async move {
            match tls {
                None => {
                    let client = ClientInfo::new(peer);
                    client::serve(stream, client, protocol, limits, proxy, shutdown).await
                }
                Some(tls) => {
                    let mut signal = shutdown.clone();
                    let done = handshake(&tls, stream, limits, &failures);
                    let done = tokio::select! {
                        done = done => done,
                        // A shutdown drops a connection still in its handshake, as one at rest.
                        _ = shutting_down(&mut signal) => None,
                    };
                    if let Some((stream, info)) = done {
                        // ALPN decides: HTTP/2 when the client and capataz agreed on h2.
                        let protocol = if info.alpn_is_h2() {
                            client::Protocol::Http2
                        } else {
                            client::Protocol::Http1
                        };
                        let client = ClientInfo::with_tls(peer, info);
                        client::serve(stream, client, protocol, limits, proxy, shutdown).await;
                    }
                }
            }
            connections.fetch_sub(1, Ordering::Relaxed);
        });
    }
}

/// Resolves once the balancer shuts down (never, should the sender be gone).
async fn shutting_down(shutdown: &mut watch::Receiver<bool>) {
    if shutdown.wait_for(|down| *down).await.is_err() {
        std::future::pending::<()>().await;
    }
}

/// The server side of a TLS handshake on a new connection, on the connection's own task,
/// within the listener's `header_read_timeout`. A failure is counted by reason and logged at
/// debug only (a port scan must not flood the log); the connection is then dropped, having
/// reached no backend.
async fn handshake(
    tls: &ServerTls,
    stream: TcpStream,
    limits: client::Limits,
    failures: &HandshakeFailures,
) -> Option<(TlsStream<TcpStream>, TlsInfo)> {
    let reason = match tokio::time::timeout(limits.header_read_timeout, tls.accept(stream)).await {
        Ok(Ok(done)) => return Some(done),
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
