//! A real Redis server (`redis-server`, installed by `.ci/deps/redis.sh`) on a loopback port,
//! without persistence, killed by PID when dropped; and a few lines of RESP to talk to it.
//!
//! Redis refuses `--port 0`, so a free port is found by binding one and releasing it, and the
//! start is tried again on another port when the server could not bind it (someone took it
//! meanwhile).

use std::net::SocketAddr;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use super::tools::require_tool;
use super::DEADLINE;

/// One `redis-server` process.
pub struct Redis {
    child: Child,
    /// Where it listens.
    pub addr: SocketAddr,
}

impl Redis {
    /// Starts one and waits until it answers `PING`.
    pub async fn start() -> Redis {
        let program = require_tool("redis-server", "redis");
        for _ in 0..10 {
            let port = std::net::TcpListener::bind("127.0.0.1:0")
                .and_then(|l| l.local_addr())
                .expect("a free port")
                .port();
            let child = Command::new(&program)
                .args(["--bind", "127.0.0.1", "--port", &port.to_string()])
                .args(["--save", "", "--appendonly", "no", "--daemonize", "no"])
                .args(["--loglevel", "warning"])
                .stdin(Stdio::null())
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .spawn()
                .expect("redis-server starts");
            let mut redis = Redis {
                child,
                addr: SocketAddr::from(([127, 0, 0, 1], port)),
            };
            if redis.ready().await {
                return redis;
            }
            // Dropped: killed by PID; the port was taken, try another.
        }
        panic!("redis-server did not start on any of 10 free ports");
    }

    /// Whether it answers `PING` within the deadline (false once the process has exited).
    async fn ready(&mut self) -> bool {
        let end = tokio::time::Instant::now() + DEADLINE;
        while tokio::time::Instant::now() < end {
            if matches!(self.child.try_wait(), Ok(Some(_))) {
                return false;
            }
            if let Ok(mut stream) = TcpStream::connect(self.addr).await {
                if command(&mut stream, &["PING"]).await.as_deref() == Some("+PONG") {
                    return true;
                }
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        false
    }

    /// Its process id.
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Kills it (SIGKILL, by PID) and reaps it.
    pub fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for Redis {
    fn drop(&mut self) {
        self.kill();
    }
}

/// `args` as a RESP array of bulk strings.
pub fn encode(args: &[&str]) -> Vec<u8> {
    let mut out = format!("*{}\r\n", args.len()).into_bytes();
    for arg in args {
        out.extend_from_slice(format!("${}\r\n{arg}\r\n", arg.len()).as_bytes());
    }
    out
}

/// Sends `args` and reads one reply: a simple string, error, integer or bulk string, as one
/// line of text (`+PONG`, `$5 hello`), or `None` if the connection failed or closed first.
pub async fn command(stream: &mut TcpStream, args: &[&str]) -> Option<String> {
    stream.write_all(&encode(args)).await.ok()?;
    reply(stream).await
}

/// Reads one reply (see [`command`]), within the deadline.
pub async fn reply(stream: &mut TcpStream) -> Option<String> {
    tokio::time::timeout(DEADLINE, read_reply(stream))
        .await
        .ok()?
}

async fn read_reply(stream: &mut TcpStream) -> Option<String> {
    let line = read_line(stream).await?;
    if let Some(len) = line.strip_prefix('$') {
        let len: i64 = len.parse().ok()?;
        if len < 0 {
            return Some("$-1".into());
        }
        let mut body = vec![0; len as usize + 2];
        stream.read_exact(&mut body).await.ok()?;
        body.truncate(len as usize);
        return Some(format!("${len} {}", String::from_utf8_lossy(&body)));
    }
    Some(line)
}

async fn read_line(stream: &mut TcpStream) -> Option<String> {
    let mut line = Vec::new();
    loop {
        let mut byte = [0];
        if stream.read(&mut byte).await.ok()? == 0 {
            return None;
        }
        if byte[0] == b'\n' {
            break;
        }
        line.push(byte[0]);
        if line.len() > 1 << 20 {
            return None;
        }
    }
    if line.last() == Some(&b'\r') {
        line.pop();
    }
    Some(String::from_utf8_lossy(&line).into_owned())
}
