//! Starting and stopping a balancer: bind every listener first, then build the pools, start
//! their probes and timers, and serve.
//!
//! Binding comes first so a config that cannot start (an address in use) leaves nothing half
//! running. Each client connection is served by hyper's HTTP/1 server with upgrades; a
//! connection that sits idle longer than the listener's idle timeout is closed gracefully.

use std::io;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use arc_swap::ArcSwap;

use tokio::net::TcpListener;
use tokio::sync::{broadcast, watch};
use tokio::task::JoinHandle;

use crate::alerts::{AlertStats, Alerts};
use crate::client;
use crate::config::{Config, ListenerConfig};
use crate::health::{Clock, Event, PoolRt};
use crate::metrics::HistogramScope;
use crate::proxy::Proxy;

/// A running balancer. Dropping it stops everything it started.
#[derive(Debug)]
pub struct Balancer {
    shared: Arc<Shared>,
    admin_addr: Option<SocketAddr>,
    admin_task: Option<JoinHandle<()>>,
}

/// What the listeners, the admin API and reloads share.
#[derive(Debug)]
pub struct Shared {
    config: Mutex<Arc<Config>>,
    config_path: Option<PathBuf>,
    pools: ArcSwap<Vec<Arc<PoolRt>>>,
    pool_tasks: Mutex<Vec<JoinHandle<()>>>,
    listeners: Mutex<Vec<ListenerRt>>,
    events: broadcast::Sender<Event>,
    clock: Clock,
    /// How latency histograms are labelled: read at start, kept across reloads.
    histograms: HistogramScope,
    shutdown: watch::Sender<bool>,
    connections: Arc<AtomicUsize>,
    reload_lock: tokio::sync::Mutex<()>,
    alerts: Mutex<Option<Alerts>>,
}

/// One client-facing listener at run time.
#[derive(Debug)]
struct ListenerRt {
    address: SocketAddr,
    local: SocketAddr,
    state: Arc<ArcSwap<ListenerState>>,
    stop: watch::Sender<bool>,
    task: JoinHandle<()>,
}

/// What a listener's connections read per request: its settings and its routes.
#[derive(Debug)]
struct ListenerState {
    config: ListenerConfig,
    proxy: Arc<Proxy>,
}

/// Why a balancer could not start, or a reload was refused.
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
    /// The new configuration is invalid.
    #[error("{0}")]
    Config(#[from] crate::config::ConfigError),
    /// A reload needs a file, and the balancer was started from text.
    #[error("this balancer was not started from a file, so there is nothing to reload")]
    NoFile,
    /// Loading the new configuration panicked (a bug): nothing changed.
    #[error("loading the configuration failed unexpectedly (a bug in capataz; please report it)")]
    LoadPanicked,
}

/// What a reload changed.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ReloadSummary {
    /// Backends that kept their health state.
    pub kept: usize,
    /// Backends added (gated until they pass `rise` probes, where configured).
    pub added: usize,
    /// Backends removed (drained: they finish their in-flight requests).
    pub removed: usize,
    /// Listeners started and stopped.
    pub listeners_added: usize,
    /// Listeners stopped.
    pub listeners_removed: usize,
}

impl Balancer {
    /// Starts a balancer for `config`; health events go to `events` (subscribe before calling to
    /// see the first ones). Must be called within a tokio runtime.
    pub async fn start(
        config: &Config,
        events: broadcast::Sender<Event>,
    ) -> Result<Balancer, StartError> {
        Balancer::start_with_path(config, events, None).await
    }

