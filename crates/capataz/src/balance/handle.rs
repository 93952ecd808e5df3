//! What the request path holds of a pool ([`PoolHandle`]): the snapshot it picks from, the
//! round-robin cursor, the backends (connections, in-flight counts), the retry budget, the
//! configuration, and where traffic outcomes go.
//!
//! The health runtime (`health::PoolRt`) owns a handle and publishes snapshots into it; the
//! handle knows the runtime only as a [`TrafficSink`], held weakly, so the request path never
//! depends on the health runtime, and a pool replaced by a reload is freed even while requests
//! on it are still streaming (their later outcomes are kept in the backends' traffic rings
//! but no longer judged by an engine nobody reads).

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Weak};

use arc_swap::{ArcSwap, Guard};
use capataz_health::{Outcome, TrafficResult, TrafficRule};

use super::{BackendRt, Snapshot};
use crate::budget::RetryBudget;
use crate::config::PoolConfig;
use crate::instruments::PoolMetrics;

/// Where traffic outcomes that need the engine go: the health runtime of the pool.
pub trait TrafficSink: Send + Sync {
    /// Judges one traffic outcome of backend `backend` of `pool` (one the fast path could not
    /// settle: an error, or a backend whose passive record is not clean).
    fn handle_traffic(&self, pool: &PoolHandle, backend: usize, outcome: Outcome);
}

/// One pool as the request path sees it.
pub struct PoolHandle {
    /// The pool's name.
    pub name: Arc<str>,
    /// Its configuration.
    pub config: PoolConfig,
    /// Its backends, in configuration order (the engine's indexes).
    pub backends: Vec<Arc<BackendRt>>,
    /// Its metric handles.
    pub(crate) metrics: PoolMetrics,
    snapshot: ArcSwap<Snapshot>,
    /// The shared round-robin cursor.
    pub(crate) cursor: AtomicUsize,
    /// The retry budget.
    pub(crate) budget: RetryBudget,
    traffic_rule: TrafficRule,
    health: Weak<dyn TrafficSink>,
}

impl std::fmt::Debug for PoolHandle {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PoolHandle")
            .field("name", &self.name)
            .field("backends", &self.backends)
            .field("snapshot", &self.snapshot)
            .finish_non_exhaustive()
    }
}

impl PoolHandle {
    /// A handle over `backends` for `config`, with an empty snapshot (the health runtime
    /// publishes the first one); outcomes the fast path cannot settle go to `health`.
    pub(crate) fn new(
        config: PoolConfig,
        backends: Vec<Arc<BackendRt>>,
        metrics: PoolMetrics,
        traffic_rule: TrafficRule,
        health: Weak<dyn TrafficSink>,
    ) -> PoolHandle {
        PoolHandle {
            name: config.name.as_str().into(),
            budget: RetryBudget::new(config.retries.budget_percent, config.retries.min_budget),
            snapshot: ArcSwap::from_pointee(Snapshot::new(Vec::new(), Vec::new(), false)),
            cursor: AtomicUsize::new(0),
            metrics,
            backends,
            config,
            traffic_rule,
            health,
        }
    }

    /// The eligible backends as of the last change; no lock taken.
    #[inline]
    pub fn snapshot(&self) -> Guard<Arc<Snapshot>> {
        self.snapshot.load()
    }

    /// Replaces the snapshot if `snapshot` differs from it (the health runtime's publishing).
    pub(crate) fn publish(&self, snapshot: Snapshot) {
        if **self.snapshot.load() != snapshot {
            self.snapshot.store(Arc::new(snapshot));
        }
    }

    /// The index of the backend named `name`.
    pub fn index_of(&self, name: &str) -> Option<usize> {
        self.backends.iter().position(|b| &*b.name == name)
    }

    /// Records one traffic outcome of backend `backend`: in its ring always, and for the
    /// engine unless it is a good response from a backend with a clean passive record (one
    /// atomic load, no lock) or passive checks are off.
    pub fn observe(&self, backend: usize, outcome: Outcome) {
        let rt = &self.backends[backend];
        rt.traffic.push(outcome);
        if !self.config.passive.enabled {
            return;
        }
        if !rt.watched.load(Ordering::Relaxed)
            && self.traffic_rule.judge(outcome) == TrafficResult::Ok
        {
            return;
        }
        if let Some(health) = self.health.upgrade() {
            health.handle_traffic(self, backend, outcome);
        }
    }
}
