//! An HTTP/2 client connection's streams, run inside the connection's own task.
//!
//! hyper hands each stream's task (the request's future, then its answer's relay) to the
//! connection's executor. Spawned as tokio tasks, each stream cost a task's allocation, its
//! scheduling and a wake-up across tasks for every exchange with h2's connection (the stream
//! queues a frame, then wakes the connection's task to write it). [`StreamExec`] instead keeps
//! them in the connection's [`Streams`], which [`WithStreams`] polls with the connection: a
//! stream woken (its backend answered) wakes the connection's task, which polls just the
//! streams that were woken, then the connection, which writes what they queued. Every stream
//! still runs in its stall [`guard`], and so does what hyper starts beside a stream (the relay of
//! an upgraded one: WebSocket over HTTP/2).
//!
//! So a connection's streams share one thread at a time, as in HAProxy, nginx and Envoy,
//! where a connection belongs to one thread: many connections spread over the worker threads,
//! one connection's streams do not.

use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex, MutexGuard};
use std::task::{Context, Poll};

use futures_util::stream::{FuturesUnordered, StreamExt};

use super::stall::{guard, Stall};

/// A stream's task in its guard.
type StreamTask = Pin<Box<dyn Future<Output = ()> + Send>>;

/// The streams of one connection: handed to [`StreamExec`] while hyper's connection is polled
/// (or while a stream is: an upgraded stream's relay), polled by [`WithStreams`] in the same
/// task. New ones wait in `incoming`, a lock of their own, since a stream may start one while
/// `running` is held to poll it; neither mutex is ever contended.
#[derive(Default)]
pub(super) struct Streams {
    running: Mutex<FuturesUnordered<StreamTask>>,
    incoming: Mutex<Vec<StreamTask>>,
}

impl std::fmt::Debug for Streams {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Streams")
            .field("running", &lock(&self.running).len())
            .finish()
    }
}

fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(|e| e.into_inner())
}

impl Streams {
    /// Polls the streams that were woken and the new ones until none is ready; `only_fresh`:
    /// only if there are new ones.
    fn poll_woken(&self, cx: &mut Context<'_>, only_fresh: bool) {
        let mut running = lock(&self.running);
        if !self.start_incoming(&mut running) && only_fresh {
            return;
        }
        loop {
            while let Poll::Ready(Some(())) = running.poll_next_unpin(cx) {}
            // A stream polled may have started another (an upgraded stream's relay).
            if !self.start_incoming(&mut running) {
                return;
            }
        }
    }

    /// Moves the new streams into `running`; whether there were any.
    fn start_incoming(&self, running: &mut FuturesUnordered<StreamTask>) -> bool {
        let mut incoming = lock(&self.incoming);
        let any = !incoming.is_empty();
        running.extend(incoming.drain(..));
        any
    }
}

/// The executor of an HTTP/2 client connection: each stream's task goes, in its stall
/// [`guard`], into the connection's [`Streams`].
#[derive(Clone, Debug)]
pub(super) struct StreamExec(Arc<Streams>);

impl StreamExec {
    /// An executor for a new connection, and the streams it will hold.
    pub(super) fn new() -> (StreamExec, Arc<Streams>) {
        let streams = Arc::new(Streams::default());
        (StreamExec(streams.clone()), streams)
    }
}

impl<F> hyper::rt::Executor<F> for StreamExec
where
    F: Future<Output = ()> + Send + 'static,
{
    fn execute(&self, fut: F) {
        let task = Box::pin(guard(fut, Arc::new(Stall::default())));
        lock(&self.0.incoming).push(task);
    }
}

/// hyper's HTTP/2 connection `C` with its streams: ends when the connection does (a stream
/// still open then, whose client is gone, is dropped, as hyper's own stream task would have
/// ended on seeing the connection gone).
pub(super) struct WithStreams<C> {
    conn: Pin<Box<C>>,
    streams: Arc<Streams>,
}

impl<C> WithStreams<C> {
    pub(super) fn new(conn: Pin<Box<C>>, streams: Arc<Streams>) -> Self {
        WithStreams { conn, streams }
    }

