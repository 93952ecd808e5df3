//! Writes put off to the end of the runtime's turn and sent there by the worker's flusher.
//!
//! [`turn`](crate::turn) puts a connection's first write of a flush off by waking its task and
//! returning `Pending` once: the write is made by a second poll of the whole task (hyper's
//! dispatcher, the service's future, the exchange), about 650 user-space instructions for a
//! client's answer and 1,000 for a backend's request. An [`Outbox`] does the same with no
//! second poll: the write's bytes are copied into it, it joins its thread's queue, and the
//! worker's [`Flusher`] (a task of its own, woken by the turn's first queued outbox, so queued
//! behind the tasks the IO driver woke) sends every queued outbox's bytes in one poll. The
//! owner is told only when something went wrong: the socket did not take all of it (the owner
//! sends the rest itself, waiting for the socket as any write does), or the send failed (the
//! owner's next write, flush or check gets the error).
//!
//! The flusher writes on the owner's socket by its file descriptor, so a descriptor closed and
//! reused meanwhile would get another connection's bytes. It never can: the outbox's state
//! (the descriptor, the bytes) is behind a lock that the flusher holds while it sends, and the
//! owner takes the descriptor away under that lock when its [`Outbox`] is dropped, which the
//! owner does before its socket closes (a field declared before the socket's, or a value
//! dropped before it). An outbox dropped with bytes still held drops them, as a task dropped
//! before its put-off write never made it; a client connection's (`sending_when_dropped`)
//! gives them to the socket then, as far as it takes them at once: its writes were final, and
//! its owner (hyper's connection ended by an error, or an upgraded connection's tunnel ended
//! by a reset) may drop the socket with no flush or shutdown after them.
//!
//! Only on a thread whose current-thread runtime runs a [`Flusher`] ([`start_flusher`]:
//! capataz's workers, `workers.rs`, and a balancer on a runtime of its own), only for plain
//! sockets (TLS encrypts in the owner's task), and at most [`MAX_HELD`] bytes held: there is no
//! outbox ([`Outbox::for_socket`]) or [`Outbox::hold`] says no otherwise, and the caller puts
//! its write off with `turn` or writes at once, as before. The thread's queue is a
//! thread-local with no lock: the flusher is a task of that thread's runtime, and so are the
//! outboxes' owners.

use std::cell::RefCell;
use std::future::Future;
use std::io::{self, IoSlice, Write};
use std::mem::ManuallyDrop;
use std::os::fd::{FromRawFd, RawFd};
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::task::{Context, Poll, Waker};

use tokio::io::AsyncWrite;

/// The most bytes an outbox holds; a write that would make it more goes at once (after what
/// is held). Answers and request heads this size or smaller are what gains from the turn's
/// order; larger ones take several sends either way.
pub const MAX_HELD: usize = 16 * 1024;

/// A socket's writes held for its thread's [`Flusher`]; see the module docs. Dropping it takes
/// the socket's descriptor away from the flusher: drop it before the socket closes. Made by
/// [`Outbox::for_socket`].
#[derive(Debug)]
pub struct Outbox {
    shared: Arc<Shared>,
    /// Whether what is still held when it is dropped goes to the socket then ([`Outbox::
    /// sending_when_dropped`]) rather than being dropped.
    send_when_dropped: bool,
}

/// What an outbox and the flusher share.
#[derive(Debug, Default)]
struct Shared {
    /// Set while bytes the flusher could not send, or its failure, wait for the owner: read
    /// without the lock, so that an owner with nothing to do takes none.
    trouble: AtomicBool,
    state: Mutex<State>,
}

#[derive(Debug, Default)]
struct State {
    /// The socket's descriptor; `None` once the owner dropped its [`Outbox`].
    fd: Option<RawFd>,
    /// Bytes not sent yet, in order.
    held: Vec<u8>,
    /// Whether it is in its thread's queue (the flusher has not looked at it since).
    queued: bool,
    /// Bytes sent since the outbox was made (by the flusher, or by the owner's
    /// [`Outbox::poll_write_held`]).
    sent: u64,
    /// The flusher's send failed: the owner's next write, flush or check returns it.
    failed: Option<io::Error>,
    /// The owner's task, woken when the flusher left bytes it could not send or failed.
    waker: Option<Waker>,
}

