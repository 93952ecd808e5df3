//! Sections 1 and 2 of the issue: a client's upload has its own deadline, and a failed upload
//! is the client's fault, never the backend's.

use std::time::{Duration, Instant};

use capataz_health::Outcome;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use super::{balancer, charged, errors};
use crate::support::raw::{
    closes, find, length_backend, read_head, read_reply, roundtrip, RawBackend,
};
use crate::support::wait::wait_until;
use crate::support::DEADLINE;

#[tokio::test]
async fn a_slow_but_steady_upload_longer_than_response_header_succeeds() {
    let backend = length_backend().await;
    let (balancer, addr) = balancer(
        &[backend.addr],
        "request_body_timeout = \"2s\"",
        "response_header = \"300ms\"",
    )
    .await;
    let mut stream = TcpStream::connect(addr).await.unwrap();
    stream
        .write_all(b"POST /up HTTP/1.1\r\nHost: app.test\r\nContent-Length: 100\r\n\r\n")
        .await
        .unwrap();
    let started = Instant::now();
    // Wall time is the subject: ten bytes every 100 ms, an upload three times response_header.
    for _ in 0..10 {
        stream.write_all(&[b'x'; 10]).await.unwrap();
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let mut buf = Vec::new();
    let reply = read_reply(&mut stream, &mut buf).await.expect("an answer");
    assert!(started.elapsed() >= Duration::from_millis(900));
    assert_eq!(reply.status, 200, "{reply:?}");
    assert_eq!(reply.body, b"100");
    assert_eq!(errors(&balancer, 0), []);
}

#[tokio::test]
async fn a_stalled_upload_gets_408_and_charges_the_backend_nothing() {
    let backend = length_backend().await;
    let (balancer, addr) = balancer(
        &[backend.addr],
        "request_body_timeout = \"300ms\"",
        "response_header = \"10s\"",
    )
    .await;
    let mut stream = TcpStream::connect(addr).await.unwrap();
    stream
        .write_all(b"POST /up HTTP/1.1\r\nHost: app.test\r\nContent-Length: 100\r\n\r\nonly ten b")
        .await
        .unwrap();
    let mut buf = Vec::new();
    let reply = tokio::time::timeout(DEADLINE, read_reply(&mut stream, &mut buf))
        .await
        .unwrap()
        .expect("an answer");
    assert_eq!(reply.status, 408, "{reply:?}");
    assert!(
        closes(&mut stream).await,
        "the client connection closes after a 408"
    );
    assert_eq!(charged(&balancer, 0), []);
    // The backend connection that carried half a body is not used again.
    let reply = roundtrip(addr, b"GET / HTTP/1.1\r\nHost: app.test\r\n\r\n")
        .await
        .unwrap();
    assert_eq!(reply.status, 200);
    assert_eq!(backend.accepted(), 2);
    assert_eq!(errors(&balancer, 0), []);
}

#[tokio::test]
async fn a_malformed_chunked_upload_gets_400_at_once_and_charges_nothing() {
    let backend = length_backend().await;
    let (balancer, addr) = balancer(&[backend.addr], "", "response_header = \"10s\"").await;
    let started = Instant::now();
    let reply = roundtrip(
        addr,
        b"POST /up HTTP/1.1\r\nHost: app.test\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\nzz-not-a-size\r\n",
    )
    .await
    .expect("an answer");
    assert_eq!(reply.status, 400, "{reply:?}");
    assert!(
        started.elapsed() < Duration::from_secs(5),
        "took {:?}",
        started.elapsed()
    );
    assert_eq!(charged(&balancer, 0), []);
    let reply = roundtrip(addr, b"GET / HTTP/1.1\r\nHost: app.test\r\n\r\n")
        .await
        .unwrap();
    assert_eq!(reply.status, 200);
    assert_eq!(
        backend.accepted(),
        2,
        "the half-fed connection is not reused"
    );
}

#[tokio::test]
async fn a_client_vanishing_mid_body_charges_the_backend_nothing() {
    let backend = length_backend().await;
    let (balancer, addr) = balancer(&[backend.addr], "", "response_header = \"10s\"").await;
    for n in 1..=3 {
        let mut stream = TcpStream::connect(addr).await.unwrap();
        stream
            .write_all(
                b"POST /up HTTP/1.1\r\nHost: app.test\r\nContent-Length: 1000\r\n\r\npartial",
            )
            .await
            .unwrap();
        // Wait until the request has reached the backend, then vanish: the backend connection
        // that carried half a body is closed at once (not after response_header), and nothing
        // is charged.
        wait_until("the request at the backend", || backend.accepted() == n).await;
        drop(stream);
        wait_until("the backend connection closed", || backend.closed() == n).await;
    }
    // A request after them is served by the same, unejected backend.
    let reply = roundtrip(addr, b"GET / HTTP/1.1\r\nHost: app.test\r\n\r\n")
        .await
        .unwrap();
    assert_eq!(reply.status, 200);
    assert_eq!(errors(&balancer, 0), []);
}

#[tokio::test]
async fn a_backend_that_stops_reading_the_body_is_charged_a_timeout() {
    // Reads the head, then nothing: the upload fills the socket buffers and the writes wait.
    let backend = RawBackend::serving(|mut stream| async move {
        let mut buf = Vec::new();
        let _ = read_head(&mut stream, &mut buf).await;
        tokio::time::sleep(DEADLINE).await;
    })
    .await;
    let (balancer, addr) = balancer(
        &[backend.addr],
        "request_body_timeout = \"10s\"",
        "body_idle = \"300ms\"\nresponse_header = \"10s\"",
    )
    .await;
    let mut stream = TcpStream::connect(addr).await.unwrap();
    let size = 64 << 20;
    stream
        .write_all(
            format!("POST /up HTTP/1.1\r\nHost: app.test\r\nContent-Length: {size}\r\n\r\n")
                .as_bytes(),
        )
        .await
        .unwrap();
    let (mut reader, mut writer) = stream.into_split();
    let started = Instant::now();
    let upload = tokio::spawn(async move {
        let piece = vec![b'x'; 65536];
        for _ in 0..(size / piece.len()) {
            if writer.write_all(&piece).await.is_err() {
                return;
            }
        }
    });
    let mut out = Vec::new();
    let _ = tokio::time::timeout(DEADLINE, async {
        let mut chunk = [0u8; 4096];
        while let Ok(n) = reader.read(&mut chunk).await {
            if n == 0 || find(&out, b"\r\n\r\n").is_some() {
                break;
            }
            out.extend_from_slice(&chunk[..n]);
        }
    })
    .await;
    upload.abort();
    let text = String::from_utf8_lossy(&out);
    assert!(text.starts_with("HTTP/1.1 504"), "{text}");
    assert!(
        started.elapsed() < Duration::from_secs(5),
        "bounded by body_idle, not response_header: {:?}",
        started.elapsed()
    );
    assert_eq!(charged(&balancer, 0), [Outcome::Timeout]);
}
