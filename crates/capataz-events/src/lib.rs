//! The health events the runtime publishes, and their JSON form (the `/events` stream, webhooks
//! and alert commands all use it).

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

pub use capataz_health::OverrideKind;
use capataz_health::{AllDown, Transition};
use serde_json::json;

/// What the health runtime reports, in the order it happened.
#[derive(Clone, Debug)]
pub enum Notice {
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
    /// The pool's backend source (DNS or etcd) changed the pool's membership, failed,
    /// recovered, held a drop for confirmation, or skipped a key.
    Membership {
        /// The pool.
        pool: Arc<str>,
        /// The source's kind (`dns` or `etcd`).
        source: &'static str,
        /// What happened.
        change: MembershipChange,
        /// Wall-clock time.
        time: SystemTime,
    },
    /// Shared probing (`[fleet]`): this instance joined its group, lost it or found it again,
    /// saw its members change, or skipped a value. About no pool (`pool()` is empty).
    Fleet {
        /// The group.
        group: Arc<str>,
        /// What happened.
        change: FleetChange,
        /// Wall-clock time.
        time: SystemTime,
    },
}

/// What happened to this instance's place in its fleet group.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum FleetChange {
    /// It registered with its lease and reads the group: it probes its share of the backends.
    Joined {
        /// Live members, itself included.
        members: usize,
    },
    /// It reaches etcd again after being cut off: it registered again and probes its share.
    Reconnected {
        /// Live members, itself included.
        members: usize,
    },
    /// The group's live members changed (one joined, left, or lost its lease): ownership moves.
    Members {
        /// Live members now.
        members: usize,
    },
    /// It could not reach etcd for longer than its lease: it probes every backend itself.
    CutOff {
        /// The last failure.
        error: String,
    },
    /// Its name is registered in the group under another lease: another instance is
    /// configured with the same `fleet.instance` (or the key was written by hand). It does not
    /// join (it probes every backend itself) and tries again until the name is free.
    NameTaken {
        /// The name.
        instance: String,
    },
    /// A key of the group had a value that could not be read (too long, not a verdict): it was
    /// ignored.
    Skipped {
        /// The key.
        key: String,
        /// Why.
        error: String,
    },
}

impl FleetChange {
    /// `joined`, `reconnected`, `members`, `cut_off`, `name_taken` or `skipped`.
    pub fn as_str(&self) -> &'static str {
        match self {
            FleetChange::Joined { .. } => "joined",
            FleetChange::Reconnected { .. } => "reconnected",
            FleetChange::Members { .. } => "members",
            FleetChange::CutOff { .. } => "cut_off",
            FleetChange::NameTaken { .. } => "name_taken",
            FleetChange::Skipped { .. } => "skipped",
        }
    }
}

impl std::fmt::Display for FleetChange {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            FleetChange::Joined { members } => write!(
                f,
                "joined the group ({members} live members); probing its share of the backends"
            ),
            FleetChange::Reconnected { members } => write!(
                f,
                "reaches etcd again and rejoined the group ({members} live members); probing \
                 its share of the backends"
            ),
            FleetChange::Members { members } => {
                write!(f, "the group has {members} live members; ownership moves")
            }
            FleetChange::CutOff { error } => write!(
                f,
                "cut off from etcd for longer than the lease ({error}); probing every backend \
                 itself"
            ),
            FleetChange::NameTaken { instance } => write!(
                f,
                "instance name {instance:?} is already registered in the group under another \
                 lease (another instance with the same fleet.instance?); not joining, probing \
                 every backend itself until the name is free"
            ),
            FleetChange::Skipped { key, error } => {
                write!(f, "key {key:?} skipped: {error}")
            }
        }
    }
}

