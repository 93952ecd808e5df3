//! The bodies that flow through the proxy, both ways, streamed frame by frame.
//!
//! `RespBody` also carries the lease on the backend: the in-flight count is released and the
//! keep-alive connection handed back when the response has been read to its end, and the
//! connection is dropped instead if the client went away before that. The lease also judges
//! the answer for the passive checks once the body has ended: its status if the body arrived
//! whole, a reset if it was cut short, a timeout if it stalled (the client already has the
//! headers, so no retry can hide it, and a backend doing this to every response must still be
//! ejected).
//!
//! A stalled body is one the backend sends nothing of for `timeouts.body_idle` while capataz
//! waits for it. Only that wait counts: the clock starts when the body returns `Pending` for
//! lack of backend data and stops when data arrives; while the client is slow to read, hyper
//! does not poll the body and nothing is charged. No timer exists until a body first waits.

use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use std::io;

use bytes::{Bytes, BytesMut};
use capataz_health::Outcome;
use hyper::body::{Body, Frame, Incoming, SizeHint};

use crate::client_body::ClientBody;

use crate::access_log::{self, AccessLog, AccessRecord, Termination};
use crate::balance::{Admission, PoolHandle};
use crate::upstream::{
    self, AttemptError, BackendStream, Phase, PrivateIdle, ResponseStream, Slot,
};
use capataz_h1::framing::Framing;

/// A request body on its way to a backend.
#[derive(Debug, Default)]
pub enum ReqBody {
    /// The client's body, streamed; the hook, if any, hears when it has been read to its end.
    Incoming(ClientBody, Option<Arc<dyn BodyRead>>),
    /// No body (a retry of a bodiless request).
    #[default]
    Empty,
}

/// Fields a trailer section must not carry (RFC 9110 section 6.5.1: they frame or route the
/// message, so they cannot come after its content; RFC 9113 section 8.2.2: connection-specific),
/// dropped from a client's request trailers before they go on. An HTTP/2 client's are refused
/// by h2 itself (`vendor/h2/CAPATAZ.md`); an HTTP/1.1 client's chunked trailers come through
/// hyper as sent, and an HTTP/2 backend would reset the stream on them (charged to the backend
/// as a reset: one client's bytes could eject it). HAProxy leaves them out too.
const FORBIDDEN_TRAILERS: [http::header::HeaderName; 8] = [
    http::header::CONTENT_LENGTH,
    http::header::HOST,
    http::header::TE,
    http::header::TRANSFER_ENCODING,
    http::header::CONNECTION,
    http::header::UPGRADE,
    http::header::HeaderName::from_static("keep-alive"),
    http::header::HeaderName::from_static("proxy-connection"),
];

/// Drops the [`FORBIDDEN_TRAILERS`] from a request's trailer section.
fn strip_forbidden_trailers(trailers: &mut http::HeaderMap) {
    for name in &FORBIDDEN_TRAILERS {
        trailers.remove(name);
    }
}

/// Hears that a client's request body has been read to its end: its HTTP/1 connection then
/// watches for the client going away while the answer is awaited (`downstream/gone.rs`).
pub trait BodyRead: Send + Sync {
    /// The body has been read to its end.
    fn body_read(&self);
}

impl std::fmt::Debug for dyn BodyRead {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("BodyRead")
    }
}

impl Body for ReqBody {
    type Data = Bytes;
    type Error = hyper::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, hyper::Error>>> {
        match self.get_mut() {
            ReqBody::Incoming(body, hook) => {
                let mut polled = Pin::new(&mut *body).poll_frame(cx);
                if let Poll::Ready(Some(Ok(frame))) = &mut polled {
                    if let Some(trailers) = frame.trailers_mut() {
                        strip_forbidden_trailers(trailers);
                    }
                }
                let ended = match &polled {
                    Poll::Ready(None) => true,
                    Poll::Ready(Some(Ok(_))) => body.is_end_stream(),
                    _ => false,
                };
                if ended {
                    if let Some(hook) = hook.take() {
                        hook.body_read();
                    }
                }
                polled
            }
            ReqBody::Empty => Poll::Ready(None),
        }
    }

