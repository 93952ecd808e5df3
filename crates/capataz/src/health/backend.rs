//! One backend at run time ([`BackendRt`]: connections, in-flight count, recent traffic, the
//! fast-path flag) and the runtime's [`Clock`], which turns engine time into instants and wall
//! time, saturating.

use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use capataz_health::Outcome;
use tokio::time::Instant;

use super::HISTORY;
use crate::metrics::BackendMetrics;
use crate::upstream::Upstream;

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
    pub(super) fn push(&self, outcome: Outcome) {
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
    pub(super) watched: AtomicBool,
    /// When the next probe is due, in engine milliseconds (`u64::MAX`: none scheduled).
    pub(super) next_probe_ms: AtomicU64,
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
