//! The client connections' watcher (one task per listener and set of timeouts) across reloads,
//! shutdowns and churn: every connection is timed out and drained, whichever watcher it
//! belongs to, and watchers end with their connections.

use std::time::Instant;

use super::*;
use crate::support::balancer::parse;
use crate::support::wait::wait_until;

/// Timeouts of `secs` each: the watcher looks once a second.
fn timeouts(secs: u64) -> String {
    format!("idle_timeout = \"{secs}s\"\nheader_read_timeout = \"{secs}s\"")
}

/// Reads until the balancer closes `stream` (within `DEADLINE`); what it sent.
async fn until_closed(stream: &mut TcpStream) -> Vec<u8> {
    let mut buf = Vec::new();
    let read = tokio::time::timeout(DEADLINE, async {
        while fill(stream, &mut buf).await.is_ok_and(|n| n > 0) {}
    })
    .await;
    assert!(
        read.is_ok(),
        "the connection was not closed within {DEADLINE:?}"
    );
    buf
}

/// A connection to `addr` that sends nothing, once the balancer counts it open (`open` in
/// all), and when it connected.
async fn silent(
    balancer: &capataz::server::Balancer,
    addr: SocketAddr,
    open: usize,
) -> (TcpStream, Instant) {
    let connected = Instant::now();
    let stream = TcpStream::connect(addr).await.expect("connect");
    wait_until("the connection is accepted", || {
        balancer.open_connections() == open
    })
    .await;
    (stream, connected)
}

/// The listener's first connection, which starts its watcher (whose first look, at once,
/// sees it): one that has had its answer.
async fn warm_up(balancer: &capataz::server::Balancer, addr: SocketAddr) -> TcpStream {
    let (mut stream, _) = silent(balancer, addr, balancer.open_connections() + 1).await;
    stream
        .write_all(b"GET / HTTP/1.1\r\nHost: a\r\n\r\n")
        .await
        .expect("send");
    let mut buf = Vec::new();
    let head = read_head(&mut stream, &mut buf).await.expect("an answer");
    assert!(head.starts_with("HTTP/1.1 200"), "{head}");
    stream
}

/// Asserts that a connection made at `connected` was closed after `timeout` (and at most a
/// watcher period, plus slack, later).
fn closed_after(what: &str, connected: Instant, timeout: Duration) {
    let took = connected.elapsed();
    assert!(
        took >= timeout - Duration::from_millis(100),
        "{what}: closed after {took:?}"
    );
    assert!(
        took < timeout + Duration::from_millis(2_500),
        "{what}: closed after {took:?}"
    );
}

/// Regression: a listener removed by a reload dropped its watcher with the connections it had
/// not looked at yet (accepted in its last period): they were never timed out.
#[tokio::test]
async fn a_connection_of_a_listener_removed_by_a_reload_is_still_timed_out() {
    let b = backends(&["a"]).await;
    let text = config_text(&sims(&b), &timeouts(3), QUIET);
    let (balancer, _rx) = start(&text).await;
    let addr = balancer.local_addrs()[0];
    // The listener's watcher starts with its first connection, and looks at it at once: the
    // one under test comes after.
    let _first = warm_up(&balancer, addr).await;
    let (mut stream, connected) = silent(&balancer, addr, 2).await;
    let moved = parse(&text.replace("\"127.0.0.1:0\"", "\"127.0.0.2:0\""));
    let summary = balancer.reload(&moved).await.expect("the reload applies");
    assert_eq!((summary.listeners_added, summary.listeners_removed), (1, 1));
    assert!(until_closed(&mut stream).await.is_empty());
    closed_after(
        "the removed listener's connection",
        connected,
        Duration::from_secs(3),
    );
    wait_until("counted closed", || balancer.open_connections() == 0).await;
}

/// A reload that changes the timeouts: connections accepted before keep theirs (and are still
/// timed out, though the listener let go of their watcher), new ones get the new ones.
#[tokio::test]
async fn a_reload_of_the_timeouts_applies_to_new_connections_and_old_ones_keep_theirs() {
    let b = backends(&["a"]).await;
    let text = config_text(&sims(&b), &timeouts(3), QUIET);
    let (balancer, _rx) = start(&text).await;
    let addr = balancer.local_addrs()[0];
    let first = warm_up(&balancer, addr).await;
    let (mut old, old_at) = silent(&balancer, addr, 2).await;
    let shorter = parse(&config_text(&sims(&b), &timeouts(1), QUIET));
    balancer.reload(&shorter).await.expect("the reload applies");
    // Accepted with the new timeouts: the listener starts their watcher and lets go of the old.
    let (mut new, new_at) = silent(&balancer, addr, 3).await;
    let new = tokio::spawn(async move {
        assert!(until_closed(&mut new).await.is_empty());
        new_at.elapsed()
    });
    assert!(until_closed(&mut old).await.is_empty());
    closed_after("the connection from before", old_at, Duration::from_secs(3));
    drop(first);
    let took = new.await.unwrap();
    assert!(
        took >= Duration::from_millis(900) && took < Duration::from_millis(2_500),
        "the connection after the reload: closed after {took:?}"
    );
    wait_until("counted closed", || balancer.open_connections() == 0).await;
}

