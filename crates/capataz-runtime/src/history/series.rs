//! Per pool and backend, a fixed ring of samples: attempts, errors (answered 5xx or not at all),
//! and the p50 and p99 of the answered ones, over each [`SAMPLE`]. A backend's are kept sparse
//! (`sparse.rs`): only its samples with attempts in them take memory.

use std::collections::{HashMap, VecDeque};
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use serde_json::{json, Value};

use super::sparse::{Sparse, Times};
use super::unix_ms;
use crate::balance::{BackendRt, LatencyCounts, LatencyTotals};
use crate::health::PoolRt;

/// How often a sample is taken.
pub(crate) const SAMPLE: Duration = Duration::from_secs(5);

/// Samples kept per pool and per backend: 15 minutes.
pub(crate) const SAMPLES: usize = 180;

/// One sample: what happened between the previous one and `at`.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(crate) struct Point {
    /// When it was taken (ms since the Unix epoch).
    pub at: u64,
    /// How long it covers, in milliseconds.
    pub span_ms: u32,
    /// Attempts sent to the backend(s) and ended (answered or failed).
    pub requests: u32,
    /// Of those, answered 5xx or not at all.
    pub errors: u32,
    /// The p50 and p99 of the answered ones, in microseconds (none without answers).
    pub latency_us: Option<(u32, u32)>,
}

/// A ring of points.
#[derive(Debug, Default)]
struct Ring(VecDeque<Point>);

impl From<Vec<Point>> for Ring {
    fn from(points: Vec<Point>) -> Ring {
        Ring(points.into())
    }
}

impl Ring {
    fn push(&mut self, point: Point) {
        if self.0.len() == SAMPLES {
            self.0.pop_front();
        }
        self.0.push_back(point);
    }

    /// Columns: `t` (ms since the Unix epoch), `seconds` (each sample's span), `requests`,
    /// `errors`, `p50_ms`, `p99_ms` (`null` for a sample without answers).
    fn json(&self) -> Value {
        let ms = |us: u32| f64::from(us) / 1000.0;
        let column = |f: &dyn Fn(&Point) -> Value| -> Vec<Value> { self.0.iter().map(f).collect() };
        json!({
            "t": column(&|p| p.at.into()),
            "seconds": column(&|p| (f64::from(p.span_ms) / 1000.0).into()),
            "requests": column(&|p| p.requests.into()),
            "errors": column(&|p| p.errors.into()),
            "p50_ms": column(&|p| p.latency_us.map(|(p50, _)| ms(p50)).into()),
            "p99_ms": column(&|p| p.latency_us.map(|(_, p99)| ms(p99)).into()),
        })
    }
}

/// What a backend's counters said at the last sample.
#[derive(Debug)]
struct Last {
    at: SystemTime,
    attempts: (u64, u64),
    /// The totals read (kept to tell a backend rebuilt with new totals from the same one).
    totals: Arc<LatencyTotals>,
    latency: LatencyCounts,
}

#[derive(Debug, Default)]
struct BackendSeries {
    last: Option<Last>,
    points: Sparse,
    /// The sample that last saw it in a pool.
    seen: u64,
}

/// Every pool's and backend's series.
#[derive(Debug, Default)]
pub(super) struct Series {
    pools: HashMap<Arc<str>, Ring>,
    backends: HashMap<(Arc<str>, Arc<str>), BackendSeries>,
    /// The times of the last samples, which the backends' sparse points share.
    times: Times,
    /// When the last sample was taken.
    previous: Option<SystemTime>,
    /// Samples taken.
    generation: u64,
}

