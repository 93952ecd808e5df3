//! Retries, passive checks, timeouts and blame over HTTP/2: as over HTTP/1.1.

use std::time::Duration;

use capataz::sim::Mode;
use capataz_health::State;
use http::StatusCode;
use tokio::io::AsyncWriteExt;

use super::{balancer, charged, silent_backend};
use crate::support::balancer::{backends, pairs};
use crate::support::events::{is_transition, wait_for};
use crate::support::h2client::connect;
use crate::support::h2frames::{
    self, data, handshake, headers, read_to_end, request_block, rst_stream, CANCEL, NO_ERROR,
};
use crate::support::raw::length_backend;
use crate::support::wait::wait_until;
use crate::support::DEADLINE;

#[tokio::test]
async fn a_get_over_h2_is_retried_past_a_503() {
    let sims = backends(&["bad", "good"]).await;
    sims[0].set_traffic(Mode::Status(503));
    let (_balancer, addr, _events) =
        balancer(&pairs(&sims), "", "retries = { attempts = 1 }").await;
    let mut conn = connect(addr).await;
    // The fresh pool's first pick is `bad`: its 503 is retried on `good`.
    let answer = conn.get("app.test", "/").await;
    assert_eq!(answer.status, StatusCode::OK);
    assert_eq!(answer.header("x-backend"), Some("good"));
    assert_eq!((sims[0].traffic_hits(), sims[1].traffic_hits()), (1, 1));
}

#[tokio::test]
async fn passive_checks_eject_a_failing_backend_over_h2() {
    let sims = backends(&["sick", "well"]).await;
    sims[0].set_traffic(Mode::Status(500));
    let (_balancer, addr, mut events) = balancer(&pairs(&sims), "", "").await;
    let mut conn = connect(addr).await;
    let first = conn.get("app.test", "/").await;
    assert_eq!(first.status, StatusCode::INTERNAL_SERVER_ERROR);
    wait_for(&mut events, "sick ejected", |e| {
        is_transition(e, "sick", State::Down)
    })
    .await;
    for _ in 0..5 {
        let answer = conn.get("app.test", "/").await;
        assert_eq!(answer.header("x-backend"), Some("well"));
    }
    assert_eq!(sims[0].traffic_hits(), 1);
}

#[tokio::test]
async fn a_stream_reset_mid_upload_charges_no_backend_and_spares_the_connection() {
    let backend = length_backend().await;
    let (balancer, addr, _events) = balancer(&[backend.entry("b0")], "", "").await;
    let (mut read, mut write, _) = handshake(addr).await;
    // A POST whose body never ends: part of it, then the client cancels the stream.
    let block = request_block("POST", "app.test", "/upload");
    write
        .write_all(&headers(1, &block, false, true))
        .await
        .unwrap();
    write
        .write_all(&data(1, &[b'x'; 1000], false))
        .await
        .unwrap();
    wait_until("the upload reaches the backend", || backend.accepted() == 1).await;
    write.write_all(&rst_stream(1, CANCEL)).await.unwrap();
    wait_until("the backend connection is closed", || backend.closed() == 1).await;
    // The same connection still serves a request.
    let block = request_block("GET", "app.test", "/after");
    write
        .write_all(&headers(3, &block, true, true))
        .await
        .unwrap();
    let answered = loop {
        let frame = h2frames::read_frame(&mut read).await.expect("frames");
        if frame.kind == h2frames::HEADERS {
            break frame;
        }
    };
    assert_eq!(answered.stream, 3);
    // `:status: 200` is HPACK's static entry 8.
    assert_eq!(answered.payload.first(), Some(&0x88), "{answered:?}");
    // Only the answered request was judged, as a 200; the cancelled one was never charged.
    assert_eq!(
        charged(&balancer, 0),
        [capataz_health::Outcome::Status(200)]
    );
}

