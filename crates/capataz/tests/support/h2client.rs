//! A well-behaved HTTP/2 client: hyper's, over TCP with prior knowledge (h2c).

use std::convert::Infallible;
use std::net::SocketAddr;

use bytes::Bytes;
use http::{HeaderMap, Method, Request, StatusCode};
use http_body_util::combinators::UnsyncBoxBody;
use http_body_util::{BodyExt, Empty, Full};
use hyper::client::conn::http2::{self, SendRequest};
use hyper_util::rt::{TokioExecutor, TokioIo};
use std::pin::Pin;
use std::task::{Context, Poll};

use hyper::body::Frame;
use tokio::net::TcpStream;
use tokio::sync::mpsc;
use tokio::task::JoinHandle;

use super::DEADLINE;

/// A request body: whole, or streamed from a [`http_body_util::channel::Sender`].
pub type H2Body = UnsyncBoxBody<Bytes, Infallible>;

/// One HTTP/2 connection; requests are streams on it (`SendRequest` is cheap to clone).
pub struct H2Conn {
    pub sender: SendRequest<H2Body>,
    /// The connection's task: it ends when the connection does.
    pub conn: JoinHandle<Result<(), hyper::Error>>,
}

/// An answer read whole.
#[derive(Debug)]
pub struct H2Answer {
    pub status: StatusCode,
    pub headers: HeaderMap,
    pub body: Bytes,
}

impl H2Answer {
    /// The body as text.
    pub fn text(&self) -> String {
        String::from_utf8_lossy(&self.body).into_owned()
    }

    /// A header's value as text.
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers.get(name).and_then(|v| v.to_str().ok())
    }
}

/// Opens an h2c connection to `addr`.
pub async fn connect(addr: SocketAddr) -> H2Conn {
    let stream = TcpStream::connect(addr).await.expect("connect");
    let _ = stream.set_nodelay(true);
    let (sender, conn) = http2::handshake(TokioExecutor::new(), TokioIo::new(stream))
        .await
        .expect("HTTP/2 handshake");
    H2Conn {
        sender,
        conn: tokio::spawn(conn),
    }
}

/// A request for `http://{authority}{path}` with `body`.
pub fn request(method: Method, authority: &str, path: &str, body: H2Body) -> Request<H2Body> {
    Request::builder()
        .method(method)
        .uri(format!("http://{authority}{path}"))
        .body(body)
        .expect("a valid request")
}

/// No body.
pub fn empty() -> H2Body {
    Empty::new().boxed_unsync()
}

/// `bytes` as a whole body.
pub fn full(bytes: impl Into<Bytes>) -> H2Body {
    Full::new(bytes.into()).boxed_unsync()
}

/// A body streamed through the returned sender; it ends when the sender is dropped.
pub fn channel() -> (mpsc::Sender<Bytes>, H2Body) {
    let (sender, receiver) = mpsc::channel(4);
    (sender, ChannelBody(receiver).boxed_unsync())
}

/// The body behind [`channel`].
struct ChannelBody(mpsc::Receiver<Bytes>);

impl hyper::body::Body for ChannelBody {
    type Data = Bytes;
    type Error = Infallible;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Infallible>>> {
        self.get_mut()
            .0
            .poll_recv(cx)
            .map(|chunk| chunk.map(|bytes| Ok(Frame::data(bytes))))
    }
}

impl H2Conn {
    /// Sends `request` and reads its answer whole, within [`DEADLINE`].
    pub async fn send(&mut self, request: Request<H2Body>) -> Result<H2Answer, hyper::Error> {
        let exchange = async {
            self.sender.ready().await?;
            let response = self.sender.send_request(request).await?;
            let (parts, body) = response.into_parts();
            let body = body.collect().await?.to_bytes();
            Ok(H2Answer {
                status: parts.status,
                headers: parts.headers,
                body,
            })
        };
        tokio::time::timeout(DEADLINE, exchange)
            .await
            .expect("an HTTP/2 answer within the deadline")
    }

    /// `GET http://{authority}{path}`.
    pub async fn get(&mut self, authority: &str, path: &str) -> H2Answer {
        self.send(request(Method::GET, authority, path, empty()))
            .await
            .expect("a GET answered")
    }
}