/// Where an outbox's bytes are, as [`Outbox::state`] sees them.
#[derive(Debug)]
pub enum Held {
    /// Nothing for the owner to do: all sent, or queued for the flusher.
    Fine,
    /// The flusher sent part or none of them and left the rest to the owner.
    Left,
}

impl Outbox {
    /// An outbox for the socket with descriptor `fd`, owned by the caller, which drops the
    /// outbox before the socket; `None` when this thread has no flusher. One given back on
    /// this thread is reused, with its buffer.
    pub fn for_socket(fd: RawFd) -> Option<Outbox> {
        LOCAL.with_borrow_mut(|local| {
            local.alive()?;
            let shared = local.spare.pop().unwrap_or_default();
            shared.lock().fd = Some(fd);
            Some(Outbox {
                shared,
                send_when_dropped: false,
            })
        })
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        self.shared.lock()
    }

    /// Sends what is still held when it is dropped, as far as the socket takes it at once,
    /// instead of dropping it: for an owner whose held writes were final (a client's answer,
    /// a tunnel's bytes), which may drop its socket without a flush or a shutdown once they
    /// are written (a tunnel ended by the other end's reset, a connection ended by an error).
    /// A write the kernel took was sent after a close; a held one is too. Not for a request
    /// the owner may give up as unsent.
    pub fn sending_when_dropped(mut self) -> Outbox {
        self.send_when_dropped = true;
        self
    }

    /// Holds a copy of `bufs` for the flusher and returns their length, or `None` (nothing
    /// held) when the thread has no flusher, a send failed or left bytes to the owner (the
    /// owner writes those first, [`Outbox::poll_write_held`]), or it would hold more than
    /// [`MAX_HELD`].
    pub fn hold(&self, cx: &Context<'_>, bufs: &[IoSlice<'_>]) -> Option<usize> {
        let len: usize = bufs.iter().map(|b| b.len()).sum();
        let mut state = self.lock();
        if state.failed.is_some()
            || state.fd.is_none()
            || (!state.queued && !state.held.is_empty())
            || state.held.len() + len > MAX_HELD
        {
            return None;
        }
        if !state.queued {
            if !queue(&self.shared) {
                return None;
            }
            state.queued = true;
        }
        for buf in bufs {
            state.held.extend_from_slice(buf);
        }
        match &mut state.waker {
            Some(waker) if waker.will_wake(cx.waker()) => {}
            slot => *slot = Some(cx.waker().clone()),
        }
        Some(len)
    }

    /// Whether the owner has bytes to send itself; a failed send's error (once), with whether
    /// any byte of this outbox was sent. The task that held the bytes is woken when that
    /// changes. No lock is taken while nothing went wrong.
    #[inline]
    pub fn state(&self) -> Result<Held, (io::Error, bool)> {
        if !self.shared.trouble.load(Ordering::Acquire) {
            return Ok(Held::Fine);
        }
        self.troubled_state()
    }

    fn troubled_state(&self) -> Result<Held, (io::Error, bool)> {
        let mut state = self.lock();
        if let Some(error) = state.failed.take() {
            self.shared.trouble.store(false, Ordering::Relaxed);
            return Err((error, state.sent > 0));
        }
        if !state.queued && !state.held.is_empty() {
            return Ok(Held::Left);
        }
        Ok(Held::Fine)
    }

    /// Writes what is held on `io` (the same socket) itself, queued or not: before a write
    /// that is not held, before a shutdown, or when the flusher left bytes. A failed send's
    /// error is returned first.
    pub fn poll_write_held<W: AsyncWrite + Unpin>(
        &self,
        cx: &mut Context<'_>,
        io: &mut W,
    ) -> Poll<io::Result<()>> {
        let mut state = self.lock();
        if let Some(error) = state.failed.take() {
            self.shared.trouble.store(false, Ordering::Relaxed);
            return Poll::Ready(Err(error));
        }
        while !state.held.is_empty() {
            match std::task::ready!(Pin::new(&mut *io).poll_write(cx, &state.held)) {
                Ok(0) => return Poll::Ready(Err(io::ErrorKind::WriteZero.into())),
                Ok(n) => {
                    state.sent += n as u64;
                    state.held.drain(..n);
                }
                Err(error) => return Poll::Ready(Err(error)),
            }
        }
        // The flusher, if it still has it queued, finds nothing to send.
        state.sent_all();
        self.shared.trouble.store(false, Ordering::Relaxed);
        Poll::Ready(Ok(()))
    }

    /// Whether bytes are held (queued or left to the owner).
    pub fn holds(&self) -> bool {
        !self.lock().held.is_empty()
    }

    /// Whether the flusher left bytes to the owner or failed (no lock taken): a task that
    /// reads rather than writes (a tunnel waiting on both ends) sends them with
    /// [`Outbox::poll_write_held`] before its read.
    #[inline]
    pub fn troubled(&self) -> bool {
        self.shared.trouble.load(Ordering::Acquire)
    }

    /// Takes back what is held, as dropping it does, and says whether none of this
    /// outbox's bytes went (sent by the flusher or by [`Outbox::poll_write_held`]): the socket
    /// ended before any, so the owner may say nothing was sent.
    pub fn withdraw(&self) -> bool {
        let mut state = self.lock();
        let nothing_sent = state.sent == 0;
        self.close_locked(&mut state);
        nothing_sent
    }

    /// Drops what is held and takes the descriptor away: the flusher sends nothing more.
    fn close_locked(&self, state: &mut State) {
        state.fd = None;
        state.sent_all();
        state.sent = 0;
        state.failed = None;
        state.waker = None;
        self.shared.trouble.store(false, Ordering::Relaxed);
    }
}

