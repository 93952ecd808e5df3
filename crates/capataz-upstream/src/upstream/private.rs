//! The idle backend connections of one client connection (the default reuse policy,
//! `connection_reuse = "private"`).
//!
//! A backend connection that carried a request of client connection C goes back, once its
//! answer has been read to its end, to C's own small set, and only C's later requests may use
//! it; it is closed with C. So whatever a backend writes on a connection after an answer (a
//! body after a HEAD answer, bytes after a complete body or a 204, whether they arrive before
//! or after the reuse) can only ever be read as an answer to the same client connection, never
//! to another client's request. A new client connection always opens fresh backend
//! connections, as HAProxy's default `http-reuse safe` does for a session's first request.
//!
//! Each set holds at most [`MAX_PRIVATE`] connections (the oldest is closed to make room), or
//! for an HTTP/2 client connection as many as its streams may hold at once (at most
//! `MAX_PRIVATE_H2` in `client`), so a client connection holds at most that many backend
//! sockets while it is idle, and none
//! longer than the backend's `timeouts.idle`: the client connection's watcher reaps the set on
//! its periodic look ([`PrivateIdle::reap`]), as the health runtime reaps the shared sets. A
//! connection is still checked before reuse: not idle too long and nothing unread on it (a
//! connection with stray bytes is dropped).
//!
//! While its client connection is parked (quiet HTTP/1, see `downstream`), a plain TCP
//! connection of the set is out of the runtime's IO driver ([`PrivateIdle::sleep`]): the socket
//! alone, its registration (256 bytes) freed, and registered again when a request takes it.
//! Nobody is told of its readiness then, so the watcher's look judges only its idle time (no
//! syscall per look), and a close by the backend (or stray bytes) is seen when a request takes
//! it, by one non-blocking peek: the request then opens a fresh connection.

use std::io;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Mutex;

use crate::lockstat::{self, Site};
use std::time::{Duration, Instant};

use tokio::net::TcpStream;

use super::{BackendStream, Upstream};

/// The most idle backend connections one client connection keeps.
pub(crate) const MAX_PRIVATE: usize = 8;

/// The idle backend connections private to one client connection.
#[derive(Debug)]
pub struct PrivateIdle {
    /// Oldest first.
    conns: Mutex<Vec<Parked>>,
    /// The most kept: [`MAX_PRIVATE`], or more for a client connection that carries requests
    /// side by side (HTTP/2 streams), set once it is known.
    capacity: AtomicUsize,
}

impl Default for PrivateIdle {
    fn default() -> PrivateIdle {
        PrivateIdle {
            conns: Mutex::new(Vec::new()),
            capacity: AtomicUsize::new(MAX_PRIVATE),
        }
    }
}

/// One idle connection.
#[derive(Debug)]
struct Parked {
    /// The backend's `Upstream::id`.
    backend: u64,
    stream: Kept,
    /// When its last answer arrived.
    since: Instant,
    /// The backend's `timeouts.idle`.
    idle_timeout: Duration,
}

/// How an idle connection is kept.
#[derive(Debug)]
enum Kept {
    /// Registered with the runtime's IO driver, as in use.
    Awake(BackendStream),
    /// Out of the IO driver while its client connection is parked: plain TCP only.
    Asleep(std::net::TcpStream),
}

impl Parked {
    /// Whether it may still be used at `now` (see [`super::usable`]); an asleep one is peeked
    /// at only if `peek` (a syscall).
    fn usable(&mut self, now: Instant, peek: bool) -> bool {
        match &mut self.stream {
            Kept::Awake(stream) => super::usable(stream, self.since, self.idle_timeout, now),
            Kept::Asleep(socket) => {
                now.saturating_duration_since(self.since) < self.idle_timeout
                    && (!peek || quiet(socket))
            }
        }
    }
}

impl Parked {
    /// Out of the IO driver if it is plain TCP (`None` if that failed: closed).
    fn asleep(self) -> Option<Parked> {
        let Kept::Awake(BackendStream::Tcp(tcp)) = self.stream else {
            return Some(self);
        };
        let socket = tcp.into_std().ok()?;
        Some(Parked {
            stream: Kept::Asleep(socket),
            ..self
        })
    }
}

/// Whether a non-blocking socket is open with nothing unread on it, as `Transport::still_open`.
fn quiet(socket: &std::net::TcpStream) -> bool {
    let mut byte = [0u8; 1];
    matches!(socket.peek(&mut byte), Err(e) if e.kind() == io::ErrorKind::WouldBlock)
}

impl PrivateIdle {
    /// An empty set.
    pub fn new() -> PrivateIdle {
        PrivateIdle::default()
    }

    /// Keeps up to `capacity` connections (at least [`MAX_PRIVATE`]): as many as the client
    /// connection may have requests in progress at once, so that its requests side by side
    /// do not open and close a backend connection each.
    pub fn set_capacity(&self, capacity: usize) {
        self.capacity
            .store(capacity.max(MAX_PRIVATE), Ordering::Relaxed);
    }

    /// The most recent idle connection to `upstream` that is still usable at `now`; unusable
    /// ones to it are dropped on the way. Called on a runtime thread (an asleep connection is
    /// registered again).
    pub(crate) fn take(&self, upstream: &Upstream, now: Instant) -> Option<BackendStream> {
        let mut conns = lockstat::lock(&self.conns, Site::PrivateIdle);
        while let Some(at) = conns.iter().rposition(|p| p.backend == upstream.id) {
            let mut parked = conns.remove(at);
            if !parked.usable(now, true) {
                continue;
            }
            match parked.stream {
                Kept::Awake(stream) => return Some(stream),
                Kept::Asleep(socket) => {
                    if let Ok(tcp) = TcpStream::from_std(socket) {
                        return Some(BackendStream::Tcp(tcp));
                    }
                }
            }
        }
        None
    }

