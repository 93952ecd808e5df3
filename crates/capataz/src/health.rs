//! The health runtime: one pure engine per pool, fed by probes and by relayed traffic, and the
//! snapshots and events it publishes.
//!
//! The engine (`capataz_health::Pool`) sits behind a mutex that is held for a few instructions
//! and never across an await. The request path never takes it for healthy traffic: it reads the
//! lock-free [`Snapshot`], and a good response from a backend with a clean passive record is
//! skipped with one atomic load. Every verdict change rebuilds the snapshot, is logged once
//! through `tracing`, and is broadcast as an [`Event`]; so are a pool losing its last UP backend
//! and getting one back.

use std::sync::atomic::{AtomicBool, AtomicI64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant, SystemTime};

use arc_swap::{ArcSwap, Guard};
use capataz_health::{
    BackendHealth, Ejection, EjectionPolicy, Outcome, Pool, ProbeRule, Settings, Side, State,
    TrafficResult, TrafficRule, Transition,
};
use tokio::sync::{broadcast, Notify};
use tokio::task::JoinHandle;

use crate::balance::Snapshot;
use crate::config::{AllDownPolicy, CheckKind, PoolConfig};
use crate::logging;
use crate::prober;
use crate::upstream::Upstream;

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
    /// The pool has no UP backend any more; its all-down policy applies.
    AllDown {
        /// The pool.
        pool: Arc<str>,
        /// What the pool does now.
        policy: AllDownPolicy,
        /// Wall-clock time.
        time: SystemTime,
    },
    /// The pool has an UP backend again.
    Recovered {
        /// The pool.
        pool: Arc<str>,
        /// Wall-clock time.
        time: SystemTime,
    },
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
    /// Its index in the pool.
    pub index: usize,
    /// Its keep-alive connections.
    pub upstream: Upstream,
    /// Requests sent to it whose response has not been read to the end.
    pub in_flight: AtomicUsize,
    /// Whether the passive side needs every traffic outcome (an error streak, an ejection or a
    /// probation is under way); when false, good responses need not reach the engine.
    watched: AtomicBool,
}

/// A retry budget: each request earns `budget_percent / 100` of a retry, a retry spends one,
/// and at most `min_budget` retries are saved up. Counted in thousandths.
#[derive(Debug)]
pub(crate) struct RetryBudget {
    milli: AtomicI64,
    per_request: i64,
    cap: i64,
}

impl RetryBudget {
    fn new(budget_percent: u8, min_budget: u32) -> RetryBudget {
        let cap = i64::from(min_budget) * 1000;
        RetryBudget {
            milli: AtomicI64::new(cap),
            per_request: i64::from(budget_percent) * 10,
            cap,
        }
    }

    /// Counts one request towards the budget.
    pub(crate) fn on_request(&self) {
        if self.per_request > 0 && self.milli.load(Ordering::Relaxed) < self.cap {
            self.milli.fetch_add(self.per_request, Ordering::Relaxed);
        }
    }

    /// Spends one retry if the budget has one.
    pub(crate) fn try_spend(&self) -> bool {
        self.milli
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |t| {
                (t >= 1000).then_some(t - 1000)
            })
            .is_ok()
    }
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
    engine: Mutex<Pool>,
    snapshot: ArcSwap<Snapshot>,
    pub(crate) cursor: AtomicUsize,
    pub(crate) budget: RetryBudget,
    traffic_rule: TrafficRule,
    events: broadcast::Sender<Event>,
    origin: Instant,
    expiry: Notify,
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
    }
}

impl PoolRt {
    /// A pool with every backend in its initial state. `origin` is time zero of the engine's
    /// clock; events go to `events`.
    pub fn new(config: PoolConfig, events: broadcast::Sender<Event>, origin: Instant) -> PoolRt {
        let settings = engine_settings(&config);
        let backends: Vec<Arc<BackendRt>> = config
            .backends
            .iter()
            .enumerate()
            .map(|(index, b)| {
                Arc::new(BackendRt {
                    name: b.name.as_str().into(),
                    address: b.address.clone(),
                    weight: b.weight,
                    index,
                    upstream: Upstream::new(
                        b.socket_addr,
                        config.timeouts.connect,
                        config.timeouts.idle,
                    ),
                    in_flight: AtomicUsize::new(0),
                    watched: AtomicBool::new(false),
                })
            })
            .collect();
        let engine = Pool::new(settings, backends.len());
        let pool = PoolRt {
            name: config.name.as_str().into(),
            budget: RetryBudget::new(config.retries.budget_percent, config.retries.min_budget),
            traffic_rule: settings.traffic_rule,
            snapshot: ArcSwap::from_pointee(Snapshot::new(Vec::new(), Vec::new(), true)),
            engine: Mutex::new(engine),
            cursor: AtomicUsize::new(0),
            backends,
            config,
            events,
            origin,
            expiry: Notify::new(),
        };
        let engine = pool.lock();
        pool.snapshot.store(Arc::new(pool.build_snapshot(&engine)));
        if engine.healthy() == 0 {
            pool.log_all_down();
        }
        drop(engine);
        pool
    }

