//! What the admin API and the metrics see of a pool: consistent copies taken under the lock
//! ([`BackendView`]), never recomputed outside the engine. Whether a backend serves and its
//! weight are read from the snapshot the request path picks from (swapped under the same
//! lock), so what is reported is what the picker does.

use std::collections::VecDeque;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use capataz_health::{
    AgentState, BackendHealth, Cadence, Effective, ProbeOutcome, ProbeResult, Role, Transition,
};

use super::{BackendRt, Inner, OverrideKind, PoolRt};
use crate::balance::Snapshot;

/// One probe, as the admin API shows it.
#[derive(Clone, Copy, Debug)]
pub struct ProbeRecord {
    /// What happened, with the answer's content match.
    pub outcome: ProbeOutcome,
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

/// The records of one backend and its manual override, as the admin API shows them.
#[derive(Clone, Debug)]
pub struct BackendInfo {
    /// Recent probes, oldest first.
    pub probes: VecDeque<ProbeRecord>,
    /// The last verdict change and when it happened.
    pub last_transition: Option<(SystemTime, Transition)>,
    /// Since when the current verdict holds (start, or the last transition).
    pub since: SystemTime,
    /// When it joined the pool.
    pub joined: SystemTime,
    /// The manual override, if any.
    pub override_: Option<Override>,
}

/// A copy of everything known about one backend at one moment, for the admin API.
#[derive(Clone, Debug)]
pub struct BackendView {
    /// Its index in the pool (and in the pool's config).
    pub index: usize,
    /// The backend.
    pub backend: Arc<BackendRt>,
    /// Its engine state.
    pub health: BackendHealth,
    /// Its records and override.
    pub info: BackendInfo,
    /// Whether new requests may go to it by its own standing (its verdict, any override,
    /// requalification or drain), before the pool's backup and all-down rules.
    pub eligible: bool,
    /// Its effective state (the engine's `Effective`).
    pub effective: Effective,
    /// Primary or backup.
    pub role: Role,
    /// While it requalifies after maintenance: passing probes in a row so far, and needed.
    pub requalifying: Option<(u32, u32)>,
    /// Its effective weight, in tenths of a weight unit: the pool's snapshot's, the one the
    /// picker uses.
    pub effective_weight_tenths: u32,
    /// Whether it is in the pool's snapshot: new requests may go to it (backups and
    /// fail-open included).
    pub serving: bool,
    /// Whether the pool's snapshot says its backups serve (no primary in rotation).
    pub on_backups: bool,
    /// Whether its slow start is under way (the engine's [`Rotation::ramping`]): its
    /// effective weight is the ramp's step, below what its agent and any load shed leave it.
    ///
    /// [`Rotation::ramping`]: capataz_health::Rotation::ramping
    pub ramping: bool,
    /// What its agent last said (`up` at 100 % without agent checks).
    pub agent: AgentState,
    /// The load shed it asked for (`429`, or `503` with `Retry-After`), while the engine
    /// holds it: until the timeout at its end, exactly while the snapshot's weight is shed.
    pub shed: Option<capataz_health::Shed>,
    /// Which probe interval applies to it now.
    pub cadence: Cadence,
    /// When it is next probed, on the engine clock (the engine's schedule; while a probe is
    /// under way, when that one was due); `None` when it is not probed.
    pub next_probe: Option<Duration>,
    /// Engine time of the copy.
    pub now: Duration,
}

impl BackendView {
    /// The effective state: the override's (`DRAINING`, `FORCED_DOWN`, `FORCED_UP`), else the
    /// verdict (`UP`, `DOWN`).
    pub fn state(&self) -> &'static str {
        self.effective.as_str()
    }
}

impl PoolRt {
    /// Per backend, in pool order: whether it is in rotation by its own standing (its verdict
    /// and any override, as [`PoolRt::views`] says in `eligible`) and its effective weight in
    /// tenths (the snapshot's), without copying every record.
    pub fn eligibility(&self) -> Vec<(bool, u32)> {
        self.eligibility_beside_snapshot().1
    }

