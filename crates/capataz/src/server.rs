//! Starting and stopping a balancer: bind every listener first, then build the pools, start
//! their probes and timers, and serve.
//!
//! Binding comes first so a config that cannot start (an address in use) leaves nothing half
//! running. Each client connection is served by hyper's HTTP/1 server with upgrades; a
//! connection that sits idle longer than the listener's idle timeout is closed gracefully.
//!
//! [`Balancer`] is the top of the crate: it starts the live state (its supervisor, whose
//! handle is [`Supervisor`], in `crate::supervisor`) and the admin listener, which serves it.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use std::os::fd::OwnedFd;

use tokio::net::TcpListener;
use tokio::sync::broadcast;
use tokio::task::JoinHandle;

use crate::config::Config;
use crate::handover::{Inherited, Kind, Offered};
use crate::health::{Notice, PoolRt};
use crate::supervisor::{adopt_unix, bind, bind_listener, unix_bind_error, ClientSocket};
pub use crate::supervisor::{OverrideRefused, ReloadSummary, StartError, Stopped, Supervisor};
use crate::workers::Workers;

/// A running balancer. Dropping it stops everything it started.
#[derive(Debug)]
pub struct Balancer {
    supervisor: Arc<Supervisor>,
    admin_addr: Option<SocketAddr>,
    admin_task: Option<JoinHandle<()>>,
    /// The admin socket of a balancer started held, served from [`Balancer::open`].
    admin_held: Option<TcpListener>,
    /// A duplicate of the admin socket's descriptor with its configured address, for a binary
    /// upgrade to offer; dropped when shutting down, so the socket closes.
    admin_offer: Option<(SocketAddr, OwnedFd)>,
    /// The flusher of the runtime the balancer started on (`outbox`), kept running while the
    /// balancer lives: a worker's runs anyway, a test's or an embedder's ends with it.
    _flusher: Option<capataz_upstream::outbox::FlusherHandle>,
}

/// The inherited TCP socket of `kind` for `address`, if one was handed over.
fn take(
    inherited: &mut Option<&mut Inherited>,
    kind: Kind,
    address: SocketAddr,
) -> Option<std::io::Result<TcpListener>> {
    let socket = inherited.as_mut()?.take(kind, address)?;
    Some(TcpListener::from_std(socket))
}

/// `socket` with the UDP socket of `listener`'s HTTP/3 endpoint, if it has one and it was
/// handed over.
fn with_http3(
    socket: ClientSocket,
    listener: &crate::config::ListenerConfig,
    inherited: &mut Option<&mut Inherited>,
) -> ClientSocket {
    let ClientSocket::Tcp(tcp) = socket else {
        return socket;
    };
    let address = tcp
        .local_addr()
        .ok()
        .and_then(|local| crate::supervisor::http3_address(listener, local));
    match address.and_then(|address| inherited.as_mut()?.take_udp(address)) {
        Some(udp) => ClientSocket::Http3(tcp, udp),
        None => ClientSocket::Tcp(tcp),
    }
}

impl Balancer {
    /// Starts a balancer for `config`; health events go to `events` (subscribe before calling to
    /// see the first ones). Must be called within a tokio runtime.
    pub async fn start(
        config: &Config,
        events: broadcast::Sender<Notice>,
    ) -> Result<Balancer, StartError> {
        Balancer::start_with_path(config, events, None).await
    }

    /// Like [`Balancer::start`], remembering `path` so SIGHUP and `POST /reload` re-read it.
    pub async fn start_with_path(
        config: &Config,
        events: broadcast::Sender<Notice>,
        path: Option<PathBuf>,
    ) -> Result<Balancer, StartError> {
        Balancer::start_taking_over(config, events, path, (None, Workers::single())).await
    }

