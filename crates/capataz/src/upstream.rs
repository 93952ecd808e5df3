//! Keep-alive connections to one backend, and one HTTP/1.1 exchange on one of them.
//!
//! The connections are plain TCP streams: capataz speaks HTTP/1.1 to backends itself (see
//! `h1`), so an idle connection holds no buffer, no task and no channel, only its socket. A
//! small stack of them is kept per backend, reused most-recent first; one the backend closed
//! meanwhile is noticed before use (its socket reads as closed) and dropped.
//!
//! A connection is handed back only once the response it carried has been read to its end
//! (see `body::Lease`), so an idle connection is always ready for the next request.

use std::io;
use std::net::SocketAddr;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use bytes::{Bytes, BytesMut};
use capataz_health::Outcome;
use http::{Request, StatusCode};
use hyper::body::{Body as _, Frame};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use crate::body::ReqBody;
use crate::h1::framing::{self, Framing};
use crate::h1::head::{self, ResponseHead};
use crate::h1::request::{self, RequestBody};

/// The most idle connections kept per backend.
const MAX_IDLE: usize = 512;
/// The largest response head accepted from a backend.
const MAX_HEAD: usize = 65536;
/// How much is read from a backend at a time.
pub(crate) const READ_SIZE: usize = 8192;
/// How much is read for the start of an answer.
const FIRST_READ: usize = 2048;

/// A connection ready to carry one request.
pub(crate) struct Conn {
    pub(crate) stream: TcpStream,
    /// Whether it came from the idle set (it may have been closed by the backend meanwhile).
    pub(crate) reused: bool,
}

/// The keep-alive connections to one backend.
#[derive(Debug)]
pub struct Upstream {
    addr: SocketAddr,
    connect_timeout: Duration,
    idle_timeout: Duration,
    idle: Mutex<Vec<(TcpStream, Instant)>>,
}

impl Upstream {
    /// An empty connection set for `addr`.
    pub fn new(addr: SocketAddr, connect_timeout: Duration, idle_timeout: Duration) -> Upstream {
        Upstream {
            addr,
            connect_timeout,
            idle_timeout,
            idle: Mutex::new(Vec::new()),
        }
    }

    /// The backend's address.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// An idle connection if one is still open, else a fresh one. A failed connect is returned
    /// as the outcome the traffic rule judges: `Refused` or `Timeout` (nothing was sent).
    /// `now` is the caller's reading of the clock, to judge idle time without another.
    pub(crate) async fn acquire(&self, now: Instant) -> Result<Conn, Outcome> {
        if let Some(stream) = self.pop_idle(now) {
            return Ok(Conn {
                stream,
                reused: true,
            });
        }
        self.connect().await
    }

    /// A fresh connection, never a pooled one.
    pub(crate) async fn connect(&self) -> Result<Conn, Outcome> {
        let stream =
            match tokio::time::timeout(self.connect_timeout, TcpStream::connect(self.addr)).await {
                Err(_) => return Err(Outcome::Timeout),
                Ok(Err(e)) => return Err(connect_error(&e)),
                Ok(Ok(stream)) => stream,
            };
        let _ = stream.set_nodelay(true);
        Ok(Conn {
            stream,
            reused: false,
        })
    }

    fn pop_idle(&self, now: Instant) -> Option<TcpStream> {
        let mut idle = self.idle.lock().unwrap_or_else(|e| e.into_inner());
        while let Some((stream, since)) = idle.pop() {
            if now.saturating_duration_since(since) < self.idle_timeout && still_open(&stream) {
                return Some(stream);
            }
        }
        None
    }

    /// Hands back a connection whose response was read to its end; its idle time counts from
    /// `since` (when its response arrived: close enough, and no clock read).
    pub(crate) fn release(&self, stream: TcpStream, since: Instant) {
        let mut idle = self.idle.lock().unwrap_or_else(|e| e.into_inner());
        if idle.len() < MAX_IDLE {
            idle.push((stream, since));
        }
    }

    /// Drops idle connections that were closed or sat idle longer than the idle timeout.
    pub fn reap(&self) {
        let mut idle = self.idle.lock().unwrap_or_else(|e| e.into_inner());
        idle.retain(|(stream, since)| since.elapsed() < self.idle_timeout && still_open(stream));
    }

    /// Drops every idle connection.
    pub fn clear(&self) {
        self.idle.lock().unwrap_or_else(|e| e.into_inner()).clear();
    }

    /// How many idle connections are kept.
    pub fn idle_count(&self) -> usize {
        self.idle.lock().unwrap_or_else(|e| e.into_inner()).len()
    }
}

/// Whether an idle connection is still usable: nothing to read on it. A closed one reads as
/// closed, and bytes a backend sent unasked make it unusable too. No syscall unless the
/// socket was reported readable.
fn still_open(stream: &TcpStream) -> bool {
    let mut byte = [0u8; 1];
    matches!(stream.try_read(&mut byte), Err(e) if e.kind() == io::ErrorKind::WouldBlock)
}

fn connect_error(error: &io::Error) -> Outcome {
    match error.kind() {
        io::ErrorKind::TimedOut => Outcome::Timeout,
        io::ErrorKind::ConnectionReset | io::ErrorKind::ConnectionAborted => Outcome::Reset,
        _ => Outcome::Refused,
    }
}