    fn lock(&self) -> MutexGuard<'_, Pool> {
        // The engine holds no invariant a panicking holder could break half-way (it never
        // panics on valid indexes), so a poisoned lock is still usable.
        self.engine.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn now(&self) -> Duration {
        self.origin.elapsed()
    }

    /// The eligible backends as of the last verdict change; no lock taken.
    pub fn snapshot(&self) -> Guard<Arc<Snapshot>> {
        self.snapshot.load()
    }

    /// A copy of every backend's health, in pool order.
    pub fn health(&self) -> Vec<BackendHealth> {
        self.lock().backends().to_vec()
    }

    /// One backend's verdict.
    pub fn verdict(&self, backend: usize) -> State {
        self.lock().verdict(backend)
    }

    /// Feeds one probe outcome to the engine.
    pub fn record_probe(&self, backend: usize, outcome: Outcome) {
        let now = self.now();
        let mut engine = self.lock();
        let active_before = engine.backend(backend).active.state;
        let (result, transition) = engine.probe(backend, outcome, now);
        let name = &self.backends[backend].name;
        tracing::trace!(
            pool = %self.name,
            backend = %name,
            outcome = %outcome,
            result = result.as_str(),
            "probe"
        );
        match transition {
            Some(transition) => self.publish(&engine, &[transition]),
            None => {
                let active = engine.backend(backend).active;
                if active.state != active_before {
                    // The verdict did not move (passive checks hold the backend out), but an
                    // operator still wants to know what the probes concluded.
                    let streak = match active.state {
                        State::Up => active.pass_streak,
                        State::Down => active.fail_streak,
                    };
                    let sentence =
                        format!(
                        "pool={} backend={} active checks say {} after {} consecutive {} probes \
                         (last: {}); the verdict stays DOWN: ejected by passive checks",
                        self.name,
                        name,
                        active.state,
                        streak,
                        if active.state == State::Up { "passing" } else { "failed" },
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
            }
        }
    }

    /// Feeds one traffic outcome to the engine (a good response from a backend with a clean
    /// passive record is skipped without taking the lock).
    pub fn observe(&self, backend: usize, outcome: Outcome) {
        if !self.config.passive.enabled {
            return;
        }
        let rt = &self.backends[backend];
        if !rt.watched.load(Ordering::Relaxed)
            && self.traffic_rule.judge(outcome) == TrafficResult::Ok
        {
            return;
        }
        let now = self.now();
        let mut engine = self.lock();
        let (_, transition) = engine.observe(backend, outcome, now);
        let passive = engine.backend(backend).passive;
        rt.watched.store(
            passive.error_streak > 0 || passive.ejection != Ejection::None,
            Ordering::Relaxed,
        );
        if let Some(transition) = transition {
            self.publish(&engine, &[transition]);
        }
        if passive.is_ejected() {
            self.expiry.notify_one();
        }
    }

    /// Ends the ejections that are due.
    pub fn tick(&self) {
        let now = self.now();
        let mut engine = self.lock();
        let mut transitions = Vec::new();
        engine.tick(now, &mut transitions);
        for t in &transitions {
            self.backends[t.backend]
                .watched
                .store(true, Ordering::Relaxed);
        }
        if !transitions.is_empty() {
            self.publish(&engine, &transitions);
        }
    }

    fn build_snapshot(&self, engine: &Pool) -> Snapshot {
        let up: Vec<usize> = (0..engine.len())
            .filter(|&i| engine.verdict(i) == State::Up)
            .collect();
        let (eligible, all_down) = if !up.is_empty() {
            (up, false)
        } else {
            match self.config.when_all_down {
                AllDownPolicy::FailOpen => ((0..engine.len()).collect(), true),
                AllDownPolicy::Reject { .. } => (Vec::new(), true),
            }
        };
        let weights = eligible.iter().map(|&i| self.backends[i].weight).collect();
        Snapshot::new(eligible, weights, all_down)
    }

    fn publish(&self, engine: &Pool, transitions: &[Transition]) {
        self.snapshot.store(Arc::new(self.build_snapshot(engine)));
        let time = SystemTime::now();
        for transition in transitions {
            let backend = &self.backends[transition.backend].name;
            let side = match transition.reason.side() {
                Side::Active => "active",
                Side::Passive => "passive",
            };
            let level = match transition.to {
                State::Down => tracing::Level::WARN,
                State::Up => tracing::Level::INFO,
            };
            let reason = transition.reason.to_string();
            logging::emit(
                level,
                &format!("pool={} backend={} {}", self.name, backend, transition),
                logging::Fields {
                    event: "transition",
                    pool: Some(&self.name),
                    backend: Some(backend),
                    from: Some(transition.from.as_str()),
                    to: Some(transition.to.as_str()),
                    side: Some(side),
                    reason: Some(&reason),
                    policy: None,
                },
            );
            let _ = self.events.send(Event::Transition {
                pool: self.name.clone(),
                backend: backend.clone(),
                transition: *transition,
                time,
            });
            if transition.emptied_pool() {
                self.log_all_down();
            } else if transition.refilled_pool() {
                logging::emit(
                    tracing::Level::INFO,
                    &format!(
                        "pool={} has an UP backend again ({backend}); normal balancing resumes",
                        self.name
                    ),
                    logging::Fields {
                        event: "recovered",
                        pool: Some(&self.name),
                        ..Default::default()
                    },
                );
                let _ = self.events.send(Event::Recovered {
                    pool: self.name.clone(),
                    time,
                });
            }
        }
    }

    fn log_all_down(&self) {
        let policy = self.config.when_all_down;
        let (name, sentence) = match policy {
            AllDownPolicy::FailOpen => (
                "fail_open",
                format!(
                    "pool={} has no UP backend: failing open, spreading traffic over all {} backends",
                    self.name,
                    self.backends.len()
                ),
            ),
            AllDownPolicy::Reject { .. } => (
                "reject",
                format!(
                    "pool={} has no UP backend: rejecting requests with 503",
                    self.name
                ),
            ),
        };
        logging::emit(
            tracing::Level::ERROR,
            &sentence,
            logging::Fields {
                event: "all_down",
                pool: Some(&self.name),
                policy: Some(name),
                ..Default::default()
            },
        );
        let _ = self.events.send(Event::AllDown {
            pool: self.name.clone(),
            policy,
            time: SystemTime::now(),
        });
    }

    /// Starts the pool's background work: one probe loop per backend (unless checks are off),
    /// the ejection timer, and the idle-connection reaper. Abort the handles to stop them.
    pub fn spawn_tasks(self: &Arc<Self>) -> Vec<JoinHandle<()>> {
        let mut tasks = Vec::new();
        if self.config.active.kind != CheckKind::None {
            for backend in 0..self.backends.len() {
                tasks.push(tokio::spawn(probe_loop(self.clone(), backend)));
            }
        }
        if self.config.passive.enabled {
            let pool = self.clone();
            tasks.push(tokio::spawn(async move { pool.expiry_loop().await }));
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

    async fn expiry_loop(&self) {
        loop {
            let next = self.lock().next_expiry();
            match next {
                Some(due) => {
                    let at = self.origin + due;
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
async fn probe_loop(pool: Arc<PoolRt>, backend: usize) {
    let active = &pool.config.active;
    let rt = pool.backends[backend].clone();
    let host = active.host.clone().unwrap_or_else(|| rt.address.clone());
    let mut rng = prober::Rng::from_entropy();
    tokio::time::sleep(prober::first_delay(active.interval, &mut rng)).await;
    loop {
        let outcome = prober::probe_once(
            active.kind,
            rt.upstream.addr(),
            &active.path,
            &host,
            active.timeout,
        )
        .await;
        pool.record_probe(backend, outcome);
        tokio::time::sleep(prober::jittered(active.interval, active.jitter, &mut rng)).await;
    }
}
