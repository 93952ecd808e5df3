//! The handles the runtime updates: one pool's ([`PoolMetrics`]) and one backend's
//! ([`BackendMetrics`]), each label set resolved once from the balancer's [`Families`] when the
//! pool or backend is built, so the request path only increments and observes.

use std::sync::OnceLock;
use std::time::Duration;

use capataz_health::{ProbeResult, Reason, State, Transition};
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::histogram::Histogram;

use super::{
    BackendLabels, Families, HistogramLabels, HistogramScope, OutlierLabels, PoolLabels,
    ProbeLabels, RequestLabels, TransitionLabels,
};

/// The answer classes of `capataz_requests_total`, in the order of [`BackendMetrics`] handles.
pub(super) const CLASSES: [&str; 6] = ["1xx", "2xx", "3xx", "4xx", "5xx", "error"];

impl Families {
    /// The handles of pool `pool`; a pool rebuilt under the same name gets the same counters
    /// and histograms.
    pub(crate) fn pool(&self, pool: &str) -> PoolMetrics {
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
    upstream_response: Histogram,
    probe_duration: Histogram,
}

/// One pool's metric handles, resolved once when the pool is built.
#[derive(Debug)]
pub(crate) struct PoolMetrics {
    /// The families its backends' handles come from.
    families: Families,
    pool: String,
    pub(super) retries: Counter,
    rejected: Counter,
    /// With [`HistogramScope::Pool`], the histograms every backend of the pool observes into;
    /// `None` when each backend has its own.
    shared: Option<LatencyHistograms>,
}

impl PoolMetrics {
    /// The handles of this pool's backend `backend`; a backend rebuilt under the same names
    /// gets the same counters.
    pub(crate) fn backend(&self, backend: &str) -> BackendMetrics {
        let latency = match &self.shared {
            Some(shared) => shared.clone(),
            None => self.families.latency(&HistogramLabels {
                pool: self.pool.clone(),
                backend: Some(backend.into()),
            }),
        };
        BackendMetrics::new(&self.families, &self.pool, backend, latency)
    }

    /// Counts one retry.
    pub(crate) fn retry(&self) {
        self.retries.inc();
    }

    /// Counts one request the pool answered 503 for lack of a backend.
    pub(crate) fn reject(&self) {
        self.rejected.inc();
    }
}

/// One backend's metric handles, resolved once when the backend is built.
#[derive(Debug)]
pub(crate) struct BackendMetrics {
    /// One counter per entry of [`CLASSES`].
    pub(super) requests: [Counter; 6],
    probes_pass: Counter,
    probes_fail: Counter,
    /// `result="drain"`, created by the first drain probe (`disable_on_404` pools only), so
    /// other pools' scrapes do not grow.
    probes_drain: OnceLock<Counter>,
    probes: prometheus_client::metrics::family::Family<ProbeLabels, Counter>,
    drain_labels: ProbeLabels,
    to_up: Counter,
    to_down: Counter,
    ejections: Counter,
    /// `detector="latency"` and `"success_rate"`, created by the first such ejection, so
    /// pools without the detectors add no series.
    outliers: [OnceLock<Counter>; 2],
    outlier_family: prometheus_client::metrics::family::Family<OutlierLabels, Counter>,
    pool_backend: (String, String),
    latency: LatencyHistograms,
}

impl BackendMetrics {
    fn new(
        metrics: &Families,
        pool: &str,
        backend: &str,
        latency: LatencyHistograms,
    ) -> BackendMetrics {
        let request = |class| {
            metrics.requests.get_or_create_owned(&RequestLabels {
                pool: pool.into(),
                backend: backend.into(),
                class,
            })
        };
        let probe = |result| {
            metrics.probes.get_or_create_owned(&ProbeLabels {
                pool: pool.into(),
                backend: backend.into(),
                result,
            })
        };
        let transition = |to| {
            metrics.transitions.get_or_create_owned(&TransitionLabels {
                pool: pool.into(),
                backend: backend.into(),
                to,
            })
        };
        BackendMetrics {
            requests: CLASSES.map(request),
            probes_pass: probe("pass"),
            probes_fail: probe("fail"),
            probes_drain: OnceLock::new(),
            probes: metrics.probes.clone(),
            drain_labels: ProbeLabels {
                pool: pool.into(),
                backend: backend.into(),
                result: "drain",
            },
            to_up: transition("up"),
            to_down: transition("down"),
            ejections: metrics.ejections.get_or_create_owned(&BackendLabels {
                pool: pool.into(),
                backend: backend.into(),
            }),
            outliers: [OnceLock::new(), OnceLock::new()],
            outlier_family: metrics.outlier_ejections.clone(),
            pool_backend: (pool.into(), backend.into()),
            latency,
        }
    }

    /// Counts an attempt the backend answered with `status`, `elapsed` after it was sent.
    pub(crate) fn answered(&self, status: u16, elapsed: Duration) {
        self.requests[class_index(status)].inc();
        self.latency
            .upstream_response
            .observe(elapsed.as_secs_f64());
    }

    /// Attempts counted, and of those the ones answered 5xx or not at all.
    pub(crate) fn attempts(&self) -> (u64, u64) {
        let total = self.requests.iter().map(Counter::get).sum();
        let errors = self.requests[4].get() + self.requests[5].get();
        (total, errors)
    }

    /// Counts an attempt that got no answer: no connection, a reset, a timeout, or garbage.
    pub(crate) fn unanswered(&self) {
        self.requests[CLASSES.len() - 1].inc();
    }

    /// Counts one probe and how long it took.
    pub(crate) fn probe(&self, result: ProbeResult, latency: Duration) {
        match result {
            ProbeResult::Pass => self.probes_pass.inc(),
            ProbeResult::Fail => self.probes_fail.inc(),
            // Created on first use: only pools with `disable_on_404` ever count one.
            ProbeResult::Drain => self
                .probes_drain
                .get_or_init(|| self.probes.get_or_create_owned(&self.drain_labels))
                .inc(),
        };
        self.latency.probe_duration.observe(latency.as_secs_f64());
    }

    /// Counts one verdict change, and an ejection when passive checks caused it.
    pub(crate) fn transition(&self, transition: &Transition) {
        match transition.to {
            State::Up => self.to_up.inc(),
            State::Down => self.to_down.inc(),
        };
        if matches!(
            transition.reason,
            Reason::TrafficErrors { .. }
                | Reason::ProbationFailed { .. }
                | Reason::SlowTraffic { .. }
                | Reason::ErrorRate { .. }
        ) {
            self.ejections.inc();
        }
        let (slot, detector) = match transition.reason {
            Reason::SlowTraffic { .. } => (0, "latency"),
            Reason::ErrorRate { .. } => (1, "success_rate"),
            _ => return,
        };
        self.outliers[slot]
            .get_or_init(|| {
                self.outlier_family.get_or_create_owned(&OutlierLabels {
                    pool: self.pool_backend.0.clone(),
                    backend: self.pool_backend.1.clone(),
                    detector,
                })
            })
            .inc();
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
