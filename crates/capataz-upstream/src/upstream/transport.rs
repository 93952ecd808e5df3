//! The seam between HTTP/1.1 and the bytes' carrier: everything above it (`exchange`, the
//! response body's reading, the reuse check, the tunnel) runs over any [`Transport`], and the
//! framing below it (`h1`) sees only bytes. A backend connection ([`BackendStream`]) is TCP,
//! TLS over TCP, or a Unix socket: one more variant here, with no change to framing.
//!
//! The TCP variant costs what a bare `TcpStream` did: one `match` per call, no allocation and
//! no dynamic dispatch; TLS sessions are boxed (one allocation per connection, not per
//! request). With TCP and TLS only, the enum was the size of a TCP stream (the box in its
//! niche); the Unix variant, as large as a TCP stream, adds a tag: one word per backend
//! connection, and no allocation for a Unix one.

use std::io;
use std::os::fd::{AsRawFd, RawFd};
use std::pin::Pin;
use std::task::{Context, Poll};

use bytes::BytesMut;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpStream, UnixStream};
use tokio_rustls::client::TlsStream;

/// A connection to a backend: what `Upstream` connects and keeps idle.
#[derive(Debug)]
pub enum BackendStream {
    /// Plain TCP.
    Tcp(TcpStream),
    /// TLS over TCP (the handshake done).
    Tls(Box<TlsStream<TcpStream>>),
    /// A Unix domain socket (`unix:/path` backends).
    Unix(UnixStream),
}

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

    /// The plain socket's descriptor, for the worker's flusher to send a request head on
    /// (`outbox`); `None` (the default) where the exchange must write itself (TLS).
    fn plain_fd(&self) -> Option<RawFd> {
        None
    }
}

/// `Transport` for a tokio socket stream (`TcpStream`, `UnixStream`: the same inherent
/// methods, in `tokio::net::$module`).
macro_rules! socket_transport {
    ($stream:ident, $module:ident) => {
        impl Transport for $stream {
            type ReadHalf<'a> = tokio::net::$module::ReadHalf<'a>;
            type WriteHalf<'a> = tokio::net::$module::WriteHalf<'a>;

            fn split(&mut self) -> (Self::ReadHalf<'_>, Self::WriteHalf<'_>) {
                $stream::split(self)
            }

            /// Reads straight into the buffer: no syscall while the socket is not reported
            /// readable.
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

            fn plain_fd(&self) -> Option<RawFd> {
                Some(self.as_raw_fd())
            }
        }
    };
}

socket_transport!(TcpStream, tcp);
socket_transport!(UnixStream, unix);

/// The most plaintext one TLS read takes: one record's worth.
const TLS_READ: usize = 16384;

/// Reads a TLS session's plaintext into `buf`'s spare capacity (at most [`TLS_READ`] bytes,
/// and some room is made if there is none). The part read into is zeroed first (the crate
/// has no `unsafe`, and rustls decrypting the record costs far more).
fn tls_read_buf(
    tls: &mut TlsStream<TcpStream>,
    cx: &mut Context<'_>,
    buf: &mut BytesMut,
) -> Poll<io::Result<usize>> {
    let start = buf.len();
    if buf.capacity() == start {
        buf.reserve(TLS_READ);
    }
    let room = (buf.capacity() - start).min(TLS_READ);
    buf.resize(start + room, 0);
    let mut read = ReadBuf::new(&mut buf[start..]);
    let polled = Pin::new(tls).poll_read(cx, &mut read);
    let n = read.filled().len();
    buf.truncate(start + n);
    match polled {
        Poll::Ready(Ok(())) => Poll::Ready(Ok(n)),
        Poll::Ready(Err(e)) => Poll::Ready(Err(e)),
        Poll::Pending => Poll::Pending,
    }
}

/// Whether an idle TLS session is still usable: a read that finds nothing (`Pending`) means
/// open and nothing unread. A `close_notify`, an end of stream, application bytes nobody asked
/// for, or an error all mean not. Records with no application data (a TLS 1.3 session ticket
/// arriving late) are consumed by rustls and leave the session usable. The read is polled with
/// a no-op waker: nothing waits on it, and the next real read registers its own.
fn tls_still_open(tls: &mut TlsStream<TcpStream>) -> bool {
    let mut byte = [0u8; 1];
    let mut read = ReadBuf::new(&mut byte);
    let mut cx = Context::from_waker(std::task::Waker::noop());
    matches!(Pin::new(tls).poll_read(&mut cx, &mut read), Poll::Pending)
}

