//! The metric handles the runtime updates (counters and latency histograms, per pool and per
//! backend, and on the client side per listener and route) and the families they belong to,
//! registered into the registry of the balancer that owns them.
//!
//! The proxy is benchmarked against HAProxy, so the request path pays for metrics with four
//! clock reads and a few relaxed atomic adds (the latency histograms on the request path are
//! `Timing`s, no mutex), and nothing else. Every label set is resolved once, when a pool, backend or listener is built:
//! `PoolMetrics`, `BackendMetrics`, `ListenerMetrics` and `RouteMetrics` hold ready handles
//! (a route's per method, class and answerer, each created on its first request), so no request
//! builds, hashes or looks up a label set.
//!
//! Registered, not global: a balancer makes one [`Families`] with [`Families::register`] into
//! its own `Registry` (which the runtime's `metrics` exposes), and every pool it builds takes its
//! handles from there. Two balancers in one process share nothing; a reload rebuilds the pools
//! from the same `Families`, asks for the same label sets and gets the same counters back, so
//! series continue.
//!
//! Counters are per backend, one block of atomics per backend found by pool and backend name
//! and encoded at scrape time (`counters`: eleven registry series per backend were 1.8 KB, 18
//! MB at 10,000 backends); latency histograms are per pool, unless
//! `admin.metrics_backend_histograms` asks for one per backend ([`HistogramScope`]). A
//! histogram is 18 series, so per backend the two of them were two thirds of a scrape (320,000
//! of 500,000 series with 10,000 backends); Envoy keeps latency histograms per cluster, and
//! HAProxy has none per server. Per pool, each backend's handles hold a clone of the pool's
//! histogram (clones share one `Arc`), so the request path still resolves nothing; the price is
//! that concurrent requests of one pool take the same histogram lock.
//!
//! The families, their labels and the latency scope are here; the handles a pool and a backend
//! hold, and how they are resolved from the families, are in `handles`; the backends' counter
//! blocks and the families that show them in `counters`; a listener's and a
//! route's in `listener`; `timing` is the lock-free histogram of client request durations.
//!
//! This module sits at the bottom of the crate (it needs only `config`, `tls` and the engine's
//! types), so the health runtime and the request path can hold handles without depending on
//! the exposition, which reads them back (`metrics` -> `health` -> `instruments`).
//!
//! Invariants:
//! - Names follow Prometheus conventions: `capataz_` prefix, snake case, `_total` on counters,
//!   seconds and bytes as units. Labels are `pool`, `backend`, `class`, `result`, `to`, on
//!   the client side `listener`, `route`, `method`, `answered_by`, and for TLS `listener`,
//!   `reason`, `certificate`.
//! - A pool's latency histograms are per pool or per backend, never both: the scope belongs to
//!   the `Families`, chosen when the balancer starts, and a reload keeps it, so no sum counts
//!   an answer twice.
//! - Series of a removed backend keep their last value until no pool holds it and the
//!   counters are next swept (`counters.rs`), then go.

use std::fmt;
use std::sync::Arc;

use prometheus_client::encoding::{EncodeLabel, EncodeLabelSet, LabelSetEncoder};
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::{Registry, Unit};

use capataz_config::Config;

use counters::BackendCounters;
pub use handles::{BackendMetrics, PoolMetrics};
use listener::ClientFamilies;
pub use listener::{AnsweredBy, ListenerMetrics, MethodClass, OpenConnection, RouteMetrics};
pub(crate) use timing::Timing;

mod counters;
mod edge;
mod handles;
mod listener;
mod queue;
mod quic;
mod tcp;
#[cfg(test)]
mod tests;
mod timing;
mod tls;

pub use queue::QueueMetrics;
pub use quic::{QuicFamilies, QuicMetrics};
pub use tcp::{TcpBackendMetrics, TcpFamilies};
pub use tls::{HandshakeFailures, TlsFamilies};

/// Upper bounds of the latency buckets, in seconds: 0.5 ms to 30 s, then `+Inf`.
const BUCKETS: [f64; 15] = [
    0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0,
];

/// A family of latency histograms, one per pool or one per backend.
type Latencies = Family<HistogramLabels, Histogram, fn() -> Histogram>;

/// `capataz_upstream_response_seconds`: observed once per attempt answered, by every worker
/// thread into its pool's series, so a [`Timing`] (relaxed atomics) rather than
/// prometheus-client's `Histogram`, whose observation takes a mutex.
type ResponseTimes = Family<HistogramLabels, Timing>;

fn latency_histogram() -> Histogram {
    Histogram::new(BUCKETS)
}

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

