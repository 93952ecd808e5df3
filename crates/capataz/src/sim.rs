//! Scriptable in-process HTTP/1.1 backends, for `capataz demo` and the integration tests.
//!
//! A health checker is only as good as the failures it has been shown, and real servers are bad
//! at failing on cue. A [`SimBackend`] is a tiny HTTP/1.1 server on loopback whose behaviour can
//! be switched at any moment, without a restart: answer with a status, hang, close, reset, send
//! garbage, answer late, follow a pattern on its health route, crash, and come back on the same
//! port.
//!
//! The server is hand-written rather than built on hyper because several of the behaviours are
//! deliberately not HTTP (hanging after a request, a TCP reset, garbage bytes) and need the raw
//! socket. It still speaks enough HTTP/1.1 for a real client: keep-alive, `Content-Length`
//! bodies on responses, and request bodies (sized or chunked) read and discarded.
//!
//! Invariants:
//! - A request counts as a hit once its head and body have been read, before its behaviour runs,
//!   so a hanging or resetting request is still counted.
//! - The health route is the request path `/healthz` exactly (a query string is ignored); every
//!   other request is traffic.
//! - [`SimBackend::crash`] closes the listener before it returns, so a connection attempted after
//!   it is refused, and resets every open connection as soon as the runtime runs their tasks.
//! - Dropping a [`SimBackend`] crashes it: nothing it started outlives it.

use std::io;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::task::Poll;
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpSocket, TcpStream};
use tokio::sync::{watch, Notify};
use tokio::task::JoinHandle;

/// The request path that selects the health behaviour.
pub const HEALTH_PATH: &str = "/healthz";

/// The largest request head accepted; a larger one is answered 431 and the connection closed.
const MAX_HEAD_BYTES: usize = 64 * 1024;

/// What a backend does with one request.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mode {
    /// Answer with this status. Codes are written verbatim, so a code outside 100-599 makes a
    /// malformed status line on purpose; 1xx, 204 and 304 answers carry no body.
    Status(u16),
    /// Read the request and never answer; the connection stays open until the client closes it.
    Hang,
    /// Close the connection (FIN) without answering.
    Close,
    /// Reset the connection (RST, through `SO_LINGER` 0) without answering.
    Reset,
    /// Answer `garbage\r\n\r\n` and close.
    Garbage,
    /// Answer with this status after this delay.
    Delay(Duration, u16),
}

/// An in-process HTTP/1.1 backend on loopback whose behaviour can be changed while it runs.
///
/// Traffic answers carry the body `<name>\n`, the header `X-Backend: <name>`, and echo the
/// request's `Host`, `X-Forwarded-For` and `X-Forwarded-Proto` as `X-Seen-Host`, `X-Seen-Xff`
/// and `X-Seen-Proto`. Health answers look the same.
pub struct SimBackend {
    shared: Arc<Shared>,
    addr: SocketAddr,
    run: Mutex<Run>,
}

/// What the connection tasks share with the handle: behaviour and counters.
struct Shared {
    name: String,
    behaviour: Mutex<Behaviour>,
    traffic_hits: AtomicU64,
    health_hits: AtomicU64,
    hit: Notify,
}

struct Behaviour {
    traffic: Mode,
    /// Never empty; one entry is used per health request, cycling.
    health: Vec<Mode>,
    next_health: usize,
}

/// The state of the current incarnation of the server.
#[derive(Default)]
struct Run {
    /// The listener, shared with the accept task; `None` once crashed, so closing is synchronous.
    listener: Option<Arc<Mutex<Option<TcpListener>>>>,
    accept: Option<JoinHandle<()>>,
    /// Sends `true` on a crash; every connection task of this incarnation watches it.
    crash: Option<watch::Sender<bool>>,
}

/// How a served connection ends.
enum End {
    /// Drop the socket normally (FIN).
    Close,
    /// Reset it (RST).
    Reset,
}

impl SimBackend {
    /// Binds `addr` (`127.0.0.1:0` for any free port) with `SO_REUSEADDR` and starts serving.
    ///
    /// A new backend answers every request with 200.
    pub async fn start(name: &str, addr: SocketAddr) -> io::Result<SimBackend> {
        let listener = bind(addr)?;
        let addr = listener.local_addr()?;
        let backend = SimBackend {
            shared: Arc::new(Shared {
                name: name.to_owned(),
                behaviour: Mutex::new(Behaviour {
                    traffic: Mode::Status(200),
                    health: vec![Mode::Status(200)],
                    next_health: 0,
                }),
                traffic_hits: AtomicU64::new(0),
                health_hits: AtomicU64::new(0),
                hit: Notify::new(),
            }),
            addr,
            run: Mutex::new(Run::default()),
        };
        backend.serve(listener);
        Ok(backend)
    }

