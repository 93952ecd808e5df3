//! TLS passthrough routing: a tcp listener's `[[listeners.sni_routes]]`, which send each
//! session to a pool by the server name its ClientHello asks for, without terminating TLS
//! (HAProxy `req.ssl_sni` + `use_backend`, nginx `ssl_preread` + `map`, Envoy
//! `tls_inspector` + `server_names`).
//!
//! Matching is the same as nginx's `map ... hostnames` and Envoy's filter chains: an exact name
//! first, then the longest wildcard suffix; case never matters. Validation guarantees that no
//! pattern is written twice, so the choice never depends on the order of the routes.

use std::time::Duration;

/// How long a client has to send its whole ClientHello by default (`inspect_timeout`).
pub const DEFAULT_INSPECT_TIMEOUT: Duration = Duration::from_secs(5);

/// The most bytes of a ClientHello read before routing (its TLS records); a larger one closes
/// the connection. nginx's `preread_buffer_size` and HAProxy's buffer are 16 KiB as well.
pub const MAX_CLIENT_HELLO: usize = 16384;

/// A server name pattern, lowercase.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum ServerNamePattern {
    /// `shop.example.com`: that name only.
    Exact(String),
    /// `*.example.com`, kept as `.example.com`: any name ending so (`a.example.com`,
    /// `a.b.example.com`), not `example.com` itself.
    Suffix(String),
}

impl ServerNamePattern {
    /// The pattern as written in the config (lowercase).
    pub fn as_written(&self) -> String {
        match self {
            ServerNamePattern::Exact(name) => name.clone(),
            ServerNamePattern::Suffix(suffix) => format!("*{suffix}"),
        }
    }
}

/// One route: the sessions whose SNI matches one of `server_names` go to `pool`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SniRoute {
    /// The patterns, at least one.
    pub server_names: Vec<ServerNamePattern>,
    /// The index of the pool in [`Config::pools`](crate::Config::pools); its `protocol` is
    /// `"tcp"`.
    pub pool: usize,
}

/// A tcp listener's routing by SNI.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SniRouting {
    /// The routes, as written.
    pub routes: Vec<SniRoute>,
    /// How long a client has to send its ClientHello (`inspect_timeout`).
    pub inspect_timeout: Duration,
}

/// The route a server name matched, and by which pattern.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SniMatch<'a> {
    /// The route's index in [`SniRouting::routes`].
    pub route: usize,
    /// The pattern that matched.
    pub pattern: &'a ServerNamePattern,
}

impl SniRouting {
    /// The route for `server_name` (any case): the route naming it exactly, else the one whose
    /// wildcard has the longest suffix it ends with; `None` when none matches.
    pub fn route(&self, server_name: &str) -> Option<SniMatch<'_>> {
        let mut best: Option<(usize, SniMatch<'_>)> = None;
        for (route, written) in self.routes.iter().enumerate() {
            for pattern in &written.server_names {
                let specificity = match pattern {
                    ServerNamePattern::Exact(name) if name.eq_ignore_ascii_case(server_name) => {
                        return Some(SniMatch { route, pattern });
                    }
                    ServerNamePattern::Exact(_) => continue,
                    ServerNamePattern::Suffix(suffix) if ends_with(server_name, suffix) => {
                        suffix.len()
                    }
                    ServerNamePattern::Suffix(_) => continue,
                };
                if best.is_none_or(|(longest, _)| specificity > longest) {
                    best = Some((specificity, SniMatch { route, pattern }));
                }
            }
        }
        best.map(|(_, found)| found)
    }
}

/// Whether `name` ends with `suffix` (which starts with a dot) and has a label before it.
fn ends_with(name: &str, suffix: &str) -> bool {
    name.len() > suffix.len()
        && name
            .get(name.len() - suffix.len()..)
            .is_some_and(|end| end.eq_ignore_ascii_case(suffix))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn routing(routes: &[&[&str]]) -> SniRouting {
        let pattern = |p: &&str| match p.strip_prefix('*') {
            Some(suffix) => ServerNamePattern::Suffix(suffix.into()),
            None => ServerNamePattern::Exact(p.to_string()),
        };
        SniRouting {
            routes: routes
                .iter()
                .enumerate()
                .map(|(pool, names)| SniRoute {
                    server_names: names.iter().map(pattern).collect(),
                    pool,
                })
                .collect(),
            inspect_timeout: DEFAULT_INSPECT_TIMEOUT,
        }
    }

    #[test]
    fn exact_names_win_then_the_longest_wildcard_in_any_case() {
        let routes = routing(&[
            &["*.example.com"],
            &["shop.example.com", "*.eu.example.com"],
            &["api.eu.example.com"],
        ]);
        let at = |name: &str| routes.route(name).map(|m| m.route);
        assert_eq!(at("shop.example.com"), Some(1));
        assert_eq!(at("SHOP.Example.COM"), Some(1), "case never matters");
        assert_eq!(at("www.example.com"), Some(0));
        assert_eq!(at("a.b.example.com"), Some(0), "a wildcard spans labels");
        assert_eq!(at("www.eu.example.com"), Some(1), "the longer suffix");
        assert_eq!(
            at("api.eu.example.com"),
            Some(2),
            "exact beats any wildcard"
        );
        assert_eq!(
            at("example.com"),
            None,
            "a wildcard needs a label before it"
        );
        assert_eq!(at(".example.com"), None);
        assert_eq!(at("example.org"), None);
        assert_eq!(at(""), None);
        let found = routes
            .route("x.eu.example.com")
            .map(|m| m.pattern.as_written());
        assert_eq!(found.as_deref(), Some("*.eu.example.com"));
    }
}
