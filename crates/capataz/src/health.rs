//! The health runtime: one pure engine per pool, fed by probes and by relayed traffic, and the
//! snapshots, events and status it publishes.
//!
//! The engine (`capataz_health::Pool`) sits behind a mutex, with the per-backend records the
//! admin API shows (recent probes, last transition, manual override); the mutex is held for a
//! few instructions and never across an await. The request path never takes it for healthy
//! traffic: it reads the lock-free [`Snapshot`], records the outcome in a lock-free ring, and a
//! good response from a backend with a clean passive record skips the engine with one atomic
//! load. Every change of eligibility (a verdict change, an override, a slow-start step) rebuilds
//! the snapshot; every verdict change and override is logged once and broadcast as an
//! [`Event`], and so are a pool losing its last eligible backend and getting one back.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant, SystemTime};

use arc_swap::{ArcSwap, Guard};
use capataz_health::{
    BackendHealth, Ejection, EjectionPolicy, Outcome, Pool, ProbeResult, ProbeRule, Reason,
    Settings, Side, State, TrafficResult, TrafficRule, Transition,
};
use tokio::sync::{broadcast, Notify};
use tokio::task::JoinHandle;

use crate::balance::Snapshot;
use crate::budget::RetryBudget;
use crate::config::{AllDownPolicy, CheckKind, PoolConfig};
pub use crate::events::{Event, OverrideKind};
use crate::logging;
use crate::metrics::{BackendMetrics, HistogramScope, PoolMetrics};
use crate::prober;
use crate::upstream::Upstream;

/// How many recent probe and traffic outcomes are kept per backend.
pub const HISTORY: usize = 20;

/// A slow-starting backend begins at this share of its weight, in percent.
const SLOW_START_FLOOR_PERCENT: u64 = 10;

/// The runtime's clock: time zero of the engines and the wall-clock time it corresponds to.
#[derive(Clone, Copy, Debug)]
pub struct Clock {
    origin: Instant,
    wall: SystemTime,
}

impl Clock {
    /// A clock starting now.
    pub fn start() -> Clock {
        Clock {
            origin: Instant::now(),
            wall: SystemTime::now(),
        }
    }

    /// Time since the origin: the engines' `now`.
    pub fn now(&self) -> Duration {
        self.origin.elapsed()
    }

    /// The wall-clock time of engine time `t`.
    pub fn wall(&self, t: Duration) -> SystemTime {
        self.wall + t
    }

    /// The instant of engine time `t`.
    pub fn instant(&self, t: Duration) -> Instant {
        self.origin + t
    }
}

/// Recent traffic outcomes of one backend, written without a lock by the request path.
#[derive(Debug, Default)]
pub struct TrafficRing {
    next: AtomicUsize,
    slots: [AtomicU32; HISTORY],
}

impl TrafficRing {
    fn push(&self, outcome: Outcome) {
        let code = match outcome {
            Outcome::Status(code) => u32::from(code),
            Outcome::Timeout => 1001,
            Outcome::Refused => 1002,
            Outcome::Reset => 1003,
            Outcome::Malformed => 1004,
        };
        let at = self.next.fetch_add(1, Ordering::Relaxed) % HISTORY;
        self.slots[at].store(code, Ordering::Relaxed);
    }

    /// The recorded outcomes, oldest first.
    pub fn recent(&self) -> Vec<Outcome> {
        let next = self.next.load(Ordering::Relaxed);
        let count = next.min(HISTORY);
        (next - count..next)
            .filter_map(|i| match self.slots[i % HISTORY].load(Ordering::Relaxed) {
                0 => None,
                1001 => Some(Outcome::Timeout),
                1002 => Some(Outcome::Refused),
                1003 => Some(Outcome::Reset),
                1004 => Some(Outcome::Malformed),
                code => u16::try_from(code).ok().map(Outcome::Status),
            })
            .collect()
    }
}

/// One backend at run time.
#[derive(Debug)]
pub struct BackendRt {
    /// Its name within the pool.
    pub name: Arc<str>,
    /// `host:port` as configured.
    pub address: String,
    /// Its configured weight.
    pub weight: u32,
    /// Its keep-alive connections.
    pub upstream: Upstream,
    /// Requests sent to it whose response has not been read to the end.
    pub in_flight: AtomicUsize,
    /// Recent traffic outcomes.
    pub traffic: TrafficRing,
    /// Its metric handles.
    pub(crate) metrics: BackendMetrics,
    /// Whether the passive side needs every traffic outcome (an error streak, an ejection or a
    /// probation is under way); when false, good responses need not reach the engine.
    watched: AtomicBool,
    /// When the next probe is due, in engine milliseconds (`u64::MAX`: none scheduled).
    next_probe_ms: AtomicU64,
    /// When its slow start began, in engine milliseconds (`u64::MAX`: not ramping).
    ramp_since_ms: AtomicU64,
}

