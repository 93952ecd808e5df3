//! The request path's side of a pool: [`PoolHandle`] (all it reads and bumps: snapshot,
//! cursor, backends with their connections and in-flight counts, retry budget) and picking a
//! backend: smooth weighted round robin, least outstanding requests (two random choices) and
//! peak EWMA (two random choices by latency and load, `ewma.rs`), all over an immutable
//! [`Snapshot`] of the eligible backends.
//!
//! A snapshot is rebuilt when the engine's decision changes (a verdict, an override, a weight
//! step of slow start, a load shed), and the request path reads it without a lock. It holds
//! every backend's weight: the one value the picker uses and `/status` and the metrics
//! report. Round robin walks a schedule precomputed with nginx's smooth weighted algorithm (so
//! a weight-3 backend is spread out, not picked three times in a row) through one atomic
//! counter.
//! Building that schedule costs one sort of the backends plus, per slot, one comparison per
//! distinct weight: linear in backends for equal weights, so a rebuild in a pool of thousands
//! (an override, a verdict change) never holds a runtime thread for long.

use std::sync::atomic::{AtomicUsize, Ordering};

use capataz_health::rotation::OnBackups;
use capataz_health::{AllDown, Eligible};

use capataz_config::Algorithm;

mod backend;
mod ewma;
mod handle;
mod latency;
mod limits;
pub mod placement;
pub mod ring;
pub mod sticky;
pub mod tap;

pub use backend::{BackendRt, OutcomeCounts, TrafficRing, HISTORY};
pub use ewma::{PeakEwma, DECAY as PEAK_EWMA_DECAY};
pub use handle::{PoolHandle, TrafficSink};
pub use latency::{LatencyBuckets, LatencyCounts, LatencyTotals};
pub use limits::{release, Admission, Admit, Limits};

/// The longest precomputed round-robin schedule; larger weight sums are scaled down.
const MAX_SCHEDULE: u64 = 65_536;

/// The backends a pool may send new requests to, every backend's weight, and why those serve
/// (the all-down policy applied, the backups in use), as the engine last decided them: what
/// the picker reads, and what `/status`, the metrics and the events report.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Snapshot {
    /// Indexes (into the pool's backends) of the eligible backends, in pool order.
    pub eligible: Vec<usize>,
    /// Whether no backend is UP (then `eligible` is every backend under fail-open, or empty
    /// under reject).
    pub all_down: bool,
    /// The all-down policy applied, while `all_down`.
    pub applied: Option<AllDown>,
    /// The backups serving (they are `eligible`), while no primary is in rotation.
    pub on_backups: Option<OnBackups>,
    /// Every backend's weight in tenths, in pool order (eligible or not).
    weights: Vec<u32>,
    schedule: Vec<u32>,
    /// The hash ring over `eligible`, for pools that hash (built with the snapshot).
    ring: Option<ring::Ring>,
    /// The backends out of rotation only because they drain, verdict UP (the engine's
    /// `Eligible::draining`): they keep sticky clients with `on_drain = "keep"`.
    pub draining: Vec<usize>,
}

impl Snapshot {
    /// A snapshot over `eligible` (indexes into the pool, ascending) with every backend's
    /// `weights` in tenths (in pool order; an eligible index past its end weighs 1).
    pub fn new(eligible: Vec<usize>, weights: Vec<u32>, all_down: bool) -> Snapshot {
        let serving: Vec<u32> = eligible
            .iter()
            .map(|&i| weights.get(i).copied().unwrap_or(1))
            .collect();
        let schedule = smooth_schedule(&serving);
        Snapshot {
            eligible,
            all_down,
            applied: None,
            on_backups: None,
            weights,
            schedule,
            ring: None,
            draining: Vec::new(),
        }
    }

    /// The snapshot of what the engine decided.
    pub fn of(eligible: Eligible) -> Snapshot {
        Snapshot {
            applied: eligible.applied,
            on_backups: eligible.on_backups,
            draining: eligible.draining,
            ..Snapshot::new(
                eligible.backends,
                eligible.member_weights,
                eligible.all_down,
            )
        }
    }

    /// Whether this snapshot already says what `eligible` says (a rebuild would change
    /// nothing).
    pub fn says(&self, eligible: &Eligible) -> bool {
        self.eligible == eligible.backends
            && self.weights == eligible.member_weights
            && self.all_down == eligible.all_down
            && self.applied == eligible.applied
            && self.on_backups == eligible.on_backups
            && self.draining == eligible.draining
    }

