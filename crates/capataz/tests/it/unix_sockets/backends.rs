//! Unix socket backends (`address = "unix:/path"`) beside TCP ones in one pool: traffic and
//! keep-alive reuse, h2c, the PROXY protocol header, TCP mode, active and passive checks when
//! the socket file goes away and comes back, and what `/status`, the metrics and the access
//! log call them (the address, path included).

use std::path::Path;
use std::time::Duration;

use capataz::sim::SimBackend;
use capataz_health::{Outcome, Reason, State};
use http::Method;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpStream, UnixListener};

use crate::support::access_log::{self, LogDir};
use crate::support::balancer::{metrics_text, start, wait_probed_up};
use crate::support::client::Client;
use crate::support::events::{transition_of, wait_for};
use crate::support::raw::read_reply;
use crate::support::unix::UnixBackend;
use crate::support::wait::{until_ok, wait_until};
use crate::support::{any, DEADLINE};

/// A balancer config: an admin listener, one HTTP listener (`listener` lines), pool `web`
/// over `backends` (each a TOML inline table's inside) with `pool` lines.
fn config(backends: &[String], listener: &str, pool: &str) -> String {
    let list = backends
        .iter()
        .map(|b| format!("{{ {b} }}"))
        .collect::<Vec<_>>()
        .join(", ");
    format!(
        "[admin]\naddress = \"127.0.0.1:0\"\n\n[[listeners]]\naddress = \"127.0.0.1:0\"\n\
         {listener}\n\n[pools.web]\nbackends = [{list}]\n{pool}\n"
    )
}

/// `address = "unix:<path>"`.
fn unix_entry(path: &Path) -> String {
    format!("address = \"unix:{}\"", path.display())
}

const PROBED: &str =
    "[pools.web.active]\ninterval = \"50ms\"\ntimeout = \"500ms\"\nrise = 1\nfall = 2\n";
const UNPROBED: &str = "[pools.web.active]\nkind = \"none\"\n";

#[tokio::test]
async fn a_mixed_pool_spreads_over_unix_and_tcp_backends_and_names_the_path() {
    let dir = LogDir::new();
    let socket = dir.path("u.sock");
    let _unix = UnixBackend::start(&socket, "u");
    let tcp = SimBackend::start("t", any()).await.unwrap();
    let address = format!("unix:{}", socket.display());
    let log = dir.path("access.log");
    let text = config(
        &[
            unix_entry(&socket),
            format!("name = \"t\", address = \"{}\"", tcp.addr()),
        ],
        &access_log::table(&log, "text", ""),
        PROBED,
    );
    let (balancer, _rx) = start(&text).await;
    let admin = balancer.admin_addr().unwrap();
    wait_probed_up(admin, None, 2).await;
    let mut client = Client::new(balancer.local_addrs()[0]);
    let mut served = Vec::new();
    for i in 0..6 {
        let answer = client.get(&format!("/r{i}")).await;
        assert_eq!(answer.status, 200);
        served.push(answer.backend.unwrap_or_default());
    }
    assert_eq!(served.iter().filter(|b| *b == "u").count(), 3, "{served:?}");
    assert_eq!(served.iter().filter(|b| *b == "t").count(), 3, "{served:?}");
    let status = capataz::ctl::request(admin, Method::GET, "/status", None)
        .await
        .expect("GET /status");
    let backends = &status["pools"][0]["backends"];
    assert_eq!(backends[0]["name"], address.as_str(), "{backends:#}");
    assert_eq!(backends[0]["address"], address.as_str(), "{backends:#}");
    assert_eq!(backends[0]["state"], "UP", "{backends:#}");
    // `capataz status` shows the path in its table.
    let rendered = capataz::ctl::render_status(&status);
    assert!(
        rendered
            .lines()
            .any(|l| l.contains(&address) && l.contains("UP")),
        "{rendered}"
    );
    let metrics = metrics_text(&balancer);
    let label = format!("backend=\"{address}\"");
    assert!(metrics.contains(&label), "no series labelled {label}");
    let lines = access_log::wait_lines(&log, 6).await;
    let logged = format!(" backend={address} ");
    assert_eq!(
        lines.iter().filter(|l| l.contains(&logged)).count(),
        3,
        "{lines:#?}"
    );
}

