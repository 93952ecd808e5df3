//! The watcher: one task per listener (per set of [`Limits`]) that looks at the counters of
//! every connection it serves a few times per timeout, closes those whose timeout ran out,
//! drains them on shutdown, asks quiet HTTP/1 connections to park, adds their bytes to the
//! listener's counters and reaps their private idle backend connections.
//!
//! One task for all connections, not one each: a task, its timer and the channel that ended
//! it cost an idle connection about as much memory as its socket and its own task together
//! (see BENCHMARKS.md, "Memory per idle client connection"). A connection is a line in the
//! watcher's list (its [`ConnState`] and what the watcher remembers of it), added when it starts
//! and dropped at the first look after it ended.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

use tokio::sync::{watch, Notify};
use tokio::time::Instant;

use super::{Close, ConnState, Limits, Park, DRAIN_IDLE_GRACE, GOAWAY_GRACE};
use crate::lockstat::{self, Site};
use crate::upstream::PrivateIdle;

/// A listener's watcher, for the connections it accepts with one set of [`Limits`]. Cloning
/// it is cheap; its task ends once every handle is gone and so are its connections.
#[derive(Clone)]
pub(crate) struct Watch(Arc<Handle>);

/// What every [`Watch`] holds: the task sees through a `Weak` of it when the last one is
/// gone, and holds [`Inner`] itself, so that connections added just before (still in
/// `started`) are not lost with the handles.
struct Handle(Arc<Inner>);

impl Drop for Handle {
    fn drop(&mut self) {
        // A watcher asleep (no connection) wakes to end.
        self.0.wake.notify_one();
    }
}

struct Inner {
    limits: Limits,
    /// Connections started since the watcher's last look, taken in at its next.
    started: Mutex<Vec<Watched>>,
    /// Whether the balancer drains (a stop, or an upgrade's handover).
    draining: AtomicBool,
    /// Wakes a watcher asleep with no connection: one was added, or the last handle went.
    wake: Notify,
    /// The looks so far.
    #[cfg(test)]
    looks: std::sync::atomic::AtomicU64,
}

impl Watch {
    /// Starts the watcher of connections served with `limits`; `shutdown` says when the
    /// balancer drains. Needs a tokio runtime.
    pub(crate) fn start(limits: Limits, shutdown: watch::Receiver<bool>) -> Watch {
        let inner = Arc::new(Inner {
            limits,
            started: Mutex::new(Vec::new()),
            draining: AtomicBool::new(*shutdown.borrow()),
            wake: Notify::new(),
            #[cfg(test)]
            looks: std::sync::atomic::AtomicU64::new(0),
        });
        let handle = Arc::new(Handle(inner.clone()));
        tokio::spawn(run(inner, Arc::downgrade(&handle), shutdown));
        Watch(handle)
    }

    /// The watcher's looks so far.
    #[cfg(test)]
    fn looks(&self) -> u64 {
        self.0 .0.looks.load(Ordering::Relaxed)
    }

    /// The limits of the connections it watches.
    pub(crate) fn limits(&self) -> &Limits {
        &self.0 .0.limits
    }

    /// Watches a connection from now on, until `shared.ended` is set.
    pub(super) fn add(&self, shared: Arc<ConnState>, private: Weak<PrivateIdle>) {
        let inner = &self.0 .0;
        let mut started = lockstat::lock(&inner.started, Site::Watcher);
        // Read under the lock: the task marks `draining` before it takes `started`, so a line
        // it did not take in its drain's look sees the mark here.
        if inner.draining.load(Ordering::Relaxed) {
            // Every answer from now on says `Connection: close`, before the watcher's next look.
            shared.draining.store(true, Ordering::Relaxed);
        }
        started.push(Watched::new(shared, private, Instant::now()));
        if started.len() == 1 {
            // The watcher may be asleep, with no connection.
            inner.wake.notify_one();
        }
    }
}