    /// Like [`Balancer::start`], remembering `path` so SIGHUP and `POST /reload` re-read it.
    pub async fn start_with_path(
        config: &Config,
        events: broadcast::Sender<Event>,
        path: Option<PathBuf>,
    ) -> Result<Balancer, StartError> {
        // Bind everything first, so a config that cannot start leaves nothing running.
        let mut sockets = Vec::with_capacity(config.listeners.len());
        for listener in &config.listeners {
            sockets.push(bind_listener(listener)?);
        }
        let admin_socket = match &config.admin {
            Some(admin) => Some(bind(admin.address).map_err(|source| StartError::Bind {
                name: "admin".into(),
                address: admin.address,
                source,
            })?),
            None => None,
        };
        let clock = Clock::start();
        let histograms = HistogramScope::of(config);
        let pools: Vec<Arc<PoolRt>> = config
            .pools
            .iter()
            .map(|pool| PoolRt::new(pool.clone(), events.clone(), clock, None, false, histograms))
            .collect();
        let mut pool_tasks = Vec::new();
        for pool in &pools {
            pool_tasks.extend(pool.spawn_tasks());
        }
        let (shutdown, _) = watch::channel(false);
        let shared = Arc::new(Shared {
            config: Mutex::new(Arc::new(config.clone())),
            config_path: path,
            pools: ArcSwap::from_pointee(pools),
            pool_tasks: Mutex::new(pool_tasks),
            listeners: Mutex::new(Vec::new()),
            events,
            clock,
            histograms,
            shutdown,
            connections: Arc::new(AtomicUsize::new(0)),
            reload_lock: tokio::sync::Mutex::new(()),
            alerts: Mutex::new(None),
        });
        shared.restart_alerts(config);
        let pools = shared.pools.load_full();
        let mut listeners = Vec::new();
        for (listener, socket) in config.listeners.iter().zip(sockets) {
            listeners.push(shared.spawn_listener(listener, socket, &pools));
        }
        *lock(&shared.listeners) = listeners;
        let (admin_addr, admin_task) = match admin_socket {
            Some(socket) => {
                let addr = socket.local_addr().ok();
                let task = tokio::spawn(crate::admin::serve(socket, shared.clone()));
                if let Some(addr) = addr {
                    tracing::info!(address = %addr, "admin API listening");
                }
                (addr, Some(task))
            }
            None => (None, None),
        };
        Ok(Balancer {
            shared,
            admin_addr,
            admin_task,
        })
    }

    /// The addresses the listeners bound, in configuration order (useful with port 0).
    pub fn local_addrs(&self) -> Vec<SocketAddr> {
        lock(&self.shared.listeners)
            .iter()
            .map(|l| l.local)
            .collect()
    }

    /// The admin API's address, if it runs.
    pub fn admin_addr(&self) -> Option<SocketAddr> {
        self.admin_addr
    }

    /// What the admin API and reloads share.
    pub fn shared(&self) -> &Arc<Shared> {
        &self.shared
    }

    /// The pools, in configuration order.
    pub fn pools(&self) -> Arc<Vec<Arc<PoolRt>>> {
        self.shared.pools()
    }

    /// The pool named `name`.
    pub fn pool(&self, name: &str) -> Option<Arc<PoolRt>> {
        self.shared.pool(name)
    }

    /// A new receiver of health events.
    pub fn subscribe(&self) -> broadcast::Receiver<Event> {
        self.shared.events.subscribe()
    }

    /// Client connections currently open.
    pub fn open_connections(&self) -> usize {
        self.shared.connections.load(Ordering::Relaxed)
    }

    /// Applies a new configuration; see [`Shared::reload`].
    pub async fn reload(&self, config: &Config) -> Result<ReloadSummary, StartError> {
        self.shared.reload(config).await
    }

    /// Stops accepting, lets open connections finish their requests for up to `deadline`, then
    /// stops everything. Once it returns, the listening sockets are closed: a new connection is
    /// refused.
    pub async fn shutdown(mut self, deadline: Duration) {
        let _ = self.shared.shutdown.send(true);
        // `deadline` is public input (callers other than the config loader, which caps it at a
        // year): saturate rather than panic on an overflowing clock reading.
        let now = tokio::time::Instant::now();
        let end = now
            .checked_add(deadline)
            .or_else(|| now.checked_add(crate::config::MAX_DURATION))
            .unwrap_or(now);
        // Wait for the accept loops to end, which drops their sockets. Aborting them in `Drop`
        // is not enough: until a worker drops the aborted task, the kernel keeps queueing new
        // connections on the socket, to reset them later.
        let listeners = std::mem::take(&mut *lock(&self.shared.listeners));
        for listener in &listeners {
            let _ = listener.stop.send(true);
        }
        let accept_loops = listeners
            .into_iter()
            .map(|l| l.task)
            .chain(self.admin_task.take());
        for mut task in accept_loops {
            if tokio::time::timeout_at(end, &mut task).await.is_err() {
                task.abort();
            }
        }
        while self.shared.connections.load(Ordering::Relaxed) > 0
            && tokio::time::Instant::now() < end
        {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        let left = self.shared.connections.load(Ordering::Relaxed);
        if left > 0 {
            tracing::warn!(
                connections = left,
                "shutdown deadline reached with connections still open; closing them"
            );
        }
        // Drop runs the rest.
    }
}

impl Drop for Balancer {
    fn drop(&mut self) {
        let _ = self.shared.shutdown.send(true);
        for listener in lock(&self.shared.listeners).drain(..) {
            let _ = listener.stop.send(true);
            listener.task.abort();
        }
        for task in lock(&self.shared.pool_tasks).drain(..) {
            task.abort();
        }
        if let Some(task) = self.admin_task.take() {
            task.abort();
        }
    }
}

fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    // Every holder leaves the value whole (plain pushes and swaps), so poison is harmless.
    mutex.lock().unwrap_or_else(|e| e.into_inner())
}

