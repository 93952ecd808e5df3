//! The health state of one pool of backends: two independent sides per backend, and a verdict.
//!
//! Active side: a failure streak and a pass streak; every probe result clears the opposite
//! streak. UP goes DOWN after `fall` consecutive failures, DOWN goes UP after `rise` consecutive
//! passes. Passive side: a streak of consecutive traffic errors, cleared by one good response;
//! reaching `consecutive_errors` ejects the backend. The two sides never touch each other's
//! counters, with one opt-in exception: with [`Settings::probes_end_ejection`], the probe that
//! brings a DOWN active side back UP also ends a passive ejection early, into probation (a
//! restarted backend need not sit out its whole ejection time). A backend is UP only if its
//! active side is UP and it is not ejected.
//!
//! Ejection comes in two modes. Without an [`EjectionPolicy`] (the replay protocol, seed 001's
//! exercise) an ejection lasts until the next good response. With one (the balancer, which sends
//! an ejected backend no traffic that could prove it well), it lasts `base x n` (capped at `max`)
//! for the n-th ejection; then the backend is back on probation: it gets traffic again, a good
//! response readmits it for good, and an error ejects it again at once, for longer.
//!
//! Invariants: every change of verdict yields exactly one [`Transition`] and nothing else does;
//! the engine never reads a clock (time is always an argument) and performs no IO.

use std::fmt;
use std::num::NonZeroU32;
use std::time::Duration;

use crate::rules::{ProbeResult, ProbeRule, TrafficResult, TrafficRule};
use crate::status::Outcome;

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
            probe_rule: ProbeRule::default(),
            traffic_rule: TrafficRule::default(),
            ejection: None,
            max_ejected_percent: 100,
            probes_end_ejection: false,
        }
    }
}

/// The active side of one backend.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Active {
    /// The active state.
    pub state: State,
    /// Consecutive failed probes, 0 after any pass.
    pub fail_streak: u32,
    /// Consecutive passing probes, 0 after any failure.
    pub pass_streak: u32,
}

/// Where a backend stands with passive checks.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Ejection {
    /// Not ejected.
    None,
    /// Ejected: no traffic.
    Ejected {
        /// When the ejection began.
        since: Duration,
        /// When it ends; `None` in streak mode (it ends with the next good response).
        until: Option<Duration>,
        /// Which ejection this is, counting from 1.
        nth: u32,
    },
    /// Back from an ejection and receiving traffic: one good response readmits the backend for
    /// good, one error ejects it again.
    Probation {
        /// When the probation began.
        since: Duration,
    },
}

/// The passive side of one backend.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Passive {
    /// Consecutive traffic errors, 0 after any good response.
    pub error_streak: u32,
    /// The ejection state.
    pub ejection: Ejection,
    /// Ejections counted towards the next ejection's length.
    pub times_ejected: u32,
    /// When the backend last left probation with a good response.
    pub readmitted_at: Option<Duration>,
}

impl Passive {
    /// Whether passive checks hold the backend out of rotation.
    pub fn is_ejected(&self) -> bool {
        matches!(self.ejection, Ejection::Ejected { .. })
    }
}

/// Both sides of one backend.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BackendHealth {
    /// The active side.
    pub active: Active,
    /// The passive side.
    pub passive: Passive,
}

impl BackendHealth {
    fn new(initial: State) -> BackendHealth {
        BackendHealth {
            active: Active {
                state: initial,
                fail_streak: 0,
                pass_streak: 0,
            },
            passive: Passive {
                error_streak: 0,
                ejection: Ejection::None,
                times_ejected: 0,
                readmitted_at: None,
            },
        }
    }

    /// UP only if the active side is UP and passive checks have not ejected the backend.
    pub fn verdict(&self) -> State {
        if self.active.state == State::Up && !self.passive.is_ejected() {
            State::Up
        } else {
            State::Down
        }
    }
}

