//! A vectored write of one buffer goes to the socket as a plain write.
//!
//! h2 writes its frame buffer through tokio-util's `poll_write_buf`, which calls
//! `poll_write_vectored` whenever the I/O says it writes vectored, and rustls writes its queue
//! of TLS records with `write_vectored` always. Almost every such write to a client carries
//! one buffer (h2's frames are encoded into one buffer; a DATA payload of 256 bytes or more is
//! chained behind it as a second slice; one record per h2 write over TLS), and the kernel's
//! `writev` of one slice costs more than a `send` of it: it imports the iovec and goes through
//! the VFS layers (`vfs_writev`, the file checks, fsnotify) before reaching the socket, as a
//! `send` does directly. HTTP/1.1 answers already go out as one `send` (hyper's
//! `writev(false)`, `downstream/mod.rs`). So: one non-empty slice is written with
//! `poll_write` (a `send` on a TCP socket), two or more stay one `writev` (no copy of a large
//! chained payload). See BENCHMARKS.md, "HTTP/2: where the instructions go".

use std::io;
use std::pin::Pin;
use std::task::{Context, Poll};

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

use super::gone::PeekPeer;

/// `bufs` written to `io`: a single non-empty slice by `poll_write`, several by
/// `poll_write_vectored`. Empty slices are skipped as tokio's default `poll_write_vectored`
/// skips them; with none non-empty, an empty `poll_write`, as there.
pub(super) fn poll_write_vectored<W: AsyncWrite + ?Sized>(
    io: Pin<&mut W>,
    cx: &mut Context<'_>,
    bufs: &[io::IoSlice<'_>],
) -> Poll<io::Result<usize>> {
    let mut filled = bufs.iter().filter(|buf| !buf.is_empty());
    match (filled.next(), filled.next()) {
        (None, _) => io.poll_write(cx, &[]),
        (Some(one), None) => io.poll_write(cx, one),
        (Some(_), Some(_)) => io.poll_write_vectored(cx, bufs),
    }
}

/// A TLS connection's socket under rustls, whose record writes go through
/// [`poll_write_vectored`] (the plaintext side is `CountingIo`'s).
pub(crate) struct FlatWrites<IO>(pub(crate) IO);

impl<IO: AsyncRead + Unpin> AsyncRead for FlatWrites<IO> {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().0).poll_read(cx, buf)
    }
}

impl<IO: AsyncWrite + Unpin> AsyncWrite for FlatWrites<IO> {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.get_mut().0).poll_write(cx, buf)
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        poll_write_vectored(Pin::new(&mut self.get_mut().0), cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.0.is_write_vectored()
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().0).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().0).poll_shutdown(cx)
    }
}

impl<IO: PeekPeer> PeekPeer for FlatWrites<IO> {
    fn poll_peek_peer(&self, cx: &mut Context<'_>) -> Poll<io::Result<usize>> {
        self.0.poll_peek_peer(cx)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::future::poll_fn;

    /// Records how each write came: `(vectored, slices, bytes)`; takes everything.
    #[derive(Default)]
    struct Recorder(Vec<(bool, usize, usize)>);

    impl AsyncWrite for Recorder {
        fn poll_write(
            self: Pin<&mut Self>,
            _: &mut Context<'_>,
            buf: &[u8],
        ) -> Poll<io::Result<usize>> {
            self.get_mut().0.push((false, 1, buf.len()));
            Poll::Ready(Ok(buf.len()))
        }

        fn poll_write_vectored(
            self: Pin<&mut Self>,
            _: &mut Context<'_>,
            bufs: &[io::IoSlice<'_>],
        ) -> Poll<io::Result<usize>> {
            let n = bufs.iter().map(|buf| buf.len()).sum();
            self.get_mut().0.push((true, bufs.len(), n));
            Poll::Ready(Ok(n))
        }

        fn is_write_vectored(&self) -> bool {
            true
        }

        fn poll_flush(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<io::Result<()>> {
            Poll::Ready(Ok(()))
        }

        fn poll_shutdown(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<io::Result<()>> {
            Poll::Ready(Ok(()))
        }
    }

    async fn write(io: &mut FlatWrites<Recorder>, bufs: &[&[u8]]) -> usize {
        let slices: Vec<_> = bufs.iter().map(|buf| io::IoSlice::new(buf)).collect();
        poll_fn(|cx| Pin::new(&mut *io).poll_write_vectored(cx, &slices))
            .await
            .unwrap()
    }

    #[tokio::test]
    async fn one_buffer_is_a_plain_write_several_stay_vectored() {
        let mut io = FlatWrites(Recorder::default());
        assert!(io.is_write_vectored());
        assert_eq!(write(&mut io, &[b"frames"]).await, 6);
        assert_eq!(write(&mut io, &[b"", b"frames", b""]).await, 6);
        assert_eq!(write(&mut io, &[b"head", b"payload"]).await, 11);
        assert_eq!(write(&mut io, &[b"", b""]).await, 0);
        assert_eq!(
            io.0 .0,
            [(false, 1, 6), (false, 1, 6), (true, 2, 11), (false, 1, 0)]
        );
    }
}