    fn is_end_stream(&self) -> bool {
        match self {
            ReqBody::Incoming(body, _) => body.is_end_stream(),
            ReqBody::Empty => true,
        }
    }

    fn size_hint(&self) -> SizeHint {
        match self {
            ReqBody::Incoming(body, _) => body.size_hint(),
            ReqBody::Empty => SizeHint::with_exact(0),
        }
    }
}

/// Holds a backend's in-flight slot and, once the response is complete, its connection.
pub struct Lease {
    /// The pool, and the backend's index in it.
    pool: Arc<PoolHandle>,
    index: usize,
    /// Where the connection goes back: the client connection's own idle set, or (`None`) the
    /// backend's shared one.
    private: Option<Arc<PrivateIdle>>,
    /// The connection, and when its response arrived: set once the body has ended whole and
    /// the connection may carry another request.
    sender: Option<(BackendStream, Instant)>,
    /// The answer to report to the passive checks when the lease ends (its status).
    verdict: Option<Outcome>,
    /// How the body failed before its end, if it did: judged instead of the answer.
    failed: Option<AttemptError>,
    /// How long the answer's head took, for recorders.
    latency: Option<Duration>,
    /// The client connection's slot this attempt holds, if it takes one (`upstream::slots`).
    _slot: Option<Slot>,
}

impl Lease {
    /// Takes an in-flight slot on backend `index` of `pool`; a reusable connection goes back
    /// to `private` if given, else to the backend's shared set.
    pub fn new(pool: Arc<PoolHandle>, index: usize, private: Option<Arc<PrivateIdle>>) -> Lease {
        pool.backends[index]
            .in_flight
            .fetch_add(1, Ordering::Relaxed);
        Lease {
            pool,
            index,
            private,
            sender: None,
            verdict: None,
            failed: None,
            latency: None,
            _slot: None,
        }
    }

    /// A lease on the slot `admission` holds on a backend of `pool` (a pool with limits: the
    /// slot is counted already, and given back when the lease ends).
    pub fn admitted(
        pool: Arc<PoolHandle>,
        admission: Admission<'_>,
        private: Option<Arc<PrivateIdle>>,
    ) -> Lease {
        let index = admission.keep();
        Lease {
            pool,
            index,
            private,
            sender: None,
            verdict: None,
            failed: None,
            latency: None,
            _slot: None,
        }
    }

    /// Holds `slot` (the client connection's, see `upstream::slots`) until the lease ends.
    pub fn hold(&mut self, slot: Option<Slot>) {
        self._slot = slot;
    }

    /// The client connection's own idle set, under the private reuse policy.
    pub fn private(&self) -> Option<&PrivateIdle> {
        self.private.as_deref()
    }

    /// The body has ended whole: `sender`, the connection if it may carry another request,
    /// goes back when the lease ends.
    fn complete(&mut self, sender: Option<BackendStream>, answered_at: Instant) {
        self.sender = sender.map(|sender| (sender, answered_at));
    }

    /// Reports `answer` for the backend when the lease ends: as is if the body ended whole or
    /// the client went away, as the failure's outcome if the body failed.
    pub fn judge_at_end(&mut self, answer: Outcome) {
        self.verdict = Some(answer);
    }

    /// Notes that the answer's head came `latency` after the request was sent.
    pub fn answered_after(&mut self, latency: Duration) {
        self.latency = Some(latency);
    }
}

impl Drop for Lease {
    fn drop(&mut self) {
        let backend = &self.pool.backends[self.index];
        backend.in_flight.fetch_sub(1, Ordering::Relaxed);
        if let Some(answer) = self.verdict.take() {
            let outcome = match self.failed {
                Some(failed) => failed.outcome(),
                None => Some(answer),
            };
            if let Some(outcome) = outcome {
                self.pool
                    .observe_answered(self.index, outcome, self.latency);
            }
        }
        if let Some((sender, answered_at)) = self.sender.take() {
            backend
                .upstream
                .release(sender, answered_at, self.private.as_deref());
        }
        // Last: the queue's head, granted the slot, finds the connection idle.
        if let Some(limits) = &self.pool.limits {
            limits.released(&self.pool);
        }
    }
}

