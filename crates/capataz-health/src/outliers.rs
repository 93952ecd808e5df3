//! Latency outliers: what one backend's relayed traffic looked like over one window
//! ([`LatencyWindow`]), as the runtime summarises it, and the pool median the engine compares
//! it with ([`Pool::latency_window`](crate::Pool::latency_window) decides); and its success
//! rate over one window ([`SuccessWindow`]; [`Pool::success_window`](crate::Pool::success_window)
//! decides).

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

/// One backend's judged traffic over one window.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SuccessWindow {
    /// Outcomes judged in the window.
    pub requests: u64,
    /// How many of them were errors.
    pub errors: u64,
}

impl SuccessWindow {
    /// The success rate, 0.0-1.0 (1.0 without requests).
    pub fn rate(&self) -> f64 {
        if self.requests == 0 {
            return 1.0;
        }
        let errors = self.errors.min(self.requests);
        (self.requests - errors) as f64 / self.requests as f64
    }
}

/// The mean and population standard deviation of `values` (none empty).
pub(crate) fn mean_stdev(values: &[f64]) -> (f64, f64) {
    let n = values.len().max(1) as f64;
    let mean = values.iter().sum::<f64>() / n;
    let variance = values.iter().map(|v| (v - mean) * (v - mean)).sum::<f64>() / n;
    (mean, variance.sqrt())
}

/// A rate 0.0-1.0 in tenths of a percent, rounded.
pub(crate) fn permille(rate: f64) -> u32 {
    (rate.clamp(0.0, 1.0) * 1000.0).round() as u32
}

/// The lower median of `values` (sorted in place), or `None` if there is none.
pub(crate) fn lower_median(values: &mut [Duration]) -> Option<Duration> {
    if values.is_empty() {
        return None;
    }
    values.sort_unstable();
    Some(values[(values.len() - 1) / 2])
}
