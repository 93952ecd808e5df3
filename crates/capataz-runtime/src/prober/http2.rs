//! Probes over HTTP/2: `kind = "http"` on a pool that speaks HTTP/2 to its backends
//! (`protocol = "h2"`, over TLS with ALPN `h2`; `"h2c"`, by prior knowledge), and
//! `kind = "grpc"`, the standard gRPC health check (`grpc.health.v1.Health/Check`).
//!
//! Each probe is one fresh connection: TCP (and TLS), the HTTP/2 handshake, one request, the
//! answer, then the connection is dropped; the probe's one deadline covers all of it. The
//! connection is driven in the probe's own task (no spawned task outlives a probe).
//!
//! What is read is bounded: the response head within [`MAX_PROBE_HEAD`] bytes (the HTTP/2
//! header list limit), the body only for a body rule and only up to its `body_limit`, and a
//! gRPC answer's message within [`MAX_GRPC_MESSAGE`] bytes. A gRPC answer is decoded by hand
//! ([`decode_health_response`]): anything that is not one uncompressed, well-formed
//! `HealthCheckResponse` is [`Outcome::Malformed`], never a panic.

use std::net::SocketAddr;
use std::time::Duration;

use bytes::{BufMut, Bytes, BytesMut};
use capataz_health::{parse_grpc_status, Mismatch, Outcome, ProbeOutcome, StatusSet};
use http::{HeaderMap, HeaderName, HeaderValue, Method, Request, Uri};
use tokio::io::{AsyncRead, AsyncWrite};

use super::content::{body_mismatch, header_mismatch};
use super::{classify_error, connect, MAX_PROBE_HEAD, USER_AGENT};
use crate::config::{ActiveCheckConfig, CheckKind, ContentRules};
use crate::tls::backend::Connector;

/// The largest gRPC health answer read (prefix and message); a longer one is malformed.
pub const MAX_GRPC_MESSAGE: usize = 4096;

/// The gRPC health check's method path.
const HEALTH_CHECK: &str = "/grpc.health.v1.Health/Check";

/// One backend's HTTP/2 probe, built once: the request, and how its answer is judged.
#[derive(Clone, Debug)]
pub struct H2Probe {
    method: Method,
    uri: Uri,
    headers: HeaderMap,
    body: Bytes,
    judge: Judge,
}

#[derive(Clone, Debug)]
enum Judge {
    /// An HTTP probe: an expected status, then the content rules.
    Http {
        expect: StatusSet,
        rules: ContentRules,
    },
    /// A gRPC health check.
    Grpc,
}

impl H2Probe {
    /// The probe `active` configures (`kind = "http"` or `"grpc"`), sent with `:authority`
    /// `host` (the `Host` of an HTTP/1.1 probe) and the scheme `https` when `tls`.
    pub fn new(active: &ActiveCheckConfig, host: &str, tls: bool) -> H2Probe {
        if active.kind == CheckKind::Grpc {
            return H2Probe::grpc(&active.grpc_service, host, tls);
        }
        let mut headers = HeaderMap::new();
        headers.insert(
            http::header::USER_AGENT,
            HeaderValue::from_static(USER_AGENT),
        );
        let mut authority = host.to_owned();
        for (name, value) in &active.headers {
            let (Ok(name), Ok(value)) = (
                HeaderName::from_bytes(name.as_bytes()),
                HeaderValue::from_str(value),
            ) else {
                continue;
            };
            if name == http::header::HOST {
                // HTTP/2 carries the host as `:authority`.
                authority = value.to_str().unwrap_or(host).to_owned();
            } else if !is_connection_specific(&name) {
                headers.append(name, value);
            }
        }
        H2Probe {
            // The configuration allows only upper-case letters, which always make a method.
            method: Method::from_bytes(active.method.as_bytes()).unwrap_or(Method::GET),
            uri: uri(tls, &authority, &active.path),
            headers,
            body: active.body.clone().map(Bytes::from).unwrap_or_default(),
            judge: Judge::Http {
                expect: active.expect,
                rules: active.content.clone(),
            },
        }
    }

