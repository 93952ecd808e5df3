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
    /// The header fields, in order.
    pub headers: HeaderMap,
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
    // Each name with the framing field it is, if one (`FramingFields::note`).
    type Field = (HeaderName, Option<FramingName>, usize, usize);
    let mut fields: Vec<Field> = Vec::with_capacity(response.headers.len());
    for field in response.headers.iter() {
        let name = field.name.as_bytes();
        let (name, framing) = match common_name(name) {
            Some(known) => known,
            None => {
                let name = HeaderName::from_bytes(name)
                    .map_err(|_| HeadError::Malformed("header name"))?;
                // None of the three, as `common_name` knows them; asked all the same.
                let framing = FramingName::of(&name);
                (name, framing)
            }
        };
        let start = field.value.as_ptr() as usize - base;
        fields.push((name, framing, start, start + field.value.len()));
    }
    let bytes = buf.split_to(len).freeze();
    let mut headers = HeaderMap::with_capacity(fields.len());
    let mut framing_fields = FramingFields::default();
    for (name, framing, start, end) in fields {
        let value = HeaderValue::from_maybe_shared(bytes.slice(start..end))
            .map_err(|_| HeadError::Malformed("header value"))?;
        if let Some(framing) = framing {
            framing_fields.note(framing, &value);
        }
        headers.append(name, value);
    }
    Ok(Some(ResponseHead {
        status,
        version,
        headers,
        framing_fields,
    }))
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

/// Whether token `name` is `lower` (lowercase letters and `-`, as long as `name`, at least 4
/// bytes) in any case, compared eight or four bytes at a time (see [`common_name`]).
#[inline]
fn folded_eq(name: &[u8], lower: &[u8]) -> bool {
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
