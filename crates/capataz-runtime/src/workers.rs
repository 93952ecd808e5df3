//! The worker threads that serve client connections, and the runtimes they run.
//!
//! `capataz run` serves with N workers (`CAPATAZ_WORKER_THREADS`, default one per core), each
//! a thread running a tokio current-thread runtime of its own: share-nothing event loops, as
//! HAProxy's threads and nginx's workers are, rather than one work-stealing runtime. Worker 0
//! is the main thread's runtime: it runs everything that is not a client connection (the
//! supervisor, the pools' probes and timers, the admin API, ACME and OCSP stapling, HTTP/3,
//! every listener's accept loop) and serves its share of the connections too. Workers 1 to
//! N-1 serve connections only, until [`Runtimes::shutdown`].
//!
//! An accept loop hands each connection it accepts to the worker with the fewest open
//! connections, ties in turn ([`Workers::place`]): the socket leaves runtime 0's reactor for
//! that worker's and the connection's task is spawned there, so all the connection does for
//! its whole life (a TLS handshake, HTTP/1.1 or HTTP/2, its backend connections, its timers)
//! runs on that one thread, as does the watcher of the listener's connections on that worker.
//! A worker the OS deschedules holds up its own connections only; under tokio's work-stealing
//! runtime, which capataz ran before, a worker descheduled with tasks in its queue (or with
//! the I/O driver) held them up until another worker stole them (BENCHMARKS.md, "Many
//! cores"). The price: no worker takes work from another, so a connection stays where it was
//! placed however busy that worker gets. The fewest open connections evens the connections,
//! not their requests; round robin would not even those when they differ in how long they
//! live. HTTP/3 connections stay on worker 0 with their endpoint.
//!
//! When there are as many workers as CPUs the process may run on (the default count), each
//! worker thread is pinned to a CPU of its own, worker 0 (the main thread) to the first
//! ([`Runtimes::start`]; `CAPATAZ_WORKER_PINNING=off` leaves them to the OS). Share-nothing
//! workers are only as good as their CPUs are apart: a scheduler that puts two of them on one
//! CPU, while another CPU idles, makes them take turns at its tick (4 ms at `HZ=250`), and
//! every connection of the worker that waits waits with it; the benchmark host's kernel did so
//! whenever the workers' load together fitted one CPU (BENCHMARKS.md, "Two threads against
//! HAProxy, nginx and Pingora"). Pinned, a worker can no longer flee a CPU that something
//! else keeps busy; its connections could not flee it either way. The threads a worker's
//! blocking pool starts (file writes, name lookups) and the processes capataz starts (an
//! upgrade's new process, alert commands: `unpinned`) are not pinned: they get back every
//! CPU the process had.
//!
//! With one worker there is the main thread's current-thread runtime alone, and
//! [`Workers::single`]: every connection is spawned where it is accepted, as it was before, and
//! as it is in the in-process tests whatever their runtime.
//!
//! Shared between workers still: what the request path reads and counts (the listener's
//! routes, the pools' snapshots and counters, the metrics), the balancer's count of open
//! connections that a drain waits for, a pool's shared backend connections (HTTP/2, or
//! `connection_reuse = "shared"`: on the worker that opened them), and the access logs' writers
//! (on worker 0). Every tokio type used across them (channels, `Notify`, a socket registered
//! with another worker's reactor) works from any runtime, only not locally.

use std::future::Future;
use std::io;
use std::num::NonZeroUsize;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use tokio::net::{TcpStream, UnixStream};
use tokio::runtime::{EnterGuard, Handle, Runtime};
use tokio::sync::oneshot;

/// The workers as the accept loops see them: where a new connection goes. Cheap to clone.
#[derive(Clone, Debug, Default)]
pub struct Workers(Option<Arc<Shared>>);

#[derive(Debug)]
struct Shared {
    /// The runtimes of workers 1 to N-1 (worker 0 is the one the accept loops run on).
    handles: Vec<Handle>,
    /// Each worker's open connections.
    open: Box<[Count]>,
    /// Where the search for the emptiest worker starts: the one after the last chosen. Only
    /// the accept loops write it; two that race may pick the same worker, which costs nothing
    /// but evenness.
    next: AtomicUsize,
}

/// A count on a cache line of its own: each changes on another worker's thread.
#[derive(Debug, Default)]
#[repr(align(128))]
struct Count(AtomicUsize);

