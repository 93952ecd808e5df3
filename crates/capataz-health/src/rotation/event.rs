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
    /// Out of rotation and not probed; on leaving it, the backend requalifies: it needs
    /// passing probes in a row (the policy's `requalify_passes`) before it gets traffic again.
    Maintenance,
}

impl OverrideKind {
    /// `drain`, `down`, `up` or `maintenance`.
    pub fn as_str(self) -> &'static str {
        match self {
            OverrideKind::Drain => "drain",
            OverrideKind::Down => "down",
            OverrideKind::Up => "up",
            OverrideKind::Maintenance => "maintenance",
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
    /// In maintenance (an operator's override): out of rotation, not probed.
    Maintenance,
    /// Back from maintenance, waiting for its passing probes before it gets traffic.
    Requalifying,
    /// Verdict UP, but its health route answered `404` (`disable_on_404`): no new requests
    /// until a probe passes.
    SelfDraining,
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
            OverrideKind::Maintenance => Effective::Maintenance,
        }
    }

    /// `UP`, `DOWN`, `DRAINING`, `FORCED_DOWN`, `FORCED_UP`, `MAINTENANCE`, `REQUALIFYING` or
    /// `SELF_DRAINING`.
    pub fn as_str(self) -> &'static str {
        match self {
            Effective::Up => "UP",
            Effective::Down => "DOWN",
            Effective::Draining => "DRAINING",
            Effective::ForcedDown => "FORCED_DOWN",
            Effective::ForcedUp => "FORCED_UP",
            Effective::Maintenance => "MAINTENANCE",
            Effective::Requalifying => "REQUALIFYING",
            Effective::SelfDraining => "SELF_DRAINING",
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
    /// under a manual override, requalifying, draining itself or held by its agent, or was never
    /// proven healthy.
    NoneToFailOpen {
        /// Backends under a manual override.
        overridden: usize,
        /// Backends never proven healthy (not yet UP since they joined).
        unproven: usize,
        /// Backends requalifying after maintenance, drained by their health route (`404`), or held
        /// out by their agent (`down`, `drain`, `maint`, `0%`).
        held: usize,
    },
    /// Some primaries are in rotation, but fewer than the pool's minimum healthy share, so
    /// `fail_open` spreads traffic over `backends` of its `primaries` primaries: the ones in
    /// rotation and the ones proven healthy once and held out by nothing else than health.
    BelowMinHealthy {
        /// Primaries in rotation.
        up: usize,
        /// Primaries needed in rotation for normal balancing.
        needed: usize,
        /// The threshold that set `needed`.
        threshold: super::MinHealthy,
        /// How many backends get traffic.
        backends: usize,
        /// How many primaries the pool has.
        primaries: usize,
    },
}

impl AllDown {
    /// The policy applied: `fail_open` or `reject`.
    pub fn policy(self) -> &'static str {
        match self {
            AllDown::FailOpen { .. } | AllDown::BelowMinHealthy { .. } => "fail_open",
            AllDown::Reject | AllDown::NoneToFailOpen { .. } => "reject",
        }
    }

    /// Whether requests get 503 without touching a backend.
    pub fn rejects(self) -> bool {
        !matches!(
            self,
            AllDown::FailOpen { .. } | AllDown::BelowMinHealthy { .. }
        )
    }

    /// What the pool lacks: `has no UP backend`, or `has too few UP backends` below its minimum
    /// healthy share.
    pub fn headline(self) -> &'static str {
        match self {
            AllDown::BelowMinHealthy { .. } => "has too few UP backends",
            _ => "has no UP backend",
        }
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
                held,
            } => {
                write!(
                    f,
                    "rejecting requests with 503: fail_open has no backend to spread traffic over \
                     ({overridden} under a manual override, {unproven} never proven healthy"
                )?;
                if held > 0 {
                    write!(
                        f,
                        ", {held} requalifying, draining itself or held by its agent"
                    )?;
                }
                f.write_str(")")
            }
            AllDown::BelowMinHealthy {
                up,
                needed,
                threshold,
                backends,
                primaries,
            } => {
                write!(
                    f,
                    "failing open below its minimum healthy share: {up} of {primaries} primaries \
                     UP, needs {needed} ("
                )?;
                match (threshold.count > 1, threshold.percent > 0) {
                    (true, true) => write!(
                        f,
                        "min_healthy = {}, min_healthy_percent = {}",
                        threshold.count, threshold.percent
                    )?,
                    (true, false) => write!(f, "min_healthy = {}", threshold.count)?,
                    _ => write!(f, "min_healthy_percent = {}", threshold.percent)?,
                }
                write!(
                    f,
                    "); spreading traffic over {backends} of them (those UP and those proven \
                     healthy once and held out by health checks only)"
                )
            }
        }
    }
}