/// The watcher's task: looks at every connection each period, and at once when the balancer
/// starts to drain; with no connection, it sleeps until one comes (an idle listener costs no
/// wakeup), looks at it at once and then every period. Ends when no [`Watch`] is left (the
/// listener moved on to other limits, or stopped) and its last connection has ended.
async fn run(inner: Arc<Inner>, handles: Weak<Handle>, mut shutdown: watch::Receiver<bool>) {
    let limits = inner.limits;
    let period = period(&limits);
    let mut tick = tokio::time::interval(period);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut lines: Vec<Watched> = Vec::new();
    let mut draining = *shutdown.borrow();
    loop {
        let now = tokio::select! {
            changed = shutdown.changed(), if !draining => {
                draining = changed.is_err() || *shutdown.borrow();
                if !draining {
                    continue;
                }
                Instant::now()
            }
            now = tick.tick(), if !lines.is_empty() => now,
            () = inner.wake.notified(), if lines.is_empty() => {
                tick.reset();
                Instant::now()
            }
        };
        // Read before `started` is taken: with no handle left, no connection can be added any
        // more, and what `started` holds now is its last.
        let orphaned = handles.strong_count() == 0;
        // The count is read relaxed: the fence orders the last handle's drop (a release)
        // and every push before it ahead of the take below.
        std::sync::atomic::fence(Ordering::Acquire);
        if draining {
            inner.draining.store(true, Ordering::Relaxed);
        }
        {
            let mut started = lockstat::lock(&inner.started, Site::Watcher);
            lines.append(&mut started);
            // Emptied, it would keep the capacity a burst of connections gave it (128 bytes a
            // connection that arrived within one period) for nothing while they stay.
            if started.capacity() > STARTED_KEPT {
                *started = Vec::new();
            }
        }
        lines.retain_mut(|line| line.look(&limits, period, draining, now));
        if PARKED_HERE.replace(0) > 0 {
            // What the connections parked since the last look freed, out of this thread's
            // allocator cache (`workers::release_cache`).
            crate::workers::release_cache();
        }
        #[cfg(test)]
        inner.looks.fetch_add(1, Ordering::Relaxed);
        if orphaned && lines.is_empty() {
            return;
        }
        if lines.capacity() > 2 * lines.len() + 64 {
            lines.shrink_to_fit();
        }
    }
}

thread_local! {
    /// Connections parked on this thread since a watcher here last looked.
    static PARKED_HERE: std::cell::Cell<u32> = const { std::cell::Cell::new(0) };
}

/// A connection parked on this thread: its freed memory is in this thread's allocator cache
/// until the next look of a watcher here gives it back (`run`).
pub(super) fn parked_here() {
    PARKED_HERE.set(PARKED_HERE.get().saturating_add(1));
}

/// The most lines `started` keeps room for between looks: a few new connections a period reuse
/// it, a burst's room is given back (`run`).
const STARTED_KEPT: usize = 64;

/// How often the watcher looks: a quarter of the shorter timeout, 20 ms to 1 s. A timeout
/// therefore fires between its value and its value plus this period.
fn period(limits: &Limits) -> Duration {
    (limits.idle_timeout.min(limits.header_read_timeout) / 4)
        .clamp(Duration::from_millis(20), Duration::from_secs(1))
}

/// One connection, and what the watcher remembers of it between looks.
struct Watched {
    shared: Arc<ConnState>,
    /// The connection's private idle backend connections (gone with the connection).
    private: Weak<PrivateIdle>,
    /// The counters at the last look (reads, writes, requests served).
    seen: (u64, u64, u64),
    /// Since when the connection has been quiet (see [`timed_out`]).
    quiet_since: Instant,
    /// Since when a request head has been arriving.
    head_since: Option<Instant>,
    /// Once it is being closed (a drain, or an HTTP/2 GOAWAY).
    closing: Option<Box<Closing>>,
}

