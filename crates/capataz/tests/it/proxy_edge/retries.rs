//! Sections 2-4: what is retried (methods, statuses, phases), the retry budget, and what
//! the client gets when nothing is left to retry.

use super::*;

#[tokio::test]
async fn get_is_retried_past_a_503_but_a_post_with_a_body_is_not() {
    let b = backends(&["bad", "good"]).await;
    b[0].set_traffic(Mode::Status(503));
    let (balancer, mut rx) = start(&config_text(&sims(&b), "", QUIET)).await;
    let mut client = Client::strict(balancer.local_addrs()[0]);

    // Round robin over [bad, good]: the first pick of a fresh pool is `bad`.
    let post = client
        .send(
            "POST",
            "/orders",
            "app.test",
            Bytes::from_static(b"{\"n\":1}"),
        )
        .await;
    assert_eq!(post.status, 503, "a POST with a body is never replayed");
    assert_eq!(post.backend.as_deref(), Some("bad"));
    assert_eq!((b[0].traffic_hits(), b[1].traffic_hits()), (1, 0));

    // Picks go good (cursor 1), then bad -> retried to good (cursor 2; a retry does not
    // advance the cursor, so first attempts keep alternating).
    let first = client.get("/").await;
    assert_eq!(first.backend.as_deref(), Some("good"));
    let retried = client.get("/").await;
    assert_eq!(retried.status, 200);
    assert_eq!(retried.backend.as_deref(), Some("good"));
    assert_eq!((b[0].traffic_hits(), b[1].traffic_hits()), (2, 2));

    // Every GET succeeds while one backend in two answers 503 (within the default budget).
    for _ in 0..5 {
        let answer = client.get("/").await;
        assert_eq!(answer.status, 200);
        assert_eq!(answer.backend.as_deref(), Some("good"));
    }
    // First attempts alternate (good, bad -> good, ...): bad draws only its half of them.
    assert_eq!((b[0].traffic_hits(), b[1].traffic_hits()), (4, 7));
    // The high `consecutive_errors` kept it in: no verdict changed.
    while let Ok(event) = rx.try_recv() {
        assert!(!matches!(event, Notice::Transition { .. }), "{event:?}");
    }
}

#[tokio::test]
async fn post_to_a_refusing_backend_is_retried_with_its_body_intact() {
    let dead = SimBackend::start("dead", any()).await.unwrap();
    dead.crash();
    let counter = counting_backend().await;
    let pool = [("dead".to_owned(), dead.addr()), counter.entry("counter")];
    let (balancer, _rx) = start(&config_text(&pool, "", QUIET)).await;
    let mut client = Client::strict(balancer.local_addrs()[0]);
    let body = pattern(100_000);
    // The fresh pool's first pick is `dead`: the connect is refused, nothing was sent, so even
    // a POST goes to the next backend.
    let answer = client
        .send("POST", "/upload", "app.test", Bytes::from(body.clone()))
        .await;
    assert_eq!(answer.status, 200);
    assert_eq!(answer.backend.as_deref(), Some("counter"));
    assert_eq!(
        answer.body,
        format!("{} {:x}", body.len(), fnv(&body)).as_bytes()
    );
    assert_eq!(counter.hits(), 1);
    assert_eq!(dead.traffic_hits(), 0);
}

#[tokio::test]
async fn retry_budget_stops_retries_once_the_saved_retries_are_spent() {
    let b = backends(&["bad", "good"]).await;
    b[0].set_traffic(Mode::Status(503));
    let extra = r#"
[pools.web.active]
kind = "none"

[pools.web.passive]
enabled = false

[pools.web.retries]
attempts = 1
budget_percent = 0
min_budget = 2
"#;
    let (balancer, _rx) = start(&config_text(&sims(&b), "", extra)).await;
    let mut client = Client::strict(balancer.local_addrs()[0]);
    // First attempts alternate bad, good, bad, ... (a retry does not advance the cursor):
    // requests 1 and 3 go to bad and are retried to good; the budget is then empty, so
    // requests 5 and 7 get bad's 503.
    let statuses: Vec<u16> = {
        let mut out = Vec::new();
        for _ in 0..8 {
            out.push(client.get("/").await.status);
        }
        out
    };
    assert_eq!(statuses, [200, 200, 200, 200, 503, 200, 503, 200]);
    assert_eq!(b[0].traffic_hits(), 4, "2 retried + 2 not retried");
    assert_eq!(b[1].traffic_hits(), 6, "2 retries + 4 direct");
}

