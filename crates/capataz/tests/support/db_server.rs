//! A database server the tests start themselves (PostgreSQL, MariaDB): its own data directory
//! in a temporary directory, a reserved loopback port, run as the current user, or as
//! `nobody` (uid 65534, through util-linux's `setpriv`) when that is root, since PostgreSQL
//! refuses to run as root and MariaDB would need `--user`. The process is stopped by PID: its
//! graceful signal, then SIGKILL if it is still there after the deadline; the directory is
//! removed when dropped.

use std::net::SocketAddr;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

use super::{reserve_port, ReservedPort, DEADLINE};

/// The uid and gid of `nobody` and `nogroup` on Debian.
const NOBODY: u32 = 65534;

/// A scratch directory for one server and the port it listens on.
pub struct ServerHome {
    dir: PathBuf,
    port: ReservedPort,
}

impl ServerHome {
    /// A new empty directory `capataz-<what>-<pid>-<n>` (owned by `nobody` when the tests run
    /// as root) and a reserved loopback port.
    pub fn new(what: &str) -> ServerHome {
        static NEXT: AtomicU32 = AtomicU32::new(0);
        let dir = std::env::temp_dir().join(format!(
            "capataz-{what}-{}-{}",
            std::process::id(),
            NEXT.fetch_add(1, Ordering::Relaxed)
        ));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).expect("a temporary directory");
        if as_root() {
            std::os::unix::fs::chown(&dir, Some(NOBODY), Some(NOBODY))
                .expect("the server's directory given to nobody");
        }
        ServerHome {
            dir,
            port: reserve_port(),
        }
    }

    /// The directory.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// The directory as text.
    pub fn text(&self) -> &str {
        self.dir.to_str().expect("a UTF-8 temporary path")
    }

    /// The port.
    pub fn port(&self) -> u16 {
        self.port.port
    }

    /// Where the server listens.
    pub fn addr(&self) -> SocketAddr {
        SocketAddr::from(([127, 0, 0, 1], self.port.port))
    }

    /// `program` with `args`, run as the server's user, its output in `<dir>/<log>`.
    pub fn command(&self, program: &Path, args: &[String], log: &str) -> Command {
        let out = std::fs::File::create(self.dir.join(log)).expect("a log file");
        if as_root() {
            std::os::unix::fs::chown(self.dir.join(log), Some(NOBODY), Some(NOBODY))
                .expect("the log given to nobody");
        }
        let mut command = if as_root() {
            let mut command = Command::new("setpriv");
            command.args([
                format!("--reuid={NOBODY}"),
                format!("--regid={NOBODY}"),
                "--clear-groups".into(),
                "--".into(),
            ]);
            command.arg(program);
            command
        } else {
            Command::new(program)
        };
        command
            .args(args)
            .env("HOME", &self.dir)
            .env("LC_ALL", "C")
            .stdin(Stdio::null())
            .stdout(out.try_clone().expect("a log file"))
            .stderr(out);
        command
    }

    /// Runs `program` to its end (an `initdb`), failing with its output if it fails.
    pub fn run(&self, program: &Path, args: &[String], log: &str) {
        let status = self
            .command(program, args, log)
            .status()
            .unwrap_or_else(|e| panic!("{} does not run: {e}", program.display()));
        let output = std::fs::read_to_string(self.dir.join(log)).unwrap_or_default();
        assert!(
            status.success(),
            "{} failed: {status}\n{output}",
            program.display()
        );
    }

    /// The last lines of `log` (for a failure message).
    pub fn log_tail(&self, log: &str) -> String {
        let text = std::fs::read_to_string(self.dir.join(log)).unwrap_or_default();
        let lines: Vec<&str> = text.lines().collect();
        lines[lines.len().saturating_sub(20)..].join("\n")
    }
}

impl Drop for ServerHome {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// Whether the tests run as root.
pub fn as_root() -> bool {
    std::fs::metadata("/proc/self").is_ok_and(|meta| meta.uid() == 0)
}

/// Stops `child` by PID: `graceful` (a signal name) first, SIGKILL if it has not exited
/// within the deadline; reaped either way.
pub fn stop(child: &mut Child, graceful: &str) {
    if matches!(child.try_wait(), Ok(Some(_))) {
        return;
    }
    // kill(1) may find it gone meanwhile: that is what was wanted.
    let _ = Command::new("kill")
        .arg(format!("-{graceful}"))
        .arg(child.id().to_string())
        .status();
    let end = Instant::now() + DEADLINE;
    while Instant::now() < end {
        if matches!(child.try_wait(), Ok(Some(_))) {
            return;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let _ = child.kill();
    let _ = child.wait();
}