    /// Like [`Balancer::start_with_path`], in a process started by a binary upgrade when
    /// `inherited` is given: each listener (and the admin listener) takes the inherited
    /// socket for its address, if there is one, instead of binding; and the balancer starts
    /// held: every probed backend starts DOWN and its first probe decides, and nothing is
    /// accepted until [`Balancer::open`] (meanwhile the old process accepts from the same
    /// sockets). The listeners hand their connections to `workers` (`Workers::single()`: the
    /// runtime this is called in serves them all).
    pub async fn start_taking_over(
        config: &Config,
        events: broadcast::Sender<Notice>,
        path: Option<PathBuf>,
        (mut inherited, workers): (Option<&mut Inherited>, Workers),
    ) -> Result<Balancer, StartError> {
        let held = inherited.is_some();
        // The runtime the listeners serve on sends their put-off writes with a flusher; a
        // worker has one already, a test's or an embedder's runtime gets one here.
        let flusher = capataz_upstream::outbox::start_flusher();
        // Bind everything first, so a config that cannot start leaves nothing running.
        let mut sockets = Vec::with_capacity(config.listeners.len());
        for (index, listener) in config.listeners.iter().enumerate() {
            if let Some(unix) = &listener.unix {
                let socket = match inherited.as_mut().and_then(|i| i.take_unix(&unix.path)) {
                    Some(socket) => adopt_unix(unix, socket)
                        .map(|(socket, file)| ClientSocket::Unix(socket, file))
                        .map_err(|error| unix_bind_error(index, listener, error))?,
                    None => bind_listener(index, listener)?,
                };
                sockets.push(socket);
                continue;
            }
            let socket = match take(&mut inherited, Kind::Listener, listener.address) {
                Some(socket) => ClientSocket::Tcp(socket.map_err(|error| StartError::Bind {
                    name: listener.name.clone(),
                    key: format!("listeners[{index}].address"),
                    address: listener.address,
                    error,
                })?),
                None => bind_listener(index, listener)?,
            };
            sockets.push(with_http3(socket, listener, &mut inherited));
        }
        let admin_socket = match &config.admin {
            Some(admin) => {
                let bind_error = |error| StartError::Bind {
                    name: "admin".into(),
                    key: "admin.address".into(),
                    address: admin.address,
                    error,
                };
                let socket = match take(&mut inherited, Kind::Admin, admin.address) {
                    Some(socket) => socket.map_err(bind_error)?,
                    None => bind(admin.address).map_err(bind_error)?,
                };
                Some((admin.address, socket))
            }
            None => None,
        };
        let supervisor = Supervisor::start_as(config, events, path, sockets, (held, workers));
        let admin_offer = admin_socket.as_ref().and_then(|(configured, socket)| {
            crate::handover::duplicate(socket)
                .inspect_err(|error| {
                    tracing::warn!(%error, "cannot duplicate the admin socket: a binary upgrade will be refused");
                })
                .ok()
                .map(|fd| (*configured, fd))
        });
        let mut balancer = Balancer {
            supervisor,
            admin_addr: None,
            admin_task: None,
            admin_held: None,
            admin_offer,
            _flusher: flusher,
        };
        if let Some((_, socket)) = admin_socket {
            balancer.admin_addr = socket.local_addr().ok();
            if held {
                balancer.admin_held = Some(socket);
            } else {
                balancer.serve_admin(socket);
            }
        }
        Ok(balancer)
    }

    fn serve_admin(&mut self, socket: TcpListener) {
        self.admin_task = Some(tokio::spawn(crate::admin::serve(
            socket,
            self.supervisor.clone(),
        )));
        if let Some(addr) = self.admin_addr {
            tracing::info!(address = %addr, "admin API listening");
        }
    }

    /// Starts accepting on every listener and the admin listener of a balancer started held
    /// (does nothing on one that accepts already).
    pub async fn open(&mut self) {
        self.supervisor.open().await;
        if let Some(socket) = self.admin_held.take() {
            self.serve_admin(socket);
        }
    }

    /// Duplicates of every listening socket (the client listeners and the admin listener),
    /// for a binary upgrade to hand over.
    pub fn offer_sockets(&self) -> std::io::Result<Vec<Offered>> {
        let mut offered = self.supervisor.offer_listeners()?;
        if self.admin_addr.is_some() {
            let Some((configured, fd)) = &self.admin_offer else {
                return Err(std::io::Error::other(
                    "the admin socket could not be duplicated at its start",
                ));
            };
            offered.push(Offered {
                kind: Kind::Admin,
                unix: None,
                configured: *configured,
                bound: self.admin_addr.unwrap_or(*configured),
                fd: fd.try_clone()?,
            });
        }
        Ok(offered)
    }

