//! Prometheus metrics: counters kept beside the runtime, and the `GET /metrics` exposition.
//!
//! The proxy is benchmarked against HAProxy, so the request path pays for metrics with two
//! clock reads, one atomic add and one histogram observation (about 80 ns in all) and nothing
//! else. Every label set is resolved once, when a pool or backend is built: `PoolMetrics` and
//! `BackendMetrics` hold ready handles, so no request builds, hashes or looks up a label set.
//! The families live in one process-wide registry, registered once; a reload rebuilds the
//! pools, asks for the same label sets and gets the same counters back, so series continue.
//!
//! Everything that describes the present (is a backend eligible, how many requests are in
//! flight, its weight, is the pool all down) is a gauge read from the live pools at scrape
//! time, so it costs nothing between scrapes and cannot drift from the state it reports. So
//! are the alert hooks' counters, which `alerts` keeps as plain atomics.
//!
//! Invariants:
//! - A scrape is one OpenMetrics text exposition ending in exactly one `# EOF`.
//! - Names follow Prometheus conventions: `capataz_` prefix, snake case, `_total` on counters,
//!   seconds as the time unit. Labels are `pool`, `backend`, `class`, `result`, `to`, `hook`.
//! - Series of a backend removed by a reload keep their last value; its gauges disappear.

use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use capataz_health::{ProbeResult, Reason, State, Transition};
use prometheus_client::encoding::{text, EncodeLabelSet};
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::{Registry, Unit};

use crate::alerts::AlertStats;
use crate::health::PoolRt;

/// The `Content-Type` of the exposition.
pub const CONTENT_TYPE: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";

/// Upper bounds of the latency buckets, in seconds: 0.5 ms to 30 s, then `+Inf`.
const BUCKETS: [f64; 15] = [
    0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0,
];

/// A family of latency histograms, one per pool and backend.
type Latencies = Family<BackendLabels, Histogram, fn() -> Histogram>;

fn latency_histogram() -> Histogram {
    Histogram::new(BUCKETS)
}

/// The answer classes of `capataz_requests_total`, in the order of [`BackendMetrics`] handles.
const CLASSES: [&str; 6] = ["1xx", "2xx", "3xx", "4xx", "5xx", "error"];

