//! Reading a PROXY protocol header off a connection: [`read_header`] reads what arrives (never
//! more than [`MAX_HEADER`] bytes), and [`Rewind`] hands the bytes that came after the header,
//! in the same reads, to whoever reads the connection next (TLS or HTTP).

use std::io;
use std::pin::Pin;
use std::task::{Context, Poll};

use bytes::{Buf, Bytes};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, ReadBuf};

use super::{parse, Header, ParseError, Parsed, MAX_HEADER};

/// Why no header was read.
#[derive(Debug, thiserror::Error)]
pub enum ReadError {
    /// The bytes are not an acceptable header.
    #[error(transparent)]
    Parse(#[from] ParseError),
    /// The peer closed before a whole header arrived.
    #[error("the connection closed before its PROXY protocol header ended")]
    Closed,
    /// Reading failed.
    #[error("reading the PROXY protocol header: {0}")]
    Io(#[from] io::Error),
}

/// Reads the header `stream` starts with. Returns it with the bytes read past it (the start of
/// the connection's own data, often empty). The caller bounds the wait (a deadline around this
/// future): a peer that sends half a header and stops is the caller's to drop.
pub async fn read_header<S: AsyncRead + Unpin>(
    stream: &mut S,
) -> Result<(Header, Bytes), ReadError> {
    let mut buf = vec![0u8; MAX_HEADER];
    let mut filled = 0;
    loop {
        // `parse` never answers Incomplete once MAX_HEADER bytes are there, so this is never
        // a read into an empty slice.
        let n = stream.read(&mut buf[filled..]).await?;
        if n == 0 {
            return Err(ReadError::Closed);
        }
        filled += n;
        match parse(&buf[..filled])? {
            Parsed::Header(header) => {
                // A copy of what follows the header (often nothing), so that the buffer is not
                // kept for the connection's life.
                let rest = Bytes::copy_from_slice(&buf[header.length..filled]);
                return Ok((header, rest));
            }
            Parsed::Incomplete if filled < MAX_HEADER => continue,
            Parsed::Incomplete => return Err(ParseError::TooLong.into()),
        }
    }
}

/// A connection whose first bytes were already read: reads give `prefix` first, then the
/// connection's. Writes go straight through.
#[derive(Debug)]
pub struct Rewind<S> {
    prefix: Bytes,
    inner: S,
}

impl<S> Rewind<S> {
    /// `inner`, with `prefix` to be read before it.
    pub fn new(prefix: Bytes, inner: S) -> Rewind<S> {
        Rewind { prefix, inner }
    }

    /// The connection under it.
    pub fn get_ref(&self) -> &S {
        &self.inner
    }

    /// How many bytes of the prefix are still to be read.
    pub fn unread(&self) -> usize {
        self.prefix.len()
    }
}

impl<S: AsyncRead + Unpin> AsyncRead for Rewind<S> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        if !self.prefix.is_empty() {
            let n = self.prefix.len().min(buf.remaining());
            buf.put_slice(&self.prefix[..n]);
            self.prefix.advance(n);
            return Poll::Ready(Ok(()));
        }
        Pin::new(&mut self.inner).poll_read(cx, buf)
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for Rewind<S> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.inner).poll_write(cx, buf)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.inner).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }
}
