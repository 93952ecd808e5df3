//! Section 3: a backend that stalls mid-body is charged a timeout and frees the client; a client
//! slow to read never gets the backend charged.

use std::sync::atomic::Ordering;
use std::time::Duration;

use capataz_health::Outcome;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use super::{balancer, charged, errors, GET};
use crate::support::raw::{closes, read_head, RawBackend};
use crate::support::DEADLINE;

#[tokio::test]
async fn a_backend_stalling_mid_body_is_charged_a_timeout_and_the_client_is_freed() {
    let backend = RawBackend::serving(|mut stream| async move {
        let mut buf = Vec::new();
        let _ = read_head(&mut stream, &mut buf).await;
        let _ = stream
            .write_all(b"HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\nten bytes.")
            .await;
        tokio::time::sleep(DEADLINE * 2).await;
    })
    .await;
    let (balancer, addr) = balancer(&[backend.addr], "", "body_idle = \"300ms\"").await;
    let mut stream = TcpStream::connect(addr).await.unwrap();
    stream.write_all(GET).await.unwrap();
    let mut buf = Vec::new();
    let head = read_head(&mut stream, &mut buf).await.expect("the head");
    assert!(head.starts_with("HTTP/1.1 200"), "{head}");
    assert!(closes(&mut stream).await, "the client connection is closed");
    assert_eq!(charged(&balancer, 0), [Outcome::Timeout]);
    let pool = balancer.pool("web").unwrap();
    assert_eq!(
        pool.backends[0].in_flight.load(Ordering::SeqCst),
        0,
        "the lease is freed"
    );
}

#[tokio::test]
async fn a_client_slow_to_read_never_charges_the_backend_a_body_timeout() {
    const SIZE: usize = 32 << 20;
    let backend = RawBackend::serving(|mut stream| async move {
        let mut buf = Vec::new();
        while read_head(&mut stream, &mut buf).await.is_some() {
            let head = format!("HTTP/1.1 200 OK\r\nContent-Length: {SIZE}\r\n\r\n");
            let _ = stream.write_all(head.as_bytes()).await;
            let piece = vec![b'x'; 1 << 20];
            for _ in 0..SIZE >> 20 {
                if stream.write_all(&piece).await.is_err() {
                    return;
                }
            }
        }
    })
    .await;
    let (balancer, addr) = balancer(&[backend.addr], "", "body_idle = \"300ms\"").await;
    let mut stream = TcpStream::connect(addr).await.unwrap();
    stream.write_all(GET).await.unwrap();
    let mut buf = Vec::new();
    let head = read_head(&mut stream, &mut buf).await.expect("the head");
    assert!(head.starts_with("HTTP/1.1 200"), "{head}");
    let mut got = buf.len();
    let mut chunk = vec![0u8; 1 << 16];
    // Three pauses longer than body_idle while the proxy has data it cannot send.
    for _ in 0..3 {
        tokio::time::sleep(Duration::from_millis(700)).await;
        let until = got + (1 << 20);
        while got < until {
            let n = stream.read(&mut chunk).await.unwrap();
            assert!(n > 0, "the body ended early at {got}");
            got += n;
        }
    }
    while got < SIZE {
        let n = tokio::time::timeout(DEADLINE, stream.read(&mut chunk))
            .await
            .expect("the rest of the body")
            .unwrap();
        assert!(n > 0, "the body ended early at {got}");
        got += n;
    }
    assert_eq!(got, SIZE);
    // The answer is judged when its body has ended; the next request's answer follows it.
    stream.write_all(GET).await.unwrap();
    let head = tokio::time::timeout(DEADLINE, read_head(&mut stream, &mut buf))
        .await
        .unwrap();
    assert!(head.is_some());
    assert_eq!(errors(&balancer, 0), []);
}