    /// The addresses the listeners bound, in configuration order (useful with port 0).
    pub fn local_addrs(&self) -> Vec<SocketAddr> {
        self.supervisor.local_addrs()
    }

    /// The admin API's address, if it runs.
    pub fn admin_addr(&self) -> Option<SocketAddr> {
        self.admin_addr
    }

    /// The handle on its supervisor, which the admin API holds: reloads, overrides, and
    /// what is in force.
    pub fn supervisor(&self) -> &Arc<Supervisor> {
        &self.supervisor
    }

    /// The pools, in configuration order.
    pub fn pools(&self) -> Arc<Vec<Arc<PoolRt>>> {
        self.supervisor.pools()
    }

    /// The pool named `name`.
    pub fn pool(&self, name: &str) -> Option<Arc<PoolRt>> {
        self.supervisor.pool(name)
    }

    /// A new receiver of health events.
    pub fn subscribe(&self) -> broadcast::Receiver<Notice> {
        self.supervisor.subscribe()
    }

    /// Client connections currently open.
    pub fn open_connections(&self) -> usize {
        self.supervisor.open_connections()
    }

    /// Client connections parked now: HTTP/1 connections quiet between requests, whose
    /// hyper state (and its buffers) is released until their next bytes (see `downstream/mod.rs`).
    pub fn parked_connections(&self) -> usize {
        self.supervisor
            .metrics()
            .families()
            .parked()
            .load(std::sync::atomic::Ordering::Relaxed)
    }

    /// Times a client connection was parked (see [`Balancer::parked_connections`]).
    pub fn parks(&self) -> u64 {
        self.supervisor
            .metrics()
            .families()
            .parks()
            .load(std::sync::atomic::Ordering::Relaxed)
    }

    /// Applies a new configuration; see [`Supervisor::reload`].
    pub async fn reload(&self, config: &Config) -> Result<ReloadSummary, StartError> {
        self.supervisor.reload(config).await
    }

    /// Stops accepting, lets open connections finish their requests for up to `deadline`, then
    /// stops everything. Once it returns, the listening sockets are closed: a new connection is
    /// refused.
    pub async fn shutdown(mut self, deadline: Duration) {
        // The duplicates would keep the sockets open (and queueing) after the accept loops end.
        self.admin_offer = None;
        self.admin_held = None;
        // Wait for the accept loops to end, which drops their sockets. Aborting them in `Drop`
        // is not enough: until a worker drops the aborted task, the kernel keeps queueing new
        // connections on the socket, to reset them later.
        let accept_loops = self.supervisor.stop_accepting().await;
        // `deadline` is public input (callers other than the config loader, which caps it at a
        // year): saturate rather than panic on an overflowing clock reading.
        let now = tokio::time::Instant::now();
        let end = now
            .checked_add(deadline)
            .or_else(|| now.checked_add(crate::config::MAX_DURATION))
            .unwrap_or(now);
        // A clean stop leaves the fleet group now: the others re-own its backends at once.
        self.supervisor.release_fleet(end).await;
        let accept_loops = accept_loops.into_iter().chain(self.admin_task.take());
        for mut task in accept_loops {
            if tokio::time::timeout_at(end, &mut task).await.is_err() {
                task.abort();
            }
        }
        while self.supervisor.open_connections() > 0 && tokio::time::Instant::now() < end {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        let left = self.supervisor.open_connections();
        if left > 0 {
            tracing::warn!(
                connections = left,
                "shutdown deadline reached with connections still open; closing them"
            );
        }
        // The access logs write the lines of the requests served: until the deadline, and at
        // least ACCESS_LOG_GRACE after the connections closed (a deadline spent waiting for
        // connections must not cost the lines of the requests that did end).
        let flush_until = end.max(tokio::time::Instant::now() + ACCESS_LOG_GRACE);
        if !self.supervisor.flush_access_logs(flush_until).await {
            tracing::warn!("shutdown: the access log could not write all its lines in time");
        }
        // Drop runs the rest.
    }
}

/// How long shutdown waits at least for the access logs to write their last lines.
const ACCESS_LOG_GRACE: Duration = Duration::from_secs(2);

impl Drop for Balancer {
    fn drop(&mut self) {
        self.supervisor.abort();
        if let Some(task) = self.admin_task.take() {
            task.abort();
        }
    }
}
