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
    let b = backends(&["a"]).await;
    let text = ConfigText::sims(&b).extra(FAST_CHECKS).build();
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
        balancer.shutdown(Duration::from_secs(10)).await;
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
