//! `capataz run` with two worker threads (`CAPATAZ_WORKER_THREADS=2`), end to end: the binary
//! as a child process, as only a process runs the worker threads (the in-process tests serve
//! on their own runtime). Many keep-alive clients are all answered and counted, with the second
//! worker's thread doing its share; a reload adds a listener while a load runs; and SIGTERM
//! lets a slow answer in flight on each worker finish. A backend on the test's runtime, blocking
//! clients; loopback and ephemeral ports; every wait has a deadline.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::io::AsyncWriteExt as _;
use tokio::sync::watch;

use crate::support::blocking::request;
use crate::support::client::{exchange, Answer};
use crate::support::process::{load, Capataz, LoadReport, TempFile};
use crate::support::raw::{ok_answer, read_head, RawBackend};
use crate::support::wait::block_until;
use crate::support::{reserve_port, runtime, DEADLINE};

/// A keep-alive backend answering `200 ok`; a `GET /slow` is counted in `pending` and answered
/// only once `gate` is open.
async fn gated_backend(pending: Arc<AtomicU64>, gate: watch::Receiver<bool>) -> RawBackend {
    RawBackend::start(move |mut stream, hits| {
        let (pending, mut gate) = (pending.clone(), gate.clone());
        async move {
            let mut buf = Vec::new();
            while let Some(head) = read_head(&mut stream, &mut buf).await {
                hits.fetch_add(1, Ordering::SeqCst);
                if head.starts_with("GET /slow ") {
                    pending.fetch_add(1, Ordering::SeqCst);
                    if gate.wait_for(|open| *open).await.is_err() {
                        return;
                    }
                }
                if stream.write_all(ok_answer("ok").as_bytes()).await.is_err() {
                    return;
                }
            }
        }
    })
    .await
}

/// Listener `front` (and `second` on port `second`, if given; a reload tells listeners apart
/// by their configured address) over pool `web` of `backend`, unprobed, and an admin listener,
/// on ephemeral ports.
fn config_text(backend: SocketAddr, second: Option<u16>) -> String {
    let second = match second {
        Some(port) => format!("[[listeners]]\nname = \"second\"\naddress = \"127.0.0.1:{port}\"\n"),
        None => String::new(),
    };
    format!(
        r#"
[server]
shutdown_timeout = "60s"

[admin]
address = "127.0.0.1:0"

[[listeners]]
name = "front"
address = "127.0.0.1:0"

{second}
[pools.web]
backends = [{{ name = "a", address = "{backend}" }}]

[pools.web.active]
kind = "none"
"#
    )
}

/// `GET path` on a new connection, for a test thread: the status, 0 without an answer.
fn get(addr: SocketAddr, path: &str) -> u16 {
    request(
        addr,
        &format!("GET {path} HTTP/1.1"),
        Duration::from_secs(30),
    )
}

/// `GET path` on the admin API at `admin`.
fn admin_get(rt: &tokio::runtime::Runtime, admin: SocketAddr, path: &str) -> Answer {
    let answer = rt.block_on(exchange(admin, "GET", path, &admin.to_string(), &[]));
    assert_eq!(answer.status, 200, "GET {path}: {}", answer.text());
    answer
}

/// The requests of listener `name` answered 2xx, from `/metrics`.
fn answered(rt: &tokio::runtime::Runtime, admin: SocketAddr, name: &str) -> u64 {
    let page = admin_get(rt, admin, "/metrics").text();
    let listener = format!("listener=\"{name}\"");
    page.lines()
        .filter(|line| line.starts_with("capataz_client_requests_total{"))
        .filter(|line| line.contains(&listener) && line.contains("class=\"2xx\""))
        .filter_map(|line| line.rsplit(' ').next()?.parse::<u64>().ok())
        .sum()
}

/// The open connections of each listener, from `/status`.
fn open(rt: &tokio::runtime::Runtime, admin: SocketAddr) -> Vec<(String, u64)> {
    let status = admin_get(rt, admin, "/status").json();
    status["listeners"]
        .as_array()
        .expect("a listeners array")
        .iter()
        .map(|l| {
            let name = l["name"].as_str().expect("a name").to_owned();
            (name, l["open"].as_u64().expect("an open count"))
        })
        .collect()
}

/// The time the thread named `name` of process `pid` has run, in nanoseconds.
fn cpu_of_thread(pid: u32, name: &str) -> u64 {
    let tasks = std::fs::read_dir(format!("/proc/{pid}/task")).expect("/proc/PID/task");
    for task in tasks {
        let dir = task.expect("a task").path();
        let comm = std::fs::read_to_string(dir.join("comm")).unwrap_or_default();
        if comm.trim() == name {
            let stat = std::fs::read_to_string(dir.join("schedstat")).expect("schedstat");
            return stat
                .split(' ')
                .next()
                .and_then(|ns| ns.parse().ok())
                .expect("a run time");
        }
    }
    panic!("no thread named {name} in process {pid}");
}

