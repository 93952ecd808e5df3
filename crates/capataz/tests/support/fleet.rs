//! A fleet of `capataz` processes for the scale-out tests: each instance a real process (so
//! one can be SIGKILLed) with its own config file, admin API and listener on ephemeral ports;
//! blocking reads of its admin API (`/status`, `/history/events`, `/metrics`); a paced client
//! per instance that logs every request (when it started and ended, and which backend
//! answered, from `X-Backend`); and the count of probes each instance sent to each backend.
//!
//! Everything here is blocking (std threads and sockets): a test drives the fleet from
//! outside, and the backends and the relay run on a runtime of the test's own.

use std::collections::BTreeMap;
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread;
use std::time::{Duration, Instant};

use serde_json::Value;

use super::process::{Capataz, TempFile};
use super::DEADLINE;

/// How many instances probe each backend in a fleet of `live` instances. Today each instance
/// probes every backend by itself: `live`. With shared probing it becomes
/// `live.min(k)`, `k` from the shared-probing block of the config.
pub fn probers_per_backend(live: usize, shared_k: Option<usize>) -> usize {
    match shared_k {
        None => live,
        Some(k) => live.min(k),
    }
}

/// One `capataz run` process and where it listens.
pub struct Instance {
    /// Its name in the test (`a`, `b`, ...).
    pub name: String,
    /// The process, killed by PID when dropped.
    pub process: Capataz,
    /// The client listener.
    pub front: SocketAddr,
    /// The admin API.
    pub admin: SocketAddr,
    _config: TempFile,
}

impl Instance {
    /// Writes `config` (which must name its listener `front` and have an `[admin]` table, both
    /// on port 0) to a file of its own and starts `capataz run` on it.
    pub fn start(name: &str, config: &str) -> Instance {
        let file = TempFile::new(&format!("fleet-{name}.toml"), config);
        let process = Capataz::spawn(&["run", "--config", file.text()], &[]);
        let front = process.listening_on("front");
        let admin = process.admin_on();
        Instance {
            name: name.to_owned(),
            process,
            front,
            admin,
            _config: file,
        }
    }

    /// Replaces its config file with `config` (to be reloaded with `HUP`).
    pub fn rewrite(&self, config: &str) {
        self._config.write(config);
    }

    /// `GET path` on its admin API, as JSON (panics on another status).
    pub fn json(&self, path: &str) -> Value {
        let (status, body) = get(self.admin, path)
            .unwrap_or_else(|e| panic!("instance {}: GET {path}: {e}", self.name));
        assert_eq!(status, 200, "instance {}: GET {path}: {body}", self.name);
        serde_json::from_str(&body).unwrap_or_else(|e| {
            panic!("instance {}: GET {path}: not JSON ({e}): {body}", self.name)
        })
    }

    /// `GET /status/web/<backend>`: its status, and the JSON when 200.
    pub fn backend(&self, pool: &str, backend: &str) -> (u16, Value) {
        let (status, body) = get(self.admin, &format!("/status/{pool}/{backend}"))
            .unwrap_or_else(|e| panic!("instance {}: GET /status: {e}", self.name));
        (status, serde_json::from_str(&body).unwrap_or(Value::Null))
    }

    /// The names of pool `pool`'s backends with their `serving` flag, from `/status`.
    pub fn serving(&self, pool: &str) -> BTreeMap<String, bool> {
        let status = self.json("/status");
        let pools = status["pools"].as_array().cloned().unwrap_or_default();
        let pool = pools
            .iter()
            .find(|p| p["name"] == pool)
            .unwrap_or_else(|| panic!("instance {}: no pool {pool}: {status}", self.name));
        pool["backends"]
            .as_array()
            .map(|backends| {
                backends
                    .iter()
                    .map(|b| {
                        (
                            b["name"].as_str().unwrap_or_default().to_owned(),
                            b["serving"] == true,
                        )
                    })
                    .collect()
            })
            .unwrap_or_default()
    }

    /// Its kept events (`/history/events`), oldest first; panics if the record lost any.
    pub fn events(&self) -> Vec<Value> {
        let history = self.json("/history/events");
        assert_eq!(
            (history["dropped"].as_u64(), history["missed"].as_u64()),
            (Some(0), Some(0)),
            "instance {}: the event record lost events, counts would be wrong",
            self.name
        );
        history["events"].as_array().cloned().unwrap_or_default()
    }

    /// Its transitions per backend, oldest first, each `FROM->TO`.
    pub fn transitions(&self) -> BTreeMap<String, Vec<String>> {
        let mut out: BTreeMap<String, Vec<String>> = BTreeMap::new();
        for event in self.events() {
            if event["type"] == "transition" {
                out.entry(event["backend"].as_str().unwrap_or_default().to_owned())
                    .or_default()
                    .push(format!(
                        "{}->{}",
                        event["from"].as_str().unwrap_or_default(),
                        event["to"].as_str().unwrap_or_default()
                    ));
            }
        }
        out
    }

