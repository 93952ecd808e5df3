//! Listeners on a Unix socket (`address = "unix:/path"`): HTTP/1.1 and h2c to TCP and Unix
//! backends, tcp mode, the socket file's mode, a stale socket replaced and anything else at the
//! path refused untouched, the client as the access log and the backends see it (`unix`, no
//! forwarded address), and the file across a reload and a shutdown.

use std::os::unix::fs::{FileTypeExt, MetadataExt, PermissionsExt};
use std::path::Path;
use std::time::Duration;

use bytes::Bytes;
use capataz::server::Balancer;
use http_body_util::{BodyExt, Empty};
use hyper_util::rt::{TokioExecutor, TokioIo};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, UnixStream};
use tokio::sync::broadcast;

use crate::support::access_log::{self, LogDir};
use crate::support::balancer::{parse, start};
use crate::support::unix::{unix_get, UnixBackend, UnixClient};
use crate::support::DEADLINE;

/// A config with one listener on `socket` (with `listener` lines) and pool `web` over
/// `backends` (TOML inline tables' insides), unprobed.
fn config(socket: &Path, listener: &str, backends: &[String]) -> String {
    let list = backends
        .iter()
        .map(|b| format!("{{ {b} }}"))
        .collect::<Vec<_>>()
        .join(", ");
    format!(
        "[[listeners]]\naddress = \"unix:{}\"\n{listener}\n\n[pools.web]\nbackends = [{list}]\n\
         [pools.web.active]\nkind = \"none\"\n",
        socket.display()
    )
}

#[tokio::test]
async fn http_over_a_unix_listener_reaches_tcp_and_unix_backends_as_client_unix() {
    let dir = LogDir::new();
    let (front, back) = (dir.path("front.sock"), dir.path("back.sock"));
    let _unix = UnixBackend::start(&back, "u");
    let tcp = capataz::sim::SimBackend::start("t", crate::support::any())
        .await
        .unwrap();
    let log = dir.path("access.log");
    let text = config(
        &front,
        &access_log::table(&log, "json", ""),
        &[
            format!("name = \"u\", address = \"unix:{}\"", back.display()),
            format!("name = \"t\", address = \"{}\"", tcp.addr()),
        ],
    );
    let (_balancer, _rx) = start(&text).await;
    let mut client = UnixClient::connect(&front).await;
    let mut served = Vec::new();
    for i in 0..4 {
        let answer = client.get(&format!("/r{i}")).await;
        assert_eq!(answer.status, 200);
        let backend = answer.backend.clone().unwrap_or_default();
        if backend == "u" {
            // A socket's client has no address: no X-Forwarded-For, Forwarded not asked for.
            assert_eq!(answer.headers["x-seen-forwarded-for"], "none");
        }
        served.push(backend);
    }
    served.sort();
    assert_eq!(served, ["t", "t", "u", "u"]);
    let lines = access_log::wait_json(&log, 4).await;
    for line in &lines {
        assert_eq!(line["client"], "unix", "{line}");
        assert_eq!(line["status"], 200, "{line}");
    }
}

#[tokio::test]
async fn the_forwarded_header_names_a_unix_client_unknown() {
    let dir = LogDir::new();
    let (front, back) = (dir.path("front.sock"), dir.path("back.sock"));
    let _unix = UnixBackend::start(&back, "u");
    let text = config(
        &front,
        "forwarded = \"both\"",
        &[format!("address = \"unix:{}\"", back.display())],
    );
    let (_balancer, _rx) = start(&text).await;
    let answer = unix_get(&front, "/f").await;
    assert_eq!(answer.status, 200);
    assert_eq!(answer.headers["x-seen-forwarded-for"], "none");
    assert_eq!(
        answer.headers["x-seen-forwarded"],
        "for=unknown;proto=http;host=app.test"
    );
}

#[tokio::test]
async fn an_h2c_client_speaks_http2_with_prior_knowledge_over_the_socket() {
    let dir = LogDir::new();
    let (front, back) = (dir.path("front.sock"), dir.path("back.sock"));
    let _unix = UnixBackend::start(&back, "u");
    let text = config(
        &front,
        "h2c = true",
        &[format!("address = \"unix:{}\"", back.display())],
    );
    let (_balancer, _rx) = start(&text).await;
    let stream = UnixStream::connect(&front).await.unwrap();
    let (mut sender, connection) =
        hyper::client::conn::http2::handshake(TokioExecutor::new(), TokioIo::new(stream))
            .await
            .expect("an HTTP/2 handshake");
    tokio::spawn(connection);
    let request = hyper::Request::get("http://app.test/h2")
        .body(Empty::<Bytes>::new())
        .unwrap();
    let response = tokio::time::timeout(DEADLINE, sender.send_request(request))
        .await
        .expect("an answer within the deadline")
        .expect("an answer");
    assert_eq!(response.version(), http::Version::HTTP_2);
    assert_eq!(response.status(), 200);
    let body = response.into_body().collect().await.unwrap().to_bytes();
    assert_eq!(&body[..], b"u /h2");
}

