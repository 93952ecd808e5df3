//! The proxied request path under hostile peers on both sides: who is charged for a failed
//! attempt (the client, the backend), the deadlines of an upload and of a response body,
//! strict framing of backend answers, Host confusion, and connection reuse that never lets
//! one client read bytes meant for another.
//!
//! Backends and clients here are raw sockets, so each test can send or withhold exactly the
//! bytes it means to. Waits are on answers, closes and counts with generous deadlines; the
//! only timing is that of the timeouts under test, set short.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use capataz::config;
use capataz::server::Balancer;
use capataz_health::Outcome;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::task::JoinHandle;

const DEADLINE: Duration = Duration::from_secs(20);

// ---- Scaffolding ------------------------------------------------------------------------------

/// A balancer with one listener and one pool `web` over `backends`, no probes, and a passive
/// side that ejects on the first error (so any charge shows); `listener` and `pool` are extra
/// TOML lines for the listener and for `[pools.web.timeouts]`.
async fn balancer(
    backends: &[SocketAddr],
    listener: &str,
    timeouts: &str,
) -> (Balancer, SocketAddr) {
    balancer_with(backends, listener, timeouts, "").await
}

async fn balancer_with(
    backends: &[SocketAddr],
    listener: &str,
    timeouts: &str,
    pool: &str,
) -> (Balancer, SocketAddr) {
    let list: Vec<String> = backends
        .iter()
        .enumerate()
        .map(|(i, addr)| format!("{{ name = \"b{i}\", address = \"{addr}\" }}"))
        .collect();
    let text = format!(
        r#"
[[listeners]]
address = "127.0.0.1:0"
{listener}

[pools.web]
backends = [{}]
{pool}
{retries}

[pools.web.active]
kind = "none"

[pools.web.passive]
consecutive_errors = 1
max_ejected_percent = 100

[pools.web.timeouts]
{timeouts}
"#,
        list.join(", "),
        retries = if pool.contains("retries") {
            ""
        } else {
            "retries = { attempts = 0 }"
        },
    );
    let config = config::parse_str(&text, "<test>").expect("valid test config");
    let (events, _) = tokio::sync::broadcast::channel(1024);
    let balancer = Balancer::start(&config, events)
        .await
        .expect("balancer starts");
    let addr = balancer.local_addrs()[0];
    (balancer, addr)
}

/// What backend `index` of pool `web` has been charged with (every outcome fed to it).
fn charged(balancer: &Balancer, index: usize) -> Vec<Outcome> {
    balancer.pool("web").expect("pool web").backends[index]
        .traffic
        .recent()
}

fn errors(balancer: &Balancer, index: usize) -> Vec<Outcome> {
    charged(balancer, index)
        .into_iter()
        .filter(|o| !matches!(o, Outcome::Status(code) if *code < 500))
        .collect()
}

/// A raw backend: `serve` runs on each accepted connection.
struct Backend {
    addr: SocketAddr,
    accepted: Arc<AtomicU64>,
    /// Connections whose `serve` has returned (the peer closed, or `serve` gave up).
    closed: Arc<AtomicU64>,
    task: JoinHandle<()>,
}

impl Backend {
    async fn start<F, Fut>(serve: F) -> Backend
    where
        F: Fn(TcpStream) -> Fut + Send + Sync + 'static,
        Fut: std::future::Future<Output = ()> + Send + 'static,
    {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let addr = listener.local_addr().expect("addr");
        let accepted = Arc::new(AtomicU64::new(0));
        let closed = Arc::new(AtomicU64::new(0));
        let (count, ended) = (accepted.clone(), closed.clone());
        let serve = Arc::new(serve);
        let task = tokio::spawn(async move {
            while let Ok((stream, _)) = listener.accept().await {
                count.fetch_add(1, Ordering::SeqCst);
                let _ = stream.set_nodelay(true);
                let (serve, ended) = (serve.clone(), ended.clone());
                tokio::spawn(async move {
                    serve(stream).await;
                    ended.fetch_add(1, Ordering::SeqCst);
                });
            }
        });
        Backend {
            addr,
            accepted,
            closed,
            task,
        }
    }
}

impl Drop for Backend {
    fn drop(&mut self) {
        self.task.abort();
    }
}

fn find(haystack: &[u8], needle: &[u8]) -> Option<usize> {
    haystack.windows(needle.len()).position(|w| w == needle)
}

