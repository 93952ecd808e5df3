//! Tests of the scripted backend over real loopback sockets.

use std::io;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use super::wire::{chunk_size, fill};
use super::*;
use std::time::Instant;

const DEADLINE: Duration = Duration::from_secs(5);

async fn backend(name: &str) -> SimBackend {
    SimBackend::start(name, "127.0.0.1:0".parse().unwrap())
        .await
        .unwrap()
}

async fn connect(backend: &SimBackend) -> TcpStream {
    TcpStream::connect(backend.addr()).await.unwrap()
}

/// Sends `request` and reads one response whose body is sized by Content-Length (or absent,
/// or not sent because the request was a HEAD).
async fn exchange(stream: &mut TcpStream, request: &str) -> String {
    tokio::time::timeout(DEADLINE, exchange_inner(stream, request))
        .await
        .expect("no complete response before the deadline")
}

async fn exchange_inner(stream: &mut TcpStream, request: &str) -> String {
    stream.write_all(request.as_bytes()).await.unwrap();
    let mut buf = Vec::new();
    let head_len = loop {
        if let Some(end) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
            break end + 4;
        }
        let n = fill(stream, &mut buf).await.unwrap();
        assert!(
            n > 0,
            "closed mid-response: {:?}",
            String::from_utf8_lossy(&buf)
        );
    };
    let head = String::from_utf8(buf[..head_len].to_vec()).unwrap();
    let length: usize = head
        .lines()
        .find_map(|line| line.strip_prefix("Content-Length: "))
        .map_or(0, |n| n.parse().unwrap());
    let length = if request.starts_with("HEAD ") {
        0
    } else {
        length
    };
    while buf.len() < head_len + length {
        assert!(fill(stream, &mut buf).await.unwrap() > 0);
    }
    String::from_utf8(buf).unwrap()
}

/// Reads until the peer closes; the error if it was not a clean close.
async fn read_to_close(stream: &mut TcpStream) -> Result<Vec<u8>, io::ErrorKind> {
    let mut all = Vec::new();
    tokio::time::timeout(DEADLINE, stream.read_to_end(&mut all))
        .await
        .expect("the backend neither closed nor reset")
        .map_err(|e| e.kind())?;
    Ok(all)
}

fn get(path: &str) -> String {
    format!("GET {path} HTTP/1.1\r\nHost: sim\r\n\r\n")
}

#[tokio::test]
async fn traffic_answers_name_and_echoes_headers_with_keep_alive() {
    let b = backend("alpha").await;
    let mut s = connect(&b).await;
    let request = "GET /x HTTP/1.1\r\nHost: example.test\r\nX-Forwarded-For: 10.0.0.1\r\n\
                   x-forwarded-for: 10.0.0.2\r\nX-Forwarded-Proto: https\r\n\r\n";
    let first = exchange(&mut s, request).await;
    assert!(first.starts_with("HTTP/1.1 200 OK\r\n"), "{first}");
    assert!(first.contains("\r\nX-Backend: alpha\r\n"), "{first}");
    assert!(
        first.contains("\r\nX-Seen-Host: example.test\r\n"),
        "{first}"
    );
    assert!(
        first.contains("\r\nX-Seen-Xff: 10.0.0.1, 10.0.0.2\r\n"),
        "{first}"
    );
    assert!(first.contains("\r\nX-Seen-Proto: https\r\n"), "{first}");
    assert!(first.contains("\r\nContent-Length: 6\r\n"), "{first}");
    assert!(first.ends_with("\r\n\r\nalpha\n"), "{first}");
    assert!(!first.contains("Connection: close"), "{first}");
    // Same connection, second request.
    b.set_traffic(Mode::Status(503));
    let second = exchange(&mut s, &get("/y")).await;
    assert!(
        second.starts_with("HTTP/1.1 503 Service Unavailable\r\n"),
        "{second}"
    );
    assert!(!second.contains("X-Seen-Xff"), "{second}");
    assert_eq!((b.traffic_hits(), b.health_hits()), (2, 0));
}

