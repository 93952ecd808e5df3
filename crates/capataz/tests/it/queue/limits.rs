//! Limits and the queue under traffic: never exceeded, FIFO, full, timed out, left.

use std::time::Instant;

use tokio::task::JoinSet;

use super::*;
use crate::support::access_log::{table, wait_lines, LogDir};

/// Thirty requests at once on two backends limited to 3 each: no backend ever holds more
/// than 3, both reach 3, every request is answered, and the requests the access log says
/// waited are the ones the wait histogram counts.
#[tokio::test]
async fn limits_are_never_exceeded_and_every_request_is_served() {
    let hold = Hold::For(Duration::from_millis(60));
    let (a, b) = (
        SlowBackend::start(hold).await,
        SlowBackend::start(hold).await,
    );
    let dir = LogDir::new();
    let log = dir.path("access.log");
    let text = config(
        &[("a", a.addr(), ""), ("b", b.addr(), "")],
        "max_connections = 3",
        &table(&log, "text", ""),
    );
    let (balancer, _events) = start(&text).await;
    let addr = balancer.local_addrs()[0];
    let mut clients = JoinSet::new();
    for n in 0..30 {
        clients.spawn(async move { get(addr, &format!("/r{n}")).await.status });
    }
    while let Some(status) = clients.join_next().await {
        assert_eq!(status.expect("a client"), 200);
    }
    assert_eq!(
        (a.max(), b.max()),
        (3, 3),
        "each backend held at most its limit"
    );
    assert_eq!(a.arrived().len() + b.arrived().len(), 30);
    let lines = wait_lines(&log, 30).await;
    let waited = lines.iter().filter(|l| !l.contains(" queued=- ")).count();
    assert!(
        waited >= 30 - 6,
        "at most 6 found a slot at once: {lines:#?}"
    );
    assert_eq!(
        metric(&balancer, "capataz_queue_wait_seconds_count{pool=\"web\"}"),
        waited as f64,
        "the histogram counts the requests the log says waited"
    );
    let pool = pool_status(balancer.admin_addr().unwrap()).await;
    assert_eq!(pool["queue"]["length"], 0, "{pool:#}");
    for backend in pool["backends"].as_array().unwrap() {
        assert_eq!(
            (&backend["in_flight"], &backend["limit"]),
            (&0.into(), &3.into())
        );
    }
    balancer.shutdown(Duration::from_secs(1)).await;
}

/// One backend limited to 1 holds the first request; four more arrive one after another and
/// wait; released one at a time, they reach the backend in arrival order. While they wait,
/// `/status`, the explain sentence and the metrics say what the backend holds.
#[tokio::test]
async fn waiting_requests_are_served_in_arrival_order() {
    let backend = SlowBackend::start(Hold::Gate).await;
    let text = config(&[("a", backend.addr(), "")], "max_connections = 1", "");
    let (balancer, _events) = start(&text).await;
    let (addr, admin) = (balancer.local_addrs()[0], balancer.admin_addr().unwrap());
    let mut clients = JoinSet::new();
    clients.spawn(async move { get(addr, "/r0").await });
    wait_until("the first request at the backend", || {
        backend.holding() == 1
    })
    .await;
    for n in 1..=4u64 {
        clients.spawn(async move { get(addr, &format!("/r{n}")).await });
        wait_queued(admin, n).await;
    }
    let pool = pool_status(admin).await;
    let a = &pool["backends"][0];
    assert_eq!(
        (&a["in_flight"], &a["limit"]),
        (&1.into(), &1.into()),
        "{a:#}"
    );
    let explain = a["explain"].as_str().unwrap();
    assert!(
        explain.contains("; at its limit: 1 of 1 requests in use")
            && explain.contains("(4 waiting)"),
        "{explain}"
    );
    assert_eq!(a["state"], "UP", "a backend at its limit is not unhealthy");
    assert_eq!(pool["queue"]["size"], 1024);
    assert_eq!(pool["queue"]["timeout_ms"], 5000);
    assert_eq!(
        metric(&balancer, "capataz_pool_queue_length{pool=\"web\"}"),
        4.0
    );
    assert_eq!(
        metric(
            &balancer,
            "capataz_backend_limit{pool=\"web\",backend=\"a\"}"
        ),
        1.0
    );
    for n in 1..=5 {
        backend.release(1);
        wait_until("the next request at the backend", || {
            backend.arrived().len() == (n + 1).min(5)
        })
        .await;
    }
    while let Some(answer) = clients.join_next().await {
        assert_eq!(answer.expect("a client").status, 200);
    }
    assert_eq!(backend.arrived(), ["/r0", "/r1", "/r2", "/r3", "/r4"]);
    assert_eq!(backend.max(), 1);
    balancer.shutdown(Duration::from_secs(1)).await;
}

