//! What the admin API and the metrics see of a pool: consistent copies taken under the lock
//! ([`BackendView`]), never recomputed outside the engine: each backend's standing is the
//! engine's one value, rendered as it is. Whether a backend serves is read from the snapshot
//! the request path picks from (swapped under the same lock), and its weight is the
//! standing's at the time that snapshot was built, so what is reported is what the picker
//! does.

use std::collections::VecDeque;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use capataz_health::{ProbeOutcome, ProbeResult, Standing};

use super::{BackendRt, Inner, PoolRt};
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

/// The records of one backend, as the admin API shows them.
#[derive(Clone, Debug)]
pub struct BackendInfo {
    /// Recent probes, oldest first.
    pub probes: VecDeque<ProbeRecord>,
    /// When it joined the pool.
    pub joined: SystemTime,
}

/// A copy of everything known about one backend at one moment, for the admin API.
#[derive(Clone, Debug)]
pub struct BackendView {
    /// Its index in the pool (and in the pool's config).
    pub index: usize,
    /// The backend.
    pub backend: Arc<BackendRt>,
    /// Where it stands, as the engine says (`Rotation::standing`): its effective state, the
    /// rule that decides it, since when, what brings it back, its health, agent, shed and
    /// cadence, and its weight as of the snapshot the picker reads.
    pub standing: Standing,
    /// Its records.
    pub info: BackendInfo,
    /// Its effective weight in tenths of a weight unit: the standing's, which is the pool's
    /// snapshot's, the one the picker uses.
    pub effective_weight_tenths: u32,
    /// Whether it is in the pool's snapshot: new requests may go to it (backups and
    /// fail-open included).
    pub serving: bool,
    /// Whether the pool's snapshot says its backups serve (no primary in rotation).
    pub on_backups: bool,
    /// When it is next probed, on the engine clock (the engine's schedule; while a probe is
    /// under way, when that one was due); `None` when it is not probed.
    pub next_probe: Option<Duration>,
    /// Engine time of the copy.
    pub now: Duration,
}

impl BackendView {
    /// The effective state: the override's (`DRAINING`, `FORCED_DOWN`, `FORCED_UP`,
    /// `MAINTENANCE`), else its own (`REQUALIFYING`, `SELF_DRAINING`), else the verdict (`UP`,
    /// `DOWN`).
    pub fn state(&self) -> &'static str {
        self.standing.effective.as_str()
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
    pub(crate) fn eligibility_beside_snapshot(&self) -> (Arc<Snapshot>, Vec<(bool, u32)>) {
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
    pub(crate) fn views_with_last_probe(&self) -> Vec<BackendView> {
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
    /// the one the engine's state published, built at `inner.published`: the standing asked at
    /// that time has the snapshot's weight.
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
        let standing = inner.engine.standing(i, inner.published);
        debug_assert_eq!(Some(standing.weight_tenths), snapshot.weight(i));
        let records = &inner.info[i];
        BackendView {
            index: i,
            backend: self.backends[i].clone(),
            standing,
            info: BackendInfo {
                probes,
                joined: records.joined,
            },
            effective_weight_tenths: standing.weight_tenths,
            serving: snapshot.serves(i),
            on_backups: snapshot.on_backups.is_some(),
            next_probe: inner.schedule.next_probe(i),
            now,
        }
    }
}