impl Shared {
    /// The pools, in configuration order.
    pub fn pools(&self) -> Arc<Vec<Arc<PoolRt>>> {
        self.pools.load_full()
    }

    /// The pool named `name`.
    pub fn pool(&self, name: &str) -> Option<Arc<PoolRt>> {
        self.pools.load().iter().find(|p| &*p.name == name).cloned()
    }

    /// A new receiver of health events.
    pub fn subscribe(&self) -> broadcast::Receiver<Event> {
        self.events.subscribe()
    }

    /// The alert hooks' delivery counters (`None` when no hook is configured).
    pub fn alert_stats(&self) -> Option<Arc<AlertStats>> {
        lock(&self.alerts).as_ref().map(Alerts::stats)
    }

    /// Starts the alert hooks of `config`, replacing (and stopping) the running ones.
    fn restart_alerts(&self, config: &Config) {
        let alerts = &config.alerts;
        let hooks = !alerts.webhooks.is_empty() || !alerts.commands.is_empty();
        let next = hooks.then(|| Alerts::start(alerts, self.events.subscribe()));
        *lock(&self.alerts) = next;
    }

    /// The configuration in force.
    pub fn config(&self) -> Arc<Config> {
        lock(&self.config).clone()
    }

    /// The runtime clock.
    pub fn clock(&self) -> Clock {
        self.clock
    }

    /// A receiver that turns true when the balancer shuts down.
    pub fn shutdown_signal(&self) -> watch::Receiver<bool> {
        self.shutdown.subscribe()
    }

    /// Re-reads the file the balancer was started from and applies it. Reading, parsing,
    /// validating and resolving the file's host names run on tokio's blocking pool: a slow disk,
    /// a FIFO, a slow resolver or a costly value never holds a runtime thread that requests and
    /// probes need.
    pub async fn reload_from_file(&self) -> Result<ReloadSummary, StartError> {
        let path = self.config_path.clone().ok_or(StartError::NoFile)?;
        // Held across the read too, so that reloads apply in the order their reads started.
        let _serial = self.reload_lock.lock().await;
        let config = tokio::task::spawn_blocking(move || crate::config::load(&path))
            .await
            .map_err(|_| StartError::LoadPanicked)??;
        self.apply(&config)
    }

    /// Applies a new, validated configuration without dropping a connection: new listeners are
    /// bound first (a failure changes nothing), then every pool is rebuilt. A backend with the
    /// same pool, name and address keeps its health state, streaks and records; a new one
    /// starts DOWN until it passes `rise` probes where the pool gates new backends; a removed
    /// one gets no new requests and is dropped once its in-flight requests finish. Changing the
    /// admin address or `admin.metrics_backend_histograms` needs a restart.
    pub async fn reload(&self, config: &Config) -> Result<ReloadSummary, StartError> {
        let _serial = self.reload_lock.lock().await;
        self.apply(config)
    }

