//! A reload reads, parses and validates its file off the runtime threads: while one is stuck
//! reading (here: the config path is a FIFO nobody writes yet), proxied traffic keeps flowing,
//! even on a runtime with a single thread.
//!
//! The balancer runs on its own one-thread runtime in its own thread; the test drives it with
//! blocking sockets that have deadlines, so a stalled runtime fails the test instead of hanging
//! it. Linux only (a FIFO, and `O_NONBLOCK` to see when the reader is waiting).
#![cfg(target_os = "linux")]

use std::io::Write;
use std::net::SocketAddr;
use std::os::unix::fs::OpenOptionsExt;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use capataz::config;
use capataz::server::Balancer;

use crate::support::balancer::ConfigText;
use crate::support::blocking::{backend, request};
use crate::support::DEADLINE;

/// `O_NONBLOCK` on Linux.
const O_NONBLOCK: i32 = 0o4000;

/// An admin listener, a client listener and pool `web` over `backend`, without probes.
fn config_text(backend: SocketAddr) -> String {
    ConfigText::new(&[("b1".to_owned(), backend)])
        .admin("")
        .extra("active.kind = \"none\"")
        .build()
}

struct TempPath(PathBuf);

impl Drop for TempPath {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

#[test]
fn a_slow_reload_stalled_proxied_traffic() {
    let backend = backend();
    let path = TempPath(
        std::env::temp_dir().join(format!("capataz-reload-fifo-{}.toml", std::process::id())),
    );
    std::fs::write(&path.0, config_text(backend)).expect("write config");
    let config = config::load(&path.0).expect("valid config");

    // The balancer, on a runtime with one thread.
    let (ready_tx, ready_rx) = std::sync::mpsc::channel();
    let start_path = path.0.clone();
    std::thread::spawn(move || {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("runtime");
        runtime.block_on(async move {
            let (events, _) = tokio::sync::broadcast::channel(1024);
            let balancer = Balancer::start_with_path(&config, events, Some(start_path))
                .await
                .expect("balancer starts");
            let addrs = (
                balancer.local_addrs()[0],
                balancer.admin_addr().expect("admin runs"),
            );
            ready_tx.send(addrs).expect("test waits");
            std::future::pending::<()>().await;
        });
    });
    let (listener, admin) = ready_rx.recv_timeout(DEADLINE).expect("balancer ready");
    assert_eq!(request(listener, "GET / HTTP/1.1", DEADLINE), 200);

    // The config path becomes a FIFO: the reload's read waits until the test writes it.
    std::fs::remove_file(&path.0).expect("remove config");
    let made = std::process::Command::new("mkfifo")
        .arg(&path.0)
        .status()
        .expect("run mkfifo");
    assert!(made.success(), "mkfifo failed");
    let reload = std::thread::spawn(move || request(admin, "POST /reload HTTP/1.1", DEADLINE));

    // Opening the write end without blocking succeeds only once the reload is reading.
    let started = Instant::now();
    let mut writer = loop {
        match std::fs::OpenOptions::new()
            .write(true)
            .custom_flags(O_NONBLOCK)
            .open(&path.0)
        {
            Ok(file) => break file,
            Err(_) if started.elapsed() < DEADLINE => {
                std::thread::sleep(Duration::from_millis(5));
            }
            Err(error) => panic!("the reload never opened the config file: {error}"),
        }
    };

    // The reload is stuck reading: traffic must still flow.
    for n in 0..20 {
        let status = request(listener, "GET / HTTP/1.1", Duration::from_secs(3));
        assert_eq!(status, 200, "request {n} during the reload");
    }
    let status = request(admin, "GET /status HTTP/1.1", Duration::from_secs(3));
    assert_eq!(status, 200, "the admin API answers during the reload");

    // Let the reload finish: it applies.
    writer
        .write_all(config_text(backend).as_bytes())
        .expect("write the FIFO");
    drop(writer);
    assert_eq!(reload.join().expect("reload thread"), 200);
    assert_eq!(request(listener, "GET / HTTP/1.1", DEADLINE), 200);
}
