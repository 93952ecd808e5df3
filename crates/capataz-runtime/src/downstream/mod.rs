//! One client connection: hyper's HTTP/1 or HTTP/2 server on it, and the two timeouts that
//! close it.
//!
//! The protocol is given ([`Protocol::Http1`], [`Protocol::Http2`], say by TLS's ALPN) or
//! detected ([`Protocol::Auto`], a listener with `h2c`): the connection is HTTP/2 if its first
//! bytes are HTTP/2's connection preface, HTTP/1.1 otherwise. Detection reads up to the 24
//! bytes of the preface (it stops at the first byte that differs) and hands them to hyper
//! before the socket's: one check per read, no layer per request. HTTP/1.1 is served by the
//! same `http1::Builder` with or without detection.
//!
//! Memory of an idle connection: hyper's connection (its state and its read and write buffers,
//! 1 KB each at first: vendor/hyper's patch 0003) is only built, boxed, once the client's
//! first bytes are there (read here, up to 4 KB, on the stack of one poll, and handed to hyper
//! first), so a connection that has sent nothing yet costs its socket, this future and a line
//! in its watcher; the listener boxes its other stages (TLS handshake, PROXY header) for the
//! same reason: a task is as big as its biggest stage for its whole life. An HTTP/1
//! connection quiet for a watcher period after a request gives hyper's connection back the
//! same way (parked, see [`park`]) until its next bytes. See BENCHMARKS.md ("Memory per idle
//! client connection").
//!
//! - `idle_timeout`: no request in progress and no byte moved either way for that long.
//! - `header_read_timeout`: bytes of a request head arrived (after the previous response, or
//!   since the accept) and the head is still not complete after that long, a slow-loris client.
//!   The wait for the next request on a keep-alive connection is idle time, not header time.
//!
//! Neither costs anything per request: the socket is wrapped in [`CountingIo`], which adds to a
//! counter per read and per write, and a watcher ([`Watch`], one task per listener for all its
//! connections) looks at the counters a few times per timeout (every quarter of the shorter
//! one, 20 ms to 1 s). A timeout therefore fires between its value and its value plus that
//! period. hyper's own `header_read_timeout`
//! is not used: it arms a fresh boxed timer per request and also counts the keep-alive wait.
//!
//! The watcher also closes the connection's private idle backend connections (see
//! `upstream::PrivateIdle`) once they sat idle longer than their backend's `timeouts.idle`.
//!
//! For HTTP/2 the same counters give: `idle_timeout`, no stream in progress and none started
//! for that long, whatever other frames come and go (PINGs, capataz's keep-alive PINGs
//! included, keep no connection open, as with Envoy's `idle_timeout`); the connection is then
//! closed with a GOAWAY (and dropped if it is still open a second later, once the streams
//! its client opened before it saw the GOAWAY, which are served, are done).
//! `header_read_timeout` applies only until the protocol is known (a client that sends part of
//! a preface or of a request line and stalls); a stream's headers are bounded by the
//! listener's `max_header_bytes` and h2's CONTINUATION limit, and the wait for them by
//! `idle_timeout`.
//!
//! An HTTP/1 client that resets its connection while its request waits for an answer is seen
//! gone at once, not when the answer is written ([`gone`]): the connection ends, which drops
//! the request as an HTTP/2 stream reset does. A half-close (FIN) is not an abort.
//!
//! A client that cancels its HTTP/2 requests before their answers (RST_STREAM, the "rapid
//! reset" attack, CVE-2023-44487) has its connection dropped once it has cancelled more than
//! `max_concurrent_streams` requests beyond those it let finish: each cancelled request may
//! have reached a backend, and the stream limit alone does not bound them, since a reset stream
//! frees its slot at once.
//!
//! An HTTP/2 stream whose client takes nothing of its answer for the pool's `body_idle` (a
//! window it keeps shut) is ended, letting go of its backend connection (`stall.rs`), and one
//! connection's streams hold at most `max_backend_connections` backend connections at once
//! (`ClientInfo::backend_slots`).
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
//! task: on a timeout the connection is dropped at once. On shutdown (a stop, or the drain of
//! an upgrade) an HTTP/1 connection answers every request from then on with `Connection:
//! close`, so its client opens the next connection elsewhere instead of sending its next
//! request on a connection about to close; with no request in progress and no byte moved for
//! `DRAIN_IDLE_GRACE`, it is dropped (its timeouts apply as ever). An HTTP/2 connection gets
//! a GOAWAY, and is dropped once its streams are done and `GOAWAY_GRACE` has passed.

use std::future::{poll_fn, Future};
use std::io;
use std::mem::MaybeUninit;
use std::pin::{pin, Pin};
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll, Waker};
use std::time::Duration;

use bytes::Bytes;
use hyper::body::{Body, Frame, SizeHint};
use hyper::server::conn::{http1, http2};
use hyper::service::service_fn;
use hyper_util::rt::{TokioIo, TokioTimer};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

use crate::body::{BodyRead, RespBody};
use crate::config::Http2Config;
use crate::instruments::ListenerMetrics;
use crate::outbox::{Held, Outbox};
use crate::proxy::{BodyReadHook, ClientInfo, Proxy, TunnelHold};
use crate::turn;

mod gone;
mod park;
mod stall;
mod watch;
use crate::atomic_enum::atomic_enum;
use crate::lockstat::{self, Site};
pub(crate) use gone::PeekPeer;
use gone::PeerWatch;
pub(crate) use stall::boxed_in_place;
use stall::{BoxedCalls, Stall, StreamExec};
pub(crate) use watch::Watch;

atomic_enum! {
    /// What the watcher asks of a connection (`ConnState::close`), only ever raised: keep serving,
    /// close gracefully, or close at once.
    enum Close in CloseCell {
        /// Keep serving.
        Open,
        /// Finish what is in progress, then close (an HTTP/2 GOAWAY).
        Graceful,
        /// Close now.
        Abort,
    }
}

