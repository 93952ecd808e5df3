//! The seam between HTTP/1.1 and the bytes' carrier: everything above it (`exchange`, the
//! response body's reading, the reuse check, the tunnel) runs over any [`Transport`], and the
//! framing below it (`h1`) sees only bytes. TCP is the one transport today
//! ([`BackendStream`]); TLS or a Unix socket is a new implementation here and a new
//! `BackendStream`, with no change to framing.

use std::io;
use std::task::{Context, Poll};

use bytes::BytesMut;
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::TcpStream;

/// The connections capataz holds to backends: what `Upstream` connects and keeps idle.
pub type BackendStream = TcpStream;

/// A byte stream to a backend, with what the HTTP/1.1 client needs beyond reading and writing.
pub trait Transport: AsyncRead + AsyncWrite + Unpin + Send + 'static {
    /// The reading half of a borrowed split.
    type ReadHalf<'a>: AsyncRead + Unpin + Send
    where
        Self: 'a;
    /// The writing half of a borrowed split.
    type WriteHalf<'a>: AsyncWrite + Unpin + Send
    where
        Self: 'a;

    /// Splits the stream so that a request body is written while the answer is read.
    fn split(&mut self) -> (Self::ReadHalf<'_>, Self::WriteHalf<'_>);

    /// Reads what has arrived into `buf`'s spare capacity (the caller reserves it):
    /// `Ready(Ok(0))` at the end of the stream, `Pending` (with the waker registered) when
    /// nothing has arrived.
    fn poll_read_buf(
        &mut self,
        cx: &mut Context<'_>,
        buf: &mut BytesMut,
    ) -> Poll<io::Result<usize>>;

    /// Whether an idle connection is still usable: open, and nothing unread on it (a backend
    /// that sent bytes nobody asked for makes it unusable). Never waits; a connection found
    /// unusable is dropped, so what this reads is lost.
    fn still_open(&mut self) -> bool;
}

impl Transport for TcpStream {
    type ReadHalf<'a> = tokio::net::tcp::ReadHalf<'a>;
    type WriteHalf<'a> = tokio::net::tcp::WriteHalf<'a>;

    fn split(&mut self) -> (Self::ReadHalf<'_>, Self::WriteHalf<'_>) {
        TcpStream::split(self)
    }

    /// Reads straight into the buffer: no syscall while the socket is not reported readable.
    #[inline]
    fn poll_read_buf(
        &mut self,
        cx: &mut Context<'_>,
        buf: &mut BytesMut,
    ) -> Poll<io::Result<usize>> {
        loop {
            match self.try_read_buf(buf) {
                Ok(n) => return Poll::Ready(Ok(n)),
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                    std::task::ready!(self.poll_read_ready(cx))?;
                }
                Err(e) => return Poll::Ready(Err(e)),
            }
        }
    }

    /// No syscall unless the socket was reported readable.
    fn still_open(&mut self) -> bool {
        let mut byte = [0u8; 1];
        matches!(self.try_read(&mut byte), Err(e) if e.kind() == io::ErrorKind::WouldBlock)
    }
}
