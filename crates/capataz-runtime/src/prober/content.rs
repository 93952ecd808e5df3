//! HTTP probes with a configured request (method, header fields, body) or content rules (an
//! expected header, body substrings): [`HttpProbe`] and [`probe_checked`].
//!
//! The plain probe (`GET`, status line only, [`super::probe_once`]) stays the default and the
//! cheap path; this one is taken only when the pool configures something it cannot do. Even
//! here the body is read only when a body rule is configured, and only on an expected status
//! (an unexpected one fails whatever the body says).
//!
//! Reading is bounded: the status line is judged by [`parse_status_line`] (through
//! [`super::judge_line`]) before anything else, the head by [`capataz_h1::head::parse`] within
//! [`MAX_PROBE_HEAD`] bytes, and the body, framed by its `Content-Length`, its chunks or the
//! close ([`capataz_h1::body::BodyReader`]), only up to the rule's `body_limit`; the probe's one
//! deadline covers all of it. Substrings are matched without a regex: a configured text is
//! UTF-8, so it is searched for in each run of valid UTF-8 of the body with `str::contains`
//! (linear time, whatever the backend sends), and never across an invalid byte.
//!
//! [`parse_status_line`]: capataz_health::parse_status_line

use std::io;
use std::net::SocketAddr;
use std::time::Duration;

use bytes::BytesMut;
use capataz_health::{Mismatch, Outcome, ProbeOutcome, Snippet, StatusSet};
use http::Method;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};

use super::{classify_error, connect, judge_line, USER_AGENT};
use crate::config::{ActiveCheckConfig, ContentRules};
use crate::tls::backend::Connector;

/// The largest response head a checked probe reads (status line and header fields).
pub const MAX_PROBE_HEAD: usize = 32 * 1024;

/// The most interim (1xx) answers skipped before the final one; more is malformed.
const MAX_INTERIM: usize = 8;

/// One backend's HTTP probe: the request's bytes, built once, and what its answer must hold.
#[derive(Clone, Debug)]
pub struct HttpProbe {
    request: Vec<u8>,
    method: Method,
    expect: StatusSet,
    rules: ContentRules,
}

impl HttpProbe {
    /// The probe `active` configures, sent with `Host: host`.
    pub fn new(active: &ActiveCheckConfig, host: &str) -> HttpProbe {
        HttpProbe {
            request: request_bytes(active, host),
            // The configuration allows only upper-case letters, which always make a method.
            method: Method::from_bytes(active.method.as_bytes()).unwrap_or(Method::GET),
            expect: active.expect,
            rules: active.content.clone(),
        }
    }

    /// The request's bytes, exactly as sent.
    pub fn request(&self) -> &[u8] {
        &self.request
    }
}

/// The bytes of a configured probe request: the plain probe's fields, then the extra fields in
/// the order of their names (a TOML table has no order), then `Content-Length` and the body when there is one.
pub fn request_bytes(active: &ActiveCheckConfig, host: &str) -> Vec<u8> {
    let mut head = format!(
        "{} {} HTTP/1.1\r\nHost: {host}\r\nUser-Agent: {USER_AGENT}\r\nConnection: close\r\n",
        active.method, active.path
    );
    for (name, value) in &active.headers {
        head.push_str(name);
        head.push_str(": ");
        head.push_str(value);
        head.push_str("\r\n");
    }
    if let Some(body) = &active.body {
        head.push_str(&format!("Content-Length: {}\r\n", body.len()));
    }
    head.push_str("\r\n");
    let mut bytes = head.into_bytes();
    if let Some(body) = &active.body {
        bytes.extend_from_slice(body.as_bytes());
    }
    bytes
}

