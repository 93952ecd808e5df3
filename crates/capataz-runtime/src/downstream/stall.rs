//! HTTP/2 streams whose client takes nothing of their answer: ended after the pool's
//! `timeouts.body_idle`, so that they let go of their backend connection.
//!
//! A backend's body is read only as fast as the client takes it: while the client's window is
//! shut (or it reads nothing off the socket), hyper holds what the body last gave and does not
//! poll it again, and nothing in the body can run, not even a timer: `body_idle` there times
//! the backend only. A client announcing a window of 0 could so keep one backend connection per
//! stream busy for as long as it likes.
//!
//! Every stream's task is therefore spawned by [`StreamExec`] inside [`guard`], which owns a
//! [`Stall`]: the stream's answer body (`Tracked`, in the parent module) says there whether
//! hyper holds what it gave (its head, or its last frame) and how often hyper polled it, and
//! the guard, polled with the stream's task, times each hold. A hold that lasts the answer's
//! limit (its pool's `body_idle`) ends the stream's task: its body is dropped (the backend
//! connection with it, nothing charged to the backend; the access log says the client ended the
//! request in `body`), and h2 resets the stream (`CANCEL`). The body hands its stall over on
//! creation through a task-local, so the guard needs no other link to the stream's answer.
//! Nothing is timed while the body waits for the backend (that is the body's own `body_idle`),
//! before the answer (`response_header`), nor for capataz's own answers. One timer per stream,
//! created at its first hold and moved only when it fires early.

use std::future::{poll_fn, Future};
use std::pin::{pin, Pin};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use tokio::time::{Instant, Sleep};

tokio::task_local! {
    /// The stall of the stream whose task is being polled.
    static STALL: Arc<Stall>;
}

/// What one stream's answer body tells its guard.
#[derive(Debug, Default)]
pub(super) struct Stall {
    /// Polls of the body so far, times two, plus one while hyper holds what the body gave.
    state: AtomicU64,
    /// The hold allowed, in nanoseconds (the pool's `body_idle`); 0: none yet (no answer, or
    /// capataz's own).
    limit: AtomicU64,
}

impl Stall {
    /// The stall of the stream being polled, if it runs under a [`guard`].
    pub(super) fn current() -> Option<Arc<Stall>> {
        STALL.try_with(Arc::clone).ok()
    }

    /// The answer's head is handed to hyper: from now on holds are limited to `limit`
    /// (`None`: not limited).
    pub(super) fn answer(&self, limit: Option<Duration>) {
        if let Some(limit) = limit {
            let nanos = u64::try_from(limit.as_nanos()).unwrap_or(u64::MAX).max(1);
            self.state.store(1, Ordering::Relaxed);
            self.limit.store(nanos, Ordering::Relaxed);
        }
    }

    /// hyper polled the body; `holding`: the body gave a frame, which hyper now holds until
    /// the client takes it (else it waits for the backend, or has ended).
    pub(super) fn polled(&self, holding: bool) {
        let polls = self.state.load(Ordering::Relaxed) >> 1;
        self.state
            .store(((polls + 1) << 1) | u64::from(holding), Ordering::Relaxed);
    }

    fn limit(&self) -> Option<Duration> {
        match self.limit.load(Ordering::Relaxed) {
            0 => None,
            nanos => Some(Duration::from_nanos(nanos)),
        }
    }
}

/// The executor of an HTTP/2 client connection: every stream's task runs in a [`guard`].
#[derive(Clone, Copy, Debug, Default)]
pub(super) struct StreamExec;

impl<F> hyper::rt::Executor<F> for StreamExec
where
    F: Future<Output = ()> + Send + 'static,
{
    fn execute(&self, fut: F) {
        tokio::spawn(guard(fut, Arc::new(Stall::default())));
    }
}

/// An HTTP/2 connection's service: `S`, with each request's future boxed. hyper moves every
/// stream's task (its request's future inside) into the task it spawns; that future is the whole
/// proxy path's (several KB), and the spawn copied it twice, at the stream's start, for about a
/// quarter of the instructions of an HTTP/2 request (BENCHMARKS.md, "HTTP/2: where the
/// instructions go"). Boxed, it is not moved at all, and the task holds a pointer: the box is
/// allocated first and the call writes the future straight into it (the box is the call's
/// return slot). `Box::pin(call)` made the future on the stack, then allocated and copied it
/// there: a copy of several KB per request (about 700 instructions under callgrind). Writing
/// in place is the optimiser's doing (the call's result goes to its destination when that
/// exists before the call), not a promise of the language: the profile is what checks it.
#[derive(Clone, Copy, Debug)]
pub(super) struct BoxedCalls<S>(pub(super) S);

impl<S, R> hyper::service::Service<R> for BoxedCalls<S>
where
    S: hyper::service::Service<R>,
{
    type Response = S::Response;
    type Error = S::Error;
    type Future = Pin<Box<S::Future>>;

    fn call(&self, req: R) -> Self::Future {
        boxed_in_place(|| self.0.call(req))
    }
}

/// `make`'s future in a box, pinned: the box is allocated first and `make`'s result written
/// straight into it (the box is the call's return slot), where `Box::pin(make())` makes the
/// future on the stack, then allocates and copies it there (several KB for a request's future).
/// Writing in place is the optimiser's doing, not a promise of the language: a profile is what
/// checks it (see [`BoxedCalls`]). HTTP/2 streams' futures and HTTP/3 requests' are boxed so.
#[inline(always)]
pub(crate) fn boxed_in_place<F>(make: impl FnOnce() -> F) -> Pin<Box<F>> {
    let mut slot = Box::new_uninit();
    slot.write(make());
    // SAFETY: `write` initialised the box's value just above.
    Box::into_pin(unsafe { slot.assume_init() })
}

