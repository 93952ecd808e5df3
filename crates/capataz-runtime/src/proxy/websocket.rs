//! WebSocket over HTTP/2 (RFC 8441, extended CONNECT) to HTTP/1.1 backends.
//!
//! An HTTP/2 client opens a WebSocket with `CONNECT` and `:protocol = websocket` on a stream;
//! the backend gets the HTTP/1.1 handshake of RFC 6455 for the same path (`GET` with
//! `Connection: Upgrade`, `Upgrade: websocket` and a `Sec-WebSocket-Key` of capataz's own,
//! which HTTP/2 has no use for); its `101` becomes a `200` on the stream, and the stream's DATA
//! frames and the backend's connection are joined as an HTTP/1.1 upgrade's two sockets are.

use http::header::{self, HeaderMap, HeaderValue};
use http::{Method, Request, Response, StatusCode, Version};

/// Whether `req` is an extended CONNECT for a WebSocket: HTTP/2, `CONNECT`, `:protocol`
/// `websocket` (case-insensitive). hyper's server accepts `:protocol` only because the
/// listener announces `SETTINGS_ENABLE_CONNECT_PROTOCOL`.
pub(super) fn is_websocket_connect<B>(req: &Request<B>) -> bool {
    req.version() == Version::HTTP_2
        && req.method() == Method::CONNECT
        && req
            .extensions()
            .get::<hyper::ext::Protocol>()
            .is_some_and(|protocol| protocol.as_str().eq_ignore_ascii_case("websocket"))
}

/// Turns the extended CONNECT's method and headers into an HTTP/1.1 WebSocket handshake:
/// `GET`, `Connection: Upgrade`, `Upgrade: websocket` and a fresh `Sec-WebSocket-Key` (any the
/// client sent is replaced: RFC 8441 has none, and one key per backend handshake is what
/// RFC 6455 asks). `Sec-WebSocket-Version`, `-Protocol` and `-Extensions` pass as they are.
pub(super) fn to_http1_handshake(method: &mut Method, headers: &mut HeaderMap) {
    *method = Method::GET;
    headers.insert(header::CONNECTION, HeaderValue::from_static("Upgrade"));
    headers.insert(header::UPGRADE, HeaderValue::from_static("websocket"));
    headers.insert(header::SEC_WEBSOCKET_KEY, handshake_key());
}

/// Turns the backend's `101 Switching Protocols` into the extended CONNECT's answer: `200`
/// without the HTTP/1.1 handshake's fields (`Connection` and `Upgrade` are connection-specific,
/// and `Sec-WebSocket-Accept` answers a key the client never sent), and with no length (a
/// successful CONNECT answer carries none).
pub(super) fn to_h2_answer<B>(response: &mut Response<B>) {
    *response.status_mut() = StatusCode::OK;
    let headers = response.headers_mut();
    for name in [
        header::CONNECTION,
        header::UPGRADE,
        header::SEC_WEBSOCKET_ACCEPT,
        header::CONTENT_LENGTH,
        header::TRANSFER_ENCODING,
    ] {
        headers.remove(name);
    }
}

/// A `Sec-WebSocket-Key`: 16 random bytes in base64, written straight as 22 characters of the
/// alphabet and `==`. The 22nd character carries only 2 bits of the 16th byte, so it is one
/// whose low 4 bits are zero (`A`, `Q`, `g`, `w`), as a canonical encoding has.
fn handshake_key() -> HeaderValue {
    const ALPHABET: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let mut key = [b'='; 24];
    for slot in &mut key[..21] {
        *slot = ALPHABET[fastrand::usize(..64)];
    }
    key[21] = ALPHABET[fastrand::usize(..4) * 16];
    HeaderValue::from_bytes(&key).expect("base64 is a valid header value")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn decode(text: &[u8]) -> Vec<u8> {
        let value = |c: u8| {
            b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/"
                .iter()
                .position(|&a| a == c)
                .expect("a base64 character") as u32
        };
        let body = text.strip_suffix(b"==").expect("padded to 16 bytes");
        let mut bits = 0u32;
        let mut count = 0;
        let mut out = Vec::new();
        for &c in body {
            bits = (bits << 6) | value(c);
            count += 6;
            if count >= 8 {
                count -= 8;
                out.push((bits >> count) as u8);
                bits &= (1 << count) - 1;
            }
        }
        assert_eq!(bits, 0, "canonical: no bits left over");
        out
    }

    #[test]
    fn handshake_keys_are_16_random_bytes_in_canonical_base64() {
        let keys: Vec<HeaderValue> = (0..200).map(|_| handshake_key()).collect();
        for key in &keys {
            assert_eq!(key.len(), 24);
            assert_eq!(decode(key.as_bytes()).len(), 16);
        }
        let mut unique = keys.clone();
        unique.sort_by(|a, b| a.as_bytes().cmp(b.as_bytes()));
        unique.dedup();
        assert_eq!(unique.len(), keys.len());
    }

    #[test]
    fn the_connect_becomes_a_get_with_the_upgrade_fields_and_a_fresh_key() {
        let mut method = Method::CONNECT;
        let mut headers = HeaderMap::new();
        headers.insert(
            header::SEC_WEBSOCKET_KEY,
            HeaderValue::from_static("client's"),
        );
        headers.insert(
            header::SEC_WEBSOCKET_VERSION,
            HeaderValue::from_static("13"),
        );
        to_http1_handshake(&mut method, &mut headers);
        assert_eq!(method, Method::GET);
        assert_eq!(headers[header::CONNECTION], "Upgrade");
        assert_eq!(headers[header::UPGRADE], "websocket");
        assert_ne!(headers[header::SEC_WEBSOCKET_KEY], "client's");
        assert_eq!(headers[header::SEC_WEBSOCKET_VERSION], "13");
    }

    #[test]
    fn the_101_becomes_a_200_without_the_handshake_fields() {
        let mut response = Response::builder()
            .status(StatusCode::SWITCHING_PROTOCOLS)
            .header(header::CONNECTION, "Upgrade")
            .header(header::UPGRADE, "websocket")
            .header(header::SEC_WEBSOCKET_ACCEPT, "s3pPLMBiTxaQ9kYGzzhZRbK+xOo=")
            .header(header::SEC_WEBSOCKET_PROTOCOL, "chat")
            .body(())
            .unwrap();
        to_h2_answer(&mut response);
        assert_eq!(response.status(), StatusCode::OK);
        let names: Vec<&str> = response.headers().keys().map(|k| k.as_str()).collect();
        assert_eq!(names, ["sec-websocket-protocol"]);
    }
}
