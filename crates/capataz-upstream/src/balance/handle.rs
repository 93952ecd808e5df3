//! What the request path holds of a pool ([`PoolHandle`]): the snapshot it picks from, the
//! round-robin cursor, the backends (connections, in-flight counts), the retry budget, the
//! configuration, and where traffic outcomes go.
//!
//! The health runtime (`health::PoolRt`) owns a handle and publishes snapshots into it; the
//! handle knows the runtime only as a [`TrafficSink`], held weakly, so the request path never
//! depends on the health runtime, and a pool replaced by a reload is freed even while requests
//! on it are still streaming (their later outcomes are kept in the backends' traffic rings
//! but no longer judged by an engine nobody reads).

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Weak};
use std::time::{Duration, SystemTime};

use arc_swap::{ArcSwap, Guard};
use capataz_health::rotation::ramp::full_tenths;
use capataz_health::{Eligible, LoadShedding, Outcome, TrafficResult, TrafficRule};

use super::placement::{Home, MoveReason};
use super::ring::Ring;
use super::sticky::Sticky;
use super::tap::{Recorded, Tap};
use super::{BackendRt, Limits, Snapshot};
use crate::budget::RetryBudget;
use crate::instruments::PoolMetrics;
use capataz_config::{Algorithm, PoolConfig};

/// Where traffic outcomes that need the engine go: the health runtime of the pool.
pub trait TrafficSink: Send + Sync {
    /// Judges one traffic outcome of backend `backend` of `pool` (one the fast path could not
    /// settle: an error, or a backend whose passive record is not clean).
    fn handle_traffic(&self, pool: &PoolHandle, backend: usize, outcome: Outcome);

    /// Backend `backend` of `pool` answered `status` asking for `retry_after` of relief
    /// (load shedding awareness is on).
    fn handle_shed(&self, pool: &PoolHandle, backend: usize, status: u16, retry_after: Duration);
}

/// One pool as the request path sees it.
pub struct PoolHandle {
    /// The pool's name.
    pub name: Arc<str>,
    /// Its configuration.
    pub config: PoolConfig,
    /// Its backends, in configuration order (the engine's indexes).
    pub backends: Vec<Arc<BackendRt>>,
    /// Its metric handles.
    pub metrics: PoolMetrics,
    snapshot: ArcSwap<Snapshot>,
    /// The shared round-robin cursor.
    pub cursor: AtomicUsize,
    /// The retry budget.
    pub budget: RetryBudget,
    traffic_rule: TrafficRule,
    /// The engine's load-shedding rule (`None`: shedding answers are judged as traffic).
    load_shedding: Option<LoadShedding>,
    health: Weak<dyn TrafficSink>,
    /// Where recorders listen (`GET /record/<pool>`).
    pub tap: Tap,
    /// The sticky cookie, for a pool with sticky sessions.
    pub sticky: Option<Box<Sticky>>,
    /// The backends' limits and the queue, when the pool sets limits (boxed: a pool without
    /// them carries a pointer).
    pub limits: Option<Box<Limits>>,
    /// A hashing pool's home ring: every primary backend at its configured weight, built once.
    /// A key's home is where it goes while they are all in rotation at full weight (see
    /// [`PoolHandle::key_home`]).
    home_ring: Option<Box<Ring>>,
}

impl std::fmt::Debug for PoolHandle {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PoolHandle")
            .field("name", &self.name)
            .field("backends", &self.backends)
            .field("snapshot", &self.snapshot)
            .finish_non_exhaustive()
    }
}

impl PoolHandle {
    /// A handle over `backends` for `config`, with an empty snapshot (the health runtime
    /// publishes the first one), judging answers by the engine's `rules` (its traffic rule and
    /// load-shedding rule); outcomes the fast path cannot settle go to `health`.
    pub fn new(
        config: PoolConfig,
        backends: Vec<Arc<BackendRt>>,
        metrics: PoolMetrics,
        rules: (TrafficRule, Option<LoadShedding>),
        health: Weak<dyn TrafficSink>,
    ) -> PoolHandle {
        let (traffic_rule, load_shedding) = rules;
        let sticky = config.affinity.sticky.as_ref().map(|sticky| {
            let names = backends.iter().map(|b| &*b.name);
            Box::new(Sticky::new(&config.name, names, sticky))
        });
        let limits = Limits::new(&config, &metrics).map(Box::new);
        let home_ring = (config.algorithm == Algorithm::Hash).then(|| {
            let primaries: Vec<usize> = (0..backends.len())
                .filter(|&i| !config.backends.get(i).is_some_and(|b| b.backup))
                .collect();
            let weight = |i: usize| full_tenths(backends[i].weight);
            Box::new(Ring::build(&primaries, weight, |i| &backends[i].name))
        });
        PoolHandle {
            sticky,
            limits,
            home_ring,
            name: config.name.as_str().into(),
            budget: RetryBudget::new(config.retries.budget_percent, config.retries.min_budget),
            snapshot: ArcSwap::from_pointee(Snapshot::new(Vec::new(), Vec::new(), false)),
            cursor: AtomicUsize::new(0),
            metrics,
            backends,
            config,
            traffic_rule,
            load_shedding,
            health,
            tap: Tap::default(),
        }
    }

