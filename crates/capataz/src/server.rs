//! Starting and stopping a balancer: bind every listener first, then build the pools, start
//! their probes and timers, and serve.
//!
//! Binding comes first so a config that cannot start (an address in use) leaves nothing half
//! running. Each client connection is served by hyper's HTTP/1 server with upgrades; a
//! connection that sits idle longer than the listener's idle timeout is closed gracefully.

use std::io;
use std::net::SocketAddr;
use std::pin::pin;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper_util::rt::{TokioIo, TokioTimer};
use tokio::net::TcpListener;
use tokio::sync::{broadcast, watch};
use tokio::task::JoinHandle;

use crate::config::{Config, ListenerConfig};
use crate::health::{Event, PoolRt};
use crate::proxy::{ClientInfo, Proxy};

/// A running balancer. Dropping it stops everything it started.
#[derive(Debug)]
pub struct Balancer {
    pools: Vec<Arc<PoolRt>>,
    addrs: Vec<SocketAddr>,
    events: broadcast::Sender<Event>,
    tasks: Vec<JoinHandle<()>>,
    shutdown: watch::Sender<bool>,
    connections: Arc<AtomicUsize>,
}

/// Why a balancer could not start.
#[derive(Debug, thiserror::Error)]
pub enum StartError {
    /// A listener could not bind its address.
    #[error("listener {name}: cannot listen on {address}: {source}")]
    Bind {
        /// The listener's name.
        name: String,
        /// Its address.
        address: SocketAddr,
        /// The OS error.
        source: io::Error,
    },
}

impl Balancer {
    /// Starts a balancer for `config`; health events go to `events` (subscribe before calling to
    /// see the first ones). Must be called within a tokio runtime.
    pub async fn start(
        config: &Config,
        events: broadcast::Sender<Event>,
    ) -> Result<Balancer, StartError> {
        let mut listeners = Vec::with_capacity(config.listeners.len());
        for listener in &config.listeners {
            let bound = bind(listener.address).map_err(|source| StartError::Bind {
                name: listener.name.clone(),
                address: listener.address,
                source,
            })?;
            listeners.push(bound);
        }
        let origin = Instant::now();
        let pools: Vec<Arc<PoolRt>> = config
            .pools
            .iter()
            .map(|pool| Arc::new(PoolRt::new(pool.clone(), events.clone(), origin)))
            .collect();
        let mut tasks = Vec::new();
        for pool in &pools {
            tasks.extend(pool.spawn_tasks());
        }
        let (shutdown, _) = watch::channel(false);
        let connections = Arc::new(AtomicUsize::new(0));
        let mut addrs = Vec::new();
        for (listener, socket) in config.listeners.iter().zip(listeners) {
            addrs.push(socket.local_addr().unwrap_or(listener.address));
            let proxy = Arc::new(Proxy::new(
                &listener.routes,
                &pools,
                listener.max_header_bytes,
            ));
            tracing::info!(
                listener = %listener.name,
                address = %addrs.last().copied().unwrap_or(listener.address),
                "listening"
            );
            tasks.push(tokio::spawn(accept_loop(
                socket,
                proxy,
                listener.clone(),
                shutdown.subscribe(),
                connections.clone(),
            )));
        }
        Ok(Balancer {
            pools,
            addrs,
            events,
            tasks,
            shutdown,
            connections,
        })
    }

    /// The addresses the listeners bound, in configuration order (useful with port 0).
    pub fn local_addrs(&self) -> &[SocketAddr] {
        &self.addrs
    }

    /// The pools, in configuration order.
    pub fn pools(&self) -> &[Arc<PoolRt>] {
        &self.pools
    }

    /// The pool named `name`.
    pub fn pool(&self, name: &str) -> Option<&Arc<PoolRt>> {
        self.pools.iter().find(|p| &*p.name == name)
    }

    /// A new receiver of health events.
    pub fn subscribe(&self) -> broadcast::Receiver<Event> {
        self.events.subscribe()
    }

    /// Client connections currently open.
    pub fn open_connections(&self) -> usize {
        self.connections.load(Ordering::Relaxed)
    }

