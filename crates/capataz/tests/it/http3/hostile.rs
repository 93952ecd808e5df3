//! Hostile HTTP/3 clients: a request whose stream stays open after its head is not held
//! forever, and a body that ends short of its `Content-Length` before its first byte is the
//! client's, never relayed with a length it will not keep; a frame announcing a gigabyte,
//! on a request stream or the control stream, is stopped before capataz holds it.

use std::sync::Arc;
use std::time::Duration;

use http::{Method, Request};

use super::{h3_balancer, json_log, udp_addr, SITE};
use crate::support::access_log::{lines, wait_json, LogDir};
use crate::support::balancer::{metrics_text, ConfigText};
use crate::support::h3client::{client_config, connect, connect_with, read_answer};
use crate::support::raw::length_backend;
use crate::support::tls::Pki;
use crate::support::DEADLINE;

#[tokio::test]
async fn a_get_whose_stream_stays_open_is_ended_after_header_read_timeout() {
    let pki = Pki::new();
    let backend = length_backend().await;
    let config = ConfigText::new(&[backend.entry("a")]).extra("active.kind = \"none\"\n");
    let (balancer, _) = h3_balancer(
        &pki,
        config,
        Some(""),
        "header_read_timeout = \"500ms\"\nidle_timeout = \"60s\"",
    )
    .await;
    // A client that keeps its connection alive (QUIC PINGs), so only capataz can end it.
    let mut transport = quinn::TransportConfig::default();
    transport.keep_alive_interval(Some(Duration::from_millis(200)));
    let mut config = client_config(&pki);
    config.transport_config(Arc::new(transport));
    let mut client = connect_with(config, udp_addr(&balancer), SITE)
        .await
        .unwrap();
    // A GET's head, its stream never finished and no DATA: the head is whole, the request
    // never is.
    let request = Request::get(format!("https://{SITE}/")).body(()).unwrap();
    let mut stream = client.start(request, None).await.unwrap();
    let ended = tokio::time::timeout(DEADLINE, read_answer(&mut stream)).await;
    let ended = ended.expect("the request was held past header_read_timeout");
    assert!(ended.is_err(), "answered: {:?}", ended.map(|a| a.head));
    assert_eq!(backend.accepted(), 0, "a backend was connected");
    assert!(
        client.connection.close_reason().is_none(),
        "the connection was closed, not the stream"
    );
}

#[tokio::test]
async fn a_body_that_ends_before_its_first_byte_is_never_relayed_with_its_length() {
    let pki = Pki::new();
    let logs = LogDir::new();
    let log = logs.path("access.log");
    let backend = length_backend().await;
    let config = ConfigText::new(&[backend.entry("a")]).extra(
        "[pools.web.active]\nkind = \"none\"\n[pools.web.passive]\nconsecutive_errors = 1\n",
    );
    let (balancer, _) = h3_balancer(&pki, config, Some(""), &json_log(&log)).await;
    let mut client = connect(&pki, udp_addr(&balancer), SITE).await.unwrap();
    // Five bytes announced, the stream ended with the head (its FIN with the HEADERS frame,
    // or right after it): malformed (RFC 9114 section 4.1.2), the client's.
    for _ in 0..5 {
        let mut stream = client.start(upload(5), Some(b"")).await.unwrap();
        let answer = tokio::time::timeout(DEADLINE, read_answer(&mut stream)).await;
        let answer = answer.expect("the request was held");
        assert!(answer.is_err(), "answered: {:?}", answer.map(|a| a.head));
    }
    // A good request after them: answered, so the balancer has seen the five.
    let answer = client.exchange(upload(3), b"abc").await.unwrap();
    assert_eq!(answer.head.status(), 200);
    assert_eq!(answer.text(), "3");
    let page = metrics_text(&balancer);
    let series = "capataz_requests_total{pool=\"web\",backend=\"a\",class=\"error\"} 0";
    assert!(page.contains(series), "{page}");
    // The good request's line, and none for the five (no backend saw them).
    let logged = wait_json(&log, 1).await;
    assert_eq!(logged[0]["status"], 200, "{}", logged[0]);
    assert_eq!(lines(&log).len(), 1, "{:?}", lines(&log));
}

