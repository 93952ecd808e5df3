//! Reloads never hold a runtime thread; commands wait for a reload under way and land on what
//! it put in force; a stopped supervisor answers with an error.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::Ordering;
use std::sync::{mpsc, Arc};
use std::time::{Duration, Instant};

use tokio::sync::{broadcast, oneshot};

use super::{bind_listener, OverrideRefused, StartError, Stopped, Supervisor};
use crate::config::Config;
use crate::events::OverrideKind;

/// Generous bound on anything the test waits for.
const DEADLINE: Duration = Duration::from_secs(10);

/// A backend on its own thread that answers every connection with `200 ok` and closes it.
fn backend() -> SocketAddr {
    let listener = TcpListener::bind("127.0.0.1:0").expect("bind a backend");
    let address = listener.local_addr().expect("its address");
    std::thread::spawn(move || {
        for stream in listener.incoming() {
            let Ok(mut stream) = stream else { return };
            let _ = stream.set_read_timeout(Some(DEADLINE));
            let mut head = Vec::new();
            let mut byte = [0u8; 1];
            while !head.ends_with(b"\r\n\r\n") && matches!(stream.read(&mut byte), Ok(1)) {
                head.push(byte[0]);
            }
            let _ = stream
                .write_all(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nConnection: close\r\n\r\nok");
        }
    });
    address
}

/// A proxied `GET /` through `listener`, with deadlines: the answer, or what went wrong.
fn get(listener: SocketAddr) -> std::io::Result<String> {
    let mut stream = TcpStream::connect_timeout(&listener, DEADLINE)?;
    stream.set_read_timeout(Some(DEADLINE))?;
    stream.set_write_timeout(Some(DEADLINE))?;
    stream.write_all(b"GET / HTTP/1.1\r\nHost: web\r\nConnection: close\r\n\r\n")?;
    let mut answer = String::new();
    stream.read_to_string(&mut answer)?;
    Ok(answer)
}

/// A balancer with one listener and pool `web` (backend `b1`, see [`backend`]), started on its
/// own thread's current-thread runtime (so one runtime thread in all). Once the test calls
/// [`Balancer::go`], `then` runs on that thread; [`Balancer::finish`] waits for its outcome and stops it.
struct Balancer<T> {
    supervisor: Arc<Supervisor>,
    go: Option<oneshot::Sender<()>>,
    done: mpsc::Receiver<T>,
    stop: oneshot::Sender<()>,
    thread: std::thread::JoinHandle<()>,
}

impl<T: Send + 'static> Balancer<T> {
    fn start<F, Fut>(then: F) -> Self
    where
        F: FnOnce(Arc<Supervisor>, Config) -> Fut + Send + 'static,
        Fut: std::future::Future<Output = T>,
    {
        let backend = backend();
        let text = format!(
            "[[listeners]]\naddress = \"127.0.0.1:0\"\n\n[pools.web]\n\
             backends = [{{ name = \"b1\", address = \"{backend}\" }}]\n\
             [pools.web.active]\nkind = \"none\"\n"
        );
        let config = crate::config::parse_str(&text, "<test>").expect("valid test config");
        let (supervisor_tx, supervisor_rx) = mpsc::channel::<Arc<Supervisor>>();
        let (go, go_rx) = oneshot::channel::<()>();
        let (done_tx, done) = mpsc::channel::<T>();
        let (stop, stop_rx) = oneshot::channel::<()>();
        let thread = std::thread::spawn(move || {
            let runtime = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .expect("a runtime");
            runtime.block_on(async move {
                let socket = bind_listener(0, &config.listeners[0]).expect("bind the listener");
                let (events, _) = broadcast::channel(1024);
                let supervisor = Supervisor::start(&config, events, None, vec![socket]);
                let _ = supervisor_tx.send(supervisor.clone());
                let _ = go_rx.await;
                let _ = done_tx.send(then(supervisor.clone(), config).await);
                let _ = stop_rx.await;
                supervisor.abort();
            });
        });
        let supervisor = supervisor_rx
            .recv_timeout(DEADLINE)
            .expect("the balancer starts");
        Self {
            supervisor,
            go: Some(go),
            done,
            stop,
            thread,
        }
    }

    /// Lets `then` run.
    fn go(&mut self) {
        if let Some(go) = self.go.take() {
            let _ = go.send(());
        }
    }

    /// Waits for what `then` returned, then stops the balancer.
    fn finish(self) -> T {
        let outcome = self
            .done
            .recv_timeout(DEADLINE)
            .expect("what the test ran on the balancer ends");
        let _ = self.stop.send(());
        let _ = self.thread.join();
        outcome
    }
}