/// A response body on its way to a client.
// A backend's body is boxed: unboxed it made a `Response<RespBody>` about 500 bytes, moved
// (memcpy) at each phase of the request path and hyper's (a dozen times per request), which
// cost more than the allocation does (BENCHMARKS.md, "Header maps and moves on the request
// path").
pub enum RespBody {
    /// A backend's body, with the lease it holds.
    Upstream(Box<UpstreamBody>),
    /// An HTTP/2 backend's body (data, then trailers), with the lease it holds.
    H2(Box<H2RespBody>),
    /// A body capataz wrote itself (an error page).
    Full(Option<Bytes>),
    /// A backend's body that came whole with its head (`RespBody::upstream`), its connection
    /// already handed back; with its pool's `body_idle`, for `client_idle` (as `Upstream`).
    Whole(Option<Bytes>, Duration),
    /// A body whose request is written to the access log when it ends.
    Logged(Box<Logged>),
}

/// A response body with its request's access log record, completed and emitted when hyper is
/// done with the body: the bytes handed to the client, the duration to the last byte, and who
/// ended the request (`fixed` if that was decided before the body, else: whole, the body's
/// own failure, or the client gone).
pub struct Logged {
    inner: RespBody,
    record: Option<Box<AccessRecord>>,
    log: Arc<AccessLog>,
    fixed: Option<Termination>,
    failed: Option<AttemptError>,
}

impl RespBody {
    /// `inner`, whose request `record` goes to `log` when the body ends; `fixed` says who
    /// ended the request if that is already decided (capataz's own page).
    pub fn logged(
        inner: RespBody,
        record: Box<AccessRecord>,
        log: Arc<AccessLog>,
        fixed: Option<Termination>,
    ) -> RespBody {
        RespBody::Logged(Box::new(Logged {
            inner,
            record: Some(record),
            log,
            fixed,
            failed: None,
        }))
    }
}

impl Logged {
    fn poll_next(&mut self, cx: &mut Context<'_>) -> Poll<Option<io::Result<Frame<Bytes>>>> {
        let polled = Pin::new(&mut self.inner).poll_frame(cx);
        match &polled {
            Poll::Ready(Some(Ok(frame))) => {
                if let (Some(data), Some(record)) = (frame.data_ref(), &mut self.record) {
                    record.bytes += data.len() as u64;
                }
            }
            Poll::Ready(Some(Err(error))) => {
                self.failed = error
                    .get_ref()
                    .and_then(|inner| inner.downcast_ref::<AttemptError>())
                    .copied()
                    .or(Some(AttemptError::BodyBroken));
            }
            _ => {}
        }
        polled
    }
}

impl Drop for Logged {
    fn drop(&mut self) {
        let Some(mut record) = self.record.take() else {
            return;
        };
        record.termination = match (self.fixed, self.failed) {
            (Some(fixed), _) => fixed,
            (None, Some(failed)) => Termination::of(failed),
            (None, None) if self.inner.is_end_stream() => Termination::COMPLETE,
            (None, None) => Termination::client_gone(access_log::Phase::Body),
        };
        self.log.emit(record);
    }
}

impl RespBody {
    /// A short plain-text body.
    pub fn text(text: impl Into<Bytes>) -> RespBody {
        RespBody::Full(Some(text.into()))
    }

    /// The body of a backend's answer, read from `stream` (`buf` holds what was read past the
    /// head) as `framing` says. When it has been read to its end the connection goes back to
    /// the backend's idle set if it is reusable; `answered_at` is when the head arrived. A body
    /// the backend sends nothing of for `body_idle` fails as stalled.
    #[inline]
    pub fn upstream(
        stream: BackendStream,
        buf: BytesMut,
        framing: Framing,
        mut lease: Lease,
        answered_at: Instant,
        body_idle: Duration,
    ) -> RespBody {
        let mut inner = ResponseStream::new(stream, buf, framing, body_idle);
        // A small answer's body usually comes whole with its head (nginx writes both at once):
        // then it is read to its end already, and needs neither a box nor polls of its own.
        let whole = inner.take_whole();
        if inner.is_done() {
            // Nothing to stream: the connection is ready again now.
            lease.complete(inner.finish(), answered_at);
            drop(lease);
            return match whole {
                Some(data) => RespBody::Whole(Some(data), body_idle),
                None => RespBody::Full(None),
            };
        }
        RespBody::Upstream(Box::new(UpstreamBody {
            inner,
            answered_at,
            lease: Some(lease),
            // The head: hyper has it buffered, and sends it only once the body waits.
            unflushed: true,
            broke: None,
            broke_waits: 0,
        }))
    }
}

