//! Running the checks the engine's schedule says are due: each probe and agent exchange is a
//! task of its own that exists only while it runs (no task, timer or future waits per backend
//! between checks), and hands its end to the engine of the pool's build in force.
//!
//! A membership update builds the pool anew and carries the schedule to the new build
//! ([`Lineage::carry_to`]); a check under way then ends into the new build, found through the
//! [`Lineage`] the builds share, where its backend (the same [`BackendRt`]) may sit at another
//! index. The lineage lives as long as a driver of the pool runs; once it is gone (the pool
//! stopped or replaced by a reload), the checks under way stop.
//!
//! Lock order: a pool's lock, then the lineage's; a pool's lock, then the fleet's view (the
//! schedule asks who owns a due probe under the pool's lock).

use std::collections::HashMap;
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

use capataz_health::schedule::Active;
use tokio::sync::watch;
use tokio::time::Instant;

use super::{Inner, PoolRt};
use crate::balance::BackendRt;
use crate::config::{ActiveCheckConfig, AgentCheckConfig, CheckKind};
use crate::prober;

/// What the successive builds of one pool share while membership updates carry its schedule
/// from one to the next: the build in force.
#[derive(Debug)]
pub(crate) struct Lineage {
    current: Mutex<Weak<PoolRt>>,
    /// Never sent; dropped with the lineage, which ends the checks under way.
    stop: watch::Sender<()>,
}

impl Lineage {
    pub(super) fn new(pool: &Arc<PoolRt>) -> Arc<Lineage> {
        Arc::new(Lineage {
            current: Mutex::new(Arc::downgrade(pool)),
            stop: watch::Sender::new(()),
        })
    }

    fn current(&self) -> Option<Arc<PoolRt>> {
        self.current
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .upgrade()
    }

    fn is_current(&self, pool: &PoolRt) -> bool {
        let current = self.current.lock().unwrap_or_else(|e| e.into_inner());
        std::ptr::eq(current.as_ptr(), pool)
    }

    /// Runs `end` on the build in force, under its lock, with the index there of the backend
    /// `rt` (at `hint` in the build the check started in); nothing once the pool is gone or
    /// the backend left it.
    fn with_backend(
        &self,
        rt: &Arc<BackendRt>,
        hint: usize,
        end: impl FnOnce(&PoolRt, &mut Inner, usize),
    ) {
        loop {
            let Some(pool) = self.current() else {
                return;
            };
            let mut inner = pool.lock();
            if !self.is_current(&pool) {
                // Carried to the next build meanwhile: end there.
                continue;
            }
            let index = match pool.backends.get(hint) {
                Some(at) if Arc::ptr_eq(at, rt) => hint,
                _ => match pool.backends.iter().position(|b| Arc::ptr_eq(b, rt)) {
                    Some(index) => index,
                    None => return,
                },
            };
            end(&pool, &mut inner, index);
            return;
        }
    }

    /// Makes `next` (a membership update of the build in force) the build in force, with the
    /// schedule carried over: a backend that stays (the same [`BackendRt`]) keeps its timers,
    /// a check of it under way ends into `next`; an added one starts as at a pool's start
    /// (`actives`). Under the old build's lock, so no check ends between the copy and the
    /// switch.
    pub(super) fn carry_to(&self, next: &Arc<PoolRt>, actives: &[Active]) {
        let Some(old) = self.current() else {
            next.start_schedule(fastrand::u64(..), actives);
            *self.current.lock().unwrap_or_else(|e| e.into_inner()) = Arc::downgrade(next);
            return;
        };
        let mut old_inner = old.lock();
        let kept: HashMap<*const BackendRt, usize> = old
            .backends
            .iter()
            .enumerate()
            .map(|(i, b)| (Arc::as_ptr(b), i))
            .collect();
        let now = next.clock.now();
        let mut inner = next.lock();
        let mut schedule = old_inner.schedule.successor();
        for (i, rt) in next.backends.iter().enumerate() {
            match kept
                .get(&Arc::as_ptr(rt))
                .and_then(|&j| old_inner.schedule.timers(j))
            {
                Some(timers) => schedule.push_kept(timers),
                None => schedule.push(actives[i], inner.engine.cadence(i), now),
            }
        }
        inner.schedule = schedule;
        // The old build's driver, aborted, may still be in its last turn: it finds nothing due.
        old_inner.schedule = old_inner.schedule.successor();
        *self.current.lock().unwrap_or_else(|e| e.into_inner()) = Arc::downgrade(next);
    }
}

