//! Raw sockets: hand-written backends for what a scripted backend cannot do, and byte-level
//! reading of HTTP/1.1 heads and bodies.

use std::future::Future;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::task::JoinHandle;

use super::{any, DEADLINE};

/// A hand-written backend: an accept loop running `serve` on each connection, a count of the
/// requests `serve` reports, and counts of the connections accepted and of those whose `serve`
/// has returned (the peer closed, or `serve` gave up). Dropping it stops accepting.
pub struct RawBackend {
    pub addr: SocketAddr,
    hits: Arc<AtomicU64>,
    accepted: Arc<AtomicU64>,
    closed: Arc<AtomicU64>,
    accept: JoinHandle<()>,
}

impl RawBackend {
    /// Listens on an ephemeral port and serves each connection with `serve`.
    pub async fn start<F, Fut>(serve: F) -> RawBackend
    where
        F: Fn(TcpStream, Arc<AtomicU64>) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = ()> + Send + 'static,
    {
        let listener = TcpListener::bind(any()).await.expect("bind raw backend");
        let addr = listener.local_addr().expect("local addr");
        let hits = Arc::new(AtomicU64::new(0));
        let accepted = Arc::new(AtomicU64::new(0));
        let closed = Arc::new(AtomicU64::new(0));
        let (counter, count, ended) = (hits.clone(), accepted.clone(), closed.clone());
        let accept = tokio::spawn(async move {
            while let Ok((stream, _)) = listener.accept().await {
                count.fetch_add(1, Ordering::SeqCst);
                let _ = stream.set_nodelay(true);
                let serving = serve(stream, counter.clone());
                let ended = ended.clone();
                tokio::spawn(async move {
                    serving.await;
                    ended.fetch_add(1, Ordering::SeqCst);
                });
            }
        });
        RawBackend {
            addr,
            hits,
            accepted,
            closed,
            accept,
        }
    }

    /// Like [`RawBackend::start`], for a `serve` that counts no requests.
    pub async fn serving<F, Fut>(serve: F) -> RawBackend
    where
        F: Fn(TcpStream) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = ()> + Send + 'static,
    {
        RawBackend::start(move |stream, _| serve(stream)).await
    }

    /// Connections accepted so far.
    pub fn accepted(&self) -> u64 {
        self.accepted.load(Ordering::SeqCst)
    }

    /// Connections whose `serve` has returned so far.
    pub fn closed(&self) -> u64 {
        self.closed.load(Ordering::SeqCst)
    }

    /// Requests served so far.
    pub fn hits(&self) -> u64 {
        self.hits.load(Ordering::SeqCst)
    }

    /// `(name, address)` for a pool's backend list.
    pub fn entry(&self, name: &str) -> (String, SocketAddr) {
        (name.to_owned(), self.addr)
    }
}

impl Drop for RawBackend {
    fn drop(&mut self) {
        self.accept.abort();
    }
}

/// A keep-alive backend that reads each request whole and answers `200` with its body's
/// length.
pub async fn length_backend() -> RawBackend {
    RawBackend::serving(|mut stream| async move {
        let mut buf = Vec::new();
        while let Some(head) = read_head(&mut stream, &mut buf).await {
            let Some(body) = read_body(&mut stream, &mut buf, &head).await else {
                return;
            };
            let text = body.len().to_string();
            let answer = ok_answer(&text);
            if stream.write_all(answer.as_bytes()).await.is_err() {
                return;
            }
        }
    })
    .await
}

/// A `200 OK` answer whose body is `text`.
pub fn ok_answer(text: &str) -> String {
    format!(
        "HTTP/1.1 200 OK\r\nContent-Length: {}\r\n\r\n{text}",
        text.len()
    )
}

/// Where `needle` first starts in `haystack`.
pub fn find(haystack: &[u8], needle: &[u8]) -> Option<usize> {
    haystack.windows(needle.len()).position(|w| w == needle)
}

