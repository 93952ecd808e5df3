//! A route's matchers beyond host and path prefix, run on a request: all must match.
//!
//! Everything is compared as the client sent it: the path without its query, not
//! percent-decoded nor normalized (as `path_prefix` is); query parameters split on `&` and
//! at their first `=`, not decoded. Each matcher is linear in what it reads (the `regex` crate
//! never backtracks), and what it reads is bounded by the listener's `max_header_bytes`.
//! Nothing allocates.

use http::{HeaderMap, Method, Uri};

use crate::config::{QueryMatch, RouteMatch};

/// Whether the request (`method`, `uri`, `headers`) satisfies every matcher of `rules`.
pub(super) fn matches(rules: &RouteMatch, method: &Method, uri: &Uri, headers: &HeaderMap) -> bool {
    if !rules.methods.is_empty() && !rules.methods.contains(method) {
        return false;
    }
    let path = uri.path();
    if rules.path.as_deref().is_some_and(|want| want != path) {
        return false;
    }
    if rules
        .path_regex
        .as_ref()
        .is_some_and(|regex| !regex.is_match(path))
    {
        return false;
    }
    let headers_ok = rules.headers.iter().all(|rule| {
        headers
            .get_all(&rule.name)
            .iter()
            .any(|value| rule.value.matches(value.as_bytes()))
    });
    headers_ok
        && rules
            .query
            .iter()
            .all(|rule| query_matches(rule, uri.query().unwrap_or("")))
}

/// Whether one parameter of `query` is named as `rule` says and holds what it says.
fn query_matches(rule: &QueryMatch, query: &str) -> bool {
    query.split('&').any(|pair| {
        let (name, value) = pair.split_once('=').unwrap_or((pair, ""));
        name == rule.name && rule.value.matches(value.as_bytes())
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::{HeaderMatch, RouteRegex, ValueMatch};
    use http::HeaderValue;

    fn check(rules: &RouteMatch, method: &str, target: &str, headers: &[(&str, &str)]) -> bool {
        let mut map = HeaderMap::new();
        for (name, value) in headers {
            map.append(
                http::HeaderName::from_bytes(name.as_bytes()).unwrap(),
                HeaderValue::from_str(value).unwrap(),
            );
        }
        let method = Method::from_bytes(method.as_bytes()).unwrap();
        matches(rules, &method, &target.parse().unwrap(), &map)
    }

    #[test]
    fn every_matcher_must_match() {
        let rules = RouteMatch {
            methods: vec![Method::GET, Method::HEAD],
            path_regex: Some(RouteRegex::new("/items/[0-9]+").unwrap()),
            headers: vec![HeaderMatch {
                name: http::HeaderName::from_static("x-canary"),
                value: ValueMatch::Exact("1".into()),
            }],
            query: vec![QueryMatch {
                name: "v".into(),
                value: ValueMatch::Regex(RouteRegex::new("[0-9]").unwrap()),
            }],
            ..RouteMatch::default()
        };
        let canary = [("x-canary", "1")];
        assert!(check(&rules, "GET", "/items/12?a=b&v=2", &canary));
        // One of several fields of the same name is enough.
        assert!(check(
            &rules,
            "HEAD",
            "/items/1?v=2",
            &[("X-Canary", "0"), ("X-Canary", "1")]
        ));
        assert!(!check(&rules, "POST", "/items/12?v=2", &canary));
        assert!(!check(&rules, "GET", "/items/12/x?v=2", &canary));
        assert!(!check(&rules, "GET", "/items/12?v=22", &canary));
        assert!(!check(&rules, "GET", "/items/12", &canary));
        assert!(!check(
            &rules,
            "GET",
            "/items/12?v=2",
            &[("x-canary", "10")]
        ));
        assert!(!check(&rules, "GET", "/items/12?v=2", &[]));
    }

    #[test]
    fn exact_path_ignores_the_query_and_is_not_decoded() {
        let rules = RouteMatch {
            path: Some("/login".into()),
            ..RouteMatch::default()
        };
        assert!(check(&rules, "GET", "/login?next=/", &[]));
        assert!(!check(&rules, "GET", "/login/", &[]));
        assert!(!check(&rules, "GET", "/%6Cogin", &[]));
    }

    #[test]
    fn query_parameters_split_at_their_first_equals_sign() {
        let rule = |value| QueryMatch {
            name: "a".into(),
            value,
        };
        assert!(query_matches(&rule(ValueMatch::Present), "x=1&a"));
        assert!(query_matches(&rule(ValueMatch::Exact(String::new())), "a="));
        assert!(query_matches(
            &rule(ValueMatch::Exact("b=c".into())),
            "a=b=c"
        ));
        assert!(!query_matches(&rule(ValueMatch::Present), "ab=1&b=a"));
        assert!(!query_matches(&rule(ValueMatch::Present), ""));
    }

    #[test]
    fn a_path_regex_on_a_long_path_answers_quickly() {
        // A pattern that backtracking engines take exponential time on.
        let rules = RouteMatch {
            path_regex: Some(RouteRegex::new("/(a+)+b").unwrap()),
            ..RouteMatch::default()
        };
        let path = format!("/{}", "a".repeat(60_000));
        let started = std::time::Instant::now();
        assert!(!check(&rules, "GET", &path, &[]));
        assert!(started.elapsed() < std::time::Duration::from_secs(2));
    }
}
