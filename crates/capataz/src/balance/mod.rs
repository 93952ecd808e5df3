//! The request path's side of a pool: [`PoolHandle`] (all it reads and bumps: snapshot,
//! cursor, backends with their connections and in-flight counts, retry budget) and picking a
//! backend: smooth weighted round robin and least outstanding requests (two random choices),
//! both over an immutable [`Snapshot`] of the eligible backends.
//!
//! A snapshot is rebuilt only when a verdict changes, and the request path reads it without a
//! lock. Round robin walks a schedule precomputed with nginx's smooth weighted algorithm (so a
//! weight-3 backend is spread out, not picked three times in a row) through one atomic counter.

use std::sync::atomic::{AtomicUsize, Ordering};

use crate::config::Algorithm;

mod backend;
mod handle;

pub use backend::{BackendRt, TrafficRing, HISTORY};
pub use handle::{PoolHandle, TrafficSink};

/// The longest precomputed round-robin schedule; larger weight sums are scaled down.
const MAX_SCHEDULE: u64 = 65_536;

/// The backends a pool may send new requests to, as of the last verdict change.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Snapshot {
    /// Indexes (into the pool's backends) of the eligible backends, in pool order.
    pub eligible: Vec<usize>,
    /// Whether no backend is UP (then `eligible` is every backend under fail-open, or empty
    /// under reject).
    pub all_down: bool,
    weights: Vec<u32>,
    schedule: Vec<u32>,
}

impl Snapshot {
    /// A snapshot over `eligible` (indexes into the pool) with their `weights` (same order).
    pub fn new(eligible: Vec<usize>, weights: Vec<u32>, all_down: bool) -> Snapshot {
        debug_assert_eq!(eligible.len(), weights.len());
        let schedule = smooth_schedule(&weights);
        Snapshot {
            eligible,
            all_down,
            weights,
            schedule,
        }
    }

    /// Picks a backend index not in `exclude`, or `None` if every eligible backend is excluded.
    /// `in_flight(i)` gives backend `i`'s outstanding requests (least-request only).
    ///
    /// A pick with an empty `exclude` is a request's first attempt and advances the shared
    /// round-robin cursor; a pick with backends to exclude is a retry and only reads it, so
    /// first attempts keep their weight shares however often a backend fails and is retried
    /// away from (a refusing backend used to draw almost every first attempt).
    pub fn pick(
        &self,
        algorithm: Algorithm,
        cursor: &AtomicUsize,
        exclude: &[usize],
        in_flight: impl Fn(usize) -> usize,
    ) -> Option<usize> {
        if self.eligible.is_empty() {
            return None;
        }
        match algorithm {
            Algorithm::RoundRobin => self.pick_round_robin(cursor, exclude),
            Algorithm::LeastRequest => self.pick_least_request(exclude, in_flight),
        }
    }

    fn pick_round_robin(&self, cursor: &AtomicUsize, exclude: &[usize]) -> Option<usize> {
        let start = if exclude.is_empty() {
            cursor.fetch_add(1, Ordering::Relaxed)
        } else {
            cursor.load(Ordering::Relaxed)
        };
        let len = self.schedule.len();
        // An excluded backend holds at most its weight's share of the schedule, so walking it
        // once finds any backend left.
        (0..len)
            .map(|step| self.eligible[self.schedule[(start + step) % len] as usize])
            .find(|backend| !exclude.contains(backend))
    }

    fn pick_least_request(
        &self,
        exclude: &[usize],
        in_flight: impl Fn(usize) -> usize,
    ) -> Option<usize> {
        let n = self.eligible.len();
        let allowed = |slot: usize| !exclude.contains(&self.eligible[slot]);
        let first = random_below(n);
        let mut second = random_below(n);
        if n > 1 && second == first {
            second = (first + 1 + random_below(n - 1)) % n;
        }
        let choices: [Option<usize>; 2] = [
            Some(first).filter(|&s| allowed(s)),
            Some(second).filter(|&s| allowed(s)),
        ];
        let slot = match choices {
            [Some(a), Some(b)] => {
                // Compare outstanding requests per unit of weight without dividing.
                let load = |s: usize| in_flight(self.eligible[s]) as u64;
                let (wa, wb) = (u64::from(self.weights[a]), u64::from(self.weights[b]));
                if load(b) * wa < load(a) * wb {
                    b
                } else {
                    a
                }
            }
            [Some(a), None] | [None, Some(a)] => a,
            [None, None] => (0..n).find(|&s| allowed(s))?,
        };
        Some(self.eligible[slot])
    }
}

/// nginx's smooth weighted round robin, unrolled into one full cycle of slots.
fn smooth_schedule(weights: &[u32]) -> Vec<u32> {
    let total: u64 = weights.iter().map(|&w| u64::from(w.max(1))).sum();
    let scaled: Vec<i64> = weights
        .iter()
        .map(|&w| {
            let w = u64::from(w.max(1));
            if total > MAX_SCHEDULE {
                (w * MAX_SCHEDULE / total).max(1) as i64
            } else {
                w as i64
            }
        })
        .collect();
    let total: i64 = scaled.iter().sum();
    let mut current = vec![0i64; scaled.len()];
    let mut schedule = Vec::with_capacity(total as usize);
    for _ in 0..total {
        let mut best = 0;
        for (i, w) in scaled.iter().enumerate() {
            current[i] += w;
            if current[i] > current[best] {
                best = i;
            }
        }
        current[best] -= total;
        schedule.push(best as u32);
    }
    schedule
}

