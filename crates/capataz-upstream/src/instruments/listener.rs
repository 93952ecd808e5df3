//! The client side's handles: one listener's ([`ListenerMetrics`]: connections, bytes, request
//! durations) and one route's ([`RouteMetrics`]: requests by method, status class and who
//! answered), resolved when the listener's `Proxy` is built.
//!
//! The plaintext path is benchmarked against HAProxy, so a request pays two clock reads, a
//! bucket search and three relaxed atomic adds here, and nothing that allocates or locks:
//! - a request's counter is one cell of a per-route table (method x class x who answered),
//!   looked up by index; a cell's series is created on its first request (one family lookup,
//!   then never again), so a scrape shows no series that never counted anything;
//! - the duration goes into a [`Timing`] (relaxed atomics, no mutex);
//! - bytes are not counted per request: the connection's socket already sums them (see
//!   `downstream/mod.rs`) and its watcher adds them to the listener's counters a few times per timeout.

use std::sync::atomic::Ordering;
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use http::Method;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::{Registry, Unit};

use super::{ClientRequestLabels, Families, ListenerLabels, Timing};

/// The method label values (`method`), in the order of [`MethodClass`].
const METHODS: [&str; 8] = [
    "GET", "HEAD", "POST", "PUT", "DELETE", "PATCH", "OPTIONS", "other",
];

/// The status class label values (`class`), by the hundreds digit of the status minus one;
/// `other` for 600-999, which hyper lets through from a backend.
const STATUS_CLASSES: [&str; 6] = ["1xx", "2xx", "3xx", "4xx", "5xx", "other"];

/// The `answered_by` label values, in the order of [`AnsweredBy`].
const ANSWERERS: [&str; 2] = ["backend", "capataz"];

const CELLS: usize = METHODS.len() * STATUS_CLASSES.len() * ANSWERERS.len();

/// A request's method as counted: the common ones by name, any other (extension methods,
/// `CONNECT`, `TRACE`, or none readable) as `other`, so hostile methods cannot grow the series.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MethodClass(usize);

impl MethodClass {
    /// A request hyper refused before its method could be read.
    pub const OTHER: MethodClass = MethodClass(METHODS.len() - 1);

    /// The class of `method`.
    pub fn of(method: &Method) -> MethodClass {
        let index = match *method {
            Method::GET => 0,
            Method::HEAD => 1,
            Method::POST => 2,
            Method::PUT => 3,
            Method::DELETE => 4,
            Method::PATCH => 5,
            Method::OPTIONS => 6,
            _ => METHODS.len() - 1,
        };
        MethodClass(index)
    }
}

/// Who wrote the answer a client got.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AnsweredBy {
    /// The backend's answer, relayed.
    Backend = 0,
    /// capataz's own: a request it refused (400, 404, 408, 431), or a backend it could not get
    /// an answer from (502, 503, 504).
    Capataz = 1,
}

/// One listener's handles. Shared by its `Proxy` (and every `Proxy` a reload builds for it
/// under the same name: they get the same counters) and by its client connections.
#[derive(Debug)]
pub struct ListenerMetrics {
    families: Families,
    listener: String,
    accepted: Counter,
    open: Gauge,
    parked_now: Gauge,
    received: Counter,
    sent: Counter,
    duration: Timing,
}

/// The client side's families, registered first (in the order a scrape shows them): requests
/// answered, their durations, connections and bytes per listener, and the access log's drops.
#[derive(Clone, Debug)]
pub(super) struct ClientFamilies {
    requests: Family<ClientRequestLabels, Counter>,
    duration: Family<ListenerLabels, Timing>,
    accepted: Family<ListenerLabels, Counter>,
    open: Family<ListenerLabels, Gauge>,
    parked: Family<ListenerLabels, Gauge>,
    received: Family<ListenerLabels, Counter>,
    sent: Family<ListenerLabels, Counter>,
    pub(super) access_log_dropped: Family<ListenerLabels, Counter>,
    limit_reached: Family<ListenerLabels, Counter>,
}

