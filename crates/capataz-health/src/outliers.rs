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

/// How many log-scale latency buckets a window has: 0-3 us one each, then four per power of
/// two of microseconds up to 2^41 us (about 25 days), so a percentile is within 25 %.
pub const LATENCY_BUCKETS: usize = 160;

/// The bucket of a latency of `us` microseconds (longer ones share the last).
pub fn latency_bucket(us: u64) -> usize {
    if us < 4 {
        return us as usize;
    }
    let us = us.min((1 << 41) - 1);
    let bits = 63 - us.leading_zeros() as usize; // 2..=40
    let sub = ((us >> (bits - 2)) & 3) as usize;
    (bits - 1) * 4 + sub
}

/// The middle of bucket `index`, in microseconds.
pub fn bucket_middle(index: usize) -> u64 {
    if index < 4 {
        return index as u64;
    }
    let bits = index / 4 + 1;
    let sub = (index % 4) as u64;
    let low = (4 + sub) << (bits - 2);
    low + (1 << (bits - 2)) / 2
}

impl LatencyWindow {
    /// The window the bucket counts `counts` hold (`counts[i]` requests in bucket `i`, see
    /// [`latency_bucket`]): each percentile is the middle of the first bucket with at least
    /// that share of the requests at or below it. The runtime's windows and the replay's are
    /// both summarised by this.
    pub fn from_buckets(counts: &[u64]) -> LatencyWindow {
        let requests = counts.iter().fold(0u64, |sum, &c| sum.saturating_add(c));
        if requests == 0 {
            return LatencyWindow::default();
        }
        let at = |q_per_mille: u64| -> Duration {
            // The smallest latency with at least q of the requests at or below it.
            let rank = (u128::from(requests) * u128::from(q_per_mille))
                .div_ceil(1000)
                .max(1);
            let mut seen = 0u128;
            for (index, &count) in counts.iter().enumerate() {
                seen += u128::from(count);
                if seen >= rank {
                    return Duration::from_micros(bucket_middle(index));
                }
            }
            Duration::ZERO
        };
        LatencyWindow {
            requests,
            p50: at(500),
            p99: at(990),
        }
    }

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
