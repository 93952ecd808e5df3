//! A backend's response head: status line and header fields, parsed from the bytes read so far.

use std::mem::MaybeUninit;

use bytes::BytesMut;
use http::header::{self, HeaderMap, HeaderName, HeaderValue};
use http::{StatusCode, Version};

use crate::framing::{FramingFields, FramingName};

/// A complete response head.
#[derive(Debug)]
pub struct ResponseHead {
    /// The status code.
    pub status: StatusCode,
    /// HTTP/1.0 or HTTP/1.1.
    pub version: Version,
    /// The header fields, in order (but a final answer's lone `Connection: keep-alive` or
    /// `close` when parsed by [`parse_relayed`]).
    pub headers: HeaderMap,
    /// Whether `headers` holds a hop-by-hop field (RFC 9110 section 7.6.1: `Connection`,
    /// `Keep-Alive`, `Proxy-Connection`, `TE`, `Trailer`, `Transfer-Encoding`, `Upgrade`),
    /// noted as the names were parsed: a proxy strips them from the heads that have one only.
    pub hop_by_hop: bool,
    /// What its `Connection`, `Transfer-Encoding` and `Content-Length` fields said, gathered
    /// as they were parsed: [`crate::framing::response`] reads this, not `headers`, so it
    /// judges the head as the backend sent it. Private, so that a head comes only from
    /// [`parse`], with the two in agreement.
    pub(crate) framing_fields: FramingFields,
}

