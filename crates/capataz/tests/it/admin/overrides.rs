//! Manual overrides: drain, down and up change eligibility, clear and a TTL end them.

use super::*;

#[tokio::test]
async fn drain_stops_new_requests_and_clear_brings_them_back() {
    let (b, mut r) = two_backends().await;
    assert!(r.traffic(10).await.get("b").is_some_and(|&n| n > 0));

    let reply = r.post("/backends/web/b/drain").await;
    assert_eq!(reply.status, 200, "{}", reply.json);
    assert_eq!(text(&reply.json, "/state"), "DRAINING");
    assert_eq!(text(&reply.json, "/override"), "drain");
    assert!(reply.json["ttl_ms"].is_null());
    let event = r
        .wait_for("b drained", |e| override_of(e, "b").is_some())
        .await;
    let (kind, from, to, reason) = override_of(&event, "b").unwrap();
    assert_eq!(
        (kind, from, to),
        (Some(OverrideKind::Drain), "UP", "DRAINING")
    );
    assert!(reason.contains("until cleared"), "{reason}");

    let status = r.backend("b").await;
    assert_eq!(text(&status, "/state"), "DRAINING");
    assert_eq!(text(&status, "/verdict"), "UP");
    assert_eq!(status["eligible"], false);
    assert_eq!(text(&status, "/override/kind"), "drain");
    assert!(status["override"]["until"].is_null());
    assert!(text(&status, "/explain").starts_with("DRAINING since "));

    let hits = b[1].traffic_hits();
    assert_eq!(r.traffic(20).await.get("a"), Some(&20));
    assert_eq!(
        b[1].traffic_hits(),
        hits,
        "a draining backend got new requests"
    );

    let reply = r.post("/backends/web/b/clear").await;
    assert_eq!(reply.status, 200, "{}", reply.json);
    assert_eq!(text(&reply.json, "/state"), "UP");
    assert!(reply.json["override"].is_null());
    let event = r
        .wait_for("b cleared", |e| {
            override_of(e, "b").is_some_and(|(kind, ..)| kind.is_none())
        })
        .await;
    let (_, from, to, reason) = override_of(&event, "b").unwrap();
    assert_eq!((from, to), ("DRAINING", "UP"));
    assert!(reason.contains("cleared by an operator"), "{reason}");
    let status = r.backend("b").await;
    assert_eq!(text(&status, "/state"), "UP");
    assert!(status["override"].is_null());
    assert!(r.traffic(20).await.get("b").is_some_and(|&n| n > 0));
    assert!(b[1].traffic_hits() > hits);
}

#[tokio::test]
async fn down_forces_a_healthy_backend_out() {
    let (b, mut r) = two_backends().await;
    let reply = r.post("/backends/web/b/down").await;
    assert_eq!(reply.status, 200, "{}", reply.json);
    assert_eq!(text(&reply.json, "/state"), "FORCED_DOWN");
    let event = r
        .wait_for("b forced down", |e| override_of(e, "b").is_some())
        .await;
    let (kind, from, to, _) = override_of(&event, "b").unwrap();
    assert_eq!(
        (kind, from, to),
        (Some(OverrideKind::Down), "UP", "FORCED_DOWN")
    );

    // Its probes keep passing, and it still gets nothing.
    let probes = b[1].health_hits();
    assert!(b[1].wait_health_hits(probes + 3, DEADLINE).await);
    let hits = b[1].traffic_hits();
    assert_eq!(r.traffic(20).await.get("a"), Some(&20));
    assert_eq!(b[1].traffic_hits(), hits);
    let status = r.backend("b").await;
    assert_eq!(text(&status, "/verdict"), "UP");
    assert_eq!(text(&status, "/state"), "FORCED_DOWN");
    assert_eq!(text(&status, "/override/kind"), "down");
    let explain = text(&status, "/explain");
    assert!(explain.starts_with("FORCED DOWN since "), "{explain}");
    assert!(explain.contains("health checks say UP"), "{explain}");

    assert_eq!(r.post("/backends/web/b/clear").await.status, 200);
    assert!(r.traffic(20).await.get("b").is_some_and(|&n| n > 0));
}

