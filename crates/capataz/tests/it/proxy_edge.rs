//! End-to-end tests of the proxy's edges on loopback: upgrades, retries and their budget,
//! HTTP/1.0 and keep-alive, oversized heads, streamed bodies both ways, routing, and the
//! least-request algorithm.
//!
//! Besides the scriptable [`SimBackend`], some tests use tiny raw backends written here (a
//! WebSocket-style echo, a body counter, a streamer) because they need to see or produce bytes
//! a `SimBackend` does not. Waits are on answers and counts with generous deadlines, never on
//! fixed sleeps.

use std::net::SocketAddr;
use std::sync::atomic::Ordering;
use std::time::Duration;

use bytes::Bytes;
use capataz::health::Event;
use capataz::sim::{Mode, SimBackend};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::task::JoinHandle;

use crate::support::balancer::{backends, pairs as sims, start, ConfigText};
use crate::support::client::{Answer, Client};
use crate::support::raw::{
    fill, has_token, header, raw_roundtrip, read_body, read_exact_buf, read_head, status_of,
    RawBackend,
};
use crate::support::{any, DEADLINE};

/// No probes and a passive side that never ejects within a test: only the proxy is exercised.
const QUIET: &str = r#"
[pools.web.active]
kind = "none"

[pools.web.passive]
consecutive_errors = 1000
"#;

/// A config with one listener on a free port (with `listener_extra` keys) and one pool `web`
/// over `backends` (weight 1 each), plus `pool_extra` TOML appended after the pool's table.
fn config_text(
    backends: &[(String, SocketAddr)],
    listener_extra: &str,
    pool_extra: &str,
) -> String {
    ConfigText::new(backends)
        .listener(listener_extra)
        .extra(pool_extra)
        .build()
}

// ---- Raw backends and raw clients -------------------------------------------------------------

/// FNV-1a, to compare large bodies in a short answer.
fn fnv(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325, |h, &b| {
        (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3)
    })
}

/// A deterministic, non-repeating-looking body of `len` bytes.
fn pattern(len: usize) -> Vec<u8> {
    (0..len)
        .map(|i| (i % 251) as u8 ^ (i / 251 % 256) as u8)
        .collect()
}

/// A keep-alive backend that reads each request's body and answers `<length> <fnv>`.
async fn counting_backend() -> RawBackend {
    RawBackend::start(|mut stream, hits| async move {
        let mut buf = Vec::new();
        while let Some(head) = read_head(&mut stream, &mut buf).await {
            let Some(body) = read_body(&mut stream, &mut buf, &head).await else {
                return;
            };
            hits.fetch_add(1, Ordering::SeqCst);
            let text = format!("{} {:x}", body.len(), fnv(&body));
            let response = format!(
                "HTTP/1.1 200 OK\r\nX-Backend: counter\r\nContent-Length: {}\r\n\r\n{text}",
                text.len()
            );
            if stream.write_all(response.as_bytes()).await.is_err() {
                return;
            }
        }
    })
    .await
}

// ---- 1. Upgrades -----------------------------------------------------------------------------