impl Supervisor {
    /// Waits while a test holds `build_gate`, counting in `building` the builds that reached it.
    pub(super) fn wait_for_build_gate(&self) -> tokio::sync::RwLockReadGuard<'_, ()> {
        self.building.fetch_add(1, Ordering::SeqCst);
        self.build_gate.blocking_read()
    }

    /// Waits until `builds` builds reached `build_gate`.
    fn wait_for_builds(&self, builds: usize) {
        let started = Instant::now();
        while self.building.load(Ordering::SeqCst) < builds {
            assert!(
                started.elapsed() < DEADLINE,
                "the reload never started its build"
            );
            std::thread::yield_now();
        }
    }
}

/// Regression: a reload built the new pools (and the listeners' proxies) on the
/// runtime thread, holding it for ~0.1 s at 10,000 backends, so proxied requests waited.
/// Here the test holds the build gate, so the reload stays in the middle of its pool build (the
/// new pools built, not yet in force) for as long as the test likes: a proxied request must still be answered on the balancer's only
/// runtime thread.
#[test]
fn reload_builds_pools_off_the_runtime_thread() {
    let mut balancer =
        Balancer::start(|supervisor, config| async move { supervisor.reload(&config).await });
    let supervisor = balancer.supervisor.clone();
    let listener = supervisor.local_addrs()[0];
    assert!(get(listener)
        .expect("a request before the reload")
        .starts_with("HTTP/1.1 200"));

    let gate = supervisor.build_gate.blocking_write();
    balancer.go();
    supervisor.wait_for_builds(1);
    let during = get(listener);
    drop(gate);
    let summary = balancer.finish();

    let during = during.expect("a request answered while the reload builds the pools");
    assert!(during.starts_with("HTTP/1.1 200"), "{during}");
    let summary = summary.expect("the reload applies");
    assert_eq!((summary.kept, summary.added, summary.removed), (1, 0, 0));
}

/// Regression: an override sent while a reload was building the new pools waited for the
/// build holding a runtime thread (tens of ms at 10,000 backends), and before that could land
/// on an old pool and be lost. Here a reload is held in its pool build, an override is sent on
/// the balancer's only runtime thread, and a proxied request must still be answered meanwhile;
/// once the build ends, the override applies to the pools the reload put in force.
#[test]
fn an_override_sent_during_a_reload_waits_for_it_and_lands_on_the_new_pools() {
    let (waiting_tx, waiting_rx) = mpsc::channel::<()>();
    let mut balancer = Balancer::start(move |supervisor, config| async move {
        let reload = supervisor.reload(&config);
        let set = async {
            // Sent once the reload is held in its build.
            while supervisor.building.load(Ordering::SeqCst) < 1 {
                tokio::time::sleep(Duration::from_millis(1)).await;
            }
            let _ = waiting_tx.send(());
            supervisor
                .set_override("web", "b1", Some(OverrideKind::Drain), None)
                .await
        };
        let (reloaded, set) = tokio::join!(reload, set);
        (reloaded.is_ok(), set.ok())
    });
    let supervisor = balancer.supervisor.clone();
    let listener = supervisor.local_addrs()[0];
    let before = supervisor.pools();

    let gate = supervisor.build_gate.blocking_write();
    balancer.go();
    supervisor.wait_for_builds(1);
    waiting_rx
        .recv_timeout(DEADLINE)
        .expect("the override is about to be sent");
    let during = get(listener);
    drop(gate);
    let (reloaded, state) = balancer.finish();

    let during = during.expect("a request answered while the override waits");
    assert!(during.starts_with("HTTP/1.1 200"), "{during}");
    assert!(reloaded, "the reload applies");
    assert!(state.is_some(), "the override applied once the build ended");
    let after = supervisor.pools();
    assert!(
        !Arc::ptr_eq(&before[0], &after[0]),
        "the reload replaced the pool"
    );
    assert!(
        !after[0].eligibility()[0].0,
        "b1 is drained in the pool in force"
    );
}

