//! The arithmetic of check times: a random first phase, a jittered interval, and a slot grid
//! that batches due times, over [`Duration`]s and a seeded [`Rng`]. A seed makes every phase and
//! jitter repeat.

use std::time::Duration;

/// The schedule's random source: splitmix64, seeded by the caller. Not cryptographic: it spreads
/// checks apart, nothing more. The engine draws no OS randomness; the runtime seeds it (from a
/// generator a test can seed), so the same seed gives the same phases and jitter.
#[derive(Clone, Debug)]
pub struct Rng {
    state: u64,
}

impl Rng {
    /// A generator seeded with `seed`.
    pub fn with_seed(seed: u64) -> Rng {
        Rng { state: seed }
    }

    /// The next 64 random bits.
    pub fn u64(&mut self) -> u64 {
        self.state = self.state.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.state;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// Uniform in [0, `n`) (Lemire's method, without bias); 0 when `n` is 0.
    pub fn below(&mut self, n: u64) -> u64 {
        if n == 0 {
            return 0;
        }
        let mut m = u128::from(self.u64()) * u128::from(n);
        if (m as u64) < n {
            let threshold = n.wrapping_neg() % n;
            while (m as u64) < threshold {
                m = u128::from(self.u64()) * u128::from(n);
            }
        }
        (m >> 64) as u64
    }

    /// Uniform in [`low`, `high`], both included (`high` below `low` counts as `low`).
    pub fn between(&mut self, low: u64, high: u64) -> u64 {
        match high.saturating_sub(low) {
            u64::MAX => self.u64(),
            span => low + self.below(span + 1),
        }
    }
}

/// The slot grid of check due times (at most; see [`align_to_slot`]). Probes of any backends due
/// in the same slot start on one timer tick and their connects leave back to back in one runtime
/// poll, so a sleeping backend host is woken about once per batch rather than once per probe (on
/// loopback that wake-up is charged to the balancer's `connect()` and `send()`). 10 ms is 1 % of
/// a 1 s interval: the jitter and the random first phase still spread probes evenly at the
/// 100 ms scale.
pub const PROBE_SLOT: Duration = Duration::from_millis(10);

/// `due` rounded to the nearest multiple of the probe slot, and never before `now`.
///
/// The slot is [`PROBE_SLOT`] or 1 % of `interval`, whichever is shorter, so short intervals are
/// not distorted; rounding to the nearest boundary keeps the mean interval unchanged. Below a
/// millisecond (the runtime timer's resolution) `due` is returned as it is.
pub fn align_to_slot(due: Duration, now: Duration, interval: Duration) -> Duration {
    let slot = PROBE_SLOT.min(interval / 100);
    if slot < Duration::from_millis(1) {
        return due;
    }
    let slot = nanos(slot);
    let due_ns = nanos(due);
    let aligned = due_ns.saturating_add(slot / 2) / slot * slot;
    let aligned = if aligned < nanos(now) {
        aligned.saturating_add(slot)
    } else {
        aligned
    };
    Duration::from_nanos(aligned)
}

/// The delay before a backend's first check: uniform in [0, `interval`), so that backends
/// configured together are not checked in lockstep. Zero for a zero interval.
pub fn first_delay(interval: Duration, rng: &mut Rng) -> Duration {
    Duration::from_nanos(rng.below(nanos(interval)))
}

/// One interval with jitter: uniform in [`interval` * (1 - `jitter`), `interval` * (1 + `jitter`)].
///
/// `jitter` is a fraction; it is clamped to [0, 1], and NaN counts as 0.
pub fn jittered(interval: Duration, jitter: f64, rng: &mut Rng) -> Duration {
    let jitter = if jitter > 0.0 { jitter.min(1.0) } else { 0.0 };
    let (low, high) = jitter_bounds(interval, jitter);
    Duration::from_nanos(rng.between(low, high))
}

/// The bounds of [`jittered`] in nanoseconds, both included.
fn jitter_bounds(interval: Duration, jitter: f64) -> (u64, u64) {
    let interval = nanos(interval) as f64;
    let low = (interval * (1.0 - jitter)).round() as u64;
    let high = (interval * (1.0 + jitter)).round() as u64;
    (low, high.max(low))
}

/// A duration in nanoseconds, saturating (at over 500 years).
pub(crate) fn nanos(duration: Duration) -> u64 {
    u64::try_from(duration.as_nanos()).unwrap_or(u64::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;

    const SAMPLES: u32 = 20_000;

    #[test]
    fn first_delay_is_uniform_below_the_interval() {
        let mut rng = Rng::with_seed(7);
        let interval = Duration::from_secs(2);
        let (mut min, mut max, mut sum) = (interval, Duration::ZERO, Duration::ZERO);
        for _ in 0..SAMPLES {
            let delay = first_delay(interval, &mut rng);
            assert!(delay < interval, "{delay:?}");
            min = min.min(delay);
            max = max.max(delay);
            sum += delay;
        }
        let mean = (sum / SAMPLES).as_secs_f64();
        assert!((mean - 1.0).abs() < 0.05, "mean {mean}");
        assert!(
            min < interval / 100 && max > interval * 99 / 100,
            "{min:?} {max:?}"
        );
        assert_eq!(first_delay(Duration::ZERO, &mut rng), Duration::ZERO);
    }

    #[test]
    fn jittered_stays_within_its_bounds_and_covers_them() {
        let mut rng = Rng::with_seed(11);
        let interval = Duration::from_secs(2);
        let (low, high) = (Duration::from_millis(1800), Duration::from_millis(2200));
        let (mut min, mut max, mut sum) = (high, low, Duration::ZERO);
        for _ in 0..SAMPLES {
            let delay = jittered(interval, 0.1, &mut rng);
            assert!(low <= delay && delay <= high, "{delay:?}");
            min = min.min(delay);
            max = max.max(delay);
            sum += delay;
        }
        let mean = (sum / SAMPLES).as_secs_f64();
        assert!((mean - 2.0).abs() < 0.01, "mean {mean}");
        let margin = Duration::from_millis(5);
        assert!(min < low + margin && max > high - margin, "{min:?} {max:?}");
    }

    #[test]
    fn jitter_edge_cases() {
        let mut rng = Rng::with_seed(3);
        let interval = Duration::from_millis(500);
        for jitter in [0.0, -1.0, f64::NAN] {
            assert_eq!(jittered(interval, jitter, &mut rng), interval, "{jitter}");
        }
        for _ in 0..1000 {
            assert!(jittered(interval, 5.0, &mut rng) <= interval * 2);
        }
        assert_eq!(jittered(Duration::ZERO, 0.5, &mut rng), Duration::ZERO);
        let huge = jittered(Duration::MAX, 0.5, &mut rng);
        assert!(huge >= Duration::from_nanos(u64::MAX / 2));
    }

    #[test]
    fn due_times_round_to_the_nearest_slot() {
        let ms = Duration::from_millis;
        let second = Duration::from_secs(1);
        let check = |due, now, interval, expected| {
            assert_eq!(
                align_to_slot(due, now, interval),
                expected,
                "{due:?} {now:?} {interval:?}"
            );
        };
        check(ms(1004), ms(0), second, ms(1000));
        check(ms(1005), ms(0), second, ms(1010));
        check(ms(1010), ms(0), second, ms(1010));
        // Never before now: a due time rounded into the past moves up one slot.
        check(ms(1003), ms(1002), second, ms(1010));
        check(ms(1003), ms(1000), second, ms(1000));
        // The slot is at most 1 % of the interval; under 1 ms nothing is rounded.
        check(ms(1003), ms(0), ms(200), ms(1004));
        let odd = Duration::from_micros(1_234_567);
        check(odd, ms(0), ms(30), odd);
        check(odd, ms(0), Duration::ZERO, odd);
    }

    #[test]
    fn aligned_due_times_keep_the_mean_interval() {
        let mut rng = Rng::with_seed(5);
        let interval = Duration::from_secs(1);
        let mut now = first_delay(interval, &mut rng);
        let start = now;
        for _ in 0..SAMPLES {
            let due = align_to_slot(now + jittered(interval, 0.1, &mut rng), now, interval);
            assert_eq!(nanos(due) % nanos(PROBE_SLOT), 0, "{due:?}");
            now = due;
        }
        let mean = ((now - start) / SAMPLES).as_secs_f64();
        assert!((mean - 1.0).abs() < 0.001, "mean {mean}");
    }

    #[test]
    fn probe_timing_repeats_from_a_seed() {
        let draws = |seed| {
            let mut rng = Rng::with_seed(seed);
            let interval = Duration::from_secs(1);
            let mut out = vec![first_delay(interval, &mut rng)];
            out.extend((0..8).map(|_| jittered(interval, 0.1, &mut rng)));
            out
        };
        assert_eq!(draws(42), draws(42));
        assert_ne!(draws(42), draws(43));
    }

    #[test]
    fn draws_below_a_bound_are_uniform() {
        let mut rng = Rng::with_seed(1);
        let mut counts = [0u32; 6];
        for _ in 0..60_000 {
            counts[rng.below(6) as usize] += 1;
        }
        assert!(
            counts.iter().all(|&n| (9_500..10_500).contains(&n)),
            "{counts:?}"
        );
        assert_eq!(rng.between(5, 5), 5);
        assert_eq!(rng.between(7, 3), 7);
        assert!((0..1000).all(|_| (3..=9).contains(&rng.between(3, 9))));
    }
}
