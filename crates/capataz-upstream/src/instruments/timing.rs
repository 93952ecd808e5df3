//! [`Timing`]: a latency histogram made of relaxed atomics, for the request path: the client
//! request durations and `capataz_upstream_response_seconds`.
//!
//! prometheus-client's `Histogram` takes a mutex per observation; the client requests of a
//! listener all observe into one histogram, and the attempts of a pool into another, from
//! every worker thread, so this one costs a bucket search over 15 bounds and two relaxed
//! atomic adds instead, and lets a scrape add the buckets up.
//!
//! Invariants:
//! - The buckets are those of every latency histogram of capataz ([`super::BUCKETS`]), with
//!   Prometheus's meaning: an observation counts in the first bucket whose bound it does not
//!   exceed (`le`), and in `+Inf` when it exceeds them all.
//! - A scrape's `_count` is the sum of the buckets it read, so `_count` always equals the
//!   `+Inf` bucket, even while observations land during the scrape.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use prometheus_client::encoding::{EncodeMetric, MetricEncoder, NoLabelSet};
use prometheus_client::metrics::{MetricType, TypedMetric};

use super::BUCKETS;

/// The bucket bounds in nanoseconds, compared on the request path without floating point.
const BOUNDS_NANOS: [u64; BUCKETS.len()] = bounds_nanos();

const fn bounds_nanos() -> [u64; BUCKETS.len()] {
    // 0.5 ms to 30 s, as integers: exact, where `BUCKETS` are decimal approximations.
    [
        500_000,
        1_000_000,
        2_500_000,
        5_000_000,
        10_000_000,
        25_000_000,
        50_000_000,
        100_000_000,
        250_000_000,
        500_000_000,
        1_000_000_000,
        2_500_000_000,
        5_000_000_000,
        10_000_000_000,
        30_000_000_000,
    ]
}

/// A latency histogram with the buckets of [`super::BUCKETS`]. Clones share the counts.
#[derive(Clone, Debug, Default)]
pub(crate) struct Timing(Arc<Counts>);

#[derive(Debug, Default)]
struct Counts {
    /// Observations per bucket (not cumulative); the last one is `+Inf`.
    buckets: [AtomicU64; BUCKETS.len() + 1],
    /// The sum of every observation, in nanoseconds (wraps after 584 years of latency).
    sum_nanos: AtomicU64,
}

impl Timing {
    /// Counts one observation of `elapsed`.
    pub(crate) fn observe(&self, elapsed: Duration) {
        let nanos = u64::try_from(elapsed.as_nanos()).unwrap_or(u64::MAX);
        let bucket = BOUNDS_NANOS.partition_point(|&bound| bound < nanos);
        let counts = &*self.0;
        counts.buckets[bucket].fetch_add(1, Ordering::Relaxed);
        counts.sum_nanos.fetch_add(nanos, Ordering::Relaxed);
    }

    /// The observations so far: per bucket (not cumulative, `+Inf` last), the count and the
    /// sum in seconds.
    fn read(&self) -> ([(f64, u64); BUCKETS.len() + 1], u64, f64) {
        let counts = &*self.0;
        let mut buckets = [(f64::INFINITY, 0); BUCKETS.len() + 1];
        for (i, slot) in buckets.iter_mut().enumerate() {
            let bound = BUCKETS.get(i).copied().unwrap_or(f64::INFINITY);
            *slot = (bound, counts.buckets[i].load(Ordering::Relaxed));
        }
        let count = buckets.iter().map(|(_, n)| n).sum();
        let sum = counts.sum_nanos.load(Ordering::Relaxed) as f64 / 1e9;
        (buckets, count, sum)
    }
}

impl TypedMetric for Timing {
    const TYPE: MetricType = MetricType::Histogram;
}

impl EncodeMetric for Timing {
    fn encode(&self, mut encoder: MetricEncoder) -> Result<(), std::fmt::Error> {
        let (buckets, count, sum) = self.read();
        encoder.encode_histogram::<NoLabelSet>(sum, count, &buckets, None)
    }

    fn metric_type(&self) -> MetricType {
        MetricType::Histogram
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bounds_in_nanoseconds_match_the_buckets_in_seconds() {
        for (nanos, seconds) in BOUNDS_NANOS.iter().zip(BUCKETS) {
            assert!(
                (*nanos as f64 / 1e9 - seconds).abs() < 1e-12,
                "{nanos} {seconds}"
            );
        }
    }

    #[test]
    fn an_observation_counts_in_the_first_bucket_it_does_not_exceed() {
        let timing = Timing::default();
        timing.observe(Duration::from_micros(500)); // exactly 0.5 ms: le="0.0005"
        timing.observe(Duration::from_micros(501)); // le="0.001"
        timing.observe(Duration::from_secs(31)); // +Inf
        timing.observe(Duration::MAX); // +Inf, the sum saturating rather than panicking
        let (buckets, count, _) = timing.read();
        assert_eq!(buckets[0], (0.0005, 1));
        assert_eq!(buckets[1], (0.001, 1));
        assert_eq!(buckets[BUCKETS.len()], (f64::INFINITY, 2));
        assert_eq!(count, 4);
    }

    #[test]
    fn the_sum_is_in_seconds() {
        let timing = Timing::default();
        timing.observe(Duration::from_millis(250));
        timing.observe(Duration::from_millis(750));
        let (_, count, sum) = timing.read();
        assert_eq!(count, 2);
        assert!((sum - 1.0).abs() < 1e-9, "{sum}");
    }
}