/// What the watcher remembers of a connection it is closing: boxed, since a line's size is
/// paid by every connection while few are ever closed this way (a line is 80 bytes, not 120).
#[derive(Default)]
struct Closing {
    /// While draining: when the connection last moved a byte (or the drain began), and the
    /// byte counts then.
    drain_quiet: Option<(Instant, (u64, u64))>,
    /// When an HTTP/2 connection got its GOAWAY.
    goaway_since: Option<Instant>,
    /// Once `GOAWAY_GRACE` has passed: the streams started at the last look (see
    /// [`started`]), and whether that look saw more than the one before.
    after_grace: Option<(u64, bool)>,
}

impl Closing {
    /// The connection's GOAWAY, now (HTTP/2).
    fn goaway(&mut self, shared: &ConnState, now: Instant) {
        shared.close(Close::Graceful);
        self.goaway_since = Some(now);
    }
}

/// The streams an HTTP/2 connection has started so far: those done and those in progress
/// (a tunnel's hold counts as one more while it lives, and one less when it ends).
fn started(shared: &ConnState) -> u64 {
    let served = shared.served.load(Ordering::Relaxed);
    served + u64::from(shared.active.load(Ordering::Relaxed))
}

impl Watched {
    fn new(shared: Arc<ConnState>, private: Weak<PrivateIdle>, now: Instant) -> Watched {
        Watched {
            shared,
            private,
            seen: (0, 0, 0),
            quiet_since: now,
            head_since: None,
            closing: None,
        }
    }

    /// One look at the connection at `now`; whether to keep watching it.
    fn look(&mut self, limits: &Limits, period: Duration, draining: bool, now: Instant) -> bool {
        let shared = &*self.shared;
        if shared.ended.load(Ordering::Acquire) {
            return false;
        }
        let drain_begun = self
            .closing
            .as_ref()
            .is_some_and(|c| c.drain_quiet.is_some());
        if draining && !drain_begun {
            let closing = self.closing.get_or_insert_with(Box::default);
            closing.drain_quiet = Some((now, bytes_moved(shared)));
            shared.draining.store(true, Ordering::Relaxed);
            if shared.h2.load(Ordering::Relaxed) {
                // GOAWAY: the client opens no new stream here; those in progress finish.
                closing.goaway(shared, now);
            }
            // HTTP/1: the answer of every request from now on says `Connection: close`, and
            // the client opens its next connection elsewhere; a connection with no request in
            // progress that moves no byte for `DRAIN_IDLE_GRACE` is closed. (hyper's graceful
            // shutdown is not used: an answer it had already sent as keep-alive would be
            // followed by a close the client did not expect, racing its next request.)
            return true;
        }
        if let Some(sent) = self.closing.as_ref().and_then(|c| c.goaway_since) {
            // An HTTP/2 connection got its GOAWAY: gone by now, or dropped once its streams
            // are done, an idle one's too. Its first GOAWAY (last stream 2^31-1) lets in the
            // streams its client opened before it saw it, which are served as any other
            // (RFC 9113 section 6.8), not cut off with the connection.
            let waited = now.saturating_duration_since(sent) >= GOAWAY_GRACE;
            if waited && shared.active.load(Ordering::Relaxed) == 0 {
                shared.close(Close::Abort);
                return false;
            }
            // h2 lets new streams in until the client answers the first GOAWAY's PING, which
            // a client may never do: one that still starts streams after the grace (a round
            // trip is far less) ignores the GOAWAY, and would hold the connection open, its
            // requests forwarded all along. Streams started at two looks in a row, each
            // counted against the look before: a stream that ends between `started`'s two
            // loads is missed at that look and shows as one more at the next, once.
            if let Some(closing) = self.closing.as_mut().filter(|_| waited) {
                let now_started = started(shared);
                let (then, more_then) = closing.after_grace.unwrap_or((now_started, false));
                let more = now_started > then;
                if more && more_then {
                    tracing::debug!("streams started after a GOAWAY: connection dropped");
                    shared.close(Close::Abort);
                    return false;
                }
                closing.after_grace = Some((now_started, more));
            }
        } else if drain_begun && shared.h2.load(Ordering::Relaxed) {
            // Turned HTTP/2 after the drain began (its first bytes came after): its GOAWAY
            // now, or its client would go on opening streams until the shutdown's deadline.
            self.closing
                .get_or_insert_with(Box::default)
                .goaway(shared, now);
        } else {
            let drain = self.closing.as_mut().and_then(|c| c.drain_quiet.as_mut());
            let drained = drain.is_some();
            if let Some((since, moved)) = drain {
                let now_moved = bytes_moved(shared);
                if now_moved != *moved {
                    *since = now;
                    *moved = now_moved;
                } else if shared.active.load(Ordering::Relaxed) == 0
                    && now.saturating_duration_since(*since) >= DRAIN_IDLE_GRACE
                {
                    shared.close(Close::Abort);
                    return false;
                }
            }
            // While draining too: a head trickling a byte at a time moves a byte within every
            // grace, and would hold the drain until the shutdown's deadline.
            if timed_out(
                shared,
                limits,
                now,
                &mut self.seen,
                &mut self.quiet_since,
                &mut self.head_since,
            ) {
                if shared.h2.load(Ordering::Relaxed) {
                    self.closing
                        .get_or_insert_with(Box::default)
                        .goaway(shared, now);
                } else {
                    shared.close(Close::Abort);
                    return false;
                }
            } else if !drained && parkable(shared, now, self.quiet_since, period) {
                shared.ask_park();
            }
        }
        shared.count_bytes();
        if let Some(private) = self.private.upgrade() {
            private.reap();
        }
        true
    }
}

