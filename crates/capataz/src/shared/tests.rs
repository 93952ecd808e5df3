//! Reloads never hold a runtime thread.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::{mpsc, Arc};
use std::time::{Duration, Instant};

use tokio::sync::{broadcast, oneshot};

use super::{bind_listener, Shared};
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
    shared: Arc<Shared>,
    go: Option<oneshot::Sender<()>>,
    done: mpsc::Receiver<T>,
    stop: oneshot::Sender<()>,
    thread: std::thread::JoinHandle<()>,
}

impl<T: Send + 'static> Balancer<T> {
    fn start<F, Fut>(then: F) -> Self
    where
        F: FnOnce(Arc<Shared>, Config) -> Fut + Send + 'static,
        Fut: std::future::Future<Output = T>,
    {
        let backend = backend();
        let text = format!(
            "[[listeners]]\naddress = \"127.0.0.1:0\"\n\n[pools.web]\n\
             backends = [{{ name = \"b1\", address = \"{backend}\" }}]\n\
             [pools.web.active]\nkind = \"none\"\n"
        );
        let config = crate::config::parse_str(&text, "<test>").expect("valid test config");
        let (shared_tx, shared_rx) = mpsc::channel::<Arc<Shared>>();
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
                let shared = Shared::start(&config, events, None, vec![socket]);
                let _ = shared_tx.send(shared.clone());
                let _ = go_rx.await;
                let _ = done_tx.send(then(shared.clone(), config).await);
                let _ = stop_rx.await;
                shared.abort();
            });
        });
        let shared = shared_rx
            .recv_timeout(DEADLINE)
            .expect("the balancer starts");
        Self {
            shared,
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

/// Regression: a reload built the new pools (and the listeners' proxies) on the
/// runtime thread, holding it for ~0.1 s at 10,000 backends, so proxied requests waited.
/// Here the test holds `swap_lock`, which the pool build takes, so the reload stays in the
/// middle of it for as long as the test likes: a proxied request must still be answered on the
/// balancer's only runtime thread. (Before, that thread itself blocked on the lock: the request
/// timed out.)
#[test]
fn reload_builds_pools_off_the_runtime_thread() {
    let mut balancer =
        Balancer::start(|shared, config| async move { shared.reload(&config).await });
    let shared = balancer.shared.clone();
    let listener = shared.local_addrs()[0];
    assert!(get(listener)
        .expect("a request before the reload")
        .starts_with("HTTP/1.1 200"));

    let swap = shared.swap_lock.blocking_lock();
    balancer.go();
    // The reload has begun once it holds `reload_lock`; it then waits for `swap_lock`.
    let started = Instant::now();
    while shared.reload_lock.try_lock().is_ok() {
        assert!(started.elapsed() < DEADLINE, "the reload never started");
        std::thread::yield_now();
    }
    let during = get(listener);
    drop(swap);
    let summary = balancer.finish();

    let during = during.expect("a request answered while the reload builds the pools");
    assert!(during.starts_with("HTTP/1.1 200"), "{during}");
    let summary = summary.expect("the reload applies");
    assert_eq!((summary.kept, summary.added, summary.removed), (1, 0, 0));
}

/// Regression: an override sent while a reload was building the new pools waited
/// for the build on a std mutex, holding a runtime thread for as long (tens of ms at 10,000
/// backends). Here the test holds `swap_lock` as a reload's build would, an override is sent on
/// the balancer's only runtime thread, and a proxied request must still be answered meanwhile;
/// once the lock is free, the override applies.
#[test]
fn an_override_waiting_for_a_reload_holds_no_runtime_thread() {
    let (waiting_tx, waiting_rx) = mpsc::channel::<()>();
    let mut balancer = Balancer::start(move |shared, _| async move {
        let _ = waiting_tx.send(());
        shared
            .set_override("web", "b1", Some(OverrideKind::Drain), None)
            .await
            .and_then(Result::ok)
    });
    let shared = balancer.shared.clone();
    let listener = shared.local_addrs()[0];

    let swap = shared.swap_lock.blocking_lock();
    balancer.go();
    waiting_rx
        .recv_timeout(DEADLINE)
        .expect("the override is about to be set");
    let during = get(listener);
    drop(swap);
    let state = balancer.finish();

    let during = during.expect("a request answered while the override waits");
    assert!(during.starts_with("HTTP/1.1 200"), "{during}");
    assert!(
        state.is_some(),
        "the override applied once the lock was free"
    );
    assert!(!shared.pools()[0].eligibility()[0].0, "b1 is drained");
}