atomic_enum! {
    /// Where an HTTP/1 connection is in parking (`ConnState::park`; see [`park`]).
    enum Park in ParkCell {
        /// Serving: hyper's connection built.
        Serving,
        /// Asked by the watcher to park.
        Asked,
        /// Taking hyper's connection apart.
        Parking,
        /// Parked: only the socket kept.
        Parked,
    }
}

/// The timeouts and buffer limit of one client connection.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Limits {
    /// See the module documentation.
    pub(crate) idle_timeout: Duration,
    /// See the module documentation.
    pub(crate) header_read_timeout: Duration,
    /// hyper's read buffer limit (the largest request head accepted).
    pub(crate) max_buf: usize,
    /// The largest HTTP/2 header list accepted (the listener's `max_header_bytes`).
    pub(crate) max_header_list: u32,
    /// The listener's HTTP/2 settings.
    pub(crate) http2: Http2Config,
}

/// The protocol a client connection speaks.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Protocol {
    /// HTTP/1.x only.
    Http1,
    /// HTTP/2 only (negotiated by TLS's ALPN, say).
    // Constructed by the TLS listener (ALPN `h2`), and by tests.
    #[allow(dead_code)]
    Http2,
    /// HTTP/2 if the client starts with its connection preface (h2c with prior knowledge),
    /// HTTP/1.x otherwise.
    Auto,
}

/// HTTP/2's connection preface (RFC 9113 section 3.4).
const PREFACE: &[u8; 24] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";

/// How long an HTTP/1 connection with no request in progress stays open once the balancer
/// drains (a shutdown or an upgrade) and it moves no byte, for a request already on its way
/// to be answered with `Connection: close`.
const DRAIN_IDLE_GRACE: Duration = Duration::from_secs(1);

/// How long an HTTP/2 connection closed for being idle has to go after its GOAWAY.
const GOAWAY_GRACE: Duration = Duration::from_secs(1);

/// Streams the client resets before hyper has taken them, per connection, before a GOAWAY
/// (h2's own default, set here so that it cannot change under us).
const MAX_PENDING_ACCEPT_RESETS: usize = 20;

/// Streams capataz's side resets for the client's errors, per connection, before a GOAWAY.
const MAX_LOCAL_ERROR_RESETS: usize = 1024;

/// The most response bytes buffered per HTTP/2 stream ahead of the client's reading.
const MAX_SEND_BUF: usize = 64 * 1024;

/// The most idle backend connections an HTTP/2 client connection keeps for itself (as many as
/// its streams may hold at once, `max_backend_connections` or `max_concurrent_streams` if
/// fewer, up to this): its streams run side by side, each on a backend connection of its own.
const MAX_PRIVATE_H2: usize = 128;

/// What the connection's task, its requests and its watcher share. 112 bytes, so that its
/// `Arc` is 128 (a smaller size class of the allocator than 160, for every connection's
/// whole life): hence `active` and `cancel_limit` in 32 bits.
pub(crate) struct ConnState {
    /// Bytes read: grows with every read that returned data.
    reads: AtomicU64,
    /// Bytes written: grows with every write that took data.
    writes: AtomicU64,
    /// `reads` and `writes` as last added to the listener's byte counters.
    counted: (AtomicU64, AtomicU64),
    /// The listener's metrics, as the connection was accepted.
    listener: Arc<ListenerMetrics>,
    /// Requests in progress (head received, response body not yet sent), and HTTP/2 streams
    /// become tunnels still open ([`OpenTunnel`]): each holds memory, far from 2^32 of them
    /// at once.
    active: AtomicU32,
    /// Requests done.
    served: AtomicU64,
    /// Requests answered (a response returned to hyper).
    answered: AtomicU64,
    /// Requests the client cancelled before their answer (an HTTP/2 stream reset, or the
    /// connection gone).
    cancelled: AtomicU64,
    /// Cancelled requests beyond the answered ones that close the connection (HTTP/2 only).
    cancel_limit: AtomicU32,
    /// Whether the connection speaks HTTP/2 (its timeouts follow HTTP/2's rules).
    h2: AtomicBool,
    /// `reads` when the last request was served (0 before the first): more reads than this and
    /// no request active means a request head is arriving.
    reads_at_rest: AtomicU64,
    /// Set by the watcher.
    close: CloseCell,
    /// Set by the watcher when the balancer drains: every HTTP/1 answer from then on says
    /// `Connection: close`.
    draining: AtomicBool,
    /// HTTP/1 only (see [`park`]).
    park: ParkCell,
    /// The connection task's waker, registered on its first poll.
    waker: Mutex<Option<Waker>>,
    /// Set when the connection has ended: the watcher forgets it.
    ended: AtomicBool,
    /// HTTP/1: whether the request in progress is watched for its client going away.
    peer: PeerWatch,
}

impl std::fmt::Debug for ConnState {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ConnState").finish_non_exhaustive()
    }
}

impl ConnState {
    fn new(listener: Arc<ListenerMetrics>) -> ConnState {
        ConnState {
            reads: AtomicU64::new(0),
            writes: AtomicU64::new(0),
            counted: (AtomicU64::new(0), AtomicU64::new(0)),
            listener,
            active: AtomicU32::new(0),
            served: AtomicU64::new(0),
            answered: AtomicU64::new(0),
            cancelled: AtomicU64::new(0),
            cancel_limit: AtomicU32::new(u32::MAX),
            h2: AtomicBool::new(false),
            reads_at_rest: AtomicU64::new(0),
            close: CloseCell::new(Close::Open),
            draining: AtomicBool::new(false),
            park: ParkCell::new(Park::Serving),
            waker: Mutex::new(None),
            ended: AtomicBool::new(false),
            peer: PeerWatch::default(),
        }
    }

