//! The access log: one line per request, per listener, written off the request path.
//!
//! A request's [`AccessRecord`] is filled along the request path (client, method, target,
//! route, pool, backend, attempts) and completed where the request ends: when its response
//! body has gone out (or failed, or the client went away during it), or when the client went
//! away before any answer. Who ended it and in which phase ([`Termination`]) come from the
//! failed attempt's [`AttemptError`] (its `fault()` and `phase()`), never from a second
//! taxonomy.
//!
//! The request path never waits for the log: [`AccessLog::emit`] is a `try_send` on a
//! bounded channel of `buffer` records; when it is full the record is dropped and counted in
//! `capataz_access_log_dropped_total{listener}`. One writer task per log (`writer.rs`)
//! formats the records (`format.rs`) and writes them in batches on tokio's blocking pool.
//! With no access log configured, the request path pays one branch (an `Option` that is
//! `None`).

mod format;
mod writer;

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime};

use prometheus_client::metrics::counter::Counter;
use tokio::sync::{mpsc, Notify};

use crate::upstream::{AttemptError, AttemptPhase, Fault};
use capataz_config::{AccessLogConfig, ListenerConfig};

pub use format::MAX_FIELD;

/// Who ended a request.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum EndedBy {
    /// Nobody: the answer went out whole (`-`).
    Nobody,
    /// The client: it went away (or its request body stalled or was malformed).
    Client,
    /// The backend: it failed (refused, timed out, reset, answered badly), or its answer was
    /// not relayed (a 502-504 with no backend left to retry).
    Backend,
    /// capataz: it answered the request itself (no route, a bad request, no backend
    /// eligible), or could not open a socket.
    Capataz,
    /// A timeout closed a TCP session (its idle or session limit).
    Timeout,
}

impl EndedBy {
    /// The name written in the log.
    pub fn as_str(self) -> &'static str {
        match self {
            EndedBy::Nobody => "-",
            EndedBy::Client => "client",
            EndedBy::Backend => "backend",
            EndedBy::Capataz => "capataz",
            EndedBy::Timeout => "timeout",
        }
    }
}

impl From<Fault> for EndedBy {
    fn from(fault: Fault) -> EndedBy {
        match fault {
            Fault::Client => EndedBy::Client,
            Fault::Backend => EndedBy::Backend,
            Fault::Capataz => EndedBy::Capataz,
        }
    }
}

/// Where a request was when it ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Phase {
    /// Nowhere in particular: the answer went out whole (`-`).
    Done,
    /// Before any backend was tried: reading, checking and routing the request.
    Request,
    /// Waiting in the pool's queue for a backend below its limit.
    Queue,
    /// Connecting to a backend (its TLS handshake included).
    Connect,
    /// Sending the request to the backend (its body included).
    Send,
    /// Waiting for the backend's response head.
    Headers,
    /// Relaying the response body.
    Body,
    /// Relaying a TCP session's bytes.
    Session,
    /// A TCP session that moved no byte for its idle timeout.
    Idle,
    /// Reading a TLS passthrough session's ClientHello, to route it by SNI.
    Inspect,
}

impl Phase {
    /// The name written in the log.
    pub fn as_str(self) -> &'static str {
        match self {
            Phase::Done => "-",
            Phase::Request => "request",
            Phase::Queue => "queue",
            Phase::Connect => "connect",
            Phase::Send => "send",
            Phase::Headers => "headers",
            Phase::Body => "body",
            Phase::Session => "session",
            Phase::Idle => "idle",
            Phase::Inspect => "inspect",
        }
    }
}

impl From<AttemptPhase> for Phase {
    fn from(phase: AttemptPhase) -> Phase {
        match phase {
            AttemptPhase::Connect => Phase::Connect,
            AttemptPhase::Send => Phase::Send,
            AttemptPhase::Head => Phase::Headers,
            AttemptPhase::Body => Phase::Body,
        }
    }
}

/// Who ended a request, and in which phase.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Termination {
    /// Who ended it.
    pub ended_by: EndedBy,
    /// Where it was.
    pub phase: Phase,
}

impl Termination {
    /// The answer went out whole.
    pub(crate) const COMPLETE: Termination = Termination {
        ended_by: EndedBy::Nobody,
        phase: Phase::Done,
    };

