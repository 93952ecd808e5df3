//! Noticing an HTTP/1 client that went away while its request waits for a backend.
//!
//! hyper's HTTP/1 server reads nothing from the socket while a request is in progress and its
//! body has been read (with `half_close`, see `http1_builder`), so a client that resets its
//! connection then would only be seen gone when its answer is written: the backend would
//! finish a request nobody waits for, the access log would say it was served, and the
//! connection would stay counted open. HAProxy and nginx notice it at once (HAProxy logs
//! `CH`, nginx closes the upstream connection unless `proxy_ignore_client_abort`).
//!
//! So while a request waits for its answer, the connection peeks at its socket whenever the
//! socket turns readable (a readiness check, then `recv` with `MSG_PEEK`: no byte is
//! consumed, hyper reads them later as ever). What the peek finds decides:
//! - an error (the client reset the connection): the client is gone. hyper's connection ends
//!   with that error, which drops the request in progress as an HTTP/2 stream reset does:
//!   its attempt is dropped, the backend connection closed (the backend sees it close before
//!   it answers), nothing is charged to the backend, and the access log says `client` and the
//!   phase the request was in, status `-`.
//! - the end of the stream (a FIN): a half-close, which is not an abort (HAProxy's default,
//!   `option abortonclose` off). The request goes on and is answered; the connection is
//!   never watched again (a reset after a FIN is seen when the answer is written).
//! - bytes (a pipelined request, or TLS records): they are the client's next words, not a
//!   departure; the request is not watched any further (its answer is written as usual).
//!
//! The watch starts at the request's head for a bodiless request, and once its body has been
//! read to its end otherwise (never while hyper itself reads the body: a client that goes
//! away mid-body is seen by hyper, as a failed upload). It ends when the answer is ready.
//! It runs in the connection's own task: hyper flushes its socket at the end of each turn of
//! its connection, even with nothing to write, and that flush ([`PeerWatch::poll_gone`]) is
//! where the peek is made, so it costs no task, timer or allocation, and no system call
//! until the socket turns readable. HTTP/2 is never watched: a client cancels a request there
//! with `RST_STREAM`, which hyper already sees.

use std::io;
use std::os::fd::{AsRawFd, RawFd};
use std::sync::atomic::Ordering;
use std::task::{Context, Poll};

use tokio::io::ReadBuf;
use tokio::net::TcpStream;

use capataz_proxy_protocol::Rewind;

use crate::atomic_enum::atomic_enum;

atomic_enum! {
    /// Whether the HTTP/1 request in progress is watched, and what was seen of the client.
    enum Watched in WatchedCell {
        /// No request is watched (none in progress, or answered).
        Idle,
        /// A request is in progress and hyper is still reading its body.
        Reading,
        /// A request is in progress, its body read (or bodiless), its answer not ready yet.
        Watching,
        /// The client half-closed the connection: it is never watched again.
        HalfClosed,
    }
}

/// Whether the HTTP/1 request in progress on a connection is watched for its client going
/// away, and what was seen of the client (see the module documentation).
#[derive(Debug)]
pub(super) struct PeerWatch(WatchedCell);

impl Default for PeerWatch {
    fn default() -> PeerWatch {
        PeerWatch(WatchedCell::new(Watched::Idle))
    }
}

impl PeerWatch {
    /// A request starts: watched from now on if it has no body, else once its body is read.
    /// (In the connection's task.)
    pub(super) fn start(&self, bodiless: bool) {
        let next = if bodiless {
            Watched::Watching
        } else {
            Watched::Reading
        };
        self.set_unless_half_closed(next);
    }

    /// The body of the request in progress has been read to its end: whether it is watched
    /// from now on. (From any task: an HTTP/2 backend's client reads it in a task of its
    /// own, and the connection's task must then be woken to start watching.)
    pub(super) fn body_read(&self) -> bool {
        self.0
            .compare_exchange(
                Watched::Reading,
                Watched::Watching,
                Ordering::Relaxed,
                Ordering::Relaxed,
            )
            .is_ok()
    }

    /// The request has its answer, or was dropped: nothing to watch until the next.
    pub(super) fn stop(&self) {
        self.set_unless_half_closed(Watched::Idle);
    }