/// The backups a pool sends its traffic to while no primary is in rotation.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct OnBackups {
    /// The first backup in rotation, in pool order (the only one served with
    /// [`BackupUse::First`](super::BackupUse::First)).
    pub first: usize,
    /// How many backups get traffic.
    pub serving: usize,
}

/// Why a backend's effective state changed without a verdict change or an override.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum StandingCause {
    /// Its health route answered `404` with `disable_on_404`: it asks to be drained.
    DrainRequested,
    /// A passing probe ended the drain its health route asked for.
    DrainEnded {
        /// The passing probe's outcome.
        last: Outcome,
    },
    /// It passed its probes after maintenance and gets traffic again.
    Requalified {
        /// The passing probes in a row it needed.
        passes: u32,
    },
}

impl fmt::Display for StandingCause {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match *self {
            StandingCause::DrainRequested => f.write_str(
                "the health route answered HTTP 404 (disable_on_404): the backend asks to be \
                 drained; no new requests, in-flight ones finish",
            ),
            StandingCause::DrainEnded { last } => {
                write!(
                    f,
                    "a passing probe ends the drain its health route asked for, last: {last}"
                )
            }
            StandingCause::Requalified { passes } => write!(
                f,
                "{passes} passing {} after maintenance: requalified",
                if passes == 1 {
                    "probe"
                } else {
                    "probes in a row"
                }
            ),
        }
    }
}

/// A backend's effective state changed by itself: a drain its health route asked for, begun or
/// ended, or a requalification after maintenance.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct StandingChange {
    /// The backend's index in the pool.
    pub backend: usize,
    /// The effective state before.
    pub from: Effective,
    /// The effective state after.
    pub to: Effective,
    /// Why.
    pub cause: StandingCause,
    /// When, on the caller's clock.
    pub at: Duration,
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

/// One thing a [`Rotation`](super::Rotation) reports, with what its consumers need to say it
/// (no need to ask the rotation again after draining events).
#[derive(Clone, Debug, PartialEq, Eq)]
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
    /// The pool switched to its backups (`Some`: no primary is in rotation, and these serve;
    /// reported again when the backups serving change) or back to its primaries (`None`).
    Backups {
        /// The backups serving now, or `None` once they hand back (or are out too).
        on: Option<OnBackups>,
        /// Which backups serve, in pool order, at the time of the event (empty with `on:
        /// None`): what the snapshot built right after it names.
        serving: Vec<usize>,
        /// With `on: None`, whether primaries serve again (else the backups are out too, and an
        /// all-down event follows).
        to_primaries: bool,
        /// When, on the caller's clock.
        at: Duration,
    },
    /// A backend's effective state changed by itself (not a verdict, not an override).
    Standing(StandingChange),
    /// A backend started shedding load (its weight reduced) or stopped (its weight restored).
    Shedding(super::ShedChange),
    /// With `close_tunnels_on_down`, right after a backend's verdict went DOWN: close its
    /// upgraded connections.
    CloseTunnels {
        /// The backend's index in the pool.
        backend: usize,
        /// When, on the caller's clock.
        at: Duration,
    },
}