/// Reads until `buf` holds a whole head; returns it (without the blank line) and leaves what
/// follows in `buf`. `None` at the end of the stream or on an error.
pub async fn read_head(stream: &mut TcpStream, buf: &mut Vec<u8>) -> Option<String> {
    loop {
        if let Some(end) = find(buf, b"\r\n\r\n") {
            let head = String::from_utf8_lossy(&buf[..end]).into_owned();
            buf.drain(..end + 4);
            return Some(head);
        }
        fill(stream, buf).await.ok().filter(|&n| n > 0)?;
    }
}

/// One read from `stream` appended to `buf`.
pub async fn fill(stream: &mut TcpStream, buf: &mut Vec<u8>) -> std::io::Result<usize> {
    let mut chunk = vec![0u8; 64 * 1024];
    let n = stream.read(&mut chunk).await?;
    buf.extend_from_slice(&chunk[..n]);
    Ok(n)
}

/// The value of the first header named `name` (case-insensitive) in `head`.
pub fn header<'a>(head: &'a str, name: &str) -> Option<&'a str> {
    head.split("\r\n").skip(1).find_map(|line| {
        let (n, v) = line.split_once(':')?;
        n.trim().eq_ignore_ascii_case(name).then(|| v.trim())
    })
}

/// Whether header `name` in `head` lists `token` (case-insensitive).
pub fn has_token(head: &str, name: &str, token: &str) -> bool {
    header(head, name).is_some_and(|v| v.split(',').any(|t| t.trim().eq_ignore_ascii_case(token)))
}

/// The next `n` bytes (from `buf`, then the stream).
pub async fn read_exact_buf(
    stream: &mut TcpStream,
    buf: &mut Vec<u8>,
    n: usize,
) -> Option<Vec<u8>> {
    while buf.len() < n {
        fill(stream, buf).await.ok().filter(|&r| r > 0)?;
    }
    Some(buf.drain(..n).collect())
}

/// The next line, without its CRLF.
pub async fn read_line(stream: &mut TcpStream, buf: &mut Vec<u8>) -> Option<String> {
    loop {
        if let Some(end) = find(buf, b"\r\n") {
            let line = String::from_utf8_lossy(&buf[..end]).into_owned();
            buf.drain(..end + 2);
            return Some(line);
        }
        fill(stream, buf).await.ok().filter(|&r| r > 0)?;
    }
}

/// Reads the body `head` announces (sized, chunked, or none).
pub async fn read_body(stream: &mut TcpStream, buf: &mut Vec<u8>, head: &str) -> Option<Vec<u8>> {
    if has_token(head, "transfer-encoding", "chunked") {
        let mut body = Vec::new();
        loop {
            let line = read_line(stream, buf).await?;
            let size = usize::from_str_radix(line.split(';').next()?.trim(), 16).ok()?;
            if size == 0 {
                while !read_line(stream, buf).await?.is_empty() {}
                return Some(body);
            }
            body.extend(read_exact_buf(stream, buf, size).await?);
            if !read_line(stream, buf).await?.is_empty() {
                return None;
            }
        }
    }
    let length = header(head, "content-length").map_or(Some(0), |v| v.parse().ok())?;
    read_exact_buf(stream, buf, length).await
}

/// Sends raw `request` bytes on a fresh connection and reads until the peer closes (or
/// resets). Returns what was read; panics if the peer neither answers nor closes in time.
pub async fn raw_roundtrip(addr: SocketAddr, request: &[u8]) -> Vec<u8> {
    let mut stream = TcpStream::connect(addr).await.expect("connect");
    // The peer may close before reading everything; what it answered still counts.
    let _ = stream.write_all(request).await;
    let mut out = Vec::new();
    let read = async {
        let mut chunk = [0u8; 16384];
        loop {
            match stream.read(&mut chunk).await {
                Ok(0) | Err(_) => return,
                Ok(n) => out.extend_from_slice(&chunk[..n]),
            }
        }
    };
    tokio::time::timeout(DEADLINE, read)
        .await
        .expect("the balancer closed the connection in time");
    out
}

