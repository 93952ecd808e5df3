//! The request's and the answer's header fields on their way through: the one host a request
//! is for (RFC 9112 section 3.2), hop-by-hop fields (RFC 9110 section 7.6.1), the
//! `X-Forwarded-*` fields, and the relayed answer's framing fields.

use crate::client_body::ClientBody;
use http::header::{self, HeaderMap, HeaderName, HeaderValue};
use http::{Request, Uri, Version};

use super::ClientInfo;
use capataz_h1::framing::{list_tokens, BodyLength};
use capataz_h1::head::{hop_name, HopName};

static X_FORWARDED_FOR: HeaderName = HeaderName::from_static("x-forwarded-for");
static X_FORWARDED_PROTO: HeaderName = HeaderName::from_static("x-forwarded-proto");
static KEEP_ALIVE: HeaderName = HeaderName::from_static("keep-alive");
static PROXY_CONNECTION: HeaderName = HeaderName::from_static("proxy-connection");

/// Makes the relayed head's `Content-Length` agree with how capataz read the body, for an
/// answer whose framing says it must (`Framing::rewrite_length`): the client's framing is
/// hyper's to choose from the body, so a `Content-Length` that did not delimit the backend's
/// body (one beside `Transfer-Encoding`, which wins) never reaches the client, and a length
/// written as a list (`7, 7`) goes as one number.
pub(super) fn rewrite_length(headers: &mut HeaderMap, body: BodyLength) {
    match body {
        BodyLength::Exact(n) => {
            headers.insert(header::CONTENT_LENGTH, HeaderValue::from(n));
        }
        _ => {
            headers.remove(header::CONTENT_LENGTH);
        }
    }
}

/// The most header fields a request head may carry, whatever its protocol; more get 431.
/// HTTP/1.1 heads are held to it by hyper (its default, `http1::Builder::max_headers`: setting
/// it, even to the same number, moves hyper's parse from the stack to a heap allocation per
/// request); HTTP/2 heads here, by [`too_many_fields`].
pub(crate) const MAX_HEADER_FIELDS: usize = 100;

/// Whether an HTTP/2 request's header fields are more than [`MAX_HEADER_FIELDS`], counted as
/// they would be in the HTTP/1.1 head it becomes: the pseudo-header fields are its request
/// line, except `:authority`, which is its `Host` (counted, unless a `host` field is there
/// too), and the `cookie` crumbs HTTP/2 may split a `Cookie` into (RFC 9113 section 8.2.3)
/// are one field.
pub(super) fn too_many_fields(uri: &Uri, headers: &HeaderMap) -> bool {
    if headers.len() < MAX_HEADER_FIELDS {
        return false;
    }
    let crumbs = headers.get_all(header::COOKIE).iter().count();
    let host = uri.authority().is_some() && !headers.contains_key(header::HOST);
    headers.len() - crumbs.saturating_sub(1) + usize::from(host) > MAX_HEADER_FIELDS
}

/// hyper's smallest read buffer; heads larger than the limit but within it are checked here.
pub(super) const MIN_HYPER_BUFFER: usize = 8192;

pub(super) fn head_size(req: &Request<ClientBody>) -> usize {
    let line = req.method().as_str().len() + req.uri().to_string().len() + 12;
    line + req
        .headers()
        .iter()
        .map(|(name, value)| name.as_str().len() + value.len() + 4)
        .sum::<usize>()
}

/// Where the host of a request is written.
#[derive(Clone, Copy, Debug)]
pub(super) enum RequestHost<'a> {
    /// Nowhere (an HTTP/1.0 request without Host, origin-form).
    None,
    /// In its one `Host` field (which an absolute-form target agrees with).
    Field(&'a HeaderValue),
    /// Only in its absolute-form target (HTTP/1.0 without Host).
    Target(&'a http::uri::Authority),
}

impl<'a> RequestHost<'a> {
    /// The host as text, with its port; `None` when there is none, or it is not text.
    pub(super) fn as_str(self) -> Option<&'a str> {
        match self {
            RequestHost::None => None,
            RequestHost::Field(value) => value.to_str().ok(),
            RequestHost::Target(authority) => Some(authority.as_str()),
        }
    }
}

