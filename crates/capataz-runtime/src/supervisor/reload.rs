//! Applying a new configuration to a running balancer without dropping a connection.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;

use tokio::sync::watch;

use super::task::Owned;
use super::{bind_listener, StartError, Supervisor};

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

impl Supervisor {
    /// Applies the reload command: `config` (or why the file could not be read), counted in
    /// the metrics in the order reloads apply. `None` when the balancer is aborted meanwhile.
    pub(super) async fn reload_owned(
        self: Arc<Self>,
        owned: Owned,
        config: Result<Box<Config>, StartError>,
        aborted: &mut watch::Receiver<bool>,
    ) -> Option<(Owned, Result<ReloadSummary, StartError>)> {
        let (owned, outcome) = match config {
            Ok(config) => {
                let work = move |owned: &mut Owned, supervisor: &Arc<Supervisor>| {
                    owned.apply(supervisor, *config)
                };
                let (owned, outcome) = self.clone().off_runtime(owned, aborted, work).await?;
                (owned, outcome.unwrap_or(Err(StartError::ReloadPanicked)))
            }
            Err(error) => (owned, Err(error)),
        };
        self.metrics.reloaded(outcome.is_ok());
        Some((owned, outcome))
    }
}

impl Owned {
    /// [`Supervisor::reload`], on a blocking-pool thread that has entered the runtime. No
    /// other command is applied meanwhile, so no override lands on an old pool (it would be
    /// lost) and no membership update on a pool being replaced.
    fn apply(
        &mut self,
        supervisor: &Arc<Supervisor>,
        mut config: Config,
    ) -> Result<ReloadSummary, StartError> {
        let old_config = supervisor.config();
        keep_started_settings(&old_config, &mut config);
        // Refused once shutdown began: it would bind listeners shutdown is closing.
        if *supervisor.shutdown.borrow() {
            return Err(StartError::ShuttingDown);
        }
        let kept = super::listener::kept(&self.listeners, &config);
        keep_ticket_keys(&self.listeners, &kept, &mut config);
        let fresh = bind_fresh(&self.listeners, &kept, &config)?;
        let old_pools = supervisor.pools();
        let mut summary = ReloadSummary::default();
        let new_pools = supervisor.build_pools(&config, &old_pools, &mut summary);
        // A test holds the reload here, with the old pools' state read and the new pools not
        // yet in force: what lands on an old pool now is lost.
        #[cfg(test)]
        let _gate = supervisor.wait_for_build_gate();
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
        self.restart_membership(supervisor, &new_pools, &had_members);
        self.restart_fleet(supervisor, &config);
        let pools = Arc::new(new_pools);
        supervisor.publish(|s| s.pools = pools.clone());
        let old_tasks = std::mem::replace(&mut self.pool_tasks, tasks);
        for (_, tasks) in old_tasks {
            tasks.abort();
        }
        let kept = Kept {
            by_config: kept,
            fresh,
        };
        supervisor.update_listeners(&mut self.listeners, kept, &config, &pools, &mut summary);
        self.publish_listeners(supervisor);
        let names: Vec<&str> = config.listeners.iter().map(|l| l.name.as_str()).collect();
        supervisor.access_logs.retain(&names);
        // Switching live would leave the other scope's series in the same families (per-backend
        // ones would not even go away), so the scope stays until the process restarts.
        let scope = supervisor.metrics.families().scope();
        if HistogramScope::of(&config) != scope {
            tracing::warn!(
                kept = %scope,
                "admin.metrics_backend_histograms in the new config differs from the one the \
                 process started with; it takes effect at the next restart"
            );
        }
        if old_config.alerts != config.alerts {
            self.restart_alerts(supervisor, &config);
        }
        supervisor
            .metrics
            .families()
            .tls()
            .set_certificates(&config);
        supervisor.publish(|s| s.config = Arc::new(config));
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
}

/// The listeners `config` adds to the `running` ones (those `kept` names no running one for),
/// bound, and the UDP sockets of the HTTP/3 endpoints the kept ones move to (or gain); on an
/// error nothing has changed.
fn bind_fresh(
    running: &[ListenerRt],
    kept: &[Option<usize>],
    config: &Config,
) -> Result<Bound, StartError> {
    let mut fresh = Vec::new();
    let mut udp = Vec::new();
    for (index, listener) in config.listeners.iter().enumerate() {
        match kept[index].map(|i| &running[i]) {
            Some(kept) => {
                let wanted = super::http3::http3_address(listener, kept.local);
                if kept.http3.as_ref().map(|h| h.address) != wanted {
                    if let Some(socket) = super::http3::bind_udp(index, listener, kept.local)? {
                        udp.extend(wanted.map(|address| (address, socket)));
                    }
                }
            }
            None => fresh.push((listener.clone(), bind_listener(index, listener)?)),
        }
    }
    Ok((fresh, udp))
}

/// What a reload bound before changing anything: the fresh listeners, and the kept ones'
/// new HTTP/3 UDP sockets by address.
type Bound = (Vec<Fresh>, Vec<(std::net::SocketAddr, std::net::UdpSocket)>);

/// Which running listeners a reload keeps ([`super::listener::kept`]), and what it bound.
struct Kept {
    by_config: Vec<Option<usize>>,
    fresh: Bound,
}

impl Supervisor {
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

