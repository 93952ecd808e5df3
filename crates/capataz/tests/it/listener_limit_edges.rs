//! A listener's `max_connections` at its edges: connections that end in unusual ways (an
//! upgraded tunnel), reloads that add a limit or remove the listener while a connection waits,
//! and many clients racing for a few slots, checked against what a backend counting its
//! concurrent requests saw.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use super::listener_limit::{open, reached, reply, sample, served, waiting};
use crate::support::access_log::LogDir;
use crate::support::balancer::{backends, parse, start, ConfigText};
use crate::support::raw::{echo_backend, read_exact_buf, read_head, read_reply, RawBackend};
use crate::support::tls::{self, Pki};
use crate::support::unix::UnixClient;
use crate::support::wait::wait_until;
use crate::support::DEADLINE;

/// No probes: only the listener is exercised.
const NO_PROBES: &str = "[pools.web.active]\nkind = \"none\"\n";

/// Regression: a reload that gave a limit to a listener without one left its connections
/// opened before it unable to wake the accept loop when they closed (only connections taken
/// under a limit did), so a connection waiting at the new limit waited for ever.
#[tokio::test]
async fn a_reload_that_adds_a_limit_takes_the_waiting_connection_when_an_older_one_closes() {
    let b = backends(&["a"]).await;
    let config = |max: &str| ConfigText::sims(&b).listener(max).build();
    let (balancer, _rx) = start(&config("")).await;
    let addr = balancer.local_addrs()[0];
    let first = served(addr).await;
    let _second = served(addr).await;
    let limited = config("max_connections = 2");
    balancer.reload(&parse(&limited)).await.expect("reload");
    let mut third = waiting(addr).await;
    wait_until("the third found it full", || reached(&balancer) == 1.0).await;
    drop(first);
    let late = reply(&mut third)
        .await
        .expect("served once an older one closed");
    assert_eq!(late.status, 200);
    assert_eq!(open(&balancer), 2.0);
}

/// The upgrade request [`an_upgraded_tunnel_holds_its_slot_until_it_closes`] sends.
const UPGRADE: &[u8] =
    b"GET /chat HTTP/1.1\r\nHost: app.test\r\nConnection: Upgrade\r\nUpgrade: websocket\r\n\r\n";

/// Regression: an HTTP/1 connection upgraded (a `101`, a WebSocket) ended its connection's
/// future, which let go of its slot while the tunnel went on: the gauge said 0 and a
/// listener at `max_connections = 1` served another connection beside the tunnel. The
/// tunnel's bytes were not counted either (the connection's were added when its future
/// ended, before them).
#[tokio::test]
async fn an_upgraded_tunnel_holds_its_slot_until_it_closes() {
    let echo = echo_backend().await;
    let text = ConfigText::new(&[echo.entry("echo")])
        .listener("max_connections = 1")
        .extra(NO_PROBES)
        .build();
    let (balancer, _rx) = start(&text).await;
    let addr = balancer.local_addrs()[0];
    let mut tunnel = TcpStream::connect(addr).await.expect("connect");
    tunnel.write_all(UPGRADE).await.expect("send the upgrade");
    let mut buf = Vec::new();
    let head = tokio::time::timeout(DEADLINE, read_head(&mut tunnel, &mut buf))
        .await
        .expect("a 101 in time")
        .expect("a head");
    assert!(head.starts_with("HTTP/1.1 101"), "{head}");
    tunnel.write_all(b"ping").await.expect("send");
    let echoed = tokio::time::timeout(DEADLINE, read_exact_buf(&mut tunnel, &mut buf, 4))
        .await
        .expect("an echo in time")
        .expect("echoed");
    assert_eq!(echoed, b"ping");
    assert_eq!(open(&balancer), 1.0, "the tunnel counted open");
    // The tunnel holds the one slot: another connection waits.
    let mut next = waiting(addr).await;
    wait_until("the next found it full", || reached(&balancer) == 1.0).await;
    drop(tunnel);
    let late = reply(&mut next)
        .await
        .expect("served once the tunnel closed");
    assert_eq!(late.status, 200);
    drop(next);
    wait_until("both counted closed", || open(&balancer) == 0.0).await;
    let late_request = "GET /late HTTP/1.1\r\nHost: app.test\r\n\r\n".len();
    let received = "capataz_client_received_bytes_total{listener=\"listener-0\"}";
    let expected = UPGRADE.len() + b"ping".len() + late_request;
    assert_eq!(sample(&balancer, received), expected as f64);
}

