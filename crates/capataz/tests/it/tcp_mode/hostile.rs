//! TCP mode against misbehaving peers: a backend that resets before a byte, a client that
//! resets, a flood of silent clients; and the PROXY protocol header a backend gets first.

use capataz_health::State;
use serde_json::Value;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

use super::{config, greeting, to_end, Greeter};
use crate::support::access_log::{table, wait_json, LogDir};
use crate::support::balancer::start;
use crate::support::events::{is_transition, wait_for};
use crate::support::wait::wait_until;
use crate::support::{any, DEADLINE};

/// A backend that reads the client's first bytes and resets the connection (SO_LINGER 0)
/// without having sent one: the connect succeeded, the session broke.
async fn resetter() -> (std::net::SocketAddr, tokio::task::JoinHandle<()>) {
    let listener = TcpListener::bind(any()).await.unwrap();
    let addr = listener.local_addr().unwrap();
    let task = tokio::spawn(async move {
        while let Ok((mut stream, _)) = listener.accept().await {
            tokio::spawn(async move {
                let mut buf = [0; 64];
                let _ = stream.read(&mut buf).await;
                let _ = stream.set_zero_linger();
                drop(stream);
            });
        }
    });
    (addr, task)
}

#[tokio::test]
async fn a_backend_that_resets_before_its_first_byte_is_charged_until_ejected() {
    let (bad, task) = resetter().await;
    let a = Greeter::start("a").await;
    let pool = "active.kind = \"none\"\npassive.consecutive_errors = 2";
    let (balancer, mut rx) = start(&config(&[("bad", bad), ("a", a.addr)], "", pool)).await;
    let addr = balancer.local_addrs()[0];
    let mut served_by_a = 0;
    for _ in 0..4 {
        let mut client = TcpStream::connect(addr).await.unwrap();
        let _ = client.write_all(b"hello\n").await;
        let mut first = [0u8; 2];
        let read = tokio::time::timeout(DEADLINE, client.read(&mut first)).await;
        if matches!(read, Ok(Ok(2))) && &first == b"a\n" {
            served_by_a += 1;
        }
    }
    // Round robin: two sessions went to `bad` (reset before a byte, no retry once connected).
    assert_eq!(served_by_a, 2);
    wait_for(&mut rx, "bad ejected", |e| {
        is_transition(e, "bad", State::Down)
    })
    .await;
    for _ in 0..3 {
        let mut client = TcpStream::connect(addr).await.unwrap();
        assert_eq!(
            greeting(&mut client).await,
            "a",
            "the ejected backend gets no session"
        );
    }
    task.abort();
}

#[tokio::test]
async fn a_client_that_resets_charges_nothing_and_is_logged_as_the_client() {
    let a = Greeter::start("a").await;
    let dir = LogDir::new();
    let log = dir.path("tcp.log");
    let pool = "active.kind = \"none\"\npassive.consecutive_errors = 1";
    let (balancer, _) = start(&config(&[("a", a.addr)], &table(&log, "json", ""), pool)).await;
    for _ in 0..3 {
        let mut client = TcpStream::connect(balancer.local_addrs()[0]).await.unwrap();
        assert_eq!(greeting(&mut client).await, "a");
        client.set_zero_linger().unwrap();
        drop(client);
    }
    let lines = wait_json(&log, 3).await;
    for line in &lines {
        assert_eq!(
            (&line["ended_by"], &line["phase"]),
            (&Value::from("client"), &Value::from("session")),
            "{line}"
        );
    }
    let page = capataz::status::page(&balancer.pools(), "now", None, &[]).unwrap();
    let page: Value = serde_json::from_slice(&page).unwrap();
    let backend = &page["pools"][0]["backends"][0];
    assert_eq!(backend["state"], "UP", "{backend}");
    assert_eq!(backend["passive"]["error_streak"], 0, "{backend}");
}

#[tokio::test]
async fn a_flood_of_silent_clients_is_closed_at_the_idle_timeout_with_its_backend_connections() {
    // capataz has no connection limit of its own (as for HTTP listeners): each session holds one
    // backend connection and at most its two buffers until the idle timeout closes both.
    let a = Greeter::start("a").await;
    let text = config(
        &[("a", a.addr)],
        "idle_timeout = \"2s\"",
        "active.kind = \"none\"",
    );
    let (balancer, _) = start(&text).await;
    let addr = balancer.local_addrs()[0];
    let mut clients = Vec::new();
    for _ in 0..200 {
        clients.push(TcpStream::connect(addr).await.unwrap());
    }
    wait_until("200 sessions open", || {
        balancer.supervisor().open_connections() == 200
    })
    .await;
    wait_until("every session closed", || {
        balancer.supervisor().open_connections() == 0
    })
    .await;
    assert_eq!(
        a.accepted(),
        200,
        "one backend connection per session, no more"
    );
    for mut client in clients {
        let rest = to_end(&mut client).await.unwrap_or_default();
        assert_eq!(rest, b"a\n", "the greeting, then the close");
    }
    let in_flight = &balancer.pool("db").unwrap().backends[0].in_flight;
    assert_eq!(in_flight.load(std::sync::atomic::Ordering::Relaxed), 0);
}

#[tokio::test]
async fn with_send_proxy_protocol_each_backend_connection_starts_with_its_clients_header() {
    let listener = TcpListener::bind(any()).await.unwrap();
    let backend = listener.local_addr().unwrap();
    // Sends back the first line it reads (the header), then closes.
    let task = tokio::spawn(async move {
        while let Ok((mut stream, _)) = listener.accept().await {
            tokio::spawn(async move {
                let mut line = Vec::new();
                let mut byte = [0];
                while stream.read(&mut byte).await.unwrap_or(0) == 1 {
                    line.push(byte[0]);
                    if byte[0] == b'\n' {
                        break;
                    }
                }
                let _ = stream.write_all(&line).await;
                let _ = stream.shutdown().await;
            });
        }
    });
    let pool = "active.kind = \"none\"\nsend_proxy_protocol = \"v1\"";
    let (balancer, _) = start(&config(&[("pp", backend)], "", pool)).await;
    let front = balancer.local_addrs()[0];
    let mut client = TcpStream::connect(front).await.unwrap();
    let mine = client.local_addr().unwrap();
    let header = String::from_utf8(to_end(&mut client).await.unwrap()).unwrap();
    assert_eq!(
        header,
        format!(
            "PROXY TCP4 {} {} {} {}\r\n",
            mine.ip(),
            front.ip(),
            mine.port(),
            front.port()
        )
    );
    task.abort();
}
