//! The backend connections one HTTP/2 client connection's streams may hold at once
//! (`[listeners.http2] max_backend_connections`).
//!
//! Over HTTP/1.1 a client connection carries one request at a time, so it holds at most one
//! backend connection. Over HTTP/2 each of its streams forwarded to an HTTP/1.1 pool holds one
//! of its own, from its attempt to the end of its answer: without a bound below the stream
//! limit, one client connection could keep that many backend connections (and the backends'
//! workers behind them) busy. A stream beyond the bound waits, in order, for one of the
//! others' to be let go; it holds nothing of a backend meanwhile. Streams to HTTP/2 pools share
//! one connection per backend and take no slot.

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
    pub(crate) fn limit(&self, limit: usize) {
        let _ = self.0.set(Arc::new(Semaphore::new(
            limit.clamp(1, Semaphore::MAX_PERMITS),
        )));
    }

    /// A slot, once one is free; `None` on a connection without a limit (HTTP/1).
    pub(crate) async fn acquire(&self) -> Option<Slot> {
        let slots = self.0.get()?.clone();
        // The semaphore is never closed.
        let permit = slots.acquire_owned().await.ok()?;
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
}