    /// From now on the connection speaks HTTP/2.
    fn set_h2(&self, limits: &Limits) {
        self.cancel_limit
            .store(limits.http2.max_concurrent_streams, Ordering::Relaxed);
        self.h2.store(true, Ordering::Relaxed);
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

    /// Asks the connection's task to park its HTTP/1 connection (it decides: not if a request
    /// started meanwhile).
    fn ask_park(&self) {
        if self
            .park
            .compare_exchange(
                Park::Serving,
                Park::Asked,
                Ordering::AcqRel,
                Ordering::Relaxed,
            )
            .is_ok()
        {
            self.wake();
        }
    }

    fn wake(&self) {
        let waker = lockstat::lock(&self.waker, Site::ConnWaker).clone();
        if let Some(waker) = waker {
            waker.wake();
        }
    }

    fn close(&self, how: Close) {
        self.close.fetch_max(how, Ordering::Release);
        self.wake();
    }
}

impl BodyRead for ConnState {
    fn body_read(&self) {
        if self.peer.body_read() {
            // Read by another task (an HTTP/2 backend's client): the connection's task starts
            // watching at its next turn, now.
            self.wake();
        }
    }
}

/// Serves one client connection, speaking `protocol`, until it closes, a timeout closes it,
/// or shutdown drains it. `proxy` gives the routes in force, read per request so a reload
/// applies to the next request. The IO is TCP, or TLS over it. `guard` is dropped with the
/// returned future.
///
/// Not an `async fn`: the setup runs here, at the call, and the future returned holds only
/// what serving needs (an `async fn` keeps its arguments, `stream` and `client` included, in
/// its future for its whole life, beside what they were moved into).
pub(crate) fn serve<IO>(
    stream: IO,
    client: ClientInfo,
    protocol: Protocol,
    watch: &Watch,
    proxy: impl Fn() -> Arc<Proxy> + Clone + Unpin + Send + Sync + 'static,
    guard: impl Send + 'static,
) -> impl Future<Output = ()> + Send + 'static
where
    IO: AsyncRead + AsyncWrite + PeekPeer + Unpin + Send + 'static,
{
    // Counted open by the caller (`guard`), from its accept; accepted now, ready to serve.
    let metrics = proxy().metrics().clone();
    metrics.count_accepted();
    // Cloned (a closure holding an `Arc`), not put in an `Arc` of its own: one allocation
    // less for every connection's whole life.
    let shared = Arc::new(ConnState::new(metrics));
    let client = Arc::new(client);
    watch.add(shared.clone(), Arc::downgrade(&client.private));
    let info = client.clone();
    let done = Ended(shared.clone());

    let service_shared = shared.clone();
    let service_proxy = proxy.clone();
    let service = service_fn(move |req: http::Request<hyper::body::Incoming>| {
        let proxy = service_proxy();
        let client = client.clone();
        let mut request = InProgress::new(service_shared.clone());
        let mut req = req.map(crate::client_body::ClientBody::Hyper);
        if !service_shared.h2.load(Ordering::Relaxed) {
            let bodiless = req.body().is_end_stream();
            // Watched for its client going away while it waits (see `gone.rs`).
            service_shared.peer.start(bodiless);
            if !bodiless {
                // The proxy tells the connection when the body has been read to its end.
                let hook: Arc<dyn crate::body::BodyRead> = service_shared.clone();
                req.extensions_mut().insert(BodyReadHook(hook));
            }
        } else if req.method() == http::Method::CONNECT {
            // An extended CONNECT (a WebSocket, RFC 8441) whose stream may become a tunnel:
            // counted in progress for as long as the tunnel holds this.
            let open = Arc::new(OpenTunnel::new(service_shared.clone()));
            req.extensions_mut().insert(TunnelHold::new(open));
        }
        // The answer is wrapped within the proxy's future, not in one of this service's own
        // around it, which would keep the request beside it (`Proxy::handle_then`).
        proxy.handle_then(req, client, move |mut response| {
            request.answered();
            close_when_draining(&request.shared, &mut response);
            Ok::<_, std::convert::Infallible>(response.map(|body| {
                // An HTTP/2 stream's guard times how long the client leaves the answer
                // untaken (`stall.rs`).
                let stall = Stall::current();
                if let Some(stall) = &stall {
                    stall.answer(body.client_idle());
                }
                Tracked {
                    body,
                    stall,
                    _request: request,
                }
            }))
        })
    });
    let io = CountingIo {
        outbox: None,
        inner: stream,
        shared: Counted(shared.clone()),
        prefix: None,
        deferred: false,
        _held: guard,
    };
    serving(
        io,
        shared,
        service,
        info,
        protocol,
        watch.clone(),
        proxy,
        done,
    )
}

/// [`serve`]'s future, past the setup; `done` (the watcher's [`Ended`]) is dropped at its
/// end, the caller's guard (which counts the connection open) with the socket (`io`): an
/// upgraded connection's tunnel keeps it.
///
/// Not an `async fn` either: an `async fn`'s future keeps each argument twice (as given, and
/// as the body's own variable), and this future is the connection's task for its whole life.
/// `watch` (a handle) rather than its `Limits` (100 bytes) for the same reason.
#[allow(clippy::too_many_arguments, clippy::manual_async_fn)]
fn serving<IO, S, P, G: Send + 'static>(
    io: CountingIo<IO, G>,
    shared: Arc<ConnState>,
    service: S,
    client: Arc<ClientInfo>,
    protocol: Protocol,
    watch: Watch,
    proxy: P,
    done: Ended,
) -> impl Future<Output = ()>
where
    IO: AsyncRead + AsyncWrite + PeekPeer + Unpin + Send + 'static,
    S: hyper::service::Service<
            http::Request<hyper::body::Incoming>,
            Response = http::Response<Tracked>,
        > + Unpin
        + Send
        + 'static,
    S::Future: Send + 'static,
    S::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
    P: Fn() -> Arc<Proxy>,
{
    // The socket and the service are this future's only copies, for the connection's whole
    // life: lent to the HTTP/1 stretches (`park::serve_http1` takes them out and puts them back
    // as it parks), taken by HTTP/2's connection. Moved into a sub-future instead, they would
    // keep their slots here too, which made the task a size class larger (BENCHMARKS.md,
    // "Memory per idle client connection").
    let mut io = Some(io);
    let mut service = Some(service);
    async move {
        let Some(socket) = io.as_mut() else { return };
        // Nothing of hyper's (its connection state and buffers) exists until the client's first
        // bytes are there: an idle connection that has sent nothing yet is only this future, its
        // socket and its watcher.
        let first = match protocol {
            Protocol::Http1 | Protocol::Http2 => {
                until_closed(&shared, pin!(first_bytes(socket))).await
            }
            Protocol::Auto => until_closed(&shared, pin!(sniff(socket))).await,
        };
        let h2 = match first {
            Some(Ok(Some(h2))) => h2 || protocol == Protocol::Http2,
            // The client closed without a byte, went away, or a timeout or shutdown closed the
            // connection.
            Some(Ok(None)) | Some(Err(_)) | None => {
                // The watcher's line first, then the socket (its bytes, then its guard).
                drop(done);
                drop(io.take());
                return;
            }
        };
        let refused = if h2 {
            let limits = watch.limits();
            shared.set_h2(limits);
            let streams =
                usize::try_from(limits.http2.max_concurrent_streams).unwrap_or(usize::MAX);
            let held = usize::try_from(limits.http2.max_backend_connections).unwrap_or(usize::MAX);
            client.backend_slots.limit(held);
            // No more backend connections are in use at once than its streams may hold.
            client
                .private
                .set_capacity(streams.min(held).min(MAX_PRIVATE_H2));
            // Boxed, as the HTTP/1 connection below: this future stays small while it waits for
            // the first bytes.
            // Each request's future boxed (`BoxedCalls`): the stream's task holds a pointer to it.
            let (Some(socket), Some(service)) = (io.take(), service.take()) else {
                return;
            };
            let service = BoxedCalls(service);
            let mut conn =
                Box::pin(http2_builder(limits).serve_connection(TokioIo::new(socket), service));
            drive(&shared, conn.as_mut(), |conn| conn.graceful_shutdown()).await
        } else {
            let max_buf = watch.limits().max_buf;
            let lent = (&mut io, &mut service);
            let refused = park::serve_http1(&shared, &client.private, lent, max_buf).await;
            // The socket goes with the stretch it ended in, as it did inside it: its bytes
            // counted, then the connection counted closed, before the watcher's line.
            drop(io.take());
            refused
        };
        if refused {
            proxy().count_refused();
        }
        // The watcher's line; the socket is gone with hyper's connection (its bytes counted, then
        // the connection counted closed), or lives on in an upgraded connection's tunnel.
        drop(done);
        shared.count_bytes();
    }
}

