//! Findings of a hostile pass over the request path (a malicious client, a broken backend),
//! each pinned by the behaviour it fixed: what the client gets, and what the backend is
//! charged. Backends are raw sockets that write exactly the bytes under test.

mod support;

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use capataz::server::Balancer;
use capataz_health::Outcome;
use tokio::io::AsyncWriteExt;
use tokio::net::TcpStream;

use support::balancer::{start, ConfigText};
use support::raw::{raw_roundtrip, read_head, status_of, RawBackend};

/// No probes, no retries, and a passive side on which any charge shows.
const POOL: &str = "retries = { attempts = 0 }\n\n\
    [pools.web.active]\nkind = \"none\"\n\n\
    [pools.web.passive]\nconsecutive_errors = 1\nmax_ejected_percent = 100\n";

/// A backend that answers every request head on its connection with `answer`, in one write,
/// and keeps the connection open.
async fn answering(answer: &'static [u8]) -> RawBackend {
    RawBackend::start(
        move |mut stream: TcpStream, hits: Arc<AtomicU64>| async move {
            let mut buf = Vec::new();
            while read_head(&mut stream, &mut buf).await.is_some() {
                hits.fetch_add(1, Ordering::SeqCst);
                if stream.write_all(answer).await.is_err() {
                    return;
                }
            }
        },
    )
    .await
}

async fn balancer(backend: &RawBackend, listener: &str) -> (Balancer, std::net::SocketAddr) {
    let text = ConfigText::new(&[backend.entry("b0")])
        .listener(listener)
        .extra(POOL)
        .build();
    let (balancer, _events) = start(&text).await;
    let addr = balancer.local_addrs()[0];
    (balancer, addr)
}

fn charged(balancer: &Balancer) -> Vec<Outcome> {
    balancer.pool("web").expect("pool web").backends[0]
        .traffic
        .recent()
}

/// `Connection: close`, so that `raw_roundtrip` (which reads to the close) ends with the answer.
const GET: &[u8] = b"GET / HTTP/1.1\r\nHost: app.test\r\nConnection: close\r\n\r\n";

/// Finding 1: a chunked answer whose very first chunk line is broken (not hex, a size beyond
/// 64 bits, data not followed by CRLF, a bare LF) used to reach the client as nothing at all:
/// capataz handed hyper the head, the body failed at its first poll, and hyper closed the
/// connection without writing even the status line. HAProxy answers 502. Now the bytes that
/// came with the head are checked first: 502, and the backend is charged a malformed answer.
#[tokio::test]
async fn a_chunked_answer_broken_from_its_first_bytes_gets_502_not_a_bare_close() {
    for answer in [
        &b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\nOK\r\n0\r\n\r\n"[..],
        b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nFFFFFFFFFFFFFFFFFF\r\nOK\r\n0\r\n\r\n",
        b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n2\r\nOKXX0\r\n\r\n",
        b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n2\nOK\n0\n\n",
        b"HTTP/1.1 200 OK\r\nContent-Length: 4\r\nTransfer-Encoding: chunked\r\n\r\n-4\r\nOKOK\r\n0\r\n\r\n",
    ] {
        let backend = answering(answer).await;
        let (balancer, addr) = balancer(&backend, "").await;
        let reply = raw_roundtrip(addr, GET).await;
        let text = String::from_utf8_lossy(answer);
        assert_eq!(
            status_of(&reply),
            Some(502),
            "{text}: {}",
            String::from_utf8_lossy(&reply)
        );
        assert_eq!(charged(&balancer), [Outcome::Malformed], "{text}");
    }
}

