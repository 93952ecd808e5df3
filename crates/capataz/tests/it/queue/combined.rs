//! Connection limits combined with the features around them: sticky sessions (a client whose
//! backend is at its limit moves, counted `at_limit`), error pages (the queue's 503 and a rate
//! limit's 429 get the listener's page and keep their headers), clients resetting in bulk
//! while queued (no slot or place leaks), and a reload while requests wait.

use tokio::task::JoinSet;

use super::*;

/// The sticky cookie's `NAME=ID` pair of an answer's `Set-Cookie`, if it has one.
fn sticky_pair(answer: &Answer) -> Option<String> {
    let value = answer.headers.get("set-cookie")?.to_str().ok()?;
    Some(value.split(';').next()?.to_owned())
}

/// Which of `a` and `b` saw `path`.
fn seen_by(a: &SlowBackend, b: &SlowBackend, path: &str) -> &'static str {
    match (
        a.arrived().iter().any(|p| p == path),
        b.arrived().iter().any(|p| p == path),
    ) {
        (true, false) => "a",
        (false, true) => "b",
        other => panic!("{path} seen by {other:?}"),
    }
}

/// A sticky client whose backend holds its limit is served by the other backend at once
/// (nobody waits), gets a cookie naming it, and counts one `at_limit` move; its backend's
/// count still holds the request there (the refused look at the slot once gave back a slot
/// it never took: the count wrapped below zero when that request ended, the backend stayed
/// "at its limit" for good and the metrics page failed to render); every slot comes back.
#[tokio::test]
async fn a_sticky_client_at_its_backends_limit_moves_as_at_limit_and_no_count_is_lost() {
    let (a, b) = (
        SlowBackend::start(Hold::Gate).await,
        SlowBackend::start(Hold::Gate).await,
    );
    let text = config(
        &[("a", a.addr(), ""), ("b", b.addr(), "")],
        "max_connections = 1\nqueue_timeout = \"60s\"\nsticky = { cookie = \"SRV\" }",
        "",
    );
    let (balancer, _events) = start(&text).await;
    let (addr, admin) = (balancer.local_addrs()[0], balancer.admin_addr().unwrap());
    a.release(1);
    b.release(1);
    let first = get(addr, "/first").await;
    assert_eq!(first.status, 200);
    let home = seen_by(&a, &b, "/first");
    let home_backend = if home == "a" { &a } else { &b };
    let cookie = sticky_pair(&first).expect("a new client gets the cookie");
    // Its backend's one slot held by the client's own first request.
    let held_cookie = cookie.clone();
    let held = tokio::spawn(async move {
        exchange(
            addr,
            "GET",
            "/held",
            "app.test",
            &[("cookie", &held_cookie)],
        )
        .await
    });
    wait_until("the held request at its backend", || {
        home_backend.holding() == 1
    })
    .await;
    // The other backend has a permit left from the first request's release: it answers at
    // once.
    let moved = exchange(addr, "GET", "/moved", "app.test", &[("cookie", &cookie)]).await;
    assert_eq!(moved.status, 200);
    assert_eq!(
        seen_by(&a, &b, "/moved"),
        if home == "a" { "b" } else { "a" }
    );
    // The home backend still holds the first request: its count says so (a refused look at
    // its slot gave nothing back).
    let pool = pool_status(admin).await;
    let home_index = usize::from(home == "b");
    assert_eq!(pool["backends"][home_index]["in_flight"], 1, "{pool:#}");
    let new_cookie = sticky_pair(&moved).expect("a moved client gets a new cookie");
    assert_ne!(new_cookie, cookie, "it names the other backend");
    let series = format!(
        "capataz_sticky_moves_total{{pool=\"web\",backend=\"{home}\",reason=\"at_limit\"}}"
    );
    assert_eq!(metric(&balancer, &series), 1.0);
    home_backend.release(1);
    let held = held.await.unwrap();
    assert_eq!((held.status, sticky_pair(&held)), (200, None), "it stayed");
    let pool = pool_status(admin).await;
    for backend in pool["backends"].as_array().unwrap() {
        assert_eq!(backend["in_flight"], 0, "{pool:#}");
    }
    balancer.shutdown(Duration::from_secs(1)).await;
}

