//! A request head over the listener's `max_header_bytes` is answered 431 by h3 and counted
//! as a refused head. h3's own client will not send one (it keeps to the server's
//! SETTINGS_MAX_FIELD_SECTION_SIZE), so this client writes the HTTP/3 frames itself on a raw
//! QUIC connection: a control stream with empty SETTINGS, and a request stream whose HEADERS
//! frame is QPACK-encoded by hand (static table references and literals, no dynamic table,
//! RFC 9204 section 4.5).

use super::{h3_balancer, udp_addr, SITE};
use crate::support::balancer::{backends, metrics_text, ConfigText};
use crate::support::h3client::{client_config, connect};
use crate::support::tls::Pki;
use crate::support::wait::wait_until;
use crate::support::DEADLINE;

/// A QUIC variable-length integer (RFC 9000 section 16).
fn varint(value: u64, out: &mut Vec<u8>) {
    match value {
        0..=63 => out.push(value as u8),
        64..=16383 => out.extend_from_slice(&(value as u16 | 0x4000).to_be_bytes()),
        _ => out.extend_from_slice(&(value as u32 | 0x8000_0000).to_be_bytes()),
    }
}

/// A QPACK/HPACK prefixed integer (RFC 7541 section 5.1): `flags` in the first byte's bits
/// above its `prefix` low bits.
fn prefixed(flags: u8, prefix: u32, value: usize, out: &mut Vec<u8>) {
    let max = (1usize << prefix) - 1;
    if value < max {
        out.push(flags | value as u8);
        return;
    }
    out.push(flags | max as u8);
    let mut rest = value - max;
    while rest >= 128 {
        out.push((rest % 128) as u8 | 0x80);
        rest /= 128;
    }
    out.push(rest as u8);
}

/// A string literal without Huffman coding, its length in a `prefix`-bit integer.
fn literal(flags: u8, prefix: u32, bytes: &[u8], out: &mut Vec<u8>) {
    prefixed(flags, prefix, bytes.len(), out);
    out.extend_from_slice(bytes);
}

/// The HEADERS frame of `GET https://{SITE}/` with one more field, `name: value`.
fn headers_frame(name: &str, value: &[u8]) -> Vec<u8> {
    // Required Insert Count 0, Delta Base 0: no dynamic table.
    let mut block = vec![0x00, 0x00];
    // Indexed field lines from the static table: :method GET (17), :scheme https (23),
    // :path / (1).
    block.extend_from_slice(&[0xc0 | 17, 0xc0 | 23, 0xc0 | 1]);
    // :authority (static name 0) with a literal value.
    block.push(0x50);
    literal(0x00, 7, SITE.as_bytes(), &mut block);
    // A literal name and value.
    literal(0x20, 3, name.as_bytes(), &mut block);
    literal(0x00, 7, value, &mut block);
    let mut frame = Vec::new();
    varint(0x01, &mut frame);
    varint(block.len() as u64, &mut frame);
    frame.extend_from_slice(&block);
    frame
}

/// The first frame on `recv` (type and payload), read as it arrives.
async fn first_frame(recv: &mut quinn::RecvStream) -> (u64, Vec<u8>) {
    let mut got = Vec::new();
    let mut chunk = [0u8; 4096];
    loop {
        if let Some(frame) = parse_frame(&got) {
            return frame;
        }
        let n = recv
            .read(&mut chunk)
            .await
            .expect("the answer's bytes")
            .expect("a frame before the stream's end");
        got.extend_from_slice(&chunk[..n]);
    }
}

fn parse_frame(bytes: &[u8]) -> Option<(u64, Vec<u8>)> {
    let (kind, used) = read_varint(bytes)?;
    let (length, more) = read_varint(&bytes[used..])?;
    let start = used + more;
    let payload = bytes.get(start..start + length as usize)?;
    Some((kind, payload.to_vec()))
}