impl Workers {
    /// The runtime the connections are accepted on, alone: each is spawned where it is
    /// accepted.
    pub fn single() -> Workers {
        Workers(None)
    }

    /// How many there are.
    pub fn count(&self) -> usize {
        self.0.as_ref().map_or(1, |shared| shared.open.len())
    }

    /// The worker for a new connection: the one with the fewest open connections, the first
    /// after the last one chosen on a tie. The connection counts as open on it until the
    /// [`Placed`] drops.
    pub(crate) fn place(&self) -> Placed {
        let Some(shared) = &self.0 else {
            return Placed(None);
        };
        let n = shared.open.len();
        let start = shared.next.load(Ordering::Relaxed) % n;
        let mut chosen = start;
        let mut fewest = usize::MAX;
        for step in 0..n {
            let index = (start + step) % n;
            let open = shared.open[index].0.load(Ordering::Relaxed);
            if open < fewest {
                (chosen, fewest) = (index, open);
            }
        }
        shared.next.store(chosen + 1, Ordering::Relaxed);
        shared.open[chosen].0.fetch_add(1, Ordering::Relaxed);
        Placed(Some((shared.clone(), chosen)))
    }

    /// Takes a new connection's `stream` to its worker ([`Workers::place`]): that worker's
    /// runtime entered (while the guard lives, tasks spawned are the worker's; never held
    /// across an await, the guard is not `Send`) and the socket moved to its reactor, unless
    /// it is the accept loop's own. On an error the connection counts open nowhere.
    pub(crate) fn take<S: Movable>(
        &self,
        stream: S,
    ) -> io::Result<(Placed, Option<EnterGuard<'_>>, S)> {
        let placed = self.place();
        let entered = self.enter(placed.index());
        let stream = if placed.elsewhere() {
            stream.moved()?
        } else {
            stream
        };
        Ok((placed, entered, stream))
    }

    /// Enters the runtime of worker `index` ([`Placed::index`]), unless it is worker 0 (the
    /// accept loop's own, entered already): while the guard lives, tasks spawned and sockets
    /// registered are that worker's.
    fn enter(&self, index: usize) -> Option<EnterGuard<'_>> {
        let shared = self.0.as_ref()?;
        Some(shared.handles.get(index.checked_sub(1)?)?.enter())
    }
}

/// A connection's place: its worker, whose count of open connections it is in until dropped.
#[derive(Debug)]
pub(crate) struct Placed(Option<(Arc<Shared>, usize)>);

impl Placed {
    /// Its worker's index, 0 (the accept loop's runtime) to N-1.
    pub(crate) fn index(&self) -> usize {
        self.0.as_ref().map_or(0, |(_, index)| *index)
    }

    /// Whether its worker is another than the accept loop's: its socket must move to that
    /// worker's reactor ([`Movable`]) before it is served.
    fn elsewhere(&self) -> bool {
        self.index() != 0
    }
}

impl Drop for Placed {
    fn drop(&mut self) {
        if let Some((shared, index)) = &self.0 {
            shared.open[*index].0.fetch_sub(1, Ordering::Relaxed);
        }
    }
}

/// A connection's socket, which can leave the reactor it was accepted on.
pub(crate) trait Movable: Sized {
    /// The socket, taken out of its reactor and registered with the one of the runtime
    /// entered now ([`Workers::enter`]).
    fn moved(self) -> io::Result<Self>;
}

impl Movable for TcpStream {
    fn moved(self) -> io::Result<Self> {
        TcpStream::from_std(self.into_std()?)
    }
}

impl Movable for UnixStream {
    fn moved(self) -> io::Result<Self> {
        UnixStream::from_std(self.into_std()?)
    }
}

/// The runtimes of a serving process: the main thread's (worker 0), which [`Runtimes::block_on`]
/// runs, and a thread with a runtime of its own for each other worker.
#[derive(Debug)]
pub struct Runtimes {
    main: Runtime,
    workers: Workers,
    threads: Vec<WorkerThread>,
}

/// Worker 1 to N-1: its thread, and what tells it to stop (with how long its runtime may take
/// to end its tasks).
#[derive(Debug)]
struct WorkerThread {
    stop: oneshot::Sender<Duration>,
    thread: std::thread::JoinHandle<()>,
}