#[tokio::test]
async fn up_forces_a_failing_backend_in() {
    let (b, mut r) = two_backends().await;
    let reply = r.post("/backends/web/b/up").await;
    assert_eq!(reply.status, 200, "{}", reply.json);
    assert_eq!(text(&reply.json, "/state"), "FORCED_UP");
    b[1].set_health(Mode::Status(503));
    r.wait_for("b DOWN", |e| is_transition(e, "b", State::Down))
        .await;

    let status = r.backend("b").await;
    assert_eq!(text(&status, "/verdict"), "DOWN");
    assert_eq!(text(&status, "/state"), "FORCED_UP");
    assert_eq!(status["eligible"], true);
    let explain = text(&status, "/explain");
    assert!(explain.starts_with("FORCED UP since "), "{explain}");
    assert!(explain.contains("health checks say DOWN"), "{explain}");
    let hits = b[1].traffic_hits();
    assert!(r.traffic(20).await.get("b").is_some_and(|&n| n > 0));
    assert!(
        b[1].traffic_hits() > hits,
        "a forced-up backend got no traffic"
    );

    // Cleared, the health checks decide again: out.
    assert_eq!(r.post("/backends/web/b/clear").await.status, 200);
    let event = r
        .wait_for("b cleared", |e| {
            override_of(e, "b").is_some_and(|(kind, ..)| kind.is_none())
        })
        .await;
    let (_, from, to, _) = override_of(&event, "b").unwrap();
    assert_eq!((from, to), ("FORCED_UP", "DOWN"));
    let hits = b[1].traffic_hits();
    assert_eq!(r.traffic(20).await.get("a"), Some(&20));
    assert_eq!(b[1].traffic_hits(), hits);
}

#[tokio::test]
async fn an_override_with_a_ttl_lapses_by_itself() {
    let (b, mut r) = two_backends().await;
    let reply = r.post("/backends/web/b/drain?ttl=300ms").await;
    assert_eq!(reply.status, 200, "{}", reply.json);
    assert_eq!(number(&reply.json, "/ttl_ms"), 300.0);
    let status = r.backend("b").await;
    assert_eq!(text(&status, "/state"), "DRAINING");
    text(&status, "/override/until");
    assert!(text(&status, "/explain").contains("(manual, until "));

    // Until it lapses, a request reaches b only once the override is gone (the override is
    // cleared before the snapshot that readmits b is published).
    let pool = r.balancer.pool("web").unwrap();
    let end = tokio::time::Instant::now() + DEADLINE;
    loop {
        assert!(
            tokio::time::Instant::now() < end,
            "b never got traffic back"
        );
        let answer = r.proxy.get("/").await;
        assert_eq!(answer.status, 200);
        if answer.backend.as_deref() == Some("b") {
            assert!(
                !matches!(
                    pool.views()[1].standing.cause,
                    capataz_health::rotation::Cause::Override(_)
                ),
                "b got a request while draining"
            );
            break;
        }
        tokio::task::yield_now().await;
    }
    let event = r
        .wait_for("the drain lapsing", |e| {
            override_of(e, "b").is_some_and(|(kind, ..)| kind.is_none())
        })
        .await;
    let (_, from, to, reason) = override_of(&event, "b").unwrap();
    assert_eq!((from, to), ("DRAINING", "UP"));
    assert!(reason.contains("lapsed"), "{reason}");
    assert!(r.backend("b").await["override"].is_null());
    let hits = b[1].traffic_hits();
    assert!(r.traffic(10).await.get("b").is_some_and(|&n| n > 0));
    assert!(b[1].traffic_hits() > hits);

    // Bad requests change nothing.
    for (path, status, says) in [
        ("/backends/web/b/drain?ttl=soon", 400, "ttl"),
        ("/backends/web/b/drain?ttl=", 400, "ttl"),
        ("/backends/web/b/explode", 404, "explode"),
        ("/backends/web/nope/drain", 404, "nope"),
        ("/backends/nope/b/drain", 404, "nope"),
    ] {
        let reply = r.post(path).await;
        assert_eq!(reply.status, status, "POST {path}: {}", reply.json);
        let error = text(&reply.json, "/error");
        assert!(error.contains(says), "POST {path}: {error}");
    }
    assert_eq!(text(&r.backend("b").await, "/state"), "UP");
}
