//! An HTTP/1.1 client that resets its connection while its request waits for a
//! slow backend was logged as served (`200`, `ended_by=-`), its connection stayed counted
//! open until the backend answered, and the backend worked on for nobody. Now the request is
//! dropped at once, as an HTTP/2 stream reset is: the log says `client` and the phase, status
//! `-`; the connection is counted closed; the backend sees its connection close before it
//! answers and is charged nothing. A half-close (FIN) is not an abort: the request goes on.
//!
//! Each test compares what capataz says (the access log line, `/metrics`, `/status`, the
//! events) with what the traffic shows (the backend's own view of its connection).

use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use capataz::health::Notice;
use capataz::server::Balancer;
use serde_json::Value;
use tokio::io::AsyncWriteExt;
use tokio::net::TcpStream;
use tokio::sync::broadcast;

use crate::support::access_log::{table, wait_json, LogDir};
use crate::support::backends_tls::{HttpBackend, Reply, Script, Speaks};
use crate::support::balancer::{metrics_text, start, ConfigText};
use crate::support::cases;
use crate::support::client::exchange;
use crate::support::events::count_transitions;
use crate::support::raw::{self, RawBackend};
use crate::support::sockets::held_tcp_sockets;
use crate::support::wait::wait_until;
use crate::support::{tls, DEADLINE};

/// How long the slow backend thinks before it answers, unless its connection closes first.
/// Long, so that an answer means nobody cancelled the request.
const THINKING: Duration = Duration::from_secs(8);

/// What the slow backend saw: requests received, requests cancelled (its connection closed
/// before it answered), requests answered.
#[derive(Clone, Default)]
struct Seen {
    received: Arc<AtomicU64>,
    cancelled: Arc<AtomicU64>,
    answered: Arc<AtomicU64>,
}

impl Seen {
    fn get(counter: &AtomicU64) -> u64 {
        counter.load(Ordering::SeqCst)
    }
}

/// A backend that reads each request whole, then answers `200 late` after `thinking`, unless
/// its connection closes (or resets) first.
async fn slow_backend(thinking: Duration) -> (RawBackend, Seen) {
    let seen = Seen::default();
    let counts = seen.clone();
    let backend = RawBackend::serving(move |mut stream| {
        let seen = counts.clone();
        async move {
            let mut buf = Vec::new();
            let Some(head) = raw::read_head(&mut stream, &mut buf).await else {
                return;
            };
            if raw::read_body(&mut stream, &mut buf, &head).await.is_none() {
                return;
            }
            seen.received.fetch_add(1, Ordering::SeqCst);
            tokio::select! {
                // Nothing more is sent on this connection: a read that ends is its close.
                _ = raw::fill(&mut stream, &mut buf) => {
                    seen.cancelled.fetch_add(1, Ordering::SeqCst);
                }
                _ = tokio::time::sleep(thinking) => {
                    if stream.write_all(raw::ok_answer("late").as_bytes()).await.is_ok() {
                        seen.answered.fetch_add(1, Ordering::SeqCst);
                    }
                }
            }
        }
    })
    .await;
    (backend, seen)
}

/// A balancer logging JSON to `path`, with an admin listener, over the slow backend: no
/// probes, and a single traffic error would eject it.
async fn balancer(
    backend: &RawBackend,
    path: &std::path::Path,
    listener_lines: &str,
) -> (
    Balancer,
    broadcast::Receiver<Notice>,
    SocketAddr,
    SocketAddr,
) {
    let config = ConfigText::new(&[backend.entry("slow")])
        .admin("")
        .listener(&format!(
            "name = \"front\"\n{listener_lines}\n{}",
            table(path, "json", "")
        ))
        .extra(
            "[pools.web.active]\nkind = \"none\"\n[pools.web.passive]\nconsecutive_errors = 1\n",
        );
    let (balancer, events) = start(&config.build()).await;
    let addr = balancer.local_addrs()[0];
    let admin = balancer.admin_addr().expect("an admin listener");
    (balancer, events, addr, admin)
}

/// The value of the sample `series` (name and labels as written) on a metrics page.
fn sample(page: &str, series: &str) -> Option<f64> {
    page.lines().find_map(|line| {
        let (name, value) = line.rsplit_once(' ')?;
        (name == series).then(|| value.parse().expect("a number"))
    })
}

