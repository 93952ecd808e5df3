//! Prometheus's own tools against capataz: `promtool check metrics` on an exposition, and a
//! real Prometheus server (Debian package `prometheus`) scraping a balancer's admin listener.
//!
//! Both are required: a missing binary fails the test with how to install it
//! (`.ci/deps/prometheus.sh`, which CI runs), it never skips.

use std::io::Write;
use std::net::{SocketAddr, TcpListener};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use serde_json::Value;

use super::tools::require_tool;
use super::DEADLINE;

/// Where a binary of the `prometheus` package is, or a failure saying how to install it.
fn tool(name: &str) -> PathBuf {
    require_tool(name, "prometheus")
}

/// What `promtool check metrics` says of `exposition`: its exit code and its findings
/// (standard output and error).
pub fn promtool_check(exposition: &str) -> (i32, String) {
    let mut child = Command::new(tool("promtool"))
        .args(["check", "metrics"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("promtool starts");
    let mut stdin = child.stdin.take().expect("promtool's stdin");
    stdin
        .write_all(exposition.as_bytes())
        .expect("the exposition written to promtool");
    drop(stdin);
    let output = child.wait_with_output().expect("promtool ends");
    let findings = format!(
        "{}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    (output.status.code().unwrap_or(-1), findings)
}

/// A scratch directory, removed when dropped.
pub struct TempDir(PathBuf);

impl TempDir {
    /// A new empty directory under the system's temporary directory.
    pub fn new(what: &str) -> TempDir {
        static NEXT: AtomicU32 = AtomicU32::new(0);
        let path = std::env::temp_dir().join(format!(
            "capataz-{what}-{}-{}",
            std::process::id(),
            NEXT.fetch_add(1, Ordering::Relaxed)
        ));
        let _ = std::fs::remove_dir_all(&path);
        std::fs::create_dir_all(&path).expect("a temporary directory");
        TempDir(path)
    }

    /// Its path.
    pub fn path(&self) -> &Path {
        &self.0
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// A Prometheus server on loopback scraping one target, stopped (and its data removed) when
/// dropped.
pub struct Prometheus {
    child: Child,
    /// Its HTTP API's address.
    pub addr: SocketAddr,
    log: PathBuf,
    _dir: TempDir,
}

/// A port free a moment ago on loopback (Prometheus takes a fixed one, not `:0`).
fn free_port() -> u16 {
    let socket = TcpListener::bind("127.0.0.1:0").expect("bind 127.0.0.1:0");
    socket.local_addr().expect("its address").port()
}

impl Prometheus {
    /// Starts Prometheus scraping `target`'s `/metrics` (job `capataz`) every
    /// `interval`, and waits until it is ready. The port is picked free and then released, so
    /// another process may take it first: then it starts again on another one.
    pub async fn start(target: SocketAddr, interval: Duration) -> Prometheus {
        let binary = tool("prometheus");
        for _ in 0..5 {
            let dir = TempDir::new("prometheus");
            let config = dir.path().join("prometheus.yml");
            let millis = interval.as_millis();
            std::fs::write(
                &config,
                format!(
                    "global:\n  scrape_interval: {millis}ms\n  scrape_timeout: {millis}ms\n\
                     scrape_configs:\n  - job_name: capataz\n    static_configs:\n      \
                     - targets: [\"{target}\"]\n"
                ),
            )
            .expect("the Prometheus config written");
            let port = free_port();
            let addr: SocketAddr = ([127, 0, 0, 1], port).into();
            let log = dir.path().join("prometheus.log");
            let log_file = std::fs::File::create(&log).expect("Prometheus's log file");
            let child = Command::new(&binary)
                .arg(format!("--config.file={}", config.display()))
                .arg(format!(
                    "--storage.tsdb.path={}",
                    dir.path().join("data").display()
                ))
                .arg(format!("--web.listen-address={addr}"))
                .stdin(Stdio::null())
                .stdout(log_file.try_clone().expect("the log file"))
                .stderr(log_file)
                .spawn()
                .expect("prometheus starts");
            let mut prometheus = Prometheus {
                child,
                addr,
                log,
                _dir: dir,
            };
            if prometheus.ready().await {
                return prometheus;
            }
            let log = prometheus.log();
            assert!(
                log.contains("address already in use"),
                "Prometheus did not start:\n{log}"
            );
        }
        panic!("Prometheus found its port taken five times in a row");
    }

    /// Waits until `/-/ready` answers 200: `true`, or `false` if the process exited first.
    async fn ready(&mut self) -> bool {
        let end = tokio::time::Instant::now() + DEADLINE;
        loop {
            if let Ok(Some(_)) = self.child.try_wait() {
                return false;
            }
            if let Ok(Ok(stream)) = tokio::time::timeout(
                Duration::from_secs(1),
                tokio::net::TcpStream::connect(self.addr),
            )
            .await
            {
                drop(stream);
                let answer = self.get("/-/ready").await;
                if answer.0 == 200 {
                    return true;
                }
            }
            assert!(
                tokio::time::Instant::now() < end,
                "Prometheus not ready within {DEADLINE:?}:\n{}",
                self.log()
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// Its log so far.
    pub fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    async fn get(&self, path: &str) -> (u16, String) {
        let host = self.addr.to_string();
        let answer = super::client::exchange(self.addr, "GET", path, &host, &[]).await;
        (answer.status, answer.text())
    }

    /// `GET path` on the HTTP API, as JSON, which must be a success.
    pub async fn api(&self, path: &str) -> Value {
        let (status, body) = self.get(path).await;
        assert_eq!(status, 200, "GET {path}: {body}");
        let json: Value = serde_json::from_str(&body).expect("JSON from the API");
        assert_eq!(json["status"], "success", "GET {path}: {body}");
        json["data"].clone()
    }

    /// The instant vector `query` evaluates to now.
    pub async fn query(&self, query: &str) -> Vec<Value> {
        let data = self
            .api(&format!("/api/v1/query?query={}", percent_encode(query)))
            .await;
        data["result"].as_array().cloned().unwrap_or_default()
    }
}

impl Drop for Prometheus {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// `text` with every byte but unreserved ones percent-encoded, for a query string.
pub fn percent_encode(text: &str) -> String {
    text.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => {
                (b as char).to_string()
            }
            _ => format!("%{b:02X}"),
        })
        .collect()
}
