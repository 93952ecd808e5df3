//! Prometheus metrics: counters kept beside the runtime, and the `GET /metrics` exposition.
//!
//! The proxy is benchmarked against HAProxy, so the request path pays for metrics with two
//! clock reads, one atomic add and one histogram observation (about 80 ns in all) and nothing
//! else. Every label set is resolved once, when a pool or backend is built: `PoolMetrics` and
//! `BackendMetrics` hold ready handles, so no request builds, hashes or looks up a label set.
//! The families live in one process-wide registry, registered once; a reload rebuilds the
//! pools, asks for the same label sets and gets the same counters back, so series continue.
//!
//! Counters are per backend; latency histograms are per pool, unless
//! `admin.metrics_backend_histograms` asks for one per backend ([`HistogramScope`]). A
//! histogram is 18 series, so per backend the two of them were two thirds of a scrape (320,000
//! of 500,000 series with 10,000 backends); Envoy keeps latency histograms per cluster, and
//! HAProxy has none per server. Per pool, each backend's handles hold a clone of the pool's
//! histogram (clones share one `Arc`), so the request path still resolves nothing; the price is
//! that concurrent requests of one pool take the same histogram lock.
//!
//! Everything that describes the present (is a backend eligible, how many requests are in
//! flight, its weight, is the pool all down) is a gauge read from the live pools at scrape
//! time, so it costs nothing between scrapes and cannot drift from the state it reports. So
//! are the alert hooks' counters, which `alerts` keeps as plain atomics. A scrape reads those
//! gauges with one short lock per pool and writes them straight out, in pool order, without
//! building a label map; the exposition goes into one buffer sized from the last one.
//!
//! Invariants:
//! - A scrape is one OpenMetrics text exposition ending in exactly one `# EOF`.
//! - Names follow Prometheus conventions: `capataz_` prefix, snake case, `_total` on counters,
//!   seconds as the time unit. Labels are `pool`, `backend`, `class`, `result`, `to`, `hook`.
//! - A pool's latency histograms are per pool or per backend, never both: the scope is chosen
//!   when the balancer starts and a reload keeps it, so no sum counts an answer twice.
//! - Series of a backend removed by a reload keep their last value; its gauges disappear.

use std::fmt;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use capataz_health::{ProbeResult, Reason, State, Transition};
use prometheus_client::collector::Collector;
use prometheus_client::encoding::{
    text, DescriptorEncoder, EncodeGaugeValue, EncodeLabel, EncodeLabelSet, LabelSetEncoder,
};
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::metrics::MetricType;
use prometheus_client::registry::{Registry, Unit};

use crate::alerts::AlertStats;
use crate::config::Config;
use crate::health::PoolRt;

/// The `Content-Type` of the exposition.
pub const CONTENT_TYPE: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";

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

/// The process-wide families. Pools are rebuilt on reload; their label sets are not.
static METRICS: OnceLock<Metrics> = OnceLock::new();

/// The length of the last exposition, so the next one is written into a buffer allocated once.
static LAST_LENGTH: AtomicUsize = AtomicUsize::new(0);

/// A first guess at the exposition's length per backend, before a scrape has measured it: 14
/// lines of about 65 bytes with per-pool histograms, and room for longer names.
const GUESS_PER_BACKEND: usize = 1200;

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
    pool: String,
    retries: Counter,
    rejected: Counter,
    /// With [`HistogramScope::Pool`], the histograms every backend of the pool observes into;
    /// `None` when each backend has its own.
    shared: Option<LatencyHistograms>,
}

impl PoolMetrics {
    /// The handles of pool `pool`, with its latency histograms labelled as `scope` says; a pool
    /// rebuilt under the same name gets the same counters and histograms.
    pub(crate) fn new(pool: &str, scope: HistogramScope) -> PoolMetrics {
        let metrics = Metrics::global();
        let labels = PoolLabels { pool: pool.into() };
        let shared = match scope {
            HistogramScope::Pool => Some(metrics.latency(&HistogramLabels {
                pool: pool.into(),
                backend: None,
            })),
            HistogramScope::Backend => None,
        };
        PoolMetrics {
            pool: pool.into(),
            retries: metrics.retries.get_or_create_owned(&labels),
            rejected: metrics.rejected.get_or_create_owned(&labels),
            shared,
        }
    }