    /// [`PoolRt::eligibility`], with the snapshot it was read beside (under one lock).
    pub fn eligibility_beside_snapshot(&self) -> (Arc<Snapshot>, Vec<(bool, u32)>) {
        let inner = self.lock();
        let snapshot = self.snapshot();
        let eligibility = (0..self.backends.len())
            .map(|i| {
                (
                    inner.engine.in_rotation(i),
                    snapshot.weight(i).unwrap_or_default(),
                )
            })
            .collect();
        (Arc::clone(&snapshot), eligibility)
    }

    /// A consistent copy of everything known about every backend.
    pub fn views(&self) -> Vec<BackendView> {
        self.standing().1
    }

    /// The pool's snapshot (who serves, the all-down policy applied, the backups in use: what
    /// the picker reads) and a copy of everything known about every backend, under one lock:
    /// a report built from both describes one decision.
    pub fn standing(&self) -> (Arc<Snapshot>, Vec<BackendView>) {
        let now = self.clock.now();
        let inner = self.lock();
        let snapshot = self.snapshot();
        let views = (0..self.backends.len())
            .map(|i| self.view(&inner, &snapshot, i, now))
            .collect();
        (Arc::clone(&snapshot), views)
    }

    /// [`PoolRt::views`], with only each backend's last probe in `info.probes` (what its
    /// explain sentence reads): for the dashboard's sampler, which copies every backend every
    /// few seconds (their whole probe histories would be 27 MB at 10,000 backends).
    pub fn views_with_last_probe(&self) -> Vec<BackendView> {
        let now = self.clock.now();
        let inner = self.lock();
        let snapshot = self.snapshot();
        (0..self.backends.len())
            .map(|i| {
                let last = inner.info[i].probes.last_record().into_iter().collect();
                self.view_with(&inner, &snapshot, i, now, last)
            })
            .collect()
    }

    /// A consistent copy of everything known about backend `index` (which must exist), without
    /// copying the others'.
    pub fn view_of(&self, index: usize) -> BackendView {
        let now = self.clock.now();
        let inner = self.lock();
        let snapshot = self.snapshot();
        self.view(&inner, &snapshot, index, now)
    }

    /// Backend `i`'s view; `snapshot` was loaded under the lock `inner` comes from, so it is
    /// the one the engine's state published.
    fn view(&self, inner: &Inner, snapshot: &Snapshot, i: usize, now: Duration) -> BackendView {
        let probes = inner.info[i].probes.records();
        self.view_with(inner, snapshot, i, now, probes)
    }

    /// [`PoolRt::view`] with `probes` for its recent probes.
    fn view_with(
        &self,
        inner: &Inner,
        snapshot: &Snapshot,
        i: usize,
        now: Duration,
        probes: VecDeque<ProbeRecord>,
    ) -> BackendView {
        let engine = &inner.engine;
        let records = &inner.info[i];
        BackendView {
            index: i,
            backend: self.backends[i].clone(),
            health: *engine.pool().backend(i),
            info: BackendInfo {
                probes,
                last_transition: records.last_transition,
                since: records.since,
                joined: records.joined,
                override_: engine.override_of(i).map(|o| Override {
                    kind: o.kind,
                    since: self.clock.wall(o.since),
                    until: o.until,
                }),
            },
            eligible: engine.in_rotation(i),
            effective: engine.effective(i),
            role: engine.role(i),
            requalifying: engine.requalifying(i),
            effective_weight_tenths: snapshot.weight(i).unwrap_or_default(),
            serving: snapshot.serves(i),
            on_backups: snapshot.on_backups.is_some(),
            ramping: engine.ramping(i),
            agent: engine.agent(i),
            shed: engine.shed(i),
            cadence: engine.cadence(i),
            next_probe: inner.schedule.next_probe(i),
            now,
        }
    }
}
