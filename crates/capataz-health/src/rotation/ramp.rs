//! Slow start: a rejoining backend's weight ramps from 10 % to 100 % of its configured weight
//! in steps of a twentieth of the ramp (at least 50 ms): linear at each step, constant between
//! two. The weight is a step function of time so that it has one value between two steps,
//! whoever asks and whenever: the runtime rebuilds its snapshot at each step
//! ([`next_step`] is the engine's timer), and the picker and every report read that snapshot.
//!
//! Weights are in tenths of the configured unit, so a weight-1 backend at 10 % still counts.
//! All arithmetic saturates: a ramp of any length, started at any time, never panics.

use std::time::Duration;

/// A slow-starting backend begins at this share of its weight, in percent.
pub const FLOOR_PERCENT: u128 = 10;

/// How many steps a ramp takes (fewer when that would make them shorter than [`MIN_STEP`]).
const STEPS: u32 = 20;

/// The shortest step between two weight updates.
const MIN_STEP: Duration = Duration::from_millis(50);

/// The full weight of `weight` configured units, in tenths.
pub fn full_tenths(weight: u32) -> u32 {
    weight.saturating_mul(10)
}

/// The weight in tenths at `now` of a backend of `weight` that began ramping at `since` over
/// `ramp`: the weight of the last step at or before `now` (the full weight from the ramp's
/// end).
pub fn weight_tenths(weight: u32, since: Duration, ramp: Duration, now: Duration) -> u32 {
    let full = full_tenths(weight);
    let elapsed = now.saturating_sub(since).as_nanos();
    let ramp_nanos = ramp.as_nanos().max(1);
    if elapsed >= ramp_nanos {
        return full;
    }
    let step = step_nanos(ramp);
    let elapsed = elapsed / step * step;
    let percent = (FLOOR_PERCENT + (100 - FLOOR_PERCENT) * elapsed / ramp_nanos).min(100);
    let tenths = u128::from(full) * percent / 100;
    u32::try_from(tenths).unwrap_or(full).max(1)
}

/// When a ramp that began at `since` ends.
pub fn end(since: Duration, ramp: Duration) -> Duration {
    since.saturating_add(ramp)
}

/// The first weight step after `now` of a ramp that began at `since`, capped at its end.
pub fn next_step(since: Duration, ramp: Duration, now: Duration) -> Duration {
    let step = step_nanos(ramp);
    let elapsed = now.saturating_sub(since).as_nanos();
    let offset = (elapsed / step)
        .saturating_add(1)
        .saturating_mul(step)
        .min(ramp.as_nanos());
    since.saturating_add(from_nanos(offset))
}

/// The time between two weight steps of `ramp`, in nanoseconds (never zero).
fn step_nanos(ramp: Duration) -> u128 {
    (ramp / STEPS).max(MIN_STEP).as_nanos()
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
    fn the_weight_holds_between_two_steps() {
        // Steps of 500 ms over 10 s: 10 %, 14.5 %, 19 %, ... of 40 tenths.
        let ramp = 10 * S;
        let ms = Duration::from_millis;
        assert_eq!(weight_tenths(4, S, ramp, S + ms(499)), 4);
        assert_eq!(weight_tenths(4, S, ramp, S + ms(500)), 5);
        assert_eq!(weight_tenths(4, S, ramp, S + ms(999)), 5);
        assert_eq!(weight_tenths(4, S, ramp, S + ms(1000)), 7);
        // The last step lasts until the end, then the full weight.
        assert_eq!(weight_tenths(4, S, ramp, S + ms(9999)), 38);
        assert_eq!(weight_tenths(4, S, ramp, S + ms(10_000)), 40);
        // Between two steps, nothing changes: the weight at any time is the weight at the
        // step `next_step` announced last.
        let mut at = S;
        while at < S + ramp {
            let next = next_step(S, ramp, at);
            assert_eq!(
                weight_tenths(4, S, ramp, at),
                weight_tenths(4, S, ramp, next - Duration::from_nanos(1))
            );
            at = next;
        }
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