/// The queue's 503 (full) gets the listener's page and no `Retry-After`; a rate limit's 429
/// gets its page and keeps `Retry-After`. Both are counted as capataz's answers.
#[tokio::test]
async fn queue_and_rate_limit_refusals_get_the_listeners_pages_and_keep_their_headers() {
    let backend = SlowBackend::start(Hold::Gate).await;
    let listener = "[[listeners.routes]]\npath_prefix = \"/\"\npool = \"web\"\n\
        rate_limit = { key = \"header:x-key\", rate = 1, per = \"60s\", burst = 1 }\n\
        [listeners.error_pages]\n\
        503 = { body = \"<p>busy</p>\" }\n\
        429 = { body = \"slow down\\n\", content_type = \"text/plain\" }\n";
    let text = config(
        &[("a", backend.addr(), "")],
        "max_connections = 1\nqueue_size = 1\nqueue_timeout = \"60s\"",
        listener,
    );
    let (balancer, _events) = start(&text).await;
    let (addr, admin) = (balancer.local_addrs()[0], balancer.admin_addr().unwrap());
    let key = |k: &'static str| [("x-key", k)];
    let held =
        tokio::spawn(async move { exchange(addr, "GET", "/held", "app.test", &key("k1")).await });
    wait_until("the first request at the backend", || {
        backend.holding() == 1
    })
    .await;
    let queued =
        tokio::spawn(async move { exchange(addr, "GET", "/queued", "app.test", &key("k2")).await });
    wait_queued(admin, 1).await;
    let full = exchange(addr, "GET", "/full", "app.test", &key("k3")).await;
    assert_eq!(full.status, 503);
    assert_eq!(&full.body[..], b"<p>busy</p>");
    assert_eq!(full.headers["content-type"], "text/html; charset=utf-8");
    assert!(
        full.headers.get("retry-after").is_none(),
        "{:?}",
        full.headers
    );
    let limited = exchange(addr, "GET", "/again", "app.test", &key("k3")).await;
    assert_eq!(limited.status, 429);
    assert_eq!(&limited.body[..], b"slow down\n");
    assert_eq!(limited.headers["retry-after"], "60");
    backend.release(2);
    assert_eq!(held.await.unwrap().status, 200);
    assert_eq!(queued.await.unwrap().status, 200);
    assert_eq!(
        metric(
            &balancer,
            "capataz_queue_rejected_total{pool=\"web\",reason=\"full\"}"
        ),
        1.0
    );
    let pool = pool_status(admin).await;
    assert_eq!(pool["backends"][0]["in_flight"], 0, "{pool:#}");
    balancer.shutdown(Duration::from_secs(1)).await;
}

/// Thirty clients queued behind a held request reset their connections at once: the queue
/// empties, the held request's slot comes back when it ends, and the next request is served
/// at once (nothing granted to a gone client stays taken).
#[tokio::test]
async fn clients_resetting_in_bulk_while_queued_leak_no_slot_nor_place() {
    let backend = SlowBackend::start(Hold::Gate).await;
    let text = config(
        &[("a", backend.addr(), "")],
        "max_connections = 1\nqueue_size = 64\nqueue_timeout = \"60s\"",
        "",
    );
    let (balancer, _events) = start(&text).await;
    let (addr, admin) = (balancer.local_addrs()[0], balancer.admin_addr().unwrap());
    let first = tokio::spawn(async move { get(addr, "/r0").await.status });
    wait_until("the first request at the backend", || {
        backend.holding() == 1
    })
    .await;
    let mut gone = Vec::new();
    for n in 0..30 {
        let mut stream = TcpStream::connect(addr).await.unwrap();
        let request = format!("GET /gone{n} HTTP/1.1\r\nhost: app.test\r\n\r\n");
        stream.write_all(request.as_bytes()).await.unwrap();
        gone.push(stream);
    }
    wait_queued(admin, 30).await;
    // Half reset while the slot is still held, half just as it is released.
    for stream in gone.drain(..15) {
        socket2::SockRef::from(&stream)
            .set_linger(Some(Duration::ZERO))
            .unwrap();
    }
    wait_queued(admin, 15).await;
    backend.release(1);
    for stream in gone.drain(..) {
        socket2::SockRef::from(&stream)
            .set_linger(Some(Duration::ZERO))
            .unwrap();
    }
    assert_eq!(first.await.unwrap(), 200);
    wait_queued(admin, 0).await;
    // Whichever gone request reached the backend before its reset, its slot comes back.
    backend.release(30);
    until_ok("every slot back", Duration::from_millis(10), async || {
        let pool = pool_status(admin).await;
        match pool["backends"][0]["in_flight"].as_u64() {
            Some(0) => Ok(()),
            _ => Err(format!("{pool:#}")),
        }
    })
    .await;
    assert_eq!(get(addr, "/next").await.status, 200);
    balancer.shutdown(Duration::from_secs(1)).await;
}

