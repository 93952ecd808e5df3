//! The live state of one balancer: its configuration, pools, listeners, alert hooks, fleet
//! task and membership tasks, owned by one supervisor task ([`task`]) that applies every
//! change (reloads, overrides, membership updates, stopping) as a command, one at a time,
//! and publishes what the others read as a [`Snapshot`].
//!
//! [`Supervisor`] is the handle the listeners' tasks, the admin API and the server hold: it
//! reads the snapshot without a lock, holds what never changes (the metrics, the event
//! broadcast, the clock, the access logs), and sends the commands. The supervisor ends when
//! the balancer stops ([`Supervisor::abort`], or every handle gone); a command sent after that
//! gets [`Stopped`].
//!
//! It has a module of its own so that the admin API (which reads and reloads it) and the
//! server (which starts it and the admin listener) both depend on it and not on each other:
//! `supervisor` -> `admin` -> `server`. `task.rs` runs the supervisor, `ordered.rs` hands it
//! the reloads (reading their files) and membership updates in order, `listener.rs` binds and
//! runs the client listeners, `reload.rs` applies a new configuration, `sources.rs` follows
//! the pools' backend sources.

mod admission;
mod http3;
mod listener;
mod ordered;
mod reload;
mod sources;
mod task;
#[cfg(test)]
mod tests;
mod unix_listen;

use std::io;
use std::net::SocketAddr;
use std::os::fd::OwnedFd;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use arc_swap::ArcSwap;
use tokio::sync::{broadcast, mpsc, oneshot, watch};
use tokio::task::JoinHandle;

use crate::alerts::AlertStats;
use crate::config::Config;
use crate::events::OverrideKind;
use crate::fleet::FleetRt;
use crate::health::{Clock, Notice, OverrideError, PoolRt};
use crate::metrics::Metrics;
pub use http3::http3_address;
pub use listener::{bind, bind_listener};
pub use reload::ReloadSummary;
use task::Command;
pub use unix_listen::{
    adopt_unix, bind_error as unix_bind_error, bind_unix, ClientSocket, SocketFile,
};

/// A handle on the supervisor of one balancer, which the listeners, the admin API and the
/// server share.
#[derive(Debug)]
pub struct Supervisor {
    /// What the supervisor published last: read without a lock, replaced whole.
    snapshot: ArcSwap<Snapshot>,
    /// The supervisor's commands; bounded, so a flood of admin calls waits for room instead of
    /// growing a queue.
    commands: mpsc::Sender<Command>,
    /// Raised by [`Supervisor::abort`]: the supervisor stops everything and ends.
    aborted: watch::Sender<bool>,
    /// Reloads and membership updates, to the ordered lane ([`ordered`]) that reads the
    /// files and hands them to the supervisor in order; bounded like `commands`.
    ordered: mpsc::Sender<ordered::Ordered>,
    /// Whether the balancer was started from a file (which reloads read again).
    from_file: bool,
    events: broadcast::Sender<Notice>,
    clock: Clock,
    /// This balancer's metrics, whose families every pool takes its handles from. The latency
    /// histograms' scope is read at start and kept across reloads.
    metrics: Arc<Metrics>,
    /// The listeners' access logs, kept across reloads.
    access_logs: crate::access_log::AccessLogs,
    /// The HTTP-01 tokens the ACME tasks are having validated, which every plaintext listener
    /// answers; kept across reloads.
    http01: Arc<crate::acme::Http01Tokens>,
    shutdown: watch::Sender<bool>,
    /// Whether the client listeners accept: false in a process taking over from an upgrading
    /// one until its backends are decided ([`Supervisor::open`]); true otherwise.
    accepting: watch::Sender<bool>,
    connections: Arc<AtomicUsize>,
    /// The worker threads the accept loops hand their connections to.
    workers: crate::workers::Workers,
    /// The recent past the dashboard shows (events, series, timelines), kept by a task of its
    /// own (`history::run`).
    history: Arc<crate::history::History>,
    /// Shared probing: who probes which backend (every pool asks it), and the task keeping it
    /// current with the settings it runs with (while `[fleet]` is on).
    fleet: Arc<FleetRt>,
    /// Test hook: a reload's pool build waits while a test holds it (to show what goes on
    /// meanwhile); `building` counts the builds that reached it.
    #[cfg(test)]
    build_gate: tokio::sync::RwLock<()>,
    #[cfg(test)]
    building: AtomicUsize,
}

