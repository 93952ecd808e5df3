//! The backend connections one HTTP/2 client connection's streams may hold at once
//! (`[listeners.http2] max_backend_connections`).
//!
//! Over HTTP/1.1 a client connection carries one request at a time, so it holds at most one
//! backend connection. Over HTTP/2 each of its streams forwarded to an HTTP/1.1 pool holds one
//! of its own, from its attempt to the end of its answer: without a bound below the stream
//! limit, one client connection could keep that many backend connections (and the backends'
//! workers behind them) busy. A bodiless stream beyond the bound waits, in order, for one of
//! the others' to be let go; it holds nothing of a backend meanwhile. A stream with a request
//! body never waits: it takes a slot if one is free and goes on without one otherwise, because
//! the body its client sends while it waits, unread, would fill the connection's flow-control
//! window, and the streams holding the slots could then receive nothing more of their own
//! bodies (each would time out with 408, then the next). Streams to HTTP/2 pools share one
//! connection per backend and take no slot.

use std::sync::{Arc, OnceLock};

use tokio::sync::{OwnedSemaphorePermit, Semaphore};

/// The slots of one client connection: none until it is known to speak HTTP/2.
#[derive(Debug, Default)]
pub struct BackendSlots(OnceLock<Arc<Semaphore>>);

/// One backend connection held by a stream: let go when dropped.
#[derive(Debug)]
pub struct Slot {
    _permit: OwnedSemaphorePermit,
}

impl BackendSlots {
    /// From now on at most `limit` slots are held at once (set once: later calls change
    /// nothing).
    pub fn limit(&self, limit: usize) {
        let _ = self.0.set(Arc::new(Semaphore::new(
            limit.clamp(1, Semaphore::MAX_PERMITS),
        )));
    }

    /// A slot, once one is free; `None` on a connection without a limit (HTTP/1).
    pub async fn acquire(&self) -> Option<Slot> {
        let slots = self.0.get()?.clone();
        // The semaphore is never closed.
        let permit = slots.acquire_owned().await.ok()?;
        Some(Slot { _permit: permit })
    }

    /// A slot if one is free now, without waiting; `None` otherwise (or without a limit).
    /// For a stream with a request body, which must never wait (see the module docs).
    pub fn try_acquire(&self) -> Option<Slot> {
        let permit = self.0.get()?.clone().try_acquire_owned().ok()?;
        Some(Slot { _permit: permit })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn without_a_limit_nothing_is_held() {
        assert!(BackendSlots::default().acquire().await.is_none());
    }

    #[tokio::test]
    async fn a_slot_beyond_the_limit_waits_for_one_let_go() {
        let slots = Arc::new(BackendSlots::default());
        slots.limit(2);
        slots.limit(100);
        let first = slots.acquire().await.expect("a slot");
        let _second = slots.acquire().await.expect("a slot");
        let waiting = tokio::spawn({
            let slots = slots.clone();
            async move { slots.acquire().await.is_some() }
        });
        tokio::task::yield_now().await;
        assert!(!waiting.is_finished(), "the third waits");
        drop(first);
        assert!(waiting.await.unwrap());
    }

    #[tokio::test]
    async fn try_acquire_takes_a_free_slot_and_never_waits() {
        let slots = BackendSlots::default();
        assert!(slots.try_acquire().is_none(), "no limit, nothing held");
        slots.limit(1);
        let first = slots.try_acquire().expect("a free slot");
        assert!(slots.try_acquire().is_none(), "none free: no wait, no slot");
        drop(first);
        assert!(slots.try_acquire().is_some());
    }
}
