//! Load shedding awareness: a backend that answers `429`, or `503` with `Retry-After`, asks for
//! less traffic, not to be judged. [`LoadShedding::relief`] decides whether an answer asks and
//! for how long (the admission rule the request path applies to every answer head);
//! [`Rotation::handle_shed`](super::Rotation::handle_shed) scales its weight down to
//! [`LoadShedding::weight_percent`] for that time (at most [`LoadShedding::max`]), then
//! restores it; the answer never counts as a traffic error.

use std::time::Duration;

/// How a pool honours a backend's request to shed load.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LoadShedding {
    /// The weight while shedding, in percent of the backend's weight (1-100).
    pub weight_percent: u8,
    /// The longest a shed lasts, whatever the backend asked.
    pub max: Duration,
    /// The relief a `429` without a usable `Retry-After` gets.
    pub default_relief: Duration,
}

impl LoadShedding {
    /// Whether an answer with `status` may ask for relief at all (`429` or `503`): two
    /// comparisons, asked of every answer head before any header is read.
    #[inline]
    pub fn may_ask(status: u16) -> bool {
        status == 429 || status == 503
    }

    /// The relief an answer with `status` asks for, given the `Retry-After` it carried
    /// (`asked`; `None` when absent or unusable), bounded by [`LoadShedding::max`]: what it
    /// asked, or [`LoadShedding::default_relief`] for a `429` that said nothing usable. `None`:
    /// the answer asks for nothing (any other status, or a `503` without a usable
    /// `Retry-After`) and is judged as traffic.
    pub fn relief(&self, status: u16, asked: Option<Duration>) -> Option<Duration> {
        let relief = match (status, asked) {
            (429 | 503, Some(asked)) => asked,
            (429, None) => self.default_relief,
            _ => return None,
        };
        Some(relief.min(self.max))
    }

    /// `weight_tenths` scaled down for a shedding backend (at least 1).
    pub fn scaled(&self, weight_tenths: u32) -> u32 {
        let scaled = u64::from(weight_tenths) * u64::from(self.weight_percent.min(100)) / 100;
        u32::try_from(scaled).unwrap_or(u32::MAX).max(1)
    }
}

/// A backend started or stopped shedding load.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ShedChange {
    /// The backend's index in the pool.
    pub backend: usize,
    /// The status that asked (`429` or `503`) and until when its weight is reduced; `None`
    /// when the shed is over and its weight restored.
    pub shed: Option<Shed>,
    /// When, on the caller's clock.
    pub at: Duration,
}

/// One shed under way.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Shed {
    /// The status that asked for it.
    pub status: u16,
    /// How long it was asked for (bounded by [`LoadShedding::max`]).
    pub duration: Duration,
    /// When it ends.
    pub until: Duration,
    /// The backend's weight meanwhile, in percent of what it would be
    /// ([`LoadShedding::weight_percent`]).
    pub weight_percent: u8,
}

#[cfg(test)]
mod tests {
    use super::*;

    const S: Duration = Duration::from_secs(1);

    const SHEDDING: LoadShedding = LoadShedding {
        weight_percent: 10,
        max: Duration::from_secs(300),
        default_relief: Duration::from_secs(5),
    };

    #[test]
    fn only_a_429_or_a_503_may_ask_for_relief() {
        for status in [429, 503] {
            assert!(LoadShedding::may_ask(status));
        }
        for status in [200, 404, 500, 502, 504, 0, u16::MAX] {
            assert!(!LoadShedding::may_ask(status), "{status}");
            assert_eq!(SHEDDING.relief(status, Some(S)), None, "{status}");
        }
    }

    #[test]
    fn a_429_gets_the_default_relief_a_503_needs_retry_after() {
        assert_eq!(SHEDDING.relief(429, None), Some(5 * S));
        assert_eq!(SHEDDING.relief(503, None), None, "judged as traffic");
        assert_eq!(SHEDDING.relief(429, Some(30 * S)), Some(30 * S));
        assert_eq!(SHEDDING.relief(503, Some(30 * S)), Some(30 * S));
        // `Retry-After: 0` asks for no relief: still a shedding answer, never judged.
        assert_eq!(
            SHEDDING.relief(503, Some(Duration::ZERO)),
            Some(Duration::ZERO)
        );
    }

    #[test]
    fn relief_is_clamped_to_the_maximum() {
        assert_eq!(SHEDDING.relief(429, Some(301 * S)), Some(300 * S));
        assert_eq!(SHEDDING.relief(503, Some(Duration::MAX)), Some(300 * S));
        let long_default = LoadShedding {
            default_relief: 900 * S,
            ..SHEDDING
        };
        assert_eq!(long_default.relief(429, None), Some(300 * S));
    }

    #[test]
    fn the_shed_weight_is_scaled_and_never_zero() {
        assert_eq!(SHEDDING.scaled(100), 10);
        assert_eq!(SHEDDING.scaled(1), 1);
        assert_eq!(SHEDDING.scaled(u32::MAX), 429_496_729);
    }
}
