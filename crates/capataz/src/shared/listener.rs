//! The client listeners: binding, the accept loop, and what each connection reads per request.

use std::io;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use arc_swap::ArcSwap;
use tokio::net::TcpListener;
use tokio::sync::watch;
use tokio::task::JoinHandle;

use super::{Shared, StartError};
use crate::balance::PoolHandle;
use crate::client;
use crate::config::ListenerConfig;
use crate::health::PoolRt;
use crate::proxy::Proxy;

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

/// Binds `listener`'s address.
pub(crate) fn bind_listener(listener: &ListenerConfig) -> Result<TcpListener, StartError> {
    bind(listener.address).map_err(|source| StartError::Bind {
        name: listener.name.clone(),
        address: listener.address,
        source,
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
        let limits = {
            let current = state.load();
            client::Limits {
                idle_timeout: current.config.idle_timeout,
                header_read_timeout: current.config.header_read_timeout,
                max_buf: current.config.max_header_bytes.max(8192),
            }
        };
        // The routes in force now: a reload applies to the next request on every connection.
        let proxy = move || state.load().proxy.clone();
        tokio::spawn(async move {
            client::serve(stream, peer, limits, proxy, shutdown).await;
            connections.fetch_sub(1, Ordering::Relaxed);
        });
    }
}
