//! One client connection: hyper's HTTP/1 server on it, and the two timeouts that close it.
//!
//! - `idle_timeout`: no request in progress and no byte moved either way for that long.
//! - `header_read_timeout`: bytes of a request head arrived (after the previous response, or
//!   since the accept) and the head is still not complete after that long, a slow-loris client.
//!   The wait for the next request on a keep-alive connection is idle time, not header time.
//!
//! Neither costs anything per request: the socket is wrapped in [`CountingIo`], which adds to a
//! counter per read and per write, and a watcher task per connection looks at the counters a
//! few times per timeout (every quarter of the shorter one, 20 ms to 1 s). A timeout therefore
//! fires between its value and its value plus that period. hyper's own `header_read_timeout`
//! is not used: it arms a fresh boxed timer per request and also counts the keep-alive wait.
//!
//! The watcher also closes the connection's private idle backend connections (see
//! `upstream::PrivateIdle`) once they sat idle longer than their backend's `timeouts.idle`.
//!
//! Metrics cost the request path little: the counters are the bytes read and written, so the
//! watcher adds them to the listener's byte counters at each look (and the connection's end
//! adds the rest), and a request reads the clock when it starts and when its answer ends, for
//! the listener's duration histogram. The proxy counts the answer itself; a request hyper
//! refuses (a malformed or oversized head, answered 400, 414 or 431) is counted here, from the
//! error that ends the connection.
//!
//! A request counts as in progress from its head until its response body has been sent (or
//! dropped). The watcher closes a connection by raising `close` and waking the connection's
//! task: on a timeout, or on shutdown while no request is in progress, the connection is
//! dropped at once; on shutdown during a request, hyper's graceful shutdown finishes that
//! request first and then closes (the watcher drops the connection at its next look once the
//! request is done, should the client keep it open).

use std::future::{poll_fn, Future};
use std::io;
use std::net::SocketAddr;
use std::pin::{pin, Pin};
use std::sync::atomic::{AtomicU64, AtomicU8, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll, Waker};
use std::time::Duration;

use bytes::Bytes;
use hyper::body::{Body, Frame, SizeHint};
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper_util::rt::TokioIo;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::TcpStream;
use tokio::sync::{oneshot, watch};
use tokio::time::Instant;

use crate::body::RespBody;
use crate::instruments::ListenerMetrics;
use crate::proxy::{ClientInfo, Proxy};
use crate::upstream::PrivateIdle;

/// `Shared::close` values, besides 0 (keep serving).
const GRACEFUL: u8 = 1;
const ABORT: u8 = 2;

/// The timeouts and buffer limit of one client connection.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Limits {
    /// See the module documentation.
    pub(crate) idle_timeout: Duration,
    /// See the module documentation.
    pub(crate) header_read_timeout: Duration,
    /// hyper's read buffer limit (the largest request head accepted).
    pub(crate) max_buf: usize,
}

/// What the connection's task, its requests and its watcher share.
struct Shared {
    /// Bytes read: grows with every read that returned data.
    reads: AtomicU64,
    /// Bytes written: grows with every write that took data.
    writes: AtomicU64,
    /// `reads` and `writes` as last added to the listener's byte counters.
    counted: (AtomicU64, AtomicU64),
    /// The listener's metrics, as the connection was accepted.
    listener: Arc<ListenerMetrics>,
    /// Requests in progress (head received, response body not yet sent).
    active: AtomicUsize,
    /// Requests done.
    served: AtomicU64,
    /// `reads` when the last request was served (0 before the first): more reads than this and
    /// no request active means a request head is arriving.
    reads_at_rest: AtomicU64,
    /// Set by the watcher: 0, `GRACEFUL` or `ABORT`.
    close: AtomicU8,
    /// The connection task's waker, registered on its first poll.
    waker: Mutex<Option<Waker>>,
}

impl Shared {
    fn new(listener: Arc<ListenerMetrics>) -> Shared {
        Shared {
            reads: AtomicU64::new(0),
            writes: AtomicU64::new(0),
            counted: (AtomicU64::new(0), AtomicU64::new(0)),
            listener,
            active: AtomicUsize::new(0),
            served: AtomicU64::new(0),
            reads_at_rest: AtomicU64::new(0),
            close: AtomicU8::new(0),
            waker: Mutex::new(None),
        }
    }

