//! The supervisor task: it owns what changes in a balancer (the listeners, the pools' tasks,
//! the membership tasks, the alert hooks, the fleet task) and applies the commands sent through
//! the [`Supervisor`] handle one at a time, in the order they were sent. That order is the
//! whole of the synchronisation: a reload applies whole before the next command (a later
//! reload, an override, a membership update) is taken, so reloads apply in order and an
//! override never lands on a pool being replaced. The slow work (reading the file, building
//! pools) runs on tokio's blocking pool while the supervisor awaits it, and the commands sent
//! meanwhile wait in the channel.

use std::panic::AssertUnwindSafe;
use std::path::PathBuf;
use std::sync::atomic::AtomicUsize;
use std::sync::{Arc, Weak};
use std::time::Duration;

use arc_swap::ArcSwap;
use tokio::runtime::Handle;
use tokio::sync::{broadcast, mpsc, oneshot, watch};
use tokio::task::JoinHandle;

use super::listener::ListenerRt;
use super::{
    ClientSocket, Listening, OverrideRefused, ReloadSummary, Snapshot, StartError, Supervisor,
};
use crate::alerts::Alerts;
use crate::config::{BackendConfig, Config, FleetConfig, PoolSource};
use crate::events::OverrideKind;
use crate::fleet::FleetRt;
use crate::health::{Clock, Notice, PoolRt, PoolTasks};
use crate::metrics::{HistogramScope, Metrics};
use crate::workers::Workers;

/// Room for commands waiting while one is applied: a sender beyond it waits for room.
const COMMANDS: usize = 64;

/// What the supervisor is asked to do, with where to reply.
#[derive(Debug)]
pub(super) enum Command {
    /// Apply this configuration (or answer why the file could not be read), from the ordered
    /// lane.
    Reload {
        config: Result<Box<Config>, StartError>,
        reply: ReloadReply,
    },
    SetOverride {
        pool: String,
        backend: String,
        kind: Option<OverrideKind>,
        ttl: Option<Duration>,
        reply: oneshot::Sender<Result<&'static str, OverrideRefused>>,
    },
    /// Put a source's membership in force in a pool: `(added, removed, total)`, or `None` when
    /// the pool is gone, follows another source now, or the balancer is shutting down. From
    /// the ordered lane.
    SetMembers {
        pool: String,
        source: PoolSource,
        members: Vec<BackendConfig>,
        reply: oneshot::Sender<Option<(usize, usize, usize)>>,
    },
    /// Let the listeners accept, and start the alert hooks of a balancer started held.
    Open { reply: oneshot::Sender<()> },
    /// Stop the listeners, the sources' tasks and the fleet task; the accept loops back.
    StopAccepting {
        reply: oneshot::Sender<Vec<JoinHandle<()>>>,
    },
    /// Stop the fleet task.
    StopFleet { reply: oneshot::Sender<()> },
}

/// Where a reload's outcome goes.
pub(super) type ReloadReply = oneshot::Sender<Result<ReloadSummary, StartError>>;

/// The state only the supervisor touches.
#[derive(Debug, Default)]
pub(super) struct Owned {
    pub(super) listeners: Vec<ListenerRt>,
    /// The pools' tasks (probes, timer), by pool name.
    pub(super) pool_tasks: Vec<(Arc<str>, PoolTasks)>,
    /// One task per pool whose backends come from a source (DNS or etcd).
    pub(super) membership_tasks: Vec<JoinHandle<()>>,
    pub(super) alerts: Option<Alerts>,
    pub(super) fleet_task: Option<(FleetConfig, JoinHandle<()>)>,
    /// The ordered lane's task (`ordered::run`), which reads the files of reloads.
    pub(super) lane: Option<JoinHandle<()>>,
}

