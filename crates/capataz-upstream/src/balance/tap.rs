//! The recording tap of a pool ([`Tap`]): while a recorder (`GET /record/<pool>` on the admin
//! API) listens, every probe and traffic outcome of the pool, with its latency and time, is
//! handed to it. With nobody listening it costs the request path one relaxed atomic load per
//! outcome and holds no buffer; while somebody listens, records go through one bounded
//! broadcast channel ([`CAPACITY`] records), and a reader that falls behind loses the oldest
//! ones and is told how many ([`Recorder::recv`]).

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use capataz_health::Outcome;
use tokio::sync::broadcast;
use tokio::time::Instant;

/// The records a recorder may fall behind by before it loses the oldest.
pub const CAPACITY: usize = 4096;

/// The most recorders one pool serves at once.
pub const MAX_RECORDERS: usize = 4;

/// What happened to a backend.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Recorded {
    /// A probe's outcome (one that broke a content rule is `Outcome::Malformed`).
    Probe(Outcome),
    /// A relayed exchange's outcome, and how long its answer's head took (`None`: no answer).
    Traffic {
        /// The outcome the passive checks judged.
        outcome: Outcome,
        /// From sending the request to reading the answer's head.
        latency: Option<Duration>,
    },
    /// An answer asking for relief (load shedding): not judged.
    Shed {
        /// `429` or `503`.
        status: u16,
        /// From sending the request to reading the answer's head.
        latency: Duration,
        /// The relief granted.
        relief: Duration,
    },
}

/// One record: when, which backend (its index in the pool), what.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Record {
    /// When it happened.
    pub at: Instant,
    /// The backend's index in the pool.
    pub backend: usize,
    /// What happened.
    pub what: Recorded,
}

/// A pool's tap: how many recorders listen, and their channel (made by the first).
#[derive(Debug, Default)]
pub struct Tap {
    recorders: Arc<AtomicUsize>,
    sender: Mutex<Option<broadcast::Sender<Record>>>,
}

/// Why no recorder was made.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TooManyRecorders;

impl Tap {
    /// Whether anybody listens (one relaxed load).
    #[inline]
    pub(crate) fn on(&self) -> bool {
        self.recorders.load(Ordering::Relaxed) > 0
    }

    /// Hands `what` of `backend` to the recorders, if any listen.
    #[inline]
    pub fn record(&self, backend: usize, what: Recorded) {
        if !self.on() {
            return;
        }
        self.send(Record {
            at: Instant::now(),
            backend,
            what,
        });
    }

    #[cold]
    fn send(&self, record: Record) {
        let sender = crate::lockstat::lock(&self.sender, crate::lockstat::Site::Tap);
        if let Some(sender) = sender.as_ref() {
            // No receiver left (the last one going away meanwhile) is fine.
            let _ = sender.send(record);
        }
    }

    /// A new recorder, unless [`MAX_RECORDERS`] already listen.
    pub fn subscribe(&self) -> Result<Recorder, TooManyRecorders> {
        let mut sender = crate::lockstat::lock(&self.sender, crate::lockstat::Site::Tap);
        let taken = self
            .recorders
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |n| {
                (n < MAX_RECORDERS).then_some(n + 1)
            });
        if taken.is_err() {
            return Err(TooManyRecorders);
        }
        let receiver = sender
            .get_or_insert_with(|| broadcast::channel(CAPACITY).0)
            .subscribe();
        Ok(Recorder {
            receiver,
            recorders: self.recorders.clone(),
        })
    }

    /// How many recorders listen.
    pub fn recorders(&self) -> usize {
        self.recorders.load(Ordering::Relaxed)
    }
}

/// One listener on a pool's tap; leaving frees its place.
#[derive(Debug)]
pub struct Recorder {
    receiver: broadcast::Receiver<Record>,
    recorders: Arc<AtomicUsize>,
}

/// What a recorder gets next.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Next {
    /// A record.
    Record(Record),
    /// This many records were lost: the reader fell behind by more than [`CAPACITY`].
    Dropped(u64),
    /// The pool is gone (replaced by a reload, or the balancer stopped).
    Closed,
}

impl Recorder {
    /// The next record, or how many were lost, or the end.
    pub async fn recv(&mut self) -> Next {
        match self.receiver.recv().await {
            Ok(record) => Next::Record(record),
            Err(broadcast::error::RecvError::Lagged(n)) => Next::Dropped(n),
            Err(broadcast::error::RecvError::Closed) => Next::Closed,
        }
    }

    /// The next record if one is waiting (or a loss, or the end); `None` if none is.
    pub fn try_recv(&mut self) -> Option<Next> {
        match self.receiver.try_recv() {
            Ok(record) => Some(Next::Record(record)),
            Err(broadcast::error::TryRecvError::Lagged(n)) => Some(Next::Dropped(n)),
            Err(broadcast::error::TryRecvError::Closed) => Some(Next::Closed),
            Err(broadcast::error::TryRecvError::Empty) => None,
        }
    }
}

impl Drop for Recorder {
    fn drop(&mut self) {
        self.recorders.fetch_sub(1, Ordering::Relaxed);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn traffic(code: u16) -> Recorded {
        Recorded::Traffic {
            outcome: Outcome::Status(code),
            latency: Some(Duration::from_millis(3)),
        }
    }

    #[tokio::test]
    async fn records_reach_recorders_only_while_they_listen_and_places_are_capped() {
        let tap = Tap::default();
        tap.record(0, traffic(200));
        assert!(!tap.on());
        let mut recorders: Vec<Recorder> = (0..MAX_RECORDERS)
            .map(|_| tap.subscribe().expect("a free place"))
            .collect();
        assert_eq!(tap.subscribe().unwrap_err(), TooManyRecorders);
        tap.record(1, traffic(502));
        for recorder in &mut recorders {
            match recorder.recv().await {
                Next::Record(record) => {
                    assert_eq!((record.backend, record.what), (1, traffic(502)))
                }
                other => panic!("{other:?}"),
            }
        }
        recorders.pop();
        assert_eq!(tap.recorders(), MAX_RECORDERS - 1);
        assert!(tap.subscribe().is_ok(), "a place freed is taken again");
    }

    #[tokio::test]
    async fn a_reader_that_falls_behind_is_told_how_many_it_lost() {
        let tap = Tap::default();
        let mut recorder = tap.subscribe().unwrap();
        for _ in 0..CAPACITY + 10 {
            tap.record(0, traffic(200));
        }
        assert_eq!(recorder.recv().await, Next::Dropped(10));
        assert!(matches!(recorder.recv().await, Next::Record(_)));
    }
}