    /// The gRPC health check asking about `service` (empty: the server as a whole).
    pub fn grpc(service: &str, host: &str, tls: bool) -> H2Probe {
        let mut headers = HeaderMap::new();
        headers.insert(
            http::header::USER_AGENT,
            HeaderValue::from_static(USER_AGENT),
        );
        headers.insert(
            http::header::CONTENT_TYPE,
            HeaderValue::from_static("application/grpc"),
        );
        headers.insert(http::header::TE, HeaderValue::from_static("trailers"));
        H2Probe {
            method: Method::POST,
            uri: uri(tls, host, HEALTH_CHECK),
            headers,
            body: encode_health_request(service),
            judge: Judge::Grpc,
        }
    }
}

/// `scheme://authority/path`; the authority falls back to `localhost` if `authority` is not
/// one (the configuration keeps spaces and control bytes out, but not every other oddity).
fn uri(tls: bool, authority: &str, path: &str) -> Uri {
    let scheme = if tls { "https" } else { "http" };
    Uri::builder()
        .scheme(scheme)
        .authority(authority)
        .path_and_query(path)
        .build()
        .or_else(|_| {
            Uri::builder()
                .scheme(scheme)
                .authority("localhost")
                .path_and_query(path)
                .build()
        })
        .unwrap_or_else(|_| Uri::from_static("http://localhost/"))
}

/// Header fields HTTP/2 forbids (RFC 9113 section 8.2.2); a configured one is left out.
fn is_connection_specific(name: &HeaderName) -> bool {
    matches!(
        name.as_str(),
        "connection" | "keep-alive" | "proxy-connection" | "transfer-encoding" | "upgrade" | "te"
    )
}

/// Runs `probe` against `addr` within `timeout` (connect, TLS with `tls`, the HTTP/2
/// handshake, the request and the answer) and says what it came to.
///
/// Failures map as [`super::probe_once_over`]'s; in addition an HTTP/2 protocol error (a
/// backend that does not speak HTTP/2, or speaks it badly) is [`Outcome::Malformed`], and a
/// stream or connection the backend reset or closed (`RST_STREAM`, `GOAWAY`) is
/// [`Outcome::Reset`]. An HTTP probe's answer is [`Outcome::Status`] with the first content
/// rule it broke. A gRPC health check's answer is [`Outcome::Grpc`]: its `grpc-status` (an
/// HTTP status other than 200 maps to a gRPC code as gRPC clients do: 404 is UNIMPLEMENTED,
/// 429, 502, 503 and 504 UNAVAILABLE, ...), and when that is OK, the serving status it
/// reported other than `SERVING` as [`Mismatch::GrpcServing`].
pub async fn probe_h2(
    probe: &H2Probe,
    addr: SocketAddr,
    timeout: Duration,
    tls: Option<&Connector>,
) -> ProbeOutcome {
    match tokio::time::timeout(timeout, exchange(probe, addr, tls)).await {
        Ok(outcome) => outcome,
        Err(_elapsed) => Outcome::Timeout.into(),
    }
}

async fn exchange(probe: &H2Probe, addr: SocketAddr, tls: Option<&Connector>) -> ProbeOutcome {
    let tcp = match connect(addr, &[]).await {
        Ok(tcp) => tcp,
        Err(error) => return classify_error(&error).into(),
    };
    match tls {
        None => over(probe, tcp).await,
        Some(tls) => match tls.connect_probe(tcp).await {
            Ok(stream) => over(probe, stream).await,
            Err(error) if error.kind() == std::io::ErrorKind::InvalidData => Outcome::Tls.into(),
            Err(error) => classify_error(&error).into(),
        },
    }
}