impl Supervisor {
    /// The state of a balancer for `config`, remembering `path` for reloads, serving the
    /// client listeners `sockets` (bound from `config.listeners`, in order): builds the pools
    /// and the metrics, starts the pools' tasks, the alert hooks, the listeners and the
    /// supervisor. Must be called within a tokio runtime.
    #[cfg(test)]
    pub(crate) fn start(
        config: &Config,
        events: broadcast::Sender<Notice>,
        path: Option<PathBuf>,
        sockets: Vec<ClientSocket>,
    ) -> Arc<Supervisor> {
        Supervisor::start_as(config, events, path, sockets, (false, Workers::single()))
    }

    /// Like [`Supervisor::start`]; with `held` (a process taking over from an upgrading one)
    /// the listeners do not accept and the alert hooks do not run until [`Supervisor::open`],
    /// and every probed backend starts DOWN with its first probe deciding (`initial =
    /// "first-probe"`), so that nothing is sent to a backend this process has not seen pass.
    /// The accept loops hand their connections to `workers` (see [`crate::workers`]); they,
    /// and everything else the supervisor starts, run on the runtime it is called in.
    pub fn start_as(
        config: &Config,
        events: broadcast::Sender<Notice>,
        path: Option<PathBuf>,
        sockets: Vec<ClientSocket>,
        (held, workers): (bool, Workers),
    ) -> Arc<Supervisor> {
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
        let mut owned = Owned::default();
        owned.pool_tasks = pools
            .iter()
            .map(|pool| (pool.name.clone(), pool.start_tasks(&pools)))
            .collect();
        let (commands, receiver) = mpsc::channel(COMMANDS);
        let (ordered, asked) = mpsc::channel(COMMANDS);
        let from_file = path.is_some();
        let (aborted, aborted_rx) = watch::channel(false);
        let supervisor = Arc::new(Supervisor {
            snapshot: ArcSwap::from_pointee(Snapshot {
                config: Arc::new(config.clone()),
                pools: Arc::new(pools),
                listeners: Arc::default(),
                alert_stats: None,
            }),
            commands,
            aborted,
            ordered,
            from_file,
            events,
            clock,
            metrics,
            access_logs: Default::default(),
            http01: crate::acme::Http01Tokens::new(),
            shutdown: watch::channel(false).0,
            accepting: watch::channel(!held).0,
            connections: Arc::new(AtomicUsize::new(0)),
            workers,
            history: Arc::default(),
            fleet: FleetRt::new(Arc::default()),
            #[cfg(test)]
            build_gate: tokio::sync::RwLock::new(()),
            #[cfg(test)]
            building: AtomicUsize::new(0),
        });
        let me = Arc::downgrade(&supervisor);
        tokio::spawn(crate::history::run(
            supervisor.history.clone(),
            supervisor.events.subscribe(),
            move || me.upgrade().map(|supervisor| supervisor.pools()),
            supervisor.shutdown_signal(),
        ));
        // A held process's first verdicts re-establish what the old process knew: its alert
        // hooks start when it takes over, not to page anyone for them.
        if !held {
            owned.restart_alerts(&supervisor, config);
        }
        let pools = supervisor.pools();
        owned.restart_membership(&supervisor, &pools, &Default::default());
        for (listener, socket) in config.listeners.iter().zip(sockets) {
            let listener = supervisor.spawn_listener(listener, socket, &pools);
            owned.listeners.push(listener);
        }
        owned.publish_listeners(&supervisor);
        owned.restart_fleet(&supervisor, config);
        owned.lane = Some(tokio::spawn(super::ordered::run(
            Arc::downgrade(&supervisor),
            path,
            asked,
            supervisor.shutdown_signal(),
        )));
        tokio::spawn(run(
            Arc::downgrade(&supervisor),
            owned,
            receiver,
            aborted_rx,
        ));
        supervisor
    }
}

