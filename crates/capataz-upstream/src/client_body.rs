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
    /// No body at all.
    Empty,
}

impl std::fmt::Debug for ClientBody {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ClientBody::Hyper(body) => body.fmt(f),
            ClientBody::Streamed(_) => f.write_str("Streamed"),
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
            ClientBody::Empty => Poll::Ready(None),
        }
    }

    #[inline]
    fn is_end_stream(&self) -> bool {
        match self {
            ClientBody::Hyper(body) => body.is_end_stream(),
            ClientBody::Streamed(body) => body.is_end_stream(),
            ClientBody::Empty => true,
        }
    }

    #[inline]
    fn size_hint(&self) -> SizeHint {
        match self {
            ClientBody::Hyper(body) => body.size_hint(),
            ClientBody::Streamed(body) => body.size_hint(),
            ClientBody::Empty => SizeHint::with_exact(0),
        }
    }
}