impl ClientFamilies {
    /// Registers the client side's families into `registry`.
    pub(super) fn register(registry: &mut Registry) -> ClientFamilies {
        let requests = Family::default();
        registry.register(
            "capataz_client_requests",
            "Client requests answered, by listener, route, method, status class and who wrote \
             the answer (the backend, or capataz itself)",
            requests.clone(),
        );
        let duration = Family::default();
        registry.register_with_unit(
            "capataz_client_request_duration",
            "Time from a client request's head to the end of its answer, per listener",
            Unit::Seconds,
            duration.clone(),
        );
        let accepted = Family::default();
        registry.register(
            "capataz_client_connections_accepted",
            "Client connections accepted",
            accepted.clone(),
        );
        let open = Family::default();
        registry.register(
            "capataz_client_connections_open",
            "Client connections open now",
            open.clone(),
        );
        let parked = Family::default();
        registry.register(
            "capataz_client_connections_parked",
            "Client connections parked now: HTTP/1 keep-alive connections quiet between requests, \
             holding only their socket",
            parked.clone(),
        );
        let received = Family::default();
        registry.register_with_unit(
            "capataz_client_received",
            "Bytes read from client connections (heads, bodies and upgraded streams)",
            Unit::Bytes,
            received.clone(),
        );
        let sent = Family::default();
        registry.register_with_unit(
            "capataz_client_sent",
            "Bytes written to client connections (heads, bodies and upgraded streams)",
            Unit::Bytes,
            sent.clone(),
        );
        let access_log_dropped = Family::default();
        registry.register(
            "capataz_access_log_dropped",
            "Access log lines dropped: the log's buffer was full, or its file could not be \
             written",
            access_log_dropped.clone(),
        );
        let limit_reached = Family::default();
        registry.register(
            "capataz_client_connections_limit_reached",
            "Times a listener reached its max_connections and stopped accepting until a \
             connection closed",
            limit_reached.clone(),
        );
        ClientFamilies {
            limit_reached,
            requests,
            duration,
            accepted,
            open,
            parked,
            received,
            sent,
            access_log_dropped,
        }
    }
}

impl Families {
    /// `capataz_client_connections_limit_reached_total` of listener `listener` (created at 0).
    pub fn limit_reached(&self, listener: &str) -> Counter {
        self.client
            .limit_reached
            .get_or_create_owned(&ListenerLabels {
                listener: listener.into(),
            })
    }

    /// The handles of listener `listener`; the same name gets the same series.
    pub fn listener(&self, listener: &str) -> Arc<ListenerMetrics> {
        let labels = ListenerLabels {
            listener: listener.into(),
        };
        Arc::new(ListenerMetrics {
            families: self.clone(),
            listener: listener.into(),
            accepted: self.client.accepted.get_or_create_owned(&labels),
            open: self.client.open.get_or_create_owned(&labels),
            parked_now: self.client.parked.get_or_create_owned(&labels),
            received: self.client.received.get_or_create_owned(&labels),
            sent: self.client.sent.get_or_create_owned(&labels),
            duration: self.client.duration.get_or_create_owned(&labels),
        })
    }
}

impl ListenerMetrics {
    /// The balancer's count of parked client connections (see `downstream/mod.rs`).
    pub fn parked(&self) -> &std::sync::atomic::AtomicUsize {
        self.families.parked()
    }

    /// This listener's gauge of parked client connections.
    pub fn parked_now(&self) -> &Gauge {
        &self.parked_now
    }

    /// The balancer's count of client connections parked, ever.
    pub fn parks(&self) -> &std::sync::atomic::AtomicU64 {
        self.families.parks()
    }

    /// The request counters of the route `route` (its host and path prefix, as written in the
    /// `route` label) to pool `pool`; `route` and `pool` empty for requests no route took.
    pub fn route(&self, route: &str, pool: &str) -> RouteMetrics {
        RouteMetrics {
            families: self.families.clone(),
            listener: self.listener.clone(),
            route: route.into(),
            pool: pool.into(),
            cells: Box::new(std::array::from_fn(|_| OnceLock::new())),
        }
    }

    /// The counter of requests route `route` (its label) refused over its rate limit.
    pub fn rate_limited(&self, route: &str) -> Counter {
        self.families.rate_limited(&self.listener, route)
    }

