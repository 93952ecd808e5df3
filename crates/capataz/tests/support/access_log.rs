//! Access log files for the tests: a fresh directory, the listener table that logs there,
//! and reading the lines back with a deadline.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};

use serde_json::Value;

use super::wait::wait_until;

/// A fresh directory for log files, removed when dropped.
pub struct LogDir {
    pub dir: PathBuf,
}

impl LogDir {
    pub fn new() -> LogDir {
        static NEXT: AtomicUsize = AtomicUsize::new(0);
        let dir = std::env::temp_dir().join(format!(
            "capataz-access-log-test-{}-{}",
            std::process::id(),
            NEXT.fetch_add(1, Ordering::Relaxed)
        ));
        std::fs::create_dir_all(&dir).expect("create the test directory");
        LogDir { dir }
    }

    /// `name` in the directory.
    pub fn path(&self, name: &str) -> PathBuf {
        self.dir.join(name)
    }
}

impl Drop for LogDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// The `[listeners.access_log]` table writing to `path` in `format`, with `lines` added.
pub fn table(path: &Path, format: &str, lines: &str) -> String {
    format!(
        "[listeners.access_log]\npath = {:?}\nformat = {format:?}\n{lines}\n",
        path.display().to_string()
    )
}

/// The complete lines of `path` now (none if it does not exist).
pub fn lines(path: &Path) -> Vec<String> {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    let complete = match text.rfind('\n') {
        Some(end) => &text[..=end],
        None => "",
    };
    complete.lines().map(str::to_owned).collect()
}

/// Waits until `path` has at least `n` complete lines, and returns them all.
pub async fn wait_lines(path: &Path, n: usize) -> Vec<String> {
    wait_until(&format!("{n} lines in {}", path.display()), || {
        lines(path).len() >= n
    })
    .await;
    lines(path)
}

/// Waits for `n` lines of a JSON log, each parsed.
pub async fn wait_json(path: &Path, n: usize) -> Vec<Value> {
    wait_lines(path, n)
        .await
        .iter()
        .map(|line| serde_json::from_str(line).unwrap_or_else(|e| panic!("{e}: {line}")))
        .collect()
}
