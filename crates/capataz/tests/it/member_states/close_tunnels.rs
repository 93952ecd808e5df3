//! `close_tunnels_on_down`: when a backend's verdict goes DOWN, its upgraded connections (a
//! WebSocket-style echo here) are closed; without the key they stay open.

use std::sync::atomic::{AtomicU16, Ordering};
use std::sync::Arc;
use std::time::Duration;

use capataz_health::State;
use tokio::io::AsyncWriteExt;
use tokio::net::TcpStream;

use super::*;
use crate::support::events::is_transition;
use crate::support::raw::{closes, has_token, read_exact_buf, read_head, RawBackend};
use crate::support::DEADLINE;

/// A backend whose health route answers `health` and which echoes on an upgraded connection.
async fn echo_backend(health: Arc<AtomicU16>) -> RawBackend {
    RawBackend::start(move |mut stream, hits| {
        let health = health.clone();
        async move {
            let mut buf = Vec::new();
            let Some(head) = read_head(&mut stream, &mut buf).await else {
                return;
            };
            hits.fetch_add(1, Ordering::SeqCst);
            if !has_token(&head, "connection", "upgrade") {
                let status = health.load(Ordering::SeqCst);
                let answer = format!(
                    "HTTP/1.1 {status} X\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"
                );
                let _ = stream.write_all(answer.as_bytes()).await;
                return;
            }
            let switch = b"HTTP/1.1 101 Switching Protocols\r\nConnection: Upgrade\r\n\
                           Upgrade: websocket\r\n\r\n";
            if stream.write_all(switch).await.is_err() {
                return;
            }
            let mut chunk = [0u8; 4096];
            while let Ok(n) = tokio::io::AsyncReadExt::read(&mut stream, &mut chunk).await {
                if n == 0 || stream.write_all(&chunk[..n]).await.is_err() {
                    return;
                }
            }
        }
    })
    .await
}

/// An upgraded connection through the balancer at `addr`, checked to echo.
async fn upgraded(addr: SocketAddr) -> (TcpStream, Vec<u8>) {
    let mut client = TcpStream::connect(addr).await.expect("connect");
    client
        .write_all(
            b"GET /chat HTTP/1.1\r\nHost: app.test\r\nConnection: Upgrade\r\n\
              Upgrade: websocket\r\n\r\n",
        )
        .await
        .expect("send the upgrade");
    let mut buf = Vec::new();
    let head = tokio::time::timeout(DEADLINE, read_head(&mut client, &mut buf))
        .await
        .expect("a 101 in time")
        .expect("a response head");
    assert!(head.starts_with("HTTP/1.1 101"), "{head}");
    echoes(&mut client, &mut buf).await;
    (client, buf)
}

async fn echoes(client: &mut TcpStream, buf: &mut Vec<u8>) {
    client.write_all(b"ping").await.expect("write");
    let echoed = tokio::time::timeout(DEADLINE, read_exact_buf(client, buf, 4))
        .await
        .expect("an echo in time");
    assert_eq!(echoed.as_deref(), Some(&b"ping"[..]));
}

/// The config: pool `web` over the echo backend and a spare, `pool_keys` added.
fn text(echo: &RawBackend, spare: &SimBackend, pool_keys: &str) -> String {
    let (name, addr) = echo.entry("echo");
    format!(
        "[admin]\naddress = \"127.0.0.1:0\"\n\n[[listeners]]\naddress = \"127.0.0.1:0\"\n\n\
         [pools.web]\nbackends = [{{ name = \"{name}\", address = \"{addr}\" }}, \
         {{ name = \"spare\", address = \"{}\", weight = 1 }}]\n{pool_keys}\n{FAST_CHECKS}\n\
         [pools.web.retries]\nattempts = 0\n",
        spare.addr()
    )
}

#[tokio::test]
async fn a_backend_marked_down_has_its_upgraded_connections_closed() {
    let health = Arc::new(AtomicU16::new(200));
    let echo = echo_backend(health.clone()).await;
    let spare = crate::support::balancer::backends(&["spare"]).await;
    // Only the echo backend gets traffic until the tunnel is open.
    spare[0].set_health(capataz::sim::Mode::Status(503));
    let mut r = Running::start(&text(&echo, &spare[0], "close_tunnels_on_down = true")).await;
    r.wait_for("spare DOWN", |e| is_transition(e, "spare", State::Down))
        .await;
    let (mut client, _buf) = upgraded(r.balancer.local_addrs()[0]).await;

    health.store(500, Ordering::SeqCst);
    r.wait_for("echo DOWN", |e| is_transition(e, "echo", State::Down))
        .await;
    assert!(closes(&mut client).await, "the tunnel stayed open");
    r.balancer.shutdown(Duration::from_secs(1)).await;
}

#[tokio::test]
async fn without_close_tunnels_on_down_a_tunnel_outlives_its_backends_down() {
    let health = Arc::new(AtomicU16::new(200));
    let echo = echo_backend(health.clone()).await;
    let spare = crate::support::balancer::backends(&["spare"]).await;
    spare[0].set_health(capataz::sim::Mode::Status(503));
    let mut r = Running::start(&text(&echo, &spare[0], "")).await;
    r.wait_for("spare DOWN", |e| is_transition(e, "spare", State::Down))
        .await;
    let (mut client, mut buf) = upgraded(r.balancer.local_addrs()[0]).await;
    health.store(500, Ordering::SeqCst);
    r.wait_for("echo DOWN", |e| is_transition(e, "echo", State::Down))
        .await;
    echoes(&mut client, &mut buf).await;
    r.balancer.shutdown(Duration::from_secs(1)).await;
}