    /// Stops accepting, lets open connections finish their requests for up to `deadline`, then
    /// stops everything.
    pub async fn shutdown(mut self, deadline: Duration) {
        let _ = self.shutdown.send(true);
        let end = tokio::time::Instant::now() + deadline;
        while self.connections.load(Ordering::Relaxed) > 0 && tokio::time::Instant::now() < end {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        for task in self.tasks.drain(..) {
            task.abort();
        }
    }
}

impl Drop for Balancer {
    fn drop(&mut self) {
        let _ = self.shutdown.send(true);
        for task in &self.tasks {
            task.abort();
        }
    }
}

fn bind(address: SocketAddr) -> io::Result<TcpListener> {
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
    proxy: Arc<Proxy>,
    listener: ListenerConfig,
    mut shutdown: watch::Receiver<bool>,
    connections: Arc<AtomicUsize>,
) {
    loop {
        let accepted = tokio::select! {
            accepted = socket.accept() => accepted,
            _ = shutdown.changed() => return,
        };
        let (stream, peer) = match accepted {
            Ok(pair) => pair,
            Err(error) => {
                // Out of descriptors and the like: back off briefly instead of spinning.
                tracing::warn!(listener = %listener.name, %error, "accept failed");
                tokio::time::sleep(Duration::from_millis(50)).await;
                continue;
            }
        };
        let _ = stream.set_nodelay(true);
        let proxy = proxy.clone();
        let shutdown = shutdown.clone();
        let connections = connections.clone();
        let idle_timeout = listener.idle_timeout;
        let header_read_timeout = listener.header_read_timeout;
        let max_buf = listener.max_header_bytes.max(8192);
        connections.fetch_add(1, Ordering::Relaxed);
        tokio::spawn(async move {
            serve_connection(
                stream,
                peer,
                proxy,
                idle_timeout,
                header_read_timeout,
                max_buf,
                shutdown,
            )
            .await;
            connections.fetch_sub(1, Ordering::Relaxed);
        });
    }
}

/// Activity on one client connection, for the idle timeout.
struct Activity {
    origin: Instant,
    active: AtomicUsize,
    last_ms: AtomicU64,
}

impl Activity {
    fn touch(&self) {
        self.last_ms
            .store(self.origin.elapsed().as_millis() as u64, Ordering::Relaxed);
    }

    fn idle_for(&self) -> Option<Duration> {
        if self.active.load(Ordering::Relaxed) > 0 {
            return None;
        }
        let last = Duration::from_millis(self.last_ms.load(Ordering::Relaxed));
        Some(self.origin.elapsed().saturating_sub(last))
    }
}

async fn serve_connection(
    stream: tokio::net::TcpStream,
    peer: SocketAddr,
    proxy: Arc<Proxy>,
    idle_timeout: Duration,
    header_read_timeout: Duration,
    max_buf: usize,
    mut shutdown: watch::Receiver<bool>,
) {
    let activity = Arc::new(Activity {
        origin: Instant::now(),
        active: AtomicUsize::new(0),
        last_ms: AtomicU64::new(0),
    });
    let service_activity = activity.clone();
    let client = Arc::new(ClientInfo::new(peer));
    let service = service_fn(move |req| {
        let proxy = proxy.clone();
        let activity = service_activity.clone();
        let client = client.clone();
        activity.active.fetch_add(1, Ordering::Relaxed);
        async move {
            let response = proxy.handle(req, client).await;
            activity.touch();
            activity.active.fetch_sub(1, Ordering::Relaxed);
            response
        }
    });
    let mut builder = http1::Builder::new();
    builder
        .timer(TokioTimer::new())
        .header_read_timeout(header_read_timeout)
        .max_buf_size(max_buf)
        .keep_alive(true);
    let mut conn = pin!(builder
        .serve_connection(TokioIo::new(stream), service)
        .with_upgrades());
    let check = (idle_timeout / 4).max(Duration::from_millis(20));
    let mut closing = *shutdown.borrow();
    if closing {
        conn.as_mut().graceful_shutdown();
    }
    loop {
        tokio::select! {
            _ = conn.as_mut() => return,
            changed = shutdown.changed(), if !closing => {
                if changed.is_err() || *shutdown.borrow() {
                    closing = true;
                    conn.as_mut().graceful_shutdown();
                }
            }
            _ = tokio::time::sleep(check), if !closing => {
                if activity.idle_for().is_some_and(|idle| idle >= idle_timeout) {
                    closing = true;
                    conn.as_mut().graceful_shutdown();
                }
            }
        }
    }
}