/// The HTTP/2 connection on `io`, driven beside the one request until its answer is judged.
pub(super) async fn over<S>(probe: &H2Probe, io: S) -> ProbeOutcome
where
    S: AsyncRead + AsyncWrite + Unpin,
{
    let handshake = h2::client::Builder::new()
        .max_header_list_size(MAX_PROBE_HEAD as u32)
        .enable_push(false)
        .handshake::<_, Bytes>(io)
        .await;
    let (client, connection) = match handshake {
        Ok(pair) => pair,
        Err(error) => return classify_h2(&error).into(),
    };
    let call = call(probe, client);
    tokio::pin!(connection);
    tokio::pin!(call);
    let mut connection_done = false;
    loop {
        tokio::select! {
            biased;
            outcome = &mut call => return outcome,
            // The connection ended: the call sees what arrived before, or the error.
            _ = &mut connection, if !connection_done => connection_done = true,
        }
    }
    // The connection is dropped here: the rest of a long answer is never read.
}

async fn call(probe: &H2Probe, client: h2::client::SendRequest<Bytes>) -> ProbeOutcome {
    match send(probe, client).await {
        Ok(outcome) => outcome,
        Err(error) => classify_h2(&error).into(),
    }
}

async fn send(
    probe: &H2Probe,
    client: h2::client::SendRequest<Bytes>,
) -> Result<ProbeOutcome, h2::Error> {
    let mut client = client.ready().await?;
    let mut request = Request::new(());
    *request.method_mut() = probe.method.clone();
    *request.uri_mut() = probe.uri.clone();
    *request.headers_mut() = probe.headers.clone();
    let (response, mut body_out) = client.send_request(request, probe.body.is_empty())?;
    if !probe.body.is_empty() {
        body_out.send_data(probe.body.clone(), true)?;
    }
    let (head, mut body) = response.await?.into_parts();
    let code = head.status.as_u16();
    match &probe.judge {
        Judge::Http { expect, rules } => {
            let status = ProbeOutcome::from(Outcome::Status(code));
            if !expect.contains(code) {
                return Ok(status);
            }
            if let Some(mismatch) = header_mismatch(rules, &head.headers) {
                return Ok(with(status, mismatch));
            }
            if !rules.reads_body() {
                return Ok(status);
            }
            let limit = rules.body_limit;
            let read = read_body(&mut body, limit).await?;
            Ok(match body_mismatch(rules, &read) {
                Some(mismatch) => with(status, mismatch),
                None => status,
            })
        }
        Judge::Grpc => {
            if code != 200 {
                return Ok(Outcome::Grpc(grpc_code_of_http(code)).into());
            }
            // A trailers-only answer carries its status in the head.
            if let Some(status) = head.headers.get("grpc-status") {
                return Ok(grpc_answer(status, None));
            }
            let message = read_body(&mut body, MAX_GRPC_MESSAGE + 1).await?;
            if message.len() > MAX_GRPC_MESSAGE {
                return Ok(Outcome::Malformed.into());
            }
            let trailers = body.trailers().await?;
            Ok(match trailers.as_ref().and_then(|t| t.get("grpc-status")) {
                Some(status) => grpc_answer(status, Some(&message)),
                None => Outcome::Malformed.into(),
            })
        }
    }
}

/// Reads the body up to `limit` bytes (or its end), giving the window back as it goes.
async fn read_body(body: &mut h2::RecvStream, limit: usize) -> Result<Vec<u8>, h2::Error> {
    let mut read = Vec::with_capacity(limit.min(16 * 1024));
    while read.len() < limit {
        let Some(chunk) = body.data().await else {
            break;
        };
        let chunk = chunk?;
        let _ = body.flow_control().release_capacity(chunk.len());
        let take = chunk.len().min(limit - read.len());
        read.extend_from_slice(&chunk[..take]);
    }
    Ok(read)
}

/// A gRPC health answer with `grpc-status` `status` and, unless trailers-only, `message`.
fn grpc_answer(status: &HeaderValue, message: Option<&[u8]>) -> ProbeOutcome {
    // A status that is not a number within 0-255 is UNKNOWN (2), as gRPC clients read it.
    let code = parse_grpc_status(status.as_bytes()).unwrap_or(2);
    if code != 0 {
        return Outcome::Grpc(code).into();
    }
    match message.and_then(decode_health_response) {
        None => Outcome::Malformed.into(),
        Some(SERVING) => Outcome::Grpc(0).into(),
        Some(other) => with(Outcome::Grpc(0).into(), Mismatch::GrpcServing(other)),
    }
}