    fn set_unless_half_closed(&self, next: Watched) {
        let _ = self.0.update(Ordering::Relaxed, |now| {
            (now != Watched::HalfClosed).then_some(next)
        });
    }

    /// Whether the client half-closed the connection (seen while a request was watched).
    #[cfg(test)]
    pub(super) fn half_closed(&self) -> bool {
        self.0.load(Ordering::Relaxed) == Watched::HalfClosed
    }

    /// `Ready` with the socket's error if the client of a watched request went away; else
    /// `Pending`, with the task woken when the socket turns readable (while watched). Called
    /// by the connection's task only.
    pub(super) fn poll_gone<S: PeekPeer + ?Sized>(
        &self,
        socket: &S,
        cx: &mut Context<'_>,
    ) -> Poll<io::Error> {
        if self.0.load(Ordering::Relaxed) != Watched::Watching {
            return Poll::Pending;
        }
        match socket.poll_peek_peer(cx) {
            Poll::Pending => Poll::Pending,
            Poll::Ready(Err(error)) => {
                tracing::debug!(%error, "the client went away while its request waited");
                Poll::Ready(error)
            }
            Poll::Ready(Ok(0)) => {
                // A FIN: the client still reads, and gets its answer.
                self.0.store(Watched::HalfClosed, Ordering::Relaxed);
                Poll::Pending
            }
            Poll::Ready(Ok(_)) => {
                // Bytes wait unread (the readiness stays set): not looked at again for this
                // request, or every turn of the connection would peek at them.
                let _ = self.0.compare_exchange(
                    Watched::Watching,
                    Watched::Idle,
                    Ordering::Relaxed,
                    Ordering::Relaxed,
                );
                Poll::Pending
            }
        }
    }
}

/// A client connection's socket, as the watch for a client gone sees it: the TCP socket
/// under any TLS or PROXY protocol layer.
pub(crate) trait PeekPeer {
    /// Peeks at what the client sent, without consuming it, once the socket is readable:
    /// `Ok(0)` at its end (a FIN), `Ok(n)` with bytes waiting unread, `Err` if the connection
    /// failed (a reset); `Pending`, with `cx` woken, until then.
    fn poll_peek_peer(&self, cx: &mut Context<'_>) -> Poll<io::Result<usize>>;

    /// The socket registered anew with the runtime's IO driver, as its connection parks (see
    /// `park`): its registration is freed and allocated again, so that parked connections'
    /// registrations end up packed together rather than on the pages a burst of requests
    /// spread them over. Itself (unchanged) where that is not done; an error closes the
    /// connection.
    fn reregister(self) -> io::Result<Self>
    where
        Self: Sized,
    {
        Ok(self)
    }

    /// The plain socket's descriptor, for a flusher to send on (`capataz_upstream::outbox`):
    /// `None` where the connection's task must write itself (TLS encrypts there).
    fn plain_fd(&self) -> Option<RawFd> {
        None
    }
}

impl PeekPeer for TcpStream {
    fn poll_peek_peer(&self, cx: &mut Context<'_>) -> Poll<io::Result<usize>> {
        let mut byte = [0u8; 1];
        self.poll_peek(cx, &mut ReadBuf::new(&mut byte))
    }

    /// Out of the IO driver and back (two `epoll_ctl`s; the socket stays non-blocking, and a
    /// socket readable meanwhile is reported at once on its new registration).
    fn reregister(self) -> io::Result<TcpStream> {
        TcpStream::from_std(self.into_std()?)
    }

    fn plain_fd(&self) -> Option<RawFd> {
        Some(self.as_raw_fd())
    }
}

impl<S: PeekPeer> PeekPeer for Rewind<S> {
    fn poll_peek_peer(&self, cx: &mut Context<'_>) -> Poll<io::Result<usize>> {
        match self.unread() {
            0 => self.get_ref().poll_peek_peer(cx),
            // Bytes read with the PROXY header, still to be read: the client's next words.
            n => Poll::Ready(Ok(n)),
        }
    }

    fn plain_fd(&self) -> Option<RawFd> {
        self.get_ref().plain_fd()
    }
}

impl<S: PeekPeer> PeekPeer for tokio_rustls::server::TlsStream<S> {
    fn poll_peek_peer(&self, cx: &mut Context<'_>) -> Poll<io::Result<usize>> {
        // A reset is the TCP socket's; a TLS close_notify is bytes, as any record.
        self.get_ref().0.poll_peek_peer(cx)
    }
}

impl<S: PeekPeer + ?Sized> PeekPeer for Box<S> {
    fn poll_peek_peer(&self, cx: &mut Context<'_>) -> Poll<io::Result<usize>> {
        (**self).poll_peek_peer(cx)
    }

