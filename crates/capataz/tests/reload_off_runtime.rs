//! A reload reads, parses and validates its file off the runtime threads: while one is stuck
//! reading (here: the config path is a FIFO nobody writes yet), proxied traffic keeps flowing,
//! even on a runtime with a single thread.
//!
//! The balancer runs on its own one-thread runtime in its own thread; the test drives it with
//! blocking sockets that have deadlines, so a stalled runtime fails the test instead of hanging
//! it. Linux only (a FIFO, and `O_NONBLOCK` to see when the reader is waiting).
#![cfg(target_os = "linux")]

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::os::unix::fs::OpenOptionsExt;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use capataz::config;
use capataz::server::Balancer;

const DEADLINE: Duration = Duration::from_secs(20);
/// `O_NONBLOCK` on Linux.
const O_NONBLOCK: i32 = 0o4000;

fn config_text(backend: SocketAddr, listener: &str) -> String {
    format!(
        r#"
[admin]
address = "127.0.0.1:0"

[[listeners]]
address = "{listener}"

[pools.web]
backends = [{{ name = "b1", address = "{backend}" }}]
active.kind = "none"
"#
    )
}

/// One request over a fresh connection, with a deadline; the status code, or 0.
fn request(addr: SocketAddr, head: &str, timeout: Duration) -> u16 {
    let Ok(mut stream) = TcpStream::connect_timeout(&addr, timeout) else {
        return 0;
    };
    let _ = stream.set_read_timeout(Some(timeout));
    let request = format!("{head}\r\nhost: {addr}\r\nconnection: close\r\n\r\n");
    if stream.write_all(request.as_bytes()).is_err() {
        return 0;
    }
    let mut answer = Vec::new();
    let _ = stream.read_to_end(&mut answer);
    String::from_utf8_lossy(&answer)
        .split(' ')
        .nth(1)
        .and_then(|code| code.parse().ok())
        .unwrap_or(0)
}

/// A backend answering `200 ok` to each request, one per connection, on its own thread.
fn backend() -> SocketAddr {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind backend");
    let addr = listener.local_addr().expect("backend address");
    std::thread::spawn(move || {
        for stream in listener.incoming() {
            let Ok(mut stream) = stream else { continue };
            std::thread::spawn(move || {
                let mut buffer = Vec::new();
                let mut chunk = [0u8; 4096];
                loop {
                    while let Some(end) = buffer.windows(4).position(|w| w == b"\r\n\r\n") {
                        buffer.drain(..end + 4);
                        let answer = b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok";
                        if stream.write_all(answer).is_err() {
                            return;
                        }
                    }
                    match stream.read(&mut chunk) {
                        Ok(0) | Err(_) => return,
                        Ok(n) => buffer.extend_from_slice(&chunk[..n]),
                    }
                }
            });
        }
    });
    addr
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
    std::fs::write(&path.0, config_text(backend, "127.0.0.1:0")).expect("write config");
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
        .write_all(config_text(backend, "127.0.0.1:0").as_bytes())
        .expect("write the FIFO");
    drop(writer);
    assert_eq!(reload.join().expect("reload thread"), 200);
    assert_eq!(request(listener, "GET / HTTP/1.1", DEADLINE), 200);
}
