//! `protocol = "h2c"` and `"h2"` pools: hyper HTTP/2 servers as backends. Many concurrent
//! requests multiplexed on one connection, HTTP/2 over TLS chosen by ALPN, a GOAWAY in the
//! middle of traffic (the requests it cut go elsewhere, the next ones to a new connection), a
//! stream the backend resets (a passive error, 502 before a head), and trailers relayed to an
//! HTTP/1.1 client that asked for them.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use bytes::Bytes;
use capataz::server::Balancer;
use capataz_health::{Outcome, State};
use http_body_util::{BodyExt, Full};
use hyper_util::rt::TokioIo;

use crate::support::backends_tls::{HttpBackend, Pki, Reply, Script, Speaks};
use crate::support::balancer::{start, ConfigText};
use crate::support::client::Client;
use crate::support::events::{transition_of, wait_for};
use crate::support::DEADLINE;

fn hello() -> Script {
    Arc::new(|_| Reply::text("hello"))
}

const QUIET_H2C: &str = r#"
protocol = "h2c"
active.kind = "none"
passive.consecutive_errors = 1000
"#;

#[tokio::test]
async fn h2c_multiplexes_concurrent_requests_on_one_connection() {
    let backend = HttpBackend::start("b", Speaks::H2, None, hello()).await;
    let text = ConfigText::new(&[backend.entry()]).extra(QUIET_H2C).build();
    let (balancer, _events) = start(&text).await;
    let addr = balancer.local_addrs()[0];
    let mut tasks = Vec::new();
    for _ in 0..50 {
        tasks.push(tokio::spawn(async move {
            let mut client = Client::strict(addr);
            let mut statuses = Vec::new();
            for _ in 0..4 {
                let answer = client.get("/").await;
                statuses.push((answer.status, answer.text()));
            }
            statuses
        }));
    }
    for task in tasks {
        for (status, text) in task.await.expect("client task") {
            assert_eq!((status, text.as_str()), (200, "hello"));
        }
    }
    assert_eq!(backend.hits(), 200);
    assert_eq!(backend.accepted(), 1, "every stream on one connection");
    balancer.shutdown(DEADLINE).await;
}

#[tokio::test]
async fn h2_over_tls_is_agreed_by_alpn() {
    let pki = Pki::new("h2");
    let backend = HttpBackend::start(
        "b",
        Speaks::H2,
        Some(pki.server(&["127.0.0.1"], &[b"h2"])),
        hello(),
    )
    .await;
    let text = ConfigText::new(&[backend.entry()])
        .extra(&format!(
            "protocol = \"h2\"\nactive.kind = \"none\"\ntls.ca_file = \"{}\"\n",
            pki.ca_file()
        ))
        .build();
    let (balancer, _events) = start(&text).await;
    let mut client = Client::new(balancer.local_addrs()[0]);
    for _ in 0..5 {
        let answer = client.get("/").await;
        assert_eq!((answer.status, answer.text().as_str()), (200, "hello"));
    }
    assert_eq!(backend.accepted(), 1);
    balancer.shutdown(DEADLINE).await;
}

#[tokio::test]
async fn a_tls_backend_that_does_not_agree_to_h2_is_a_tls_failure() {
    let pki = Pki::new("no-h2");
    // Offers HTTP/1.1 only: the ALPN negotiation fails.
    let backend = HttpBackend::start(
        "b",
        Speaks::Http1,
        Some(pki.server(&["127.0.0.1"], &[b"http/1.1"])),
        hello(),
    )
    .await;
    let text = ConfigText::new(&[backend.entry()])
        .extra(&format!(
            "protocol = \"h2\"\nactive.kind = \"none\"\ntls.ca_file = \"{}\"\nretries.attempts = 0\n",
            pki.ca_file()
        ))
        .build();
    let (balancer, _events) = start(&text).await;
    let answer = Client::new(balancer.local_addrs()[0]).get("/").await;
    assert_eq!(answer.status, 502);
    let pool = balancer.pool("web").expect("pool");
    assert_eq!(pool.backends[0].traffic.recent(), vec![Outcome::Tls]);
    balancer.shutdown(DEADLINE).await;
}

