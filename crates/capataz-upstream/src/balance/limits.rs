//! Connection limits and the pool's queue ([`Limits`]): each backend holds at most its limit
//! of requests at once (HAProxy's `maxconn`, Envoy's `max_requests`), and a request that finds
//! every eligible backend at its limit waits in a bounded FIFO queue for a free slot (HAProxy's
//! `timeout queue`, Envoy's `max_pending_requests`), or is refused.
//!
//! The count a limit bounds is the backend's `in_flight`, the one the picker, `/status` and the
//! metrics read: a slot is taken by a compare-and-swap below the limit, so the limit is never
//! exceeded, and given back when the request's [`Lease`](crate::body::Lease) ends. A limit
//! ramps with the backend's weight in the engine's snapshot (slow start, agent weight, load
//! shedding): `limit x weight now / configured weight`, at least 1.
//!
//! The queue hands slots over: whoever frees one (a lease ending, a waiter leaving with a slot
//! it did not use) or makes one usable (a new snapshot: a backend back, a weight step) takes a
//! slot for the head of the queue, under the queue's lock, and wakes it; the waiter finds its
//! backend granted. So a slot freed while requests wait goes to the oldest, never to a later
//! arrival, and a waiter woken is never refused for a race. The lock is held for a pick and a
//! few pointer moves, never across an await. A request arriving while nobody waits takes a
//! slot without the lock; a release checks the queue's length after its decrement, and an
//! arrival publishes its place before its last look at the slots (both with a `SeqCst` fence),
//! so a slot is never left free while a request waits. One release the queue cannot hear: a
//! request sent by the pool's previous build (a membership update shares kept backends and
//! their counts between builds) ends through the old build's queue; the queue's head looks for
//! a free slot itself every [`RECHECK`] for that.
//!
//! Invariants: the queue never holds more than `queue_size` requests; a request leaves it by
//! a slot, by a timeout, by the pool losing every eligible backend (the all-down policy
//! answers), or by its client going away, and in every case any slot granted to it is given
//! back.

use std::collections::VecDeque;
use std::sync::atomic::{fence, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use capataz_config::PoolConfig;
use capataz_health::rotation::ramp::full_tenths;
use tokio::sync::Notify;
use tokio::time::Instant;

use super::{PoolHandle, Snapshot};
use crate::instruments::{PoolMetrics, QueueMetrics};

/// A waiter's grant before it has one.
const NOTHING: usize = usize::MAX;
/// A waiter's grant when the pool has no eligible backend left.
const REFUSED: usize = usize::MAX - 1;
/// How often the queue's head looks for a free slot itself: a safety net for a slot whose
/// release this queue does not hear of (a request sent by the pool's previous build, after a
/// membership update, ends on a backend both builds share).
const RECHECK: Duration = Duration::from_millis(100);

/// One pool's limits and queue.
#[derive(Debug)]
pub struct Limits {
    /// Each backend's configured limit, in pool order (`None`: it has none).
    caps: Vec<Option<u32>>,
    queue_size: usize,
    queue_timeout: Duration,
    /// The queue's length, readable without the lock (written under it).
    waiting: AtomicUsize,
    queue: Mutex<VecDeque<Arc<Waiter>>>,
    metrics: QueueMetrics,
    /// Looks waiters took at the queue's head (tests count them: only the head keeps looking).
    #[cfg(test)]
    rechecks: AtomicUsize,
}

/// One request in the queue.
#[derive(Debug)]
struct Waiter {
    /// The backend whose slot it was granted, [`NOTHING`] yet, or [`REFUSED`].
    grant: AtomicUsize,
    woken: Notify,
}

/// What a request's attempt gets from a pool with limits.
#[derive(Debug)]
pub enum Admit<'a> {
    /// A slot on a backend, and how long the request waited in the queue for it (`None`: it
    /// did not wait).
    Granted(Admission<'a>, Option<Duration>),
    /// No eligible backend it has not tried: as the picker finding none (the all-down policy,
    /// or the last failure, answers). `waited`: as in `Granted`.
    NoBackend(Option<Duration>),
    /// A retry found every eligible backend it has not tried at its limit (retries do not
    /// queue).
    Busy,
    /// Every eligible backend is at its limit and the queue is full.
    QueueFull,
    /// The request waited `queue_timeout` without a slot.
    TimedOut(Duration),
}

/// A slot held on backend `index` of a pool with limits: its `in_flight` counted. Given back
/// when dropped, unless a lease takes it over ([`crate::body::Lease::admitted`]).
#[derive(Debug)]
pub struct Admission<'a> {
    pool: &'a PoolHandle,
    index: usize,
}

