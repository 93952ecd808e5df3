//! A route's path rewrite (`strip_prefix`, `replace_prefix`, `regex_rewrite`), run once the
//! route is chosen: the backends get the new path, the query as sent; matching, the access
//! log and the metrics keep the path the client sent.

use std::borrow::Cow;

use http::uri::{Parts, PathAndQuery, Uri};

use crate::config::PathRewrite;

/// `uri` with its path rewritten by `rule` (the route's prefix is `prefix`); `None` when the
/// result is not a valid origin-form path (it must start with `/`). The new target is built in
/// one `String` (one allocation, no formatting), and an origin-form request's `Uri` is made
/// from it alone, without copying the old one.
pub(super) fn rewrite(rule: &PathRewrite, prefix: &str, uri: &Uri) -> Option<Uri> {
    let path = uri.path();
    // The new path is `head` then `tail`.
    let (head, tail): (&str, Cow<'_, str>) = match rule {
        PathRewrite::StripPrefix => {
            let rest = path.strip_prefix(prefix).unwrap_or(path);
            if rest.starts_with('/') {
                ("", Cow::Borrowed(rest))
            } else {
                ("/", Cow::Borrowed(rest))
            }
        }
        PathRewrite::ReplacePrefix(with) => match path.strip_prefix(prefix) {
            Some(rest) => (with.as_str(), Cow::Borrowed(rest)),
            None => ("", Cow::Borrowed(path)),
        },
        PathRewrite::Regex {
            pattern,
            substitution,
        } => ("", pattern.regex().replace_all(path, substitution.as_str())),
    };
    let first = if head.is_empty() { &*tail } else { head };
    if !first.starts_with('/') {
        return None;
    }
    let query = uri.query();
    let mut target =
        String::with_capacity(head.len() + tail.len() + query.map_or(0, |q| q.len() + 1));
    target.push_str(head);
    target.push_str(&tail);
    if let Some(query) = query {
        target.push('?');
        target.push_str(query);
    }
    let path_and_query = PathAndQuery::try_from(target).ok()?;
    if uri.scheme().is_none() && uri.authority().is_none() {
        return Some(Uri::from(path_and_query));
    }
    let mut parts = Parts::default();
    parts.scheme = uri.scheme().cloned();
    parts.authority = uri.authority().cloned();
    parts.path_and_query = Some(path_and_query);
    Uri::from_parts(parts).ok()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::RouteRegex;

    fn check(rule: &PathRewrite, prefix: &str, target: &str) -> Option<String> {
        rewrite(rule, prefix, &target.parse().unwrap()).map(|uri| uri.to_string())
    }

    #[test]
    fn prefixes_are_stripped_or_replaced_and_the_query_kept() {
        let strip = PathRewrite::StripPrefix;
        assert_eq!(
            check(&strip, "/api", "/api/users?a=1").as_deref(),
            Some("/users?a=1")
        );
        assert_eq!(
            check(&strip, "/api/", "/api/users").as_deref(),
            Some("/users")
        );
        assert_eq!(check(&strip, "/api", "/api").as_deref(), Some("/"));
        assert_eq!(check(&strip, "/api", "/api?x").as_deref(), Some("/?x"));
        let replace = PathRewrite::ReplacePrefix("/v2/".into());
        assert_eq!(
            check(&replace, "/api/", "/api/users").as_deref(),
            Some("/v2/users")
        );
        // An HTTP/2 request's scheme and authority stay.
        assert_eq!(
            check(&replace, "/api/", "http://app.test/api/x?y").as_deref(),
            Some("http://app.test/v2/x?y")
        );
    }

    #[test]
    fn regex_rewrites_replace_every_match_and_must_leave_a_path() {
        let rule = |pattern: &str, substitution: &str| PathRewrite::Regex {
            pattern: RouteRegex::unanchored(pattern).unwrap(),
            substitution: substitution.into(),
        };
        let version = rule("^/v([0-9]+)/(.*)", "/api/$2/version/$1");
        assert_eq!(
            check(&version, "/", "/v1/items?q=1").as_deref(),
            Some("/api/items/version/1?q=1")
        );
        assert_eq!(
            check(&rule("//+", "/"), "/", "/a//b///c").as_deref(),
            Some("/a/b/c")
        );
        // No match: the path as sent.
        assert_eq!(check(&version, "/", "/x").as_deref(), Some("/x"));
        // A result without its leading slash is refused.
        assert_eq!(check(&rule("^/", ""), "/", "/a"), None);
    }
}