/// The same over TLS: the connection's slot was held outside the connection's future, by the
/// task around it, which ended with it at the upgrade.
#[tokio::test]
async fn an_upgraded_tunnel_over_tls_holds_its_slot() {
    let pki = Pki::new();
    let echo = echo_backend().await;
    let (cert, key) = pki.server("site", &["site.test"], None);
    let listener = format!(
        "max_connections = 1\n{}",
        Pki::listener(&[(cert.as_path(), key.as_path())], "")
    );
    let text = ConfigText::new(&[echo.entry("echo")])
        .listener(&listener)
        .extra(NO_PROBES)
        .build();
    let (balancer, _rx) = start(&text).await;
    let addr = balancer.local_addrs()[0];
    let client = tls::Client::trusting(&pki);
    let mut tunnel = client.connect(addr, "site.test").await.expect("handshake");
    tunnel.write_all(UPGRADE).await.expect("send the upgrade");
    let mut head = Vec::new();
    let mut byte = [0u8; 1];
    let read = async {
        while !head.ends_with(b"\r\n\r\n") {
            let n = tunnel.read(&mut byte).await.expect("read");
            assert_eq!(n, 1, "closed before an answer");
            head.push(byte[0]);
        }
        tunnel.write_all(b"ping").await.expect("send");
        let mut echoed = [0u8; 4];
        tunnel.read_exact(&mut echoed).await.expect("echoed");
        assert_eq!(&echoed, b"ping");
    };
    tokio::time::timeout(DEADLINE, read)
        .await
        .expect("a 101 and an echo in time");
    assert!(head.starts_with(b"HTTP/1.1 101"), "{head:?}");
    assert_eq!(open(&balancer), 1.0, "the tunnel counted open");
    // A TLS client meanwhile waits (its handshake not begun), served once the tunnel closes.
    let next = tokio::spawn(async move {
        let mut stream = client.connect(addr, "site.test").await.expect("handshake");
        tls::get(&mut stream, "site.test").await
    });
    wait_until("the next found it full", || reached(&balancer) == 1.0).await;
    drop(tunnel);
    let (head, _) = tokio::time::timeout(DEADLINE, next)
        .await
        .expect("served within the deadline")
        .expect("the client task")
        .expect("an answer");
    assert!(head.starts_with("http/1.1 200"), "{head}");
}

/// The next read on `stream` within the deadline: it must be its close (an end or a reset),
/// no answer.
async fn closed_unanswered(stream: &mut TcpStream) {
    let mut byte = [0u8; 1];
    let read = tokio::time::timeout(DEADLINE, stream.read(&mut byte))
        .await
        .expect("closed within the deadline, not left hanging");
    assert!(matches!(read, Ok(0) | Err(_)), "answered: {read:?}");
}

