//! What a pool's backend source last did ([`SourceRecord`]): when the registry last answered,
//! whether it is failing now, whether a drop is held, and which SRV targets have no address. Shared by every rebuild of the same
//! pool (a reload or a membership update), so the age shown by the metrics and `/status` is
//! the source's, not the pool object's.

use std::sync::{Mutex, MutexGuard};
use std::time::{Duration, SystemTime};

use crate::events::Unresolved;

/// A pool's source record (a static pool keeps the default: never updated).
#[derive(Debug, Default)]
pub struct SourceRecord {
    state: Mutex<SourceState>,
}

/// A copy of a pool's membership record.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct SourceState {
    /// Engine time of the last good answer from the source (`None`: none yet).
    pub confirmed: Option<Duration>,
    /// Wall-clock time of the last good answer.
    pub confirmed_wall: Option<SystemTime>,
    /// Why the source is failing now (`None`: it answers).
    pub failing: Option<String>,
    /// A drop held for confirmation: the backends in force and those the source answered.
    pub held: Option<(usize, usize)>,
    /// The SRV targets (DNS) the source's last answer gave no address, sorted: left out, or
    /// kept at their last known address while their lookup fails.
    pub unresolved: Vec<Unresolved>,
}

impl SourceRecord {
    fn lock(&self) -> MutexGuard<'_, SourceState> {
        // Plain field writes: a poisoned lock still holds a whole value.
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// A copy of the record.
    pub fn state(&self) -> SourceState {
        self.lock().clone()
    }

    /// Changes the record.
    pub fn update(&self, change: impl FnOnce(&mut SourceState)) {
        change(&mut self.lock());
    }
}
