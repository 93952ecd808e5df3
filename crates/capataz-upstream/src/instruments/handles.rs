//! The handles the runtime updates: one pool's ([`PoolMetrics`]) and one backend's
//! ([`BackendMetrics`]: its counter block and its latency histograms), each resolved once from
//! the balancer's [`Families`] when the pool or backend is built, so the request path only
//! increments and observes.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use capataz_health::{ProbeResult, Reason, State, Transition};
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::histogram::Histogram;

use super::counters::Counts;
use super::{Families, HistogramLabels, HistogramScope, PoolLabels};

/// The answer classes of `capataz_requests_total`, in the order of a backend's counters.
pub(super) const CLASSES: [&str; 6] = ["1xx", "2xx", "3xx", "4xx", "5xx", "error"];

impl Families {
    /// The handles of pool `pool`; a pool rebuilt under the same name gets the same counters
    /// and histograms.
    pub fn pool(&self, pool: &str) -> PoolMetrics {
        let labels = PoolLabels { pool: pool.into() };
        let shared = match self.scope {
            HistogramScope::Pool => Some(self.latency(&HistogramLabels {
                pool: pool.into(),
                backend: None,
            })),
            HistogramScope::Backend => None,
        };
        PoolMetrics {
            families: self.clone(),
            pool: pool.into(),
            retries: self.retries.get_or_create_owned(&labels),
            rejected: self.rejected.get_or_create_owned(&labels),
            shared,
        }
    }

    /// Removes the latency histograms labelled `labels`, if there are (a backend's, once its
    /// counters are forgotten).
    fn forget_latency(&self, labels: &HistogramLabels) {
        if self.scope == HistogramScope::Backend {
            self.upstream_response.remove(labels);
            self.probe_duration.remove(labels);
        }
    }

    /// The latency histograms labelled `labels`.
    fn latency(&self, labels: &HistogramLabels) -> LatencyHistograms {
        LatencyHistograms {
            upstream_response: self.upstream_response.get_or_create_owned(labels),
            probe_duration: self.probe_duration.get_or_create_owned(labels),
        }
    }
}

/// The two latency histograms a backend observes into: its own, or clones of its pool's
/// (a clone shares the histogram).
#[derive(Clone, Debug)]
struct LatencyHistograms {
    upstream_response: super::Timing,
    probe_duration: Histogram,
}

/// One pool's metric handles, resolved once when the pool is built.
#[derive(Debug)]
pub struct PoolMetrics {
    /// The families its backends' handles come from.
    pub(super) families: Families,
    pub(super) pool: Arc<str>,
    pub(super) retries: Counter,
    rejected: Counter,
    /// With [`HistogramScope::Pool`], the histograms every backend of the pool observes into;
    /// `None` when each backend has its own.
    shared: Option<LatencyHistograms>,
}

impl PoolMetrics {
    /// The handles of this pool's backend `backend`; a backend rebuilt under the same names
    /// gets the same counters.
    pub fn backend(&self, backend: &Arc<str>) -> BackendMetrics {
        let latency = match &self.shared {
            Some(shared) => shared.clone(),
            None => self.families.latency(&HistogramLabels {
                pool: self.pool.to_string(),
                backend: Some(backend.to_string()),
            }),
        };
        let counts = self
            .families
            .counters
            .of(&self.pool, backend, |pool, gone| {
                self.families.forget_latency(&HistogramLabels {
                    pool: pool.to_owned(),
                    backend: Some(gone.to_owned()),
                });
            });
        BackendMetrics { counts, latency }
    }

    /// Counts one retry.
    pub fn retry(&self) {
        self.retries.inc();
    }

    /// Counts one request the pool answered 503 for lack of a backend.
    pub fn reject(&self) {
        self.rejected.inc();
    }

    /// Counts one sticky client moved off `backend` for `reason` (rare: the labels are
    /// looked up at each move).
    pub fn sticky_move(&self, backend: &str, reason: &'static str) {
        self.families
            .sticky_moves
            .get_or_create(&super::StickyMoveLabels {
                pool: self.pool.to_string(),
                backend: backend.to_owned(),
                reason,
            })
            .inc();
    }
}

/// One backend's metric handles, resolved once when the backend is built: its counters (see
/// `counters.rs`) and the latency histograms it observes into.
#[derive(Debug)]
pub struct BackendMetrics {
    pub(super) counts: Arc<Counts>,
    latency: LatencyHistograms,
}

impl BackendMetrics {
    /// Counts an attempt the backend answered with `status`, `elapsed` after it was sent.
    pub fn answered(&self, status: u16, elapsed: Duration) {
        self.counts.requests[class_index(status)].fetch_add(1, Ordering::Relaxed);
        self.latency.upstream_response.observe(elapsed);
    }

    /// Attempts counted, and of those the ones answered 5xx or not at all.
    pub(crate) fn attempts(&self) -> (u64, u64) {
        let count = |n: &AtomicU64| n.load(Ordering::Relaxed);
        let requests = &self.counts.requests;
        let total = requests.iter().map(count).sum();
        let errors = count(&requests[4]) + count(&requests[5]);
        (total, errors)
    }

    /// Counts an attempt that got no answer: no connection, a reset, a timeout, or garbage.
    pub fn unanswered(&self) {
        self.counts.requests[CLASSES.len() - 1].fetch_add(1, Ordering::Relaxed);
    }

    /// Counts one probe and how long it took.
    pub fn probe(&self, result: ProbeResult, latency: Duration) {
        match result {
            ProbeResult::Pass => self.counts.probes[0].fetch_add(1, Ordering::Relaxed),
            ProbeResult::Fail => self.counts.probes[1].fetch_add(1, Ordering::Relaxed),
            // Shown from the first: only pools with `disable_on_404` ever count one.
            ProbeResult::Drain => {
                self.counts.drain();
                0
            }
        };
        self.latency.probe_duration.observe(latency.as_secs_f64());
    }

    /// Counts one verdict change, and an ejection when passive checks caused it.
    pub fn transition(&self, transition: &Transition) {
        let to = match transition.to {
            State::Up => 0,
            State::Down => 1,
        };
        self.counts.transitions[to].fetch_add(1, Ordering::Relaxed);
        if matches!(
            transition.reason,
            Reason::TrafficErrors { .. }
                | Reason::ProbationFailed { .. }
                | Reason::SlowTraffic { .. }
                | Reason::ErrorRate { .. }
        ) {
            self.counts.ejections.fetch_add(1, Ordering::Relaxed);
        }
        match transition.reason {
            Reason::SlowTraffic { .. } => self.counts.outlier(0),
            Reason::ErrorRate { .. } => self.counts.outlier(1),
            _ => {}
        }
    }
}

/// The index in [`CLASSES`] of an answer with `status`; a code outside 100-599 (hyper lets
/// 600-999 through) has no class and counts as `error`.
pub(super) fn class_index(status: u16) -> usize {
    match status / 100 {
        class @ 1..=5 => usize::from(class) - 1,
        _ => CLASSES.len() - 1,
    }
}