#[tokio::test]
async fn websocket_upgrade_passes_through_and_echoes_both_ways() {
    // Plain requests get `200 plain` (keep-alive); an upgrade request gets a 101 and an echo.
    let echo = RawBackend::start(|mut stream, hits| async move {
        let mut buf = Vec::new();
        loop {
            let Some(head) = read_head(&mut stream, &mut buf).await else {
                return;
            };
            hits.fetch_add(1, Ordering::SeqCst);
            let upgrade = has_token(&head, "connection", "upgrade")
                && header(&head, "upgrade").is_some_and(|v| v.eq_ignore_ascii_case("websocket"));
            if upgrade {
                break;
            }
            let plain = b"HTTP/1.1 200 OK\r\nX-Backend: echo\r\nContent-Length: 5\r\n\r\nplain";
            if stream.write_all(plain).await.is_err() {
                return;
            }
        }
        let switch = b"HTTP/1.1 101 Switching Protocols\r\nConnection: Upgrade\r\nUpgrade: websocket\r\n\r\n";
        if stream.write_all(switch).await.is_err() {
            return;
        }
        if !buf.is_empty() && stream.write_all(&buf).await.is_err() {
            return;
        }
        let mut chunk = [0u8; 4096];
        while let Ok(n) = stream.read(&mut chunk).await {
            if n == 0 || stream.write_all(&chunk[..n]).await.is_err() {
                return;
            }
        }
    })
    .await;
    let (balancer, _rx) = start(&config_text(&[echo.entry("echo")], "", QUIET)).await;
    let mut client = TcpStream::connect(balancer.local_addrs()[0])
        .await
        .expect("connect");
    client
        .write_all(
            b"GET /chat HTTP/1.1\r\nHost: app.test\r\nConnection: Upgrade\r\n\
              Upgrade: websocket\r\nSec-WebSocket-Version: 13\r\n\r\n",
        )
        .await
        .unwrap();
    let mut buf = Vec::new();
    let head = tokio::time::timeout(DEADLINE, read_head(&mut client, &mut buf))
        .await
        .expect("a 101 in time")
        .expect("a response head");
    assert!(head.starts_with("HTTP/1.1 101"), "{head}");
    assert!(has_token(&head, "connection", "upgrade"), "{head}");
    assert_eq!(header(&head, "upgrade"), Some("websocket"), "{head}");
    assert!(buf.is_empty(), "no bytes may follow a 101 head unasked");

    for message in [&b"hello"[..], b"\x81\x05frame", &[0u8; 3000][..]] {
        client.write_all(message).await.unwrap();
        let echoed = tokio::time::timeout(
            DEADLINE,
            read_exact_buf(&mut client, &mut buf, message.len()),
        )
        .await
        .expect("echo in time")
        .expect("echoed bytes");
        assert_eq!(echoed, message);
    }
    assert_eq!(echo.hits(), 1);
    // The upgraded upstream connection is the tunnel's alone: a plain request meanwhile gets a
    // connection of its own.
    let mut plain = Client::strict(balancer.local_addrs()[0]);
    let answer = plain.get("/plain").await;
    assert_eq!((answer.status, &answer.body[..]), (200, &b"plain"[..]));
    assert_eq!(echo.hits(), 2);
    client.write_all(b"still there").await.unwrap();
    let echoed = tokio::time::timeout(DEADLINE, read_exact_buf(&mut client, &mut buf, 11))
        .await
        .expect("echo in time")
        .expect("echoed bytes");
    assert_eq!(echoed, b"still there");
    // The tunnel is closed from the client side: the backend sees the end and closes too.
    client.shutdown().await.unwrap();
    let mut rest = Vec::new();
    tokio::time::timeout(DEADLINE, client.read_to_end(&mut rest))
        .await
        .expect("the tunnel closes after the client's FIN")
        .expect("a clean close");
    assert!(rest.is_empty());
}

// ---- 2-4. Retries ----------------------------------------------------------------------------

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
        assert!(!matches!(event, Event::Transition { .. }), "{event:?}");
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

// ---- 5. HTTP/1.0, Connection: close, keep-alive ---------------------------------------------

#[tokio::test]
async fn http10_without_host_gets_an_answer_and_the_connection_closes() {
    let b = backends(&["a"]).await;
    let (balancer, _rx) = start(&config_text(&sims(&b), "", QUIET)).await;
    let response = raw_roundtrip(balancer.local_addrs()[0], b"GET /old HTTP/1.0\r\n\r\n").await;
    assert_eq!(
        status_of(&response),
        Some(200),
        "{}",
        String::from_utf8_lossy(&response)
    );
    assert!(
        response.ends_with(b"\r\n\r\na\n"),
        "the whole body, then close"
    );
    assert_eq!(b[0].traffic_hits(), 1);
}

#[tokio::test]
async fn connection_close_from_the_client_closes_after_the_response() {
    let b = backends(&["a"]).await;
    let (balancer, _rx) = start(&config_text(&sims(&b), "", QUIET)).await;
    let response = raw_roundtrip(
        balancer.local_addrs()[0],
        b"GET / HTTP/1.1\r\nHost: app.test\r\nConnection: close\r\n\r\n",
    )
    .await;
    let text = String::from_utf8_lossy(&response);
    assert_eq!(status_of(&response), Some(200), "{text}");
    assert!(response.ends_with(b"\r\n\r\na\n"), "{text}");
}

/// A client that sends its request and then shuts down its sending side (a half-close, as
/// `nc -N` or an HTTP/1.0 client may) still gets the answer, as with HAProxy (whose
/// `option abortonclose` is off by default): the end of the request is not an abort.
#[tokio::test]
async fn a_request_followed_by_a_half_close_still_gets_its_answer() {
    let b = backends(&["a"]).await;
    // The backend answers after the client's FIN has surely reached the balancer.
    b[0].set_traffic(Mode::Delay(Duration::from_millis(300), 200));
    let (balancer, _rx) = start(&config_text(&sims(&b), "", QUIET)).await;
    let mut stream = TcpStream::connect(balancer.local_addrs()[0])
        .await
        .expect("connect");
    stream
        .write_all(b"GET / HTTP/1.1\r\nHost: app.test\r\n\r\n")
        .await
        .expect("send the request");
    stream.shutdown().await.expect("half-close");
    let (_, response) = until_closed(&mut stream).await;
    let text = String::from_utf8_lossy(&response);
    assert_eq!(status_of(&response), Some(200), "{text}");
    assert!(response.ends_with(b"\r\n\r\na\n"), "{text}");
    assert_eq!(b[0].traffic_hits(), 1);
}