/// Waits until the front listener counts no open connection.
async fn wait_connections_closed(balancer: &Balancer) {
    let open = "capataz_client_connections_open{listener=\"front\"}";
    wait_until("the client connection counted closed", || {
        sample(&metrics_text(balancer), open) == Some(0.0)
    })
    .await;
}

/// Resets `stream` (`SO_LINGER` 0, then close: an RST, not a FIN).
fn reset(stream: TcpStream) {
    stream.set_zero_linger().expect("SO_LINGER 0");
    drop(stream);
}

/// The checks every vanished client shares: the one log line says the client ended the
/// request in `phase`, with no status; the backend saw its connection close before it
/// answered; the connection is counted closed; and the backend was charged nothing (no
/// attempt counted, no error streak, no event).
async fn assert_vanished(
    path: &std::path::Path,
    phase: &str,
    seen: &Seen,
    balancer: &Balancer,
    admin: SocketAddr,
    events: &mut broadcast::Receiver<Notice>,
) {
    let line = &wait_json(path, 1).await[0];
    assert_eq!(line["status"], Value::Null, "{line}");
    assert_eq!(line["ended_by"], "client", "{line}");
    assert_eq!(line["phase"], phase, "{line}");
    assert_eq!(line["backend"], "slow", "{line}");
    assert_eq!(line["attempts"], 1, "{line}");
    assert_eq!(line["bytes"], 0, "{line}");
    wait_until("the backend's connection closed by capataz", || {
        Seen::get(&seen.cancelled) == 1
    })
    .await;
    assert_eq!(Seen::get(&seen.answered), 0, "the backend answered nobody");
    wait_connections_closed(balancer).await;
    let page = metrics_text(balancer);
    for class in ["1xx", "2xx", "3xx", "4xx", "5xx", "error"] {
        let series =
            format!("capataz_requests_total{{pool=\"web\",backend=\"slow\",class=\"{class}\"}}");
        assert_eq!(sample(&page, &series), Some(0.0), "{series}");
    }
    assert!(
        !page.contains("capataz_client_requests_total{"),
        "a request was counted answered:\n{page}"
    );
    let status = exchange(admin, "GET", "/status/web/slow", &admin.to_string(), &[]).await;
    assert_eq!(status.status, 200);
    let status = status.json();
    assert_eq!(status["verdict"], "UP", "{status}");
    assert_eq!(status["passive"]["error_streak"], 0, "{status}");
    assert_eq!(count_transitions(events), 0, "no transition");
}

/// A client sends `request` on a new connection to a balancer over a slow backend (with
/// `listener` lines in its listener), and resets the connection once the backend has it:
/// [`assert_vanished`] in `phase`. The access log's lines, for more checks.
async fn sent_then_reset(request: &[u8], listener: &str, phase: &str) -> Vec<Value> {
    let (backend, seen) = slow_backend(THINKING).await;
    let dir = LogDir::new();
    let path = dir.path("access.log");
    let (balancer, mut events, addr, admin) = balancer(&backend, &path, listener).await;
    let mut client = TcpStream::connect(addr).await.unwrap();
    client.write_all(request).await.unwrap();
    wait_until("the backend has the request (and its body)", || {
        Seen::get(&seen.received) == 1
    })
    .await;
    reset(client);
    assert_vanished(&path, phase, &seen, &balancer, admin, &mut events).await;
    wait_json(&path, 1).await
}

/// A client that sends `request` on a plain connection and resets it ([`sent_then_reset`]).
struct Vanished {
    request: &'static [u8],
    /// More lines of the listener.
    listener: &'static str,
    /// The phase the line says.
    phase: &'static str,
    /// The line's fields to check besides.
    fields: &'static [(&'static str, &'static str)],
}