#[tokio::test]
async fn an_idle_h2_connection_gets_a_goaway_and_is_closed() {
    let backend = length_backend().await;
    let (_balancer, addr, _events) =
        balancer(&[backend.entry("b0")], "idle_timeout = \"200ms\"", "").await;
    let (mut read, _write, _) = handshake(addr).await;
    let ending = read_to_end(&mut read, DEADLINE).await;
    assert!(ending.closed, "{ending:?}");
    assert_eq!(ending.goaways.first(), Some(&NO_ERROR), "{ending:?}");
}

#[tokio::test]
async fn an_idle_h2_client_that_stops_reading_is_dropped_after_its_goaway() {
    let backend = silent_backend().await;
    let (_balancer, addr, _events) =
        balancer(&[backend.entry("b0")], "idle_timeout = \"200ms\"", "").await;
    // The client never reads (not even the server's SETTINGS) and sends nothing after its
    // preface: the GOAWAY cannot be acknowledged, and the connection is dropped anyway.
    let stream = tokio::net::TcpStream::connect(addr).await.unwrap();
    let (mut read, mut write) = stream.into_split();
    let mut start = h2frames::PREFACE.to_vec();
    start.extend(h2frames::settings(&[]));
    write.write_all(&start).await.unwrap();
    let ending = read_to_end(&mut read, DEADLINE).await;
    assert!(ending.closed, "{ending:?}");
}

/// Regression: an HTTP/2 connection closed for idleness was dropped a second after its GOAWAY
/// whatever it still served. Its first GOAWAY (last stream 2^31-1, then a PING) lets in the
/// streams a client opened before it saw it (RFC 9113 section 6.8: "without losing
/// requests"), as h2 does; one whose answer took longer than that second was cut off with the
/// connection, its backend's work thrown away and counted as the client's cancel. Envoy and
/// HAProxy close an idle connection's successor streams only once they are done.
#[tokio::test]
async fn a_stream_that_crossed_an_idle_goaway_is_answered_before_the_close() {
    let sims = backends(&["slow"]).await;
    // Longer than the second the watcher gives a GOAWAY.
    sims[0].set_traffic(Mode::Delay(Duration::from_millis(2500), 200));
    let (balancer, addr, _events) = balancer(&pairs(&sims), "idle_timeout = \"200ms\"", "").await;
    let (mut read, mut write, _) = handshake(addr).await;
    // The idle GOAWAY, and the PING whose answer lets the final one go.
    let (mut goaway, mut ping) = (None, None);
    while goaway.is_none() || ping.is_none() {
        let frame = tokio::time::timeout(DEADLINE, h2frames::read_frame(&mut read))
            .await
            .expect("the idle GOAWAY in time")
            .expect("a frame");
        match frame.kind {
            h2frames::GOAWAY => goaway = Some(frame.payload),
            h2frames::PING if frame.flags & h2frames::ACK == 0 => ping = Some(frame.payload),
            _ => {}
        }
    }
    let goaway = goaway.unwrap_or_default();
    assert_eq!(
        goaway[..4],
        [0x7f, 0xff, 0xff, 0xff],
        "the first GOAWAY takes any stream"
    );
    // A request sent as the GOAWAY arrives: on the wire, the same as one in flight when the
    // GOAWAY left. Then the PING's answer, after it, as a client that sent the request first.
    let mut sent = headers(1, &request_block("GET", "app.test", "/"), true, true);
    sent.extend(h2frames::frame(
        h2frames::PING,
        h2frames::ACK,
        0,
        &ping.unwrap_or_default(),
    ));
    write.write_all(&sent).await.unwrap();
    let ending = read_to_end(&mut read, DEADLINE).await;
    assert_eq!(ending.answered, [1], "{ending:?}");
    assert!(ending.closed, "closed once its stream is done: {ending:?}");
    assert_eq!(
        charged(&balancer, 0),
        [capataz_health::Outcome::Status(200)]
    );
}

