//! The bodies that flow through the proxy, both ways, streamed frame by frame.
//!
//! `RespBody` also carries the lease on the backend: the in-flight count is released and the
//! keep-alive connection handed back when the response has been read to its end, and the
//! connection is dropped instead if the client went away before that. The lease also judges
//! the answer for the passive checks once the body has ended: its status if the body arrived
//! whole, a reset if it was cut short (the client already has the headers, so no retry can hide
//! it, and a backend doing this to every response must still be ejected).

use std::pin::Pin;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Instant;

use bytes::Bytes;
use capataz_health::Outcome;
use hyper::body::{Body, Frame, Incoming, SizeHint};
use hyper::client::conn::http1::SendRequest;

use crate::health::{BackendRt, PoolRt};

/// A request body on its way to a backend.
#[derive(Debug)]
pub enum ReqBody {
    /// The client's body, streamed.
    Incoming(Incoming),
    /// No body (a retry of a bodiless request).
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
    backend: Arc<BackendRt>,
    /// The connection, and when its response arrived.
    sender: Option<(SendRequest<ReqBody>, Instant)>,
    complete: bool,
    /// The answer to report to the passive checks when the lease ends: the pool, the backend's
    /// index in it, and the answer's status.
    verdict: Option<(Arc<PoolRt>, usize, Outcome)>,
    /// Whether the body broke before its end.
    broken: bool,
}

impl Lease {
    /// Takes an in-flight slot on `backend`.
    pub(crate) fn new(backend: Arc<BackendRt>) -> Lease {
        backend.in_flight.fetch_add(1, Ordering::Relaxed);
        Lease {
            backend,
            sender: None,
            complete: false,
            verdict: None,
            broken: false,
        }
    }

    pub(crate) fn backend(&self) -> &Arc<BackendRt> {
        &self.backend
    }

    pub(crate) fn set_sender(&mut self, sender: SendRequest<ReqBody>, answered_at: Instant) {
        self.sender = Some((sender, answered_at));
    }

    /// Reports `answer` for backend `index` of `pool` when the lease ends: as is if the body
    /// ended whole or the client went away, as [`Outcome::Reset`] if the body broke.
    pub(crate) fn judge_at_end(&mut self, pool: Arc<PoolRt>, index: usize, answer: Outcome) {
        self.verdict = Some((pool, index, answer));
    }
}

impl Drop for Lease {
    fn drop(&mut self) {
        self.backend.in_flight.fetch_sub(1, Ordering::Relaxed);
        if let Some((pool, index, answer)) = self.verdict.take() {
            pool.observe(index, if self.broken { Outcome::Reset } else { answer });
        }
        if self.complete {
            if let Some((sender, answered_at)) = self.sender.take() {
                self.backend.upstream.release(sender, answered_at);
            }
        }
    }
}

/// A response body on its way to a client.
pub enum RespBody {
    /// A backend's body, with the lease it holds.
    Upstream(Incoming, Option<Lease>),
    /// A body capataz wrote itself (an error page).
    Full(Option<Bytes>),
}

impl RespBody {
    /// A short plain-text body.
    pub fn text(text: impl Into<Bytes>) -> RespBody {
        RespBody::Full(Some(text.into()))
    }

    pub(crate) fn upstream(body: Incoming, mut lease: Lease) -> RespBody {
        if body.is_end_stream() {
            // Nothing to stream: the connection is ready again now.
            lease.complete = true;
            drop(lease);
            return RespBody::Upstream(body, None);
        }
        RespBody::Upstream(body, Some(lease))
    }
}

impl Body for RespBody {
    type Data = Bytes;
    type Error = hyper::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, hyper::Error>>> {
        match self.get_mut() {
            RespBody::Upstream(body, lease) => {
                let polled = Pin::new(&mut *body).poll_frame(cx);
                match &polled {
                    // hyper stops polling once a sized body has delivered its last byte, so the
                    // end is detected after each frame, not only at `None`.
                    Poll::Ready(None) | Poll::Ready(Some(Ok(_))) if body.is_end_stream() => {
                        if let Some(mut lease) = lease.take() {
                            lease.complete = true;
                        }
                    }
                    Poll::Ready(Some(Err(_))) => {
                        // A broken response: the connection is not reused, and it counts as a
                        // reset.
                        if let Some(mut lease) = lease.take() {
                            lease.broken = true;
                        }
                    }
                    _ => {}
                }
                polled
            }
            RespBody::Full(bytes) => Poll::Ready(bytes.take().map(|b| Ok(Frame::data(b)))),
        }
    }

    fn is_end_stream(&self) -> bool {
        match self {
            RespBody::Upstream(body, _) => body.is_end_stream(),
            RespBody::Full(bytes) => bytes.is_none(),
        }
    }

    fn size_hint(&self) -> SizeHint {
        match self {
            RespBody::Upstream(body, _) => body.size_hint(),
            RespBody::Full(Some(bytes)) => SizeHint::with_exact(bytes.len() as u64),
            RespBody::Full(None) => SizeHint::with_exact(0),
        }
    }
}
