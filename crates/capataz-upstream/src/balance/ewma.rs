//! Peak EWMA (`algorithm = "peak_ewma"`, as Linkerd and Finagle pick): each backend keeps a
//! latency estimate ([`PeakEwma`]), and a request goes to the cheaper of two random eligible
//! backends, the cost being `estimate x (outstanding + 1) / weight`.
//!
//! The estimate is fed by the latency capataz already measures for every answer (request sent
//! to response head, the same value as `capataz_upstream_response_seconds`), in
//! `BackendRt::answered`. It is peak-sensitive: a sample slower than the estimate replaces it
//! at once; a faster one moves it by an exponential weight with time constant [`DECAY`]
//! (10 s): `w = exp(-elapsed / 10 s)`, `estimate = estimate x w + sample x (1 - w)`. When it is
//! read, an estimate decays towards zero with the time since its last sample, so a backend
//! left alone for one slow answer is tried again after a few time constants (and a slow answer
//! then puts its estimate back up at once). Attempts that got no answer (a refused connection,
//! a timeout) feed nothing: those are the passive checks' to judge.
//!
//! A backend not sampled yet (new, or back in rotation) is taken as fast as the one it is
//! compared with: between the two, the choice is least outstanding requests per weight.
//! A backend that comes back into rotation (from DOWN, an ejection, a drain or maintenance)
//! starts unsampled: its old estimate said nothing of the backend that returns. The request
//! path reads and writes the estimate lock-free: two relaxed atomics, a sample that races
//! another may be lost, never torn into a wrong number for long.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use super::{random_below, Snapshot};

/// The time constant of the estimate's decay.
pub const DECAY: Duration = Duration::from_secs(10);

/// One backend's latency estimate, in nanoseconds; 0 while unsampled.
#[derive(Debug)]
pub struct PeakEwma {
    epoch: Instant,
    /// The estimate, as `f64` bits (0.0: unsampled).
    estimate: AtomicU64,
    /// When it was last fed, in nanoseconds since `epoch`.
    at: AtomicU64,
}

impl Default for PeakEwma {
    fn default() -> PeakEwma {
        PeakEwma::new(Instant::now())
    }
}

impl PeakEwma {
    /// An unsampled estimate whose clock starts at `epoch`.
    pub fn new(epoch: Instant) -> PeakEwma {
        PeakEwma {
            epoch,
            estimate: AtomicU64::new(0),
            at: AtomicU64::new(0),
        }
    }

    fn nanos(&self, now: Instant) -> u64 {
        u64::try_from(now.saturating_duration_since(self.epoch).as_nanos()).unwrap_or(u64::MAX)
    }

    /// Feeds one answer's latency `rtt`, measured at `now`.
    pub fn observe(&self, rtt: Duration, now: Instant) {
        let sample = (rtt.as_nanos() as f64).max(1.0);
        let now = self.nanos(now);
        let previous = f64::from_bits(self.estimate.load(Ordering::Relaxed));
        let next = if previous == 0.0 || sample >= previous {
            sample
        } else {
            let elapsed = now.saturating_sub(self.at.load(Ordering::Relaxed));
            let w = decay(elapsed);
            previous * w + sample * (1.0 - w)
        };
        self.estimate.store(next.to_bits(), Ordering::Relaxed);
        self.at.store(now, Ordering::Relaxed);
    }

    /// The estimate at `now`, in nanoseconds, decayed with the time since its last sample;
    /// `None` while unsampled.
    pub fn estimate(&self, now: Instant) -> Option<f64> {
        let estimate = f64::from_bits(self.estimate.load(Ordering::Relaxed));
        if estimate == 0.0 {
            return None;
        }
        let idle = self
            .nanos(now)
            .saturating_sub(self.at.load(Ordering::Relaxed));
        // Never quite zero: a sampled backend stays sampled.
        Some((estimate * decay(idle)).max(f64::MIN_POSITIVE))
    }

    /// Forgets the estimate: the backend is unsampled again.
    pub fn reset(&self) {
        self.estimate.store(0, Ordering::Relaxed);
    }
}

/// `exp(-elapsed / DECAY)`.
fn decay(elapsed_nanos: u64) -> f64 {
    (-(elapsed_nanos as f64) / DECAY.as_nanos() as f64).exp()
}

