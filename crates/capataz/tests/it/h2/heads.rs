//! What a request's header fields and trailers may hold over HTTP/2: the same field count as
//! over HTTP/1.1 (100, `431` beyond, not logged, no backend reached), and a trailer section
//! with a pseudo-header field or a field that cannot come after the content is malformed (RFC
//! 9113 section 8.1): the stream is reset (`PROTOCOL_ERROR`), the client blamed, the backend
//! charged nothing.

use http::{HeaderValue, Method, StatusCode};
use tokio::io::AsyncWriteExt;

use super::{balancer, charged, echo_backend};
use crate::support::access_log::{lines, table, wait_json, LogDir};
use crate::support::client::Client;
use crate::support::h2client::{connect, empty, request};
use crate::support::h2frames::{
    data, handshake, headers, hpack, read_frame, request_block, HEADERS, RST_STREAM,
};
use crate::support::raw::roundtrip;

/// PROTOCOL_ERROR.
const PROTOCOL_ERROR: u32 = 1;

#[tokio::test]
async fn http2_heads_over_100_header_fields_get_431_as_over_http1() {
    let backend = echo_backend("echo").await;
    let logs = LogDir::new();
    let path = logs.path("access.log");
    let (_balancer, addr, _events) = balancer(
        &[backend.entry("echo")],
        &format!("max_header_bytes = 65536\n{}", table(&path, "json", "")),
        "",
    )
    .await;
    // HTTP/2: `:authority` (the Host) and 99 fields pass, and 100 tiny ones do not.
    let mut conn = connect(addr).await;
    for (fields, status) in [
        (99, StatusCode::OK),
        (100, StatusCode::REQUEST_HEADER_FIELDS_TOO_LARGE),
        (300, StatusCode::REQUEST_HEADER_FIELDS_TOO_LARGE),
    ] {
        let mut req = request(Method::GET, "app.test", "/", empty());
        for i in 0..fields {
            req.headers_mut().insert(
                format!("x-{i}").parse::<http::HeaderName>().unwrap(),
                HeaderValue::from_static("v"),
            );
        }
        let answer = conn.send(req).await.expect("an answer");
        assert_eq!(answer.status, status, "{fields} fields and :authority");
    }
    assert_eq!(backend.hits(), 1, "only the head within the limit went on");
    // HTTP/1.1: `Host` and 99 fields pass, and 100 do not: the same limit.
    for (fields, status) in [(99, 200), (100, 431)] {
        let extra: String = (0..fields).map(|i| format!("X-{i}: v\r\n")).collect();
        let head = format!("GET / HTTP/1.1\r\nHost: app.test\r\n{extra}\r\n");
        let reply = roundtrip(addr, head.as_bytes()).await.expect("an answer");
        assert_eq!(reply.status, status, "Host and {fields} fields");
    }
    assert_eq!(backend.hits(), 2);
    // Logged: the answered requests; the heads refused were not, whatever the protocol (a
    // last request's line comes after any line of theirs).
    let mut client = Client::new(addr);
    assert_eq!(client.get("/").await.status, 200);
    let logged = wait_json(&path, 3).await;
    assert_eq!(lines(&path).len(), 3, "{logged:?}");
    assert!(
        logged.iter().all(|line| line["status"] == 200),
        "{logged:?}"
    );
}

#[tokio::test]
async fn malformed_request_trailers_reset_the_stream_and_charge_nothing() {
    let backend = echo_backend("echo").await;
    let logs = LogDir::new();
    let path = logs.path("access.log");
    let (balancer, addr, _events) =
        balancer(&[backend.entry("echo")], &table(&path, "json", ""), "").await;
    let (mut read, mut write, _) = handshake(addr).await;
    let malformed: [(&str, &str); 8] = [
        (":path", "/other"),
        (":method", "GET"),
        (":status", "200"),
        ("content-length", "3"),
        ("host", "elsewhere.test"),
        ("te", "trailers"),
        ("transfer-encoding", "chunked"),
        ("connection", "close"),
    ];
    let mut id = 1;
    for field in malformed.iter().copied().chain([("x-checksum", "abc")]) {
        // A POST whose body is on its way, then its trailers.
        write
            .write_all(&headers(
                id,
                &request_block("POST", "app.test", "/up"),
                false,
                true,
            ))
            .await
            .unwrap();
        write.write_all(&data(id, b"abc", false)).await.unwrap();
        write
            .write_all(&headers(id, &hpack(&[field]), true, true))
            .await
            .unwrap();
        let ended = loop {
            let frame = read_frame(&mut read)
                .await
                .expect("the connection stays open");
            if frame.stream == id && matches!(frame.kind, HEADERS | RST_STREAM) {
                break frame;
            }
        };
        if field.0 == "x-checksum" {
            assert_eq!(ended.kind, HEADERS, "well-formed trailers: answered");
        } else {
            assert_eq!(ended.kind, RST_STREAM, "{field:?}");
            assert_eq!(ended.payload, PROTOCOL_ERROR.to_be_bytes(), "{field:?}");
        }
        id += 2;
    }
    // Nothing against the backend: only the well-formed request's answer.
    assert_eq!(
        charged(&balancer, 0),
        vec![capataz_health::Outcome::Status(200)]
    );
    let logged = wait_json(&path, malformed.len() + 1).await;
    let client_ended = logged
        .iter()
        .filter(|line| line["ended_by"] == "client")
        .count();
    assert_eq!(client_ended, malformed.len(), "{logged:?}");
    for line in logged.iter().filter(|line| line["ended_by"] == "client") {
        // Ended while its body was on its way (or before the attempt got that far).
        assert_ne!(line["phase"], "body", "{line}");
        assert_ne!(line["status"], 200, "{line}");
    }
}