    /// The address it listens on; it stays the same across [`SimBackend::restart`].
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// Its name, as sent in `X-Backend` and the body.
    pub fn name(&self) -> &str {
        &self.shared.name
    }

    /// Sets what every health request gets from now on (clears any pattern).
    pub fn set_health(&self, mode: Mode) {
        self.set_health_pattern(vec![mode]);
    }

    /// Makes health requests cycle through `pattern`, one entry per request, starting with its
    /// first entry. For example `[200, 200, 503]` fails every third probe. An empty pattern means
    /// `[Status(200)]`.
    pub fn set_health_pattern(&self, pattern: Vec<Mode>) {
        let mut behaviour = lock(&self.shared.behaviour);
        behaviour.health = if pattern.is_empty() {
            vec![Mode::Status(200)]
        } else {
            pattern
        };
        behaviour.next_health = 0;
    }

    /// Sets what every traffic (non-health) request gets from now on.
    pub fn set_traffic(&self, mode: Mode) {
        lock(&self.shared.behaviour).traffic = mode;
    }

    /// Traffic requests received so far, across restarts.
    pub fn traffic_hits(&self) -> u64 {
        self.shared.traffic_hits.load(Ordering::SeqCst)
    }

    /// Health requests received so far, across restarts.
    pub fn health_hits(&self) -> u64 {
        self.shared.health_hits.load(Ordering::SeqCst)
    }

    /// Waits until at least `n` traffic requests have been received; false if `deadline` passed
    /// first.
    pub async fn wait_traffic_hits(&self, n: u64, deadline: Duration) -> bool {
        self.wait_hits(deadline, || self.traffic_hits() >= n).await
    }

    /// Waits until at least `n` health requests have been received; false if `deadline` passed
    /// first.
    pub async fn wait_health_hits(&self, n: u64, deadline: Duration) -> bool {
        self.wait_hits(deadline, || self.health_hits() >= n).await
    }

    /// Whether it is serving (started or restarted, and not crashed since).
    pub fn is_running(&self) -> bool {
        lock(&self.run).listener.is_some()
    }

    /// Crashes the backend: the listener is closed before this returns, and every open
    /// connection is reset. Counters and behaviour are kept for [`SimBackend::restart`].
    /// Crashing a crashed backend does nothing.
    pub fn crash(&self) {
        let mut run = lock(&self.run);
        if let Some(slot) = run.listener.take() {
            // Dropping the listener here, not in the accept task, closes it synchronously.
            drop(lock(&slot).take());
        }
        if let Some(accept) = &run.accept {
            accept.abort();
        }
        if let Some(crash) = run.crash.take() {
            crash.send_replace(true);
        }
    }

    /// Binds the same address again and serves with the current behaviour. Restarting a running
    /// backend does nothing.
    pub async fn restart(&self) -> io::Result<()> {
        let previous = {
            let mut run = lock(&self.run);
            if run.listener.is_some() {
                return Ok(());
            }
            run.accept.take()
        };
        if let Some(previous) = previous {
            // The task was aborted by `crash`; it holds nothing that matters, but wait for it so
            // that two incarnations never overlap.
            let _ = previous.await;
        }
        let listener = bind(self.addr)?;
        self.serve(listener);
        Ok(())
    }

    fn serve(&self, listener: TcpListener) {
        let slot = Arc::new(Mutex::new(Some(listener)));
        let (crash, crashed) = watch::channel(false);
        let accept = tokio::spawn(accept_loop(
            Arc::clone(&slot),
            Arc::clone(&self.shared),
            crashed,
        ));
        let mut run = lock(&self.run);
        *run = Run {
            listener: Some(slot),
            accept: Some(accept),
            crash: Some(crash),
        };
    }

    async fn wait_hits(&self, deadline: Duration, reached: impl Fn() -> bool) -> bool {
        let wait = async {
            loop {
                let notified = self.shared.hit.notified();
                tokio::pin!(notified);
                // Registered before the check, so a hit between the check and the await is seen.
                notified.as_mut().enable();
                if reached() {
                    return;
                }
                notified.await;
            }
        };
        tokio::time::timeout(deadline, wait).await.is_ok()
    }
}

impl Drop for SimBackend {
    fn drop(&mut self) {
        self.crash();
    }
}