impl Drop for Outbox {
    /// Closed, and kept for reuse on this thread unless a flusher's queue still holds it.
    fn drop(&mut self) {
        let mut state = self.lock();
        if let (true, Some(fd), false) = (self.send_when_dropped, state.fd, state.held.is_empty()) {
            // SAFETY: the owner drops its outbox before its socket closes (see the module
            // docs): `fd` is that open socket.
            let _ = unsafe { write_fd(fd, &state.held) };
        }
        self.close_locked(&mut state);
        drop(state);
        if Arc::strong_count(&self.shared) == 1 {
            let shared = Arc::clone(&self.shared);
            let _ = LOCAL.try_with(|local| {
                if let Ok(mut local) = local.try_borrow_mut() {
                    if local.spare.len() < SPARE {
                        local.spare.push(shared);
                    }
                }
            });
        }
    }
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, State> {
        self.state
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }
}

impl State {
    /// Everything held was sent: the buffer is kept for the next turn's bytes unless it grew
    /// beyond what a small answer needs (an outbox lives as long as its connection serves).
    fn sent_all(&mut self) {
        if self.held.capacity() > KEPT_CAPACITY {
            self.held = Vec::new();
        } else {
            self.held.clear();
        }
    }
}

/// The most capacity an outbox's buffer keeps between turns.
const KEPT_CAPACITY: usize = 2048;

/// What a thread's flusher and the handles that keep it share.
#[derive(Debug, Default)]
struct Turn {
    /// Whether a flusher serves the thread (false once the flusher is dropped).
    alive: AtomicBool,
    /// The [`FlusherHandle`]s alive: the flusher ends once there are none.
    handles: AtomicUsize,
    /// The flusher's task, woken by a turn's first queued outbox and by the last handle.
    waker: Mutex<Option<Waker>>,
}

impl Turn {
    fn waker(&self) -> MutexGuard<'_, Option<Waker>> {
        self.waker
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }
}

/// A thread's flusher and the outboxes queued for it, and outboxes given back for reuse (an
/// exchange's goes to the next exchange, with its buffer). The flusher runs on this thread
/// (a current-thread runtime's task), so the queue needs no lock.
#[derive(Debug)]
struct Local {
    turn: Option<Arc<Turn>>,
    queued: Vec<Arc<Shared>>,
    spare: Vec<Arc<Shared>>,
}

/// The most outboxes a thread keeps for reuse.
const SPARE: usize = 64;