#[tokio::test]
async fn a_client_that_vanished_is_not_logged_as_served() {
    let cases = [
        (
            "a GET: in headers",
            Vanished {
                request: b"GET /slow HTTP/1.1\r\nHost: app.test\r\n\r\n",
                listener: "",
                phase: "headers",
                fields: &[("target", "/slow"), ("protocol", "HTTP/1.1")],
            },
        ),
        (
            // Its body was read whole, then the client waited, then reset: the same, in `send`
            // (a request with a body is in `send` until its answer's head, as HAProxy's
            // `CH`-like row).
            "after its upload: in send",
            Vanished {
                request: b"POST /upload HTTP/1.1\r\nHost: app.test\r\nContent-Length: 5\r\n\r\nhello",
                listener: "",
                phase: "send",
                fields: &[],
            },
        ),
        (
            // Its end is the last chunk, not a length.
            "after a chunked upload: in send",
            Vanished {
                request: b"POST /upload HTTP/1.1\r\nHost: app.test\r\nTransfer-Encoding: chunked\r\n\r\n\
                  5\r\nhello\r\n0\r\n\r\n",
                listener: "",
                phase: "send",
                fields: &[],
            },
        ),
        (
            // The header and the request in one write: the request is read from what capataz
            // read past the header, and the reset is still the socket's.
            "behind a PROXY protocol header",
            Vanished {
                request: b"PROXY TCP4 192.0.2.7 127.0.0.1 5555 80\r\nGET /slow HTTP/1.1\r\nHost: app.test\r\n\r\n",
                listener: "proxy_protocol = { trusted = [\"127.0.0.0/8\"] }",
                phase: "headers",
                fields: &[("client", "192.0.2.7")],
            },
        ),
    ];
    cases::each(cases, |case| async move {
        let lines = sent_then_reset(case.request, case.listener, case.phase).await;
        for (field, value) in case.fields {
            assert_eq!(lines[0][field], *value, "{field}");
        }
    })
    .await;
}

#[tokio::test]
async fn a_client_that_vanished_over_tls_is_not_logged_as_served() {
    // The reset is the TCP socket's, under the TLS layer.
    let pki = tls::Pki::new();
    let (cert, key) = pki.server("front", &["app.test"], None);
    let (backend, seen) = slow_backend(THINKING).await;
    let dir = LogDir::new();
    let path = dir.path("access.log");
    let listener = tls::Pki::listener(&[(&cert, &key)], "");
    let (balancer, mut events, addr, admin) = balancer(&backend, &path, &listener).await;
    let mut client = tls::Client::trusting(&pki)
        .connect(addr, "app.test")
        .await
        .expect("a TLS handshake");
    client
        .write_all(b"GET /slow HTTP/1.1\r\nHost: app.test\r\n\r\n")
        .await
        .unwrap();
    client.flush().await.unwrap();
    wait_until("the backend has the request", || {
        Seen::get(&seen.received) == 1
    })
    .await;
    let (tcp, _) = client.into_inner();
    reset(tcp);
    assert_vanished(&path, "headers", &seen, &balancer, admin, &mut events).await;
}

#[tokio::test]
async fn a_client_that_vanished_after_its_upload_to_an_http2_pool_is_not_logged_as_served() {
    // An HTTP/2 backend's client reads the body in a task of its own, which then tells the
    // connection to start watching; the backend's stream is reset (its in-flight slot freed).
    let uploads = Arc::new(AtomicU64::new(0));
    let seen = uploads.clone();
    let script: Script = Arc::new(move |_| {
        // Called once the backend has read the body to its end.
        seen.fetch_add(1, Ordering::SeqCst);
        Reply::Hang
    });
    let backend = HttpBackend::start("slow", Speaks::H2, None, script).await;
    let dir = LogDir::new();
    let path = dir.path("access.log");
    let config = ConfigText::new(&[backend.entry()])
        .listener(&format!("name = \"front\"\n{}", table(&path, "json", "")))
        .extra("protocol = \"h2c\"\n[pools.web.active]\nkind = \"none\"\n[pools.web.passive]\nconsecutive_errors = 1\n");
    let (balancer, mut events) = start(&config.build()).await;
    let addr = balancer.local_addrs()[0];
    let mut client = TcpStream::connect(addr).await.unwrap();
    client
        .write_all(b"POST /upload HTTP/1.1\r\nHost: app.test\r\nContent-Length: 5\r\n\r\nhello")
        .await
        .unwrap();
    wait_until("the backend has the request and its body", || {
        uploads.load(Ordering::SeqCst) == 1
    })
    .await;
    reset(client);
    let line = &wait_json(&path, 1).await[0];
    assert_eq!(line["status"], Value::Null, "{line}");
    assert_eq!(line["ended_by"], "client", "{line}");
    assert_eq!(line["phase"], "send", "{line}");
    wait_connections_closed(&balancer).await;
    let in_flight = "capataz_backend_in_flight{pool=\"web\",backend=\"slow\"}";
    wait_until("the backend's stream dropped", || {
        sample(&metrics_text(&balancer), in_flight) == Some(0.0)
    })
    .await;
    let page = metrics_text(&balancer);
    let errors = "capataz_requests_total{pool=\"web\",backend=\"slow\",class=\"error\"}";
    assert_eq!(sample(&page, errors), Some(0.0));
    assert_eq!(count_transitions(&mut events), 0, "no transition");
}

