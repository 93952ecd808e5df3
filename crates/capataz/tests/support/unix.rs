//! Unix domain socket peers: an HTTP backend (HTTP/1.1 and h2c, hyper's server) listening on
//! a socket file, optionally reading a PROXY protocol v1 line first on each connection, and
//! an HTTP/1.1 client over a `UnixStream` (hyper's).

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use bytes::Bytes;
use http_body_util::{BodyExt, Empty, Full};
use hyper::service::service_fn;
use hyper_util::rt::{TokioExecutor, TokioIo};
use hyper_util::server::conn::auto;
use tokio::io::AsyncReadExt;
use tokio::net::{UnixListener, UnixStream};
use tokio::task::JoinHandle;

use super::client::Answer;
use super::DEADLINE;

/// An HTTP backend on a Unix socket: answers every request `200` with `X-Backend: <name>`,
/// the request's `X-Forwarded-For` and `Forwarded` in `X-Seen-Forwarded-For` and
/// `X-Seen-Forwarded` ("none" when absent), and the body `<name> <path>`. Dropping it stops accepting (the socket file stays).
pub struct UnixBackend {
    pub path: PathBuf,
    accepted: Arc<AtomicU64>,
    requests: Arc<AtomicU64>,
    headers: Arc<Mutex<Vec<String>>>,
    task: JoinHandle<()>,
}

impl UnixBackend {
    /// Listens on `path` (which must not exist).
    pub fn start(path: &Path, name: &str) -> UnixBackend {
        UnixBackend::listen(path, name, false)
    }

    /// The same, reading a PROXY protocol v1 line first on each connection (kept in
    /// [`UnixBackend::headers`]).
    pub fn start_proxied(path: &Path, name: &str) -> UnixBackend {
        UnixBackend::listen(path, name, true)
    }

    fn listen(path: &Path, name: &str, proxied: bool) -> UnixBackend {
        let listener = UnixListener::bind(path).expect("the backend binds its socket");
        let accepted = Arc::new(AtomicU64::new(0));
        let requests = Arc::new(AtomicU64::new(0));
        let headers = Arc::new(Mutex::new(Vec::new()));
        let name: Arc<str> = name.into();
        let task = tokio::spawn({
            let (accepted, requests, headers) =
                (accepted.clone(), requests.clone(), headers.clone());
            async move {
                while let Ok((stream, _)) = listener.accept().await {
                    accepted.fetch_add(1, Ordering::Relaxed);
                    let (name, requests, headers) =
                        (name.clone(), requests.clone(), headers.clone());
                    tokio::spawn(serve(stream, name, requests, headers, proxied));
                }
            }
        });
        UnixBackend {
            path: path.to_owned(),
            accepted,
            requests,
            headers,
            task,
        }
    }

    /// Connections accepted.
    pub fn accepted(&self) -> u64 {
        self.accepted.load(Ordering::Relaxed)
    }

    /// Requests answered.
    pub fn requests(&self) -> u64 {
        self.requests.load(Ordering::Relaxed)
    }

    /// The PROXY protocol lines read, in order.
    pub fn headers(&self) -> Vec<String> {
        self.headers.lock().unwrap().clone()
    }
}

impl Drop for UnixBackend {
    fn drop(&mut self) {
        self.task.abort();
    }
}

async fn serve(
    mut stream: UnixStream,
    name: Arc<str>,
    requests: Arc<AtomicU64>,
    headers: Arc<Mutex<Vec<String>>>,
    proxied: bool,
) {
    if proxied {
        let mut line = Vec::new();
        while !line.ends_with(b"\r\n") && line.len() < 108 {
            let Ok(byte) = stream.read_u8().await else {
                return;
            };
            line.push(byte);
        }
        headers
            .lock()
            .unwrap()
            .push(String::from_utf8_lossy(&line).into_owned());
    }
    let service = service_fn(move |request: hyper::Request<hyper::body::Incoming>| {
        requests.fetch_add(1, Ordering::Relaxed);
        let body = format!("{name} {}", request.uri().path());
        let name = name.clone();
        // The forwarded fields as they arrived ("none" when absent).
        let seen = |field: &str| {
            request
                .headers()
                .get(field)
                .cloned()
                .unwrap_or(hyper::header::HeaderValue::from_static("none"))
        };
        let (xff, forwarded) = (seen("x-forwarded-for"), seen("forwarded"));
        async move {
            let response = hyper::Response::builder()
                .header("x-backend", &*name)
                .header("x-seen-forwarded-for", xff)
                .header("x-seen-forwarded", forwarded)
                .body(Full::new(Bytes::from(body)))
                .unwrap();
            Ok::<_, std::convert::Infallible>(response)
        }
    });
    let _ = auto::Builder::new(TokioExecutor::new())
        .serve_connection(TokioIo::new(stream), service)
        .await;
}

/// `GET path` over a fresh connection to the Unix socket at `path`.
pub async fn unix_get(socket: &Path, path: &str) -> Answer {
    let mut client = UnixClient::connect(socket).await;
    client.get(path).await
}

/// A keep-alive HTTP/1.1 client connection to a Unix socket listener.
pub struct UnixClient {
    sender: hyper::client::conn::http1::SendRequest<Empty<Bytes>>,
}

impl UnixClient {
    /// Connects to `socket`.
    pub async fn connect(socket: &Path) -> UnixClient {
        let stream = UnixStream::connect(socket)
            .await
            .expect("the listener accepts");
        let (sender, connection) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
            .await
            .expect("a handshake");
        tokio::spawn(connection);
        UnixClient { sender }
    }

    /// `GET path` (Host `app.test`) on the connection.
    pub async fn get(&mut self, path: &str) -> Answer {
        let request = hyper::Request::get(path)
            .header("host", "app.test")
            .body(Empty::new())
            .unwrap();
        let exchange = async {
            let response = self.sender.send_request(request).await.expect("an answer");
            let status = response.status().as_u16();
            let headers = response.headers().clone();
            let backend = headers
                .get("x-backend")
                .and_then(|v| v.to_str().ok())
                .map(str::to_owned);
            let body = response
                .into_body()
                .collect()
                .await
                .expect("a body")
                .to_bytes();
            Answer {
                status,
                backend,
                headers,
                body,
            }
        };
        tokio::time::timeout(DEADLINE, exchange)
            .await
            .expect("an answer within the deadline")
    }
}
