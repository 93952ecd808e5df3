//! A route's local rate limit on the request path: the request's key (its client address, or
//! a header's value), a token from the route's [`RateLimiter`], and, over the limit, capataz's
//! 429 with `Retry-After`: the request never reaches a backend, costs none of the pool's retry
//! budget, and is counted (`capataz_rate_limited_total`) and logged (`reason=rate_limited`).
//! A route without a limit pays one branch on a `None`.

use std::net::IpAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use http::header::{self, HeaderValue};
use http::{HeaderMap, Response, StatusCode};
use prometheus_client::metrics::counter::Counter;

use super::pages::error_page;
use crate::body::RespBody;
use crate::config::{RateLimitConfig, RateLimitKey};
use crate::rate_limit::{RateLimiter, Verdict};

/// The reason the access log gives for a request refused over a rate limit.
pub(super) const RATE_LIMITED: &str = "rate_limited";

/// One route's limit.
#[derive(Debug)]
pub(super) struct RouteLimit {
    /// What it was built from: a proxy rebuilt with the same keeps it.
    config: RateLimitConfig,
    limiter: RateLimiter,
    key: RateLimitKey,
    /// Requests refused over it.
    limited: Counter,
}

impl RouteLimit {
    /// The limit `config` says, counting refusals into `limited`.
    pub(super) fn new(config: &RateLimitConfig, limited: Counter) -> RouteLimit {
        RouteLimit {
            config: config.clone(),
            limiter: RateLimiter::new(config, Instant::now()),
            key: config.key.clone(),
            limited,
        }
    }

    /// The limit of route `label` as `config` says: the one `previous` (the routes of the
    /// proxy being replaced, by label) had for it if it was built from the same config, so
    /// a reload or a membership update keeps its buckets; else a new one counting into
    /// `limited()`.
    pub(super) fn kept_or_new<'a>(
        previous: Option<impl Iterator<Item = (&'a String, &'a Option<Arc<RouteLimit>>)>>,
        label: &str,
        config: &RateLimitConfig,
        limited: impl FnOnce() -> Counter,
    ) -> Arc<RouteLimit> {
        let kept = previous.into_iter().flatten().find_map(|(l, limit)| {
            limit
                .as_ref()
                .filter(|limit| l == label && limit.config == *config)
        });
        match kept {
            Some(limit) => limit.clone(),
            None => Arc::new(RouteLimit::new(config, limited())),
        }
    }

    /// `None` if a request with `headers` from `client` may go on (a token was taken), else
    /// the 429 it gets.
    pub(super) fn check(
        &self,
        (headers, authority): (&HeaderMap, Option<&str>),
        client: IpAddr,
    ) -> Option<Response<RespBody>> {
        let now = Instant::now();
        let header = match &self.key {
            // An HTTP/2 request's host is its `:authority` (it has no `Host` field).
            RateLimitKey::Header(name) => {
                headers.get(name).map(HeaderValue::as_bytes).or_else(|| {
                    (*name == header::HOST)
                        .then_some(authority)
                        .flatten()
                        .map(str::as_bytes)
                })
            }
            RateLimitKey::ClientIp => None,
        };
        // Tagged, so a header's value never shares a bucket with an address. The header's
        // first value counts; without it, the client's address.
        let verdict = match (header, client.to_canonical()) {
            (Some(value), _) => self.limiter.check((b'h', value), now),
            (None, IpAddr::V4(v4)) => self.limiter.check((b'4', v4.octets()), now),
            (None, IpAddr::V6(v6)) => self.limiter.check((b'6', v6.octets()), now),
        };
        let Verdict::Limited(wait) = verdict else {
            return None;
        };
        self.limited.inc();
        Some(limited_page(wait))
    }
}

/// capataz's 429, with `Retry-After` the whole seconds until a token (at least 1).
fn limited_page(wait: Duration) -> Response<RespBody> {
    let mut page = error_page(
        StatusCode::TOO_MANY_REQUESTS,
        "over this route's rate limit",
    );
    page.headers_mut()
        .insert(header::RETRY_AFTER, HeaderValue::from(retry_after(wait)));
    page
}

/// Whole seconds, rounded up, at least 1.
fn retry_after(wait: Duration) -> u64 {
    let secs = wait.as_secs() + u64::from(wait.subsec_nanos() > 0);
    secs.max(1)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn retry_after_rounds_up_to_at_least_a_second() {
        assert_eq!(retry_after(Duration::ZERO), 1);
        assert_eq!(retry_after(Duration::from_millis(1)), 1);
        assert_eq!(retry_after(Duration::from_secs(1)), 1);
        assert_eq!(retry_after(Duration::from_millis(1001)), 2);
        assert_eq!(retry_after(Duration::from_secs(90)), 90);
    }

    #[test]
    fn a_missing_header_keys_by_address_and_addresses_are_distinct() {
        let config = RateLimitConfig {
            key: RateLimitKey::Header(http::HeaderName::from_static("x-api-key")),
            rate: 1,
            per: Duration::from_secs(60),
            burst: 1,
            max_keys: 100,
        };
        let limit = RouteLimit::new(&config, Counter::default());
        let none = HeaderMap::new();
        let mut keyed = HeaderMap::new();
        keyed.insert("x-api-key", HeaderValue::from_static("alice"));
        let a: IpAddr = "192.0.2.1".parse().unwrap();
        let mapped: IpAddr = "::ffff:192.0.2.1".parse().unwrap();
        let b: IpAddr = "192.0.2.2".parse().unwrap();
        assert!(limit.check((&none, None), a).is_none());
        // The same address written as IPv4-mapped IPv6 is the same key.
        let page = limit.check((&none, None), mapped).expect("over the limit");
        assert_eq!(page.status(), 429);
        assert_eq!(page.headers()[header::RETRY_AFTER], "60");
        assert!(limit.check((&none, None), b).is_none());
        // A header value is its own key, whatever the address.
        assert!(limit.check((&keyed, None), a).is_none());
        assert!(limit.check((&keyed, None), b).is_some());
        assert_eq!(limit.limited.get(), 2);
    }
}
