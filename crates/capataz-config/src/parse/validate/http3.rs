//! `[listeners.tls.http3]` (see `http3`).

use super::super::raw::RawHttp3;
use super::{ConfigError, Validator};
use crate::Http3Config;

impl Validator<'_> {
    /// `[listeners.tls]`'s `http3` table (`at` is the TLS table's path).
    pub(super) fn http3(&self, at: &str, raw: RawHttp3) -> Result<Http3Config, ConfigError> {
        let at = format!("{at}.http3");
        let default = Http3Config::DEFAULT;
        let port = match &raw.port {
            None => None,
            some => Some(self.int(some, &format!("{at}.port"), 0, 1..=65_535)? as u16),
        };
        let max_streams = self.int(
            &raw.max_streams,
            &format!("{at}.max_streams"),
            i64::from(default.max_streams),
            1..=10_000,
        )? as u32;
        let retry_threshold = self.int(
            &raw.retry_threshold,
            &format!("{at}.retry_threshold"),
            i64::from(default.retry_threshold),
            0..=1_000_000,
        )? as u32;
        let alt_svc_max_age = self.duration(
            &raw.alt_svc_max_age,
            &format!("{at}.alt_svc_max_age"),
            default.alt_svc_max_age,
        )?;
        Ok(Http3Config {
            port,
            max_streams,
            alt_svc_max_age,
            retry_threshold,
        })
    }
}