    /// How a request of a hashing pool whose key hashes to `key`, given `picked` from
    /// `snapshot`, stands to the key's home (the owner of its point on the home ring): kept
    /// there, or moved because the home is out of rotation, draining, holds less or more of
    /// the ring than at its configured weight (`weight`: slow start, load shedding, an agent),
    /// or is over its bounded load. One binary search when `picked` is the home.
    pub fn key_home(&self, snapshot: &Snapshot, key: u64, picked: Option<usize>) -> Home {
        let home = self
            .home_ring
            .as_ref()
            .and_then(|ring| ring.pick(key, &[], |_| false));
        let mut placed = Home::hashed(home);
        if let Some(home) = home.filter(|&h| picked != Some(h)) {
            placed.moving(if !snapshot.serves(home) {
                match snapshot.drains(home) {
                    true => MoveReason::Draining,
                    false => MoveReason::OutOfRotation,
                }
            } else if snapshot.owner_of_key(key) != Some(home) {
                MoveReason::Weight
            } else {
                MoveReason::BoundedLoad
            });
        }
        placed
    }

    /// The eligible backends as of the last change; no lock taken.
    #[inline]
    pub fn snapshot(&self) -> Guard<Arc<Snapshot>> {
        self.snapshot.load()
    }

    /// Replaces the snapshot with one built from what the engine decided, unless the current
    /// one says the same already (the health runtime's publishing; a rebuild that would change
    /// nothing costs no schedule). A hashing pool's snapshot gets its ring (see
    /// [`super::ring`]); in a peak EWMA pool, a backend back in rotation starts unsampled.
    pub fn publish(&self, eligible: Eligible) {
        let current = self.snapshot.load();
        if !current.says(&eligible) {
            if self.config.algorithm == Algorithm::PeakEwma {
                current.reset_returning(&eligible.backends, |b| {
                    if let Some(ewma) = self.backends.get(b).and_then(|rt| rt.ewma.as_ref()) {
                        ewma.reset();
                    }
                });
            }
            let mut snapshot = Snapshot::of(eligible);
            if self.config.algorithm == Algorithm::Hash {
                snapshot = snapshot.with_ring(|i| self.backends.get(i).map_or("", |b| &b.name));
            }
            self.snapshot.store(Arc::new(snapshot));
            if let Some(limits) = &self.limits {
                limits.republished(self);
            }
        }
    }

    /// The index of the backend named `name`.
    pub fn index_of(&self, name: &str) -> Option<usize> {
        self.backends.iter().position(|b| &*b.name == name)
    }

    /// With load shedding awareness on, whether an answer with `status` and `headers` asks
    /// the backend's weight down instead of being judged, and for how long: the engine's rule
    /// ([`LoadShedding::relief`]) on the `Retry-After` read here. Called for every answer head:
    /// two comparisons unless it is a 429 or a 503.
    #[inline]
    pub fn shed_request(&self, status: u16, headers: &http::HeaderMap) -> Option<Duration> {
        if !LoadShedding::may_ask(status) {
            return None;
        }
        let shedding = self.load_shedding?;
        let asked = headers
            .get(http::header::RETRY_AFTER)
            .and_then(|value| parse_retry_after(value.as_bytes(), SystemTime::now()));
        shedding.relief(status, asked)
    }

    /// Records that backend `backend` answered `status` asking for `retry_after` of relief (see
    /// [`PoolHandle::shed_request`]): in its traffic ring, and for the engine, which reduces
    /// its weight instead of judging the answer.
    pub fn shed(&self, backend: usize, status: u16, retry_after: Duration, latency: Duration) {
        self.backends[backend].traffic.push(Outcome::Status(status));
        self.tap.record(
            backend,
            Recorded::Shed {
                status,
                latency,
                relief: retry_after,
            },
        );
        if let Some(health) = self.health.upgrade() {
            health.handle_shed(self, backend, status, retry_after);
        }
    }

