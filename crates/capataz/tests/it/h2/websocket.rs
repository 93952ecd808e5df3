//! WebSocket over HTTP/2 (RFC 8441): an extended CONNECT from hyper's HTTP/2 client reaches an
//! HTTP/1.1 backend as the RFC 6455 handshake, and the stream carries the frames both ways.

use std::sync::{Arc, Mutex};

use http::{Method, StatusCode};
use hyper::ext::Protocol;
use hyper::upgrade::Upgraded;
use hyper_util::rt::TokioIo;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use super::{balancer, echo_backend};
use crate::support::h2client::{connect, empty, H2Conn};
use crate::support::raw::{has_token, header, read_head, RawBackend};
use crate::support::DEADLINE;

/// A WebSocket backend: it keeps the handshake's head in `seen`, answers `101` (with the
/// `Sec-WebSocket-Accept` a real server computes, here any) and `Sec-WebSocket-Protocol:
/// chat`, then echoes every byte; a request without the upgrade fields gets a `200` page.
async fn websocket_backend(seen: Arc<Mutex<Vec<String>>>) -> RawBackend {
    RawBackend::start(move |mut stream, hits| {
        let seen = seen.clone();
        async move {
            let mut buf = Vec::new();
            let Some(head) = read_head(&mut stream, &mut buf).await else {
                return;
            };
            hits.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            seen.lock().unwrap().push(head.clone());
            let upgrade = has_token(&head, "connection", "upgrade")
                && header(&head, "upgrade").is_some_and(|v| v.eq_ignore_ascii_case("websocket"));
            if !upgrade {
                let page = b"HTTP/1.1 200 OK\r\nContent-Length: 4\r\n\r\npage";
                let _ = stream.write_all(page).await;
                return;
            }
            let switch = "HTTP/1.1 101 Switching Protocols\r\nConnection: Upgrade\r\n\
                          Upgrade: websocket\r\nSec-WebSocket-Accept: s3pPLMBiTxaQ9kYGzzhZRbK+xOo=\r\n\
                          Sec-WebSocket-Protocol: chat\r\n\r\n";
            if stream.write_all(switch.as_bytes()).await.is_err() {
                return;
            }
            let mut chunk = [0u8; 4096];
            while let Ok(n) = stream.read(&mut chunk).await {
                if n == 0 || stream.write_all(&chunk[..n]).await.is_err() {
                    return;
                }
            }
        }
    })
    .await
}

fn extended_connect(protocol: &'static str) -> http::Request<crate::support::h2client::H2Body> {
    let mut req = http::Request::builder()
        .method(Method::CONNECT)
        .uri("http://app.test/chat?room=1")
        .header("sec-websocket-version", "13")
        .header("sec-websocket-protocol", "chat")
        .body(empty())
        .unwrap();
    req.extensions_mut().insert(Protocol::from_static(protocol));
    req
}

/// The answer to a WebSocket's extended CONNECT on `conn`, checked to be the `200` that opens
/// the tunnel.
async fn handshake(conn: &mut H2Conn) -> http::Response<hyper::body::Incoming> {
    conn.sender.ready().await.unwrap();
    let response = tokio::time::timeout(
        DEADLINE,
        conn.sender.send_request(extended_connect("websocket")),
    )
    .await
    .expect("an answer in time")
    .expect("an answer");
    assert_eq!(response.status(), StatusCode::OK);
    response
}

/// The tunnel the stream of `response` (a `200` to an extended CONNECT) becomes.
async fn tunnel_of(response: http::Response<hyper::body::Incoming>) -> TokioIo<Upgraded> {
    TokioIo::new(
        tokio::time::timeout(DEADLINE, hyper::upgrade::on(response))
            .await
            .expect("the tunnel in time")
            .expect("the stream becomes the tunnel"),
    )
}

/// `count` three-byte messages through `tunnel`, one every 100 ms, each echoed before the next.
async fn echo_paced(tunnel: &mut TokioIo<Upgraded>, count: u8) {
    let began = std::time::Instant::now();
    let mut pace = tokio::time::interval(std::time::Duration::from_millis(100));
    for n in 0..count {
        pace.tick().await;
        let message = [0x81, 0x01, n];
        tunnel
            .write_all(&message)
            .await
            .unwrap_or_else(|error| panic!("message {n}, {:?} in: {error}", began.elapsed()));
        let mut echoed = [0u8; 3];
        tokio::time::timeout(DEADLINE, tunnel.read_exact(&mut echoed))
            .await
            .expect("the echo in time")
            .unwrap_or_else(|error| panic!("echo {n}, {:?} in: {error}", began.elapsed()));
        assert_eq!(echoed, message);
    }
}