    /// The live members of its fleet group as it sees them (`/status`'s `fleet.members`; none
    /// without `[fleet]`), sorted.
    pub fn fleet_members(&self) -> Vec<String> {
        let mut members: Vec<String> = self.json("/status")["fleet"]["members"]
            .as_array()
            .map(|m| {
                m.iter()
                    .map(|n| n.as_str().unwrap_or_default().to_owned())
                    .collect()
            })
            .unwrap_or_default();
        members.sort();
        members
    }

    /// Its `membership` events, oldest first: the change (`updated`, `failing`, ...) of each.
    pub fn membership_events(&self) -> Vec<String> {
        self.events()
            .iter()
            .filter(|e| e["type"] == "membership")
            .map(|e| e["membership"].as_str().unwrap_or_default().to_owned())
            .collect()
    }

    /// Probes it has sent to each backend of `pool` so far (`capataz_probes_total`, every
    /// result).
    pub fn probes_sent(&self, pool: &str) -> BTreeMap<String, u64> {
        let (status, body) = get(self.admin, "/metrics")
            .unwrap_or_else(|e| panic!("instance {}: GET /metrics: {e}", self.name));
        assert_eq!(status, 200, "instance {}: /metrics: {body}", self.name);
        let mut out = BTreeMap::new();
        let pool_label = format!("pool=\"{pool}\"");
        for line in body.lines() {
            let Some(rest) = line.strip_prefix("capataz_probes_total{") else {
                continue;
            };
            let Some((labels, value)) = rest.split_once("} ") else {
                continue;
            };
            if !labels.split(',').any(|l| l == pool_label) {
                continue;
            }
            let Some(backend) = labels.split(',').find_map(|l| {
                l.strip_prefix("backend=\"")
                    .and_then(|b| b.strip_suffix('"'))
            }) else {
                continue;
            };
            let value: f64 = value
                .split(' ')
                .next()
                .unwrap_or("0")
                .parse()
                .unwrap_or(0.0);
            *out.entry(backend.to_owned()).or_insert(0) += value as u64;
        }
        out
    }
}

/// `GET path` over a fresh connection to `addr`: the status and the body (a sized or chunked
/// one), each step bounded.
pub fn get(addr: SocketAddr, path: &str) -> std::io::Result<(u16, String)> {
    let mut stream = TcpStream::connect_timeout(&addr, Duration::from_secs(5))?;
    stream.set_read_timeout(Some(Duration::from_secs(10)))?;
    stream.set_write_timeout(Some(Duration::from_secs(10)))?;
    write!(
        stream,
        "GET {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n"
    )?;
    let mut raw = Vec::new();
    stream.read_to_end(&mut raw)?;
    let bad = |what: &str| std::io::Error::new(std::io::ErrorKind::InvalidData, what.to_owned());
    let end = raw
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .ok_or_else(|| bad("no end of head"))?;
    let head = String::from_utf8_lossy(&raw[..end]).to_ascii_lowercase();
    let status = head
        .split(' ')
        .nth(1)
        .and_then(|s| s.parse().ok())
        .ok_or_else(|| bad("no status"))?;
    let mut body = raw[end + 4..].to_vec();
    if head.contains("transfer-encoding: chunked") {
        body = dechunk(&body).ok_or_else(|| bad("a broken chunked body"))?;
    }
    Ok((status, String::from_utf8_lossy(&body).into_owned()))
}

fn dechunk(mut raw: &[u8]) -> Option<Vec<u8>> {
    let mut out = Vec::new();
    loop {
        let line = raw.windows(2).position(|w| w == b"\r\n")?;
        let size_text = String::from_utf8_lossy(&raw[..line]);
        let size = usize::from_str_radix(size_text.split(';').next()?.trim(), 16).ok()?;
        raw = &raw[line + 2..];
        if size == 0 {
            return Some(out);
        }
        out.extend_from_slice(raw.get(..size)?);
        raw = raw.get(size + 2..)?;
    }
}

/// One request of a [`Traffic`].
#[derive(Clone, Debug)]
pub struct Request {
    /// When it was sent.
    pub started: Instant,
    /// When its answer (or its failure) came.
    pub ended: Instant,
    /// The backend that answered 200 (its `X-Backend`), or what went wrong.
    pub outcome: Result<String, String>,
}

/// A paced client of one instance: one keep-alive connection (a new one after an error or a
/// `Connection: close`), a `GET /` every `pace`, every request logged. It stops when dropped,
/// or after two minutes.
pub struct Traffic {
    stop: Arc<AtomicBool>,
    log: Arc<Mutex<Vec<Request>>>,
    thread: Option<thread::JoinHandle<()>>,
}