/// A reload that removes a listener while a connection waits at its limit closes that
/// connection unserved (it does not hang); the other listener goes on.
#[tokio::test]
async fn a_reload_that_removes_the_listener_closes_the_waiting_connection() {
    let dir = LogDir::new();
    let socket = dir.path("other.sock");
    let b = backends(&["a"]).await;
    let other = format!(
        "\n[[listeners]]\nname = \"other\"\naddress = \"unix:{}\"\n",
        socket.display()
    );
    let two = ConfigText::sims(&b)
        .listener("max_connections = 1")
        .extra(&format!("{NO_PROBES}{other}"))
        .build();
    let (balancer, _rx) = start(&two).await;
    let addr = balancer.local_addrs()[0];
    let _first = served(addr).await;
    let mut second = waiting(addr).await;
    wait_until("the second found it full", || reached(&balancer) == 1.0).await;
    let other_only = format!(
        "{other}\n[pools.web]\nbackends = [{{ address = \"{}\" }}]\n{NO_PROBES}",
        b[0].addr()
    );
    balancer.reload(&parse(&other_only)).await.expect("reload");
    closed_unanswered(&mut second).await;
    let mut client = UnixClient::connect(&socket).await;
    assert_eq!(client.get("/").await.status, 200);
}

/// Shutdown while a connection waits at the limit closes it unserved, within the deadline.
#[tokio::test]
async fn shutdown_closes_the_waiting_connection() {
    let b = backends(&["a"]).await;
    let text = ConfigText::sims(&b).listener("max_connections = 1").build();
    let (balancer, _rx) = start(&text).await;
    let addr = balancer.local_addrs()[0];
    let _first = served(addr).await;
    let mut second = waiting(addr).await;
    wait_until("the second found it full", || reached(&balancer) == 1.0).await;
    let down = balancer.shutdown(std::time::Duration::from_millis(200));
    tokio::time::timeout(DEADLINE, down)
        .await
        .expect("shutdown within the deadline");
    closed_unanswered(&mut second).await;
}

/// Many clients racing for few slots: never more than `max_connections` requests at the
/// backend at once (each connection carries one), and every client served in the end.
#[tokio::test]
async fn two_hundred_clients_at_five_slots_are_served_five_at_a_time() {
    let now = Arc::new(AtomicUsize::new(0));
    let most = Arc::new(AtomicUsize::new(0));
    let (seen_now, seen_most) = (now.clone(), most.clone());
    let backend = RawBackend::start(move |mut stream, hits| {
        let (now, most) = (seen_now.clone(), seen_most.clone());
        async move {
            let mut buf = Vec::new();
            while read_head(&mut stream, &mut buf).await.is_some() {
                hits.fetch_add(1, Ordering::SeqCst);
                let at_once = now.fetch_add(1, Ordering::SeqCst) + 1;
                most.fetch_max(at_once, Ordering::SeqCst);
                // Service time, so that requests overlap (not a synchronisation).
                tokio::time::sleep(std::time::Duration::from_millis(2)).await;
                now.fetch_sub(1, Ordering::SeqCst);
                let ok = b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok";
                if stream.write_all(ok).await.is_err() {
                    return;
                }
            }
        }
    })
    .await;
    let text = ConfigText::new(&[backend.entry("a")])
        .listener("max_connections = 5")
        .extra(NO_PROBES)
        .build();
    let (balancer, _rx) = start(&text).await;
    let addr = balancer.local_addrs()[0];
    let clients: Vec<_> = (0..200)
        .map(|_| {
            tokio::spawn(async move {
                let mut stream = TcpStream::connect(addr).await.expect("connect");
                stream
                    .write_all(b"GET / HTTP/1.1\r\nHost: app.test\r\nConnection: close\r\n\r\n")
                    .await
                    .expect("send");
                let mut buf = Vec::new();
                read_reply(&mut stream, &mut buf).await.map(|r| r.status)
            })
        })
        .collect();
    for client in clients {
        let status = tokio::time::timeout(DEADLINE, client)
            .await
            .expect("served within the deadline")
            .expect("the client task");
        assert_eq!(status, Some(200));
    }
    assert_eq!(backend.hits(), 200);
    let most = most.load(Ordering::SeqCst);
    assert!(most <= 5, "{most} requests at the backend at once");
    assert!(reached(&balancer) >= 1.0, "the limit was never reached");
    wait_until("all closed", || open(&balancer) == 0.0).await;
}
