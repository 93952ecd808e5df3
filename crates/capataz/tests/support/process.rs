//! `capataz` as a child process (for the tests of what only a whole process does: signals,
//! systemd's notifications, binary upgrades), a config file that can be rewritten, a
//! notification socket standing in for systemd, and a blocking HTTP/1.1 load client.
//!
//! Every process is held by a guard that kills it by PID when the test ends, even on failure;
//! so is a process the test only learns of (the new process of an upgrade, a grandchild). Its
//! standard error is read by a thread and kept, and a test waits for the line it needs with a
//! generous deadline: nothing here sleeps to synchronise.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::os::unix::net::UnixDatagram;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::thread;
use std::time::{Duration, Instant};

use super::DEADLINE;

/// How often a condition that offers no notification (an exit) is checked.
const POLL: Duration = Duration::from_millis(20);

/// A file in the temporary directory, unique to this process and call, removed on drop.
pub struct TempFile {
    path: PathBuf,
}

impl TempFile {
    /// A new file `capataz-<pid>-<n>-<tag>` holding `contents`.
    pub fn new(tag: &str, contents: &str) -> TempFile {
        static NEXT: AtomicUsize = AtomicUsize::new(0);
        let n = NEXT.fetch_add(1, Ordering::Relaxed);
        let name = format!("capataz-{}-{n}-{tag}", std::process::id());
        let file = TempFile {
            path: std::env::temp_dir().join(name),
        };
        file.write(contents);
        file
    }

    /// Replaces the contents.
    pub fn write(&self, contents: &str) {
        std::fs::write(&self.path, contents)
            .unwrap_or_else(|e| panic!("cannot write {}: {e}", self.path.display()));
    }

    /// Its path.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Its path as text.
    pub fn text(&self) -> &str {
        self.path.to_str().expect("a UTF-8 temporary path")
    }
}

impl Drop for TempFile {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.path);
    }
}

/// Lines of a stream, kept as they come, with a condition variable for the waiters.
#[derive(Default)]
struct Lines {
    seen: Mutex<(Vec<String>, bool)>,
    changed: Condvar,
}

/// Sends `signal` (`TERM`, `HUP`, `USR2`, `KILL`) to `pid` with kill(1).
pub fn signal(pid: u32, signal: &str) {
    let status = Command::new("kill")
        .arg(format!("-{signal}"))
        .arg(pid.to_string())
        .status()
        .expect("kill(1) runs");
    assert!(status.success(), "kill -{signal} {pid} failed: {status}");
}

/// Whether process `pid` is gone (or a zombie nobody reaped).
pub fn gone(pid: u32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Err(_) => true,
        Ok(stat) => stat
            .rsplit_once(") ")
            .is_some_and(|(_, rest)| rest.starts_with('Z') || rest.starts_with('X')),
    }
}

/// A running `capataz`, killed by PID when dropped, with its standard error kept.
pub struct Capataz {
    child: Child,
    stderr: Arc<Lines>,
    /// Other processes to kill at the end (the new process of an upgrade).
    adopted: Vec<u32>,
}

impl Capataz {
    /// Starts the `capataz` binary with `args` and `env` added to the environment.
    pub fn spawn(args: &[&str], env: &[(&str, &str)]) -> Capataz {
        let mut command = Command::new(env!("CARGO_BIN_EXE_capataz"));
        command
            .args(args)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            // One worker: this machine is shared, and one is plenty for a test's traffic.
            .env("CAPATAZ_WORKER_THREADS", "1");
        for (key, value) in env {
            command.env(key, value);
        }
        let mut child = command.spawn().expect("the capataz binary runs");
        let stream = child.stderr.take().expect("piped stderr");
        let stderr = Arc::new(Lines::default());
        let lines = stderr.clone();
        thread::spawn(move || {
            for line in BufReader::new(stream).lines() {
                let Ok(line) = line else { break };
                lines.seen.lock().unwrap().0.push(line);
                lines.changed.notify_all();
            }
            lines.seen.lock().unwrap().1 = true;
            lines.changed.notify_all();
        });
        Capataz {
            child,
            stderr,
            adopted: Vec::new(),
        }
    }

