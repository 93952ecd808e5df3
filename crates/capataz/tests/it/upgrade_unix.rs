//! A binary upgrade of a process listening on a Unix socket (`address = "unix:/path"`): the
//! new process takes the same listening socket over (the same file, the same inode: never
//! renamed or bound again), requests are answered before, during and after it, and the old
//! process leaves the file to the new one when it exits; the new one removes it when it stops.
//! `capataz run` as a child process, as in `upgrade.rs`; loopback and a temporary directory
//! only; every wait has a deadline.

use std::io::{Read, Write};
use std::os::unix::fs::{FileTypeExt, MetadataExt};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use capataz::sim::SimBackend;

use crate::support::any;
use crate::support::process::{gone, pid_in, signal, Capataz, TempFile};
use crate::support::wait::block_until;

/// `GET /` over a fresh connection to the socket at `path`: the status.
fn unix_status(path: &Path) -> std::io::Result<u16> {
    let mut stream = UnixStream::connect(path)?;
    stream.set_read_timeout(Some(Duration::from_secs(10)))?;
    stream.write_all(b"GET / HTTP/1.1\r\nHost: upgrade.test\r\nConnection: close\r\n\r\n")?;
    let mut raw = Vec::new();
    stream.read_to_end(&mut raw)?;
    let text = String::from_utf8_lossy(&raw);
    Ok(text
        .split(' ')
        .nth(1)
        .and_then(|code| code.parse().ok())
        .unwrap_or(0))
}

/// A fresh directory for the socket, removed when dropped.
struct Dir(PathBuf);

impl Drop for Dir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

#[test]
fn a_unix_listener_is_served_throughout_an_upgrade_and_its_file_stays_with_the_new_process() {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .expect("a tokio runtime");
    let backend = rt.block_on(SimBackend::start("a", any())).expect("start a");
    let dir =
        Dir(std::env::temp_dir().join(format!("capataz-upgrade-unix-{}", std::process::id())));
    let _ = std::fs::remove_dir_all(&dir.0);
    std::fs::create_dir_all(&dir.0).expect("the socket directory");
    let socket = dir.0.join("front.sock");
    let config = TempFile::new(
        "upgrade-unix.toml",
        &format!(
            "[[listeners]]\nname = \"front\"\naddress = \"unix:{}\"\nsocket_mode = \"0660\"\n\n\
             [pools.web]\nbackends = [{{ name = \"a\", address = \"{}\" }}]\n\n\
             [pools.web.active]\ninterval = \"50ms\"\ntimeout = \"1s\"\n",
            socket.display(),
            backend.addr()
        ),
    );
    let mut capataz = Capataz::spawn(&["run", "--config", config.text()], &[]);
    capataz.wait_line("the listening line", |l| {
        l.contains("listening") && l.contains("listener=front")
    });
    block_until("the first answer", || {
        unix_status(&socket).is_ok_and(|s| s == 200)
    });
    let inode = std::fs::metadata(&socket).expect("the socket file").ino();

    // Clients on the socket throughout: a fresh connection per request.
    let stop = Arc::new(AtomicBool::new(false));
    let (ok, errors) = (Arc::new(AtomicU64::new(0)), Arc::new(AtomicU64::new(0)));
    let clients: Vec<_> = (0..2)
        .map(|_| {
            let (stop, ok, errors, socket) =
                (stop.clone(), ok.clone(), errors.clone(), socket.clone());
            std::thread::spawn(move || {
                let mut failures = Vec::new();
                while !stop.load(Ordering::Relaxed) {
                    match unix_status(&socket) {
                        Ok(200) => ok.fetch_add(1, Ordering::Relaxed),
                        other => {
                            failures.push(format!("{other:?}"));
                            errors.fetch_add(1, Ordering::Relaxed)
                        }
                    };
                }
                failures
            })
        })
        .collect();
    block_until("100 requests before the upgrade", || {
        ok.load(Ordering::Relaxed) >= 100
    });

    let old = capataz.pid();
    let mark = capataz.line_count();
    signal(old, "USR2");
    let (_, started) = capataz.wait_line_after(mark, "the new process", |l| {
        l.contains("upgrade: the new process started")
    });
    let new = pid_in(&started);
    capataz.adopt(new);
    capataz.wait_line_after(mark, "the takeover", |l| {
        l.contains("took over from the old process")
    });
    let status = capataz.wait_exit();
    assert!(status.success(), "the old process exited with {status}");
    assert!(!gone(new), "the new process is gone:\n{}", capataz.stderr());

    // The old process is gone; its socket file is still there, the same one, served.
    let meta =
        std::fs::symlink_metadata(&socket).expect("the socket file after the old process exited");
    assert!(meta.file_type().is_socket());
    assert_eq!(meta.ino(), inode, "the same socket file, not bound again");
    let after = ok.load(Ordering::Relaxed);
    block_until("100 requests after the upgrade", || {
        ok.load(Ordering::Relaxed) >= after + 100
    });
    stop.store(true, Ordering::Relaxed);
    let failures: Vec<String> = clients
        .into_iter()
        .flat_map(|c| c.join().expect("a client"))
        .collect();
    assert_eq!(
        errors.load(Ordering::Relaxed),
        0,
        "client errors: {failures:?}"
    );
    assert_eq!(unix_status(&socket).expect("the new process answers"), 200);

    // The new process owns the file now: it removes it when it stops.
    signal(new, "TERM");
    block_until("the new process to exit", || gone(new));
    assert!(!socket.exists(), "the new process removed its socket file");
}
