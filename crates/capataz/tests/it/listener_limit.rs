//! A listener's `max_connections` (HAProxy's `maxconn` on a frontend, Envoy's listener
//! connection limit): at the limit, a connection taken waits unserved and the accept loop
//! takes no other, so the next ones wait in the kernel's backlog, until one closes (or a
//! reload raises the limit); QUIC connections over it are refused. The count bounded is the listener's
//! `capataz_client_connections_open`, from each connection's accept (a TLS handshake
//! included); the tests compare it, and `capataz_client_connections_limit_reached_total`, with
//! what the clients saw. Nothing of it reaches a backend or its health.

use std::net::SocketAddr;
use std::time::Duration;

use tokio::io::AsyncWriteExt;
use tokio::net::{TcpStream, UnixStream};

use crate::support::access_log::LogDir;
use crate::support::balancer::{backends, metrics_text, parse, start, ConfigText};
use crate::support::h3client::connect;
use crate::support::raw::{read_reply, Reply};
use crate::support::tls::{self, Pki};
use crate::support::unix::UnixClient;
use crate::support::wait::wait_until;
use crate::support::DEADLINE;
use capataz::server::Balancer;

/// How long a connection that must wait is watched for an answer it must not get. Only a
/// check of absence: a slow machine can make it pass wrongly, never fail wrongly.
pub(super) const QUIET: Duration = Duration::from_millis(300);

/// The value of the sample `series` (name and labels, as written), 0 if absent.
pub(super) fn sample(balancer: &Balancer, series: &str) -> f64 {
    metrics_text(balancer)
        .lines()
        .find_map(|l| l.strip_prefix(series)?.strip_prefix(' ')?.parse().ok())
        .unwrap_or(0.0)
}

/// The first listener's open connections, as its gauge says.
pub(super) fn open(balancer: &Balancer) -> f64 {
    sample(
        balancer,
        "capataz_client_connections_open{listener=\"listener-0\"}",
    )
}

/// Times the first listener reached its limit.
pub(super) fn reached(balancer: &Balancer) -> f64 {
    sample(
        balancer,
        "capataz_client_connections_limit_reached_total{listener=\"listener-0\"}",
    )
}

/// The first listener in `/status`.
fn status_listener(balancer: &Balancer) -> serde_json::Value {
    let views = balancer.supervisor().listener_views();
    let page = capataz::status::page(&balancer.pools(), "now", None, &views).expect("a page");
    let page: serde_json::Value = serde_json::from_slice(&page).expect("JSON");
    page["listeners"][0].clone()
}

/// Sends a keep-alive `GET path`.
pub(super) async fn send_get(stream: &mut TcpStream, path: &str) {
    let request = format!("GET {path} HTTP/1.1\r\nHost: app.test\r\n\r\n");
    stream.write_all(request.as_bytes()).await.expect("send");
}

/// A keep-alive connection that was served one request.
pub(super) async fn served(addr: SocketAddr) -> TcpStream {
    let mut stream = TcpStream::connect(addr).await.expect("connect");
    send_get(&mut stream, "/").await;
    let reply = reply(&mut stream).await.expect("an answer");
    assert_eq!(reply.status, 200);
    stream
}

/// The next answer on `stream`, within the deadline.
pub(super) async fn reply(stream: &mut TcpStream) -> Option<Reply> {
    let mut buf = Vec::new();
    tokio::time::timeout(DEADLINE, read_reply(stream, &mut buf))
        .await
        .expect("an answer or a close within the deadline")
}

/// A connection that connected (the kernel's backlog took it) and sent a request, which
/// must not be answered while the listener is full.
pub(super) async fn waiting(addr: SocketAddr) -> TcpStream {
    let mut stream = TcpStream::connect(addr)
        .await
        .expect("the backlog takes it");
    send_get(&mut stream, "/late").await;
    let mut buf = Vec::new();
    let early = tokio::time::timeout(QUIET, read_reply(&mut stream, &mut buf)).await;
    assert!(early.is_err(), "served over the limit: {early:?}");
    stream
}