#[tokio::test]
async fn a_client_that_half_closes_still_gets_its_answer() {
    // A FIN after the request is a half-close, not an abort (HAProxy's default, `option
    // abortonclose` off): the backend is not cancelled, the client reads its answer, and
    // the line says it was served. The backend thinks long enough for the FIN to arrive
    // before the answer.
    let (backend, seen) = slow_backend(Duration::from_millis(500)).await;
    let dir = LogDir::new();
    let path = dir.path("access.log");
    let (balancer, _events, addr, _admin) = balancer(&backend, &path, "").await;
    let mut client = TcpStream::connect(addr).await.unwrap();
    client
        .write_all(b"GET /slow HTTP/1.1\r\nHost: app.test\r\n\r\n")
        .await
        .unwrap();
    client.shutdown().await.unwrap();
    let mut buf = Vec::new();
    let reply = tokio::time::timeout(DEADLINE, raw::read_reply(&mut client, &mut buf))
        .await
        .expect("an answer in time")
        .expect("an answer");
    assert_eq!(reply.status, 200);
    assert_eq!(reply.body, b"late");
    // Then capataz closes the connection: the client sent its last request.
    assert!(raw::closes(&mut client).await);
    assert_eq!(Seen::get(&seen.cancelled), 0);
    assert_eq!(Seen::get(&seen.answered), 1);
    let line = &wait_json(&path, 1).await[0];
    assert_eq!(line["status"], 200, "{line}");
    assert_eq!(line["ended_by"], "-", "{line}");
    assert_eq!(line["phase"], "-", "{line}");
    wait_connections_closed(&balancer).await;
}

#[tokio::test]
async fn a_pipelined_request_behind_a_slow_one_is_answered_in_turn() {
    // Bytes waiting behind a request are the client's next words, not a departure: both
    // requests are answered, in order, and nothing is cancelled.
    let (backend, seen) = slow_backend(Duration::from_millis(200)).await;
    let dir = LogDir::new();
    let path = dir.path("access.log");
    let (_balancer, _events, addr, _admin) = balancer(&backend, &path, "").await;
    let mut client = TcpStream::connect(addr).await.unwrap();
    client
        .write_all(b"GET /first HTTP/1.1\r\nHost: app.test\r\n\r\n")
        .await
        .unwrap();
    wait_until("the backend has the first request", || {
        Seen::get(&seen.received) == 1
    })
    .await;
    client
        .write_all(b"GET /second HTTP/1.1\r\nHost: app.test\r\n\r\n")
        .await
        .unwrap();
    let mut buf = Vec::new();
    for _ in 0..2 {
        let reply = tokio::time::timeout(DEADLINE, raw::read_reply(&mut client, &mut buf))
            .await
            .expect("an answer in time")
            .expect("an answer");
        assert_eq!(reply.status, 200);
    }
    let lines = wait_json(&path, 2).await;
    assert_eq!(lines[0]["target"], "/first");
    assert_eq!(lines[1]["target"], "/second");
    assert!(lines.iter().all(|l| l["ended_by"] == "-"), "{lines:?}");
    assert_eq!(Seen::get(&seen.cancelled), 0);
}