impl BackendRt {
    /// When the next probe is due, on the engine clock.
    pub fn next_probe(&self) -> Option<Duration> {
        match self.next_probe_ms.load(Ordering::Relaxed) {
            u64::MAX => None,
            ms => Some(Duration::from_millis(ms)),
        }
    }

    /// Its weight now: during slow start a linear ramp from 10 % to 100 % of `weight`, in
    /// tenths of the configured weight unit (so 10 x `weight` at full weight).
    pub fn effective_weight_tenths(&self, slow_start: Option<Duration>, now: Duration) -> u32 {
        let full = self.weight.saturating_mul(10);
        let (Some(ramp), since) = (slow_start, self.ramp_since_ms.load(Ordering::Relaxed)) else {
            return full;
        };
        if since == u64::MAX {
            return full;
        }
        let elapsed = (now.as_millis() as u64).saturating_sub(since);
        let ramp_ms = (ramp.as_millis() as u64).max(1);
        if elapsed >= ramp_ms {
            self.ramp_since_ms.store(u64::MAX, Ordering::Relaxed);
            return full;
        }
        let percent = (SLOW_START_FLOOR_PERCENT
            + (100 - SLOW_START_FLOOR_PERCENT) * elapsed / ramp_ms)
            .min(100);
        ((u64::from(full) * percent / 100) as u32).max(1)
    }

    fn is_ramping(&self) -> bool {
        self.ramp_since_ms.load(Ordering::Relaxed) != u64::MAX
    }
}

/// The engine settings a pool's configuration asks for.
pub fn engine_settings(config: &PoolConfig) -> Settings {
    let initial = match config.active.kind {
        // Nothing would ever bring a DOWN active side back without probes.
        CheckKind::None => State::Up,
        CheckKind::Http | CheckKind::Tcp => config.active.initial,
    };
    Settings {
        rise: config.active.rise,
        fall: config.active.fall,
        consecutive_errors: config.passive.consecutive_errors,
        initial,
        probe_rule: ProbeRule {
            expect: config.active.expect,
        },
        traffic_rule: TrafficRule {
            count_503: config.passive.count_503,
        },
        ejection: Some(EjectionPolicy {
            base: config.passive.ejection_time,
            max: config.passive.max_ejection_time,
        }),
        max_ejected_percent: if config.passive.enabled {
            config.passive.max_ejected_percent
        } else {
            0
        },
        probes_end_ejection: config.passive.probes_end_ejection,
    }
}

/// One probe, as the admin API shows it.
#[derive(Clone, Copy, Debug)]
pub struct ProbeRecord {
    /// What happened.
    pub outcome: Outcome,
    /// How the probe rule judged it.
    pub result: ProbeResult,
    /// How long it took.
    pub latency: Duration,
    /// When it finished.
    pub at: SystemTime,
}

/// A manual override in force.
#[derive(Clone, Copy, Debug)]
pub struct Override {
    /// What it does.
    pub kind: OverrideKind,
    /// When it was set.
    pub since: SystemTime,
    /// When it lapses, on the engine clock (`None`: until cleared).
    pub until: Option<Duration>,
}

/// What the runtime remembers of one backend beside its engine state.
#[derive(Clone, Debug)]
pub struct BackendInfo {
    /// Recent probes, oldest first.
    pub probes: VecDeque<ProbeRecord>,
    /// The last verdict change and when it happened.
    pub last_transition: Option<(SystemTime, Transition)>,
    /// Since when the current verdict holds (start, or the last transition).
    pub since: SystemTime,
    /// The manual override, if any.
    pub override_: Option<Override>,
}

impl BackendInfo {
    fn new(since: SystemTime) -> BackendInfo {
        BackendInfo {
            probes: VecDeque::with_capacity(HISTORY),
            last_transition: None,
            since,
            override_: None,
        }
    }
}

