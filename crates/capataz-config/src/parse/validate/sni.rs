//! A tcp listener's TLS passthrough routes: `[[listeners.sni_routes]]` (each `server_names` and
//! a `pool`) and `inspect_timeout`. Every pattern is a DNS name or a `*.` wildcard, written once
//! across the listener's routes (so the route a name takes never depends on their order); the
//! pools have `protocol = "tcp"`; a listener that terminates TLS (`[listeners.tls]`) cannot
//! pass it through.

use std::collections::HashMap;

use rustls::pki_types::DnsName;

use super::super::raw::RawListener;
use super::{ConfigError, Validator};
use crate::{PoolConfig, ServerNamePattern, SniRoute, SniRouting, DEFAULT_INSPECT_TIMEOUT};

/// The longest server name (RFC 1035's limit on a DNS name).
const MAX_NAME: usize = 253;

/// The first TLS passthrough key written on `raw`, if any (an error on an HTTP listener).
pub(super) fn sni_key(raw: &RawListener) -> Option<&'static str> {
    if !raw.sni_routes.is_empty() {
        Some("sni_routes")
    } else if raw.inspect_timeout.is_some() {
        Some("inspect_timeout")
    } else {
        None
    }
}

impl Validator<'_> {
    /// The routing of the tcp listener `raw` at `at` by SNI: `None` without `sni_routes`.
    pub(super) fn sni_routing(
        &self,
        at: &str,
        raw: &RawListener,
        pools: &[PoolConfig],
    ) -> Result<Option<SniRouting>, ConfigError> {
        if raw.sni_routes.is_empty() {
            if let Some(timeout) = &raw.inspect_timeout {
                return Err(self.error(
                    Some(timeout.span()),
                    &format!("{at}.inspect_timeout"),
                    "inspect_timeout bounds the wait for a ClientHello to route by, and this \
                     listener has no [[listeners.sni_routes]] (add routes, or remove \
                     inspect_timeout)"
                        .into(),
                ));
            }
            return Ok(None);
        }
        if raw.tls.is_some() {
            return Err(self.error(
                Some(raw.sni_routes[0].span()),
                &format!("{at}.sni_routes"),
                "sni_routes pass TLS through to the backends untouched, and this listener \
                 terminates TLS with [listeners.tls] (remove tls to pass it through, or remove \
                 sni_routes)"
                    .into(),
            ));
        }
        let mut seen: HashMap<ServerNamePattern, usize> = HashMap::new();
        let mut routes = Vec::with_capacity(raw.sni_routes.len());
        for (index, route) in raw.sni_routes.iter().enumerate() {
            let at = format!("{at}.sni_routes[{index}]");
            let span = route.span();
            let route = route.get_ref();
            let Some(pool) = &route.pool else {
                return Err(self.error(
                    Some(span),
                    &format!("{at}.pool"),
                    "a route names the pool its sessions go to (add pool = NAME, a pool with \
                     protocol = \"tcp\")"
                        .into(),
                ));
            };
            let pool = self.tcp_pool_index(&format!("{at}.pool"), pool, pools)?;
            let key = format!("{at}.server_names");
            let names = match &route.server_names {
                Some(names) if !names.is_empty() => names,
                _ => {
                    return Err(self.error(
                        Some(span),
                        &key,
                        "a route needs at least one server name (server_names = \
                         [\"shop.example.com\", \"*.example.com\"])"
                            .into(),
                    ))
                }
            };
            let mut server_names = Vec::with_capacity(names.len());
            for name in names {
                let Some(pattern) = pattern(name.get_ref()) else {
                    return Err(self.error(
                        Some(name.span()),
                        &key,
                        format!(
                            "{:?} is not a server name (write a DNS name, \"shop.example.com\", \
                             or a wildcard for the names below one, \"*.example.com\")",
                            name.get_ref()
                        ),
                    ));
                };
                if let Some(first) = seen.insert(pattern.clone(), index) {
                    return Err(self.error(
                        Some(name.span()),
                        &key,
                        format!(
                            "{:?} is also in sni_routes[{first}] (a name routes to one pool: \
                             write it once)",
                            name.get_ref()
                        ),
                    ));
                }
                server_names.push(pattern);
            }
            routes.push(SniRoute { server_names, pool });
        }
        let inspect_timeout = self.duration(
            &raw.inspect_timeout,
            &format!("{at}.inspect_timeout"),
            DEFAULT_INSPECT_TIMEOUT,
        )?;
        Ok(Some(SniRouting {
            routes,
            inspect_timeout,
        }))
    }
}

/// The pattern `written` says, lowercase: a DNS name (not an IP address: SNI never carries
/// one), or `*.` and a DNS name; `None` for anything else.
fn pattern(written: &str) -> Option<ServerNamePattern> {
    let lower = written.to_ascii_lowercase();
    let (name, wildcard) = match lower.strip_prefix("*.") {
        Some(rest) => (rest, true),
        None => (lower.as_str(), false),
    };
    let valid = name.len() <= MAX_NAME
        && !name.ends_with('.')
        && name.parse::<std::net::IpAddr>().is_err()
        && DnsName::try_from(name).is_ok();
    match (valid, wildcard) {
        (false, _) => None,
        (true, true) => Some(ServerNamePattern::Suffix(format!(".{name}"))),
        (true, false) => Some(ServerNamePattern::Exact(lower)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn patterns_are_dns_names_or_wildcards_in_lowercase() {
        let exact = |n: &str| Some(ServerNamePattern::Exact(n.into()));
        let suffix = |n: &str| Some(ServerNamePattern::Suffix(n.into()));
        assert_eq!(pattern("Shop.Example.com"), exact("shop.example.com"));
        assert_eq!(pattern("localhost"), exact("localhost"));
        assert_eq!(pattern("*.Example.com"), suffix(".example.com"));
        for bad in [
            "",
            "*",
            "*.",
            "a.*.example.com",
            "*example.com",
            "**.example.com",
            "10.0.0.1",
            "::1",
            "shop example.com",
            "shop.example.com.",
            "a..b",
            "-",
            "é.example.com",
        ] {
            assert_eq!(pattern(bad), None, "{bad:?}");
        }
        assert_eq!(pattern(&"a".repeat(254)), None);
    }
}