#[tokio::test]
async fn tcp_mode_relays_a_unix_listeners_sessions() {
    let dir = LogDir::new();
    let front = dir.path("front.sock");
    let echo = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let address = echo.local_addr().unwrap();
    tokio::spawn(async move {
        while let Ok((mut stream, _)) = echo.accept().await {
            tokio::spawn(async move {
                let (mut read, mut write) = stream.split();
                let _ = write.write_all(b"hello\n").await;
                let _ = tokio::io::copy(&mut read, &mut write).await;
            });
        }
    });
    let log = dir.path("access.log");
    let text = format!(
        "[[listeners]]\naddress = \"unix:{}\"\nmode = \"tcp\"\npool = \"db\"\n{}\n\n\
         [pools.db]\nprotocol = \"tcp\"\nbackends = [{{ address = \"{address}\" }}]\n\
         [pools.db.active]\nkind = \"none\"\n",
        front.display(),
        access_log::table(&log, "text", "")
    );
    let (_balancer, _rx) = start(&text).await;
    let mut session = UnixStream::connect(&front).await.unwrap();
    session.write_all(b"ping").await.unwrap();
    session.shutdown().await.unwrap();
    let mut all = Vec::new();
    tokio::time::timeout(DEADLINE, session.read_to_end(&mut all))
        .await
        .expect("the session ends")
        .unwrap();
    assert_eq!(all, b"hello\nping");
    let lines = access_log::wait_lines(&log, 1).await;
    assert!(lines[0].starts_with("unix - - ["), "{lines:?}");
}

#[tokio::test]
async fn a_stale_socket_is_replaced_with_the_socket_mode_and_removed_at_shutdown() {
    let dir = LogDir::new();
    let (front, back) = (dir.path("front.sock"), dir.path("back.sock"));
    let _unix = UnixBackend::start(&back, "u");
    // A crashed process's socket file: nobody listens on it.
    drop(std::os::unix::net::UnixListener::bind(&front).unwrap());
    let text = config(
        &front,
        "socket_mode = \"0640\"",
        &[format!("address = \"unix:{}\"", back.display())],
    );
    let (balancer, _rx) = start(&text).await;
    let meta = std::fs::symlink_metadata(&front).unwrap();
    assert!(meta.file_type().is_socket());
    assert_eq!(meta.permissions().mode() & 0o777, 0o640);
    assert_eq!(unix_get(&front, "/s").await.text(), "u /s");
    balancer.shutdown(Duration::from_secs(1)).await;
    assert!(!front.exists(), "the socket file is removed at shutdown");
    // Nothing else was left in the directory (the temporary name was renamed).
    let left: Vec<_> = std::fs::read_dir(front.parent().unwrap())
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .filter(|name| name.contains("front"))
        .collect();
    assert!(left.is_empty(), "{left:?}");
}

#[tokio::test]
async fn a_regular_file_at_the_path_is_a_clear_error_and_left_untouched() {
    let dir = LogDir::new();
    let front = dir.path("front.sock");
    std::fs::write(&front, "precious").unwrap();
    let text = config(&front, "", &["address = \"127.0.0.1:9\"".into()]);
    let (events, _rx) = broadcast::channel(16);
    let Err(error) = Balancer::start(&parse(&text), events).await else {
        panic!("the balancer started over a regular file");
    };
    let message = error.to_string();
    assert!(
        message.contains("listeners[0].address unix:")
            && message.contains(
                "something that is not a socket is there, and capataz does not remove it"
            ),
        "{message}"
    );
    assert_eq!(std::fs::read_to_string(&front).unwrap(), "precious");
}