/// `HealthCheckResponse.ServingStatus.SERVING`.
const SERVING: u64 = 1;

/// The gRPC code a client gives an answer with HTTP status `code` other than 200 (the gRPC
/// spec's "HTTP to gRPC status code mapping").
fn grpc_code_of_http(code: u16) -> u8 {
    match code {
        400 => 13,                   // INTERNAL
        401 => 16,                   // UNAUTHENTICATED
        403 => 7,                    // PERMISSION_DENIED
        404 => 12,                   // UNIMPLEMENTED
        429 | 502 | 503 | 504 => 14, // UNAVAILABLE
        _ => 2,                      // UNKNOWN
    }
}

fn with(status: ProbeOutcome, mismatch: Mismatch) -> ProbeOutcome {
    ProbeOutcome {
        mismatch: Some(mismatch),
        ..status
    }
}

/// Maps an HTTP/2 failure: an IO error as a probe's; a reset or `GOAWAY` from the backend is
/// [`Outcome::Reset`]; anything else (the backend broke the protocol, or does not speak it)
/// is [`Outcome::Malformed`].
fn classify_h2(error: &h2::Error) -> Outcome {
    if let Some(io) = error.get_io() {
        return classify_error(io);
    }
    if error.is_remote() && (error.is_reset() || error.is_go_away()) {
        return Outcome::Reset;
    }
    Outcome::Malformed
}

/// The framed `grpc.health.v1.HealthCheckRequest { service }`: the 5-byte prefix (not
/// compressed, the length, big-endian), then field 1 as a length-delimited string (left out
/// when empty, as proto3 does).
pub fn encode_health_request(service: &str) -> Bytes {
    let mut message = BytesMut::new();
    if !service.is_empty() {
        message.put_u8(0x0a);
        put_varint(&mut message, service.len() as u64);
        message.put_slice(service.as_bytes());
    }
    let mut framed = BytesMut::with_capacity(5 + message.len());
    framed.put_u8(0);
    framed.put_u32(message.len() as u32);
    framed.put_slice(&message);
    framed.freeze()
}

fn put_varint(buf: &mut BytesMut, mut value: u64) {
    while value >= 0x80 {
        buf.put_u8((value as u8 & 0x7f) | 0x80);
        value >>= 7;
    }
    buf.put_u8(value as u8);
}

/// The serving status of one framed `grpc.health.v1.HealthCheckResponse`: exactly one
/// uncompressed message, its length as its prefix says. Unknown fields are skipped; field 1
/// absent is `UNKNOWN` (0), as proto3 reads it. `None` for anything else (a compressed or cut
/// or overlong message, a bad varint, a field of the wrong type, a group). Never panics.
pub fn decode_health_response(framed: &[u8]) -> Option<u64> {
    let [0, a, b, c, d, message @ ..] = framed else {
        return None;
    };
    if u32::from_be_bytes([*a, *b, *c, *d]) as usize != message.len() {
        return None;
    }
    let mut rest = message;
    let mut status = 0;
    while !rest.is_empty() {
        let key = varint(&mut rest)?;
        let (field, wire) = (key >> 3, key & 7);
        match (field, wire) {
            (0, _) => return None,
            (1, 0) => status = varint(&mut rest)?,
            (1, _) => return None,
            (_, 0) => {
                varint(&mut rest)?;
            }
            (_, 1) => rest = rest.get(8..)?,
            (_, 2) => {
                let len = usize::try_from(varint(&mut rest)?).ok()?;
                rest = rest.get(len..)?;
            }
            (_, 5) => rest = rest.get(4..)?,
            _ => return None,
        }
    }
    Some(status)
}