impl Traffic {
    /// Starts sending to `addr`.
    pub fn start(addr: SocketAddr, pace: Duration) -> Traffic {
        let stop = Arc::new(AtomicBool::new(false));
        let log = Arc::new(Mutex::new(Vec::new()));
        let (stopping, logging) = (stop.clone(), log.clone());
        let thread = thread::spawn(move || {
            let end = Instant::now() + Duration::from_secs(120);
            let mut conn: Option<TcpStream> = None;
            while !stopping.load(Ordering::Relaxed) && Instant::now() < end {
                let started = Instant::now();
                let (outcome, keep) = match exchange(conn.take(), addr) {
                    Ok((200, backend, stream)) => (Ok(backend), stream),
                    Ok((status, _, stream)) => (Err(format!("status {status}")), stream),
                    Err(e) => (Err(e.to_string()), None),
                };
                conn = keep;
                logging.lock().unwrap().push(Request {
                    started,
                    ended: Instant::now(),
                    outcome,
                });
                // Pacing, not synchronisation: the next request is due one pace after this one.
                if let Some(left) = (started + pace).checked_duration_since(Instant::now()) {
                    thread::sleep(left);
                }
            }
        });
        Traffic {
            stop,
            log,
            thread: Some(thread),
        }
    }

    /// A copy of the log so far.
    pub fn requests(&self) -> Vec<Request> {
        self.log.lock().unwrap().clone()
    }

    /// Requests that ended so far.
    pub fn count(&self) -> usize {
        self.log.lock().unwrap().len()
    }

    /// The failed requests among those that ended before `until` (all of them with `None`).
    pub fn errors(&self, until: Option<Instant>) -> Vec<Request> {
        self.requests()
            .into_iter()
            .filter(|r| r.outcome.is_err() && until.is_none_or(|t| r.ended < t))
            .collect()
    }

    /// Requests sent at or after `since` that `backend` answered.
    pub fn served_since(&self, backend: &str, since: Instant) -> usize {
        self.requests()
            .iter()
            .filter(|r| r.started >= since && r.outcome.as_deref() == Ok(backend))
            .count()
    }

    /// Waits until `more` requests beyond those ended now have ended.
    pub fn wait_more(&self, more: usize) {
        let target = self.count() + more;
        let end = Instant::now() + DEADLINE;
        while self.count() < target {
            assert!(
                Instant::now() < end,
                "fewer than {more} requests within {DEADLINE:?}"
            );
            thread::sleep(Duration::from_millis(10));
        }
    }

    /// Stops sending (the request in flight ends first) and returns the whole log.
    pub fn stop(mut self) -> Vec<Request> {
        self.halt();
        std::mem::take(&mut *self.log.lock().unwrap())
    }

    fn halt(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

impl Drop for Traffic {
    fn drop(&mut self) {
        self.halt();
    }
}

/// `GET /` on `conn` (or a new connection): the status, `X-Backend`, and the connection when
/// it may be reused.
fn exchange(
    conn: Option<TcpStream>,
    addr: SocketAddr,
) -> std::io::Result<(u16, String, Option<TcpStream>)> {
    let mut stream = match conn {
        Some(stream) => stream,
        None => {
            let stream = TcpStream::connect_timeout(&addr, Duration::from_secs(5))?;
            stream.set_read_timeout(Some(Duration::from_secs(10)))?;
            stream.set_write_timeout(Some(Duration::from_secs(10)))?;
            stream.set_nodelay(true)?;
            stream
        }
    };
    stream.write_all(b"GET / HTTP/1.1\r\nHost: fleet.test\r\n\r\n")?;
    let bad = |what: &str| std::io::Error::new(std::io::ErrorKind::InvalidData, what.to_owned());
    let mut buf = Vec::new();
    let mut chunk = [0u8; 4096];
    let head_end = loop {
        if let Some(at) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
            break at + 4;
        }
        if buf.len() > 65_536 {
            return Err(bad("a head over 64 KiB"));
        }
        let n = stream.read(&mut chunk)?;
        if n == 0 {
            return Err(bad("connection closed before the whole answer"));
        }
        buf.extend_from_slice(&chunk[..n]);
    };
    let head = String::from_utf8_lossy(&buf[..head_end]).into_owned();
    let status = head
        .split(' ')
        .nth(1)
        .and_then(|s| s.parse().ok())
        .ok_or_else(|| bad("no status line"))?;
    let header = |name: &str| {
        head.split("\r\n").find_map(|line| {
            let (key, value) = line.split_once(':')?;
            key.eq_ignore_ascii_case(name)
                .then(|| value.trim().to_owned())
        })
    };
    let length: usize = header("content-length")
        .and_then(|v| v.parse().ok())
        .ok_or_else(|| bad("no content-length"))?;
    while buf.len() < head_end + length {
        let n = stream.read(&mut chunk)?;
        if n == 0 {
            return Err(bad("connection closed in the body"));
        }
        buf.extend_from_slice(&chunk[..n]);
    }
    let close = header("connection").is_some_and(|v| v.eq_ignore_ascii_case("close"));
    let backend = header("x-backend").unwrap_or_default();
    Ok((status, backend, (!close).then_some(stream)))
}
