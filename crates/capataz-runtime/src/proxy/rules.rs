//! Header rules run on a request or an answer (the listener's, then the route's), the
//! `Forwarded` element (RFC 7239) and the request id.
//!
//! Nothing here runs for a listener without rules, `forwarded = "rfc7239"` or `request_id`.
//! A value rendered from variables is checked as a field value before it is sent: one that is
//! not valid (or renders empty) is not sent, never a panic; the client's bytes that variables
//! carry (its `Host`, its request id, its SNI) were valid field values already, so CR, LF and
//! NUL never reach a rendered field.

use std::fmt::Write as _;

use http::header::{self, HeaderMap, HeaderName, HeaderValue};

use super::ClientInfo;
use crate::config::{HeaderRules, Piece, RequestIdConfig, Template, Variable, MAX_REQUEST_ID};

static FORWARDED: HeaderName = header::FORWARDED;

/// What variables render as, for one request (and, for an answer, its backend).
pub(super) struct Facts<'a> {
    pub(super) client: &'a ClientInfo,
    pub(super) request_id: Option<&'a HeaderValue>,
    /// The request's host as it sent it (`Host`, or its target's authority).
    pub(super) host: Option<&'a HeaderValue>,
    pub(super) pool: &'a str,
    /// The backend that answered (answers only).
    pub(super) backend: Option<&'a str>,
}

/// Runs `rules` on `headers`: `remove`, then `set`, then `add`.
pub(super) fn apply(rules: &HeaderRules, headers: &mut HeaderMap, facts: &Facts<'_>) {
    for name in &rules.remove {
        headers.remove(name);
    }
    let mut scratch = String::new();
    for (name, template) in &rules.set {
        // `insert` replaces every field of that name: one lookup, not a removal and an insert.
        match render(template, facts, &mut scratch) {
            Some(value) => {
                headers.insert(name.clone(), value);
            }
            None => {
                headers.remove(name);
            }
        }
    }
    for (name, template) in &rules.add {
        if let Some(value) = render(template, facts, &mut scratch) {
            headers.append(name.clone(), value);
        }
    }
}

/// The value `template` renders as; `None` when that is empty or not a valid field value.
fn render(template: &Template, facts: &Facts<'_>, scratch: &mut String) -> Option<HeaderValue> {
    let pieces = match template {
        Template::Static(value) => return (!value.is_empty()).then(|| value.clone()),
        Template::Dynamic(pieces) => pieces,
    };
    scratch.clear();
    for piece in pieces {
        match piece {
            Piece::Text(text) => scratch.push_str(text),
            Piece::Var(var) => write_var(*var, facts, scratch),
        }
    }
    if scratch.is_empty() {
        return None;
    }
    HeaderValue::from_str(scratch).ok()
}

/// A field value as text; empty when it is not visible ASCII.
fn text(value: Option<&HeaderValue>) -> &str {
    value.and_then(|v| v.to_str().ok()).unwrap_or("")
}

fn write_var(var: Variable, facts: &Facts<'_>, out: &mut String) {
    let tls = facts.client.tls.as_deref();
    match var {
        Variable::ClientIp if facts.client.unix() => out.push_str("unix"),
        Variable::ClientIp => {
            let _ = write!(out, "{}", facts.client.addr.ip());
        }
        Variable::ClientPort => {
            let _ = write!(out, "{}", facts.client.addr.port());
        }
        Variable::RequestId => out.push_str(text(facts.request_id)),
        Variable::Backend => out.push_str(facts.backend.unwrap_or("")),
        Variable::Pool => out.push_str(facts.pool),
        Variable::TlsVersion => out.push_str(tls.map_or("", |tls| tls.version)),
        Variable::TlsSni => out.push_str(tls.and_then(|tls| tls.sni.as_deref()).unwrap_or("")),
        Variable::Scheme => out.push_str(if tls.is_some() { "https" } else { "http" }),
        Variable::Host => out.push_str(text(facts.host)),
    }
}