/// Tells the watcher, when dropped, that the connection has ended (however its future ends),
/// and lets go of the task's waker: the watcher keeps the line until its next look, and a
/// waker keeps the task's whole allocation (its future's slot) alive.
struct Ended(Arc<ConnState>);

impl Drop for Ended {
    fn drop(&mut self) {
        let waker = lockstat::lock(&self.0.waker, Site::ConnWaker).take();
        self.0.ended.store(true, Ordering::Release);
        drop(waker);
    }
}

/// hyper's HTTP/1 server with the listener's settings.
fn http1_builder(max_buf: usize) -> http1::Builder {
    let mut builder = http1::Builder::new();
    // - half_close: a client's FIN after its request is a half-close, not an abort: the
    //   request goes on and is answered, as with HAProxy (`option abortonclose` is off by
    //   default); a reset is seen by the peek of `gone.rs` meanwhile. It also spares a read
    //   per request: without it hyper reads ahead while the request is in flight, to see a
    //   FIN, and that read finds its buffer still shared with the request's headers and
    //   allocates a new one every time.
    // - writev(false): each write is one `send`, not a `writev`, whose iovec import and VFS
    //   layers cost the kernel more than copying a head and a small body into one buffer.
    //   See BENCHMARKS.md.
    builder
        .max_buf_size(max_buf)
        .keep_alive(true)
        .half_close(true)
        .writev(false);
    builder
}

/// Adds `Connection: close` to an HTTP/1 answer of a draining connection, so that the client
/// opens its next connection elsewhere (to the process that took over, after an upgrade)
/// instead of sending its next request on a connection about to close. A protocol switch
/// (`101`) is left alone: the connection becomes the tunnel.
fn close_when_draining<B>(shared: &ConnState, response: &mut http::Response<B>) {
    if shared.draining.load(Ordering::Relaxed)
        && !shared.h2.load(Ordering::Relaxed)
        && response.status() != http::StatusCode::SWITCHING_PROTOCOLS
    {
        response.headers_mut().insert(
            http::header::CONNECTION,
            http::HeaderValue::from_static("close"),
        );
    }
}

/// hyper's HTTP/2 server with the listener's settings and the attack limits.
fn http2_builder(limits: &Limits) -> http2::Builder<StreamExec> {
    let settings = &limits.http2;
    // Each stream's task runs under a guard that ends it when the client leaves its answer
    // untaken for the pool's `body_idle` (`stall.rs`).
    let mut builder = http2::Builder::new(StreamExec);
    builder
        .timer(TokioTimer::new())
        .max_concurrent_streams(settings.max_concurrent_streams)
        .initial_stream_window_size(settings.initial_stream_window_size)
        .initial_connection_window_size(settings.initial_connection_window_size)
        .max_frame_size(settings.max_frame_size)
        .max_header_list_size(limits.max_header_list)
        .max_pending_accept_reset_streams(MAX_PENDING_ACCEPT_RESETS)
        .max_local_error_reset_streams(MAX_LOCAL_ERROR_RESETS)
        .max_send_buf_size(MAX_SEND_BUF)
        // Extended CONNECT (RFC 8441): WebSocket over HTTP/2, see `proxy/websocket.rs`.
        .enable_connect_protocol()
        .keep_alive_interval(settings.keepalive_interval)
        .keep_alive_timeout(settings.keepalive_timeout);
    builder
}

