//! The queue and health: a drained backend's freed slot is not handed to the queue, whose
//! requests go to the remaining backend as its slots free; when no backend is left, the
//! waiting requests get the all-down answer at once.

use std::time::Instant;

use super::*;

async fn admin_post(admin: SocketAddr, path: &str) {
    capataz::ctl::request(admin, http::Method::POST, path, None)
        .await
        .unwrap_or_else(|e| panic!("POST {path}: {e}"));
}

#[tokio::test]
async fn queued_requests_go_to_the_backends_left_and_get_the_all_down_answer_when_none_is() {
    let (a, b) = (
        SlowBackend::start(Hold::Gate).await,
        SlowBackend::start(Hold::Gate).await,
    );
    let text = config(
        &[("a", a.addr(), ""), ("b", b.addr(), "")],
        "max_connections = 1\nqueue_timeout = \"60s\"\nwhen_all_down = \"reject\"",
        "",
    );
    let (balancer, _events) = start(&text).await;
    let (addr, admin) = (balancer.local_addrs()[0], balancer.admin_addr().unwrap());
    let send = |path: &'static str| tokio::spawn(async move { get(addr, path).await });
    let held = [send("/r0"), send("/r1")];
    wait_until("one request at each backend", || {
        a.holding() == 1 && b.holding() == 1
    })
    .await;
    let queued = send("/r2");
    wait_queued(admin, 1).await;

    // `a` is drained: its request ends, and its slot does not go to the queue.
    admin_post(admin, "/backends/web/a/drain").await;
    a.release(1);
    wait_until("a's request answered", || a.holding() == 0).await;
    let pool = wait_queued(admin, 1).await;
    assert_eq!(pool["backends"][0]["in_flight"], 0, "{pool:#}");
    // `b`'s slot frees: the queued request goes there.
    b.release(1);
    wait_until("the queued request at b", || b.arrived().len() == 2).await;
    wait_queued(admin, 0).await;
    assert_eq!(a.arrived().len(), 1, "the drained backend got nothing new");
    b.release(1);
    for answer in held {
        assert_eq!(answer.await.unwrap().status, 200);
    }
    assert_eq!(queued.await.unwrap().status, 200);

    // `b` holds one again, one waits; then `b` is forced down too: no backend is left, and
    // the waiting request gets the all-down answer at once, not after the queue timeout.
    let holding = send("/r3");
    wait_until("r3 at b", || b.holding() == 1).await;
    let started = Instant::now();
    let waiting = send("/r4");
    wait_queued(admin, 1).await;
    admin_post(admin, "/backends/web/b/down").await;
    let refused = waiting.await.unwrap();
    assert_eq!(refused.status, 503, "{}", refused.text());
    assert!(
        refused.headers.get("retry-after").is_some(),
        "the all-down answer"
    );
    assert!(started.elapsed() < Duration::from_secs(30), "at once");
    assert_eq!(
        metric(
            &balancer,
            "capataz_queue_rejected_total{pool=\"web\",reason=\"timeout\"}"
        ),
        0.0
    );
    b.release(1);
    assert_eq!(holding.await.unwrap().status, 200);
    balancer.shutdown(Duration::from_secs(1)).await;
}

/// A retry takes a free slot or none: a request whose first backend refuses the connection,
/// while the other is at its limit, ends with the refusal's 502 at once; it does not wait in
/// the queue (nor does it reach the full backend).
#[tokio::test]
async fn a_retry_that_finds_every_backend_at_its_limit_does_not_queue() {
    let b = SlowBackend::start(Hold::Gate).await;
    // A port nobody listens on: connections are refused.
    let dead = {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        listener.local_addr().unwrap()
    };
    let text = config(
        &[("dead", dead, ""), ("b", b.addr(), "")],
        "max_connections = 1\nqueue_timeout = \"60s\"\npassive.enabled = false",
        "",
    );
    let (balancer, _events) = start(&text).await;
    let (addr, admin) = (balancer.local_addrs()[0], balancer.admin_addr().unwrap());
    let held = tokio::spawn(async move { get(addr, "/r0").await.status });
    wait_until("a request held at b", || b.holding() == 1).await;
    let started = Instant::now();
    let refused = get(addr, "/r1").await;
    assert_eq!(refused.status, 502, "{}", refused.text());
    assert!(started.elapsed() < Duration::from_secs(30), "not queued");
    let pool = pool_status(admin).await;
    assert_eq!(pool["queue"]["length"], 0, "{pool:#}");
    b.release(1);
    assert_eq!(held.await.unwrap(), 200);
    assert_eq!(b.arrived(), ["/r0"]);
    balancer.shutdown(Duration::from_secs(1)).await;
}

/// A backend's own 503 is relayed, not retried, when the only other backend is at its limit:
/// the retry would find no slot, so none is asked for (no budget spent) and the client gets
/// the backend's answer rather than capataz's 502.
#[tokio::test]
async fn a_backend_s_503_is_relayed_when_every_other_backend_is_at_its_limit() {
    let shedding = crate::support::balancer::backends(&["a"]).await.remove(0);
    shedding.set_traffic(capataz::sim::Mode::Status(503));
    let b = SlowBackend::start(Hold::Gate).await;
    let text = config(
        &[("a", shedding.addr(), ""), ("b", b.addr(), "")],
        "max_connections = 1\npassive.enabled = false",
        "",
    );
    let (balancer, _events) = start(&text).await;
    let addr = balancer.local_addrs()[0];
    let held = tokio::spawn(async move { get(addr, "/r0").await.status });
    wait_until("a request held at b", || b.holding() == 1).await;
    let retries = "capataz_retries_total{pool=\"web\"}";
    let before = metric(&balancer, retries);
    let answer = get(addr, "/r1").await;
    assert_eq!(answer.status, 503, "{}", answer.text());
    assert_eq!(
        answer.backend.as_deref(),
        Some("a"),
        "the backend's own answer"
    );
    assert_eq!(metric(&balancer, retries), before, "no retry asked for");
    b.release(1);
    assert_eq!(held.await.unwrap(), 200);
    assert_eq!(b.arrived(), ["/r0"]);
    balancer.shutdown(Duration::from_secs(1)).await;
}