    /// Keeps `stream`, a connection to `upstream` whose answer arrived at `since`.
    pub(crate) fn park(&self, upstream: &Upstream, stream: BackendStream, since: Instant) {
        let mut conns = lockstat::lock(&self.conns, Site::PrivateIdle);
        if conns.len() >= self.capacity.load(Ordering::Relaxed) {
            conns.remove(0);
        }
        if conns.capacity() == 0 {
            // Room for one: an HTTP/1 client connection keeps one backend connection at a
            // time (a first push would make room for four, 216 bytes more for each idle client).
            conns.reserve_exact(1);
        }
        conns.push(Parked {
            backend: upstream.id,
            stream: Kept::Awake(stream),
            since,
            idle_timeout: upstream.idle_timeout,
        });
    }

    /// Takes the plain TCP connections out of the runtime's IO driver: their client connection
    /// parks. One that cannot be is closed. The order (oldest first) is kept.
    pub fn sleep(&self) {
        let mut conns = lockstat::lock(&self.conns, Site::PrivateIdle);
        for _ in 0..conns.len() {
            let parked = conns.remove(0);
            if let Some(parked) = parked.asleep() {
                conns.push(parked);
            }
        }
    }

    /// Closes the connections that sat idle too long or that the backend closed (or sent
    /// stray bytes on; an asleep one is judged by its idle time only). The clock is read only
    /// when some connection is kept.
    pub fn reap(&self) {
        let mut conns = lockstat::lock(&self.conns, Site::PrivateIdle);
        if !conns.is_empty() {
            let now = Instant::now();
            conns.retain_mut(|p| p.usable(now, false));
        }
    }
}

#[cfg(test)]
mod tests {
    use std::time::{Duration, Instant};

    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    use tokio::net::{TcpListener, TcpStream};

    use super::{BackendStream, Kept, PrivateIdle, Upstream};

    /// A set holding one connection to a loopback listener, and the listener's end.
    async fn one_kept() -> (PrivateIdle, Upstream, TcpStream) {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let upstream = Upstream::new(addr, Duration::from_secs(1), Duration::from_secs(30));
        let ours = TcpStream::connect(addr).await.unwrap();
        let (theirs, _) = listener.accept().await.unwrap();
        let set = PrivateIdle::new();
        set.park(&upstream, BackendStream::Tcp(ours), Instant::now());
        (set, upstream, theirs)
    }

    fn asleep(set: &PrivateIdle) -> usize {
        let conns = set.conns.lock().unwrap();
        conns
            .iter()
            .filter(|p| matches!(p.stream, Kept::Asleep(_)))
            .count()
    }

    #[tokio::test]
    async fn an_asleep_connection_is_taken_awake_and_carries_bytes_both_ways() {
        let (set, upstream, mut theirs) = one_kept().await;
        set.sleep();
        assert_eq!(asleep(&set), 1);
        set.reap();
        assert_eq!(
            asleep(&set),
            1,
            "an asleep connection within its idle time is kept"
        );
        let Some(BackendStream::Tcp(mut ours)) = set.take(&upstream, Instant::now()) else {
            panic!("the asleep connection is taken");
        };
        ours.write_all(b"ping").await.unwrap();
        let mut got = [0u8; 4];
        theirs.read_exact(&mut got).await.unwrap();
        assert_eq!(&got, b"ping");
        theirs.write_all(b"pong").await.unwrap();
        ours.read_exact(&mut got).await.unwrap();
        assert_eq!(&got, b"pong");
    }

    #[tokio::test]
    async fn an_asleep_connection_the_backend_closed_or_wrote_on_is_not_taken() {
        let (set, upstream, theirs) = one_kept().await;
        set.sleep();
        drop(theirs);
        // The close is seen when it is taken (nothing is told of an asleep socket's readiness).
        assert!(
            wait_for_fin(&set, &upstream).await,
            "a connection the backend closed is not reused"
        );
        let (set, upstream, mut theirs) = one_kept().await;
        set.sleep();
        theirs.write_all(b"stray").await.unwrap();
        assert!(
            wait_for_fin(&set, &upstream).await,
            "nor one with stray bytes"
        );
    }

    /// Whether `take` finds nothing usable once the peer's close or bytes have arrived (nothing
    /// tells of an asleep socket's readiness: looked at until a generous deadline).
    async fn wait_for_fin(set: &PrivateIdle, upstream: &Upstream) -> bool {
        let deadline = Instant::now() + Duration::from_secs(10);
        while Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(5)).await;
            let conns = set.conns.lock().unwrap();
            let Kept::Asleep(socket) = &conns[0].stream else {
                panic!("asleep");
            };
            if !super::quiet(socket) {
                drop(conns);
                return set.take(upstream, Instant::now()).is_none() && asleep(set) == 0;
            }
        }
        false
    }

    #[tokio::test]
    async fn an_asleep_connection_past_its_idle_time_is_not_taken() {
        let (set, upstream, _theirs) = one_kept().await;
        set.sleep();
        let later = Instant::now() + Duration::from_secs(31);
        assert!(set.take(&upstream, later).is_none());
        assert_eq!(asleep(&set), 0);
    }
}
