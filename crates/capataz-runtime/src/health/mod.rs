//! The health runtime: one pure engine per pool, fed by probes, by relayed traffic, by operators
//! and by its own timer, and the snapshots, events and status it publishes.
//!
//! Every decision is the engine's (`capataz_health::Rotation`: verdicts, overrides with expiry,
//! slow start, the all-down policy and its fail-open set). This module only feeds it inputs
//! with the time, and `publish` turns what comes out into a new `Snapshot` (stored in the
//! [`PoolHandle`]), log lines and broadcast [`Notice`]s; `driver` runs the pool's one timer,
//! which starts the checks the engine's schedule says are due (`checks`).
//!
//! The engine sits behind a mutex, with the per-backend records the admin API shows (recent
//! probes, last transition); the mutex is held for a few instructions and never across an
//! await. The request path never takes it for healthy traffic, and never sees this module: it
//! holds the pool's [`PoolHandle`], reads its lock-free snapshot, records the outcome in a
//! lock-free ring, and a good response from a backend with a clean passive record skips the
//! engine with one atomic load (`watched`, the engine's `needs_traffic` as of its last
//! change); anything else reaches [`PoolRt`] as the handle's [`TrafficSink`].

mod backend;
mod checks;
mod driver;
mod probes;
mod publish;
mod records;
mod source_record;
#[cfg(test)]
mod tests;
mod view;

use std::collections::HashMap;
use std::num::NonZeroU32;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, Weak};
use std::time::{Duration, SystemTime};

use capataz_health::schedule::Timing as CheckTiming;
use capataz_health::{
    AgentReport, AgentState, BackendHealth, Cadence, Carried, EjectionPolicy, Join,
    LatencyOutliers, LatencyWindow, LoadShedding, Outcome, Policy, ProbeIntervals, ProbeOutcome,
    ProbeRule, Role, Rotation, Schedule, Settings, State, SuccessRate, SuccessWindow, TrafficRule,
    WhenAllDown,
};
use tokio::sync::{broadcast, Notify};

pub use crate::balance::{BackendRt, LatencyBuckets, OutcomeCounts, TrafficRing, HISTORY};
use crate::balance::{PoolHandle, TrafficSink};
use crate::config::{AllDownPolicy, BackendProtocol, CheckKind, PoolConfig};
pub use crate::events::{Notice, OverrideKind};
use crate::instruments::Families;
use crate::tls::backend::{
    client_config, server_name, without_resumption, Alpn, ClientSettings, Connector,
};
use crate::upstream::Upstream;
pub use backend::Clock;
pub(crate) use driver::PoolTasks;
pub use source_record::{SourceRecord, SourceState};
pub use view::BackendView;
pub(crate) use view::ProbeRecord;

/// The rustls client configuration of a pool that speaks TLS to its backends, built once per
/// pool from the material its config loaded. The config loader checked the client key, so
/// this fails only if rustls and the loader disagree: the pool then goes without the client
/// certificate, said loudly.
fn tls_config(config: &PoolConfig) -> Option<Arc<rustls::ClientConfig>> {
    let tls = config.tls.as_ref()?;
    let alpn = match config.protocol {
        BackendProtocol::H2 => Alpn::H2,
        BackendProtocol::Http1 | BackendProtocol::H2c => Alpn::Http11,
        // A byte stream: capataz does not know its protocol, and offers none.
        BackendProtocol::Tcp => Alpn::NotOffered,
    };
    let identity = tls
        .identity
        .as_deref()
        .map(|id| (id.chain.as_slice(), &id.key));
    let settings = ClientSettings {
        roots: &tls.roots,
        verify: tls.verify,
        identity,
        alpn,
    };
    match client_config(settings) {
        Ok(built) => Some(built),
        Err(error) => {
            tracing::error!(pool = %config.name, %error, "the client certificate cannot be used; connecting without it");
            client_config(ClientSettings {
                identity: None,
                ..settings
            })
            .ok()
        }
    }
}