/// The most read by [`first_bytes`] (more is left to hyper's first read): a request head
/// usually fits.
const FIRST_READ: usize = 4096;

/// Waits for the client's first bytes and reads them, to go back to `io` and be read again by
/// hyper (`Some(false)`); `None` if the client closed without sending any. The buffer lives on
/// the stack of one poll only, never in the connection's future.
async fn first_bytes<IO: AsyncRead + AsyncWrite + Unpin, G>(
    io: &mut CountingIo<IO, G>,
) -> io::Result<Option<bool>> {
    poll_fn(|cx| {
        let mut buf = [MaybeUninit::<u8>::uninit(); FIRST_READ];
        let mut read = ReadBuf::uninit(&mut buf);
        match Pin::new(&mut *io).poll_read(cx, &mut read) {
            Poll::Pending => Poll::Pending,
            Poll::Ready(Err(error)) => Poll::Ready(Err(error)),
            Poll::Ready(Ok(())) if read.filled().is_empty() => Poll::Ready(Ok(None)),
            Poll::Ready(Ok(())) => {
                io.prefix = Some(Bytes::copy_from_slice(read.filled()));
                Poll::Ready(Ok(Some(false)))
            }
        }
    })
    .await
}

/// Reads the start of the connection until it is HTTP/2's preface (`Some(true)`) or cannot
/// be (`Some(false)`); what was read goes back to `io`, to be read again by hyper. `None` if
/// the client closed without sending a byte.
async fn sniff<IO: AsyncRead + AsyncWrite + Unpin, G>(
    io: &mut CountingIo<IO, G>,
) -> io::Result<Option<bool>> {
    let mut buf = [0u8; PREFACE.len()];
    let mut filled = 0;
    let h2 = loop {
        let mut read = ReadBuf::new(&mut buf[filled..]);
        poll_fn(|cx| Pin::new(&mut *io).poll_read(cx, &mut read)).await?;
        let n = read.filled().len();
        if n == 0 {
            if filled == 0 {
                return Ok(None);
            }
            // Closed before a whole preface or a differing byte: hyper sees the same end.
            break false;
        }
        filled += n;
        if buf[..filled] != PREFACE[..filled] {
            break false;
        }
        if filled == PREFACE.len() {
            break true;
        }
    };
    io.prefix = Some(Bytes::copy_from_slice(&buf[..filled]));
    Ok(Some(h2))
}

/// Polls `fut` until it ends or the watcher closes the connection (`None`). Not an `async fn`,
/// whose future would keep a copy of `fut`'s: the caller's future holds it, pinned.
fn until_closed<'a, F: Future>(
    shared: &'a ConnState,
    mut fut: Pin<&'a mut F>,
) -> impl Future<Output = Option<F::Output>> + 'a {
    let mut registered = false;
    poll_fn(move |cx| {
        register(shared, cx, &mut registered);
        if shared.close.load(Ordering::Acquire) == Close::Abort {
            return Poll::Ready(None);
        }
        fut.as_mut().poll(cx).map(Some)
    })
}

/// Drives the connection until it ends or the watcher aborts it, and shuts it down
/// gracefully (`graceful`) when the watcher asks. Returns whether hyper ended it refusing a request head it answered itself (`refused_by_hyper`).
async fn drive<C, E>(shared: &ConnState, mut conn: Pin<&mut C>, graceful: fn(Pin<&mut C>)) -> bool
where
    C: Future<Output = Result<(), E>>,
    E: std::error::Error + 'static,
{
    let mut closing = false;
    let mut registered = false;
    poll_fn(|cx| {
        register(shared, cx, &mut registered);
        match shared.close.load(Ordering::Acquire) {
            Close::Abort => return Poll::Ready(false),
            Close::Graceful if !closing => {
                closing = true;
                graceful(conn.as_mut());
            }
            _ => {}
        }
        conn.as_mut()
            .poll(cx)
            .map(|ended| ended.err().is_some_and(|error| refused_by_hyper(&error)))
    })
    .await
}

/// Registers the connection task's waker for the watcher, on a future's first poll only (a
/// spawned task's waker never changes, so the mutex is not taken per poll).
fn register(shared: &ConnState, cx: &Context<'_>, registered: &mut bool) {
    if !*registered {
        *lockstat::lock(&shared.waker, Site::ConnWaker) = Some(cx.waker().clone());
        *registered = true;
    }
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
    shared: Arc<ConnState>,
    started: std::time::Instant,
    /// Whether the proxy produced an answer (a request whose client went away first is not
    /// timed, and over HTTP/2 counts as cancelled).
    answered: bool,
}

impl InProgress {
    fn new(shared: Arc<ConnState>) -> InProgress {
        shared.active.fetch_add(1, Ordering::Relaxed);
        InProgress {
            shared,
            started: std::time::Instant::now(),
            answered: false,
        }
    }

    /// The request has its answer (whatever happens to its body). Counted for HTTP/2 only,
    /// the one protocol with a cancel limit; over HTTP/1.1 its client is no longer watched
    /// for going away.
    fn answered(&mut self) {
        self.answered = true;
        if self.shared.h2.load(Ordering::Relaxed) {
            self.shared.answered.fetch_add(1, Ordering::Relaxed);
        } else {
            // Its client is no longer watched for (see `gone.rs`).
            self.shared.peer.stop();
        }
    }
}

