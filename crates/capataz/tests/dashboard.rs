//! The admin dashboard in a real browser: headless Chromium, driven through ChromeDriver's W3C
//! WebDriver HTTP API, loads `GET /` from a running balancer and must follow a backend from UP
//! to DOWN as its probes fail, with the sentence that says why and the event in its log; show
//! the pool's and backends' charts with samples in them (latencies under a millisecond written
//! as such), the DOWN period on the backend's timeline with the sentence on hover; and, loaded
//! again, the event from the balancer's history.
//!
//! Without ChromeDriver the test says so loudly and passes, so `cargo test` works on a machine
//! without a browser; with `CI` set it fails instead (`.ci/run` installs Debian's `chromium` and
//! `chromium-driver`). Chromium runs with its background networking off, every host name
//! resolving to nothing and a dead proxy for anything not on loopback: it only reaches the
//! balancer's admin listener.
//!
//! Screenshots are taken of the page with the DOWN backend and of the page loaded again; set
//! `CAPATAZ_DASHBOARD_PNG=/some/file.png` to keep them (the second as `file-reloaded.png`).

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use capataz::config;
use capataz::server::Balancer;
use capataz::sim::{Mode, SimBackend};
use serde_json::{json, Value};

mod support;

use support::any;
use support::balancer::{ConfigText, FAST_CHECKS};

/// How long the page gets to show what the balancer knows (it needs well under a second).
const DEADLINE: Duration = Duration::from_secs(30);

/// A backend name that would run script if the page inserted names as HTML.
const HOSTILE_NAME: &str = "<img src=x onerror=window.__pwned=1>&amp;";

/// Where ChromeDriver is: `$CHROMEDRIVER`, `/usr/bin/chromedriver`, or `chromedriver` on `PATH`.
fn find_chromedriver() -> Option<PathBuf> {
    if let Some(path) = std::env::var_os("CHROMEDRIVER") {
        return Some(PathBuf::from(path));
    }
    let paths = std::env::var_os("PATH").unwrap_or_default();
    std::iter::once(PathBuf::from("/usr/bin"))
        .chain(std::env::split_paths(&paths))
        .map(|dir| dir.join("chromedriver"))
        .find(|path| path.is_file())
}

/// A ChromeDriver process on a free loopback port, killed (by its PID) when dropped, with a
/// scratch directory for Chromium's profile and ChromeDriver's log.
struct Driver {
    child: Child,
    port: u16,
    dir: PathBuf,
}

