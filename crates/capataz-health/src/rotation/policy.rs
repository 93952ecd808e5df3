//! The inputs and outputs of a [`Rotation`](super::Rotation) besides its events: the pool-level
//! [`Policy`], how a backend joins ([`Join`], [`Carried`] across a reload), and the
//! [`Eligible`] set the runtime's snapshot is built from.

use std::time::Duration;

use super::{AgentState, AllDown, OnBackups, Override};
use crate::pool::{BackendHealth, State};

/// What a pool does when no backend is in rotation, as configured.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum WhenAllDown {
    /// Spread traffic over the proven backends under no override (default).
    #[default]
    FailOpen,
    /// Reject requests.
    Reject,
}

/// The pool-level policy around the verdicts. The default is the replay protocol's, and every
/// field added after `slow_start` defaults to the behaviour from before it existed.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Policy {
    /// What an all-down pool does.
    pub when_all_down: WhenAllDown,
    /// How long a rejoining backend's weight ramps up, if at all.
    pub slow_start: Option<Duration>,
    /// Which backups serve while no primary is in rotation (default: the first one only).
    pub backups: BackupUse,
    /// Below how many primaries in rotation the pool fails open (default: only with none).
    pub min_healthy: MinHealthy,
    /// Whether a probe answered `404` asks for a drain instead of counting as a failure
    /// (HAProxy's `http-check disable-on-404`; default false).
    pub disable_on_404: bool,
    /// Passing probes in a row a backend needs after maintenance before it gets traffic again:
    /// `None` (default) for the pool's `rise`, `Some(0)` for none (no probes to wait for).
    pub requalify_passes: Option<u32>,
    /// Whether a backend whose verdict goes DOWN has its upgraded connections closed
    /// ([`Event::CloseTunnels`](super::Event::CloseTunnels); HAProxy's `on-marked-down
    /// shutdown-sessions`; default false).
    pub close_tunnels_on_down: bool,
    /// Whether a backend's `429`, or `503` with `Retry-After`, reduces its weight for that
    /// long instead of counting as a traffic error ([`Rotation::handle_shed`](super::Rotation::handle_shed);
    /// default `None`: off).
    pub load_shedding: Option<super::LoadShedding>,
}

/// What role a backend plays in its pool.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum Role {
    /// Gets traffic whenever it is in rotation (default).
    #[default]
    Primary,
    /// Gets traffic only while no primary is in rotation (HAProxy's and nginx's `backup`).
    Backup,
}

/// Which backups serve while no primary is in rotation.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum BackupUse {
    /// The first backup in rotation, in pool order, takes all the traffic (HAProxy's default).
    #[default]
    First,
    /// Every backup in rotation shares it by weight (HAProxy's `option allbackups`).
    All,
}

impl BackupUse {
    /// `first` or `all`.
    pub fn as_str(self) -> &'static str {
        match self {
            BackupUse::First => "first",
            BackupUse::All => "all",
        }
    }
}

/// The minimum healthy share of a pool (AWS ALB's minimum healthy targets, Envoy's panic
/// threshold): with fewer primaries in rotation than this, but at least one, a pool whose
/// all-down policy is `fail_open` fails open over its primaries. The default (0 and 0) keeps the
/// plain rule: fail open only when no backend is in rotation.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct MinHealthy {
    /// At least this many primaries in rotation (0 or 1: no count threshold).
    pub count: u32,
    /// At least this percentage of the primaries, rounded up (0: no percentage threshold).
    pub percent: u8,
}

impl MinHealthy {
    /// How many of `primaries` must be in rotation for normal balancing: the stricter of the
    /// two thresholds, at least 1, at most `primaries`.
    pub fn needed(self, primaries: usize) -> usize {
        let count = usize::try_from(self.count).unwrap_or(usize::MAX);
        let percent = usize::from(self.percent.min(100));
        let share = (primaries.saturating_mul(percent)).div_ceil(100);
        count.max(share).max(1).min(primaries.max(1))
    }

    /// Whether a threshold above "at least one" is set.
    pub fn is_set(self) -> bool {
        self.count > 1 || self.percent > 0
    }
}

/// How a backend joins a [`Rotation`](super::Rotation).
// A join lives only while a rotation is built (one per backend, on a reload): boxing what a
// kept backend carries would cost an allocation per backend for no memory kept.
#[allow(clippy::large_enum_variant)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Join {
    /// A new backend: its active side starts in `initial` (DOWN for a gated backend), and it is
    /// proven only if it starts UP. With `warm_up`, a backend starting UP ramps with slow start.
    New {
        /// The active side's initial state.
        initial: State,
        /// Whether a backend starting UP ramps up (one added by a reload).
        warm_up: bool,
    },
    /// A backend kept across a reload, with everything it had.
    Kept(Carried),
}

/// What a backend carries from one [`Rotation`](super::Rotation) to the next (across a reload).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Carried {
    /// Its health on both sides.
    pub health: BackendHealth,
    /// Whether it was ever proven healthy.
    pub proven: bool,
    /// Its manual override.
    pub override_: Option<Override>,
    /// When its slow start began, if it is ramping.
    pub ramp_since: Option<Duration>,
    /// Passing probes in a row since it left maintenance, while it requalifies.
    pub requalify: Option<u32>,
    /// Whether its health route asked for a drain (a `404` with `disable_on_404`).
    pub self_drained: bool,
    /// What its agent last said.
    pub agent: AgentState,
    /// Since when its verdict holds: its last transition, or when it joined.
    pub since: Duration,
    /// Its last verdict change.
    pub last: Option<crate::Transition>,
}

/// The backends a pool may send new requests to, with their weights.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Eligible {
    /// Indexes of the backends, in pool order.
    pub backends: Vec<usize>,
    /// Their weights in tenths of the configured unit (same order).
    pub weights: Vec<u32>,
    /// Every backend's weight in tenths, in pool order, in rotation or not (what it has or
    /// would have there): `weights` are these at `backends`.
    pub member_weights: Vec<u32>,
    /// Whether the all-down policy chose `backends`: no backend is in rotation, or fewer
    /// primaries than the minimum healthy share.
    pub all_down: bool,
    /// The all-down policy applied, while `all_down` ([`Rotation::all_down`](super::Rotation::all_down)).
    pub applied: Option<AllDown>,
    /// The backups serving, while no primary is in rotation
    /// ([`Rotation::on_backups`](super::Rotation::on_backups)).
    pub on_backups: Option<OnBackups>,
    /// Backends out of rotation only because they drain (an operator's drain, or a drain their
    /// health route or agent asked for) while their verdict is UP, in pool order: no new
    /// clients, but they may still serve the sticky clients they have
    /// ([`Rotation::draining`](super::Rotation::draining)).
    pub draining: Vec<usize>,
}