/// The host a request is for, one and unambiguous (RFC 9112 section 3.2): its `Host` field,
/// or the authority of an absolute-form target, which must then agree with `Host`. An HTTP/2
/// request's `:authority` is its target's authority (RFC 9113 section 8.3.1): it is the host
/// when the request has no `Host`, and must agree with `Host` when it has one. Refused
/// (400): two `Host` fields, an HTTP/1.1 request without one, and an absolute-form target
/// naming another host or port than `Host`. No header lookup: `fields` has the Host fields.
/// `fields` are the request's, from [`RequestFields::of`].
pub(super) fn request_host<'a>(
    req: &'a Request<ClientBody>,
    fields: &RequestFields<'a>,
) -> Result<RequestHost<'a>, &'static str> {
    let field = fields.host;
    if fields.more_hosts {
        return Err("more than one Host header field");
    }
    if field.is_none() && req.version() == Version::HTTP_11 {
        return Err("an HTTP/1.1 request needs a Host header field");
    }
    if field.is_none()
        && matches!(req.version(), Version::HTTP_2 | Version::HTTP_3)
        && req.uri().authority().is_none()
    {
        return Err("an HTTP/2 or HTTP/3 request needs an :authority or a Host header field");
    }
    let named = field.map(HeaderValue::as_bytes).or_else(|| {
        req.uri()
            .authority()
            .map(|authority| authority.as_str().as_bytes())
    });
    if named.is_some_and(|host| !valid_host(host)) {
        return Err("the Host header field is not a valid host");
    }
    match (req.uri().authority(), field) {
        (None, None) => Ok(RequestHost::None),
        (None, Some(field)) => Ok(RequestHost::Field(field)),
        (Some(authority), None) => Ok(RequestHost::Target(authority)),
        (Some(authority), Some(field)) => {
            let same = field
                .to_str()
                .is_ok_and(|field| same_authority(req.uri(), authority, field));
            if same {
                Ok(RequestHost::Field(field))
            } else {
                Err("the request target's host differs from the Host header field")
            }
        }
    }
}

/// Whether `value` is a valid `Host` (RFC 9110 section 7.2, RFC 3986 section 3.2):
/// `uri-host [ ":" port ]`, where the host is a reg-name (letters, digits, `-._~`, the
/// sub-delims `!$&'()*+,;=`, `%` and two hex digits; an IPv4 address is one) or a bracketed
/// IPv6 literal, and the port is digits. Empty is valid (a target without an authority). No
/// userinfo (`user@host`), no spaces, slashes or second colon: such a value would let the host
/// a route matches differ from the host a backend reads in it.
pub(super) fn valid_host(value: &[u8]) -> bool {
    let (host_ok, rest) = match value.strip_prefix(b"[") {
        Some(literal) => match literal.iter().position(|b| *b == b']') {
            Some(close) => (
                close > 0
                    && literal[..close]
                        .iter()
                        .all(|b| b.is_ascii_hexdigit() || *b == b':' || *b == b'.'),
                &literal[close + 1..],
            ),
            None => return false,
        },
        None => {
            let end = value.iter().position(|b| *b == b':').unwrap_or(value.len());
            (reg_name(&value[..end]), &value[end..])
        }
    };
    let port_ok = match rest.split_first() {
        None => true,
        Some((b':', digits)) => digits.iter().all(u8::is_ascii_digit),
        Some(_) => false,
    };
    host_ok && port_ok
}

/// RFC 3986 `reg-name`: unreserved, percent-encoded and sub-delims characters.
fn reg_name(host: &[u8]) -> bool {
    let mut i = 0;
    while i < host.len() {
        let b = host[i];
        if b == b'%' {
            let hex = host.get(i + 1..i + 3);
            if !hex.is_some_and(|h| h.iter().all(u8::is_ascii_hexdigit)) {
                return false;
            }
            i += 3;
            continue;
        }
        if !REG_NAME_BYTE[usize::from(b)] {
            return false;
        }
        i += 1;
    }
    true
}

/// The bytes a `reg-name` takes as they are (letters, digits, the rest of the unreserved
/// `-._~` and the sub-delims), as a table: every request's host is checked byte by byte, and a
/// search of the sub-delims for each `.` of an address cost more than the rest of the check.
const REG_NAME_BYTE: [bool; 256] = {
    let mut table = [false; 256];
    let mut b = 0;
    while b < 256 {
        table[b] = (b as u8).is_ascii_alphanumeric();
        b += 1;
    }
    let others = b"-._~!$&'()*+,;=";
    let mut i = 0;
    while i < others.len() {
        table[others[i] as usize] = true;
        i += 1;
    }
    table
};