/// The engine and the per-backend records, under one lock.
#[derive(Debug)]
struct Inner {
    engine: Pool,
    info: Vec<BackendInfo>,
}

/// A copy of everything known about one backend at one moment, for the admin API.
#[derive(Clone, Debug)]
pub struct BackendView {
    /// The backend.
    pub backend: Arc<BackendRt>,
    /// Its engine state.
    pub health: BackendHealth,
    /// Its records.
    pub info: BackendInfo,
    /// Whether new requests may go to it now.
    pub eligible: bool,
    /// Its effective weight, in tenths of a weight unit.
    pub effective_weight_tenths: u32,
    /// Engine time of the copy.
    pub now: Duration,
}

impl BackendView {
    /// The effective state: the override's (`DRAINING`, `FORCED_DOWN`, `FORCED_UP`), else the
    /// verdict (`UP`, `DOWN`).
    pub fn state(&self) -> &'static str {
        effective_state(self.health.verdict(), self.info.override_.map(|o| o.kind))
    }
}

fn effective_state(verdict: State, kind: Option<OverrideKind>) -> &'static str {
    match kind {
        Some(kind) => kind.state(),
        None => verdict.as_str(),
    }
}

fn eligible(verdict: State, kind: Option<OverrideKind>) -> bool {
    match kind {
        Some(OverrideKind::Up) => true,
        Some(OverrideKind::Down | OverrideKind::Drain) => false,
        None => verdict == State::Up,
    }
}

/// Why an override could not be applied.
#[derive(Debug, thiserror::Error)]
pub enum OverrideError {
    /// No such backend in this pool.
    #[error("pool {pool} has no backend {backend:?}")]
    UnknownBackend {
        /// The pool.
        pool: String,
        /// The name asked for.
        backend: String,
    },
}

/// One pool at run time: its backends, its engine, its snapshot.
#[derive(Debug)]
pub struct PoolRt {
    /// The pool's name.
    pub name: Arc<str>,
    /// Its configuration.
    pub config: PoolConfig,
    /// Its backends, in configuration order (the engine's indexes).
    pub backends: Vec<Arc<BackendRt>>,
    /// Its metric handles.
    pub(crate) metrics: PoolMetrics,
    inner: Mutex<Inner>,
    snapshot: ArcSwap<Snapshot>,
    pub(crate) cursor: AtomicUsize,
    pub(crate) budget: RetryBudget,
    traffic_rule: TrafficRule,
    events: broadcast::Sender<Event>,
    clock: Clock,
    expiry: Notify,
}

impl PoolRt {
    /// A pool for `config`. Backends that `previous` (the same pool before a reload) has with
    /// the same name and address keep their health, streaks and records; other backends start
    /// in the configured initial state, or DOWN when `gate_new` (readiness gating after a
    /// reload). Events go to `events`; latency histograms are kept per pool or per backend as
    /// `histograms` says.
    pub fn new(
        config: PoolConfig,
        events: broadcast::Sender<Event>,
        clock: Clock,
        previous: Option<&PoolRt>,
        gate_new: bool,
        histograms: HistogramScope,
    ) -> PoolRt {
        let settings = engine_settings(&config);
        let metrics = PoolMetrics::new(&config.name, histograms);
        let now = clock.now();
        let wall = clock.wall(now);
        let previous = previous.map(|p| (p, p.lock()));
        let mut engine = Pool::new(settings, 0);
        let mut info = Vec::with_capacity(config.backends.len());
        let mut backends = Vec::with_capacity(config.backends.len());
        for b in &config.backends {
            let kept = previous.as_ref().and_then(|(p, inner)| {
                p.backends
                    .iter()
                    .position(|old| *old.name == *b.name && old.address == b.address)
                    .map(|i| {
                        (
                            inner.engine.backend(i).to_owned(),
                            inner.info[i].clone(),
                            &p.backends[i],
                        )
                    })
            });
            let rt = BackendRt {
                name: b.name.as_str().into(),
                address: b.address.clone(),
                weight: b.weight,
                upstream: Upstream::new(
                    b.socket_addr,
                    config.timeouts.connect,
                    config.timeouts.idle,
                ),
                in_flight: AtomicUsize::new(0),
                traffic: TrafficRing::default(),
                metrics: metrics.backend(&b.name),
                watched: AtomicBool::new(false),
                next_probe_ms: AtomicU64::new(u64::MAX),
                ramp_since_ms: AtomicU64::new(u64::MAX),
            };
            match kept {
                Some((health, record, old)) => {
                    engine.push_health(health);
                    rt.watched
                        .store(old.watched.load(Ordering::Relaxed), Ordering::Relaxed);
                    rt.ramp_since_ms
                        .store(old.ramp_since_ms.load(Ordering::Relaxed), Ordering::Relaxed);
                    for outcome in old.traffic.recent() {
                        rt.traffic.push(outcome);
                    }
                    info.push(record);
                }
                None => {
                    let initial = if gate_new && config.active.kind != CheckKind::None {
                        State::Down
                    } else {
                        settings.initial
                    };
                    engine.push(initial);
                    if previous.is_some() && initial == State::Up {
                        // Added by a reload straight into rotation: it still warms up.
                        rt.ramp_since_ms
                            .store(now.as_millis() as u64, Ordering::Relaxed);
                    }
                    info.push(BackendInfo::new(wall));
                }
            }
            backends.push(Arc::new(rt));
        }
        drop(previous);
        let pool = PoolRt {
            name: config.name.as_str().into(),
            metrics,
            budget: RetryBudget::new(config.retries.budget_percent, config.retries.min_budget),
            traffic_rule: settings.traffic_rule,
            snapshot: ArcSwap::from_pointee(Snapshot::new(Vec::new(), Vec::new(), false)),
            inner: Mutex::new(Inner { engine, info }),
            cursor: AtomicUsize::new(0),
            backends,
            config,
            events,
            clock,
            expiry: Notify::new(),
        };
        let inner = pool.lock();
        let snapshot = pool.build_snapshot(&inner, now);
        let all_down = snapshot.all_down;
        pool.snapshot.store(Arc::new(snapshot));
        drop(inner);
        if all_down {
            pool.emit(Event::AllDown {
                pool: pool.name.clone(),
                policy: pool.config.when_all_down,
                time: wall,
            });
        }
        pool
    }

