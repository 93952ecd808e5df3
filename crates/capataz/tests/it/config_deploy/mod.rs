//! Configuration that fits deployment: `${VAR}` substitution and
//! `admin.token_file` (`env.rs`), every error of a file in one run (`errors.rs`), warnings with
//! file, line and key, a TCP check's outcome told as a connect (`warnings.rs`), and addresses
//! and bind errors (`addresses.rs`), through the library and the `capataz` binary.

mod addresses;
mod env;
mod errors;
mod warnings;

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

/// A directory of its own in the temporary directory, removed on drop.
struct TempDir {
    path: PathBuf,
}

impl TempDir {
    fn new(tag: &str) -> TempDir {
        static NEXT: AtomicUsize = AtomicUsize::new(0);
        let n = NEXT.fetch_add(1, Ordering::Relaxed);
        let path =
            std::env::temp_dir().join(format!("capataz-deploy-{}-{n}-{tag}", std::process::id()));
        std::fs::create_dir_all(&path).expect("create a temporary directory");
        TempDir { path }
    }

    /// Writes `contents` to `name` in the directory; returns its path.
    fn write(&self, name: &str, contents: &str) -> PathBuf {
        let path = self.path.join(name);
        std::fs::write(&path, contents).expect("write a temporary file");
        path
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.path);
    }
}

/// What a run of the binary came to.
struct Output {
    code: Option<i32>,
    stdout: String,
    stderr: String,
}

/// Runs `capataz ARGS` with `env` added to its environment, and waits for it to exit (20 s at
/// most; then it is killed and the test fails).
fn capataz(args: &[&str], env: &[(&str, &str)]) -> Output {
    let mut command = Command::new(env!("CARGO_BIN_EXE_capataz"));
    command
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    for (name, value) in env {
        command.env(name, value);
    }
    let mut child = command.spawn().expect("spawn capataz");
    let end = Instant::now() + crate::support::DEADLINE;
    // A child offers no exit notification to wait on with a deadline: check every 20 ms.
    loop {
        if child.try_wait().expect("wait for capataz").is_some() {
            break;
        }
        if Instant::now() > end {
            let _ = child.kill();
            let _ = child.wait();
            panic!("capataz {args:?} did not exit within the deadline");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let out = child.wait_with_output().expect("read capataz's output");
    Output {
        code: out.status.code(),
        stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
    }
}

/// `path` as text, for arguments and expected messages.
fn shown(path: &Path) -> String {
    path.display().to_string()
}
