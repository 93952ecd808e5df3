//! One backend's latencies over the current window, written without a lock by the request
//! path ([`LatencyBuckets`]): one relaxed `fetch_add` per answered request into a log-scale
//! bucket (four per power of two of microseconds, so a percentile is within 25 %), drained
//! once per window by the health runtime into the engine's
//! [`LatencyWindow`](capataz_health::LatencyWindow).

use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use capataz_health::LatencyWindow;

/// Buckets: 0-3 us one each, then four per power of two up to 2^41 us (about 25 days).
const BUCKETS: usize = 160;

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

/// The bucket of a latency of `us` microseconds.
fn bucket(us: u64) -> usize {
    if us < 4 {
        return us as usize;
    }
    let us = us.min((1 << 41) - 1);
    let bits = 63 - us.leading_zeros() as usize; // 2..=40
    let sub = ((us >> (bits - 2)) & 3) as usize;
    (bits - 1) * 4 + sub
}

/// The middle of bucket `index`, in microseconds.
fn middle(index: usize) -> u64 {
    if index < 4 {
        return index as u64;
    }
    let bits = index / 4 + 1;
    let sub = (index % 4) as u64;
    let low = (4 + sub) << (bits - 2);
    low + (1 << (bits - 2)) / 2
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
        let mut requests = 0u64;
        for (count, slot) in counts.iter_mut().zip(&self.counts) {
            *count = u64::from(slot.swap(0, Ordering::Relaxed));
            requests += *count;
        }
        let at = |q_per_mille: u64| -> Duration {
            // The smallest latency with at least q of the requests at or below it.
            let rank = (requests * q_per_mille).div_ceil(1000).max(1);
            let mut seen = 0;
            for (index, count) in counts.iter().enumerate() {
                seen += count;
                if seen >= rank {
                    return Duration::from_micros(middle(index));
                }
            }
            Duration::ZERO
        };
        if requests == 0 {
            return LatencyWindow::default();
        }
        LatencyWindow {
            requests,
            p50: at(500),
            p99: at(990),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