/// `upstream` speaking `protocol`.
fn speaking(upstream: Upstream, protocol: BackendProtocol) -> Upstream {
    match protocol {
        BackendProtocol::Http1 | BackendProtocol::Tcp => upstream,
        BackendProtocol::H2 | BackendProtocol::H2c => upstream.with_h2(),
    }
}

/// `upstream` with a TLS handshake to the backend at `address` (as written) when the pool
/// speaks TLS.
fn with_tls(
    upstream: Upstream,
    tls: Option<&PoolTls>,
    config: &PoolConfig,
    address: &str,
) -> Upstream {
    let (Some(built), Some(settings)) = (tls, config.tls.as_ref()) else {
        return upstream;
    };
    // The config loader accepted the address, so it has a host part; without one the backend
    // is still reached over TLS, verified against its IP address.
    let name = server_name(settings.server_name.as_deref(), address)
        .unwrap_or_else(|| upstream.addr().ip().into());
    let connector = Connector::new(built.traffic.clone(), built.probes.clone(), name);
    upstream.with_tls(connector)
}

/// A TLS pool's rustls client configurations: the traffic's, and the probes' (the same
/// without session resumption).
struct PoolTls {
    traffic: Arc<rustls::ClientConfig>,
    probes: Arc<rustls::ClientConfig>,
}

impl PoolTls {
    fn of(config: &PoolConfig) -> Option<PoolTls> {
        let traffic = tls_config(config)?;
        let probes = without_resumption(&traffic);
        Some(PoolTls { traffic, probes })
    }
}

