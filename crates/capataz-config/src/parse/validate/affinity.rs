//! `[pools.NAME]`'s affinity keys: `hash_key` and `hash_balance_factor` (only with
//! `algorithm = "hash"`), and the `[pools.NAME.sticky]` table.

use std::ops::Range;

use toml::Spanned;

use super::super::raw::{RawOnDrain, RawPool, RawSameSite, RawSticky};
use super::{ConfigError, Validator};
use crate::{Affinity, Algorithm, HashConfig, HashKey, OnDrain, SameSite, StickyConfig};

/// What `hash_key` takes, for its error messages.
const HASH_KEYS: &str = r#"use "client_ip", "path", "header:NAME", "cookie:NAME" or "query:NAME", e.g. "header:X-User""#;

impl Validator<'_> {
    /// The pool's hashing (with `algorithm = "hash"`; its keys refused otherwise) and sticky
    /// sessions.
    pub(super) fn affinity(
        &self,
        at: &str,
        name_span: &Range<usize>,
        algorithm: Algorithm,
        raw: &mut RawPool,
    ) -> Result<Affinity, ConfigError> {
        let hash = if algorithm == Algorithm::Hash {
            let key = match &raw.hash_key {
                None => HashKey::ClientIp,
                Some(text) => self.hash_key(&format!("{at}.hash_key"), text)?,
            };
            let factor_at = format!("{at}.hash_balance_factor");
            let balance_factor = self.int(&raw.hash_balance_factor, &factor_at, 0, 0..=10_000)?;
            if (1..=100).contains(&balance_factor) {
                return Err(self.error(
                    raw.hash_balance_factor.as_ref().map(Spanned::span),
                    &factor_at,
                    format!(
                        "{balance_factor} would cap every backend below the average load \
                         (use a percentage above 100, e.g. 150, or 0 to turn bounded loads off)"
                    ),
                ));
            }
            Some(HashConfig {
                key,
                balance_factor: balance_factor as u32,
            })
        } else {
            let given = [
                ("hash_key", raw.hash_key.as_ref().map(Spanned::span)),
                (
                    "hash_balance_factor",
                    raw.hash_balance_factor.as_ref().map(Spanned::span),
                ),
            ];
            if let Some((key, span)) = given.into_iter().find(|(_, span)| span.is_some()) {
                return Err(self.error(
                    span.or(Some(name_span.clone())),
                    &format!("{at}.{key}"),
                    format!(r#"{key} applies only to a hashing pool (add algorithm = "hash", or remove {key})"#),
                ));
            }
            None
        };
        let sticky = match raw.sticky.take() {
            None => None,
            Some(sticky) => Some(self.sticky(&format!("{at}.sticky"), sticky)?),
        };
        Ok(Affinity { hash, sticky })
    }

    /// `hash_key`: `client_ip`, `path`, `header:NAME`, `cookie:NAME` or `query:NAME`.
    fn hash_key(&self, key: &str, text: &Spanned<String>) -> Result<HashKey, ConfigError> {
        let bad = |why: String| self.error(Some(text.span()), key, why);
        let value = text.get_ref().as_str();
        let parsed = match value.split_once(':') {
            None if value == "client_ip" => HashKey::ClientIp,
            None if value == "path" => HashKey::Path,
            None => return Err(bad(format!("{value:?} is not a hash key ({HASH_KEYS})"))),
            Some((kind, name)) => {
                if name.is_empty() || name.len() > 256 {
                    return Err(bad(format!(
                        "{value:?} names no {kind} (write its name after the colon, 1 to 256 characters: {HASH_KEYS})"
                    )));
                }
                match kind {
                    "header" if is_token(name) => match http::HeaderName::from_bytes(name.as_bytes()) {
                        Ok(header) => HashKey::Header(header),
                        Err(_) => return Err(bad(format!("{name:?} is not a header name"))),
                    },
                    "cookie" if is_token(name) => HashKey::Cookie(name.to_owned()),
                    "query" if is_query_name(name) => HashKey::Query(name.to_owned()),
                    "header" | "cookie" | "query" => {
                        return Err(bad(format!(
                            "{name:?} is not a {kind} name (use letters, digits and -_.!#$%&'*+^`|~, e.g. \"{kind}:user\")"
                        )))
                    }
                    _ => return Err(bad(format!("{value:?} is not a hash key ({HASH_KEYS})"))),
                }
            }
        };
        Ok(parsed)
    }

    /// `[pools.NAME.sticky]`: the cookie's name (required) and attributes, and `on_drain`.
    fn sticky(&self, at: &str, raw: RawSticky) -> Result<StickyConfig, ConfigError> {
        let Some(cookie) = &raw.cookie else {
            return Err(self.error(
                None,
                &format!("{at}.cookie"),
                r#"sticky sessions need the cookie's name (add cookie = "SRV" under the sticky table)"#.into(),
            ));
        };
        if !is_token(cookie.get_ref()) || cookie.get_ref().len() > 256 {
            return Err(self.error(
                Some(cookie.span()),
                &format!("{at}.cookie"),
                format!(
                    "{:?} is not a cookie name (use 1 to 256 letters, digits and -_.!#$%&'*+^`|~, e.g. \"SRV\")",
                    cookie.get_ref()
                ),
            ));
        }
        let path = match &raw.path {
            None => "/".to_owned(),
            Some(path) => {
                let text = path.get_ref();
                let fits = text.starts_with('/')
                    && text.len() <= 1024
                    && !text
                        .chars()
                        .any(|c| c == ';' || c.is_whitespace() || c.is_control());
                if !fits {
                    return Err(self.error(
                        Some(path.span()),
                        &format!("{at}.path"),
                        format!("{text:?} is not a cookie path (start with '/', no ';', spaces or control characters, e.g. \"/\")"),
                    ));
                }
                text.clone()
            }
        };
        let max_age = self.optional_duration(&raw.max_age, &format!("{at}.max_age"))?;
        let secure = raw.secure.unwrap_or(false);
        let same_site = match raw.samesite {
            None | Some(RawSameSite::Lax) => SameSite::Lax,
            Some(RawSameSite::Strict) => SameSite::Strict,
            Some(RawSameSite::None) => SameSite::None,
        };
        if same_site == SameSite::None && !secure {
            return Err(self.error(
                None,
                &format!("{at}.samesite"),
                r#"browsers drop a SameSite=None cookie that is not Secure (add secure = true, or use samesite = "lax")"#.into(),
            ));
        }
        Ok(StickyConfig {
            cookie: cookie.get_ref().clone(),
            path,
            max_age,
            secure,
            http_only: raw.httponly.unwrap_or(true),
            same_site,
            on_drain: match raw.on_drain {
                None | Some(RawOnDrain::Keep) => OnDrain::Keep,
                Some(RawOnDrain::Move) => OnDrain::Move,
            },
        })
    }
}

/// An HTTP token (RFC 9110 `tchar`s): a header's or a cookie's name.
fn is_token(text: &str) -> bool {
    !text.is_empty()
        && text
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&b))
}

/// A query parameter's name as sent: printable ASCII, no `&`, `=`, `#` or space.
fn is_query_name(text: &str) -> bool {
    text.bytes()
        .all(|b| b.is_ascii_graphic() && !matches!(b, b'&' | b'=' | b'#'))
}