#[tokio::test]
async fn keep_alive_serves_a_hundred_requests_on_one_connection() {
    let b = backends(&["a", "b"]).await;
    let (balancer, _rx) = start(&config_text(&sims(&b), "", QUIET)).await;
    let mut client = Client::strict(balancer.local_addrs()[0]);
    for i in 0..100 {
        // Every tenth is a HEAD: its Content-Length announces a body that never comes, and the
        // connection must stay in step.
        let method = if i % 10 == 9 { "HEAD" } else { "GET" };
        let answer = client
            .send(method, &format!("/item/{i}"), "app.test", Bytes::new())
            .await;
        assert_eq!(answer.status, 200);
        let expected: &[u8] = match (method, answer.backend.as_deref()) {
            ("HEAD", _) => b"",
            (_, Some("a")) => b"a\n",
            _ => b"b\n",
        };
        assert_eq!(&answer.body[..], expected);
    }
    assert_eq!(
        client.connects, 1,
        "one TCP connection carried every request"
    );
    assert_eq!(balancer.open_connections(), 1);
    assert_eq!(b[0].traffic_hits() + b[1].traffic_hits(), 100);
}

/// Reads until the balancer closes the connection; returns how long that took and what came.
async fn until_closed(stream: &mut TcpStream) -> (Duration, Vec<u8>) {
    let start = tokio::time::Instant::now();
    let mut buf = Vec::new();
    let read = tokio::time::timeout(DEADLINE, async {
        while fill(stream, &mut buf).await.is_ok_and(|n| n > 0) {}
    })
    .await;
    assert!(
        read.is_ok(),
        "the connection was not closed within {DEADLINE:?}"
    );
    (start.elapsed(), buf)
}

const TIMEOUTS: &str = "header_read_timeout = \"200ms\"\nidle_timeout = \"1500ms\"";

#[tokio::test]
async fn a_head_that_never_completes_is_closed_after_header_read_timeout() {
    let b = backends(&["a"]).await;
    let (balancer, _rx) = start(&config_text(&sims(&b), TIMEOUTS, QUIET)).await;
    let mut stream = TcpStream::connect(balancer.local_addrs()[0]).await.unwrap();
    stream
        .write_all(b"GET / HTTP/1.1\r\nHost: a\r\n")
        .await
        .unwrap();
    let (took, got) = until_closed(&mut stream).await;
    // Closed by the header timeout (200 ms, checked every 50 ms), well before the idle one.
    assert!(took >= Duration::from_millis(150), "closed after {took:?}");
    assert!(took < Duration::from_millis(1400), "closed after {took:?}");
    assert!(got.is_empty(), "{}", String::from_utf8_lossy(&got));
    assert_eq!(b[0].traffic_hits(), 0);
}

#[tokio::test]
async fn a_quiet_keep_alive_connection_lasts_idle_timeout_not_header_read_timeout() {
    let b = backends(&["a"]).await;
    let (balancer, _rx) = start(&config_text(&sims(&b), TIMEOUTS, QUIET)).await;
    // A connection that never sends a byte is idle from the start.
    let mut silent = TcpStream::connect(balancer.local_addrs()[0]).await.unwrap();
    let silent = tokio::spawn(async move { until_closed(&mut silent).await });
    let mut stream = TcpStream::connect(balancer.local_addrs()[0]).await.unwrap();
    stream
        .write_all(b"GET / HTTP/1.1\r\nHost: a\r\n\r\n")
        .await
        .unwrap();
    let mut buf = Vec::new();
    let head = read_head(&mut stream, &mut buf).await.expect("a response");
    assert!(head.starts_with("HTTP/1.1 200"), "{head}");
    read_body(&mut stream, &mut buf, &head)
        .await
        .expect("its body");
    // The wait for the next request is idle time (1.5 s), not header time (200 ms).
    let (took, got) = until_closed(&mut stream).await;
    assert!(took >= Duration::from_millis(1400), "closed after {took:?}");
    assert!(got.is_empty(), "{}", String::from_utf8_lossy(&got));
    let (took, got) = silent.await.unwrap();
    assert!(
        took >= Duration::from_millis(1400),
        "silent: closed after {took:?}"
    );
    assert!(got.is_empty());
    assert_eq!(balancer.open_connections(), 0);
}

