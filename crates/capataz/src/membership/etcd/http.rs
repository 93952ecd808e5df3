//! HTTP/1.1 to one etcd endpoint's JSON gateway: a request with a bounded answer
//! ([`call`]), and a watch whose answer is a stream of JSON lines ([`Watch`]). One connection
//! per request (a watch holds its own for as long as it runs); every step within a deadline.

use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, Full, Limited};
use hyper::body::Incoming;
use hyper_util::rt::TokioIo;
use tokio::net::TcpStream;
use tokio::task::JoinHandle;
use tokio::time::timeout;

use crate::config::EtcdEndpoint;

/// The largest answer to a request (a range of up to `MAX_MEMBERS` keys of `MAX_VALUE`
/// bytes, in base64, fits).
pub(super) const MAX_ANSWER: usize = 64 << 20;

/// The longest line of a watch stream (one watch response, with its events).
pub(super) const MAX_LINE: usize = 32 << 20;

/// A connection's request sender, its driver task aborted on drop.
struct Connection {
    sender: hyper::client::conn::http1::SendRequest<Full<Bytes>>,
    driver: JoinHandle<()>,
}

impl Drop for Connection {
    fn drop(&mut self) {
        self.driver.abort();
    }
}

/// Connects to `endpoint` (its name resolved on the blocking pool, by tokio) within
/// `deadline`.
async fn connect(endpoint: &EtcdEndpoint, deadline: Duration) -> Result<Connection, String> {
    let attempt = async {
        let addresses = tokio::net::lookup_host((endpoint.host.as_str(), endpoint.port))
            .await
            .map_err(|e| format!("cannot resolve {}: {e}", endpoint.url))?;
        let mut last = format!("{} has no address", endpoint.url);
        for address in addresses.take(8) {
            match TcpStream::connect(address).await {
                Ok(stream) => {
                    let _ = stream.set_nodelay(true);
                    let (sender, connection) =
                        hyper::client::conn::http1::handshake(TokioIo::new(stream))
                            .await
                            .map_err(|e| format!("{}: {e}", endpoint.url))?;
                    let driver = tokio::spawn(async move {
                        let _ = connection.await;
                    });
                    return Ok(Connection { sender, driver });
                }
                Err(e) => last = format!("cannot connect to {} ({address}): {e}", endpoint.url),
            }
        }
        Err(last)
    };
    timeout(deadline, attempt)
        .await
        .map_err(|_| format!("connecting to {} timed out", endpoint.url))?
}

/// Sends `body` to `path` and returns the head's status and the body (the connection stays
/// with the body).
async fn send(
    connection: &mut Connection,
    endpoint: &EtcdEndpoint,
    path: &str,
    body: String,
) -> Result<Incoming, String> {
    let request = hyper::Request::post(path)
        .header(
            hyper::header::HOST,
            format!("{}:{}", endpoint.host, endpoint.port),
        )
        .header(hyper::header::CONTENT_TYPE, "application/json")
        .body(Full::new(Bytes::from(body)))
        .map_err(|e| format!("building a request to {}: {e}", endpoint.url))?;
    let response = connection
        .sender
        .send_request(request)
        .await
        .map_err(|e| format!("{}{path}: {e}", endpoint.url))?;
    let (parts, body) = response.into_parts();
    if parts.status != hyper::StatusCode::OK {
        let text = Limited::new(body, 4096)
            .collect()
            .await
            .map(|b| b.to_bytes())
            .unwrap_or_default();
        let message = serde_json::from_slice::<serde_json::Value>(&text)
            .ok()
            .and_then(|v| v.get("message").and_then(|m| m.as_str()).map(str::to_owned))
            .unwrap_or_else(|| String::from_utf8_lossy(&text).chars().take(200).collect());
        return Err(format!(
            "{}{path} answered {}: {message}",
            endpoint.url, parts.status
        ));
    }
    Ok(body)
}

/// One request to `endpoint`: its whole answer (at most [`MAX_ANSWER`] bytes), within
/// `deadline` from connecting to the last byte.
pub(super) async fn call(
    endpoint: &EtcdEndpoint,
    path: &str,
    body: String,
    deadline: Duration,
) -> Result<Bytes, String> {
    let exchange = async {
        let mut connection = connect(endpoint, deadline).await?;
        let body = send(&mut connection, endpoint, path, body).await?;
        Limited::new(body, MAX_ANSWER)
            .collect()
            .await
            .map(|b| b.to_bytes())
            .map_err(|e| format!("reading {}{path}: {e}", endpoint.url))
    };
    timeout(deadline, exchange)
        .await
        .map_err(|_| format!("{}{path} timed out after {deadline:?}", endpoint.url))?
}

/// A running watch: the stream of its answer, line by line.
pub(super) struct Watch {
    body: Incoming,
    buffer: Vec<u8>,
    /// Where the lines not taken yet start in `buffer`.
    start: usize,
    /// How much of `buffer` is known to hold no newline (each byte is looked at once).
    scanned: usize,
    _connection: Connection,
}

impl std::fmt::Debug for Watch {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Watch")
            .field("buffered", &self.buffer.len())
            .finish_non_exhaustive()
    }
}

impl Watch {
    /// Opens a watch on `endpoint` with `request` (connecting and the answer's head within
    /// `deadline`).
    pub(super) async fn open(
        endpoint: &EtcdEndpoint,
        request: String,
        deadline: Duration,
    ) -> Result<Watch, String> {
        let open = async {
            let mut connection = connect(endpoint, deadline).await?;
            let body = send(&mut connection, endpoint, "/v3/watch", request).await?;
            Ok(Watch {
                body,
                buffer: Vec::new(),
                start: 0,
                scanned: 0,
                _connection: connection,
            })
        };
        timeout(deadline, open)
            .await
            .map_err(|_| format!("opening a watch on {} timed out", endpoint.url))?
    }

    /// A whole line already received, if any (without waiting).
    pub(super) fn buffered_line(&mut self) -> Option<Vec<u8>> {
        let from = self.scanned.max(self.start);
        let Some(found) = self.buffer[from..].iter().position(|b| *b == b'\n') else {
            self.scanned = self.buffer.len();
            return None;
        };
        let end = from + found;
        let line = self.buffer[self.start..end].to_vec();
        self.start = end + 1;
        self.scanned = self.start;
        Some(line)
    }

    /// The next line; an error when the stream ends, fails, or sends a line longer than
    /// [`MAX_LINE`]. Cancel-safe: what was read stays buffered.
    pub(super) async fn next_line(&mut self) -> Result<Vec<u8>, String> {
        loop {
            if let Some(line) = self.buffered_line() {
                return Ok(line);
            }
            if self.buffer.len() - self.start > MAX_LINE {
                return Err(format!(
                    "the watch sent a line longer than {MAX_LINE} bytes"
                ));
            }
            // What was taken goes before more is read (each byte is moved at most once more).
            self.buffer.drain(..self.start);
            self.scanned -= self.start;
            self.start = 0;
            match self.body.frame().await {
                None => return Err("the watch stream ended".into()),
                Some(Err(e)) => return Err(format!("the watch stream failed: {e}")),
                Some(Ok(frame)) => {
                    if let Some(data) = frame.data_ref() {
                        self.buffer.extend_from_slice(data);
                    }
                }
            }
        }
    }
}