/// Review: the same for an upload that waited for `100 Continue` before sending its body.
#[tokio::test]
async fn a_client_that_vanished_after_an_expect_continue_upload_is_seen_gone() {
    let (backend, seen) = slow_backend(THINKING).await;
    let dir = LogDir::new();
    let path = dir.path("access.log");
    let (balancer, mut events, addr, admin) = balancer(&backend, &path, "").await;
    let mut client = TcpStream::connect(addr).await.unwrap();
    client
        .write_all(
            b"POST /upload HTTP/1.1\r\nHost: app.test\r\nContent-Length: 5\r\n\
              Expect: 100-continue\r\n\r\n",
        )
        .await
        .unwrap();
    let mut buf = Vec::new();
    let head = raw::read_head(&mut client, &mut buf).await.expect("100");
    assert!(head.starts_with("HTTP/1.1 100"), "{head}");
    client.write_all(b"hello").await.unwrap();
    wait_until("the backend has the request and its body", || {
        Seen::get(&seen.received) == 1
    })
    .await;
    reset(client);
    assert_vanished(&path, "send", &seen, &balancer, admin, &mut events).await;
}

/// The CPU this thread has used, in clock ticks. The thread's, not the process's: the other
/// tests of this binary run beside this one, while this test's runtime (a current-thread
/// one), and so the balancer's connection tasks, run on this thread alone.
fn cpu_ticks() -> u64 {
    let stat = std::fs::read_to_string("/proc/thread-self/stat").expect("/proc/thread-self/stat");
    // The fields after the command's closing parenthesis; utime and stime are the 14th and
    // 15th of the line, the 12th and 13th after it.
    let rest = &stat[stat.rfind(')').expect("the command") + 2..];
    let fields: Vec<&str> = rest.split(' ').collect();
    fields[11].parse::<u64>().unwrap() + fields[12].parse::<u64>().unwrap()
}

/// Review: a socket that stays readable while its request waits (pipelined bytes left unread,
/// or the end of a half-closed stream) must not make the connection's task poll in a loop:
/// the watch stops looking at it, and nothing else is woken by it.
#[tokio::test]
async fn a_socket_left_readable_while_a_request_waits_costs_no_cpu() {
    for half_close in [false, true] {
        let (backend, seen) = slow_backend(THINKING).await;
        let dir = LogDir::new();
        let path = dir.path("access.log");
        let (_balancer, _events, addr, _admin) = balancer(&backend, &path, "").await;
        let mut client = TcpStream::connect(addr).await.unwrap();
        client
            .write_all(b"GET /first HTTP/1.1\r\nHost: app.test\r\n\r\n")
            .await
            .unwrap();
        wait_until("the backend has the first request", || {
            Seen::get(&seen.received) == 1
        })
        .await;
        if half_close {
            client.shutdown().await.unwrap();
        } else {
            // Half a pipelined head: unread until the first answer is sent.
            client.write_all(b"GET /second HTTP/1.1\r\n").await.unwrap();
        }
        // A measurement window, not a synchronisation: a task spinning on the readable socket
        // would take a whole core for it (150 ticks at 100 Hz).
        let before = cpu_ticks();
        tokio::time::sleep(Duration::from_millis(1500)).await;
        let spent = cpu_ticks() - before;
        assert!(
            spent < 50,
            "{spent} ticks of CPU in 1.5 s (half_close: {half_close})"
        );
        assert_eq!(Seen::get(&seen.cancelled), 0);
    }
}

/// Review: many clients resetting at once leak nothing: every backend connection is closed,
/// every client connection counted closed, every socket let go, one log line each.
#[tokio::test]
async fn many_clients_resetting_at_once_leak_nothing() {
    const CLIENTS: usize = 40;
    let (backend, seen) = slow_backend(THINKING).await;
    let dir = LogDir::new();
    let path = dir.path("access.log");
    let (balancer, _events, addr, _admin) = balancer(&backend, &path, "").await;
    let mut clients = Vec::new();
    for i in 0..CLIENTS {
        let mut client = TcpStream::connect(addr).await.unwrap();
        let request = format!("GET /slow/{i} HTTP/1.1\r\nHost: app.test\r\n\r\n");
        client.write_all(request.as_bytes()).await.unwrap();
        clients.push(client);
    }
    wait_until("the backend has every request", || {
        Seen::get(&seen.received) == CLIENTS as u64
    })
    .await;
    // The measure sees them while they are open (so its 0 below means let go).
    assert_eq!(held_tcp_sockets(addr, false), CLIENTS);
    clients.into_iter().for_each(reset);
    wait_until("every backend connection closed by capataz", || {
        Seen::get(&seen.cancelled) == CLIENTS as u64
    })
    .await;
    wait_connections_closed(&balancer).await;
    let lines = wait_json(&path, CLIENTS).await;
    assert!(
        lines
            .iter()
            .all(|l| l["ended_by"] == "client" && l["status"] == Value::Null),
        "{lines:?}"
    );
    wait_until("every accepted socket let go", || {
        held_tcp_sockets(addr, false) == 0
    })
    .await;
    assert_eq!(Seen::get(&seen.answered), 0);
}