/// Commands sent once the balancer stopped get an error, neither a panic nor a hang.
#[tokio::test]
async fn commands_after_a_stop_are_refused() {
    let backend = backend();
    let text = format!(
        "[[listeners]]\naddress = \"127.0.0.1:0\"\n\n[pools.web]\n\
         backends = [{{ name = \"b1\", address = \"{backend}\" }}]\n[pools.web.active]\nkind = \"none\"\n"
    );
    let config = crate::config::parse_str(&text, "<test>").expect("valid test config");
    let (events, _) = broadcast::channel(16);
    let supervisor = Supervisor::start(&config, events, None, Vec::new());
    supervisor.abort();
    let reload = tokio::time::timeout(DEADLINE, supervisor.reload(&config))
        .await
        .expect("a reload after the stop is answered");
    assert!(
        matches!(reload, Err(StartError::Stopped(Stopped))),
        "{reload:?}"
    );
    assert_eq!(reload.unwrap_err().to_string(), "the balancer has stopped");
    let set = tokio::time::timeout(
        DEADLINE,
        supervisor.set_override("web", "b1", Some(OverrideKind::Drain), None),
    )
    .await
    .expect("an override after the stop is answered");
    assert!(matches!(set, Err(OverrideRefused::Stopped(_))), "{set:?}");
    let loops = tokio::time::timeout(DEADLINE, supervisor.stop_accepting())
        .await
        .expect("stopping again is answered");
    assert!(loops.is_empty());
}

