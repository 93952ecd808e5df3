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

use std::time::Duration;

use crate::cadence::Cadence;
use crate::fleet::Published;
use crate::outliers::{lower_median, mean_stdev, permille, LatencyWindow, SuccessWindow};
use crate::probe::ProbeOutcome;
pub use crate::reason::{
    human_duration, EjectionInfo, RateSentence, Reason, Side, SlowSentence, Transition,
};
use crate::rules::{ProbeResult, TrafficResult};
pub use crate::settings::{
    EjectionPolicy, LatencyOutliers, Percentile, Settings, State, SuccessRate,
};
use crate::status::Outcome;

/// The active side of one backend.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Active {
    /// The active state.
    pub state: State,
    /// Consecutive failed probes, 0 after any pass.
    pub fail_streak: u32,
    /// Consecutive passing probes, 0 after any failure.
    pub pass_streak: u32,
    /// Whether any probe result was recorded since the backend joined (with
    /// [`Settings::first_probe`], the first one decides at once).
    pub probed: bool,
}

impl Active {
    /// The streak that holds the active side in its state: passes while UP, failures while
    /// DOWN (what a hidden active change reports, and what an owner publishes).
    pub fn streak(&self) -> u32 {
        match self.state {
            State::Up => self.pass_streak,
            State::Down => self.fail_streak,
        }
    }
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
    /// Consecutive judged latency windows in which the backend was an outlier (see
    /// [`Settings::latency_outliers`]), 0 after a window in which it was not.
    pub slow_windows: u32,
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
                probed: false,
            },
            passive: Passive {
                error_streak: 0,
                ejection: Ejection::None,
                times_ejected: 0,
                readmitted_at: None,
                slow_windows: 0,
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

    /// Whether the passive side of `backend` needs every traffic outcome: an error streak, an
    /// ejection or a probation is under way. When false, a good response changes nothing, so the
    /// request path may skip the engine for it. Panics if `backend` is not an index of this pool.
    pub fn needs_traffic(&self, backend: usize) -> bool {
        let passive = &self.backends[backend].passive;
        passive.error_streak > 0 || passive.ejection != Ejection::None
    }

    /// The most backends passive checks may hold ejected at once.
    pub fn max_ejected(&self) -> usize {
        match self.settings.max_ejected_percent {
            0 => 0,
            pct => (self.backends.len() * usize::from(pct.min(100)) / 100).max(1),
        }
    }

    /// Which probe interval applies to `backend` now (see [`Cadence`]). Panics if `backend` is
    /// not an index of this pool.
    pub fn cadence(&self, backend: usize) -> Cadence {
        Cadence::of(&self.backends[backend].active)
    }

    /// Records one probe outcome for `backend` (an [`Outcome`] alone, or a [`ProbeOutcome`] with
    /// the answer's content match) and returns how the probe rule judged it, with the transition
    /// it caused, if any. Panics if `backend` is not an index of this pool.
    pub fn probe(
        &mut self,
        backend: usize,
        probe: impl Into<ProbeOutcome>,
        now: Duration,
    ) -> (ProbeResult, Option<Transition>) {
        let probe = probe.into();
        let outcome = probe.outcome;
        let result = self.settings.probe_rule.judge_probe(&probe);
        let (rise, fall) = (self.settings.rise.get(), self.settings.fall.get());
        let probes_end_ejection = self.settings.probes_end_ejection;
        let first_probe = self.settings.first_probe;
        let health = &mut self.backends[backend];
        let before = health.verdict();
        let active = &mut health.active;
        let first = first_probe && !active.probed;
        active.probed = true;
        let reason = match result {
            ProbeResult::Pass => {
                active.pass_streak = active.pass_streak.saturating_add(1);
                active.fail_streak = 0;
                let recovered =
                    active.state == State::Down && (active.pass_streak >= rise || first);
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
            // The probe rule never gives `Drain`; only the rotation does, before the pool.
            ProbeResult::Fail | ProbeResult::Drain => {
                active.fail_streak = active.fail_streak.saturating_add(1);
                active.pass_streak = 0;
                if active.state == State::Up && active.fail_streak >= fall {
                    active.state = State::Down;
                }
                Reason::ProbesFailed {
                    streak: active.fail_streak,
                    last: outcome,
                    mismatch: probe.mismatch,
                }
            }
        };
        (result, self.settle(backend, before, reason, now))
    }

    /// Sets the active side of `backend`, which tracks another backend, to that backend's
    /// active `state` (its streaks cleared), and returns the transition this causes, if any. A
    /// tracking backend is never probed: this is its only active input. Panics if `backend`
    /// is not an index of this pool.
    pub fn track(&mut self, backend: usize, state: State, now: Duration) -> Option<Transition> {
        let health = &mut self.backends[backend];
        let before = health.verdict();
        let active = &mut health.active;
        active.probed = true;
        if active.state == state {
            return None;
        }
        active.state = state;
        active.fail_streak = 0;
        active.pass_streak = 0;
        self.settle(backend, before, Reason::Tracked { state }, now)
    }

    /// Sets the active side of `backend` to the verdict another member of the fleet group
    /// published (its owner: this instance does not probe it), and returns the transition this
    /// causes, if any. The streak that decided the owner's verdict becomes this side's streak,
    /// so should this instance take the backend over, its own probes continue from there and
    /// nothing flaps. Panics if `backend` is not an index of this pool.
    pub fn publish(
        &mut self,
        backend: usize,
        published: Published,
        now: Duration,
    ) -> Option<Transition> {
        let health = &mut self.backends[backend];
        let before = health.verdict();
        let active = &mut health.active;
        active.probed = true;
        let streak = published.why.streak;
        match published.state {
            State::Up => {
                active.pass_streak = streak;
                active.fail_streak = 0;
            }
            State::Down => {
                active.fail_streak = streak;
                active.pass_streak = 0;
            }
        }
        if active.state == published.state {
            return None;
        }
        active.state = published.state;
        self.settle(backend, before, Reason::Published(published), now)
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

    /// Judges one latency window of every backend (`windows[i]` is backend `i`'s; a backend
    /// past the end of `windows` relayed nothing in it) with [`Settings::latency_outliers`],
    /// and appends the transitions this causes to `out`. A backend that relayed fewer than
    /// `min_requests` requests in the window is not judged and keeps its count of slow windows;
    /// an ejected one is not judged and its count is cleared. The pool's median is the lower
    /// median of the judged, non-ejected backends' percentile. A backend more than `factor`
    /// times it (and at least `min_latency`) for `windows` judged windows in a row is ejected
    /// like a passive error ejection (same timed ejection, probation and cap), and at once when
    /// it is on probation. Without the detector, this does nothing.
    pub fn latency_window(
        &mut self,
        windows: &[LatencyWindow],
        now: Duration,
        out: &mut Vec<Transition>,
    ) {
        let Some(rule) = self.settings.latency_outliers else {
            return;
        };
        let judged = |b: usize, backends: &[BackendHealth]| -> Option<Duration> {
            let w = windows.get(b)?;
            (w.requests >= u64::from(rule.min_requests) && !backends[b].passive.is_ejected())
                .then(|| w.value(rule.percentile))
        };
        let mut values: Vec<Duration> = (0..self.backends.len())
            .filter_map(|b| judged(b, &self.backends))
            .collect();
        let Some(median) = lower_median(&mut values) else {
            for health in &mut self.backends {
                if health.passive.is_ejected() {
                    health.passive.slow_windows = 0;
                }
            }
            return;
        };
        let threshold = median.saturating_mul(rule.factor.get());
        let policy = self.settings.ejection;
        for backend in 0..self.backends.len() {
            if self.backends[backend].passive.is_ejected() {
                self.backends[backend].passive.slow_windows = 0;
                continue;
            }
            let Some(value) = judged(backend, &self.backends) else {
                continue;
            };
            let slow = value > threshold && value >= rule.min_latency;
            let may_eject = self.ejected < self.max_ejected();
            let health = &mut self.backends[backend];
            let before = health.verdict();
            let passive = &mut health.passive;
            if !slow {
                passive.slow_windows = 0;
                continue;
            }
            passive.slow_windows = passive.slow_windows.saturating_add(1);
            let on_probation = matches!(passive.ejection, Ejection::Probation { .. });
            if !(passive.slow_windows >= rule.windows.get() || on_probation) || !may_eject {
                continue;
            }
            let slow_windows = passive.slow_windows;
            passive.slow_windows = 0;
            passive.error_streak = 0;
            let ejection = eject(passive, policy, now);
            self.ejected += 1;
            let reason = Reason::SlowTraffic {
                percentile: rule.percentile,
                latency: value,
                median,
                windows: slow_windows,
                ejection,
            };
            out.extend(self.settle(backend, before, reason, now));
        }
    }

    /// Judges one window of every backend's traffic outcomes (`windows[i]` is backend `i`'s)
    /// with [`Settings::success_rate`], and appends the transitions this causes to `out`. The
    /// backends judged are those with at least `min_requests` outcomes in the window and not
    /// ejected; with fewer than `min_backends` of them nothing is judged. One whose success rate
    /// is below `mean - stdev_factor x stdev` of the judged backends' rates is ejected like a
    /// passive error ejection (same timed ejection, probation and cap). Without the detector,
    /// this does nothing.
    pub fn success_window(
        &mut self,
        windows: &[SuccessWindow],
        now: Duration,
        out: &mut Vec<Transition>,
    ) {
        let Some(rule) = self.settings.success_rate else {
            return;
        };
        let judged: Vec<(usize, f64)> = (0..self.backends.len())
            .filter_map(|b| {
                let w = windows.get(b)?;
                (w.requests >= u64::from(rule.min_requests.max(1))
                    && !self.backends[b].passive.is_ejected())
                .then(|| (b, w.rate()))
            })
            .collect();
        if judged.len() < rule.min_backends.max(1) as usize {
            return;
        }
        let rates: Vec<f64> = judged.iter().map(|&(_, rate)| rate).collect();
        let (mean, stdev) = mean_stdev(&rates);
        let threshold = mean - f64::from(rule.stdev_factor_milli) / 1000.0 * stdev;
        let policy = self.settings.ejection;
        for (backend, rate) in judged {
            if rate >= threshold || self.ejected >= self.max_ejected() {
                continue;
            }
            let health = &mut self.backends[backend];
            let before = health.verdict();
            let passive = &mut health.passive;
            passive.error_streak = 0;
            passive.slow_windows = 0;
            let ejection = eject(passive, policy, now);
            self.ejected += 1;
            let reason = Reason::ErrorRate {
                success_permille: permille(rate),
                mean_permille: permille(mean),
                threshold_permille: permille(threshold),
                ejection,
            };
            out.extend(self.settle(backend, before, reason, now));
        }
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