#[tokio::test]
async fn connections_over_the_limit_wait_until_one_closes() {
    let b = backends(&["a"]).await;
    let text = ConfigText::sims(&b).listener("max_connections = 2").build();
    let (balancer, _rx) = start(&text).await;
    let addr = balancer.local_addrs()[0];
    // Every series of a listener with a limit is there from the start.
    assert_eq!(reached(&balancer), 0.0);
    let first = served(addr).await;
    let mut second = served(addr).await;
    assert_eq!(open(&balancer), 2.0);
    let mut third = waiting(addr).await;
    wait_until("the third found it full", || reached(&balancer) == 1.0).await;
    assert_eq!(open(&balancer), 2.0, "the third counted open");
    // `/status` says the same, from the same count.
    let status = status_listener(&balancer);
    assert_eq!(status["open"], 2, "{status}");
    assert_eq!(status["max_connections"], 2, "{status}");
    assert_eq!(status["full"], true, "{status}");
    assert_eq!(status["limit_reached"], 1, "{status}");
    assert_eq!(status["mode"], "http", "{status}");
    assert_eq!(status["address"], addr.to_string(), "{status}");
    let accepted = "capataz_client_connections_accepted_total{listener=\"listener-0\"}";
    assert_eq!(sample(&balancer, accepted), 2.0, "the third was accepted");
    // One closes: the third is taken and served, and the listener is full again.
    drop(first);
    let late = reply(&mut third).await.expect("served once there is room");
    assert_eq!(late.status, 200);
    assert_eq!(sample(&balancer, accepted), 3.0);
    assert_eq!(open(&balancer), 2.0);
    // Full still (two held), and none waits now: the count of waits stays.
    let status = status_listener(&balancer);
    assert_eq!(
        (status["full"].clone(), status["limit_reached"].clone()),
        (true.into(), 1.into())
    );
    // The kept connections go on being served.
    send_get(&mut second, "/again").await;
    assert_eq!(reply(&mut second).await.expect("an answer").status, 200);
    // None of it is the backend's: three requests and one more, all answered, no error.
    let requests = "capataz_requests_total{pool=\"web\",backend=\"a\",class=\"2xx\"}";
    assert_eq!(sample(&balancer, requests), 4.0);
    let errors = "capataz_requests_total{pool=\"web\",backend=\"a\",class=\"error\"}";
    assert_eq!(sample(&balancer, errors), 0.0);
    assert_eq!(
        sample(&balancer, "capataz_backend_up{pool=\"web\",backend=\"a\"}"),
        1.0
    );
}

#[tokio::test]
async fn a_reload_that_raises_the_limit_takes_the_waiting_connection() {
    let b = backends(&["a"]).await;
    let config = |max: &str| ConfigText::sims(&b).listener(max).build();
    let (balancer, _rx) = start(&config("max_connections = 1")).await;
    let addr = balancer.local_addrs()[0];
    let _first = served(addr).await;
    let mut second = waiting(addr).await;
    wait_until("the second found it full", || reached(&balancer) == 1.0).await;
    let raised = config("max_connections = 2");
    balancer.reload(&parse(&raised)).await.expect("reload");
    let late = reply(&mut second).await.expect("served after the reload");
    assert_eq!(late.status, 200);
    assert_eq!(open(&balancer), 2.0);
    // Without a limit, the next ones are taken at once.
    let unlimited = config("");
    balancer.reload(&parse(&unlimited)).await.expect("reload");
    let _more = [served(addr).await, served(addr).await];
    assert_eq!(open(&balancer), 4.0);
    let status = status_listener(&balancer);
    assert_eq!(
        status["max_connections"],
        serde_json::Value::Null,
        "{status}"
    );
    assert_eq!(status["full"], false, "{status}");
    assert_eq!(status["open"], 4, "{status}");
}

