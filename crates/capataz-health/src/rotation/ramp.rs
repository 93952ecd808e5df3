//! Slow start: a rejoining backend's weight ramps linearly from 10 % to 100 % of its configured
//! weight, and the snapshot is rebuilt in steps of a twentieth of the ramp (at least 50 ms).
//!
//! Weights are in tenths of the configured unit, so a weight-1 backend at 10 % still counts.
//! All arithmetic saturates: a ramp of any length, started at any time, never panics.

use std::time::Duration;

/// A slow-starting backend begins at this share of its weight, in percent.
pub const FLOOR_PERCENT: u128 = 10;

/// The shortest step between two weight updates.
const MIN_STEP: Duration = Duration::from_millis(50);

/// The full weight of `weight` configured units, in tenths.
pub fn full_tenths(weight: u32) -> u32 {
    weight.saturating_mul(10)
}

/// The weight in tenths at `now` of a backend of `weight` that began ramping at `since` over
/// `ramp`.
pub fn weight_tenths(weight: u32, since: Duration, ramp: Duration, now: Duration) -> u32 {
    let full = full_tenths(weight);
    let elapsed = now.saturating_sub(since).as_nanos();
    let ramp = ramp.as_nanos().max(1);
    if elapsed >= ramp {
        return full;
    }
    let percent = (FLOOR_PERCENT + (100 - FLOOR_PERCENT) * elapsed / ramp).min(100);
    let tenths = u128::from(full) * percent / 100;
    u32::try_from(tenths).unwrap_or(full).max(1)
}

/// When a ramp that began at `since` ends.
pub fn end(since: Duration, ramp: Duration) -> Duration {
    since.saturating_add(ramp)
}

/// The first weight step after `now` of a ramp that began at `since`, capped at its end.
pub fn next_step(since: Duration, ramp: Duration, now: Duration) -> Duration {
    let step = (ramp / 20).max(MIN_STEP).as_nanos();
    let elapsed = now.saturating_sub(since).as_nanos();
    let offset = (elapsed / step)
        .saturating_add(1)
        .saturating_mul(step)
        .min(ramp.as_nanos());
    since.saturating_add(from_nanos(offset))
}

fn from_nanos(nanos: u128) -> Duration {
    const PER_SEC: u128 = 1_000_000_000;
    let secs = u64::try_from(nanos / PER_SEC).unwrap_or(u64::MAX);
    // The remainder is below one billion, so it fits.
    Duration::new(secs, (nanos % PER_SEC) as u32)
}

#[cfg(test)]
mod tests {
    use super::*;

    const S: Duration = Duration::from_secs(1);

    #[test]
    fn the_weight_ramps_from_a_tenth_to_full() {
        let ramp = 10 * S;
        assert_eq!(weight_tenths(4, S, ramp, S), 4);
        assert_eq!(weight_tenths(4, S, ramp, 6 * S), 22);
        assert_eq!(weight_tenths(4, S, ramp, 11 * S), 40);
        assert_eq!(weight_tenths(4, S, ramp, Duration::MAX), 40);
        // Never below one tenth, whatever the weight.
        assert_eq!(weight_tenths(1, S, ramp, S), 1);
    }

    #[test]
    fn steps_are_a_twentieth_of_the_ramp_and_stop_at_its_end() {
        let ramp = 20 * S;
        assert_eq!(next_step(S, ramp, S), 2 * S);
        assert_eq!(next_step(S, ramp, 2 * S), 3 * S);
        assert_eq!(next_step(S, ramp, 20 * S + S / 2), 21 * S);
        // Short ramps step every 50 ms at most.
        let short = Duration::from_millis(200);
        assert_eq!(next_step(S, short, S), S + MIN_STEP);
    }

    #[test]
    fn huge_ramps_and_times_saturate() {
        let huge = Duration::MAX;
        assert_eq!(end(S, huge), Duration::MAX);
        assert!(next_step(S, huge, Duration::MAX) <= Duration::MAX);
        assert_eq!(weight_tenths(u32::MAX, S, huge, 2 * S), 429_496_729);
        assert_eq!(
            weight_tenths(u32::MAX, Duration::MAX, S, Duration::MAX),
            429_496_729
        );
        assert_eq!(weight_tenths(u32::MAX, S, S, Duration::MAX), u32::MAX);
    }
}
