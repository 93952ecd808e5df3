//! The health events the runtime publishes, and their JSON form (the `/events` stream, webhooks
//! and alert commands all use it).

use std::sync::Arc;
use std::time::{Duration, SystemTime};

pub use capataz_health::OverrideKind;
use capataz_health::{AllDown, Transition};
use serde_json::json;

use crate::timefmt;

/// What the health runtime reports, in the order it happened.
#[derive(Clone, Debug)]
pub enum Event {
    /// A backend's verdict changed.
    Transition {
        /// The pool.
        pool: Arc<str>,
        /// The backend.
        backend: Arc<str>,
        /// The engine's event: from, to, reason, time since start.
        transition: Transition,
        /// Wall-clock time.
        time: SystemTime,
    },
    /// The pool has no eligible backend any more (or still has none, and what it does about it
    /// changed): its all-down policy applies.
    AllDown {
        /// The pool.
        pool: Arc<str>,
        /// What the pool really does now (`fail_open` with nothing to spread over rejects).
        policy: AllDown,
        /// Wall-clock time.
        time: SystemTime,
    },
    /// The pool has an eligible backend again.
    Recovered {
        /// The pool.
        pool: Arc<str>,
        /// Wall-clock time.
        time: SystemTime,
    },
    /// An operator set, cleared, or let lapse a manual override.
    Override {
        /// The pool.
        pool: Arc<str>,
        /// The backend.
        backend: Arc<str>,
        /// The override now in force (`None` once cleared or lapsed).
        kind: Option<OverrideKind>,
        /// The effective state before (`UP`, `DOWN`, `DRAINING`, ...).
        from: &'static str,
        /// The effective state after.
        to: &'static str,
        /// Why, as a sentence.
        reason: String,
        /// Wall-clock time.
        time: SystemTime,
    },
    /// The pool switched to its backups (`serving` non-empty) or away from them.
    Backups {
        /// The pool.
        pool: Arc<str>,
        /// The backups serving now, in pool order (empty once they stop).
        serving: Vec<Arc<str>>,
        /// When they stop: whether a primary serves again (else the backups are out too).
        to_primaries: bool,
        /// Wall-clock time.
        time: SystemTime,
    },
    /// A backend's effective state changed by itself: its health route asked for a drain
    /// (`disable_on_404`) or a probe ended it, or it requalified after maintenance.
    Eligibility {
        /// The pool.
        pool: Arc<str>,
        /// The backend.
        backend: Arc<str>,
        /// The effective state before (`UP`, `SELF_DRAINING`, `REQUALIFYING`, ...).
        from: &'static str,
        /// The effective state after.
        to: &'static str,
        /// Why, as a sentence.
        reason: String,
        /// Wall-clock time.
        time: SystemTime,
    },
    /// A backend's agent check said something new (its hold or its weight changed).
    Agent {
        /// The pool.
        pool: Arc<str>,
        /// The backend.
        backend: Arc<str>,
        /// What the agent said before (`up`, `down`, `drain`, `maint`, with `, weight N%`).
        from: String,
        /// What it says now.
        to: String,
        /// Whether the backend is in rotation by its own standing after the change.
        in_rotation: bool,
        /// Why, as a sentence.
        reason: String,
        /// Wall-clock time.
        time: SystemTime,
    },
    /// A backend asked to shed load (`429`, or `503` with `Retry-After`) and its weight is
    /// reduced (`shedding: true`), or the time it asked for is over and its weight restored.
    Shedding {
        /// The pool.
        pool: Arc<str>,
        /// The backend.
        backend: Arc<str>,
        /// Whether it sheds load from now on (else the shed is over).
        shedding: bool,
        /// The status that asked (with `shedding`).
        status: Option<u16>,
        /// How long its weight stays reduced (with `shedding`).
        duration: Option<Duration>,
        /// Why, as a sentence.
        reason: String,
        /// Wall-clock time.
        time: SystemTime,
    },
}

impl Event {
    /// The pool the event is about.
    pub fn pool(&self) -> &str {
        match self {
            Event::Transition { pool, .. }
            | Event::AllDown { pool, .. }
            | Event::Recovered { pool, .. }
            | Event::Override { pool, .. }
            | Event::Backups { pool, .. }
            | Event::Eligibility { pool, .. }
            | Event::Agent { pool, .. }
            | Event::Shedding { pool, .. } => pool,
        }
    }

    /// The backend the event is about, if it is about one.
    pub fn backend(&self) -> Option<&str> {
        match self {
            Event::Transition { backend, .. }
            | Event::Override { backend, .. }
            | Event::Eligibility { backend, .. }
            | Event::Agent { backend, .. }
            | Event::Shedding { backend, .. } => Some(backend),
            Event::AllDown { .. } | Event::Recovered { .. } | Event::Backups { .. } => None,
        }
    }