/// What the supervisor publishes: everything readers need of the state it owns, consistent
/// with itself (a reload's pools and listeners come with the configuration they were built
/// from once it ends).
#[derive(Debug, Clone)]
pub(crate) struct Snapshot {
    /// The configuration in force.
    config: Arc<Config>,
    /// The pools, in configuration order.
    pools: Arc<Vec<Arc<PoolRt>>>,
    /// The client listeners running, in configuration order.
    listeners: Arc<Vec<Listening>>,
    /// The alert hooks' delivery counters (`None` when no hook runs).
    alert_stats: Option<Arc<AlertStats>>,
}

/// A running client listener, as readers see it.
#[derive(Debug)]
pub(crate) struct Listening {
    /// The address it was configured with.
    address: SocketAddr,
    /// The address it bound.
    local: SocketAddr,
    /// The socket path of a listener on a Unix socket.
    unix: Option<std::path::PathBuf>,
    /// A duplicate of the listening socket's descriptor, which a binary upgrade offers to the
    /// new process; `None` if it could not be made (out of descriptors): an upgrade is then
    /// refused. Dropped once no snapshot lists the listener, so a stopped listener's socket
    /// closes.
    offer: Option<Arc<OwnedFd>>,
    /// The HTTP/3 endpoint's UDP socket, offered as `offer` is: the address it was asked to
    /// bind, the one it bound, and a duplicate of its descriptor.
    http3: Option<(SocketAddr, SocketAddr, Arc<OwnedFd>)>,
    /// What its connections read, for `/status`'s view of it.
    state: Arc<arc_swap::ArcSwap<listener::ListenerState>>,
}

impl Listening {
    /// The address it bound (its port, when configured as 0), or `unix:/path`.
    fn shown_address(&self) -> String {
        match &self.unix {
            Some(path) => format!("unix:{}", path.display()),
            None => self.local.to_string(),
        }
    }
}

/// The supervisor has stopped (the balancer stopped): a command can no longer be applied.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("the balancer has stopped")]
pub struct Stopped;

/// Why an override could not be set or cleared.
#[derive(Debug, thiserror::Error)]
pub enum OverrideRefused {
    /// No pool of that name.
    #[error("no pool named {0:?}")]
    NoPool(String),
    /// No such backend in the pool.
    #[error(transparent)]
    Backend(#[from] OverrideError),
    /// The balancer has stopped.
    #[error(transparent)]
    Stopped(#[from] Stopped),
}

/// Why a balancer could not start, or a reload was refused.
#[derive(Debug, thiserror::Error)]
pub enum StartError {
    /// A listener could not bind its address. The message names the key (or flag) to change
    /// and says what to do, once (the OS error is part of it, not a separate cause).
    #[error("{}", bind_message(.key, *.address, .error))]
    Bind {
        /// The listener's name.
        name: String,
        /// The key (`listeners[0].address`, `admin.address`) or flag (`--listen`) that set it.
        key: String,
        /// Its address.
        address: SocketAddr,
        /// The OS error.
        error: io::Error,
    },
    /// A listener could not bind its HTTP/3 UDP socket.
    #[error("{}", udp_bind_message(.key, *.address, .error))]
    BindUdp {
        /// The listener's name.
        name: String,
        /// The key that sets its port (`listeners[0].tls.http3.port`).
        key: String,
        /// The UDP address.
        address: SocketAddr,
        /// The OS error.
        error: io::Error,
    },
    /// A listener could not bind its Unix socket path.
    #[error(
        "{key} unix:{path}: cannot listen there: {error} (change {key}, or make the path free)"
    )]
    BindUnix {
        /// The key that set it (`listeners[0].address`).
        key: String,
        /// The socket path.
        path: String,
        /// Why.
        error: io::Error,
    },
    /// The new configuration is invalid.
    #[error("{0}")]
    Config(#[from] crate::config::ConfigError),
    /// The new configuration file is invalid: every error found in it, in file order.
    #[error("{}", errors_message(.0))]
    Configs(crate::config::ConfigErrors),
    /// A reload needs a file, and the balancer was started from text.
    #[error("this balancer was not started from a file, so there is nothing to reload")]
    NoFile,
    /// The balancer is shutting down: a reload would bind listeners it is closing.
    #[error("the balancer is shutting down")]
    ShuttingDown,
    /// The balancer has stopped: there is nothing left to reload.
    #[error(transparent)]
    Stopped(#[from] Stopped),
    /// Loading or applying the new configuration panicked (a bug).
    #[error(
        "reloading the configuration failed unexpectedly (a bug in capataz; please report it)"
    )]
    ReloadPanicked,
}

