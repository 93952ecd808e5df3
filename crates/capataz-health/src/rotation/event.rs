//! What a [`Rotation`](super::Rotation) reports, in the order it happened: verdict changes,
//! active-side changes hidden behind an ejection, manual overrides set or lapsed, and the pool
//! entering or leaving the all-down state with the policy it really applies.

use std::fmt;
use std::time::Duration;

use super::AgentChange;
use crate::settings::State;
use crate::status::Outcome;
use crate::Transition;

/// A manual override of a backend's health.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum OverrideKind {
    /// No new requests; in-flight ones finish.
    Drain,
    /// Out of rotation whatever health says.
    Down,
    /// In rotation whatever health says.
    Up,
}

impl OverrideKind {
    /// `drain`, `down` or `up`.
    pub fn as_str(self) -> &'static str {
        match self {
            OverrideKind::Drain => "drain",
            OverrideKind::Down => "down",
            OverrideKind::Up => "up",
        }
    }
}

/// A manual override in force.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Override {
    /// What it does.
    pub kind: OverrideKind,
    /// When it was set, on the caller's clock.
    pub since: Duration,
    /// When it lapses (`None`: until cleared). Saturates: a huge TTL never lapses.
    pub until: Option<Duration>,
}

/// A backend's effective state: its verdict, or what an override makes of it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Effective {
    /// Verdict UP, no override.
    Up,
    /// Verdict DOWN, no override.
    Down,
    /// Drained by an operator.
    Draining,
    /// Forced down by an operator.
    ForcedDown,
    /// Forced up by an operator.
    ForcedUp,
}

impl Effective {
    /// The effective state of a backend with `verdict` under `kind`.
    pub fn of(verdict: State, kind: Option<OverrideKind>) -> Effective {
        match (kind, verdict) {
            (Some(kind), _) => Effective::from_override(kind),
            (None, State::Up) => Effective::Up,
            (None, State::Down) => Effective::Down,
        }
    }

    fn from_override(kind: OverrideKind) -> Effective {
        match kind {
            OverrideKind::Drain => Effective::Draining,
            OverrideKind::Down => Effective::ForcedDown,
            OverrideKind::Up => Effective::ForcedUp,
        }
    }

    /// `UP`, `DOWN`, `DRAINING`, `FORCED_DOWN` or `FORCED_UP`.
    pub fn as_str(self) -> &'static str {
        match self {
            Effective::Up => "UP",
            Effective::Down => "DOWN",
            Effective::Draining => "DRAINING",
            Effective::ForcedDown => "FORCED_DOWN",
            Effective::ForcedUp => "FORCED_UP",
        }
    }

    /// Whether new requests may go to the backend (outside the all-down policy).
    pub fn in_rotation(self) -> bool {
        matches!(self, Effective::Up | Effective::ForcedUp)
    }
}

impl fmt::Display for Effective {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Who changed an override.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum OverrideCause {
    /// An operator set or cleared it.
    Operator,
    /// Its TTL ran out.
    Lapsed,
}

/// An override set, cleared or lapsed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct OverrideChange {
    /// The backend's index in the pool.
    pub backend: usize,
    /// The override in force after the change (`None` once cleared or lapsed).
    pub kind: Option<OverrideKind>,
    /// How long it lasts, when set with a TTL.
    pub ttl: Option<Duration>,
    /// The effective state before.
    pub from: Effective,
    /// The effective state after.
    pub to: Effective,
    /// Who changed it.
    pub cause: OverrideCause,
    /// When, on the caller's clock.
    pub at: Duration,
}

/// What a pool with no backend in rotation does: the policy actually applied, not just the one
/// configured.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AllDown {
    /// `fail_open`: traffic is spread over `backends` of the pool's `of` backends, the ones proven
    /// healthy once (UP at some point) and under no manual override.
    FailOpen {
        /// How many backends get traffic.
        backends: usize,
        /// How many the pool has.
        of: usize,
    },
    /// `reject`, as configured: 503 without touching a backend.
    Reject,
    /// `fail_open` is configured but no backend qualifies, so requests get 503: every backend is
    /// either under a manual override (down or drain) or was never proven healthy.
    NoneToFailOpen {
        /// Backends under a manual override.
        overridden: usize,
        /// Backends never proven healthy (not yet UP since they joined).
        unproven: usize,
    },
}

impl AllDown {
    /// The policy applied: `fail_open` or `reject`.
    pub fn policy(self) -> &'static str {
        match self {
            AllDown::FailOpen { .. } => "fail_open",
            AllDown::Reject | AllDown::NoneToFailOpen { .. } => "reject",
        }
    }

    /// Whether requests get 503 without touching a backend.
    pub fn rejects(self) -> bool {
        !matches!(self, AllDown::FailOpen { .. })
    }
}

impl fmt::Display for AllDown {
    /// What the pool does, after "has no UP backend: ".
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match *self {
            AllDown::FailOpen { backends, of } if backends == of => {
                f.write_str("failing open, spreading traffic over its backends")
            }
            AllDown::FailOpen { backends, of } => write!(
                f,
                "failing open, spreading traffic over {backends} of its {of} backends \
                 (those proven healthy once and not overridden)"
            ),
            AllDown::Reject => f.write_str("rejecting requests with 503"),
            AllDown::NoneToFailOpen {
                overridden,
                unproven,
            } => write!(
                f,
                "rejecting requests with 503: fail_open has no backend to spread traffic over \
                 ({overridden} under a manual override, {unproven} never proven healthy)"
            ),
        }
    }
}

/// The active side changed while the verdict did not (a passive ejection holds the backend
/// out): worth a log line, not a transition.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ActiveChange {
    /// The backend's index in the pool.
    pub backend: usize,
    /// The active side's new state.
    pub state: State,
    /// The streak that changed it.
    pub streak: u32,
    /// The last probe outcome.
    pub last: Outcome,
    /// When, on the caller's clock.
    pub at: Duration,
}

/// One thing a [`Rotation`](super::Rotation) reports.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Event {
    /// A backend's verdict changed.
    Transition(Transition),
    /// A backend's active side changed behind an ejection.
    ActiveChange(ActiveChange),
    /// An override was set, cleared or lapsed.
    Override(OverrideChange),
    /// The pool has no backend in rotation any more (or still has none, and the policy applied
    /// changed): what it does now.
    AllDown {
        /// The policy applied.
        applied: AllDown,
        /// When, on the caller's clock.
        at: Duration,
    },
    /// A backend's agent said something new.
    Agent(AgentChange),
    /// The pool has a backend in rotation again.
    Recovered {
        /// When, on the caller's clock.
        at: Duration,
    },
}