impl Admission<'_> {
    /// The backend the slot is on.
    pub fn index(&self) -> usize {
        self.index
    }

    /// Hands the slot over to whoever ends it (a lease): it is no longer given back here.
    pub(crate) fn keep(self) -> usize {
        let index = self.index;
        std::mem::forget(self);
        index
    }
}

impl Drop for Admission<'_> {
    fn drop(&mut self) {
        release(self.pool, self.index);
    }
}

/// Gives back a slot of backend `index` of `pool` (its `in_flight` count), and in a pool with
/// limits hands it to the queue's head if one waits.
#[inline]
pub fn release(pool: &PoolHandle, index: usize) {
    pool.backends[index]
        .in_flight
        .fetch_sub(1, Ordering::Relaxed);
    if let Some(limits) = &pool.limits {
        limits.released(pool);
    }
}

/// Takes a slot on a backend whose `in_flight` count is given: below `limit` (compare and swap),
/// or always without one. Whether it was taken.
fn hold(in_flight: &AtomicUsize, limit: Option<usize>) -> bool {
    match limit {
        None => {
            in_flight.fetch_add(1, Ordering::Relaxed);
            true
        }
        Some(limit) => in_flight
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |n| {
                (n < limit).then_some(n + 1)
            })
            .is_ok(),
    }
}

/// What one look at the slots found.
enum Taken {
    Slot(usize),
    /// No eligible backend left to try.
    NoBackend,
    /// Every eligible backend left to try is at its limit.
    Full,
}

impl Limits {
    /// The limits of `config`, if it sets any, counting into the queue handles of `metrics`
    /// (made only then: a pool without limits has no queue series).
    pub fn new(config: &PoolConfig, metrics: &PoolMetrics) -> Option<Limits> {
        let limits = config.limits?;
        let metrics = metrics.queue();
        Some(Limits {
            caps: config
                .backends
                .iter()
                .map(|b| b.limit.or(limits.default).map(|n| n.get()))
                .collect(),
            queue_size: limits.queue_size as usize,
            queue_timeout: limits.queue_timeout,
            waiting: AtomicUsize::new(0),
            queue: Mutex::new(VecDeque::new()),
            metrics,
            #[cfg(test)]
            rechecks: AtomicUsize::new(0),
        })
    }

    /// Requests waiting now.
    pub fn queued(&self) -> usize {
        self.waiting.load(Ordering::Relaxed)
    }

    /// Requests the queue refused because it was full, and after `queue_timeout`:
    /// `capataz_queue_rejected_total`'s two series, read from their handles.
    pub fn refused(&self) -> (u64, u64) {
        (self.metrics.full.get(), self.metrics.timeout.get())
    }

    /// The most requests that may wait.
    pub fn queue_size(&self) -> usize {
        self.queue_size
    }

    /// The longest a request waits.
    pub fn queue_timeout(&self) -> Duration {
        self.queue_timeout
    }

    /// Backend `backend`'s limit as `snapshot` weighs it (`None`: it has none): its configured
    /// limit scaled by its weight now over its configured weight, at least 1.
    pub fn limit(&self, pool: &PoolHandle, snapshot: &Snapshot, backend: usize) -> Option<usize> {
        let configured = pool.backends[backend].weight;
        let now = snapshot.weight(backend).unwrap_or(full_tenths(configured));
        self.limit_weighing(backend, now, configured)
    }

    /// Backend `backend`'s limit when it weighs `weight` tenths and is configured with weight
    /// `configured` (`None`: it has none).
    pub fn limit_weighing(&self, backend: usize, weight: u32, configured: u32) -> Option<usize> {
        let cap = (*self.caps.get(backend)?)?;
        Some(scaled(cap, weight, full_tenths(configured)))
    }

    /// Whether backend `backend` holds its limit now.
    pub fn at_limit(&self, pool: &PoolHandle, snapshot: &Snapshot, backend: usize) -> bool {
        self.limit(pool, snapshot, backend)
            .is_some_and(|limit| pool.backends[backend].in_flight.load(Ordering::Relaxed) >= limit)
    }