    /// Adds the bytes moved since the last call to the listener's counters. Safe to call from
    /// the watcher and the connection's end at once: each byte is added once (`fetch_max`
    /// hands every caller a disjoint stretch).
    fn count_bytes(&self) {
        let delta = |total: &AtomicU64, counted: &AtomicU64| {
            let now = total.load(Ordering::Relaxed);
            now.saturating_sub(counted.fetch_max(now, Ordering::Relaxed))
        };
        let received = delta(&self.reads, &self.counted.0);
        let sent = delta(&self.writes, &self.counted.1);
        self.listener.add_bytes(received, sent);
    }

    fn close(&self, how: u8) {
        self.close.fetch_max(how, Ordering::Release);
        let waker = self.waker.lock().unwrap_or_else(|e| e.into_inner()).clone();
        if let Some(waker) = waker {
            waker.wake();
        }
    }
}

/// Serves one client connection until it closes, a timeout closes it, or shutdown drains it.
/// `proxy` gives the routes in force, read per request so a reload applies to the next request.
pub(crate) async fn serve(
    stream: TcpStream,
    peer: SocketAddr,
    limits: Limits,
    proxy: impl Fn() -> Arc<Proxy> + Send + Sync + 'static,
    shutdown: watch::Receiver<bool>,
) {
    // Counted open until this function returns.
    let open = proxy().metrics().connection();
    let proxy = Arc::new(proxy);
    let shared = Arc::new(Shared::new(open.listener().clone()));
    let client = Arc::new(ClientInfo::new(peer));
    let (done, watcher_done) = oneshot::channel::<()>();
    tokio::spawn(watch_connection(
        shared.clone(),
        client.private.clone(),
        limits,
        shutdown,
        watcher_done,
    ));

    let service_shared = shared.clone();
    let service_proxy = proxy.clone();
    let service = service_fn(move |req| {
        let proxy = service_proxy();
        let client = client.clone();
        let mut request = InProgress::new(service_shared.clone());
        async move {
            let response = proxy.handle(req, client).await;
            request.answered = true;
            response.map(|response| {
                response.map(|body| Tracked {
                    body,
                    _request: request,
                })
            })
        }
    });
    let io = TokioIo::new(CountingIo {
        inner: stream,
        shared: shared.clone(),
    });
    let mut builder = http1::Builder::new();
    // - half_close: a client's FIN after its request ends the request, not the connection, as
    //   with HAProxy (`option abortonclose` is off by default). It also spares a read per
    //   request: without it hyper reads ahead while the request is in flight, to see a FIN,
    //   and that read finds its buffer still shared with the request's headers and allocates
    //   a new 8 KB one every time.
    // - writev(false): each write is one `send`, not a `writev`, whose iovec import and VFS
    //   layers cost the kernel more than copying a head and a small body into one buffer.
    //   See BENCHMARKS.md.
    builder
        .max_buf_size(limits.max_buf)
        .keep_alive(true)
        .half_close(true)
        .writev(false);
    let mut conn = pin!(builder.serve_connection(io, service).with_upgrades());
    let mut registered = false;
    let mut closing = false;
    poll_fn(|cx| {
        if !registered {
            // A spawned task's waker never changes, so one registration is enough.
            *shared.waker.lock().unwrap_or_else(|e| e.into_inner()) = Some(cx.waker().clone());
            registered = true;
        }
        match shared.close.load(Ordering::Acquire) {
            ABORT => return Poll::Ready(()),
            GRACEFUL if !closing => {
                closing = true;
                conn.as_mut().graceful_shutdown();
            }
            _ => {}
        }
        conn.as_mut().poll(cx).map(|ended| {
            if let Err(error) = ended {
                if refused_by_hyper(&error) {
                    proxy().count_refused();
                }
            }
        })
    })
    .await;
    drop(done);
    shared.count_bytes();
    drop(open);
}