    fn lock(&self) -> MutexGuard<'_, Inner> {
        // The engine holds no invariant a panicking holder could break half-way (it never
        // panics on valid indexes), so a poisoned lock is still usable.
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The runtime clock.
    pub fn clock(&self) -> Clock {
        self.clock
    }

    /// The eligible backends as of the last change; no lock taken.
    pub fn snapshot(&self) -> Guard<Arc<Snapshot>> {
        self.snapshot.load()
    }

    /// A copy of every backend's health, in pool order.
    pub fn health(&self) -> Vec<BackendHealth> {
        self.lock().engine.backends().to_vec()
    }

    /// One backend's verdict.
    pub fn verdict(&self, backend: usize) -> State {
        self.lock().engine.verdict(backend)
    }

    /// The index of the backend named `name`.
    pub fn index_of(&self, name: &str) -> Option<usize> {
        self.backends.iter().position(|b| &*b.name == name)
    }

    /// Whether each backend may get new requests now (its verdict and any override), in pool
    /// order: what [`PoolRt::views`] says in `eligible`, without copying every record.
    pub fn eligibility(&self) -> Vec<bool> {
        let inner = self.lock();
        (0..self.backends.len())
            .map(|i| {
                let kind = inner.info[i].override_.map(|o| o.kind);
                eligible(inner.engine.verdict(i), kind)
            })
            .collect()
    }

    /// A consistent copy of everything known about every backend.
    pub fn views(&self) -> Vec<BackendView> {
        let now = self.clock.now();
        let inner = self.lock();
        (0..self.backends.len())
            .map(|i| self.view(&inner, i, now))
            .collect()
    }

    /// A consistent copy of everything known about backend `index` (which must exist), without
    /// copying the others'.
    pub fn view_of(&self, index: usize) -> BackendView {
        let now = self.clock.now();
        let inner = self.lock();
        self.view(&inner, index, now)
    }

    fn view(&self, inner: &Inner, i: usize, now: Duration) -> BackendView {
        let health = *inner.engine.backend(i);
        let info = inner.info[i].clone();
        let kind = info.override_.map(|o| o.kind);
        BackendView {
            backend: self.backends[i].clone(),
            eligible: eligible(health.verdict(), kind),
            effective_weight_tenths: self.backends[i]
                .effective_weight_tenths(self.config.slow_start, now),
            health,
            info,
            now,
        }
    }

