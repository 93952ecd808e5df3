//! `[pools.NAME.source]`: where a pool's backends come from (`static`, the default, or `dns`).

use std::time::Duration;

use toml::Spanned;

use super::super::raw::RawSource;
use super::{ConfigError, Validator};
use crate::config::{DnsRecord, DnsSource, PoolSource};

/// The longest DNS name (RFC 1035: 255 octets on the wire, 253 written).
const MAX_NAME: usize = 253;

impl Validator<'_> {
    pub(super) fn source(
        &self,
        at: &str,
        raw: Option<Spanned<RawSource>>,
    ) -> Result<PoolSource, ConfigError> {
        let Some(raw) = raw else {
            return Ok(PoolSource::Static);
        };
        let span = raw.span();
        let raw = raw.into_inner();
        let at = format!("{at}.source");
        let kind = raw.kind.as_ref().map(|k| k.get_ref().as_str());
        match kind {
            None | Some("static") => {
                let extra = [
                    ("name", raw.name.is_some()),
                    ("record", raw.record.is_some()),
                    ("port", raw.port.is_some()),
                    ("resolver", raw.resolver.is_some()),
                    ("ttl_min", raw.ttl_min.is_some()),
                    ("ttl_max", raw.ttl_max.is_some()),
                    ("timeout", raw.timeout.is_some()),
                    ("max_drop_percent", raw.max_drop_percent.is_some()),
                ];
                if let Some((key, _)) = extra.iter().find(|(_, set)| *set) {
                    return Err(self.error(
                        Some(span),
                        &format!("{at}.{key}"),
                        format!(
                            r#"{key} belongs to a dns source, and this source is static (set kind = "dns", or remove {key})"#
                        ),
                    ));
                }
                Ok(PoolSource::Static)
            }
            Some("dns") => self.dns_source(&at, span, raw).map(PoolSource::Dns),
            Some(other) => {
                let kind_span = raw.kind.as_ref().map(|k| k.span());
                Err(self.error(
                    kind_span,
                    &format!("{at}.kind"),
                    format!(r#"{other:?} is not a backend source (use "static" or "dns")"#),
                ))
            }
        }
    }

    fn dns_source(
        &self,
        at: &str,
        span: std::ops::Range<usize>,
        raw: RawSource,
    ) -> Result<DnsSource, ConfigError> {
        let Some(name) = raw.name else {
            return Err(self.error(
                Some(span),
                &format!("{at}.name"),
                r#"a dns source needs the name to resolve (add name = "web.service.example.")"#
                    .into(),
            ));
        };
        let text = name.get_ref();
        let valid = !text.is_empty()
            && text.len() <= MAX_NAME
            && text.trim_end_matches('.').split('.').all(|label| {
                !label.is_empty()
                    && label.len() <= 63
                    && label
                        .bytes()
                        .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_'))
            });
        if !valid {
            return Err(self.error(
                Some(name.span()),
                &format!("{at}.name"),
                format!(
                    r#"{text:?} is not a DNS name (use labels of letters, digits, '-' and '_' separated by dots, e.g. "_http._tcp.web.example.")"#
                ),
            ));
        }
        let srv = match raw.record.as_ref().map(|r| r.get_ref().as_str()) {
            None | Some("a") => false,
            Some("srv") => true,
            Some(other) => {
                return Err(self.error(
                    raw.record.as_ref().map(|r| r.span()),
                    &format!("{at}.record"),
                    format!(
                        r#"{other:?} is not a record type here (use "a" for A and AAAA records with a port, or "srv")"#
                    ),
                ));
            }
        };
        let record = match (srv, &raw.port) {
            (true, Some(port)) => {
                return Err(self.error(
                    Some(port.span()),
                    &format!("{at}.port"),
                    "SRV records carry their own ports (remove port)".into(),
                ));
            }
            (true, None) => DnsRecord::Srv,
            (false, None) => {
                return Err(self.error(
                    Some(span),
                    &format!("{at}.port"),
                    "A and AAAA records carry no port (add port = 8080, or use record = \"srv\")"
                        .into(),
                ));
            }
            (false, port) => DnsRecord::Address {
                port: self.int(port, &format!("{at}.port"), 0, 1..=65_535)? as u16,
            },
        };
        let resolver = match &raw.resolver {
            None => None,
            Some(value) => Some(self.socket_addr(value, &format!("{at}.resolver"))?),
        };
        let ttl_min = self.duration(
            &raw.ttl_min,
            &format!("{at}.ttl_min"),
            Duration::from_secs(5),
        )?;
        let ttl_max = self.duration(
            &raw.ttl_max,
            &format!("{at}.ttl_max"),
            Duration::from_secs(300),
        )?;
        if ttl_max < ttl_min {
            return Err(self.error(
                raw.ttl_max
                    .as_ref()
                    .or(raw.ttl_min.as_ref())
                    .map(|v| v.span()),
                &format!("{at}.ttl_max"),
                "ttl_max is below ttl_min (the ceiling must be at least the floor)".into(),
            ));
        }
        Ok(DnsSource {
            name: text.clone(),
            record,
            resolver,
            ttl_min,
            ttl_max,
            timeout: self.duration(
                &raw.timeout,
                &format!("{at}.timeout"),
                Duration::from_secs(2),
            )?,
            max_drop_percent: self.int(
                &raw.max_drop_percent,
                &format!("{at}.max_drop_percent"),
                50,
                0..=100,
            )? as u8,
        })
    }
}
