//! The pure health engine of capataz.
//!
//! It decides which backends of a pool deserve traffic from two kinds of evidence: probes the
//! balancer sends on a timer (active checks) and the responses it relays (passive checks). It
//! performs no IO, reads no clock and draws no random numbers: time is always an argument, so the
//! same inputs always give the same verdicts and events, and hours of history replay in
//! milliseconds.
//!
//! - [`status`]: what a well-formed status line is, and the [`Outcome`] of an exchange.
//! - [`rules`]: the probe rule and the traffic rule that judge outcomes.
//! - [`pool`]: streaks, ejection and verdicts for one pool, and the [`Transition`] events.
//! - [`replay`]: the line protocol that drives a pool from a script.

pub mod pool;
pub mod replay;
pub mod rules;
pub mod status;

pub use pool::{
    BackendHealth, Ejection, EjectionInfo, EjectionPolicy, Pool, Reason, Settings, Side, State,
    Transition,
};
pub use replay::Replay;
pub use rules::{ProbeResult, ProbeRule, StatusSet, TrafficResult, TrafficRule};
pub use status::{parse_status_line, Outcome};
