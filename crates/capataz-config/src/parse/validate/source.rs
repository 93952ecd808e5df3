//! `[pools.NAME.source]`: where a pool's backends come from (`static`, the default, `dns` or `etcd`).

use std::sync::Arc;
use std::time::Duration;

use toml::{Spanned, Value};

use super::super::raw::RawSource;
use super::{ConfigError, EtcdOwner, Validator};
use crate::{DnsRecord, DnsSource, EtcdEndpoint, EtcdSource, PoolSource};

/// The longest DNS name (RFC 1035: 255 octets on the wire, 253 written).
const MAX_NAME: usize = 253;

/// The most etcd endpoints one source may list.
const MAX_ENDPOINTS: usize = 16;

/// The longest etcd key prefix, in bytes.
const MAX_PREFIX: usize = 1024;

/// One duration of a floor and ceiling pair: its key, its raw value and its default.
type Bound<'a> = (&'a str, &'a Option<Spanned<Value>>, Duration);

impl Validator<'_> {
    /// A floor and a ceiling, under `at`, each with its default: an error on the ceiling (or
    /// the floor, when only it is written) when the ceiling is below the floor, saying `why`.
    fn duration_bounds(
        &self,
        at: &str,
        (min_key, min_raw, min_default): Bound<'_>,
        (max_key, max_raw, max_default): Bound<'_>,
        why: &str,
    ) -> Result<(Duration, Duration), ConfigError> {
        let min = self.duration(min_raw, &format!("{at}.{min_key}"), min_default)?;
        let max = self.duration(max_raw, &format!("{at}.{max_key}"), max_default)?;
        if max < min {
            return Err(self.error(
                max_raw.as_ref().or(min_raw.as_ref()).map(|v| v.span()),
                &format!("{at}.{max_key}"),
                format!("{max_key} is below {min_key} ({why})"),
            ));
        }
        Ok((min, max))
    }

    pub(super) fn source(
        &self,
        pool: &str,
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
        let kind_name = match kind {
            None | Some("static") => "static",
            Some("dns") => "dns",
            Some("etcd") => "etcd",
            Some(other) => {
                let kind_span = raw.kind.as_ref().map(|k| k.span());
                return Err(self.error(
                    kind_span,
                    &format!("{at}.kind"),
                    format!(r#"{other:?} is not a backend source (use "static", "dns" or "etcd")"#),
                ));
            }
        };
        // Each key and the kinds it belongs to.
        let keys: [(&str, bool, &[&str]); 18] = [
            ("name", raw.name.is_some(), &["dns"]),
            ("record", raw.record.is_some(), &["dns"]),
            ("port", raw.port.is_some(), &["dns"]),
            ("resolver", raw.resolver.is_some(), &["dns"]),
            ("ttl_min", raw.ttl_min.is_some(), &["dns"]),
            ("ttl_max", raw.ttl_max.is_some(), &["dns"]),
            ("timeout", raw.timeout.is_some(), &["dns", "etcd"]),
            (
                "max_drop_percent",
                raw.max_drop_percent.is_some(),
                &["dns", "etcd"],
            ),
            ("endpoints", raw.endpoints.is_some(), &["etcd"]),
            ("prefix", raw.prefix.is_some(), &["etcd"]),
            ("reconnect_min", raw.reconnect_min.is_some(), &["etcd"]),
            ("reconnect_max", raw.reconnect_max.is_some(), &["etcd"]),
            ("keepalive", raw.keepalive.is_some(), &["etcd"]),
            ("confirm_after", raw.confirm_after.is_some(), &["etcd"]),
            ("tls", raw.tls.is_some(), &["etcd"]),
            ("username", raw.username.is_some(), &["etcd"]),
            ("password", raw.password.is_some(), &["etcd"]),
            ("password_file", raw.password_file.is_some(), &["etcd"]),
        ];
        if let Some((key, _, kinds)) = keys
            .iter()
            .find(|(_, set, kinds)| *set && !kinds.contains(&kind_name))
        {
            let owner = kinds.join(" or ");
            return Err(self.error(
                Some(span),
                &format!("{at}.{key}"),
                format!(
                    r#"{key} belongs to a {owner} source, and this source is {kind_name} (set kind = "{}", or remove {key})"#,
                    kinds[0]
                ),
            ));
        }
        match kind_name {
            "dns" => self.dns_source(&at, span, raw).map(PoolSource::Dns),
            "etcd" => self.etcd_source(pool, &at, span, raw).map(PoolSource::Etcd),
            _ => Ok(PoolSource::Static),
        }
    }

    /// The etcd endpoints under `at` (`endpoints`, each with the same scheme) with their
    /// access (TLS and credentials, taken from `raw`), shared by all of them.
    pub(super) fn etcd_endpoints(
        &self,
        owner: EtcdOwner<'_>,
        at: &str,
        span: std::ops::Range<usize>,
        raw: &mut RawSource,
    ) -> Result<Vec<EtcdEndpoint>, ConfigError> {
        let Some(list) = raw.endpoints.take() else {
            return Err(self.error(
                Some(span),
                &format!("{at}.endpoints"),
                r#"etcd's endpoints are needed (add endpoints = ["http://127.0.0.1:2379"])"#.into(),
            ));
        };
        let list_span = list.span();
        let list = list.into_inner();
        if list.is_empty() || list.len() > MAX_ENDPOINTS {
            return Err(self.error(
                Some(list_span),
                &format!("{at}.endpoints"),
                format!(
                    "list 1 to {MAX_ENDPOINTS} etcd endpoints (it has {})",
                    list.len()
                ),
            ));
        }
        let mut endpoints = Vec::with_capacity(list.len());
        let mut https = None;
        for (index, value) in list.iter().enumerate() {
            let key = format!("{at}.endpoints[{index}]");
            let text = value.get_ref();
            let endpoint = etcd_endpoint(text).ok_or_else(|| {
                self.error(
                    Some(value.span()),
                    &key,
                    format!(
                        r#"{text:?} is not an etcd endpoint (use "http://host:port" or "https://host:port", e.g. "https://10.0.0.5:2379")"#
                    ),
                )
            })?;
            let secure = text.starts_with("https://");
            if *https.get_or_insert(secure) != secure {
                return Err(self.error(
                    Some(value.span()),
                    &key,
                    format!(
                        "{text:?}: the endpoints mix http:// and https:// (write every endpoint \
                         with the same scheme: https:// when etcd serves TLS)"
                    ),
                ));
            }
            endpoints.push(endpoint);
        }
        let access =
            Arc::new(self.etcd_access(owner, at, span.clone(), https == Some(true), raw)?);
        for endpoint in &mut endpoints {
            endpoint.access = access.clone();
        }
        Ok(endpoints)
    }

    /// `kind = "dns"`: the name, its records, resolver and TTL bounds.
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
        let (ttl_min, ttl_max) = self.duration_bounds(
            at,
            ("ttl_min", &raw.ttl_min, Duration::from_secs(5)),
            ("ttl_max", &raw.ttl_max, Duration::from_secs(300)),
            "the ceiling must be at least the floor",
        )?;
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

    /// `kind = "etcd"`: the endpoints, the key prefix, the watch's timings, TLS and
    /// credentials.
    fn etcd_source(
        &self,
        pool: &str,
        at: &str,
        span: std::ops::Range<usize>,
        mut raw: RawSource,
    ) -> Result<EtcdSource, ConfigError> {
        let endpoints = self.etcd_endpoints(EtcdOwner::Pool(pool), at, span.clone(), &mut raw)?;
        let Some(prefix) = raw.prefix else {
            return Err(self.error(
                Some(span),
                &format!("{at}.prefix"),
                r#"an etcd source needs the key prefix of its backends (add prefix = "/services/web/")"#
                    .into(),
            ));
        };
        let text = prefix.get_ref();
        if text.is_empty() || text.len() > MAX_PREFIX || text.chars().any(char::is_control) {
            return Err(self.error(
                Some(prefix.span()),
                &format!("{at}.prefix"),
                format!(
                    "{text:?} is not a key prefix (use 1 to {MAX_PREFIX} bytes of text without \
                     control characters, e.g. \"/services/web/\")"
                ),
            ));
        }
        let (reconnect_min, reconnect_max) = self.duration_bounds(
            at,
            (
                "reconnect_min",
                &raw.reconnect_min,
                Duration::from_millis(500),
            ),
            ("reconnect_max", &raw.reconnect_max, Duration::from_secs(30)),
            "the longest wait must be at least the first",
        )?;
        Ok(EtcdSource {
            endpoints,
            prefix: text.clone(),
            timeout: self.duration(
                &raw.timeout,
                &format!("{at}.timeout"),
                Duration::from_secs(2),
            )?,
            reconnect_min,
            reconnect_max,
            keepalive: self.duration(
                &raw.keepalive,
                &format!("{at}.keepalive"),
                Duration::from_secs(10),
            )?,
            confirm_after: self.duration(
                &raw.confirm_after,
                &format!("{at}.confirm_after"),
                Duration::from_secs(5),
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

/// `http://host:port` or `https://host:port` (a trailing `/` allowed; the port defaults to
/// 2379): the host an IP address (IPv6 in brackets) or a DNS name. Its access is plain (no
/// TLS, no credentials) until the source's settings are put in.
pub(crate) fn etcd_endpoint(text: &str) -> Option<EtcdEndpoint> {
    let rest = text
        .strip_prefix("http://")
        .or_else(|| text.strip_prefix("https://"))?;
    let rest = rest.strip_suffix('/').unwrap_or(rest);
    if rest.is_empty() || rest.contains(['/', '@', '?', '#']) {
        return None;
    }
    let (host, port) = if let Some(v6) = rest.strip_prefix('[') {
        let (ip, after) = v6.split_once(']')?;
        ip.parse::<std::net::Ipv6Addr>().ok()?;
        let port = match after {
            "" => None,
            p => Some(p.strip_prefix(':')?),
        };
        (ip.to_owned(), port)
    } else {
        match rest.rsplit_once(':') {
            Some((host, port)) => (host.to_owned(), Some(port)),
            None => (rest.to_owned(), None),
        }
    };
    let port = match port {
        None => 2379,
        Some(p) => p.parse::<u16>().ok().filter(|p| *p > 0)?,
    };
    let host_ok = host.parse::<std::net::IpAddr>().is_ok()
        || (!host.is_empty()
            && host.len() <= MAX_NAME
            && host.split('.').all(|label| {
                !label.is_empty()
                    && label.len() <= 63
                    && label
                        .bytes()
                        .all(|b| b.is_ascii_alphanumeric() || b == b'-')
            }));
    host_ok.then(|| EtcdEndpoint {
        url: text.to_owned(),
        host,
        port,
        access: Arc::default(),
    })
}

#[cfg(test)]
mod tests {
    use super::etcd_endpoint;

    #[test]
    fn etcd_endpoints_are_http_or_https_urls_with_a_host_and_an_optional_port() {
        let e = etcd_endpoint("http://127.0.0.1:2379").expect("an endpoint");
        assert_eq!((e.host.as_str(), e.port), ("127.0.0.1", 2379));
        let e = etcd_endpoint("http://etcd-1.example:12379/").expect("an endpoint");
        assert_eq!((e.host.as_str(), e.port), ("etcd-1.example", 12379));
        let e = etcd_endpoint("http://[::1]:2379").expect("an endpoint");
        assert_eq!((e.host.as_str(), e.port), ("::1", 2379));
        assert_eq!(etcd_endpoint("http://etcd").map(|e| e.port), Some(2379));
        let e = etcd_endpoint("https://etcd-1.example").expect("an endpoint");
        assert_eq!((e.host.as_str(), e.port), ("etcd-1.example", 2379));
        for bad in [
            "127.0.0.1:2379",
            "http://",
            "http://:2379",
            "http://a:0",
            "http://a:99999",
            "http://a/v3",
            "http://user@a:1",
            "http://[::1",
            "http://a b:1",
            "https://",
            "ftp://a:1",
            "unix:///run/etcd.sock",
        ] {
            assert!(etcd_endpoint(bad).is_none(), "{bad}");
        }
    }
}
