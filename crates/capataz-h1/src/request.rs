//! A request's head as sent to a backend, and the chunk framing of a body of unknown length.

use http::header::{self, HeaderMap};
use http::Method;

/// How the body of a request to a backend is framed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RequestBody {
    /// No body.
    None,
    /// Exactly this many bytes, with `Content-Length`.
    Exact(u64),
    /// A body of unknown length, chunked.
    Chunked,
}

impl RequestBody {
    /// The framing for a body that has ended already (`end_stream`) or has this exact length
    /// (`exact`), else chunked.
    pub fn of(end_stream: bool, exact: Option<u64>) -> RequestBody {
        match (end_stream, exact) {
            (true, _) | (false, Some(0)) => RequestBody::None,
            (false, Some(n)) => RequestBody::Exact(n),
            (false, None) => RequestBody::Chunked,
        }
    }
}

/// The end of a chunked body, with no trailer fields.
pub const LAST_CHUNK: &[u8] = b"0\r\n\r\n";

/// Writes the head of a request to `out`: `method`, the origin-form `target`, HTTP/1.1, every
/// field of `headers` except `Content-Length` and `Transfer-Encoding` (framing is decided here,
/// from `body`, never copied from the client), then the framing field. A bodiless POST, PUT or
/// PATCH says `content-length: 0`, as RFC 9110 section 8.6 asks of a user agent.
pub fn encode_head(
    method: &Method,
    target: &str,
    headers: &HeaderMap,
    body: RequestBody,
    out: &mut Vec<u8>,
) {
    out.extend_from_slice(method.as_str().as_bytes());
    out.push(b' ');
    out.extend_from_slice(target.as_bytes());
    out.extend_from_slice(b" HTTP/1.1\r\n");
    for (name, value) in headers {
        if name == header::CONTENT_LENGTH || name == header::TRANSFER_ENCODING {
            continue;
        }
        out.extend_from_slice(name.as_str().as_bytes());
        out.extend_from_slice(b": ");
        out.extend_from_slice(value.as_bytes());
        out.extend_from_slice(b"\r\n");
    }
    match body {
        RequestBody::Exact(n) => {
            out.extend_from_slice(b"content-length: ");
            out.extend_from_slice(n.to_string().as_bytes());
            out.extend_from_slice(b"\r\n");
        }
        RequestBody::Chunked => out.extend_from_slice(b"transfer-encoding: chunked\r\n"),
        RequestBody::None if matches!(*method, Method::POST | Method::PUT | Method::PATCH) => {
            out.extend_from_slice(b"content-length: 0\r\n");
        }
        RequestBody::None => {}
    }
    out.extend_from_slice(b"\r\n");
}

/// The line that opens a chunk of `len` bytes (`len` must not be 0: that is the last chunk).
pub fn chunk_start(len: usize) -> String {
    format!("{len:x}\r\n")
}

#[cfg(test)]
mod tests {
    use super::*;
    use http::HeaderValue;

    fn head(method: Method, headers: &HeaderMap, body: RequestBody) -> String {
        let mut out = Vec::new();
        encode_head(&method, "/a?b=1", headers, body, &mut out);
        String::from_utf8(out).unwrap()
    }

    #[test]
    fn the_head_and_its_framing() {
        let mut h = HeaderMap::new();
        h.insert(header::HOST, HeaderValue::from_static("app.test"));
        h.append("x-tag", HeaderValue::from_static("one"));
        h.append("x-tag", HeaderValue::from_static("two"));
        // The client's own framing never passes.
        h.insert(header::CONTENT_LENGTH, HeaderValue::from_static("999"));
        h.insert(
            header::TRANSFER_ENCODING,
            HeaderValue::from_static("chunked"),
        );
        assert_eq!(
            head(Method::GET, &h, RequestBody::None),
            "GET /a?b=1 HTTP/1.1\r\nhost: app.test\r\nx-tag: one\r\nx-tag: two\r\n\r\n"
        );
        assert_eq!(
            head(Method::POST, &h, RequestBody::Exact(12)),
            "POST /a?b=1 HTTP/1.1\r\nhost: app.test\r\nx-tag: one\r\nx-tag: two\r\ncontent-length: 12\r\n\r\n"
        );
        assert_eq!(
            head(Method::PUT, &HeaderMap::new(), RequestBody::Chunked),
            "PUT /a?b=1 HTTP/1.1\r\ntransfer-encoding: chunked\r\n\r\n"
        );
        assert_eq!(
            head(Method::POST, &HeaderMap::new(), RequestBody::None),
            "POST /a?b=1 HTTP/1.1\r\ncontent-length: 0\r\n\r\n"
        );
        assert_eq!(
            head(Method::DELETE, &HeaderMap::new(), RequestBody::None),
            "DELETE /a?b=1 HTTP/1.1\r\n\r\n"
        );
    }

    #[test]
    fn framing_from_what_is_known_of_the_body() {
        assert_eq!(RequestBody::of(true, Some(0)), RequestBody::None);
        assert_eq!(RequestBody::of(true, None), RequestBody::None);
        assert_eq!(RequestBody::of(false, Some(0)), RequestBody::None);
        assert_eq!(RequestBody::of(false, Some(5)), RequestBody::Exact(5));
        assert_eq!(RequestBody::of(false, None), RequestBody::Chunked);
        assert_eq!(chunk_start(255), "ff\r\n");
    }
}