    /// [`Shared::reload`] once the caller holds `reload_lock`.
    fn apply(&self, config: &Config) -> Result<ReloadSummary, StartError> {
        let old_config = self.config();
        let mut listeners = std::mem::take(&mut *lock(&self.listeners));
        // Bind the listeners that are new, before changing anything.
        let mut fresh = Vec::new();
        for listener in &config.listeners {
            if !listeners.iter().any(|l| l.address == listener.address) {
                match bind_listener(listener) {
                    Ok(socket) => fresh.push((listener.clone(), socket)),
                    Err(error) => {
                        *lock(&self.listeners) = listeners;
                        return Err(error);
                    }
                }
            }
        }
        let old_pools = self.pools.load_full();
        let mut summary = ReloadSummary::default();
        let new_pools: Vec<Arc<PoolRt>> = config
            .pools
            .iter()
            .map(|pool| {
                let previous = old_pools.iter().find(|p| *p.name == *pool.name);
                for backend in &pool.backends {
                    let kept = previous.is_some_and(|p| {
                        p.backends
                            .iter()
                            .any(|b| *b.name == *backend.name && b.address == backend.address)
                    });
                    if kept {
                        summary.kept += 1;
                    } else {
                        summary.added += 1;
                    }
                }
                PoolRt::new(
                    pool.clone(),
                    self.events.clone(),
                    self.clock,
                    previous.map(|p| &**p),
                    pool.gate_new_backends,
                    self.histograms,
                )
            })
            .collect();
        let total_old: usize = old_pools.iter().map(|p| p.backends.len()).sum();
        summary.removed = total_old.saturating_sub(summary.kept);
        let mut tasks = Vec::new();
        for pool in &new_pools {
            tasks.extend(pool.spawn_tasks());
        }
        self.pools.store(Arc::new(new_pools));
        let old_tasks = std::mem::replace(&mut *lock(&self.pool_tasks), tasks);
        for task in old_tasks {
            task.abort();
        }
        let pools = self.pools.load_full();
        // Keep, update or stop the existing listeners.
        let mut kept_listeners = Vec::new();
        for listener in listeners.drain(..) {
            match config
                .listeners
                .iter()
                .find(|l| l.address == listener.address)
            {
                Some(new) => {
                    listener.state.store(Arc::new(ListenerState {
                        config: new.clone(),
                        proxy: Arc::new(Proxy::new(new, &pools)),
                    }));
                    kept_listeners.push(listener);
                }
                None => {
                    let _ = listener.stop.send(true);
                    summary.listeners_removed += 1;
                }
            }
        }
        for (listener, socket) in fresh {
            kept_listeners.push(self.spawn_listener(&listener, socket, &pools));
            summary.listeners_added += 1;
        }
        *lock(&self.listeners) = kept_listeners;
        if old_config.admin.as_ref().map(|a| a.address) != config.admin.as_ref().map(|a| a.address)
        {
            tracing::warn!(
                "the admin address changed in the new config; it takes effect at the next restart"
            );
        }
        // Switching live would leave the other scope's series in the same families (per-backend
        // ones would not even go away), so the scope stays until the process restarts.
        if HistogramScope::of(config) != self.histograms {
            tracing::warn!(
                kept = %self.histograms,
                "admin.metrics_backend_histograms in the new config differs from the one the \
                 process started with; it takes effect at the next restart"
            );
        }
        if old_config.alerts != config.alerts {
            self.restart_alerts(config);
        }
        *lock(&self.config) = Arc::new(config.clone());
        tracing::info!(
            kept = summary.kept,
            added = summary.added,
            removed = summary.removed,
            "configuration reloaded: {} backends kept their health, {} added, {} removed",
            summary.kept,
            summary.added,
            summary.removed
        );
        Ok(summary)
    }

    fn spawn_listener(
        &self,
        listener: &ListenerConfig,
        socket: TcpListener,
        pools: &[Arc<PoolRt>],
    ) -> ListenerRt {
        let local = socket.local_addr().unwrap_or(listener.address);
        let state = Arc::new(ArcSwap::from_pointee(ListenerState {
            config: listener.clone(),
            proxy: Arc::new(Proxy::new(listener, pools)),
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

fn bind_listener(listener: &ListenerConfig) -> Result<TcpListener, StartError> {
    bind(listener.address).map_err(|source| StartError::Bind {
        name: listener.name.clone(),
        address: listener.address,
        source,
    })
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
