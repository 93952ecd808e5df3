//! One TCP session's bytes, both ways, with HAProxy's half-close: a FIN read from one side is
//! passed on as a shutdown of the other side's write half, and the session ends once both
//! directions are done, or at the first error, or when a timer or a signal closes it.
//!
//! Both directions are driven by one future on the session's own task (no task, lock or
//! channel per direction), each with its own buffer of [`BUFFER`] bytes: a peer that does not
//! read stops the other side being read (back-pressure), so a session holds at most two
//! buffers however fast either side sends. A buffer is read into as allocated, never zeroed
//! first (`poll_read_buf` hands the reader its uninitialised spare capacity), and reused from
//! its start once everything read went out.

use std::future::poll_fn;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::task::{ready, Context, Poll};
use std::time::Duration;

use bytes::{BufMut, BytesMut};
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::sync::watch;
use tokio::time::{Instant, MissedTickBehavior};
use tokio_util::io::poll_read_buf;

/// The buffer of each direction.
pub(super) const BUFFER: usize = 8192;

/// One side of a session.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Side {
    /// The client's connection.
    Client,
    /// The backend's connection.
    Backend,
}

/// How a session's relaying ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum End {
    /// Both directions ended with a FIN; `first` closed first.
    Closed {
        /// The side whose FIN came first.
        first: Side,
    },
    /// A read or write on `side`'s connection failed (a reset, most often).
    Broke {
        /// Whose connection failed.
        side: Side,
    },
    /// No byte moved either way for the idle timeout.
    Idle,
    /// The session lasted its `session_timeout`.
    SessionLimit,
    /// The backend's verdict went DOWN and its pool closes its sessions then
    /// (`close_tunnels_on_down`).
    BackendDown,
}

/// What a session's relaying came to.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Relayed {
    /// How it ended.
    pub(crate) end: End,
    /// Bytes read from the client and written to the backend.
    pub(crate) from_client: u64,
    /// Bytes read from the backend and written to the client.
    pub(crate) from_backend: u64,
}

/// When a session is closed whatever its sides do.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Limits {
    /// No byte either way for this long.
    pub(crate) idle: Duration,
    /// The whole session, from the backend's connect (`None`: no limit).
    pub(crate) session: Option<Duration>,
}

/// Relays between `client` and `backend` until the session ends (see the module's doc).
/// `early` bytes, already read from the client, are sent to the backend first. `closing`: the
/// backend's close signal, when its pool closes sessions on DOWN.
pub(crate) async fn relay<C, B>(
    client: &mut C,
    backend: &mut B,
    limits: Limits,
    closing: Option<watch::Receiver<u64>>,
) -> Relayed
where
    C: AsyncRead + AsyncWrite + Unpin,
    B: AsyncRead + AsyncWrite + Unpin,
{
    // Relaxed atomics on the session's own task: `Send`, and as cheap as plain counters.
    let (from_client, from_backend) = (AtomicU64::new(0), AtomicU64::new(0));
    let mut up = Direction::new(Side::Client, Side::Backend, &from_client);
    let mut down = Direction::new(Side::Backend, Side::Client, &from_backend);
    let started = Instant::now();
    // Looked at a few times per `idle`, as tunnels and client connections are: the session
    // closes between `idle` and `idle` plus that period after its last byte.
    let period = (limits.idle / 4).clamp(Duration::from_millis(20), Duration::from_secs(1));
    // The first look one period in (the one at once `interval` makes could see nothing): a
    // session's timer is registered once, not registered and then moved.
    let mut tick = tokio::time::interval_at(started + period, period);
    tick.set_missed_tick_behavior(MissedTickBehavior::Delay);
    let mut seen = 0;
    let mut quiet_since = started;
    let session_end = limits.session.and_then(|limit| started.checked_add(limit));
    let over = async {
        match session_end {
            Some(at) => tokio::time::sleep_until(at).await,
            None => std::future::pending().await,
        }
    };
    tokio::pin!(over);
    let down_signal = backend_down(closing);
    tokio::pin!(down_signal);
    let mut first_fin = None;
    let copy = poll_fn(|cx| {
        let up_done = up.poll(cx, client, backend);
        let down_done = down.poll(cx, backend, client);
        for (done, from) in [(up_done, Side::Client), (down_done, Side::Backend)] {
            match done {
                Poll::Ready(Err(side)) => return Poll::Ready(End::Broke { side }),
                Poll::Ready(Ok(())) => {
                    first_fin.get_or_insert(from);
                }
                Poll::Pending => {}
            }
        }
        // A direction's FIN counts as soon as it was read, even while its shutdown is pending.
        for (direction, from) in [(&up, Side::Client), (&down, Side::Backend)] {
            if direction.read_done {
                first_fin.get_or_insert(from);
            }
        }
        if up.finished && down.finished {
            return Poll::Ready(End::Closed {
                first: first_fin.unwrap_or(Side::Client),
            });
        }
        Poll::Pending
    });
    tokio::pin!(copy);
    let end = loop {
        tokio::select! {
            end = &mut copy => break end,
            _ = &mut over => break End::SessionLimit,
            _ = &mut down_signal => break End::BackendDown,
            now = tick.tick() => {
                let moved = from_client.load(Ordering::Relaxed) + from_backend.load(Ordering::Relaxed);
                if moved != seen {
                    seen = moved;
                    quiet_since = now;
                } else if now.saturating_duration_since(quiet_since) >= limits.idle {
                    break End::Idle;
                }
            }
        }
    };
    Relayed {
        end,
        from_client: from_client.load(Ordering::Relaxed),
        from_backend: from_backend.load(Ordering::Relaxed),
    }
}

