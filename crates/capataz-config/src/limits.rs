//! A pool's connection limits and its queue: how many requests each backend may hold at once
//! (`max_connections` on an HTTP/1.1 pool, `max_requests` on an HTTP/2 one, per backend or as
//! the pool's default), and how many requests may wait, and for how long, when every eligible
//! backend holds its limit (`queue_size`, `queue_timeout`).

use std::num::NonZeroU32;
use std::time::Duration;

/// The default `queue_size`: as Envoy's `max_pending_requests`.
pub const DEFAULT_QUEUE_SIZE: u32 = 1024;

/// The default `queue_timeout`.
pub const DEFAULT_QUEUE_TIMEOUT: Duration = Duration::from_secs(5);

/// The largest `max_connections`, `max_requests` and `queue_size`.
pub const MAX_LIMIT: u32 = 1_000_000;

/// A pool's limits, present when the pool or one of its backends sets one.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LimitsConfig {
    /// The limit of a backend that sets none (`None`: such a backend has no limit).
    pub default: Option<NonZeroU32>,
    /// The most requests that may wait for a free backend at once (0: none waits; a request
    /// that finds every eligible backend at its limit is refused at once).
    pub queue_size: u32,
    /// The longest a request waits in the queue before it is answered 503.
    pub queue_timeout: Duration,
}