/// Sends `head` (the request line and headers, without the blank line) with
/// `Connection: close` and `Content-Length: 0` on a fresh connection, and returns the status
/// code and the whole answer.
pub async fn send_head(addr: SocketAddr, head: &str) -> (u16, String) {
    let request = format!("{head}\r\nconnection: close\r\ncontent-length: 0\r\n\r\n");
    let answer = raw_roundtrip(addr, request.as_bytes()).await;
    let status = status_of(&answer).expect("an HTTP answer");
    (status, String::from_utf8_lossy(&answer).into_owned())
}

/// The status code of a raw response.
pub fn status_of(response: &[u8]) -> Option<u16> {
    let text = std::str::from_utf8(response.get(..12)?).ok()?;
    let rest = text.strip_prefix("HTTP/1.")?;
    rest.get(2..5)?.parse().ok()
}

/// A client's view of one answer read from raw bytes.
#[derive(Debug)]
pub struct Reply {
    pub status: u16,
    pub head: String,
    pub body: Vec<u8>,
}

/// Reads one answer (head, and a Content-Length or chunked body) from `stream`; `None` if the
/// connection ended before a complete one.
pub async fn read_reply(stream: &mut TcpStream, buf: &mut Vec<u8>) -> Option<Reply> {
    let head = read_head(stream, buf).await?;
    let status = head.get(9..12)?.parse().ok()?;
    let body = if header(&head, "transfer-encoding").is_some()
        || header(&head, "content-length").is_some()
    {
        read_body(stream, buf, &head).await?
    } else {
        Vec::new()
    };
    Some(Reply { status, head, body })
}

/// Sends `request` on a fresh connection and reads one answer, failing after [`DEADLINE`].
pub async fn roundtrip(addr: SocketAddr, request: &[u8]) -> Option<Reply> {
    let mut stream = TcpStream::connect(addr).await.expect("connect");
    stream.write_all(request).await.expect("send");
    let mut buf = Vec::new();
    tokio::time::timeout(DEADLINE, read_reply(&mut stream, &mut buf))
        .await
        .expect("an answer or a close within the deadline")
}

/// Reads until the peer closes; `true` if it did within [`DEADLINE`].
pub async fn closes(stream: &mut TcpStream) -> bool {
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

/// Plain requests get `200 plain` (keep-alive); an upgrade request gets a 101 and an echo.
pub async fn echo_backend() -> RawBackend {
    RawBackend::start(|mut stream, hits| async move {
        let mut buf = Vec::new();
        loop {
            let Some(head) = read_head(&mut stream, &mut buf).await else {
                return;
            };
            hits.fetch_add(1, Ordering::SeqCst);
            let upgrade = has_token(&head, "connection", "upgrade")
                && header(&head, "upgrade").is_some_and(|v| v.eq_ignore_ascii_case("websocket"));
            if upgrade {
                break;
            }
            let plain = b"HTTP/1.1 200 OK\r\nX-Backend: echo\r\nContent-Length: 5\r\n\r\nplain";
            if stream.write_all(plain).await.is_err() {
                return;
            }
        }
        let switch = b"HTTP/1.1 101 Switching Protocols\r\nConnection: Upgrade\r\nUpgrade: websocket\r\n\r\n";
        if stream.write_all(switch).await.is_err() {
            return;
        }
        if !buf.is_empty() && stream.write_all(&buf).await.is_err() {
            return;
        }
        let mut chunk = [0u8; 4096];
        while let Ok(n) = stream.read(&mut chunk).await {
            if n == 0 || stream.write_all(&chunk[..n]).await.is_err() {
                return;
            }
        }
    })
    .await
}