impl Runtimes {
    /// Starts `count` workers (1 if 0): the main thread's runtime, and `count - 1` threads;
    /// with `pinning` ([`Runtimes::pinning_from`]) and as many workers as CPUs the process may
    /// run on, each pinned to one of those CPUs (see the module docs), the main thread to the
    /// first. A pin that fails leaves that worker where the OS puts it.
    pub fn start(count: usize, pinning: bool) -> io::Result<Runtimes> {
        let allowed = cpus::allowed();
        let pins = allowed
            .as_ref()
            .filter(|cpus| pinning && count > 1 && cpus.len() == count)
            .cloned();
        if pins.is_some() {
            // What the blocking pools' threads and the process's children get back.
            cpus::keep_unpinned();
        }
        let main = current_thread(pins.is_some())?;
        let mut handles = Vec::new();
        let mut threads = Vec::new();
        for index in 1..count {
            let runtime = current_thread(pins.is_some())?;
            handles.push(runtime.handle().clone());
            let (stop, stopped) = oneshot::channel::<Duration>();
            let pin = pins.as_ref().map(|cpus| cpus[index]);
            // Short: Linux keeps 15 bytes of a thread's name (what `top -H` and /proc show).
            let thread = std::thread::Builder::new()
                .name(format!("worker-{index}"))
                .spawn(move || {
                    if let Some(cpu) = pin {
                        let _ = cpus::set(&[cpu]);
                    }
                    // Serves what the accept loops spawn on it until told to stop (or until
                    // the `Runtimes` is dropped unstopped, on an error at start).
                    // With its flusher, which sends the writes its connections put off to the
                    // end of the turn (`outbox`).
                    let stopped = runtime.block_on(async {
                        let _flusher = crate::outbox::start_flusher();
                        stopped.await
                    });
                    runtime.shutdown_timeout(stopped.unwrap_or_default());
                })?;
            threads.push(WorkerThread { stop, thread });
        }
        // The main thread last: the worker threads it started do not inherit its pin.
        if let Some(cpus) = &pins {
            let _ = cpus::set(&cpus[..1]);
        }
        let workers = if handles.is_empty() {
            Workers::single()
        } else {
            Workers(Some(Arc::new(Shared {
                open: (0..=handles.len()).map(|_| Count::default()).collect(),
                handles,
                next: AtomicUsize::new(0),
            })))
        };
        Ok(Runtimes {
            main,
            workers,
            threads,
        })
    }

    /// The number of workers `CAPATAZ_WORKER_THREADS` (`value`) asks for: a positive number,
    /// else (unset, or not a positive number) one per core.
    pub fn count_from(value: Option<&str>) -> usize {
        value
            .and_then(|v| v.parse::<usize>().ok())
            .filter(|&n| n > 0)
            .unwrap_or_else(|| std::thread::available_parallelism().map_or(1, NonZeroUsize::get))
    }

    /// Whether `CAPATAZ_WORKER_PINNING` (`value`) lets [`Runtimes::start`] pin the workers:
    /// unless it is `off` (or `0`, `false`, `no`).
    pub fn pinning_from(value: Option<&str>) -> bool {
        !matches!(
            value.map(|v| v.trim().to_ascii_lowercase()).as_deref(),
            Some("off" | "0" | "false" | "no")
        )
    }

    /// The workers, for the balancer's accept loops.
    pub fn workers(&self) -> Workers {
        self.workers.clone()
    }

    /// Runs `future` on the main thread's runtime (worker 0) to its end, with the runtime's
    /// flusher (`outbox`).
    pub fn block_on<F: Future>(&self, future: F) -> F::Output {
        self.main.block_on(async {
            let _flusher = crate::outbox::start_flusher();
            future.await
        })
    }

    /// Stops every worker: each runtime drops the tasks still on it (connections left past a
    /// drain's deadline), waiting up to `timeout` for its blocking tasks, the other workers'
    /// all at once, then the main thread's.
    pub fn shutdown(self, timeout: Duration) {
        let Runtimes { main, threads, .. } = self;
        let threads: Vec<_> = threads
            .into_iter()
            .map(|worker| {
                let _ = worker.stop.send(timeout);
                worker.thread
            })
            .collect();
        for thread in threads {
            // A worker's runtime catches its tasks' panics; its thread does nothing else.
            let _ = thread.join();
        }
        main.shutdown_timeout(timeout);
    }
}

/// What gives the calling thread's allocator cache back ([`set_cache_release`]).
static CACHE_RELEASE: std::sync::OnceLock<fn()> = std::sync::OnceLock::new();