/// A uniform index below `n` (n > 0), from `fastrand`'s per-thread generator (the crate's one
/// random source; a test seeds it with `fastrand::seed`). No lock, no shared state.
fn random_below(n: usize) -> usize {
    fastrand::usize(..n)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn counts(snapshot: &Snapshot, picks: usize, exclude: &[usize]) -> Vec<usize> {
        let cursor = AtomicUsize::new(0);
        let mut counts = vec![0; 8];
        for _ in 0..picks {
            let b = snapshot
                .pick(Algorithm::RoundRobin, &cursor, exclude, |_| 0)
                .unwrap();
            counts[b] += 1;
        }
        counts
    }

    #[test]
    fn round_robin_follows_weights_smoothly() {
        let snapshot = Snapshot::new(vec![0, 2, 5], vec![5, 1, 1], false);
        assert_eq!(snapshot.schedule, vec![0, 0, 1, 0, 2, 0, 0]);
        let c = counts(&snapshot, 700, &[]);
        assert_eq!((c[0], c[2], c[5]), (500, 100, 100));
    }

    #[test]
    fn round_robin_skips_excluded() {
        let snapshot = Snapshot::new(vec![0, 1], vec![1, 1], false);
        let c = counts(&snapshot, 10, &[1]);
        assert_eq!((c[0], c[1]), (10, 0));
        let cursor = AtomicUsize::new(0);
        assert_eq!(
            snapshot.pick(Algorithm::RoundRobin, &cursor, &[0, 1], |_| 0),
            None
        );
    }

    /// Regression (issue 10): a retry advanced the shared cursor, so with two backends and the
    /// first one refusing, it drew every first attempt (39 of 40 observed).
    #[test]
    fn retries_leave_first_attempts_their_weight_shares() {
        let snapshot = Snapshot::new(vec![0, 1, 2], vec![1, 1, 1], false);
        let cursor = AtomicUsize::new(0);
        let mut first = [0usize; 3];
        for _ in 0..300 {
            let b = snapshot
                .pick(Algorithm::RoundRobin, &cursor, &[], |_| 0)
                .unwrap();
            first[b] += 1;
            if b == 0 {
                // Backend 0 refuses: the request is retried elsewhere.
                let retry = snapshot.pick(Algorithm::RoundRobin, &cursor, &[0], |_| 0);
                assert!(matches!(retry, Some(1 | 2)));
            }
        }
        assert_eq!(first, [100, 100, 100]);
    }

    #[test]
    fn huge_weights_are_scaled() {
        let snapshot = Snapshot::new((0..200).collect(), vec![1000; 200], false);
        assert!(snapshot.schedule.len() as u64 <= MAX_SCHEDULE);
        assert!(!snapshot.schedule.is_empty());
    }

    #[test]
    fn least_request_prefers_the_less_loaded() {
        let snapshot = Snapshot::new(vec![0, 1], vec![1, 1], false);
        let cursor = AtomicUsize::new(0);
        for _ in 0..100 {
            let b = snapshot
                .pick(Algorithm::LeastRequest, &cursor, &[], |b| {
                    if b == 0 {
                        10
                    } else {
                        1
                    }
                })
                .unwrap();
            assert_eq!(b, 1);
        }
        assert_eq!(
            snapshot.pick(Algorithm::LeastRequest, &cursor, &[1], |_| 0),
            Some(0)
        );
        assert_eq!(
            snapshot.pick(Algorithm::LeastRequest, &cursor, &[0, 1], |_| 0),
            None
        );
    }

    #[test]
    fn least_request_weights_count() {
        // Backend 1 has 4x the weight, so 3 outstanding requests there beat 1 on backend 0.
        let snapshot = Snapshot::new(vec![0, 1], vec![1, 4], false);
        let cursor = AtomicUsize::new(0);
        for _ in 0..50 {
            let b = snapshot
                .pick(Algorithm::LeastRequest, &cursor, &[], |b| {
                    if b == 0 {
                        1
                    } else {
                        3
                    }
                })
                .unwrap();
            assert_eq!(b, 1);
        }
    }

    #[test]
    fn empty_snapshot_picks_nothing() {
        let snapshot = Snapshot::new(vec![], vec![], true);
        let cursor = AtomicUsize::new(0);
        assert_eq!(
            snapshot.pick(Algorithm::RoundRobin, &cursor, &[], |_| 0),
            None
        );
    }

    #[test]
    fn least_request_picks_repeat_from_a_seed() {
        let snapshot = Snapshot::new((0..8).collect(), vec![1; 8], false);
        let cursor = AtomicUsize::new(0);
        let picks = |seed| {
            fastrand::seed(seed);
            (0..64)
                .map(|_| snapshot.pick(Algorithm::LeastRequest, &cursor, &[], |_| 0))
                .collect::<Vec<_>>()
        };
        assert_eq!(picks(42), picks(42));
        assert_ne!(picks(42), picks(43));
    }
}
