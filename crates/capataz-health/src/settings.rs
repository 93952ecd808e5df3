//! The engine's settings for one pool, and the two-valued [`State`] of a verdict or a side.

use std::fmt;
use std::num::NonZeroU32;
use std::time::Duration;

use crate::rules::{ProbeRule, TrafficRule};

/// A backend's health verdict, or one side's state.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum State {
    /// Eligible for traffic.
    Up,
    /// Out of rotation.
    Down,
}

impl State {
    /// `UP` or `DOWN`.
    pub fn as_str(self) -> &'static str {
        match self {
            State::Up => "UP",
            State::Down => "DOWN",
        }
    }
}

impl fmt::Display for State {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// How long passive ejections last; see the module documentation for the exact rule.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct EjectionPolicy {
    /// The first ejection's length; the n-th lasts `base x n`.
    pub base: Duration,
    /// The longest any ejection lasts. A backend that stays clear of ejection this long after a
    /// readmission starts counting its ejections from one again.
    pub max: Duration,
}

impl EjectionPolicy {
    /// How long the `nth` ejection (counting from 1) lasts.
    pub fn duration(&self, nth: u32) -> Duration {
        self.base.saturating_mul(nth.max(1)).min(self.max)
    }
}

/// The engine's settings for one pool. The defaults are the replay protocol's.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Settings {
    /// Consecutive passing probes that bring a DOWN active side UP (default 2).
    pub rise: NonZeroU32,
    /// Consecutive failed probes that take an UP active side DOWN (default 3).
    pub fall: NonZeroU32,
    /// Consecutive traffic errors that eject a backend (default 3).
    pub consecutive_errors: NonZeroU32,
    /// The active state of a backend that joins the pool (default UP).
    pub initial: State,
    /// Whether the first probe result of a backend that joined DOWN decides at once (HAProxy's
    /// `first-probe`): its first passing probe brings it UP without waiting for `rise`; a
    /// failing one leaves it DOWN, and from then on the streaks apply. Default false.
    pub first_probe: bool,
    /// How probe outcomes are judged.
    pub probe_rule: ProbeRule,
    /// How traffic outcomes are judged.
    pub traffic_rule: TrafficRule,
    /// Timed ejection with probation, or `None` for "ejected until the next good response".
    pub ejection: Option<EjectionPolicy>,
    /// The most of the pool, in percent, that passive checks may hold ejected at once
    /// (default 100). The cap is `floor(backends x percent / 100)` but at least one backend,
    /// except that 0 disables passive ejection.
    pub max_ejected_percent: u8,
    /// Whether probes that bring a DOWN active side back UP also end a passive ejection early,
    /// into probation (default false; Envoy's `successful_active_health_check_uneject_host`).
    /// Only that edge does it: a backend whose probes pass all along while its traffic fails
    /// (a "liar") stays ejected, because its active side never went DOWN.
    pub probes_end_ejection: bool,
}

const fn nz(n: u32) -> NonZeroU32 {
    match NonZeroU32::new(n) {
        Some(n) => n,
        None => panic!("zero threshold"),
    }
}

impl Default for Settings {
    fn default() -> Settings {
        Settings {
            rise: nz(2),
            fall: nz(3),
            consecutive_errors: nz(3),
            initial: State::Up,
            first_probe: false,
            probe_rule: ProbeRule::default(),
            traffic_rule: TrafficRule::default(),
            ejection: None,
            max_ejected_percent: 100,
            probes_end_ejection: false,
        }
    }
}
