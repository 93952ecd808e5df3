//! One backend's latencies over the current window, written without a lock by the request
//! path ([`LatencyBuckets`]): one relaxed `fetch_add` per answered request into a log-scale
//! bucket (four per power of two of microseconds, so a percentile is within 25 %), drained
//! once per window by the health runtime into the engine's
//! [`LatencyWindow`](capataz_health::LatencyWindow). [`LatencyTotals`] counts into the same
//! buckets and is never drained: the dashboard's sampler (`history`) reads it every few seconds
//! and takes the difference, so one relaxed `fetch_add` per answer is all it costs.

use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::OnceLock;
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

/// One backend's latencies since it was built, in [`LatencyBuckets`]' buckets, never drained
/// (a count wraps at `u32::MAX`; readers take differences with `wrapping_sub`). The buckets
/// (640 bytes) are allocated by the first answer counted: a backend that never answered holds
/// none.
#[derive(Debug, Default)]
pub struct LatencyTotals {
    counts: OnceLock<Box<[AtomicU32; BUCKETS]>>,
}

/// A copy of a [`LatencyTotals`] at one moment (`None` inside: nothing counted yet).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LatencyCounts(Option<Box<[u32; BUCKETS]>>);

impl LatencyTotals {
    /// Counts one answered request that took `elapsed`.
    #[inline]
    pub(crate) fn record(&self, elapsed: Duration) {
        let us = u64::try_from(elapsed.as_micros()).unwrap_or(u64::MAX);
        let counts = self
            .counts
            .get_or_init(|| Box::new(std::array::from_fn(|_| AtomicU32::new(0))));
        counts[bucket(us)].fetch_add(1, Ordering::Relaxed);
    }

    /// The counts now.
    pub fn read(&self) -> LatencyCounts {
        LatencyCounts(self.counts.get().map(|slots| {
            let mut counts = Box::new([0u32; BUCKETS]);
            for (count, slot) in counts.iter_mut().zip(slots.iter()) {
                *count = slot.load(Ordering::Relaxed);
            }
            counts
        }))
    }
}

impl LatencyCounts {
    /// Bucket `i`'s count.
    fn at(&self, i: usize) -> u32 {
        self.0.as_ref().map_or(0, |counts| counts[i])
    }

    /// The requests counted since `earlier` (a copy of the same totals), with their p50 and
    /// p99 (`None` for no requests).
    pub fn since(&self, earlier: &LatencyCounts) -> (u64, Option<(Duration, Duration)>) {
        if self.0.is_none() {
            return (0, None);
        }
        let counts: Vec<u64> = (0..BUCKETS)
            .map(|i| u64::from(self.at(i).wrapping_sub(earlier.at(i))))
            .collect();
        let window = LatencyWindow::from_buckets(&counts);
        if window.requests == 0 {
            return (0, None);
        }
        (window.requests, Some((window.p50, window.p99)))
    }

    /// The sum, bucket by bucket, of this and the requests `later` counted since `earlier`
    /// (for a pool's figures, summed over its backends).
    pub fn add_since(&mut self, later: &LatencyCounts, earlier: &LatencyCounts) {
        if later.0.is_none() {
            return;
        }
        let sums = self.0.get_or_insert_with(|| Box::new([0u32; BUCKETS]));
        for (i, sum) in sums.iter_mut().enumerate() {
            *sum = sum.wrapping_add(later.at(i).wrapping_sub(earlier.at(i)));
        }
    }

    /// No requests at all.
    pub fn zero() -> LatencyCounts {
        LatencyCounts(None)
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

    #[test]
    fn totals_give_the_percentiles_of_the_requests_between_two_readings() {
        let totals = LatencyTotals::default();
        for _ in 0..10 {
            totals.record(Duration::from_secs(2));
        }
        let before = totals.read();
        for _ in 0..99 {
            totals.record(Duration::from_micros(400));
        }
        totals.record(Duration::from_millis(50));
        let after = totals.read();
        let (requests, percentiles) = after.since(&before);
        assert_eq!(requests, 100);
        let (p50, p99) = percentiles.expect("requests were counted");
        assert!((350..=450).contains(&p50.as_micros()), "{p50:?}");
        assert!((350..=450).contains(&p99.as_micros()), "{p99:?}");
        assert_eq!(after.since(&after), (0, None));
        let mut pool = LatencyCounts::zero();
        pool.add_since(&after, &before);
        pool.add_since(&after, &before);
        assert_eq!(pool.since(&LatencyCounts::zero()).0, 200);
    }

    #[test]
    fn totals_without_answers_hold_no_buckets_and_count_from_the_first() {
        let totals = LatencyTotals::default();
        let empty = totals.read();
        assert_eq!(empty, LatencyCounts::zero());
        assert!(totals.counts.get().is_none());
        assert_eq!(empty.since(&empty), (0, None));
        totals.record(Duration::from_micros(400));
        let after = totals.read();
        let (requests, percentiles) = after.since(&empty);
        assert_eq!(requests, 1);
        assert!(percentiles.is_some());
        let mut pool = LatencyCounts::zero();
        pool.add_since(&empty, &empty);
        assert_eq!(
            pool,
            LatencyCounts::zero(),
            "nothing added, nothing allocated"
        );
        pool.add_since(&after, &empty);
        assert_eq!(pool.since(&LatencyCounts::zero()).0, 1);
    }
}
