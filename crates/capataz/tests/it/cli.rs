//! End-to-end tests of the `capataz` binary: `check`, `run` and `demo`, on loopback only.
//!
//! Every child process is held by a [`Running`] guard that kills it by PID when the test ends,
//! even on failure. Its output is read by one thread per stream and handed over line by line,
//! and a test waits for the line (or the exit, or the open port) it needs with a generous
//! deadline: nothing here sleeps to synchronise. The backends behind `capataz run` are
//! [`SimBackend`]s served by a tokio runtime each test owns.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::mpsc;
use std::thread;
use std::time::{Duration, Instant};

use capataz::sim::{Mode, SimBackend};

/// How long a test waits for anything before it gives up.
const DEADLINE: Duration = Duration::from_secs(20);

/// How often a condition that offers no notification (an open port, an exit) is checked.
const POLL: Duration = Duration::from_millis(20);

fn capataz() -> Command {
    Command::new(env!("CARGO_BIN_EXE_capataz"))
}

/// A file in the temporary directory, with a name unique to this process and call, removed on
/// drop.
struct TempFile {
    path: PathBuf,
}

impl TempFile {
    fn new(tag: &str, contents: &str) -> TempFile {
        static NEXT: AtomicUsize = AtomicUsize::new(0);
        let n = NEXT.fetch_add(1, Ordering::Relaxed);
        let name = format!("capataz-cli-{}-{n}-{tag}.toml", std::process::id());
        let path = std::env::temp_dir().join(name);
        std::fs::write(&path, contents)
            .unwrap_or_else(|e| panic!("cannot write {}: {e}", path.display()));
        TempFile { path }
    }

    fn path(&self) -> &Path {
        &self.path
    }

    fn display(&self) -> String {
        self.path.display().to_string()
    }
}

impl Drop for TempFile {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.path);
    }
}

/// The lines of one output stream of a child, read by a thread and kept once seen.
struct Lines {
    name: &'static str,
    rx: mpsc::Receiver<String>,
    seen: Vec<String>,
    ended: bool,
}

impl Lines {
    fn spawn(name: &'static str, stream: impl Read + Send + 'static) -> Lines {
        let (tx, rx) = mpsc::channel();
        thread::spawn(move || {
            for line in BufReader::new(stream).lines() {
                let Ok(line) = line else { break };
                if tx.send(line).is_err() {
                    break;
                }
            }
        });
        Lines {
            name,
            rx,
            seen: Vec::new(),
            ended: false,
        }
    }

    /// Waits for a line matching `want` (possibly one already seen) and returns it.
    fn wait_for(&mut self, what: &str, want: impl Fn(&str) -> bool) -> String {
        if let Some(line) = self.seen.iter().find(|line| want(line)) {
            return line.clone();
        }
        let end = Instant::now() + DEADLINE;
        loop {
            let left = end.saturating_duration_since(Instant::now());
            match self.rx.recv_timeout(left) {
                Ok(line) => {
                    self.seen.push(line);
                    let line = self.seen.last().expect("just pushed");
                    if want(line) {
                        return line.clone();
                    }
                }
                Err(mpsc::RecvTimeoutError::Timeout) => {
                    panic!(
                        "no {what} on {} within {DEADLINE:?}:\n{}",
                        self.name,
                        self.text()
                    )
                }
                Err(mpsc::RecvTimeoutError::Disconnected) => {
                    self.ended = true;
                    panic!("{} ended without {what}:\n{}", self.name, self.text())
                }
            }
        }
    }

    /// Reads until the stream ends (the child has exited) and returns everything seen.
    fn read_to_end(&mut self) -> String {
        let end = Instant::now() + DEADLINE;
        while !self.ended {
            let left = end.saturating_duration_since(Instant::now());
            match self.rx.recv_timeout(left) {
                Ok(line) => self.seen.push(line),
                Err(mpsc::RecvTimeoutError::Disconnected) => self.ended = true,
                Err(mpsc::RecvTimeoutError::Timeout) => {
                    panic!(
                        "{} still open after {DEADLINE:?}:\n{}",
                        self.name,
                        self.text()
                    )
                }
            }
        }
        self.text()
    }