/// How many times a body that failed right after the head or data waits before it reports
/// the failure. hyper sends what it holds when the body waits, and an HTTP/1 client connection
/// puts the first write of each flush off to the back of the runtime's run queue once
/// ([`crate::turn`]): that write goes out at the second wait, so the client gets the head (and
/// the data) before the connection ends.
const BROKEN_WAITS: u8 = 2;

/// A backend's response body, read straight from its connection, with the lease it holds.
pub struct UpstreamBody {
    inner: ResponseStream<BackendStream>,
    answered_at: Instant,
    lease: Option<Lease>,
    /// Whether the head or data went out since the last `Pending` (true before the first
    /// poll): hyper may still hold it unsent.
    unflushed: bool,
    /// The body failed after data that may not have been sent yet; the failure is reported
    /// once the body has waited twice (see [`BROKEN_WAITS`]).
    broke: Option<AttemptError>,
    /// Waits left before `broke` is reported.
    broke_waits: u8,
}

impl UpstreamBody {
    /// The body has ended whole: the lease completes, with the connection if it can be used
    /// again (nothing unread is left on it).
    fn finish(&mut self) {
        let stream = self.inner.finish();
        if let Some(mut lease) = self.lease.take() {
            lease.complete(stream, self.answered_at);
        }
    }

    /// The body failed (`why`: broke off or stalled): the lease reports it, and the
    /// connection is dropped.
    fn break_off(&mut self, why: AttemptError) -> io::Error {
        self.inner.fail();
        if let Some(mut lease) = self.lease.take() {
            lease.failed = Some(why);
        }
        io::Error::other(why)
    }

    /// The body failed here. If the head or data went out since the last wait, the failure is
    /// reported after [`BROKEN_WAITS`] waits: hyper sends what it holds when the body waits, so the client
    /// gets the head and every byte that arrived before it learns of the failure. Without that
    /// wait a body failing at its very first poll (bad bytes arriving just after the head was
    /// read) would end the connection with the head still buffered: a bare close, no status.
    fn broken(
        &mut self,
        cx: &mut Context<'_>,
        why: AttemptError,
    ) -> Poll<Option<io::Result<Frame<Bytes>>>> {
        if self.unflushed {
            self.broke = Some(why);
            self.broke_waits = BROKEN_WAITS - 1;
            cx.waker().wake_by_ref();
            return Poll::Pending;
        }
        Poll::Ready(Some(Err(self.break_off(why))))
    }

    fn poll_next(&mut self, cx: &mut Context<'_>) -> Poll<Option<io::Result<Frame<Bytes>>>> {
        let polled = self.poll_step(cx);
        match &polled {
            Poll::Ready(Some(Ok(_))) => self.unflushed = true,
            Poll::Pending => self.unflushed = false,
            _ => {}
        }
        polled
    }

    fn poll_step(&mut self, cx: &mut Context<'_>) -> Poll<Option<io::Result<Frame<Bytes>>>> {
        if let Some(why) = self.broke {
            if self.broke_waits > 0 {
                self.broke_waits -= 1;
                cx.waker().wake_by_ref();
                return Poll::Pending;
            }
            return Poll::Ready(Some(Err(self.break_off(why))));
        }
        if self.inner.is_done() {
            return Poll::Ready(None);
        }
        match std::task::ready!(self.inner.poll_data(cx)) {
            Ok(Some(data)) => {
                if self.inner.is_done() {
                    self.finish();
                }
                Poll::Ready(Some(Ok(Frame::data(data))))
            }
            Ok(None) => {
                self.finish();
                Poll::Ready(None)
            }
            Err(why) => self.broken(cx, why),
        }
    }
}