// ---- 6. Oversized heads ----------------------------------------------------------------------

#[tokio::test]
async fn a_head_over_max_header_bytes_is_refused_with_431() {
    let b = backends(&["a"]).await;
    // Above hyper's smallest buffer: hyper itself refuses the head.
    let (balancer, _rx) = start(&config_text(&sims(&b), "max_header_bytes = 8192", QUIET)).await;
    let big = format!(
        "GET / HTTP/1.1\r\nHost: app.test\r\nX-Big: {}\r\n\r\n",
        "x".repeat(20 * 1024)
    );
    let response = raw_roundtrip(balancer.local_addrs()[0], big.as_bytes()).await;
    // The connection is closed either way; an answer, if the client got to read it before the
    // reset of its unread bytes, is a 431.
    if !response.is_empty() {
        assert_eq!(
            status_of(&response),
            Some(431),
            "{}",
            String::from_utf8_lossy(&response)
        );
    }
    assert_eq!(b[0].traffic_hits(), 0);

    // Below it: capataz measures the head itself.
    let (balancer, _rx) = start(&config_text(&sims(&b), "max_header_bytes = 1024", QUIET)).await;
    let mut client = Client::strict(balancer.local_addrs()[0]);
    let request = http::Request::get("/")
        .header("host", "app.test")
        .header("x-big", "y".repeat(4000))
        .body(Bytes::new())
        .unwrap();
    client.get("/").await;
    let response = client.request(request).await;
    assert_eq!(response.status, 431);
    assert_eq!(client.connects, 1, "both requests on one connection");
    assert_eq!(b[0].traffic_hits(), 1, "only the small request reached it");
}

// ---- 7. Streaming ----------------------------------------------------------------------------

#[tokio::test]
async fn a_5mb_chunked_response_streams_through_intact() {
    const LEN: usize = 5 * 1024 * 1024;
    let streamer = RawBackend::start(|mut stream, hits| async move {
        let mut buf = Vec::new();
        while let Some(head) = read_head(&mut stream, &mut buf).await {
            if read_body(&mut stream, &mut buf, &head).await.is_none() {
                return;
            }
            hits.fetch_add(1, Ordering::SeqCst);
            let body = pattern(LEN);
            let mut out = b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n".to_vec();
            // Uneven chunk sizes, so no frame boundary lines up with another.
            let sizes = [65_536, 1, 4_095, 32_768, 7, 100_000];
            let mut at = 0;
            for size in sizes.iter().cycle() {
                if at == LEN {
                    break;
                }
                let end = (at + size).min(LEN);
                out.extend_from_slice(format!("{:x}\r\n", end - at).as_bytes());
                out.extend_from_slice(&body[at..end]);
                out.extend_from_slice(b"\r\n");
                at = end;
                if out.len() > 256 * 1024 {
                    if stream.write_all(&out).await.is_err() {
                        return;
                    }
                    out.clear();
                }
            }
            out.extend_from_slice(b"0\r\n\r\n");
            if stream.write_all(&out).await.is_err() {
                return;
            }
        }
    })
    .await;
    let (balancer, _rx) = start(&config_text(&[streamer.entry("s")], "", QUIET)).await;
    let mut client = Client::strict(balancer.local_addrs()[0]);
    let answer = client.get("/big").await;
    assert_eq!(answer.status, 200);
    assert_eq!(answer.body.len(), LEN);
    assert!(answer.body == pattern(LEN), "the body arrived altered");
    // The upstream connection went back to the pool: a second download works the same.
    let again = client.get("/big").await;
    assert_eq!(again.body.len(), LEN);
    assert_eq!(streamer.hits(), 2);
}

#[tokio::test]
async fn a_2mb_chunked_request_body_reaches_the_backend_intact() {
    let counter = counting_backend().await;
    let (balancer, _rx) = start(&config_text(&[counter.entry("counter")], "", QUIET)).await;
    let body = pattern(2 * 1024 * 1024);
    let mut request =
        b"POST /upload HTTP/1.1\r\nHost: app.test\r\nTransfer-Encoding: chunked\r\nConnection: close\r\n\r\n"
            .to_vec();
    for chunk in body.chunks(50_000) {
        request.extend_from_slice(format!("{:x}\r\n", chunk.len()).as_bytes());
        request.extend_from_slice(chunk);
        request.extend_from_slice(b"\r\n");
    }
    request.extend_from_slice(b"0\r\n\r\n");
    let addr = balancer.local_addrs()[0];
    let response = raw_roundtrip(addr, &request).await;
    let text = String::from_utf8_lossy(&response);
    assert_eq!(status_of(&response), Some(200), "{text}");
    let expected = format!("{} {:x}", body.len(), fnv(&body));
    assert!(text.ends_with(&expected), "{text}");
    assert_eq!(counter.hits(), 1);
}