    /// Backend `backend`'s weight in tenths of its configured unit: in rotation, what the
    /// picker gives it; out of it, what it would get there. `None` past the pool's end.
    pub fn weight(&self, backend: usize) -> Option<u32> {
        self.weights.get(backend).copied()
    }

    /// Whether new requests may go to backend `backend`.
    pub fn serves(&self, backend: usize) -> bool {
        self.eligible.binary_search(&backend).is_ok()
    }

    /// Whether backend `backend` drains with its verdict UP: it takes no new clients but
    /// may keep its sticky ones.
    pub fn drains(&self, backend: usize) -> bool {
        self.draining.binary_search(&backend).is_ok()
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
        self.pick_where(
            algorithm,
            (cursor, exclude.is_empty()),
            |b| exclude.contains(&b),
            in_flight,
        )
    }

    /// [`Snapshot::pick`] skipping the backends `skip` names (those tried, and in a pool with
    /// limits those at their limit), advancing the round-robin `cursor` if `advance` (a first
    /// pick of a request) and else only reading it.
    #[inline]
    pub fn pick_where(
        &self,
        algorithm: Algorithm,
        (cursor, advance): (&AtomicUsize, bool),
        skip: impl Fn(usize) -> bool,
        in_flight: impl Fn(usize) -> usize,
    ) -> Option<usize> {
        if self.eligible.is_empty() {
            return None;
        }
        match algorithm {
            // A hashing pool's request without its key is balanced round robin.
            Algorithm::RoundRobin | Algorithm::Hash => self.pick_round_robin(cursor, advance, skip),
            // Peak EWMA is picked by `pick_peak_ewma`; without its estimates (a pool with
            // limits picking below them) it is this.
            Algorithm::LeastRequest | Algorithm::PeakEwma => {
                self.pick_least_request(skip, in_flight)
            }
        }
    }