/// How a pool probes, read once from its configuration by its driver: what each probe's task
/// needs beside its backend.
#[derive(Debug)]
pub(super) struct ProbePlan {
    active: ActiveCheckConfig,
    /// An HTTP/2 pool's http probe, and every gRPC health check, speak HTTP/2.
    over_h2: bool,
    /// The probe has a configured request or content rules (more than the plain status line).
    checked: bool,
    agent: Option<AgentCheckConfig>,
}

impl ProbePlan {
    pub(super) fn of(pool: &PoolRt) -> Arc<ProbePlan> {
        let active = pool.config.active.clone();
        let over_h2 = pool.config.protocol.is_h2() && active.kind == CheckKind::Http
            || active.kind == CheckKind::Grpc;
        let checked = !over_h2 && active.kind == CheckKind::Http && !active.is_plain();
        Arc::new(ProbePlan {
            active,
            over_h2,
            checked,
            agent: pool.config.agent,
        })
    }

    /// One probe of `rt`. Each kind's future is boxed for the probe's length: with its TLS and
    /// HTTP/2 states it is up to about 10 KB, and the task holding it should be no larger
    /// than its kind needs.
    async fn probe(&self, rt: &BackendRt) -> capataz_health::ProbeOutcome {
        let active = &self.active;
        if let Some(path) = rt.upstream.unix_path() {
            return self.probe_unix(rt, path).await;
        }
        let host = active.host.as_deref().unwrap_or(&rt.address);
        let (addr, tls) = (rt.upstream.addr(), rt.upstream.tls());
        if self.over_h2 {
            let probe = prober::H2Probe::new(active, host, tls.is_some());
            return Box::pin(prober::probe_h2(&probe, addr, active.timeout, tls)).await;
        }
        // The PROXY protocol header of a pool that sends one: a probe carries no client.
        let preamble = rt
            .upstream
            .proxy_protocol()
            .map(capataz_proxy_protocol::encode_local)
            .unwrap_or_default();
        if let (CheckKind::Tcp, Some(exchange)) = (active.kind, &active.tcp_exchange) {
            let probe = prober::probe_tcp_exchange(addr, active.timeout, &preamble, exchange, tls);
            return Box::pin(probe).await;
        }
        if self.checked {
            let probe = prober::HttpProbe::new(active, host);
            let timeout = active.timeout;
            return Box::pin(prober::probe_checked_sending(
                &probe, addr, timeout, tls, &preamble,
            ))
            .await;
        }
        // The plain probe (status line only, the benchmarked cost).
        Box::pin(prober::probe_once_sending(
            active.kind,
            addr,
            &active.path,
            host,
            active.timeout,
            tls,
            &preamble,
        ))
        .await
    }
}

impl ProbePlan {
    /// One probe of `rt`, a Unix socket backend at `path` (`prober::probe_unix`).
    async fn probe_unix(
        &self,
        rt: &BackendRt,
        path: &std::path::Path,
    ) -> capataz_health::ProbeOutcome {
        let active = &self.active;
        let probe = prober::UnixProbe {
            active,
            host: active.host.as_deref().unwrap_or(prober::UNIX_PROBE_HOST),
            over_h2: self.over_h2,
            checked: self.checked,
        };
        let preamble = rt
            .upstream
            .proxy_protocol()
            .map(capataz_proxy_protocol::encode_local)
            .unwrap_or_default();
        Box::pin(prober::probe_unix(probe, path, &preamble)).await
    }
}