    /// The running `listeners` kept (with the new routes, ACME and stapling tasks, and a
    /// reopened access log: log rotation) or stopped, and the fresh ones started; counted in
    /// `summary`.
    fn update_listeners(
        &self,
        listeners: &mut Vec<ListenerRt>,
        kept: Kept,
        config: &Config,
        pools: &[Arc<PoolRt>],
        summary: &mut ReloadSummary,
    ) {
        let Kept {
            by_config,
            fresh: (fresh, mut udp),
        } = kept;
        let pool_handles = super::listener::handles(pools);
        // In the new file's order, as at start: the kept ones in their new places, the fresh
        // ones in the places left.
        let mut slots: Vec<Option<ListenerRt>> = config.listeners.iter().map(|_| None).collect();
        for (running, listener) in std::mem::take(listeners).into_iter().enumerate() {
            match by_config.iter().position(|&k| k == Some(running)) {
                Some(index) => {
                    let new = &config.listeners[index];
                    super::unix_listen::apply_mode(new);
                    let mut listener = listener;
                    listener.acme = self.spawn_acme(new);
                    listener.ocsp = self.spawn_stapling(new);
                    // A reload reopens the access log (log rotation).
                    let log = self.access_log(new);
                    let previous = listener.state.load_full();
                    let resolved = super::http3::resolved(new, listener.local);
                    listener.state.store(self.listener_state(
                        &resolved,
                        &pool_handles,
                        log,
                        Some(&previous),
                    ));
                    // A loop waiting at `max_connections` reads the new limit.
                    previous.room.notify_waiters();
                    self.update_http3(&mut listener, new, &mut udp);
                    slots[index] = Some(listener);
                }
                None => {
                    let _ = listener.stop.send(true);
                    summary.listeners_removed += 1;
                }
            }
        }
        let empty = slots.iter_mut().filter(|slot| slot.is_none());
        for (slot, (listener, socket)) in empty.zip(fresh) {
            *slot = Some(self.spawn_listener(&listener, socket, pools));
            summary.listeners_added += 1;
        }
        *listeners = slots.into_iter().flatten().collect();
    }
}

/// A listener the new config adds, and its socket, bound.
type Fresh = (ListenerConfig, super::ClientSocket);

/// Each TLS listener of `config` that keeps a running one (`kept`, paired as the sockets are:
/// the same address or socket path, by name first among several on `127.0.0.1:0`) keeps that
/// listener's session ticket keys when its tickets' settings and client CAs are unchanged, so
/// that clients resume their sessions across the reload (as HAProxy's `tls-ticket-keys` and
/// Caddy's shared keys allow).
fn keep_ticket_keys(running: &[ListenerRt], kept: &[Option<usize>], config: &mut Config) {
    for (listener, kept) in config.listeners.iter_mut().zip(kept) {
        let Some(index) = *kept else { continue };
        let state = running[index].state.load();
        let previous = state
            .config
            .tls
            .as_ref()
            .and_then(|tls| tls.loaded.as_ref());
        let loaded = listener.tls.as_mut().and_then(|tls| tls.loaded.as_mut());
        if let (Some(previous), Some(loaded)) = (previous, loaded) {
            loaded.keep_ticket_keys(previous);
        }
    }
}

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
