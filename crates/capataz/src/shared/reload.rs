//! Applying a new configuration to a running balancer without dropping a connection.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;

use tokio::runtime::Handle;
use tokio::sync::OwnedMutexGuard;

use super::{bind_listener, lock, Shared, StartError};
use tokio::net::TcpListener;

use super::listener::ListenerRt;
use crate::config::{Config, ListenerConfig, PoolConfig};
use crate::health::PoolRt;
use crate::metrics::HistogramScope;

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

impl Shared {
    /// Re-reads the file the balancer was started from and applies it (see
    /// [`Shared::reload`]). The whole reload runs on tokio's blocking pool: reading, parsing,
    /// validating and resolving the file (a slow disk, a FIFO, a slow resolver, a costly
    /// value), then building the new pools from the old ones' state and the listeners'
    /// proxies, never hold a runtime thread that requests and probes need.
    pub async fn reload_from_file(self: &Arc<Self>) -> Result<ReloadSummary, StartError> {
        let Some(path) = self.config_path.clone() else {
            self.metrics.reloaded(false);
            return Err(StartError::NoFile);
        };
        // Taken before the read, so that reloads apply in the order their reads started.
        let serial = self.reload_lock.clone().lock_owned().await;
        self.off_runtime(serial, move |shared| {
            let config = crate::config::load_all_errors(&path).map_err(StartError::Configs)?;
            shared.apply(config)
        })
        .await
    }

    /// Applies a new, validated configuration without dropping a connection: new listeners are
    /// bound first (a failure changes nothing), then every pool is rebuilt. A backend with the
    /// same pool, name and address keeps its health state, streaks and records; a new one
    /// starts DOWN until it passes `rise` probes where the pool gates new backends; a removed
    /// one gets no new requests and is dropped once its in-flight requests finish. Changing the
    /// admin address or `admin.metrics_backend_histograms` needs a restart. Reloads apply one
    /// at a time, in the order they were asked for; the work runs on tokio's blocking pool,
    /// not on a runtime thread (a pool of thousands of backends takes a while to build).
    pub async fn reload(self: &Arc<Self>, config: &Config) -> Result<ReloadSummary, StartError> {
        let serial = self.reload_lock.clone().lock_owned().await;
        let config = config.clone();
        self.off_runtime(serial, move |shared| shared.apply(config))
            .await
    }

    /// Runs `work` on tokio's blocking pool, holding `serial` (the `reload_lock`) until it is
    /// done. Once started it runs to the end even if the caller stops waiting, so a reload is
    /// applied whole or not at all, and the next one waits for it. The pools' and listeners'
    /// tasks it spawns go to the caller's runtime.
    async fn off_runtime(
        self: &Arc<Self>,
        serial: OwnedMutexGuard<()>,
        work: impl FnOnce(&Shared) -> Result<ReloadSummary, StartError> + Send + 'static,
    ) -> Result<ReloadSummary, StartError> {
        let shared = self.clone();
        let runtime = Handle::current();
        tokio::task::spawn_blocking(move || {
            let _runtime = runtime.enter();
            let outcome = work(&shared);
            // Counted before the next reload may start, so the counters follow their order.
            shared.metrics.reloaded(outcome.is_ok());
            drop(serial);
            outcome
        })
        .await
        .map_err(|_| {
            self.metrics.reloaded(false);
            StartError::ReloadPanicked
        })?
    }