/// Runs `stream` (a stream's task) until it ends, or until what its answer's body gave has
/// been held, untaken by the client, for the answer's limit (see the module documentation).
pub(super) async fn guard<F: Future<Output = ()>>(stream: F, stall: Arc<Stall>) {
    let mut stream = pin!(stream);
    let mut hold = Hold::default();
    poll_fn(|cx| {
        // The body takes the stall when it is made; no scope is needed once it has.
        let polled = if stall.limit().is_none() {
            STALL.sync_scope(stall.clone(), || stream.as_mut().poll(cx))
        } else {
            stream.as_mut().poll(cx)
        };
        if polled.is_ready() {
            return Poll::Ready(());
        }
        if hold.ran_out(&stall, cx) {
            tracing::debug!("the client took nothing of an answer for its body_idle: stream reset");
            // Dropping the stream's task drops its body and resets the stream.
            return Poll::Ready(());
        }
        Poll::Pending
    })
    .await
}

/// The guard's clock.
#[derive(Default)]
struct Hold {
    /// The stall's state when last seen.
    seen: Option<u64>,
    /// When it was first seen so.
    since: Option<Instant>,
    /// Wakes the task at the end of the hold (or earlier, then it is moved on).
    timer: Option<Pin<Box<Sleep>>>,
}

impl Hold {
    /// Whether hyper has held the body's last frame (or the head) for the whole limit, with
    /// no poll of the body since; if not, the timer is set to wake the task when it would.
    fn ran_out(&mut self, stall: &Stall, cx: &mut Context<'_>) -> bool {
        let state = stall.state.load(Ordering::Relaxed);
        let Some(limit) = stall.limit().filter(|_| state & 1 == 1) else {
            // No answer yet, capataz's own, or the body waits on the backend or has ended.
            return false;
        };
        let since = match (self.seen, self.since) {
            (Some(seen), Some(since)) if seen == state => since,
            _ => {
                let now = Instant::now();
                self.seen = Some(state);
                self.since = Some(now);
                now
            }
        };
        let deadline = since + limit;
        let timer = self
            .timer
            .get_or_insert_with(|| Box::pin(tokio::time::sleep_until(deadline)));
        loop {
            if timer.as_mut().poll(cx).is_pending() {
                return false;
            }
            // Fired: at this hold's end, or at an earlier one's (the body moved since).
            if timer.deadline() >= deadline {
                return true;
            }
            timer.as_mut().reset(deadline);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::sync::mpsc;

    /// A stream task that hands its body's stall over with `limit`, then polls its body once
    /// per message: `true`, the body gave a frame hyper now holds; `false`, it waits for its
    /// backend.
    async fn stream_task(limit: Option<Duration>, mut polls: mpsc::UnboundedReceiver<bool>) {
        let stall = Stall::current().expect("run under a guard");
        stall.answer(limit);
        while let Some(holding) = polls.recv().await {
            stall.polled(holding);
        }
        std::future::pending().await
    }

    fn spawn_stream(
        limit: Option<Duration>,
    ) -> (tokio::task::JoinHandle<()>, mpsc::UnboundedSender<bool>) {
        let (polls, rx) = mpsc::unbounded_channel();
        let task = tokio::spawn(guard(stream_task(limit, rx), Arc::new(Stall::default())));
        (task, polls)
    }

    #[tokio::test(start_paused = true)]
    async fn a_hold_of_the_whole_limit_ends_the_stream() {
        let started = Instant::now();
        let (task, _polls) = spawn_stream(Some(Duration::from_secs(5)));
        task.await.expect("the guard ends the stream");
        assert_eq!(started.elapsed(), Duration::from_secs(5));
    }

    #[tokio::test(start_paused = true)]
    async fn each_poll_of_the_body_starts_the_hold_again() {
        let started = Instant::now();
        let (task, polls) = spawn_stream(Some(Duration::from_secs(5)));
        // A client that takes a frame every 4 s, three times, then nothing.
        for _ in 0..3 {
            tokio::time::sleep(Duration::from_secs(4)).await;
            assert!(!task.is_finished());
            polls.send(true).unwrap();
        }
        task.await.expect("the guard ends the stream");
        assert_eq!(started.elapsed(), Duration::from_secs(12 + 5));
    }

    #[tokio::test(start_paused = true)]
    async fn a_body_waiting_on_its_backend_is_not_held() {
        let (task, polls) = spawn_stream(Some(Duration::from_secs(5)));
        tokio::time::sleep(Duration::from_secs(1)).await;
        polls.send(false).unwrap();
        tokio::time::sleep(Duration::from_secs(60)).await;
        assert!(!task.is_finished(), "the backend's wait is the body's own");
        // The backend's data comes: the hold starts again.
        polls.send(true).unwrap();
        let resumed = Instant::now();
        task.await.expect("the guard ends the stream");
        assert_eq!(resumed.elapsed(), Duration::from_secs(5));
    }

    #[tokio::test(start_paused = true)]
    async fn an_answer_without_a_limit_is_never_cut() {
        let (task, _polls) = spawn_stream(None);
        tokio::time::sleep(Duration::from_secs(3600)).await;
        assert!(!task.is_finished());
        task.abort();
    }
}