impl Driver {
    fn start(binary: &Path) -> Driver {
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
    fn session(&self) -> Session {
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
struct Session {
    port: u16,
    id: String,
    open: bool,
}

impl Session {
    fn call(&self, method: &str, path: &str, body: Option<&Value>) -> Value {
        let path = format!("/session/{}{path}", self.id);
        webdriver(self.port, method, &path, body).unwrap_or_else(|e| panic!("{e}"))
    }

    fn navigate(&self, url: &str) {
        self.call("POST", "/url", Some(&json!({ "url": url })));
    }

    /// Runs `script` (a function body) in the page and returns what it returns.
    fn execute(&self, script: &str) -> Value {
        self.call(
            "POST",
            "/execute/sync",
            Some(&json!({ "script": script, "args": [] })),
        )
    }

    fn screenshot(&self) -> Vec<u8> {
        let encoded = self.call("GET", "/screenshot", None);
        base64_decode(encoded.as_str().expect("a screenshot is a base64 string"))
    }

    fn delete(mut self) {
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

/// What the page shows, read from its DOM through the test hooks.
const READ_PAGE: &str = r##"
const text = (el, selector) => {
  const found = el.querySelector(selector);
  return found ? found.textContent.trim() : null;
};
return {
  backends: Array.from(document.querySelectorAll("[data-pool][data-backend]")).map((el) => ({
    pool: el.dataset.pool,
    backend: el.dataset.backend,
    name: text(el, ".name"),
    state: text(el, ".state"),
    explain: text(el, ".explain"),
    probe_fails: el.querySelectorAll(".strip i.r-fail").length,
    strip_cells: el.querySelectorAll(".strip i").length,
    down_segments: Array.from(el.querySelectorAll(".timeline rect.s-down")).map((r) => {
      const title = r.querySelector("title");
      return title ? title.textContent : "";
    }),
    up_segments: el.querySelectorAll(".timeline rect.s-up").length,
    charts_with_data: Array.from(el.querySelectorAll("svg.chart"))
      .filter((c) => Number(c.dataset.points) > 0).map((c) => c.getAttribute("class")),
    chart_values: Array.from(el.querySelectorAll(".chart-value")).map((v) => v.textContent),
  })),
  pool_charts: Array.from(document.querySelectorAll("section.pool")).map((el) => ({
    pool: el.dataset.pool,
    with_data: Array.from(el.querySelectorAll(".pool-charts svg.chart"))
      .filter((c) => Number(c.dataset.points) > 0).map((c) => c.getAttribute("class")),
    values: Array.from(el.querySelectorAll(".pool-charts .chart-value")).map((v) => v.textContent),
  })),
  legend: text(document, "#legend"),
  log: Array.from(document.querySelectorAll("#log li")).map((li) => li.textContent),
  images: document.querySelectorAll("#pools img").length,
  pwned: window.__pwned !== undefined,
};
"##;

/// Reads the page until `done` holds for it, failing with the last reading after the deadline.
fn wait_for_page(session: &Session, what: &str, done: impl Fn(&Value) -> bool) -> Value {
    let end = Instant::now() + DEADLINE;
    loop {
        let page = session.execute(READ_PAGE);
        if done(&page) {
            return page;
        }
        assert!(
            Instant::now() < end,
            "the dashboard did not show {what} within {DEADLINE:?}; it shows:\n{page:#}"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

fn backend<'v>(page: &'v Value, name: &str) -> Option<&'v Value> {
    page["backends"]
        .as_array()?
        .iter()
        .find(|b| b["pool"] == "web" && b["backend"] == name)
}

fn shows(page: &Value, name: &str, state: &str) -> bool {
    backend(page, name).is_some_and(|b| b["state"] == state)
}

/// One request through the balancer's listener, to give the traffic strips something to show.
fn get(addr: SocketAddr) {
    let mut stream = TcpStream::connect(addr).expect("connect to the listener");
    stream
        .set_read_timeout(Some(DEADLINE))
        .expect("set a read timeout");
    stream
        .write_all(b"GET / HTTP/1.1\r\nHost: app.test\r\nConnection: close\r\n\r\n")
        .expect("send a request");
    let mut answer = Vec::new();
    stream.read_to_end(&mut answer).expect("read the answer");
    assert!(
        answer.starts_with(b"HTTP/1.1 200"),
        "{}",
        String::from_utf8_lossy(&answer)
    );
}

#[test]
fn dashboard_follows_a_backend_going_down() {
    let Some(chromedriver) = find_chromedriver() else {
        if std::env::var_os("CI").is_some() {
            panic!(
                "chromedriver is not installed, and CI must run the browser test: install \
                 Debian's `chromium` and `chromium-driver` (.ci/run does) or set CHROMEDRIVER"
            );
        }
        // Straight to the process's stderr: libtest hides what `eprintln!` prints in a test
        // that passes, and a skip must not pass unnoticed.
        let _ = std::io::stderr().write_all(
            b"\n*** SKIPPED dashboard_follows_a_backend_going_down: no chromedriver found \
              ($CHROMEDRIVER, /usr/bin, PATH).\n*** Install Debian's chromium and \
              chromium-driver to run the browser test.\n\n",
        );
        return;
    };

    // The balancer runs on its own threads; this thread drives the browser with blocking IO.
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("a tokio runtime");
    let (a, b, hostile) = runtime.block_on(async {
        (
            SimBackend::start("a", any())
                .await
                .expect("start backend a"),
            SimBackend::start("b", any())
                .await
                .expect("start backend b"),
            SimBackend::start("h", any())
                .await
                .expect("start backend h"),
        )
    });
    let text = ConfigText::new(&[
        ("a".to_owned(), a.addr()),
        ("b".to_owned(), b.addr()),
        (HOSTILE_NAME.to_owned(), hostile.addr()),
    ])
    .weights(&[1, 2, 1])
    .admin("")
    .extra(FAST_CHECKS)
    .build();
    let config = config::parse_str(&text, "<dashboard test>").expect("valid test config");
    let (events, _events_rx) = tokio::sync::broadcast::channel(4096);
    let balancer = runtime
        .block_on(Balancer::start(&config, events))
        .expect("balancer starts");
    let admin = balancer.admin_addr().expect("the admin API runs");
    let listener = balancer.local_addrs()[0];

    let driver = Driver::start(&chromedriver);
    let session = driver.session();
    session.navigate(&format!("http://{admin}/"));

    wait_for_page(&session, "backend b UP", |page| shows(page, "b", "UP"));
    for _ in 0..12 {
        get(listener);
    }

    b.set_health(Mode::Status(503));
    let page = wait_for_page(
        &session,
        "backend b DOWN after 3 failed probes, and the event in the log",
        |page| {
            backend(page, "b").is_some_and(|b| {
                b["state"] == "DOWN"
                    && b["explain"]
                        .as_str()
                        .is_some_and(|s| s.contains("3 consecutive failed probes"))
            }) && page["log"].as_array().is_some_and(|log| {
                log.iter()
                    .filter_map(Value::as_str)
                    .any(|line| line.contains("backend=b") && line.contains("DOWN"))
            })
        },
    );
    let b_row = backend(&page, "b").expect("b is on the page");
    assert!(
        b_row["probe_fails"].as_u64() >= Some(3),
        "b's probe strip shows its failed probes: {b_row:#}"
    );
    assert!(shows(&page, "a", "UP"), "a stays UP: {page:#}");

    // Names come from the config and are shown as text, never as markup.
    let hostile_row = backend(&page, HOSTILE_NAME).expect("the hostile name is a data attribute");
    assert_eq!(hostile_row["name"], HOSTILE_NAME, "{hostile_row:#}");
    assert_eq!(page["images"], 0, "a backend name became markup: {page:#}");
    assert_eq!(page["pwned"], false, "a backend name ran script: {page:#}");

    screenshot(&session, "");

    // The pool's charts fill with samples (one every 5 s) of the requests sent above, with
    // loopback latencies under a millisecond written as such.
    for _ in 0..6 {
        get(listener);
    }
    let page = wait_for_page(&session, "the pool's charts with samples", |page| {
        page["pool_charts"].as_array().is_some_and(|pools| {
            pools.iter().any(|p| {
                p["pool"] == "web"
                    && p["with_data"]
                        .as_array()
                        .is_some_and(|c| c.len() == 3 && c.iter().any(|c| c == "chart c-latency"))
            })
        }) && backend(page, "a").is_some_and(|a| {
            a["charts_with_data"]
                .as_array()
                .is_some_and(|c| c.iter().any(|c| c == "chart c-rate"))
        })
    });
    let web = page["pool_charts"]
        .as_array()
        .and_then(|p| p.iter().find(|p| p["pool"] == "web"))
        .expect("the web pool is on the page");
    let latency = web["values"][2].as_str().unwrap_or_default();
    assert!(
        latency.starts_with("p50 ") && !latency.contains("p50 0 ms") && latency.contains(" · p99 "),
        "the pool's latency is written, sub-millisecond ones as such: {web:#}"
    );
    assert!(
        page["legend"]
            .as_str()
            .is_some_and(|l| l.contains("UTC") && l.contains("p99")),
        "the legend says what the colours and lines mean: {page:#}"
    );

    // b's timeline shows its DOWN period, with the sentence of why on hover.
    let page = wait_for_page(&session, "b's DOWN period on its timeline", |page| {
        backend(page, "b").is_some_and(|b| {
            b["down_segments"].as_array().is_some_and(|segments| {
                segments.iter().any(|title| {
                    title.as_str().is_some_and(|t| {
                        t.contains("UTC DOWN") && t.contains("3 consecutive failed probes")
                    })
                })
            }) && b["up_segments"].as_u64() >= Some(1)
        })
    });
    let a_row = backend(&page, "a").expect("a is on the page");
    assert_eq!(
        a_row["down_segments"].as_array().map(Vec::len),
        Some(0),
        "a was never DOWN: {a_row:#}"
    );

    // Loaded again, the page shows the event from the balancer's history at once, though no
    // new event comes (b stays DOWN).
    session.navigate(&format!("http://{admin}/"));
    let page = wait_for_page(&session, "b's DOWN event from the history", |page| {
        page["log"].as_array().is_some_and(|log| {
            log.iter()
                .filter_map(Value::as_str)
                .any(|line| line.contains("backend=b") && line.contains("UP → DOWN"))
        })
    });
    assert!(
        page["log"].as_array().is_some_and(|log| log
            .iter()
            .all(|line| line.as_str().is_some_and(|l| l.contains(" UTC")))),
        "every logged time says UTC: {page:#}"
    );
    wait_for_page(&session, "b's timeline after the reload", |page| {
        backend(page, "b")
            .is_some_and(|b| b["down_segments"].as_array().is_some_and(|s| !s.is_empty()))
    });
    screenshot(&session, "-reloaded");

    session.delete();
    drop(driver);
    drop(balancer);
}

/// Takes a screenshot, checks it is a PNG, and keeps it when `CAPATAZ_DASHBOARD_PNG` names a
/// file (`suffix` added before its extension).
fn screenshot(session: &Session, suffix: &str) {
    let png = session.screenshot();
    assert!(png.starts_with(b"\x89PNG"), "the screenshot is a PNG");
    if let Some(path) = std::env::var_os("CAPATAZ_DASHBOARD_PNG") {
        let path = PathBuf::from(path);
        let path = match suffix {
            "" => path,
            suffix => path.with_file_name(format!(
                "{}{suffix}.png",
                path.file_stem()
                    .map_or_else(Default::default, |s| s.to_string_lossy())
            )),
        };
        std::fs::write(&path, png).expect("write the screenshot");
        eprintln!("screenshot of the dashboard: {}", path.display());
    }
}
