//! A backend's whole standing as one value ([`Standing`]): its effective state, the one rule
//! that decides it ([`Cause`]), since when, what brings it back ([`Back`]) and the weight the
//! picker gives it. Every report (the explain sentence, `/status`, the dashboard) renders this
//! value and never works out the precedence again.
//!
//! The precedence is [`Rotation::effective`]'s, extended to the backends in rotation and the
//! ones health holds out: a manual override, then an agent's `maint`, requalification after
//! maintenance, an agent's drain while UP, any other agent hold, a drain the health route asked
//! for (`disable_on_404`), tracking another backend (unless ejected), a passive ejection, active
//! checks DOWN, and last UP.

use std::time::Duration;

use super::{ramp, AgentHold, Effective, Override, Role, Rotation};
use crate::cadence::Cadence;
use crate::pool::{BackendHealth, Ejection, Reason, State, Transition};
use crate::rotation::{AgentState, Shed};

/// Where one backend stands, at one moment, for every report.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Standing {
    /// Its effective state ([`Rotation::effective`]).
    pub effective: Effective,
    /// The rule that decides it, the first that applies in the module's order.
    pub cause: Cause,
    /// What brings it (back) into rotation.
    pub back: Back,
    /// Since when its verdict holds: its last transition, or when it joined.
    pub since: Duration,
    /// Its last verdict change, if it had one since it joined (kept across reloads).
    pub last_transition: Option<Transition>,
    /// Its weight in tenths of the configured unit at the time asked: the value
    /// [`Rotation::eligible`] gives the picker at that time (`member_weights`).
    pub weight_tenths: u32,
    /// Its configured weight.
    pub weight: u32,
    /// Both sides of its health: the verdict, the streaks, the ejection.
    pub health: BackendHealth,
    /// Primary or backup.
    pub role: Role,
    /// What its agent last said (`up` at 100 % without agent checks).
    pub agent: AgentState,
    /// The load shed it asked for, while it lasts (its weight is shed exactly while this is
    /// `Some`).
    pub shed: Option<Shed>,
    /// While it requalifies after maintenance: passing probes in a row so far, and needed
    /// (also under an override that keeps it out meanwhile).
    pub requalifying: Option<(u32, u32)>,
    /// Which probe interval applies to it.
    pub cadence: Cadence,
}

impl Standing {
    /// Whether new requests may go to it by its own standing (outside the pool's backup and
    /// all-down rules): [`Effective::in_rotation`].
    pub fn in_rotation(&self) -> bool {
        self.effective.in_rotation()
    }
}

/// The rule that decides a backend's standing, highest precedence first.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Cause {
    /// A manual override, whatever health says.
    Override(Override),
    /// Its agent said `maint` (no operator override): maintenance, no probes.
    AgentMaintenance,
    /// Back from maintenance, out of rotation until `needs` passing probes in a row.
    Requalifying {
        /// Passing probes in a row so far.
        has: u32,
        /// Passing probes in a row needed.
        needs: u32,
    },
    /// Its verdict is UP but its agent asked for a drain (`drain`, `0%`): `SELF_DRAINING`.
    AgentDrain,
    /// Its agent holds it out otherwise (`down`, or a drain while its verdict is DOWN).
    AgentHold,
    /// Its verdict is UP but its health route answered `404` (`disable_on_404`):
    /// `SELF_DRAINING` until a probe passes.
    DrainOn404,
    /// It tracks another backend (and is not ejected): its active side is that backend's.
    Tracked {
        /// The tracked backend's active state, now its own.
        state: State,
    },
    /// Passive checks ejected it.
    Ejected {
        /// When the ejection began.
        since: Duration,
        /// When it ends (`None`: with the next good response, without timed ejection).
        until: Option<Duration>,
        /// Which ejection this is, counting from 1.
        nth: u32,
        /// Why, as the transition that took it DOWN said (`None` if its last transition was
        /// not to DOWN).
        reason: Option<Reason>,
        /// With its active side DOWN too: what the probes need for it.
        probes: Option<ProbesDown>,
    },
    /// Its active side is DOWN.
    ProbesDown(ProbesDown),
    /// In rotation on its verdict (UP, not ejected, nothing holding it out).
    Up {
        /// Back from an ejection, on probation.
        probation: Option<Probation>,
        /// Whether its slow start is under way: its weight is the ramp's step, below what its
        /// agent and any load shed leave it.
        ramping: bool,
    },
}