    /// capataz answered the request itself before trying any backend.
    pub const REFUSED: Termination = Termination {
        ended_by: EndedBy::Capataz,
        phase: Phase::Request,
    };

    /// An attempt that failed with `error`: its fault and phase.
    pub fn of(error: AttemptError) -> Termination {
        Termination {
            ended_by: error.fault().into(),
            phase: error.phase().into(),
        }
    }

    /// The client went away in `phase`.
    pub fn client_gone(phase: Phase) -> Termination {
        Termination {
            ended_by: EndedBy::Client,
            phase,
        }
    }
}

/// One request, as the access log writes it. Filled along the request path; the strings a
/// client controls are bounded to [`MAX_FIELD`] bytes when taken (and marked truncated).
#[derive(Clone, Debug)]
pub struct AccessRecord {
    /// When the request's head was received (wall clock, for the timestamp).
    pub time: SystemTime,
    /// When the request's head was received (for the duration).
    pub started: Instant,
    /// From the head to the end of the answer (or to the client going away).
    pub duration: Duration,
    /// The client's address.
    pub client: SocketAddr,
    /// The request method.
    pub method: String,
    /// The request target as received (origin-form path and query, or absolute-form).
    pub target: String,
    /// `HTTP/1.0`, `HTTP/1.1`, `HTTP/2.0` or `HTTP/3.0`.
    pub protocol: &'static str,
    /// The `Referer` header, if any.
    pub referer: Option<String>,
    /// The `User-Agent` header, if any.
    pub user_agent: Option<String>,
    /// The TLS version, on a TLS listener.
    pub tls_version: Option<&'static str>,
    /// The server name the client asked for by SNI.
    pub sni: Option<String>,
    /// Whether a field was cut at [`MAX_FIELD`] bytes.
    pub truncated: bool,
    /// The status sent; `None` if the client went away before any answer.
    pub status: Option<u16>,
    /// Response body bytes handed to the client's connection (a TCP session: bytes written to
    /// the client).
    pub bytes: u64,
    /// A TCP session's bytes read from the client; `None` for a request.
    pub bytes_in: Option<u64>,
    /// The route taken (its host and path prefix), if any.
    pub route: Option<String>,
    /// The route's pool.
    pub pool: Option<Arc<str>>,
    /// The backend that answered, or the last one tried.
    pub backend: Option<Arc<str>>,
    /// Backends tried (first attempt plus retries).
    pub attempts: u32,
    /// Who ended the request, and where.
    pub termination: Termination,
    /// How long it waited in its pool's queue for a backend below its limit (`None`: it did
    /// not wait; HAProxy's `Tw`).
    pub queued: Option<Duration>,
    /// Why capataz refused it, when a rule of its own did (`rate_limited`); `None` otherwise.
    pub reason: Option<&'static str>,
    /// The request's id, on a listener with `request_id`.
    pub request_id: Option<String>,
    /// How its backend stands to the one its pool's affinity named (`kept`, `moved:REASON`,
    /// `new`, `unknown`, `no_key`; `-` when no backend served), on a pool that hashes or is
    /// sticky; `None` on the others (the field is then left out).
    pub affinity: Option<&'static str>,
}

impl AccessRecord {
    /// A record of a request from `client` with this head, received now.
    pub fn start(
        client: SocketAddr,
        method: &http::Method,
        uri: &http::Uri,
        version: http::Version,
        headers: &http::HeaderMap,
    ) -> AccessRecord {
        let mut truncated = false;
        let mut bounded = |text: &str| {
            let (text, cut) = format::bounded(text);
            truncated |= cut;
            text
        };
        let method = bounded(method.as_str());
        // An HTTP/2 or HTTP/3 request's URI carries the scheme and authority (`:scheme`, `:authority`):
        // its target is the path, as an HTTP/1.1 client would have written it.
        let target = match (version, uri.path_and_query()) {
            (http::Version::HTTP_2 | http::Version::HTTP_3, Some(path)) => bounded(path.as_str()),
            _ => bounded(&uri.to_string()),
        };
        let mut header = |name: http::header::HeaderName| {
            headers
                .get(name)
                .map(|value| bounded(&String::from_utf8_lossy(value.as_bytes())))
        };
        let referer = header(http::header::REFERER);
        let user_agent = header(http::header::USER_AGENT);
        AccessRecord {
            time: SystemTime::now(),
            started: Instant::now(),
            duration: Duration::ZERO,
            client,
            method,
            target,
            protocol: match version {
                http::Version::HTTP_09 => "HTTP/0.9",
                http::Version::HTTP_10 => "HTTP/1.0",
                http::Version::HTTP_2 => "HTTP/2.0",
                http::Version::HTTP_3 => "HTTP/3.0",
                _ => "HTTP/1.1",
            },
            referer,
            user_agent,
            tls_version: None,
            sni: None,
            truncated,
            status: None,
            bytes: 0,
            bytes_in: None,
            route: None,
            pool: None,
            backend: None,
            attempts: 0,
            termination: Termination::client_gone(Phase::Request),
            queued: None,
            reason: None,
            request_id: None,
            affinity: None,
        }
    }