/// Whether `field` (a Host value) names the same host and port as `authority`, the port
/// defaulting to the scheme's.
pub(super) fn same_authority(uri: &Uri, authority: &http::uri::Authority, field: &str) -> bool {
    let default = if uri.scheme_str() == Some("https") {
        443
    } else {
        80
    };
    let Ok(field) = field.parse::<http::uri::Authority>() else {
        return false;
    };
    field.host().eq_ignore_ascii_case(authority.host())
        && field.port_u16().unwrap_or(default) == authority.port_u16().unwrap_or(default)
}

/// The host without its port, as a route's `host` is written: an IPv6 literal keeps its
/// brackets (`[::1]:80` is `[::1]`, the form the config check gives a route's host).
pub(super) fn strip_port(host: &str) -> &str {
    if host.starts_with('[') {
        // [v6]:port
        return host.find(']').map_or(host, |close| &host[..=close]);
    }
    host.rsplit_once(':').map_or(host, |(h, _)| h)
}

pub(super) fn origin_form(uri: &Uri) -> Uri {
    match uri.path_and_query() {
        Some(_) if uri.scheme().is_none() && uri.authority().is_none() => uri.clone(),
        Some(pq) => Uri::from(pq.clone()),
        None => Uri::from_static("/"),
    }
}

pub(super) fn wants_upgrade(headers: &HeaderMap) -> bool {
    headers.contains_key(header::UPGRADE)
        && headers
            .get_all(header::CONNECTION)
            .iter()
            .flat_map(list_tokens)
            .any(|t| t.eq_ignore_ascii_case(b"upgrade"))
}

/// Removes the hop-by-hop headers of RFC 9110 section 7.6.1 (and any the Connection header
/// names). For an upgrade, `Connection: upgrade` and `Upgrade` are kept.
///
/// It first finds which of those names are present in one pass over the names (no hashing,
/// and for most names only a length compared: a message usually carries none of them, or only
/// `Connection`) and then removes just those. A request's fields were found before routing
/// ([`RequestFields`]): see [`strip_found`].
pub(super) fn strip_hop_by_hop(headers: &mut HeaderMap, keep_upgrade: bool) {
    let mut hops = HopFields::default();
    let mut named: Vec<HeaderName> = Vec::new();
    for (name, value) in headers.iter() {
        if hops.note(name) == Some(HopByHop::Fixed(CONNECTION_AT)) {
            connection_names(value, &mut named);
        }
    }
    remove_hops(headers, hops, named, keep_upgrade);
}

/// [`strip_hop_by_hop`] for a request whose hop-by-hop fields are known (`hops`, from
/// [`RequestFields::of`]; nothing since added or removed one): a request with none, which is
/// nearly every HTTP/2 request, is not looked at again, and one with `Connection` has that
/// looked up alone.
pub(super) fn strip_found(headers: &mut HeaderMap, hops: HopFields, keep_upgrade: bool) {
    debug_assert_eq!(hops, HopFields::of(headers), "the request's fields changed");
    let mut named: Vec<HeaderName> = Vec::new();
    if hops.present[CONNECTION_AT] {
        for value in headers.get_all(header::CONNECTION) {
            connection_names(value, &mut named);
        }
    }
    remove_hops(headers, hops, named, keep_upgrade);
}

/// Adds the names a `Connection` value lists to `named`. The usual tokens name no header of
/// their own, or one removed anyway, and are skipped without parsing a name; the usual
/// values, `keep-alive` or `close` alone, are not even split. Tokens are read as
/// [`list_tokens`] reads them. `Host` is never named: routing
/// has read it, and a backend must get it (`Connection: host` would otherwise leave the
/// request without one; HAProxy and nginx remove no field a `Connection` names).
fn connection_names(value: &HeaderValue, named: &mut Vec<HeaderName>) {
    let bytes = value.as_bytes();
    if bytes.eq_ignore_ascii_case(b"keep-alive") || bytes.eq_ignore_ascii_case(b"close") {
        return;
    }
    named.extend(
        list_tokens(value)
            .filter(|t| {
                !(t.eq_ignore_ascii_case(b"keep-alive")
                    || t.eq_ignore_ascii_case(b"close")
                    || t.eq_ignore_ascii_case(b"upgrade")
                    || t.eq_ignore_ascii_case(b"host"))
            })
            .filter_map(|t| HeaderName::from_bytes(t).ok()),
    );
}

