//! What a client's keep-alive connection sees while the balancer drains (a stop, or the old
//! process of an upgrade): its next request is answered, with `Connection: close`, and a
//! connection left idle is closed after a grace second, not cut at once.

use std::time::{Duration, Instant};

use tokio::io::AsyncWriteExt as _;
use tokio::net::TcpStream;

use crate::support::balancer::{backends, start, ConfigText, FAST_CHECKS};
use crate::support::raw::{closes, has_token, read_reply};

const GET: &[u8] = b"GET / HTTP/1.1\r\nHost: drain.test\r\n\r\n";

/// A balancer over one backend and a keep-alive connection to it that has had one answer
/// (without `Connection: close`); then the balancer starts draining.
async fn draining_with_a_kept_connection() -> (TcpStream, tokio::task::JoinHandle<()>) {
    draining_with("", Duration::from_secs(10)).await
}

/// [`draining_with_a_kept_connection`], with `listener` lines and the shutdown's `grace`.
async fn draining_with(
    listener: &str,
    grace: Duration,
) -> (TcpStream, tokio::task::JoinHandle<()>) {
    let b = backends(&["a"]).await;
    let text = ConfigText::sims(&b)
        .listener(listener)
        .extra(FAST_CHECKS)
        .build();
    let (balancer, _) = start(&text).await;
    let addr = balancer.local_addrs()[0];
    let mut stream = TcpStream::connect(addr).await.expect("connect");
    let mut buf = Vec::new();
    stream.write_all(GET).await.expect("send");
    let first = read_reply(&mut stream, &mut buf).await.expect("an answer");
    assert_eq!(first.status, 200, "{}", first.head);
    assert!(
        !has_token(&first.head, "connection", "close"),
        "{}",
        first.head
    );
    // Keep the backends alive as long as the balancer: the shutdown task owns them.
    let shutdown = tokio::spawn(async move {
        balancer.shutdown(grace).await;
        drop(b);
    });
    // Draining has begun once the listener refuses new connections.
    let end = Instant::now() + crate::support::DEADLINE;
    while TcpStream::connect(addr).await.is_ok() {
        assert!(Instant::now() < end, "still accepting");
        tokio::task::yield_now().await;
    }
    (stream, shutdown)
}

#[tokio::test]
async fn a_request_on_a_kept_connection_while_draining_is_answered_with_connection_close() {
    let (mut stream, shutdown) = draining_with_a_kept_connection().await;
    stream.write_all(GET).await.expect("send");
    let mut buf = Vec::new();
    let answer = read_reply(&mut stream, &mut buf)
        .await
        .expect("the request on the draining connection is answered");
    assert_eq!(answer.status, 200, "{}", answer.head);
    assert!(
        has_token(&answer.head, "connection", "close"),
        "no Connection: close while draining: {}",
        answer.head
    );
    assert!(closes(&mut stream).await, "the connection stays open");
    tokio::time::timeout(Duration::from_secs(5), shutdown)
        .await
        .expect("the shutdown ends once its last connection closed")
        .expect("the shutdown task");
}

#[tokio::test]
async fn an_idle_kept_connection_is_closed_a_grace_second_after_the_drain_begins() {
    let began = Instant::now();
    let (mut stream, shutdown) = draining_with_a_kept_connection().await;
    assert!(closes(&mut stream).await, "the idle connection stays open");
    let waited = began.elapsed();
    assert!(
        waited >= Duration::from_millis(1000),
        "closed after {waited:?}: a request already on its way would have been cut"
    );
    tokio::time::timeout(Duration::from_secs(5), shutdown)
        .await
        .expect("the shutdown ends once its last connection closed")
        .expect("the shutdown task");
}

/// Regression: while the balancer drained, an HTTP/1 connection's `header_read_timeout` (and
/// `idle_timeout`) no longer applied, only the drain's grace for a quiet connection: a client
/// trickling a head a byte at a time kept the old process of an upgrade (or a stop) waiting
/// for it until the shutdown's deadline (`shutdown_timeout`, 30 s by default). HAProxy's
/// `timeout http-request` applies on a soft stop as ever.
#[tokio::test]
async fn a_head_trickling_while_draining_is_still_cut_at_header_read_timeout() {
    let (mut stream, shutdown) =
        draining_with("header_read_timeout = \"300ms\"", Duration::from_secs(120)).await;
    let began = Instant::now();
    // A head that never ends, a byte every 100 ms: the connection always moves a byte within
    // the drain's grace second.
    let mut pace = tokio::time::interval(Duration::from_millis(100));
    let head = b"GET / HTTP/1.1\r\nHost: drain.test\r\nX-Slow: ";
    let mut sent = 0usize;
    let mut chunk = [0u8; 512];
    let closed = tokio::time::timeout(crate::support::DEADLINE, async {
        loop {
            tokio::select! {
                _ = pace.tick() => {
                    let byte = head.get(sent).copied().unwrap_or(b'a');
                    if stream.write_all(&[byte]).await.is_err() {
                        return;
                    }
                    sent += 1;
                }
                read = tokio::io::AsyncReadExt::read(&mut stream, &mut chunk) => {
                    if matches!(read, Ok(0) | Err(_)) {
                        return;
                    }
                }
            }
        }
    })
    .await;
    assert!(
        closed.is_ok(),
        "a head trickling for {:?} while draining is still open",
        began.elapsed()
    );
    tokio::time::timeout(Duration::from_secs(5), shutdown)
        .await
        .expect("the shutdown ends once its last connection closed")
        .expect("the shutdown task");
}