thread_local! {
    static LOCAL: RefCell<Local> = const {
        RefCell::new(Local {
            turn: None,
            queued: Vec::new(),
            spare: Vec::new(),
        })
    };
}

impl Local {
    /// This thread's flusher, if one is running.
    fn alive(&self) -> Option<&Arc<Turn>> {
        self.turn
            .as_ref()
            .filter(|turn| turn.alive.load(Ordering::Relaxed))
    }
}

/// Whether this thread has a flusher (an outbox made here can hold bytes).
#[cfg(test)]
fn here() -> bool {
    LOCAL.with_borrow(|local| local.alive().is_some())
}

/// Queues `shared` on this thread's flusher, waking it for the turn's first; false when this
/// thread has none.
fn queue(shared: &Arc<Shared>) -> bool {
    LOCAL.with_borrow_mut(|local| {
        let Some(turn) = local.alive() else {
            return false;
        };
        if local.queued.is_empty() {
            if let Some(waker) = &*turn.waker() {
                waker.wake_by_ref();
            }
        }
        local.queued.push(Arc::clone(shared));
        true
    })
}

/// A worker's flusher: a task that sends every outbox queued on its thread since its last
/// poll ([`start_flusher`]), until no [`FlusherHandle`] is left.
#[derive(Debug)]
pub struct Flusher {
    turn: Arc<Turn>,
    /// Kept between polls so that a turn's queue reuses its allocation.
    spare: Vec<Arc<Shared>>,
}

/// Makes sure the runtime this thread runs has a flusher while the handle returned lives:
/// unless one serves this thread already, spawns one (`tokio::spawn`), which serves this
/// thread's outboxes from then on and ends once every handle is dropped. Capataz's workers each
/// hold one for their runtime's life; a balancer holds one (for a runtime of its own: tests,
/// embedders). Only on a current-thread runtime, whose tasks all run on this thread: elsewhere
/// (or outside a runtime) nothing starts, and connections write at once.
pub fn start_flusher() -> Option<FlusherHandle> {
    let flavor = tokio::runtime::Handle::try_current().ok()?.runtime_flavor();
    if flavor != tokio::runtime::RuntimeFlavor::CurrentThread {
        return None;
    }
    LOCAL.with_borrow_mut(|local| {
        if let Some(turn) = local.alive() {
            turn.handles.fetch_add(1, Ordering::Relaxed);
            return Some(FlusherHandle(Arc::clone(turn)));
        }
        let turn = Arc::new(Turn {
            alive: AtomicBool::new(true),
            handles: AtomicUsize::new(1),
            waker: Mutex::default(),
        });
        local.turn = Some(Arc::clone(&turn));
        tokio::spawn(Flusher {
            turn: Arc::clone(&turn),
            spare: Vec::new(),
        });
        Some(FlusherHandle(turn))
    })
}

/// Keeps its thread's flusher running ([`start_flusher`]).
#[derive(Debug)]
pub struct FlusherHandle(Arc<Turn>);

impl Drop for FlusherHandle {
    /// The last one wakes the flusher, which ends.
    fn drop(&mut self) {
        if self.0.handles.fetch_sub(1, Ordering::AcqRel) == 1 {
            if let Some(waker) = &*self.0.waker() {
                waker.wake_by_ref();
            }
        }
    }
}

impl Flusher {
    /// Whether this thread's queue is this flusher's (it is polled and dropped on the thread
    /// that spawned it, unless its runtime is dropped elsewhere).
    fn takes<T>(&self, take: impl FnOnce(&mut Local) -> T) -> Option<T> {
        LOCAL
            .try_with(|local| {
                let mut local = local.try_borrow_mut().ok()?;
                let ours = local
                    .turn
                    .as_ref()
                    .is_some_and(|t| Arc::ptr_eq(t, &self.turn));
                ours.then(|| take(&mut local))
            })
            .ok()
            .flatten()
    }
}