/// The supervisor: applies `commands` in order until the balancer is aborted or every handle
/// is gone, then stops everything it owns.
async fn run(
    me: Weak<Supervisor>,
    mut owned: Owned,
    mut commands: mpsc::Receiver<Command>,
    mut aborted: watch::Receiver<bool>,
) {
    loop {
        let command = tokio::select! {
            biased;
            _ = aborted.wait_for(|aborted| *aborted) => break,
            command = commands.recv() => command,
        };
        let (Some(command), Some(supervisor)) = (command, me.upgrade()) else {
            break;
        };
        match supervisor.clone().apply(owned, command, &mut aborted).await {
            Some(kept) => owned = kept,
            // Aborted while work on the blocking pool held the state: it stops everything once
            // that work ends (`Owned`'s drop).
            None => {
                supervisor.publish(|s| s.listeners = Arc::default());
                return;
            }
        }
    }
    if let Some(supervisor) = me.upgrade() {
        supervisor.publish(|s| s.listeners = Arc::default());
    }
    drop(owned);
}

impl Supervisor {
    /// Applies `command` to `owned`; `None` when the balancer was aborted while the state was
    /// away on the blocking pool.
    async fn apply(
        self: Arc<Self>,
        mut owned: Owned,
        command: Command,
        aborted: &mut watch::Receiver<bool>,
    ) -> Option<Owned> {
        match command {
            Command::Reload { config, reply } => {
                let (owned, outcome) = self.clone().reload_owned(owned, config, aborted).await?;
                let _ = reply.send(outcome);
                return Some(owned);
            }
            Command::SetMembers {
                pool,
                source,
                members,
                reply,
            } => {
                let work = move |owned: &mut Owned, supervisor: &Arc<Supervisor>| {
                    owned.replace_members(supervisor, &pool, &source, members)
                };
                let (owned, outcome) = self.off_runtime(owned, aborted, work).await?;
                let _ = reply.send(outcome.ok().flatten());
                return Some(owned);
            }
            Command::SetOverride {
                pool,
                backend,
                kind,
                ttl,
                reply,
            } => {
                let outcome = match self.pool(&pool) {
                    Some(pool) => pool.set_override(&backend, kind, ttl).map_err(Into::into),
                    None => Err(OverrideRefused::NoPool(pool)),
                };
                let _ = reply.send(outcome);
            }
            Command::Open { reply } => {
                if !self.accepting.send_replace(true) {
                    owned.restart_alerts(&self, &self.config());
                }
                let _ = reply.send(());
            }
            Command::StopAccepting { reply } => {
                let _ = reply.send(owned.stop_accepting(&self));
            }
            Command::StopFleet { reply } => {
                owned.stop_fleet();
                let _ = reply.send(());
            }
        }
        Some(owned)
    }

    /// Runs `work` on `owned` on tokio's blocking pool, within the runtime (the pools' and
    /// listeners' tasks it spawns go to it), and hands the state back with the outcome (`Err`:
    /// `work` panicked, a bug; the state stays as the panic left it). `None` when the balancer
    /// is aborted meanwhile. Once started, `work` runs to its end.
    pub(super) async fn off_runtime<T: Send + 'static>(
        self: Arc<Self>,
        mut owned: Owned,
        aborted: &mut watch::Receiver<bool>,
        work: impl FnOnce(&mut Owned, &Arc<Supervisor>) -> T + Send + 'static,
    ) -> Option<(Owned, std::thread::Result<T>)> {
        let runtime = Handle::current();
        let blocking = tokio::task::spawn_blocking(move || {
            let _runtime = runtime.enter();
            let outcome = std::panic::catch_unwind(AssertUnwindSafe(|| work(&mut owned, &self)));
            (owned, outcome)
        });
        tokio::select! {
            biased;
            done = blocking => done.ok(),
            _ = aborted.wait_for(|aborted| *aborted) => None,
        }
    }
}