/// Which side of the health checks caused a transition.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Side {
    /// Probes.
    Active,
    /// Relayed traffic.
    Passive,
}

/// One ejection, as reported in a [`Reason`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct EjectionInfo {
    /// Which ejection this is, counting from 1.
    pub nth: u32,
    /// How long it lasts.
    pub duration: Duration,
    /// When it ends.
    pub until: Duration,
}

/// Why a verdict changed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Reason {
    /// The failure streak reached `fall`.
    ProbesFailed {
        /// The failure streak.
        streak: u32,
        /// The last probe outcome.
        last: Outcome,
    },
    /// The pass streak reached `rise`.
    ProbesPassed {
        /// The pass streak.
        streak: u32,
        /// The last probe outcome.
        last: Outcome,
    },
    /// The traffic error streak reached `consecutive_errors`.
    TrafficErrors {
        /// The error streak.
        streak: u32,
        /// The last traffic outcome.
        last: Outcome,
        /// The ejection's length, with timed ejection.
        ejection: Option<EjectionInfo>,
    },
    /// A good response ended a streak-mode ejection.
    TrafficRecovered {
        /// The good response.
        last: Outcome,
    },
    /// A timed ejection ran out: the backend is back on probation.
    EjectionExpired {
        /// The ejection that ended.
        nth: u32,
        /// How long it lasted.
        duration: Duration,
    },
    /// The pass streak reached `rise` while the backend was also ejected, and
    /// [`Settings::probes_end_ejection`] ended the ejection early: the backend is back on
    /// probation.
    ProbesEndedEjection {
        /// The pass streak.
        streak: u32,
        /// The last probe outcome.
        last: Outcome,
        /// The ejection that ended.
        nth: u32,
    },
    /// A traffic error during probation ejected the backend again.
    ProbationFailed {
        /// The error.
        last: Outcome,
        /// The new ejection.
        ejection: EjectionInfo,
    },
}

impl Reason {
    /// The side that caused the transition.
    pub fn side(&self) -> Side {
        match self {
            Reason::ProbesFailed { .. }
            | Reason::ProbesPassed { .. }
            | Reason::ProbesEndedEjection { .. } => Side::Active,
            _ => Side::Passive,
        }
    }

    /// The outcome that triggered the transition, if one did (an expiry has none).
    pub fn last(&self) -> Option<Outcome> {
        match *self {
            Reason::ProbesFailed { last, .. }
            | Reason::ProbesPassed { last, .. }
            | Reason::ProbesEndedEjection { last, .. }
            | Reason::TrafficErrors { last, .. }
            | Reason::TrafficRecovered { last }
            | Reason::ProbationFailed { last, .. } => Some(last),
            Reason::EjectionExpired { .. } => None,
        }
    }
}

/// Writes a duration for people: `250 ms`, `1.5 s`, `30 s`.
pub fn human_duration(d: Duration) -> impl fmt::Display {
    struct Human(Duration);
    impl fmt::Display for Human {
        fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            let ms = self.0.as_millis();
            if ms < 1000 {
                write!(f, "{ms} ms")
            } else if ms % 1000 == 0 {
                write!(f, "{} s", ms / 1000)
            } else {
                write!(f, "{:.1} s", self.0.as_secs_f64())
            }
        }
    }
    Human(d)
}

fn plural(n: u32, one: &'static str, many: &'static str) -> &'static str {
    if n == 1 {
        one
    } else {
        many
    }
}

impl fmt::Display for EjectionInfo {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "ejected for {} (ejection #{})",
            human_duration(self.duration),
            self.nth
        )
    }
}