#[tokio::test]
async fn expect_100_continue_gets_the_interim_answer_then_the_body_goes_through() {
    let counter = counting_backend().await;
    let (balancer, _rx) = start(&config_text(&[counter.entry("counter")], "", QUIET)).await;
    let mut client = TcpStream::connect(balancer.local_addrs()[0])
        .await
        .expect("connect");
    client
        .write_all(
            b"POST /u HTTP/1.1\r\nHost: app.test\r\nContent-Length: 5\r\n\
              Expect: 100-continue\r\n\r\n",
        )
        .await
        .unwrap();
    // Like curl, the client holds its body back until told to go on.
    let mut buf = Vec::new();
    let interim = tokio::time::timeout(DEADLINE, read_head(&mut client, &mut buf))
        .await
        .expect("an interim answer in time")
        .expect("a head");
    assert!(interim.starts_with("HTTP/1.1 100"), "{interim}");
    client.write_all(b"hello").await.unwrap();
    let head = tokio::time::timeout(DEADLINE, read_head(&mut client, &mut buf))
        .await
        .expect("a final answer in time")
        .expect("a head");
    assert!(head.starts_with("HTTP/1.1 200"), "{head}");
    let body = read_body(&mut client, &mut buf, &head).await.expect("body");
    assert_eq!(body, format!("5 {:x}", fnv(b"hello")).as_bytes());
}

// ---- 8. Routing ------------------------------------------------------------------------------

#[tokio::test]
async fn routes_match_host_then_path_prefix_first_match_wins_else_404() {
    let api = SimBackend::start("api1", any()).await.unwrap();
    let stat = SimBackend::start("static1", any()).await.unwrap();
    let text = format!(
        r#"
[[listeners]]
address = "127.0.0.1:0"

  [[listeners.routes]]
  host = "api.test"
  pool = "api"

  [[listeners.routes]]
  path_prefix = "/static"
  pool = "static"

[pools.api]
backends = [{{ name = "api1", address = "{}" }}]
[pools.api.active]
kind = "none"

[pools.static]
backends = [{{ name = "static1", address = "{}" }}]
[pools.static.active]
kind = "none"
"#,
        api.addr(),
        stat.addr()
    );
    let (balancer, _rx) = start(&text).await;
    let mut client = Client::strict(balancer.local_addrs()[0]);
    let cases: [(&str, &str, u16, Option<&str>); 7] = [
        ("api.test", "/v1/users", 200, Some("api1")),
        // Both routes match; the first one listed wins.
        ("api.test", "/static/app.js", 200, Some("api1")),
        // Host is compared without case and port.
        ("API.Test:8080", "/x", 200, Some("api1")),
        ("www.test", "/static/app.js", 200, Some("static1")),
        ("www.test", "/static", 200, Some("static1")),
        ("www.test", "/other", 404, None),
        ("www.test", "/", 404, None),
    ];
    for (host, path, status, backend) in cases {
        let answer = client.send("GET", path, host, Bytes::new()).await;
        assert_eq!(answer.status, status, "{host} {path}");
        assert_eq!(answer.backend.as_deref(), backend, "{host} {path}");
    }
    assert_eq!(api.traffic_hits(), 3);
    assert_eq!(stat.traffic_hits(), 2);
}

// ---- 9. Least request ------------------------------------------------------------------------

#[tokio::test]
async fn least_request_sends_most_traffic_to_the_fast_backend() {
    let b = backends(&["slow", "fast"]).await;
    b[0].set_traffic(Mode::Delay(Duration::from_millis(100), 200));
    let extra = format!("algorithm = \"least_request\"\n{QUIET}");
    let (balancer, _rx) = start(&config_text(&sims(&b), "", &extra)).await;
    let addr = balancer.local_addrs()[0];
    let mut tasks = Vec::new();
    for _ in 0..8 {
        tasks.push(tokio::spawn(async move {
            let mut client = Client::strict(addr);
            for _ in 0..50 {
                assert_eq!(client.get("/").await.status, 200);
            }
        }));
    }
    for task in tasks {
        task.await.expect("client task");
    }
    let (slow, fast) = (b[0].traffic_hits(), b[1].traffic_hits());
    assert_eq!(slow + fast, 400);
    // Round robin would give each 200.
    assert!(slow * 5 < slow + fast, "slow {slow}, fast {fast}");
}