impl Snapshot {
    /// Peak EWMA's pick among the eligible backends not in `exclude`: the cheaper of two
    /// distinct random ones, by `estimate x (outstanding + 1) / weight`, where `in_flight(i)`
    /// gives backend `i`'s outstanding requests and `estimate(i)` its latency estimate
    /// (`None`: unsampled, taken as fast as the other). `None` if every eligible backend is
    /// excluded.
    pub fn pick_peak_ewma(
        &self,
        exclude: &[usize],
        in_flight: impl Fn(usize) -> usize,
        estimate: impl Fn(usize) -> Option<f64>,
    ) -> Option<usize> {
        let n = self.eligible.len();
        if n == 0 {
            return None;
        }
        let allowed = |slot: usize| !exclude.contains(&self.eligible[slot]);
        let first = random_below(n);
        let mut second = random_below(n);
        if n > 1 && second == first {
            second = (first + 1 + random_below(n - 1)) % n;
        }
        let slot = match [first, second].map(|s| Some(s).filter(|&s| allowed(s))) {
            [Some(a), Some(b)] => {
                let (ba, bb) = (self.eligible[a], self.eligible[b]);
                let (ea, eb) = (estimate(ba), estimate(bb));
                // An unsampled backend is taken as fast as the other one.
                let (ea, eb) = match (ea, eb) {
                    (Some(x), Some(y)) => (x, y),
                    (Some(x), None) | (None, Some(x)) => (x, x),
                    (None, None) => (1.0, 1.0),
                };
                let cost = |backend: usize, latency: f64| {
                    let weight = f64::from(self.weight(backend).unwrap_or(1).max(1));
                    latency * (in_flight(backend) as f64 + 1.0) / weight
                };
                if cost(bb, eb) < cost(ba, ea) {
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

    /// Calls `reset` for every backend `next` (the eligible backends of the snapshot about to
    /// replace this one) serves that this snapshot did not: each comes back into rotation
    /// unsampled (see the module's doc).
    pub fn reset_returning(&self, next: &[usize], mut reset: impl FnMut(usize)) {
        for &b in next {
            if !self.serves(b) {
                reset(b);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: Duration = Duration::from_millis(1);

    fn ms(nanos: f64) -> f64 {
        nanos / 1e6
    }

    #[test]
    fn a_slower_sample_is_taken_at_once_and_faster_ones_decay_it() {
        let t0 = Instant::now();
        let ewma = PeakEwma::new(t0);
        assert_eq!(ewma.estimate(t0), None);
        ewma.observe(10 * MS, t0);
        assert!((ms(ewma.estimate(t0).unwrap()) - 10.0).abs() < 1e-9);
        // The peak: 50 ms replaces 10 ms at once.
        ewma.observe(50 * MS, t0 + MS);
        assert!((ms(ewma.estimate(t0 + MS).unwrap()) - 50.0).abs() < 1e-9);
        // A 10 ms answer 10 s later (one time constant): 50 e^-1 + 10 (1 - e^-1).
        let later = t0 + MS + DECAY;
        ewma.observe(10 * MS, later);
        let expected = 50.0 * (-1f64).exp() + 10.0 * (1.0 - (-1f64).exp());
        assert!((ms(ewma.estimate(later).unwrap()) - expected).abs() < 1e-6);
        // Faster answers close together barely move it.
        ewma.observe(MS, later + MS);
        assert!(ms(ewma.estimate(later + MS).unwrap()) > expected * 0.99);
    }

    #[test]
    fn an_idle_estimate_decays_towards_zero_when_read_and_reset_forgets_it() {
        let t0 = Instant::now();
        let ewma = PeakEwma::new(t0);
        ewma.observe(100 * MS, t0);
        let read = ms(ewma.estimate(t0 + 3 * DECAY).unwrap());
        assert!((read - 100.0 * (-3f64).exp()).abs() < 1e-6, "{read}");
        // Reading changed nothing.
        assert!((ms(ewma.estimate(t0).unwrap()) - 100.0).abs() < 1e-9);
        ewma.reset();
        assert_eq!(ewma.estimate(t0), None);
    }

    #[test]
    fn the_pick_prefers_the_lower_cost_and_counts_weight_and_load() {
        let snapshot = Snapshot::new(vec![0, 1], vec![10, 10], false);
        let latency = |b: usize| Some(if b == 0 { 50e6 } else { 1e6 });
        for _ in 0..50 {
            assert_eq!(snapshot.pick_peak_ewma(&[], |_| 0, latency), Some(1));
        }
        // 49 outstanding on the fast one cost 50 x 1 ms, the slow one's 1 x 50 ms: a tie goes
        // to the first choice; 60 outstanding tip it to the slow one.
        for _ in 0..50 {
            let load = |b: usize| if b == 1 { 60 } else { 0 };
            assert_eq!(snapshot.pick_peak_ewma(&[], load, latency), Some(0));
        }
        // Five times the weight makes 5x the latency even.
        let weighted = Snapshot::new(vec![0, 1], vec![50, 10], false);
        let latency = |b: usize| Some(if b == 0 { 4e6 } else { 1e6 });
        for _ in 0..50 {
            assert_eq!(weighted.pick_peak_ewma(&[], |_| 0, latency), Some(0));
        }
        assert_eq!(snapshot.pick_peak_ewma(&[1], |_| 0, latency), Some(0));
        assert_eq!(snapshot.pick_peak_ewma(&[0, 1], |_| 0, latency), None);
        assert_eq!(
            Snapshot::new(vec![], vec![], true).pick_peak_ewma(&[], |_| 0, latency),
            None
        );
    }

    #[test]
    fn backends_back_in_rotation_are_reset_and_the_others_kept() {
        let before = Snapshot::new(vec![0, 2], vec![10; 4], false);
        let mut reset = Vec::new();
        before.reset_returning(&[0, 1, 3], |b| reset.push(b));
        assert_eq!(reset, [1, 3]);
        reset.clear();
        before.reset_returning(&[0], |b| reset.push(b));
        assert!(reset.is_empty());
    }

    #[test]
    fn an_unsampled_backend_is_compared_by_load_alone() {
        let snapshot = Snapshot::new(vec![0, 1], vec![10, 10], false);
        let latency = |b: usize| (b == 0).then_some(500e6);
        // Equal load: as fast as the sampled one, a tie: either may win; more load loses.
        for _ in 0..50 {
            let load = |b: usize| usize::from(b == 0);
            assert_eq!(snapshot.pick_peak_ewma(&[], load, latency), Some(1));
            let load = |b: usize| usize::from(b == 1);
            assert_eq!(snapshot.pick_peak_ewma(&[], load, latency), Some(0));
        }
    }
}