/// Every error of an invalid file on one line: the error itself when there is one, else
/// "N errors: FIRST; SECOND; ...".
fn errors_message(errors: &crate::config::ConfigErrors) -> String {
    if errors.len() == 1 {
        return errors.first().to_string();
    }
    let all: Vec<String> = errors.iter().map(ToString::to_string).collect();
    format!("{} errors: {}", errors.len(), all.join("; "))
}

/// Why `address` (set by `key`) could not be listened on, and what to do about it.
fn bind_message(key: &str, address: SocketAddr, error: &io::Error) -> String {
    match error.kind() {
        io::ErrorKind::AddrInUse => format!(
            "{key} {address} is in use (another process listens there: pick another port or \
             stop it)"
        ),
        io::ErrorKind::PermissionDenied => format!(
            "{key} {address}: permission denied (a port below 1024 needs privileges: pick a \
             port above 1023, or grant the process CAP_NET_BIND_SERVICE)"
        ),
        io::ErrorKind::AddrNotAvailable => format!(
            "{key} {address} is not an address of this host (use one of its addresses, \
             0.0.0.0 or [::])"
        ),
        _ => format!("{key} {address}: cannot listen there: {error} (change {key})"),
    }
}

/// Why UDP `address` (HTTP/3, its port set by `key`) could not be bound, and what to do.
fn udp_bind_message(key: &str, address: SocketAddr, error: &io::Error) -> String {
    match error.kind() {
        io::ErrorKind::AddrInUse => format!(
            "{key}: UDP {address} (HTTP/3) is in use (another process holds it: pick another \
             port or stop it)"
        ),
        _ => format!("{key}: UDP {address} (HTTP/3): cannot listen there: {error} (change {key})"),
    }
}

/// Sends `channel` the message `make` builds around a reply slot and waits for the reply;
/// [`Stopped`] once the receiver has ended (also for a message it dropped unanswered).
async fn ask_on<M, T>(
    channel: &mpsc::Sender<M>,
    make: impl FnOnce(oneshot::Sender<T>) -> M,
) -> Result<T, Stopped> {
    let (reply, answer) = oneshot::channel();
    channel.send(make(reply)).await.map_err(|_| Stopped)?;
    answer.await.map_err(|_| Stopped)
}

impl Supervisor {
    /// Asks the supervisor to run the command `make` builds around a reply slot, and waits for
    /// the reply; [`Stopped`] once the supervisor has ended (also for a command it dropped
    /// unanswered while ending).
    async fn ask<T>(&self, make: impl FnOnce(oneshot::Sender<T>) -> Command) -> Result<T, Stopped> {
        ask_on(&self.commands, make).await
    }

    /// Like [`Supervisor::ask`], through the ordered lane.
    async fn ask_in_order<T>(
        &self,
        make: impl FnOnce(oneshot::Sender<T>) -> ordered::Ordered,
    ) -> Result<T, Stopped> {
        ask_on(&self.ordered, make).await
    }

    /// Re-reads the file the balancer was started from and applies it (see
    /// [`Supervisor::reload`]). Reading, parsing, validating and resolving the file (a slow
    /// disk, a FIFO, a slow resolver, a costly value) run on tokio's blocking pool, as the pool
    /// build does, never on a runtime thread that requests and probes need; one file is read
    /// at a time, in the order the reloads were asked, in the ordered lane, so a read that
    /// takes long holds back the reloads and membership updates asked after it, not the
    /// overrides.
    pub async fn reload_from_file(&self) -> Result<ReloadSummary, StartError> {
        if !self.from_file {
            self.metrics.reloaded(false);
            return Err(StartError::NoFile);
        }
        self.ask_in_order(ordered::Ordered::ReloadFile).await?
    }