/// Runs `probe` against `addr` within `timeout` and says what it came to, with the first
/// content rule the answer broke. Failures map as [`super::probe_once`]'s; in addition a head
/// that is not HTTP/1.x within [`MAX_PROBE_HEAD`] bytes, an ill-framed body or a broken chunked
/// coding is [`Outcome::Malformed`], and a body cut short before the limit is
/// [`Outcome::Reset`].
///
/// With `tls` (a pool that speaks TLS to its backends) the exchange runs over TLS with the
/// pool's settings, the handshake inside the one deadline, as [`super::probe_once_over`]'s: a
/// handshake rustls refuses is [`Outcome::Tls`].
pub async fn probe_checked(
    probe: &HttpProbe,
    addr: SocketAddr,
    timeout: Duration,
    tls: Option<&Connector>,
) -> ProbeOutcome {
    probe_checked_sending(probe, addr, timeout, tls, &[]).await
}

/// [`probe_checked`], writing `preamble` first on the connection when it is not empty (see
/// [`super::probe_once_sending`]).
pub async fn probe_checked_sending(
    probe: &HttpProbe,
    addr: SocketAddr,
    timeout: Duration,
    tls: Option<&Connector>,
    preamble: &[u8],
) -> ProbeOutcome {
    match tokio::time::timeout(timeout, exchange(probe, addr, tls, preamble)).await {
        Ok(Ok(outcome)) => outcome,
        Ok(Err(error)) => classify_error(&error).into(),
        Err(_elapsed) => Outcome::Timeout.into(),
    }
}

async fn exchange(
    probe: &HttpProbe,
    addr: SocketAddr,
    tls: Option<&Connector>,
    preamble: &[u8],
) -> io::Result<ProbeOutcome> {
    let stream = connect(addr, preamble).await?;
    match tls {
        None => exchange_on(probe, stream).await,
        Some(tls) => match tls.connect_probe(stream).await {
            Ok(stream) => exchange_on(probe, stream).await,
            Err(error) if error.kind() == io::ErrorKind::InvalidData => Ok(Outcome::Tls.into()),
            Err(error) => Err(error),
        },
    }
}

/// The probe's exchange on a connected `stream` (TCP or TLS).
pub(super) async fn exchange_on<S>(probe: &HttpProbe, mut stream: S) -> io::Result<ProbeOutcome>
where
    S: AsyncRead + AsyncWrite + Unpin,
{
    stream.write_all(&probe.request).await?;
    let mut buf = BytesMut::with_capacity(4096);
    let mut interim = 0;
    let (code, head) = loop {
        let code = loop {
            if let Some(newline) = buf.iter().position(|&b| b == b'\n') {
                match judge_line(&buf[..newline]) {
                    Outcome::Status(code) => break code,
                    other => return Ok(other.into()),
                }
            }
            if buf.len() >= super::MAX_STATUS_LINE {
                return Ok(Outcome::Malformed.into());
            }
            if read_more(&mut stream, &mut buf).await? == 0 {
                if buf.is_empty() {
                    return Ok(Outcome::Reset.into());
                }
                return Ok(judge_line(&buf).into());
            }
        };
        let head = loop {
            match capataz_h1::head::parse(&mut buf, MAX_PROBE_HEAD) {
                Ok(Some(head)) => break head,
                Ok(None) => {
                    if read_more(&mut stream, &mut buf).await? == 0 {
                        // The head was cut short.
                        return Ok(Outcome::Reset.into());
                    }
                }
                Err(_) => return Ok(Outcome::Malformed.into()),
            }
        };
        if (100..200).contains(&code) && code != 101 {
            interim += 1;
            if interim > MAX_INTERIM {
                return Ok(Outcome::Malformed.into());
            }
            continue;
        }
        break (code, head);
    };
    let status = ProbeOutcome::from(Outcome::Status(code));
    if !probe.expect.contains(code) {
        // The engine fails it on its status; the body would add nothing.
        return Ok(status);
    }
    if let Some(mismatch) = header_mismatch(&probe.rules, &head.headers) {
        return Ok(with(status, mismatch));
    }
    if !probe.rules.reads_body() {
        return Ok(status);
    }
    let Ok(framing) = capataz_h1::framing::response(&probe.method, &head) else {
        return Ok(Outcome::Malformed.into());
    };
    let limit = probe.rules.body_limit;
    let mut reader = capataz_h1::body::BodyReader::new(framing);
    let mut body: Vec<u8> = Vec::with_capacity(limit.min(16 * 1024));
    while body.len() < limit && !reader.is_done() {
        match reader.decode(&mut buf) {
            Ok(capataz_h1::body::Step::Data(data)) => {
                let take = data.len().min(limit - body.len());
                body.extend_from_slice(&data[..take]);
            }
            Ok(capataz_h1::body::Step::End) => break,
            Ok(capataz_h1::body::Step::NeedMore) => {
                if read_more(&mut stream, &mut buf).await? == 0 && reader.handle_eof().is_err() {
                    return Ok(Outcome::Reset.into());
                }
            }
            Err(_) => return Ok(Outcome::Malformed.into()),
        }
    }
    Ok(match body_mismatch(&probe.rules, &body) {
        Some(mismatch) => with(status, mismatch),
        None => status,
    })
    // `stream` is dropped here: the rest of a long body is never read.
}

