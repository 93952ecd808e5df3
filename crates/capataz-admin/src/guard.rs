//! Keeping web pages out of the admin API.
//!
//! A browser will send requests to a loopback admin listener on behalf of any page it shows: a
//! cross-site form can POST to it (CSRF), and a page whose name the attacker re-points at
//! 127.0.0.1 can read its answers as same-origin (DNS rebinding). A request that proves itself
//! with the bearer token is safe from both (a page cannot attach the header), so these checks
//! apply to every request that is let in without one:
//! - its `Host` must name the admin listener: the address the client connected to, or
//!   `localhost`, `127.0.0.1` or `[::1]`, each with the listener's port (no port for port 80),
//!   or a host listed in `admin.allowed_hosts` (with any port). Else 421 Misdirected Request;
//!   a request without `Host` (HTTP/1.0 tools) passes. An absolute-form target
//!   (`GET http://host/status`) names its host too, and must pass the same test; two `Host`
//!   headers get 400 (RFC 9112 section 3.2).
//! - a write (any method but GET and HEAD) carrying an `Origin` must come from an allowed host
//!   over `http://`; else 403. (`Origin: null` is refused too.)
//! - a write must not carry a content type a cross-site form can send without asking
//!   (`application/x-www-form-urlencoded`, `multipart/form-data`, `text/plain`); else 415.
//!   capataz's own clients send no body and no content type.

use std::net::SocketAddr;

use http::{header, HeaderMap, Method, StatusCode};

use crate::config::AdminConfig;

/// Why a request is refused before routing: the status and the message for the client.
#[derive(Debug, PartialEq, Eq)]
pub(super) struct Refusal {
    pub(super) status: StatusCode,
    pub(super) message: String,
}

/// Checks a request let in without a token; `local` is the address the client connected to,
/// `target` the authority of an absolute-form request target.
pub(super) fn check(
    admin: Option<&AdminConfig>,
    local: SocketAddr,
    method: &Method,
    target: Option<&str>,
    headers: &HeaderMap,
) -> Result<(), Refusal> {
    let extra: &[String] = admin.map_or(&[], |a| &a.allowed_hosts);
    if headers.get_all(header::HOST).iter().count() > 1 {
        return Err(Refusal {
            status: StatusCode::BAD_REQUEST,
            message: "the request has more than one Host header".into(),
        });
    }
    let host = headers
        .get(header::HOST)
        .map(|host| host.to_str().unwrap_or(""));
    for host in host.into_iter().chain(target) {
        if !host_allowed(host, local, extra) {
            return Err(Refusal {
                status: StatusCode::MISDIRECTED_REQUEST,
                message: format!(
                    "Host {:?} does not name this admin listener (use {local}, \
                     localhost:{port}, or add the name to admin.allowed_hosts)",
                    host.escape_debug().to_string(),
                    port = local.port()
                ),
            });
        }
    }
    if method == Method::GET || method == Method::HEAD {
        return Ok(());
    }
    // Every Origin and content type counts: a second header must not hide a refused first one.
    for origin in headers.get_all(header::ORIGIN) {
        let origin = origin.to_str().unwrap_or("");
        let allowed = origin
            .strip_prefix("http://")
            .is_some_and(|authority| host_allowed(authority, local, extra));
        if !allowed {
            return Err(Refusal {
                status: StatusCode::FORBIDDEN,
                message: format!(
                    "cross-origin write refused: Origin {:?} is not this admin listener",
                    origin.escape_debug().to_string()
                ),
            });
        }
    }
    for content_type in headers.get_all(header::CONTENT_TYPE) {
        let essence = content_type
            .to_str()
            .unwrap_or("")
            .split(';')
            .next()
            .unwrap_or("")
            .trim()
            .to_ascii_lowercase();
        if matches!(
            essence.as_str(),
            "application/x-www-form-urlencoded" | "multipart/form-data" | "text/plain"
        ) {
            return Err(Refusal {
                status: StatusCode::UNSUPPORTED_MEDIA_TYPE,
                message: format!(
                    "a write with Content-Type {essence} is refused (a web form can send it): \
                     send no body, or application/json"
                ),
            });
        }
    }
    Ok(())
}

/// Whether `authority` (`host`, `host:port`, `[v6]:port`) names this listener.
fn host_allowed(authority: &str, local: SocketAddr, extra: &[String]) -> bool {
    let (host, port) = split_authority(authority);
    let (Some(host), false) = (host, port == Some(None)) else {
        return false;
    };
    let host = host.to_ascii_lowercase();
    if extra.contains(&host) {
        return true;
    }
    let port_matches = match port {
        Some(port) => port == Some(local.port()),
        None => local.port() == 80,
    };
    if !port_matches {
        return false;
    }
    let local_ip = match local.ip().to_canonical() {
        std::net::IpAddr::V4(ip) => ip.to_string(),
        std::net::IpAddr::V6(ip) => format!("[{ip}]"),
    };
    host == "localhost" || host == "127.0.0.1" || host == "[::1]" || host == local_ip
}