    /// Applies a new, validated configuration without dropping a connection: new listeners are
    /// bound first (a failure changes nothing), then every pool is rebuilt. A backend with the
    /// same pool, name and address keeps its health state, streaks and records; a new one
    /// starts DOWN until it passes `rise` probes where the pool gates new backends; a removed
    /// one gets no new requests and is dropped once its in-flight requests finish. Changing the
    /// admin address or `admin.metrics_backend_histograms` needs a restart. Reloads apply one
    /// at a time, in the order they were asked for (the supervisor's commands); the work runs
    /// on tokio's blocking pool, not on a runtime thread (a pool of thousands of backends takes
    /// a while to build). Once asked, a reload applies whole even if the caller stops waiting.
    pub async fn reload(&self, config: &Config) -> Result<ReloadSummary, StartError> {
        let config = Box::new(config.clone());
        self.ask_in_order(|reply| ordered::Ordered::Reload(config, reply))
            .await?
    }

    /// Sets (`Some`) or clears (`None`) a manual override on backend `backend` of pool `pool`
    /// (see [`PoolRt::set_override`]), returning the backend's new state. Sent to the
    /// supervisor directly, not through the ordered lane: one sent while a reload builds lands
    /// on the new pools; one sent while a reload's file is still being read lands on the pools
    /// in force, which that reload then carries over.
    pub async fn set_override(
        &self,
        pool: &str,
        backend: &str,
        kind: Option<OverrideKind>,
        ttl: Option<Duration>,
    ) -> Result<&'static str, OverrideRefused> {
        self.ask(|reply| Command::SetOverride {
            pool: pool.to_owned(),
            backend: backend.to_owned(),
            kind,
            ttl,
            reply,
        })
        .await?
    }

    /// Lets the client listeners accept (they wait for it in a process started held).
    /// Starts the alert hooks too, which a held process does not run before.
    pub async fn open(&self) {
        let _ = self.ask(|reply| Command::Open { reply }).await;
    }

    /// Tells everything to shut down and the client listeners to stop accepting; returns their
    /// accept loops, which end once their sockets are dropped.
    pub async fn stop_accepting(&self) -> Vec<JoinHandle<()>> {
        let _ = self.shutdown.send(true);
        self.ask(|reply| Command::StopAccepting { reply })
            .await
            .unwrap_or_default()
    }

    /// Revokes the fleet lease this instance held (its task is stopped by
    /// [`Supervisor::stop_accepting`]), waiting until `end` at the latest: a clean stop hands
    /// its backends over to the rest of the group at once instead of one lease later.
    pub async fn release_fleet(&self, end: tokio::time::Instant) {
        let _ = self.ask(|reply| Command::StopFleet { reply }).await;
        if let Some(held) = self.fleet.take_held() {
            let _ = tokio::time::timeout_at(end, crate::fleet::run::revoke(&held)).await;
        }
    }

    /// Stops everything at once: the supervisor stops the listeners and the pools', sources'
    /// and fleet tasks, and ends (after the reload or update it may be applying).
    pub fn abort(&self) {
        let _ = self.shutdown.send(true);
        let _ = self.aborted.send(true);
    }

    /// Publishes `change` made to the snapshot in force (only the supervisor publishes, so
    /// nothing is lost between the load and the store).
    fn publish(&self, change: impl FnOnce(&mut Snapshot)) {
        let mut next = Snapshot::clone(&self.snapshot.load());
        change(&mut next);
        self.snapshot.store(Arc::new(next));
    }

    /// Shared probing's runtime (it owns every backend without `[fleet]`).
    pub fn fleet(&self) -> &Arc<FleetRt> {
        &self.fleet
    }

    /// The `fleet` object of `/status`, with `[fleet]` on.
    pub fn fleet_status(&self) -> Option<serde_json::Value> {
        self.fleet.status(&self.pools())
    }

    /// The pools, in configuration order.
    pub fn pools(&self) -> Arc<Vec<Arc<PoolRt>>> {
        self.snapshot.load().pools.clone()
    }

    /// The pool named `name`.
    pub fn pool(&self, name: &str) -> Option<Arc<PoolRt>> {
        let snapshot = self.snapshot.load();
        snapshot.pools.iter().find(|p| &*p.name == name).cloned()
    }

    /// A new receiver of health events.
    pub fn subscribe(&self) -> broadcast::Receiver<Notice> {
        self.events.subscribe()
    }

    /// The recent past: events, series and timelines.
    pub fn history(&self) -> &crate::history::History {
        &self.history
    }

    /// The alert hooks' delivery counters (`None` when no hook is configured).
    pub fn alert_stats(&self) -> Option<Arc<AlertStats>> {
        self.snapshot.load().alert_stats.clone()
    }

    /// This balancer's metrics (its own registry: nothing shared with another balancer).
    pub fn metrics(&self) -> Arc<Metrics> {
        self.metrics.clone()
    }

    /// The HTTP-01 tokens being validated, which the plaintext listeners answer.
    pub fn http01(&self) -> &Arc<crate::acme::Http01Tokens> {
        &self.http01
    }

    /// The configuration in force.
    pub fn config(&self) -> Arc<Config> {
        self.snapshot.load().config.clone()
    }

    /// The runtime clock.
    pub fn clock(&self) -> Clock {
        self.clock
    }

    /// A receiver that turns true when the balancer shuts down.
    pub fn shutdown_signal(&self) -> watch::Receiver<bool> {
        self.shutdown.subscribe()
    }

    /// The addresses the client listeners bound, in configuration order.
    pub fn local_addrs(&self) -> Vec<SocketAddr> {
        let snapshot = self.snapshot.load();
        snapshot.listeners.iter().map(|l| l.local).collect()
    }

    /// The client listeners' views for `/status`, in the config's order: their connections
    /// now, read from the gauge their accept loops compare with `max_connections`.
    pub fn listener_views(&self) -> Vec<crate::status::ListenerView> {
        let snapshot = self.snapshot.load();
        snapshot
            .listeners
            .iter()
            .map(|listening| {
                let state = listening.state.load();
                let config = &state.config;
                let address = listening.shown_address();
                let mode = if config.tcp.is_some() { "tcp" } else { "http" };
                let open = u64::try_from(state.proxy.metrics().open_now()).unwrap_or(0);
                crate::status::ListenerView::new(
                    (config.name.clone(), address, mode),
                    open,
                    config.max_connections,
                    state.limit_reached.as_ref().map(|reached| reached.get()),
                )
            })
            .collect()
    }

    /// Whether the client listeners accept connections.
    pub fn accepting(&self) -> bool {
        *self.accepting.borrow()
    }

    /// Duplicates of the client listeners' sockets, with the addresses they were configured
    /// with and bound to, for a binary upgrade to hand over: the listeners in force now (a
    /// reload under way is not waited for; the new process reads the file itself and binds
    /// what it does not inherit).
    pub fn offer_listeners(&self) -> io::Result<Vec<crate::handover::Offered>> {
        let snapshot = self.snapshot.load();
        let http3 = snapshot.listeners.iter().filter_map(|l| l.http3.as_ref());
        let http3 = http3.map(|(configured, bound, fd)| {
            Ok(crate::handover::Offered {
                kind: crate::handover::Kind::Http3,
                unix: None,
                configured: *configured,
                bound: *bound,
                fd: fd.try_clone()?,
            })
        });
        snapshot
            .listeners
            .iter()
            .map(|l| {
                let kind = match &l.unix {
                    Some(_) => crate::handover::Kind::Unix,
                    None => crate::handover::Kind::Listener,
                };
                Ok(crate::handover::Offered {
                    kind,
                    unix: l.unix.clone(),
                    configured: l.address,
                    bound: l.local,
                    fd: match &l.offer {
                        Some(fd) => fd.try_clone()?,
                        None => {
                            return Err(io::Error::other(format!(
                                "the socket of the listener on {} could not be duplicated at \
                                 its start",
                                l.shown_address()
                            )))
                        }
                    },
                })
            })
            .chain(http3)
            .collect()
    }

    /// Client connections currently open.
    pub fn open_connections(&self) -> usize {
        self.connections.load(Ordering::Relaxed)
    }

    /// Waits, until `deadline` at the latest, for the access logs to have written every line
    /// handed to them; whether they did.
    pub async fn flush_access_logs(&self, deadline: tokio::time::Instant) -> bool {
        self.access_logs.flush(deadline).await
    }
}
