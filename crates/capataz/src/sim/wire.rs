//! Just enough HTTP/1.1 for a real client: request heads, sized and chunked request bodies
//! (read and discarded), and answers with `Content-Length` bodies.

use tokio::io::AsyncReadExt;
use tokio::net::TcpStream;

use std::io;

/// The largest request head accepted; a larger one is answered 431 and the connection closed.
const MAX_HEAD_BYTES: usize = 64 * 1024;

pub(super) enum HeadError {
    Io,
    TooLarge,
}

/// Reads one request head (through its empty line) out of `buf` and the stream; `None` on a
/// clean end of stream between requests.
pub(super) async fn read_head(
    stream: &mut TcpStream,
    buf: &mut Vec<u8>,
) -> Result<Option<Vec<u8>>, HeadError> {
    loop {
        // Empty lines before a request line are tolerated (RFC 9112 section 2.2).
        let skip = buf
            .iter()
            .take_while(|&&b| b == b'\r' || b == b'\n')
            .count();
        buf.drain(..skip);
        if let Some(end) = head_end(buf) {
            let head = buf.drain(..end).collect();
            return Ok(Some(head));
        }
        if buf.len() > MAX_HEAD_BYTES {
            return Err(HeadError::TooLarge);
        }
        match fill(stream, buf).await {
            Ok(0) if buf.is_empty() => return Ok(None),
            Ok(0) | Err(_) => return Err(HeadError::Io),
            Ok(_) => {}
        }
    }
}

/// The length of the head at the start of `buf`, including the empty line that ends it.
fn head_end(buf: &[u8]) -> Option<usize> {
    let mut line_start = 0;
    for (i, &b) in buf.iter().enumerate() {
        if b == b'\n' {
            let line = &buf[line_start..i];
            if line.is_empty() || line == b"\r" {
                return Some(i + 1);
            }
            line_start = i + 1;
        }
    }
    None
}

/// Appends what the stream has to `buf`; 0 at the end of the stream.
pub(super) async fn fill(stream: &mut TcpStream, buf: &mut Vec<u8>) -> io::Result<usize> {
    let mut chunk = [0u8; 8192];
    let n = stream.read(&mut chunk).await?;
    buf.extend_from_slice(&chunk[..n]);
    Ok(n)
}

pub(super) async fn discard_exact(
    stream: &mut TcpStream,
    buf: &mut Vec<u8>,
    mut length: u64,
) -> io::Result<()> {
    loop {
        let take = usize::try_from(length).unwrap_or(usize::MAX).min(buf.len());
        buf.drain(..take);
        // `take` fits in u64: it is at most `length`.
        length -= take as u64;
        if length == 0 {
            return Ok(());
        }
        if fill(stream, buf).await? == 0 {
            return Err(io::ErrorKind::UnexpectedEof.into());
        }
    }
}

pub(super) async fn discard_chunked(stream: &mut TcpStream, buf: &mut Vec<u8>) -> io::Result<()> {
    loop {
        let line = read_line(stream, buf).await?;
        let size = chunk_size(&line).ok_or(io::ErrorKind::InvalidData)?;
        if size == 0 {
            // Trailer fields, up to and including the empty line.
            loop {
                if read_line(stream, buf).await?.is_empty() {
                    return Ok(());
                }
            }
        }
        discard_exact(stream, buf, size).await?;
        if !read_line(stream, buf).await?.is_empty() {
            return Err(io::ErrorKind::InvalidData.into());
        }
    }
}

/// Reads one line, without its ending, out of `buf` and the stream.
async fn read_line(stream: &mut TcpStream, buf: &mut Vec<u8>) -> io::Result<Vec<u8>> {
    loop {
        if let Some(newline) = buf.iter().position(|&b| b == b'\n') {
            let mut line: Vec<u8> = buf.drain(..=newline).collect();
            line.pop();
            if line.last() == Some(&b'\r') {
                line.pop();
            }
            return Ok(line);
        }
        if buf.len() > MAX_HEAD_BYTES {
            return Err(io::ErrorKind::InvalidData.into());
        }
        if fill(stream, buf).await? == 0 {
            return Err(io::ErrorKind::UnexpectedEof.into());
        }
    }
}

/// The size in a chunk-size line (hex digits, then optional extensions).
pub(super) fn chunk_size(line: &[u8]) -> Option<u64> {
    let digits = line.iter().take_while(|b| b.is_ascii_hexdigit()).count();
    if digits == 0 || digits > 15 {
        return None;
    }
    let text = std::str::from_utf8(&line[..digits]).ok()?;
    u64::from_str_radix(text, 16).ok()
}

/// The parts of a request the backend cares about.
pub(super) struct Request {
    method: String,
    target: String,
    pub(super) body: Body,
    pub(super) keep_alive: bool,
    host: Option<String>,
    forwarded_for: Option<String>,
    forwarded_proto: Option<String>,
}