/// Resolves once the backend's sessions are to close; never without a receiver, or once the
/// signal's sender is gone (its pool was removed by a reload).
async fn backend_down(closing: Option<watch::Receiver<u64>>) {
    if let Some(mut rx) = closing {
        if rx.changed().await.is_ok() {
            return;
        }
    }
    std::future::pending().await
}

/// One direction: bytes read from `from`'s connection, written to `to`'s.
struct Direction<'a> {
    from: Side,
    to: Side,
    /// Allocated by the first read attempt (the session's first poll): [`BUFFER`] bytes per
    /// direction, its capacity, which never grows (it is read into only when empty).
    buf: Option<BytesMut>,
    /// The unwritten bytes are `buf[start..]`.
    start: usize,
    /// `from` sent its FIN.
    read_done: bool,
    /// The FIN was passed on: `to`'s write half is shut.
    finished: bool,
    /// Bytes written to `to` (read by the idle timer while the copy runs).
    moved: &'a AtomicU64,
}

impl<'a> Direction<'a> {
    fn new(from: Side, to: Side, moved: &'a AtomicU64) -> Direction<'a> {
        Direction {
            from,
            to,
            buf: None,
            start: 0,
            read_done: false,
            finished: false,
            moved,
        }
    }

    /// Moves what it can. `Ready(Ok)` once the FIN was passed on (and every time after),
    /// `Ready(Err(side))` when `side`'s connection failed.
    fn poll<R, W>(
        &mut self,
        cx: &mut Context<'_>,
        from: &mut R,
        to: &mut W,
    ) -> Poll<Result<(), Side>>
    where
        R: AsyncRead + Unpin,
        W: AsyncWrite + Unpin,
    {
        if self.finished {
            return Poll::Ready(Ok(()));
        }
        loop {
            while let Some(buf) = self.buf.as_ref().filter(|buf| self.start < buf.len()) {
                let written = ready!(Pin::new(&mut *to).poll_write(cx, &buf[self.start..]))
                    .map_err(|_| self.to)?;
                if written == 0 {
                    return Poll::Ready(Err(self.to));
                }
                self.start += written;
                self.moved.fetch_add(written as u64, Ordering::Relaxed);
            }
            if self.read_done {
                ready!(Pin::new(&mut *to).poll_shutdown(cx)).map_err(|_| self.to)?;
                self.finished = true;
                return Poll::Ready(Ok(()));
            }
            // Everything read went out: flush it (a TLS session buffers), then read more, into
            // the buffer from its start.
            ready!(Pin::new(&mut *to).poll_flush(cx)).map_err(|_| self.to)?;
            let buf = self
                .buf
                .get_or_insert_with(|| BytesMut::with_capacity(BUFFER));
            buf.clear();
            self.start = 0;
            // At most `BUFFER` bytes, into the spare capacity (uninitialised, as allocated): the
            // buffer is empty, so `BytesMut` never grows it for this read.
            match poll_read_buf(Pin::new(&mut *from), cx, &mut buf.limit(BUFFER)) {
                Poll::Pending => return Poll::Pending,
                // The side read from failed (a reset, most often).
                Poll::Ready(Err(_)) => return Poll::Ready(Err(self.from)),
                Poll::Ready(Ok(0)) => self.read_done = true,
                Poll::Ready(Ok(_)) => {}
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::{duplex, AsyncReadExt, AsyncWriteExt, DuplexStream};

    /// `len` bytes that differ from one buffer's worth to the next, so a chunk relayed twice,
    /// lost or out of place shows.
    fn pattern(len: usize, seed: u32) -> Vec<u8> {
        (0..len as u32)
            .map(|i| (i.wrapping_mul(31) ^ (i / 251) ^ seed) as u8)
            .collect()
    }

    /// Writes `bytes`, sends a FIN, and reads to the end.
    async fn exchange(end: DuplexStream, bytes: Vec<u8>) -> Vec<u8> {
        let (mut read, mut write) = tokio::io::split(end);
        let send = async {
            write.write_all(&bytes).await.expect("write");
            write.shutdown().await.expect("shutdown");
        };
        let mut got = Vec::new();
        let receive = read.read_to_end(&mut got);
        let (_, received) = tokio::join!(send, receive);
        received.expect("read");
        got
    }

    #[tokio::test]
    async fn several_buffers_each_way_arrive_whole_in_order_and_counted() {
        // Pipes smaller than a buffer: reads come in pieces and writes are partial, so each
        // buffer is refilled from its start many times under back-pressure.
        let (client, mut client_side) = duplex(1000);
        let (mut backend_side, backend) = duplex(3001);
        let up = pattern(5 * BUFFER + 17, 1);
        let down = pattern(3 * BUFFER + 5, 2);
        let limits = Limits {
            idle: Duration::from_secs(60),
            session: None,
        };
        let relaying = relay(&mut client_side, &mut backend_side, limits, None);
        let (relayed, at_client, at_backend) = tokio::join!(
            relaying,
            exchange(client, up.clone()),
            exchange(backend, down.clone())
        );
        assert!(matches!(relayed.end, End::Closed { .. }), "{relayed:?}");
        assert_eq!(
            (relayed.from_client, relayed.from_backend),
            (up.len() as u64, down.len() as u64)
        );
        assert!(
            at_backend == up,
            "the backend got other bytes than the client sent"
        );
        assert!(
            at_client == down,
            "the client got other bytes than the backend sent"
        );
    }
}