/// Finding 2 (the bare-LF half): a chunked body whose lines end in a bare LF after a good
/// start used to leave the client waiting `body_idle` (60 s by default) for a CRLF that never
/// comes, and charged the backend a timeout. The bare LF now breaks the body at once.
#[tokio::test]
async fn a_bare_lf_in_a_chunked_answer_breaks_it_at_once() {
    // The head and a first chunk, then (in a later segment, after the head was relayed) a
    // last chunk ended by bare LFs; the connection stays open.
    let backend = RawBackend::start(|mut stream: TcpStream, _hits: Arc<AtomicU64>| async move {
        let mut buf = Vec::new();
        if read_head(&mut stream, &mut buf).await.is_some() {
            let head = b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n2\r\nOK\r\n";
            let _ = stream.write_all(head).await;
            // Only splits the writes into two segments; either way the answer is judged.
            tokio::time::sleep(std::time::Duration::from_millis(50)).await;
            let _ = stream.write_all(b"0\n\n").await;
            let _ = read_head(&mut stream, &mut buf).await;
        }
    })
    .await;
    let (balancer, addr) = balancer(&backend, "").await;
    // raw_roundtrip panics unless the connection ends within the support deadline (20 s),
    // well short of the default 60 s body_idle the client used to wait.
    let reply = raw_roundtrip(addr, GET).await;
    let text = String::from_utf8_lossy(&reply);
    match status_of(&reply) {
        // The head was relayed: the body is cut, never made to look whole.
        Some(200) => assert!(!text.ends_with("0\r\n\r\n"), "{text}"),
        // Both writes arrived together: judged with the head.
        Some(502) => {}
        other => panic!("{other:?}: {text}"),
    }
    let outcomes = charged(&balancer);
    assert!(
        matches!(outcomes[..], [Outcome::Reset] | [Outcome::Malformed]),
        "{outcomes:?}"
    );
}

