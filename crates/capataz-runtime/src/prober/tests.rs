//! The probe against loopback backends that answer well, badly, partly or not at all, and the
//! mapping of IO errors to outcomes.

use super::*;
use std::time::Instant;
use tokio::net::TcpListener;
use tokio::sync::oneshot;

const GENEROUS: Duration = Duration::from_secs(5);

/// What the fake backend does once it has read the probe's request.
enum Answer {
    /// Write these bytes and close.
    Bytes(&'static [u8]),
    /// Write these bytes and keep the connection open without answering more.
    BytesThenHang(Vec<u8>),
    /// Close right after accepting, without reading.
    CloseAtOnce,
}

/// A one-shot backend on loopback; the receiver yields the request bytes it read.
async fn backend(answer: Answer) -> (SocketAddr, oneshot::Receiver<Vec<u8>>) {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let (tx, rx) = oneshot::channel();
    tokio::spawn(async move {
        let (mut stream, _) = listener.accept().await.unwrap();
        if let Answer::CloseAtOnce = answer {
            return;
        }
        let mut request = Vec::new();
        let mut chunk = [0u8; 1024];
        while !request.ends_with(b"\r\n\r\n") {
            let n = stream.read(&mut chunk).await.unwrap();
            if n == 0 {
                break;
            }
            request.extend_from_slice(&chunk[..n]);
        }
        let _ = tx.send(request);
        match answer {
            Answer::Bytes(bytes) => {
                let _ = stream.write_all(bytes).await;
            }
            Answer::BytesThenHang(bytes) => {
                let _ = stream.write_all(&bytes).await;
                // Hold the connection until the prober closes it.
                let _ = stream.read(&mut chunk).await;
            }
            Answer::CloseAtOnce => {}
        }
    });
    (addr, rx)
}

async fn http(answer: Answer) -> Outcome {
    let (addr, _request) = backend(answer).await;
    probe_once(CheckKind::Http, addr, "/healthz", "svc", GENEROUS).await
}

/// An address where nothing listens.
async fn closed_port() -> SocketAddr {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    listener.local_addr().unwrap()
}

#[tokio::test]
async fn status_lines_are_judged() {
    let ok = Answer::Bytes(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok");
    assert_eq!(http(ok).await, Outcome::Status(200));
    let slow = Answer::Bytes(b"HTTP/1.1 503 Backend 200 ms slow\r\n\r\n");
    assert_eq!(http(slow).await, Outcome::Status(503));
    let bare_lf = Answer::Bytes(b"HTTP/1.0 404 Not Found\n\n");
    assert_eq!(http(bare_lf).await, Outcome::Status(404));
}

#[tokio::test]
async fn garbage_is_malformed() {
    assert_eq!(
        http(Answer::Bytes(b"garbage\r\n\r\n")).await,
        Outcome::Malformed
    );
    assert_eq!(
        http(Answer::Bytes(b"TIMEOUT\r\n")).await,
        Outcome::Malformed
    );
    assert_eq!(
        http(Answer::Bytes(b"HTTP/1.1 200 OK\r\r\n")).await,
        Outcome::Malformed
    );
    assert_eq!(http(Answer::Bytes(b"\r\n")).await, Outcome::Malformed);
}

#[tokio::test]
async fn an_overlong_line_is_malformed_without_waiting() {
    let long = [b"HTTP/1.1 200 ".as_slice(), &[b'x'; 2000]].concat();
    let started = Instant::now();
    assert_eq!(http(Answer::BytesThenHang(long)).await, Outcome::Malformed);
    assert!(started.elapsed() < GENEROUS);
}

#[tokio::test]
async fn a_line_cut_short_by_eof_is_judged_as_it_is() {
    assert_eq!(
        http(Answer::Bytes(b"HTTP/1.1 20")).await,
        Outcome::Malformed
    );
    assert_eq!(
        http(Answer::Bytes(b"HTTP/1.1 200 OK")).await,
        Outcome::Status(200)
    );
}

#[tokio::test]
async fn silence_is_a_timeout_within_the_deadline() {
    let (addr, _request) = backend(Answer::BytesThenHang(Vec::new())).await;
    let started = Instant::now();
    let timeout = Duration::from_millis(100);
    let outcome = probe_once(CheckKind::Http, addr, "/", "svc", timeout).await;
    assert_eq!(outcome, Outcome::Timeout);
    let elapsed = started.elapsed();
    assert!(elapsed >= timeout && elapsed < GENEROUS, "{elapsed:?}");
}

#[tokio::test]
async fn a_partial_line_then_silence_is_a_timeout() {
    let (addr, _request) = backend(Answer::BytesThenHang(b"HTTP/1.1 2".to_vec())).await;
    let timeout = Duration::from_millis(100);
    let outcome = probe_once(CheckKind::Http, addr, "/", "svc", timeout).await;
    assert_eq!(outcome, Outcome::Timeout);
}

#[tokio::test]
async fn closing_without_an_answer_is_a_reset() {
    assert_eq!(http(Answer::CloseAtOnce).await, Outcome::Reset);
    assert_eq!(http(Answer::Bytes(b"")).await, Outcome::Reset);
}

#[tokio::test]
async fn nothing_listening_is_refused() {
    let addr = closed_port().await;
    let outcome = probe_once(CheckKind::Http, addr, "/", "svc", GENEROUS).await;
    assert_eq!(outcome, Outcome::Refused);
}

#[tokio::test]
async fn the_request_is_exactly_as_specified() {
    let (addr, request) = backend(Answer::Bytes(b"HTTP/1.1 204 No Content\r\n\r\n")).await;
    let outcome = probe_once(
        CheckKind::Http,
        addr,
        "/health?deep=1",
        "api.test",
        GENEROUS,
    )
    .await;
    assert_eq!(outcome, Outcome::Status(204));
    let expected = format!(
        "GET /health?deep=1 HTTP/1.1\r\nHost: api.test\r\nUser-Agent: capataz/{}\r\n\
         Connection: close\r\n\r\n",
        env!("CARGO_PKG_VERSION")
    );
    assert_eq!(String::from_utf8(request.await.unwrap()).unwrap(), expected);
}

#[tokio::test]
async fn tcp_kind_passes_on_connect_and_fails_when_refused() {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    // The kernel completes the handshake from the backlog; nobody needs to accept.
    let outcome = probe_once(CheckKind::Tcp, addr, "/", "svc", GENEROUS).await;
    assert_eq!(outcome, Outcome::Connected);
    drop(listener);
    let outcome = probe_once(CheckKind::Tcp, addr, "/", "svc", GENEROUS).await;
    assert_eq!(outcome, Outcome::Refused);
}

#[tokio::test]
async fn no_kind_passes_without_touching_the_network() {
    let addr = closed_port().await;
    let outcome = probe_once(CheckKind::None, addr, "/", "svc", GENEROUS).await;
    assert_eq!(outcome, Outcome::Status(200));
}

#[test]
fn error_kinds_map_to_outcomes() {
    let check = |kind: io::ErrorKind, expected| {
        assert_eq!(classify_error(&kind.into()), expected, "{kind:?}");
    };
    check(io::ErrorKind::ConnectionRefused, Outcome::Refused);
    check(io::ErrorKind::ConnectionReset, Outcome::Reset);
    check(io::ErrorKind::ConnectionAborted, Outcome::Reset);
    check(io::ErrorKind::BrokenPipe, Outcome::Reset);
    check(io::ErrorKind::UnexpectedEof, Outcome::Reset);
    check(io::ErrorKind::TimedOut, Outcome::Timeout);
    check(io::ErrorKind::HostUnreachable, Outcome::Refused);
    check(io::ErrorKind::NetworkUnreachable, Outcome::Refused);
    check(io::ErrorKind::AddrNotAvailable, Outcome::Refused);
}