/// Requests waiting in the queue when a reload rebuilds the pool are served by the slots the
/// requests sent before free (the old queue), not left to time out.
#[tokio::test]
async fn requests_queued_across_a_reload_are_served() {
    let backend = SlowBackend::start(Hold::Gate).await;
    let make = |timeout: &str| {
        config(
            &[("a", backend.addr(), "")],
            &format!("max_connections = 1\nqueue_timeout = \"{timeout}\""),
            "",
        )
    };
    let (balancer, _events) = start(&make("60s")).await;
    let (addr, admin) = (balancer.local_addrs()[0], balancer.admin_addr().unwrap());
    let mut clients = JoinSet::new();
    clients.spawn(async move { get(addr, "/r0").await.status });
    wait_until("the first request at the backend", || {
        backend.holding() == 1
    })
    .await;
    for n in 1..=2 {
        clients.spawn(async move { get(addr, &format!("/r{n}")).await.status });
    }
    wait_queued(admin, 2).await;
    let reloaded = crate::support::balancer::parse(&make("59s"));
    balancer
        .reload(&reloaded)
        .await
        .expect("the reload applies");
    let started = std::time::Instant::now();
    backend.release(3);
    while let Some(status) = clients.join_next().await {
        assert_eq!(status.unwrap(), 200);
    }
    assert!(
        started.elapsed() < Duration::from_secs(20),
        "served by freed slots, not at the queue timeout: {:?}",
        started.elapsed()
    );
    assert_eq!(backend.arrived(), ["/r0", "/r1", "/r2"]);
    balancer.shutdown(Duration::from_secs(1)).await;
}

/// An HTTP/2 client's sticky streams queued behind their backend's limit (its cookie names
/// the one backend) are all dropped when the client closes the connection: the queue
/// empties, every slot comes back, and the next client is served at once.
#[tokio::test]
async fn an_http2_clients_queued_streams_go_away_with_its_connection() {
    use crate::support::h2client;

    let backend = SlowBackend::start(Hold::Gate).await;
    let text = config(
        &[("a", backend.addr(), "")],
        "max_connections = 1\nqueue_timeout = \"60s\"\nsticky = { cookie = \"SRV\" }",
        "h2c = true",
    );
    let (balancer, _events) = start(&text).await;
    let (addr, admin) = (balancer.local_addrs()[0], balancer.admin_addr().unwrap());
    backend.release(1);
    let first = get(addr, "/first").await;
    let cookie = sticky_pair(&first).expect("a new client gets the cookie");
    let conn = h2client::connect(addr).await;
    let mut streams = JoinSet::new();
    for n in 0..8 {
        let mut sender = conn.sender.clone();
        let mut request = h2client::request(
            http::Method::GET,
            "app.test",
            &format!("/s{n}"),
            h2client::empty(),
        );
        request
            .headers_mut()
            .insert("cookie", cookie.parse().unwrap());
        streams.spawn(async move {
            let _ = sender.ready().await;
            let _ = sender.send_request(request).await;
        });
    }
    wait_until("one stream at the backend", || backend.holding() == 1).await;
    wait_queued(admin, 7).await;
    streams.abort_all();
    conn.conn.abort();
    drop(conn.sender);
    wait_queued(admin, 0).await;
    backend.release(8);
    until_ok("every slot back", Duration::from_millis(10), async || {
        let pool = pool_status(admin).await;
        match pool["backends"][0]["in_flight"].as_u64() {
            Some(0) => Ok(()),
            _ => Err(format!("{pool:#}")),
        }
    })
    .await;
    let next = exchange(addr, "GET", "/next", "app.test", &[("cookie", &cookie)]).await;
    assert_eq!((next.status, sticky_pair(&next)), (200, None), "it stayed");
    balancer.shutdown(Duration::from_secs(1)).await;
}