    /// [`Shared::reload`] once the caller holds `reload_lock`, on a blocking-pool thread that
    /// has entered the runtime (the std locks it takes are never held across an await).
    fn apply(&self, mut config: Config) -> Result<ReloadSummary, StartError> {
        let old_config = self.config();
        keep_started_settings(&old_config, &mut config);
        let (listeners, fresh) = self.take_listeners_and_bind(&config)?;
        // From reading the old pools' state to swapping in the new ones, no override may land
        // on an old pool (it would be lost).
        let swap = self.swap_lock.blocking_lock();
        let old_pools = self.pools.load_full();
        let mut summary = ReloadSummary::default();
        let new_pools = self.build_pools(&config, &old_pools, &mut summary);
        let total_old: usize = old_pools.iter().map(|p| p.backends.len()).sum();
        summary.removed = total_old.saturating_sub(summary.kept);
        let tasks: Vec<_> = new_pools
            .iter()
            .map(|pool| (pool.name.clone(), pool.start_tasks(&new_pools)))
            .collect();
        let had_members: HashSet<&str> = old_pools
            .iter()
            .filter(|p| p.config.source.is_dynamic())
            .map(|p| &*p.name)
            .collect();
        self.restart_membership(&new_pools, &had_members);
        self.restart_fleet(&config);
        self.pools.store(Arc::new(new_pools));
        drop(swap);
        let old_tasks = std::mem::replace(&mut *lock(&self.pool_tasks), tasks);
        for (_, tasks) in old_tasks {
            tasks.abort();
        }
        let pools = self.pools.load_full();
        let kept_listeners = self.update_listeners(listeners, fresh, &config, &pools, &mut summary);
        let names: Vec<&str> = config.listeners.iter().map(|l| l.name.as_str()).collect();
        self.access_logs.retain(&names);
        let mut running = lock(&self.listeners);
        if *self.shutdown.borrow() {
            // Shutdown began meanwhile and found none to stop: stop them here.
            for listener in &kept_listeners {
                let _ = listener.stop.send(true);
            }
        }
        running.extend(kept_listeners);
        drop(running);
        // Switching live would leave the other scope's series in the same families (per-backend
        // ones would not even go away), so the scope stays until the process restarts.
        let scope = self.metrics.families().scope();
        if HistogramScope::of(&config) != scope {
            tracing::warn!(
                kept = %scope,
                "admin.metrics_backend_histograms in the new config differs from the one the \
                 process started with; it takes effect at the next restart"
            );
        }
        if old_config.alerts != config.alerts {
            self.restart_alerts(&config);
        }
        self.metrics.families().tls().set_certificates(&config);
        *lock(&self.config) = Arc::new(config);
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

    /// The listeners running now, taken out, and the ones the new config adds, bound: on an
    /// error the running ones are put back and nothing has changed. Refused once shutdown
    /// began.
    fn take_listeners_and_bind(
        &self,
        config: &Config,
    ) -> Result<(Vec<ListenerRt>, Vec<Fresh>), StartError> {
        let listeners = {
            let mut running = lock(&self.listeners);
            // Checked under the listeners' lock, which shutdown takes after raising the flag.
            if *self.shutdown.borrow() {
                return Err(StartError::ShuttingDown);
            }
            std::mem::take(&mut *running)
        };
        // Bind the listeners that are new, before changing anything.
        let mut fresh = Vec::new();
        for (index, listener) in config.listeners.iter().enumerate() {
            if !listeners.iter().any(|l| l.address == listener.address) {
                match bind_listener(index, listener) {
                    Ok(socket) => fresh.push((listener.clone(), socket)),
                    Err(error) => {
                        *lock(&self.listeners) = listeners;
                        return Err(error);
                    }
                }
            }
        }
        Ok((listeners, fresh))
    }

    /// The new pools, each built from the old pool of its name (its backends' health kept),
    /// counting in `summary` the backends kept and added.
    fn build_pools(
        &self,
        config: &Config,
        old_pools: &[Arc<PoolRt>],
        summary: &mut ReloadSummary,
    ) -> Vec<Arc<PoolRt>> {
        // The old pools by name, so that a config of many pools is matched in linear time.
        let old_by_name: HashMap<&str, &Arc<PoolRt>> =
            old_pools.iter().map(|p| (&*p.name, p)).collect();
        config
            .pools
            .iter()
            .map(|pool| {
                let previous = old_by_name.get(pool.name.as_str()).copied();
                // A pool whose backends come from a source keeps the ones it has: its source
                // task, restarted below, updates them from there.
                let pool = match previous {
                    Some(old) if pool.source.is_dynamic() => &PoolConfig {
                        backends: old.config.backends.clone(),
                        ..pool.clone()
                    },
                    _ => pool,
                };
                // The old pool's backends by name and address, so that counting stays linear
                // in a pool of thousands of backends.
                let before: HashSet<(&str, &str)> = previous
                    .map(|p| {
                        p.backends
                            .iter()
                            .map(|b| (&*b.name, b.address.as_str()))
                            .collect()
                    })
                    .unwrap_or_default();
                for backend in &pool.backends {
                    let kept = before.contains(&(backend.name.as_str(), backend.address.as_str()));
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
                    self.metrics.families(),
                )
            })
            .collect()
    }

    /// The running listeners kept (with the new routes, ACME and stapling tasks, and a
    /// reopened access log: log rotation) or stopped, and the fresh ones started; counted in
    /// `summary`.
    fn update_listeners(
        &self,
        listeners: Vec<ListenerRt>,
        fresh: Vec<Fresh>,
        config: &Config,
        pools: &[Arc<PoolRt>],
        summary: &mut ReloadSummary,
    ) -> Vec<ListenerRt> {
        let pool_handles = super::listener::handles(pools);
        let mut kept_listeners = Vec::new();
        for listener in listeners {
            match config
                .listeners
                .iter()
                .find(|l| l.address == listener.address)
            {
                Some(new) => {
                    let mut listener = listener;
                    listener.acme = self.spawn_acme(new);
                    listener.ocsp = self.spawn_stapling(new);
                    // A reload reopens the access log (log rotation).
                    let log = self.access_log(new);
                    listener
                        .state
                        .store(self.listener_state(new, &pool_handles, log));
                    kept_listeners.push(listener);
                }
                None => {
                    let _ = listener.stop.send(true);
                    summary.listeners_removed += 1;
                }
            }
        }
        for (listener, socket) in fresh {
            kept_listeners.push(self.spawn_listener(&listener, socket, pools));
            summary.listeners_added += 1;
        }
        kept_listeners
    }
}

/// A listener the new config adds, and its socket, bound.
type Fresh = (ListenerConfig, TcpListener);

/// What a reload does not change: the admin listener's address and settings (unless the new
/// table is for the same address) and logging, set up at start.
fn keep_started_settings(old_config: &Config, config: &mut Config) {
    // The admin listener stays where it was bound, so it keeps the `[admin]` settings it was
    // started with unless the new table is for the same address: a token must not vanish from
    // a listener on a network address because the new file moves it to loopback or drops the
    // table.
    let admin_moved =
        old_config.admin.as_ref().map(|a| a.address) != config.admin.as_ref().map(|a| a.address);
    if admin_moved {
        tracing::warn!(
            "the new config moves or removes [admin]; the admin listener keeps its address \
             and its settings (token, open_read_only, allowed_hosts) until the next restart"
        );
        config.admin = old_config.admin.clone();
    }
    // Logging is set up once, at start: the config in force keeps saying what it does.
    if old_config.log != config.log {
        tracing::warn!(
            "[log] in the new config differs from the one the process started with; logging \
             is set up at start, so it takes effect at the next restart"
        );
        config.log = old_config.log.clone();
    }
}