/// Whether an HTTP/1 connection can be parked (see `park.rs`): it served a request, has
/// none in progress and no head arriving, and moved no byte for a whole watcher period.
fn parkable(shared: &ConnState, now: Instant, quiet_since: Instant, period: Duration) -> bool {
    !shared.h2.load(Ordering::Relaxed)
        && shared.served.load(Ordering::Relaxed) > 0
        && shared.active.load(Ordering::Relaxed) == 0
        && shared.reads.load(Ordering::Relaxed) <= shared.reads_at_rest.load(Ordering::Relaxed)
        && now.saturating_duration_since(quiet_since) >= period
        && shared.park.load(Ordering::Relaxed) == Park::Serving
}

/// The bytes a connection has read and written so far.
fn bytes_moved(shared: &ConnState) -> (u64, u64) {
    (
        shared.reads.load(Ordering::Relaxed),
        shared.writes.load(Ordering::Relaxed),
    )
}

/// One look at the counters: whether a timeout has run out by `now`.
fn timed_out(
    shared: &ConnState,
    limits: &Limits,
    now: Instant,
    seen: &mut (u64, u64, u64),
    quiet_since: &mut Instant,
    head_since: &mut Option<Instant>,
) -> bool {
    let reads = shared.reads.load(Ordering::Relaxed);
    let counters = (
        reads,
        shared.writes.load(Ordering::Relaxed),
        shared.served.load(Ordering::Relaxed),
    );
    let h2 = shared.h2.load(Ordering::Relaxed);
    let wrote = counters.1 != seen.1;
    // HTTP/2 moves frames of its own (PING, SETTINGS, WINDOW_UPDATE): only streams count.
    let moved = if h2 {
        counters.2 != seen.2
    } else {
        counters != *seen
    };
    *seen = counters;
    if shared.active.load(Ordering::Relaxed) > 0 {
        *quiet_since = now;
        *head_since = None;
        return false;
    }
    // HTTP/2 has no head to time between requests: only idleness counts.
    if !h2 && reads > shared.reads_at_rest.load(Ordering::Relaxed) {
        // A head is arriving. (A write means a response is still going out, pipelined
        // requests queued behind it; the head's time starts after.)
        if wrote {
            *head_since = None;
        }
        let since = *head_since.get_or_insert(now);
        return now.saturating_duration_since(since) >= limits.header_read_timeout;
    }
    *head_since = None;
    if moved {
        *quiet_since = now;
    }
    now.saturating_duration_since(*quiet_since) >= limits.idle_timeout
}

#[cfg(test)]
mod tests {
    use super::super::tests::{limits, new_shared};
    use super::*;