    /// Feeds one probe outcome to the engine.
    pub fn record_probe(&self, backend: usize, outcome: Outcome, latency: Duration) {
        let now = self.clock.now();
        let mut inner = self.lock();
        let active_before = inner.engine.backend(backend).active.state;
        let (result, transition) = inner.engine.probe(backend, outcome, now);
        self.backends[backend].metrics.probe(result, latency);
        let probes = &mut inner.info[backend].probes;
        if probes.len() == HISTORY {
            probes.pop_front();
        }
        probes.push_back(ProbeRecord {
            outcome,
            result,
            latency,
            at: self.clock.wall(now),
        });
        let name = &self.backends[backend].name;
        tracing::trace!(
            pool = %self.name,
            backend = %name,
            outcome = %outcome,
            result = result.as_str(),
            latency_us = latency.as_micros() as u64,
            "probe"
        );
        match transition {
            Some(transition) => self.publish(&mut inner, &[transition], now),
            None => {
                let active = inner.engine.backend(backend).active;
                if active.state != active_before {
                    self.log_hidden_active_change(backend, active, outcome);
                }
            }
        }
    }

    fn log_hidden_active_change(
        &self,
        backend: usize,
        active: capataz_health::pool::Active,
        outcome: Outcome,
    ) {
        // The verdict did not move (passive checks hold the backend out), but an operator
        // still wants to know what the probes concluded.
        let name = &self.backends[backend].name;
        let streak = match active.state {
            State::Up => active.pass_streak,
            State::Down => active.fail_streak,
        };
        let sentence = format!(
            "pool={} backend={} active checks say {} after {} consecutive {} probes \
             (last: {}); the verdict stays DOWN: ejected by passive checks",
            self.name,
            name,
            active.state,
            streak,
            if active.state == State::Up {
                "passing"
            } else {
                "failed"
            },
            outcome
        );
        logging::emit(
            tracing::Level::INFO,
            &sentence,
            logging::Fields {
                event: "active_change",
                pool: Some(&self.name),
                backend: Some(name),
                to: Some(active.state.as_str()),
                side: Some("active"),
                ..Default::default()
            },
        );
    }

    /// Feeds one traffic outcome to the engine (a good response from a backend with a clean
    /// passive record is skipped without taking the lock).
    pub fn observe(&self, backend: usize, outcome: Outcome) {
        let rt = &self.backends[backend];
        rt.traffic.push(outcome);
        if !self.config.passive.enabled {
            return;
        }
        if !rt.watched.load(Ordering::Relaxed)
            && self.traffic_rule.judge(outcome) == TrafficResult::Ok
        {
            return;
        }
        let now = self.clock.now();
        let mut inner = self.lock();
        let (_, transition) = inner.engine.observe(backend, outcome, now);
        let passive = inner.engine.backend(backend).passive;
        rt.watched.store(
            passive.error_streak > 0 || passive.ejection != Ejection::None,
            Ordering::Relaxed,
        );
        if let Some(transition) = transition {
            self.publish(&mut inner, &[transition], now);
        }
        if passive.is_ejected() {
            self.expiry.notify_one();
        }
    }

    /// Ends the ejections and overrides that are due.
    pub fn tick(&self) {
        let now = self.clock.now();
        let mut inner = self.lock();
        let mut transitions = Vec::new();
        inner.engine.tick(now, &mut transitions);
        for t in &transitions {
            self.backends[t.backend]
                .watched
                .store(true, Ordering::Relaxed);
        }
        if !transitions.is_empty() {
            self.publish(&mut inner, &transitions, now);
        }
        let lapsed: Vec<usize> = (0..inner.info.len())
            .filter(|&i| {
                inner.info[i]
                    .override_
                    .is_some_and(|o| o.until.is_some_and(|until| until <= now))
            })
            .collect();
        for i in lapsed {
            self.apply_override(&mut inner, i, None, None, now, "manual override lapsed");
        }
    }