/// With the queue full, the next request is answered 503 at once, with the reason, and is
/// counted as `reason="full"`; the queued one is served later.
#[tokio::test]
async fn a_full_queue_answers_503_at_once() {
    let backend = SlowBackend::start(Hold::Gate).await;
    let text = config(
        &[("a", backend.addr(), "")],
        "max_connections = 1\nqueue_size = 1\nqueue_timeout = \"60s\"",
        "",
    );
    let (balancer, _events) = start(&text).await;
    let (addr, admin) = (balancer.local_addrs()[0], balancer.admin_addr().unwrap());
    let first = tokio::spawn(async move { get(addr, "/r0").await.status });
    wait_until("the first request at the backend", || {
        backend.holding() == 1
    })
    .await;
    let queued = tokio::spawn(async move { get(addr, "/r1").await.status });
    wait_queued(admin, 1).await;
    let started = Instant::now();
    let refused = get(addr, "/r2").await;
    let took = started.elapsed();
    assert_eq!(refused.status, 503);
    assert!(
        refused
            .text()
            .contains("the queue is full (1 requests waiting)"),
        "{}",
        refused.text()
    );
    assert!(refused.headers.get("retry-after").is_none());
    assert!(
        took < Duration::from_secs(2),
        "at once, not after the timeout: {took:?}"
    );
    let full = "capataz_queue_rejected_total{pool=\"web\",reason=\"full\"}";
    assert_eq!(metric(&balancer, full), 1.0);
    backend.release(2);
    assert_eq!((first.await.unwrap(), queued.await.unwrap()), (200, 200));
    assert_eq!(
        backend.arrived(),
        ["/r0", "/r1"],
        "the refused one never reached it"
    );
    balancer.shutdown(Duration::from_secs(1)).await;
}

/// A request that waits `queue_timeout` is answered 503 after about that long, logged as
/// capataz's in the queue phase with the time it waited, counted as `reason="timeout"`, and
/// never reaches the backend, which is not charged for it.
#[tokio::test]
async fn a_queue_timeout_answers_503_after_about_the_timeout() {
    let backend = SlowBackend::start(Hold::Gate).await;
    let dir = LogDir::new();
    let log = dir.path("access.log");
    let text = config(
        &[("a", backend.addr(), "")],
        "max_connections = 1\nqueue_timeout = \"400ms\"",
        &table(&log, "text", ""),
    );
    let (balancer, _events) = start(&text).await;
    let addr = balancer.local_addrs()[0];
    let first = tokio::spawn(async move { get(addr, "/r0").await.status });
    wait_until("the first request at the backend", || {
        backend.holding() == 1
    })
    .await;
    let started = Instant::now();
    let refused = get(addr, "/late").await;
    let took = started.elapsed();
    assert_eq!(refused.status, 503);
    assert!(
        refused.text().contains("queue timeout (400 ms)"),
        "{}",
        refused.text()
    );
    assert!(
        took >= Duration::from_millis(400) && took < Duration::from_millis(2400),
        "about the timeout: {took:?}"
    );
    let timeout = "capataz_queue_rejected_total{pool=\"web\",reason=\"timeout\"}";
    assert_eq!(metric(&balancer, timeout), 1.0);
    let line = wait_lines(&log, 1).await.remove(0);
    assert!(line.contains("\"GET /late HTTP/1.1\" 503 "), "{line}");
    assert!(line.contains(" ended_by=capataz phase=queue "), "{line}");
    let queued: f64 = line
        .split(" queued=")
        .nth(1)
        .and_then(|rest| rest.split(' ').next())
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| panic!("no queued= in {line}"));
    assert!((0.4..2.4).contains(&queued), "{line}");
    backend.release(1);
    assert_eq!(first.await.unwrap(), 200);
    assert_eq!(backend.arrived(), ["/r0"]);
    let requests = "capataz_requests_total{pool=\"web\",backend=\"a\",class=\"5xx\"}";
    assert_eq!(
        sample(&metrics_text(&balancer), requests).unwrap_or(0.0),
        0.0
    );
    let pool = pool_status(balancer.admin_addr().unwrap()).await;
    assert_eq!(pool["backends"][0]["passive"]["error_streak"], 0);
    balancer.shutdown(Duration::from_secs(1)).await;
}

/// A client whose connection is reset while its request waits leaves the queue: the one place
/// is free for the next request, which is served; the backend never sees the gone one.
#[tokio::test]
async fn a_client_gone_while_queued_frees_its_place() {
    let backend = SlowBackend::start(Hold::Gate).await;
    let text = config(
        &[("a", backend.addr(), "")],
        "max_connections = 1\nqueue_size = 1\nqueue_timeout = \"60s\"",
        "",
    );
    let (balancer, _events) = start(&text).await;
    let (addr, admin) = (balancer.local_addrs()[0], balancer.admin_addr().unwrap());
    let first = tokio::spawn(async move { get(addr, "/r0").await.status });
    wait_until("the first request at the backend", || {
        backend.holding() == 1
    })
    .await;
    let mut gone = TcpStream::connect(addr).await.unwrap();
    gone.write_all(b"GET /gone HTTP/1.1\r\nhost: app.test\r\n\r\n")
        .await
        .unwrap();
    wait_queued(admin, 1).await;
    // A reset, not a FIN (a half-close would leave the request to be answered).
    socket2::SockRef::from(&gone)
        .set_linger(Some(Duration::ZERO))
        .unwrap();
    drop(gone);
    wait_queued(admin, 0).await;
    let next = tokio::spawn(async move { get(addr, "/next").await.status });
    wait_queued(admin, 1).await;
    backend.release(2);
    assert_eq!((first.await.unwrap(), next.await.unwrap()), (200, 200));
    assert_eq!(backend.arrived(), ["/r0", "/next"]);
    let pool = pool_status(admin).await;
    assert_eq!(pool["backends"][0]["in_flight"], 0, "no slot leaked");
    balancer.shutdown(Duration::from_secs(1)).await;
}