#[tokio::test]
async fn a_reload_keeps_the_socket_serving_and_removes_a_dropped_one() {
    let dir = LogDir::new();
    let (front, other, back) = (
        dir.path("front.sock"),
        dir.path("other.sock"),
        dir.path("back.sock"),
    );
    let _unix = UnixBackend::start(&back, "u");
    let backend = [format!("address = \"unix:{}\"", back.display())];
    let both = format!(
        "{}\n[[listeners]]\naddress = \"unix:{}\"\n",
        config(&front, "", &backend),
        other.display()
    );
    let (balancer, _rx) = start(&both).await;
    let inode = std::fs::metadata(&front).unwrap().ino();
    // A keep-alive connection opened before the reload is served after it.
    let mut client = UnixClient::connect(&front).await;
    assert_eq!(client.get("/a").await.text(), "u /a");
    assert_eq!(unix_get(&other, "/o").await.text(), "u /o");
    let summary = balancer
        .reload(&parse(&config(&front, "", &backend)))
        .await
        .expect("the reload applies");
    assert_eq!((summary.listeners_added, summary.listeners_removed), (0, 1));
    assert_eq!(client.get("/b").await.text(), "u /b");
    assert_eq!(unix_get(&front, "/c").await.text(), "u /c");
    assert_eq!(
        std::fs::metadata(&front).unwrap().ino(),
        inode,
        "the same socket, not bound again"
    );
    crate::support::wait::wait_until("the dropped socket's file removed", || !other.exists()).await;
}

#[tokio::test]
async fn a_unix_client_is_a_local_proxy_header_and_one_rate_limit_key() {
    let dir = LogDir::new();
    let (front, back) = (dir.path("front.sock"), dir.path("back.sock"));
    let unix = UnixBackend::start_proxied(&back, "u");
    let text = format!(
        "[[listeners]]\naddress = \"unix:{}\"\n\n[[listeners.routes]]\npool = \"web\"\n\
         rate_limit = {{ key = \"client_ip\", rate = 1, per = \"1h\", burst = 1 }}\n\n\
         [pools.web]\nsend_proxy_protocol = \"v1\"\n\
         backends = [{{ address = \"unix:{}\" }}]\n[pools.web.active]\nkind = \"none\"\n",
        front.display(),
        back.display()
    );
    let (balancer, _rx) = start(&text).await;
    assert_eq!(unix_get(&front, "/one").await.status, 200);
    // Another connection is the same client as far as the limit knows: no address tells
    // them apart.
    assert_eq!(unix_get(&front, "/two").await.status, 429);
    assert_eq!(unix.headers(), ["PROXY UNKNOWN\r\n"]);
    // A binary upgrade hands the Unix socket over, named by its path.
    let offered = balancer.offer_sockets().expect("the socket is offered");
    assert_eq!(offered.len(), 1);
    assert_eq!(offered[0].kind, capataz::handover::Kind::Unix);
    assert_eq!(offered[0].unix.as_deref(), Some(front.as_path()));
}

#[tokio::test]
async fn a_reload_adding_a_listener_over_a_regular_file_is_refused_and_changes_nothing() {
    let dir = LogDir::new();
    let (front, blocked, back) = (
        dir.path("front.sock"),
        dir.path("blocked.sock"),
        dir.path("back.sock"),
    );
    let _unix = UnixBackend::start(&back, "u");
    let backend = [format!("address = \"unix:{}\"", back.display())];
    let (balancer, _rx) = start(&config(&front, "socket_mode = \"0640\"", &backend)).await;
    std::fs::write(&blocked, "precious").unwrap();
    let more = format!(
        "{}\n[[listeners]]\naddress = \"unix:{}\"\n",
        config(&front, "socket_mode = \"0600\"", &backend),
        blocked.display()
    );
    let refused = balancer
        .reload(&parse(&more))
        .await
        .expect_err("the reload is refused");
    assert!(
        refused
            .to_string()
            .starts_with("listeners[1].address unix:"),
        "{refused}"
    );
    assert_eq!(std::fs::read_to_string(&blocked).unwrap(), "precious");
    // Nothing applied: the running listener kept its socket and its mode.
    assert_eq!(
        std::fs::metadata(&front).unwrap().permissions().mode() & 0o777,
        0o640
    );
    assert_eq!(unix_get(&front, "/still").await.text(), "u /still");
    // A reload that only changes the mode applies it to the kept socket.
    balancer
        .reload(&parse(&config(&front, "socket_mode = \"0600\"", &backend)))
        .await
        .expect("the reload applies");
    assert_eq!(
        std::fs::metadata(&front).unwrap().permissions().mode() & 0o777,
        0o600
    );
}
