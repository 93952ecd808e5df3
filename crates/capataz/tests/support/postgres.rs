//! A real PostgreSQL server (Debian's `postgresql`, installed by `.ci/deps/postgresql.sh`) the
//! test starts itself: `initdb` (user `capataz`, trust authentication, no fsync) into a
//! temporary directory, then `postgres` on a reserved loopback port with its socket in that
//! directory and `cluster_name` set, so a query tells which server answered. Stopped by PID
//! (SIGQUIT, PostgreSQL's immediate shutdown, which takes its children along).
//!
//! Beside it, the protocol's simple query flow in a few lines ([`Session`]), so a test holds a
//! session open across a kill, and `psql` ([`psql`]) as users run it.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::Child;
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use super::db_server::{stop, ServerHome};
use super::tools::require_tool;
use super::DEADLINE;

/// The user `initdb` makes the superuser, and the tests log in as.
pub const USER: &str = "capataz";

/// A `StartupMessage` (protocol 3.0) for `user` on database `postgres`.
pub fn startup(user: &str) -> Vec<u8> {
    let mut body = 0x0003_0000u32.to_be_bytes().to_vec();
    for (key, value) in [("user", user), ("database", "postgres")] {
        body.extend_from_slice(key.as_bytes());
        body.push(0);
        body.extend_from_slice(value.as_bytes());
        body.push(0);
    }
    body.push(0);
    let mut message = u32::try_from(body.len() + 4)
        .unwrap()
        .to_be_bytes()
        .to_vec();
    message.extend_from_slice(&body);
    message
}

/// One `postgres` server.
pub struct Postgres {
    home: ServerHome,
    name: String,
    child: Option<Child>,
    /// Where it listens.
    pub addr: SocketAddr,
}

impl Postgres {
    /// Makes a cluster whose `cluster_name` is `name`, starts it and waits until it takes
    /// logins.
    pub async fn start(name: &str) -> Postgres {
        let home = ServerHome::new("postgres");
        let data = format!("{}/data", home.text());
        let args = [
            "-D",
            &data,
            "-U",
            USER,
            "-A",
            "trust",
            "--no-sync",
            "-E",
            "UTF8",
        ];
        home.run(&bin("initdb"), &strings(&args), "initdb.log");
        let mut server = Postgres {
            addr: home.addr(),
            home,
            name: name.into(),
            child: None,
        };
        server.run().await;
        server
    }

