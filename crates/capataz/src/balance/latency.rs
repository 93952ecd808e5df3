//! One backend's latencies over the current window, written without a lock by the request
//! path ([`LatencyBuckets`]): one relaxed `fetch_add` per answered request into a log-scale
//! bucket (four per power of two of microseconds, so a percentile is within 25 %), drained
//! once per window by the health runtime into the engine's
//! [`LatencyWindow`](capataz_health::LatencyWindow).

use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use capataz_health::outliers::{latency_bucket as bucket, LATENCY_BUCKETS as BUCKETS};
use capataz_health::LatencyWindow;

/// Lock-free latency counts of one backend for the current window.
#[derive(Debug)]
pub struct LatencyBuckets {
    counts: [AtomicU32; BUCKETS],
}

impl Default for LatencyBuckets {
    fn default() -> LatencyBuckets {
        LatencyBuckets {
            counts: std::array::from_fn(|_| AtomicU32::new(0)),
        }
    }
}

impl LatencyBuckets {
    /// Counts one answered request that took `elapsed`.
    #[inline]
    pub(crate) fn record(&self, elapsed: Duration) {
        let us = u64::try_from(elapsed.as_micros()).unwrap_or(u64::MAX);
        self.counts[bucket(us)].fetch_add(1, Ordering::Relaxed);
    }

    /// Empties the buckets and returns the window they held (a request counted meanwhile lands
    /// in this window or the next, never in both).
    pub fn drain(&self) -> LatencyWindow {
        let mut counts = [0u64; BUCKETS];
        for (count, slot) in counts.iter_mut().zip(&self.counts) {
            *count = u64::from(slot.swap(0, Ordering::Relaxed));
        }
        LatencyWindow::from_buckets(&counts)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use capataz_health::outliers::bucket_middle as middle;

    #[test]
    fn buckets_are_monotonic_and_within_a_quarter() {
        let mut last = 0;
        for us in [
            0u64,
            1,
            3,
            4,
            5,
            7,
            8,
            100,
            999,
            1000,
            38_000,
            412_000,
            1 << 40,
            u64::MAX,
        ] {
            let b = bucket(us);
            assert!(b < BUCKETS);
            assert!(b >= last, "bucket of {us}");
            last = b;
            if (4..1 << 41).contains(&us) {
                let mid = middle(b) as f64;
                assert!((mid - us as f64).abs() <= us as f64 / 4.0, "{us} -> {mid}");
            }
        }
    }

    #[test]
    fn a_drained_window_has_its_percentiles_and_the_next_is_empty() {
        let buckets = LatencyBuckets::default();
        for _ in 0..98 {
            buckets.record(Duration::from_millis(38));
        }
        for _ in 0..2 {
            buckets.record(Duration::from_millis(412));
        }
        let w = buckets.drain();
        assert_eq!(w.requests, 100);
        let ms = |d: Duration| d.as_secs_f64() * 1000.0;
        assert!((ms(w.p50) - 38.0).abs() < 38.0 / 4.0, "{:?}", w.p50);
        assert!((ms(w.p99) - 412.0).abs() < 412.0 / 4.0, "{:?}", w.p99);
        assert_eq!(buckets.drain(), LatencyWindow::default());
        buckets.record(Duration::MAX);
        assert_eq!(buckets.drain().requests, 1);
    }
}