impl Owned {
    /// Starts, restarts or stops shared probing for `config`'s `[fleet]` (kept running when
    /// its settings did not change). Every pool asks the fleet runtime before each probe;
    /// without `[fleet]` it owns every backend.
    pub(super) fn restart_fleet(&mut self, supervisor: &Arc<Supervisor>, config: &Config) {
        if self.fleet_task.as_ref().map(|(settings, _)| settings) == config.fleet.as_ref() {
            return;
        }
        self.stop_fleet();
        let fleet = &supervisor.fleet;
        // The old registration must not outlive the old task: the new task revokes it before
        // registering (it would hold this instance's name for one more lease), or, with no new
        // task, a task of its own does.
        let previous = fleet.take_held();
        for pool in supervisor.pools().iter() {
            crate::fleet::run::attach(&pool.probing, fleet);
        }
        fleet.set_cut_off(false);
        fleet.published().clear();
        let Some(settings) = config.fleet.clone() else {
            if let Some(held) = previous {
                tokio::spawn(async move { crate::fleet::run::revoke(&held).await });
            }
            fleet.set_group("", None);
            supervisor.metrics.set_fleet(None);
            return;
        };
        let port = self.listeners.first().map_or(0, |l| l.local.port());
        let instance = settings
            .instance
            .clone()
            .unwrap_or_else(|| crate::fleet::default_instance(port));
        supervisor.metrics.set_fleet(Some(fleet.counters().clone()));
        let me = Arc::downgrade(supervisor);
        let task = crate::fleet::run::Task {
            fleet: fleet.clone(),
            config: settings.clone(),
            instance,
            pools: Box::new(move || me.upgrade().map(|supervisor| supervisor.pools())),
            events: supervisor.events.clone(),
            revoke: previous,
        };
        self.fleet_task = Some((settings, tokio::spawn(task.run())));
    }

    /// Starts the alert hooks of `config`, replacing (and stopping) the running ones, and
    /// publishes their counters.
    pub(super) fn restart_alerts(&mut self, supervisor: &Supervisor, config: &Config) {
        let alerts = &config.alerts;
        let hooks = !alerts.webhooks.is_empty() || !alerts.commands.is_empty();
        self.alerts = hooks.then(|| Alerts::start(alerts, supervisor.events.subscribe()));
        let stats = self.alerts.as_ref().map(Alerts::stats);
        supervisor.publish(|s| s.alert_stats = stats);
    }

    /// Publishes the running listeners.
    pub(super) fn publish_listeners(&self, supervisor: &Supervisor) {
        let listening: Vec<Listening> = self.listeners.iter().map(ListenerRt::listening).collect();
        supervisor.publish(|s| s.listeners = Arc::new(listening));
    }

    /// Stops the fleet task, if one runs.
    fn stop_fleet(&mut self) {
        if let Some((_, task)) = self.fleet_task.take() {
            task.abort();
        }
    }

    /// Stops the sources' membership tasks and the fleet task.
    fn stop_sources(&mut self) {
        for task in self.membership_tasks.drain(..) {
            task.abort();
        }
        self.stop_fleet();
    }

    /// Stops the sources' and fleet tasks and tells the listeners to stop accepting; returns
    /// their accept loops.
    fn stop_accepting(&mut self, supervisor: &Supervisor) -> Vec<JoinHandle<()>> {
        self.stop_sources();
        let listeners = std::mem::take(&mut self.listeners);
        supervisor.publish(|s| s.listeners = Arc::default());
        for listener in &listeners {
            let _ = listener.stop.send(true);
        }
        listeners
            .into_iter()
            .flat_map(|l| std::iter::once(l.task).chain(l.http3.map(|h| h.task)))
            .collect()
    }
}

/// The supervisor's end (or its state lost with a panic): everything it started stops.
impl Drop for Owned {
    fn drop(&mut self) {
        for listener in self.listeners.drain(..) {
            let _ = listener.stop.send(true);
            listener.task.abort();
            if let Some(http3) = listener.http3 {
                http3.task.abort();
            }
        }
        self.stop_sources();
        for (_, tasks) in self.pool_tasks.drain(..) {
            tasks.abort();
        }
        if let Some(lane) = self.lane.take() {
            lane.abort();
        }
    }
}