/// Reads a head into a string (without the blank line), leaving what follows in `buf`.
async fn read_head(stream: &mut TcpStream, buf: &mut Vec<u8>) -> Option<String> {
    loop {
        if let Some(end) = find(buf, b"\r\n\r\n") {
            let head = String::from_utf8_lossy(&buf[..end]).into_owned();
            buf.drain(..end + 4);
            return Some(head);
        }
        let mut chunk = [0u8; 16384];
        match stream.read(&mut chunk).await {
            Ok(0) | Err(_) => return None,
            Ok(n) => buf.extend_from_slice(&chunk[..n]),
        }
    }
}

fn header<'a>(head: &'a str, name: &str) -> Option<&'a str> {
    head.split("\r\n").skip(1).find_map(|line| {
        let (n, v) = line.split_once(':')?;
        n.trim().eq_ignore_ascii_case(name).then(|| v.trim())
    })
}

/// Reads exactly `n` more bytes past `buf`.
async fn read_n(stream: &mut TcpStream, buf: &mut Vec<u8>, n: usize) -> Option<Vec<u8>> {
    while buf.len() < n {
        let mut chunk = [0u8; 16384];
        match stream.read(&mut chunk).await {
            Ok(0) | Err(_) => return None,
            Ok(k) => buf.extend_from_slice(&chunk[..k]),
        }
    }
    Some(buf.drain(..n).collect())
}

/// Reads a request body framed by `head` (Content-Length or chunked), in full.
async fn read_request_body(
    stream: &mut TcpStream,
    buf: &mut Vec<u8>,
    head: &str,
) -> Option<Vec<u8>> {
    if header(head, "transfer-encoding").is_some() {
        let mut body = Vec::new();
        loop {
            let line = loop {
                if let Some(end) = find(buf, b"\r\n") {
                    let line = String::from_utf8_lossy(&buf[..end]).into_owned();
                    buf.drain(..end + 2);
                    break line;
                }
                let mut chunk = [0u8; 16384];
                match stream.read(&mut chunk).await {
                    Ok(0) | Err(_) => return None,
                    Ok(n) => buf.extend_from_slice(&chunk[..n]),
                }
            };
            let size = usize::from_str_radix(line.trim(), 16).ok()?;
            if size == 0 {
                read_n(stream, buf, 2).await?;
                return Some(body);
            }
            body.extend(read_n(stream, buf, size + 2).await?[..size].iter());
        }
    }
    let length: usize = header(head, "content-length").map_or(Some(0), |v| v.parse().ok())?;
    read_n(stream, buf, length).await
}

/// A keep-alive backend that reads each request whole and answers `200` with its body's
/// length.
async fn length_backend() -> Backend {
    Backend::start(|mut stream| async move {
        let mut buf = Vec::new();
        while let Some(head) = read_head(&mut stream, &mut buf).await {
            let Some(body) = read_request_body(&mut stream, &mut buf, &head).await else {
                return;
            };
            let text = body.len().to_string();
            let answer = format!(
                "HTTP/1.1 200 OK\r\nContent-Length: {}\r\n\r\n{text}",
                text.len()
            );
            if stream.write_all(answer.as_bytes()).await.is_err() {
                return;
            }
        }
    })
    .await
}

/// A client's view of one answer.
#[derive(Debug)]
struct Reply {
    status: u16,
    head: String,
    body: Vec<u8>,
}

/// Reads one answer (head and a Content-Length or chunked body) from `stream`; `None` if the
/// connection ended before a complete one.
async fn read_reply(stream: &mut TcpStream, buf: &mut Vec<u8>) -> Option<Reply> {
    let head = read_head(stream, buf).await?;
    let status = head.get(9..12)?.parse().ok()?;
    let body = if header(&head, "transfer-encoding").is_some()
        || header(&head, "content-length").is_some()
    {
        read_request_body(stream, buf, &head).await?
    } else {
        Vec::new()
    };
    Some(Reply { status, head, body })
}

/// Sends `request` on a fresh connection and reads one answer.
async fn roundtrip(addr: SocketAddr, request: &[u8]) -> Option<Reply> {
    let mut stream = TcpStream::connect(addr).await.expect("connect");
    stream.write_all(request).await.expect("send");
    let mut buf = Vec::new();
    tokio::time::timeout(DEADLINE, read_reply(&mut stream, &mut buf))
        .await
        .expect("an answer or a close within the deadline")
}