impl fmt::Display for Reason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match *self {
            Reason::ProbesFailed { streak, last } => {
                let what = plural(streak, "failed probe", "consecutive failed probes");
                write!(f, "{streak} {what}, last: {last}")
            }
            Reason::ProbesPassed { streak, last } => {
                let what = plural(streak, "passing probe", "consecutive passing probes");
                write!(f, "{streak} {what}, last: {last}")
            }
            Reason::ProbesEndedEjection { streak, last, nth } => {
                let what = plural(streak, "passing probe", "consecutive passing probes");
                write!(
                    f,
                    "{streak} {what} after DOWN, last: {last}; ends ejection #{nth} early, back on probation"
                )
            }
            Reason::TrafficErrors {
                streak,
                last,
                ejection,
            } => {
                let what = plural(streak, "traffic error", "consecutive traffic errors");
                write!(f, "{streak} {what}, last: {last}")?;
                match ejection {
                    Some(ejection) => write!(f, "; {ejection}"),
                    None => Ok(()),
                }
            }
            Reason::TrafficRecovered { last } => {
                write!(f, "a good response ended the error streak, last: {last}")
            }
            Reason::EjectionExpired { nth, duration } => write!(
                f,
                "ejection #{nth} ({}) is over, back on probation",
                human_duration(duration)
            ),
            Reason::ProbationFailed { last, ejection } => {
                write!(f, "traffic error on probation, last: {last}; {ejection}")
            }
        }
    }
}

/// A change of one backend's verdict: the engine's only output event.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Transition {
    /// The backend's index in the pool.
    pub backend: usize,
    /// The verdict before.
    pub from: State,
    /// The verdict after.
    pub to: State,
    /// Why.
    pub reason: Reason,
    /// When, on the caller's clock.
    pub at: Duration,
    /// How many backends of the pool are UP after the change.
    pub healthy_after: usize,
}

impl Transition {
    /// Whether this transition left the pool with no UP backend.
    pub fn emptied_pool(&self) -> bool {
        self.to == State::Down && self.healthy_after == 0
    }

    /// Whether this transition ended a time with no UP backend.
    pub fn refilled_pool(&self) -> bool {
        self.to == State::Up && self.healthy_after == 1
    }
}

impl fmt::Display for Transition {
    /// `UP -> DOWN: 3 consecutive failed probes, last: TIMEOUT` (the caller names the backend).
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} -> {}: {}", self.from, self.to, self.reason)
    }
}

/// The health engine for one pool. Backends are addressed by their index, in pool order.
#[derive(Clone, Debug)]
pub struct Pool {
    settings: Settings,
    backends: Vec<BackendHealth>,
    healthy: usize,
    ejected: usize,
}

impl Pool {
    /// A pool of `size` backends, each in the settings' initial state with all streaks at 0.
    pub fn new(settings: Settings, size: usize) -> Pool {
        let mut pool = Pool {
            settings,
            backends: Vec::with_capacity(size),
            healthy: 0,
            ejected: 0,
        };
        for _ in 0..size {
            pool.push(settings.initial);
        }
        pool
    }

    /// The settings in force.
    pub fn settings(&self) -> &Settings {
        &self.settings
    }

    /// Replaces the settings; every backend keeps its state and streaks. New thresholds apply
    /// from the next result on.
    pub fn set_settings(&mut self, settings: Settings) {
        self.settings = settings;
    }

    /// Adds a backend in the given active state, all streaks at 0, and returns its index.
    pub fn push(&mut self, initial: State) -> usize {
        let health = BackendHealth::new(initial);
        if health.verdict() == State::Up {
            self.healthy += 1;
        }
        self.backends.push(health);
        self.backends.len() - 1
    }

    /// Adds a backend with the health it had elsewhere (e.g. in the pool before a reload).
    pub fn push_health(&mut self, health: BackendHealth) -> usize {
        if health.verdict() == State::Up {
            self.healthy += 1;
        }
        if health.passive.is_ejected() {
            self.ejected += 1;
        }
        self.backends.push(health);
        self.backends.len() - 1
    }

    /// The number of backends.
    pub fn len(&self) -> usize {
        self.backends.len()
    }