/// Regression: with every command applied in one queue, a reload stuck reading its file (here
/// a FIFO nobody writes yet) held back every override sent after it, for as long as the read
/// took (forever, for a FIFO); an override never waited for a read before the supervisor. The
/// read goes through the ordered lane, so the override is applied meanwhile, and the reload
/// still answers once its file arrives.
#[cfg(target_os = "linux")]
#[tokio::test]
async fn an_override_is_applied_while_a_reload_is_stuck_reading_its_file() {
    use std::os::unix::fs::OpenOptionsExt;

    let backend = backend();
    let text = format!(
        "[[listeners]]\naddress = \"127.0.0.1:0\"\n\n[pools.web]\n\
         backends = [{{ name = \"b1\", address = \"{backend}\" }}]\n[pools.web.active]\n\
         kind = \"none\"\n"
    );
    let config = crate::config::parse_str(&text, "<test>").expect("valid test config");
    let dir = std::env::temp_dir().join(format!(
        "capataz-supervisor-fifo-{}-{:?}",
        std::process::id(),
        std::thread::current().id()
    ));
    std::fs::create_dir_all(&dir).expect("a temporary directory");
    let path = dir.join("capataz.toml");
    let _ = std::fs::remove_file(&path);
    let made = std::process::Command::new("mkfifo")
        .arg(&path)
        .status()
        .expect("run mkfifo");
    assert!(made.success(), "mkfifo failed");
    let (events, _) = broadcast::channel(16);
    let supervisor = Supervisor::start(&config, events, Some(path.clone()), Vec::new());
    let reloading = supervisor.clone();
    let reload = tokio::spawn(async move { reloading.reload_from_file().await });
    // The write end opens (without blocking) once the reload has opened the FIFO to read it.
    let started = Instant::now();
    let mut writer = loop {
        let opened = std::fs::OpenOptions::new()
            .write(true)
            .custom_flags(0o4000) // O_NONBLOCK
            .open(&path);
        if let Ok(writer) = opened {
            break writer;
        }
        assert!(
            started.elapsed() < DEADLINE,
            "the reload never read its file"
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    };

    let set = tokio::time::timeout(
        DEADLINE,
        supervisor.set_override("web", "b1", Some(OverrideKind::Drain), None),
    )
    .await
    .expect("the override is answered while the reload reads");
    assert_eq!(set.expect("the override applies"), "DRAINING");
    assert!(!supervisor.pools()[0].eligibility()[0].0, "b1 is drained");

    writer.write_all(b"not [toml").expect("write the FIFO");
    drop(writer);
    let reloaded = tokio::time::timeout(DEADLINE, reload)
        .await
        .expect("the reload answers once its file is read")
        .expect("the reload task");
    assert!(
        matches!(reloaded, Err(StartError::Configs(_))),
        "{reloaded:?}"
    );
    supervisor.abort();
    let _ = std::fs::remove_file(&path);
    let _ = std::fs::remove_dir(&dir);
}

/// Regression: SIGTERM's "stop accepting" was a command like any other, so while a reload was
/// applied (here held in its pool build) the client listeners kept accepting and serving new
/// connections after shutdown began, until the reload ended (and a reload past its shutdown
/// check even started new ones). The listeners stop accepting as soon as shutdown begins.
#[test]
fn the_listeners_stop_accepting_at_shutdown_even_while_a_reload_is_applied() {
    let mut balancer =
        Balancer::start(|supervisor, config| async move { supervisor.reload(&config).await });
    let supervisor = balancer.supervisor.clone();
    let listener = supervisor.local_addrs()[0];
    let gate = supervisor.build_gate.blocking_write();
    balancer.go();
    supervisor.wait_for_builds(1);
    // SIGTERM, from a thread of its own: it waits for the reload to end before it returns.
    let stopping = supervisor.clone();
    let stopper = std::thread::spawn(move || {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("a runtime");
        runtime.block_on(stopping.stop_accepting()).len()
    });
    let started = Instant::now();
    while !*supervisor.shutdown.borrow() {
        assert!(started.elapsed() < DEADLINE, "shutdown never began");
        std::thread::yield_now();
    }
    // The socket stays open (the reload holds it, as does the upgrade's duplicate), so a
    // connection still completes its handshake in the kernel's queue; it must not be served.
    let mut stream = TcpStream::connect_timeout(&listener, DEADLINE).expect("connect");
    stream
        .set_read_timeout(Some(Duration::from_secs(2)))
        .expect("a read timeout");
    let _ = stream.write_all(b"GET / HTTP/1.1\r\nHost: web\r\nConnection: close\r\n\r\n");
    let mut answer = Vec::new();
    let _ = stream.read_to_end(&mut answer);
    drop(gate);
    // The stopper's answer first: stopping the balancer's thread (`finish`) could end the
    // supervisor before it takes the stopper's command, queued behind the reload (a
    // connection closed at once, taken in the same wake-up as the shutdown, left no time).
    let loops = stopper.join().expect("the stopping thread");
    let reloaded = balancer.finish();
    assert!(
        answer.is_empty(),
        "a connection accepted after shutdown began was served: {}",
        String::from_utf8_lossy(&answer)
    );
    assert!(
        matches!(reloaded, Ok(_) | Err(StartError::ShuttingDown)),
        "{reloaded:?}"
    );
    assert_eq!(
        loops, 1,
        "stop_accepting returns the listener's accept loop"
    );
}