    /// This snapshot with its hash ring built, each eligible backend named by `name`.
    pub fn with_ring<'a>(mut self, name: impl Fn(usize) -> &'a str) -> Snapshot {
        let weights = &self.weights;
        let weight = |i: usize| weights.get(i).copied().unwrap_or(1);
        self.ring = Some(ring::Ring::build(&self.eligible, weight, name));
        self
    }

    /// Picks the backend of a request whose key hashes to `key` on the ring, walking on past
    /// backends in `exclude` and, with a `balance_factor` (percent, 0: off), past those over
    /// their bounded load (see [`ring::overloaded`]; `in_flight(i)` gives backend `i`'s
    /// outstanding requests). Without a ring (a pool that does not hash), the first eligible
    /// backend not excluded.
    pub fn pick_by_key(
        &self,
        key: u64,
        exclude: &[usize],
        balance_factor: u32,
        in_flight: impl Fn(usize) -> usize,
    ) -> Option<usize> {
        let Some(ring) = &self.ring else {
            return self.eligible.iter().copied().find(|b| !exclude.contains(b));
        };
        if balance_factor == 0 {
            return ring.pick(key, exclude, |_| false);
        }
        let weight = |b: usize| u64::from(self.weight(b).unwrap_or(1).max(1));
        let total: u64 = self.eligible.iter().map(|&b| in_flight(b) as u64).sum();
        let total_weight: u64 = self.eligible.iter().map(|&b| weight(b)).sum();
        ring.pick(key, exclude, |b| {
            ring::overloaded(
                in_flight(b) as u64,
                weight(b),
                total,
                total_weight,
                balance_factor,
            )
        })
    }

    /// The owner of the point a key hashing to `key` falls on, on the ring of the backends
    /// in rotation (ignoring loads): the backend [`Snapshot::pick_by_key`] gives when it
    /// excludes none and none is over its bound. Without a ring, the first eligible backend;
    /// `None` when none is.
    pub fn owner_of_key(&self, key: u64) -> Option<usize> {
        match &self.ring {
            Some(ring) => ring.pick(key, &[], |_| false),
            None => self.eligible.first().copied(),
        }
    }

    fn pick_round_robin(
        &self,
        cursor: &AtomicUsize,
        advance: bool,
        skip: impl Fn(usize) -> bool,
    ) -> Option<usize> {
        let start = if advance {
            cursor.fetch_add(1, Ordering::Relaxed)
        } else {
            cursor.load(Ordering::Relaxed)
        };
        let len = self.schedule.len();
        // An excluded backend holds at most its weight's share of the schedule, so walking it
        // once finds any backend left.
        (0..len)
            .map(|step| self.eligible[self.schedule[(start + step) % len] as usize])
            .find(|&backend| !skip(backend))
    }

    fn pick_least_request(
        &self,
        skip: impl Fn(usize) -> bool,
        in_flight: impl Fn(usize) -> usize,
    ) -> Option<usize> {
        let n = self.eligible.len();
        let allowed = |slot: usize| !skip(self.eligible[slot]);
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
                let weight = |s: usize| u64::from(self.weight(self.eligible[s]).unwrap_or(1));
                let (wa, wb) = (weight(a), weight(b));
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
///
/// At each slot every backend's current weight grows by its weight, the largest (the lowest
/// index among equals) is picked and loses the total. Done literally that is O(backends x
/// total weight), seconds for 10,000 backends. The same sequence comes cheaper from two facts:
/// backends of equal weight are always picked in index order, round and round (their current
/// weights differ only by how often each was picked), so each distinct weight is one rotating
/// class whose candidate is its next member; and a backend's current weight at slot `t` is
/// `t * weight - total * picks`, so a class's candidate needs no update while others are
/// picked. Each slot compares the classes' candidates: O(total x distinct weights), which is
/// O(backends) for equal weights and at most 65,536 x 362 comparisons (distinct weights
/// summing to at most 65,536
/// are at most 362, and scaling adds only weight 1) plus one sort of the backends by weight.
fn smooth_schedule(weights: &[u32]) -> Vec<u32> {
    let scaled = scaled_weights(weights);
    let total: i64 = scaled.iter().sum();
    // The classes, by weight; each lists its members in index order.
    let mut order: Vec<u32> = (0..scaled.len() as u32).collect();
    order.sort_by_key(|&i| (scaled[i as usize], i));
    let mut classes: Vec<Class<'_>> = Vec::new();
    for chunk in order.chunk_by(|&a, &b| scaled[a as usize] == scaled[b as usize]) {
        classes.push(Class {
            weight: scaled[chunk[0] as usize],
            members: chunk,
            picks: 0,
        });
    }
    let mut schedule = Vec::with_capacity(total as usize);
    for t in 1..=total {
        let mut best: Option<(i64, u32, usize)> = None;
        for (c, class) in classes.iter().enumerate() {
            #[cfg(test)]
            tests::COMPARISONS.with(|n| n.set(n.get() + 1));
            let (current, index) = class.candidate(t, total);
            let better = match best {
                None => true,
                Some((b_current, b_index, _)) => {
                    current > b_current || (current == b_current && index < b_index)
                }
            };
            if better {
                best = Some((current, index, c));
            }
        }
        // `total >= 1` whenever there is a backend, and there is none only when `total == 0`.
        let Some((_, index, c)) = best else { break };
        classes[c].picks += 1;
        schedule.push(index);
    }
    schedule
}

/// Backends of one weight in the schedule: picked in index order, round and round.
struct Class<'a> {
    weight: i64,
    members: &'a [u32],
    /// How many slots this class has taken so far.
    picks: usize,
}

impl Class<'_> {
    /// The class's next member and its current weight at slot `t` (1-based), after the slot's
    /// increase: `t * weight - total * (times it was picked)`.
    fn candidate(&self, t: i64, total: i64) -> (i64, u32) {
        let n = self.members.len();
        let own_picks = (self.picks / n) as i64;
        (
            t * self.weight - total * own_picks,
            self.members[self.picks % n],
        )
    }
}

/// The weights the schedule uses: at least 1, scaled down when they sum past `MAX_SCHEDULE`.
fn scaled_weights(weights: &[u32]) -> Vec<i64> {
    let total: u64 = weights.iter().map(|&w| u64::from(w.max(1))).sum();
    weights
        .iter()
        .map(|&w| {
            let w = u64::from(w.max(1));
            if total > MAX_SCHEDULE {
                (w * MAX_SCHEDULE / total).max(1) as i64
            } else {
                w as i64
            }
        })
        .collect()
}

