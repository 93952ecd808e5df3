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

use std::pin::Pin;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use std::io;

use bytes::{Bytes, BytesMut};
use capataz_health::Outcome;
use hyper::body::{Body, Frame, Incoming, SizeHint};

use crate::balance::PoolHandle;
use crate::h1::framing::Framing;
use crate::upstream::{AttemptError, BackendStream, PrivateIdle, ResponseStream};

/// A request body on its way to a backend.
#[derive(Debug, Default)]
pub enum ReqBody {
    /// The client's body, streamed.
    Incoming(Incoming),
    /// No body (a retry of a bodiless request).
    #[default]
    Empty,
}

impl Body for ReqBody {
    type Data = Bytes;
    type Error = hyper::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, hyper::Error>>> {
        match self.get_mut() {
            ReqBody::Incoming(body) => Pin::new(body).poll_frame(cx),
            ReqBody::Empty => Poll::Ready(None),
        }
    }

    fn is_end_stream(&self) -> bool {
        match self {
            ReqBody::Incoming(body) => body.is_end_stream(),
            ReqBody::Empty => true,
        }
    }

    fn size_hint(&self) -> SizeHint {
        match self {
            ReqBody::Incoming(body) => body.size_hint(),
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
}

impl Lease {
    /// Takes an in-flight slot on backend `index` of `pool`; a reusable connection goes back
    /// to `private` if given, else to the backend's shared set.
    pub(crate) fn new(
        pool: Arc<PoolHandle>,
        index: usize,
        private: Option<Arc<PrivateIdle>>,
    ) -> Lease {
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
        }
    }

    /// The client connection's own idle set, under the private reuse policy.
    pub(crate) fn private(&self) -> Option<&PrivateIdle> {
        self.private.as_deref()
    }

    /// The body has ended whole: `sender`, the connection if it may carry another request,
    /// goes back when the lease ends.
    fn complete(&mut self, sender: Option<BackendStream>, answered_at: Instant) {
        self.sender = sender.map(|sender| (sender, answered_at));
    }

    /// Reports `answer` for the backend when the lease ends: as is if the body ended whole or
    /// the client went away, as the failure's outcome if the body failed.
    pub(crate) fn judge_at_end(&mut self, answer: Outcome) {
        self.verdict = Some(answer);
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
                self.pool.observe(self.index, outcome);
            }
        }
        if let Some((sender, answered_at)) = self.sender.take() {
            backend
                .upstream
                .release(sender, answered_at, self.private.as_deref());
        }
    }
}

/// A response body on its way to a client.
// One per response in flight, moved once: boxing the large variant would cost an allocation
// per response for nothing.
#[allow(clippy::large_enum_variant)]
pub enum RespBody {
    /// A backend's body, with the lease it holds.
    Upstream(UpstreamBody),
    /// A body capataz wrote itself (an error page).
    Full(Option<Bytes>),
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
    pub(crate) fn upstream(
        stream: BackendStream,
        buf: BytesMut,
        framing: Framing,
        mut lease: Lease,
        answered_at: Instant,
        body_idle: Duration,
    ) -> RespBody {
        let mut inner = ResponseStream::new(stream, buf, framing, body_idle);
        if inner.is_done() {
            // Nothing to stream: the connection is ready again now.
            lease.complete(inner.finish(), answered_at);
            drop(lease);
            return RespBody::Full(None);
        }
        RespBody::Upstream(UpstreamBody {
            inner,
            answered_at,
            lease: Some(lease),
            // The head: hyper has it buffered, and sends it only once the body waits.
            unflushed: true,
            broke: None,
        })
    }
}

/// A backend's response body, read straight from its connection, with the lease it holds.
pub struct UpstreamBody {
    inner: ResponseStream<BackendStream>,
    answered_at: Instant,
    lease: Option<Lease>,
    /// Whether the head or data went out since the last `Pending` (true before the first
    /// poll): hyper may still hold it unsent.
    unflushed: bool,
    /// The body failed after data that may not have been sent yet; the failure is reported
    /// on the next poll.
    broke: Option<AttemptError>,
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
        io::Error::other(why.to_string())
    }

    /// The body failed here. If the head or data went out since the last wait, the failure is
    /// reported on the next poll: hyper sends what it holds when the body waits, so the client
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

impl Body for RespBody {
    type Data = Bytes;
    type Error = io::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, io::Error>>> {
        match self.get_mut() {
            RespBody::Upstream(body) => body.poll_next(cx),
            RespBody::Full(bytes) => Poll::Ready(bytes.take().map(|b| Ok(Frame::data(b)))),
        }
    }

    fn is_end_stream(&self) -> bool {
        match self {
            RespBody::Upstream(body) => body.inner.is_done(),
            RespBody::Full(bytes) => bytes.is_none(),
        }
    }

    fn size_hint(&self) -> SizeHint {
        match self {
            RespBody::Upstream(body) => match body.inner.remaining() {
                Some(n) => SizeHint::with_exact(n),
                None => SizeHint::default(),
            },
            RespBody::Full(Some(bytes)) => SizeHint::with_exact(bytes.len() as u64),
            RespBody::Full(None) => SizeHint::with_exact(0),
        }
    }
}