/// The engine settings a pool's configuration asks for.
pub fn engine_settings(config: &PoolConfig) -> Settings {
    let initial = match config.active.kind {
        // Nothing would ever bring a DOWN active side back without probes.
        CheckKind::None => State::Up,
        CheckKind::Http | CheckKind::Tcp | CheckKind::Grpc => config.active.initial,
    };
    Settings {
        rise: config.active.rise,
        fall: config.active.fall,
        consecutive_errors: config.passive.consecutive_errors,
        initial,
        first_probe: config.active.first_probe && config.active.kind != CheckKind::None,
        probe_rule: ProbeRule {
            expect: config.active.expect,
        },
        traffic_rule: TrafficRule {
            count_503: config.passive.count_503,
            grpc_errors: config.passive.grpc_error_codes,
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
        latency_outliers: config
            .passive
            .latency_outliers
            .filter(|_| config.passive.enabled)
            .map(|l| LatencyOutliers {
                percentile: l.percentile,
                factor: l.factor,
                windows: l.windows,
                min_requests: l.min_requests,
                min_latency: l.min_latency,
            }),
        success_rate: config
            .passive
            .success_rate
            .filter(|_| config.passive.enabled)
            .map(|r| SuccessRate {
                min_requests: r.min_requests,
                min_backends: r.min_backends,
                stdev_factor_milli: r.stdev_factor_milli,
            }),
    }
}

/// How often a pool's configuration checks its backends: the probe intervals, the jitter and
/// the agent's interval.
pub(crate) fn check_timing(config: &PoolConfig) -> CheckTiming {
    CheckTiming {
        intervals: probe_intervals(config),
        jitter: config.active.jitter,
        agent: config.agent.map(|agent| agent.interval),
    }
}

/// The probe intervals a pool's configuration asks for, by [`Cadence`].
pub(crate) fn probe_intervals(config: &PoolConfig) -> ProbeIntervals {
    ProbeIntervals {
        steady: config.active.interval,
        fast: config.active.fast_interval,
        down: config.active.down_interval,
    }
}

/// The pool-level policy a pool's configuration asks for.
pub fn engine_policy(config: &PoolConfig) -> Policy {
    let probed = config.active.kind != CheckKind::None;
    Policy {
        when_all_down: match config.when_all_down {
            AllDownPolicy::FailOpen => WhenAllDown::FailOpen,
            AllDownPolicy::Reject { .. } => WhenAllDown::Reject,
        },
        slow_start: config.slow_start,
        backups: config.backups,
        min_healthy: config.min_healthy,
        disable_on_404: config.active.disable_on_404 && config.active.kind == CheckKind::Http,
        // Without probes nothing could requalify a backend: it comes back at once.
        requalify_passes: match (probed, config.active.rise_after_maintenance) {
            (false, _) => Some(0),
            (true, passes) => passes.map(NonZeroU32::get),
        },
        close_tunnels_on_down: config.close_tunnels_on_down,
        load_shedding: config
            .passive
            .load_shedding
            .filter(|_| config.passive.enabled)
            .map(|l| LoadShedding {
                weight_percent: l.weight_percent,
                max: l.max_retry_after,
                default_relief: l.default_retry_after,
            }),
    }
}

/// What each backend of `config` carries over from the same backend (by name and address) of
/// `previous`: its index there, its engine state and its records (moved out of `previous`
/// when `share`, a membership update retiring it; copied otherwise).
///
/// The old pool's lock is held only to copy what kept backends carry over, not while the new
/// backends are built (their connections and metric handles): its probes and traffic, and the
/// admin API reading it, wait on that lock, on runtime threads.
fn carried_over(
    config: &PoolConfig,
    previous: Option<&PoolRt>,
    share: bool,
) -> Vec<Option<(usize, Carried, Records)>> {
    let Some(p) = previous else {
        return config.backends.iter().map(|_| None).collect();
    };
    // The old pool's backends by name and address: one lookup per backend, so a pool of
    // thousands rebuilds in linear time.
    let old_index: HashMap<BackendKey<'_>, usize> = p
        .backends
        .iter()
        .enumerate()
        .map(|(i, old)| (BackendKey::new(&old.name, &old.address), i))
        .collect();
    let mut inner = p.lock();
    config
        .backends
        .iter()
        .map(|b| {
            let i = *old_index.get(&BackendKey::new(&b.name, &b.address))?;
            let record = if share {
                // A membership update retires the old build: its probe history moves instead
                // of being copied (megabytes at 5,000 backends, each update, which the
                // allocator's per-thread arenas kept).
                inner.info[i].take()
            } else {
                inner.info[i].clone()
            };
            Some((i, inner.engine.carry(i), record))
        })
        .collect()
}

/// A new runtime for backend `b` of the pool `config` configures; `old` is the same backend
/// in the pool's previous build, whose latency totals and tunnels' signal it keeps.
fn new_backend(
    config: &PoolConfig,
    b: &crate::config::BackendConfig,
    tls: Option<&PoolTls>,
    metrics: &crate::instruments::PoolMetrics,
    old: Option<&BackendRt>,
) -> BackendRt {
    // One copy of the name, which the metrics' counters are keyed by too.
    let name: Arc<str> = b.name.as_str().into();
    let upstream = Upstream::new(b.socket_addr, config.timeouts.connect, config.timeouts.idle)
        .with_unix(b.unix_path())
        .with_proxy_protocol(config.send_proxy_protocol);
    let passive = &config.passive;
    BackendRt {
        metrics: metrics.backend(&name),
        name,
        address: b.address.clone(),
        weight: b.weight,
        upstream: speaking(with_tls(upstream, tls, config, &b.address), config.protocol),
        in_flight: AtomicUsize::new(0),
        traffic: TrafficRing::default(),
        watched: AtomicBool::new(false),
        latency: (passive.enabled && passive.latency_outliers.is_some()).then(Box::default),
        outcomes: (passive.enabled && passive.success_rate.is_some()).then(OutcomeCounts::default),
        latency_totals: old.map_or_else(Arc::default, |old| old.latency_totals.clone()),
        // A kept backend keeps its tunnels' signal: a tunnel opened before a reload is still
        // closed by a DOWN after it.
        tunnels: match old.and_then(|old| old.tunnels.clone()) {
            Some(tunnels) => Some(tunnels),
            None => config
                .close_tunnels_on_down
                .then(|| Arc::new(tokio::sync::watch::Sender::new(0))),
        },
        ewma: (config.algorithm == crate::config::Algorithm::PeakEwma).then(Box::default),
    }
}

/// What the runtime remembers of one backend beside its engine state (the engine keeps its
/// last transition and since when its verdict holds).
#[derive(Clone, Debug)]
struct Records {
    pub(super) probes: records::ProbeRing,
    /// When the backend joined the pool (kept while it stays, across reloads and updates).
    pub(super) joined: SystemTime,
}

impl Records {
    fn new(joined: SystemTime) -> Records {
        Records {
            probes: records::ProbeRing::default(),
            joined,
        }
    }

    /// A copy that takes the probe history, leaving this record without it.
    fn take(&mut self) -> Records {
        Records {
            probes: std::mem::take(&mut self.probes),
            joined: self.joined,
        }
    }
}

/// What makes a backend the same one across a reload: its name and its address.
#[derive(Debug, Hash)]
struct BackendKey<'a> {
    name: &'a str,
    address: &'a str,
}