    /// The event's type: `transition`, `all_down`, `recovered`, `override`, `backups`,
    /// `eligibility`, `agent` or `shedding`.
    pub fn kind(&self) -> &'static str {
        match self {
            Event::Transition { .. } => "transition",
            Event::AllDown { .. } => "all_down",
            Event::Recovered { .. } => "recovered",
            Event::Override { .. } => "override",
            Event::Backups { .. } => "backups",
            Event::Eligibility { .. } => "eligibility",
            Event::Agent { .. } => "agent",
            Event::Shedding { .. } => "shedding",
        }
    }

    /// When it happened.
    pub fn time(&self) -> SystemTime {
        match self {
            Event::Transition { time, .. }
            | Event::AllDown { time, .. }
            | Event::Recovered { time, .. }
            | Event::Override { time, .. }
            | Event::Backups { time, .. }
            | Event::Eligibility { time, .. }
            | Event::Agent { time, .. }
            | Event::Shedding { time, .. } => *time,
        }
    }

    /// `(from, to, reason)` where the event has them.
    pub fn change(&self) -> Option<(&str, &str, String)> {
        match self {
            Event::Transition { transition, .. } => Some((
                transition.from.as_str(),
                transition.to.as_str(),
                transition.reason.to_string(),
            )),
            Event::Override {
                from, to, reason, ..
            }
            | Event::Eligibility {
                from, to, reason, ..
            } => Some((from, to, reason.clone())),
            Event::Agent {
                from, to, reason, ..
            } => Some((from, to, reason.clone())),
            Event::Shedding {
                shedding, reason, ..
            } => Some(match shedding {
                true => ("full", "shedding", reason.clone()),
                false => ("shedding", "full", reason.clone()),
            }),
            Event::AllDown { .. } | Event::Recovered { .. } | Event::Backups { .. } => None,
        }
    }

    /// The readable sentence of the event, as logged.
    pub fn sentence(&self) -> String {
        match self {
            Event::Transition {
                pool,
                backend,
                transition,
                ..
            } => format!("pool={pool} backend={backend} {transition}"),
            Event::AllDown { pool, policy, .. } => {
                format!("pool={pool} {}: {policy}", policy.headline())
            }
            Event::Recovered { pool, .. } => {
                format!("pool={pool} has an UP backend again; normal balancing resumes")
            }
            Event::Override {
                pool,
                backend,
                from,
                to,
                reason,
                ..
            }
            | Event::Eligibility {
                pool,
                backend,
                from,
                to,
                reason,
                ..
            } => format!("pool={pool} backend={backend} {from} -> {to}: {reason}"),
            Event::Backups {
                pool,
                serving,
                to_primaries,
                ..
            } => match serving.as_slice() {
                [] if *to_primaries => format!(
                    "pool={pool} has a primary backend in rotation again: its backups hand back"
                ),
                [] => format!("pool={pool} has no backup in rotation any more either"),
                [one] => format!(
                    "pool={pool} has no primary backend in rotation: backup {one} takes over"
                ),
                many => format!(
                    "pool={pool} has no primary backend in rotation: backups {} take over",
                    many.join(", ")
                ),
            },
            Event::Agent {
                pool,
                backend,
                from,
                to,
                reason,
                ..
            } => format!("pool={pool} backend={backend} agent {from} -> {to}: {reason}"),
            Event::Shedding {
                pool,
                backend,
                reason,
                ..
            } => format!("pool={pool} backend={backend} {reason}"),
        }
    }

    /// The event as one JSON object: `type`, `pool`, `backend`, `from`, `to`, `side`, `reason`,
    /// `time` (RFC 3339, UTC), `sentence`, and per type `policy`, `override`.
    pub fn to_json(&self) -> serde_json::Value {
        let mut value = json!({
            "type": self.kind(),
            "pool": self.pool(),
            "time": timefmt::rfc3339(self.time()),
            "sentence": self.sentence(),
        });
        let object = value
            .as_object_mut()
            .expect("a json! object literal is an object");
        if let Some(backend) = self.backend() {
            object.insert("backend".into(), backend.into());
        }
        if let Some((from, to, reason)) = self.change() {
            object.insert("from".into(), from.into());
            object.insert("to".into(), to.into());
            object.insert("reason".into(), reason.into());
        }
        match self {
            Event::Transition { transition, .. } => {
                object.insert("side".into(), transition.reason.side().as_str().into());
            }
            Event::AllDown { policy, .. } => {
                object.insert("policy".into(), policy.policy().into());
            }
            Event::Override { kind, .. } => {
                object.insert(
                    "override".into(),
                    kind.map_or(serde_json::Value::Null, |k| k.as_str().into()),
                );
            }
            Event::Backups { serving, .. } => {
                let names: Vec<&str> = serving.iter().map(|s| &**s).collect();
                object.insert("backups".into(), names.into());
            }
            Event::Agent { in_rotation, .. } => {
                object.insert("in_rotation".into(), (*in_rotation).into());
            }
            Event::Shedding {
                shedding,
                status,
                duration,
                ..
            } => {
                object.insert("shedding".into(), (*shedding).into());
                if let Some(status) = status {
                    object.insert("status".into(), (*status).into());
                }
                if let Some(duration) = duration {
                    object.insert("seconds".into(), duration.as_secs_f64().into());
                }
            }
            Event::Recovered { .. } | Event::Eligibility { .. } => {}
        }
        value
    }
}