    fn text(&self) -> String {
        let mut text = self.seen.join("\n");
        text.push('\n');
        text
    }
}

/// A running `capataz`, killed by PID when dropped.
struct Running {
    child: Child,
    stdout: Lines,
    stderr: Lines,
}

impl Running {
    fn spawn<S: AsRef<std::ffi::OsStr>>(args: &[S]) -> Running {
        let mut child = capataz()
            .args(args)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("the capataz binary runs");
        let stdout = Lines::spawn("stdout", child.stdout.take().expect("piped stdout"));
        let stderr = Lines::spawn("stderr", child.stderr.take().expect("piped stderr"));
        Running {
            child,
            stdout,
            stderr,
        }
    }

    /// Whether it has exited, without waiting.
    fn exited(&mut self) -> Option<ExitStatus> {
        self.child.try_wait().expect("try_wait on the child")
    }

    /// Waits for it to exit by itself, and for both streams to end.
    fn finish(&mut self) -> (ExitStatus, String, String) {
        let end = Instant::now() + DEADLINE;
        let status = loop {
            if let Some(status) = self.exited() {
                break status;
            }
            assert!(
                Instant::now() < end,
                "capataz still running after {DEADLINE:?}; stderr so far:\n{}",
                self.stderr.text()
            );
            thread::sleep(POLL);
        };
        (status, self.stdout.read_to_end(), self.stderr.read_to_end())
    }

    /// Sends SIGTERM.
    fn terminate(&self) {
        let status = Command::new("kill")
            .arg("-TERM")
            .arg(self.child.id().to_string())
            .status()
            .expect("kill(1) runs");
        assert!(status.success(), "kill -TERM failed: {status}");
    }

    /// Waits until `addr` answers an HTTP request, failing early if the child exits.
    /// The address its listener bound (from its `listening` log line, text or JSON), for a
    /// config that asks for port 0.
    fn listening_on(&mut self) -> SocketAddr {
        const HOST: &str = "127.0.0.1:";
        let line = self.stderr.wait_for("the listening line", |l| {
            l.contains("listening") && l.contains("front") && l.contains(HOST)
        });
        let port: String = line[line.find(HOST).expect("matched above") + HOST.len()..]
            .chars()
            .take_while(char::is_ascii_digit)
            .collect();
        let addr: SocketAddr = format!("{HOST}{port}")
            .parse()
            .unwrap_or_else(|_| panic!("no address in {line}"));
        assert_ne!(addr.port(), 0, "{line}");
        addr
    }