/// Reads one protobuf varint (at most 10 bytes, fitting 64 bits) off the front of `rest`.
fn varint(rest: &mut &[u8]) -> Option<u64> {
    let mut value: u64 = 0;
    for (i, &byte) in rest.iter().enumerate().take(10) {
        let bits = u64::from(byte & 0x7f);
        if i == 9 && bits > 1 {
            return None;
        }
        value |= bits << (7 * i);
        if byte & 0x80 == 0 {
            *rest = &rest[i + 1..];
            return Some(value);
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn framed(message: &[u8]) -> Vec<u8> {
        let mut out = vec![0];
        out.extend_from_slice(&(message.len() as u32).to_be_bytes());
        out.extend_from_slice(message);
        out
    }

    #[test]
    fn the_health_request_is_the_prefix_and_the_service_as_field_one() {
        assert_eq!(&encode_health_request("")[..], &[0, 0, 0, 0, 0]);
        assert_eq!(
            &encode_health_request("shop.Cart")[..],
            b"\x00\x00\x00\x00\x0b\x0a\x09shop.Cart"
        );
        let long = "s".repeat(300);
        let request = encode_health_request(&long);
        // 300 is the varint 0xac 0x02.
        assert_eq!(&request[5..8], &[0x0a, 0xac, 0x02]);
        assert_eq!(request.len(), 5 + 3 + 300);
    }

    #[test]
    fn serving_statuses_are_read_and_unknown_fields_skipped() {
        assert_eq!(decode_health_response(&framed(b"\x08\x01")), Some(1));
        assert_eq!(decode_health_response(&framed(b"\x08\x02")), Some(2));
        assert_eq!(decode_health_response(&framed(b"\x08\x03")), Some(3));
        // Field 1 absent: proto3's default, UNKNOWN.
        assert_eq!(decode_health_response(&framed(b"")), Some(0));
        // Unknown fields of every wire type around it.
        let message = b"\x10\x05\x19abcdefgh\x22\x02hi\x2dabcd\x08\x01";
        assert_eq!(decode_health_response(&framed(message)), Some(1));
    }

    #[test]
    fn malformed_answers_are_refused() {
        // Compressed, cut, overlong, a length that lies, wrong wire type, a group, field 0.
        assert_eq!(
            decode_health_response(b"\x01\x00\x00\x00\x02\x08\x01"),
            None
        );
        assert_eq!(decode_health_response(b"\x00\x00\x00"), None);
        assert_eq!(
            decode_health_response(b"\x00\x00\x00\x00\x01\x08\x01"),
            None
        );
        assert_eq!(
            decode_health_response(b"\x00\x00\x00\x00\x03\x08\x01"),
            None
        );
        assert_eq!(decode_health_response(&framed(b"\x0a\x01\x01")), None);
        assert_eq!(decode_health_response(&framed(b"\x13\x14")), None);
        assert_eq!(decode_health_response(&framed(b"\x00\x01")), None);
        assert_eq!(decode_health_response(&framed(b"\x08")), None);
        assert_eq!(
            decode_health_response(&framed(&[
                0x08, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x7f
            ])),
            None
        );
        assert_eq!(decode_health_response(&framed(b"\x22\x05hi")), None);
    }

    #[test]
    fn http_statuses_map_to_grpc_codes_as_clients_read_them() {
        assert_eq!(grpc_code_of_http(404), 12);
        assert_eq!(grpc_code_of_http(503), 14);
        assert_eq!(grpc_code_of_http(500), 2);
    }

    proptest! {
        #[test]
        fn the_decoder_never_panics(bytes in proptest::collection::vec(any::<u8>(), 0..64)) {
            let _ = decode_health_response(&bytes);
            let _ = decode_health_response(&framed(&bytes));
        }

        #[test]
        fn any_status_round_trips(status in any::<u64>()) {
            let mut message = BytesMut::new();
            message.put_u8(0x08);
            put_varint(&mut message, status);
            prop_assert_eq!(decode_health_response(&framed(&message)), Some(status));
        }
    }
}
