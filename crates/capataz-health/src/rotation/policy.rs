//! The inputs and outputs of a [`Rotation`](super::Rotation) besides its events: the pool-level
//! [`Policy`], how a backend joins ([`Join`], [`Carried`] across a reload), and the
//! [`Eligible`] set the runtime's snapshot is built from.

use std::time::Duration;

use super::{AgentState, Override};
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

/// The pool-level policy around the verdicts.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Policy {
    /// What an all-down pool does.
    pub when_all_down: WhenAllDown,
    /// How long a rejoining backend's weight ramps up, if at all.
    pub slow_start: Option<Duration>,
}

/// How a backend joins a [`Rotation`](super::Rotation).
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
    /// What its agent last said.
    pub agent: AgentState,
}

/// The backends a pool may send new requests to, with their weights.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Eligible {
    /// Indexes of the backends, in pool order.
    pub backends: Vec<usize>,
    /// Their weights in tenths of the configured unit (same order).
    pub weights: Vec<u32>,
    /// Whether no backend is in rotation (the all-down policy chose `backends`).
    pub all_down: bool,
}