    /// A slot on backend `index` itself (the one a request's affinity names: in rotation, or
    /// draining and keeping its sticky clients), if it has one free and nobody waits in the
    /// queue (a waiter is served first); `None` otherwise.
    pub fn admit_on<'a>(&self, pool: &'a PoolHandle, index: usize) -> Option<Admission<'a>> {
        if self.waiting.load(Ordering::Relaxed) > 0 {
            return None;
        }
        let in_flight = &pool.backends.get(index)?.in_flight;
        let limit = self.limit(pool, &pool.snapshot(), index);
        let held = hold(in_flight, limit);
        // Made only when held: an `Admission` dropped gives its slot back (`then_some` would
        // build it, and drop it, whether held or not).
        held.then(|| Admission { pool, index })
    }

    /// A slot for an attempt that has tried `exclude`: at once if a backend it has not tried
    /// has one; else, for a first attempt, after waiting its turn in the queue.
    pub async fn admit<'a>(&self, pool: &'a PoolHandle, exclude: &[usize]) -> Admit<'a> {
        let first = exclude.is_empty();
        if !first || self.waiting.load(Ordering::Relaxed) == 0 {
            match self.take(pool, exclude, first) {
                Taken::Slot(index) => return Admit::Granted(Admission { pool, index }, None),
                Taken::NoBackend => return Admit::NoBackend(None),
                Taken::Full if !first => return Admit::Busy,
                Taken::Full => {}
            }
        }
        if self.queue_size == 0 {
            self.metrics.full.inc();
            return Admit::QueueFull;
        }
        let waiter = {
            let mut queue = self.lock();
            if queue.is_empty() {
                // Say a request waits before the last look at the slots: a release that did
                // not see it has already made its slot visible (see the module's doc).
                self.waiting.store(1, Ordering::Relaxed);
                fence(Ordering::SeqCst);
                match self.take(pool, exclude, false) {
                    Taken::Full => {}
                    taken => {
                        self.waiting.store(0, Ordering::Relaxed);
                        return match taken {
                            Taken::Slot(index) => Admit::Granted(Admission { pool, index }, None),
                            _ => Admit::NoBackend(None),
                        };
                    }
                }
            } else if pool.snapshot().eligible.is_empty() {
                // The waiters are being sent to the all-down answer: so is this one.
                return Admit::NoBackend(None);
            } else if queue.len() >= self.queue_size {
                drop(queue);
                self.metrics.full.inc();
                return Admit::QueueFull;
            }
            let waiter = Arc::new(Waiter {
                grant: AtomicUsize::new(NOTHING),
                woken: Notify::new(),
            });
            queue.push_back(waiter.clone());
            self.waiting.store(queue.len(), Ordering::Relaxed);
            waiter
        };
        let queued = Queued {
            limits: self,
            pool,
            waiter,
            since: Instant::now(),
            settled: false,
        };
        let timed_out = queued.wait().await;
        queued.end(timed_out)
    }

    /// Called after a slot was given back: hands it to the queue's head if one waits.
    #[inline]
    pub(crate) fn released(&self, pool: &PoolHandle) {
        // Pairs with the arrival's fence: either it sees the slot free, or this sees it wait.
        fence(Ordering::SeqCst);
        if self.waiting.load(Ordering::Relaxed) > 0 {
            self.dispatch(pool);
        }
    }

    /// Called after a new snapshot: backends may have slots now (one back, a weight step), or
    /// none may be left (every waiter then gets the all-down policy's answer).
    pub fn republished(&self, pool: &PoolHandle) {
        if self.waiting.load(Ordering::Relaxed) > 0 {
            self.dispatch(pool);
        }
    }

    /// Grants slots to the queue's head, in order, while there are slots to grant.
    fn dispatch(&self, pool: &PoolHandle) {
        let mut queue = self.lock();
        let mut granted = false;
        while !queue.is_empty() {
            let grant = match self.take(pool, &[], true) {
                Taken::Slot(index) => index,
                Taken::NoBackend => REFUSED,
                Taken::Full => break,
            };
            // The loop runs while the queue is not empty.
            let Some(waiter) = queue.pop_front() else {
                break;
            };
            waiter.grant.store(grant, Ordering::Release);
            waiter.woken.notify_one();
            granted = true;
        }
        if granted {
            wake_head(&queue);
        }
        self.waiting.store(queue.len(), Ordering::Relaxed);
    }

    /// One look for a slot on an eligible backend not in `exclude`, taken if found.
    fn take(&self, pool: &PoolHandle, exclude: &[usize], advance: bool) -> Taken {
        let snapshot = pool.snapshot();
        if snapshot.eligible.iter().all(|b| exclude.contains(b)) {
            return Taken::NoBackend;
        }
        let mut advance = advance;
        // Each failed hold means another request took that slot just now; the backend is
        // then at its limit and skipped, so this ends.
        for _ in 0..=snapshot.eligible.len() {
            let picked = snapshot.pick_where(
                pool.config.algorithm,
                (&pool.cursor, advance),
                |b| exclude.contains(&b) || self.at_limit(pool, &snapshot, b),
                |b| pool.backends[b].in_flight.load(Ordering::Relaxed),
            );
            advance = false;
            let Some(index) = picked else {
                return Taken::Full;
            };
            let in_flight = &pool.backends[index].in_flight;
            let held = hold(in_flight, self.limit(pool, &snapshot, index));
            if held {
                return Taken::Slot(index);
            }
        }
        Taken::Full
    }

    /// The queue's head looks for a free slot itself (see [`RECHECK`]); whether `waiter` is
    /// the head.
    fn recheck(&self, pool: &PoolHandle, waiter: &Arc<Waiter>) -> bool {
        #[cfg(test)]
        self.rechecks.fetch_add(1, Ordering::Relaxed);
        let head = self.lock().front().is_some_and(|w| Arc::ptr_eq(w, waiter));
        if head {
            self.dispatch(pool);
        }
        head
    }

    fn lock(&self) -> MutexGuard<'_, VecDeque<Arc<Waiter>>> {
        // Nothing panics while holding it; a poisoned queue is still a consistent list.
        crate::lockstat::lock(&self.queue, crate::lockstat::Site::Queue)
    }

    /// Takes `waiter` out of the queue if it is still there (`None`), else returns what it was
    /// granted.
    fn leave(&self, waiter: &Arc<Waiter>) -> Option<usize> {
        let mut queue = self.lock();
        if let Some(at) = queue.iter().position(|w| Arc::ptr_eq(w, waiter)) {
            queue.remove(at);
            if at == 0 {
                wake_head(&queue);
            }
            self.waiting.store(queue.len(), Ordering::Relaxed);
            return None;
        }
        Some(waiter.grant.load(Ordering::Acquire))
    }
}

