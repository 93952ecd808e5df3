//! One backend at run time, as the request path and the health runtime share it
//! ([`BackendRt`]: connections, in-flight count, recent traffic, the fast-path flag).

use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use capataz_health::Outcome;

use super::{LatencyBuckets, LatencyTotals};
use crate::instruments::BackendMetrics;
use crate::upstream::Upstream;

/// How many recent probe and traffic outcomes are kept per backend.
pub const HISTORY: usize = 20;

/// Recent traffic outcomes of one backend, written without a lock by the request path.
#[derive(Debug, Default)]
pub struct TrafficRing {
    next: AtomicUsize,
    slots: [AtomicU32; HISTORY],
}

impl TrafficRing {
    /// Records one outcome, overwriting the oldest once the ring is full.
    pub fn push(&self, outcome: Outcome) {
        let code = match outcome {
            Outcome::Status(code) => u32::from(code),
            Outcome::Timeout => 1001,
            Outcome::Refused => 1002,
            Outcome::Reset => 1003,
            Outcome::Malformed => 1004,
            Outcome::Tls => 1005,
            Outcome::Connected => 1006,
            Outcome::Grpc(code) => 2000 + u32::from(code),
        };
        let at = self.next.fetch_add(1, Ordering::Relaxed) % HISTORY;
        self.slots[at].store(code, Ordering::Relaxed);
    }

    /// The recorded outcomes, oldest first.
    pub fn recent(&self) -> Vec<Outcome> {
        let next = self.next.load(Ordering::Relaxed);
        let count = next.min(HISTORY);
        (next - count..next)
            .filter_map(|i| match self.slots[i % HISTORY].load(Ordering::Relaxed) {
                0 => None,
                1001 => Some(Outcome::Timeout),
                1002 => Some(Outcome::Refused),
                1003 => Some(Outcome::Reset),
                1004 => Some(Outcome::Malformed),
                1005 => Some(Outcome::Tls),
                1006 => Some(Outcome::Connected),
                code @ 2000..=2255 => u8::try_from(code - 2000).ok().map(Outcome::Grpc),
                code => u16::try_from(code).ok().map(Outcome::Status),
            })
            .collect()
    }
}

/// One backend's judged traffic outcomes over the current window, written without a lock.
#[derive(Debug, Default)]
pub struct OutcomeCounts {
    requests: AtomicU64,
    errors: AtomicU64,
}

impl OutcomeCounts {
    /// Counts one judged outcome.
    #[inline]
    pub(crate) fn record(&self, error: bool) {
        self.requests.fetch_add(1, Ordering::Relaxed);
        if error {
            self.errors.fetch_add(1, Ordering::Relaxed);
        }
    }

    /// Empties the counts and returns the window they held (an outcome counted meanwhile may
    /// split across two windows; the error count is bounded by the request count).
    pub fn drain(&self) -> capataz_health::SuccessWindow {
        let requests = self.requests.swap(0, Ordering::Relaxed);
        let errors = self.errors.swap(0, Ordering::Relaxed).min(requests);
        capataz_health::SuccessWindow { requests, errors }
    }
}

/// One backend at run time.
#[derive(Debug)]
pub struct BackendRt {
    /// Its name within the pool.
    pub name: Arc<str>,
    /// `host:port` as configured.
    pub address: String,
    /// Its configured weight.
    pub weight: u32,
    /// Its keep-alive connections.
    pub upstream: Upstream,
    /// Requests sent to it whose response has not been read to the end.
    pub in_flight: AtomicUsize,
    /// Recent traffic outcomes.
    pub traffic: TrafficRing,
    /// Its metric handles.
    pub metrics: BackendMetrics,
    /// The engine's `needs_traffic` for it as of the engine's last change: when false, good
    /// responses need not reach the engine.
    pub watched: AtomicBool,
    /// Its latencies over the current window, when its pool detects latency outliers (boxed:
    /// 640 bytes that a backend of any other pool does not carry).
    pub latency: Option<Box<LatencyBuckets>>,
    /// Its judged outcomes over the current window, when its pool detects success-rate
    /// outliers.
    pub outcomes: Option<OutcomeCounts>,
    /// Its latencies since it joined, for the dashboard's charts; shared with the same backend
    /// across a reload.
    pub latency_totals: Arc<LatencyTotals>,
    /// Bumped to close its upgraded connections, in a pool with `close_tunnels_on_down` (or
    /// whose backend had it before a reload: `None` otherwise, a channel a backend of any
    /// other pool does not carry); each tunnel to it holds a receiver. Shared with the same
    /// backend across a reload.
    pub tunnels: Option<Arc<tokio::sync::watch::Sender<u64>>>,
    /// Its latency estimate, in a pool that picks by peak EWMA (`None` in any other).
    pub ewma: Option<Box<super::PeakEwma>>,
}

impl BackendRt {
    /// Counts an attempt the backend answered with `status`, `elapsed` after it was sent: in
    /// its metrics, in its latency totals, in its latency window when its pool detects
    /// latency outliers, and in its peak EWMA when its pool picks by it.
    #[inline]
    pub fn answered(&self, status: u16, elapsed: Duration) {
        self.metrics.answered(status, elapsed);
        self.latency_totals.record(elapsed);
        if let Some(latency) = &self.latency {
            latency.record(elapsed);
        }
        if let Some(ewma) = &self.ewma {
            ewma.observe(elapsed, std::time::Instant::now());
        }
    }

    /// Its attempts since it was built (or since a backend of the same names first was: the
    /// counters are kept across reloads), and of those the ones answered 5xx or not at all.
    pub fn attempts(&self) -> (u64, u64) {
        self.metrics.attempts()
    }

    /// Closes its upgraded connections that watch for it, and returns how many watched.
    pub fn close_tunnels(&self) -> usize {
        let Some(tunnels) = &self.tunnels else {
            return 0;
        };
        let open = tunnels.receiver_count();
        tunnels.send_modify(|n| *n = n.wrapping_add(1));
        open
    }
}