    /// Looks at `shared` every second for `secs` seconds, bumping reads (and writes, if
    /// `writes`) before each look (a chatty peer); the second at which a timeout ran out, if
    /// one did.
    fn chatty_for(shared: &ConnState, secs: u64, writes: bool) -> Option<u64> {
        let start = Instant::now();
        let (mut seen, mut quiet, mut head) = ((0, 0, 0), start, None);
        (1..=secs).find(|s| {
            shared.reads.fetch_add(1, Ordering::Relaxed);
            if writes {
                shared.writes.fetch_add(1, Ordering::Relaxed);
            }
            let now = start + Duration::from_secs(*s);
            timed_out(shared, &limits(), now, &mut seen, &mut quiet, &mut head)
        })
    }

    #[test]
    fn http2_frames_without_a_stream_are_idle_time_not_a_head() {
        let shared = new_shared();
        shared.set_h2(&limits());
        // PINGs and acks every second, no stream: closed at idle_timeout, never as a slow head.
        assert_eq!(chatty_for(&shared, 30, true), Some(10));
        let shared = new_shared();
        shared.set_h2(&limits());
        assert_eq!(chatty_for(&shared, 30, false), Some(10));
    }

    #[test]
    fn http1_bytes_without_a_request_are_a_head_arriving() {
        // Bytes since the first look, no request: the head's 2 s run out at the third look.
        let shared = new_shared();
        assert_eq!(chatty_for(&shared, 30, false), Some(3));
    }

    #[test]
    fn an_http2_stream_in_progress_is_never_idle() {
        let shared = new_shared();
        shared.set_h2(&limits());
        shared.active.fetch_add(1, Ordering::Relaxed);
        assert_eq!(chatty_for(&shared, 60, true), None);
    }

    #[test]
    fn a_line_is_80_bytes() {
        // Paid by every connection, for its whole life (`Closing` boxed apart).
        assert!(std::mem::size_of::<Watched>() <= 80);
    }

    /// Connections that parked on a watcher's thread: its next look gives the thread's allocator
    /// cache back, once; a look after no park does not.
    #[tokio::test(start_paused = true)]
    async fn a_look_after_parks_on_its_thread_releases_the_allocator_cache() {
        static RELEASED: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
        crate::workers::set_cache_release(|| {
            RELEASED.fetch_add(1, Ordering::Relaxed);
        });
        let (_tx, shutdown) = watch::channel(false);
        let watch = Watch::start(limits(), shutdown);
        let shared = Arc::new(new_shared());
        watch.add(shared.clone(), Weak::new());
        tokio::time::sleep(Duration::from_millis(100)).await;
        assert_eq!(RELEASED.load(Ordering::Relaxed), 0);
        parked_here();
        parked_here();
        tokio::time::sleep(Duration::from_secs(1)).await;
        assert_eq!(RELEASED.load(Ordering::Relaxed), 1);
        tokio::time::sleep(Duration::from_secs(2)).await;
        assert_eq!(RELEASED.load(Ordering::Relaxed), 1);
        shared.ended.store(true, Ordering::Release);
    }

    /// Connections of one watcher: an idle one is closed after `idle_timeout` (within a period),
    /// an ended one leaves the list, and the task ends once its handles and connections are
    /// gone.
    #[tokio::test(start_paused = true)]
    async fn one_task_times_out_its_connections_and_ends_with_them() {
        let (tx, shutdown) = watch::channel(false);
        let watch = Watch::start(limits(), shutdown);
        let idle = Arc::new(new_shared());
        let busy = Arc::new(new_shared());
        busy.active.fetch_add(1, Ordering::Relaxed);
        watch.add(idle.clone(), Weak::new());
        watch.add(busy.clone(), Weak::new());
        tokio::time::sleep(Duration::from_millis(9_900)).await;
        assert_eq!(idle.close.load(Ordering::Relaxed), Close::Open);
        tokio::time::sleep(Duration::from_millis(600)).await;
        assert_eq!(idle.close.load(Ordering::Relaxed), Close::Abort);
        assert_eq!(busy.close.load(Ordering::Relaxed), Close::Open);
        drop(watch);
        tokio::time::sleep(Duration::from_secs(2)).await;
        // The busy connection keeps the task: it still holds its line.
        assert_eq!(Arc::strong_count(&busy), 2);
        assert_eq!(tx.receiver_count(), 1);
        busy.ended.store(true, Ordering::Release);
        tokio::time::sleep(Duration::from_secs(2)).await;
        assert_eq!(Arc::strong_count(&busy), 1);
        assert_eq!(Arc::strong_count(&idle), 1);
        // The task has ended: its receiver of the shutdown signal is gone.
        assert_eq!(tx.receiver_count(), 0);
    }