impl Future for Flusher {
    type Output = ();

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
        let this = self.get_mut();
        match &mut *this.turn.waker() {
            Some(waker) if waker.will_wake(cx.waker()) => {}
            slot => *slot = Some(cx.waker().clone()),
        }
        let mut batch = std::mem::take(&mut this.spare);
        this.takes(|local| std::mem::swap(&mut batch, &mut local.queued));
        for shared in batch.drain(..) {
            send(&shared);
        }
        this.spare = batch;
        if this.turn.handles.load(Ordering::Acquire) == 0 {
            // Dropped, it gives back what was queued since (see its `Drop`).
            return Poll::Ready(());
        }
        Poll::Pending
    }
}

impl Drop for Flusher {
    /// Nothing is queued on a dead flusher: what is queued goes back to its owners, woken to
    /// write it themselves.
    fn drop(&mut self) {
        self.turn.alive.store(false, Ordering::Relaxed);
        *self.turn.waker() = None;
        let queued = self
            .takes(|local| std::mem::take(&mut local.queued))
            .unwrap_or_default();
        for shared in queued {
            let mut state = shared.lock();
            state.queued = false;
            if !state.held.is_empty() {
                shared.trouble.store(true, Ordering::Release);
            }
            if let Some(waker) = state.waker.take() {
                waker.wake();
            }
        }
    }
}

/// Sends an outbox's held bytes on its socket; what the socket does not take is left to the
/// owner (woken), as is a failure.
fn send(shared: &Shared) {
    let mut state = shared.lock();
    state.queued = false;
    let Some(fd) = state.fd else {
        state.held = Vec::new();
        return;
    };
    if state.held.is_empty() {
        return;
    }
    // SAFETY: `fd` is the owner's open socket: the owner takes it out of `state` (under this
    // lock, held until the send is done) before the socket closes (see the module docs).
    match unsafe { write_fd(fd, &state.held) } {
        Ok(n) if n == state.held.len() => {
            state.sent += n as u64;
            state.sent_all();
            return;
        }
        Ok(n) => {
            state.sent += n as u64;
            state.held.drain(..n);
            shared.trouble.store(true, Ordering::Release);
        }
        Err(error) if error.kind() == io::ErrorKind::WouldBlock => {
            shared.trouble.store(true, Ordering::Release);
        }
        Err(error) => {
            state.failed = Some(error);
            state.held = Vec::new();
            shared.trouble.store(true, Ordering::Release);
        }
    }
    if let Some(waker) = state.waker.take() {
        waker.wake();
    }
}

/// One write of `bytes` on the socket `fd`, never waiting.
///
/// # Safety
///
/// `fd` is an open socket for the whole call, the one the bytes are for. The `ManuallyDrop`
/// never closes it. A socket's `write` is `send` with `MSG_NOSIGNAL`; the socket is
/// non-blocking (tokio's), so it never waits.
unsafe fn write_fd(fd: RawFd, bytes: &[u8]) -> io::Result<usize> {
    // SAFETY: see the function's contract.
    let socket = ManuallyDrop::new(unsafe { std::net::TcpStream::from_raw_fd(fd) });
    loop {
        match (&*socket).write(bytes) {
            Err(error) if error.kind() == io::ErrorKind::Interrupted => continue,
            outcome => return outcome,
        }
    }
}

#[cfg(test)]
mod tests {
    use std::os::fd::AsRawFd;
    use std::time::Duration;

    use tokio::io::AsyncReadExt;
    use tokio::net::{TcpListener, TcpStream};

    use super::*;

    /// A connected pair on loopback: (the peer's end, the owner's end).
    async fn pair() -> (TcpStream, TcpStream) {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let peer = TcpStream::connect(listener.local_addr().unwrap())
            .await
            .unwrap();
        let (owner, _) = listener.accept().await.unwrap();
        (peer, owner)
    }

    /// Holds `bytes` in `outbox` (with this task's context).
    async fn hold(outbox: &Outbox, bytes: &[u8]) -> Option<usize> {
        std::future::poll_fn(|cx| Poll::Ready(outbox.hold(cx, &[IoSlice::new(bytes)]))).await
    }

    /// Lets the runtime run every queued task (the flusher included) once or more.
    async fn turns() {
        for _ in 0..4 {
            tokio::task::yield_now().await;
        }
    }