/// Appends this hop's element to the request's `Forwarded` (RFC 7239):
/// `for=IP;proto=SCHEME;host=HOST`, an IPv6 address quoted and bracketed
/// (`for="[2001:db8::1]"`), a host quoted when it is not a token. The fields already there are
/// kept, joined into one list before it.
pub(super) fn add_forwarded(
    headers: &mut HeaderMap,
    client: &ClientInfo,
    host: Option<&HeaderValue>,
) {
    let mut element = String::with_capacity(64);
    match client.addr.ip() {
        // RFC 7239's word for a client whose address is not known.
        _ if client.unix() => element.push_str("for=unknown"),
        std::net::IpAddr::V4(ip) => {
            let _ = write!(element, "for={ip}");
        }
        std::net::IpAddr::V6(ip) => {
            let _ = write!(element, "for=\"[{ip}]\"");
        }
    }
    element.push_str(if client.tls.is_some() {
        ";proto=https"
    } else {
        ";proto=http"
    });
    // A host is a valid `Host` (checked before routing): no `"` or `\` to escape.
    if let Some(host) = host.and_then(|h| h.to_str().ok()).filter(|h| !h.is_empty()) {
        if host.bytes().all(is_tchar) {
            let _ = write!(element, ";host={host}");
        } else {
            let _ = write!(element, ";host=\"{host}\"");
        }
    }
    let before: Vec<&str> = headers
        .get_all(&FORWARDED)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .collect();
    let value = if before.is_empty() {
        element
    } else {
        format!("{}, {element}", before.join(", "))
    };
    if let Ok(value) = HeaderValue::try_from(value) {
        headers.insert(&FORWARDED, value);
    }
}

/// RFC 9110 `tchar`.
fn is_tchar(b: u8) -> bool {
    b.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&b)
}

/// The id of a request with these `headers`: its own, if `config` keeps incoming ids and it
/// carries one of 1 to [`MAX_REQUEST_ID`] visible ASCII characters, else a new random UUID
/// (version 4).
pub(super) fn request_id(config: &RequestIdConfig, headers: &HeaderMap) -> HeaderValue {
    if config.keep_incoming {
        let mut fields = headers.get_all(&config.header).iter();
        if let (Some(value), None) = (fields.next(), fields.next()) {
            let bytes = value.as_bytes();
            if (1..=MAX_REQUEST_ID).contains(&bytes.len()) && bytes.iter().all(u8::is_ascii_graphic)
            {
                return value.clone();
            }
        }
    }
    let bits = fastrand::u128(..);
    // Version 4, variant 10xx (RFC 9562 section 5.4).
    let bits = (bits & !(0xf << 76) | (0x4 << 76)) & !(0x3 << 62) | (0x2 << 62);
    let hex = format!("{bits:032x}");
    let uuid = format!(
        "{}-{}-{}-{}-{}",
        &hex[..8],
        &hex[8..12],
        &hex[12..16],
        &hex[16..20],
        &hex[20..]
    );
    HeaderValue::try_from(uuid).unwrap_or_else(|_| HeaderValue::from_static("-"))
}

use http::Response;

use super::tally::Tally;
use super::Target;
use crate::balance::PoolHandle;
use crate::body::RespBody;

impl super::Proxy {
    /// What a request gets beyond hop-by-hop and `X-Forwarded-*` fields: its request id, a
    /// `Forwarded` element, then the listener's header rules and its route's. Returns its
    /// host as it sent it (for the answer's rules; `None` when nothing uses it). Not inlined:
    /// a listener without any of them never comes here.
    #[inline(never)]
    pub(super) fn rewrite_request(
        &self,
        parts: &mut http::request::Parts,
        pool: &PoolHandle,
        client: &ClientInfo,
        tally: &Tally,
    ) -> Option<HeaderValue> {
        let host = if self.rules_need_host {
            parts.headers.get(header::HOST).cloned().or_else(|| {
                parts
                    .uri
                    .authority()
                    .and_then(|a| HeaderValue::from_str(a.as_str()).ok())
            })
        } else {
            None
        };
        if let (Some(config), Some(id)) = (&self.request_id, &tally.request_id) {
            parts.headers.insert(config.header.clone(), id.clone());
        }
        if self.forwarded.rfc7239() {
            add_forwarded(&mut parts.headers, client, host.as_ref());
        }
        let route = tally.route.map(|index| &self.routes[index]);
        let facts = Facts {
            client,
            request_id: tally.request_id.as_ref(),
            host: host.as_ref(),
            pool: &pool.name,
            backend: None,
        };
        let route_rules = route.and_then(|r| r.request_headers.as_deref());
        for rules in [self.request_headers.as_deref(), route_rules]
            .into_iter()
            .flatten()
        {
            apply(rules, &mut parts.headers, &facts);
        }
        host
    }