/// Reads what the backend sends next into `buf`; 0 at the end of the stream.
async fn read_more<S: AsyncRead + Unpin>(stream: &mut S, buf: &mut BytesMut) -> io::Result<usize> {
    buf.reserve(8 * 1024);
    stream.read_buf(buf).await
}

fn with(status: ProbeOutcome, mismatch: Mismatch) -> ProbeOutcome {
    ProbeOutcome {
        mismatch: Some(mismatch),
        ..status
    }
}

/// The header rule `headers` break, if any (shared with the HTTP/2 probe).
pub(super) fn header_mismatch(rules: &ContentRules, headers: &http::HeaderMap) -> Option<Mismatch> {
    let (name, value) = rules.header.as_ref()?;
    let mut values = headers.get_all(name.as_str()).iter().peekable();
    if values.peek().is_none() {
        return Some(Mismatch::HeaderAbsent(Snippet::new(name)));
    }
    let value = value.as_ref()?;
    if values.any(|v| contains(v.as_bytes(), value)) {
        return None;
    }
    Some(Mismatch::HeaderLacks {
        name: Snippet::new(name),
        value: Snippet::new(value),
    })
}

/// The first body rule `body` breaks (`body_contains`, then `body_not_contains`).
pub(super) fn body_mismatch(rules: &ContentRules, body: &[u8]) -> Option<Mismatch> {
    if let Some(text) = &rules.body_contains {
        if !contains(body, text) {
            return Some(Mismatch::BodyLacks(Snippet::new(text)));
        }
    }
    if let Some(text) = &rules.body_not_contains {
        if contains(body, text) {
            return Some(Mismatch::BodyHas(Snippet::new(text)));
        }
    }
    None
}

/// Whether `haystack` contains `needle`, byte for byte. The needle is UTF-8, so it can only
/// occur within a run of valid UTF-8; each run is searched with `str::contains` (linear).
fn contains(haystack: &[u8], needle: &str) -> bool {
    haystack
        .utf8_chunks()
        .any(|chunk| chunk.valid().contains(needle))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn substrings_are_found_byte_for_byte_and_never_across_invalid_bytes() {
        assert!(contains(b"status: ok\n", "ok"));
        assert!(!contains(b"status: OK\n", "ok"));
        assert!(contains(b"\xff\xfeok\xff", "ok"));
        assert!(!contains(b"o\xffk", "ok"));
        assert!(contains("caf\u{e9} ready".as_bytes(), "\u{e9} r"));
        assert!(!contains(b"", "ok"));
    }

    #[test]
    fn body_rules_report_the_first_broken_one() {
        let rules = ContentRules {
            body_contains: Some("ok".into()),
            body_not_contains: Some("maintenance".into()),
            body_limit: 100,
            header: None,
        };
        assert_eq!(body_mismatch(&rules, b"all ok"), None);
        assert_eq!(
            body_mismatch(&rules, b"down"),
            Some(Mismatch::BodyLacks(Snippet::new("ok")))
        );
        assert_eq!(
            body_mismatch(&rules, b"ok but maintenance"),
            Some(Mismatch::BodyHas(Snippet::new("maintenance")))
        );
    }
}
