//! The health runtime: one pure engine per pool, fed by probes, by relayed traffic, by operators
//! and by its own timer, and the snapshots, events and status it publishes.
//!
//! Every decision is the engine's (`capataz_health::Rotation`: verdicts, overrides with expiry,
//! slow start, the all-down policy and its fail-open set). This module only feeds it inputs
//! with the time, and [`publish`] turns what comes out into a new [`Snapshot`], log lines and
//! broadcast [`Event`]s; [`driver`] runs the probe loops and the one timer.
//!
//! The engine sits behind a mutex, with the per-backend records the admin API shows (recent
//! probes, last transition); the mutex is held for a few instructions and never across an
//! await. The request path never takes it for healthy traffic: it reads the lock-free
//! [`Snapshot`], records the outcome in a lock-free ring, and a good response from a backend
//! with a clean passive record skips the engine with one atomic load (`watched`, the engine's
//! `needs_traffic` as of its last change).

mod driver;
mod publish;

use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use arc_swap::{ArcSwap, Guard};
use capataz_health::{
    BackendHealth, EjectionPolicy, Join, Outcome, Policy, ProbeResult, ProbeRule, Reason, Rotation,
    Settings, Side, State, TrafficResult, TrafficRule, Transition, WhenAllDown,
};
use tokio::sync::{broadcast, Notify};
use tokio::time::Instant;

use crate::balance::Snapshot;
use crate::budget::RetryBudget;
use crate::config::{AllDownPolicy, CheckKind, PoolConfig};
pub use crate::events::{Event, OverrideKind};
use crate::metrics::{BackendMetrics, HistogramScope, PoolMetrics};
use crate::upstream::Upstream;

/// How many recent probe and traffic outcomes are kept per backend.
pub const HISTORY: usize = 20;

/// The latest wall-clock time the runtime writes (9999-12-31T23:59:59Z): engine times past it
/// (a saturated TTL) are shown as this.
const LAST_WALL: Duration = Duration::from_secs(253_402_300_799);

/// How far ahead a timer is set at most; anything later is "never" in practice, and a far
/// instant could overflow the platform's clock.
const FAR: Duration = Duration::from_secs(100 * 365 * 86_400);

/// The runtime's clock: time zero of the engines and the wall-clock time it corresponds to.
/// It reads tokio's clock, so tests may pause and advance it.
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
        Instant::now().saturating_duration_since(self.origin)
    }

    /// The wall-clock time of engine time `t`, saturating at the year 9999.
    pub fn wall(&self, t: Duration) -> SystemTime {
        let last = UNIX_EPOCH + LAST_WALL;
        self.wall.checked_add(t).map_or(last, |wall| wall.min(last))
    }

    /// The instant of engine time `t`, at most a century ahead.
    pub fn instant(&self, t: Duration) -> Instant {
        let t = t.min(self.now().saturating_add(FAR));
        // Within a century of now, so the additions cannot fail on any real clock.
        self.origin
            .checked_add(t)
            .or_else(|| self.origin.checked_add(FAR))
            .unwrap_or(self.origin)
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
    /// The engine's `needs_traffic` for it as of the engine's last change: when false, good
    /// responses need not reach the engine.
    watched: AtomicBool,
    /// When the next probe is due, in engine milliseconds (`u64::MAX`: none scheduled).
    next_probe_ms: AtomicU64,
}

