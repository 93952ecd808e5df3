//! The metric handles the runtime updates (counters and latency histograms, per pool and per
//! backend) and the families they belong to, registered into the registry of the balancer
//! that owns them.
//!
//! The proxy is benchmarked against HAProxy, so the request path pays for metrics with two
//! clock reads, one atomic add and one histogram observation (about 80 ns in all) and nothing
//! else. Every label set is resolved once, when a pool or backend is built: `PoolMetrics` and
//! `BackendMetrics` hold ready handles, so no request builds, hashes or looks up a label set.
//!
//! Registered, not global: a balancer makes one [`Families`] with [`Families::register`] into
//! its own `Registry` (which `crate::metrics` exposes), and every pool it builds takes its
//! handles from there. Two balancers in one process share nothing; a reload rebuilds the pools
//! from the same `Families`, asks for the same label sets and gets the same counters back, so
//! series continue.
//!
//! Counters are per backend; latency histograms are per pool, unless
//! `admin.metrics_backend_histograms` asks for one per backend ([`HistogramScope`]). A
//! histogram is 18 series, so per backend the two of them were two thirds of a scrape (320,000
//! of 500,000 series with 10,000 backends); Envoy keeps latency histograms per cluster, and
//! HAProxy has none per server. Per pool, each backend's handles hold a clone of the pool's
//! histogram (clones share one `Arc`), so the request path still resolves nothing; the price is
//! that concurrent requests of one pool take the same histogram lock.
//!
//! This module sits at the bottom of the crate (it needs only `config` and the engine's
//! types), so the health runtime and the request path can hold handles without depending on
//! the exposition, which reads them back (`metrics` -> `health` -> `instruments`).
//!
//! Invariants:
//! - Names follow Prometheus conventions: `capataz_` prefix, snake case, `_total` on counters,
//!   seconds as the time unit. Labels are `pool`, `backend`, `class`, `result`, `to`.
//! - A pool's latency histograms are per pool or per backend, never both: the scope belongs to
//!   the `Families`, chosen when the balancer starts, and a reload keeps it, so no sum counts
//!   an answer twice.
//! - Series of a backend removed by a reload keep their last value.

use std::fmt;
use std::time::Duration;

use capataz_health::{ProbeResult, Reason, State, Transition};
use prometheus_client::encoding::{EncodeLabel, EncodeLabelSet, LabelSetEncoder};
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::{Registry, Unit};

use crate::config::Config;

/// Upper bounds of the latency buckets, in seconds: 0.5 ms to 30 s, then `+Inf`.
const BUCKETS: [f64; 15] = [
    0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0,
];

/// A family of latency histograms, one per pool or one per backend.
type Latencies = Family<HistogramLabels, Histogram, fn() -> Histogram>;

fn latency_histogram() -> Histogram {
    Histogram::new(BUCKETS)
}

/// The answer classes of `capataz_requests_total`, in the order of [`BackendMetrics`] handles.
const CLASSES: [&str; 6] = ["1xx", "2xx", "3xx", "4xx", "5xx", "error"];

/// Which labels the latency histograms (`capataz_upstream_response_seconds`,
/// `capataz_probe_duration_seconds`) carry.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum HistogramScope {
    /// One histogram per pool (`pool`), whatever the number of backends: the default.
    #[default]
    Pool,
    /// One histogram per backend (`pool`, `backend`), for small deployments
    /// (`admin.metrics_backend_histograms = true`): 18 series per backend and histogram.
    Backend,
}

impl HistogramScope {
    /// The scope `config` asks for.
    pub fn of(config: &Config) -> HistogramScope {
        match &config.admin {
            Some(admin) if admin.metrics_backend_histograms => HistogramScope::Backend,
            _ => HistogramScope::Pool,
        }
    }
}