impl Drop for InProgress {
    fn drop(&mut self) {
        let shared = &self.shared;
        if !shared.h2.load(Ordering::Relaxed) {
            shared.peer.stop();
        }
        if self.answered {
            shared.listener.request_took(self.started.elapsed());
        }
        shared
            .reads_at_rest
            .store(shared.reads.load(Ordering::Relaxed), Ordering::Relaxed);
        shared.served.fetch_add(1, Ordering::Relaxed);
        shared.active.fetch_sub(1, Ordering::Relaxed);
        if !self.answered && shared.h2.load(Ordering::Relaxed) {
            // Cancelled by the client before its answer: a rapid reset, if it goes on.
            let cancelled = shared.cancelled.fetch_add(1, Ordering::Relaxed) + 1;
            let allowed = shared
                .answered
                .load(Ordering::Relaxed)
                .saturating_add(u64::from(shared.cancel_limit.load(Ordering::Relaxed)));
            if cancelled > allowed {
                tracing::debug!(cancelled, "client cancels its requests: connection dropped");
                shared.close(Close::Abort);
            }
        }
    }
}

/// An HTTP/2 extended CONNECT, and the tunnel its stream may become (`TunnelHold`), counted
/// in `active` until dropped: a connection whose only stream is a busy WebSocket is not idle,
/// and a drain waits for it as for a request. The tunnel closes on its own idleness.
struct OpenTunnel(Arc<ConnState>);

impl OpenTunnel {
    fn new(shared: Arc<ConnState>) -> OpenTunnel {
        shared.active.fetch_add(1, Ordering::Relaxed);
        OpenTunnel(shared)
    }
}

impl Drop for OpenTunnel {
    fn drop(&mut self) {
        self.0.active.fetch_sub(1, Ordering::Relaxed);
    }
}

/// A response body that keeps its request in progress until hyper is done with it, and over
/// HTTP/2 tells its stream's guard when hyper holds what it gave (`stall.rs`).
struct Tracked {
    body: RespBody,
    stall: Option<Arc<Stall>>,
    _request: InProgress,
}

impl Body for Tracked {
    type Data = Bytes;
    type Error = std::io::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, std::io::Error>>> {
        let this = self.get_mut();
        let polled = Pin::new(&mut this.body).poll_frame(cx);
        if let Some(stall) = &this.stall {
            stall.polled(matches!(polled, Poll::Ready(Some(Ok(_)))));
        }
        polled
    }

    fn is_end_stream(&self) -> bool {
        self.body.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.body.size_hint()
    }
}

/// The client socket (TCP, or TLS over it), counting the bytes read and written.
struct CountingIo<IO, G> {
    /// HTTP/1 on a plain socket, on a worker with a flusher: where writes wait for the end of
    /// the turn (see `put_off`), made at the first. Declared before `inner`, so dropped
    /// (what it holds sent, the flusher's hold on the descriptor taken away) before the
    /// socket closes.
    outbox: Option<Outbox>,
    inner: IO,
    shared: Counted,
    /// Bytes read while detecting the protocol, read again first.
    prefix: Option<Bytes>,
    /// Whether this flush's first write was put off (see `put_off`); cleared by the flush.
    deferred: bool,
    /// The caller's guard (it counts the connection open), dropped with the socket: after
    /// the connection's future, or after an upgraded connection's tunnel.
    _held: G,
}

/// The connection's state as its socket holds it: dropped with the socket, it adds the bytes
/// moved to the listener's counters before the guard (a later field of [`CountingIo`]) counts
/// the connection closed.
struct Counted(Arc<ConnState>);

impl std::ops::Deref for Counted {
    type Target = ConnState;

    fn deref(&self) -> &ConnState {
        &self.0
    }
}

impl Drop for Counted {
    fn drop(&mut self) {
        self.0.count_bytes();
    }
}

impl<IO: PeekPeer, G> CountingIo<IO, G> {
    /// The socket registered anew with the runtime's IO driver ([`PeekPeer::reregister`]).
    /// The outbox goes first (made again at the next write), sending what it may still hold
    /// (the parking shutdown wrote it all): a socket that fails to register again is closed
    /// within `reregister`, before `self` (and an outbox in it) would be dropped.
    fn reregistered(mut self) -> io::Result<Self> {
        self.outbox = None;
        self.inner = self.inner.reregister()?;
        Ok(self)
    }
}

/// Never pinned structurally: the guard is only held.
impl<IO: Unpin, G> Unpin for CountingIo<IO, G> {}

impl<IO: AsyncRead + AsyncWrite + Unpin, G> AsyncRead for CountingIo<IO, G> {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        if let Some(prefix) = &mut this.prefix {
            let n = prefix.len().min(buf.remaining());
            buf.put_slice(&prefix.split_to(n));
            if prefix.is_empty() {
                this.prefix = None;
            }
            return Poll::Ready(Ok(()));
        }
        if let Some(outbox) = this.outbox.as_ref().filter(|outbox| outbox.troubled()) {
            // Bytes the flusher could not send, and a task that may only be reading now (an
            // upgraded connection's tunnel): they go first, or wait for the socket with the read.
            if let Poll::Ready(Err(error)) = outbox.poll_write_held(cx, &mut this.inner) {
                return Poll::Ready(Err(error));
            }
        }
        if this.shared.ended.load(Ordering::Relaxed)
            && this.outbox.as_ref().is_some_and(|outbox| !outbox.holds())
        {
            // A tunnel's read: hyper's connection is over and the tunnel writes at once (see
            // `put_off`), so an empty outbox goes, with the waker of hyper's task it keeps
            // (which keeps that task's allocation).
            this.outbox = None;
        }
        let before = buf.filled().len();
        let polled = Pin::new(&mut this.inner).poll_read(cx, buf);
        let read = buf.filled().len().saturating_sub(before);
        if read > 0 {
            this.shared.reads.fetch_add(read as u64, Ordering::Relaxed);
        }
        polled
    }
}

impl<IO, G> CountingIo<IO, G> {
    fn count_write(&self, polled: &Poll<io::Result<usize>>) {
        if let Poll::Ready(Ok(n)) = polled {
            if *n > 0 {
                self.shared.writes.fetch_add(*n as u64, Ordering::Relaxed);
            }
        }
    }
}