/// Runs `clients` keep-alive clients on `addr` until `done`.
fn load_until(addr: SocketAddr, clients: usize, done: impl FnMut() -> bool) -> LoadReport {
    let stop = Arc::new(AtomicBool::new(false));
    let running = load(addr, clients, 0, stop.clone());
    block_until("the load's requests", done);
    stop.store(true, Ordering::Relaxed);
    running.join().expect("the load")
}

#[test]
fn two_workers_answer_every_client_keep_serving_through_a_reload_and_drain_both_on_sigterm() {
    let rt = runtime();
    let (gate, gated) = watch::channel(false);
    let pending = Arc::new(AtomicU64::new(0));
    let backend = rt.block_on(gated_backend(pending.clone(), gated));
    let config = TempFile::new("workers.toml", &config_text(backend.addr, None));
    let mut capataz = Capataz::spawn(&["run", config.text()], &[("CAPATAZ_WORKER_THREADS", "2")]);
    let front = capataz.listening_on("front");
    let admin = capataz.admin_on();
    block_until("a first answer", || get(front, "/") == 200);

    // Many keep-alive clients: every request answered, and counted once; the second worker's
    // thread served its share (the first, the main thread, accepts them all).
    let before = answered(&rt, admin, "front");
    let worker_before = cpu_of_thread(capataz.pid(), "worker-1");
    let start = backend.hits();
    let report = load_until(front, 32, || backend.hits() >= start + 2_000);
    assert_eq!(report.errors, 0, "{:?}", report.samples);
    assert_eq!(report.connections, 32, "{report:?}");
    assert!(report.ok >= 2_000, "{report:?}");
    let end = Instant::now() + DEADLINE;
    loop {
        let counted = answered(&rt, admin, "front") - before;
        if counted == report.ok {
            break;
        }
        assert!(
            Instant::now() < end,
            "{counted} answers counted, {} seen",
            report.ok
        );
        std::thread::sleep(Duration::from_millis(10));
    }
    let worker_ran = cpu_of_thread(capataz.pid(), "worker-1") - worker_before;
    assert!(
        worker_ran >= 10_000_000,
        "worker 1 ran {worker_ran} ns during {} requests",
        report.ok
    );

    // A reload adds a listener while a load runs on the first: nothing refused or cut.
    let stop = Arc::new(AtomicBool::new(false));
    let running = load(front, 8, 0, stop.clone());
    let port = reserve_port();
    let mark = capataz.line_count();
    config.write(&config_text(backend.addr, Some(port.port)));
    capataz.signal("HUP");
    capataz.wait_line_after(mark, "the second listener", |l| {
        l.contains("listening") && l.contains("listener=second ")
    });
    let second = SocketAddr::from(([127, 0, 0, 1], port.port));
    let second_report = load_until(second, 8, || answered(&rt, admin, "second") >= 200);
    stop.store(true, Ordering::Relaxed);
    let report = running.join().expect("the load");
    for report in [&report, &second_report] {
        assert_eq!(report.errors, 0, "{:?}", report.samples);
        assert!(report.ok > 0, "{report:?}");
    }
    // Every client has closed its connections: none is open on either listener.
    block_until("the clients' connections to close", || {
        open(&rt, admin).iter().all(|(_, open)| *open == 0)
    });

    // SIGTERM with four slow answers in flight, two per worker (each connection goes to the
    // worker with the fewest): each finishes, and the process exits without its deadline.
    let slow: Vec<_> = (0..4)
        .map(|_| std::thread::spawn(move || get(front, "/slow")))
        .collect();
    block_until("four slow requests at the backend", || {
        pending.load(Ordering::SeqCst) == 4
    });
    let listeners = open(&rt, admin);
    assert!(
        listeners.contains(&("front".to_owned(), 4)),
        "{listeners:?}"
    );
    let mark = capataz.line_count();
    capataz.signal("TERM");
    capataz.wait_line_after(mark, "the drain", |l| {
        l.contains("stopping: no new connections")
    });
    gate.send(true).expect("the backend's gate");
    for client in slow {
        let status = client.join().expect("a slow client");
        assert_eq!(status, 200);
    }
    let status = capataz.wait_exit();
    assert!(status.success(), "{status}\n{}", capataz.stderr());
    assert!(
        !capataz.stderr().contains("deadline reached"),
        "{}",
        capataz.stderr()
    );
}