#[tokio::test]
async fn a_goaway_mid_traffic_loses_no_request() {
    let a = HttpBackend::start("a", Speaks::H2, None, hello()).await;
    let b = HttpBackend::start("b", Speaks::H2, None, hello()).await;
    let text = ConfigText::new(&[a.entry(), b.entry()])
        .extra(&format!("{QUIET_H2C}retries.min_budget = 1000\n"))
        .build();
    let (balancer, _events) = start(&text).await;
    let addr = balancer.local_addrs()[0];
    let mut tasks = Vec::new();
    for _ in 0..20 {
        tasks.push(tokio::spawn(async move {
            let mut client = Client::strict(addr);
            let mut statuses = Vec::new();
            for _ in 0..20 {
                statuses.push(client.get("/").await.status);
            }
            statuses
        }));
    }
    // Once traffic flows on both, `a` sends GOAWAY on its connection.
    crate::support::wait::wait_until("traffic on a", || a.hits() >= 20).await;
    a.go_away();
    for task in tasks {
        for status in task.await.expect("client task") {
            assert_eq!(status, 200);
        }
    }
    // Later requests to `a` went over a new connection.
    let mut client = Client::new(addr);
    for _ in 0..4 {
        assert_eq!(client.get("/").await.status, 200);
    }
    assert!(a.accepted() >= 2, "a reconnected after its GOAWAY");
    balancer.shutdown(DEADLINE).await;
}

/// An h2c backend that does what nginx does after `keepalive_requests`, frame by frame: it
/// answers the first `limit` streams of a connection (`200`, `hello`), then sends GOAWAY with
/// `NO_ERROR` naming the last of them, so that the streams the client opened meanwhile are
/// refused unprocessed; it keeps reading (and ignoring) until the client closes, as nginx's
/// lingering close does. Returns its address and how many connections it accepted.
async fn closes_after(limit: usize) -> (std::net::SocketAddr, Arc<AtomicU64>) {
    use crate::support::h2frames::{self as f, read_frame};
    use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let addr = listener.local_addr().expect("address");
    let accepted = Arc::new(AtomicU64::new(0));
    let counted = accepted.clone();
    tokio::spawn(async move {
        while let Ok((socket, _)) = listener.accept().await {
            counted.fetch_add(1, Ordering::Relaxed);
            tokio::spawn(async move {
                let (mut read, mut write) = socket.into_split();
                let mut preface = [0u8; 24];
                if read.read_exact(&mut preface).await.is_err() || preface != f::PREFACE {
                    return;
                }
                let _ = write.write_all(&f::settings(&[])).await;
                let mut answered = 0;
                while let Some(frame) = read_frame(&mut read).await {
                    let reply = match frame.kind {
                        f::SETTINGS if frame.flags & f::ACK == 0 => f::settings_ack(),
                        f::PING if frame.flags & f::ACK == 0 => {
                            f::frame(f::PING, f::ACK, 0, &frame.payload)
                        }
                        f::HEADERS if answered < limit => {
                            answered += 1;
                            // `:status: 200` is the static table's entry 8.
                            let mut reply = f::headers(frame.stream, &[0x88], false, true);
                            reply.extend(f::data(frame.stream, b"hello", true));
                            if answered == limit {
                                let mut goaway = frame.stream.to_be_bytes().to_vec();
                                goaway.extend(f::NO_ERROR.to_be_bytes());
                                reply.extend(f::frame(f::GOAWAY, 0, 0, &goaway));
                            }
                            reply
                        }
                        _ => continue,
                    };
                    if write.write_all(&reply).await.is_err() {
                        return;
                    }
                }
            });
        }
    });
    (addr, accepted)
}