/// Regression: a shutdown stops the accept loops (their watchers' last handles) as it tells
/// the watchers to drain; connections accepted in a watcher's last period were lost with it
/// and held the shutdown until its deadline. Many just-accepted connections (plain, on the
/// multi-thread runtime whose workers race the two) all close within the drain's grace.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_shutdown_right_after_accepts_drains_every_connection_at_once() {
    let b = backends(&["a"]).await;
    let (balancer, _rx) = start(&config_text(&sims(&b), &timeouts(60), QUIET)).await;
    let addr = balancer.local_addrs()[0];
    let mut streams = Vec::new();
    for open in 1..=50 {
        streams.push(silent(&balancer, addr, open).await.0);
    }
    let started = Instant::now();
    let shutdown = tokio::spawn(balancer.shutdown(Duration::from_secs(15)));
    for stream in &mut streams {
        assert!(until_closed(stream).await.is_empty());
    }
    tokio::time::timeout(DEADLINE, shutdown)
        .await
        .expect("shutdown ends")
        .unwrap();
    assert!(
        started.elapsed() < Duration::from_secs(4),
        "shutdown took {:?}",
        started.elapsed()
    );
}

/// A hundred reloads that change the timeouts, each followed by a connection kept open: a
/// watcher per set of timeouts, each ending with its last connection (no task left behind).
#[tokio::test]
async fn watchers_of_a_hundred_reloads_end_with_their_connections() {
    let b = backends(&["a"]).await;
    let text = |secs: u64| config_text(&sims(&b), &timeouts(secs), QUIET);
    let (balancer, _rx) = start(&text(30)).await;
    let addr = balancer.local_addrs()[0];
    let metrics = tokio::runtime::Handle::current().metrics();
    // One connection made and closed: the listener's watcher is running.
    drop(silent(&balancer, addr, 1).await);
    wait_until("counted closed", || balancer.open_connections() == 0).await;
    let before = metrics.num_alive_tasks();
    let mut streams = Vec::new();
    for round in 0..100 {
        balancer
            .reload(&parse(&text(30 + round % 2)))
            .await
            .expect("the reload applies");
        let (mut stream, _) = silent(&balancer, addr, streams.len() + 1).await;
        stream
            .write_all(b"GET / HTTP/1.1\r\nHost: a\r\n\r\n")
            .await
            .expect("send");
        let mut buf = Vec::new();
        let head = read_head(&mut stream, &mut buf).await.expect("an answer");
        assert!(head.starts_with("HTTP/1.1 200"), "{head}");
        streams.push(stream);
    }
    // A task per connection, and a watcher per reload.
    assert!(
        metrics.num_alive_tasks() >= before + 200,
        "{}",
        metrics.num_alive_tasks()
    );
    drop(streams);
    wait_until("counted closed", || balancer.open_connections() == 0).await;
    wait_until("the old watchers end", || {
        metrics.num_alive_tasks() <= before
    })
    .await;
}

/// A backend connection kept for a client connection (the default `connection_reuse`) closes
/// as soon as its client connection does, not at the backend's idle timeout nor a watcher
/// period later.
#[tokio::test]
async fn a_backend_connection_kept_for_a_client_closes_with_it() {
    let listener = tokio::net::TcpListener::bind(crate::support::any())
        .await
        .expect("bind");
    let backend = listener.local_addr().expect("address");
    let (closed_tx, mut closed) = tokio::sync::mpsc::unbounded_channel();
    let server = tokio::spawn(async move {
        loop {
            let Ok((mut stream, _)) = listener.accept().await else {
                return;
            };
            let closed_tx = closed_tx.clone();
            tokio::spawn(async move {
                let mut buf = Vec::new();
                while read_head(&mut stream, &mut buf).await.is_some() {
                    let answer = b"HTTP/1.1 200 OK\r\nContent-Length: 3\r\n\r\nok\n";
                    if stream.write_all(answer).await.is_err() {
                        return;
                    }
                }
                let _ = closed_tx.send(Instant::now());
            });
        }
    });
    let pair = [("k".to_owned(), backend)];
    // Timeouts of a minute: neither the client's watcher nor the backend's idle timeout
    // closes anything within the test.
    let (balancer, _rx) = start(&config_text(&pair, &timeouts(60), QUIET)).await;
    let addr = balancer.local_addrs()[0];
    for _ in 0..20 {
        let mut stream = TcpStream::connect(addr).await.expect("connect");
        stream
            .write_all(b"GET / HTTP/1.1\r\nHost: a\r\n\r\n")
            .await
            .expect("send");
        let mut buf = Vec::new();
        let head = read_head(&mut stream, &mut buf).await.expect("an answer");
        assert!(head.starts_with("HTTP/1.1 200"), "{head}");
        read_body(&mut stream, &mut buf, &head)
            .await
            .expect("its body");
        let left = Instant::now();
        drop(stream);
        let seen = tokio::time::timeout(DEADLINE, closed.recv())
            .await
            .expect("the backend connection closes")
            .expect("the backend runs");
        let took = seen.saturating_duration_since(left);
        assert!(
            took < Duration::from_millis(500),
            "closed {took:?} after its client"
        );
    }
    server.abort();
}