fn read_varint(bytes: &[u8]) -> Option<(u64, usize)> {
    let first = *bytes.first()?;
    let len = 1usize << (first >> 6);
    let raw = bytes.get(..len)?;
    let mut value = u64::from(first & 0x3f);
    for byte in &raw[1..] {
        value = (value << 8) | u64::from(*byte);
    }
    Some((value, len))
}

/// A raw QUIC connection to the HTTP/3 listener at `addr`, its control stream open (its type,
/// 0x00, and an empty SETTINGS frame, 0x04 with length 0), for heads written by hand. The
/// control stream is kept: closing it would close the connection.
pub(super) struct RawH3 {
    _endpoint: quinn::Endpoint,
    connection: quinn::Connection,
    _control: quinn::SendStream,
}

impl RawH3 {
    pub(super) async fn connect(pki: &Pki, addr: std::net::SocketAddr) -> RawH3 {
        let endpoint = quinn::Endpoint::client("127.0.0.1:0".parse().unwrap()).unwrap();
        let connection = endpoint
            .connect_with(client_config(pki), addr, SITE)
            .unwrap()
            .await
            .expect("QUIC connection");
        let mut control = connection.open_uni().await.unwrap();
        control.write_all(&[0x00, 0x04, 0x00]).await.unwrap();
        RawH3 {
            _endpoint: endpoint,
            connection,
            _control: control,
        }
    }

    /// A request stream of one HEADERS frame with the field `name: value`, then its end;
    /// the first frame of the answer (its type and payload), within the deadline.
    pub(super) async fn head(&self, name: &str, value: &[u8]) -> (u64, Vec<u8>) {
        let (mut send, mut recv) = self.connection.open_bi().await.unwrap();
        send.write_all(&headers_frame(name, value)).await.unwrap();
        send.finish().unwrap();
        tokio::time::timeout(DEADLINE, first_frame(&mut recv))
            .await
            .expect("an answer in time")
    }
}

/// h3's answer to an oversized head: a HEADERS frame holding `:status: 431` alone, as its
/// stateless QPACK encoder writes it: no dynamic table (0x00 0x00), a literal with the
/// static name `:status` (index 24: 0x5f 0x09), and the value "431" Huffman-coded (RFC 7541
/// appendix B: '4' 011010, '3' 011001, '1' 00001, padded with ones: 0x69 0x90 0xff).
pub(super) const STATUS_431: [u8; 8] = [0x00, 0x00, 0x5f, 0x09, 0x83, 0x69, 0x90, 0xff];

#[tokio::test]
async fn an_oversized_http3_head_is_answered_431_and_counted_as_a_refused_head() {
    let pki = Pki::new();
    let b = backends(&["a"]).await;
    let (balancer, _) = h3_balancer(
        &pki,
        ConfigText::sims(&b),
        Some(""),
        "max_header_bytes = 4096",
    )
    .await;
    let addr = udp_addr(&balancer);
    let raw = RawH3::connect(&pki, addr).await;
    // Within the limit: answered by the backend.
    let (kind, _) = raw.head("x-small", &[b'v'; 100]).await;
    assert_eq!(kind, 0x01, "a HEADERS frame");
    // One field of 5,000 bytes: over 4,096.
    let (kind, payload) = raw.head("x-big", &[b'v'; 5000]).await;
    assert_eq!((kind, payload.as_slice()), (0x01, &STATUS_431[..]));
    // Only the first request reached the backend; the second is counted as a head capataz
    // refused, under no route and method `other`.
    assert_eq!(b[0].traffic_hits(), 1);
    let refused = "capataz_client_requests_total{listener=\"listener-0\",route=\"\",pool=\"\",\
                   method=\"other\",class=\"4xx\",answered_by=\"capataz\"} 1";
    wait_until("the refused head counted", || {
        metrics_text(&balancer).contains(refused)
    })
    .await;
    // HTTP/3 serves on: a real client's request on a new connection is answered.
    let mut client = connect(&pki, addr, SITE).await.expect("HTTP/3");
    let answer = client.get(SITE, "/").await.expect("answer");
    assert_eq!(answer.head.status(), http::StatusCode::OK);
}