impl<'a> BackendKey<'a> {
    fn new(name: &'a str, address: &'a str) -> BackendKey<'a> {
        BackendKey { name, address }
    }
}

impl PartialEq for BackendKey<'_> {
    fn eq(&self, other: &Self) -> bool {
        #[cfg(test)]
        tests::KEY_COMPARISONS.with(|n| n.set(n.get() + 1));
        self.name == other.name && self.address == other.address
    }
}

impl Eq for BackendKey<'_> {}

/// The engine (the rotation and its check schedule) and the per-backend records, under one
/// lock.
#[derive(Debug)]
struct Inner {
    engine: Rotation,
    /// When each backend is checked: empty until the pool's driver starts (`driver.rs`).
    schedule: Schedule,
    info: Vec<Records>,
    /// The engine time of the rotation's next timeout as the driver knows it (`None`: none).
    /// Set by the driver when it reads `poll_timeout`, and by `publish` when it wakes it earlier.
    armed: Option<Duration>,
    /// The engine time the handle's snapshot was last built at (from `eligible`): the
    /// standings reported are asked at this time, so their weights are the picker's.
    published: Duration,
    /// The schedule's next due time the driver sleeps until (`None`: none); a check that ends
    /// and schedules an earlier one wakes it.
    wake: Option<Duration>,
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

/// One pool at run time: the request path's [`PoolHandle`] (backends, snapshot, cursor,
/// budget), and the health runtime around it: the engine and the records under one lock, the
/// event broadcast, the clock and the timer.
///
/// It dereferences to its handle, so what the request path reads (`name`, `config`,
/// `backends`, `snapshot()`) reads the same here.
#[derive(Debug)]
pub struct PoolRt {
    handle: Arc<PoolHandle>,
    inner: Mutex<Inner>,
    events: broadcast::Sender<Notice>,
    clock: Clock,
    /// Wakes the timer when the engine's next timeout may have moved earlier.
    timer: Notify,
    /// What the pool's backend source last did, shared with the pool's earlier and later
    /// builds.
    pub source_record: Arc<SourceRecord>,
    /// Who probes which backend when instances share the probing (`[fleet]`), shared with the
    /// pool's earlier and later builds; empty: this instance probes every backend.
    pub probing: Arc<ProbingSlot>,
}

/// Whether this instance probes a backend (shared probing): asked for each due probe, under
/// the pool's lock, and handed to the engine's schedule. Implemented by the fleet runtime,
/// which `health` does not know.
pub trait ProbeOwnership: Send + Sync + std::fmt::Debug {
    /// Whether this instance probes the backend at `address` of pool `pool`.
    fn owns(&self, pool: &str, address: &str) -> bool;
}

/// Where a pool finds its [`ProbeOwnership`]: set once (by the balancer, when it has a fleet
/// runtime), kept by every later build of the pool.
pub(crate) type ProbingSlot = std::sync::OnceLock<Arc<dyn ProbeOwnership>>;

impl PoolRt {
    /// A pool for `config`. Backends that `previous` (the same pool before a reload) has with
    /// the same name and address keep their health, streaks, override, slow start and records,
    /// and whether they were ever proven healthy; other backends start in the configured
    /// initial state, or DOWN when `gate_new` (readiness gating after a reload). Events go to
    /// `events`; metric handles come from `families` (the balancer's), so a pool rebuilt from
    /// the same families continues its series.
    pub fn new(
        config: PoolConfig,
        events: broadcast::Sender<Notice>,
        clock: Clock,
        previous: Option<&PoolRt>,
        gate_new: bool,
        families: &Families,
    ) -> Arc<PoolRt> {
        PoolRt::build(config, events, clock, previous, gate_new, families, false)
    }