    fn wait_until_serving(&mut self, addr: SocketAddr) {
        let end = Instant::now() + DEADLINE;
        loop {
            if get(addr).is_ok() {
                return;
            }
            if let Some(status) = self.exited() {
                panic!(
                    "capataz exited ({status}) before serving on {addr}:\n{}",
                    self.stderr.read_to_end()
                );
            }
            assert!(
                Instant::now() < end,
                "nothing answered on {addr} within {DEADLINE:?}; stderr:\n{}",
                self.stderr.text()
            );
            thread::sleep(POLL);
        }
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        // Harmless when it has already exited and been reaped.
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// One answer: the status and the `X-Backend` header, if any.
#[derive(Debug)]
struct Answer {
    status: u16,
    backend: Option<String>,
}

/// `GET /` over a fresh connection, closed after the answer.
fn get(addr: SocketAddr) -> std::io::Result<Answer> {
    let mut stream = TcpStream::connect_timeout(&addr, Duration::from_secs(2))?;
    stream.set_read_timeout(Some(Duration::from_secs(10)))?;
    stream.set_write_timeout(Some(Duration::from_secs(10)))?;
    stream.write_all(b"GET / HTTP/1.1\r\nHost: cli.test\r\nConnection: close\r\n\r\n")?;
    let mut raw = Vec::new();
    stream.read_to_end(&mut raw)?;
    let text = String::from_utf8_lossy(&raw);
    let malformed = || std::io::Error::new(std::io::ErrorKind::InvalidData, text.to_string());
    let head = text.split("\r\n\r\n").next().ok_or_else(malformed)?;
    let mut lines = head.split("\r\n");
    let status = lines
        .next()
        .and_then(|line| line.strip_prefix("HTTP/1.1 "))
        .and_then(|rest| rest.get(..3))
        .and_then(|code| code.parse().ok())
        .ok_or_else(malformed)?;
    let backend = lines.find_map(|line| {
        let (name, value) = line.split_once(':')?;
        name.eq_ignore_ascii_case("x-backend")
            .then(|| value.trim().to_owned())
    });
    Ok(Answer { status, backend })
}

/// Runs `capataz check` on a config with `text` and returns (exit code, stdout, stderr, file).
fn check(text: &str) -> (i32, String, String, TempFile) {
    let file = TempFile::new("check", text);
    let mut running = Running::spawn(&["check".as_ref(), file.path().as_os_str()]);
    let (status, stdout, stderr) = running.finish();
    let code = status.code().expect("check exits, not killed by a signal");
    (code, stdout, stderr, file)
}

/// A config without foot-guns; `active` is appended to `[pools.web.active]`.
fn plain_config(active: &str) -> String {
    format!(
        r#"
[[listeners]]
address = "127.0.0.1:0"

[pools.web]
backends = [
    {{ name = "one", address = "127.0.0.1:9" }},
    {{ name = "two", address = "127.0.0.1:10" }},
]

[pools.web.active]
path = "/healthz"
{active}
"#
    )
}

/// The 1-based number of the first line of `text` containing `needle`.
fn line_of(text: &str, needle: &str) -> usize {
    text.lines()
        .position(|line| line.contains(needle))
        .expect("the needle is in the text")
        + 1
}

#[test]
fn check_passes_a_valid_config_without_warnings() {
    let (code, stdout, stderr, file) = check(&plain_config(""));
    assert_eq!(code, 0, "stdout:\n{stdout}stderr:\n{stderr}");
    let expected = format!(
        "{}: valid (1 listeners, 1 pools, 2 backends, 0 warnings)",
        file.display()
    );
    assert!(stdout.lines().any(|l| l == expected), "{stdout}");
    assert!(!stdout.contains("warning:"), "{stdout}");
}

#[test]
fn check_warns_about_rise_1_and_exits_0() {
    // A valid file with warnings exits 0 (`--strict`: 1, see cli_forms.rs).
    let (code, stdout, stderr, _file) = check(&plain_config("rise = 1"));
    assert_eq!(code, 0, "stdout:\n{stdout}stderr:\n{stderr}");
    let warning = stdout
        .lines()
        .find(|l| l.starts_with("warning: "))
        .unwrap_or_else(|| panic!("no warning line:\n{stdout}"));
    assert!(
        warning.contains("pools.web.active.rise") && warning.contains("rise = 1"),
        "{warning}"
    );
    assert_eq!(stdout.matches("warning: ").count(), 1, "{stdout}");
    assert!(stdout.contains(": valid ("), "{stdout}");
    assert!(stdout.contains("1 warnings)"), "{stdout}");
}

#[test]
fn check_rejects_a_bad_duration_naming_file_line_and_key() {
    let text = plain_config("interval = \"2x\"");
    let (code, stdout, stderr, file) = check(&text);
    assert_eq!(code, 2, "stdout:\n{stdout}stderr:\n{stderr}");
    let line = line_of(&text, "interval = \"2x\"");
    let expected = format!("{}:{line}: pools.web.active.interval: ", file.display());
    assert!(
        stderr.contains(&expected),
        "want {expected:?} in:\n{stderr}"
    );
    assert!(stderr.contains("not a duration"), "{stderr}");
    assert!(!stdout.contains("valid"), "{stdout}");
}

#[test]
fn check_of_a_missing_file_exits_2_and_names_it() {
    let path = std::env::temp_dir().join(format!(
        "capataz-cli-{}-does-not-exist.toml",
        std::process::id()
    ));
    let mut running = Running::spawn(&["check".as_ref(), path.as_os_str()]);
    let (status, stdout, stderr) = running.finish();
    assert_eq!(status.code(), Some(2), "stdout:\n{stdout}stderr:\n{stderr}");
    assert!(stderr.contains(&path.display().to_string()), "{stderr}");
    assert!(stderr.contains("cannot read"), "{stderr}");
}

#[test]
fn run_with_an_invalid_config_exits_2_and_binds_nothing() {
    // Held for the test (see `support::ReservedPort`): a port released before the run is soon
    // another test's listener, and the last check would fail on it.
    let reserved = crate::support::reserve_port();
    let port = reserved.port;
    let text = format!(
        r#"
[[listeners]]
address = "127.0.0.1:{port}"

[pools.web]
backends = [{{ name = "one", address = "127.0.0.1:9" }}]

[pools.web.active]
timeout = "soon"
"#
    );
    let file = TempFile::new("run-invalid", &text);
    let mut running =
        Running::spawn(&["run".as_ref(), "--config".as_ref(), file.path().as_os_str()]);
    let (status, stdout, stderr) = running.finish();
    assert_eq!(status.code(), Some(2), "stdout:\n{stdout}stderr:\n{stderr}");
    let line = line_of(&text, "timeout = \"soon\"");
    let expected = format!(
        "capataz: invalid configuration: {}:{line}: pools.web.active.timeout: ",
        file.display()
    );
    assert!(
        stderr.contains(&expected),
        "want {expected:?} in:\n{stderr}"
    );
    assert!(!stderr.contains("listening"), "{stderr}");
    // It never bound its listener: the port is still free (held, nobody else took it; a
    // listener with SO_REUSEADDR, as std's, binds and listens beside the reservation).
    TcpListener::bind(("127.0.0.1", port)).expect("the listener's port is still free");
    drop(reserved);
}

/// `capataz run` in front of two backends, `alpha` and `beta`, probed every 50 ms.
struct RunFixture {
    // Fields drop in order: the child first, the runtime that serves the backends last.
    capataz: Running,
    addr: SocketAddr,
    _config: TempFile,
    backends: Vec<SimBackend>,
    _runtime: tokio::runtime::Runtime,
}

impl RunFixture {
    fn start(extra_args: &[&str]) -> RunFixture {
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .expect("a tokio runtime");
        let any: SocketAddr = ([127, 0, 0, 1], 0).into();
        let backends = runtime.block_on(async {
            vec![
                SimBackend::start("alpha", any).await.expect("start alpha"),
                SimBackend::start("beta", any).await.expect("start beta"),
            ]
        });
        let text = format!(
            r#"
[[listeners]]
name = "front"
address = "127.0.0.1:0"

[pools.web]
backends = [
    {{ name = "alpha", address = "{}" }},
    {{ name = "beta", address = "{}" }},
]

[pools.web.active]
interval = "50ms"
timeout = "200ms"
rise = 2
fall = 3
"#,
            backends[0].addr(),
            backends[1].addr()
        );
        let config = TempFile::new("run", &text);
        let mut args = vec![
            "run",
            "--config",
            config.path().to_str().expect("UTF-8 path"),
        ];
        args.extend_from_slice(extra_args);
        let mut capataz = Running::spawn(&args);
        let addr = capataz.listening_on();
        capataz.wait_until_serving(addr);
        RunFixture {
            capataz,
            addr,
            _config: config,
            backends,
            _runtime: runtime,
        }
    }

    /// Sends GETs until both backends have answered 200.
    fn see_both_backends(&self) {
        let mut seen = [false, false];
        for _ in 0..20 {
            let answer = get(self.addr).expect("the balancer answers");
            assert_eq!(answer.status, 200, "{answer:?}");
            match answer.backend.as_deref() {
                Some("alpha") => seen[0] = true,
                Some("beta") => seen[1] = true,
                other => panic!("answer from an unknown backend {other:?}"),
            }
            if seen == [true, true] {
                return;
            }
        }
        panic!("20 requests did not reach both backends: {seen:?}");
    }

    /// Sends SIGTERM and asserts a clean exit.
    fn stop(&mut self) {
        self.capataz.terminate();
        let (status, _, stderr) = self.capataz.finish();
        assert!(status.success(), "exit after SIGTERM: {status}\n{stderr}");
    }
}

#[test]
fn run_balances_takes_a_failing_backend_down_and_stops_on_sigterm() {
    let mut fixture = RunFixture::start(&[]);
    fixture.see_both_backends();

    fixture.backends[1].set_health(Mode::Status(503));
    let line = fixture.capataz.stderr.wait_for("beta going DOWN", |line| {
        line.contains("backend=beta UP -> DOWN: 3 consecutive failed probes, last: HTTP 503")
    });
    assert!(line.contains("pool=web"), "{line}");
    // The eligible set is swapped before the line is logged, so beta gets nothing from now on.
    for _ in 0..6 {
        let answer = get(fixture.addr).expect("the balancer answers");
        assert_eq!(
            (answer.status, answer.backend.as_deref()),
            (200, Some("alpha"))
        );
    }

    fixture.stop();
    assert!(
        fixture.capataz.stderr.text().contains("stopping"),
        "{}",
        fixture.capataz.stderr.text()
    );
}

#[test]
fn run_with_json_logs_writes_transitions_as_json_objects() {
    let mut fixture = RunFixture::start(&["--log-format", "json"]);
    fixture.see_both_backends();

    fixture.backends[1].set_health(Mode::Status(503));
    let is_beta_down = |line: &str| {
        serde_json::from_str::<serde_json::Value>(line).is_ok_and(|v| {
            v["event"] == "transition" && v["backend"] == "beta" && v["to"] == "DOWN"
        })
    };
    let line = fixture
        .capataz
        .stderr
        .wait_for("a JSON transition of beta to DOWN", is_beta_down);
    let event: serde_json::Value = serde_json::from_str(&line).expect("checked above");
    assert_eq!(event["pool"], "web", "{line}");
    assert_eq!(event["from"], "UP", "{line}");
    assert_eq!(event["side"], "active", "{line}");
    assert_eq!(
        event["reason"], "3 consecutive failed probes, last: HTTP 503",
        "{line}"
    );
    assert_eq!(event["level"], "WARN", "{line}");
    assert!(line.contains(r#""event":"transition""#), "{line}");

    fixture.stop();
    // Every line is JSON, the startup and shutdown lines included.
    let stderr = fixture.capataz.stderr.text();
    for line in stderr.lines().filter(|l| !l.is_empty()) {
        assert!(
            serde_json::from_str::<serde_json::Value>(line).is_ok_and(|v| v.is_object()),
            "not a JSON object: {line}"
        );
    }
}

#[test]
fn demo_runs_for_its_duration_and_passive_checks_eject_the_liar() {
    // Both listeners on ephemeral ports, read back from the banner: the defaults (8080, 9901)
    // would collide with a `capataz demo` running on the same machine.
    let mut demo = Running::spawn(&[
        "demo",
        "--listen",
        "127.0.0.1:0",
        "--admin",
        "127.0.0.1:0",
        "--duration",
        "8",
    ]);
    let banner = demo.stdout.wait_for("the banner", |l| {
        l.starts_with("capataz demo: balancer on http://")
    });
    let addr: SocketAddr = banner["capataz demo: balancer on http://".len()..]
        .split('/')
        .next()
        .and_then(|a| a.parse().ok())
        .unwrap_or_else(|| panic!("no address in the banner: {banner}"));
    assert_ne!(addr.port(), 0, "{banner}");
    demo.wait_until_serving(addr);
    // The liar answers 500 until it is ejected (and retries usually hide that): ask until a
    // healthy backend answers.
    let end = Instant::now() + DEADLINE;
    loop {
        let answer = get(addr).expect("the demo balancer answers");
        if answer.status == 200 {
            assert_ne!(answer.backend.as_deref(), Some("liar"), "{answer:?}");
            assert!(answer.backend.is_some(), "{answer:?}");
            break;
        }
        assert!(Instant::now() < end, "no 200 within {DEADLINE:?}");
    }

    let (status, stdout, stderr) = demo.finish();
    assert!(status.success(), "demo exit {status}\n{stderr}");
    assert!(
        stdout.contains(&format!("capataz demo: balancer on http://{addr}/")),
        "{stdout}"
    );
    assert!(
        stdout.contains("Dashboard: http://127.0.0.1:")
            && !stdout.contains(":9901/")
            && !stdout.contains("http://127.0.0.1:0/"),
        "the banner names the bound ephemeral admin address:\n{stdout}"
    );
    // The commands it suggests name this binary as the shell finds it: `capataz` when that is
    // on PATH, otherwise its path (`capataz status` after `cargo run` named nothing).
    let command = stdout
        .split(" status --admin ")
        .next()
        .and_then(|before| before.rsplit(' ').next())
        .unwrap_or_else(|| panic!("no status command in the banner:\n{stdout}"));
    let this = std::fs::canonicalize(env!("CARGO_BIN_EXE_capataz")).expect("the binary");
    if command == "capataz" {
        let found = Command::new("sh")
            .args(["-c", "command -v capataz"])
            .output()
            .expect("sh runs");
        let found = String::from_utf8_lossy(&found.stdout).trim().to_owned();
        assert_eq!(std::fs::canonicalize(&found).ok(), Some(this), "{stdout}");
    } else {
        assert_eq!(
            std::fs::canonicalize(command).ok(),
            Some(this),
            "the banner's command {command:?} is not this binary:\n{stdout}"
        );
        assert!(
            stdout.contains(&format!(": this binary is {command}; `cargo install --locked --path crates/capataz` installs it")),
            "{stdout}"
        );
    }
    for name in ["steady", "flaky", "crashy", "liar"] {
        assert!(
            stdout.lines().any(|l| l.trim_start().starts_with(name)),
            "the banner does not name {name}:\n{stdout}"
        );
    }
    assert!(
        stderr
            .lines()
            .any(|l| l.contains("backend=liar UP -> DOWN:") && l.contains("traffic errors")),
        "the liar was not ejected by passive checks:\n{stderr}"
    );
    // It says when it stops, with a last summary that names each error's status.
    assert!(
        stderr
            .lines()
            .any(|l| l.contains("demo: stopping (its 8 s are over)")),
        "the demo did not log its stop:\n{stderr}"
    );
    let summary = stderr
        .lines()
        .find(|l| l.contains("demo traffic, last "))
        .unwrap_or_else(|| panic!("no traffic summary:\n{stderr}"));
    assert!(
        summary.contains(" requests; answered by ")
            && !summary.contains("HTTP 500 from")
            && (!summary.contains("liar")
                || (summary.contains("liar ") && summary.contains(" x HTTP 500"))),
        "{summary}"
    );
    assert!(
        stderr
            .lines()
            .last()
            .is_some_and(|l| l.contains("demo: stopped")),
        "the demo's last line says it stopped:\n{stderr}"
    );
}