/// The reading half of a split [`BackendStream`].
pub enum BackendRead<'a> {
    /// Of a TCP stream.
    Tcp(tokio::net::tcp::ReadHalf<'a>),
    /// Of a TLS session (the halves share it through tokio's lock).
    Tls(tokio::io::ReadHalf<&'a mut TlsStream<TcpStream>>),
    /// Of a Unix socket.
    Unix(tokio::net::unix::ReadHalf<'a>),
}

/// The writing half of a split [`BackendStream`].
pub enum BackendWrite<'a> {
    /// Of a TCP stream.
    Tcp(tokio::net::tcp::WriteHalf<'a>),
    /// Of a TLS session.
    Tls(tokio::io::WriteHalf<&'a mut TlsStream<TcpStream>>),
    /// Of a Unix socket.
    Unix(tokio::net::unix::WriteHalf<'a>),
}

impl Transport for BackendStream {
    type ReadHalf<'a> = BackendRead<'a>;
    type WriteHalf<'a> = BackendWrite<'a>;

    fn split(&mut self) -> (BackendRead<'_>, BackendWrite<'_>) {
        match self {
            BackendStream::Tcp(tcp) => {
                let (read, write) = tcp.split();
                (BackendRead::Tcp(read), BackendWrite::Tcp(write))
            }
            BackendStream::Tls(tls) => {
                let (read, write) = tokio::io::split(&mut **tls);
                (BackendRead::Tls(read), BackendWrite::Tls(write))
            }
            BackendStream::Unix(unix) => {
                let (read, write) = unix.split();
                (BackendRead::Unix(read), BackendWrite::Unix(write))
            }
        }
    }

    #[inline]
    fn poll_read_buf(
        &mut self,
        cx: &mut Context<'_>,
        buf: &mut BytesMut,
    ) -> Poll<io::Result<usize>> {
        match self {
            BackendStream::Tcp(tcp) => tcp.poll_read_buf(cx, buf),
            BackendStream::Tls(tls) => tls_read_buf(tls, cx, buf),
            BackendStream::Unix(unix) => unix.poll_read_buf(cx, buf),
        }
    }

    fn still_open(&mut self) -> bool {
        match self {
            BackendStream::Tcp(tcp) => tcp.still_open(),
            BackendStream::Tls(tls) => tls_still_open(tls),
            BackendStream::Unix(unix) => unix.still_open(),
        }
    }

    fn plain_fd(&self) -> Option<RawFd> {
        match self {
            BackendStream::Tcp(tcp) => tcp.plain_fd(),
            BackendStream::Tls(_) => None,
            BackendStream::Unix(unix) => unix.plain_fd(),
        }
    }
}

/// Forwards each `AsyncRead`/`AsyncWrite` call to the variant's stream.
macro_rules! forward_io {
    ($type:ty, $($variant:ident),+) => {
        impl AsyncRead for $type {
            #[inline]
            fn poll_read(
                self: Pin<&mut Self>,
                cx: &mut Context<'_>,
                buf: &mut ReadBuf<'_>,
            ) -> Poll<io::Result<()>> {
                match self.get_mut() {
                    $(Self::$variant(inner) => Pin::new(inner).poll_read(cx, buf),)+
                }
            }
        }
    };
}

/// Forwards each `AsyncWrite` call to the variant's stream.
macro_rules! forward_write {
    ($type:ty, $($variant:ident),+) => {
        impl AsyncWrite for $type {
            #[inline]
            fn poll_write(
                self: Pin<&mut Self>,
                cx: &mut Context<'_>,
                buf: &[u8],
            ) -> Poll<io::Result<usize>> {
                match self.get_mut() {
                    $(Self::$variant(inner) => Pin::new(inner).poll_write(cx, buf),)+
                }
            }

            #[inline]
            fn poll_write_vectored(
                self: Pin<&mut Self>,
                cx: &mut Context<'_>,
                bufs: &[io::IoSlice<'_>],
            ) -> Poll<io::Result<usize>> {
                match self.get_mut() {
                    $(Self::$variant(inner) => Pin::new(inner).poll_write_vectored(cx, bufs),)+
                }
            }

            fn is_write_vectored(&self) -> bool {
                match self {
                    $(Self::$variant(inner) => inner.is_write_vectored(),)+
                }
            }

            fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
                match self.get_mut() {
                    $(Self::$variant(inner) => Pin::new(inner).poll_flush(cx),)+
                }
            }

            fn poll_shutdown(
                self: Pin<&mut Self>,
                cx: &mut Context<'_>,
            ) -> Poll<io::Result<()>> {
                match self.get_mut() {
                    $(Self::$variant(inner) => Pin::new(inner).poll_shutdown(cx),)+
                }
            }
        }
    };
}

forward_io!(BackendStream, Tcp, Tls, Unix);
forward_write!(BackendStream, Tcp, Tls, Unix);
forward_io!(BackendRead<'_>, Tcp, Tls, Unix);
forward_write!(BackendWrite<'_>, Tcp, Tls, Unix);