impl std::fmt::Debug for SimBackend {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SimBackend")
            .field("name", &self.shared.name)
            .field("addr", &self.addr)
            .field("running", &self.is_running())
            .finish()
    }
}

impl Shared {
    /// Counts one request and picks its behaviour.
    fn handle_request(&self, health: bool) -> Mode {
        let mode = {
            let mut behaviour = lock(&self.behaviour);
            if health {
                let index = behaviour.next_health % behaviour.health.len();
                behaviour.next_health = index + 1;
                behaviour.health[index]
            } else {
                behaviour.traffic
            }
        };
        let counter = if health {
            &self.health_hits
        } else {
            &self.traffic_hits
        };
        counter.fetch_add(1, Ordering::SeqCst);
        self.hit.notify_waiters();
        mode
    }
}

/// Locks a mutex, ignoring poisoning: every critical section here leaves its data consistent.
fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(PoisonError::into_inner)
}

fn bind(addr: SocketAddr) -> io::Result<TcpListener> {
    let socket = if addr.is_ipv4() {
        TcpSocket::new_v4()?
    } else {
        TcpSocket::new_v6()?
    };
    socket.set_reuseaddr(true)?;
    socket.bind(addr)?;
    socket.listen(1024)
}

async fn accept_loop(
    slot: Arc<Mutex<Option<TcpListener>>>,
    shared: Arc<Shared>,
    crashed: watch::Receiver<bool>,
) {
    loop {
        // The lock is held only while polling, never across an await, so `crash` can take the
        // listener out at any moment.
        let accepted = std::future::poll_fn(|cx| match lock(&slot).as_ref() {
            Some(listener) => listener.poll_accept(cx),
            None => Poll::Ready(Err(io::ErrorKind::NotConnected.into())),
        })
        .await;
        match accepted {
            Ok((stream, _peer)) => {
                tokio::spawn(connection(stream, Arc::clone(&shared), crashed.clone()));
            }
            Err(error) if error.kind() == io::ErrorKind::NotConnected => return,
            Err(error) => {
                // Typically out of file descriptors: back off instead of spinning.
                tracing::debug!(backend = %shared.name, %error, "sim accept failed");
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
        }
    }
}

async fn connection(
    mut stream: TcpStream,
    shared: Arc<Shared>,
    mut crashed: watch::Receiver<bool>,
) {
    let _ = stream.set_nodelay(true);
    let end = tokio::select! {
        end = serve_connection(&mut stream, &shared) => end,
        // A dropped sender (the backend was dropped) counts as a crash too.
        _ = crashed.wait_for(|crashed| *crashed) => End::Reset,
    };
    if let End::Reset = end {
        let _ = stream.set_zero_linger();
    }
    drop(stream);
}

/// Serves requests on one connection until it should end, and says how.
async fn serve_connection(stream: &mut TcpStream, shared: &Shared) -> End {
    let mut buf = Vec::with_capacity(4096);
    loop {
        let head = match read_head(stream, &mut buf).await {
            Ok(Some(head)) => head,
            Ok(None) => return End::Close,
            Err(HeadError::Io) => return End::Close,
            Err(HeadError::TooLarge) => {
                let _ = stream.write_all(&plain_error(431)).await;
                return End::Close;
            }
        };
        let Some(request) = Request::parse(&head) else {
            let _ = stream.write_all(&plain_error(400)).await;
            return End::Close;
        };
        let discarded = match request.body {
            Body::None => Ok(()),
            Body::Length(length) => discard_exact(stream, &mut buf, length).await,
            Body::Chunked => discard_chunked(stream, &mut buf).await,
        };
        if discarded.is_err() {
            return End::Close;
        }
        let mode = shared.handle_request(request.path() == HEALTH_PATH);
        let code = match mode {
            Mode::Status(code) => code,
            Mode::Delay(delay, code) => {
                tokio::time::sleep(delay).await;
                code
            }
            Mode::Hang => {
                drain_until_closed(stream).await;
                return End::Close;
            }
            Mode::Close => return End::Close,
            Mode::Reset => return End::Reset,
            Mode::Garbage => {
                let _ = stream.write_all(b"garbage\r\n\r\n").await;
                return End::Close;
            }
        };
        let response = request.response(code, &shared.name);
        if stream.write_all(&response).await.is_err() || !request.keep_alive {
            return End::Close;
        }
    }
}

enum HeadError {
    Io,
    TooLarge,
}

/// Reads one request head (through its empty line) out of `buf` and the stream; `None` on a
/// clean end of stream between requests.
async fn read_head(
    stream: &mut TcpStream,
    buf: &mut Vec<u8>,
) -> Result<Option<Vec<u8>>, HeadError> {
    loop {
        // Empty lines before a request line are tolerated (RFC 9112 section 2.2).
        let skip = buf
            .iter()
            .take_while(|&&b| b == b'\r' || b == b'\n')
            .count();
        buf.drain(..skip);
        if let Some(end) = head_end(buf) {
            let head = buf.drain(..end).collect();
            return Ok(Some(head));
        }
        if buf.len() > MAX_HEAD_BYTES {
            return Err(HeadError::TooLarge);
        }
        match fill(stream, buf).await {
            Ok(0) if buf.is_empty() => return Ok(None),
            Ok(0) | Err(_) => return Err(HeadError::Io),
            Ok(_) => {}
        }
    }
}

/// The length of the head at the start of `buf`, including the empty line that ends it.
fn head_end(buf: &[u8]) -> Option<usize> {
    let mut line_start = 0;
    for (i, &b) in buf.iter().enumerate() {
        if b == b'\n' {
            let line = &buf[line_start..i];
            if line.is_empty() || line == b"\r" {
                return Some(i + 1);
            }
            line_start = i + 1;
        }
    }
    None
}

/// Appends what the stream has to `buf`; 0 at the end of the stream.
async fn fill(stream: &mut TcpStream, buf: &mut Vec<u8>) -> io::Result<usize> {
    let mut chunk = [0u8; 8192];
    let n = stream.read(&mut chunk).await?;
    buf.extend_from_slice(&chunk[..n]);
    Ok(n)
}

async fn discard_exact(
    stream: &mut TcpStream,
    buf: &mut Vec<u8>,
    mut length: u64,
) -> io::Result<()> {
    loop {
        let take = usize::try_from(length).unwrap_or(usize::MAX).min(buf.len());
        buf.drain(..take);
        // `take` fits in u64: it is at most `length`.
        length -= take as u64;
        if length == 0 {
            return Ok(());
        }
        if fill(stream, buf).await? == 0 {
            return Err(io::ErrorKind::UnexpectedEof.into());
        }
    }
}

async fn discard_chunked(stream: &mut TcpStream, buf: &mut Vec<u8>) -> io::Result<()> {
    loop {
        let line = read_line(stream, buf).await?;
        let size = chunk_size(&line).ok_or(io::ErrorKind::InvalidData)?;
        if size == 0 {
            // Trailer fields, up to and including the empty line.
            loop {
                if read_line(stream, buf).await?.is_empty() {
                    return Ok(());
                }
            }
        }
        discard_exact(stream, buf, size).await?;
        if !read_line(stream, buf).await?.is_empty() {
            return Err(io::ErrorKind::InvalidData.into());
        }
    }
}

/// Reads one line, without its ending, out of `buf` and the stream.
async fn read_line(stream: &mut TcpStream, buf: &mut Vec<u8>) -> io::Result<Vec<u8>> {
    loop {
        if let Some(newline) = buf.iter().position(|&b| b == b'\n') {
            let mut line: Vec<u8> = buf.drain(..=newline).collect();
            line.pop();
            if line.last() == Some(&b'\r') {
                line.pop();
            }
            return Ok(line);
        }
        if buf.len() > MAX_HEAD_BYTES {
            return Err(io::ErrorKind::InvalidData.into());
        }
        if fill(stream, buf).await? == 0 {
            return Err(io::ErrorKind::UnexpectedEof.into());
        }
    }
}

/// The size in a chunk-size line (hex digits, then optional extensions).
fn chunk_size(line: &[u8]) -> Option<u64> {
    let digits = line.iter().take_while(|b| b.is_ascii_hexdigit()).count();
    if digits == 0 || digits > 15 {
        return None;
    }
    let text = std::str::from_utf8(&line[..digits]).ok()?;
    u64::from_str_radix(text, 16).ok()
}

/// Reads and discards until the peer closes or the connection fails.
async fn drain_until_closed(stream: &mut TcpStream) {
    let mut chunk = [0u8; 8192];
    while let Ok(n) = stream.read(&mut chunk).await {
        if n == 0 {
            return;
        }
    }
}

/// The parts of a request the backend cares about.
struct Request {
    method: String,
    target: String,
    body: Body,
    keep_alive: bool,
    host: Option<String>,
    forwarded_for: Option<String>,
    forwarded_proto: Option<String>,
}

enum Body {
    None,
    Length(u64),
    Chunked,
}

impl Request {
    /// Parses a request head; `None` if it is not one.
    fn parse(head: &[u8]) -> Option<Request> {
        let text = std::str::from_utf8(head).ok()?;
        let mut lines = text
            .split('\n')
            .map(|line| line.strip_suffix('\r').unwrap_or(line));
        let mut request_line = lines.next()?.split(' ');
        let (method, target, version) = (
            request_line.next()?,
            request_line.next()?,
            request_line.next()?,
        );
        if request_line.next().is_some() || method.is_empty() || target.is_empty() {
            return None;
        }
        let http11 = match version {
            "HTTP/1.1" => true,
            "HTTP/1.0" => false,
            _ => return None,
        };
        let mut request = Request {
            method: method.to_owned(),
            target: target.to_owned(),
            body: Body::None,
            keep_alive: http11,
            host: None,
            forwarded_for: None,
            forwarded_proto: None,
        };
        let mut chunked = false;
        let mut length = None;
        for line in lines.filter(|line| !line.is_empty()) {
            let (name, value) = line.split_once(':')?;
            let value = value.trim_matches([' ', '\t']);
            if value.bytes().any(|b| b.is_ascii_control() && b != b'\t') {
                return None;
            }
            match name.to_ascii_lowercase().as_str() {
                "host" => request.host = Some(value.to_owned()),
                "x-forwarded-for" => append(&mut request.forwarded_for, value),
                "x-forwarded-proto" => append(&mut request.forwarded_proto, value),
                "content-length" => length = Some(value.parse::<u64>().ok()?),
                "transfer-encoding" => {
                    chunked = value
                        .rsplit(',')
                        .next()
                        .is_some_and(|last| last.trim().eq_ignore_ascii_case("chunked"));
                    if !chunked {
                        return None;
                    }
                }
                "connection" => {
                    for token in value.split(',').map(str::trim) {
                        if token.eq_ignore_ascii_case("close") {
                            request.keep_alive = false;
                        } else if token.eq_ignore_ascii_case("keep-alive") && !http11 {
                            request.keep_alive = true;
                        }
                    }
                }
                _ => {}
            }
        }
        request.body = match (chunked, length) {
            (true, Some(_)) => {
                // Both framings: chunked wins, and the connection must not be reused.
                request.keep_alive = false;
                Body::Chunked
            }
            (true, None) => Body::Chunked,
            (false, Some(length)) if length > 0 => Body::Length(length),
            (false, _) => Body::None,
        };
        Some(request)
    }

    /// The request path, without any query.
    fn path(&self) -> &str {
        self.target.split('?').next().unwrap_or_default()
    }

    /// The bytes of the answer to this request.
    fn response(&self, code: u16, name: &str) -> Vec<u8> {
        let reason = http::StatusCode::from_u16(code)
            .ok()
            .and_then(|status| status.canonical_reason())
            .unwrap_or("Status");
        let body = format!("{name}\n");
        let mut out = format!("HTTP/1.1 {code:03} {reason}\r\nX-Backend: {name}\r\n");
        if let Some(host) = &self.host {
            out.push_str(&format!("X-Seen-Host: {host}\r\n"));
        }
        if let Some(xff) = &self.forwarded_for {
            out.push_str(&format!("X-Seen-Xff: {xff}\r\n"));
        }
        if let Some(proto) = &self.forwarded_proto {
            out.push_str(&format!("X-Seen-Proto: {proto}\r\n"));
        }
        let bodyless = (100..200).contains(&code) || code == 204 || code == 304;
        if !bodyless {
            out.push_str("Content-Type: text/plain\r\n");
            out.push_str(&format!("Content-Length: {}\r\n", body.len()));
        }
        if !self.keep_alive {
            out.push_str("Connection: close\r\n");
        }
        out.push_str("\r\n");
        if !bodyless && self.method != "HEAD" {
            out.push_str(&body);
        }
        out.into_bytes()
    }
}

fn append(field: &mut Option<String>, value: &str) {
    match field {
        Some(existing) => {
            existing.push_str(", ");
            existing.push_str(value);
        }
        None => *field = Some(value.to_owned()),
    }
}

/// A closing error answer for a request that could not be read.
fn plain_error(code: u16) -> Vec<u8> {
    let reason = http::StatusCode::from_u16(code)
        .ok()
        .and_then(|status| status.canonical_reason())
        .unwrap_or("Error");
    format!("HTTP/1.1 {code} {reason}\r\nContent-Length: 0\r\nConnection: close\r\n\r\n")
        .into_bytes()
}

#[cfg(test)]
mod tests {
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
}