/// Why a response head is refused.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
pub enum HeadError {
    /// No complete head within the limit.
    #[error("response head larger than {0} bytes")]
    TooLarge(usize),
    /// More header fields than the limit.
    #[error("more than {0} header fields")]
    TooManyHeaders(usize),
    /// Not a valid HTTP/1.x response head; says which part.
    #[error("malformed response head: {0}")]
    Malformed(&'static str),
}

/// The most header fields a response head may have.
pub const MAX_HEADERS: usize = 128;

/// Parses a response head from the start of `buf` and, once it is complete, takes it off the
/// front of `buf`. `Ok(None)`: not complete yet, read more (unless `buf` already holds
/// `max_len` bytes, which is an error). Obsolete line folding, a space before a colon and
/// invalid field values are errors, as is any version but 1.x. Field values share the
/// buffer's memory (no copy).
pub fn parse(buf: &mut BytesMut, max_len: usize) -> Result<Option<ResponseHead>, HeadError> {
    parse_head(buf, max_len, false)
}

/// [`parse`] for an answer a proxy relays: a final answer's (not a 101's) `Connection` field
/// that is `keep-alive` or `close` alone is left out of `headers`, its framing fields noted. It
/// is hop-by-hop, so the relay would remove it, and it names no other field to remove: nearly
/// every backend's answer has one (`Connection: keep-alive`, nginx's), and then no other
/// hop-by-hop field ([`ResponseHead::hop_by_hop`] false), so the relay has nothing to strip.
/// The map took the field, and the strip went over every name and looked this one up again
/// to remove it: about 700 instructions an answer (BENCHMARKS.md, "The backend's answer:
/// hop-by-hop fields, whole bodies, names").
pub fn parse_relayed(
    buf: &mut BytesMut,
    max_len: usize,
) -> Result<Option<ResponseHead>, HeadError> {
    parse_head(buf, max_len, true)
}

/// [`parse`], or [`parse_relayed`] when `relayed`.
#[inline(always)]
fn parse_head(
    buf: &mut BytesMut,
    max_len: usize,
    relayed: bool,
) -> Result<Option<ResponseHead>, HeadError> {
    // Slots left uninitialised: httparse writes those it fills (initialising all 128, 4 KB, cost
    // about 700 instructions a head). Same parser settings as `Response::parse`'s.
    let mut slots = [const { MaybeUninit::<httparse::Header<'_>>::uninit() }; MAX_HEADERS];
    let mut response = httparse::Response::new(&mut []);
    let window = &buf[..buf.len().min(max_len)];
    let parsed = httparse::ParserConfig::default().parse_response_with_uninit_headers(
        &mut response,
        window,
        &mut slots,
    );
    let len = match parsed {
        Ok(httparse::Status::Complete(len)) => len,
        Ok(httparse::Status::Partial) if buf.len() >= max_len => {
            return Err(HeadError::TooLarge(max_len))
        }
        Ok(httparse::Status::Partial) => return Ok(None),
        Err(httparse::Error::TooManyHeaders) => return Err(HeadError::TooManyHeaders(MAX_HEADERS)),
        Err(e) => return Err(HeadError::Malformed(error_text(e))),
    };
    let version = match response.version {
        Some(0) => Version::HTTP_10,
        Some(1) => Version::HTTP_11,
        _ => return Err(HeadError::Malformed("HTTP version")),
    };
    // httparse has checked the line's shape (`HTTP/1.x`, three digits, a reason of text); the
    // range makes it the probes' grammar (`capataz_health::parse_status_line`): a code
    // outside 100-599 is malformed here as it is there (see the test that holds them equal).
    let status = response
        .code
        .filter(|code| (100..=599).contains(code))
        .and_then(|code| StatusCode::from_u16(code).ok())
        .ok_or(HeadError::Malformed("status code"))?;
    // Names are parsed now; values are cut from the head's bytes once they are taken off the
    // buffer, as ranges into it.
    let base = buf.as_ptr() as usize;
    // Each name with the framing field it is, if one (`FramingFields::note`), and whether it
    // is hop-by-hop.
    type Field = (HeaderName, Option<FramingName>, bool, usize, usize);
    let mut fields: Vec<Field> = Vec::with_capacity(response.headers.len());
    for field in response.headers.iter() {
        let name = field.name.as_bytes();
        let (name, framing, hop) = match common_name(name) {
            // `Connection` and `Transfer-Encoding` are the hop-by-hop names among them.
            Some((name, framing)) => (name, framing, framing.is_some_and(FramingName::hop)),
            None => {
                let name = recent_name(name)?;
                // None of the three, as `common_name` knows them; asked all the same.
                let framing = FramingName::of(&name);
                let hop = hop_name(&name).is_some();
                (name, framing, hop)
            }
        };
        let start = field.value.as_ptr() as usize - base;
        fields.push((name, framing, hop, start, start + field.value.len()));
    }
    // A 101's `Connection` goes on with its `Upgrade`, whatever it says.
    let drop_lone = relayed && status != StatusCode::SWITCHING_PROTOCOLS;
    let bytes = buf.split_to(len).freeze();
    let mut headers = HeaderMap::with_capacity(fields.len());
    let mut framing_fields = FramingFields::default();
    let mut hop_by_hop = false;
    for (name, framing, hop, start, end) in fields {
        if drop_lone
            && framing == Some(FramingName::Connection)
            && framing_fields.note_lone_connection(&bytes[start..end])
        {
            continue;
        }
        // SAFETY (of the value's bytes, `from_maybe_shared_unchecked`'s one condition):
        // httparse with its default settings accepted this field's value, and it accepts only
        // HTAB, SP, visible ASCII and obs-text (0x80-0xFF), exactly the bytes `HeaderValue`
        // allows (no other control byte, no DEL, no CR or LF: a folded line is malformed); the
        // test `a_value_httparse_accepts_is_a_header_value` holds the two sets equal, byte by
        // byte. Checking them again cost about 270 instructions a head. (In debug builds the
        // `http` crate checks them all the same, and panics on a stray byte.)
        let value = unsafe { HeaderValue::from_maybe_shared_unchecked(bytes.slice(start..end)) };
        if let Some(framing) = framing {
            framing_fields.note(framing, &value);
        }
        hop_by_hop |= hop;
        headers.append(name, value);
    }
    Ok(Some(ResponseHead {
        status,
        version,
        headers,
        hop_by_hop,
        framing_fields,
    }))
}

/// A hop-by-hop field's name (RFC 9110 section 7.6.1, and the legacy `Keep-Alive` and
/// `Proxy-Connection`): the one list of them, for the parse ([`ResponseHead::hop_by_hop`]) and
/// for the proxy's strip. Those always removed come first, `Connection` first; then `Upgrade`,
/// which an upgrade keeps.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum HopName {
    /// `Connection`.
    Connection,
    /// `Keep-Alive` (legacy).
    KeepAlive,
    /// `Proxy-Connection` (legacy).
    ProxyConnection,
    /// `TE`.
    Te,
    /// `Trailer`.
    Trailer,
    /// `Transfer-Encoding`.
    TransferEncoding,
    /// `Upgrade`.
    Upgrade,
}

/// Which hop-by-hop field `name` (lowercase, as a `HeaderName` is) names, if any. The length is
/// looked at first: most names have a length none of these has.
#[inline]
pub fn hop_name(name: &HeaderName) -> Option<HopName> {
    let name = name.as_str();
    let found = match (name.len(), name) {
        (10, "connection") => HopName::Connection,
        (10, "keep-alive") => HopName::KeepAlive,
        (16, "proxy-connection") => HopName::ProxyConnection,
        (2, "te") => HopName::Te,
        (7, "trailer") => HopName::Trailer,
        (17, "transfer-encoding") => HopName::TransferEncoding,
        (7, "upgrade") => HopName::Upgrade,
        _ => return None,
    };
    Some(found)
}

/// The name of a field backends commonly send, without `HeaderName::from_bytes`'s lowercased
/// copy and table match (about 120 instructions a name; a small head has five or so). `name`
/// is as httparse found it, a token (RFC 9110 section 5.6.2): setting bit 0x20 of each of its
/// bytes folds a letter to lowercase and keeps `-`, and makes no other token byte a letter or
/// `-` (only CR, which no token holds, would become `-`). Each name below is lowercase letters
/// and `-`. Any other name (`None`) goes to `from_bytes`.
/// With the name, which framing field it is, if one (`Connection`, `Content-Length` and
/// `Transfer-Encoding` are among these names).
#[inline]
fn common_name(name: &[u8]) -> Option<(HeaderName, Option<FramingName>)> {
    use FramingName::{Connection, ContentLength, TransferEncoding};
    let (known, framing, lower): (HeaderName, _, &[u8]) = match (name.len(), name.first()? | 0x20) {
        (4, b'd') => (header::DATE, None, b"date"),
        (4, b'e') => (header::ETAG, None, b"etag"),
        (4, b'v') => (header::VARY, None, b"vary"),
        (6, b's') => (header::SERVER, None, b"server"),
        (8, b'l') => (header::LOCATION, None, b"location"),
        (10, b'c') => (header::CONNECTION, Some(Connection), b"connection"),
        (10, b's') => (header::SET_COOKIE, None, b"set-cookie"),
        (12, b'c') => (header::CONTENT_TYPE, None, b"content-type"),
        (13, b'a') => (header::ACCEPT_RANGES, None, b"accept-ranges"),
        (13, b'c') => (header::CACHE_CONTROL, None, b"cache-control"),
        (13, b'l') => (header::LAST_MODIFIED, None, b"last-modified"),
        (14, b'c') => (
            header::CONTENT_LENGTH,
            Some(ContentLength),
            b"content-length",
        ),
        (16, b'c') => (header::CONTENT_ENCODING, None, b"content-encoding"),
        (17, b't') => (
            header::TRANSFER_ENCODING,
            Some(TransferEncoding),
            b"transfer-encoding",
        ),
        _ => return None,
    };
    folded_eq(name, lower).then_some((known, framing))
}

/// How many names outside [`common_name`]'s [`RECENT`] keeps, and how long each may be.
const RECENT_NAMES: usize = 8;
const RECENT_NAME_LEN: usize = 32;

/// The names outside [`common_name`]'s this thread parsed last (a backend's own, such as
/// `x-backend` or `x-request-id`), each a lowercase token of letters, digits and `-`, 4 to
/// [`RECENT_NAME_LEN`] bytes, replaced oldest first. A name `http` does not know is a copy of
/// its bytes, allocated (about 200 instructions with its lowercasing and its free); a name
/// kept here is shared, one reference count more.
struct Recent {
    names: [Option<HeaderName>; RECENT_NAMES],
    next: usize,
}

thread_local! {
    static RECENT: std::cell::RefCell<Recent> = const {
        std::cell::RefCell::new(Recent {
            names: [const { None }; RECENT_NAMES],
            next: 0,
        })
    };
}

/// The name of token `raw` (as httparse found it) when [`common_name`] has none: one of
/// [`RECENT`]'s if `raw` is one of them in any case, else `HeaderName::from_bytes`'s (kept in
/// [`RECENT`] if it may be). A kept name is letters, digits and `-`: of token bytes, only a
/// letter's other case becomes such a byte with bit 0x20 set (a digit's and `-`'s other
/// values are control bytes), so [`folded_eq`] finds exactly the names `from_bytes` would give.
fn recent_name(raw: &[u8]) -> Result<HeaderName, HeadError> {
    RECENT.with_borrow_mut(|recent| {
        let mut kept = recent.names.iter().flatten();
        if let Some(name) = kept.find(|n| folded_eq(raw, n.as_str().as_bytes())) {
            return Ok(name.clone());
        }
        let name = HeaderName::from_bytes(raw).map_err(|_| HeadError::Malformed("header name"))?;
        let keepable = (4..=RECENT_NAME_LEN).contains(&raw.len())
            && name
                .as_str()
                .bytes()
                .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-');
        if keepable {
            let at = recent.next;
            recent.names[at] = Some(name.clone());
            recent.next = (at + 1) % RECENT_NAMES;
        }
        Ok(name)
    })
}

/// Whether token `name` is `lower` (lowercase letters and `-`, as long as `name`, at least 4
/// bytes) in any case, compared eight or four bytes at a time (see [`common_name`]). Digits in
/// `lower` are found as themselves only ([`recent_name`]). `name` may as well be a field
/// value (`FramingFields::note_lone_connection`): of the bytes a value may hold (tab, visible
/// ASCII, obs-text), too, only a letter's other case becomes a letter or `-` with bit 0x20 set.
#[inline]
pub(crate) fn folded_eq(name: &[u8], lower: &[u8]) -> bool {
    let len = name.len();
    if len != lower.len() || len < 4 {
        return false;
    }
    if len < 8 {
        // The first four bytes and the last four, overlapping when shorter than eight.
        let word =
            |b: &[u8], at: usize| u32::from_le_bytes([b[at], b[at + 1], b[at + 2], b[at + 3]]);
        let fold = 0x2020_2020;
        return word(name, 0) | fold == word(lower, 0)
            && word(name, len - 4) | fold == word(lower, len - 4);
    }
    // Eight bytes at a time, the last eight overlapping the ones before.
    let word = |b: &[u8], at: usize| {
        let mut bytes = [0; 8];
        bytes.copy_from_slice(&b[at..at + 8]);
        u64::from_le_bytes(bytes)
    };
    let fold = 0x2020_2020_2020_2020;
    let mut at = 0;
    while at + 8 < len {
        if word(name, at) | fold != word(lower, at) {
            return false;
        }
        at += 8;
    }
    word(name, len - 8) | fold == word(lower, len - 8)
}

fn error_text(error: httparse::Error) -> &'static str {
    match error {
        httparse::Error::HeaderName => "header name",
        httparse::Error::HeaderValue => "header value",
        httparse::Error::NewLine => "line ending",
        httparse::Error::Status => "status code",
        httparse::Error::Token => "token",
        httparse::Error::Version => "HTTP version",
        httparse::Error::TooManyHeaders => "too many header fields",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MAX: usize = 16384;

    /// `common_name`'s name, its framing field checked against `FramingName::of`'s.
    fn common(name: &[u8]) -> Option<HeaderName> {
        let (known, framing) = common_name(name)?;
        assert_eq!(framing, FramingName::of(&known), "{known}");
        Some(known)
    }

    fn parse_bytes(text: &[u8], max_len: usize) -> Result<Option<ResponseHead>, HeadError> {
        let mut buf = BytesMut::from(text);
        let parsed = parse(&mut buf, max_len);
        if let Ok(Some(_)) = &parsed {
            let end = text.windows(4).position(|w| w == b"\r\n\r\n").unwrap() + 4;
            assert_eq!(&buf[..], &text[end..], "the head is taken off the buffer");
        } else {
            assert_eq!(buf.len(), text.len(), "nothing is taken off");
        }
        parsed
    }

    #[test]
    fn a_complete_head_with_its_fields_and_length() {
        let text = b"HTTP/1.1 200 OK\r\nContent-Length: 3\r\nX-Tag: a\r\nx-tag: b\r\n\r\nok\n";
        let head = parse_bytes(text, MAX).unwrap().unwrap();
        assert_eq!(head.status, StatusCode::OK);
        assert_eq!(head.version, Version::HTTP_11);
        assert_eq!(head.headers["content-length"], "3");
        let tags: Vec<_> = head.headers.get_all("x-tag").iter().collect();
        assert_eq!(tags, ["a", "b"]);
    }

    #[test]
    fn http10_and_an_empty_reason() {
        let head = parse_bytes(b"HTTP/1.0 204 \r\n\r\n", MAX).unwrap().unwrap();
        assert_eq!(head.version, Version::HTTP_10);
        assert_eq!(head.status, StatusCode::NO_CONTENT);
    }

    #[test]
    fn every_prefix_of_a_head_is_partial() {
        let text = b"HTTP/1.1 503 Service Unavailable\r\nRetry-After: 1\r\n\r\n";
        for end in 0..text.len() {
            assert!(parse_bytes(&text[..end], MAX).unwrap().is_none(), "{end}");
        }
        assert!(parse_bytes(text, MAX).unwrap().is_some());
    }

    #[test]
    fn limits() {
        let long = format!("HTTP/1.1 200 OK\r\nX-Big: {}\r\n\r\n", "a".repeat(200));
        assert_eq!(
            parse_bytes(long.as_bytes(), 100).unwrap_err(),
            HeadError::TooLarge(100)
        );
        // Not complete, but not at the limit either: read more.
        assert!(parse_bytes(&long.as_bytes()[..50], 100).unwrap().is_none());
        let many = format!(
            "HTTP/1.1 200 OK\r\n{}\r\n",
            "A: b\r\n".repeat(MAX_HEADERS + 1)
        );
        assert_eq!(
            parse_bytes(many.as_bytes(), 65536).unwrap_err(),
            HeadError::TooManyHeaders(MAX_HEADERS)
        );
    }

    #[test]
    fn common_names_are_the_names_from_bytes_gives() {
        let names = [
            "date",
            "etag",
            "vary",
            "server",
            "location",
            "connection",
            "set-cookie",
            "content-type",
            "accept-ranges",
            "cache-control",
            "last-modified",
            "content-length",
            "content-encoding",
            "transfer-encoding",
        ];
        for name in names {
            for written in [
                name.to_string(),
                name.to_ascii_uppercase(),
                name.split('-')
                    .map(|w| w[..1].to_ascii_uppercase() + &w[1..])
                    .collect::<Vec<_>>()
                    .join("-"),
            ] {
                let known = common(written.as_bytes());
                assert_eq!(known, Some(HeaderName::from_static(name)), "{written}");
            }
        }
        // Near misses: same length and first letter, another name (or none the list knows).
        for other in [
            "dat_",
            "dates",
            "da-e",
            "etah",
            "server1",
            "serv-r",
            "connectio_",
            "content-lengtH1",
            "content_length",
            "content.length",
            "contentxlength",
            "transfer-encodinG!",
            "x-date",
            "keep-alive",
            "upgrade",
            "te",
            "a",
            "",
            "cache-contro1",
            "set-cookie2",
        ] {
            let known = common(other.as_bytes());
            let parsed = HeaderName::from_bytes(other.as_bytes()).ok();
            assert!(known.is_none() || known == parsed, "{other}");
            if known.is_some() {
                assert!(
                    names.contains(&other.to_ascii_lowercase().as_str()),
                    "{other}"
                );
            }
        }
    }

    #[test]
    fn recent_names_are_the_names_from_bytes_gives() {
        // Kept in any case, found again in any case; near misses (`^` is `~` with bit 0x20 set,
        // a token byte) are names of their own.
        let written = [
            "X-Backend",
            "x-backend",
            "X-BACKEND",
            "x-request-id2",
            "X-Request-Id2",
            "x~backend",
            "x^backend",
            "X^Backend",
            "x_backend",
            "x-backenD",
            "abc",
            "ABC",
            "a-much-longer-name-than-the-thirty-two-kept",
        ];
        for _ in 0..3 {
            for name in written {
                let text = format!("HTTP/1.1 200 OK\r\n{name}: v\r\nContent-Length: 0\r\n\r\n");
                let head = parse_bytes(text.as_bytes(), MAX).unwrap().unwrap();
                let expected = HeaderName::from_bytes(name.as_bytes()).unwrap();
                let names: Vec<_> = head.headers.keys().collect();
                assert_eq!(names, [&expected, &header::CONTENT_LENGTH], "{name}");
            }
        }
        // More names than are kept: each still its own.
        for i in 0..3 * RECENT_NAMES {
            let name = format!("x-name-{i}");
            let head = parse_bytes(
                format!("HTTP/1.1 204 No\r\n{name}: v\r\n\r\n").as_bytes(),
                MAX,
            );
            assert!(
                head.unwrap().unwrap().headers.contains_key(name.as_str()),
                "{name}"
            );
        }
    }

    #[test]
    fn a_relayed_head_leaves_out_a_lone_keep_alive_or_close() {
        for (value, kept) in [
            ("keep-alive", false),
            ("Keep-Alive", false),
            ("close", false),
            ("CLOSE", false),
            ("keep-alive, x-hop", true),
            ("upgrade", true),
            ("", true),
        ] {
            let text =
                format!("HTTP/1.1 200 OK\r\nConnection: {value}\r\nContent-Length: 0\r\n\r\n");
            let mut buf = BytesMut::from(text.as_bytes());
            let relayed = parse_relayed(&mut buf, MAX).unwrap().unwrap();
            let mut buf = BytesMut::from(text.as_bytes());
            let full = parse(&mut buf, MAX).unwrap().unwrap();
            assert_eq!(
                relayed.headers.contains_key(header::CONNECTION),
                kept,
                "{value}"
            );
            assert!(full.headers.contains_key(header::CONNECTION), "{value}");
            assert_eq!(relayed.hop_by_hop, kept, "{value}");
            assert!(full.hop_by_hop, "{value}");
            // Framed the same either way.
            assert_eq!(relayed.framing_fields, full.framing_fields, "{value}");
        }
        // A 101 keeps its `Connection` whatever it says.
        let text = b"HTTP/1.1 101 Switching\r\nConnection: close\r\nUpgrade: x\r\n\r\n";
        let head = parse_relayed(&mut BytesMut::from(&text[..]), MAX)
            .unwrap()
            .unwrap();
        assert!(head.headers.contains_key(header::CONNECTION) && head.hop_by_hop);
        // Any other hop-by-hop name is noted; an answer without one has none.
        for name in [
            "Keep-Alive",
            "proxy-connection",
            "TE",
            "Trailer",
            "Transfer-Encoding",
            "Upgrade",
        ] {
            let text = format!("HTTP/1.1 200 OK\r\n{name}: x\r\nContent-Length: 0\r\n\r\n");
            let head = parse_relayed(&mut BytesMut::from(text.as_bytes()), MAX);
            assert!(head.unwrap().unwrap().hop_by_hop, "{name}");
        }
        let text = b"HTTP/1.1 200 OK\r\nServer: x\r\nX-Te: y\r\nContent-Length: 0\r\n\r\n";
        let head = parse_relayed(&mut BytesMut::from(&text[..]), MAX)
            .unwrap()
            .unwrap();
        assert!(!head.hop_by_hop);
    }

    proptest::proptest! {
        /// Any token httparse accepts as a name is parsed to the same `HeaderName` with or
        /// without the fast path.
        #[test]
        fn the_fast_path_agrees_with_from_bytes(
            name in "[-!#$%&'*+.^_`|~0-9A-Za-z]{1,20}",
        ) {
            let text = format!("HTTP/1.1 200 OK\r\n{name}: v\r\n\r\n");
            if let Ok(Some(head)) = parse_bytes(text.as_bytes(), MAX) {
                let expected = HeaderName::from_bytes(name.as_bytes()).unwrap();
                proptest::prop_assert!(head.headers.contains_key(&expected), "{}", name);
                proptest::prop_assert_eq!(head.headers.len(), 1);
            }
            if let Some(known) = common(name.as_bytes()) {
                proptest::prop_assert_eq!(known, HeaderName::from_bytes(name.as_bytes()).unwrap());
            }
        }

        /// A known name with one byte changed to any token byte, and its letters' case
        /// flipped at random: the fast path gives `from_bytes`'s name, or none.
        #[test]
        fn near_misses_of_known_names(
            which in 0usize..14,
            at in 0usize..20,
            byte in proptest::sample::select(
                b"-!#$%&'*+.^_`|~0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz".to_vec(),
            ),
            upper in proptest::collection::vec(proptest::prelude::any::<bool>(), 20),
        ) {
            let names = [
                "date", "etag", "vary", "server", "location", "connection", "set-cookie",
                "content-type", "accept-ranges", "cache-control", "last-modified",
                "content-length", "content-encoding", "transfer-encoding",
            ];
            let mut name = names[which].as_bytes().to_vec();
            let at = at % name.len();
            name[at] = byte;
            for (b, up) in name.iter_mut().zip(upper) {
                if up {
                    *b = b.to_ascii_uppercase();
                }
            }
            let parsed = HeaderName::from_bytes(&name).unwrap();
            match common(&name) {
                Some(known) => proptest::prop_assert_eq!(known, parsed),
                None => proptest::prop_assert!(!names.contains(&parsed.as_str())),
            }
        }
    }

    proptest::proptest! {
        /// Traffic and probes accept the same status lines: whatever the code and the reason,
        /// a head parses with a status exactly when `parse_status_line` accepts its line.
        #[test]
        fn status_lines_agree_with_the_probes_grammar(
            code in 0u16..1000,
            minor in proptest::sample::select(vec![b'0', b'1']),
            reason in proptest::collection::vec(proptest::prelude::any::<u8>(), 0..12),
            with_reason in proptest::prelude::any::<bool>(),
        ) {
            let mut line = format!("HTTP/1.{} {code:03}", char::from(minor)).into_bytes();
            if with_reason {
                line.push(b' ');
                line.extend(reason.iter().filter(|&&b| b != b'\r' && b != b'\n'));
            }
            let mut text = line.clone();
            text.extend_from_slice(b"\r\nContent-Length: 0\r\n\r\n");
            let probe = capataz_health::parse_status_line(&line);
            let traffic = parse_bytes(&text, MAX).ok().flatten().map(|head| head.status.as_u16());
            proptest::prop_assert_eq!(traffic, probe, "{:?}", String::from_utf8_lossy(&line));
        }
    }

    /// Every byte in a field's value: httparse (as `parse` sets it up) accepts the head
    /// exactly when `HeaderValue` accepts the value, so the parse can take httparse's word for
    /// it (`from_maybe_shared_unchecked`).
    #[test]
    fn a_value_httparse_accepts_is_a_header_value() {
        for byte in 0..=255u8 {
            let value = [b'a', byte, b'b'];
            let mut text = b"HTTP/1.1 200 OK\r\nX-Byte: ".to_vec();
            text.extend_from_slice(&value);
            text.extend_from_slice(b"\r\n\r\n");
            let parsed = parse_bytes(&text, MAX);
            let valid = HeaderValue::from_bytes(&value).is_ok();
            match parsed {
                Ok(Some(head)) => {
                    assert!(
                        valid,
                        "httparse accepted byte {byte:#04x}, HeaderValue does not"
                    );
                    assert_eq!(head.headers["x-byte"].as_bytes(), &value[..]);
                }
                Err(HeadError::Malformed(_)) => {
                    assert!(
                        !valid,
                        "httparse refused byte {byte:#04x}, HeaderValue accepts it"
                    );
                }
                other => panic!("byte {byte:#04x}: {other:?}"),
            }
        }
    }

    #[test]
    fn garbage_is_malformed() {
        for text in [
            &b"HTTP/2.0 200 OK\r\n\r\n"[..],
            b"HTTP/1.1 20 OK\r\n\r\n",
            b"HTTP/1.1 600 Too Far\r\n\r\n",
            b"HTTP/1.1 099 Too Low\r\n\r\n",
            b"HTTP/1.1 999\r\n\r\n",
            b"SSH-2.0-OpenSSH_9.2\r\n\r\n",
            b"HTTP/1.1 200 OK\r\nBad Name: x\r\n\r\n",
            b"HTTP/1.1 200 OK\r\nX: a\r\n folded\r\n\r\n",
            b"HTTP/1.1 200 OK\r\nX : a\r\n\r\n",
        ] {
            assert!(
                matches!(parse_bytes(text, MAX), Err(HeadError::Malformed(_))),
                "{}",
                String::from_utf8_lossy(text)
            );
        }
    }
}