/// Whether hyper ended the connection on a request head it could not take, after answering
/// it itself (400 for a malformed head, 431 or 414 for one over the size limit; an HTTP/2
/// preface gets no answer). Any error type: a connection served by another builder reports
/// hyper's error boxed.
fn refused_by_hyper(error: &(dyn std::error::Error + 'static)) -> bool {
    error.downcast_ref::<hyper::Error>().is_some_and(|error| {
        error.is_parse() && !error.is_parse_status() && !error.is_parse_version_h2()
    })
}

/// One request in progress on the connection, until dropped with its response body.
struct InProgress {
    shared: Arc<Shared>,
    started: std::time::Instant,
    /// Whether the proxy produced an answer (a request whose client went away first is not
    /// timed).
    answered: bool,
}

impl InProgress {
    fn new(shared: Arc<Shared>) -> InProgress {
        shared.active.fetch_add(1, Ordering::Relaxed);
        InProgress {
            shared,
            started: std::time::Instant::now(),
            answered: false,
        }
    }
}

impl Drop for InProgress {
    fn drop(&mut self) {
        let shared = &self.shared;
        if self.answered {
            shared.listener.request_took(self.started.elapsed());
        }
        shared
            .reads_at_rest
            .store(shared.reads.load(Ordering::Relaxed), Ordering::Relaxed);
        shared.served.fetch_add(1, Ordering::Relaxed);
        shared.active.fetch_sub(1, Ordering::Relaxed);
    }
}

/// A response body that keeps its request in progress until hyper is done with it.
struct Tracked {
    body: RespBody,
    _request: InProgress,
}

impl Body for Tracked {
    type Data = Bytes;
    type Error = std::io::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, std::io::Error>>> {
        Pin::new(&mut self.get_mut().body).poll_frame(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.body.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.body.size_hint()
    }
}

/// Watches one connection's counters for its timeouts, and the balancer's shutdown, and reaps
/// the idle backend connections private to it.
async fn watch_connection(
    shared: Arc<Shared>,
    private: Arc<PrivateIdle>,
    limits: Limits,
    mut shutdown: watch::Receiver<bool>,
    mut done: oneshot::Receiver<()>,
) {
    let period = (limits.idle_timeout.min(limits.header_read_timeout) / 4)
        .clamp(Duration::from_millis(20), Duration::from_secs(1));
    let mut quiet_since = Instant::now();
    let mut head_since: Option<Instant> = None;
    let mut seen = (0, 0, 0);
    let mut tick = tokio::time::interval(period);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut draining = *shutdown.borrow();
    loop {
        if draining {
            // Shutdown: finish a request in progress, drop the connection at rest.
            let at_rest = shared.active.load(Ordering::Relaxed) == 0;
            shared.close(if at_rest { ABORT } else { GRACEFUL });
            if at_rest {
                return;
            }
        }
        tokio::select! {
            _ = &mut done => return,
            changed = shutdown.changed(), if !draining => {
                draining = changed.is_err() || *shutdown.borrow();
            }
            now = tick.tick() => {
                if !draining
                    && timed_out(&shared, limits, now, &mut seen, &mut quiet_since, &mut head_since)
                {
                    shared.close(ABORT);
                    return;
                }
                shared.count_bytes();
                private.reap();
            }
        }
    }
}

/// One look at the counters: whether a timeout has run out by `now`.
fn timed_out(
    shared: &Shared,
    limits: Limits,
    now: Instant,
    seen: &mut (u64, u64, u64),
    quiet_since: &mut Instant,
    head_since: &mut Option<Instant>,
) -> bool {
    let reads = shared.reads.load(Ordering::Relaxed);
    let counters = (
        reads,
        shared.writes.load(Ordering::Relaxed),
        shared.served.load(Ordering::Relaxed),
    );
    let wrote = counters.1 != seen.1;
    let moved = counters != *seen;
    *seen = counters;
    if shared.active.load(Ordering::Relaxed) > 0 {
        *quiet_since = now;
        *head_since = None;
        return false;
    }
    if reads > shared.reads_at_rest.load(Ordering::Relaxed) {
        // A head is arriving. (A write means a response is still going out, pipelined
        // requests queued behind it; the head's time starts after.)
        if wrote {
            *head_since = None;
        }
        let since = *head_since.get_or_insert(now);
        return now.saturating_duration_since(since) >= limits.header_read_timeout;
    }
    *head_since = None;
    if moved {
        *quiet_since = now;
    }
    now.saturating_duration_since(*quiet_since) >= limits.idle_timeout
}

/// The client socket, counting the bytes read and written.
struct CountingIo {
    inner: TcpStream,
    shared: Arc<Shared>,
}

impl AsyncRead for CountingIo {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        let before = buf.filled().len();
        let polled = Pin::new(&mut this.inner).poll_read(cx, buf);
        let read = buf.filled().len().saturating_sub(before);
        if read > 0 {
            this.shared.reads.fetch_add(read as u64, Ordering::Relaxed);
        }
        polled
    }
}

impl CountingIo {
    fn count_write(&self, polled: &Poll<io::Result<usize>>) {
        if let Poll::Ready(Ok(n)) = polled {
            if *n > 0 {
                self.shared.writes.fetch_add(*n as u64, Ordering::Relaxed);
            }
        }
    }
}

impl AsyncWrite for CountingIo {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        let polled = Pin::new(&mut this.inner).poll_write(cx, buf);
        this.count_write(&polled);
        polled
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        let polled = Pin::new(&mut this.inner).poll_write_vectored(cx, bufs);
        this.count_write(&polled);
        polled
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().inner).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().inner).poll_shutdown(cx)
    }
}