pub(super) enum Body {
    None,
    Length(u64),
    Chunked,
}

impl Request {
    /// Parses a request head; `None` if it is not one.
    pub(super) fn parse(head: &[u8]) -> Option<Request> {
        let text = std::str::from_utf8(head).ok()?;
        let mut lines = text
            .split('\n')
            .map(|line| line.strip_suffix('\r').unwrap_or(line));
        let mut request_line = lines.next()?.split(' ');
        let (method, target, version) = (
            request_line.next()?,
            request_line.next()?,
            request_line.next()?,
        );
        if request_line.next().is_some() || method.is_empty() || target.is_empty() {
            return None;
        }
        let http11 = match version {
            "HTTP/1.1" => true,
            "HTTP/1.0" => false,
            _ => return None,
        };
        let mut request = Request {
            method: method.to_owned(),
            target: target.to_owned(),
            body: Body::None,
            keep_alive: http11,
            host: None,
            forwarded_for: None,
            forwarded_proto: None,
        };
        let mut chunked = false;
        let mut length = None;
        for line in lines.filter(|line| !line.is_empty()) {
            let (name, value) = line.split_once(':')?;
            let value = value.trim_matches([' ', '\t']);
            if value.bytes().any(|b| b.is_ascii_control() && b != b'\t') {
                return None;
            }
            match name.to_ascii_lowercase().as_str() {
                "host" => request.host = Some(value.to_owned()),
                "x-forwarded-for" => append(&mut request.forwarded_for, value),
                "x-forwarded-proto" => append(&mut request.forwarded_proto, value),
                "content-length" => length = Some(value.parse::<u64>().ok()?),
                "transfer-encoding" => {
                    chunked = value
                        .rsplit(',')
                        .next()
                        .is_some_and(|last| last.trim().eq_ignore_ascii_case("chunked"));
                    if !chunked {
                        return None;
                    }
                }
                "connection" => {
                    for token in value.split(',').map(str::trim) {
                        if token.eq_ignore_ascii_case("close") {
                            request.keep_alive = false;
                        } else if token.eq_ignore_ascii_case("keep-alive") && !http11 {
                            request.keep_alive = true;
                        }
                    }
                }
                _ => {}
            }
        }
        request.body = match (chunked, length) {
            (true, Some(_)) => {
                // Both framings: chunked wins, and the connection must not be reused.
                request.keep_alive = false;
                Body::Chunked
            }
            (true, None) => Body::Chunked,
            (false, Some(length)) if length > 0 => Body::Length(length),
            (false, _) => Body::None,
        };
        Some(request)
    }

    /// The request path, without any query.
    pub(super) fn path(&self) -> &str {
        self.target.split('?').next().unwrap_or_default()
    }

    /// The bytes of the answer to this request.
    pub(super) fn response(&self, code: u16, name: &str, retry_after: Option<u32>) -> Vec<u8> {
        let reason = http::StatusCode::from_u16(code)
            .ok()
            .and_then(|status| status.canonical_reason())
            .unwrap_or("Status");
        let body = format!("{name}\n");
        let mut out = format!("HTTP/1.1 {code:03} {reason}\r\nX-Backend: {name}\r\n");
        if let Some(host) = &self.host {
            out.push_str(&format!("X-Seen-Host: {host}\r\n"));
        }
        if let Some(xff) = &self.forwarded_for {
            out.push_str(&format!("X-Seen-Xff: {xff}\r\n"));
        }
        if let Some(proto) = &self.forwarded_proto {
            out.push_str(&format!("X-Seen-Proto: {proto}\r\n"));
        }
        if let Some(seconds) = retry_after {
            out.push_str(&format!("Retry-After: {seconds}\r\n"));
        }
        let bodyless = (100..200).contains(&code) || code == 204 || code == 304;
        if !bodyless {
            out.push_str("Content-Type: text/plain\r\n");
            out.push_str(&format!("Content-Length: {}\r\n", body.len()));
        }
        if !self.keep_alive {
            out.push_str("Connection: close\r\n");
        }
        out.push_str("\r\n");
        if !bodyless && self.method != "HEAD" {
            out.push_str(&body);
        }
        out.into_bytes()
    }
}

fn append(field: &mut Option<String>, value: &str) {
    match field {
        Some(existing) => {
            existing.push_str(", ");
            existing.push_str(value);
        }
        None => *field = Some(value.to_owned()),
    }
}

/// A closing error answer for a request that could not be read.
pub(super) fn plain_error(code: u16) -> Vec<u8> {
    let reason = http::StatusCode::from_u16(code)
        .ok()
        .and_then(|status| status.canonical_reason())
        .unwrap_or("Error");
    format!("HTTP/1.1 {code} {reason}\r\nContent-Length: 0\r\nConnection: close\r\n\r\n")
        .into_bytes()
}