/// Finding 3: a `Host` that is not `uri-host [":" port]` was routed by what capataz took for
/// its host (`evil:@a.test` by `evil`, `[evil]` by `evil`) while the backend received it whole
/// and may read another host in it (`a.test`, the authority after the userinfo). RFC 9112
/// section 3.2 asks for 400 for an invalid Host field value; HAProxy forwards them all as they
/// are. Now: 400, `Connection: close`, and no backend is asked.
#[tokio::test]
async fn host_values_outside_the_uri_host_grammar_get_400_and_never_reach_a_backend() {
    let backend = answering(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok").await;
    let routes = "[[listeners.routes]]\nhost = \"evil\"\npool = \"web\"";
    let (_balancer, addr) = balancer(&backend, routes).await;
    for host in [
        &b"evil:@a.test"[..],
        b"u@evil",
        b"[evil]",
        b"[evil]:80",
        b"evil:x",
        b"evil:80:81",
        b"evil b",
        b"evil/x",
        b"evil\\",
        b"ev\xffil",
    ] {
        let mut request = b"GET / HTTP/1.1\r\nHost: ".to_vec();
        request.extend_from_slice(host);
        request.extend_from_slice(b"\r\n\r\n");
        let reply = raw_roundtrip(addr, &request).await;
        let text = String::from_utf8_lossy(&reply);
        assert_eq!(
            status_of(&reply),
            Some(400),
            "{}: {text}",
            String::from_utf8_lossy(host)
        );
        assert!(
            text.to_ascii_lowercase().contains("connection: close"),
            "{text}"
        );
    }
    // HTTP/1.0 with an absolute-form target and no Host: the target's authority is the host.
    let reply = raw_roundtrip(addr, b"GET http://u@evil/ HTTP/1.0\r\n\r\n").await;
    assert_eq!(status_of(&reply), Some(400));
    assert_eq!(backend.hits(), 0);
    // Valid forms still route: the name, with a port, with a trailing empty port.
    for host in ["evil", "EVIL:8080", "evil:"] {
        let request = format!("GET / HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n\r\n");
        let reply = raw_roundtrip(addr, request.as_bytes()).await;
        assert_eq!(status_of(&reply), Some(200), "{host}");
    }
}

/// Finding 4 (docs): besides `max_header_bytes`, a request head may carry at most 100 header
/// fields (hyper's limit); more get 431 however small the head, which the docs did not say.
/// HAProxy's limit is 101 fields (`tune.http.maxhdr`), answered 400.
#[tokio::test]
async fn a_request_with_more_than_100_header_fields_gets_431() {
    let backend = answering(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok").await;
    let (_balancer, addr) = balancer(&backend, "").await;
    let head = |fields: usize| {
        let mut request = b"GET / HTTP/1.1\r\nHost: app.test\r\nConnection: close\r\n".to_vec();
        for i in 2..fields {
            request.extend_from_slice(format!("X-{i}: y\r\n").as_bytes());
        }
        request.extend_from_slice(b"\r\n");
        request
    };
    assert_eq!(status_of(&raw_roundtrip(addr, &head(100)).await), Some(200));
    assert_eq!(status_of(&raw_roundtrip(addr, &head(101)).await), Some(431));
    assert_eq!(backend.hits(), 1);
}

/// Finding 5: a request whose `Transfer-Encoding` is not `chunked` once (`chunked, chunked`,
/// `identity, chunked`, two `chunked` fields) was read by hyper as one chunked body and
/// forwarded, although capataz refuses the same from a backend and HAProxy refuses it from a
/// client (400, 422 for `identity`): a proxy in front that reads the codings otherwise
/// disagrees with capataz on where the body ends. Now: 400, `Connection: close`, and neither
/// the request nor what follows it on the connection reaches a backend.
#[tokio::test]
async fn a_request_with_transfer_codings_other_than_chunked_once_gets_400() {
    let backend = answering(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok").await;
    let (_balancer, addr) = balancer(&backend, "").await;
    for codings in [
        "Transfer-Encoding: chunked, chunked",
        "Transfer-Encoding: identity, chunked",
        "Transfer-Encoding: chunked\r\nTransfer-Encoding: chunked",
        "Transfer-Encoding: chunked\r\nTransfer-Encoding: identity",
    ] {
        let request = format!(
            "POST / HTTP/1.1\r\nHost: app.test\r\n{codings}\r\n\r\n\
             3\r\nabc\r\n0\r\n\r\nGET /smuggled HTTP/1.1\r\nHost: app.test\r\n\r\n"
        );
        let reply = raw_roundtrip(addr, request.as_bytes()).await;
        let text = String::from_utf8_lossy(&reply);
        assert_eq!(status_of(&reply), Some(400), "{codings}: {text}");
        assert!(
            text.to_ascii_lowercase().contains("connection: close"),
            "{text}"
        );
    }
    assert_eq!(backend.hits(), 0);
    // `chunked` once still goes through.
    let reply = raw_roundtrip(
        addr,
        b"POST / HTTP/1.1\r\nHost: app.test\r\nTransfer-Encoding: chunked\r\n\
          Connection: close\r\n\r\n3\r\nabc\r\n0\r\n\r\n",
    )
    .await;
    assert_eq!(status_of(&reply), Some(200));
}

/// Finding 6: a route for an IPv6 literal never matched. The config check keeps a route's
/// brackets (`host = "[::1]"`, written so because `::1` alone is refused), but the request's
/// Host lost them before the comparison (`[::1]:8080` became `::1`), so such a request fell
/// through to the next route, or got 404.
#[tokio::test]
async fn a_route_for_an_ipv6_literal_matches_its_host() {
    let backend = answering(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok").await;
    let routes = "[[listeners.routes]]\nhost = \"[::1]\"\npool = \"web\"";
    let (_balancer, addr) = balancer(&backend, routes).await;
    for host in ["[::1]", "[::1]:8080"] {
        let request = format!("GET / HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n\r\n");
        let reply = raw_roundtrip(addr, request.as_bytes()).await;
        assert_eq!(
            status_of(&reply),
            Some(200),
            "{host}: {}",
            String::from_utf8_lossy(&reply)
        );
    }
    let reply = raw_roundtrip(
        addr,
        b"GET / HTTP/1.1\r\nHost: [::2]\r\nConnection: close\r\n\r\n",
    )
    .await;
    assert_eq!(status_of(&reply), Some(404));
}

/// Finding 7: an upgraded connection (a WebSocket) that went quiet was held forever: the
/// client connection's `idle_timeout` watcher ends with hyper's connection at the upgrade, and
/// the tunnel had no clock of its own, so a client could pin two sockets and a task per
/// upgrade indefinitely (or simply vanish without a FIN). HAProxy closes an idle tunnel after
/// `timeout tunnel` (else `timeout client`/`server`). Now a tunnel in which no byte moved
/// either way for the listener's `idle_timeout` is closed at both ends; one that moves bytes
/// stays up.
#[tokio::test]
async fn an_idle_upgraded_connection_is_closed_after_idle_timeout() {
    use tokio::io::AsyncReadExt;
    let (closed_tx, closed_rx) = tokio::sync::oneshot::channel::<()>();
    let closed_tx = Arc::new(std::sync::Mutex::new(Some(closed_tx)));
    let backend = RawBackend::start(move |mut stream: TcpStream, _hits: Arc<AtomicU64>| {
        let closed_tx = closed_tx.clone();
        async move {
            let mut buf = Vec::new();
            if read_head(&mut stream, &mut buf).await.is_none() {
                return;
            }
            let switch = b"HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\n\
                           Connection: Upgrade\r\n\r\n";
            if stream.write_all(switch).await.is_err() {
                return;
            }
            // Echo until the balancer closes the tunnel.
            let mut chunk = [0u8; 1024];
            while let Ok(n) = stream.read(&mut chunk).await {
                if n == 0 || stream.write_all(&chunk[..n]).await.is_err() {
                    break;
                }
            }
            if let Some(tx) = closed_tx.lock().unwrap().take() {
                let _ = tx.send(());
            }
        }
    })
    .await;
    let (_balancer, addr) = balancer(&backend, "idle_timeout = \"1s\"").await;
    let mut client = TcpStream::connect(addr).await.unwrap();
    client
        .write_all(
            b"GET /ws HTTP/1.1\r\nHost: app.test\r\nConnection: Upgrade\r\nUpgrade: websocket\r\n\r\n",
        )
        .await
        .unwrap();
    let mut buf = Vec::new();
    let head = read_head(&mut client, &mut buf).await.expect("a 101");
    assert!(head.starts_with("HTTP/1.1 101"), "{head}");
    // Bytes moving every 100 ms keep it up well past the 1 s idle timeout.
    for i in 0..25u8 {
        client.write_all(&[b'a' + i % 26]).await.unwrap();
        let mut echo = [0u8; 1];
        tokio::time::timeout(support::DEADLINE, client.read_exact(&mut echo))
            .await
            .expect("an echo in time")
            .expect("the tunnel is up while bytes move");
        assert_eq!(echo[0], b'a' + i % 26);
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
    // Quiet: both ends are closed.
    let mut rest = [0u8; 16];
    let read = tokio::time::timeout(support::DEADLINE, client.read(&mut rest)).await;
    assert!(
        matches!(read, Ok(Ok(0) | Err(_))),
        "the client end of an idle tunnel is closed: {read:?}"
    );
    tokio::time::timeout(support::DEADLINE, closed_rx)
        .await
        .expect("the backend end of an idle tunnel is closed")
        .unwrap();
}

/// Docs finding: the docs said a client that closes mid-body "gets nothing", which holds for a
/// client that is gone; one that only half-closes (shuts down its sending side) can still read,
/// and gets 400 with `Connection: close`. Either way the backend is charged nothing.
#[tokio::test]
async fn a_client_half_closing_mid_body_gets_400_and_charges_nothing() {
    let backend = RawBackend::start(|mut stream: TcpStream, hits: Arc<AtomicU64>| async move {
        let mut buf = Vec::new();
        if read_head(&mut stream, &mut buf).await.is_some() {
            hits.fetch_add(1, Ordering::SeqCst);
            // Read what comes of the body, until capataz gives up on it.
            while support::raw::fill(&mut stream, &mut buf)
                .await
                .is_ok_and(|n| n > 0)
            {}
        }
    })
    .await;
    let (balancer, addr) = balancer(&backend, "").await;
    for request in [
        &b"POST / HTTP/1.1\r\nHost: app.test\r\nContent-Length: 10\r\n\r\n12345"[..],
        b"POST / HTTP/1.1\r\nHost: app.test\r\nTransfer-Encoding: chunked\r\n\r\n5\r\n12345\r\n",
    ] {
        let mut client = TcpStream::connect(addr).await.unwrap();
        client.write_all(request).await.unwrap();
        client.shutdown().await.unwrap();
        let mut reply = Vec::new();
        tokio::time::timeout(
            support::DEADLINE,
            tokio::io::AsyncReadExt::read_to_end(&mut client, &mut reply),
        )
        .await
        .expect("an answer in time")
        .expect("read");
        let text = String::from_utf8_lossy(&reply);
        assert_eq!(status_of(&reply), Some(400), "{text}");
        assert!(
            text.to_ascii_lowercase().contains("connection: close"),
            "{text}"
        );
    }
    assert!(charged(&balancer).is_empty(), "{:?}", charged(&balancer));
}