/// What a gRPC answer's body still decides: the call's status, from its trailers.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Grpc {
    /// Not a gRPC answer (or its status came in the head): judged as it stands.
    No,
    /// A gRPC answer whose `grpc-status` is still to come, in the trailers.
    Pending,
}

/// An HTTP/2 backend's response body, relayed frame by frame: data, then the trailers (which
/// hyper's server sends to an HTTP/2 client as trailers, and to an HTTP/1.1 client in the
/// last chunk when it asked with `TE: trailers`). The lease is judged when the body ends: the
/// answer's status, or for a gRPC call the `grpc-status` of its trailers (a gRPC answer that
/// ends without one is INTERNAL, 13, as gRPC clients take it); a body the backend resets is
/// `BodyBroken`, one it sends nothing of for `body_idle` while capataz waits is `BodyStalled`.
pub struct H2RespBody {
    inner: Incoming,
    /// `None` once the body has ended or failed.
    lease: Option<Lease>,
    grpc: Grpc,
    body_idle: Duration,
    /// The idle timer, created the first time the body waits and reset at each later wait.
    idle: Option<Pin<Box<tokio::time::Sleep>>>,
    /// Whether the body is waiting for the backend (its idle timer runs).
    waiting: bool,
    /// Whether the head or data went out since the last `Pending` (see `UpstreamBody`).
    unflushed: bool,
    /// A failure kept for a later poll, once what hyper holds has gone out.
    broke: Option<AttemptError>,
    /// Waits left before `broke` is reported (see [`BROKEN_WAITS`]).
    broke_waits: u8,
}

impl RespBody {
    /// The body of an HTTP/2 backend's answer; `grpc` says whether a `grpc-status` is still
    /// to come in its trailers. The lease was told the answer's outcome as of its head.
    pub fn h2(inner: Incoming, lease: Lease, grpc: Grpc, body_idle: Duration) -> RespBody {
        let mut body = H2RespBody {
            inner,
            lease: Some(lease),
            grpc,
            body_idle,
            idle: None,
            waiting: false,
            unflushed: true,
            broke: None,
            broke_waits: 0,
        };
        if body.inner.is_end_stream() {
            body.end();
            return RespBody::Full(None);
        }
        RespBody::H2(Box::new(body))
    }
}

/// The `grpc-status` of a head or trailers, if there is one: a value that is not a number
/// within 0-255 is UNKNOWN (2), as gRPC clients read it.
pub fn grpc_status(headers: &http::HeaderMap) -> Option<u8> {
    let value = headers.get("grpc-status")?;
    Some(capataz_health::parse_grpc_status(value.as_bytes()).unwrap_or(2))
}

impl H2RespBody {
    /// The body ended whole: the lease is judged and released.
    fn end(&mut self) {
        if let Some(mut lease) = self.lease.take() {
            if self.grpc == Grpc::Pending {
                // A gRPC answer without a status: INTERNAL.
                lease.judge_at_end(Outcome::Grpc(13));
            }
        }
    }

    /// The body failed with `why`: the lease reports it.
    fn fail(&mut self, why: AttemptError) -> io::Error {
        if let Some(mut lease) = self.lease.take() {
            lease.failed = Some(why);
        }
        io::Error::other(why)
    }

    /// As `UpstreamBody::broken`: a failure right after the head or data is reported on the
    /// next poll, so the client gets what arrived before it learns of the failure.
    fn broken(
        &mut self,
        cx: &mut Context<'_>,
        why: AttemptError,
    ) -> Poll<Option<io::Result<Frame<Bytes>>>> {
        if self.unflushed {
            self.broke = Some(why);
            self.broke_waits = BROKEN_WAITS - 1;
            cx.waker().wake_by_ref();
            return Poll::Pending;
        }
        Poll::Ready(Some(Err(self.fail(why))))
    }

    fn poll_next(&mut self, cx: &mut Context<'_>) -> Poll<Option<io::Result<Frame<Bytes>>>> {
        let polled = self.poll_step(cx);
        match &polled {
            Poll::Ready(Some(Ok(_))) => self.unflushed = true,
            Poll::Pending => self.unflushed = false,
            _ => {}
        }
        polled
    }

