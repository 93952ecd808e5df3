//! An upgraded connection (a WebSocket, say) relayed both ways once the backend switched
//! protocols.

use std::sync::atomic::Ordering;
use std::sync::Arc;

use bytes::Bytes;
use hyper_util::rt::TokioIo;
use tokio::io::AsyncWriteExt;

use crate::upstream::Transport;

/// Joins the client's upgraded connection and the backend's, once the 101 has reached the
/// client; `early` is what the backend sent after its 101 before the tunnel existed. The
/// tunnel closes when either side does, or once no byte has moved either way for `idle` (the
/// listener's `idle_timeout`): an idle upgraded connection holds two sockets and a task. With
/// `closing` (the pool's `close_tunnels_on_down`), it also closes when the health runtime
/// signals that the backend went DOWN. `hold` (an HTTP/2 client's WebSocket) is kept until
/// the tunnel ends.
pub(super) fn tunnel<S: Transport>(
    client: hyper::upgrade::OnUpgrade,
    hold: Option<super::TunnelHold>,
    mut backend: S,
    early: Bytes,
    idle: std::time::Duration,
    closing: Option<tokio::sync::watch::Receiver<u64>>,
) {
    tokio::spawn(async move {
        // Let go of with the tunnel (its client connection counts it until then).
        let _hold = hold;
        let Ok(client) = client.await else {
            return;
        };
        let moved = Arc::new(std::sync::atomic::AtomicU64::new(0));
        let mut client = Moving {
            inner: TokioIo::new(client),
            moved: moved.clone(),
        };
        if !early.is_empty() && client.write_all(&early).await.is_err() {
            return;
        }
        let mut backend = Moving {
            inner: &mut backend,
            moved: moved.clone(),
        };
        let copy = tokio::io::copy_bidirectional(&mut client, &mut backend);
        tokio::pin!(copy);
        // Looked at a few times per `idle`, as client connections are (see `downstream/watch.rs`): the
        // tunnel closes between `idle` and `idle` plus that period after its last byte.
        let period = (idle / 4).clamp(
            std::time::Duration::from_millis(20),
            std::time::Duration::from_secs(1),
        );
        let mut tick = tokio::time::interval(period);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut seen = 0;
        let mut quiet_since = tokio::time::Instant::now();
        let closed = backend_down(closing);
        tokio::pin!(closed);
        loop {
            tokio::select! {
                _ = &mut copy => return,
                // Dropping both ends closes them.
                _ = &mut closed => return,
                now = tick.tick() => {
                    let count = moved.load(Ordering::Relaxed);
                    if count != seen {
                        seen = count;
                        quiet_since = now;
                    } else if now.saturating_duration_since(quiet_since) >= idle {
                        // Dropping both ends closes them.
                        return;
                    }
                }
            }
        }
    });
}

/// Resolves once the backend's tunnels are to close; never without a receiver, or once the
/// signal's sender is gone (its pool was removed by a reload).
async fn backend_down(closing: Option<tokio::sync::watch::Receiver<u64>>) {
    if let Some(mut rx) = closing {
        if rx.changed().await.is_ok() {
            return;
        }
    }
    std::future::pending().await
}

/// One end of a tunnel, counting the reads that moved bytes.
struct Moving<T> {
    inner: T,
    moved: Arc<std::sync::atomic::AtomicU64>,
}

impl<T: tokio::io::AsyncRead + Unpin> tokio::io::AsyncRead for Moving<T> {
    fn poll_read(
        self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        buf: &mut tokio::io::ReadBuf<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        let this = self.get_mut();
        let before = buf.filled().len();
        let polled = std::pin::Pin::new(&mut this.inner).poll_read(cx, buf);
        if buf.filled().len() > before {
            this.moved.fetch_add(1, Ordering::Relaxed);
        }
        polled
    }
}

impl<T: tokio::io::AsyncWrite + Unpin> tokio::io::AsyncWrite for Moving<T> {
    fn poll_write(
        self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        buf: &[u8],
    ) -> std::task::Poll<std::io::Result<usize>> {
        std::pin::Pin::new(&mut self.get_mut().inner).poll_write(cx, buf)
    }

    fn poll_flush(
        self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        std::pin::Pin::new(&mut self.get_mut().inner).poll_flush(cx)
    }

    fn poll_shutdown(
        self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        std::pin::Pin::new(&mut self.get_mut().inner).poll_shutdown(cx)
    }
}