/// The process-wide families. Pools are rebuilt on reload; their label sets are not.
static METRICS: OnceLock<Metrics> = OnceLock::new();

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct PoolLabels {
    pool: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct BackendLabels {
    pool: String,
    backend: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct RequestLabels {
    pool: String,
    backend: String,
    class: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ProbeLabels {
    pool: String,
    backend: String,
    result: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct TransitionLabels {
    pool: String,
    backend: String,
    to: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct HookLabels {
    hook: &'static str,
}

/// The counter and histogram families, and the registry that holds them.
#[derive(Debug)]
struct Metrics {
    registry: Registry,
    requests: Family<RequestLabels, Counter>,
    upstream_response: Latencies,
    retries: Family<PoolLabels, Counter>,
    rejected: Family<PoolLabels, Counter>,
    probes: Family<ProbeLabels, Counter>,
    probe_duration: Latencies,
    transitions: Family<TransitionLabels, Counter>,
    ejections: Family<BackendLabels, Counter>,
}

impl Metrics {
    fn global() -> &'static Metrics {
        METRICS.get_or_init(Metrics::new)
    }

    fn new() -> Metrics {
        let mut registry = Registry::default();
        let requests = Family::default();
        registry.register(
            "capataz_requests",
            "Attempts sent to a backend, by the class of its answer (error: no answer came)",
            requests.clone(),
        );
        let upstream_response = Latencies::new_with_constructor(latency_histogram);
        registry.register_with_unit(
            "capataz_upstream_response",
            "Time from sending a request to a backend to its response headers",
            Unit::Seconds,
            upstream_response.clone(),
        );
        let retries = Family::default();
        registry.register(
            "capataz_retries",
            "Attempts made on another backend after a failed one",
            retries.clone(),
        );
        let rejected = Family::default();
        registry.register(
            "capataz_rejected",
            "Requests answered 503 without trying a backend, because none was eligible",
            rejected.clone(),
        );
        let probes = Family::default();
        registry.register(
            "capataz_probes",
            "Active health probes, by how the probe rule judged them",
            probes.clone(),
        );
        let probe_duration = Latencies::new_with_constructor(latency_histogram);
        registry.register_with_unit(
            "capataz_probe_duration",
            "Time an active health probe took",
            Unit::Seconds,
            probe_duration.clone(),
        );
        let transitions = Family::default();
        registry.register(
            "capataz_transitions",
            "Health verdict changes, by the verdict changed to",
            transitions.clone(),
        );
        let ejections = Family::default();
        registry.register(
            "capataz_ejections",
            "Backends taken out by passive checks (traffic errors, or a failed probation)",
            ejections.clone(),
        );
        Metrics {
            registry,
            requests,
            upstream_response,
            retries,
            rejected,
            probes,
            probe_duration,
            transitions,
            ejections,
        }
    }
}

/// One pool's metric handles, resolved once when the pool is built.
#[derive(Debug)]
pub(crate) struct PoolMetrics {
    retries: Counter,
    rejected: Counter,
}

impl PoolMetrics {
    /// The handles of pool `pool`; a pool rebuilt under the same name gets the same counters.
    pub(crate) fn new(pool: &str) -> PoolMetrics {
        let metrics = Metrics::global();
        let labels = PoolLabels { pool: pool.into() };
        PoolMetrics {
            retries: metrics.retries.get_or_create_owned(&labels),
            rejected: metrics.rejected.get_or_create_owned(&labels),
        }
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
    requests: [Counter; 6],
    upstream_response: Histogram,
    probes_pass: Counter,
    probes_fail: Counter,
    probe_duration: Histogram,
    to_up: Counter,
    to_down: Counter,
    ejections: Counter,
}

impl BackendMetrics {
    /// The handles of backend `backend` of pool `pool`; a backend rebuilt under the same names
    /// gets the same counters.
    pub(crate) fn new(pool: &str, backend: &str) -> BackendMetrics {
        let metrics = Metrics::global();
        let labels = BackendLabels {
            pool: pool.into(),
            backend: backend.into(),
        };
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
            upstream_response: metrics.upstream_response.get_or_create_owned(&labels),
            probes_pass: probe("pass"),
            probes_fail: probe("fail"),
            probe_duration: metrics.probe_duration.get_or_create_owned(&labels),
            to_up: transition("up"),
            to_down: transition("down"),
            ejections: metrics.ejections.get_or_create_owned(&labels),
        }
    }

    /// Counts an attempt the backend answered with `status`, `elapsed` after it was sent.
    pub(crate) fn answered(&self, status: u16, elapsed: Duration) {
        self.requests[class_index(status)].inc();
        self.upstream_response.observe(elapsed.as_secs_f64());
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
        };
        self.probe_duration.observe(latency.as_secs_f64());
    }

    /// Counts one verdict change, and an ejection when passive checks caused it.
    pub(crate) fn transition(&self, transition: &Transition) {
        match transition.to {
            State::Up => self.to_up.inc(),
            State::Down => self.to_down.inc(),
        };
        if matches!(
            transition.reason,
            Reason::TrafficErrors { .. } | Reason::ProbationFailed { .. }
        ) {
            self.ejections.inc();
        }
    }
}

/// The index in [`CLASSES`] of an answer with `status`; a code outside 100-599 (hyper lets
/// 600-999 through) has no class and counts as `error`.
fn class_index(status: u16) -> usize {
    match status / 100 {
        class @ 1..=5 => usize::from(class) - 1,
        _ => CLASSES.len() - 1,
    }
}

/// The metrics as one OpenMetrics text exposition: the counters, then gauges read now from
/// `pools` (and the alert counters, when hooks run).
pub fn render(pools: &[Arc<PoolRt>], alerts: Option<&AlertStats>) -> Result<String, fmt::Error> {
    let mut out = String::with_capacity(16 * 1024);
    text::encode_registry(&mut out, &Metrics::global().registry)?;
    text::encode_registry(&mut out, &live_registry(pools, alerts))?;
    text::encode_eof(&mut out)?;
    Ok(out)
}

/// A registry of gauges and alert counters built from the state at this moment.
fn live_registry(pools: &[Arc<PoolRt>], alerts: Option<&AlertStats>) -> Registry {
    let up = Family::<BackendLabels, Gauge>::default();
    let in_flight = Family::<BackendLabels, Gauge>::default();
    let weight = Family::<BackendLabels, Gauge<f64, AtomicU64>>::default();
    let healthy = Family::<PoolLabels, Gauge>::default();
    let all_down = Family::<PoolLabels, Gauge>::default();
    for pool in pools {
        let pool_labels = PoolLabels {
            pool: pool.name.to_string(),
        };
        let views = pool.views();
        for view in &views {
            let labels = BackendLabels {
                pool: pool_labels.pool.clone(),
                backend: view.backend.name.to_string(),
            };
            up.get_or_create(&labels).set(i64::from(view.eligible));
            let flying = view.backend.in_flight.load(Ordering::Relaxed);
            in_flight
                .get_or_create(&labels)
                .set(i64::try_from(flying).unwrap_or(i64::MAX));
            weight
                .get_or_create(&labels)
                .set(f64::from(view.effective_weight_tenths) / 10.0);
        }
        let eligible = views.iter().filter(|v| v.eligible).count();
        healthy
            .get_or_create(&pool_labels)
            .set(i64::try_from(eligible).unwrap_or(i64::MAX));
        all_down
            .get_or_create(&pool_labels)
            .set(i64::from(pool.snapshot().all_down));
    }
    let mut registry = Registry::default();
    registry.register(
        "capataz_backend_up",
        "1 when the backend may get new requests (health and overrides), else 0",
        up,
    );
    registry.register(
        "capataz_backend_in_flight",
        "Requests sent to the backend whose response has not been read to the end",
        in_flight,
    );
    registry.register(
        "capataz_backend_effective_weight",
        "The backend's weight now (below the configured one during slow start)",
        weight,
    );
    registry.register(
        "capataz_pool_healthy_backends",
        "Backends of the pool that may get new requests",
        healthy,
    );
    registry.register(
        "capataz_pool_all_down",
        "1 when the pool has no eligible backend and its all-down policy applies, else 0",
        all_down,
    );
    if let Some(stats) = alerts {
        register_alerts(&mut registry, stats);
    }
    registry
}

fn register_alerts(registry: &mut Registry, stats: &AlertStats) {
    let delivered = Family::<HookLabels, Counter>::default();
    let failed = Family::<HookLabels, Counter>::default();
    let dropped = Family::<HookLabels, Counter>::default();
    let suppressed = Family::<HookLabels, Counter>::default();
    for (hook, counts) in stats.hooks() {
        let labels = HookLabels { hook };
        delivered.get_or_create(&labels).inc_by(counts.delivered());
        failed.get_or_create(&labels).inc_by(counts.failed());
        dropped.get_or_create(&labels).inc_by(counts.dropped());
        suppressed
            .get_or_create(&labels)
            .inc_by(counts.suppressed());
    }
    registry.register(
        "capataz_alerts_delivered",
        "Alerts a hook accepted",
        delivered,
    );
    registry.register(
        "capataz_alerts_failed",
        "Alerts a hook did not accept after its retries",
        failed,
    );
    registry.register(
        "capataz_alerts_dropped",
        "Alerts lost before delivery (a full queue, or a lagging dispatcher)",
        dropped,
    );
    // Per hook, like the stats: debouncing counts a folded event once for each hook it
    // would have reached, so an unlabelled sum would count it several times.
    registry.register(
        "capataz_alerts_suppressed",
        "Events folded away by debouncing instead of alerting on their own",
        suppressed,
    );
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn classes() {
        assert_eq!(CLASSES[class_index(101)], "1xx");
        assert_eq!(CLASSES[class_index(200)], "2xx");
        assert_eq!(CLASSES[class_index(304)], "3xx");
        assert_eq!(CLASSES[class_index(404)], "4xx");
        assert_eq!(CLASSES[class_index(599)], "5xx");
        assert_eq!(CLASSES[class_index(600)], "error");
        assert_eq!(CLASSES[class_index(99)], "error");
    }

    #[test]
    fn histogram_buckets_are_inclusive_and_cumulative() {
        let h = latency_histogram();
        h.observe(0.0005); // exactly on the first bound
        h.observe(0.000501);
        h.observe(60.0); // past the last bound
        let mut registry = Registry::default();
        registry.register_with_unit("t", "test", Unit::Seconds, h);
        let mut out = String::new();
        text::encode(&mut out, &registry).unwrap();
        assert!(out.contains("t_seconds_count 3\n"), "{out}");
        assert!(out.contains("t_seconds_bucket{le=\"0.0005\"} 1\n"), "{out}");
        assert!(out.contains("t_seconds_bucket{le=\"0.001\"} 2\n"), "{out}");
        assert!(out.contains("t_seconds_bucket{le=\"30.0\"} 2\n"), "{out}");
        assert!(out.contains("t_seconds_bucket{le=\"+Inf\"} 3\n"), "{out}");
        assert!(out.ends_with("# EOF\n"));
    }

    #[test]
    fn handles_survive_a_rebuild() {
        let first = BackendMetrics::new("metrics_unit_pool", "a");
        first.answered(200, Duration::from_millis(1));
        first.unanswered();
        let again = BackendMetrics::new("metrics_unit_pool", "a");
        again.answered(204, Duration::from_millis(1));
        assert_eq!(again.requests[1].get(), 2);
        assert_eq!(again.requests[5].get(), 1);
        let pool = PoolMetrics::new("metrics_unit_pool");
        pool.retry();
        pool.reject();
        assert_eq!(PoolMetrics::new("metrics_unit_pool").retries.get(), 1);
    }
}