#[tokio::test]
async fn connection_close_and_http10_close_after_the_answer() {
    let b = backend("alpha").await;
    let mut s = connect(&b).await;
    let req = "GET / HTTP/1.1\r\nHost: a\r\nConnection: close\r\n\r\n";
    s.write_all(req.as_bytes()).await.unwrap();
    let all = String::from_utf8(read_to_close(&mut s).await.unwrap()).unwrap();
    assert!(
        all.contains("\r\nConnection: close\r\n") && all.ends_with("alpha\n"),
        "{all}"
    );

    let mut s = connect(&b).await;
    s.write_all(b"GET / HTTP/1.0\r\n\r\n").await.unwrap();
    let all = String::from_utf8(read_to_close(&mut s).await.unwrap()).unwrap();
    assert!(all.starts_with("HTTP/1.1 200 OK\r\n"), "{all}");
}

#[tokio::test]
async fn request_bodies_are_discarded() {
    let b = backend("alpha").await;
    let mut s = connect(&b).await;
    let sized = "POST /a HTTP/1.1\r\nHost: a\r\nContent-Length: 5\r\n\r\nhello";
    assert!(exchange(&mut s, sized).await.starts_with("HTTP/1.1 200"));
    let chunked = "POST /a HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\n\r\n\
                   5;ext=1\r\nhello\r\n3\r\nabc\r\n0\r\nTrailer: x\r\n\r\n";
    assert!(exchange(&mut s, chunked).await.starts_with("HTTP/1.1 200"));
    let head = "HEAD /a HTTP/1.1\r\nHost: a\r\n\r\n";
    let answer = exchange(&mut s, head).await;
    assert!(answer.ends_with("Content-Length: 6\r\n\r\n"), "{answer}");
    assert!(exchange(&mut s, &get("/b")).await.ends_with("alpha\n"));
    assert_eq!(b.traffic_hits(), 4);
}

#[tokio::test]
async fn a_bad_request_gets_400_and_a_close() {
    let b = backend("alpha").await;
    let mut s = connect(&b).await;
    s.write_all(b"NONSENSE\r\n\r\n").await.unwrap();
    let all = String::from_utf8(read_to_close(&mut s).await.unwrap()).unwrap();
    assert!(all.starts_with("HTTP/1.1 400 "), "{all}");
    assert_eq!(b.traffic_hits(), 0);
}

#[tokio::test]
async fn health_route_is_separate_and_follows_a_pattern() {
    let b = backend("alpha").await;
    b.set_traffic(Mode::Status(500));
    b.set_health_pattern(vec![
        Mode::Status(200),
        Mode::Status(200),
        Mode::Status(503),
    ]);
    let mut s = connect(&b).await;
    let mut codes = Vec::new();
    for _ in 0..6 {
        let answer = exchange(&mut s, &get("/healthz")).await;
        codes.push(answer[9..12].to_owned());
    }
    assert_eq!(codes, ["200", "200", "503", "200", "200", "503"]);
    let query = exchange(&mut s, &get("/healthz?full=1")).await;
    assert!(query.starts_with("HTTP/1.1 200"), "{query}");
    let other = exchange(&mut s, &get("/healthz/deep")).await;
    assert!(other.starts_with("HTTP/1.1 500"), "{other}");
    assert_eq!((b.traffic_hits(), b.health_hits()), (1, 7));
    b.set_health(Mode::Status(404));
    assert!(exchange(&mut s, &get("/healthz"))
        .await
        .starts_with("HTTP/1.1 404"));
}

#[tokio::test]
async fn hang_reads_the_request_and_never_answers() {
    let b = backend("alpha").await;
    b.set_traffic(Mode::Hang);
    let mut s = connect(&b).await;
    s.write_all(get("/").as_bytes()).await.unwrap();
    assert!(b.wait_traffic_hits(1, DEADLINE).await);
    let mut byte = [0u8; 1];
    let read = tokio::time::timeout(Duration::from_millis(200), s.read(&mut byte)).await;
    assert!(read.is_err(), "a hanging backend answered: {read:?}");
}

#[tokio::test]
async fn close_sends_a_clean_eof() {
    let b = backend("alpha").await;
    b.set_traffic(Mode::Close);
    let mut s = connect(&b).await;
    s.write_all(get("/").as_bytes()).await.unwrap();
    assert_eq!(read_to_close(&mut s).await, Ok(Vec::new()));
}

#[tokio::test]
async fn reset_sends_a_reset() {
    let b = backend("alpha").await;
    b.set_traffic(Mode::Reset);
    let mut s = connect(&b).await;
    s.write_all(get("/").as_bytes()).await.unwrap();
    assert_eq!(
        read_to_close(&mut s).await,
        Err(io::ErrorKind::ConnectionReset)
    );
}