    /// Records one traffic outcome of backend `backend`: in its ring always, and for the
    /// engine unless it is a good response from a backend with a clean passive record (one
    /// atomic load, no lock) or passive checks are off.
    pub fn observe(&self, backend: usize, outcome: Outcome) {
        self.observe_answered(backend, outcome, None);
    }

    /// Feeds a failed attempt (a request's or a TCP session's connect) on backend `index` to
    /// the passive side if it was the backend's fault; a failure that was the client's (or
    /// capataz's own, such as no local socket) is only logged, at debug.
    pub fn charge(&self, index: usize, error: crate::upstream::AttemptError) {
        let backend = &self.backends[index];
        match error.outcome() {
            Some(outcome) => {
                self.observe(index, outcome);
                backend.metrics.unanswered();
            }
            None => tracing::debug!(
                pool = %self.name,
                backend = %backend.name,
                fault = ?error.fault(),
                %error,
                "attempt failed; nothing charged to the backend"
            ),
        }
    }

    /// [`PoolHandle::observe`] of an exchange whose answer's head came `latency` after the
    /// request was sent (`None`: no answer came), which recorders hear of.
    pub fn observe_answered(&self, backend: usize, outcome: Outcome, latency: Option<Duration>) {
        let rt = &self.backends[backend];
        rt.traffic.push(outcome);
        self.tap
            .record(backend, Recorded::Traffic { outcome, latency });
        if !self.config.passive.enabled {
            return;
        }
        let ok = self.traffic_rule.judge(outcome) == TrafficResult::Ok;
        if let Some(outcomes) = &rt.outcomes {
            outcomes.record(!ok);
        }
        if !rt.watched.load(Ordering::Relaxed) && ok {
            return;
        }
        if let Some(health) = self.health.upgrade() {
            health.handle_traffic(self, backend, outcome);
        }
    }
}

/// A `Retry-After` value: delta-seconds (digits only, capped at a year, so no overflow), or
/// an HTTP-date in the future (any of its three forms, as RFC 9110 asks of recipients), as the time from `now`; `None` for anything else
/// or a date already past.
pub(crate) fn parse_retry_after(value: &[u8], now: SystemTime) -> Option<Duration> {
    const YEAR: u64 = 365 * 86_400;
    let text = std::str::from_utf8(value).ok()?.trim();
    if !text.is_empty() && text.len() <= 20 && text.bytes().all(|b| b.is_ascii_digit()) {
        let secs = text.parse::<u64>().unwrap_or(u64::MAX).min(YEAR);
        return Some(Duration::from_secs(secs));
    }
    let at = capataz_timefmt::parse_any_http_date(text)?;
    at.duration_since(now).ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn retry_after_takes_seconds_or_a_future_date_and_nothing_else() {
        let now = capataz_timefmt::parse_http_date("Sun, 06 Nov 1994 08:49:37 GMT").unwrap();
        let at = |v: &str| parse_retry_after(v.as_bytes(), now);
        assert_eq!(at("120"), Some(Duration::from_secs(120)));
        assert_eq!(at(" 0 "), Some(Duration::ZERO));
        assert_eq!(
            at("99999999999999999999"),
            Some(Duration::from_secs(365 * 86_400)),
            "huge values are capped, never overflow"
        );
        assert_eq!(
            at("Sun, 06 Nov 1994 08:50:07 GMT"),
            Some(Duration::from_secs(30))
        );
        assert_eq!(
            at("Sunday, 06-Nov-94 08:50:07 GMT"),
            Some(Duration::from_secs(30)),
            "the obsolete RFC 850 form"
        );
        assert_eq!(
            at("Sun Nov  6 08:50:07 1994"),
            Some(Duration::from_secs(30)),
            "the obsolete asctime form"
        );
        assert_eq!(at("Sun, 06 Nov 1994 08:49:00 GMT"), None, "in the past");
        for bad in ["", "-1", "1.5", "soon", "12 s", "\u{ff}"] {
            assert_eq!(at(bad), None, "{bad:?}");
        }
        assert_eq!(parse_retry_after(&[0xff, b'1'], now), None);
    }
}
