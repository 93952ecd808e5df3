//! A backend that expects a PROXY protocol header first on every connection (as a backend of a
//! pool with `send_proxy_protocol` does), records each connection's header bytes, and answers
//! HTTP/1.1 requests on it with `200 ok`, keep-alive. A connection that does not start with a
//! valid header is recorded with what arrived, and closed. [`ProxiedBackend::start_tls`]
//! speaks TLS after the header, as a backend of a TLS pool with the option does.

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};

use bytes::Bytes;
use capataz_proxy_protocol::{parse, Parsed, Rewind, MAX_HEADER};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::task::JoinHandle;

/// One connection as the backend saw it.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Seen {
    /// The header's bytes exactly (or all that arrived, if it was not a valid one).
    pub header: Vec<u8>,
    /// Whether it was a valid header.
    pub valid: bool,
    /// The request targets served on the connection, in order.
    pub requests: Vec<String>,
}

/// The backend; dropping it stops it.
pub struct ProxiedBackend {
    pub addr: SocketAddr,
    seen: Arc<Mutex<Vec<Seen>>>,
    task: JoinHandle<()>,
}

impl Drop for ProxiedBackend {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl ProxiedBackend {
    pub async fn start() -> ProxiedBackend {
        ProxiedBackend::serving(None).await
    }

    /// The same, with TLS by `config` after the header.
    pub async fn start_tls(config: Arc<rustls::ServerConfig>) -> ProxiedBackend {
        ProxiedBackend::serving(Some(config)).await
    }

    async fn serving(tls: Option<Arc<rustls::ServerConfig>>) -> ProxiedBackend {
        let listener = TcpListener::bind(super::any()).await.unwrap();
        let addr = listener.local_addr().unwrap();
        let seen = Arc::new(Mutex::new(Vec::new()));
        let record = seen.clone();
        let task = tokio::spawn(async move {
            while let Ok((stream, _)) = listener.accept().await {
                let record = record.clone();
                tokio::spawn(serve(stream, record, tls.clone()));
            }
        });
        ProxiedBackend { addr, seen, task }
    }

    /// Every connection so far, in the order they were accepted.
    pub fn seen(&self) -> Vec<Seen> {
        self.seen.lock().unwrap().clone()
    }

    /// The connections that carried at least one request other than `/healthz`.
    pub fn traffic(&self) -> Vec<Seen> {
        self.seen()
            .into_iter()
            .filter(|s| s.requests.iter().any(|r| r != "/healthz"))
            .collect()
    }
}

async fn serve(
    mut stream: TcpStream,
    record: Arc<Mutex<Vec<Seen>>>,
    tls: Option<Arc<rustls::ServerConfig>>,
) {
    let index = {
        let mut all = record.lock().unwrap();
        all.push(Seen::default());
        all.len() - 1
    };
    let update = |f: &mut dyn FnMut(&mut Seen)| f(&mut record.lock().unwrap()[index]);
    let mut buf = Vec::new();
    let mut chunk = [0u8; 4096];
    // The header.
    let length = loop {
        match parse(&buf) {
            Ok(Parsed::Header(header)) => break header.length,
            Ok(Parsed::Incomplete) if buf.len() < MAX_HEADER => {}
            _ => {
                update(&mut |s| s.header = buf.clone());
                return;
            }
        }
        match stream.read(&mut chunk).await {
            Ok(0) | Err(_) => {
                update(&mut |s| s.header = buf.clone());
                return;
            }
            Ok(n) => buf.extend_from_slice(&chunk[..n]),
        }
    };
    let header = buf[..length].to_vec();
    update(&mut |s| {
        s.header = header.clone();
        s.valid = true;
    });
    buf.drain(..length);
    let rest = Rewind::new(Bytes::from(std::mem::take(&mut buf)), stream);
    match tls {
        None => requests(rest, Vec::new(), index, &record).await,
        Some(config) => {
            let Ok(stream) = tokio_rustls::TlsAcceptor::from(config).accept(rest).await else {
                return;
            };
            requests(stream, Vec::new(), index, &record).await
        }
    }
}

/// Requests without bodies on `stream`, answered in turn.
async fn requests<S: AsyncRead + AsyncWrite + Unpin>(
    mut stream: S,
    mut buf: Vec<u8>,
    index: usize,
    record: &Mutex<Vec<Seen>>,
) {
    let update = |f: &mut dyn FnMut(&mut Seen)| f(&mut record.lock().unwrap()[index]);
    let mut chunk = [0u8; 4096];
    loop {
        while let Some(end) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
            let head = String::from_utf8_lossy(&buf[..end]).into_owned();
            buf.drain(..end + 4);
            let target = head.split(' ').nth(1).unwrap_or("").to_owned();
            let close = head.to_ascii_lowercase().contains("connection: close");
            update(&mut |s| s.requests.push(target.clone()));
            let answer = b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok";
            if stream.write_all(answer).await.is_err() || close {
                return;
            }
        }
        match stream.read(&mut chunk).await {
            Ok(0) | Err(_) => return,
            Ok(n) => buf.extend_from_slice(&chunk[..n]),
        }
    }
}
