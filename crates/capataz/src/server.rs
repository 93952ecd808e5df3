//! Starting and stopping a balancer: bind every listener first, then build the pools, start
//! their probes and timers, and serve.
//!
//! Binding comes first so a config that cannot start (an address in use) leaves nothing half
//! running. Each client connection is served by hyper's HTTP/1 server with upgrades; a
//! connection that sits idle longer than the listener's idle timeout is closed gracefully.
//!
//! [`Balancer`] is the top of the crate: it starts the live state ([`Shared`], in
//! `crate::shared`) and the admin listener, which serves that state.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::broadcast;
use tokio::task::JoinHandle;

use crate::config::Config;
use crate::health::{Event, PoolRt};
use crate::shared::{bind, bind_listener};
pub use crate::shared::{ReloadSummary, Shared, StartError};

/// A running balancer. Dropping it stops everything it started.
#[derive(Debug)]
pub struct Balancer {
    shared: Arc<Shared>,
    admin_addr: Option<SocketAddr>,
    admin_task: Option<JoinHandle<()>>,
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
        for (index, listener) in config.listeners.iter().enumerate() {
            sockets.push(bind_listener(index, listener)?);
        }
        let admin_socket = match &config.admin {
            Some(admin) => Some(bind(admin.address).map_err(|error| StartError::Bind {
                name: "admin".into(),
                key: "admin.address".into(),
                address: admin.address,
                error,
            })?),
            None => None,
        };
        let shared = Shared::start(config, events, path, sockets);
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
        self.shared.local_addrs()
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
        self.shared.subscribe()
    }

    /// Client connections currently open.
    pub fn open_connections(&self) -> usize {
        self.shared.open_connections()
    }

    /// Applies a new configuration; see [`Shared::reload`].
    pub async fn reload(&self, config: &Config) -> Result<ReloadSummary, StartError> {
        self.shared.reload(config).await
    }

    /// Stops accepting, lets open connections finish their requests for up to `deadline`, then
    /// stops everything. Once it returns, the listening sockets are closed: a new connection is
    /// refused.
    pub async fn shutdown(mut self, deadline: Duration) {
        // Wait for the accept loops to end, which drops their sockets. Aborting them in `Drop`
        // is not enough: until a worker drops the aborted task, the kernel keeps queueing new
        // connections on the socket, to reset them later.
        let accept_loops = self.shared.stop_accepting();
        // `deadline` is public input (callers other than the config loader, which caps it at a
        // year): saturate rather than panic on an overflowing clock reading.
        let now = tokio::time::Instant::now();
        let end = now
            .checked_add(deadline)
            .or_else(|| now.checked_add(crate::config::MAX_DURATION))
            .unwrap_or(now);
        let accept_loops = accept_loops.into_iter().chain(self.admin_task.take());
        for mut task in accept_loops {
            if tokio::time::timeout_at(end, &mut task).await.is_err() {
                task.abort();
            }
        }
        while self.shared.open_connections() > 0 && tokio::time::Instant::now() < end {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        let left = self.shared.open_connections();
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
        if !self.shared.flush_access_logs(flush_until).await {
            tracing::warn!("shutdown: the access log could not write all its lines in time");
        }
        // Drop runs the rest.
    }
}

/// How long shutdown waits at least for the access logs to write their last lines.
const ACCESS_LOG_GRACE: Duration = Duration::from_secs(2);

impl Drop for Balancer {
    fn drop(&mut self) {
        self.shared.abort();
        if let Some(task) = self.admin_task.take() {
            task.abort();
        }
    }
}