    /// Sets (`Some`) or clears (`None`) a manual override on the backend named `backend`, for
    /// `ttl` or until cleared. Returns the backend's new effective state.
    pub fn set_override(
        &self,
        backend: &str,
        kind: Option<OverrideKind>,
        ttl: Option<Duration>,
    ) -> Result<&'static str, OverrideError> {
        let i = self
            .index_of(backend)
            .ok_or_else(|| OverrideError::UnknownBackend {
                pool: self.name.to_string(),
                backend: backend.to_owned(),
            })?;
        let now = self.clock.now();
        let mut inner = self.lock();
        let why = match kind {
            Some(_) => "set by an operator",
            None => "cleared by an operator",
        };
        let state = self.apply_override(&mut inner, i, kind, ttl, now, why);
        drop(inner);
        self.expiry.notify_one();
        Ok(state)
    }

    fn apply_override(
        &self,
        inner: &mut Inner,
        i: usize,
        kind: Option<OverrideKind>,
        ttl: Option<Duration>,
        now: Duration,
        why: &str,
    ) -> &'static str {
        let verdict = inner.engine.verdict(i);
        let before = effective_state(verdict, inner.info[i].override_.map(|o| o.kind));
        let wall = self.clock.wall(now);
        inner.info[i].override_ = kind.map(|kind| Override {
            kind,
            since: wall,
            until: ttl.map(|ttl| now + ttl),
        });
        let after = effective_state(verdict, kind);
        let reason = match (kind, ttl) {
            (Some(kind), Some(ttl)) => format!(
                "manual {} {why}, for {} (until {})",
                kind.as_str(),
                capataz_health::pool::human_duration(ttl),
                crate::timefmt::clock(wall + ttl)
            ),
            (Some(kind), None) => format!("manual {} {why}, until cleared", kind.as_str()),
            (None, _) => format!("{why}; health checks decide again"),
        };
        let event = Event::Override {
            pool: self.name.clone(),
            backend: self.backends[i].name.clone(),
            kind,
            from: before,
            to: after,
            reason,
            time: wall,
        };
        self.publish(inner, &[], now);
        self.emit(event);
        after
    }

    fn build_snapshot(&self, inner: &Inner, now: Duration) -> Snapshot {
        let kinds = |i: usize| inner.info[i].override_.map(|o| o.kind);
        let up: Vec<usize> = (0..inner.engine.len())
            .filter(|&i| eligible(inner.engine.verdict(i), kinds(i)))
            .collect();
        let (eligible, all_down) = if !up.is_empty() {
            (up, false)
        } else {
            match self.config.when_all_down {
                // Fail open over every backend an operator has not taken out by hand.
                AllDownPolicy::FailOpen => (
                    (0..inner.engine.len())
                        .filter(|&i| kinds(i).is_none())
                        .collect(),
                    true,
                ),
                AllDownPolicy::Reject { .. } => (Vec::new(), true),
            }
        };
        let weights = eligible
            .iter()
            .map(|&i| self.backends[i].effective_weight_tenths(self.config.slow_start, now))
            .collect();
        Snapshot::new(eligible, weights, all_down)
    }

    /// Records `transitions`, rebuilds the snapshot, and logs and broadcasts what changed.
    fn publish(&self, inner: &mut Inner, transitions: &[Transition], now: Duration) {
        let time = self.clock.wall(now);
        for transition in transitions {
            let info = &mut inner.info[transition.backend];
            info.last_transition = Some((time, *transition));
            info.since = time;
            if transition.to == State::Up && self.config.slow_start.is_some() {
                self.backends[transition.backend]
                    .ramp_since_ms
                    .store(now.as_millis() as u64, Ordering::Relaxed);
            }
        }
        let was_all_down = self.snapshot.load().all_down;
        let snapshot = self.build_snapshot(inner, now);
        let all_down = snapshot.all_down;
        self.snapshot.store(Arc::new(snapshot));
        for transition in transitions {
            let metrics = &self.backends[transition.backend].metrics;
            metrics.transition(transition);
            self.emit(Event::Transition {
                pool: self.name.clone(),
                backend: self.backends[transition.backend].name.clone(),
                transition: *transition,
                time,
            });
        }
        if all_down && !was_all_down {
            self.emit(Event::AllDown {
                pool: self.name.clone(),
                policy: self.config.when_all_down,
                time,
            });
        } else if was_all_down && !all_down {
            self.emit(Event::Recovered {
                pool: self.name.clone(),
                time,
            });
        }
    }

    /// Logs `event` once and broadcasts it.
    fn emit(&self, event: Event) {
        let sentence = event.sentence();
        let change = event.change();
        let side = match &event {
            Event::Transition { transition, .. } => Some(match transition.reason.side() {
                Side::Active => "active",
                Side::Passive => "passive",
            }),
            _ => None,
        };
        let policy = match &event {
            Event::AllDown { policy, .. } => Some(match policy {
                AllDownPolicy::FailOpen => "fail_open",
                AllDownPolicy::Reject { .. } => "reject",
            }),
            _ => None,
        };
        let level = match &event {
            Event::AllDown { .. } => tracing::Level::ERROR,
            Event::Transition { transition, .. } if transition.to == State::Down => {
                tracing::Level::WARN
            }
            _ => tracing::Level::INFO,
        };
        logging::emit(
            level,
            &sentence,
            logging::Fields {
                event: event.kind(),
                pool: Some(event.pool()),
                backend: event.backend(),
                from: change.as_ref().map(|c| c.0),
                to: change.as_ref().map(|c| c.1),
                side,
                reason: change.as_ref().map(|c| c.2.as_str()),
                policy,
            },
        );
        let _ = self.events.send(event);
    }

    /// Starts the pool's background work: one probe loop per backend (unless checks are off),
    /// the ejection and override timer, the slow-start ramp, and the idle-connection reaper.
    /// Abort the handles to stop them.
    pub fn spawn_tasks(self: &Arc<Self>) -> Vec<JoinHandle<()>> {
        let mut tasks = Vec::new();
        if self.config.active.kind != CheckKind::None {
            for backend in 0..self.backends.len() {
                tasks.push(tokio::spawn(probe_loop(self.clone(), backend)));
            }
        }
        let pool = self.clone();
        tasks.push(tokio::spawn(async move { pool.expiry_loop().await }));
        if let Some(ramp) = self.config.slow_start {
            let pool = self.clone();
            tasks.push(tokio::spawn(async move {
                let step = (ramp / 20).max(Duration::from_millis(50));
                loop {
                    tokio::time::sleep(step).await;
                    if pool.backends.iter().any(|b| b.is_ramping()) {
                        let now = pool.clock.now();
                        let inner = pool.lock();
                        pool.snapshot
                            .store(Arc::new(pool.build_snapshot(&inner, now)));
                    }
                }
            }));
        }
        let pool = self.clone();
        tasks.push(tokio::spawn(async move {
            let period = (pool.config.timeouts.idle / 2).max(Duration::from_millis(100));
            loop {
                tokio::time::sleep(period).await;
                for backend in &pool.backends {
                    backend.upstream.reap();
                }
            }
        }));
        tasks
    }

    fn next_deadline(&self) -> Option<Duration> {
        let inner = self.lock();
        let overrides = inner
            .info
            .iter()
            .filter_map(|i| i.override_.and_then(|o| o.until));
        inner
            .engine
            .next_expiry()
            .into_iter()
            .chain(overrides)
            .min()
    }

    async fn expiry_loop(&self) {
        loop {
            match self.next_deadline() {
                Some(due) => {
                    let at = self.clock.instant(due);
                    tokio::select! {
                        _ = tokio::time::sleep_until(at.into()) => {}
                        _ = self.expiry.notified() => {}
                    }
                }
                None => self.expiry.notified().await,
            }
            self.tick();
        }
    }
}