    /// A record of a TCP session from `client` to pool `pool`, starting now: method and target
    /// `-`, protocol `TCP`, no status.
    pub fn session(client: SocketAddr, pool: Arc<str>) -> AccessRecord {
        AccessRecord {
            time: SystemTime::now(),
            started: Instant::now(),
            duration: Duration::ZERO,
            client,
            method: "-".into(),
            target: "-".into(),
            protocol: "TCP",
            referer: None,
            user_agent: None,
            tls_version: None,
            sni: None,
            truncated: false,
            status: None,
            bytes: 0,
            bytes_in: Some(0),
            route: None,
            pool: Some(pool),
            backend: None,
            attempts: 0,
            termination: Termination::client_gone(Phase::Connect),
            queued: None,
            reason: None,
            request_id: None,
            affinity: None,
        }
    }

    /// Notes the request's id (a valid field value: visible ASCII, or capataz's own).
    pub fn set_request_id(&mut self, id: &http::HeaderValue) {
        let (id, cut) = format::bounded(&String::from_utf8_lossy(id.as_bytes()));
        self.truncated |= cut;
        self.request_id = Some(id);
    }

    /// Notes the TLS session the request came over.
    pub fn set_tls(&mut self, version: &'static str, sni: Option<&str>) {
        self.tls_version = Some(version);
        self.sni = sni.map(|sni| {
            let (sni, cut) = format::bounded(sni);
            self.truncated |= cut;
            sni
        });
    }
}

/// How far a log's writer has got: records handed to it against records it has finished
/// with (written, or dropped by a failed write), and whether it has stopped.
#[derive(Debug, Default)]
pub(crate) struct Progress {
    /// Records handed to the writer's channel.
    emitted: AtomicU64,
    /// Records the writer has finished with.
    done: AtomicU64,
    /// Whether the writer has stopped (its channel closed and drained, or the runtime ending).
    stopped: AtomicBool,
}

impl Progress {
    /// Whether every record handed to the writer so far is finished with.
    fn caught_up(&self) -> bool {
        self.stopped.load(Ordering::Acquire)
            || self.done.load(Ordering::Acquire) >= self.emitted.load(Ordering::Acquire)
    }
}

/// One listener's access log: the sending side of its writer's channel.
#[derive(Debug)]
pub struct AccessLog {
    config: AccessLogConfig,
    tx: mpsc::Sender<Box<AccessRecord>>,
    dropped: Counter,
    reopen: Arc<Notify>,
    progress: Arc<Progress>,
}

impl AccessLog {
    /// Starts the writer of a log configured as `config` for listener `listener` (on the
    /// current runtime), counting dropped records in `dropped`.
    pub fn start(config: &AccessLogConfig, listener: &str, dropped: Counter) -> AccessLog {
        let (tx, rx) = mpsc::channel(config.buffer);
        let reopen = Arc::new(Notify::new());
        let progress = Arc::new(Progress::default());
        tokio::spawn(writer::run(
            rx,
            config.clone(),
            listener.into(),
            dropped.clone(),
            reopen.clone(),
            progress.clone(),
        ));
        AccessLog {
            config: config.clone(),
            tx,
            dropped,
            reopen,
            progress,
        }
    }