    /// Whether the pool has no backend.
    pub fn is_empty(&self) -> bool {
        self.backends.is_empty()
    }

    /// The number of backends whose verdict is UP.
    pub fn healthy(&self) -> usize {
        self.healthy
    }

    /// The number of backends held out by passive checks.
    pub fn ejected(&self) -> usize {
        self.ejected
    }

    /// One backend's health. Panics if `backend` is not an index of this pool.
    pub fn backend(&self, backend: usize) -> &BackendHealth {
        &self.backends[backend]
    }

    /// Every backend's health, in pool order.
    pub fn backends(&self) -> &[BackendHealth] {
        &self.backends
    }

    /// One backend's verdict. Panics if `backend` is not an index of this pool.
    pub fn verdict(&self, backend: usize) -> State {
        self.backends[backend].verdict()
    }

    /// The most backends passive checks may hold ejected at once.
    pub fn max_ejected(&self) -> usize {
        match self.settings.max_ejected_percent {
            0 => 0,
            pct => (self.backends.len() * usize::from(pct.min(100)) / 100).max(1),
        }
    }

    /// Records one probe outcome for `backend` and returns how the probe rule judged it, with the
    /// transition it caused, if any. Panics if `backend` is not an index of this pool.
    pub fn probe(
        &mut self,
        backend: usize,
        outcome: Outcome,
        now: Duration,
    ) -> (ProbeResult, Option<Transition>) {
        let result = self.settings.probe_rule.judge(outcome);
        let (rise, fall) = (self.settings.rise.get(), self.settings.fall.get());
        let probes_end_ejection = self.settings.probes_end_ejection;
        let health = &mut self.backends[backend];
        let before = health.verdict();
        let active = &mut health.active;
        let reason = match result {
            ProbeResult::Pass => {
                active.pass_streak = active.pass_streak.saturating_add(1);
                active.fail_streak = 0;
                let recovered = active.state == State::Down && active.pass_streak >= rise;
                if recovered {
                    active.state = State::Up;
                }
                let streak = active.pass_streak;
                match health.passive.ejection {
                    Ejection::Ejected { nth, .. } if recovered && probes_end_ejection => {
                        health.passive.ejection = Ejection::Probation { since: now };
                        health.passive.error_streak = 0;
                        self.ejected -= 1;
                        Reason::ProbesEndedEjection {
                            streak,
                            last: outcome,
                            nth,
                        }
                    }
                    _ => Reason::ProbesPassed {
                        streak,
                        last: outcome,
                    },
                }
            }
            ProbeResult::Fail => {
                active.fail_streak = active.fail_streak.saturating_add(1);
                active.pass_streak = 0;
                if active.state == State::Up && active.fail_streak >= fall {
                    active.state = State::Down;
                }
                Reason::ProbesFailed {
                    streak: active.fail_streak,
                    last: outcome,
                }
            }
        };
        (result, self.settle(backend, before, reason, now))
    }

