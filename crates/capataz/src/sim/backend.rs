//! The handle of a scripted backend: its behaviour, its counters, crash and restart.

use std::io;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::net::TcpListener;
use tokio::sync::{watch, Notify};
use tokio::task::JoinHandle;

use super::server::{accept_loop, bind};
use super::{lock, Mode};

/// An in-process HTTP/1.1 backend on loopback whose behaviour can be changed while it runs.
///
/// Traffic answers carry the body `<name>\n`, the header `X-Backend: <name>`, and echo the
/// request's `Host`, `X-Forwarded-For` and `X-Forwarded-Proto` as `X-Seen-Host`, `X-Seen-Xff`
/// and `X-Seen-Proto`. Health answers look the same.
pub struct SimBackend {
    script: Arc<Script>,
    addr: SocketAddr,
    run: Mutex<Run>,
}

/// What the backend is scripted to answer, and what it counted: shared by the connection tasks
/// and the handle.
pub(super) struct Script {
    pub(super) name: String,
    behaviour: Mutex<Behaviour>,
    traffic_hits: AtomicU64,
    health_hits: AtomicU64,
    hit: Notify,
}

struct Behaviour {
    traffic: Mode,
    /// Never empty; one entry is used per health request, cycling.
    health: Vec<Mode>,
    next_health: usize,
}

/// The state of the current incarnation of the server.
#[derive(Default)]
struct Run {
    /// The listener, shared with the accept task; `None` once crashed, so closing is synchronous.
    listener: Option<Arc<Mutex<Option<TcpListener>>>>,
    accept: Option<JoinHandle<()>>,
    /// Sends `true` on a crash; every connection task of this incarnation watches it.
    crash: Option<watch::Sender<bool>>,
}

impl SimBackend {
    /// Binds `addr` (`127.0.0.1:0` for any free port) with `SO_REUSEADDR` and starts serving.
    ///
    /// A new backend answers every request with 200.
    pub async fn start(name: &str, addr: SocketAddr) -> io::Result<SimBackend> {
        let listener = bind(addr)?;
        let addr = listener.local_addr()?;
        let backend = SimBackend {
            script: Arc::new(Script {
                name: name.to_owned(),
                behaviour: Mutex::new(Behaviour {
                    traffic: Mode::Status(200),
                    health: vec![Mode::Status(200)],
                    next_health: 0,
                }),
                traffic_hits: AtomicU64::new(0),
                health_hits: AtomicU64::new(0),
                hit: Notify::new(),
            }),
            addr,
            run: Mutex::new(Run::default()),
        };
        backend.serve(listener);
        Ok(backend)
    }

    /// The address it listens on; it stays the same across [`SimBackend::restart`].
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// Its name, as sent in `X-Backend` and the body.
    pub fn name(&self) -> &str {
        &self.script.name
    }

    /// Sets what every health request gets from now on (clears any pattern).
    pub fn set_health(&self, mode: Mode) {
        self.set_health_pattern(vec![mode]);
    }

    /// Makes health requests cycle through `pattern`, one entry per request, starting with its
    /// first entry. For example `[200, 200, 503]` fails every third probe. An empty pattern means
    /// `[Status(200)]`.
    pub fn set_health_pattern(&self, pattern: Vec<Mode>) {
        let mut behaviour = lock(&self.script.behaviour);
        behaviour.health = if pattern.is_empty() {
            vec![Mode::Status(200)]
        } else {
            pattern
        };
        behaviour.next_health = 0;
    }

    /// Sets what every traffic (non-health) request gets from now on.
    pub fn set_traffic(&self, mode: Mode) {
        lock(&self.script.behaviour).traffic = mode;
    }

    /// Traffic requests received so far, across restarts.
    pub fn traffic_hits(&self) -> u64 {
        self.script.traffic_hits.load(Ordering::SeqCst)
    }

    /// Health requests received so far, across restarts.
    pub fn health_hits(&self) -> u64 {
        self.script.health_hits.load(Ordering::SeqCst)
    }