/// What a pool's backend source did to its membership.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum MembershipChange {
    /// A new membership is in force: backends added (gated until they pass `rise` probes) and
    /// removed (drained), out of `total` now.
    Updated {
        /// Backends added.
        added: usize,
        /// Backends removed.
        removed: usize,
        /// Backends in the pool now.
        total: usize,
    },
    /// The source failed (a DNS error, a timeout, an unreachable server): the last known
    /// membership (`kept` backends) stays. Said once, when the failures start.
    Failing {
        /// Why, as the resolver said it.
        error: String,
        /// Backends kept.
        kept: usize,
    },
    /// The source answers again after failing.
    Restored {
        /// Backends in force when it answered.
        kept: usize,
    },
    /// An answer would remove more than the allowed share of the pool at once: it is held,
    /// and applied only if the next answer confirms it.
    DropHeld {
        /// Backends in force.
        from: usize,
        /// Backends the answer has.
        to: usize,
    },
    /// The next answer confirmed a held drop: it is applied (its `Updated` follows).
    DropConfirmed {
        /// Backends in force before.
        from: usize,
        /// Backends after.
        to: usize,
    },
    /// A key of the source (etcd) has a value that is no backend: it counts as absent, the
    /// other keys still count. Said once per value written.
    Skipped {
        /// The key, as text (bytes that are not UTF-8 replaced).
        key: String,
        /// What is wrong with its value.
        error: String,
    },
    /// An SRV target (DNS) is left out: it has no address, or its lookup fails and no address
    /// is known for it. The other targets still count. Said when its standing changes.
    TargetLeftOut {
        /// The backend it would be, `host:port`.
        target: String,
        /// Why.
        trouble: TargetTrouble,
    },
    /// An SRV target's (DNS) address lookup fails: it stays at its last known address. Said
    /// when its standing changes.
    TargetFailing {
        /// The backend, `host:port`.
        target: String,
        /// Why the lookup failed.
        error: String,
        /// The address it stays at.
        kept: SocketAddr,
    },
    /// An SRV target (DNS) left out or failing resolves again.
    TargetRestored {
        /// The backend, `host:port`.
        target: String,
        /// Its address now.
        address: SocketAddr,
    },
}

/// Why an SRV target has no address from the last answer.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum TargetTrouble {
    /// The target's name does not exist (NXDOMAIN).
    NxDomain,
    /// The name has neither an A nor an AAAA record (NODATA on both).
    NoRecords,
    /// A lookup of the target failed (a timeout, SERVFAIL, REFUSED, an answer the resolver
    /// could not read): which record type, and why.
    Failed(String),
}

impl std::fmt::Display for TargetTrouble {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            TargetTrouble::NxDomain => f.write_str("no address: NXDOMAIN"),
            TargetTrouble::NoRecords => f.write_str("no address: no A or AAAA record"),
            TargetTrouble::Failed(error) => write!(f, "lookup failed: {error}"),
        }
    }
}

/// An SRV target (DNS) the last answer gave no address: left out of the pool (`kept` is
/// `None`), or kept at its last known address while its lookup fails.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Unresolved {
    /// The backend it is or would be, `host:port`.
    pub target: String,
    /// Why it has no address now.
    pub trouble: TargetTrouble,
    /// The last known address it stays at (only while its lookup fails).
    pub kept: Option<SocketAddr>,
}

impl MembershipChange {
    /// `updated`, `failing`, `restored`, `drop_held`, `drop_confirmed`, `skipped`,
    /// `target_left_out`, `target_failing` or `target_restored`.
    pub fn as_str(&self) -> &'static str {
        match self {
            MembershipChange::Updated { .. } => "updated",
            MembershipChange::Failing { .. } => "failing",
            MembershipChange::Restored { .. } => "restored",
            MembershipChange::DropHeld { .. } => "drop_held",
            MembershipChange::DropConfirmed { .. } => "drop_confirmed",
            MembershipChange::Skipped { .. } => "skipped",
            MembershipChange::TargetLeftOut { .. } => "target_left_out",
            MembershipChange::TargetFailing { .. } => "target_failing",
            MembershipChange::TargetRestored { .. } => "target_restored",
        }
    }
}