/// A pool of one h2c backend that closes each connection gracefully after 100 streams (GOAWAY
/// with `NO_ERROR`, as nginx does after `keepalive_requests`) under 20 concurrent clients: the
/// streams it did not take go to it again on a new connection, every client gets its 200, and
/// nothing is charged to it (one error would eject it here).
#[tokio::test]
async fn a_graceful_goaway_is_no_fault_and_its_streams_go_again_to_the_same_backend() {
    let (addr, accepted) = closes_after(100).await;
    let text = ConfigText::new(&[("a".to_owned(), addr)])
        .extra("protocol = \"h2c\"\nactive.kind = \"none\"\npassive.consecutive_errors = 1\n")
        .build();
    let (balancer, _events) = start(&text).await;
    let listener = balancer.local_addrs()[0];
    let mut tasks = Vec::new();
    for _ in 0..20 {
        tasks.push(tokio::spawn(async move {
            let mut client = Client::strict(listener);
            let mut statuses = Vec::new();
            for _ in 0..20 {
                statuses.push(client.get("/").await.status);
            }
            statuses
        }));
    }
    let mut statuses = Vec::new();
    for task in tasks {
        statuses.extend(task.await.expect("client task"));
    }
    let pool = balancer.pool("web").expect("pool");
    let recent = pool.backends[0].traffic.recent();
    assert!(
        statuses.iter().all(|s| *s == 200),
        "{:?} {recent:?}",
        statuses.iter().filter(|s| **s != 200).count()
    );
    assert!(
        recent.iter().all(|o| *o == Outcome::Status(200)),
        "{recent:?}"
    );
    assert!(
        accepted.load(Ordering::Relaxed) >= 4,
        "400 requests, 100 a connection"
    );
    balancer.shutdown(DEADLINE).await;
}

#[tokio::test]
async fn a_stream_reset_by_the_backend_is_a_passive_error() {
    let resetting = HttpBackend::start(
        "resets",
        Speaks::H2,
        None,
        Arc::new(|parts| {
            if parts.uri.path() == "/late" {
                Reply::ResetAfterHead
            } else {
                Reply::Reset
            }
        }),
    )
    .await;
    let text = ConfigText::new(&[resetting.entry()])
        .extra("protocol = \"h2c\"\nactive.kind = \"none\"\npassive.consecutive_errors = 2\nretries.attempts = 0\n")
        .build();
    let (balancer, mut events) = start(&text).await;
    let mut client = Client::new(balancer.local_addrs()[0]);
    assert_eq!(client.get("/").await.status, 502, "a reset before the head");
    // The head, a piece of body, then the reset: the head may reach capataz first (200, the
    // body cut short) or with the reset (502); either way the passive side hears a reset.
    let late = client.get("/late").await;
    assert!(matches!(late.status, 200 | 502), "{late:?}");
    assert_ne!(
        late.body,
        Bytes::from_static(b"partial"),
        "never a whole-looking body"
    );
    let event = wait_for(&mut events, "the resetting backend ejected", |event| {
        transition_of(event, "resets", State::Down).is_some()
    })
    .await;
    let transition = transition_of(&event, "resets", State::Down).expect("transition");
    assert_eq!(transition.reason.last(), Some(Outcome::Reset));
    balancer.shutdown(DEADLINE).await;
}