/// Waits until `done` holds, polling, within the deadline.
async fn until(mut done: impl FnMut() -> bool) {
    let deadline = Instant::now() + DEADLINE;
    while !done() {
        assert!(Instant::now() < deadline, "not done within {DEADLINE:?}");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

/// Reads until the peer closes; `true` if it did within the deadline.
async fn closes(stream: &mut TcpStream) -> bool {
    let read_all = async {
        let mut chunk = [0u8; 4096];
        loop {
            match stream.read(&mut chunk).await {
                Ok(0) | Err(_) => return,
                Ok(_) => {}
            }
        }
    };
    tokio::time::timeout(DEADLINE, read_all).await.is_ok()
}

// ---- 1 and 2: uploads, and whose fault a failed one is -----------------------------------------

#[tokio::test]
async fn a_slow_but_steady_upload_longer_than_response_header_succeeds() {
    let backend = length_backend().await;
    let (balancer, addr) = balancer(
        &[backend.addr],
        "request_body_timeout = \"2s\"",
        "response_header = \"300ms\"",
    )
    .await;
    let mut stream = TcpStream::connect(addr).await.unwrap();
    stream
        .write_all(b"POST /up HTTP/1.1\r\nHost: app.test\r\nContent-Length: 100\r\n\r\n")
        .await
        .unwrap();
    let started = Instant::now();
    for _ in 0..10 {
        stream.write_all(&[b'x'; 10]).await.unwrap();
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let mut buf = Vec::new();
    let reply = read_reply(&mut stream, &mut buf).await.expect("an answer");
    assert!(started.elapsed() >= Duration::from_millis(900));
    assert_eq!(reply.status, 200, "{reply:?}");
    assert_eq!(reply.body, b"100");
    assert_eq!(errors(&balancer, 0), []);
}

#[tokio::test]
async fn a_stalled_upload_gets_408_and_charges_the_backend_nothing() {
    let backend = length_backend().await;
    let (balancer, addr) = balancer(
        &[backend.addr],
        "request_body_timeout = \"300ms\"",
        "response_header = \"10s\"",
    )
    .await;
    let mut stream = TcpStream::connect(addr).await.unwrap();
    stream
        .write_all(b"POST /up HTTP/1.1\r\nHost: app.test\r\nContent-Length: 100\r\n\r\nonly ten b")
        .await
        .unwrap();
    let mut buf = Vec::new();
    let reply = tokio::time::timeout(DEADLINE, read_reply(&mut stream, &mut buf))
        .await
        .unwrap()
        .expect("an answer");
    assert_eq!(reply.status, 408, "{reply:?}");
    assert!(
        closes(&mut stream).await,
        "the client connection closes after a 408"
    );
    assert_eq!(charged(&balancer, 0), []);
    // The backend connection that carried half a body is not used again.
    let reply = roundtrip(addr, b"GET / HTTP/1.1\r\nHost: app.test\r\n\r\n")
        .await
        .unwrap();
    assert_eq!(reply.status, 200);
    assert_eq!(backend.accepted.load(Ordering::SeqCst), 2);
    assert_eq!(errors(&balancer, 0), []);
}

#[tokio::test]
async fn a_malformed_chunked_upload_gets_400_at_once_and_charges_nothing() {
    let backend = length_backend().await;
    let (balancer, addr) = balancer(&[backend.addr], "", "response_header = \"10s\"").await;
    let started = Instant::now();
    let reply = roundtrip(
        addr,
        b"POST /up HTTP/1.1\r\nHost: app.test\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\nzz-not-a-size\r\n",
    )
    .await
    .expect("an answer");
    assert_eq!(reply.status, 400, "{reply:?}");
    assert!(
        started.elapsed() < Duration::from_secs(5),
        "took {:?}",
        started.elapsed()
    );
    assert_eq!(charged(&balancer, 0), []);
    let reply = roundtrip(addr, b"GET / HTTP/1.1\r\nHost: app.test\r\n\r\n")
        .await
        .unwrap();
    assert_eq!(reply.status, 200);
    assert_eq!(
        backend.accepted.load(Ordering::SeqCst),
        2,
        "the half-fed connection is not reused"
    );
}

#[tokio::test]
async fn a_client_vanishing_mid_body_charges_the_backend_nothing() {
    let backend = length_backend().await;
    let (balancer, addr) = balancer(&[backend.addr], "", "response_header = \"10s\"").await;
    for n in 1..=3 {
        let mut stream = TcpStream::connect(addr).await.unwrap();
        stream
            .write_all(
                b"POST /up HTTP/1.1\r\nHost: app.test\r\nContent-Length: 1000\r\n\r\npartial",
            )
            .await
            .unwrap();
        // Wait until the request has reached the backend, then vanish: the backend connection
        // that carried half a body is closed at once (not after response_header), and nothing
        // is charged.
        until(|| backend.accepted.load(Ordering::SeqCst) == n).await;
        drop(stream);
        until(|| backend.closed.load(Ordering::SeqCst) == n).await;
    }
    // A request after them is served by the same, unejected backend.
    let reply = roundtrip(addr, b"GET / HTTP/1.1\r\nHost: app.test\r\n\r\n")
        .await
        .unwrap();
    assert_eq!(reply.status, 200);
    assert_eq!(errors(&balancer, 0), []);
}

#[tokio::test]
async fn a_backend_that_stops_reading_the_body_is_charged_a_timeout() {
    // Reads the head, then nothing: the upload fills the socket buffers and the writes wait.
    let backend = Backend::start(|mut stream| async move {
        let mut buf = Vec::new();
        let _ = read_head(&mut stream, &mut buf).await;
        tokio::time::sleep(DEADLINE).await;
    })
    .await;
    let (balancer, addr) = balancer(
        &[backend.addr],
        "request_body_timeout = \"10s\"",
        "body_idle = \"300ms\"\nresponse_header = \"10s\"",
    )
    .await;
    let mut stream = TcpStream::connect(addr).await.unwrap();
    let size = 64 << 20;
    stream
        .write_all(
            format!("POST /up HTTP/1.1\r\nHost: app.test\r\nContent-Length: {size}\r\n\r\n")
                .as_bytes(),
        )
        .await
        .unwrap();
    let (mut reader, mut writer) = stream.into_split();
    let started = Instant::now();
    let upload = tokio::spawn(async move {
        let piece = vec![b'x'; 65536];
        for _ in 0..(size / piece.len()) {
            if writer.write_all(&piece).await.is_err() {
                return;
            }
        }
    });
    let mut out = Vec::new();
    let _ = tokio::time::timeout(DEADLINE, async {
        let mut chunk = [0u8; 4096];
        while let Ok(n) = reader.read(&mut chunk).await {
            if n == 0 || find(&out, b"\r\n\r\n").is_some() {
                break;
            }
            out.extend_from_slice(&chunk[..n]);
        }
    })
    .await;
    upload.abort();
    let text = String::from_utf8_lossy(&out);
    assert!(text.starts_with("HTTP/1.1 504"), "{text}");
    assert!(
        started.elapsed() < Duration::from_secs(5),
        "bounded by body_idle, not response_header: {:?}",
        started.elapsed()
    );
    assert_eq!(charged(&balancer, 0), [Outcome::Timeout]);
}

// ---- 3: a backend that stalls mid-body; a client slow to read --------------------------------

/// A backend that answers every request on its connection with `answer`, verbatim.
async fn answering(answer: &'static [u8]) -> Backend {
    Backend::start(move |mut stream| async move {
        let mut buf = Vec::new();
        while let Some(head) = read_head(&mut stream, &mut buf).await {
            if read_request_body(&mut stream, &mut buf, &head)
                .await
                .is_none()
                || stream.write_all(answer).await.is_err()
            {
                return;
            }
        }
    })
    .await
}

const GET: &[u8] = b"GET / HTTP/1.1\r\nHost: app.test\r\n\r\n";

#[tokio::test]
async fn a_backend_stalling_mid_body_is_charged_a_timeout_and_the_client_is_freed() {
    let backend = Backend::start(|mut stream| async move {
        let mut buf = Vec::new();
        let _ = read_head(&mut stream, &mut buf).await;
        let _ = stream
            .write_all(b"HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\nten bytes.")
            .await;
        tokio::time::sleep(DEADLINE * 2).await;
    })
    .await;
    let (balancer, addr) = balancer(&[backend.addr], "", "body_idle = \"300ms\"").await;
    let mut stream = TcpStream::connect(addr).await.unwrap();
    stream.write_all(GET).await.unwrap();
    let mut buf = Vec::new();
    let head = read_head(&mut stream, &mut buf).await.expect("the head");
    assert!(head.starts_with("HTTP/1.1 200"), "{head}");
    assert!(closes(&mut stream).await, "the client connection is closed");
    assert_eq!(charged(&balancer, 0), [Outcome::Timeout]);
    let pool = balancer.pool("web").unwrap();
    assert_eq!(
        pool.backends[0].in_flight.load(Ordering::SeqCst),
        0,
        "the lease is freed"
    );
}

#[tokio::test]
async fn a_client_slow_to_read_never_charges_the_backend_a_body_timeout() {
    const SIZE: usize = 32 << 20;
    let backend = Backend::start(|mut stream| async move {
        let mut buf = Vec::new();
        while read_head(&mut stream, &mut buf).await.is_some() {
            let head = format!("HTTP/1.1 200 OK\r\nContent-Length: {SIZE}\r\n\r\n");
            let _ = stream.write_all(head.as_bytes()).await;
            let piece = vec![b'x'; 1 << 20];
            for _ in 0..SIZE >> 20 {
                if stream.write_all(&piece).await.is_err() {
                    return;
                }
            }
        }
    })
    .await;
    let (balancer, addr) = balancer(&[backend.addr], "", "body_idle = \"300ms\"").await;
    let mut stream = TcpStream::connect(addr).await.unwrap();
    stream.write_all(GET).await.unwrap();
    let mut buf = Vec::new();
    let head = read_head(&mut stream, &mut buf).await.expect("the head");
    assert!(head.starts_with("HTTP/1.1 200"), "{head}");
    let mut got = buf.len();
    let mut chunk = vec![0u8; 1 << 16];
    // Three pauses longer than body_idle while the proxy has data it cannot send.
    for _ in 0..3 {
        tokio::time::sleep(Duration::from_millis(700)).await;
        let until = got + (1 << 20);
        while got < until {
            let n = stream.read(&mut chunk).await.unwrap();
            assert!(n > 0, "the body ended early at {got}");
            got += n;
        }
    }
    while got < SIZE {
        let n = tokio::time::timeout(DEADLINE, stream.read(&mut chunk))
            .await
            .expect("the rest of the body")
            .unwrap();
        assert!(n > 0, "the body ended early at {got}");
        got += n;
    }
    assert_eq!(got, SIZE);
    // The answer is judged when its body has ended; the next request's answer follows it.
    stream.write_all(GET).await.unwrap();
    let head = tokio::time::timeout(DEADLINE, read_head(&mut stream, &mut buf))
        .await
        .unwrap();
    assert!(head.is_some());
    assert_eq!(errors(&balancer, 0), []);
}

// ---- 4, 5, 6: what a backend answer must be --------------------------------------------------

#[tokio::test]
async fn a_status_code_outside_100_599_is_a_malformed_answer() {
    let backend = answering(b"HTTP/1.1 600 Beyond\r\nContent-Length: 2\r\n\r\nok").await;
    let (balancer, addr) = balancer(&[backend.addr], "", "").await;
    let reply = roundtrip(addr, GET).await.expect("an answer");
    assert_eq!(reply.status, 502, "{reply:?}");
    assert_eq!(charged(&balancer, 0), [Outcome::Malformed]);
}

#[tokio::test]
async fn an_unasked_101_is_a_malformed_answer_and_is_not_relayed() {
    let backend = answering(
        b"HTTP/1.1 101 Switching Protocols\r\nUpgrade: raw\r\nConnection: upgrade\r\n\r\nRAW BYTES",
    )
    .await;
    let (balancer, addr) = balancer(&[backend.addr], "", "").await;
    let mut stream = TcpStream::connect(addr).await.unwrap();
    stream.write_all(GET).await.unwrap();
    let mut buf = Vec::new();
    let reply = read_reply(&mut stream, &mut buf).await.expect("an answer");
    assert_eq!(reply.status, 502, "{reply:?}");
    assert_eq!(charged(&balancer, 0), [Outcome::Malformed]);
    stream.write_all(GET).await.unwrap();
    let next = read_reply(&mut stream, &mut buf)
        .await
        .expect("a second answer");
    assert_eq!(next.status, 502);
    assert!(!String::from_utf8_lossy(&next.body).contains("RAW"));
}

#[tokio::test]
async fn content_length_beside_chunked_never_truncates_the_body() {
    for length in ["3", "40", "5"] {
        let answer = format!(
            "HTTP/1.1 200 OK\r\nContent-Length: {length}\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n0\r\n\r\n"
        );
        let backend = answering(Box::leak(answer.into_bytes().into_boxed_slice())).await;
        let (balancer, addr) = balancer(&[backend.addr], "", "").await;
        for _ in 0..2 {
            let reply = roundtrip(addr, GET)
                .await
                .expect("an answer, not a bare close");
            assert_eq!(reply.status, 200, "{length}: {reply:?}");
            assert_eq!(reply.body, b"hello", "{length}: {reply:?}");
        }
        assert_eq!(
            backend.accepted.load(Ordering::SeqCst),
            2,
            "{length}: a connection whose answer had both is not reused"
        );
        assert_eq!(errors(&balancer, 0), []);
    }
}

#[tokio::test]
async fn answers_with_untrustworthy_framing_get_502() {
    for answer in [
        &b"HTTP/1.1 200 OK\r\nContent-Length: 3\r\nContent-Length: 4\r\n\r\nabcd"[..],
        b"HTTP/1.1 200 OK\r\nContent-Length: 3, 4\r\n\r\nabcd",
        b"HTTP/1.1 200 OK\r\nTransfer-Encoding: gzip, chunked\r\n\r\n1\r\nx\r\n0\r\n\r\n",
        b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked, gzip\r\n\r\nxyz",
        b"HTTP/1.0 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n1\r\nx\r\n0\r\n\r\n",
    ] {
        let backend = answering(answer).await;
        let (balancer, addr) = balancer(&[backend.addr], "", "").await;
        let reply = roundtrip(addr, GET).await.expect("an answer");
        let text = String::from_utf8_lossy(answer);
        assert_eq!(reply.status, 502, "{text}: {reply:?}");
        assert_eq!(charged(&balancer, 0), [Outcome::Malformed], "{text}");
    }
    // A length repeated as a list is one length, and goes to the client as one number.
    let backend = answering(b"HTTP/1.1 200 OK\r\nContent-Length: 2, 2\r\n\r\nok").await;
    let (_balancer, addr) = balancer(&[backend.addr], "", "").await;
    let reply = roundtrip(addr, GET).await.expect("an answer");
    assert_eq!(
        (reply.status, &reply.body[..]),
        (200, &b"ok"[..]),
        "{reply:?}"
    );
    assert_eq!(header(&reply.head, "content-length"), Some("2"));
}

// ---- 7: one host per request -------------------------------------------------------------------

/// A backend that answers each request with the Host it received.
async fn host_echo() -> Backend {
    Backend::start(|mut stream| async move {
        let mut buf = Vec::new();
        while let Some(head) = read_head(&mut stream, &mut buf).await {
            let hosts: Vec<&str> = head
                .split("\r\n")
                .skip(1)
                .filter_map(|line| line.split_once(':'))
                .filter(|(name, _)| name.trim().eq_ignore_ascii_case("host"))
                .map(|(_, value)| value.trim())
                .collect();
            let text = hosts.join("|");
            let answer = format!(
                "HTTP/1.1 200 OK\r\nContent-Length: {}\r\n\r\n{text}",
                text.len()
            );
            if stream.write_all(answer.as_bytes()).await.is_err() {
                return;
            }
        }
    })
    .await
}

const A_TEST_ONLY: &str = "[[listeners.routes]]\nhost = \"a.test\"\npool = \"web\"";

#[tokio::test]
async fn ambiguous_hosts_get_400_and_never_reach_a_backend() {
    let backend = host_echo().await;
    let (_balancer, addr) = balancer(&[backend.addr], A_TEST_ONLY, "").await;
    for request in [
        &b"GET / HTTP/1.1\r\nHost: a.test\r\nHost: b.test\r\n\r\n"[..],
        b"GET / HTTP/1.1\r\nHost: a.test\r\nHost: a.test\r\n\r\n",
        b"GET http://a.test/ HTTP/1.1\r\nHost: b.test\r\n\r\n",
        b"GET http://a.test/ HTTP/1.1\r\nHost: a.test:8080\r\n\r\n",
        b"GET / HTTP/1.1\r\n\r\n",
        b"GET http://a.test/ HTTP/1.1\r\n\r\n",
    ] {
        let reply = roundtrip(addr, request).await.expect("an answer");
        assert_eq!(
            reply.status,
            400,
            "{}: {reply:?}",
            String::from_utf8_lossy(request)
        );
    }
    assert_eq!(backend.accepted.load(Ordering::SeqCst), 0);
}

#[tokio::test]
async fn routing_and_the_forwarded_request_use_the_same_host() {
    let backend = host_echo().await;
    let (_balancer, addr) = balancer(&[backend.addr], A_TEST_ONLY, "").await;
    for (request, status, seen) in [
        (
            &b"GET / HTTP/1.1\r\nHost: A.test:80\r\n\r\n"[..],
            200,
            &b"A.test:80"[..],
        ),
        (
            b"GET http://a.test/x HTTP/1.1\r\nHost: a.test\r\n\r\n",
            200,
            b"a.test",
        ),
        (
            b"GET http://a.test:80/x HTTP/1.1\r\nHost: a.test\r\n\r\n",
            200,
            b"a.test",
        ),
        (b"GET http://a.test/x HTTP/1.0\r\n\r\n", 200, b"a.test"),
        (b"GET / HTTP/1.1\r\nHost: b.test\r\n\r\n", 404, b""),
    ] {
        let reply = roundtrip(addr, request).await.expect("an answer");
        let text = String::from_utf8_lossy(request);
        assert_eq!(reply.status, status, "{text}: {reply:?}");
        if status == 200 {
            assert_eq!(reply.body, seen, "{text}");
        }
    }
}

// ---- 8: bytes a backend sends never reach another client --------------------------------------

/// A backend that, after some answers, writes a whole second answer 20 ms later, unasked,
/// naming the client whose request it follows: after a HEAD answer (as if it were the body),
/// after a complete Content-Length body, and after a 204. `/plain` gets no stray bytes.
async fn poisoner() -> Backend {
    Backend::start(|mut stream| async move {
        let mut buf = Vec::new();
        while let Some(head) = read_head(&mut stream, &mut buf).await {
            let client = header(&head, "x-client").unwrap_or("?").to_owned();
            let path = head.split(' ').nth(1).unwrap_or("/").to_owned();
            let answer = match path.as_str() {
                "/head" => "HTTP/1.1 200 OK\r\nContent-Length: 30\r\n\r\n".to_owned(),
                "/204" => "HTTP/1.1 204 No Content\r\n\r\n".to_owned(),
                _ => {
                    let text = format!("OK-{client}");
                    format!(
                        "HTTP/1.1 200 OK\r\nContent-Length: {}\r\n\r\n{text}",
                        text.len()
                    )
                }
            };
            if stream.write_all(answer.as_bytes()).await.is_err() {
                return;
            }
            if path != "/plain" {
                tokio::time::sleep(Duration::from_millis(20)).await;
                let text = format!("POISONED-{client}");
                let stray = format!(
                    "HTTP/1.1 200 OK\r\nContent-Length: {}\r\n\r\n{text}",
                    text.len()
                );
                if stream.write_all(stray.as_bytes()).await.is_err() {
                    return;
                }
            }
        }
    })
    .await
}

/// One request of client `client` on `stream`: the answer's body (none for HEAD and 204), or
/// `None` if the connection ended without a whole answer.
async fn poisonable_request(
    stream: &mut TcpStream,
    buf: &mut Vec<u8>,
    client: &str,
    kind: &str,
) -> Option<(u16, Vec<u8>)> {
    let method = if kind == "/head" { "HEAD" } else { "GET" };
    let request =
        format!("{method} {kind} HTTP/1.1\r\nHost: app.test\r\nX-Client: {client}\r\n\r\n");
    stream.write_all(request.as_bytes()).await.ok()?;
    let head = read_head(stream, buf).await?;
    let status: u16 = head.get(9..12)?.parse().ok()?;
    if method == "HEAD" || status == 204 {
        return Some((status, Vec::new()));
    }
    let body = read_request_body(stream, buf, &head).await?;
    Some((status, body))
}

/// The client names found in `POISONED-<client>` markers of `body`.
fn poisoned_by(body: &[u8]) -> Vec<String> {
    let text = String::from_utf8_lossy(body);
    text.match_indices("POISONED-")
        .map(|(at, marker)| {
            text[at + marker.len()..]
                .chars()
                .take_while(|c| c.is_ascii_alphanumeric() || *c == '-')
                .collect()
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn stray_backend_bytes_never_reach_another_client() {
    let backend = poisoner().await;
    let (_balancer, addr) = balancer(&[backend.addr], "", "").await;
    const KINDS: [&str; 4] = ["/head", "/cl", "/204", "/plain"];
    let mut tasks = Vec::new();
    // Keep-alive clients: many requests on one connection each.
    for c in 0..20 {
        tasks.push(tokio::spawn(async move {
            let client = format!("k{c}");
            let mut stream = TcpStream::connect(addr).await.unwrap();
            let mut buf = Vec::new();
            let mut seen = Vec::new();
            for r in 0..12 {
                let kind = KINDS[(c + r) % KINDS.len()];
                match poisonable_request(&mut stream, &mut buf, &client, kind).await {
                    Some((_, body)) => seen.extend(poisoned_by(&body)),
                    None => {
                        stream = TcpStream::connect(addr).await.unwrap();
                        buf.clear();
                    }
                }
            }
            (client, seen)
        }));
    }
    // Fresh clients: one request per connection, arriving while the others run.
    for c in 0..40 {
        tasks.push(tokio::spawn(async move {
            let client = format!("f{c}");
            let mut seen = Vec::new();
            for r in 0..6 {
                let mut stream = TcpStream::connect(addr).await.unwrap();
                let mut buf = Vec::new();
                let kind = KINDS[(c + r) % KINDS.len()];
                if let Some((_, body)) =
                    poisonable_request(&mut stream, &mut buf, &client, kind).await
                {
                    seen.extend(poisoned_by(&body));
                }
            }
            (client, seen)
        }));
    }
    let mut foreign = Vec::new();
    for task in tasks {
        let (client, seen) = tokio::time::timeout(DEADLINE, task)
            .await
            .expect("every client finishes")
            .expect("client task");
        foreign.extend(
            seen.into_iter()
                .filter(|from| *from != client)
                .map(|from| format!("{client} got {from}'s bytes")),
        );
    }
    assert!(
        foreign.is_empty(),
        "{} cross-client answers: {foreign:?}",
        foreign.len()
    );
}

#[tokio::test]
async fn a_new_client_connection_never_reuses_another_ones_backend_connection() {
    let backend = length_backend().await;
    let (balancer, addr) = balancer(&[backend.addr], "", "").await;
    // Keep-alive: the backend connection is reused by the same client connection.
    let mut stream = TcpStream::connect(addr).await.unwrap();
    let mut buf = Vec::new();
    for _ in 0..3 {
        stream.write_all(GET).await.unwrap();
        assert_eq!(read_reply(&mut stream, &mut buf).await.unwrap().status, 200);
    }
    assert_eq!(backend.accepted.load(Ordering::SeqCst), 1);
    // Another client connection, while the first is open and idle: a fresh backend connection.
    let reply = roundtrip(addr, GET).await.unwrap();
    assert_eq!(reply.status, 200);
    assert_eq!(backend.accepted.load(Ordering::SeqCst), 2);
    drop(stream);
    let _ = balancer;
}

#[tokio::test]
async fn shared_reuse_stays_available_as_an_opt_in() {
    let backend = length_backend().await;
    let (_balancer, addr) =
        balancer_with(&[backend.addr], "", "", "connection_reuse = \"shared\"").await;
    for _ in 0..3 {
        assert_eq!(roundtrip(addr, GET).await.unwrap().status, 200);
    }
    assert_eq!(backend.accepted.load(Ordering::SeqCst), 1);
}

#[tokio::test]
async fn an_idle_private_backend_connection_is_closed_after_timeouts_idle() {
    let backend = length_backend().await;
    let (_balancer, addr) = balancer(&[backend.addr], "", "idle = \"200ms\"").await;
    let mut stream = TcpStream::connect(addr).await.unwrap();
    let mut buf = Vec::new();
    stream.write_all(GET).await.unwrap();
    assert_eq!(read_reply(&mut stream, &mut buf).await.unwrap().status, 200);
    // The client connection stays open and idle; its backend connection does not outlive
    // the backend's idle timeout (plus the watcher's period).
    until(|| backend.closed.load(Ordering::SeqCst) == 1).await;
    stream.write_all(GET).await.unwrap();
    assert_eq!(read_reply(&mut stream, &mut buf).await.unwrap().status, 200);
    assert_eq!(backend.accepted.load(Ordering::SeqCst), 2);
}

// ---- A retry sends the same request -----------------------------------------------------------

#[tokio::test]
async fn a_retry_sends_the_same_request_head_again() {
    let heads = Arc::new(std::sync::Mutex::new(Vec::<(&str, String)>::new()));
    let seen = heads.clone();
    // Reads a request, then closes without an answer: a reset before the head, retried.
    let closer = Backend::start(move |mut stream| {
        let seen = seen.clone();
        async move {
            let mut buf = Vec::new();
            if let Some(head) = read_head(&mut stream, &mut buf).await {
                seen.lock().unwrap().push(("closer", head));
            }
        }
    })
    .await;
    let seen = heads.clone();
    let answerer = Backend::start(move |mut stream| {
        let seen = seen.clone();
        async move {
            let mut buf = Vec::new();
            while let Some(head) = read_head(&mut stream, &mut buf).await {
                seen.lock().unwrap().push(("answerer", head));
                let answer = "HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok";
                if stream.write_all(answer.as_bytes()).await.is_err() {
                    return;
                }
            }
        }
    })
    .await;
    let (_balancer, addr) = balancer_with(
        &[closer.addr, answerer.addr],
        "",
        "",
        "retries = { attempts = 1 }",
    )
    .await;
    let request = b"GET /again?x=1 HTTP/1.1\r\nHost: app.test\r\nX-Tag: one\r\nX-Tag: two\r\nAccept: */*\r\n\r\n";
    for _ in 0..2 {
        let reply = roundtrip(addr, request).await.expect("an answer");
        assert_eq!((reply.status, &reply.body[..]), (200, &b"ok"[..]));
    }
    let heads = heads.lock().unwrap().clone();
    let at = heads
        .iter()
        .position(|(backend, _)| *backend == "closer")
        .expect("one request went to the closer first");
    let (_, first) = &heads[at];
    let (backend, again) = &heads[at + 1];
    assert_eq!(*backend, "answerer");
    assert_eq!(first, again);
    assert!(first.starts_with("GET /again?x=1 HTTP/1.1"), "{first}");
    assert!(first.contains("x-tag: one\r\nx-tag: two"), "{first}");
}