    fn poll_step(&mut self, cx: &mut Context<'_>) -> Poll<Option<io::Result<Frame<Bytes>>>> {
        if self.broke.is_some() && self.broke_waits > 0 {
            self.broke_waits -= 1;
            cx.waker().wake_by_ref();
            return Poll::Pending;
        }
        if let Some(why) = self.broke.take() {
            return Poll::Ready(Some(Err(self.fail(why))));
        }
        if self.lease.is_none() {
            return Poll::Ready(None);
        }
        match Pin::new(&mut self.inner).poll_frame(cx) {
            Poll::Ready(Some(Ok(frame))) => {
                self.waiting = false;
                if let Some(trailers) = frame.trailers_ref() {
                    if self.grpc == Grpc::Pending {
                        if let (Some(code), Some(lease)) = (grpc_status(trailers), &mut self.lease)
                        {
                            lease.judge_at_end(Outcome::Grpc(code));
                            self.grpc = Grpc::No;
                        }
                    }
                }
                if self.inner.is_end_stream() {
                    self.end();
                }
                Poll::Ready(Some(Ok(frame)))
            }
            Poll::Ready(None) => {
                self.end();
                Poll::Ready(None)
            }
            Poll::Ready(Some(Err(error))) => {
                let why = upstream::classify_h2(&error, Phase::Body);
                self.broken(cx, why)
            }
            Poll::Pending => {
                if !self.waiting {
                    self.waiting = true;
                    let deadline = tokio::time::Instant::now() + self.body_idle;
                    match &mut self.idle {
                        Some(sleep) => sleep.as_mut().reset(deadline),
                        None => self.idle = Some(Box::pin(tokio::time::sleep_until(deadline))),
                    }
                }
                let stalled = self
                    .idle
                    .as_mut()
                    .is_some_and(|sleep| sleep.as_mut().poll(cx).is_ready());
                if stalled {
                    return self.broken(cx, AttemptError::BodyStalled);
                }
                Poll::Pending
            }
        }
    }
}

impl RespBody {
    /// How long a client may leave this body's next frame untaken (HTTP/2 streams, see
    /// `downstream/stall.rs`): its pool's `timeouts.body_idle` while it holds a backend's answer,
    /// `None` for capataz's own.
    pub fn client_idle(&self) -> Option<Duration> {
        match self {
            RespBody::Upstream(body) => Some(body.inner.body_idle()),
            RespBody::H2(body) => Some(body.body_idle),
            RespBody::Full(_) => None,
            RespBody::Whole(_, body_idle) => Some(*body_idle),
            RespBody::Logged(body) => body.inner.client_idle(),
        }
    }
}

impl Body for RespBody {
    type Data = Bytes;
    type Error = io::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, io::Error>>> {
        match self.get_mut() {
            RespBody::Upstream(body) => body.poll_next(cx),
            RespBody::H2(body) => body.poll_next(cx),
            RespBody::Full(bytes) | RespBody::Whole(bytes, _) => {
                Poll::Ready(bytes.take().map(|b| Ok(Frame::data(b))))
            }
            RespBody::Logged(body) => body.poll_next(cx),
        }
    }

    fn is_end_stream(&self) -> bool {
        match self {
            RespBody::Upstream(body) => body.inner.is_done(),
            RespBody::H2(body) => body.lease.is_none() || body.inner.is_end_stream(),
            RespBody::Full(bytes) | RespBody::Whole(bytes, _) => bytes.is_none(),
            RespBody::Logged(body) => body.inner.is_end_stream(),
        }
    }

    fn size_hint(&self) -> SizeHint {
        match self {
            RespBody::Upstream(body) => match body.inner.remaining() {
                Some(n) => SizeHint::with_exact(n),
                None => SizeHint::default(),
            },
            RespBody::H2(body) => body.inner.size_hint(),
            RespBody::Full(Some(bytes)) | RespBody::Whole(Some(bytes), _) => {
                SizeHint::with_exact(bytes.len() as u64)
            }
            RespBody::Full(None) | RespBody::Whole(None, _) => SizeHint::with_exact(0),
            RespBody::Logged(body) => body.inner.size_hint(),
        }
    }
}