#[tokio::test]
async fn a_tls_handshake_holds_a_slot_and_quic_over_the_limit_is_refused() {
    let pki = Pki::new();
    let b = backends(&["a"]).await;
    let (cert, key) = pki.server("site", &["site.test"], None);
    let listener = format!(
        "max_connections = 1\nheader_read_timeout = \"60s\"\n{}[listeners.tls.http3]\n",
        Pki::listener(&[(cert.as_path(), key.as_path())], "")
    );
    let text = ConfigText::sims(&b).listener(&listener).build();
    let (balancer, _rx) = start(&text).await;
    let addr = balancer.local_addrs()[0];
    // A client that connected and is silent, its handshake not begun, holds the one slot.
    let silent = TcpStream::connect(addr).await.expect("connect");
    wait_until("the silent connection counted", || open(&balancer) == 1.0).await;
    let accepted = "capataz_client_connections_accepted_total{listener=\"listener-0\"}";
    assert_eq!(
        sample(&balancer, accepted),
        0.0,
        "accepted before its handshake"
    );
    // HTTP/3 over the limit: refused at once, before any handshake.
    let refused = connect(&pki, addr, "site.test").await;
    assert!(
        refused.is_err(),
        "an HTTP/3 connection over the limit was served"
    );
    let series = "capataz_quic_handshakes_total{listener=\"listener-0\",result=\"refused\"}";
    assert_eq!(sample(&balancer, series), 1.0);
    // The silent one goes: HTTP/3 is served, and holds the slot in its turn.
    drop(silent);
    wait_until("the slot freed", || open(&balancer) == 0.0).await;
    let mut h3 = connect(&pki, addr, "site.test")
        .await
        .expect("HTTP/3 served");
    let answer = h3.get("site.test", "/").await.expect("an answer");
    assert_eq!(answer.head.status(), 200);
    assert_eq!(open(&balancer), 1.0);
    // A TLS client meanwhile waits in the backlog, and is served once HTTP/3 closes.
    let client = tls::Client::trusting(&pki);
    let tls_client = tokio::spawn(async move {
        let mut stream = client.connect(addr, "site.test").await.expect("handshake");
        tls::get(&mut stream, "site.test").await
    });
    tokio::time::sleep(QUIET).await;
    if tls_client.is_finished() {
        panic!(
            "a TLS client was served over the limit: {:?}",
            tls_client.await
        );
    }
    h3.connection.close(0u32.into(), b"done");
    drop(h3);
    let (head, _) = tokio::time::timeout(DEADLINE, tls_client)
        .await
        .expect("served within the deadline")
        .expect("the client task")
        .expect("an answer");
    assert!(head.starts_with("http/1.1 200"), "{head}");
}

#[tokio::test]
async fn a_unix_socket_listener_holds_its_limit_too() {
    let dir = LogDir::new();
    let socket = dir.path("front.sock");
    let b = backends(&["a"]).await;
    let text = format!(
        "[[listeners]]\naddress = \"unix:{}\"\nmax_connections = 1\n\n[pools.web]\n\
         backends = [{{ address = \"{}\" }}]\n[pools.web.active]\nkind = \"none\"\n",
        socket.display(),
        b[0].addr()
    );
    let (balancer, _rx) = start(&text).await;
    let mut first = UnixClient::connect(&socket).await;
    assert_eq!(first.get("/").await.status, 200);
    // The second connects (the backlog) and sends its request, unanswered while the first lives.
    let mut second = UnixStream::connect(&socket)
        .await
        .expect("the backlog takes it");
    second
        .write_all(b"GET /late HTTP/1.1\r\nHost: app.test\r\n\r\n")
        .await
        .expect("send");
    let mut byte = [0u8; 1];
    let early = tokio::time::timeout(QUIET, tokio::io::AsyncReadExt::read(&mut second, &mut byte));
    assert!(early.await.is_err(), "served over the limit");
    wait_until("the second found it full", || reached(&balancer) == 1.0).await;
    drop(first);
    let mut head = Vec::new();
    let read = async {
        while !head.ends_with(b"\r\n\r\n") {
            let n = tokio::io::AsyncReadExt::read(&mut second, &mut byte)
                .await
                .expect("read");
            assert_eq!(n, 1, "closed before an answer");
            head.push(byte[0]);
        }
    };
    tokio::time::timeout(DEADLINE, read)
        .await
        .expect("served once the first closed");
    assert!(head.starts_with(b"HTTP/1.1 200"), "{head:?}");
}
