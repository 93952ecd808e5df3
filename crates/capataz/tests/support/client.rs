//! HTTP/1.1 clients: a keep-alive one for a balancer's listener, and one-shot exchanges for
//! the admin API.

use std::net::SocketAddr;

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::client::conn::http1;
use hyper_util::rt::TokioIo;
use serde_json::Value;
use tokio::net::TcpStream;

use super::DEADLINE;

/// An answer: status, headers (and the backend that sent it, from `X-Backend`), and body.
#[derive(Debug)]
pub struct Answer {
    pub status: u16,
    pub backend: Option<String>,
    pub headers: http::HeaderMap,
    pub body: Bytes,
}

impl Answer {
    fn read_head(response: &http::Response<hyper::body::Incoming>) -> (u16, Option<String>) {
        let backend = response
            .headers()
            .get("x-backend")
            .and_then(|v| v.to_str().ok())
            .map(str::to_owned);
        (response.status().as_u16(), backend)
    }

    /// The body as JSON (`Null` when it is not JSON).
    pub fn json(&self) -> Value {
        serde_json::from_slice(&self.body).unwrap_or(Value::Null)
    }

    /// The body as text.
    pub fn text(&self) -> String {
        String::from_utf8_lossy(&self.body).into_owned()
    }

    /// The `Content-Type`, empty when there is none.
    pub fn content_type(&self) -> &str {
        self.headers
            .get(http::header::CONTENT_TYPE)
            .and_then(|v| v.to_str().ok())
            .unwrap_or_default()
    }
}

/// A keep-alive HTTP/1.1 client for one address.
///
/// A tolerant client ([`Client::new`]) opens a new connection when the balancer closed the
/// last one, and sends a request again once when a connection fails it (as any client does);
/// a strict one ([`Client::strict`]) panics instead, for tests about connections themselves.
pub struct Client {
    addr: SocketAddr,
    sender: Option<http1::SendRequest<Full<Bytes>>>,
    strict: bool,
    /// Connections opened so far.
    pub connects: usize,
}

impl Client {
    /// A tolerant client.
    pub fn new(addr: SocketAddr) -> Client {
        Client {
            addr,
            sender: None,
            strict: false,
            connects: 0,
        }
    }

    /// A strict client.
    pub fn strict(addr: SocketAddr) -> Client {
        Client {
            strict: true,
            ..Client::new(addr)
        }
    }

    /// `GET path` with `Host: app.test`.
    pub async fn get(&mut self, path: &str) -> Answer {
        self.send("GET", path, "app.test", Bytes::new()).await
    }

    /// `method path` with `Host: host` and `body`.
    pub async fn send(&mut self, method: &str, path: &str, host: &str, body: Bytes) -> Answer {
        let request = http::Request::builder()
            .method(method)
            .uri(path)
            .header("host", host)
            .body(body)
            .expect("a valid request");
        self.request(request).await
    }

    /// Sends `request` and reads its whole answer, failing after [`DEADLINE`].
    pub async fn request(&mut self, request: http::Request<Bytes>) -> Answer {
        let tries = if self.strict { 1 } else { 2 };
        for _ in 0..tries {
            if self.sender.as_ref().is_none_or(|s| s.is_closed()) {
                let stream = TcpStream::connect(self.addr).await.expect("connect");
                let (sender, conn) = http1::handshake(TokioIo::new(stream))
                    .await
                    .expect("handshake");
                tokio::spawn(conn);
                self.sender = Some(sender);
                self.connects += 1;
            }
            let Some(sender) = self.sender.as_mut() else {
                unreachable!("connected above")
            };
            if let Err(error) = sender.ready().await {
                assert!(!self.strict, "connection not ready: {error}");
                self.sender = None;
                continue;
            }
            let mut copy = http::Request::new(Full::new(request.body().clone()));
            *copy.method_mut() = request.method().clone();
            *copy.uri_mut() = request.uri().clone();
            *copy.headers_mut() = request.headers().clone();
            let response = match tokio::time::timeout(DEADLINE, sender.send_request(copy)).await {
                Err(_) => panic!("no answer within {DEADLINE:?}"),
                Ok(Err(error)) => {
                    assert!(!self.strict, "no answer: {error}");
                    self.sender = None;
                    continue;
                }
                Ok(Ok(response)) => response,
            };
            let (status, backend) = Answer::read_head(&response);
            let headers = response.headers().clone();
            let body = tokio::time::timeout(DEADLINE, response.into_body().collect())
                .await
                .expect("body within the deadline");
            let body = match body {
                Ok(body) => body.to_bytes(),
                Err(error) => {
                    assert!(!self.strict, "not a whole body: {error}");
                    Bytes::new()
                }
            };
            return Answer {
                status,
                backend,
                headers,
                body,
            };
        }
        panic!("the balancer closed two connections in a row");
    }
}

/// One request on a fresh connection, with `headers` besides `Host`, failing after
/// [`DEADLINE`].
pub async fn exchange(
    addr: SocketAddr,
    method: &str,
    path: &str,
    host: &str,
    headers: &[(&str, &str)],
) -> Answer {
    let stream = TcpStream::connect(addr).await.expect("connect");
    let (mut sender, conn) = http1::handshake(TokioIo::new(stream))
        .await
        .expect("handshake");
    tokio::spawn(conn);
    let mut request = http::Request::builder()
        .method(method)
        .uri(path)
        .header("host", host);
    for (name, value) in headers {
        request = request.header(*name, *value);
    }
    let request = request
        .body(Full::new(Bytes::new()))
        .expect("a valid request");
    let response = tokio::time::timeout(DEADLINE, sender.send_request(request))
        .await
        .unwrap_or_else(|_| panic!("no answer to {method} {path} within {DEADLINE:?}"))
        .expect("a response");
    let (status, backend) = Answer::read_head(&response);
    let headers = response.headers().clone();
    let body = tokio::time::timeout(DEADLINE, response.into_body().collect())
        .await
        .expect("body within the deadline")
        .expect("a whole body")
        .to_bytes();
    Answer {
        status,
        backend,
        headers,
        body,
    }
}