impl std::fmt::Display for MembershipChange {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            MembershipChange::Updated {
                added,
                removed,
                total,
            } => write!(
                f,
                "membership updated: {added} added (gated until they pass rise probes), \
                 {removed} removed (drained), {total} in the pool"
            ),
            MembershipChange::Failing { error, kept } => write!(
                f,
                "the source is failing ({error}); the last known membership stays \
                 ({kept} backends)"
            ),
            MembershipChange::Restored { kept } => write!(
                f,
                "the source answers again; membership follows it ({kept} backends in force)"
            ),
            MembershipChange::DropHeld { from, to } => write!(
                f,
                "an answer would take the pool from {from} to {to} backends at once; held \
                 until the next answer confirms it"
            ),
            MembershipChange::DropConfirmed { from, to } => write!(
                f,
                "the next answer confirmed the drop from {from} to {to} backends; applied"
            ),
            MembershipChange::Skipped { key, error } => write!(
                f,
                "key {key:?} skipped: {error}; it counts as no backend, the other keys still count"
            ),
            MembershipChange::TargetLeftOut { target, trouble } => write!(
                f,
                "SRV target {target} left out ({trouble}); the other targets still count, and \
                 it is asked again with them"
            ),
            MembershipChange::TargetFailing {
                target,
                error,
                kept,
            } => write!(
                f,
                "SRV target {target}: lookup failed ({error}); it stays at its last known \
                 address {kept}"
            ),
            MembershipChange::TargetRestored { target, address } => write!(
                f,
                "SRV target {target} resolves again ({address}); it counts again"
            ),
        }
    }
}

impl Notice {
    /// The pool the event is about.
    pub fn pool(&self) -> &str {
        match self {
            Notice::Transition { pool, .. }
            | Notice::AllDown { pool, .. }
            | Notice::Recovered { pool, .. }
            | Notice::Override { pool, .. }
            | Notice::Backups { pool, .. }
            | Notice::Eligibility { pool, .. }
            | Notice::Agent { pool, .. }
            | Notice::Shedding { pool, .. }
            | Notice::Membership { pool, .. } => pool,
            Notice::Fleet { .. } => "",
        }
    }

    /// The backend the event is about, if it is about one.
    pub fn backend(&self) -> Option<&str> {
        match self {
            Notice::Transition { backend, .. }
            | Notice::Override { backend, .. }
            | Notice::Eligibility { backend, .. }
            | Notice::Agent { backend, .. }
            | Notice::Shedding { backend, .. } => Some(backend),
            Notice::AllDown { .. }
            | Notice::Recovered { .. }
            | Notice::Backups { .. }
            | Notice::Membership { .. }
            | Notice::Fleet { .. } => None,
        }
    }