    /// Hands `record` to the writer, finished: its duration set from its start. Never waits:
    /// with the buffer full (or the writer gone) the record is dropped and counted.
    pub fn emit(&self, mut record: Box<AccessRecord>) {
        record.duration = record.started.elapsed();
        if self.tx.try_send(record).is_ok() {
            self.progress.emitted.fetch_add(1, Ordering::AcqRel);
        } else {
            self.dropped.inc();
        }
    }

    /// Asks the writer to reopen its file (after a rotation) before its next write.
    pub(crate) fn reopen(&self) {
        self.reopen.notify_one();
    }
}

/// The access logs of the running listeners, by listener name, kept across reloads: a
/// listener whose log settings did not change keeps its log (and the records waiting in it),
/// which reopens its file; one whose settings changed gets a new log, and the old one writes
/// what it holds and stops once the last request holding it has ended.
#[derive(Debug, Default)]
pub struct AccessLogs {
    by_listener: Mutex<HashMap<String, Arc<AccessLog>>>,
    /// The progress of every writer started and not yet stopped, replaced logs included, for
    /// [`AccessLogs::flush`].
    writers: Mutex<Vec<Arc<Progress>>>,
}

impl AccessLogs {
    /// The log of `listener` as configured (none if it has none), starting one if needed,
    /// counting dropped records in `dropped` (called only when one is started). A log kept
    /// from before (a reload) reopens its file.
    pub fn for_listener(
        &self,
        listener: &ListenerConfig,
        dropped: impl FnOnce() -> Counter,
    ) -> Option<Arc<AccessLog>> {
        let mut logs = self.by_listener.lock().unwrap_or_else(|e| e.into_inner());
        let Some(config) = &listener.access_log else {
            logs.remove(&listener.name);
            return None;
        };
        if let Some(log) = logs.get(&listener.name) {
            if log.config == *config {
                log.reopen();
                return Some(log.clone());
            }
        }
        let log = Arc::new(AccessLog::start(config, &listener.name, dropped()));
        let mut writers = self.writers.lock().unwrap_or_else(|e| e.into_inner());
        writers.retain(|progress| !progress.stopped.load(Ordering::Acquire));
        writers.push(log.progress.clone());
        logs.insert(listener.name.clone(), log.clone());
        Some(log)
    }

    /// Waits, until `deadline` at the latest, for every log's writer to have written the
    /// records handed to it so far (at shutdown, once the connections are closed, so that no
    /// line of a served request is lost); whether they all did.
    pub async fn flush(&self, deadline: tokio::time::Instant) -> bool {
        loop {
            let caught_up = {
                let writers = self.writers.lock().unwrap_or_else(|e| e.into_inner());
                writers.iter().all(|progress| progress.caught_up())
            };
            if caught_up {
                return true;
            }
            if tokio::time::Instant::now() >= deadline {
                return false;
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    }

    /// Forgets the logs of listeners not in `names` (removed by a reload).
    pub fn retain(&self, names: &[&str]) {
        let mut logs = self.by_listener.lock().unwrap_or_else(|e| e.into_inner());
        logs.retain(|name, _| names.contains(&name.as_str()));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn termination_comes_from_the_attempts_fault_and_phase() {
        let t = Termination::of(AttemptError::HeadTimeout);
        assert_eq!((t.ended_by, t.phase), (EndedBy::Backend, Phase::Headers));
        let t = Termination::of(AttemptError::ClientBodyStalled);
        assert_eq!((t.ended_by, t.phase), (EndedBy::Client, Phase::Send));
        let t = Termination::of(AttemptError::ConnectLocal);
        assert_eq!((t.ended_by, t.phase), (EndedBy::Capataz, Phase::Connect));
        let t = Termination::of(AttemptError::BodyBroken);
        assert_eq!((t.ended_by, t.phase), (EndedBy::Backend, Phase::Body));
    }

    #[test]
    fn client_controlled_fields_are_bounded_when_taken() {
        let long = format!("/{}", "a".repeat(10_000));
        let uri: http::Uri = long.parse().unwrap();
        let record = AccessRecord::start(
            "127.0.0.1:1".parse().unwrap(),
            &http::Method::GET,
            &uri,
            http::Version::HTTP_11,
            &http::HeaderMap::new(),
        );
        assert!(record.truncated);
        assert!(record.target.len() <= MAX_FIELD);
    }
}