/// An HTTP/2 backend answering `payload` with one trailer field `name: value`, a balancer
/// over it, and an HTTP/1.1 client connection to the balancer.
async fn trailer_backend(
    name: &'static str,
    value: &'static str,
) -> (
    HttpBackend,
    Balancer,
    hyper::client::conn::http1::SendRequest<Full<Bytes>>,
) {
    let backend = HttpBackend::start(
        "b",
        Speaks::H2,
        None,
        Arc::new(move |_| {
            let mut trailers = http::HeaderMap::new();
            trailers.insert(name, value.parse().expect("a value"));
            Reply::Ok {
                status: 200,
                headers: vec![("trailer", name.into())],
                body: Bytes::from_static(b"payload"),
                trailers: Some(trailers),
            }
        }),
    )
    .await;
    let text = ConfigText::new(&[backend.entry()]).extra(QUIET_H2C).build();
    let (balancer, _events) = start(&text).await;
    let stream = tokio::net::TcpStream::connect(balancer.local_addrs()[0])
        .await
        .expect("connect");
    let (sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
        .await
        .expect("handshake");
    tokio::spawn(conn);
    (backend, balancer, sender)
}

/// A bodiless request that accepts trailers.
fn te_request() -> http::Request<Full<Bytes>> {
    http::Request::builder()
        .uri("/")
        .header("host", "app.test")
        .header("te", "trailers")
        .body(Full::new(Bytes::new()))
        .expect("request")
}

#[tokio::test]
async fn trailers_are_relayed_to_an_http1_client_that_asks() {
    let (_backend, balancer, mut sender) = trailer_backend("x-checksum", "abc123").await;
    let request = te_request();
    let response = tokio::time::timeout(DEADLINE, sender.send_request(request))
        .await
        .expect("in time")
        .expect("an answer");
    assert_eq!(response.status(), 200);
    let body = response.into_body().collect().await.expect("whole body");
    let trailers = body.trailers().cloned().expect("trailers");
    assert_eq!(
        trailers.get("x-checksum").map(|v| v.as_bytes()),
        Some(&b"abc123"[..])
    );
    assert_eq!(body.to_bytes(), Bytes::from_static(b"payload"));
    balancer.shutdown(DEADLINE).await;
}

/// A trailer section with a field that cannot come after the content is malformed (RFC 9113
/// section 8.1): capataz's HTTP/2 client resets the stream, and the answer is broken, charged
/// to the backend, never relayed with its trailers cut down.
#[tokio::test]
async fn malformed_trailers_from_an_h2_backend_break_its_answer() {
    let (_backend, balancer, mut sender) = trailer_backend("content-length", "7").await;
    let request = te_request();
    let whole = tokio::time::timeout(DEADLINE, async {
        match sender.send_request(request).await {
            Ok(response) => response.into_body().collect().await.is_ok(),
            Err(_) => false,
        }
    })
    .await
    .expect("in time");
    assert!(!whole, "the answer is cut, not ended as if whole");
    let pool = balancer.pool("web").expect("pool");
    crate::support::wait::wait_until("the broken answer judged", || {
        !pool.backends[0].traffic.recent().is_empty()
    })
    .await;
    assert_eq!(pool.backends[0].traffic.recent(), vec![Outcome::Reset]);
    balancer.shutdown(DEADLINE).await;
}

#[tokio::test]
async fn no_head_within_response_header_is_a_timeout() {
    let backend = HttpBackend::start("slow", Speaks::H2, None, Arc::new(|_| Reply::Hang)).await;
    let text = ConfigText::new(&[backend.entry()])
        .extra(&format!(
            "{QUIET_H2C}retries.attempts = 0\ntimeouts.response_header = \"200ms\"\n"
        ))
        .build();
    let (balancer, _events) = start(&text).await;
    let answer = Client::new(balancer.local_addrs()[0]).get("/").await;
    assert_eq!(answer.status, 504);
    let pool = balancer.pool("web").expect("pool");
    assert_eq!(pool.backends[0].traffic.recent(), vec![Outcome::Timeout]);
    balancer.shutdown(DEADLINE).await;
}

#[tokio::test]
async fn a_client_body_that_stalls_is_the_clients_fault() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let backend = HttpBackend::start("b", Speaks::H2, None, hello()).await;
    let text = ConfigText::new(&[backend.entry()])
        .listener("request_body_timeout = \"200ms\"")
        .extra(QUIET_H2C)
        .build();
    let (balancer, _events) = start(&text).await;
    let mut stream = tokio::net::TcpStream::connect(balancer.local_addrs()[0])
        .await
        .expect("connect");
    stream
        .write_all(b"POST /upload HTTP/1.1\r\nHost: app.test\r\nContent-Length: 10\r\n\r\nab")
        .await
        .expect("write");
    let mut reply = Vec::new();
    tokio::time::timeout(DEADLINE, stream.read_to_end(&mut reply))
        .await
        .expect("an answer in time")
        .expect("read");
    let reply = String::from_utf8_lossy(&reply);
    assert!(reply.starts_with("HTTP/1.1 408"), "{reply}");
    let pool = balancer.pool("web").expect("pool");
    assert!(
        pool.backends[0].traffic.recent().is_empty(),
        "nothing charged"
    );
    balancer.shutdown(DEADLINE).await;
}

