//! Connection limits and the pool's queue, end to end, against real slow backends that count
//! the requests they hold at once: a limit is never exceeded, waiting requests are served in
//! arrival order, a full queue and a queue timeout answer 503 (at once, and after about the
//! timeout), a client that goes away while queued frees its place, and a slow-starting
//! backend's limit ramps with the weight `/status` reports. `/status`, the metrics and the
//! access log are compared with what the backends saw, and `capataz status` with `/status`.

mod combined;
mod h2;
mod health;
mod limits;
mod slow_start;
mod status_view;

use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde_json::Value;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::sync::Semaphore;

use crate::support::balancer::{metrics_text, start};
use crate::support::client::{exchange, Answer};
use crate::support::raw::RawBackend;
use crate::support::wait::{until_ok, wait_until};

/// How a [`SlowBackend`] lets a request go.
#[derive(Clone, Copy)]
pub(crate) enum Hold {
    /// When the test releases it ([`SlowBackend::release`]).
    Gate,
    /// After this long.
    For(Duration),
}

/// What a slow backend saw.
struct Seen {
    /// Requests it holds now.
    current: AtomicUsize,
    /// The most it ever held at once.
    max: AtomicUsize,
    /// The paths of the requests, in the order they arrived.
    arrived: Mutex<Vec<String>>,
    /// Requests it may answer (with [`Hold::Gate`]).
    gate: Semaphore,
}

impl Default for Seen {
    fn default() -> Seen {
        Seen {
            current: AtomicUsize::new(0),
            max: AtomicUsize::new(0),
            arrived: Mutex::new(Vec::new()),
            gate: Semaphore::new(0),
        }
    }
}

/// A real HTTP/1.1 backend (keep-alive, bodiless requests) that holds each request before
/// answering it with its path, and counts what it holds: the count drops before the answer
/// is written, so it is never above what capataz counts in flight.
pub(crate) struct SlowBackend {
    seen: Arc<Seen>,
    raw: RawBackend,
}

impl SlowBackend {
    pub(crate) async fn start(hold: Hold) -> SlowBackend {
        let seen = Arc::new(Seen::default());
        let shared = seen.clone();
        let raw = RawBackend::start(move |stream, _| serve(stream, shared.clone(), hold)).await;
        SlowBackend { seen, raw }
    }

    pub(crate) fn addr(&self) -> SocketAddr {
        self.raw.addr
    }

    pub(crate) fn holding(&self) -> usize {
        self.seen.current.load(Ordering::SeqCst)
    }

    fn max(&self) -> usize {
        self.seen.max.load(Ordering::SeqCst)
    }

    fn arrived(&self) -> Vec<String> {
        self.seen.arrived.lock().unwrap().clone()
    }

    /// Lets `n` held (or future) requests be answered.
    pub(crate) fn release(&self, n: usize) {
        self.seen.gate.add_permits(n);
    }
}

/// Serves one connection: each request is counted, held, uncounted, then answered.
async fn serve(mut stream: TcpStream, seen: Arc<Seen>, hold: Hold) {
    let mut buffer = Vec::new();
    loop {
        let head_end = loop {
            if let Some(at) = buffer.windows(4).position(|w| w == b"\r\n\r\n") {
                break at + 4;
            }
            let mut chunk = [0u8; 4096];
            match stream.read(&mut chunk).await {
                Ok(0) | Err(_) => return,
                Ok(n) => buffer.extend_from_slice(&chunk[..n]),
            }
        };
        let head = String::from_utf8_lossy(&buffer[..head_end]).into_owned();
        buffer.drain(..head_end);
        let path = head.split(' ').nth(1).unwrap_or("?").to_owned();
        let now = seen.current.fetch_add(1, Ordering::SeqCst) + 1;
        seen.max.fetch_max(now, Ordering::SeqCst);
        seen.arrived.lock().unwrap().push(path.clone());
        match hold {
            Hold::Gate => match seen.gate.acquire().await {
                Ok(permit) => permit.forget(),
                Err(_) => return,
            },
            Hold::For(delay) => tokio::time::sleep(delay).await,
        }
        seen.current.fetch_sub(1, Ordering::SeqCst);
        let answer = format!(
            "HTTP/1.1 200 OK\r\ncontent-length: {}\r\n\r\n{path}",
            path.len()
        );
        if stream.write_all(answer.as_bytes()).await.is_err() {
            return;
        }
    }
}

/// A config of pool `web` over `backends` (`(name, address, extra keys)`), with `pool_lines`,
/// no active checks, an admin listener, and `listener_lines` on the client listener.
pub(crate) fn config(
    backends: &[(&str, SocketAddr, &str)],
    pool_lines: &str,
    listener_lines: &str,
) -> String {
    let list: Vec<String> = backends
        .iter()
        .map(|(name, addr, extra)| format!("{{ name = \"{name}\", address = \"{addr}\"{extra} }}"))
        .collect();
    format!(
        "[admin]\naddress = \"127.0.0.1:0\"\n\n[[listeners]]\naddress = \"127.0.0.1:0\"\n\
         {listener_lines}\n\n[pools.web]\n{pool_lines}\nbackends = [{}]\n\n\
         [pools.web.active]\nkind = \"none\"\n",
        list.join(", ")
    )
}

/// Pool `web`'s part of `/status`.
async fn pool_status(admin: SocketAddr) -> Value {
    let status = capataz::ctl::request(admin, http::Method::GET, "/status", None)
        .await
        .expect("GET /status");
    status["pools"][0].clone()
}

/// Waits until `/status` says `n` requests wait in pool `web`'s queue.
async fn wait_queued(admin: SocketAddr, n: u64) -> Value {
    until_ok(
        &format!("{n} requests queued"),
        Duration::from_millis(10),
        async || {
            let pool = pool_status(admin).await;
            match pool["queue"]["length"].as_u64() {
                Some(length) if length == n => Ok(pool),
                _ => Err(format!("{:#}", pool["queue"])),
            }
        },
    )
    .await
}

/// A GET of `path` through the balancer at `addr`, on a connection of its own.
pub(crate) async fn get(addr: SocketAddr, path: &str) -> Answer {
    exchange(addr, "GET", path, "app.test", &[]).await
}

/// The value of the sample `series` (name and labels, as written) in the metrics.
fn sample(text: &str, series: &str) -> Option<f64> {
    text.lines()
        .find_map(|l| l.strip_prefix(series)?.strip_prefix(' ')?.parse().ok())
}

/// The sample `series`, which must be there.
fn metric(balancer: &capataz::server::Balancer, series: &str) -> f64 {
    let text = metrics_text(balancer);
    sample(&text, series).unwrap_or_else(|| panic!("no {series} in:\n{text}"))
}
