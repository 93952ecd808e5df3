//! The WebDriver side of the dashboard test: ChromeDriver found and started, a headless
//! Chromium session that only reaches loopback, and the W3C WebDriver HTTP API spoken over a
//! plain blocking TCP connection (one request per connection).

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use serde_json::{json, Value};

use super::DEADLINE;

/// Where ChromeDriver is: `$CHROMEDRIVER`, `/usr/bin/chromedriver` or `chromedriver` on
/// `PATH`; or a failure saying how to install it.
pub(crate) fn find_chromedriver() -> PathBuf {
    match std::env::var_os("CHROMEDRIVER") {
        Some(path) => PathBuf::from(path),
        None => crate::support::tools::require_tool("chromedriver", "chromium"),
    }
}

/// A ChromeDriver process on a free loopback port, killed (by its PID) when dropped, with a
/// scratch directory for Chromium's profile and ChromeDriver's log.
pub(crate) struct Driver {
    child: Child,
    port: u16,
    dir: PathBuf,
}

impl Driver {
    pub(crate) fn start(binary: &Path) -> Driver {
        let nanos = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos());
        let dir =
            std::env::temp_dir().join(format!("capataz-dashboard-{}-{nanos}", std::process::id()));
        std::fs::create_dir_all(dir.join("profile")).expect("create a scratch directory");
        let port = TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .expect("find a free loopback port")
            .port();
        let child = Command::new(binary)
            .arg(format!("--port={port}"))
            .arg(format!(
                "--log-path={}",
                dir.join("chromedriver.log").display()
            ))
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap_or_else(|e| panic!("cannot start {}: {e}", binary.display()));
        let mut driver = Driver { child, port, dir };
        driver.wait_ready();
        driver
    }

    fn wait_ready(&mut self) {
        let end = Instant::now() + DEADLINE;
        loop {
            if let Ok(Some(status)) = self.child.try_wait() {
                panic!(
                    "chromedriver exited at start ({status}); see {}",
                    self.log_path().display()
                );
            }
            if let Ok(status) = webdriver(self.port, "GET", "/status", None) {
                if status["ready"] == json!(true) {
                    return;
                }
            }
            assert!(
                Instant::now() < end,
                "chromedriver not ready on port {} within {DEADLINE:?}; see {}",
                self.port,
                self.log_path().display()
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    fn log_path(&self) -> PathBuf {
        self.dir.join("chromedriver.log")
    }

    /// A new headless Chromium session that only reaches loopback.
    pub(crate) fn session(&self) -> Session {
        let profile = self.dir.join("profile");
        let mut options = json!({
            "args": [
                "--headless",
                "--no-sandbox",
                "--disable-gpu",
                "--disable-quic",
                "--no-first-run",
                "--disable-background-networking",
                "--disable-component-update",
                "--disable-sync",
                "--disable-dev-shm-usage",
                "--disable-extensions",
                "--no-default-browser-check",
                "--window-size=1360,760",
                format!("--user-data-dir={}", profile.display()),
                // Nothing but loopback: no name resolves, and anything that is not loopback
                // (which Chromium always sends direct) goes to a proxy that is not there.
                "--host-resolver-rules=MAP * ~NOTFOUND, EXCLUDE 127.0.0.1",
                "--proxy-server=http://127.0.0.1:9",
            ],
        });
        if Path::new("/usr/bin/chromium").is_file() {
            options["binary"] = json!("/usr/bin/chromium");
        }
        let capabilities = json!({
            "capabilities": { "alwaysMatch": { "goog:chromeOptions": options } }
        });
        let created =
            webdriver(self.port, "POST", "/session", Some(&capabilities)).unwrap_or_else(|e| {
                panic!(
                    "cannot start Chromium: {e}; see {}",
                    self.log_path().display()
                )
            });
        let id = created["sessionId"]
            .as_str()
            .unwrap_or_else(|| panic!("no sessionId in {created}"))
            .to_owned();
        Session {
            port: self.port,
            id,
            open: true,
        }
    }
}

impl Drop for Driver {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        if std::thread::panicking() {
            eprintln!(
                "chromedriver's log is kept in {}",
                self.log_path().display()
            );
        } else {
            let _ = std::fs::remove_dir_all(&self.dir);
        }
    }
}

/// One browser session; deleting it (also on drop) closes Chromium.
pub(crate) struct Session {
    port: u16,
    id: String,
    open: bool,
}

impl Session {
    fn call(&self, method: &str, path: &str, body: Option<&Value>) -> Value {
        let path = format!("/session/{}{path}", self.id);
        webdriver(self.port, method, &path, body).unwrap_or_else(|e| panic!("{e}"))
    }

    pub(crate) fn navigate(&self, url: &str) {
        self.call("POST", "/url", Some(&json!({ "url": url })));
    }

    /// Runs `script` (a function body) in the page and returns what it returns.
    pub(crate) fn execute(&self, script: &str) -> Value {
        self.call(
            "POST",
            "/execute/sync",
            Some(&json!({ "script": script, "args": [] })),
        )
    }

    pub(crate) fn screenshot(&self) -> Vec<u8> {
        let encoded = self.call("GET", "/screenshot", None);
        base64_decode(encoded.as_str().expect("a screenshot is a base64 string"))
    }

    pub(crate) fn delete(mut self) {
        self.open = false;
        let path = format!("/session/{}", self.id);
        webdriver(self.port, "DELETE", &path, None).unwrap_or_else(|e| panic!("{e}"));
    }
}

impl Drop for Session {
    fn drop(&mut self) {
        if self.open {
            let _ = webdriver(self.port, "DELETE", &format!("/session/{}", self.id), None);
        }
    }
}

/// One WebDriver command: an HTTP/1.1 request with a JSON body to ChromeDriver on loopback.
/// Returns the answer's `value`, or the WebDriver error as a sentence.
fn webdriver(port: u16, method: &str, path: &str, body: Option<&Value>) -> Result<Value, String> {
    let what = format!("{method} {path}");
    let fail = |e: std::io::Error| format!("{what}: {e}");
    let mut stream = TcpStream::connect(SocketAddr::from(([127, 0, 0, 1], port))).map_err(fail)?;
    stream
        .set_read_timeout(Some(Duration::from_secs(90)))
        .map_err(fail)?;
    let body = body.map(Value::to_string).unwrap_or_default();
    let request = format!(
        "{method} {path} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n\
         Content-Type: application/json; charset=utf-8\r\nContent-Length: {}\r\n\
         Connection: close\r\n\r\n{body}",
        body.len()
    );
    stream.write_all(request.as_bytes()).map_err(fail)?;

    let mut raw = Vec::new();
    let mut chunk = [0u8; 64 * 1024];
    let head_end = loop {
        if let Some(at) = raw.windows(4).position(|w| w == b"\r\n\r\n") {
            break at + 4;
        }
        match stream.read(&mut chunk).map_err(fail)? {
            0 => {
                return Err(format!(
                    "{what}: the connection closed before the headers ended"
                ))
            }
            n => raw.extend_from_slice(&chunk[..n]),
        }
    };
    let head = String::from_utf8_lossy(&raw[..head_end]).into_owned();
    let status: u16 = head
        .split(' ')
        .nth(1)
        .and_then(|code| code.parse().ok())
        .ok_or_else(|| format!("{what}: no status line in {head:?}"))?;
    let header = |name: &str| {
        head.lines().find_map(|line| {
            let (key, value) = line.split_once(':')?;
            key.trim()
                .eq_ignore_ascii_case(name)
                .then(|| value.trim().to_owned())
        })
    };
    if header("transfer-encoding").is_some() {
        return Err(format!(
            "{what}: chunked answers are not supported: {head:?}"
        ));
    }
    match header("content-length").and_then(|n| n.parse::<usize>().ok()) {
        Some(length) => {
            while raw.len() < head_end + length {
                match stream.read(&mut chunk).map_err(fail)? {
                    0 => return Err(format!("{what}: the answer ended early")),
                    n => raw.extend_from_slice(&chunk[..n]),
                }
            }
            raw.truncate(head_end + length);
        }
        None => {
            stream.read_to_end(&mut raw).map_err(fail)?;
        }
    }
    let answer: Value = serde_json::from_slice(&raw[head_end..])
        .map_err(|e| format!("{what}: HTTP {status} with a body that is not JSON: {e}"))?;
    let value = answer.get("value").cloned().unwrap_or(Value::Null);
    if (200..300).contains(&status) {
        Ok(value)
    } else {
        Err(format!(
            "{what}: HTTP {status}: {}: {}",
            value["error"].as_str().unwrap_or("?"),
            value["message"].as_str().unwrap_or("?")
        ))
    }
}

fn base64_decode(text: &str) -> Vec<u8> {
    let sextet = |c: u8| match c {
        b'A'..=b'Z' => Some(c - b'A'),
        b'a'..=b'z' => Some(c - b'a' + 26),
        b'0'..=b'9' => Some(c - b'0' + 52),
        b'+' => Some(62),
        b'/' => Some(63),
        _ => None,
    };
    let mut out = Vec::with_capacity(text.len() * 3 / 4);
    let (mut bits, mut count) = (0u32, 0);
    for value in text.bytes().filter_map(sextet) {
        bits = (bits << 6) | u32::from(value);
        count += 6;
        if count >= 8 {
            count -= 8;
            out.push((bits >> count) as u8);
        }
    }
    out
}
