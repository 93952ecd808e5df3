//! A backend's response head: status line and header fields, parsed from the bytes read so far.

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
    let mut slots = [httparse::EMPTY_HEADER; MAX_HEADERS];
    let mut response = httparse::Response::new(&mut slots);
    let window = &buf[..buf.len().min(max_len)];
    let len = match response.parse(window) {
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
    // The status line by the probes' grammar (`capataz_health::parse_status_line`): a code
    // outside 100-599 is malformed here as it is there.
    let line_end = window.iter().position(|&b| b == b'\n').unwrap_or(0);
    let line = window[..line_end]
        .strip_suffix(b"\r")
        .unwrap_or(&window[..line_end]);
    let status = capataz_health::parse_status_line(line)
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