/// `capataz_sticky_moves_total`'s labels: the backend a sticky client left, and why.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct StickyMoveLabels {
    pool: String,
    backend: String,
    reason: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct BackendLabels {
    pool: Arc<str>,
    backend: Arc<str>,
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
struct ListenerLabels {
    listener: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ClientRequestLabels {
    listener: String,
    route: String,
    pool: String,
    method: &'static str,
    class: &'static str,
    answered_by: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct RequestLabels {
    pool: Arc<str>,
    backend: Arc<str>,
    class: &'static str,
}

/// The labels of an outlier ejection: which detector ejected.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct OutlierLabels {
    pool: Arc<str>,
    backend: Arc<str>,
    detector: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ProbeLabels {
    pool: Arc<str>,
    backend: Arc<str>,
    result: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct TransitionLabels {
    pool: Arc<str>,
    backend: Arc<str>,
    to: &'static str,
}

/// The counter and histogram families of one balancer, and the latency scope it started with.
/// Clones share the families (each is an `Arc`).
#[derive(Clone, Debug)]
pub struct Families {
    scope: HistogramScope,
    /// Every backend's counters (`capataz_requests`, `_probes`, `_transitions`, `_ejections`,
    /// `_outlier_ejections`).
    counters: BackendCounters,
    upstream_response: ResponseTimes,
    retries: Family<PoolLabels, Counter>,
    rejected: Family<PoolLabels, Counter>,
    sticky_moves: Family<StickyMoveLabels, Counter>,
    probe_duration: Latencies,
    /// The client side's families (`capataz_client_*`, `capataz_access_log_dropped`).
    client: ClientFamilies,
    tls: TlsFamilies,
    /// HTTP/3 listeners' QUIC families (`capataz_quic_*`).
    quic: QuicFamilies,
    /// The pools' queues' families (`capataz_queue_*`).
    queue: queue::QueueFamilies,
    tcp: TcpFamilies,
    /// The edge's families (`capataz_rate_limited`).
    edge: edge::EdgeFamilies,
    /// Client connections parked now (HTTP/1 between requests, hyper's state released; see
    /// `downstream/mod.rs`), balancer-wide, for the tests (`Balancer::parked_connections`); per
    /// listener in `connections_parked`.
    parked: Arc<std::sync::atomic::AtomicUsize>,
    /// Times a client connection was parked, ever (for the tests, as `parked`).
    parks: Arc<std::sync::atomic::AtomicU64>,
}

impl Families {
    /// Registers every family into `registry` (in the order a scrape shows them), with latency
    /// histograms labelled as `scope` says.
    pub fn register(registry: &mut Registry, scope: HistogramScope) -> Families {
        let client = ClientFamilies::register(registry);
        let counters = BackendCounters::default();
        registry.register(
            "capataz_requests",
            "Attempts sent to a backend, by the class of its answer (error: no answer came)",
            counters.series(counters::Family::Requests),
        );
        let upstream_response = ResponseTimes::default();
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
        registry.register(
            "capataz_probes",
            "Active health probes, by how the probe rule judged them",
            counters.series(counters::Family::Probes),
        );
        let probe_duration = Latencies::new_with_constructor(latency_histogram);
        registry.register_with_unit(
            "capataz_probe_duration",
            "Time an active health probe took",
            Unit::Seconds,
            probe_duration.clone(),
        );
        registry.register(
            "capataz_transitions",
            "Health verdict changes, by the verdict changed to",
            counters.series(counters::Family::Transitions),
        );
        registry.register(
            "capataz_ejections",
            "Backends taken out by passive checks (traffic errors, a failed probation, or latency outliers)",
            counters.series(counters::Family::Ejections),
        );
        registry.register(
            "capataz_outlier_ejections",
            "Ejections by a gray-failure detector (detector = latency or success_rate), also counted in capataz_ejections_total",
            counters.series(counters::Family::Outliers),
        );
        let sticky_moves = Family::default();
        registry.register(
            "capataz_sticky_moves",
            "Sticky clients moved off their backend (reason = out_of_rotation, draining, failed or at_limit), each with its cookie rewritten",
            sticky_moves.clone(),
        );
        let tls = TlsFamilies::register(registry);
        let quic = QuicFamilies::register(registry);
        let queue = queue::QueueFamilies::register(registry);
        let tcp = TcpFamilies::register(registry);
        let edge = edge::EdgeFamilies::register(registry);
        Families {
            sticky_moves,
            tcp,
            tls,
            quic,
            queue,
            edge,
            scope,
            counters,
            upstream_response,
            retries,
            rejected,
            probe_duration,
            client,
            parked: Arc::default(),
            parks: Arc::default(),
        }
    }

    /// Client connections parked now (see `downstream/mod.rs`).
    pub fn parked(&self) -> &std::sync::atomic::AtomicUsize {
        &self.parked
    }

    /// Times a client connection was parked (see `downstream/mod.rs`).
    pub fn parks(&self) -> &std::sync::atomic::AtomicU64 {
        &self.parks
    }

    /// The counter of access log lines listener `listener` dropped.
    pub fn access_log_dropped(&self, listener: &str) -> Counter {
        self.client
            .access_log_dropped
            .get_or_create_owned(&ListenerLabels {
                listener: listener.into(),
            })
    }

    /// How latency histograms are labelled.
    pub fn scope(&self) -> HistogramScope {
        self.scope
    }

    /// The TLS listeners' families.
    pub fn tls(&self) -> &TlsFamilies {
        &self.tls
    }

    /// HTTP/3 listeners' QUIC families.
    pub fn quic(&self) -> &QuicFamilies {
        &self.quic
    }

    /// TCP mode's families.
    pub fn tcp(&self) -> &TcpFamilies {
        &self.tcp
    }
}
