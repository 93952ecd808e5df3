//! Sections 5 and 6: the client connection: HTTP/1.0, `Connection: close`, half-close,
//! keep-alive, the head and idle timeouts, and oversized heads.

use super::*;
use crate::support::wait::wait_until;

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
    until_closed_since(stream, tokio::time::Instant::now()).await
}

/// As [`until_closed`], the time counted from `start`. A lower bound on when the balancer
/// closes (a timeout) must count from before the balancer's timer starts (the connect, the
/// request), not from when the test got round to reading: on a loaded machine the test may
/// look 100 ms after the timer started, and the close then seems early.
async fn until_closed_since(
    stream: &mut TcpStream,
    start: tokio::time::Instant,
) -> (Duration, Vec<u8>) {
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
    let connecting = tokio::time::Instant::now();
    let mut stream = TcpStream::connect(balancer.local_addrs()[0]).await.unwrap();
    stream
        .write_all(b"GET / HTTP/1.1\r\nHost: a\r\n")
        .await
        .unwrap();
    let (took, got) = until_closed_since(&mut stream, connecting).await;
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
    let connecting = tokio::time::Instant::now();
    let mut silent = TcpStream::connect(balancer.local_addrs()[0]).await.unwrap();
    let silent = tokio::spawn(async move { until_closed_since(&mut silent, connecting).await });
    let mut stream = TcpStream::connect(balancer.local_addrs()[0]).await.unwrap();
    let sent = tokio::time::Instant::now();
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
    let (took, got) = until_closed_since(&mut stream, sent).await;
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

// ---- Parking: a quiet keep-alive connection without hyper's state --------------------------

/// A watcher period of 50 ms (a quarter of the head timeout): a connection quiet after a
/// request parks within about 100 ms.
pub(super) const PARKING: &str = "header_read_timeout = \"200ms\"\nidle_timeout = \"30s\"";

/// A POST of `body` to the counting backend, as bytes.
pub(super) fn post(path: &str, body: &[u8]) -> Vec<u8> {
    let mut request = format!(
        "POST {path} HTTP/1.1\r\nHost: app.test\r\nContent-Length: {}\r\n\r\n",
        body.len()
    )
    .into_bytes();
    request.extend_from_slice(body);
    request
}

/// Reads one answer of the counting backend: its `<length> <fnv>` text.
pub(super) async fn counted(stream: &mut TcpStream, buf: &mut Vec<u8>) -> String {
    let head = read_head(stream, buf).await.expect("an answer");
    assert!(head.starts_with("HTTP/1.1 200"), "{head}");
    assert!(!has_token(&head, "connection", "close"), "{head}");
    let body = read_body(stream, buf, &head).await.expect("its body");
    String::from_utf8(body).expect("text")
}

pub(super) fn expected(body: &[u8]) -> String {
    format!("{} {:x}", body.len(), fnv(body))
}

#[tokio::test]
async fn a_parked_connection_serves_its_next_requests_byte_exact_pipelined_too() {
    let backend = counting_backend().await;
    let (balancer, _rx) = start(&config_text(&[backend.entry("c")], PARKING, QUIET)).await;
    let mut stream = TcpStream::connect(balancer.local_addrs()[0]).await.unwrap();
    let mut buf = Vec::new();
    let first = pattern(20_000);
    stream.write_all(&post("/1", &first)).await.unwrap();
    assert_eq!(counted(&mut stream, &mut buf).await, expected(&first));
    wait_until("the quiet connection parks", || {
        balancer.parked_connections() == 1
    })
    .await;
    // Three requests in one write, the middle one with a body larger than any buffer: the
    // parked connection's first read takes part of them, hyper the rest.
    let (a, b, c) = (pattern(10), pattern(300_000), pattern(0));
    let mut burst = post("/a", &a);
    burst.extend(post("/b", &b));
    burst.extend(post("/c", &c));
    stream.write_all(&burst).await.unwrap();
    assert_eq!(counted(&mut stream, &mut buf).await, expected(&a));
    assert_eq!(counted(&mut stream, &mut buf).await, expected(&b));
    assert_eq!(counted(&mut stream, &mut buf).await, expected(&c));
    assert!(buf.is_empty(), "nothing more: {buf:?}");
    // Quiet again: parked again, and served again.
    wait_until("parked a second time", || balancer.parks() >= 2).await;
    assert_eq!(balancer.parked_connections(), 1);
    stream.write_all(&post("/d", &first)).await.unwrap();
    assert_eq!(counted(&mut stream, &mut buf).await, expected(&first));
    assert_eq!(backend.hits(), 5);
    assert_eq!(backend.accepted(), 1, "one backend connection for them all");
    assert_eq!(balancer.open_connections(), 1);
}

#[tokio::test]
async fn bytes_read_ahead_of_a_parked_connection_are_kept() {
    let backend = counting_backend().await;
    // The half head held is a head arriving, timed by `header_read_timeout` once parked: 2 s
    // (a watcher period of 500 ms), for the test's second write to arrive well within it.
    let listener = "header_read_timeout = \"2s\"\nidle_timeout = \"30s\"";
    let (balancer, _rx) = start(&config_text(&[backend.entry("c")], listener, QUIET)).await;
    let mut stream = TcpStream::connect(balancer.local_addrs()[0]).await.unwrap();
    let mut buf = Vec::new();
    // A request and the first half of the next one's head, in one write: hyper reads both,
    // answers the first, and holds the half head when the connection parks.
    let next = post("/2", b"second");
    let mut write = post("/1", b"first");
    write.extend_from_slice(&next[..20]);
    stream.write_all(&write).await.unwrap();
    assert_eq!(counted(&mut stream, &mut buf).await, expected(b"first"));
    wait_until("the connection parks", || balancer.parks() >= 1).await;
    stream.write_all(&next[20..]).await.unwrap();
    assert_eq!(counted(&mut stream, &mut buf).await, expected(b"second"));
    assert_eq!(backend.hits(), 2);
}

#[tokio::test]
async fn a_parked_connection_is_closed_at_idle_timeout_and_by_a_client_close() {
    let backend = counting_backend().await;
    let (balancer, _rx) = start(&config_text(&[backend.entry("c")], TIMEOUTS, QUIET)).await;
    let mut stream = TcpStream::connect(balancer.local_addrs()[0]).await.unwrap();
    let mut buf = Vec::new();
    let sent = tokio::time::Instant::now();
    stream.write_all(&post("/1", b"x")).await.unwrap();
    assert_eq!(counted(&mut stream, &mut buf).await, expected(b"x"));
    let (took, got) = until_closed_since(&mut stream, sent).await;
    // Parked within the idle time (checked every 50 ms), closed at the idle timeout all the same.
    assert!(balancer.parks() >= 1, "the connection parked first");
    assert!(took >= Duration::from_millis(1400), "closed after {took:?}");
    assert!(got.is_empty(), "{}", String::from_utf8_lossy(&got));
    wait_until("the connection is gone", || {
        balancer.open_connections() == 0 && balancer.parked_connections() == 0
    })
    .await;

    // A parked connection whose client closes ends at once.
    let mut stream = TcpStream::connect(balancer.local_addrs()[0]).await.unwrap();
    stream.write_all(&post("/2", b"y")).await.unwrap();
    assert_eq!(counted(&mut stream, &mut buf).await, expected(b"y"));
    wait_until("parked", || balancer.parked_connections() == 1).await;
    drop(stream);
    wait_until("the closed connection is gone", || {
        balancer.open_connections() == 0 && balancer.parked_connections() == 0
    })
    .await;
}

// ---- Parking under hostile or unusual clients ----------------------------------------------

/// `PARKING` with a 1 KB head limit, for the oversized heads.
const PARKING_SMALL_HEADS: &str =
    "header_read_timeout = \"200ms\"\nidle_timeout = \"30s\"\nmax_header_bytes = 1024";

/// A connection that served one request and then parked (the balancer's park count grew).
async fn parked_connection(balancer: &capataz::server::Balancer) -> TcpStream {
    let parks = balancer.parks();
    let mut stream = TcpStream::connect(balancer.local_addrs()[0]).await.unwrap();
    let mut buf = Vec::new();
    stream.write_all(&post("/warm", b"w")).await.unwrap();
    assert_eq!(counted(&mut stream, &mut buf).await, expected(b"w"));
    assert!(buf.is_empty());
    wait_until("the connection parks", || balancer.parks() > parks).await;
    stream
}

/// What the client read until the balancer closed, without the `Date` header (the one part
/// that may differ between two answers).
async fn answer_until_closed(stream: &mut TcpStream) -> String {
    let (_, got) = until_closed(stream).await;
    String::from_utf8_lossy(&got)
        .split("\r\n")
        .filter(|line| !line.to_ascii_lowercase().starts_with("date:"))
        .collect::<Vec<_>>()
        .join("\r\n")
}

/// Each request that ends its connection gets, on a parked connection, exactly the answer it
/// gets on a fresh one: HTTP/1.0, `Connection: close`, a request then a half-close (FIN), an
/// oversized head (431), a malformed one (400).
#[tokio::test]
async fn after_a_park_closing_requests_get_the_answer_of_a_fresh_connection() {
    let backend = counting_backend().await;
    let (balancer, _rx) = start(&config_text(
        &[backend.entry("c")],
        PARKING_SMALL_HEADS,
        QUIET,
    ))
    .await;
    let big = format!(
        "GET / HTTP/1.1\r\nHost: app.test\r\nX-Big: {}\r\n\r\n",
        "y".repeat(4000)
    );
    let cases: Vec<(&str, Vec<u8>, bool)> = vec![
        (
            "HTTP/1.0",
            b"POST /old HTTP/1.0\r\nContent-Length: 3\r\n\r\nold".to_vec(),
            false,
        ),
        (
            "Connection: close",
            b"GET /c HTTP/1.1\r\nHost: app.test\r\nConnection: close\r\n\r\n".to_vec(),
            false,
        ),
        ("half-close", post("/fin", b"then FIN"), true),
        ("oversized head", big.into_bytes(), false),
        (
            "malformed head",
            b"GET / HTTP/1.1\r\nHost app.test\r\n\r\n".to_vec(),
            false,
        ),
    ];
    let mut kept = Vec::new();
    for (what, request, fin) in cases {
        let mut answers = Vec::new();
        for parked in [false, true] {
            let mut stream = if parked {
                parked_connection(&balancer).await
            } else {
                TcpStream::connect(balancer.local_addrs()[0]).await.unwrap()
            };
            stream.write_all(&request).await.unwrap();
            if fin {
                stream.shutdown().await.unwrap();
            }
            if what == "oversized head" {
                // capataz measures a head under hyper's smallest buffer itself: a 431 on a
                // connection that goes on.
                let mut buf = Vec::new();
                let head = read_head(&mut stream, &mut buf).await.expect("an answer");
                let body = read_body(&mut stream, &mut buf, &head)
                    .await
                    .expect("its body");
                let head: Vec<_> = head
                    .split("\r\n")
                    .filter(|line| !line.to_ascii_lowercase().starts_with("date:"))
                    .collect();
                answers.push(format!(
                    "{}\r\n\r\n{}",
                    head.join("\r\n"),
                    String::from_utf8_lossy(&body)
                ));
                kept.push(stream);
            } else {
                answers.push(answer_until_closed(&mut stream).await);
            }
        }
        assert!(answers[0].starts_with("HTTP/1."), "{what}: {}", answers[0]);
        if what == "oversized head" {
            assert!(answers[0].starts_with("HTTP/1.1 431"), "{}", answers[0]);
        }
        assert_eq!(answers[0], answers[1], "{what}: fresh, then parked");
    }
    drop(kept);
    wait_until("every connection is gone", || {
        balancer.open_connections() == 0 && balancer.parked_connections() == 0
    })
    .await;
}

/// `Expect: 100-continue` and a chunked body sent slowly, on a parked connection: the same
/// interim answer and final answer as on a fresh one, and the connection goes on.
#[tokio::test]
async fn after_a_park_expect_continue_and_a_slow_chunked_body_are_served() {
    let backend = counting_backend().await;
    let (balancer, _rx) = start(&config_text(&[backend.entry("c")], PARKING, QUIET)).await;
    let body = pattern(5000);
    let mut kept = Vec::new();
    for parked in [false, true] {
        let mut stream = if parked {
            parked_connection(&balancer).await
        } else {
            TcpStream::connect(balancer.local_addrs()[0]).await.unwrap()
        };
        let mut buf = Vec::new();
        stream
            .write_all(
                format!(
                    "POST /e HTTP/1.1\r\nHost: app.test\r\nExpect: 100-continue\r\n\
                     Content-Length: {}\r\n\r\n",
                    body.len()
                )
                .as_bytes(),
            )
            .await
            .unwrap();
        let interim = read_head(&mut stream, &mut buf)
            .await
            .expect("100 Continue");
        assert!(
            interim.starts_with("HTTP/1.1 100"),
            "parked {parked}: {interim}"
        );
        stream.write_all(&body).await.unwrap();
        assert_eq!(counted(&mut stream, &mut buf).await, expected(&body));
        // A chunked body in pieces, each after the balancer read the one before (no fixed
        // sleep: the answer needs them all).
        stream
            .write_all(
                b"POST /chunked HTTP/1.1\r\nHost: app.test\r\nTransfer-Encoding: chunked\r\n\r\n",
            )
            .await
            .unwrap();
        for piece in body.chunks(1000) {
            stream
                .write_all(format!("{:x}\r\n", piece.len()).as_bytes())
                .await
                .unwrap();
            stream.write_all(piece).await.unwrap();
            stream.write_all(b"\r\n").await.unwrap();
            tokio::task::yield_now().await;
        }
        stream.write_all(b"0\r\n\r\n").await.unwrap();
        assert_eq!(counted(&mut stream, &mut buf).await, expected(&body));
        kept.push(stream);
    }
    assert_eq!(balancer.open_connections(), 2);
}

/// A slow-loris head on a parked connection is closed by `header_read_timeout`, as on a fresh
/// one, not left to the (30 s) idle timeout.
#[tokio::test]
async fn a_slow_head_after_a_park_is_closed_by_header_read_timeout() {
    let backend = counting_backend().await;
    let (balancer, _rx) = start(&config_text(&[backend.entry("c")], PARKING, QUIET)).await;
    let mut stream = parked_connection(&balancer).await;
    stream
        .write_all(b"GET / HTTP/1.1\r\nHost: a")
        .await
        .unwrap();
    let (took, got) = until_closed(&mut stream).await;
    assert!(took < Duration::from_secs(5), "closed after {took:?}");
    assert!(got.is_empty(), "{}", String::from_utf8_lossy(&got));
    wait_until("the connection is gone", || {
        balancer.open_connections() == 0
    })
    .await;
}

/// A slow-loris head whose first bytes came in the same write as the request before it (hyper
/// read them ahead, and the connection parks holding them) is still timed by
/// `header_read_timeout`: the held bytes are a head arriving, not a quiet connection.
#[tokio::test]
async fn a_slow_head_read_ahead_before_a_park_is_closed_by_header_read_timeout() {
    let backend = counting_backend().await;
    let (balancer, _rx) = start(&config_text(&[backend.entry("c")], PARKING, QUIET)).await;
    let mut stream = TcpStream::connect(balancer.local_addrs()[0]).await.unwrap();
    let mut buf = Vec::new();
    let mut write = post("/1", b"first");
    write.extend_from_slice(b"GET /slow HTTP/1.1\r\nHost: a");
    stream.write_all(&write).await.unwrap();
    assert_eq!(counted(&mut stream, &mut buf).await, expected(b"first"));
    let (took, got) = until_closed(&mut stream).await;
    assert!(took < Duration::from_secs(5), "closed after {took:?}");
    assert!(got.is_empty(), "{}", String::from_utf8_lossy(&got));
    assert_eq!(backend.hits(), 1);
    // Parked once, holding the half head; not again with a head arriving.
    assert_eq!(balancer.parks(), 1);
}

/// A balancer's shutdown closes a parked connection promptly (the drain's idle grace, 1 s),
/// and counts it closed.
#[tokio::test]
async fn shutdown_closes_a_parked_connection_promptly() {
    let backend = counting_backend().await;
    let (balancer, _rx) = start(&config_text(&[backend.entry("c")], PARKING, QUIET)).await;
    let mut stream = parked_connection(&balancer).await;
    assert_eq!(balancer.parked_connections(), 1);
    let started = tokio::time::Instant::now();
    let shutdown = tokio::spawn(balancer.shutdown(Duration::from_secs(15)));
    let (took, got) = until_closed(&mut stream).await;
    assert!(got.is_empty(), "{}", String::from_utf8_lossy(&got));
    assert!(took < Duration::from_secs(4), "closed after {took:?}");
    tokio::time::timeout(DEADLINE, shutdown)
        .await
        .expect("shutdown ends")
        .unwrap();
    assert!(
        started.elapsed() < Duration::from_secs(6),
        "shutdown took {:?} (its open connections counted closed)",
        started.elapsed()
    );
}

/// The value of the (one) metric line of `family` with labels, if present.
fn metric(balancer: &capataz::server::Balancer, family: &str) -> Option<f64> {
    let text = crate::support::balancer::metrics_text(balancer);
    text.lines()
        .find(|line| line.starts_with(&format!("{family}{{")))
        .and_then(|line| line.rsplit(' ').next()?.parse().ok())
}

/// Requests sent at every delay around the moment the connection parks (the watcher looks
/// every 50 ms, a connection quiet for a look parks at the next): some arrive while the task
/// is asked to park or taking hyper apart, some right after. Every answer is byte exact, on
/// the one connection, and the byte counters match what went each way once it closes.
#[tokio::test]
async fn requests_racing_the_park_are_all_served_and_bytes_counted() {
    let backend = counting_backend().await;
    let (balancer, _rx) = start(&config_text(&[backend.entry("c")], PARKING, QUIET)).await;
    let mut stream = TcpStream::connect(balancer.local_addrs()[0]).await.unwrap();
    let mut buf = Vec::new();
    let (mut sent, mut received) = (0usize, 0usize);
    let mut requests = 0;
    for step in 0..60u64 {
        let body = pattern(100 + step as usize * 37);
        let request = post(&format!("/{step}"), &body);
        // Split in two writes a step apart: a head can straddle the park too.
        let cut = (step as usize * 7) % request.len();
        stream.write_all(&request[..cut]).await.unwrap();
        if step % 3 == 0 {
            tokio::task::yield_now().await;
        }
        stream.write_all(&request[cut..]).await.unwrap();
        sent += request.len();
        let before = buf.len();
        let head = read_head(&mut stream, &mut buf).await.expect("an answer");
        assert!(head.starts_with("HTTP/1.1 200"), "step {step}: {head}");
        let answer = read_body(&mut stream, &mut buf, &head)
            .await
            .expect("its body");
        assert_eq!(
            String::from_utf8(answer.clone()).unwrap(),
            expected(&body),
            "step {step}"
        );
        assert!(buf.is_empty() && before == 0);
        received += head.len() + 4 + answer.len();
        requests += 1;
        // The time the feature works on: a delay from 0 to about 120 ms, around the park.
        tokio::time::sleep(Duration::from_millis(step * 2)).await;
    }
    assert_eq!(backend.hits(), requests);
    assert!(balancer.parks() >= 10, "parked {} times", balancer.parks());
    assert_eq!(balancer.open_connections(), 1);
    drop(stream);
    wait_until("the connection is gone", || {
        balancer.open_connections() == 0 && balancer.parked_connections() == 0
    })
    .await;
    assert_eq!(
        metric(&balancer, "capataz_client_received_bytes_total"),
        Some(sent as f64)
    );
    assert_eq!(
        metric(&balancer, "capataz_client_sent_bytes_total"),
        Some(received as f64)
    );
}

/// The sum of `family`'s series whose labels hold every one of `labels`.
fn metric_sum(balancer: &capataz::server::Balancer, family: &str, labels: &[&str]) -> f64 {
    let text = crate::support::balancer::metrics_text(balancer);
    text.lines()
        .filter(|line| line.starts_with(&format!("{family}{{")))
        .filter(|line| labels.iter().all(|label| line.contains(label)))
        .filter_map(|line| line.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

/// A head over hyper's own limit after a park is refused by hyper as on a fresh connection:
/// the connection closes, nothing reaches the backend, and the refusal is counted once each.
#[tokio::test]
async fn a_head_over_hypers_limit_after_a_park_is_refused_and_counted() {
    let backend = counting_backend().await;
    let (balancer, _rx) = start(&config_text(
        &[backend.entry("c")],
        "header_read_timeout = \"200ms\"\nidle_timeout = \"30s\"\nmax_header_bytes = 8192",
        QUIET,
    ))
    .await;
    let big = format!(
        "GET / HTTP/1.1\r\nHost: app.test\r\nX-Big: {}\r\n\r\n",
        "x".repeat(20 * 1024)
    );
    let refused = || {
        metric_sum(
            &balancer,
            "capataz_client_requests_total",
            &["answered_by=\"capataz\"", "class=\"4xx\""],
        )
    };
    for (round, parked) in [false, true].into_iter().enumerate() {
        let mut stream = if parked {
            parked_connection(&balancer).await
        } else {
            TcpStream::connect(balancer.local_addrs()[0]).await.unwrap()
        };
        // The balancer may close before reading it all (a reset): the write may fail.
        let _ = stream.write_all(big.as_bytes()).await;
        let (_, got) = until_closed(&mut stream).await;
        if !got.is_empty() {
            assert_eq!(
                status_of(&got),
                Some(431),
                "{}",
                String::from_utf8_lossy(&got)
            );
        }
        wait_until("the refusal is counted", || refused() == (round + 1) as f64).await;
    }
    assert_eq!(backend.hits(), 1, "only the warm-up request");
    wait_until("every connection is gone", || {
        balancer.open_connections() == 0 && balancer.parked_connections() == 0
    })
    .await;
}

/// A keep-alive backend that answers `GET /size/N` with N bytes of [`pattern`].
async fn sized_backend() -> RawBackend {
    RawBackend::start(|mut stream, hits| async move {
        let mut buf = Vec::new();
        while let Some(head) = read_head(&mut stream, &mut buf).await {
            hits.fetch_add(1, Ordering::SeqCst);
            let len: usize = head
                .split_whitespace()
                .nth(1)
                .and_then(|path| path.strip_prefix("/size/"))
                .and_then(|n| n.parse().ok())
                .unwrap_or(0);
            let mut response =
                format!("HTTP/1.1 200 OK\r\nContent-Length: {len}\r\n\r\n").into_bytes();
            response.extend(pattern(len));
            if stream.write_all(&response).await.is_err() {
                return;
            }
        }
    })
    .await
}

/// Forty requests in one write, answers small (held for the end of the runtime's turn, see
/// `outbox`) and large (written at once), to a client that reads nothing until the backend has
/// seen several: what the client's socket would not take waits and goes later, and every
/// answer arrives whole, in order, byte for byte.
#[tokio::test]
async fn pipelined_answers_to_a_client_that_reads_late_arrive_whole_and_in_order() {
    let backend = sized_backend().await;
    let (balancer, _rx) = start(&config_text(&[backend.entry("s")], "", QUIET)).await;
    let mut stream = TcpStream::connect(balancer.local_addrs()[0]).await.unwrap();
    let sizes: Vec<usize> = (0..40)
        .map(|i| if i % 3 == 1 { 300_000 } else { 50 + i })
        .collect();
    let mut burst = Vec::new();
    for size in &sizes {
        burst.extend(format!("GET /size/{size} HTTP/1.1\r\nHost: app.test\r\n\r\n").as_bytes());
    }
    stream.write_all(&burst).await.unwrap();
    wait_until("the backend has answered several", || backend.hits() >= 5).await;
    let mut buf = Vec::new();
    for (i, size) in sizes.iter().enumerate() {
        let head = read_head(&mut stream, &mut buf).await.expect("an answer");
        assert!(head.starts_with("HTTP/1.1 200"), "answer {i}: {head}");
        let body = read_body(&mut stream, &mut buf, &head)
            .await
            .expect("its body");
        assert_eq!(body.len(), *size, "answer {i}");
        assert!(body == pattern(*size), "answer {i}: byte for byte");
    }
    assert!(buf.is_empty(), "nothing more");
    assert_eq!(backend.hits(), 40);
}

/// A request answered, then (in the same write) HTTP/2's preface where the next HTTP/1 head
/// should be: hyper ends the connection with an error, with no shutdown after the answer it
/// wrote (held for the end of the turn, `outbox`). The answer still arrives whole, then the
/// end.
#[tokio::test]
async fn an_answer_followed_by_a_connection_error_still_arrives_whole() {
    let backend = sized_backend().await;
    let (balancer, _rx) = start(&config_text(&[backend.entry("s")], "", QUIET)).await;
    let mut stream = TcpStream::connect(balancer.local_addrs()[0]).await.unwrap();
    stream
        .write_all(
            b"GET /size/100 HTTP/1.1\r\nHost: app.test\r\n\r\nPRI * HTTP/2.0\r\n\r\nSM\r\n\r\n",
        )
        .await
        .unwrap();
    let mut buf = Vec::new();
    let head = tokio::time::timeout(DEADLINE, read_head(&mut stream, &mut buf))
        .await
        .expect("in time")
        .expect("the first request's answer");
    assert!(head.starts_with("HTTP/1.1 200"), "{head}");
    let body = read_body(&mut stream, &mut buf, &head)
        .await
        .expect("its body");
    assert!(body == pattern(100), "byte for byte");
    assert_eq!(backend.hits(), 1);
}