/// Sets what gives a thread's allocator cache back (the binary's: jemalloc's
/// `thread.tcache.flush`), called by a worker whose connections parked
/// ([`release_cache`]). Set once, before serving; later calls change nothing.
pub fn set_cache_release(release: fn()) {
    let _ = CACHE_RELEASE.set(release);
}

/// Gives the calling thread's allocator cache back, if the binary said how. Called by a
/// watcher at its look after connections of its worker parked: the memory a parking
/// connection frees (hyper's connection and buffers, its backend connection's registration)
/// goes first to the thread's cache, which an allocator empties only as the thread allocates
/// again, so after a burst the cache would keep it, and the pages it sits on, for as long as
/// the worker stays idle. jemalloc's manual suggests flushing for a thread that stops
/// allocating; BENCHMARKS.md, "Memory per idle client connection". Once a period at most per
/// watcher, never per request: a busy connection does not park.
pub(crate) fn release_cache() {
    if let Some(release) = CACHE_RELEASE.get() {
        release();
    }
}

/// How many task polls a worker's runtime makes before it polls its IO driver again when
/// tasks are still queued (tokio's default is 61). An HTTP/1 exchange over TLS puts its writes
/// off to the back of the run queue (`turn`), so a turn of N events is about 2N polls (over
/// plain TCP they wait in outboxes for the worker's flusher, `outbox`: N polls and one): at 61
/// a turn of more than about 30 events was cut by an `epoll_wait` in its middle, and the
/// events it brought were queued before the turn's put-off writes. 256 keeps turns of up to
/// about 128 events whole; a poll here takes a few microseconds, so IO and timers still wait
/// at most a millisecond or so behind a full queue.
const EVENT_INTERVAL: u32 = 256;

/// A current-thread runtime with I/O and timers. With `pinned` workers, the threads of its
/// blocking pool (started by a pinned worker) get back every CPU the process could run on.
fn current_thread(pinned: bool) -> io::Result<Runtime> {
    let mut builder = tokio::runtime::Builder::new_current_thread();
    builder.enable_all().event_interval(EVENT_INTERVAL);
    if pinned {
        builder.on_thread_start(cpus::restore_unpinned);
    }
    builder.build()
}

/// Lets `command`'s process run on every CPU this process could at its start, not on the one
/// CPU of the pinned thread that spawns it (a child inherits its parent thread's affinity):
/// the new process of a binary upgrade, which counts its CPUs to choose its workers, and alert
/// commands.
pub(crate) fn unpinned(command: &mut tokio::process::Command) {
    cpus::unpinned(command);
}

/// The calling thread's CPU affinity (Linux; elsewhere nothing is pinned).
mod cpus {
    /// The process's CPUs before any thread was pinned, for its children (`unpinned`) and the
    /// blocking pools' threads (`restore_unpinned`).
    #[cfg(target_os = "linux")]
    static UNPINNED: std::sync::OnceLock<libc::cpu_set_t> = std::sync::OnceLock::new();

