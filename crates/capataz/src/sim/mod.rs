//! Scriptable in-process HTTP/1.1 backends, for `capataz demo` and the integration tests.
//!
//! A health checker is only as good as the failures it has been shown, and real servers are bad
//! at failing on cue. A [`SimBackend`] is a tiny HTTP/1.1 server on loopback whose behaviour can
//! be switched at any moment, without a restart: answer with a status, hang, close, reset, send
//! garbage, answer late, follow a pattern on its health route, crash, and come back on the same
//! port.
//!
//! The server is hand-written rather than built on hyper because several of the behaviours are
//! deliberately not HTTP (hanging after a request, a TCP reset, garbage bytes) and need the raw
//! socket. It still speaks enough HTTP/1.1 for a real client: keep-alive, `Content-Length`
//! bodies on responses, and request bodies (sized or chunked) read and discarded.
//!
//! Invariants:
//! - A request counts as a hit once its head and body have been read, before its behaviour runs,
//!   so a hanging or resetting request is still counted.
//! - The health route is the request path `/healthz` exactly (a query string is ignored); every
//!   other request is traffic.
//! - [`SimBackend::crash`] closes the listener before it returns, so a connection attempted after
//!   it is refused, and resets every open connection as soon as the runtime runs their tasks.
//! - Dropping a [`SimBackend`] crashes it: nothing it started outlives it.

//!
//! Files: `backend.rs` (the handle: behaviour, counters, crash and restart), `server.rs` (the
//! accept loop and one connection's request loop), `wire.rs` (reading request heads and bodies,
//! writing answers).

use std::sync::{Mutex, MutexGuard, PoisonError};
use std::time::Duration;

mod backend;
mod server;
mod wire;

#[cfg(test)]
mod tests;

pub use backend::SimBackend;

/// The request path that selects the health behaviour.
pub const HEALTH_PATH: &str = "/healthz";

/// What a backend does with one request.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mode {
    /// Answer with this status. Codes are written verbatim, so a code outside 100-599 makes a
    /// malformed status line on purpose; 1xx, 204 and 304 answers carry no body.
    Status(u16),
    /// Read the request and never answer; the connection stays open until the client closes it.
    Hang,
    /// Close the connection (FIN) without answering.
    Close,
    /// Reset the connection (RST, through `SO_LINGER` 0) without answering.
    Reset,
    /// Answer `garbage\r\n\r\n` and close.
    Garbage,
    /// Answer with this status after this delay.
    Delay(Duration, u16),
    /// Answer with this status and `Retry-After: N` (seconds): a backend shedding load.
    RetryAfter(u16, u32),
    /// Answer every n-th request of its kind (counting all since the backend started) with
    /// this status, the others with 200: deterministic intermittent errors.
    FailEvery(u32, u16),
}

/// Locks a mutex, ignoring poisoning: every critical section here leaves its data consistent.
fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(PoisonError::into_inner)
}