    async fn read_exactly(peer: &mut TcpStream, len: usize) -> Vec<u8> {
        let mut got = vec![0; len];
        tokio::time::timeout(Duration::from_secs(10), peer.read_exact(&mut got))
            .await
            .expect("the bytes arrive")
            .unwrap();
        got
    }

    #[tokio::test]
    async fn without_a_flusher_nothing_is_held() {
        let (_peer, owner) = pair().await;
        assert!(!here());
        assert!(Outbox::for_socket(owner.as_raw_fd()).is_none());
    }

    /// Two writes held in one turn go out together, in order, sent by the flusher.
    #[tokio::test]
    async fn held_writes_are_sent_by_the_flusher_in_order() {
        let _flusher = start_flusher();
        assert!(here());
        let (mut peer, owner) = pair().await;
        let outbox = Outbox::for_socket(owner.as_raw_fd()).expect("a flusher");
        assert_eq!(hold(&outbox, b"first ").await, Some(6));
        assert_eq!(hold(&outbox, b"second").await, Some(6));
        assert!(outbox.holds(), "nothing is sent before the flusher's turn");
        turns().await;
        assert_eq!(read_exactly(&mut peer, 12).await, b"first second");
        assert!(matches!(outbox.state(), Ok(Held::Fine)));
        assert!(!outbox.holds());
        // Held again after the turn: a new batch.
        assert_eq!(hold(&outbox, b"third").await, Some(5));
        turns().await;
        assert_eq!(read_exactly(&mut peer, 5).await, b"third");
        drop(outbox);
        drop(owner);
    }

    /// An outbox dropped before its socket closes takes its descriptor away: the flusher sends
    /// nothing, not even to the socket that took the same descriptor since.
    #[tokio::test]
    async fn a_dropped_outbox_sends_nothing_to_a_reused_descriptor() {
        let _flusher = start_flusher();
        let (mut first_peer, owner) = pair().await;
        let second_listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let fd = owner.as_raw_fd();
        let outbox = Outbox::for_socket(fd).expect("a flusher");
        assert_eq!(hold(&outbox, b"for the first client only").await, Some(25));
        drop(outbox);
        drop(owner);
        // The lowest free descriptor is the one just closed: the next socket takes it.
        let second = TcpStream::connect(second_listener.local_addr().unwrap())
            .await
            .unwrap();
        assert_eq!(second.as_raw_fd(), fd, "the descriptor is reused");
        let (mut second_peer, _) = second_listener.accept().await.unwrap();
        turns().await;
        let mut byte = [0u8; 1];
        let quiet = tokio::time::timeout(Duration::from_millis(200), second_peer.read(&mut byte));
        assert!(quiet.await.is_err(), "the second connection got nothing");
        assert_eq!(
            first_peer.read(&mut byte).await.unwrap(),
            0,
            "the first connection ended without the dropped bytes"
        );
        drop(second);
    }

    /// A client's outbox (`sending_when_dropped`) dropped before the flusher's turn gives what
    /// it holds to the socket then: the peer gets it, then the end.
    #[tokio::test]
    async fn an_outbox_sending_when_dropped_sends_what_it_holds() {
        let _flusher = start_flusher();
        let (mut peer, owner) = pair().await;
        let outbox = Outbox::for_socket(owner.as_raw_fd())
            .expect("a flusher")
            .sending_when_dropped();
        assert_eq!(hold(&outbox, b"final words").await, Some(11));
        drop(outbox);
        drop(owner);
        turns().await;
        let mut got = Vec::new();
        tokio::time::timeout(Duration::from_secs(10), peer.read_to_end(&mut got))
            .await
            .expect("the end arrives")
            .unwrap();
        assert_eq!(got, b"final words");
    }

