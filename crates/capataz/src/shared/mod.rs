//! The live state of one balancer ([`Shared`]): its configuration, pools, listeners, events,
//! alert hooks and metrics, shared by the listeners, the admin API and reloads.
//!
//! It has a module of its own so that the admin API (which reads and reloads it) and the
//! server (which starts it and the admin listener) both depend on it and not on each other:
//! `shared` -> `admin` -> `server`. `listener.rs` binds and runs the client listeners,
//! `reload.rs` applies a new configuration.

mod listener;
mod reload;
mod sources;
#[cfg(test)]
mod tests;

use std::io;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, Weak};
use std::time::Duration;

use arc_swap::ArcSwap;
use tokio::net::TcpListener;
use tokio::sync::{broadcast, watch};
use tokio::task::JoinHandle;

use crate::alerts::{AlertStats, Alerts};
use crate::config::Config;
use crate::config::FleetConfig;
use crate::events::OverrideKind;
use crate::fleet::FleetRt;
use crate::health::{Clock, Event, OverrideError, PoolRt, PoolTasks};
use crate::metrics::{HistogramScope, Metrics};
use listener::ListenerRt;
pub(crate) use listener::{bind, bind_listener};
pub use reload::ReloadSummary;

/// What the listeners, the admin API and reloads share.
#[derive(Debug)]
pub struct Shared {
    /// Itself, for the tasks it starts (membership tasks end once it is gone).
    me: Weak<Shared>,
    config: Mutex<Arc<Config>>,
    config_path: Option<PathBuf>,
    pools: ArcSwap<Vec<Arc<PoolRt>>>,
    /// The pools' tasks (probes, timer), by pool name.
    pool_tasks: Mutex<Vec<(Arc<str>, PoolTasks)>>,
    /// One task per pool whose backends come from a source (DNS or etcd).
    membership_tasks: Mutex<sources::MembershipTasks>,
    listeners: Mutex<Vec<ListenerRt>>,
    events: broadcast::Sender<Event>,
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
    /// one until its backends are decided ([`Shared::open`]); true otherwise.
    accepting: watch::Sender<bool>,
    connections: Arc<AtomicUsize>,
    /// Held from the start of a reload to its end: reloads apply one at a time, in order.
    reload_lock: Arc<tokio::sync::Mutex<()>>,
    /// Held while a reload builds the new pools from the old ones and swaps them in, and while
    /// an override is set: an override set meanwhile on a pool being replaced would be lost.
    /// A tokio mutex: an override waits for a reload's pool build without holding a runtime
    /// thread; the build takes it with `blocking_lock` on the blocking pool.
    swap_lock: tokio::sync::Mutex<()>,
    alerts: Mutex<Option<Alerts>>,
    /// The recent past the dashboard shows (events, series, timelines), kept by a task of its
    /// own (`history::run`).
    history: Arc<crate::history::History>,
    /// Shared probing: who probes which backend (every pool asks it), and the task keeping it
    /// current with the settings it runs with (while `[fleet]` is on).
    fleet: Arc<FleetRt>,
    fleet_task: Mutex<Option<(FleetConfig, JoinHandle<()>)>>,
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

impl Shared {
    /// The state of a balancer for `config`, remembering `path` for reloads, serving the
    /// client listeners `sockets` (bound from `config.listeners`, in order): builds the pools
    /// and the metrics, starts the pools' tasks, the alert hooks and the listeners. Must be
    /// called within a tokio runtime.
    #[cfg(test)]
    pub(crate) fn start(
        config: &Config,
        events: broadcast::Sender<Event>,
        path: Option<PathBuf>,
        sockets: Vec<TcpListener>,
    ) -> Arc<Shared> {
        Shared::start_as(config, events, path, sockets, false)
    }