/// One `h2c` backend connection, requests one at a time: between two of them the connection
/// has no stream, and h2 (patched, `vendor/h2`) frees its read and write buffers. Request heads
/// larger than the read buffer (8 KB; the backend's h2 answers 431 to a head over 16 KB),
/// answer heads larger than both (40 KB: HEADERS and CONTINUATION frames) and bodies larger
/// than both must come through whole both ways, request after request, on that one connection.
#[tokio::test]
async fn h2c_requests_one_at_a_time_larger_than_the_buffers_come_through_whole() {
    let script: Script = Arc::new(|parts| {
        let size: usize = parts.uri.path()[1..].parse().unwrap_or(0);
        let big = parts.headers.get("x-big").map_or(0, |v| v.len());
        Reply::Ok {
            status: 200,
            headers: vec![
                ("x-big-len", big.to_string()),
                ("x-pad", "p".repeat(40_000)),
            ],
            body: Bytes::from((0..size).map(|i| b'a' + (i % 26) as u8).collect::<Vec<_>>()),
            trailers: None,
        }
    });
    let backend = HttpBackend::start("b", Speaks::H2, None, script).await;
    let text = ConfigText::new(&[backend.entry()])
        .listener("max_header_bytes = 65536")
        .extra(QUIET_H2C)
        .build();
    let (balancer, _events) = start(&text).await;
    let mut client = Client::strict(balancer.local_addrs()[0]);
    for round in 0..6usize {
        let size = 100_000 + round;
        let request = http::Request::builder()
            .method("POST")
            .uri(format!("/{size}"))
            .header("host", "app.test")
            .header("x-big", "x".repeat(15_000 + round))
            .body(Bytes::from(vec![b'q'; 50_000]))
            .expect("a request");
        let answer = client.request(request).await;
        assert_eq!(answer.status, 200, "round {round}: {}", answer.text());
        assert_eq!(
            answer.headers.get("x-big-len").map(|v| v.to_str().unwrap()),
            Some((15_000 + round).to_string().as_str()),
            "round {round}"
        );
        assert_eq!(answer.headers.get("x-pad").map(|v| v.len()), Some(40_000));
        let expected: Vec<u8> = (0..size).map(|i| b'a' + (i % 26) as u8).collect();
        assert!(answer.body == expected, "round {round}: the body differs");
        // And a small one in between.
        assert_eq!(client.get("/0").await.status, 200, "round {round}");
    }
    assert_eq!(backend.hits(), 12);
    assert_eq!(
        backend.accepted(),
        1,
        "every request on one backend connection"
    );
    balancer.shutdown(DEADLINE).await;
}

/// Found by review: an HTTP/1.1 client's chunked request may end with a trailer section that
/// HTTP/2 calls malformed (`content-length`, `host`). Relayed as it came to an HTTP/2 backend,
/// the backend's h2 reset the stream (PROTOCOL_ERROR), the client got 502 and the reset was
/// charged to the backend: one client's bytes ejected a healthy backend (`consecutive_errors`
/// such requests). Those fields are left out of forwarded request trailers, as HAProxy does.
#[tokio::test]
async fn malformed_request_trailers_from_an_http1_client_are_not_charged_to_an_h2_backend() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let backend = HttpBackend::start("b", Speaks::H2, None, hello()).await;
    let text = ConfigText::new(&[backend.entry()])
        .extra(&format!("{QUIET_H2C}retries.attempts = 0\n"))
        .build();
    let (balancer, _events) = start(&text).await;
    let mut stream = tokio::net::TcpStream::connect(balancer.local_addrs()[0])
        .await
        .expect("connect");
    stream
        .write_all(
            b"POST /upload HTTP/1.1\r\nHost: app.test\r\nTransfer-Encoding: chunked\r\n\
              Trailer: content-length\r\nConnection: close\r\n\r\n\
              5\r\nhello\r\n0\r\ncontent-length: 5\r\n\r\n",
        )
        .await
        .expect("write");
    let mut reply = Vec::new();
    tokio::time::timeout(DEADLINE, stream.read_to_end(&mut reply))
        .await
        .expect("an answer in time")
        .expect("read");
    let reply = String::from_utf8_lossy(&reply);
    let pool = balancer.pool("web").expect("pool");
    let charged = pool.backends[0].traffic.recent();
    assert!(
        !charged.contains(&Outcome::Reset),
        "the client's malformed trailers were charged to the backend: {charged:?}; the client got: {reply}"
    );
    assert!(reply.starts_with("HTTP/1.1 200"), "{reply}");
    balancer.shutdown(DEADLINE).await;
}