    /// Starts the server on its data and port again (after [`Postgres::kill`]) and waits
    /// until it takes logins. The children of a killed server leave on their own once they
    /// see it gone; until they have, a new one refuses to start, so it is tried again.
    pub async fn run(&mut self) {
        let end = tokio::time::Instant::now() + DEADLINE;
        let data = format!("{}/data", self.home.text());
        // A killed server's lock file names a process that is gone.
        let _ = std::fs::remove_file(format!("{data}/postmaster.pid"));
        while tokio::time::Instant::now() < end {
            let port = self.home.port().to_string();
            let cluster = format!("cluster_name={}", self.name);
            let args = [
                "-D",
                &data,
                "-k",
                self.home.text(),
                "-p",
                &port,
                "-h",
                "127.0.0.1",
                "-c",
                &cluster,
                "-c",
                "fsync=off",
                "-c",
                "max_connections=20",
            ];
            let mut command = self
                .home
                .command(&bin("postgres"), &strings(&args), "server.log");
            let child = command.spawn().expect("postgres starts");
            self.child = Some(child);
            if self.ready(end).await {
                return;
            }
            self.kill();
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        panic!(
            "postgres did not start:\n{}",
            self.home.log_tail("server.log")
        );
    }

    /// Whether it takes a login before `end` (false once the process has exited).
    async fn ready(&mut self, end: tokio::time::Instant) -> bool {
        while tokio::time::Instant::now() < end {
            let child = self.child.as_mut().expect("started");
            if matches!(child.try_wait(), Ok(Some(_))) {
                return false;
            }
            if Session::open(self.addr).await.is_ok() {
                return true;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        false
    }

    /// The postmaster's process id.
    pub fn pid(&self) -> u32 {
        self.child.as_ref().expect("started").id()
    }

    /// Kills the postmaster (SIGKILL, by PID) and reaps it; its children end by themselves
    /// once they see it gone (a session's process when it next waits for its client: at once
    /// if idle).
    pub fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

impl Drop for Postgres {
    fn drop(&mut self) {
        if let Some(mut child) = self.child.take() {
            stop(&mut child, "QUIT");
        }
    }
}

/// Where Debian keeps the server's program `name`: `/usr/lib/postgresql/<version>/bin`, the
/// highest version installed.
fn bin(name: &str) -> PathBuf {
    // psql is on PATH; requiring it applies the tier rule and names the script.
    require_tool("psql", "postgresql");
    let mut found: Vec<(u32, PathBuf)> = std::fs::read_dir("/usr/lib/postgresql")
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|entry| {
            let version = entry.file_name().to_str()?.parse().ok()?;
            let path = entry.path().join("bin").join(name);
            path.is_file().then_some((version, path))
        })
        .collect();
    found.sort();
    found.pop().map(|(_, path)| path).unwrap_or_else(|| {
        panic!(
            "no /usr/lib/postgresql/*/bin/{name}: run `bash .ci/deps/postgresql.sh` (as \
             `.ci/test` and CI do; it installs Debian packages, so as root)"
        )
    })
}

fn strings(args: &[&str]) -> Vec<String> {
    args.iter().map(|arg| arg.to_string()).collect()
}

/// `psql` (Debian's client) running `sql` against `addr` as [`USER`]: its output lines
/// (unaligned, tuples only), or its error output if it failed.
pub async fn psql(addr: SocketAddr, sql: &str) -> Result<Vec<String>, String> {
    let program = require_tool("psql", "postgresql");
    let port = addr.port().to_string();
    let host = addr.ip().to_string();
    let run = tokio::process::Command::new(program)
        .args([
            "-X", "-A", "-t", "-w", "-h", &host, "-p", &port, "-U", USER, "-d", "postgres",
        ])
        .args(["-v", "ON_ERROR_STOP=1", "-c", sql])
        .env("PGCONNECT_TIMEOUT", "10")
        .kill_on_drop(true)
        .output();
    let output = tokio::time::timeout(DEADLINE, run)
        .await
        .expect("psql ends within the deadline")
        .expect("psql runs");
    if !output.status.success() {
        return Err(String::from_utf8_lossy(&output.stderr).into_owned());
    }
    Ok(String::from_utf8_lossy(&output.stdout)
        .lines()
        .map(str::to_owned)
        .collect())
}

/// A session in PostgreSQL's protocol: logged in as [`USER`], simple queries, the first
/// column of each row as text.
pub struct Session {
    stream: TcpStream,
}

impl Session {
    /// Connects to `addr`, logs in (trust) and waits for `ReadyForQuery`; within the deadline.
    pub async fn open(addr: SocketAddr) -> Result<Session, String> {
        let stream = TcpStream::connect(addr).await.map_err(|e| e.to_string())?;
        let mut session = Session { stream };
        session.send(&startup(USER)).await?;
        session.until_ready().await?;
        Ok(session)
    }

    /// Runs `sql` (one statement): the first column of each row, or the server's error, or
    /// how the connection failed.
    pub async fn query(&mut self, sql: &str) -> Result<Vec<String>, String> {
        let mut message = vec![b'Q'];
        message.extend_from_slice(&u32::try_from(sql.len() + 5).unwrap().to_be_bytes());
        message.extend_from_slice(sql.as_bytes());
        message.push(0);
        self.send(&message).await?;
        self.until_ready().await
    }

    /// Waits, sending nothing, until the connection ends (within the deadline): the errors
    /// the server sent before it did.
    pub async fn ended(&mut self) -> Vec<String> {
        let read = async {
            let mut errors = Vec::new();
            while let Ok((kind, body)) = self.message().await {
                if kind == b'E' {
                    errors.push(error_text(&body));
                }
            }
            errors
        };
        tokio::time::timeout(DEADLINE, read)
            .await
            .expect("the session ends within the deadline")
    }

    async fn send(&mut self, bytes: &[u8]) -> Result<(), String> {
        self.stream
            .write_all(bytes)
            .await
            .map_err(|e| e.to_string())
    }

    /// Reads messages until `ReadyForQuery`: the rows' first columns, or the first error.
    async fn until_ready(&mut self) -> Result<Vec<String>, String> {
        let read = async {
            let mut rows = Vec::new();
            let mut error = None;
            loop {
                let (kind, body) = self.message().await?;
                match kind {
                    b'Z' => return error.map_or(Ok(rows), Err),
                    b'D' => rows.push(first_column(&body)?),
                    b'E' => error = Some(error_text(&body)),
                    b'R' if body.get(..4) != Some(&[0, 0, 0, 0]) => {
                        return Err("a password was asked for".into())
                    }
                    _ => {}
                }
            }
        };
        tokio::time::timeout(DEADLINE, read)
            .await
            .map_err(|_| "no answer within the deadline".to_string())?
    }

    /// One message: its type and body (at most 1 MiB).
    async fn message(&mut self) -> Result<(u8, Vec<u8>), String> {
        let mut head = [0u8; 5];
        let io = |e: std::io::Error| format!("the connection failed: {e}");
        self.stream.read_exact(&mut head).await.map_err(io)?;
        let len = u32::from_be_bytes([head[1], head[2], head[3], head[4]]) as usize;
        if !(4..=1 << 20).contains(&len) {
            return Err(format!("a message of {len} bytes"));
        }
        let mut body = vec![0; len - 4];
        self.stream.read_exact(&mut body).await.map_err(io)?;
        Ok((head[0], body))
    }
}

/// A `DataRow`'s first column as text.
fn first_column(body: &[u8]) -> Result<String, String> {
    let len = body
        .get(2..6)
        .map(|b| i32::from_be_bytes([b[0], b[1], b[2], b[3]]))
        .ok_or("a short DataRow")?;
    let len = usize::try_from(len).map_err(|_| "a NULL column".to_string())?;
    let value = body.get(6..6 + len).ok_or("a short DataRow")?;
    Ok(String::from_utf8_lossy(value).into_owned())
}

/// An `ErrorResponse`'s message field (`M`), or the whole body if it has none.
fn error_text(body: &[u8]) -> String {
    body.split(|b| *b == 0)
        .find_map(|field| field.strip_prefix(b"M"))
        .map(|text| String::from_utf8_lossy(text).into_owned())
        .unwrap_or_else(|| String::from_utf8_lossy(body).into_owned())
}