    /// Its process id.
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Kills `pid` too when dropped.
    pub fn adopt(&mut self, pid: u32) {
        self.adopted.push(pid);
    }

    /// Sends `name` (`TERM`, `HUP`, `USR2`) to it.
    pub fn signal(&self, name: &str) {
        signal(self.pid(), name);
    }

    /// Everything written to its standard error (and its children's) so far.
    pub fn stderr(&self) -> String {
        self.stderr.seen.lock().unwrap().0.join("\n")
    }

    /// Waits for the first line matching `want` after the first `skip` lines, and returns it
    /// with its index.
    pub fn wait_line_after(
        &self,
        skip: usize,
        what: &str,
        want: impl Fn(&str) -> bool,
    ) -> (usize, String) {
        let end = Instant::now() + DEADLINE;
        let mut seen = self.stderr.seen.lock().unwrap();
        loop {
            if let Some((i, line)) = seen.0.iter().enumerate().skip(skip).find(|(_, l)| want(l)) {
                return (i, line.clone());
            }
            let left = end.saturating_duration_since(Instant::now());
            assert!(
                !left.is_zero() && !seen.1,
                "no {what} on capataz's stderr within {DEADLINE:?}:\n{}",
                seen.0.join("\n")
            );
            seen = self.stderr.changed.wait_timeout(seen, left).unwrap().0;
        }
    }

    /// Waits for a line matching `want` and returns it.
    pub fn wait_line(&self, what: &str, want: impl Fn(&str) -> bool) -> String {
        self.wait_line_after(0, what, want).1
    }

    /// How many lines it has written so far.
    pub fn line_count(&self) -> usize {
        self.stderr.seen.lock().unwrap().0.len()
    }

    /// The address listener `name` bound (from its `listening` log line), for a config that
    /// asks for port 0.
    pub fn listening_on(&self, name: &str) -> SocketAddr {
        let line = self.wait_line("the listening line", |l| {
            l.contains("listening") && l.contains(&format!("listener={name} "))
        });
        address_in(&line)
    }

    /// The admin API's address (from its log line).
    pub fn admin_on(&self) -> SocketAddr {
        address_in(&self.wait_line("the admin line", |l| l.contains("admin API listening")))
    }

    /// Whether it has exited, without waiting.
    pub fn exited(&mut self) -> Option<ExitStatus> {
        self.child.try_wait().expect("try_wait on the child")
    }

    /// Waits for it to exit by itself.
    pub fn wait_exit(&mut self) -> ExitStatus {
        let end = Instant::now() + DEADLINE;
        loop {
            if let Some(status) = self.exited() {
                return status;
            }
            assert!(
                Instant::now() < end,
                "capataz still running after {DEADLINE:?}; stderr:\n{}",
                self.stderr()
            );
            thread::sleep(POLL);
        }
    }
}

