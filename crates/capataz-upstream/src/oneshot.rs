//! The one internal HTTP/1.1 client, for the runtime's own requests to other servers (ACME
//! directories, etcd gateways, OCSP responders, webhooks, the admin API from `capataz ctl`,
//! the demo's traffic): connect (TCP, then TLS with the caller's rustls config and server
//! name) before a deadline, send a request over hyper's HTTP/1 client connection, get the
//! answer's head before a deadline, and read its body up to a size limit before a deadline.
//! Each step fails with its own [`Error`], which keeps its source; callers word it as they
//! always have. A leaf: it imports nothing of the runtime.

use std::net::SocketAddr;
use std::sync::Arc;

use bytes::Bytes;
use http_body_util::BodyExt as _;
use hyper::body::{Body, Incoming};
use hyper::client::conn::http1;
use hyper_util::rt::TokioIo;
use rustls::pki_types::ServerName;
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::{TcpStream, ToSocketAddrs};
use tokio::time::Instant;
use tokio_util::task::AbortOnDropHandle;

/// Why a step of an exchange failed.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The TCP connection could not be made.
    #[error("connecting: {0}")]
    Connect(#[source] std::io::Error),
    /// The TLS handshake failed.
    #[error("the TLS handshake failed: {0}")]
    Tls(#[source] std::io::Error),
    /// hyper refused to start HTTP/1.1 on the connection.
    #[error(transparent)]
    Handshake(hyper::Error),
    /// The request could not be sent, or the answer's head not read.
    #[error(transparent)]
    Send(hyper::Error),
    /// The connection (TCP and TLS) was not made before its deadline.
    #[error("no connection before the deadline")]
    ConnectTimeout,
    /// The answer's head did not come before its deadline.
    #[error("no answer before the deadline")]
    HeadTimeout,
    /// The body was not whole before its deadline (it trickles, or stalls).
    #[error("the body did not arrive whole before the deadline")]
    BodyTimeout,
    /// The body is longer than the limit.
    #[error("the body is longer than {0} bytes")]
    TooLarge(usize),
    /// Reading the body failed.
    #[error(transparent)]
    Body(hyper::Error),
}

/// What a TLS connection needs: the rustls configuration and the name to send and verify.
pub struct Tls {
    /// The client configuration (roots, client certificate, versions).
    pub config: Arc<rustls::ClientConfig>,
    /// The server name (SNI, and the name its certificate must carry).
    pub name: ServerName<'static>,
}

/// A client connection: the request sender, its driver task aborted when this is dropped
/// (so an exchange given up, by its deadline or its caller, leaves nothing running).
pub struct Connection<B> {
    sender: http1::SendRequest<B>,
    peer: Option<SocketAddr>,
    _driver: AbortOnDropHandle<()>,
}

/// A TCP connection to `to` (each address it resolves to, in turn), `TCP_NODELAY` set.
pub async fn tcp(to: impl ToSocketAddrs) -> Result<TcpStream, Error> {
    let stream = TcpStream::connect(to).await.map_err(Error::Connect)?;
    let _ = stream.set_nodelay(true);
    Ok(stream)
}

/// TLS over `tcp` with `tls`.
pub async fn tls(
    tcp: TcpStream,
    tls: Tls,
) -> Result<tokio_rustls::client::TlsStream<TcpStream>, Error> {
    tokio_rustls::TlsConnector::from(tls.config)
        .connect(tls.name, tcp)
        .await
        .map_err(Error::Tls)
}

/// A connection to `to`, over TLS when `tls` is given, made before `by`.
pub async fn connect<B>(
    to: impl ToSocketAddrs,
    tls: Option<Tls>,
    by: Instant,
) -> Result<Connection<B>, Error>
where
    B: Body + Send + 'static,
    B::Data: Send,
    B::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
{
    let attempt = async {
        let stream = tcp(to).await?;
        match tls {
            None => Connection::over(stream).await,
            Some(config) => Connection::over(self::tls(stream, config).await?).await,
        }
    };
    tokio::time::timeout_at(by, attempt)
        .await
        .map_err(|_| Error::ConnectTimeout)?
}

impl<B> Connection<B>
where
    B: Body + Send + 'static,
    B::Data: Send,
    B::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
{
    /// HTTP/1.1 over a connected `io` (its driver spawned beside).
    pub async fn over<T>(io: T) -> Result<Connection<B>, Error>
    where
        T: AsyncRead + AsyncWrite + Peer + Unpin + Send + 'static,
    {
        let peer = io.peer();
        let (sender, connection) = http1::handshake(TokioIo::new(io))
            .await
            .map_err(Error::Handshake)?;
        let driver = AbortOnDropHandle::new(tokio::spawn(async move {
            let _ = connection.await;
        }));
        Ok(Connection {
            sender,
            peer,
            _driver: driver,
        })
    }

    /// The address connected to, when known.
    pub fn peer(&self) -> Option<SocketAddr> {
        self.peer
    }

    /// Whether the connection is closed (a keep-alive caller connects again).
    pub fn is_closed(&self) -> bool {
        self.sender.is_closed()
    }

    /// Sends `request` and returns the answer's head, before `by`.
    pub async fn send(
        &mut self,
        request: http::Request<B>,
        by: Instant,
    ) -> Result<http::Response<Incoming>, Error> {
        let exchange = async {
            self.sender.ready().await.map_err(Error::Send)?;
            self.sender.send_request(request).await.map_err(Error::Send)
        };
        tokio::time::timeout_at(by, exchange)
            .await
            .map_err(|_| Error::HeadTimeout)?
    }
}

/// `body` whole, at most `limit` bytes, before `by`. A body whose announced length is over
/// `limit` is refused before any of it is read.
pub async fn read_body(body: Incoming, limit: usize, by: Instant) -> Result<Bytes, Error> {
    if body.size_hint().lower() > u64::try_from(limit).unwrap_or(u64::MAX) {
        return Err(Error::TooLarge(limit));
    }
    let read = async {
        let mut body = body;
        let mut whole = bytes::BytesMut::new();
        while let Some(frame) = body.frame().await {
            let frame = frame.map_err(Error::Body)?;
            if let Ok(data) = frame.into_data() {
                if data.len() > limit.saturating_sub(whole.len()) {
                    return Err(Error::TooLarge(limit));
                }
                whole.extend_from_slice(&data);
            }
        }
        Ok(whole.freeze())
    };
    tokio::time::timeout_at(by, read)
        .await
        .map_err(|_| Error::BodyTimeout)?
}

/// The address a stream is connected to, for [`Connection::peer`].
pub trait Peer {
    /// The address, when known.
    fn peer(&self) -> Option<SocketAddr>;
}

impl Peer for TcpStream {
    fn peer(&self) -> Option<SocketAddr> {
        self.peer_addr().ok()
    }
}

impl<T: Peer> Peer for tokio_rustls::client::TlsStream<T> {
    fn peer(&self) -> Option<SocketAddr> {
        self.get_ref().0.peer()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use http_body_util::Full;
    use std::time::Duration;
    use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};

    /// A server on loopback that reads one request head, writes `answer`, and stalls.
    async fn server(answer: &'static [u8]) -> SocketAddr {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        tokio::spawn(async move {
            let (mut stream, _) = listener.accept().await.unwrap();
            let mut head = Vec::new();
            let mut buf = [0u8; 1024];
            while !head.windows(4).any(|w| w == b"\r\n\r\n") {
                let n = stream.read(&mut buf).await.unwrap();
                if n == 0 {
                    return;
                }
                head.extend_from_slice(&buf[..n]);
            }
            stream.write_all(answer).await.unwrap();
            std::future::pending::<()>().await;
        });
        addr
    }

    async fn get(addr: SocketAddr, limit: usize, within: Duration) -> Result<Bytes, Error> {
        let by = Instant::now() + within;
        let mut connection = connect::<Full<Bytes>>(addr, None, by).await?;
        assert_eq!(connection.peer(), Some(addr));
        let request = http::Request::get("/")
            .header(http::header::HOST, "test")
            .body(Full::default())
            .unwrap();
        let response = connection.send(request, by).await?;
        read_body(response.into_body(), limit, by).await
    }

    #[tokio::test]
    async fn a_body_within_its_limit_is_read_whole() {
        let addr = server(b"HTTP/1.1 200 OK\r\ncontent-length: 5\r\n\r\nhello").await;
        let body = get(addr, 5, Duration::from_secs(30)).await.unwrap();
        assert_eq!(&body[..], b"hello");
    }

    #[tokio::test]
    async fn a_body_over_its_limit_is_an_error_saying_so() {
        let addr = server(b"HTTP/1.1 200 OK\r\ncontent-length: 6\r\n\r\nhello!").await;
        let error = get(addr, 5, Duration::from_secs(30)).await.unwrap_err();
        assert!(matches!(error, Error::TooLarge(5)), "{error:?}");
        assert_eq!(error.to_string(), "the body is longer than 5 bytes");
    }

    #[tokio::test]
    async fn a_chunked_body_growing_over_its_limit_is_cut_there() {
        let addr = server(
            b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n3\r\nabc\r\n3\r\ndef\r\n",
        )
        .await;
        let error = get(addr, 5, Duration::from_secs(30)).await.unwrap_err();
        assert!(matches!(error, Error::TooLarge(5)), "{error:?}");
    }

    #[tokio::test]
    async fn a_stalled_head_or_body_is_a_timeout_saying_which() {
        let addr = server(b"HTTP/1.1 200").await;
        let error = get(addr, 5, Duration::from_millis(200)).await.unwrap_err();
        assert!(matches!(error, Error::HeadTimeout), "{error:?}");
        let addr = server(b"HTTP/1.1 200 OK\r\ncontent-length: 5\r\n\r\nhe").await;
        let error = get(addr, 5, Duration::from_millis(200)).await.unwrap_err();
        assert!(matches!(error, Error::BodyTimeout), "{error:?}");
    }

    #[tokio::test]
    async fn a_refused_connection_keeps_its_io_error() {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        drop(listener);
        let error = get(addr, 5, Duration::from_secs(30)).await.unwrap_err();
        let Error::Connect(source) = &error else {
            panic!("{error:?}");
        };
        assert_eq!(source.kind(), std::io::ErrorKind::ConnectionRefused);
    }
}
