//! A real MariaDB server (Debian's `mariadb-server`, installed by `.ci/deps/mariadb.sh`) the test
//! starts itself: `mariadb-install-db` (root without a password, small InnoDB files) into a
//! temporary directory, then `mariadbd` on a reserved loopback port with its socket in that
//! directory and its `server_id` set, so a query tells which server answered. Stopped by PID
//! (SIGTERM). The client is Debian's `mariadb` ([`query`], [`Client`]).

use std::net::SocketAddr;
use std::process::{Child, Stdio};
use std::time::Duration;

use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio::process::{ChildStdin, ChildStdout};

use super::db_server::{stop, ServerHome};
use super::tools::require_tool;
use super::DEADLINE;

/// Settings that keep a test server small and quick: 4 MiB of redo log instead of 96, a small
/// buffer pool, no binary log, no DNS lookups.
const SMALL: [&str; 4] = [
    "--innodb-log-file-size=4M",
    "--innodb-buffer-pool-size=16M",
    "--skip-log-bin",
    "--skip-name-resolve",
];

/// One `mariadbd` server.
pub struct Mariadb {
    home: ServerHome,
    id: u32,
    child: Option<Child>,
    /// Where it listens.
    pub addr: SocketAddr,
}

impl Mariadb {
    /// Makes a data directory, starts a server whose `server_id` is `id` and waits until it
    /// answers a query.
    pub async fn start(id: u32) -> Mariadb {
        let home = ServerHome::new("mariadb");
        let mut args = vec![
            "--no-defaults".to_string(),
            format!("--datadir={}/data", home.text()),
            "--auth-root-authentication-method=normal".into(),
            "--skip-test-db".into(),
            // Its own temporary files: servers bootstrapped at once in the shared /tmp
            // collide on their temporary tables' names.
            format!("--tmpdir={}", home.text()),
        ];
        args.extend(SMALL.iter().map(|arg| arg.to_string()));
        let install = require_tool("mariadb-install-db", "mariadb");
        home.run(&install, &args, "install.log");
        let mut server = Mariadb {
            addr: home.addr(),
            home,
            id,
            child: None,
        };
        server.run().await;
        server
    }

    /// Starts the server on its data and port (again, after [`Mariadb::kill`]) and waits
    /// until it answers.
    pub async fn run(&mut self) {
        let end = tokio::time::Instant::now() + DEADLINE;
        let dir = self.home.text();
        let mut args = vec![
            "--no-defaults".to_string(),
            format!("--datadir={dir}/data"),
            format!("--socket={dir}/mariadb.sock"),
            format!("--pid-file={dir}/mariadb.pid"),
            format!("--port={}", self.home.port()),
            "--bind-address=127.0.0.1".into(),
            format!("--server-id={}", self.id),
            format!("--tmpdir={dir}"),
        ];
        args.extend(SMALL.iter().map(|arg| arg.to_string()));
        let program = require_tool("mariadbd", "mariadb");
        while tokio::time::Instant::now() < end {
            let child = self.home.command(&program, &args, "server.log").spawn();
            self.child = Some(child.expect("mariadbd starts"));
            if self.ready(end).await {
                return;
            }
            // It exited (its port or files still held by the one killed): try again.
            self.kill();
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        panic!(
            "mariadbd did not start:\n{}",
            self.home.log_tail("server.log")
        );
    }

    /// Whether it answers before `end` (false once the process has exited).
    async fn ready(&mut self, end: tokio::time::Instant) -> bool {
        while tokio::time::Instant::now() < end {
            let child = self.child.as_mut().expect("started");
            if matches!(child.try_wait(), Ok(Some(_))) {
                return false;
            }
            if query(self.addr, "SELECT 1").await.is_ok() {
                return true;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        false
    }

    /// Its process id.
    pub fn pid(&self) -> u32 {
        self.child.as_ref().expect("started").id()
    }

    /// Kills it (SIGKILL, by PID) and reaps it.
    pub fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

impl Drop for Mariadb {
    fn drop(&mut self) {
        if let Some(mut child) = self.child.take() {
            stop(&mut child, "TERM");
        }
    }
}

/// The `mariadb` command line to `addr` as root: batch mode (tab-separated, no column names),
/// one line out per row, no reconnecting.
fn client(addr: SocketAddr) -> tokio::process::Command {
    let mut command = tokio::process::Command::new(require_tool("mariadb", "mariadb"));
    command
        .args(["--no-defaults", "--protocol=tcp", "-h"])
        .arg(addr.ip().to_string())
        .args(["-P", &addr.port().to_string(), "-u", "root"])
        .args([
            "--batch",
            "--skip-column-names",
            "--unbuffered",
            "--skip-reconnect",
        ])
        .args(["--connect-timeout=10"])
        .kill_on_drop(true);
    command
}

/// `mariadb -e sql` against `addr`: its output lines, or its error output if it failed.
pub async fn query(addr: SocketAddr, sql: &str) -> Result<Vec<String>, String> {
    let run = client(addr).args(["-e", sql]).output();
    let output = tokio::time::timeout(DEADLINE, run)
        .await
        .expect("mariadb ends within the deadline")
        .expect("mariadb runs");
    if !output.status.success() {
        return Err(String::from_utf8_lossy(&output.stderr).into_owned());
    }
    Ok(String::from_utf8_lossy(&output.stdout)
        .lines()
        .map(str::to_owned)
        .collect())
}

/// A `mariadb` client kept running: statements written to its input one at a time, so one
/// session lives across what the test does to the server.
pub struct Client {
    child: tokio::process::Child,
    input: ChildStdin,
    output: BufReader<ChildStdout>,
}

impl Client {
    /// Starts a client session to `addr`.
    pub fn open(addr: SocketAddr) -> Client {
        let mut child = client(addr)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("mariadb runs");
        let input = child.stdin.take().expect("its input");
        let output = BufReader::new(child.stdout.take().expect("its output"));
        Client {
            child,
            input,
            output,
        }
    }

    /// Runs `sql` (one statement returning one row): that row, or `Err` with the client's
    /// error output once it has exited (the session ended).
    pub async fn one(&mut self, sql: &str) -> Result<String, String> {
        let statement = format!("{sql};\n");
        let _ = self.input.write_all(statement.as_bytes()).await;
        let mut line = String::new();
        let read = self.output.read_line(&mut line);
        match tokio::time::timeout(DEADLINE, read).await {
            Ok(Ok(n)) if n > 0 => Ok(line.trim_end().to_owned()),
            Ok(_) => Err(self.ended().await),
            Err(_) => panic!("mariadb answered nothing within the deadline"),
        }
    }

    /// How the client ended: its status and error output.
    async fn ended(&mut self) -> String {
        let wait = self.child.wait();
        let status = tokio::time::timeout(DEADLINE, wait)
            .await
            .expect("mariadb exits once its session ended")
            .expect("its status");
        let mut stderr = String::new();
        if let Some(mut err) = self.child.stderr.take() {
            let _ = tokio::io::AsyncReadExt::read_to_string(&mut err, &mut stderr).await;
        }
        format!("{status}: {stderr}")
    }
}
