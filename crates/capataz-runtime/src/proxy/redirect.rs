//! A route's redirect (`redirect`), answered by capataz: the request's URL with what the
//! route gives replaced, in `Location`.

use http::header::{self, HeaderValue};
use http::{Response, StatusCode, Uri};

use super::headers::strip_port;
use super::pages::error_page;
use crate::body::RespBody;
use crate::config::{Redirect, RedirectPath};

/// The answer redirecting a request for `uri` with host `host` (as sent, port included; none
/// for an HTTP/1.0 request without one) over `tls` or not, by `rule`, on a route whose
/// prefix is `prefix`. A request without a host, to a redirect that does not name one, gets
/// `400`.
pub(super) fn redirect_page(
    rule: &Redirect,
    prefix: &str,
    host: Option<&str>,
    uri: &Uri,
    tls: bool,
) -> Response<RespBody> {
    let request_scheme = if tls { "https" } else { "http" };
    let scheme = rule.scheme.as_deref().unwrap_or(request_scheme);
    let sent = host.filter(|h| !h.is_empty());
    let Some(name) = rule.host.as_deref().or(sent.map(strip_port)) else {
        return error_page(
            StatusCode::BAD_REQUEST,
            "a redirect needs the request's host",
        );
    };
    // The request's port stays only when the redirect keeps its scheme and host.
    let kept_port = (rule.scheme.is_none() && rule.host.is_none())
        .then(|| sent.and_then(|h| h.strip_prefix(strip_port(h))?.strip_prefix(':')))
        .flatten()
        .and_then(|port| port.parse::<u16>().ok());
    let default_port = if scheme == "https" { 443 } else { 80 };
    let port = rule.port.or(kept_port).filter(|p| *p != default_port);
    let path = uri.path();
    let mut location = format!("{scheme}://{name}");
    if let Some(port) = port {
        location.push(':');
        location.push_str(&port.to_string());
    }
    match &rule.path {
        RedirectPath::Same => location.push_str(path),
        RedirectPath::Replace(with) => location.push_str(with),
        RedirectPath::Prefix(with) => {
            location.push_str(with);
            location.push_str(path.strip_prefix(prefix).unwrap_or(path));
        }
    }
    if let (Some(query), false) = (uri.query(), rule.strip_query) {
        location.push('?');
        location.push_str(query);
    }
    let Ok(value) = HeaderValue::from_str(&location) else {
        return error_page(StatusCode::BAD_REQUEST, "the request's host or path");
    };
    let status = StatusCode::from_u16(rule.status).unwrap_or(StatusCode::FOUND);
    let mut page = error_page(status, &location);
    page.headers_mut().insert(header::LOCATION, value);
    page
}

#[cfg(test)]
mod tests {
    use super::*;

    fn location(rule: &Redirect, host: Option<&str>, target: &str, tls: bool) -> String {
        let page = redirect_page(rule, "/old/", host, &target.parse().unwrap(), tls);
        page.headers()
            .get(header::LOCATION)
            .map(|v| format!("{} {}", page.status().as_u16(), v.to_str().unwrap()))
            .unwrap_or_else(|| page.status().as_u16().to_string())
    }

    fn rule() -> Redirect {
        Redirect {
            status: 302,
            scheme: None,
            host: None,
            port: None,
            path: RedirectPath::Same,
            strip_query: false,
        }
    }

    #[test]
    fn redirects_replace_what_they_name() {
        let https = Redirect {
            scheme: Some("https".into()),
            status: 301,
            ..rule()
        };
        assert_eq!(
            location(&https, Some("app.test:8080"), "/a?b", false),
            "301 https://app.test/a?b"
        );
        let moved = Redirect {
            host: Some("new.test".into()),
            path: RedirectPath::Prefix("/new/".into()),
            strip_query: true,
            ..rule()
        };
        assert_eq!(
            location(&moved, Some("app.test"), "/old/x?y", true),
            "302 https://new.test/new/x"
        );
        // Neither scheme nor host given: the request's port stays.
        let path = Redirect {
            path: RedirectPath::Replace("/login".into()),
            ..rule()
        };
        assert_eq!(
            location(&path, Some("[::1]:8080"), "/x?y", false),
            "302 http://[::1]:8080/login?y"
        );
        let port = Redirect {
            port: Some(8443),
            scheme: Some("https".into()),
            ..rule()
        };
        assert_eq!(
            location(&port, Some("app.test:80"), "/", false),
            "302 https://app.test:8443/"
        );
        assert_eq!(location(&path, None, "/x", false), "400");
    }
}