impl<IO: PeekPeer, G> CountingIo<IO, G> {
    /// Puts this write off, or says it goes at once (`None`).
    ///
    /// HTTP/1: a turn's reads all come before its writes, as in HAProxy's event loop (see
    /// `turn`'s module docs; BENCHMARKS.md, "The balancer against HAProxy and nginx: plaintext
    /// HTTP/1.1"). On a plain socket, on a worker with a flusher, the bytes are held in the
    /// connection's outbox and sent by the worker's flusher at the end of the turn
    /// (`outbox`): hyper sees them written. What the outbox does not hold (too much, or bytes
    /// it left after a partial send) goes at once, after what it holds. Otherwise (TLS) the
    /// first write of each flush goes to the back of the runtime's run queue
    /// ([`turn::poll_back_of_queue`]), made by the task's next poll.
    ///
    /// HTTP/2: while requests of the connection are in progress, the first write of each flush
    /// makes the connection's task yield (woken once the runtime has polled its IO driver), so
    /// that the answers of the streams whose backends answered meanwhile go out in the same
    /// write, as HAProxy writes once per connection and event-loop turn. With nothing in
    /// progress the write goes at once: one request at a time gains nothing from waiting. See
    /// BENCHMARKS.md, "HTTP/2: where the instructions go".
    fn put_off(
        &mut self,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Option<Poll<io::Result<usize>>>
    where
        IO: AsyncWrite + Unpin,
    {
        if !self.shared.h2.load(Ordering::Relaxed) {
            if self.shared.ended.load(Ordering::Relaxed) {
                // hyper's connection is over: an upgraded connection's tunnel writes, at once
                // (after what is held). A tunnel waiting for its backend's bytes, with its
                // client's unsent to a backend that does not read, calls nothing of this
                // socket's: bytes the flusher left would wait for a poll that never comes. And
                // a write put off by a poll leaves the bytes in the copy's buffer, lost if its
                // next read of the backend fails.
                let waiting = held_first(self.outbox.as_ref()?, cx, &mut self.inner);
                if waiting.is_none() {
                    // Empty, and never used again: not kept (nor hyper's task, its waker).
                    self.outbox = None;
                }
                return waiting;
            }
            if self.outbox.is_none() {
                // A TLS socket has no descriptor to give: no lookup of the thread's flusher.
                // What it holds when the connection ends goes then: hyper may drop the
                // socket with no flush after a write (a connection ended by an error).
                self.outbox = self
                    .inner
                    .plain_fd()
                    .and_then(Outbox::for_socket)
                    .map(Outbox::sending_when_dropped);
            }
            let Some(outbox) = &self.outbox else {
                return turn::poll_back_of_queue(&mut self.deferred, cx)
                    .is_pending()
                    .then_some(Poll::Pending);
            };
            if let Some(held) = outbox.hold(cx, bufs) {
                return Some(Poll::Ready(Ok(held)));
            }
            return held_first(outbox, cx, &mut self.inner);
        }
        if self.shared.active.load(Ordering::Relaxed) == 0 {
            self.deferred = false;
            return None;
        }
        if !self.deferred {
            self.deferred = true;
            let mut yielded = std::pin::pin!(tokio::task::yield_now());
            if yielded.as_mut().poll(cx).is_pending() {
                return Some(Poll::Pending);
            }
        }
        // The rest of this flush's writes go at once; the flush ends the turn's batch.
        None
    }
}

/// A write not held by `outbox`: what it holds goes first, on `io` (`None` once it is all out,
/// and the write may go), else the write waits with it or fails with its error.
fn held_first<IO: AsyncWrite + Unpin>(
    outbox: &Outbox,
    cx: &mut Context<'_>,
    io: &mut IO,
) -> Option<Poll<io::Result<usize>>> {
    match outbox.poll_write_held(cx, io) {
        Poll::Ready(Ok(())) => None,
        Poll::Ready(Err(error)) => Some(Poll::Ready(Err(error))),
        Poll::Pending => Some(Poll::Pending),
    }
}

impl<IO: AsyncWrite + PeekPeer + Unpin, G> AsyncWrite for CountingIo<IO, G> {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        let polled = match this.put_off(cx, &[io::IoSlice::new(buf)]) {
            Some(put_off) => put_off,
            None => Pin::new(&mut this.inner).poll_write(cx, buf),
        };
        this.count_write(&polled);
        polled
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        let polled = match this.put_off(cx, bufs) {
            Some(put_off) => put_off,
            None => Pin::new(&mut this.inner).poll_write_vectored(cx, bufs),
        };
        this.count_write(&polled);
        polled
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }

    /// hyper flushes at the end of every turn of an HTTP/1 connection, even with nothing to
    /// write: while a request waits for its answer, that is where its client is seen gone
    /// (see `gone.rs`), and the error ends the connection. It is also where bytes the
    /// flusher could not send are sent, and where its failure is returned.
    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        this.deferred = false;
        if let Poll::Ready(error) = this.shared.peer.poll_gone(&this.inner, cx) {
            return Poll::Ready(Err(error));
        }
        if let Some(outbox) = &this.outbox {
            match outbox.state() {
                Ok(Held::Fine) => {}
                Ok(Held::Left) => std::task::ready!(outbox.poll_write_held(cx, &mut this.inner))?,
                Err((error, _)) => return Poll::Ready(Err(error)),
            }
        }
        Pin::new(&mut this.inner).poll_flush(cx)
    }

    /// What the outbox holds goes first, parking or not.
    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        if let Some(outbox) = &this.outbox {
            std::task::ready!(outbox.poll_write_held(cx, &mut this.inner))?;
        }
        if this.shared.park.load(Ordering::Relaxed) == Park::Parking {
            // hyper's connection is being taken apart to park, not closed: the socket stays.
            return Poll::Ready(Ok(()));
        }
        Pin::new(&mut this.inner).poll_shutdown(cx)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::instruments::{Families, HistogramScope};

    pub(super) fn new_shared() -> ConnState {
        let mut registry = prometheus_client::registry::Registry::default();
        let families = Families::register(&mut registry, HistogramScope::Pool);
        ConnState::new(families.listener("test"))
    }

    pub(super) fn limits() -> Limits {
        Limits {
            idle_timeout: Duration::from_secs(10),
            header_read_timeout: Duration::from_secs(2),
            max_buf: 8192,
            max_header_list: 16384,
            http2: Http2Config::default(),
        }
    }

    #[test]
    fn cancelled_requests_beyond_the_answered_ones_close_an_http2_connection() {
        let shared = Arc::new(new_shared());
        let mut limits = limits();
        limits.http2.max_concurrent_streams = 3;
        shared.set_h2(&limits);
        // Two answered, then cancelled ones: more than 3 beyond the 2 answered close it.
        for _ in 0..2 {
            InProgress::new(shared.clone()).answered();
        }
        for cancelled in 1..=7 {
            drop(InProgress::new(shared.clone()));
            let closed = shared.close.load(Ordering::Relaxed) == Close::Abort;
            assert_eq!(closed, cancelled > 5, "after {cancelled} cancelled");
        }
    }

    /// The counters made 32 bits (`active`, `cancel_limit`) at their limits: the largest
    /// `max_concurrent_streams` the config takes (10,000) still drops the connection at the
    /// cancel after it, a connection that has answered (nearly) 2^64 requests adds no overflow,
    /// and requests and tunnels give back every count of `active` they took.
    #[test]
    fn the_32_bit_counters_hold_at_their_limits() {
        let shared = Arc::new(new_shared());
        let mut limits = limits();
        limits.http2.max_concurrent_streams = 10_000;
        shared.set_h2(&limits);
        for cancelled in 1..=10_001u32 {
            drop(InProgress::new(shared.clone()));
            let closed = shared.close.load(Ordering::Relaxed) == Close::Abort;
            assert_eq!(closed, cancelled > 10_000, "after {cancelled} cancelled");
        }
        let shared = Arc::new(new_shared());
        shared.cancel_limit.store(u32::MAX, Ordering::Relaxed);
        shared.h2.store(true, Ordering::Relaxed);
        shared.answered.store(u64::MAX - 1, Ordering::Relaxed);
        drop(InProgress::new(shared.clone()));
        assert_eq!(shared.close.load(Ordering::Relaxed), Close::Open);
        let held: Vec<_> = (0..1000)
            .map(|n| {
                let request = InProgress::new(shared.clone());
                let tunnel = (n % 2 == 0).then(|| OpenTunnel::new(shared.clone()));
                (request, tunnel)
            })
            .collect();
        assert_eq!(shared.active.load(Ordering::Relaxed), 1500);
        drop(held);
        assert_eq!(shared.active.load(Ordering::Relaxed), 0);
    }

    #[test]
    fn cancelled_requests_never_close_an_http1_connection() {
        let shared = Arc::new(new_shared());
        for _ in 0..1000 {
            drop(InProgress::new(shared.clone()));
        }
        assert_eq!(shared.close.load(Ordering::Relaxed), Close::Open);
    }

    /// A connection's task is as big as its future for its whole life, idle or not: hyper's
    /// connection and what drives it are boxed while it serves, and no argument is kept twice,
    /// so an idle connection (before its first request, or parked) keeps only this future.
    /// What every connection keeps for its whole life, in the allocator's size classes they
    /// were made to fit (with an `Arc`'s two counts, 16 bytes): 128 and 160 bytes.
    #[test]
    fn the_connection_state_and_client_info_fit_their_size_classes() {
        assert!(std::mem::size_of::<ConnState>() <= 112);
        assert!(std::mem::size_of::<ClientInfo>() <= 144);
    }

    #[tokio::test]
    async fn an_idle_connection_is_a_small_future() {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let _client = tokio::net::TcpStream::connect(addr).await.unwrap();
        let (stream, peer) = listener.accept().await.unwrap();
        let shared = Arc::new(new_shared());
        let io = CountingIo {
            outbox: None,
            inner: stream,
            shared: Counted(shared.clone()),
            prefix: None,
            deferred: false,
            _held: (),
        };
        let client = Arc::new(ClientInfo::new(peer));
        // As the real service: three `Arc`s.
        let held = (shared.clone(), client.clone(), Arc::new(()));
        let service = service_fn(move |_: http::Request<hyper::body::Incoming>| {
            let _held = &held;
            async { Err::<http::Response<Tracked>, io::Error>(io::Error::other("unused")) }
        });
        // As the listener's: a closure holding an `Arc`.
        let state = Arc::new(());
        let proxy = move || -> Arc<Proxy> {
            let _state = &state;
            unreachable!("not asked")
        };
        let done = Ended(shared.clone());
        let watch = Watch::start(limits(), tokio::sync::watch::channel(false).1);
        let future = serving(
            io,
            shared,
            service,
            client,
            Protocol::Auto,
            watch,
            proxy,
            done,
        );
        // A task adds about 104 bytes to its future and is rounded up to 128: at most 400
        // keeps a connection's task at 512 bytes (it was 1,024: its future, 1,040 bytes here).
        let size = std::mem::size_of_val(&future);
        assert!(size <= 400, "the connection's future: {size} bytes");
    }

    /// Regression: the watcher keeps an ended connection's line until its next look (up to a
    /// period), and the line held the task's waker, which keeps the task's whole allocation
    /// (its future's slot, a few KB) alive: under churn, a period's worth of ended tasks.
    #[test]
    fn an_ended_connection_lets_go_of_its_waker() {
        struct Count;
        impl std::task::Wake for Count {
            fn wake(self: Arc<Self>) {}
        }
        let task = Arc::new(Count);
        let shared = Arc::new(new_shared());
        let waker = Waker::from(task.clone());
        register(&shared, &Context::from_waker(&waker), &mut false);
        drop(waker);
        assert_eq!(Arc::strong_count(&task), 2);
        drop(Ended(shared.clone()));
        assert!(shared.ended.load(Ordering::Relaxed));
        assert_eq!(Arc::strong_count(&task), 1, "the waker is still held");
    }
}
