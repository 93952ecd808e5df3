//! A backend's response head: status line and header fields, parsed from the bytes read so far.

use std::mem::MaybeUninit;

use bytes::BytesMut;
use http::header::{HeaderMap, HeaderName, HeaderValue};
use http::{StatusCode, Version};

/// A complete response head.
#[derive(Debug)]
pub struct ResponseHead {
    /// The status code.
    pub status: StatusCode,
    /// HTTP/1.0 or HTTP/1.1.
    pub version: Version,
    /// The header fields, in order.
    pub headers: HeaderMap,
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
    let mut fields: Vec<(HeaderName, usize, usize)> = Vec::with_capacity(response.headers.len());
    for field in response.headers.iter() {
        let name = HeaderName::from_bytes(field.name.as_bytes())
            .map_err(|_| HeadError::Malformed("header name"))?;
        let start = field.value.as_ptr() as usize - base;
        fields.push((name, start, start + field.value.len()));
    }
    let bytes = buf.split_to(len).freeze();
    let mut headers = HeaderMap::with_capacity(fields.len());
    for (name, start, end) in fields {
        let value = HeaderValue::from_maybe_shared(bytes.slice(start..end))
            .map_err(|_| HeadError::Malformed("header value"))?;
        headers.append(name, value);
    }
    Ok(Some(ResponseHead {
        status,
        version,
        headers,
    }))
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