/// An active side DOWN and what brings it UP.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ProbesDown {
    /// Why it is DOWN.
    pub why: DownWhy,
    /// Passing probes in a row so far.
    pub has: u32,
    /// Passing probes in a row needed (`rise`).
    pub needs: u32,
    /// Whether coming back UP also ends the backend's timed ejection early
    /// ([`Settings::probes_end_ejection`](crate::Settings::probes_end_ejection)); false when
    /// it is not ejected.
    pub ends_ejection: bool,
}

/// Why an active side is DOWN.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DownWhy {
    /// Failed probes took it DOWN (its last transition says which).
    ProbesFailed {
        /// The failure streak then.
        streak: u32,
        /// The last probe outcome then.
        last: crate::Outcome,
        /// The content rule the last probe's answer broke, if that is why it failed.
        mismatch: Option<crate::Mismatch>,
    },
    /// It joined DOWN with first-probe (`Settings::first_probe`) and no probe came yet: one
    /// passing probe brings it UP at once.
    FirstProbe,
    /// It never was UP since it joined (no transition yet).
    NeverProven,
    /// Otherwise (DOWN by another input, the streak since moved): its failure streak now.
    Failing {
        /// Consecutive failed probes.
        streak: u32,
    },
}

/// A probation after an ejection.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Probation {
    /// When it began.
    pub since: Duration,
    /// How long the ejection one traffic error would cause lasts (`None` without timed
    /// ejection).
    pub next_ejection: Option<Duration>,
}

/// What brings a backend (back) into rotation.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Back {
    /// It is in rotation.
    InRotation,
    /// Its override is cleared, or lapses at `until`.
    OverrideEnds {
        /// When it lapses (`None`: when cleared).
        until: Option<Duration>,
    },
    /// Maintenance ends (the override is cleared or lapses, or the agent says otherwise), then
    /// `passes` passing probes in a row (0: at once).
    LeavingMaintenance {
        /// Passing probes in a row needed after maintenance.
        passes: u32,
    },
    /// `needs` passing probes in a row; it has `has`.
    Passes {
        /// Passing probes in a row so far.
        has: u32,
        /// Passing probes in a row needed.
        needs: u32,
    },
    /// Its first probe, if it passes.
    FirstPass,
    /// The next passing probe, at once.
    NextPass,
    /// Its agent saying `up` or `ready`.
    AgentUp,
    /// The tracked backend's active side coming back UP.
    TrackedUp,
    /// The ejection ending: at `until` (into probation), or with the next good response.
    EjectionEnds {
        /// When it ends (`None`: with the next good response).
        until: Option<Duration>,
    },
}

impl Rotation {
    /// Where `backend` stands, with its weight at `now` (pass the time the caller's snapshot was
    /// built from [`Rotation::eligible`] to report the weight its picker uses). Panics if
    /// `backend` is not an index.
    pub fn standing(&self, backend: usize, now: Duration) -> Standing {
        let member = &self.members[backend];
        let (cause, back) = self.cause(backend, now);
        Standing {
            effective: self.effective(backend),
            cause,
            back,
            since: member.since,
            last_transition: member.last,
            weight_tenths: self.weight_tenths(backend, now),
            weight: member.weight,
            health: *self.pool.backend(backend),
            role: member.role,
            agent: member.agent,
            shed: member.shed,
            requalifying: self.requalifying(backend),
            cadence: self.cadence(backend),
        }
    }

