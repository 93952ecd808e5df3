//! A pool's connection limits and queue: `max_connections` (HTTP/1.1 and tcp pools) or `max_requests`
//! (HTTP/2 pools) on the pool, as its backends' default, and on each backend;
//! `queue_size` and `queue_timeout`, which need a limit to mean anything. Called from the
//! pool's validation (`pool.rs`) before the backends are read (`backends.rs`), whose raw
//! entries it reads for their limits.

use std::num::NonZeroU32;

use toml::Spanned;

use super::super::raw::{RawBackend, RawPool};
use super::{ConfigError, Validator};
use crate::{BackendProtocol, LimitsConfig, DEFAULT_QUEUE_SIZE, DEFAULT_QUEUE_TIMEOUT, MAX_LIMIT};

/// A pool's limits (`None` when it sets none) and each backend's own limit, in order.
pub(super) type Limits = (Option<LimitsConfig>, Vec<Option<NonZeroU32>>);

impl Validator<'_> {
    /// The limits of pool `raw` at `at`, whose backends speak `protocol`.
    pub(super) fn limits(
        &self,
        at: &str,
        raw: &RawPool,
        protocol: BackendProtocol,
    ) -> Result<Limits, ConfigError> {
        let default = self.limit(at, &raw.max_connections, &raw.max_requests, protocol)?;
        let mut own = Vec::new();
        for (index, backend) in raw.backends.iter().flatten().enumerate() {
            let RawBackend {
                max_connections,
                max_requests,
                ..
            } = backend.get_ref();
            let at = format!("{at}.backends[{index}]");
            own.push(self.limit(&at, max_connections, max_requests, protocol)?);
        }
        let queue_size_key = format!("{at}.queue_size");
        let queue_timeout_key = format!("{at}.queue_timeout");
        if default.is_none() && own.iter().all(Option::is_none) {
            let key = match (&raw.queue_size, &raw.queue_timeout) {
                (Some(value), _) => Some((value.span(), queue_size_key)),
                (None, Some(value)) => Some((value.span(), queue_timeout_key)),
                (None, None) => None,
            };
            if let Some((span, key)) = key {
                return Err(self.error(
                    Some(span),
                    &key,
                    format!(
                        "a queue holds requests that find every backend at its limit, and no \
                         backend of this pool has one (set {} on the pool or its backends, or \
                         remove queue_size and queue_timeout)",
                        limit_key(protocol)
                    ),
                ));
            }
            return Ok((None, own));
        }
        let queue_size = self.int(
            &raw.queue_size,
            &queue_size_key,
            i64::from(DEFAULT_QUEUE_SIZE),
            0..=i64::from(MAX_LIMIT),
        )? as u32;
        let queue_timeout = self.duration(
            &raw.queue_timeout,
            &queue_timeout_key,
            DEFAULT_QUEUE_TIMEOUT,
        )?;
        let limits = LimitsConfig {
            default,
            queue_size,
            queue_timeout,
        };
        Ok((Some(limits), own))
    }

    /// The limit written at `at` as `max_connections` or `max_requests`: the key of the pool's
    /// protocol, from 1 to [`MAX_LIMIT`].
    fn limit(
        &self,
        at: &str,
        max_connections: &Option<Spanned<i64>>,
        max_requests: &Option<Spanned<i64>>,
        protocol: BackendProtocol,
    ) -> Result<Option<NonZeroU32>, ConfigError> {
        let (value, wrong) = match protocol {
            BackendProtocol::Http1 | BackendProtocol::Tcp => (
                max_connections,
                max_requests.as_ref().map(|v| ("max_requests", v)),
            ),
            BackendProtocol::H2 | BackendProtocol::H2c => (
                max_requests,
                max_connections.as_ref().map(|v| ("max_connections", v)),
            ),
        };
        if let Some((key, value)) = wrong {
            let why = match protocol {
                BackendProtocol::Tcp => {
                    "max_requests limits the concurrent requests (streams) an HTTP/2 backend \
                     carries, and this pool relays TCP sessions, each holding a connection of \
                     its own (use max_connections)"
                }
                BackendProtocol::Http1 => {
                    "max_requests limits the concurrent requests (streams) an HTTP/2 backend \
                     carries, and this pool's backends speak HTTP/1.1, where each request holds \
                     a connection of its own (use max_connections)"
                }
                _ => {
                    "max_connections limits the connections an HTTP/1.1 backend holds, and this \
                     pool's backends speak HTTP/2, one multiplexed connection each (use \
                     max_requests, the concurrent requests each backend may carry)"
                }
            };
            return Err(self.error(Some(value.span()), &format!("{at}.{key}"), why.into()));
        }
        let Some(value) = value else {
            return Ok(None);
        };
        let key = format!("{at}.{}", limit_key(protocol));
        let n = self.int(&Some(value.clone()), &key, 1, 1..=i64::from(MAX_LIMIT))?;
        // `int` kept n within 1..=MAX_LIMIT.
        Ok(NonZeroU32::new(n as u32))
    }
}

/// The key that limits a backend of a pool speaking `protocol`.
fn limit_key(protocol: BackendProtocol) -> &'static str {
    match protocol {
        BackendProtocol::Http1 | BackendProtocol::Tcp => "max_connections",
        BackendProtocol::H2 | BackendProtocol::H2c => "max_requests",
    }
}