/// A uniform index below `n` (n > 0), from `fastrand`'s per-thread generator (the crate's one
/// random source; a test seeds it with `fastrand::seed`). No lock, no shared state.
fn random_below(n: usize) -> usize {
    fastrand::usize(..n)
}

#[cfg(test)]
mod tests {
    use std::cell::Cell;

    use proptest::prelude::*;

    use super::*;

    thread_local! {
        /// Class candidates compared by `smooth_schedule` on this thread.
        pub(super) static COMPARISONS: Cell<u64> = const { Cell::new(0) };
    }

    /// The schedule as it was built first, literally: every backend scanned at every
    /// slot, O(backends x total weight). The reference the fast one must match.
    fn reference_schedule(weights: &[u32]) -> Vec<u32> {
        let scaled = scaled_weights(weights);
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

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(256))]

        /// The class-based schedule is the nginx sequence, slot for slot, ties included.
        #[test]
        fn schedule_is_the_smooth_weighted_sequence(
            weights in prop::collection::vec(prop_oneof![0u32..4, 0u32..20, 0u32..1000], 0..40),
        ) {
            prop_assert_eq!(smooth_schedule(&weights), reference_schedule(&weights));
        }

        /// In any run of consecutive slots of the schedule (wrapping around, as the cursor
        /// does), each backend is picked fewer than 2 times away from its weight's share of
        /// the run: the bound the weight-versus-traffic tests (`tests/it/weights`) compare
        /// with.
        #[test]
        fn any_run_of_the_schedule_is_within_two_of_its_share(
            weights in prop::collection::vec(1u32..100, 1..6),
            start in 0usize..10_000,
            len in 1usize..400,
        ) {
            let schedule = smooth_schedule(&weights);
            let total: u32 = weights.iter().sum();
            let mut picks = vec![0u32; weights.len()];
            for step in 0..len {
                picks[schedule[(start + step) % schedule.len()] as usize] += 1;
            }
            for (i, &weight) in weights.iter().enumerate() {
                let share = len as f64 * f64::from(weight) / f64::from(total);
                prop_assert!(
                    (f64::from(picks[i]) - share).abs() < 2.0,
                    "{weights:?} from {start} for {len}: {picks:?}"
                );
            }
        }

        /// The same with sums past `MAX_SCHEDULE`, where weights are scaled down first.
        #[test]
        fn scaled_schedule_is_the_smooth_weighted_sequence(
            weights in prop::collection::vec(1u32..u32::MAX, 1..6),
        ) {
            prop_assert_eq!(smooth_schedule(&weights), reference_schedule(&weights));
        }
    }

    /// Regression: a snapshot of 10,000 weight-1 backends took 10^8 steps to build
    /// (0.9 s in release for one drain, on a runtime thread). Now one comparison per slot for
    /// equal weights, and at most the distinct weights per slot otherwise.
    #[test]
    fn snapshot_rebuild_is_linear_in_backends() {
        let comparisons = |weights: &[u32]| {
            COMPARISONS.with(|n| n.set(0));
            let snapshot = Snapshot::new((0..weights.len()).collect(), weights.to_vec(), false);
            (COMPARISONS.with(Cell::get), snapshot.schedule.len() as u64)
        };
        // 50,000 equal weights: 50,000 slots, one class (the old scan: 2.5 x 10^9 steps).
        let (n, slots) = comparisons(&[1; 50_000]);
        assert_eq!(slots, 50_000);
        assert_eq!(n, 50_000);
        // 10,000 backends of weights 1..=4: 25,000 slots, four classes each.
        let mixed: Vec<u32> = (0..10_000).map(|i| i % 4 + 1).collect();
        let (n, slots) = comparisons(&mixed);
        assert_eq!(slots, 25_000);
        assert_eq!(n, 4 * 25_000);
        // 10,000 distinct weights, scaled into the 65,536-slot cap: bounded by the cap times
        // the distinct scaled weights (at most 363), never by backends x slots.
        let distinct: Vec<u32> = (1..=10_000).collect();
        let (n, slots) = comparisons(&distinct);
        assert!(slots <= MAX_SCHEDULE + 10_000);
        assert!(n <= slots * 363, "{n} comparisons for {slots} slots");
    }

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
        let snapshot = Snapshot::new(vec![0, 2, 5], vec![5, 0, 1, 0, 0, 1], false);
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

    /// Regression: a retry advanced the shared cursor, so with two backends and the
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