#[tokio::test]
async fn one_client_connection_reuses_one_socket_connection() {
    let dir = LogDir::new();
    let socket = dir.path("u.sock");
    let unix = UnixBackend::start(&socket, "u");
    let text = config(&[unix_entry(&socket)], "", UNPROBED);
    let (balancer, _rx) = start(&text).await;
    let mut client = Client::new(balancer.local_addrs()[0]);
    for i in 0..5 {
        let answer = client.get(&format!("/k{i}")).await;
        assert_eq!((answer.status, answer.text()), (200, format!("u /k{i}")));
    }
    assert_eq!((unix.accepted(), unix.requests()), (1, 5));
}

#[tokio::test]
async fn an_h2c_pool_multiplexes_clients_over_one_socket_connection() {
    let dir = LogDir::new();
    let socket = dir.path("h2.sock");
    let unix = UnixBackend::start(&socket, "u");
    let text = config(
        &[unix_entry(&socket)],
        "",
        &format!("protocol = \"h2c\"\n{PROBED}"),
    );
    let (balancer, _rx) = start(&text).await;
    wait_probed_up(balancer.admin_addr().unwrap(), None, 1).await;
    let probes = unix.accepted();
    let (mut a, mut b) = (
        Client::new(balancer.local_addrs()[0]),
        Client::new(balancer.local_addrs()[0]),
    );
    for i in 0..3 {
        assert_eq!(a.get(&format!("/a{i}")).await.text(), format!("u /a{i}"));
        assert_eq!(b.get(&format!("/b{i}")).await.text(), format!("u /b{i}"));
    }
    // Probes open a connection each; the traffic shares one.
    assert!(
        unix.accepted() - probes <= 3,
        "{} {probes}",
        unix.accepted()
    );
}

#[tokio::test]
async fn the_proxy_protocol_header_to_a_unix_backend_names_the_tcp_client() {
    let dir = LogDir::new();
    let socket = dir.path("p.sock");
    let unix = UnixBackend::start_proxied(&socket, "u");
    let pool = "send_proxy_protocol = \"v1\"\n[pools.web.active]\nkind = \"tcp\"\n\
                interval = \"50ms\"\ntimeout = \"500ms\"\n";
    let text = config(&[unix_entry(&socket)], "", pool);
    let (balancer, _rx) = start(&text).await;
    wait_until("a probe's header", || !unix.headers().is_empty()).await;
    assert_eq!(unix.headers()[0], "PROXY UNKNOWN\r\n");
    let listener = balancer.local_addrs()[0];
    let mut stream = TcpStream::connect(listener).await.unwrap();
    let port = stream.local_addr().unwrap().port();
    stream
        .write_all(b"GET /p HTTP/1.1\r\nHost: app.test\r\n\r\n")
        .await
        .unwrap();
    let mut buf = Vec::new();
    let reply = tokio::time::timeout(DEADLINE, read_reply(&mut stream, &mut buf))
        .await
        .expect("an answer within the deadline")
        .expect("an answer");
    assert_eq!(reply.status, 200);
    // As HAProxy does for a send-proxy server on a socket: the client's TCP addresses.
    let traffic: Vec<String> = unix
        .headers()
        .into_iter()
        .filter(|h| h.contains("TCP4"))
        .collect();
    let expected = format!(
        "PROXY TCP4 127.0.0.1 127.0.0.1 {port} {}\r\n",
        listener.port()
    );
    assert_eq!(traffic, [expected]);
}

#[tokio::test]
async fn a_removed_socket_goes_down_by_probes_and_comes_back_when_rebound() {
    let dir = LogDir::new();
    let socket = dir.path("gone.sock");
    let unix = UnixBackend::start(&socket, "u");
    let name = format!("unix:{}", socket.display());
    let text = config(&[unix_entry(&socket)], "", PROBED);
    let (balancer, mut rx) = start(&text).await;
    wait_probed_up(balancer.admin_addr().unwrap(), None, 1).await;
    drop(unix);
    std::fs::remove_file(&socket).unwrap();
    let down = wait_for(&mut rx, "DOWN", |e| {
        transition_of(e, &name, State::Down).is_some()
    })
    .await;
    let reason = transition_of(&down, &name, State::Down).unwrap().reason;
    assert!(
        matches!(
            reason,
            Reason::ProbesFailed {
                last: Outcome::Refused,
                ..
            }
        ),
        "{reason:?}"
    );
    let _back = UnixBackend::start(&socket, "u");
    wait_for(&mut rx, "UP again", |e| {
        transition_of(e, &name, State::Up).is_some()
    })
    .await;
}

