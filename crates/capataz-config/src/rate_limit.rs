//! A route's local rate limit (`rate_limit = { ... }`): a token bucket per key, kept in this
//! instance's memory.

use std::time::Duration;

/// The most keys a limit's table holds, unless `max_keys` says otherwise.
pub const DEFAULT_RATE_LIMIT_KEYS: usize = 100_000;

/// A route's rate limit: each key may make `burst` requests at once, and one more every
/// `per / rate`; a request over the limit is answered 429 and never reaches a backend.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RateLimitConfig {
    /// What the buckets are kept by.
    pub key: RateLimitKey,
    /// Requests allowed per `per` (at least 1).
    pub rate: u32,
    /// The period `rate` is counted over (default 1 s).
    pub per: Duration,
    /// The bucket's size: requests a key may make at once after a quiet time (default
    /// `rate`; at least 1).
    pub burst: u32,
    /// The most keys remembered at once (default [`DEFAULT_RATE_LIMIT_KEYS`]); past it, the
    /// idlest keys are forgotten.
    pub max_keys: usize,
}

/// What a rate limit's buckets are kept by.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum RateLimitKey {
    /// The client's address (`"client_ip"`: the PROXY protocol's when a trusted source sent
    /// one).
    ClientIp,
    /// The value of this request header (`"header:NAME"`); a request without it is keyed by
    /// its client address.
    Header(http::HeaderName),
}

impl RateLimitConfig {
    /// The time one token takes to come back: `per / rate`, at least a nanosecond.
    pub fn interval(&self) -> Duration {
        (self.per / self.rate.max(1)).max(Duration::from_nanos(1))
    }
}
