//! An HTTP/3 request's body as the proxy reads it: the stream's DATA frames, then its
//! trailers. It never fails: a stream the client resets, a connection that closes, or a body
//! that breaks its own `Content-Length` (more bytes, or fewer before its end) tells the
//! request's task (`Gone`), which drops the request as a client going away; the body itself
//! just waits from then on.

use std::convert::Infallible;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use bytes::{Buf, Bytes};
use h3::server::RequestStream;
use hyper::body::{Body, Frame, SizeHint};
use tokio::sync::Notify;

/// The receiving half of a request stream.
pub(super) type RecvStream = RequestStream<super::capped::RecvStream, Bytes>;

/// Where the body is.
enum Stage {
    /// Reading DATA frames.
    Data,
    /// The data ended: reading the trailers, if any.
    Trailers,
    /// Ended, trailers and all.
    Done,
    /// The client went away or broke the framing: told, and waiting forever.
    Gone,
}

/// An HTTP/3 request body (see the module documentation).
pub(super) struct H3Body {
    recv: RecvStream,
    /// Bytes read ahead of the proxy (the first DATA frame, read to learn whether the request
    /// had a body at all).
    first: Option<Bytes>,
    stage: Stage,
    /// What `Content-Length` still announces, if it was given.
    remaining: Option<u64>,
    /// Told when the client went away.
    gone: Arc<Notify>,
}

impl H3Body {
    pub(super) fn new(
        recv: RecvStream,
        first: Option<Bytes>,
        length: Option<u64>,
        gone: Arc<Notify>,
    ) -> H3Body {
        H3Body {
            recv,
            first: None,
            stage: Stage::Data,
            remaining: length,
            gone,
        }
        .with_first(first)
    }

    fn with_first(mut self, first: Option<Bytes>) -> H3Body {
        if let Some(first) = first {
            if self.take(first.len()) {
                self.first = Some(first);
            }
        }
        self
    }

    /// Counts `n` bytes against `Content-Length`; false (and the client told gone) when they
    /// are more than it announced.
    fn take(&mut self, n: usize) -> bool {
        if let Some(remaining) = &mut self.remaining {
            match remaining.checked_sub(n as u64) {
                Some(left) => *remaining = left,
                None => {
                    self.give_up();
                    return false;
                }
            }
        }
        true
    }

    fn give_up(&mut self) {
        self.stage = Stage::Gone;
        self.recv
            .stop_sending(h3::error::Code::H3_REQUEST_CANCELLED);
        self.gone.notify_one();
    }
}

impl Body for H3Body {
    type Data = Bytes;
    type Error = Infallible;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Infallible>>> {
        let this = self.get_mut();
        if let Some(first) = this.first.take() {
            return Poll::Ready(Some(Ok(Frame::data(first))));
        }
        loop {
            match this.stage {
                Stage::Data => match this.recv.poll_recv_data(cx) {
                    Poll::Pending => return Poll::Pending,
                    Poll::Ready(Ok(Some(mut data))) => {
                        let data = data.copy_to_bytes(data.remaining());
                        if data.is_empty() {
                            continue;
                        }
                        if !this.take(data.len()) {
                            return Poll::Pending;
                        }
                        return Poll::Ready(Some(Ok(Frame::data(data))));
                    }
                    Poll::Ready(Ok(None)) => {
                        if this.remaining.is_some_and(|left| left > 0) {
                            // Ended short of its Content-Length.
                            this.give_up();
                            return Poll::Pending;
                        }
                        this.stage = Stage::Trailers;
                    }
                    Poll::Ready(Err(_)) => {
                        this.give_up();
                        return Poll::Pending;
                    }
                },
                Stage::Trailers => match this.recv.poll_recv_trailers(cx) {
                    Poll::Pending => return Poll::Pending,
                    Poll::Ready(Ok(trailers)) => {
                        this.stage = Stage::Done;
                        return Poll::Ready(trailers.map(|t| Ok(Frame::trailers(t))));
                    }
                    Poll::Ready(Err(_)) => {
                        this.give_up();
                        return Poll::Pending;
                    }
                },
                Stage::Done => return Poll::Ready(None),
                Stage::Gone => return Poll::Pending,
            }
        }
    }

    fn is_end_stream(&self) -> bool {
        matches!(self.stage, Stage::Done) && self.first.is_none()
    }

    fn size_hint(&self) -> SizeHint {
        match self.remaining {
            Some(left) => {
                let first = self.first.as_ref().map_or(0, |b| b.len() as u64);
                SizeHint::with_exact(left + first)
            }
            None => SizeHint::default(),
        }
    }
}