    /// The same pool as `self` with the backends `members` (a membership update of a pool
    /// whose backends come from a source: the configuration is otherwise the same). As
    /// [`PoolRt::new`] from `self`, except that a kept backend (same name, address and weight)
    /// is the very same [`BackendRt`] (its connections, in-flight count, traffic and probe
    /// schedule), so its tasks go on ([`PoolTasks::carry`]) and only the added backends are
    /// built: the cost follows the change, beside a copy of the pool's small per-backend state.
    pub(crate) fn with_members(
        &self,
        members: Vec<crate::config::BackendConfig>,
        gate_new: bool,
        families: &Families,
    ) -> Arc<PoolRt> {
        let config = PoolConfig {
            backends: members,
            ..self.config.clone()
        };
        PoolRt::build(
            config,
            self.events.clone(),
            self.clock,
            Some(self),
            gate_new,
            families,
            true,
        )
    }

    /// [`PoolRt::new`]; with `share`, kept backends of the same weight share `previous`'s
    /// [`BackendRt`] instead of getting a new one.
    fn build(
        config: PoolConfig,
        events: broadcast::Sender<Notice>,
        clock: Clock,
        previous: Option<&PoolRt>,
        gate_new: bool,
        families: &Families,
        share: bool,
    ) -> Arc<PoolRt> {
        let settings = engine_settings(&config);
        let metrics = families.pool(&config.name);
        let now = clock.now();
        let wall = clock.wall(now);
        let carried = carried_over(&config, previous, share);
        let source_record = previous.map_or_else(Default::default, |p| p.source_record.clone());
        let probing = previous.map_or_else(Default::default, |p| p.probing.clone());
        let tls = PoolTls::of(&config);
        let mut joins = Vec::with_capacity(config.backends.len());
        let mut info = Vec::with_capacity(config.backends.len());
        let mut backends = Vec::with_capacity(config.backends.len());
        for (b, kept) in config.backends.iter().zip(carried) {
            let role = if b.backup {
                Role::Backup
            } else {
                Role::Primary
            };
            // A membership update keeps a staying backend's runtime whole.
            let same = match (&kept, previous) {
                (Some((i, ..)), Some(p)) if share && p.backends[*i].weight == b.weight => {
                    Some(p.backends[*i].clone())
                }
                _ => None,
            };
            let kept = match (same, kept) {
                (Some(rt), Some((_, carried, record))) => {
                    joins.push((b.weight, Join::Kept(carried), role));
                    info.push(record);
                    backends.push(rt);
                    continue;
                }
                (_, kept) => kept,
            };
            #[cfg(test)]
            if let Some(p) = previous {
                tests::note_build_beside_old_pool(p.inner.try_lock().is_err());
            }
            let old = match (&kept, previous) {
                (Some((i, ..)), Some(p)) => Some(&*p.backends[*i]),
                _ => None,
            };
            let rt = new_backend(&config, b, tls.as_ref(), &metrics, old);
            match (kept, previous) {
                (Some((i, carried, record)), Some(p)) => {
                    joins.push((b.weight, Join::Kept(carried), role));
                    for outcome in p.backends[i].traffic.recent() {
                        rt.traffic.push(outcome);
                    }
                    info.push(record);
                }
                _ => {
                    let initial = if gate_new && config.active.kind != CheckKind::None {
                        State::Down
                    } else {
                        settings.initial
                    };
                    // Added by a reload straight into rotation: it still warms up.
                    let warm_up = previous.is_some();
                    joins.push((b.weight, Join::New { initial, warm_up }, role));
                    info.push(Records::new(wall));
                }
            }
            backends.push(Arc::new(rt));
        }
        let mut engine = Rotation::with_roles(settings, engine_policy(&config), joins, now);
        for (i, b) in config.backends.iter().enumerate() {
            engine.set_tracks(i, b.track.is_some());
        }
        let schedule = Schedule::new(check_timing(&config), 0);
        // A kept backend may carry an error streak, an ejection or a probation: its traffic
        // must reach the engine from the first response.
        for (i, rt) in backends.iter().enumerate() {
            rt.watched.store(engine.needs_traffic(i), Ordering::Relaxed);
        }
        let pool = Arc::new_cyclic(|me: &Weak<PoolRt>| {
            let sink: Weak<dyn TrafficSink> = me.clone();
            PoolRt {
                handle: Arc::new(PoolHandle::new(
                    config,
                    backends,
                    metrics,
                    (settings.traffic_rule, engine.policy().load_shedding),
                    sink,
                )),
                inner: Mutex::new(Inner {
                    engine,
                    schedule,
                    info,
                    armed: None,
                    published: now,
                    wake: None,
                }),
                events,
                clock,
                timer: Notify::new(),
                source_record,
                probing,
            }
        });
        let mut inner = pool.lock();
        pool.publish(&mut inner, now, true);
        drop(inner);
        pool
    }

