//! How often a backend is probed, by where its active side stands (HAProxy's `inter`,
//! `fastinter` and `downinter`; Envoy's `interval`, `unhealthy_edge_interval` and
//! `unhealthy_interval`).
//!
//! - [`Cadence::Steady`]: UP with no failure streak, or not probed yet: the pool's `interval`.
//! - [`Cadence::Fast`]: a streak is under way that may change the active state: an UP side with
//!   at least one failed probe, or a DOWN side with at least one passing probe. Probing faster
//!   then shortens the time to a verdict without changing `rise` or `fall`.
//! - [`Cadence::Down`]: DOWN with no passing probe, after at least one probe: the backend is
//!   known bad, so probes may be spaced out. A backend that starts DOWN and was never probed
//!   (a gated or `first-probe` newcomer) is probed at the steady interval: nothing is known
//!   about it yet.
//!
//! The cadence is a pure function of the active side ([`crate::pool::Active`]); the runtime asks
//! for it after every probe and waits the matching interval from [`ProbeIntervals`]. With all
//! three intervals equal (the default) nothing changes.

use std::time::Duration;

use crate::pool::Active;
use crate::settings::State;

/// Which of a pool's probe intervals applies to a backend now.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Cadence {
    /// UP and steady: the pool's `interval`.
    Steady,
    /// A streak is under way that may change the active state: `fast_interval`.
    Fast,
    /// DOWN with no passing probe: `down_interval`.
    Down,
}

impl Cadence {
    /// The cadence of an active side.
    pub fn of(active: &Active) -> Cadence {
        match active.state {
            State::Up if active.fail_streak > 0 => Cadence::Fast,
            State::Up => Cadence::Steady,
            State::Down if !active.probed => Cadence::Steady,
            State::Down if active.pass_streak > 0 => Cadence::Fast,
            State::Down => Cadence::Down,
        }
    }

    /// `steady`, `fast` or `down`.
    pub fn as_str(self) -> &'static str {
        match self {
            Cadence::Steady => "steady",
            Cadence::Fast => "fast",
            Cadence::Down => "down",
        }
    }
}

/// A pool's three probe intervals.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ProbeIntervals {
    /// Between probes of a steady UP backend.
    pub steady: Duration,
    /// While a streak is under way ([`Cadence::Fast`]).
    pub fast: Duration,
    /// While DOWN with no passing probe ([`Cadence::Down`]).
    pub down: Duration,
}

impl ProbeIntervals {
    /// One interval for every cadence: today's behaviour.
    pub fn uniform(interval: Duration) -> ProbeIntervals {
        ProbeIntervals {
            steady: interval,
            fast: interval,
            down: interval,
        }
    }

    /// The interval for `cadence`.
    pub fn of(&self, cadence: Cadence) -> Duration {
        match cadence {
            Cadence::Steady => self.steady,
            Cadence::Fast => self.fast,
            Cadence::Down => self.down,
        }
    }
}