    /// Counts a client connection open from its accept (before any TLS or QUIC handshake)
    /// until the guard is dropped; `None` (nothing counted) if `max` are open already: the
    /// count and the check are one atomic step, so no two connections take the last slot.
    /// A refused connection leaves the gauge as it was: it never shows more than `max`, and
    /// a loop waiting for room never reads a count another's refusal raised for a moment.
    pub fn open(self: &Arc<Self>, max: Option<usize>) -> Option<OpenConnection> {
        match max {
            None => {
                self.open.inc();
            }
            Some(max) => {
                let max = i64::try_from(max).unwrap_or(i64::MAX);
                self.open
                    .inner()
                    .fetch_update(Ordering::AcqRel, Ordering::Acquire, |open| {
                        (open < max).then_some(open + 1)
                    })
                    .ok()?;
            }
        }
        Some(OpenConnection(self.clone()))
    }

    /// The client connections open now (what a listener's `max_connections` bounds).
    pub fn open_now(&self) -> i64 {
        self.open.get()
    }

    /// Counts a client connection accepted: ready to serve, its handshake (if any) done.
    pub fn count_accepted(&self) {
        self.accepted.inc();
    }

    /// Adds bytes received from and sent to clients.
    pub fn add_bytes(&self, received: u64, sent: u64) {
        if received > 0 {
            self.received.inc_by(received);
        }
        if sent > 0 {
            self.sent.inc_by(sent);
        }
    }

    /// Counts one request's duration, from its head to the end of its answer.
    pub fn request_took(&self, elapsed: Duration) {
        self.duration.observe(elapsed);
    }
}

/// A client connection counted as open, until dropped.
#[derive(Debug)]
pub struct OpenConnection(Arc<ListenerMetrics>);

impl OpenConnection {
    /// The listener's handles.
    pub fn listener(&self) -> &Arc<ListenerMetrics> {
        &self.0
    }
}

impl Drop for OpenConnection {
    fn drop(&mut self) {
        self.0.open.dec();
    }
}

/// One route's request counters (or a listener's unrouted requests'), one cell per method,
/// status class and answerer, each created on first use.
#[derive(Debug)]
pub struct RouteMetrics {
    families: Families,
    listener: String,
    route: String,
    pool: String,
    cells: Box<[OnceLock<Counter>; CELLS]>,
}

impl RouteMetrics {
    /// Counts one answer with `status` to a request with `method`, written by `by`.
    pub fn answered(&self, method: MethodClass, status: u16, by: AnsweredBy) {
        let class = match status / 100 {
            hundreds @ 1..=5 => usize::from(hundreds) - 1,
            _ => STATUS_CLASSES.len() - 1,
        };
        let cell = (method.0 * STATUS_CLASSES.len() + class) * ANSWERERS.len() + by as usize;
        self.cells[cell]
            .get_or_init(|| {
                self.families
                    .client
                    .requests
                    .get_or_create_owned(&ClientRequestLabels {
                        listener: self.listener.clone(),
                        route: self.route.clone(),
                        pool: self.pool.clone(),
                        method: METHODS[method.0],
                        class: STATUS_CLASSES[class],
                        answered_by: ANSWERERS[by as usize],
                    })
            })
            .inc();
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::AtomicBool;

    use super::*;
    use crate::instruments::HistogramScope;

    /// Regression: a refused `open` counted the connection for a moment (added, then taken
    /// back): the gauge showed more than `max`, and an accept loop waiting for room that read
    /// it then went back to waiting while the slot was free. Two threads refused over and over
    /// while this one looks at the gauge.
    #[test]
    fn a_refused_open_never_shows_over_the_limit() {
        let mut registry = Registry::default();
        let families = Families::register(&mut registry, HistogramScope::Pool);
        let metrics = families.listener("front");
        let held = metrics.open(Some(1)).expect("room for one");
        let stop = AtomicBool::new(false);
        let most = std::thread::scope(|scope| {
            for _ in 0..2 {
                scope.spawn(|| {
                    while !stop.load(Ordering::Relaxed) {
                        assert!(metrics.open(Some(1)).is_none(), "over the limit");
                    }
                });
            }
            let mut most = 0;
            for _ in 0..2_000_000 {
                most = most.max(metrics.open.get());
                if most > 1 {
                    break;
                }
            }
            stop.store(true, Ordering::Relaxed);
            most
        });
        assert_eq!(most, 1, "the gauge showed {most} open with a limit of 1");
        drop(held);
        assert_eq!(metrics.open.get(), 0);
    }
}