/// Removes the hop-by-hop fields `hops` says are there and the `named` ones; keeps (or, for
/// an upgrade, sets) `Connection: upgrade` and `Upgrade` as [`strip_hop_by_hop`] says.
fn remove_hops(
    headers: &mut HeaderMap,
    hops: HopFields,
    named: Vec<HeaderName>,
    keep_upgrade: bool,
) {
    for name in named {
        headers.remove(name);
    }
    for (name, present) in FIXED_HOP_BY_HOP.iter().zip(hops.present) {
        if present {
            headers.remove(*name);
        }
    }
    if keep_upgrade {
        headers.insert(header::CONNECTION, HeaderValue::from_static("upgrade"));
    } else if hops.upgrade {
        headers.remove(header::UPGRADE);
    }
}

/// Which hop-by-hop fields a message has: each of [`FIXED_HOP_BY_HOP`], and `Upgrade`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(super) struct HopFields {
    present: [bool; FIXED_HOP_BY_HOP.len()],
    upgrade: bool,
}

impl HopFields {
    /// The hop-by-hop fields of `headers`, in one pass over its names.
    pub(super) fn of(headers: &HeaderMap) -> HopFields {
        let mut hops = HopFields::default();
        for name in headers.keys() {
            hops.note(name);
        }
        hops
    }

    /// Notes one field's name; which hop-by-hop field it is, if one.
    fn note(&mut self, name: &HeaderName) -> Option<HopByHop> {
        let found = hop_by_hop(name);
        match found {
            None => {}
            Some(HopByHop::Upgrade) => self.upgrade = true,
            Some(HopByHop::Fixed(i)) => self.present[i] = true,
        }
        found
    }

    /// Whether the message has an `Upgrade` field.
    pub(super) fn upgrade(self) -> bool {
        self.upgrade
    }

    /// Whether the message has a `Transfer-Encoding` field.
    pub(super) fn transfer_encoding(self) -> bool {
        self.present[TRANSFER_ENCODING_AT]
    }
}

/// What one pass over a request's fields found, before routing: its `Host` fields and its
/// hop-by-hop fields. The checks before routing (the Host, the transfer codings), the upgrade
/// check and the hop-by-hop strip each looked their names up in the map, hashing each again
/// (80 to 110 instructions a lookup); most requests have a handful of fields.
#[derive(Clone, Copy, Debug)]
pub(super) struct RequestFields<'a> {
    /// The first `Host` field, and whether there is another.
    host: Option<&'a HeaderValue>,
    more_hosts: bool,
    pub(super) hops: HopFields,
}

impl<'a> RequestFields<'a> {
    pub(super) fn of(headers: &'a HeaderMap) -> RequestFields<'a> {
        let mut fields = RequestFields {
            host: None,
            more_hosts: false,
            hops: HopFields::default(),
        };
        for (name, value) in headers.iter() {
            if *name == header::HOST {
                match fields.host {
                    None => fields.host = Some(value),
                    Some(_) => fields.more_hosts = true,
                }
            } else {
                fields.hops.note(name);
            }
        }
        fields
    }
}

/// The hop-by-hop headers always removed, in [`HopName`]'s order (`Connection` first).
const FIXED_HOP_BY_HOP: [&HeaderName; 6] = [
    &header::CONNECTION,
    &KEEP_ALIVE,
    &PROXY_CONNECTION,
    &header::TE,
    &header::TRAILER,
    &header::TRANSFER_ENCODING,
];

/// Where `Connection` and `Transfer-Encoding` are in [`FIXED_HOP_BY_HOP`].
const CONNECTION_AT: usize = HopName::Connection as usize;
const TRANSFER_ENCODING_AT: usize = HopName::TransferEncoding as usize;

/// A hop-by-hop header name: one of [`FIXED_HOP_BY_HOP`] (its index), or `Upgrade`.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(super) enum HopByHop {
    Fixed(usize),
    Upgrade,
}

