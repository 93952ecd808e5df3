//! A session's slot on its backend: the one place a session is counted in the backend's
//! `in_flight` (what `least_request`, the limits, `/status` and the metrics read), from its
//! pick until it ends.
//!
//! In a pool with limits (`max_connections`) the slot is the pool's [`Admission`], taken by
//! `Limits::admit` below the backend's limit, or after waiting in the pool's FIFO queue
//! (HAProxy's `maxconn` and `timeout queue` in `mode tcp`); given back, and handed to the
//! queue's head, when the session ends or its connect fails. A hashing pool's session takes
//! its key's backend if it has a free slot and nobody waits, else goes the queue's way like any
//! other (`Limits::admit_on`, as an HTTP request's affinity). Without limits the slot is a
//! plain count, taken on the snapshot's pick.
//!
//! Invariant: a slot is counted once and given back once, whatever ends the session (a
//! failed connect, the relay's end, the client going away while queued).

use std::sync::atomic::Ordering;
use std::time::Duration;

use crate::balance::{release, Admission, Admit, Limits, PoolHandle};

/// A slot held on a backend while a session lasts; given back when dropped.
#[derive(Debug)]
pub(crate) enum Slot<'a> {
    /// A slot of a pool with limits.
    Admitted(Admission<'a>),
    /// A count on backend `index` of a pool without limits.
    Counted { pool: &'a PoolHandle, index: usize },
}

impl Slot<'_> {
    /// The backend the slot is on.
    pub(crate) fn index(&self) -> usize {
        match self {
            Slot::Admitted(admission) => admission.index(),
            Slot::Counted { index, .. } => *index,
        }
    }
}

impl Drop for Slot<'_> {
    fn drop(&mut self) {
        // An `Admission` gives its slot back itself.
        if let Slot::Counted { pool, index } = self {
            release(pool, *index);
        }
    }
}

/// What a session's look for a slot came to when it got none.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Unslotted {
    /// No eligible backend it has not tried (or, on a retry, each is at its limit).
    NoBackend,
    /// Every eligible backend is at its limit and the queue is full (or `queue_size = 0`).
    QueueFull,
    /// The session waited `queue_timeout` without a slot.
    QueueTimeout,
}

/// A slot on backend `picked` of `pool` (a pool without limits: what the snapshot picked).
pub(crate) fn counted(pool: &PoolHandle, picked: Option<usize>) -> Result<Slot<'_>, Unslotted> {
    let index = picked.ok_or(Unslotted::NoBackend)?;
    pool.backends[index]
        .in_flight
        .fetch_add(1, Ordering::Relaxed);
    Ok(Slot::Counted { pool, index })
}

/// A slot on a backend of `pool`, whose limits are `limits`, not in `tried`: `preferred` (a
/// hashing pool's backend for the client) if it has one free and nobody waits; else any
/// eligible backend below its limit, waited for in the queue by a first attempt (a retry takes
/// one at once or none). The time spent in the queue goes to `queued`.
pub(crate) async fn admitted<'a>(
    pool: &'a PoolHandle,
    limits: &Limits,
    preferred: Option<usize>,
    tried: &[usize],
    queued: &mut Option<Duration>,
) -> Result<Slot<'a>, Unslotted> {
    if let Some(admission) = preferred.and_then(|index| limits.admit_on(pool, index)) {
        return Ok(Slot::Admitted(admission));
    }
    match limits.admit(pool, tried).await {
        Admit::Granted(admission, waited) => {
            *queued = waited.or(*queued);
            Ok(Slot::Admitted(admission))
        }
        Admit::NoBackend(waited) => {
            *queued = waited.or(*queued);
            Err(Unslotted::NoBackend)
        }
        Admit::Busy => Err(Unslotted::NoBackend),
        Admit::QueueFull => Err(Unslotted::QueueFull),
        Admit::TimedOut(waited) => {
            *queued = Some(waited);
            Err(Unslotted::QueueTimeout)
        }
    }
}