impl BackendSeries {
    /// What backend `b`'s counters say at `now` against the last sample: its point (without
    /// its time, which the caller sets), the attempts and the errors, added to `pool_latency`;
    /// `None` at its first sample or when it was rebuilt without its past.
    fn next(
        &mut self,
        b: &BackendRt,
        now: SystemTime,
        pool_latency: &mut LatencyCounts,
    ) -> Option<(Point, u64, u64)> {
        let attempts = b.attempts();
        let next = Last {
            at: now,
            attempts,
            totals: b.latency_totals.clone(),
            latency: b.latency_totals.read(),
        };
        let last = self.last.replace(next)?;
        let next = self.last.as_ref()?;
        if !Arc::ptr_eq(&last.totals, &next.totals) {
            // Rebuilt without its past (removed and added again): count from here.
            return None;
        }
        let (total, failed) = (
            attempts.0.saturating_sub(last.attempts.0),
            attempts.1.saturating_sub(last.attempts.1),
        );
        let (_, percentiles) = next.latency.since(&last.latency);
        pool_latency.add_since(&next.latency, &last.latency);
        let point = Point {
            at: 0,
            span_ms: span_ms(now, last.at),
            requests: saturate(total),
            errors: saturate(failed.min(total)),
            latency_us: percentiles.map(|(p50, p99)| (micros(p50), micros(p99))),
        };
        Some((point, total, failed.min(total)))
    }
}

/// The milliseconds from `then` to `now` (0 for a clock that went back), saturating.
fn span_ms(now: SystemTime, then: SystemTime) -> u32 {
    let span = now
        .duration_since(then)
        .unwrap_or(Duration::ZERO)
        .as_millis();
    u32::try_from(span).unwrap_or(u32::MAX)
}

fn saturate(n: u64) -> u32 {
    u32::try_from(n).unwrap_or(u32::MAX)
}

fn micros(d: Duration) -> u32 {
    u32::try_from(d.as_micros()).unwrap_or(u32::MAX)
}

impl Series {
    /// Takes one sample of every backend of `pools` at `now`; a backend's first sample only
    /// sets where the next one counts from.
    pub(super) fn sample(&mut self, pools: &[Arc<PoolRt>], now: SystemTime) {
        let at = unix_ms(now);
        self.generation += 1;
        let generation = self.generation;
        let since_previous = self
            .previous
            .replace(now)
            .map_or(0, |then| span_ms(now, then));
        self.times.push(generation, at, since_previous);
        for pool in pools {
            let mut pool_latency = LatencyCounts::zero();
            let (mut requests, mut errors, mut span, mut any) = (0u64, 0u64, 0u32, false);
            for b in pool.backends.iter() {
                let key = (pool.name.clone(), b.name.clone());
                let series = self.backends.entry(key).or_default();
                series.seen = generation;
                let counted = series.next(b, now, &mut pool_latency);
                let point = counted.map(|(point, total, failed)| {
                    requests += total;
                    errors += failed;
                    span = span.max(point.span_ms);
                    any = true;
                    Point { at, ..point }
                });
                series.points.push(generation, point, &self.times);
            }
            if any {
                let (_, percentiles) = pool_latency.since(&LatencyCounts::zero());
                self.pools
                    .entry(pool.name.clone())
                    .or_default()
                    .push(Point {
                        at,
                        span_ms: span,
                        requests: saturate(requests),
                        errors: saturate(errors),
                        latency_us: percentiles.map(|(p50, p99)| (micros(p50), micros(p99))),
                    });
            }
        }
        self.pools
            .retain(|name, _| pools.iter().any(|p| p.name == *name));
        self.backends.retain(|_, series| series.seen == generation);
    }

    pub(super) fn pool_json(&self, pool: &str) -> Value {
        self.pools
            .get(pool)
            .map_or_else(|| Ring::default().json(), Ring::json)
    }

    pub(super) fn backend_json(&self, pool: &Arc<str>, backend: &Arc<str>) -> Value {
        self.backends
            .get(&(pool.clone(), backend.clone()))
            .map_or_else(
                || Ring::default().json(),
                |s| Ring::from(s.points.points(&self.times)).json(),
            )
    }
}