    /// Waits until at least `n` traffic requests have been received; false if `deadline` passed
    /// first.
    pub async fn wait_traffic_hits(&self, n: u64, deadline: Duration) -> bool {
        self.wait_hits(deadline, || self.traffic_hits() >= n).await
    }

    /// Waits until at least `n` health requests have been received; false if `deadline` passed
    /// first.
    pub async fn wait_health_hits(&self, n: u64, deadline: Duration) -> bool {
        self.wait_hits(deadline, || self.health_hits() >= n).await
    }

    /// Whether it is serving (started or restarted, and not crashed since).
    pub fn is_running(&self) -> bool {
        lock(&self.run).listener.is_some()
    }

    /// Crashes the backend: the listener is closed before this returns, and every open
    /// connection is reset. Counters and behaviour are kept for [`SimBackend::restart`].
    /// Crashing a crashed backend does nothing.
    pub fn crash(&self) {
        let mut run = lock(&self.run);
        if let Some(slot) = run.listener.take() {
            // Dropping the listener here, not in the accept task, closes it synchronously.
            drop(lock(&slot).take());
        }
        if let Some(accept) = &run.accept {
            accept.abort();
        }
        if let Some(crash) = run.crash.take() {
            crash.send_replace(true);
        }
    }

    /// Binds the same address again and serves with the current behaviour. Restarting a running
    /// backend does nothing.
    pub async fn restart(&self) -> io::Result<()> {
        let previous = {
            let mut run = lock(&self.run);
            if run.listener.is_some() {
                return Ok(());
            }
            run.accept.take()
        };
        if let Some(previous) = previous {
            // The task was aborted by `crash`; it holds nothing that matters, but wait for it so
            // that two incarnations never overlap.
            let _ = previous.await;
        }
        let listener = bind(self.addr)?;
        self.serve(listener);
        Ok(())
    }

    fn serve(&self, listener: TcpListener) {
        let slot = Arc::new(Mutex::new(Some(listener)));
        let (crash, crashed) = watch::channel(false);
        let accept = tokio::spawn(accept_loop(
            Arc::clone(&slot),
            Arc::clone(&self.script),
            crashed,
        ));
        let mut run = lock(&self.run);
        *run = Run {
            listener: Some(slot),
            accept: Some(accept),
            crash: Some(crash),
        };
    }

    async fn wait_hits(&self, deadline: Duration, reached: impl Fn() -> bool) -> bool {
        let wait = async {
            loop {
                let notified = self.script.hit.notified();
                tokio::pin!(notified);
                // Registered before the check, so a hit between the check and the await is seen.
                notified.as_mut().enable();
                if reached() {
                    return;
                }
                notified.await;
            }
        };
        tokio::time::timeout(deadline, wait).await.is_ok()
    }
}

impl Drop for SimBackend {
    fn drop(&mut self) {
        self.crash();
    }
}

impl std::fmt::Debug for SimBackend {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SimBackend")
            .field("name", &self.script.name)
            .field("addr", &self.addr)
            .field("running", &self.is_running())
            .finish()
    }
}

impl Script {
    /// Counts one request and picks its behaviour.
    pub(super) fn handle_request(&self, health: bool) -> Mode {
        let mode = {
            let mut behaviour = lock(&self.behaviour);
            if health {
                let index = behaviour.next_health % behaviour.health.len();
                behaviour.next_health = index + 1;
                behaviour.health[index]
            } else {
                behaviour.traffic
            }
        };
        let counter = if health {
            &self.health_hits
        } else {
            &self.traffic_hits
        };
        let hit = counter.fetch_add(1, Ordering::SeqCst) + 1;
        self.hit.notify_waiters();
        match mode {
            // Deterministic intermittent errors: the n-th, 2n-th, ... hit of its kind.
            Mode::FailEvery(n, code) if n > 0 && hit % u64::from(n) == 0 => Mode::Status(code),
            Mode::FailEvery(..) => Mode::Status(200),
            mode => mode,
        }
    }
}
