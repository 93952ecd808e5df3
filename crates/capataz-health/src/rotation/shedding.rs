//! Load shedding awareness: a backend that answers `429`, or `503` with `Retry-After`, asks for
//! less traffic, not to be judged. [`Rotation::handle_shed`](super::Rotation::handle_shed)
//! scales its weight down to [`LoadShedding::weight_percent`] for the time it asked (at most
//! [`LoadShedding::max`]), then restores it; the answer never counts as a traffic error.

use std::time::Duration;

/// How a pool honours a backend's request to shed load.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LoadShedding {
    /// The weight while shedding, in percent of the backend's weight (1-100).
    pub weight_percent: u8,
    /// The longest a shed lasts, whatever the backend asked.
    pub max: Duration,
}

impl LoadShedding {
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
}
