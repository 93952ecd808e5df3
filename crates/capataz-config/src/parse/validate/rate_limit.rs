//! A route's `rate_limit` table: the key its buckets are kept by, the rate, the burst and
//! the most keys remembered.

use std::time::Duration;

use super::super::raw::RawRateLimit;
use super::{ConfigError, Validator};
use crate::{RateLimitConfig, RateLimitKey, DEFAULT_RATE_LIMIT_KEYS};

/// The largest `rate` and `burst`.
const MAX_RATE: i64 = 1_000_000;

impl Validator<'_> {
    /// Route `at`'s rate limit.
    pub(super) fn rate_limit(
        &self,
        at: &str,
        raw: RawRateLimit,
    ) -> Result<RateLimitConfig, ConfigError> {
        let at = format!("{at}.rate_limit");
        let key = match &raw.key {
            None => {
                return Err(self.error(
                    None,
                    &format!("{at}.key"),
                    r#"a rate limit needs a key (key = "client_ip", or "header:NAME")"#.into(),
                ))
            }
            Some(written) => match written.get_ref().as_str() {
                "client_ip" => RateLimitKey::ClientIp,
                text => match text
                    .strip_prefix("header:")
                    .and_then(|name| http::HeaderName::from_bytes(name.trim().as_bytes()).ok())
                {
                    Some(name) => RateLimitKey::Header(name),
                    None => {
                        return Err(self.error(
                            Some(written.span()),
                            &format!("{at}.key"),
                            format!(
                                r#"{text:?} is not a rate limit key (use "client_ip", or "header:" and a header name, e.g. "header:X-Api-Key")"#
                            ),
                        ))
                    }
                },
            },
        };
        let Some(rate) = &raw.rate else {
            return Err(self.error(
                None,
                &format!("{at}.rate"),
                "a rate limit needs a rate (requests per `per`, e.g. rate = 100)".into(),
            ));
        };
        let rate = self.int(&Some(rate.clone()), &format!("{at}.rate"), 1, 1..=MAX_RATE)? as u32;
        let per = self.duration(&raw.per, &format!("{at}.per"), Duration::from_secs(1))?;
        if per < Duration::from_millis(1) {
            return Err(self.error(
                raw.per.as_ref().map(|p| p.span()),
                &format!("{at}.per"),
                r#"the period must be at least 1ms (e.g. "1s", "1m")"#.into(),
            ));
        }
        let burst = self.int(
            &raw.burst,
            &format!("{at}.burst"),
            i64::from(rate),
            1..=MAX_RATE,
        )? as u32;
        let max_keys = self.int(
            &raw.max_keys,
            &format!("{at}.max_keys"),
            DEFAULT_RATE_LIMIT_KEYS as i64,
            1..=10_000_000,
        )? as usize;
        Ok(RateLimitConfig {
            key,
            rate,
            per,
            burst,
            max_keys,
        })
    }
}