    /// Records one traffic outcome for `backend` and returns how the traffic rule judged it, with
    /// the transition it caused, if any. Panics if `backend` is not an index of this pool.
    pub fn observe(
        &mut self,
        backend: usize,
        outcome: Outcome,
        now: Duration,
    ) -> (TrafficResult, Option<Transition>) {
        let result = self.settings.traffic_rule.judge(outcome);
        let limit = self.settings.consecutive_errors.get();
        let may_eject = self.ejected < self.max_ejected();
        let policy = self.settings.ejection;
        let health = &mut self.backends[backend];
        let before = health.verdict();
        let passive = &mut health.passive;
        let reason = match result {
            TrafficResult::Ok => {
                passive.error_streak = 0;
                match passive.ejection {
                    Ejection::Ejected { until: None, .. } => {
                        passive.ejection = Ejection::None;
                        self.ejected -= 1;
                        Some(Reason::TrafficRecovered { last: outcome })
                    }
                    Ejection::Probation { .. } => {
                        passive.ejection = Ejection::None;
                        passive.readmitted_at = Some(now);
                        None
                    }
                    // A timed ejection runs its course: a good answer to a request sent before
                    // the ejection proves little.
                    Ejection::Ejected { .. } | Ejection::None => None,
                }
            }
            TrafficResult::Error => {
                passive.error_streak = passive.error_streak.saturating_add(1);
                match passive.ejection {
                    Ejection::None if passive.error_streak >= limit && may_eject => {
                        let ejection = eject(passive, policy, now);
                        self.ejected += 1;
                        Some(Reason::TrafficErrors {
                            streak: passive.error_streak,
                            last: outcome,
                            ejection,
                        })
                    }
                    Ejection::Probation { .. } if may_eject => {
                        let streak = passive.error_streak;
                        let ejection = eject(passive, policy, now);
                        self.ejected += 1;
                        Some(match ejection {
                            Some(ejection) => Reason::ProbationFailed {
                                last: outcome,
                                ejection,
                            },
                            // Probation without a policy (`set_settings` dropped it, or
                            // `push_health` brought the backend from a pool that had one): the
                            // ejection lasts until the next good response, and is reported.
                            None => Reason::TrafficErrors {
                                streak,
                                last: outcome,
                                ejection: None,
                            },
                        })
                    }
                    _ => None,
                }
            }
        };
        let transition = reason.and_then(|reason| self.settle(backend, before, reason, now));
        (result, transition)
    }

    /// Ends every timed ejection due by `now`, putting those backends on probation, and appends
    /// the transitions this causes to `out`.
    pub fn tick(&mut self, now: Duration, out: &mut Vec<Transition>) {
        for backend in 0..self.backends.len() {
            let health = &mut self.backends[backend];
            let Ejection::Ejected {
                since,
                until: Some(until),
                nth,
            } = health.passive.ejection
            else {
                continue;
            };
            if until > now {
                continue;
            }
            let before = health.verdict();
            health.passive.ejection = Ejection::Probation { since: now };
            health.passive.error_streak = 0;
            self.ejected -= 1;
            let reason = Reason::EjectionExpired {
                nth,
                duration: until.saturating_sub(since),
            };
            out.extend(self.settle(backend, before, reason, now));
        }
    }

    /// The earliest time a timed ejection ends, if any backend is ejected with a timer.
    pub fn next_expiry(&self) -> Option<Duration> {
        self.backends
            .iter()
            .filter_map(|b| match b.passive.ejection {
                Ejection::Ejected { until, .. } => until,
                _ => None,
            })
            .min()
    }

    fn settle(
        &mut self,
        backend: usize,
        before: State,
        reason: Reason,
        now: Duration,
    ) -> Option<Transition> {
        let after = self.backends[backend].verdict();
        if after == before {
            return None;
        }
        match after {
            State::Up => self.healthy += 1,
            State::Down => self.healthy -= 1,
        }
        Some(Transition {
            backend,
            from: before,
            to: after,
            reason,
            at: now,
            healthy_after: self.healthy,
        })
    }
}

fn eject(
    passive: &mut Passive,
    policy: Option<EjectionPolicy>,
    now: Duration,
) -> Option<EjectionInfo> {
    if let (Some(policy), Some(readmitted)) = (policy, passive.readmitted_at) {
        if now.saturating_sub(readmitted) >= policy.max {
            passive.times_ejected = 0;
        }
    }
    passive.times_ejected = passive.times_ejected.saturating_add(1);
    let nth = passive.times_ejected;
    let info = policy.map(|policy| {
        let duration = policy.duration(nth);
        EjectionInfo {
            nth,
            duration,
            until: now.saturating_add(duration),
        }
    });
    passive.ejection = Ejection::Ejected {
        since: now,
        until: info.map(|info| info.until),
        nth,
    };
    info
}