    /// Runs the listener's and then the route's response rules on a backend's answer from
    /// `backend` to a request for `host`.
    #[inline(never)]
    pub(super) fn rewrite_response(
        &self,
        response: &mut Response<RespBody>,
        host: &Option<HeaderValue>,
        backend: &str,
        client: &ClientInfo,
        tally: &Tally,
    ) {
        let route = tally.route.map(|index| &self.routes[index]);
        let facts = Facts {
            client,
            request_id: tally.request_id.as_ref(),
            host: host.as_ref(),
            pool: match route.map(|r| &r.target) {
                Some(Target::Pool(pool)) => &pool.name,
                _ => "",
            },
            backend: Some(backend),
        };
        let route_rules = route.and_then(|r| r.response_headers.as_deref());
        for rules in [self.response_headers.as_deref(), route_rules]
            .into_iter()
            .flatten()
        {
            apply(rules, response.headers_mut(), &facts);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn facts(client: &ClientInfo) -> Facts<'_> {
        Facts {
            client,
            request_id: None,
            host: None,
            pool: "web",
            backend: Some("web-1"),
        }
    }

    #[test]
    fn rules_remove_then_set_then_add() {
        let client = ClientInfo::new("192.0.2.7:5000".parse().unwrap());
        let rules = HeaderRules {
            remove: vec![HeaderName::from_static("x-debug")],
            set: vec![(
                HeaderName::from_static("x-client"),
                Template::parse("%{client_ip}:%{client_port} via %{pool}").unwrap(),
            )],
            add: vec![
                (
                    HeaderName::from_static("x-debug"),
                    Template::parse("on").unwrap(),
                ),
                (
                    HeaderName::from_static("x-sni"),
                    Template::parse("%{tls_sni}").unwrap(),
                ),
            ],
        };
        let mut headers = HeaderMap::new();
        headers.append("x-debug", HeaderValue::from_static("client's"));
        headers.append("x-client", HeaderValue::from_static("spoofed"));
        headers.append("x-client", HeaderValue::from_static("twice"));
        apply(&rules, &mut headers, &facts(&client));
        assert_eq!(headers.get_all("x-debug").iter().count(), 1);
        assert_eq!(headers["x-debug"], "on");
        assert_eq!(headers.get_all("x-client").iter().count(), 1);
        assert_eq!(headers["x-client"], "192.0.2.7:5000 via web");
        // Renders empty (no TLS): not sent.
        assert!(headers.get("x-sni").is_none());
    }

    #[test]
    fn a_variable_that_is_not_visible_ascii_renders_empty() {
        let client = ClientInfo::new("192.0.2.7:5000".parse().unwrap());
        let host = HeaderValue::from_bytes(b"caf\xe9.test").unwrap();
        let facts = Facts {
            host: Some(&host),
            ..facts(&client)
        };
        let rules = HeaderRules {
            set: vec![
                (
                    HeaderName::from_static("x-a"),
                    Template::parse("%{host}").unwrap(),
                ),
                (
                    HeaderName::from_static("x-b"),
                    Template::parse("h=%{host}").unwrap(),
                ),
            ],
            ..HeaderRules::default()
        };
        let mut headers = HeaderMap::new();
        apply(&rules, &mut headers, &facts);
        assert!(headers.get("x-a").is_none());
        assert_eq!(headers["x-b"], "h=");
    }

    #[test]
    fn forwarded_quotes_ipv6_and_hosts_that_are_not_tokens() {
        let v6 = ClientInfo::new("[2001:db8::1]:5000".parse().unwrap());
        let mut headers = HeaderMap::new();
        headers.insert(&FORWARDED, HeaderValue::from_static("for=198.51.100.1"));
        add_forwarded(
            &mut headers,
            &v6,
            Some(&HeaderValue::from_static("app.test:8080")),
        );
        assert_eq!(
            headers[&FORWARDED],
            r#"for=198.51.100.1, for="[2001:db8::1]";proto=http;host="app.test:8080""#
        );
        let v4 = ClientInfo::new("192.0.2.7:5000".parse().unwrap());
        let mut headers = HeaderMap::new();
        add_forwarded(
            &mut headers,
            &v4,
            Some(&HeaderValue::from_static("app.test")),
        );
        assert_eq!(
            headers[&FORWARDED],
            "for=192.0.2.7;proto=http;host=app.test"
        );
    }

    #[test]
    fn request_ids_are_kept_when_sane_else_made() {
        let config = RequestIdConfig {
            header: HeaderName::from_static("x-request-id"),
            keep_incoming: true,
            response: false,
        };
        let mut headers = HeaderMap::new();
        headers.insert("x-request-id", HeaderValue::from_static("abc-123"));
        assert_eq!(request_id(&config, &headers), "abc-123");
        headers.insert("x-request-id", HeaderValue::from_static("has space"));
        let made = request_id(&config, &headers);
        let text = made.to_str().unwrap();
        assert_eq!(text.len(), 36, "{text}");
        assert_eq!(&text[14..15], "4", "{text}");
        assert!("89ab".contains(&text[19..20]), "{text}");
        headers.insert(
            "x-request-id",
            HeaderValue::from_str(&"a".repeat(201)).unwrap(),
        );
        assert_eq!(request_id(&config, &headers).len(), 36);
        let replace = RequestIdConfig {
            keep_incoming: false,
            ..config
        };
        headers.insert("x-request-id", HeaderValue::from_static("abc-123"));
        assert_ne!(request_id(&replace, &headers), "abc-123");
    }
}