    /// hyper's connection (to begin its graceful shutdown).
    pub(super) fn conn(&mut self) -> Pin<&mut C> {
        self.conn.as_mut()
    }
}

impl<C> Drop for WithStreams<C> {
    fn drop(&mut self) {
        // The streams go with the connection, dropped outside the lock (a stream's drop may
        // run any code); a stream holding its executor would otherwise keep itself alive.
        let running = std::mem::take(&mut *lock(&self.streams.running));
        let incoming = std::mem::take(&mut *lock(&self.streams.incoming));
        drop((running, incoming));
    }
}

impl<C: Future> Future for WithStreams<C> {
    type Output = C::Output;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<C::Output> {
        let this = self.get_mut();
        // The streams first: what a woken one queues (its answer) is written by the
        // connection's poll just after.
        this.streams.poll_woken(cx, false);
        if let Poll::Ready(ended) = this.conn.as_mut().poll(cx) {
            return Poll::Ready(ended);
        }
        // Streams the connection has just accepted start now; if they queued something (an
        // answer of capataz's own), h2 has woken this task to write it.
        this.streams.poll_woken(cx, true);
        Poll::Pending
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use hyper::rt::Executor;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use tokio::sync::oneshot;

    /// A connection that runs until told to end, and counts its polls.
    struct Conn {
        end: oneshot::Receiver<()>,
        polls: Arc<AtomicUsize>,
    }

    impl Future for Conn {
        type Output = ();
        fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
            self.polls.fetch_add(1, Ordering::Relaxed);
            Pin::new(&mut self.end).poll(cx).map(|_| ())
        }
    }

    #[tokio::test]
    async fn streams_run_in_the_connections_task_until_it_ends() {
        let (exec, streams) = StreamExec::new();
        let (end, end_rx) = oneshot::channel();
        let polls = Arc::new(AtomicUsize::new(0));
        let conn = Box::pin(Conn {
            end: end_rx,
            polls: polls.clone(),
        });
        let mut both = WithStreams::new(conn, streams.clone());
        // Two streams: one answers at once, one waits for its backend.
        let (answered, answered_rx) = oneshot::channel();
        exec.execute(async move {
            answered.send(()).unwrap();
        });
        let (backend, backend_rx) = oneshot::channel::<()>();
        let (finished, mut finished_rx) = oneshot::channel();
        exec.execute(async move {
            backend_rx.await.unwrap();
            finished.send(()).unwrap();
        });
        assert!(futures_util::poll!(&mut both).is_pending());
        answered_rx
            .await
            .expect("the first stream ran in the connection's task");
        assert!(finished_rx.try_recv().is_err());
        backend.send(()).unwrap();
        assert!(futures_util::poll!(&mut both).is_pending());
        finished_rx
            .await
            .expect("a woken stream runs at the connection's next poll");
        assert_eq!(lock(&streams.running).len(), 0, "ended streams are gone");
        // A stream still open when the connection ends is dropped with it.
        let (_never, never_rx) = oneshot::channel::<()>();
        let (dropped, dropped_rx) = oneshot::channel::<()>();
        exec.execute(async move {
            let _dropped = dropped;
            let _ = never_rx.await;
        });
        assert!(futures_util::poll!(&mut both).is_pending());
        end.send(()).unwrap();
        (&mut both).await;
        drop(both);
        assert!(dropped_rx.await.is_err(), "the open stream was dropped");
        assert!(polls.load(Ordering::Relaxed) >= 3);
    }

    #[tokio::test]
    async fn a_stream_may_start_another_while_it_is_polled() {
        // hyper starts an upgraded stream's relay from inside the stream's own poll.
        let (exec, streams) = StreamExec::new();
        let (_end, end_rx) = oneshot::channel::<()>();
        let polls = Arc::new(AtomicUsize::new(0));
        let conn = Box::pin(Conn { end: end_rx, polls });
        let mut both = WithStreams::new(conn, streams);
        let (relayed, relayed_rx) = oneshot::channel();
        let inner = exec.clone();
        exec.execute(async move {
            inner.execute(async move {
                relayed.send(()).unwrap();
            });
        });
        assert!(futures_util::poll!(&mut both).is_pending());
        relayed_rx.await.expect("the relay ran in the same poll");
    }
}