/// Starts a probe of `pool`'s backend `backend`; its end goes to the build in force then.
pub(super) fn start_probe(
    pool: &PoolRt,
    lineage: &Arc<Lineage>,
    plan: &Arc<ProbePlan>,
    backend: usize,
) {
    let rt = pool.backends[backend].clone();
    let plan = plan.clone();
    let weak = Arc::downgrade(lineage);
    let mut stop = lineage.stop.subscribe();
    tokio::spawn(async move {
        let started = Instant::now();
        let outcome = tokio::select! {
            outcome = plan.probe(&rt) => outcome,
            _ = stop.changed() => return,
        };
        let latency = started.elapsed();
        if let Some(lineage) = weak.upgrade() {
            lineage.with_backend(&rt, backend, |pool, inner, index| {
                pool.finish_probe(inner, index, outcome, latency);
            });
        }
    });
}

/// Starts an exchange with the agent of `pool`'s backend `backend`; its end goes to the build
/// in force then.
pub(super) fn start_agent(pool: &PoolRt, lineage: &Arc<Lineage>, plan: &ProbePlan, backend: usize) {
    let Some(agent) = plan.agent else {
        return;
    };
    let rt = pool.backends[backend].clone();
    let port = pool.config.backends[backend]
        .agent_port
        .unwrap_or(agent.port);
    let mut addr = rt.upstream.addr();
    addr.set_port(port);
    let weak = Arc::downgrade(lineage);
    let mut stop = lineage.stop.subscribe();
    tokio::spawn(async move {
        let report = tokio::select! {
            report = prober::agent_once(addr, agent.timeout) => report,
            _ = stop.changed() => return,
        };
        if let Some(lineage) = weak.upgrade() {
            lineage.with_backend(&rt, backend, |pool, inner, index| {
                pool.finish_agent(inner, index, report);
            });
        }
    });
}

/// The backends a pool's backends track, by index: `pools` are the pools in force (this one
/// among them). A tracked backend that is not running (only a pool started on its own, in
/// tests, can miss one) is said once, and its tracker's active side stays as it is.
pub(super) type Tracks = HashMap<usize, (Arc<PoolRt>, usize)>;

/// What checks each of `pool`'s backends' active side, and the targets of those that track
/// another among `pools`.
pub(super) fn actives(pool: &PoolRt, pools: &[Arc<PoolRt>]) -> (Vec<Active>, Tracks) {
    let mut tracks = Tracks::new();
    let actives = pool
        .config
        .backends
        .iter()
        .enumerate()
        .map(|(backend, config)| {
            let Some(track) = &config.track else {
                return match pool.config.active.kind {
                    CheckKind::None => Active::None,
                    CheckKind::Http | CheckKind::Tcp | CheckKind::Grpc => Active::Probe,
                };
            };
            let target = pools.iter().find(|p| *p.name == *track.pool).and_then(|p| {
                let index = p.backends.iter().position(|b| *b.name == *track.backend)?;
                Some((p.clone(), index))
            });
            match target {
                Some(target) => {
                    tracks.insert(backend, target);
                    Active::Track
                }
                None => {
                    tracing::warn!(
                        pool = %pool.name,
                        backend = %pool.backends[backend].name,
                        "the tracked backend {}/{} is not running; this backend's active side stays as it is",
                        track.pool,
                        track.backend
                    );
                    Active::None
                }
            }
        })
        .collect();
    (actives, tracks)
}

/// The earlier of two deadlines, either of which may be missing.
pub(super) fn earliest(a: Option<Duration>, b: Option<Duration>) -> Option<Duration> {
    match (a, b) {
        (Some(a), Some(b)) => Some(a.min(b)),
        (a, b) => a.or(b),
    }
}