#[tokio::test]
async fn a_connect_to_a_missing_socket_is_refused_charged_and_retried_elsewhere() {
    let dir = LogDir::new();
    let socket = dir.path("missing.sock");
    let tcp = SimBackend::start("t", any()).await.unwrap();
    let pool = "[pools.web.active]\nkind = \"none\"\n[pools.web.passive]\n\
                consecutive_errors = 2\nejection_time = \"200ms\"\n\
                [pools.web.retries]\nattempts = 1\nbudget_percent = 100\n";
    let text = config(
        &[
            format!("name = \"u\", {}", unix_entry(&socket)),
            format!("name = \"t\", address = \"{}\"", tcp.addr()),
        ],
        "",
        pool,
    );
    let (balancer, mut rx) = start(&text).await;
    let mut client = Client::new(balancer.local_addrs()[0]);
    for i in 0..4 {
        // Every request is answered: a refused connect is retried on t.
        let answer = client.get(&format!("/m{i}")).await;
        assert_eq!(answer.backend.as_deref(), Some("t"));
    }
    let down = wait_for(&mut rx, "u ejected", |e| {
        transition_of(e, "u", State::Down).is_some()
    })
    .await;
    let reason = transition_of(&down, "u", State::Down).unwrap().reason;
    assert!(
        matches!(
            reason,
            Reason::TrafficErrors {
                last: Outcome::Refused,
                ..
            }
        ),
        "{reason:?}"
    );
    // Rebound: once the ejection ends, u takes its share again.
    let unix = UnixBackend::start(&socket, "u");
    until_ok(
        "traffic to u again",
        Duration::from_millis(20),
        async || match client.get("/back").await.backend.as_deref() {
            Some("u") => Ok(()),
            other => Err(format!("{other:?}")),
        },
    )
    .await;
    assert!(unix.requests() >= 1);
}

#[tokio::test]
async fn a_tcp_pool_relays_to_a_unix_backend_checked_by_tcp_probes() {
    let dir = LogDir::new();
    let socket = dir.path("t.sock");
    let listener = UnixListener::bind(&socket).unwrap();
    let echo = tokio::spawn(async move {
        while let Ok((mut stream, _)) = listener.accept().await {
            tokio::spawn(async move {
                let (mut read, mut write) = stream.split();
                let _ = write.write_all(b"hello\n").await;
                let _ = tokio::io::copy(&mut read, &mut write).await;
            });
        }
    });
    let name = format!("unix:{}", socket.display());
    let text = format!(
        "[admin]\naddress = \"127.0.0.1:0\"\n\n[[listeners]]\naddress = \"127.0.0.1:0\"\nmode = \"tcp\"\npool = \"db\"\n\n\
         [pools.db]\nprotocol = \"tcp\"\nbackends = [{{ {} }}]\n\
         [pools.db.active]\nkind = \"tcp\"\ninterval = \"50ms\"\ntimeout = \"500ms\"\n\
         rise = 1\nfall = 2\n",
        unix_entry(&socket)
    );
    let (balancer, mut rx) = start(&text).await;
    wait_probed_up(balancer.admin_addr().unwrap(), None, 1).await;
    let mut session = TcpStream::connect(balancer.local_addrs()[0]).await.unwrap();
    session.write_all(b"ping").await.unwrap();
    session.shutdown().await.unwrap();
    let mut all = Vec::new();
    tokio::time::timeout(DEADLINE, session.read_to_end(&mut all))
        .await
        .expect("the session ends")
        .unwrap();
    assert_eq!(all, b"hello\nping");
    echo.abort();
    std::fs::remove_file(&socket).unwrap();
    let down = wait_for(&mut rx, "DOWN once the socket is gone", |e| {
        transition_of(e, &name, State::Down).is_some()
    })
    .await;
    let reason = transition_of(&down, &name, State::Down).unwrap().reason;
    assert!(
        matches!(
            reason,
            Reason::ProbesFailed {
                last: Outcome::Refused,
                ..
            }
        ),
        "{reason:?}"
    );
}
