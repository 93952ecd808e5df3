//! Section 1: upgrades (a WebSocket-style echo) pass through both ways.

use super::*;
use crate::support::raw::echo_backend;

#[tokio::test]
async fn websocket_upgrade_passes_through_and_echoes_both_ways() {
    let echo = echo_backend().await;
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

/// Regression: a sticky pool's `Set-Cookie` was added to relayed answers but not to a `101`,
/// so a WebSocket client (whose first request is often its upgrade) was never stuck to its
/// backend. The 101 carries it now, and the tunnel works as before.
#[tokio::test]
async fn a_sticky_pools_101_carries_the_cookie() {
    let echo = echo_backend().await;
    let extra = format!("{QUIET}\n[pools.web.sticky]\ncookie = \"SRV\"\n");
    let (balancer, _rx) = start(&config_text(&[echo.entry("echo")], "", &extra)).await;
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
    let cookie = header(&head, "set-cookie").unwrap_or_default();
    assert!(cookie.starts_with("SRV="), "{head}");
    client.write_all(b"hello").await.unwrap();
    let echoed = tokio::time::timeout(DEADLINE, read_exact_buf(&mut client, &mut buf, 5))
        .await
        .expect("echo in time")
        .expect("echoed bytes");
    assert_eq!(echoed, b"hello");
}

/// A WebSocket upgrade on a parked connection (quiet for a watcher period after a plain
/// request) gets its 101 and a tunnel that echoes both ways, even once quiet again.
#[tokio::test]
async fn a_websocket_upgrade_on_a_parked_connection_passes_through() {
    let echo = echo_backend().await;
    let (balancer, _rx) = start(&config_text(
        &[echo.entry("echo")],
        "header_read_timeout = \"200ms\"\nidle_timeout = \"30s\"",
        QUIET,
    ))
    .await;
    let mut client = TcpStream::connect(balancer.local_addrs()[0]).await.unwrap();
    let mut buf = Vec::new();
    client
        .write_all(b"GET /plain HTTP/1.1\r\nHost: app.test\r\n\r\n")
        .await
        .unwrap();
    let head = read_head(&mut client, &mut buf).await.expect("an answer");
    assert!(head.starts_with("HTTP/1.1 200"), "{head}");
    assert_eq!(
        read_body(&mut client, &mut buf, &head).await.unwrap(),
        b"plain"
    );
    crate::support::wait::wait_until("the connection parks", || balancer.parks() >= 1).await;
    client
        .write_all(
            b"GET /chat HTTP/1.1\r\nHost: app.test\r\nConnection: Upgrade\r\n\
              Upgrade: websocket\r\nSec-WebSocket-Version: 13\r\n\r\n",
        )
        .await
        .unwrap();
    let head = tokio::time::timeout(DEADLINE, read_head(&mut client, &mut buf))
        .await
        .expect("a 101 in time")
        .expect("a response head");
    assert!(head.starts_with("HTTP/1.1 101"), "{head}");
    assert!(buf.is_empty(), "no bytes may follow a 101 head unasked");
    let parks = balancer.parks();
    for message in [&b"hello"[..], &[7u8; 3000][..]] {
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
    // Quiet for several watcher periods (50 ms): a tunnel is not an HTTP connection to park.
    // The one wait of the test on time itself: nothing to wait on but its passing.
    tokio::time::sleep(Duration::from_millis(300)).await;
    client.write_all(b"still there").await.unwrap();
    let echoed = tokio::time::timeout(DEADLINE, read_exact_buf(&mut client, &mut buf, 11))
        .await
        .expect("echo in time")
        .expect("echoed bytes");
    assert_eq!(echoed, b"still there");
    assert_eq!(balancer.parks(), parks, "the tunnel never parks");
    assert_eq!(balancer.parked_connections(), 0);
    assert_eq!(echo.hits(), 2);
}

/// A backend's last bytes in a tunnel reach the client even though the backend resets the
/// connection right after them: the tunnel's copy ends with the reset's error, and what it had
/// written to the client must not be lost with it (a write the client's socket took is sent,
/// as the kernel sends what it took before a close).
#[tokio::test]
async fn a_tunnels_last_bytes_before_a_backend_reset_reach_the_client() {
    let backend = RawBackend::serving(|mut stream| async move {
        let mut buf = Vec::new();
        if read_head(&mut stream, &mut buf).await.is_none() {
            return;
        }
        let switch = b"HTTP/1.1 101 Switching Protocols\r\nConnection: Upgrade\r\nUpgrade: websocket\r\n\r\n";
        if stream.write_all(switch).await.is_err() {
            return;
        }
        // The client's farewell, then the backend's, then a reset (SO_LINGER 0).
        let mut chunk = [0u8; 4];
        if stream.read_exact(&mut chunk).await.is_err() {
            return;
        }
        let _ = stream.write_all(b"last words").await;
        let _ = socket2::SockRef::from(&stream).set_linger(Some(Duration::ZERO));
    })
    .await;
    let (balancer, _rx) = start(&config_text(&[backend.entry("ws")], "", QUIET)).await;
    let mut client = TcpStream::connect(balancer.local_addrs()[0]).await.unwrap();
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
    client.write_all(b"bye?").await.unwrap();
    let mut rest = std::mem::take(&mut buf);
    let _ = tokio::time::timeout(DEADLINE, client.read_to_end(&mut rest)).await;
    assert_eq!(
        String::from_utf8_lossy(&rest),
        "last words",
        "the backend's last bytes, then the end"
    );
    drop(balancer);
}