    fn plain_fd(&self) -> Option<RawFd> {
        (**self).plain_fd()
    }
}

#[cfg(test)]
mod tests {
    use std::future::poll_fn;

    use tokio::io::AsyncWriteExt;
    use tokio::net::TcpListener;

    use super::*;

    /// A connected pair on loopback: (the client's end, capataz's end).
    async fn pair() -> (TcpStream, TcpStream) {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let client = TcpStream::connect(listener.local_addr().unwrap())
            .await
            .unwrap();
        let (server, _) = listener.accept().await.unwrap();
        (client, server)
    }

    /// What one poll of the watch says now.
    fn look(watch: &PeerWatch, socket: &TcpStream) -> Poll<io::ErrorKind> {
        let waker = std::task::Waker::noop();
        watch
            .poll_gone(socket, &mut Context::from_waker(waker))
            .map(|error| error.kind())
    }

    /// Waits until the watch says the client is gone.
    async fn gone(watch: &PeerWatch, socket: &TcpStream) -> io::ErrorKind {
        poll_fn(|cx| watch.poll_gone(socket, cx)).await.kind()
    }

    #[tokio::test]
    async fn a_reset_is_a_client_gone_and_wakes_the_task() {
        let (client, server) = pair().await;
        let watch = PeerWatch::default();
        watch.start(true);
        assert!(look(&watch, &server).is_pending());
        client.set_zero_linger().unwrap();
        drop(client);
        // Woken by the readiness, not polled in a loop.
        assert_eq!(gone(&watch, &server).await, io::ErrorKind::ConnectionReset);
    }

    #[tokio::test]
    async fn a_half_close_is_not_a_client_gone_and_is_never_watched_again() {
        let (mut client, server) = pair().await;
        let watch = PeerWatch::default();
        watch.start(true);
        client.shutdown().await.unwrap();
        poll_fn(|cx| {
            let _ = watch.poll_gone(&server, cx);
            if watch.half_closed() {
                Poll::Ready(())
            } else {
                Poll::Pending
            }
        })
        .await;
        // Sticky: the next request on the connection is not watched either.
        watch.stop();
        watch.start(true);
        assert!(watch.half_closed());
        // A reset after the FIN is left to the answer's write.
        client.set_zero_linger().unwrap();
        drop(client);
        assert!(look(&watch, &server).is_pending());
    }

    #[tokio::test]
    async fn bytes_waiting_end_the_watch_of_that_request_only() {
        let (mut client, server) = pair().await;
        let watch = PeerWatch::default();
        watch.start(true);
        client.write_all(b"GET /next HTTP/1.1\r\n").await.unwrap();
        poll_fn(|cx| match watch.poll_gone(&server, cx) {
            Poll::Ready(error) => panic!("{error}"),
            Poll::Pending if watch.0.load(Ordering::Relaxed) == Watched::Idle => Poll::Ready(()),
            Poll::Pending => Poll::Pending,
        })
        .await;
        // Not consumed: the bytes are still there for hyper.
        let mut buf = [0u8; 64];
        let n = server.peek(&mut buf).await.unwrap();
        assert_eq!(&buf[..n], b"GET /next HTTP/1.1\r\n");
    }

    #[tokio::test]
    async fn a_request_is_watched_only_once_its_body_is_read_and_until_its_answer() {
        let (client, server) = pair().await;
        let watch = PeerWatch::default();
        client.set_zero_linger().unwrap();
        drop(client);
        // No request, a body being read, an answered request: nothing is looked at.
        assert!(look(&watch, &server).is_pending());
        watch.start(false);
        assert!(look(&watch, &server).is_pending());
        watch.stop();
        assert!(!watch.body_read());
        assert!(look(&watch, &server).is_pending());
        // The body read: watched.
        watch.start(false);
        assert!(watch.body_read());
        assert_eq!(
            look(&watch, &server),
            Poll::Ready(io::ErrorKind::ConnectionReset)
        );
    }
}