    /// Like [`Shared::start`]; with `held` (a process taking over from an upgrading one) the
    /// listeners do not accept and the alert hooks do not run until [`Shared::open`], and
    /// every probed backend starts DOWN with its first probe deciding (`initial =
    /// "first-probe"`), so that nothing is sent to a backend this process has not seen pass.
    pub(crate) fn start_as(
        config: &Config,
        events: broadcast::Sender<Event>,
        path: Option<PathBuf>,
        sockets: Vec<TcpListener>,
        held: bool,
    ) -> Arc<Shared> {
        let clock = Clock::start();
        let metrics = Arc::new(Metrics::new(HistogramScope::of(config)));
        metrics.families().tls().set_certificates(config);
        let pools: Vec<Arc<PoolRt>> = config
            .pools
            .iter()
            .map(|pool| {
                let mut pool = pool.clone();
                if held {
                    pool.active.initial = capataz_health::State::Down;
                    pool.active.first_probe = true;
                }
                PoolRt::new(pool, events.clone(), clock, None, false, metrics.families())
            })
            .collect();
        let pool_tasks = pools
            .iter()
            .map(|pool| (pool.name.clone(), pool.start_tasks(&pools)))
            .collect();
        let (shutdown, _) = watch::channel(false);
        let (accepting, _) = watch::channel(!held);
        let shared = Arc::new_cyclic(|me| Shared {
            me: me.clone(),
            config: Mutex::new(Arc::new(config.clone())),
            config_path: path,
            pools: ArcSwap::from_pointee(pools),
            pool_tasks: Mutex::new(pool_tasks),
            membership_tasks: Mutex::new(Vec::new()),
            listeners: Mutex::new(Vec::new()),
            events,
            clock,
            metrics,
            access_logs: Default::default(),
            http01: crate::acme::Http01Tokens::new(),
            shutdown,
            accepting,
            connections: Arc::new(AtomicUsize::new(0)),
            reload_lock: Arc::new(tokio::sync::Mutex::new(())),
            swap_lock: tokio::sync::Mutex::new(()),
            alerts: Mutex::new(None),
            history: Arc::default(),
            fleet: FleetRt::new(Arc::default()),
            fleet_task: Mutex::new(None),
        });
        let me = Arc::downgrade(&shared);
        tokio::spawn(crate::history::run(
            shared.history.clone(),
            shared.events.subscribe(),
            move || me.upgrade().map(|shared| shared.pools()),
            shared.shutdown_signal(),
        ));
        // A held process's first verdicts re-establish what the old process knew: its alert
        // hooks start when it takes over, not to page anyone for them.
        if !held {
            shared.restart_alerts(config);
        }
        let pools = shared.pools.load_full();
        shared.restart_membership(&pools, &Default::default());
        let mut listeners = Vec::new();
        for (listener, socket) in config.listeners.iter().zip(sockets) {
            listeners.push(shared.spawn_listener(listener, socket, &pools));
        }
        *lock(&shared.listeners) = listeners;
        shared.restart_fleet(config);
        shared
    }

    /// Starts, restarts or stops shared probing for `config`'s `[fleet]` (kept running when
    /// its settings did not change). Every pool asks the fleet runtime before each probe;
    /// without `[fleet]` it owns every backend.
    pub(crate) fn restart_fleet(&self, config: &Config) {
        let mut running = lock(&self.fleet_task);
        if running.as_ref().map(|(settings, _)| settings) == config.fleet.as_ref() {
            return;
        }
        if let Some((_, task)) = running.take() {
            task.abort();
        }
        // The old registration must not outlive the old task: the new task revokes it before
        // registering (it would hold this instance's name for one more lease), or, with no new
        // task, a task of its own does.
        let previous = self.fleet.take_held();
        for pool in self.pools.load().iter() {
            crate::fleet::run::attach(&pool.probing, &self.fleet);
        }
        self.fleet.set_cut_off(false);
        self.fleet.published().clear();
        let Some(settings) = config.fleet.clone() else {
            if let Some(held) = previous {
                tokio::spawn(async move { crate::fleet::run::revoke(&held).await });
            }
            self.fleet.set_group("", None);
            self.metrics.set_fleet(None);
            return;
        };
        let port = lock(&self.listeners).first().map_or(0, |l| l.local.port());
        let instance = settings
            .instance
            .clone()
            .unwrap_or_else(|| crate::fleet::default_instance(port));
        self.metrics.set_fleet(Some(self.fleet.counters().clone()));
        let me = self.me.clone();
        let task = crate::fleet::run::Task {
            fleet: self.fleet.clone(),
            config: settings.clone(),
            instance,
            pools: Box::new(move || me.upgrade().map(|shared| shared.pools())),
            events: self.events.clone(),
            revoke: previous,
        };
        *running = Some((settings, tokio::spawn(task.run())));
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
        self.pools.load_full()
    }

    /// The pool named `name`.
    pub fn pool(&self, name: &str) -> Option<Arc<PoolRt>> {
        self.pools.load().iter().find(|p| &*p.name == name).cloned()
    }