#[tokio::test]
async fn a_websocket_over_h2_reaches_an_http1_backend_and_echoes_both_ways() {
    let seen = Arc::new(Mutex::new(Vec::new()));
    let backend = websocket_backend(seen.clone()).await;
    let (_balancer, addr, _events) = balancer(&[backend.entry("ws")], "", "").await;
    let mut conn = connect(addr).await;
    let response = handshake(&mut conn).await;
    let headers = response.headers();
    assert_eq!(headers.get("sec-websocket-protocol").unwrap(), "chat");
    for gone in ["connection", "upgrade", "sec-websocket-accept"] {
        assert!(
            headers.get(gone).is_none(),
            "{gone} is not relayed: {headers:?}"
        );
    }
    // The backend got the HTTP/1.1 handshake for the same path, with a key of capataz's own.
    let head = seen.lock().unwrap()[0].clone();
    assert!(head.starts_with("GET /chat?room=1 HTTP/1.1\r\n"), "{head}");
    assert!(has_token(&head, "connection", "upgrade"), "{head}");
    assert_eq!(header(&head, "upgrade"), Some("websocket"), "{head}");
    assert_eq!(header(&head, "sec-websocket-version"), Some("13"), "{head}");
    assert_eq!(
        header(&head, "sec-websocket-protocol"),
        Some("chat"),
        "{head}"
    );
    assert_eq!(header(&head, "host"), Some("app.test"), "{head}");
    assert_eq!(
        header(&head, "sec-websocket-key").map(str::len),
        Some(24),
        "{head}"
    );

    let mut tunnel = tunnel_of(response).await;
    for message in [&b"\x81\x05hello"[..], &[7u8; 70_000][..]] {
        tunnel.write_all(message).await.unwrap();
        let mut echoed = vec![0u8; message.len()];
        tokio::time::timeout(DEADLINE, tunnel.read_exact(&mut echoed))
            .await
            .expect("the echo in time")
            .expect("echoed bytes");
        assert_eq!(echoed, message);
    }
    // The connection's other streams go on beside the tunnel.
    let page = conn
        .send(crate::support::h2client::request(
            Method::GET,
            "app.test",
            "/",
            empty(),
        ))
        .await
        .unwrap();
    assert_eq!(
        (page.status, page.text()),
        (StatusCode::OK, "page".to_owned())
    );
    assert_eq!(backend.hits(), 2);
}

#[tokio::test]
async fn a_backend_that_does_not_switch_gets_the_client_a_502_and_other_protocols_a_501() {
    // The echo backend answers the handshake with a 200 page: over HTTP/2 a 2xx would open
    // the tunnel, so the client gets a 502 instead.
    let backend = echo_backend("echo").await;
    let (_balancer, addr, _events) = balancer(&[backend.entry("echo")], "", "").await;
    let mut conn = connect(addr).await;
    let answer = conn.send(extended_connect("websocket")).await.unwrap();
    assert_eq!(answer.status, StatusCode::BAD_GATEWAY, "{}", answer.text());
    assert!(
        answer.text().contains("without switching protocols"),
        "{}",
        answer.text()
    );
    assert_eq!(backend.hits(), 1);
    // An extended CONNECT for any other protocol reaches no backend.
    let answer = conn.send(extended_connect("connect-udp")).await.unwrap();
    assert_eq!(answer.status, StatusCode::NOT_IMPLEMENTED);
    assert_eq!(backend.hits(), 1);
}

/// Regression: an HTTP/2 connection whose only stream was a WebSocket (RFC 8441) counted as
/// idle: the watcher times an HTTP/2 connection by the streams it starts and has in progress,
/// and a tunnel is neither once its `200` is out. A WebSocket busy both ways was cut
/// `idle_timeout` (and a grace second) after its handshake; its idleness is the tunnel's
/// own to time (`idle_timeout` too, with no byte either way), as over HTTP/1.1.
#[tokio::test]
async fn a_busy_websocket_over_h2_outlives_the_connections_idle_timeout() {
    let seen = Arc::new(Mutex::new(Vec::new()));
    let backend = websocket_backend(seen).await;
    let (_balancer, addr, _events) =
        balancer(&[backend.entry("ws")], "idle_timeout = \"300ms\"", "").await;
    let mut conn = connect(addr).await;
    let response = handshake(&mut conn).await;
    let mut tunnel = tunnel_of(response).await;
    // A message every 100 ms for 2.5 s: the connection is never quiet for its idle_timeout,
    // and this outlasts it and the GOAWAY's grace second.
    echo_paced(&mut tunnel, 25).await;
    // Quiet, the tunnel is closed at its own idle_timeout, then the connection at its own.
    let mut rest = Vec::new();
    let ended = tokio::time::timeout(DEADLINE, tunnel.read_to_end(&mut rest)).await;
    assert!(ended.is_ok(), "the quiet tunnel stays open");
    tokio::time::timeout(DEADLINE, &mut conn.conn)
        .await
        .expect("the idle connection ends after its tunnel")
        .unwrap()
        .unwrap();
}

/// A drain with a WebSocket over HTTP/2 open: the connection gets its GOAWAY, the tunnel goes
/// on past the GOAWAY's grace second as a stream in progress does (as an HTTP/1.1 upgrade's
/// tunnel does), and the shutdown waits for it until its deadline.
#[tokio::test]
async fn a_drain_lets_a_websocket_over_h2_go_on_until_the_shutdowns_deadline() {
    let seen = Arc::new(Mutex::new(Vec::new()));
    let backend = websocket_backend(seen).await;
    let (balancer, addr, _events) = balancer(&[backend.entry("ws")], "", "").await;
    let mut conn = connect(addr).await;
    let response = handshake(&mut conn).await;
    let mut tunnel = tunnel_of(response).await;
    let began = std::time::Instant::now();
    let grace = std::time::Duration::from_secs(3);
    let shutdown = tokio::spawn(balancer.shutdown(grace));
    // Messages every 100 ms for 2 s, past the GOAWAY's grace second.
    echo_paced(&mut tunnel, 20).await;
    tokio::time::timeout(DEADLINE, shutdown)
        .await
        .expect("the shutdown ends at its deadline")
        .expect("the shutdown task");
    // It waited for the tunnel, as for a request in progress. (What is still open at the
    // deadline is left to the process's exit: in a test's runtime it would go on.)
    assert!(
        began.elapsed() >= grace,
        "ended after {:?}",
        began.elapsed()
    );
}