/// A request in the queue; if dropped there (its client went away), it leaves the queue, and
/// gives back a slot granted to it meanwhile.
struct Queued<'l, 'a> {
    limits: &'l Limits,
    pool: &'a PoolHandle,
    waiter: Arc<Waiter>,
    since: Instant,
    /// Whether `end` settled it (nothing left to give back).
    settled: bool,
}

impl<'a> Queued<'_, 'a> {
    /// Waits for a grant until `queue_timeout` (`true`: timed out), the queue's head looking
    /// for a free slot every [`RECHECK`] meanwhile. The others sleep until woken (a grant, or
    /// made the head) or their deadline: a long queue costs no timer storm (each of 100,000
    /// waiters waking every [`RECHECK`] kept a core busy).
    async fn wait(&self) -> bool {
        let deadline = self.since + self.limits.queue_timeout;
        // Whether it was the head at its last look (a newcomer looks once, after `RECHECK`).
        let mut head = true;
        loop {
            let wake = match head {
                true => deadline.min(Instant::now() + RECHECK),
                false => deadline,
            };
            let _ = tokio::time::timeout_at(wake, self.waiter.woken.notified()).await;
            if self.waiter.grant.load(Ordering::Acquire) != NOTHING {
                return false;
            }
            if Instant::now() >= deadline {
                return true;
            }
            head = self.limits.recheck(self.pool, &self.waiter);
        }
    }

    /// What the wait came to, woken or (`timed_out`) not.
    fn end(mut self, timed_out: bool) -> Admit<'a> {
        let waited = self.since.elapsed();
        self.limits.metrics.wait.observe(waited.as_secs_f64());
        self.settled = true;
        let grant = if timed_out {
            // Still queued: out, and timed out; granted just as the time ran out: used.
            self.limits.leave(&self.waiter)
        } else {
            Some(self.waiter.grant.load(Ordering::Acquire))
        };
        match grant {
            None | Some(NOTHING) => {
                self.limits.metrics.timeout.inc();
                Admit::TimedOut(waited)
            }
            Some(REFUSED) => Admit::NoBackend(Some(waited)),
            Some(index) => Admit::Granted(
                Admission {
                    pool: self.pool,
                    index,
                },
                Some(waited),
            ),
        }
    }
}

impl Drop for Queued<'_, '_> {
    fn drop(&mut self) {
        if self.settled {
            return;
        }
        self.limits
            .metrics
            .wait
            .observe(self.since.elapsed().as_secs_f64());
        if let Some(grant) = self.limits.leave(&self.waiter) {
            if grant < REFUSED {
                release(self.pool, grant);
            }
        }
    }
}

/// Tells the queue's head it is the head now (it then looks for a free slot every
/// [`RECHECK`]); called, under the lock, when the head left or was granted a slot.
fn wake_head(queue: &VecDeque<Arc<Waiter>>) {
    if let Some(head) = queue.front() {
        head.woken.notify_one();
    }
}

/// `cap` scaled by `weight` over `configured` (both in tenths), at least 1 and at most `cap`.
fn scaled(cap: u32, weight: u32, configured: u32) -> usize {
    let scaled = u64::from(cap) * u64::from(weight) / u64::from(configured.max(1));
    scaled.clamp(1, u64::from(cap)) as usize
}

#[cfg(test)]
mod tests;