/// Splits `host[:port]`: the host (`None` if empty or malformed), and the port if one is
/// written (`Some(None)` when it is not a valid port).
fn split_authority(authority: &str) -> (Option<&str>, Option<Option<u16>>) {
    let (host, port) = if authority.starts_with('[') {
        match authority.find(']') {
            Some(close) => {
                let (host, rest) = authority.split_at(close + 1);
                match rest.strip_prefix(':') {
                    Some(port) => (host, Some(port)),
                    None if rest.is_empty() => (host, None),
                    None => return (None, None),
                }
            }
            None => return (None, None),
        }
    } else {
        match authority.rsplit_once(':') {
            Some((host, port)) => (host, Some(port)),
            None => (authority, None),
        }
    };
    let port = port.map(|p| {
        if p.bytes().all(|b| b.is_ascii_digit()) {
            p.parse::<u16>().ok()
        } else {
            None
        }
    });
    if host.is_empty() || host.contains(|c: char| c == '@' || c == '/' || c.is_whitespace()) {
        return (None, None);
    }
    (Some(host), port)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn headers(pairs: &[(&'static str, &'static str)]) -> HeaderMap {
        let mut map = HeaderMap::new();
        for (name, value) in pairs {
            map.insert(*name, value.parse().expect("a test header value"));
        }
        map
    }

    fn status(method: Method, pairs: &[(&'static str, &'static str)]) -> Option<u16> {
        let admin = AdminConfig {
            address: "127.0.0.1:9901".parse().expect("an address"),
            token: None,
            open_read_only: false,
            metrics_backend_histograms: false,
            allowed_hosts: vec!["lb1.internal".into()],
        };
        let local = "127.0.0.1:9901".parse().expect("an address");
        check(Some(&admin), local, &method, None, &headers(pairs))
            .err()
            .map(|r| r.status.as_u16())
    }

    #[test]
    fn hosts() {
        for (host, expected) in [
            ("127.0.0.1:9901", None),
            ("localhost:9901", None),
            ("LOCALHOST:9901", None),
            ("[::1]:9901", None),
            ("lb1.internal", None),
            ("lb1.internal:8443", None),
            ("lb1.internal:x", Some(421)),
            ("localhost", Some(421)),
            ("localhost:9902", Some(421)),
            ("rebind.evil.example:9901", Some(421)),
            ("127.0.0.1:9901@evil", Some(421)),
            ("[::1", Some(421)),
            ("", Some(421)),
            (":9901", Some(421)),
            ("localhost.:9901", Some(421)),
        ] {
            let got = status(Method::GET, &[("host", host)]);
            assert_eq!(got, expected, "{host:?}");
        }
        assert_eq!(status(Method::GET, &[]), None, "no Host (HTTP/1.0)");
    }

    #[test]
    fn writes() {
        let host = ("host", "127.0.0.1:9901");
        assert_eq!(status(Method::POST, &[host]), None);
        assert_eq!(
            status(Method::POST, &[host, ("origin", "http://127.0.0.1:9901")]),
            None
        );
        assert_eq!(
            status(Method::POST, &[host, ("origin", "http://evil.example")]),
            Some(403)
        );
        assert_eq!(
            status(Method::POST, &[host, ("origin", "https://127.0.0.1:9901")]),
            Some(403)
        );
        assert_eq!(status(Method::POST, &[host, ("origin", "null")]), Some(403));
        assert_eq!(
            status(Method::GET, &[host, ("origin", "http://evil.example")]),
            None,
            "a read is guarded by Host alone"
        );
        for form in [
            "application/x-www-form-urlencoded",
            "multipart/form-data; boundary=x",
            "Text/Plain;charset=utf-8",
        ] {
            let mut map = headers(&[host]);
            map.insert(header::CONTENT_TYPE, form.parse().expect("a header value"));
            let local = "127.0.0.1:9901".parse().expect("an address");
            let got = check(None, local, &Method::POST, None, &map)
                .err()
                .map(|r| r.status);
            assert_eq!(got, Some(StatusCode::UNSUPPORTED_MEDIA_TYPE), "{form}");
        }
        assert_eq!(
            status(Method::POST, &[host, ("content-type", "application/json")]),
            None
        );
    }

    #[test]
    fn the_address_the_client_connected_to_is_allowed() {
        let local: SocketAddr = "10.0.0.5:9901".parse().expect("an address");
        let map = headers(&[("host", "10.0.0.5:9901")]);
        assert_eq!(check(None, local, &Method::GET, None, &map), Ok(()));
        let local: SocketAddr = "[fd00::5]:9901".parse().expect("an address");
        let map = headers(&[("host", "[fd00::5]:9901")]);
        assert_eq!(check(None, local, &Method::GET, None, &map), Ok(()));
    }

    /// Regression: only the first `Host`, `Origin` and `Content-Type` were read, and an
    /// absolute-form target's authority not at all, so a second header or the target could name
    /// another host than the one checked (RFC 9112 section 3.2.2: the target's authority wins).
    #[test]
    fn a_second_host_origin_or_content_type_or_an_absolute_target_is_checked_too() {
        let local: SocketAddr = "127.0.0.1:9901".parse().expect("an address");
        let refused = |method: Method, target: Option<&str>, pairs: &[(&str, &str)]| {
            let mut map = HeaderMap::new();
            for (name, value) in pairs {
                map.append(
                    header::HeaderName::from_bytes(name.as_bytes()).expect("a header name"),
                    value.parse().expect("a header value"),
                );
            }
            check(None, local, &method, target, &map)
                .err()
                .map(|r| r.status.as_u16())
        };
        let good = ("host", "127.0.0.1:9901");
        assert_eq!(
            refused(Method::GET, None, &[good, ("host", "evil.example")]),
            Some(400)
        );
        assert_eq!(
            refused(Method::GET, Some("evil.example"), &[good]),
            Some(421)
        );
        assert_eq!(refused(Method::GET, Some("evil.example"), &[]), Some(421));
        assert_eq!(refused(Method::GET, Some("localhost:9901"), &[good]), None);
        assert_eq!(
            refused(
                Method::POST,
                None,
                &[
                    good,
                    ("origin", "http://127.0.0.1:9901"),
                    ("origin", "http://evil.example")
                ]
            ),
            Some(403)
        );
        assert_eq!(
            refused(
                Method::POST,
                None,
                &[
                    good,
                    ("content-type", "application/json"),
                    ("content-type", "text/plain")
                ]
            ),
            Some(415)
        );
    }
}