/// Probes one backend forever: a first probe at a random phase within the interval, then one
/// jittered interval after each probe finishes, so probes never pile up or run in lockstep.
/// Each due time is rounded to the probe slot grid ([`prober::align_to_slot`]), so that probes
/// of different backends due within a few milliseconds of each other start together.
async fn probe_loop(pool: Arc<PoolRt>, backend: usize) {
    let active = &pool.config.active;
    let rt = pool.backends[backend].clone();
    let host = active.host.clone().unwrap_or_else(|| rt.address.clone());
    let mut rng = prober::Rng::from_entropy();
    let mut wait = prober::first_delay(active.interval, &mut rng);
    loop {
        let now = pool.clock.now();
        let due = prober::align_to_slot(now + wait, now, active.interval);
        rt.next_probe_ms
            .store(due.as_millis() as u64, Ordering::Relaxed);
        tokio::time::sleep_until(pool.clock.instant(due).into()).await;
        let started = Instant::now();
        let outcome = prober::probe_once(
            active.kind,
            rt.upstream.addr(),
            &active.path,
            &host,
            active.timeout,
        )
        .await;
        pool.record_probe(backend, outcome, started.elapsed());
        wait = prober::jittered(active.interval, active.jitter, &mut rng);
    }
}

/// The reason of a transition, for the explain sentence: the side and the streak.
pub fn reason_side(reason: &Reason) -> &'static str {
    match reason.side() {
        Side::Active => "active",
        Side::Passive => "passive",
    }
}