/// Which hop-by-hop header `name` is, if any: `capataz_h1`'s list ([`hop_name`]), which the
/// parse of a backend's answer notes too.
#[inline]
pub(super) fn hop_by_hop(name: &HeaderName) -> Option<HopByHop> {
    hop_name(name).map(|hop| match hop {
        HopName::Upgrade => HopByHop::Upgrade,
        fixed => HopByHop::Fixed(fixed as usize),
    })
}

pub(super) fn add_forwarded_headers(headers: &mut HeaderMap, client: &ClientInfo) {
    match headers.entry(&X_FORWARDED_FOR) {
        // A Unix socket's client has no address to add (HAProxy adds none either).
        _ if client.unix() => {}
        header::Entry::Vacant(entry) => {
            entry.insert(client.ip.clone());
        }
        header::Entry::Occupied(mut entry) => {
            let appended = entry.get().to_str().ok().and_then(|before| {
                HeaderValue::try_from(format!("{before}, {}", client.addr.ip())).ok()
            });
            if let Some(appended) = appended {
                entry.insert(appended);
            }
        }
    }
    let proto = if client.tls.is_some() {
        "https"
    } else {
        "http"
    };
    headers.insert(&X_FORWARDED_PROTO, HeaderValue::from_static(proto));
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_h2_head_counts_its_fields_as_the_http1_head_it_becomes() {
        // `fields` regular fields (with `crumbs` of them cookie crumbs), `:authority`, and
        // perhaps a `host` field too; whether that is too many.
        let too_many = |fields: usize, crumbs: usize, host: bool| {
            let mut req = Request::builder()
                .version(Version::HTTP_2)
                .uri("http://app.test/");
            for i in 0..fields - crumbs - usize::from(host) {
                req = req.header(format!("x-{i}"), "v");
            }
            for i in 0..crumbs {
                req = req.header("cookie", format!("c{i}=v"));
            }
            if host {
                req = req.header("host", "app.test");
            }
            let (parts, ()) = req.body(()).unwrap().into_parts();
            too_many_fields(&parts.uri, &parts.headers)
        };
        assert!(!too_many(99, 0, false), "99 and :authority as Host: 100");
        assert!(too_many(100, 0, false), "100 and :authority as Host: 101");
        assert!(!too_many(100, 0, true), "100 with Host");
        assert!(too_many(101, 0, true));
        assert!(!too_many(150, 52, false), "52 crumbs are one Cookie: 100");
        assert!(too_many(150, 51, false));
    }

    #[test]
    fn host_values_follow_the_uri_host_grammar() {
        for good in [
            "",
            "a.test",
            "A.Test:8080",
            "a.test:",
            "a.",
            "10.0.0.1:80",
            "[::1]",
            "[::1]:8080",
            "[2001:db8::1]",
            "xn--bcher-kva.example",
            "a%2Db",
            "a,b",
        ] {
            assert!(valid_host(good.as_bytes()), "{good:?}");
        }
        for bad in [
            "u@a.test",
            "evil:@a.test",
            "a.test:x",
            "a.test:80:81",
            "[api.example.com]",
            "[]",
            "[::1",
            "[::1]x",
            "[::1]:8x",
            "a b",
            "a/b",
            "a\tb",
            "a%zz",
            "a%2",
            "a\\b",
        ] {
            assert!(!valid_host(bad.as_bytes()), "{bad:?}");
        }
        assert!(!valid_host(b"a\xffb"));
    }

    /// The table of `reg-name` bytes says what the rule it replaced said, for every byte.
    #[test]
    fn the_reg_name_table_is_the_rule() {
        for b in 0..=255u8 {
            let rule = b.is_ascii_alphanumeric() || b"-._~!$&'()*+,;=".contains(&b);
            assert_eq!(REG_NAME_BYTE[usize::from(b)], rule, "byte {b}");
        }
    }

    #[test]
    fn the_name_lookup_agrees_with_the_fixed_list_and_knows_nothing_else() {
        for (i, name) in FIXED_HOP_BY_HOP.iter().enumerate() {
            assert_eq!(hop_by_hop(name), Some(HopByHop::Fixed(i)), "{name}");
        }
        assert_eq!(hop_by_hop(&header::UPGRADE), Some(HopByHop::Upgrade));
        for other in [
            "host",
            "x-forwarded-for",
            "x-forwarded-proto",
            "content-length",
            "connectionx",
            "t",
            "trailers",
            "x-connection",
        ] {
            let name = HeaderName::from_bytes(other.as_bytes()).unwrap();
            assert_eq!(hop_by_hop(&name), None, "{other}");
        }
    }

    #[test]
    fn hop_by_hop_headers_go() {
        let mut h = HeaderMap::new();
        h.insert(
            header::CONNECTION,
            HeaderValue::from_static("keep-alive, x-secret"),
        );
        h.insert("x-secret", HeaderValue::from_static("1"));
        h.insert("keep-alive", HeaderValue::from_static("timeout=5"));
        h.insert(header::TE, HeaderValue::from_static("trailers"));
        h.insert(
            header::TRANSFER_ENCODING,
            HeaderValue::from_static("chunked"),
        );
        h.insert(header::UPGRADE, HeaderValue::from_static("websocket"));
        h.insert(header::HOST, HeaderValue::from_static("example.com"));
        h.insert("x-keep", HeaderValue::from_static("yes"));
        strip_hop_by_hop(&mut h, false);
        let mut names: Vec<&str> = h.keys().map(|k| k.as_str()).collect();
        names.sort();
        assert_eq!(names, ["host", "x-keep"]);
    }

    #[test]
    fn every_hop_by_hop_name_goes_in_any_case_and_order() {
        let listed = ["Keep-Alive", "CLOSE", "x-a", " X-B ", "upgrade", "te"];
        for keep_upgrade in [false, true] {
            let mut h = HeaderMap::new();
            h.append("x-b", HeaderValue::from_static("2"));
            h.insert(
                header::CONNECTION,
                HeaderValue::from_str(&listed.join(",")).unwrap(),
            );
            h.append(header::CONNECTION, HeaderValue::from_static("x-c"));
            for name in [
                "x-a",
                "x-c",
                "proxy-connection",
                "trailer",
                "keep-alive",
                "transfer-encoding",
                "te",
            ] {
                h.append(HeaderName::from_static(name), HeaderValue::from_static("1"));
            }
            h.insert(header::UPGRADE, HeaderValue::from_static("h2c"));
            h.insert("x-keep", HeaderValue::from_static("yes"));
            strip_hop_by_hop(&mut h, keep_upgrade);
            let mut names: Vec<&str> = h.keys().map(|k| k.as_str()).collect();
            names.sort();
            if keep_upgrade {
                assert_eq!(names, ["connection", "upgrade", "x-keep"]);
                assert_eq!(h.get_all(header::CONNECTION).iter().count(), 1);
            } else {
                assert_eq!(names, ["x-keep"]);
            }
        }
        // Nothing to strip: nothing changes.
        let mut h = HeaderMap::new();
        h.insert(header::HOST, HeaderValue::from_static("a"));
        h.insert("x-keep-alive", HeaderValue::from_static("1"));
        let before = h.clone();
        strip_hop_by_hop(&mut h, false);
        assert_eq!(h, before);
    }

    #[test]
    fn a_connection_listing_never_removes_host() {
        for listed in [
            &b"host,x-a"[..],
            b"HOST, x-a",
            b"x-a , Host",
            b"\xff, x-a,host",
        ] {
            let listed = HeaderValue::from_bytes(listed).unwrap();
            let mut h = HeaderMap::new();
            h.insert(header::HOST, HeaderValue::from_static("shop.test"));
            h.insert(header::CONNECTION, listed.clone());
            h.insert("x-a", HeaderValue::from_static("1"));
            let mut found = h.clone();
            strip_hop_by_hop(&mut h, false);
            let hops = RequestFields::of(&found).hops;
            strip_found(&mut found, hops, false);
            for stripped in [h, found] {
                let names: Vec<&str> = stripped.keys().map(|k| k.as_str()).collect();
                assert_eq!(names, ["host"], "{listed:?}");
                assert_eq!(stripped.get(header::HOST).unwrap(), "shop.test");
            }
        }
    }

    #[test]
    fn found_fields_strip_as_a_fresh_look_does() {
        let maps: [&[(&str, &str)]; 6] = [
            &[("host", "a"), ("accept", "*/*")],
            &[
                ("host", "a"),
                ("connection", "keep-alive"),
                ("keep-alive", "5"),
            ],
            &[
                ("connection", "x-a, Close"),
                ("x-a", "1"),
                ("te", "trailers"),
                ("host", "b"),
            ],
            &[
                ("connection", "close"),
                ("connection", "x-b"),
                ("x-b", "2"),
                ("upgrade", "h2c"),
            ],
            &[
                ("transfer-encoding", "chunked"),
                ("trailer", "x"),
                ("proxy-connection", "k"),
            ],
            &[
                ("connection", "KEEP-ALIVE"),
                ("connection", "upgrade"),
                ("upgrade", "ws"),
            ],
        ];
        for fields in maps {
            for keep_upgrade in [false, true] {
                let mut h = HeaderMap::new();
                for (name, value) in fields {
                    h.append(
                        HeaderName::from_static(name),
                        HeaderValue::from_static(value),
                    );
                }
                let mut fresh = h.clone();
                strip_hop_by_hop(&mut fresh, keep_upgrade);
                let hops = RequestFields::of(&h).hops;
                assert_eq!(hops, HopFields::of(&h));
                strip_found(&mut h, hops, keep_upgrade);
                assert_eq!(h, fresh, "{fields:?} {keep_upgrade}");
            }
        }
    }

    #[test]
    fn the_host_fields_are_found_in_one_pass() {
        let mut h = HeaderMap::new();
        assert!(RequestFields::of(&h).host.is_none());
        h.append(header::HOST, HeaderValue::from_static("a.test"));
        h.append(
            header::TRANSFER_ENCODING,
            HeaderValue::from_static("chunked"),
        );
        let fields = RequestFields::of(&h);
        assert_eq!(fields.host.unwrap(), "a.test");
        assert!(!fields.more_hosts);
        assert!(fields.hops.transfer_encoding() && !fields.hops.upgrade());
        h.append(header::HOST, HeaderValue::from_static("b.test"));
        h.append(header::UPGRADE, HeaderValue::from_static("websocket"));
        let fields = RequestFields::of(&h);
        assert_eq!(fields.host.unwrap(), "a.test");
        assert!(fields.more_hosts && fields.hops.upgrade());
    }

    #[test]
    fn upgrade_headers_stay_for_upgrades() {
        let mut h = HeaderMap::new();
        h.insert(header::CONNECTION, HeaderValue::from_static("Upgrade"));
        h.insert(header::UPGRADE, HeaderValue::from_static("websocket"));
        assert!(wants_upgrade(&h));
        strip_hop_by_hop(&mut h, true);
        assert_eq!(h.get(header::CONNECTION).unwrap(), "upgrade");
        assert_eq!(h.get(header::UPGRADE).unwrap(), "websocket");
    }

    #[test]
    fn forwarded_headers() {
        let mut h = HeaderMap::new();
        h.insert("x-forwarded-for", HeaderValue::from_static("10.0.0.1"));
        h.insert("x-forwarded-proto", HeaderValue::from_static("https"));
        let client = ClientInfo::new("127.0.0.2:5000".parse().unwrap());
        add_forwarded_headers(&mut h, &client);
        assert_eq!(h.get("x-forwarded-for").unwrap(), "10.0.0.1, 127.0.0.2");
        assert_eq!(h.get("x-forwarded-proto").unwrap(), "http");
        // A client's own "http" is overwritten too, on a TLS connection.
        let tls = crate::tls::TlsInfo {
            version: "TLSv1.3",
            sni: None,
            alpn: None,
            client_certificate: false,
        };
        let client = ClientInfo::with_tls("127.0.0.2:5000".parse().unwrap(), tls);
        add_forwarded_headers(&mut h, &client);
        assert_eq!(h.get("x-forwarded-proto").unwrap(), "https");
    }

    #[test]
    fn hosts_and_uris() {
        assert_eq!(strip_port("example.com:8080"), "example.com");
        assert_eq!(strip_port("example.com"), "example.com");
        assert_eq!(strip_port("[::1]:80"), "[::1]");
        assert_eq!(strip_port("[::1]"), "[::1]");
        let abs: Uri = "http://example.com/a?b=1".parse().unwrap();
        assert_eq!(origin_form(&abs), "/a?b=1");
        let rel: Uri = "/x".parse().unwrap();
        assert_eq!(origin_form(&rel), "/x");
    }
}