    /// A drain reaches every connection at once, not at the next period: an HTTP/2 one gets
    /// its GOAWAY, an HTTP/1 one answers with `Connection: close` from then on, and one added
    /// while draining too.
    #[tokio::test(start_paused = true)]
    async fn a_drain_reaches_every_connection_at_once() {
        let (tx, shutdown) = watch::channel(false);
        let watch = Watch::start(limits(), shutdown);
        let h1 = Arc::new(new_shared());
        let h2 = Arc::new(new_shared());
        h2.set_h2(&limits());
        watch.add(h1.clone(), Weak::new());
        watch.add(h2.clone(), Weak::new());
        tokio::time::sleep(Duration::from_millis(10)).await;
        tx.send_replace(true);
        tokio::task::yield_now().await;
        tokio::task::yield_now().await;
        assert!(h1.draining.load(Ordering::Relaxed));
        assert_eq!(h2.close.load(Ordering::Relaxed), Close::Graceful);
        let late = Arc::new(new_shared());
        watch.add(late.clone(), Weak::new());
        assert!(late.draining.load(Ordering::Relaxed));
        // Quiet for `DRAIN_IDLE_GRACE`: the HTTP/1 connections are closed.
        tokio::time::sleep(DRAIN_IDLE_GRACE + Duration::from_millis(600)).await;
        assert_eq!(h1.close.load(Ordering::Relaxed), Close::Abort);
        assert_eq!(late.close.load(Ordering::Relaxed), Close::Abort);
    }