impl BackendRt {
    /// When the next probe is due, on the engine clock.
    pub fn next_probe(&self) -> Option<Duration> {
        match self.next_probe_ms.load(Ordering::Relaxed) {
            u64::MAX => None,
            ms => Some(Duration::from_millis(ms)),
        }
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

/// The pool-level policy a pool's configuration asks for.
pub fn engine_policy(config: &PoolConfig) -> Policy {
    Policy {
        when_all_down: match config.when_all_down {
            AllDownPolicy::FailOpen => WhenAllDown::FailOpen,
            AllDownPolicy::Reject { .. } => WhenAllDown::Reject,
        },
        slow_start: config.slow_start,
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

/// A manual override in force, as the admin API shows it.
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
struct Records {
    probes: VecDeque<ProbeRecord>,
    last_transition: Option<(SystemTime, Transition)>,
    since: SystemTime,
}

impl Records {
    fn new(since: SystemTime) -> Records {
        Records {
            probes: VecDeque::with_capacity(HISTORY),
            last_transition: None,
            since,
        }
    }
}

/// The records of one backend and its manual override, as the admin API shows them.
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

/// The engine and the per-backend records, under one lock.
#[derive(Debug)]
struct Inner {
    engine: Rotation,
    info: Vec<Records>,
}

/// A copy of everything known about one backend at one moment, for the admin API.
#[derive(Clone, Debug)]
pub struct BackendView {
    /// The backend.
    pub backend: Arc<BackendRt>,
    /// Its engine state.
    pub health: BackendHealth,
    /// Its records and override.
    pub info: BackendInfo,
    /// Whether new requests may go to it now (its verdict and any override).
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
        match self.info.override_ {
            Some(o) => o.kind.state(),
            None => self.health.verdict().as_str(),
        }
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
    /// Wakes the timer when the engine's next timeout may have moved earlier.
    timer: Notify,
}

impl PoolRt {
    /// A pool for `config`. Backends that `previous` (the same pool before a reload) has with
    /// the same name and address keep their health, streaks, override, slow start and records,
    /// and whether they were ever proven healthy; other backends start in the configured
    /// initial state, or DOWN when `gate_new` (readiness gating after a reload). Events go to
    /// `events`; latency histograms are kept per pool or per backend as `histograms` says.
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
        let mut joins = Vec::with_capacity(config.backends.len());
        let mut info = Vec::with_capacity(config.backends.len());
        let mut backends = Vec::with_capacity(config.backends.len());
        for b in &config.backends {
            let kept = previous.as_ref().and_then(|(p, inner)| {
                let i = p
                    .backends
                    .iter()
                    .position(|old| *old.name == *b.name && old.address == b.address)?;
                Some((inner.engine.carry(i), inner.info[i].clone(), &p.backends[i]))
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
            };
            match kept {
                Some((carried, record, old)) => {
                    joins.push((b.weight, Join::Kept(carried)));
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
                    // Added by a reload straight into rotation: it still warms up.
                    let warm_up = previous.is_some();
                    joins.push((b.weight, Join::New { initial, warm_up }));
                    info.push(Records::new(wall));
                }
            }
            backends.push(Arc::new(rt));
        }
        drop(previous);
        let engine = Rotation::new(settings, engine_policy(&config), joins, now);
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
            timer: Notify::new(),
        };
        let mut inner = pool.lock();
        pool.publish(&mut inner, now, true);
        drop(inner);
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
        self.lock().engine.pool().backends().to_vec()
    }

    /// One backend's verdict.
    pub fn verdict(&self, backend: usize) -> State {
        self.lock().engine.pool().verdict(backend)
    }

    /// The index of the backend named `name`.
    pub fn index_of(&self, name: &str) -> Option<usize> {
        self.backends.iter().position(|b| &*b.name == name)
    }

    /// Per backend, in pool order: whether it may get new requests now (its verdict and any
    /// override, as [`PoolRt::views`] says in `eligible`) and its effective weight in tenths,
    /// without copying every record.
    pub fn eligibility(&self) -> Vec<(bool, u32)> {
        let now = self.clock.now();
        let inner = self.lock();
        (0..self.backends.len())
            .map(|i| {
                (
                    inner.engine.in_rotation(i),
                    inner.engine.weight_tenths(i, now),
                )
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
        let engine = &inner.engine;
        let records = &inner.info[i];
        BackendView {
            backend: self.backends[i].clone(),
            health: *engine.pool().backend(i),
            info: BackendInfo {
                probes: records.probes.clone(),
                last_transition: records.last_transition,
                since: records.since,
                override_: engine.override_of(i).map(|o| Override {
                    kind: o.kind,
                    since: self.clock.wall(o.since),
                    until: o.until,
                }),
            },
            eligible: engine.in_rotation(i),
            effective_weight_tenths: engine.weight_tenths(i, now),
            now,
        }
    }

    /// Feeds one probe outcome to the engine.
    pub fn record_probe(&self, backend: usize, outcome: Outcome, latency: Duration) {
        let now = self.clock.now();
        let mut inner = self.lock();
        let result = inner.engine.handle_probe(backend, outcome, now);
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
        tracing::trace!(
            pool = %self.name,
            backend = %self.backends[backend].name,
            outcome = %outcome,
            result = result.as_str(),
            latency_us = latency.as_micros() as u64,
            "probe"
        );
        self.publish(&mut inner, now, false);
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
        inner.engine.handle_traffic(backend, outcome, now);
        rt.watched
            .store(inner.engine.needs_traffic(backend), Ordering::Relaxed);
        let timer = inner.engine.pool().backend(backend).passive.is_ejected();
        self.publish(&mut inner, now, false);
        drop(inner);
        if timer {
            self.timer.notify_one();
        }
    }

    /// Runs the engine's timers due now (ejections ending, overrides lapsing, slow-start
    /// steps) and publishes what changed.
    pub fn tick(&self) {
        let now = self.clock.now();
        let mut inner = self.lock();
        inner.engine.handle_timeout(now);
        for (i, rt) in self.backends.iter().enumerate() {
            rt.watched
                .store(inner.engine.needs_traffic(i), Ordering::Relaxed);
        }
        self.publish(&mut inner, now, true);
    }

    /// Sets (`Some`) or clears (`None`) a manual override on the backend named `backend`, for
    /// `ttl` or until cleared (a TTL too long to represent never lapses). Returns the backend's
    /// new effective state.
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
        let state = inner.engine.set_override(i, kind, ttl, now);
        self.publish(&mut inner, now, false);
        drop(inner);
        self.timer.notify_one();
        Ok(state.as_str())
    }
}

/// The reason of a transition, for the explain sentence: the side and the streak.
pub fn reason_side(reason: &Reason) -> &'static str {
    match reason.side() {
        Side::Active => "active",
        Side::Passive => "passive",
    }
}