    fn lock(&self) -> MutexGuard<'_, Inner> {
        // The engine holds no invariant a panicking holder could break half-way (it never
        // panics on valid indexes), so a poisoned lock is still usable.
        crate::lockstat::lock(&self.inner, crate::lockstat::Site::Engine)
    }

    /// The runtime clock.
    pub fn clock(&self) -> Clock {
        self.clock
    }

    /// The request path's side of the pool.
    pub fn handle(&self) -> &Arc<PoolHandle> {
        &self.handle
    }

    /// A copy of every backend's health, in pool order.
    pub fn health(&self) -> Vec<BackendHealth> {
        self.lock().engine.pool().backends().to_vec()
    }

    /// One backend's verdict.
    pub fn verdict(&self, backend: usize) -> State {
        self.lock().engine.pool().verdict(backend)
    }

    /// Whether the engine wants `backend` probed now (not while it is in maintenance).
    pub fn wants_probes(&self, backend: usize) -> bool {
        self.lock().engine.wants_probes(backend)
    }

    /// Passing probes in a row a backend needs after maintenance before traffic (0: none).
    pub fn requalify_passes(&self) -> u32 {
        self.lock().engine.requalify_passes()
    }

    /// Feeds one probe outcome to the engine, and says which probe interval applies to the
    /// backend next (the engine's [`Cadence`]). What the probe came to reaches the tap, the
    /// metrics, the probe history and the traces from the engine's output (`publish`).
    pub fn record_probe(
        &self,
        backend: usize,
        outcome: impl Into<ProbeOutcome>,
        latency: Duration,
    ) -> Cadence {
        let mut inner = self.lock();
        self.finish_probe(&mut inner, backend, outcome.into(), latency);
        inner.engine.cadence(backend)
    }

    /// Hands the engine how `backend`'s probe ended (its schedule takes the next one from
    /// there when the driver started it), publishes, and wakes the driver if the next check
    /// is now due earlier than it sleeps.
    fn finish_probe(
        &self,
        inner: &mut Inner,
        backend: usize,
        outcome: ProbeOutcome,
        latency: Duration,
    ) {
        let now = self.clock.now();
        let Inner {
            engine, schedule, ..
        } = inner;
        schedule.handle_probe(engine, backend, outcome, latency, now);
        self.publish(inner, now, false);
        self.wake_for_schedule(inner);
    }

    /// Wakes the driver if the schedule's next due time is earlier than the one it sleeps
    /// until.
    fn wake_for_schedule(&self, inner: &mut Inner) {
        let due = inner.schedule.poll_timeout();
        if due.is_some_and(|due| inner.wake.is_none_or(|wake| due < wake)) {
            inner.wake = due;
            self.timer.notify_one();
        }
    }

    /// When `backend` is next probed, on the engine clock (while a probe is under way: when it
    /// was due); `None` when it is not probed (no checks, `track`, or the pool's driver not
    /// started).
    pub fn next_probe(&self, backend: usize) -> Option<Duration> {
        self.lock().schedule.next_probe(backend)
    }