impl Drop for Capataz {
    fn drop(&mut self) {
        for &pid in &self.adopted {
            if !gone(pid) {
                let _ = Command::new("kill")
                    .arg("-KILL")
                    .arg(pid.to_string())
                    .status();
            }
        }
        // Harmless when it has already exited and been reaped.
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The `address=` value of a log line.
fn address_in(line: &str) -> SocketAddr {
    let at = line
        .find("address=")
        .unwrap_or_else(|| panic!("no address in {line}"));
    let text: String = line[at + "address=".len()..]
        .chars()
        .take_while(|c| !c.is_whitespace())
        .collect();
    text.parse()
        .unwrap_or_else(|_| panic!("no address in {line}"))
}

/// The `pid=` value of a log line.
pub fn pid_in(line: &str) -> u32 {
    let at = line
        .find("pid=")
        .unwrap_or_else(|| panic!("no pid in {line}"));
    line[at + 4..]
        .chars()
        .take_while(char::is_ascii_digit)
        .collect::<String>()
        .parse()
        .unwrap_or_else(|_| panic!("no pid in {line}"))
}

/// A unix datagram socket standing in for systemd's notification socket.
pub struct NotifySocket {
    socket: UnixDatagram,
    /// What to put in `NOTIFY_SOCKET`.
    pub name: String,
    path: Option<PathBuf>,
}

impl NotifySocket {
    /// A socket at a path in the temporary directory.
    pub fn at_path() -> NotifySocket {
        static NEXT: AtomicUsize = AtomicUsize::new(0);
        let n = NEXT.fetch_add(1, Ordering::Relaxed);
        let path = std::env::temp_dir().join(format!("capataz-{}-{n}-notify", std::process::id()));
        let _ = std::fs::remove_file(&path);
        let socket = UnixDatagram::bind(&path).expect("bind the notification socket");
        NotifySocket::ready(
            socket,
            path.to_str().expect("UTF-8 path").to_owned(),
            Some(path),
        )
    }

    /// A socket in the abstract namespace (`@name`).
    pub fn abstract_name() -> NotifySocket {
        use std::os::linux::net::SocketAddrExt as _;
        let name = format!("capataz-test-{}-{}", std::process::id(), fastrand::u64(..));
        let address = std::os::unix::net::SocketAddr::from_abstract_name(name.as_bytes())
            .expect("an abstract address");
        let socket = UnixDatagram::bind_addr(&address).expect("bind an abstract socket");
        NotifySocket::ready(socket, format!("@{name}"), None)
    }

    fn ready(socket: UnixDatagram, name: String, path: Option<PathBuf>) -> NotifySocket {
        socket
            .set_read_timeout(Some(DEADLINE))
            .expect("a read timeout");
        NotifySocket { socket, name, path }
    }

    /// The next notification, or a panic after the deadline.
    pub fn next(&self) -> String {
        let mut buf = [0u8; 4096];
        let n = self
            .socket
            .recv(&mut buf)
            .unwrap_or_else(|e| panic!("no notification within {DEADLINE:?}: {e}"));
        String::from_utf8_lossy(&buf[..n]).into_owned()
    }
}

impl Drop for NotifySocket {
    fn drop(&mut self) {
        if let Some(path) = &self.path {
            let _ = std::fs::remove_file(path);
        }
    }
}

/// What a load run saw.
#[derive(Debug, Default)]
pub struct LoadReport {
    /// Requests answered 200.
    pub ok: u64,
    /// Everything else: connection errors, a cut answer, another status.
    pub errors: u64,
    /// The first few errors, said.
    pub samples: Vec<String>,
    /// Connections opened.
    pub connections: u64,
}

/// A blocking HTTP/1.1 load: `keep_alive` clients that reuse their connection until an answer
/// says `Connection: close` (then open another), and `fresh` clients that open a connection
/// per request, each sending `GET /` back to back until `stop` is set (or a minute passes).
/// A client that sees an error counts it and goes on with a new connection; nothing is
/// retried.
pub fn load(
    addr: SocketAddr,
    keep_alive: usize,
    fresh: usize,
    stop: Arc<AtomicBool>,
) -> thread::JoinHandle<LoadReport> {
    thread::spawn(move || {
        let ok = Arc::new(AtomicU64::new(0));
        let connections = Arc::new(AtomicU64::new(0));
        let errors = Arc::new(Mutex::new((0u64, Vec::new())));
        let mut clients = Vec::new();
        for i in 0..keep_alive + fresh {
            let reuse = i < keep_alive;
            let (stop, ok, connections, errors) = (
                stop.clone(),
                ok.clone(),
                connections.clone(),
                errors.clone(),
            );
            clients.push(thread::spawn(move || {
                let end = Instant::now() + Duration::from_secs(60);
                let mut stream: Option<Conn> = None;
                while !stop.load(Ordering::Relaxed) && Instant::now() < end {
                    let conn = match stream.take() {
                        Some(conn) => conn,
                        None => match Conn::open(addr) {
                            Ok(conn) => {
                                connections.fetch_add(1, Ordering::Relaxed);
                                conn
                            }
                            Err(e) => {
                                note(&errors, format!("connect: {e}"));
                                continue;
                            }
                        },
                    };
                    match conn.get(reuse) {
                        Ok((200, conn)) => {
                            ok.fetch_add(1, Ordering::Relaxed);
                            stream = conn.filter(|_| reuse);
                        }
                        Ok((status, _)) => note(&errors, format!("status {status}")),
                        Err(e) => note(&errors, format!("request: {e}")),
                    }
                }
            }));
        }
        for client in clients {
            client.join().expect("a load client");
        }
        let (errors, samples) = std::mem::take(&mut *errors.lock().unwrap());
        LoadReport {
            ok: ok.load(Ordering::Relaxed),
            errors,
            samples,
            connections: connections.load(Ordering::Relaxed),
        }
    })
}

fn note(errors: &Mutex<(u64, Vec<String>)>, what: String) {
    let mut errors = errors.lock().unwrap();
    errors.0 += 1;
    if errors.1.len() < 10 {
        errors.1.push(what);
    }
}

/// One client connection.
struct Conn {
    stream: TcpStream,
    buf: Vec<u8>,
}

impl Conn {
    fn open(addr: SocketAddr) -> std::io::Result<Conn> {
        let stream = TcpStream::connect_timeout(&addr, Duration::from_secs(5))?;
        stream.set_read_timeout(Some(Duration::from_secs(10)))?;
        stream.set_write_timeout(Some(Duration::from_secs(10)))?;
        stream.set_nodelay(true)?;
        Ok(Conn {
            stream,
            buf: Vec::new(),
        })
    }

    /// Sends `GET /` and reads the answer: its status, and the connection if it may be reused.
    fn get(mut self, keep_alive: bool) -> std::io::Result<(u16, Option<Conn>)> {
        let connection = if keep_alive { "keep-alive" } else { "close" };
        let request =
            format!("GET / HTTP/1.1\r\nHost: load.test\r\nConnection: {connection}\r\n\r\n");
        self.stream.write_all(request.as_bytes())?;
        let bad =
            |what: &str| std::io::Error::new(std::io::ErrorKind::InvalidData, what.to_owned());
        let head_end = loop {
            if let Some(at) = self.buf.windows(4).position(|w| w == b"\r\n\r\n") {
                break at + 4;
            }
            self.fill()?;
        };
        let head = String::from_utf8_lossy(&self.buf[..head_end]).into_owned();
        let status: u16 = head
            .split(' ')
            .nth(1)
            .and_then(|code| code.parse().ok())
            .ok_or_else(|| bad("no status line"))?;
        let header = |name: &str| {
            head.split("\r\n").find_map(|line| {
                let (key, value) = line.split_once(':')?;
                key.eq_ignore_ascii_case(name)
                    .then(|| value.trim().to_ascii_lowercase())
            })
        };
        let length: usize = header("content-length")
            .and_then(|v| v.parse().ok())
            .ok_or_else(|| bad("no content-length"))?;
        while self.buf.len() < head_end + length {
            self.fill()?;
        }
        self.buf.drain(..head_end + length);
        let close = header("connection").is_some_and(|v| v == "close");
        Ok((status, (!close).then_some(self)))
    }

    fn fill(&mut self) -> std::io::Result<()> {
        let mut chunk = [0u8; 4096];
        let n = self.stream.read(&mut chunk)?;
        if n == 0 {
            return Err(std::io::Error::new(
                std::io::ErrorKind::UnexpectedEof,
                "connection closed before the whole answer",
            ));
        }
        self.buf.extend_from_slice(&chunk[..n]);
        Ok(())
    }
}

/// The subcommands `capataz <args> --help` lists, without `help` (clap's own): for the tests
/// that check the docs, the manual and the completions name every one and no other.
pub fn subcommands(args: &[&str]) -> Vec<String> {
    let output = Command::new(env!("CARGO_BIN_EXE_capataz"))
        .args(args)
        .arg("--help")
        .output()
        .expect("the capataz binary runs");
    assert!(
        output.status.success(),
        "capataz {args:?} --help: {}",
        output.status
    );
    let help = String::from_utf8(output.stdout).expect("UTF-8 help");
    let listed: Vec<String> = help
        .split("Commands:")
        .nth(1)
        .unwrap_or_else(|| panic!("no command list in:\n{help}"))
        .lines()
        .skip(1)
        .take_while(|line| line.starts_with("  "))
        .filter_map(|line| line.split_whitespace().next())
        .filter(|name| *name != "help")
        .map(str::to_owned)
        .collect();
    assert!(!listed.is_empty(), "{help}");
    listed
}
