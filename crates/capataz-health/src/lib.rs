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
//! - [`pool`]: streaks, ejection and verdicts for one pool, and the [`Transition`] events
//!   (their [`Reason`]s in `reason`, the [`Settings`] in `settings`).
//! - [`rotation`]: which backends get traffic and with what weight: verdicts plus manual
//!   overrides with expiry, slow start, gating of never-proven backends and the all-down
//!   policy, backups, maintenance with requalification, drains a backend's health route asks
//!   for (`disable_on_404`) and the minimum healthy share, with one
//!   `poll_timeout`/`handle_timeout` for every timer.
//! - [`probe`]: a probe's outcome with its body and header match ([`ProbeOutcome`]).
//! - [`outliers`]: one backend's latency over a window ([`LatencyWindow`]), which the
//!   pool judges against the pool's median (latency outliers).
//! - [`cadence`]: which probe interval applies to a backend ([`Cadence`]).
//! - [`schedule`]: when each backend is probed, tracked or asked by its agent ([`Schedule`]:
//!   random first phase, jitter from a seeded generator, the slot grid, maintenance and
//!   ownership gating), and what each probe came to ([`Probed`]).
//! - [`fleet`]: shared probing across balancers: rendezvous ownership ([`Group`]) and the
//!   verdicts owners publish ([`Published`]).
//! - [`replay`]: the line protocol that drives a pool from a script.

pub mod cadence;
pub mod fleet;
pub mod outliers;
pub mod pool;
pub mod probe;
mod reason;
pub mod replay;
pub mod rotation;
pub mod rules;
pub mod schedule;
mod settings;
pub mod status;

pub use cadence::{Cadence, ProbeIntervals};
pub use fleet::{Group, Ownership, Published, PublishedWhy};
pub use outliers::{LatencyWindow, SuccessWindow};
pub use pool::{
    BackendHealth, Ejection, EjectionInfo, EjectionPolicy, LatencyOutliers, Percentile, Pool,
    RateSentence, Reason, Settings, Side, SlowSentence, State, SuccessRate, Transition,
};
pub use probe::{Mismatch, ProbeOutcome, Snippet};
pub use replay::{Replay, ReplayOptions};
pub use rotation::{
    AgentChange, AgentHold, AgentReport, AgentState, AllDown, BackupUse, Carried, Effective,
    Eligible, Join, LoadShedding, MinHealthy, Override, OverrideKind, Policy, Role, Rotation, Shed,
    ShedChange, Standing, WhenAllDown,
};
pub use rules::{GrpcCodes, ProbeResult, ProbeRule, StatusSet, TrafficResult, TrafficRule};
pub use schedule::{Probed, Schedule};
pub use status::{grpc_code_name, parse_grpc_status, parse_status_line, Outcome};