    /// Per backend, in pool order, under one lock: the load-shedding relief it has left (zero
    /// when it sheds nothing) and its latency windows judged slow in a row.
    pub(crate) fn gray_state(&self) -> Vec<(Duration, u32)> {
        let now = self.clock.now();
        let inner = self.lock();
        (0..self.backends.len())
            .map(|i| {
                let left = inner
                    .engine
                    .shed(i)
                    .map_or(Duration::ZERO, |shed| shed.until.saturating_sub(now));
                let slow = inner.engine.pool().backend(i).passive.slow_windows;
                (left, slow)
            })
            .collect()
    }

    /// The active state of backend `index` (which must exist).
    pub(crate) fn active_state(&self, index: usize) -> State {
        self.lock().engine.pool().backend(index).active.state
    }

    /// Whether this instance probes `backend` (always, unless shared probing gives it to
    /// other instances).
    pub(crate) fn owns_probes(&self, backend: usize) -> bool {
        match self.probing.get() {
            Some(ownership) => ownership.owns(&self.name, &self.backends[backend].address),
            None => true,
        }
    }

    /// `backend`'s active side as an owner publishes it: its state, the streak that holds it
    /// there (failures when DOWN, passes when UP) and the last probe's outcome, if any; `None`
    /// while it is no evidence yet ([`capataz_health::fleet::publishable`]).
    pub(crate) fn active_published(&self, backend: usize) -> Option<(State, u32, Option<Outcome>)> {
        let inner = self.lock();
        let active = inner.engine.pool().backend(backend).active;
        if !capataz_health::fleet::publishable(&active) {
            return None;
        }
        let last = inner.info[backend].probes.last_outcome();
        Some((active.state, active.streak(), last))
    }

    /// Feeds the active verdict another instance published for `backend` (it owns its
    /// probes) to the engine.
    pub(crate) fn record_published(&self, backend: usize, published: capataz_health::Published) {
        let now = self.clock.now();
        let mut inner = self.lock();
        inner.engine.handle_published(backend, published, now);
        self.publish(&mut inner, now, false);
    }

    /// Feeds the active state of the backend `backend` tracks to the engine.
    pub(crate) fn record_tracked(&self, backend: usize, state: State) {
        let now = self.clock.now();
        let mut inner = self.lock();
        inner.engine.handle_tracked(backend, state, now);
        self.publish(&mut inner, now, false);
    }

    /// Feeds one agent answer to the engine (a failed exchange is no input at all).
    pub fn record_agent(&self, backend: usize, report: AgentReport) {
        let mut inner = self.lock();
        self.finish_agent(&mut inner, backend, Some(report));
    }

    /// Hands the engine how `backend`'s agent exchange ended (`None`: it failed, no input),
    /// publishes, and wakes the driver for the next exchange if need be.
    fn finish_agent(&self, inner: &mut Inner, backend: usize, report: Option<AgentReport>) {
        let now = self.clock.now();
        let Inner {
            engine, schedule, ..
        } = inner;
        let answered = report.is_some();
        let state = schedule.handle_agent(engine, backend, report, now);
        if answered {
            tracing::trace!(
                pool = %self.name,
                backend = %self.backends[backend].name,
                agent = %state,
                "agent"
            );
        }
        self.publish(inner, now, false);
        self.wake_for_schedule(inner);
    }

    /// What `backend`'s agent last said (the default, `up` at 100 %, before it said anything).
    pub fn agent(&self, backend: usize) -> AgentState {
        self.lock().engine.agent(backend)
    }

    /// Every backend's [`Cadence`], in pool order, under one lock.
    pub(crate) fn cadences(&self) -> Vec<Cadence> {
        let inner = self.lock();
        (0..self.backends.len())
            .map(|i| inner.engine.cadence(i))
            .collect()
    }

    /// Which probe interval applies to `backend` now (the engine's [`Cadence`]).
    pub fn cadence(&self, backend: usize) -> Cadence {
        self.lock().engine.cadence(backend)
    }