    /// What the socket does not take is left to the owner, which is woken and sends it itself,
    /// after which new writes are held again.
    #[tokio::test]
    async fn bytes_the_socket_does_not_take_are_left_to_the_owner() {
        let _flusher = start_flusher();
        let (mut peer, mut owner) = pair().await;
        // Fill the socket's buffers with what the peer does not read yet.
        let chunk = vec![b'a'; 64 * 1024];
        let mut filled = 0;
        while let Ok(n) = owner.try_write(&chunk) {
            filled += n;
        }
        let outbox = Outbox::for_socket(owner.as_raw_fd()).expect("a flusher");
        assert_eq!(hold(&outbox, b"tail").await, Some(4));
        turns().await;
        let state = outbox.state();
        assert!(matches!(state, Ok(Held::Left)), "{state:?}");
        assert!(outbox.troubled());
        assert_eq!(
            hold(&outbox, b"more").await,
            None,
            "not held past bytes left"
        );
        let drain = tokio::spawn(async move {
            let mut got = vec![0; filled + 4];
            peer.read_exact(&mut got).await.unwrap();
            got
        });
        std::future::poll_fn(|cx| outbox.poll_write_held(cx, &mut owner))
            .await
            .unwrap();
        let got = tokio::time::timeout(Duration::from_secs(10), drain)
            .await
            .expect("the peer reads it all")
            .unwrap();
        assert!(got[..filled].iter().all(|&b| b == b'a'));
        assert_eq!(&got[filled..], b"tail");
        assert!(!outbox.holds());
        drop(outbox);
    }

    /// A send to a peer that reset the connection fails: the owner gets the error, and knows
    /// no byte went.
    #[tokio::test]
    async fn a_failed_send_is_the_owners_error() {
        let _flusher = start_flusher();
        let (peer, owner) = pair().await;
        // A reset: SO_LINGER 0, then close.
        // Deprecated for blocking on drop with a timeout; a zero timeout resets at once.
        #[allow(deprecated)]
        peer.set_linger(Some(Duration::ZERO)).unwrap();
        drop(peer);
        // Wait until the reset has arrived: a read fails or ends.
        let mut byte = [0u8; 1];
        let _ = tokio::time::timeout(Duration::from_secs(10), async {
            loop {
                owner.readable().await.unwrap();
                match owner.try_read(&mut byte) {
                    Err(e) if e.kind() == io::ErrorKind::WouldBlock => continue,
                    _ => break,
                }
            }
        })
        .await;
        let outbox = Outbox::for_socket(owner.as_raw_fd()).expect("a flusher");
        assert_eq!(hold(&outbox, b"answer").await, Some(6));
        turns().await;
        match outbox.state() {
            Err((_, sent_any)) => assert!(!sent_any),
            other => panic!("expected a failure, got {other:?}"),
        }
        drop(outbox);
    }

    /// The flusher sends what is queued and ends once its last handle is dropped; outboxes then
    /// hold nothing, and the task is gone (nothing left running on a test's runtime).
    #[tokio::test]
    async fn the_flusher_ends_with_its_last_handle() {
        let metrics = tokio::runtime::Handle::current().metrics();
        let tasks = metrics.num_alive_tasks();
        let first = start_flusher().expect("a current-thread runtime");
        let second = start_flusher().expect("the same flusher");
        assert_eq!(metrics.num_alive_tasks(), tasks + 1, "one flusher for both");
        let (mut peer, owner) = pair().await;
        let outbox = Outbox::for_socket(owner.as_raw_fd()).expect("a flusher");
        assert_eq!(hold(&outbox, b"last words").await, Some(10));
        drop(first);
        turns().await;
        assert!(here(), "a handle is left");
        drop(second);
        turns().await;
        assert!(!here());
        assert_eq!(read_exactly(&mut peer, 10).await, b"last words");
        assert_eq!(hold(&outbox, b"more").await, None);
        assert_eq!(metrics.num_alive_tasks(), tasks);
        drop(outbox);
    }

    /// Limits: more than `MAX_HELD` at once is not held.
    #[tokio::test]
    async fn more_than_the_limit_is_not_held() {
        let _flusher = start_flusher();
        let (_peer, owner) = pair().await;
        let outbox = Outbox::for_socket(owner.as_raw_fd()).expect("a flusher");
        assert_eq!(hold(&outbox, &vec![0; MAX_HELD + 1]).await, None);
        assert_eq!(hold(&outbox, &vec![0; MAX_HELD]).await, Some(MAX_HELD));
        assert_eq!(hold(&outbox, b"x").await, None);
        drop(outbox);
    }
}