    /// Keeps the calling thread's CPUs, before any is pinned (see `UNPINNED`).
    #[cfg(target_os = "linux")]
    pub(super) fn keep_unpinned() {
        // SAFETY: as in `allowed`.
        unsafe {
            let mut set: libc::cpu_set_t = std::mem::zeroed();
            if libc::sched_getaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &mut set) == 0 {
                let _ = UNPINNED.set(set);
            }
        }
    }

    #[cfg(target_os = "linux")]
    pub(super) fn unpinned(command: &mut tokio::process::Command) {
        let Some(&set) = UNPINNED.get() else {
            return;
        };
        // SAFETY: the closure runs in the child between fork and exec, where only
        // async-signal-safe calls are allowed: it allocates nothing (the set is a copy made
        // here) and makes one `sched_setaffinity` call, whose failure leaves the child where it
        // was.
        unsafe {
            command.pre_exec(move || {
                libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &set);
                Ok(())
            });
        }
    }

    /// Lets the calling thread run on every CPU kept by `keep_unpinned` (none kept: as it is).
    #[cfg(target_os = "linux")]
    pub(super) fn restore_unpinned() {
        if let Some(set) = UNPINNED.get() {
            // SAFETY: as in `allowed`; a failure leaves the thread where it was.
            unsafe {
                libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), set);
            }
        }
    }

    #[cfg(not(target_os = "linux"))]
    pub(super) fn keep_unpinned() {}

    #[cfg(not(target_os = "linux"))]
    pub(super) fn restore_unpinned() {}

    #[cfg(not(target_os = "linux"))]
    pub(super) fn unpinned(_command: &mut tokio::process::Command) {}

    /// The CPUs the calling thread may run on, in order; `None` if unknown.
    #[cfg(target_os = "linux")]
    pub(super) fn allowed() -> Option<Vec<usize>> {
        // SAFETY: a `cpu_set_t` is plain bits, valid all zero; the call writes at most its
        // size, which it is given, and `CPU_ISSET` reads within it (`CPU_SETSIZE`).
        unsafe {
            let mut set: libc::cpu_set_t = std::mem::zeroed();
            if libc::sched_getaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &mut set) != 0 {
                return None;
            }
            Some(
                (0..libc::CPU_SETSIZE as usize)
                    .filter(|&cpu| libc::CPU_ISSET(cpu, &set))
                    .collect(),
            )
        }
    }

    /// Lets the calling thread run on `cpus` only (each under `CPU_SETSIZE`, as
    /// [`allowed`] gives them).
    #[cfg(target_os = "linux")]
    pub(super) fn set(cpus: &[usize]) -> std::io::Result<()> {
        // SAFETY: as in `allowed`; `CPU_SET` writes within the set for a CPU under
        // `CPU_SETSIZE`, and the others are skipped.
        unsafe {
            let mut set: libc::cpu_set_t = std::mem::zeroed();
            for &cpu in cpus.iter().filter(|&&cpu| cpu < libc::CPU_SETSIZE as usize) {
                libc::CPU_SET(cpu, &mut set);
            }
            if libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &set) != 0 {
                return Err(std::io::Error::last_os_error());
            }
        }
        Ok(())
    }

    #[cfg(not(target_os = "linux"))]
    pub(super) fn allowed() -> Option<Vec<usize>> {
        None
    }

    #[cfg(not(target_os = "linux"))]
    pub(super) fn set(_cpus: &[usize]) -> std::io::Result<()> {
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn workers(count: usize) -> (Runtimes, Workers) {
        let runtimes = Runtimes::start(count, false).expect("runtimes");
        let workers = runtimes.workers();
        (runtimes, workers)
    }

    #[test]
    fn one_worker_is_the_accept_loops_runtime_alone() {
        let (runtimes, workers) = workers(1);
        assert_eq!(workers.count(), 1);
        let placed = workers.place();
        assert_eq!(placed.index(), 0);
        assert!(!placed.elsewhere());
        assert!(workers.enter(placed.index()).is_none());
        runtimes.shutdown(Duration::from_secs(1));
    }

    #[test]
    fn connections_go_to_the_worker_with_the_fewest_ties_in_turn() {
        let (runtimes, workers) = workers(3);
        assert_eq!(workers.count(), 3);
        let first: Vec<Placed> = (0..3).map(|_| workers.place()).collect();
        let mut indexes: Vec<usize> = first.iter().map(Placed::index).collect();
        indexes.sort_unstable();
        assert_eq!(indexes, [0, 1, 2], "one each");
        // Worker 1's connection closes: the next goes there, whatever the turn says.
        let mut first = first;
        let closed = first.iter().position(|p| p.index() == 1).unwrap();
        drop(first.remove(closed));
        let next = workers.place();
        assert_eq!(next.index(), 1);
        first.push(next);
        // All even again: the next three go one to each.
        let mut indexes: Vec<usize> = (0..3).map(|_| workers.place().index()).collect();
        indexes.sort_unstable();
        assert_eq!(indexes, [0, 1, 2]);
        runtimes.shutdown(Duration::from_secs(1));
    }

    #[test]
    fn a_task_spawned_inside_the_guard_runs_on_its_worker_thread() {
        let (runtimes, workers) = workers(2);
        let _first = workers.place();
        let placed = workers.place();
        let on = {
            let _entered = workers.enter(placed.index()).expect("another worker");
            tokio::spawn(async { std::thread::current().name().map(str::to_owned) })
        };
        let name = runtimes.block_on(on).expect("the task");
        assert_eq!(name.as_deref(), Some("worker-1"));
        runtimes.shutdown(Duration::from_secs(1));
    }

    #[test]
    fn a_socket_moved_to_another_worker_is_served_there() {
        use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
        let (runtimes, workers) = workers(2);
        let _first = workers.place();
        let placed = workers.place();
        let echoed = runtimes.block_on(async {
            let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
            let address = listener.local_addr().unwrap();
            let client = tokio::spawn(async move {
                let mut stream = TcpStream::connect(address).await.unwrap();
                stream.write_all(b"ping").await.unwrap();
                let mut answer = [0u8; 4];
                stream.read_exact(&mut answer).await.unwrap();
                answer
            });
            let (stream, _) = listener.accept().await.unwrap();
            let served = {
                let _entered = workers.enter(placed.index()).expect("another worker");
                let mut stream = stream.moved().expect("moved");
                tokio::spawn(async move {
                    let mut ping = [0u8; 4];
                    stream.read_exact(&mut ping).await.unwrap();
                    stream.write_all(&ping).await.unwrap();
                    std::thread::current().name().map(str::to_owned)
                })
            };
            let name = served.await.unwrap();
            (client.await.unwrap(), name)
        });
        assert_eq!(&echoed.0, b"ping");
        assert_eq!(echoed.1.as_deref(), Some("worker-1"));
        runtimes.shutdown(Duration::from_secs(1));
    }

    /// As many workers as CPUs: each on its own, the main thread (worker 0) on the first; a
    /// blocking task's thread, started by a pinned worker, on all of them again.
    #[cfg(target_os = "linux")]
    #[test]
    fn as_many_workers_as_cpus_are_pinned_one_to_each() {
        let all = cpus::allowed().expect("the affinity");
        if all.len() < 2 {
            return;
        }
        let runtimes = Runtimes::start(all.len(), true).expect("runtimes");
        let workers = runtimes.workers();
        let mut seen = vec![cpus::allowed().expect("the main thread's")];
        for _ in 0..all.len() {
            let placed = workers.place();
            let on = workers.enter(placed.index()).map(|_entered| {
                tokio::spawn(async {
                    let blocking = tokio::task::spawn_blocking(cpus::allowed);
                    (cpus::allowed(), blocking.await.expect("blocking"))
                })
            });
            if let Some(on) = on {
                let (worker, blocking) = runtimes.block_on(on).expect("the task");
                assert_eq!(blocking.as_ref(), Some(&all), "the blocking pool's thread");
                seen.push(worker.expect("the worker's"));
            }
        }
        let expected: Vec<Vec<usize>> = all.iter().map(|&cpu| vec![cpu]).collect();
        assert_eq!(seen, expected);
        // A child spawned by the pinned main thread runs on every CPU again.
        if all.iter().all(|&cpu| cpu < 32) {
            let mut command = tokio::process::Command::new("grep");
            command.args(["^Cpus_allowed:", "/proc/self/status"]);
            unpinned(&mut command);
            let output = runtimes
                .block_on(async move { command.output().await })
                .expect("grep");
            let mask: u32 = all.iter().map(|&cpu| 1u32 << cpu).sum();
            let shown = String::from_utf8_lossy(&output.stdout);
            let shown = shown.trim().rsplit(['\t', ',']).next().unwrap_or_default();
            assert_eq!(u32::from_str_radix(shown, 16).ok(), Some(mask), "{shown}");
        }
        runtimes.shutdown(Duration::from_secs(1));
        cpus::set(&all).expect("the test thread unpinned");
    }

    #[test]
    fn fewer_workers_than_cpus_or_pinning_off_pins_nothing() {
        let all = cpus::allowed();
        for (count, pinning) in [(2, false), (all.as_ref().map_or(1, Vec::len) + 1, true)] {
            let runtimes = Runtimes::start(count, pinning).expect("runtimes");
            assert_eq!(cpus::allowed(), all, "the main thread");
            runtimes.shutdown(Duration::from_secs(1));
        }
    }

    #[test]
    fn pinning_is_on_unless_turned_off() {
        assert!(Runtimes::pinning_from(None));
        assert!(Runtimes::pinning_from(Some("on")));
        assert!(Runtimes::pinning_from(Some("auto")));
        for off in ["off", "OFF", "0", "false", "no", " off "] {
            assert!(!Runtimes::pinning_from(Some(off)), "{off}");
        }
    }

    #[test]
    fn the_count_is_the_variable_or_one_per_core() {
        let cores = std::thread::available_parallelism().map_or(1, NonZeroUsize::get);
        assert_eq!(Runtimes::count_from(Some("3")), 3);
        assert_eq!(Runtimes::count_from(Some("1")), 1);
        assert_eq!(Runtimes::count_from(Some("0")), cores);
        assert_eq!(Runtimes::count_from(Some("many")), cores);
        assert_eq!(Runtimes::count_from(None), cores);
    }
}