    /// Feeds one traffic outcome to the engine (a good response from a backend with a clean
    /// passive record is skipped without taking the lock; see [`PoolHandle::observe`]).
    pub fn observe(&self, backend: usize, outcome: Outcome) {
        self.handle.observe(backend, outcome);
    }

    /// The engine's side of [`PoolRt::observe`].
    fn judge_traffic(&self, backend: usize, outcome: Outcome) {
        let rt = &self.backends[backend];
        let now = self.clock.now();
        let mut inner = self.lock();
        let was_ejected = inner.engine.pool().backend(backend).passive.is_ejected();
        inner.engine.handle_traffic(backend, outcome, now);
        rt.watched
            .store(inner.engine.needs_traffic(backend), Ordering::Relaxed);
        // A new ejection is a new timer.
        let timer = !was_ejected && inner.engine.pool().backend(backend).passive.is_ejected();
        self.publish(&mut inner, now, false);
        drop(inner);
        if timer {
            self.timer.notify_one();
        }
    }

    /// Drains every backend's latency window (see [`LatencyBuckets`]) and hands the engine the
    /// windows, which judges latency outliers; publishes what changed.
    pub(crate) fn close_latency_window(&self) {
        let windows: Vec<LatencyWindow> = self
            .backends
            .iter()
            .map(|b| {
                b.latency
                    .as_deref()
                    .map(LatencyBuckets::drain)
                    .unwrap_or_default()
            })
            .collect();
        self.judge_window(|engine, now| engine.handle_latency_window(&windows, now));
    }

    /// Drains every backend's outcome counts (see [`OutcomeCounts`]) and hands the engine the
    /// windows, which judges success-rate outliers; publishes what changed.
    pub(crate) fn close_success_window(&self) {
        let windows: Vec<SuccessWindow> = self
            .backends
            .iter()
            .map(|b| {
                b.outcomes
                    .as_ref()
                    .map(OutcomeCounts::drain)
                    .unwrap_or_default()
            })
            .collect();
        self.judge_window(|engine, now| engine.handle_success_window(&windows, now));
    }

    /// Hands the engine a closed window (`judge`, with the time), refreshes the backends'
    /// `watched` flags, publishes what changed, and wakes the timer if the window ejected a
    /// backend (its ejection ends on a timer).
    fn judge_window(&self, judge: impl FnOnce(&mut Rotation, Duration)) {
        let now = self.clock.now();
        let mut inner = self.lock();
        let ejected = inner.engine.pool().ejected();
        judge(&mut inner.engine, now);
        for (i, rt) in self.backends.iter().enumerate() {
            rt.watched
                .store(inner.engine.needs_traffic(i), Ordering::Relaxed);
        }
        let timer = inner.engine.pool().ejected() > ejected;
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
        // Time alone moves weights (slow start's steps): always rebuild, which changes
        // nothing when no weight moved.
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

impl std::ops::Deref for PoolRt {
    type Target = PoolHandle;

    fn deref(&self) -> &PoolHandle {
        &self.handle
    }
}

impl TrafficSink for PoolRt {
    fn handle_traffic(&self, pool: &PoolHandle, backend: usize, outcome: Outcome) {
        debug_assert!(std::ptr::eq(pool, &*self.handle));
        self.judge_traffic(backend, outcome);
    }

    fn handle_shed(&self, pool: &PoolHandle, backend: usize, status: u16, retry_after: Duration) {
        debug_assert!(std::ptr::eq(pool, &*self.handle));
        let now = self.clock.now();
        let mut inner = self.lock();
        let was = inner.engine.shed(backend).filter(|shed| shed.until > now);
        inner.engine.handle_shed(backend, status, retry_after, now);
        // A relief of nothing (`Retry-After: 0`) starts no shed, and needs no timer.
        let new = was.is_none()
            && inner
                .engine
                .shed(backend)
                .is_some_and(|shed| shed.until > now);
        self.publish(&mut inner, now, false);
        drop(inner);
        if new {
            // A new shed is a new timer.
            self.timer.notify_one();
        }
    }
}
