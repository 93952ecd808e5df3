//! A client's request body as the proxy takes it: hyper's (HTTP/1.x and HTTP/2 clients) or a
//! stream of frames from another server (HTTP/3, whose streams are not hyper's).
//!
//! The other server's body never fails: a client that goes away mid-body is that server's to
//! see, and it drops the request (its future) as hyper does for an HTTP/2 stream reset, so
//! nothing is charged to a backend and the access log blames the client. Until then such a
//! body just waits ([`Poll::Pending`]).

use std::convert::Infallible;
use std::pin::Pin;
use std::task::{Context, Poll};

use bytes::Bytes;
use hyper::body::{Body, Frame, Incoming, SizeHint};

/// A request body from another server than hyper's: boxed, one allocation per request that
/// has a body.
pub type StreamedBody = Pin<Box<dyn Body<Data = Bytes, Error = Infallible> + Send + Sync>>;

/// A client's request body.
pub enum ClientBody {
    /// hyper's: an HTTP/1.x or HTTP/2 client's.
    Hyper(Incoming),
    /// Another server's (HTTP/3), which never fails (see the module documentation).
    Streamed(StreamedBody),
    /// An HTTP/2 stream's, served by h2 directly: never fails either (see [`H2Body`]).
    H2(H2Body),
    /// No body at all.
    Empty,
}

impl std::fmt::Debug for ClientBody {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ClientBody::Hyper(body) => body.fmt(f),
            ClientBody::Streamed(_) => f.write_str("Streamed"),
            ClientBody::H2(_) => f.write_str("H2"),
            ClientBody::Empty => f.write_str("Empty"),
        }
    }
}

impl Body for ClientBody {
    type Data = Bytes;
    type Error = hyper::Error;

    #[inline]
    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, hyper::Error>>> {
        match self.get_mut() {
            ClientBody::Hyper(body) => Pin::new(body).poll_frame(cx),
            ClientBody::Streamed(body) => match body.as_mut().poll_frame(cx) {
                Poll::Ready(Some(Ok(frame))) => Poll::Ready(Some(Ok(frame))),
                Poll::Ready(Some(Err(never))) => match never {},
                Poll::Ready(None) => Poll::Ready(None),
                Poll::Pending => Poll::Pending,
            },
            ClientBody::H2(body) => body.poll_frame(cx),
            ClientBody::Empty => Poll::Ready(None),
        }
    }

    #[inline]
    fn is_end_stream(&self) -> bool {
        match self {
            ClientBody::Hyper(body) => body.is_end_stream(),
            ClientBody::Streamed(body) => body.is_end_stream(),
            ClientBody::H2(body) => body.recv.is_end_stream(),
            ClientBody::Empty => true,
        }
    }

    #[inline]
    fn size_hint(&self) -> SizeHint {
        match self {
            ClientBody::Hyper(body) => body.size_hint(),
            ClientBody::Streamed(body) => body.size_hint(),
            ClientBody::H2(body) => body.size_hint(),
            ClientBody::Empty => SizeHint::with_exact(0),
        }
    }
}

/// An HTTP/2 stream's request body, read from h2 directly. Every chunk read is given back to
/// the client's flow-control window at once (what is read is forwarded). It never fails, as
/// [`StreamedBody`]: a stream reset (by the client, or by h2 for a malformed body) or a failed
/// connection ends the stream's task, which drops the request; until then it waits.
pub struct H2Body {
    recv: h2::RecvStream,
    /// The `content-length` the client announced (h2 checks the body against it).
    length: Option<u64>,
    /// The data is done: trailers next.
    data_done: bool,
}

impl H2Body {
    /// The body of a request whose `content-length` says `length`.
    pub fn new(recv: h2::RecvStream, length: Option<u64>) -> H2Body {
        let length = if recv.is_end_stream() {
            Some(0)
        } else {
            length
        };
        H2Body {
            recv,
            length,
            data_done: false,
        }
    }

    fn size_hint(&self) -> SizeHint {
        match self.length {
            Some(length) => SizeHint::with_exact(length),
            None => SizeHint::default(),
        }
    }

    fn poll_frame(
        &mut self,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, hyper::Error>>> {
        if !self.data_done {
            match self.recv.poll_data(cx) {
                Poll::Pending => return Poll::Pending,
                Poll::Ready(Some(Ok(data))) => {
                    let _ = self.recv.flow_control().release_capacity(data.len());
                    if let Some(length) = &mut self.length {
                        *length = length.saturating_sub(data.len() as u64);
                    }
                    return Poll::Ready(Some(Ok(Frame::data(data))));
                }
                Poll::Ready(Some(Err(error))) => return Self::failed(&error),
                Poll::Ready(None) => self.data_done = true,
            }
        }
        match self.recv.poll_trailers(cx) {
            Poll::Pending => Poll::Pending,
            Poll::Ready(Ok(trailers)) => Poll::Ready(trailers.map(|t| Ok(Frame::trailers(t)))),
            Poll::Ready(Err(error)) => Self::failed(&error),
        }
    }

    /// A reset with `NO_ERROR` ends the body early (RFC 9113 8.1: the answer came first);
    /// anything else ends the stream's task, which drops the request: wait for it.
    fn failed(error: &h2::Error) -> Poll<Option<Result<Frame<Bytes>, hyper::Error>>> {
        if error.reason() == Some(h2::Reason::NO_ERROR) {
            Poll::Ready(None)
        } else {
            Poll::Pending
        }
    }
}
