//! Latency outliers: what one backend's relayed traffic looked like over one window
//! ([`LatencyWindow`]), as the runtime summarises it, and the pool median the engine compares
//! it with ([`Pool::latency_window`](crate::Pool::latency_window) decides).

use std::time::Duration;

use crate::settings::Percentile;

/// One backend's relayed traffic over one window.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct LatencyWindow {
    /// Requests answered in the window.
    pub requests: u64,
    /// Their median latency.
    pub p50: Duration,
    /// Their 99th-percentile latency.
    pub p99: Duration,
}

impl LatencyWindow {
    /// The latency at `percentile`.
    pub fn value(&self, percentile: Percentile) -> Duration {
        match percentile {
            Percentile::P50 => self.p50,
            Percentile::P99 => self.p99,
        }
    }
}

/// The lower median of `values` (sorted in place), or `None` if there is none.
pub(crate) fn lower_median(values: &mut [Duration]) -> Option<Duration> {
    if values.is_empty() {
        return None;
    }
    values.sort_unstable();
    Some(values[(values.len() - 1) / 2])
}