/// How one exchange failed.
// Returned once per failed exchange; boxing the request would cost an allocation for nothing.
#[allow(clippy::large_enum_variant)]
pub(crate) enum ExchangeError {
    /// Not a byte of the request was written: it comes back intact.
    NotSent(Request<ReqBody>),
    /// The request was written, at least in part, and no usable response head came.
    Failed(Outcome),
}

/// A response head from a backend, with what is needed to read its body.
pub(crate) struct Answer {
    pub(crate) head: ResponseHead,
    pub(crate) framing: Framing,
    pub(crate) stream: TcpStream,
    /// What was read past the head: the start of the body (or of an upgraded stream).
    pub(crate) buf: BytesMut,
}

/// Sends `request` on `stream` and reads the response head, skipping interim (1xx) answers
/// but `101 Switching Protocols`. A request body is streamed while the answer is awaited; a
/// backend that answers before it has all of it gets no more of it, and its connection is
/// not reused.
pub(crate) async fn exchange(
    mut stream: TcpStream,
    request: Request<ReqBody>,
) -> Result<Answer, ExchangeError> {
    let body_framing = RequestBody::of(
        request.body().is_end_stream(),
        request.body().size_hint().exact(),
    );
    let target = request.uri().path_and_query().map_or("/", |pq| pq.as_str());
    let mut head_bytes = Vec::with_capacity(256);
    request::encode_head(
        request.method(),
        target,
        request.headers(),
        body_framing,
        &mut head_bytes,
    );
    // The first write decides whether anything was sent at all.
    match stream.write(&head_bytes).await {
        Ok(0) | Err(_) => return Err(ExchangeError::NotSent(request)),
        Ok(n) if n < head_bytes.len() => {
            if stream.write_all(&head_bytes[n..]).await.is_err() {
                return Err(ExchangeError::Failed(Outcome::Reset));
            }
        }
        Ok(_) => {}
    }
    let (parts, body) = request.into_parts();
    let method = parts.method;
    let mut buf = BytesMut::new();
    let mut sending = body_framing != RequestBody::None;
    let mut body_whole = !sending;
    let head = {
        let (mut reader, mut writer) = stream.split();
        let send = send_body(&mut writer, body, body_framing);
        let receive = read_head(&mut reader, &mut buf);
        tokio::pin!(send, receive);
        loop {
            tokio::select! {
                biased;
                head = &mut receive => break head,
                // A failed send leaves the answer to be read: the backend may have said why
                // (413, say) before closing.
                sent = &mut send, if sending => {
                    sending = false;
                    body_whole = sent.is_ok();
                }
            }
        }
    };
    let head = head.map_err(ExchangeError::Failed)?;
    let mut framing = if head.status == StatusCode::SWITCHING_PROTOCOLS {
        Framing {
            body: framing::BodyLength::UntilClose,
            reusable: false,
        }
    } else {
        framing::response(&method, &head).map_err(|_| ExchangeError::Failed(Outcome::Malformed))?
    };
    if !body_whole {
        // The backend answered before it had the whole body (or the body broke): what it
        // did not read is still on the way, so the connection cannot carry another request.
        framing.reusable = false;
    }
    Ok(Answer {
        head,
        framing,
        stream,
        buf,
    })
}

/// Streams a request body, framed as `framing` says.
async fn send_body(
    writer: &mut tokio::net::tcp::WriteHalf<'_>,
    mut body: ReqBody,
    framing: RequestBody,
) -> io::Result<()> {
    if framing == RequestBody::None {
        return Ok(());
    }
    while let Some(frame) =
        std::future::poll_fn(|cx| std::pin::Pin::new(&mut body).poll_frame(cx)).await
    {
        let frame: Frame<Bytes> = frame.map_err(io::Error::other)?;
        let Ok(data) = frame.into_data() else {
            continue; // trailers are not forwarded
        };
        if data.is_empty() {
            continue;
        }
        if framing == RequestBody::Chunked {
            writer
                .write_all(request::chunk_start(data.len()).as_bytes())
                .await?;
            writer.write_all(&data).await?;
            writer.write_all(b"\r\n").await?;
        } else {
            writer.write_all(&data).await?;
        }
    }
    if framing == RequestBody::Chunked {
        writer.write_all(request::LAST_CHUNK).await?;
    }
    Ok(())
}

/// Reads until a final response head (or a 101) is complete; interim answers are skipped.
async fn read_head(
    reader: &mut tokio::net::tcp::ReadHalf<'_>,
    buf: &mut BytesMut,
) -> Result<ResponseHead, Outcome> {
    loop {
        match head::parse(buf, MAX_HEAD) {
            Ok(Some(head)) => {
                if head.status.is_informational() && head.status != StatusCode::SWITCHING_PROTOCOLS
                {
                    continue;
                }
                return Ok(head);
            }
            Ok(None) => {}
            Err(_) => return Err(Outcome::Malformed),
        }
        // Most answers' heads (and small bodies) fit in a first read of 2 KB; more is asked
        // for only when the head goes on.
        buf.reserve(if buf.is_empty() {
            FIRST_READ
        } else {
            READ_SIZE
        });
        match reader.read_buf(buf).await {
            Ok(0) | Err(_) => return Err(Outcome::Reset),
            Ok(_) => {}
        }
    }
}