#[tokio::test]
async fn a_stream_waiting_on_its_answer_is_not_idle() {
    let sims = backends(&["slow"]).await;
    sims[0].set_traffic(Mode::Delay(Duration::from_millis(600), 200));
    let (_balancer, addr, _events) = balancer(&pairs(&sims), "idle_timeout = \"200ms\"", "").await;
    let mut conn = connect(addr).await;
    let answer = conn.get("app.test", "/").await;
    assert_eq!(answer.status, StatusCode::OK);
}

#[tokio::test]
async fn shutdown_lets_a_stream_in_progress_finish_then_closes_the_connection() {
    let sims = backends(&["slow"]).await;
    sims[0].set_traffic(Mode::Delay(Duration::from_millis(400), 200));
    let (balancer, addr, _events) = balancer(&pairs(&sims), "", "").await;
    let mut conn = connect(addr).await;
    let mut sender = conn.sender.clone();
    let request = tokio::spawn(async move {
        sender.ready().await.unwrap();
        let req = crate::support::h2client::request(
            http::Method::GET,
            "app.test",
            "/",
            crate::support::h2client::empty(),
        );
        sender.send_request(req).await.map(|r| r.status())
    });
    assert!(sims[0].wait_traffic_hits(1, DEADLINE).await);
    let shutdown = tokio::spawn(balancer.shutdown(Duration::from_secs(10)));
    let status = tokio::time::timeout(DEADLINE, request)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(status.unwrap(), StatusCode::OK);
    tokio::time::timeout(DEADLINE, &mut conn.conn)
        .await
        .expect("the connection ends after its last stream")
        .unwrap()
        .unwrap();
    tokio::time::timeout(DEADLINE, shutdown)
        .await
        .unwrap()
        .unwrap();
}

#[tokio::test]
async fn a_stalled_h2_upload_gets_408_and_charges_nothing() {
    let backend = length_backend().await;
    let (balancer, addr, _events) = balancer(
        &[backend.entry("b0")],
        "request_body_timeout = \"300ms\"",
        "",
    )
    .await;
    let mut conn = connect(addr).await;
    let (sender, body) = crate::support::h2client::channel();
    sender
        .send(bytes::Bytes::from_static(b"ten bytes!"))
        .await
        .unwrap();
    let req = crate::support::h2client::request(http::Method::POST, "app.test", "/up", body);
    let answer = conn
        .send(req)
        .await
        .expect("an answer while the body is open");
    assert_eq!(answer.status, StatusCode::REQUEST_TIMEOUT);
    assert_eq!(charged(&balancer, 0), []);
    drop(sender);
    // The connection serves the next request.
    let next = conn.get("app.test", "/").await;
    assert_eq!(next.status, StatusCode::OK);
}

#[tokio::test]
async fn a_header_list_over_max_header_bytes_gets_431() {
    let backend = length_backend().await;
    let (_balancer, addr, _events) =
        balancer(&[backend.entry("b0")], "max_header_bytes = 4096", "").await;
    let mut conn = connect(addr).await;
    let mut req = crate::support::h2client::request(
        http::Method::GET,
        "app.test",
        "/",
        crate::support::h2client::empty(),
    );
    req.headers_mut().insert(
        "x-big",
        http::HeaderValue::from_str(&"a".repeat(5000)).unwrap(),
    );
    let answer = conn.send(req).await.expect("an answer");
    assert_eq!(answer.status, StatusCode::REQUEST_HEADER_FIELDS_TOO_LARGE);
    assert_eq!(backend.accepted(), 0);
}

#[tokio::test]
async fn a_preface_that_stalls_is_cut_at_header_read_timeout() {
    let backend = length_backend().await;
    let (_balancer, addr, _events) = balancer(
        &[backend.entry("b0")],
        "header_read_timeout = \"200ms\"\nidle_timeout = \"60s\"",
        "",
    )
    .await;
    let mut stream = tokio::net::TcpStream::connect(addr).await.unwrap();
    stream.write_all(&h2frames::PREFACE[..10]).await.unwrap();
    let started = tokio::time::Instant::now();
    assert!(crate::support::raw::closes(&mut stream).await);
    assert!(
        started.elapsed() < Duration::from_secs(30),
        "not the idle timeout"
    );
}