/// Review (the proxy's futures as `async move` blocks, the HTTP/2 pool's attempt boxed): an
/// HTTP/2 client cancelling one stream (RST_STREAM) while an HTTP/2 backend holds it is logged
/// once as ended by the client, frees the backend's in-flight slot, charges nothing, and the
/// client's connection serves its next stream.
#[tokio::test]
async fn an_http2_stream_cancelled_while_an_http2_backend_holds_it_is_logged_and_let_go() {
    use crate::support::h2frames::{handshake, headers, read_frame, request_block, rst_stream};
    let held = Arc::new(AtomicU64::new(0));
    let seen = held.clone();
    let script: Script = Arc::new(move |parts| {
        if parts.uri.path() == "/hang" {
            seen.fetch_add(1, Ordering::SeqCst);
            Reply::Hang
        } else {
            Reply::Ok {
                status: 200,
                headers: Vec::new(),
                body: bytes::Bytes::from_static(b"ok"),
                trailers: None,
            }
        }
    });
    let backend = HttpBackend::start("slow", Speaks::H2, None, script).await;
    let dir = LogDir::new();
    let path = dir.path("access.log");
    let config = ConfigText::new(&[backend.entry()])
        .listener(&format!(
            "name = \"front\"\nh2c = true\n{}",
            table(&path, "json", "")
        ))
        .extra("protocol = \"h2c\"\n[pools.web.active]\nkind = \"none\"\n[pools.web.passive]\nconsecutive_errors = 1\n");
    let (balancer, mut events) = start(&config.build()).await;
    let (mut read, mut write, _) = handshake(balancer.local_addrs()[0]).await;
    let hang = headers(1, &request_block("GET", "app.test", "/hang"), true, true);
    write.write_all(&hang).await.unwrap();
    wait_until("the backend holds the stream", || {
        held.load(Ordering::SeqCst) == 1
    })
    .await;
    write.write_all(&rst_stream(1, 8)).await.unwrap();
    let line = &wait_json(&path, 1).await[0];
    assert_eq!(line["status"], Value::Null, "{line}");
    assert_eq!(line["ended_by"], "client", "{line}");
    let in_flight = "capataz_backend_in_flight{pool=\"web\",backend=\"slow\"}";
    wait_until("the backend's stream dropped", || {
        sample(&metrics_text(&balancer), in_flight) == Some(0.0)
    })
    .await;
    let ok = headers(3, &request_block("GET", "app.test", "/ok"), true, true);
    write.write_all(&ok).await.unwrap();
    let answer = tokio::time::timeout(DEADLINE, async {
        loop {
            let frame = read_frame(&mut read)
                .await
                .expect("the connection serves on");
            if frame.stream == 3 && frame.kind == 0x1 {
                return frame.payload[0];
            }
        }
    })
    .await
    .expect("an answer in time");
    assert_eq!(answer, 0x88, "200 from the static table");
    let lines = wait_json(&path, 2).await;
    assert_eq!(lines[1]["status"], 200, "{lines:?}");
    assert_eq!(lines.len(), 2, "{lines:?}");
    let page = metrics_text(&balancer);
    let errors = "capataz_requests_total{pool=\"web\",backend=\"slow\",class=\"error\"}";
    assert_eq!(sample(&page, errors), Some(0.0));
    assert_eq!(count_transitions(&mut events), 0, "no transition");
}