    /// The handles of this pool's backend `backend`; a backend rebuilt under the same names
    /// gets the same counters.
    pub(crate) fn backend(&self, backend: &str) -> BackendMetrics {
        let latency = match &self.shared {
            Some(shared) => shared.clone(),
            None => Metrics::global().latency(&HistogramLabels {
                pool: self.pool.clone(),
                backend: Some(backend.into()),
            }),
        };
        BackendMetrics::new(&self.pool, backend, latency)
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
    fn new(pool: &str, backend: &str, latency: LatencyHistograms) -> BackendMetrics {
        let metrics = Metrics::global();
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

/// The metrics as one OpenMetrics text exposition: the counters and histograms, then gauges
/// read now from `pools` (and the alert counters, when hooks run).
pub fn render(pools: &[Arc<PoolRt>], alerts: Option<&AlertStats>) -> Result<String, fmt::Error> {
    let gauges = LiveGauges::read(pools);
    // The last exposition's length plus an eighth covers backends added since and growing
    // counter values; before the first one, a guess from the backend count.
    let last = LAST_LENGTH.load(Ordering::Relaxed);
    let capacity = if last > 0 {
        last + last / 8
    } else {
        16 * 1024 + gauges.backends.len() * GUESS_PER_BACKEND
    };
    let mut out = String::with_capacity(capacity);
    text::encode_registry(&mut out, &Metrics::global().registry)?;
    let mut live = Registry::default();
    live.register_collector(Box::new(gauges));
    if let Some(stats) = alerts {
        register_alerts(&mut live, stats);
    }
    text::encode_registry(&mut out, &live)?;
    text::encode_eof(&mut out)?;
    LAST_LENGTH.store(out.len(), Ordering::Relaxed);
    Ok(out)
}

/// The gauges of one scrape, read from the live pools as it starts, in pool order.
#[derive(Debug)]
struct LiveGauges {
    backends: Vec<BackendGauges>,
    pools: Vec<PoolGauges>,
}

/// The labels of a backend's gauges; the names are shared with the runtime, not copied.
#[derive(Debug, EncodeLabelSet)]
struct LiveBackendLabels {
    pool: Arc<str>,
    backend: Arc<str>,
}

#[derive(Debug, EncodeLabelSet)]
struct LivePoolLabels {
    pool: Arc<str>,
}

#[derive(Debug)]
struct BackendGauges {
    labels: LiveBackendLabels,
    up: bool,
    in_flight: usize,
    weight_tenths: u32,
}

#[derive(Debug)]
struct PoolGauges {
    labels: LivePoolLabels,
    healthy: usize,
    all_down: bool,
}

impl LiveGauges {
    /// Reads every gauge: one lock per pool for eligibility, atomics for the rest.
    fn read(pools: &[Arc<PoolRt>]) -> LiveGauges {
        let count = pools.iter().map(|p| p.backends.len()).sum();
        let mut backends = Vec::with_capacity(count);
        let mut pool_gauges = Vec::with_capacity(pools.len());
        for pool in pools {
            let eligible = pool.eligibility();
            for (backend, &(up, weight_tenths)) in pool.backends.iter().zip(&eligible) {
                backends.push(BackendGauges {
                    labels: LiveBackendLabels {
                        pool: pool.name.clone(),
                        backend: backend.name.clone(),
                    },
                    up,
                    in_flight: backend.in_flight.load(Ordering::Relaxed),
                    weight_tenths,
                });
            }
            pool_gauges.push(PoolGauges {
                labels: LivePoolLabels {
                    pool: pool.name.clone(),
                },
                healthy: eligible.iter().filter(|(up, _)| *up).count(),
                all_down: pool.snapshot().all_down,
            });
        }
        LiveGauges {
            backends,
            pools: pool_gauges,
        }
    }
}

impl Collector for LiveGauges {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), fmt::Error> {
        let backends = &self.backends;
        encode_gauges(
            &mut encoder,
            "capataz_backend_up",
            "1 when the backend may get new requests (health and overrides), else 0.",
            backends.iter().map(|b| (&b.labels, i64::from(b.up))),
        )?;
        encode_gauges(
            &mut encoder,
            "capataz_backend_in_flight",
            "Requests sent to the backend whose response has not been read to the end.",
            backends.iter().map(|b| (&b.labels, b.in_flight)),
        )?;
        encode_gauges(
            &mut encoder,
            "capataz_backend_effective_weight",
            "The backend's weight now (below the configured one during slow start).",
            backends
                .iter()
                .map(|b| (&b.labels, f64::from(b.weight_tenths) / 10.0)),
        )?;
        encode_gauges(
            &mut encoder,
            "capataz_pool_healthy_backends",
            "Backends of the pool that may get new requests.",
            self.pools.iter().map(|p| (&p.labels, p.healthy)),
        )?;
        encode_gauges(
            &mut encoder,
            "capataz_pool_all_down",
            "1 when the pool has no eligible backend and its all-down policy applies, else 0.",
            self.pools
                .iter()
                .map(|p| (&p.labels, i64::from(p.all_down))),
        )
    }
}

/// Writes one gauge family: its descriptor, then one sample per `(labels, value)`. (`help`
/// ends with a period, as `Registry::register` would add one.)
fn encode_gauges<'a, L, V>(
    encoder: &mut DescriptorEncoder,
    name: &str,
    help: &str,
    samples: impl Iterator<Item = (&'a L, V)>,
) -> Result<(), fmt::Error>
where
    L: EncodeLabelSet + 'a,
    V: EncodeGaugeValue,
{
    let mut family = encoder.encode_descriptor(name, help, None, MetricType::Gauge)?;
    for (labels, value) in samples {
        family.encode_family(labels)?.encode_gauge(&value)?;
    }
    Ok(())
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

    /// The lines of the process-wide families that mention `pool` and start with `name`.
    fn lines(name: &str, pool: &str) -> Vec<String> {
        let mut out = String::new();
        text::encode_registry(&mut out, &Metrics::global().registry).unwrap();
        let pool = format!("pool=\"{pool}\"");
        out.lines()
            .filter(|l| l.starts_with(name) && l.contains(&pool))
            .map(str::to_owned)
            .collect()
    }

    #[test]
    fn handles_survive_a_rebuild() {
        let pool = PoolMetrics::new("metrics_unit_pool", HistogramScope::Pool);
        let first = pool.backend("a");
        first.answered(200, Duration::from_millis(1));
        first.unanswered();
        let again = PoolMetrics::new("metrics_unit_pool", HistogramScope::Pool).backend("a");
        again.answered(204, Duration::from_millis(1));
        assert_eq!(again.requests[1].get(), 2);
        assert_eq!(again.requests[5].get(), 1);
        pool.retry();
        pool.reject();
        let rebuilt = PoolMetrics::new("metrics_unit_pool", HistogramScope::Pool);
        assert_eq!(rebuilt.retries.get(), 1);
        assert_eq!(
            lines(
                "capataz_upstream_response_seconds_count",
                "metrics_unit_pool"
            ),
            ["capataz_upstream_response_seconds_count{pool=\"metrics_unit_pool\"} 2"]
        );
    }

    #[test]
    fn pool_histograms_count_every_backend_of_the_pool() {
        let pool = PoolMetrics::new("metrics_unit_shared", HistogramScope::Pool);
        let (a, b) = (pool.backend("a"), pool.backend("b"));
        a.answered(200, Duration::from_micros(300));
        b.answered(503, Duration::from_millis(20));
        b.answered(200, Duration::from_millis(20));
        a.unanswered(); // not timed: no answer came
        a.probe(ProbeResult::Pass, Duration::from_millis(2));
        b.probe(ProbeResult::Fail, Duration::from_secs(1));
        let counts = |name: &str| lines(name, "metrics_unit_shared");
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
        let pool = PoolMetrics::new("metrics_unit_own", HistogramScope::Backend);
        let (a, b) = (pool.backend("a"), pool.backend("b"));
        a.answered(200, Duration::from_millis(1));
        b.answered(200, Duration::from_millis(1));
        b.answered(200, Duration::from_millis(1));
        b.probe(ProbeResult::Pass, Duration::from_millis(1));
        let mut counts = lines(
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
        let mut probes = lines("capataz_probe_duration_seconds_count", "metrics_unit_own");
        probes.sort();
        assert_eq!(
            probes,
            [
                "capataz_probe_duration_seconds_count{pool=\"metrics_unit_own\",backend=\"a\"} 0",
                "capataz_probe_duration_seconds_count{pool=\"metrics_unit_own\",backend=\"b\"} 1",
            ]
        );
    }
}