/// A POST to `/upload` announcing `length` bytes.
fn upload(length: usize) -> Request<()> {
    Request::builder()
        .method(Method::POST)
        .uri(format!("https://{SITE}/upload"))
        .header("content-length", length)
        .body(())
        .unwrap()
}

/// The process's resident memory, in KiB.
fn rss_kib() -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap();
    let line = status.lines().find(|l| l.starts_with("VmRSS:")).unwrap();
    line.split_whitespace().nth(1).unwrap().parse().unwrap()
}

#[tokio::test]
async fn a_headers_frame_announcing_a_gigabyte_is_refused_before_it_is_buffered() {
    let pki = Pki::new();
    let backend = length_backend().await;
    let config = ConfigText::new(&[backend.entry("a")]).extra("active.kind = \"none\"\n");
    let (balancer, _) = h3_balancer(&pki, config, Some(""), "header_read_timeout = \"60s\"").await;
    let client = connect(&pki, udp_addr(&balancer), SITE).await.unwrap();
    let (mut send, _recv) = client.connection.open_bi().await.unwrap();
    // A HEADERS frame (type 0x01) announcing 2^30 - 1 bytes, then its "payload".
    send.write_all(&[0x01, 0xbf, 0xff, 0xff, 0xff])
        .await
        .unwrap();
    let before = rss_kib();
    let chunk = vec![0u8; 64 * 1024];
    let mut sent = 0usize;
    let written = tokio::time::timeout(DEADLINE, async {
        while sent < 256 << 20 {
            send.write_all(&chunk).await?;
            sent += chunk.len();
        }
        Ok::<_, quinn::WriteError>(())
    })
    .await;
    let grown = rss_kib().saturating_sub(before);
    let written = written.expect("capataz took the frame's bytes until the deadline");
    assert!(
        matches!(written, Err(quinn::WriteError::Stopped(_))),
        "{written:?} after {} MiB",
        sent >> 20
    );
    // What reaches capataz before its STOP_SENDING reaches the client: the stream's window.
    assert!(
        sent < 16 << 20,
        "capataz took {} MiB of one HEADERS frame (RSS +{} MiB)",
        sent >> 20,
        grown >> 10
    );
    // The stream's end is not the connection's: a request after it is answered.
    let mut client = client;
    let answer = client.exchange(upload(3), b"abc").await.unwrap();
    assert_eq!(answer.text(), "3");
}

#[tokio::test]
async fn a_huge_frame_on_the_control_stream_is_stopped_before_it_is_buffered() {
    let pki = Pki::new();
    let backend = length_backend().await;
    let config = ConfigText::new(&[backend.entry("a")]).extra("active.kind = \"none\"\n");
    let (balancer, _) = h3_balancer(&pki, config, Some(""), "").await;
    // A bare QUIC connection (ALPN h3) whose control stream starts with an unknown frame
    // type announcing 2^30 - 1 bytes.
    let endpoint = quinn::Endpoint::client("127.0.0.1:0".parse().unwrap()).unwrap();
    let connection = endpoint
        .connect_with(client_config(&pki), udp_addr(&balancer), SITE)
        .unwrap()
        .await
        .unwrap();
    let mut control = connection.open_uni().await.unwrap();
    control
        .write_all(&[0x00, 0x04, 0x00, 0x40, 0x21, 0xbf, 0xff, 0xff, 0xff])
        .await
        .unwrap();
    let chunk = vec![0u8; 64 * 1024];
    let mut sent = 0usize;
    let written = tokio::time::timeout(DEADLINE, async {
        loop {
            control.write_all(&chunk).await?;
            sent += chunk.len();
        }
        #[allow(unreachable_code)]
        Ok::<_, quinn::WriteError>(())
    })
    .await;
    let written = written.expect("capataz took the control stream's bytes until the deadline");
    assert!(written.is_err());
    assert!(sent < 16 << 20, "capataz took {} MiB", sent >> 20);
}
