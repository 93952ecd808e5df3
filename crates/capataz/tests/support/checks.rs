//! Backends for the health-check tests: an HTTP backend whose health answer (status, body,
//! header fields) can be switched while it runs and which logs every probe it answers, and an
//! agent that answers each connection with the line it is told to (or fails as told).

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};

use tokio::io::AsyncWriteExt;
use tokio::time::Instant;

use super::raw::{read_head, RawBackend};

/// What the health route answers.
#[derive(Clone, Debug)]
pub struct HealthAnswer {
    /// The status code.
    pub status: u16,
    /// Extra header fields.
    pub headers: Vec<(String, String)>,
    /// The body (sent with `Content-Length`).
    pub body: String,
}

impl HealthAnswer {
    /// `status` with `body` and no extra field.
    pub fn new(status: u16, body: &str) -> HealthAnswer {
        HealthAnswer {
            status,
            headers: Vec::new(),
            body: body.to_owned(),
        }
    }
}

/// An HTTP backend: `GET /healthz` (any method) gets the current [`HealthAnswer`] and is
/// logged with its time and status; any other path gets `200` with the backend's name. Every
/// answer closes its connection.
pub struct HealthBackend {
    /// Its address.
    pub addr: SocketAddr,
    answer: Arc<Mutex<HealthAnswer>>,
    log: Arc<Mutex<Vec<(Instant, u16)>>>,
    _raw: RawBackend,
}

impl HealthBackend {
    /// A backend named `name` answering its health route with `answer`.
    pub async fn start(name: &str, answer: HealthAnswer) -> HealthBackend {
        let answer = Arc::new(Mutex::new(answer));
        let log = Arc::new(Mutex::new(Vec::new()));
        let (shared, probes, name) = (answer.clone(), log.clone(), name.to_owned());
        let raw = RawBackend::serving(move |mut stream| {
            let (shared, probes, name) = (shared.clone(), probes.clone(), name.clone());
            async move {
                let mut buf = Vec::new();
                let Some(head) = read_head(&mut stream, &mut buf).await else {
                    return;
                };
                let path = head.split(' ').nth(1).unwrap_or("");
                let reply = if path == "/healthz" {
                    let answer = shared.lock().unwrap().clone();
                    probes.lock().unwrap().push((Instant::now(), answer.status));
                    let mut text = format!("HTTP/1.1 {} X\r\n", answer.status);
                    for (field, value) in &answer.headers {
                        text.push_str(&format!("{field}: {value}\r\n"));
                    }
                    text.push_str(&format!(
                        "Content-Length: {}\r\nConnection: close\r\n\r\n{}",
                        answer.body.len(),
                        answer.body
                    ));
                    text
                } else {
                    format!(
                        "HTTP/1.1 200 OK\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{name}",
                        name.len()
                    )
                };
                let _ = stream.write_all(reply.as_bytes()).await;
            }
        })
        .await;
        HealthBackend {
            addr: raw.addr,
            answer,
            log,
            _raw: raw,
        }
    }

    /// Switches the health route's answer.
    pub fn answer(&self, answer: HealthAnswer) {
        *self.answer.lock().unwrap() = answer;
    }

    /// The probes answered so far: when, and with which status.
    pub fn probes(&self) -> Vec<(Instant, u16)> {
        self.log.lock().unwrap().clone()
    }
}

/// An agent: each connection gets the current line and is closed; `None` closes it at once
/// without a word (a failed exchange).
pub struct AgentBackend {
    /// Its address.
    pub addr: SocketAddr,
    line: Arc<Mutex<Option<Vec<u8>>>>,
    raw: RawBackend,
}

impl AgentBackend {
    /// An agent answering `line` (with its line ending, if any).
    pub async fn start(line: &str) -> AgentBackend {
        let line = Arc::new(Mutex::new(Some(line.as_bytes().to_vec())));
        let shared = line.clone();
        let raw = RawBackend::serving(move |mut stream| {
            let shared = shared.clone();
            async move {
                let bytes = shared.lock().unwrap().clone();
                if let Some(bytes) = bytes {
                    let _ = stream.write_all(&bytes).await;
                }
            }
        })
        .await;
        AgentBackend {
            addr: raw.addr,
            line,
            raw,
        }
    }

    /// Switches the answer (`None`: close without a word).
    pub fn say(&self, line: Option<&str>) {
        *self.line.lock().unwrap() = line.map(|l| l.as_bytes().to_vec());
    }

    /// Connections answered so far.
    pub fn asked(&self) -> u64 {
        self.raw.closed()
    }
}