impl fmt::Display for HistogramScope {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            HistogramScope::Pool => "per pool",
            HistogramScope::Backend => "per backend",
        })
    }
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct PoolLabels {
    pool: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct BackendLabels {
    pool: String,
    backend: String,
}

/// The labels of a latency histogram: `pool`, and `backend` with [`HistogramScope::Backend`].
/// (A derived label set would write `backend=""` for `None`, not leave the label out.)
#[derive(Clone, Debug, Hash, PartialEq, Eq)]
struct HistogramLabels {
    pool: String,
    backend: Option<String>,
}

impl EncodeLabelSet for HistogramLabels {
    fn encode(&self, encoder: &mut LabelSetEncoder) -> Result<(), fmt::Error> {
        ("pool", self.pool.as_str()).encode(encoder.encode_label())?;
        if let Some(backend) = &self.backend {
            ("backend", backend.as_str()).encode(encoder.encode_label())?;
        }
        Ok(())
    }
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

/// The counter and histogram families of one balancer, and the latency scope it started with.
/// Clones share the families (each is an `Arc`).
#[derive(Clone, Debug)]
pub struct Families {
    scope: HistogramScope,
    requests: Family<RequestLabels, Counter>,
    upstream_response: Latencies,
    retries: Family<PoolLabels, Counter>,
    rejected: Family<PoolLabels, Counter>,
    probes: Family<ProbeLabels, Counter>,
    probe_duration: Latencies,
    transitions: Family<TransitionLabels, Counter>,
    ejections: Family<BackendLabels, Counter>,
}

impl Families {
    /// Registers every family into `registry` (in the order a scrape shows them), with latency
    /// histograms labelled as `scope` says.
    pub fn register(registry: &mut Registry, scope: HistogramScope) -> Families {
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
        Families {
            scope,
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

    /// How latency histograms are labelled.
    pub fn scope(&self) -> HistogramScope {
        self.scope
    }

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
    retries: Counter,
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
    requests: [Counter; 6],
    probes_pass: Counter,
    probes_fail: Counter,
    to_up: Counter,
    to_down: Counter,
    ejections: Counter,
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
            to_up: transition("up"),
            to_down: transition("down"),
            ejections: metrics.ejections.get_or_create_owned(&BackendLabels {
                pool: pool.into(),
                backend: backend.into(),
            }),
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

#[cfg(test)]
mod tests {
    use prometheus_client::encoding::text;

    use super::*;

    /// Families registered into a registry of their own.
    fn families(scope: HistogramScope) -> (Registry, Families) {
        let mut registry = Registry::default();
        let families = Families::register(&mut registry, scope);
        (registry, families)
    }

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

    /// The lines of `registry` that mention `pool` and start with `name`.
    fn lines(registry: &Registry, name: &str, pool: &str) -> Vec<String> {
        let mut out = String::new();
        text::encode_registry(&mut out, registry).unwrap();
        let pool = format!("pool=\"{pool}\"");
        out.lines()
            .filter(|l| l.starts_with(name) && l.contains(&pool))
            .map(str::to_owned)
            .collect()
    }

    #[test]
    fn handles_survive_a_rebuild() {
        let (registry, families) = families(HistogramScope::Pool);
        let pool = families.pool("metrics_unit_pool");
        let first = pool.backend("a");
        first.answered(200, Duration::from_millis(1));
        first.unanswered();
        let again = families.pool("metrics_unit_pool").backend("a");
        again.answered(204, Duration::from_millis(1));
        assert_eq!(again.requests[1].get(), 2);
        assert_eq!(again.requests[5].get(), 1);
        pool.retry();
        pool.reject();
        let rebuilt = families.pool("metrics_unit_pool");
        assert_eq!(rebuilt.retries.get(), 1);
        assert_eq!(
            lines(
                &registry,
                "capataz_upstream_response_seconds_count",
                "metrics_unit_pool"
            ),
            ["capataz_upstream_response_seconds_count{pool=\"metrics_unit_pool\"} 2"]
        );
    }

    #[test]
    fn pool_histograms_count_every_backend_of_the_pool() {
        let (registry, families) = families(HistogramScope::Pool);
        let pool = families.pool("metrics_unit_shared");
        let (a, b) = (pool.backend("a"), pool.backend("b"));
        a.answered(200, Duration::from_micros(300));
        b.answered(503, Duration::from_millis(20));
        b.answered(200, Duration::from_millis(20));
        a.unanswered(); // not timed: no answer came
        a.probe(ProbeResult::Pass, Duration::from_millis(2));
        b.probe(ProbeResult::Fail, Duration::from_secs(1));
        let counts = |name: &str| lines(&registry, name, "metrics_unit_shared");
        assert_eq!(
            counts("capataz_upstream_response_seconds_count"),
            ["capataz_upstream_response_seconds_count{pool=\"metrics_unit_shared\"} 3"]
        );
        assert_eq!(
            counts("capataz_probe_duration_seconds_count"),
            ["capataz_probe_duration_seconds_count{pool=\"metrics_unit_shared\"} 2"]
        );
        let buckets = counts("capataz_upstream_response_seconds_bucket");
        assert_eq!(buckets.len(), BUCKETS.len() + 1, "{buckets:?}");
        assert!(buckets.contains(
            &"capataz_upstream_response_seconds_bucket{le=\"0.0005\",pool=\"metrics_unit_shared\"} 1"
                .to_owned()
        ));
        assert!(buckets.contains(
            &"capataz_upstream_response_seconds_bucket{le=\"0.025\",pool=\"metrics_unit_shared\"} 3"
                .to_owned()
        ));
        // Counters stay per backend.
        assert_eq!(
            counts("capataz_requests_total")
                .iter()
                .filter(|l| l.contains("backend=\"b\"") && l.ends_with(" 1"))
                .count(),
            2,
            "b: one 2xx, one 5xx"
        );
    }

    #[test]
    fn backend_histograms_carry_the_backend_label() {
        let (registry, families) = families(HistogramScope::Backend);
        let pool = families.pool("metrics_unit_own");
        let (a, b) = (pool.backend("a"), pool.backend("b"));
        a.answered(200, Duration::from_millis(1));
        b.answered(200, Duration::from_millis(1));
        b.answered(200, Duration::from_millis(1));
        b.probe(ProbeResult::Pass, Duration::from_millis(1));
        let mut counts = lines(
            &registry,
            "capataz_upstream_response_seconds_count",
            "metrics_unit_own",
        );
        counts.sort();
        assert_eq!(
            counts,
            [
                "capataz_upstream_response_seconds_count{pool=\"metrics_unit_own\",backend=\"a\"} 1",
                "capataz_upstream_response_seconds_count{pool=\"metrics_unit_own\",backend=\"b\"} 2",
            ]
        );
        let mut probes = lines(
            &registry,
            "capataz_probe_duration_seconds_count",
            "metrics_unit_own",
        );
        probes.sort();
        assert_eq!(
            probes,
            [
                "capataz_probe_duration_seconds_count{pool=\"metrics_unit_own\",backend=\"a\"} 0",
                "capataz_probe_duration_seconds_count{pool=\"metrics_unit_own\",backend=\"b\"} 1",
            ]
        );
    }

    #[test]
    fn families_of_two_registries_share_no_counter() {
        let (first, one) = families(HistogramScope::Pool);
        let (second, two) = families(HistogramScope::Pool);
        one.pool("p")
            .backend("a")
            .answered(200, Duration::from_millis(1));
        one.pool("p").retry();
        let _idle = two.pool("p").backend("a");
        let count = |registry: &Registry, name: &str| lines(registry, name, "p");
        assert_eq!(
            count(
                &first,
                "capataz_requests_total{pool=\"p\",backend=\"a\",class=\"2xx\"}"
            ),
            ["capataz_requests_total{pool=\"p\",backend=\"a\",class=\"2xx\"} 1"]
        );
        assert_eq!(
            count(
                &second,
                "capataz_requests_total{pool=\"p\",backend=\"a\",class=\"2xx\"}"
            ),
            ["capataz_requests_total{pool=\"p\",backend=\"a\",class=\"2xx\"} 0"]
        );
        assert_eq!(two.pool("p").retries.get(), 0);
        assert_eq!(one.pool("p").retries.get(), 1);
    }
}