    /// The event's type: `transition`, `all_down`, `recovered`, `override`, `backups`,
    /// `eligibility`, `agent`, `shedding`, `membership` or `fleet`.
    pub fn kind(&self) -> &'static str {
        match self {
            Notice::Transition { .. } => "transition",
            Notice::AllDown { .. } => "all_down",
            Notice::Recovered { .. } => "recovered",
            Notice::Override { .. } => "override",
            Notice::Backups { .. } => "backups",
            Notice::Eligibility { .. } => "eligibility",
            Notice::Agent { .. } => "agent",
            Notice::Shedding { .. } => "shedding",
            Notice::Membership { .. } => "membership",
            Notice::Fleet { .. } => "fleet",
        }
    }

    /// When it happened.
    pub fn time(&self) -> SystemTime {
        match self {
            Notice::Transition { time, .. }
            | Notice::AllDown { time, .. }
            | Notice::Recovered { time, .. }
            | Notice::Override { time, .. }
            | Notice::Backups { time, .. }
            | Notice::Eligibility { time, .. }
            | Notice::Agent { time, .. }
            | Notice::Shedding { time, .. }
            | Notice::Membership { time, .. }
            | Notice::Fleet { time, .. } => *time,
        }
    }

    /// `(from, to, reason)` where the event has them.
    pub fn change(&self) -> Option<(&str, &str, String)> {
        match self {
            Notice::Transition { transition, .. } => Some((
                transition.from.as_str(),
                transition.to.as_str(),
                transition.reason.to_string(),
            )),
            Notice::Override {
                from, to, reason, ..
            }
            | Notice::Eligibility {
                from, to, reason, ..
            } => Some((from, to, reason.clone())),
            Notice::Agent {
                from, to, reason, ..
            } => Some((from, to, reason.clone())),
            Notice::Shedding {
                shedding, reason, ..
            } => Some(match shedding {
                true => ("full", "shedding", reason.clone()),
                false => ("shedding", "full", reason.clone()),
            }),
            Notice::AllDown { .. }
            | Notice::Recovered { .. }
            | Notice::Backups { .. }
            | Notice::Membership { .. }
            | Notice::Fleet { .. } => None,
        }
    }

    /// The readable sentence of the event, as logged.
    pub fn sentence(&self) -> String {
        match self {
            Notice::Transition {
                pool,
                backend,
                transition,
                ..
            } => format!("pool={pool} backend={backend} {transition}"),
            Notice::AllDown { pool, policy, .. } => {
                format!("pool={pool} {}: {policy}", policy.headline())
            }
            Notice::Recovered { pool, .. } => {
                format!("pool={pool} has an UP backend again; normal balancing resumes")
            }
            Notice::Override {
                pool,
                backend,
                from,
                to,
                reason,
                ..
            }
            | Notice::Eligibility {
                pool,
                backend,
                from,
                to,
                reason,
                ..
            } => format!("pool={pool} backend={backend} {from} -> {to}: {reason}"),
            Notice::Membership {
                pool,
                source,
                change,
                ..
            } => format!("pool={pool} source={source}: {change}"),
            Notice::Fleet { group, change, .. } => format!("fleet={group}: {change}"),
            Notice::Backups {
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
            Notice::Agent {
                pool,
                backend,
                from,
                to,
                reason,
                ..
            } => format!("pool={pool} backend={backend} agent {from} -> {to}: {reason}"),
            Notice::Shedding {
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
            "time": capataz_timefmt::rfc3339(self.time()),
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
            Notice::Transition { transition, .. } => {
                object.insert("side".into(), transition.reason.side().as_str().into());
            }
            Notice::AllDown { policy, .. } => {
                object.insert("policy".into(), policy.policy().into());
            }
            Notice::Override { kind, .. } => {
                object.insert(
                    "override".into(),
                    kind.map_or(serde_json::Value::Null, |k| k.as_str().into()),
                );
            }
            Notice::Backups { serving, .. } => {
                let names: Vec<&str> = serving.iter().map(|s| &**s).collect();
                object.insert("backups".into(), names.into());
            }
            Notice::Agent { in_rotation, .. } => {
                object.insert("in_rotation".into(), (*in_rotation).into());
            }
            Notice::Shedding {
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
            Notice::Membership { source, change, .. } => {
                object.insert("source".into(), (*source).into());
                object.insert("membership".into(), change.as_str().into());
                match change {
                    MembershipChange::Skipped { key, .. } => {
                        object.insert("key".into(), key.clone().into());
                    }
                    MembershipChange::TargetLeftOut { target, .. }
                    | MembershipChange::TargetFailing { target, .. }
                    | MembershipChange::TargetRestored { target, .. } => {
                        object.insert("target".into(), target.clone().into());
                    }
                    _ => {}
                }
            }
            Notice::Fleet { group, change, .. } => {
                object.insert("group".into(), group.to_string().into());
                object.insert("fleet".into(), change.as_str().into());
                match change {
                    FleetChange::Joined { members }
                    | FleetChange::Reconnected { members }
                    | FleetChange::Members { members } => {
                        object.insert("members".into(), (*members).into());
                    }
                    FleetChange::Skipped { key, .. } => {
                        object.insert("key".into(), key.clone().into());
                    }
                    FleetChange::NameTaken { instance } => {
                        object.insert("instance".into(), instance.clone().into());
                    }
                    FleetChange::CutOff { .. } => {}
                }
            }
            Notice::Recovered { .. } | Notice::Eligibility { .. } => {}
        }
        value
    }
}