#[tokio::test]
async fn garbage_answers_garbage_and_closes() {
    let b = backend("alpha").await;
    b.set_health(Mode::Garbage);
    let mut s = connect(&b).await;
    s.write_all(get("/healthz").as_bytes()).await.unwrap();
    assert_eq!(read_to_close(&mut s).await.unwrap(), b"garbage\r\n\r\n");
}

#[tokio::test]
async fn delay_answers_late() {
    let b = backend("alpha").await;
    b.set_traffic(Mode::Delay(Duration::from_millis(150), 201));
    let mut s = connect(&b).await;
    let started = Instant::now();
    let answer = exchange(&mut s, &get("/")).await;
    assert!(answer.starts_with("HTTP/1.1 201 Created\r\n"), "{answer}");
    assert!(started.elapsed() >= Duration::from_millis(150));
}

#[tokio::test]
async fn bodyless_statuses_have_no_body() {
    let b = backend("alpha").await;
    b.set_traffic(Mode::Status(204));
    let mut s = connect(&b).await;
    let answer = exchange(&mut s, &get("/")).await;
    assert!(
        answer.starts_with("HTTP/1.1 204 No Content\r\n"),
        "{answer}"
    );
    assert!(answer.ends_with("\r\n\r\n") && !answer.contains("Content-Length"));
    // The connection is still usable.
    b.set_traffic(Mode::Status(200));
    assert!(exchange(&mut s, &get("/")).await.ends_with("alpha\n"));
}

#[tokio::test]
async fn crash_refuses_and_resets_then_restart_serves_on_the_same_port() {
    let b = backend("alpha").await;
    b.set_traffic(Mode::Hang);
    let addr = b.addr();
    let mut open = connect(&b).await;
    open.write_all(get("/").as_bytes()).await.unwrap();
    assert!(b.wait_traffic_hits(1, DEADLINE).await);
    assert!(b.is_running());

    b.crash();
    assert!(!b.is_running());
    let refused = TcpStream::connect(addr).await.unwrap_err();
    assert_eq!(refused.kind(), io::ErrorKind::ConnectionRefused);
    assert_eq!(
        read_to_close(&mut open).await,
        Err(io::ErrorKind::ConnectionReset)
    );
    b.crash(); // A second crash is harmless.

    b.restart().await.unwrap();
    assert!(b.is_running());
    assert_eq!(b.addr(), addr);
    b.restart().await.unwrap(); // Restarting a running backend is harmless.
    b.set_traffic(Mode::Status(200));
    let mut s = connect(&b).await;
    assert!(exchange(&mut s, &get("/")).await.ends_with("alpha\n"));
    assert_eq!(b.traffic_hits(), 2);
}

#[tokio::test]
async fn wait_traffic_hits_reports_a_missed_deadline() {
    let b = backend("alpha").await;
    assert!(b.wait_traffic_hits(0, Duration::ZERO).await);
    assert!(!b.wait_traffic_hits(1, Duration::from_millis(50)).await);
    let mut s = connect(&b).await;
    let waiter = b.wait_traffic_hits(3, DEADLINE);
    let client = async {
        for _ in 0..3 {
            exchange(&mut s, &get("/")).await;
        }
    };
    let (reached, ()) = tokio::join!(waiter, client);
    assert!(reached);
    assert!(b.wait_health_hits(0, Duration::ZERO).await);
}

#[tokio::test]
async fn dropping_stops_the_backend() {
    let b = backend("alpha").await;
    let addr = b.addr();
    assert_eq!(b.name(), "alpha");
    drop(b);
    let refused = TcpStream::connect(addr).await.unwrap_err();
    assert_eq!(refused.kind(), io::ErrorKind::ConnectionRefused);
}

#[test]
fn chunk_sizes() {
    assert_eq!(chunk_size(b"1a"), Some(26));
    assert_eq!(chunk_size(b"0"), Some(0));
    assert_eq!(chunk_size(b"5;ext=1"), Some(5));
    assert_eq!(chunk_size(b""), None);
    assert_eq!(chunk_size(b"zz"), None);
    assert_eq!(chunk_size(b"ffffffffffffffff"), None);
}