    /// Regression: a connection whose protocol was not known yet when the drain began
    /// (accepted just before it, its h2c preface or its first bytes after a TLS handshake
    /// that chose h2 coming after) turned HTTP/2 with no GOAWAY: a client that kept its
    /// streams going held the drain until the shutdown's deadline, and was then cut off
    /// mid-request.
    #[tokio::test(start_paused = true)]
    async fn a_connection_that_turns_http2_while_draining_gets_its_goaway() {
        let (tx, shutdown) = watch::channel(false);
        let watch = Watch::start(limits(), shutdown);
        let late = Arc::new(new_shared());
        watch.add(late.clone(), Weak::new());
        tokio::time::sleep(Duration::from_millis(10)).await;
        tx.send_replace(true);
        tokio::task::yield_now().await;
        tokio::task::yield_now().await;
        assert!(late.draining.load(Ordering::Relaxed));
        assert_eq!(late.close.load(Ordering::Relaxed), Close::Open);
        // Its preface, then a stream every 100 ms, each answered.
        late.set_h2(&limits());
        let streams = |count: u64| {
            let late = late.clone();
            async move {
                for _ in 0..count {
                    late.reads.fetch_add(100, Ordering::Relaxed);
                    late.served.fetch_add(1, Ordering::Relaxed);
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
            }
        };
        streams(5).await;
        assert_eq!(late.close.load(Ordering::Relaxed), Close::Graceful);
        // Dropped once its grace has passed with no stream in progress.
        streams(20).await;
        assert_eq!(late.close.load(Ordering::Relaxed), Close::Abort);
    }

    /// An HTTP/2 connection closed for idleness: a stream that crossed its GOAWAY keeps it
    /// open while in progress; a client that ignores the GOAWAY (never answers its PING, h2
    /// then lets its new streams in) and goes on starting streams is dropped a couple of
    /// looks after the grace.
    #[tokio::test(start_paused = true)]
    async fn streams_started_after_a_goaways_grace_drop_the_connection() {
        let (_tx, shutdown) = watch::channel(false);
        let watch = Watch::start(limits(), shutdown);
        let conn = Arc::new(new_shared());
        conn.set_h2(&limits());
        watch.add(conn.clone(), Weak::new());
        tokio::time::sleep(Duration::from_millis(10_600)).await;
        assert_eq!(conn.close.load(Ordering::Relaxed), Close::Graceful);
        // A slow stream that crossed the GOAWAY: in progress well past the grace.
        conn.active.fetch_add(1, Ordering::Relaxed);
        tokio::time::sleep(Duration::from_secs(5)).await;
        assert_eq!(conn.close.load(Ordering::Relaxed), Close::Graceful);
        // New streams, one every 100 ms.
        for _ in 0..30 {
            conn.served.fetch_add(1, Ordering::Relaxed);
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        assert_eq!(conn.close.load(Ordering::Relaxed), Close::Abort);
    }

    /// One more stream seen at one look after a GOAWAY's grace (a stream that ended between
    /// `started`'s two loads, counted at the next look) is not a client ignoring the GOAWAY:
    /// the connection stays until its streams are done. Counted against the first look after
    /// the grace instead of the one before, it was dropped at the second look after.
    #[tokio::test(start_paused = true)]
    async fn one_stream_more_at_one_look_after_a_goaways_grace_keeps_the_connection() {
        let (_tx, shutdown) = watch::channel(false);
        let watch = Watch::start(limits(), shutdown);
        let conn = Arc::new(new_shared());
        conn.set_h2(&limits());
        watch.add(conn.clone(), Weak::new());
        tokio::time::sleep(Duration::from_millis(10_600)).await;
        assert_eq!(conn.close.load(Ordering::Relaxed), Close::Graceful);
        conn.active.fetch_add(1, Ordering::Relaxed);
        tokio::time::sleep(Duration::from_secs(3)).await;
        conn.served.fetch_add(1, Ordering::Relaxed);
        tokio::time::sleep(Duration::from_secs(3)).await;
        assert_eq!(conn.close.load(Ordering::Relaxed), Close::Graceful);
        // Its stream done: dropped.
        conn.active.fetch_sub(1, Ordering::Relaxed);
        tokio::time::sleep(Duration::from_secs(1)).await;
        assert_eq!(conn.close.load(Ordering::Relaxed), Close::Abort);
    }

    /// Regression: a connection added after the watcher's last look, just before the listener
    /// let go of its last handle (a reload that changed the limits starts another watcher at
    /// the next accept, a removed or stopped listener drops it), was lost with the handles:
    /// never timed out, never drained.
    #[tokio::test(start_paused = true)]
    async fn a_connection_added_just_before_the_last_handle_went_is_still_timed_out() {
        let (_tx, shutdown) = watch::channel(false);
        let watch = Watch::start(limits(), shutdown);
        // Past the watcher's first look.
        tokio::time::sleep(Duration::from_millis(10)).await;
        let idle = Arc::new(new_shared());
        watch.add(idle.clone(), Weak::new());
        drop(watch);
        tokio::time::sleep(Duration::from_millis(10_600)).await;
        assert_eq!(idle.close.load(Ordering::Relaxed), Close::Abort);
        // Then the task ended, its line dropped.
        tokio::time::sleep(Duration::from_secs(1)).await;
        assert_eq!(Arc::strong_count(&idle), 1);
    }

    /// Regression: the same when the balancer shuts down, which stops the accept loop (its
    /// handle gone) as it tells the watcher to drain: the connection is drained at once.
    #[tokio::test(start_paused = true)]
    async fn a_connection_added_just_before_shutdown_stops_the_listener_is_drained() {
        let (tx, shutdown) = watch::channel(false);
        let watch = Watch::start(limits(), shutdown);
        tokio::time::sleep(Duration::from_millis(10)).await;
        let h1 = Arc::new(new_shared());
        let h2 = Arc::new(new_shared());
        h2.set_h2(&limits());
        watch.add(h1.clone(), Weak::new());
        watch.add(h2.clone(), Weak::new());
        tx.send_replace(true);
        drop(watch);
        tokio::task::yield_now().await;
        tokio::task::yield_now().await;
        assert!(h1.draining.load(Ordering::Relaxed));
        assert_eq!(h2.close.load(Ordering::Relaxed), Close::Graceful);
        tokio::time::sleep(DRAIN_IDLE_GRACE + Duration::from_millis(600)).await;
        assert_eq!(h1.close.load(Ordering::Relaxed), Close::Abort);
        assert_eq!(h2.close.load(Ordering::Relaxed), Close::Abort);
        assert_eq!(
            tx.receiver_count(),
            0,
            "the task ended with its connections"
        );
    }

    /// A watcher with no connection sleeps (an idle listener costs no wakeup) until one is
    /// added, which it looks at at once and then every period; and it still ends once its
    /// handles are gone while it sleeps.
    #[tokio::test(start_paused = true)]
    async fn a_watcher_without_connections_sleeps_until_one_comes() {
        let (tx, shutdown) = watch::channel(false);
        let watch = Watch::start(limits(), shutdown);
        tokio::time::sleep(Duration::from_secs(3600)).await;
        assert!(watch.looks() <= 1, "{} looks in an hour", watch.looks());
        let idle = Arc::new(new_shared());
        watch.add(idle.clone(), Weak::new());
        tokio::task::yield_now().await;
        let looks = watch.looks();
        // Timed out as ever: after idle_timeout, within a period.
        tokio::time::sleep(Duration::from_millis(9_900)).await;
        assert_eq!(idle.close.load(Ordering::Relaxed), Close::Open);
        assert!(
            watch.looks() >= looks + 19,
            "{} looks",
            watch.looks() - looks
        );
        tokio::time::sleep(Duration::from_millis(600)).await;
        assert_eq!(idle.close.load(Ordering::Relaxed), Close::Abort);
        // Its line gone, the watcher sleeps again; then its handles go.
        tokio::time::sleep(Duration::from_secs(3600)).await;
        assert!(
            watch.looks() <= looks + 25,
            "{} looks",
            watch.looks() - looks
        );
        drop(watch);
        tokio::time::sleep(Duration::from_secs(1)).await;
        assert_eq!(tx.receiver_count(), 0, "the task ended");
    }

    /// What one look at 10,000 idle HTTP/1 connections costs (each with its set of private
    /// backend connections, empty): the median of 101 looks. A measurement, printed, for
    /// BENCHMARKS.md; run in release:
    /// `cargo test -p capataz --release --lib look_at_ten_thousand -- --ignored --nocapture`.
    #[test]
    #[ignore = "a measurement, to run in release"]
    fn look_at_ten_thousand_idle_connections() {
        let limits = limits();
        let period = period(&limits);
        let start = Instant::now();
        let privates: Vec<Arc<PrivateIdle>> =
            (0..10_000).map(|_| Arc::new(PrivateIdle::new())).collect();
        let mut lines: Vec<Watched> = privates
            .iter()
            .map(|private| {
                let shared = Arc::new(new_shared());
                shared.served.store(1, Ordering::Relaxed);
                // Parked already: the look finds nothing to do but its counters.
                shared
                    .park
                    .store(super::super::Park::Parked, Ordering::Relaxed);
                Watched::new(shared, Arc::downgrade(private), start)
            })
            .collect();
        let mut took: Vec<std::time::Duration> = (1..=101)
            .map(|n| {
                let now = start + Duration::from_millis(n);
                let began = std::time::Instant::now();
                lines.retain_mut(|line| line.look(&limits, period, false, now));
                began.elapsed()
            })
            .collect();
        assert_eq!(lines.len(), 10_000);
        took.sort();
        println!(
            "one look at 10,000 idle connections: median {:?} (min {:?}, max {:?})",
            took[50], took[0], took[100]
        );
    }
}