/// Regression: the budget used to save at most `min_budget` (10) retries whatever the traffic,
/// so a backend dying with more requests than that in flight cost clients 502s. Savings now
/// follow the traffic (20 % of the last 10 s): 30 requests cut at once are all retried.
#[tokio::test]
async fn every_request_in_flight_on_a_backend_that_dies_is_retried_within_the_budget() {
    let b = backends(&["dies", "good"]).await;
    let extra = r#"
[pools.web.active]
kind = "none"

[pools.web.passive]
enabled = false

[pools.web.timeouts]
response_header = "30s"
"#;
    let (balancer, _rx) = start(&config_text(&sims(&b), "", extra)).await;
    let addr = balancer.local_addrs()[0];
    // Earn the budget: 300 requests at 20 % save 10 + 60 retries.
    let mut client = Client::strict(addr);
    for _ in 0..300 {
        assert_eq!(client.get("/").await.status, 200);
    }
    // 60 clients at once: round robin leaves 30 of them waiting on `dies`, which then crashes.
    b[0].set_traffic(Mode::Hang);
    let hits = b[0].traffic_hits();
    let clients: Vec<JoinHandle<Answer>> = (0..60)
        .map(|_| tokio::spawn(async move { Client::strict(addr).get("/").await }))
        .collect();
    assert!(b[0].wait_traffic_hits(hits + 30, DEADLINE).await);
    b[0].crash();
    let mut served_by = std::collections::HashMap::new();
    for client in clients {
        let answer = tokio::time::timeout(DEADLINE, client)
            .await
            .expect("answered in time")
            .unwrap();
        assert_eq!(answer.status, 200, "a client saw {}", answer.status);
        *served_by.entry(answer.backend).or_insert(0) += 1;
    }
    assert_eq!(
        served_by.get(&Some("good".to_owned())),
        Some(&60),
        "{served_by:?}"
    );
}

#[tokio::test]
async fn zero_retry_attempts_turn_a_refused_connect_into_502() {
    let b = backends(&["dead", "good"]).await;
    b[0].crash();
    let extra = format!("{QUIET}\n[pools.web.retries]\nattempts = 0\n");
    let (balancer, _rx) = start(&config_text(&sims(&b), "", &extra)).await;
    let mut client = Client::strict(balancer.local_addrs()[0]);
    let answers: Vec<u16> = {
        let mut out = Vec::new();
        for _ in 0..4 {
            out.push(client.get("/").await.status);
        }
        out
    };
    assert_eq!(answers, [502, 200, 502, 200]);
    assert_eq!(b[1].traffic_hits(), 2);
}

/// Regression: with no backend left to retry on, a retryable 503 used to be replaced by a 502 of
/// capataz's own ("the backend failed (HTTP 503)"), losing the backend's answer.
#[tokio::test]
async fn a_503_with_no_backend_left_to_retry_reaches_the_client_as_is() {
    let b = backends(&["only"]).await;
    b[0].set_traffic(Mode::Status(503));
    let (balancer, _rx) = start(&config_text(&sims(&b), "", QUIET)).await;
    let mut client = Client::strict(balancer.local_addrs()[0]);
    let answer = client.get("/").await;
    assert_eq!(answer.status, 503);
    assert_eq!(answer.backend.as_deref(), Some("only"));
    assert_eq!(answer.body, "only\n");
    assert_eq!(b[0].traffic_hits(), 1);

    // Every backend answers 503 and retries could go on: the last answer is relayed.
    let b = backends(&["x", "y"]).await;
    for backend in &b {
        backend.set_traffic(Mode::Status(503));
    }
    let extra = format!("{QUIET}\n[pools.web.retries]\nattempts = 5\n");
    let (balancer, _rx) = start(&config_text(&sims(&b), "", &extra)).await;
    let mut client = Client::strict(balancer.local_addrs()[0]);
    let answer = client.get("/").await;
    assert_eq!(answer.status, 503);
    assert_eq!(answer.backend.as_deref(), Some("y"), "tried x, then y");
    assert_eq!((b[0].traffic_hits(), b[1].traffic_hits()), (1, 1));
}