    /// The rule that decides `backend`'s standing, and what brings it back.
    fn cause(&self, backend: usize, now: Duration) -> (Cause, Back) {
        let member = &self.members[backend];
        let health = self.pool.backend(backend);
        if let Some(o) = member.override_ {
            let back = match o.kind {
                super::OverrideKind::Up => Back::InRotation,
                super::OverrideKind::Maintenance => Back::LeavingMaintenance {
                    passes: self.requalify_passes(),
                },
                _ => Back::OverrideEnds { until: o.until },
            };
            return (Cause::Override(o), back);
        }
        if member.agent.hold == Some(AgentHold::Maint) {
            let passes = self.requalify_passes();
            return (Cause::AgentMaintenance, Back::LeavingMaintenance { passes });
        }
        if let Some((has, needs)) = self.requalifying(backend) {
            return (
                Cause::Requalifying { has, needs },
                Back::Passes { has, needs },
            );
        }
        let self_draining = self.effective(backend) == Effective::SelfDraining;
        if member.agent.holds_out() {
            // An agent's `down` shows DOWN whatever the verdict; its drain, SELF_DRAINING while
            // the verdict is UP.
            let cause = if self_draining {
                Cause::AgentDrain
            } else {
                Cause::AgentHold
            };
            return (cause, Back::AgentUp);
        }
        if self_draining {
            return (Cause::DrainOn404, Back::NextPass);
        }
        let active = health.active;
        if member.tracks && !health.passive.is_ejected() {
            let back = match active.state {
                State::Up => Back::InRotation,
                State::Down => Back::TrackedUp,
            };
            return (
                Cause::Tracked {
                    state: active.state,
                },
                back,
            );
        }
        if let Ejection::Ejected { since, until, nth } = health.passive.ejection {
            let reason = member
                .last
                .filter(|t| t.to == State::Down)
                .map(|t| t.reason);
            let probes = (active.state == State::Down).then(|| ProbesDown {
                ends_ejection: self.pool.settings().probes_end_ejection && until.is_some(),
                ..self.probes_down(backend)
            });
            let cause = Cause::Ejected {
                since,
                until,
                nth,
                reason,
                probes,
            };
            return (cause, Back::EjectionEnds { until });
        }
        if active.state == State::Down {
            let down = self.probes_down(backend);
            let back = match down.why {
                DownWhy::FirstProbe => Back::FirstPass,
                _ => Back::Passes {
                    has: down.has,
                    needs: down.needs,
                },
            };
            return (Cause::ProbesDown(down), back);
        }
        let probation = match health.passive.ejection {
            Ejection::Probation { since } => Some(Probation {
                since,
                next_ejection: self
                    .pool
                    .settings()
                    .ejection
                    .map(|p| p.duration(health.passive.times_ejected.saturating_add(1))),
            }),
            _ => None,
        };
        let ramping = match (member.ramp_since, self.policy.slow_start) {
            (Some(since), Some(ramp)) => ramp::end(since, ramp) > now,
            _ => false,
        };
        (Cause::Up { probation, ramping }, Back::InRotation)
    }

    /// Why `backend`'s active side is DOWN, and the passes it needs.
    fn probes_down(&self, backend: usize) -> ProbesDown {
        let settings = self.pool.settings();
        let active = self.pool.backend(backend).active;
        let last = self.members[backend].last;
        let why = match last {
            Some(Transition {
                to: State::Down,
                reason:
                    Reason::ProbesFailed {
                        streak,
                        last,
                        mismatch,
                    },
                ..
            }) => DownWhy::ProbesFailed {
                streak,
                last,
                mismatch,
            },
            _ if settings.first_probe && !active.probed => DownWhy::FirstProbe,
            None => DownWhy::NeverProven,
            Some(_) => DownWhy::Failing {
                streak: active.fail_streak,
            },
        };
        ProbesDown {
            why,
            has: active.pass_streak,
            needs: settings.rise.get(),
            ends_ejection: false,
        }
    }
}
