//! Writes put off to the end of the runtime's turn: HAProxy's order of work.
//!
//! HAProxy's event loop takes one batch of events from `epoll_wait`, receives on every ready
//! socket, then runs the streams, which send: a turn is all its `recvfrom`s, then all its
//! `sendto`s. A capataz connection task did its receive and its send in one poll, so a turn
//! alternated them, and the answers and requests of one turn left one at a time, spread over
//! the turn. The load generator and the backends on the other end of those sockets were then
//! woken by each one and took them a few at a time: on the benchmark's shared core they ran
//! in slices of 150-200 us, preempting each other (40 % of their switches, against 20 % beside
//! HAProxy), where beside HAProxy they took a turn's worth in slices of about 90 us and went to
//! sleep (BENCHMARKS.md, "The balancer against HAProxy and nginx: plaintext HTTP/1.1").
//!
//! A connection's first write of a flush therefore goes to the back of the runtime's run queue:
//! the task wakes itself and returns `Pending` once ([`poll_back_of_queue`]). On tokio's
//! current-thread runtime (each worker's) a task woken from its own poll is queued behind the
//! tasks already there, so the tasks the IO driver woke in this turn all do their reads first,
//! then the put-off writes go out together, before the driver is polled again (which the
//! runtime's `event_interval` bounds, see `workers.rs`). Unlike `tokio::task::yield_now`, which
//! waits for the driver's next poll, this adds no system call and no wait for new events: one
//! more poll of the task per write.
//!
//! On a plain socket, on a worker, the write skips that poll: its bytes wait in an outbox that
//! the worker's flusher sends, in the same place in the turn (`outbox`). This module's way
//! stays for TLS, whose records are made in the connection's task.

use std::future::poll_fn;
use std::task::{Context, Poll};

/// Puts the caller's next step off to the back of the run queue once: the first call (with
/// `done` false) wakes the task and returns `Pending`, the next (`done` now true) `Ready`.
pub fn poll_back_of_queue(done: &mut bool, cx: &mut Context<'_>) -> Poll<()> {
    if *done {
        return Poll::Ready(());
    }
    *done = true;
    cx.waker().wake_by_ref();
    Poll::Pending
}

/// [`poll_back_of_queue`] as a future: ready at the task's next poll.
pub async fn back_of_queue() {
    let mut done = false;
    poll_fn(|cx| poll_back_of_queue(&mut done, cx)).await;
}

#[cfg(test)]
mod tests {
    use std::cell::RefCell;
    use std::rc::Rc;

    use super::*;

    /// Two tasks that each log, wait for the back of the queue, and log again: the second's
    /// first step runs before the first's second, as HAProxy receives on every socket of a
    /// turn before it sends.
    #[test]
    fn a_put_off_step_runs_after_the_tasks_already_queued() {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .build()
            .expect("runtime");
        let local = tokio::task::LocalSet::new();
        let log = Rc::new(RefCell::new(Vec::new()));
        for name in ["a", "b"] {
            let log = Rc::clone(&log);
            local.spawn_local(async move {
                log.borrow_mut().push(format!("{name} read"));
                back_of_queue().await;
                log.borrow_mut().push(format!("{name} write"));
            });
        }
        runtime.block_on(local);
        assert_eq!(*log.borrow(), ["a read", "b read", "a write", "b write"]);
    }
}