    /// Sets (`Some`) or clears (`None`) a manual override on backend `backend` of pool `pool`
    /// (see [`PoolRt::set_override`]); `None` if there is no such pool. Serialized with the pool
    /// swap of a reload, so the override lands on the pools that stay in force.
    pub async fn set_override(
        &self,
        pool: &str,
        backend: &str,
        kind: Option<OverrideKind>,
        ttl: Option<Duration>,
    ) -> Option<Result<&'static str, OverrideError>> {
        let _swap = self.swap_lock.lock().await;
        let pool = self.pool(pool)?;
        Some(pool.set_override(backend, kind, ttl))
    }

    /// A new receiver of health events.
    pub fn subscribe(&self) -> broadcast::Receiver<Event> {
        self.events.subscribe()
    }

    /// The recent past: events, series and timelines.
    pub fn history(&self) -> &crate::history::History {
        &self.history
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

    /// The addresses the client listeners bound, in configuration order.
    pub fn local_addrs(&self) -> Vec<SocketAddr> {
        lock(&self.listeners).iter().map(|l| l.local).collect()
    }

    /// Lets the client listeners accept (they wait for it in a process started held).
    /// Starts the alert hooks too, which a held process does not run before.
    pub(crate) fn open(&self) {
        if !self.accepting.send_replace(true) {
            self.restart_alerts(&self.config());
        }
    }

    /// Whether the client listeners accept connections.
    pub fn accepting(&self) -> bool {
        *self.accepting.borrow()
    }

    /// Duplicates of the client listeners' sockets, with the addresses they were configured
    /// with and bound to, for a binary upgrade to hand over: the listeners in force now (a
    /// reload under way is not waited for; the new process reads the file itself and binds
    /// what it does not inherit).
    pub(crate) fn offer_listeners(&self) -> io::Result<Vec<crate::handover::Offered>> {
        lock(&self.listeners)
            .iter()
            .map(|l| {
                Ok(crate::handover::Offered {
                    kind: crate::handover::Kind::Listener,
                    configured: l.address,
                    bound: l.local,
                    fd: match &l.offer {
                        Some(fd) => fd.try_clone()?,
                        None => {
                            return Err(io::Error::other(format!(
                                "the socket of the listener on {} could not be duplicated at \
                                 its start",
                                l.local
                            )))
                        }
                    },
                })
            })
            .collect()
    }

    /// Client connections currently open.
    pub fn open_connections(&self) -> usize {
        self.connections.load(Ordering::Relaxed)
    }

    /// Waits, until `deadline` at the latest, for the access logs to have written every line
    /// handed to them; whether they did.
    pub(crate) async fn flush_access_logs(&self, deadline: tokio::time::Instant) -> bool {
        self.access_logs.flush(deadline).await
    }

    /// Tells everything to shut down and the client listeners to stop accepting; returns their
    /// accept loops, which end once their sockets are dropped.
    pub(crate) fn stop_accepting(&self) -> Vec<JoinHandle<()>> {
        let _ = self.shutdown.send(true);
        for task in lock(&self.membership_tasks).drain(..) {
            task.abort();
        }
        if let Some((_, task)) = lock(&self.fleet_task).take() {
            task.abort();
        }
        let listeners = std::mem::take(&mut *lock(&self.listeners));
        for listener in &listeners {
            let _ = listener.stop.send(true);
        }
        listeners.into_iter().map(|l| l.task).collect()
    }

    /// Revokes the fleet lease this instance held (its task is stopped by
    /// [`Shared::stop_accepting`]), waiting until `end` at the latest: a clean stop hands its
    /// backends over to the rest of the group at once instead of one lease later.
    pub(crate) async fn release_fleet(&self, end: tokio::time::Instant) {
        if let Some((_, task)) = lock(&self.fleet_task).take() {
            task.abort();
        }
        if let Some(held) = self.fleet.take_held() {
            let _ = tokio::time::timeout_at(end, crate::fleet::run::revoke(&held)).await;
        }
    }

    /// Stops everything at once: the listeners and the pools' tasks.
    pub(crate) fn abort(&self) {
        let _ = self.shutdown.send(true);
        for listener in lock(&self.listeners).drain(..) {
            let _ = listener.stop.send(true);
            listener.task.abort();
        }
        for task in lock(&self.membership_tasks).drain(..) {
            task.abort();
        }
        if let Some((_, task)) = lock(&self.fleet_task).take() {
            task.abort();
        }
        for (_, tasks) in lock(&self.pool_tasks).drain(..) {
            tasks.abort();
        }
    }
}

fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    // Every holder leaves the value whole (plain pushes and swaps), so poison is harmless.
    mutex.lock().unwrap_or_else(|e| e.into_inner())
}
