//! The runtime's [`Clock`], which turns engine time into instants and wall time, saturating.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use tokio::time::Instant;

/// The latest wall-clock time the runtime writes (9999-12-31T23:59:59Z): engine times past it
/// (a saturated TTL) are shown as this.
const LAST_WALL: Duration = Duration::from_secs(253_402_300_799);

/// How far ahead a timer is set at most; anything later is "never" in practice, and a far
/// instant could overflow the platform's clock.
const FAR: Duration = Duration::from_secs(100 * 365 * 86_400);

/// The runtime's clock: time zero of the engines and the wall-clock time it corresponds to.
/// It reads tokio's clock, so tests may pause and advance it.
#[derive(Clone, Copy, Debug)]
pub struct Clock {
    origin: Instant,
    wall: SystemTime,
}

impl Clock {
    /// A clock starting now.
    pub fn start() -> Clock {
        Clock {
            origin: Instant::now(),
            wall: SystemTime::now(),
        }
    }

    /// Time since the origin: the engines' `now`.
    pub fn now(&self) -> Duration {
        Instant::now().saturating_duration_since(self.origin)
    }

    /// The engine time of `instant` (zero for one before the clock started).
    pub fn at(&self, instant: Instant) -> Duration {
        instant.saturating_duration_since(self.origin)
    }

    /// The wall-clock time of engine time `t`, saturating at the year 9999.
    pub fn wall(&self, t: Duration) -> SystemTime {
        let last = UNIX_EPOCH + LAST_WALL;
        self.wall.checked_add(t).map_or(last, |wall| wall.min(last))
    }

    /// The instant of engine time `t`, at most a century ahead.
    pub fn instant(&self, t: Duration) -> Instant {
        let t = t.min(self.now().saturating_add(FAR));
        // Within a century of now, so the additions cannot fail on any real clock.
        self.origin
            .checked_add(t)
            .or_else(|| self.origin.checked_add(FAR))
            .unwrap_or(self.origin)
    }
}
