//! Clients that never finish a handshake: closed after the listener's `header_read_timeout`,
//! counted, and never a request to a backend.

use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use super::*;

/// Reads until the peer closes (or resets); how long that took.
async fn closed_after(stream: &mut TcpStream) -> Duration {
    let started = tokio::time::Instant::now();
    let mut buf = [0u8; 1024];
    tokio::time::timeout(DEADLINE, async {
        loop {
            match stream.read(&mut buf).await {
                Ok(0) | Err(_) => return,
                Ok(_) => {}
            }
        }
    })
    .await
    .expect("the balancer closes the connection");
    started.elapsed()
}

#[tokio::test]
async fn garbage_bytes_and_a_stalled_handshake_are_closed_and_reach_no_backend() {
    let pki = Pki::new();
    let (cert, key) = pki.server("site", &["site.test"], None);
    let (b, balancer) = tls_balancer(&[(&cert, &key)], "", "header_read_timeout = \"300ms\"").await;
    let addr = balancer.local_addrs()[0];

    // A plaintext HTTP request to the TLS port: refused at once (an alert), not after the
    // timeout.
    let mut plain = TcpStream::connect(addr).await.unwrap();
    plain
        .write_all(b"GET / HTTP/1.1\r\nHost: site.test\r\n\r\n")
        .await
        .unwrap();
    assert!(closed_after(&mut plain).await < Duration::from_millis(250));

    // A record header announcing a ClientHello that never comes, and a client that sends
    // nothing at all: closed once the timeout runs out.
    let mut stalled = TcpStream::connect(addr).await.unwrap();
    stalled
        .write_all(&[0x16, 0x03, 0x01, 0x02, 0x00, 0x01])
        .await
        .unwrap();
    let mut silent = TcpStream::connect(addr).await.unwrap();
    let waited = closed_after(&mut stalled).await;
    assert!(
        waited >= Duration::from_millis(250),
        "closed after {waited:?}"
    );
    closed_after(&mut silent).await;

    // Counted once the connection's task is done, right after it dropped the socket.
    crate::support::wait::wait_until("the failures are counted", || {
        failures(&balancer, "protocol") == 1.0 && failures(&balancer, "timeout") == 2.0
    })
    .await;
    // Nothing reached the backend, and the connections are gone.
    assert_eq!(b[0].traffic_hits(), 0);
    crate::support::wait::wait_until("connections closed", || balancer.open_connections() == 0)
        .await;
    // The listener still serves.
    let mut stream = Client::trusting(&pki)
        .connect(addr, "site.test")
        .await
        .expect("handshake");
    assert!(get(&mut stream, "site.test").await.is_some());
}

#[tokio::test]
async fn a_client_that_closes_mid_handshake_is_counted_as_closed() {
    let pki = Pki::new();
    let (cert, key) = pki.server("site", &["site.test"], None);
    let (_b, balancer) = tls_balancer(&[(&cert, &key)], "", "").await;
    let addr = balancer.local_addrs()[0];
    let mut half = TcpStream::connect(addr).await.unwrap();
    half.write_all(&[0x16, 0x03, 0x01, 0x02, 0x00, 0x01])
        .await
        .unwrap();
    drop(half);
    crate::support::wait::wait_until("the failure is counted", || {
        failures(&balancer, "closed") == 1.0
    })
    .await;
}

#[tokio::test]
async fn shutdown_drops_a_connection_still_in_its_handshake_at_once() {
    let pki = Pki::new();
    let (cert, key) = pki.server("site", &["site.test"], None);
    let (_b, balancer) = tls_balancer(&[(&cert, &key)], "", "header_read_timeout = \"1h\"").await;
    let addr = balancer.local_addrs()[0];
    let mut silent = TcpStream::connect(addr).await.unwrap();
    crate::support::wait::wait_until("the connection is open", || {
        balancer.open_connections() == 1
    })
    .await;
    // Within the deadline, and without waiting for the hour of handshake time.
    tokio::time::timeout(DEADLINE, balancer.shutdown(Duration::from_secs(3600)))
        .await
        .expect("the shutdown ends at once");
    closed_after(&mut silent).await;
}

/// An HTTPS connection parks like a plain one (its TLS stream kept, no `close_notify` sent by
/// the park): the answer after a park is the answer before it, a `Connection: close` request
/// after a park gets its answer and a clean close, and a shutdown closes a parked connection
/// promptly and counts it closed.
#[tokio::test]
async fn a_parked_tls_connection_answers_as_before_and_closes_cleanly() {
    let pki = Pki::new();
    let (cert, key) = pki.server("site", &["site.test"], None);
    let (b, balancer) = tls_balancer(
        &[(&cert, &key)],
        "",
        "header_read_timeout = \"200ms\"\nidle_timeout = \"30s\"",
    )
    .await;
    let addr = balancer.local_addrs()[0];
    let client = Client::trusting(&pki);
    let mut stream = client.connect(addr, "site.test").await.expect("handshake");
    let without_date = |(head, body): (String, String)| {
        let head: Vec<_> = head
            .lines()
            .filter(|l| !l.starts_with("date:"))
            .map(str::to_owned)
            .collect();
        (head, body)
    };
    let before = without_date(get(&mut stream, "site.test").await.expect("an answer"));
    crate::support::wait::wait_until("the connection parks", || balancer.parks() >= 1).await;
    let after = without_date(
        get(&mut stream, "site.test")
            .await
            .expect("an answer after a park"),
    );
    assert_eq!(before, after);
    crate::support::wait::wait_until("parked again", || balancer.parks() >= 2).await;
    stream
        .write_all(b"GET / HTTP/1.1\r\nHost: site.test\r\nConnection: close\r\n\r\n")
        .await
        .unwrap();
    let mut rest = Vec::new();
    tokio::time::timeout(DEADLINE, stream.read_to_end(&mut rest))
        .await
        .expect("closed after the answer")
        .expect("a clean TLS close (close_notify)");
    let text = String::from_utf8_lossy(&rest);
    assert!(text.starts_with("HTTP/1.1 200"), "{text}");
    assert!(text.ends_with(&before.1), "{text}");
    crate::support::wait::wait_until("the connection is counted closed", || {
        balancer.open_connections() == 0 && balancer.parked_connections() == 0
    })
    .await;
    assert_eq!(b[0].traffic_hits(), 3);

    // Parked again on a new connection, then the balancer shuts down.
    let mut stream = client.connect(addr, "site.test").await.expect("handshake");
    assert!(get(&mut stream, "site.test").await.is_some());
    crate::support::wait::wait_until("parked", || balancer.parked_connections() == 1).await;
    let started = tokio::time::Instant::now();
    tokio::time::timeout(DEADLINE, balancer.shutdown(Duration::from_secs(15)))
        .await
        .expect("the shutdown ends");
    assert!(
        started.elapsed() < Duration::from_secs(6),
        "shutdown took {:?}",
        started.elapsed()
    );
    let mut rest = Vec::new();
    let read = tokio::time::timeout(DEADLINE, stream.read_to_end(&mut rest)).await;
    assert!(read.is_ok(), "the parked connection is closed");
    assert!(rest.is_empty(), "{}", String::from_utf8_lossy(&rest));
}
