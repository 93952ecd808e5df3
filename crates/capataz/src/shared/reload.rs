//! Applying a new configuration to a running balancer without dropping a connection.

use std::sync::Arc;

use super::listener::ListenerState;
use super::{bind_listener, lock, Shared, StartError};
use crate::config::Config;
use crate::health::PoolRt;
use crate::metrics::HistogramScope;
use crate::proxy::Proxy;

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
                Arc::new(PoolRt::new(
                    pool.clone(),
                    self.events.clone(),
                    self.clock,
                    previous.map(|p| &**p),
                    pool.gate_new_backends,
                    self.metrics.families(),
                ))
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
        let scope = self.metrics.families().scope();
        if HistogramScope::of(config) != scope {
            tracing::warn!(
                kept = %scope,
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
}
