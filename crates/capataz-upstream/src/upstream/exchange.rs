//! One HTTP/1.1 exchange on one backend connection: send the request (its body streamed),
//! read the response head.
//!
//! Three clocks bound it, each charged to the party it waits on:
//! - the client's body: `request_body` between two pieces of it (the client's fault);
//! - the backend's reading: a write to the backend that waits `body_idle` (the backend's);
//! - the answer: `response_header` from the moment the whole request (head and body) was
//!   written, or from the head's write for a bodiless request (the backend's).
//!
//! A slow but steady upload therefore takes as long as it takes.

use std::cell::RefCell;
use std::future::Future;
use std::pin::Pin;
use std::task::Poll;
use std::time::{Duration, Instant};

use bytes::{Bytes, BytesMut};
use http::{Method, Request, StatusCode};
use hyper::body::{Body, Frame};
use tokio::io::{AsyncReadExt, AsyncWriteExt, ReadBuf};

use super::{AttemptError, Transport, FIRST_READ, MAX_HEAD, READ_SIZE};
use crate::outbox::{Held, Outbox};
use capataz_h1::framing::{self, Framing};
use capataz_h1::head::{self, ResponseHead};
use capataz_h1::request::{self, RequestBody};

/// The deadlines of one exchange (see the module documentation).
#[derive(Clone, Copy, Debug)]
pub struct ExchangeTimeouts {
    /// From the end of the request to the response head.
    pub response_header: Duration,
    /// The longest one write to the backend may wait.
    pub body_idle: Duration,
    /// The longest wait for the next piece of the client's body.
    pub request_body: Duration,
}

/// What one exchange sends.
// Moved once per attempt; boxing the request would cost an allocation for nothing.
#[allow(clippy::large_enum_variant)]
pub enum Outgoing<'a, B> {
    /// A request: its head is encoded into the caller's head buffer, its body streamed.
    Request(Request<B>),
    /// A bodiless request already sent once, to this method: the head buffer holds its head,
    /// sent again byte for byte (a retry on another backend).
    Resend(&'a Method),
}

/// How one exchange failed.
// Returned once per failed exchange; boxing the request would cost an allocation for nothing.
#[allow(clippy::large_enum_variant)]
pub enum ExchangeError<'a, B> {
    /// Not a byte of the request was written: it comes back intact.
    NotSent(Outgoing<'a, B>),
    /// The request was written, at least in part, and no usable response head came.
    Failed(AttemptError),
}

/// A response head from a backend, with what is needed to read its body.
pub struct Answer<S> {
    pub head: ResponseHead,
    pub framing: Framing,
    pub stream: S,
    /// What was read past the head: the start of the body (or of an upgraded stream).
    pub buf: BytesMut,
}

/// Sends `outgoing` on `stream` and reads the response head, skipping interim (1xx) answers
/// but `101 Switching Protocols` (an error unless the request asked for an upgrade). A
/// request's head is encoded into `head_bytes` (which then holds it for a resend); a resend's
/// is taken from there. A request body is streamed while the answer is awaited; a backend
/// that answers before it has all of it gets no more of it, and its connection is not reused.
/// `head_sent_at` is when the head is written (the caller's clock reading): a bodiless
/// request's answer is due `response_header` after it. `upgrade_asked`: whether the request
/// asks for an upgrade (a 101 is an answer only then).
///
/// Any [`Transport`] carries it (TCP in the balancer); `B` is the client's body (an error
/// reading it is the client's fault).
pub async fn exchange<'a, S, B>(
    mut stream: S,
    outgoing: Outgoing<'a, B>,
    head_bytes: &mut Vec<u8>,
    upgrade_asked: bool,
    timeouts: ExchangeTimeouts,
    head_sent_at: Instant,
) -> Result<Answer<S>, ExchangeError<'a, B>>
where
    S: Transport,
    B: Body<Data = Bytes, Error = hyper::Error> + Unpin + Default,
{
    let body_framing = match &outgoing {
        Outgoing::Request(request) => {
            let body_framing = RequestBody::of(
                request.body().is_end_stream(),
                request.body().size_hint().exact(),
            );
            let target = request.uri().path_and_query().map_or("/", |pq| pq.as_str());
            head_bytes.clear();
            request::encode_head(
                request.method(),
                target,
                request.headers(),
                body_framing,
                head_bytes,
            );
            body_framing
        }
        Outgoing::Resend(_) => RequestBody::None,
    };
    // The request goes out at the end of the runtime's turn, with the turn's other requests
    // and answers (HAProxy's order, see `turn`): a bodiless request on a plain socket is held
    // for the worker's flusher (`outbox`), any other waits for its task's next poll.
    let outbox = match body_framing {
        RequestBody::None => hold_head(&stream, head_bytes).await,
        _ => None,
    };
    if outbox.is_none() {
        crate::turn::back_of_queue().await;
        // The first write decides whether anything was sent at all.
        match stream.write(head_bytes).await {
            Ok(0) | Err(_) => return Err(ExchangeError::NotSent(outgoing)),
            Ok(n) if n < head_bytes.len() => {
                write_within(&mut stream, &head_bytes[n..], timeouts.body_idle)
                    .await
                    .map_err(ExchangeError::Failed)?;
            }
            Ok(_) => {}
        }
        // TLS may hold records the socket did not take yet; for TCP this returns at once.
        flush_within(&mut stream, timeouts.body_idle)
            .await
            .map_err(ExchangeError::Failed)?;
    }
    let mut buf = BytesMut::new();
    let mut body_whole = true;
    let (method, head) = if body_framing == RequestBody::None {
        let deadline = tokio::time::Instant::from_std(head_sent_at) + timeouts.response_header;
        let read = read_head_sent(outbox.as_ref(), &mut stream, &mut buf, timeouts.body_idle);
        let head = match tokio::time::timeout_at(deadline, read).await {
            Ok(Err(Unsent::NotSent)) => return Err(ExchangeError::NotSent(outgoing)),
            Ok(Err(Unsent::Failed(error))) => Err(error),
            Ok(Ok(head)) => Ok(head),
            Err(_) => Err(AttemptError::HeadTimeout),
        };
        if outbox.as_ref().is_some_and(Outbox::holds) {
            // Answered before its request went out (a backend that speaks first): the request
            // is not sent now, and the connection carries no other.
            body_whole = false;
        }
        drop(outbox);
        let method = match outgoing {
            Outgoing::Request(request) => request.into_parts().0.method,
            Outgoing::Resend(method) => method.clone(),
        };
        (method, head)
    } else {
        let (method, body) = match outgoing {
            Outgoing::Request(request) => {
                let (parts, body) = request.into_parts();
                (parts.method, body)
            }
            Outgoing::Resend(method) => (method.clone(), B::default()),
        };
        let (mut reader, mut writer) = stream.split();
        let send = send_body(&mut writer, body, body_framing, timeouts);
        let receive = read_head(&mut reader, &mut buf);
        tokio::pin!(send, receive);
        let early = tokio::select! {
            biased;
            head = &mut receive => Some(head),
            sent = &mut send => match sent {
                Ok(()) => None,
                // A send that failed on the backend's side leaves the answer to be read: the
                // backend may have said why (413, say) before closing.
                Err(AttemptError::Send { .. }) => {
                    body_whole = false;
                    None
                }
                Err(error) => return Err(ExchangeError::Failed(error)),
            },
        };
        let head = match early {
            Some(head) => {
                // Answered before the whole body was sent: the rest is not coming.
                body_whole = false;
                head
            }
            None => tokio::time::timeout(timeouts.response_header, &mut receive)
                .await
                .unwrap_or(Err(AttemptError::HeadTimeout)),
        };
        (method, head)
    };
    let head = head.map_err(ExchangeError::Failed)?;
    let mut framing = if head.status == StatusCode::SWITCHING_PROTOCOLS {
        if !upgrade_asked {
            return Err(ExchangeError::Failed(AttemptError::UnexpectedUpgrade));
        }
        Framing {
            body: framing::BodyLength::UntilClose,
            reusable: false,
            rewrite_length: false,
        }
    } else {
        framing::response(&method, &head)
            .map_err(|_| ExchangeError::Failed(AttemptError::HeadMalformed))?
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

/// A bodiless request's head held for the worker's flusher (`outbox`): `None` if the stream
/// is not a plain socket, the thread has no flusher, or the head is too large to hold.
async fn hold_head<S: Transport>(stream: &S, head_bytes: &[u8]) -> Option<Outbox> {
    let outbox = stream.plain_fd().and_then(Outbox::for_socket)?;
    let held = std::future::poll_fn(|cx| {
        Poll::Ready(outbox.hold(cx, &[std::io::IoSlice::new(head_bytes)]))
    })
    .await;
    held.map(|_| outbox)
}

/// Why [`read_head_sent`] has no head.
enum Unsent {
    /// The flusher's send failed before a byte of the request went.
    NotSent,
    Failed(AttemptError),
}

/// [`read_head`], watching what `outbox` holds meanwhile: a send that failed ends it, bytes the
/// flusher left are written here (a write that waits `limit` means the backend stopped
/// reading). A connection that ended before any byte of the request went is `NotSent`, as a
/// write made at once would have found. Reading the head is cancel-safe (what was read is in
/// `buf`), so it is set aside for that write.
async fn read_head_sent<S: Transport>(
    outbox: Option<&Outbox>,
    stream: &mut S,
    buf: &mut BytesMut,
    limit: Duration,
) -> Result<ResponseHead, Unsent> {
    let Some(outbox) = outbox else {
        return read_head(stream, buf).await.map_err(Unsent::Failed);
    };
    loop {
        let read = {
            let mut read = std::pin::pin!(read_head(&mut *stream, &mut *buf));
            std::future::poll_fn(|cx| {
                match outbox.state() {
                    Ok(Held::Fine) => {}
                    Ok(Held::Left) => return Poll::Ready(None),
                    Err((_, false)) => return Poll::Ready(Some(Err(Unsent::NotSent))),
                    Err((_, true)) => {
                        let error = AttemptError::Send { sent_any: true };
                        return Poll::Ready(Some(Err(Unsent::Failed(error))));
                    }
                }
                read.as_mut().poll(cx).map(|head| {
                    Some(head.map_err(|error| match error {
                        // The connection ended (a pooled one the backend closed or reset
                        // after its reuse check) before a byte of the request went.
                        AttemptError::HeadClosed if outbox.withdraw() => Unsent::NotSent,
                        error => Unsent::Failed(error),
                    }))
                })
            })
            .await
        };
        if let Some(read) = read {
            return read;
        }
        let write = std::future::poll_fn(|cx| outbox.poll_write_held(cx, &mut *stream));
        match tokio::time::timeout(limit, write).await {
            Ok(Ok(())) => {}
            Ok(Err(_)) if outbox.withdraw() => return Err(Unsent::NotSent),
            Ok(Err(_)) => return Err(Unsent::Failed(AttemptError::Send { sent_any: true })),
            Err(_) => return Err(Unsent::Failed(AttemptError::BackendNotReading)),
        }
    }
}

/// Writes `bytes` to the backend; a write that waits `limit` means it stopped reading.
async fn write_within<W: tokio::io::AsyncWrite + Unpin>(
    writer: &mut W,
    bytes: &[u8],
    limit: Duration,
) -> Result<(), AttemptError> {
    let write = async {
        writer.write_all(bytes).await?;
        // TLS may hold records the socket did not take yet; for TCP this returns at once.
        writer.flush().await
    };
    match tokio::time::timeout(limit, write).await {
        Ok(Ok(())) => Ok(()),
        Ok(Err(_)) => Err(AttemptError::Send { sent_any: true }),
        Err(_) => Err(AttemptError::BackendNotReading),
    }
}

/// Flushes what the transport holds; a flush that waits `limit` means the backend stopped
/// reading. A flush done at once (always, on TCP) arms no timer and reads no clock.
async fn flush_within<W: tokio::io::AsyncWrite + Unpin>(
    writer: &mut W,
    limit: Duration,
) -> Result<(), AttemptError> {
    let at_once =
        std::future::poll_fn(|cx| std::task::Poll::Ready(Pin::new(&mut *writer).poll_flush(cx)))
            .await;
    match at_once {
        std::task::Poll::Ready(Ok(())) => return Ok(()),
        std::task::Poll::Ready(Err(_)) => return Err(AttemptError::Send { sent_any: true }),
        std::task::Poll::Pending => {}
    }
    match tokio::time::timeout(limit, writer.flush()).await {
        Ok(Ok(())) => Ok(()),
        Ok(Err(_)) => Err(AttemptError::Send { sent_any: true }),
        Err(_) => Err(AttemptError::BackendNotReading),
    }
}

/// The next frame of the client's body, waiting at most `limit` for it.
async fn next_frame<B: Body<Data = Bytes, Error = hyper::Error> + Unpin>(
    body: &mut B,
    limit: Duration,
) -> Result<Option<Frame<Bytes>>, AttemptError> {
    let next = std::future::poll_fn(|cx| Pin::new(&mut *body).poll_frame(cx));
    match tokio::time::timeout(limit, next).await {
        Err(_) => Err(AttemptError::ClientBodyStalled),
        Ok(None) => Ok(None),
        Ok(Some(Ok(frame))) => Ok(Some(frame)),
        Ok(Some(Err(error))) => Err(AttemptError::of_client_body(&error)),
    }
}

/// Streams a request body, framed as `framing` says.
async fn send_body<W, B>(
    writer: &mut W,
    mut body: B,
    framing: RequestBody,
    timeouts: ExchangeTimeouts,
) -> Result<(), AttemptError>
where
    W: tokio::io::AsyncWrite + Unpin,
    B: Body<Data = Bytes, Error = hyper::Error> + Unpin,
{
    while let Some(frame) = next_frame(&mut body, timeouts.request_body).await? {
        let Ok(data) = frame.into_data() else {
            continue; // trailers are not forwarded
        };
        if data.is_empty() {
            continue;
        }
        if framing == RequestBody::Chunked {
            let start = request::chunk_start(data.len());
            write_within(writer, start.as_bytes(), timeouts.body_idle).await?;
            write_within(writer, &data, timeouts.body_idle).await?;
            write_within(writer, b"\r\n", timeouts.body_idle).await?;
        } else {
            write_within(writer, &data, timeouts.body_idle).await?;
        }
    }
    if framing == RequestBody::Chunked {
        write_within(writer, request::LAST_CHUNK, timeouts.body_idle).await?;
    }
    Ok(())
}

/// Reads until a final response head (or a 101) is complete; interim answers are skipped.
async fn read_head<R: tokio::io::AsyncRead + Unpin>(
    reader: &mut R,
    buf: &mut BytesMut,
) -> Result<ResponseHead, AttemptError> {
    loop {
        // Relayed: a lone `Connection: keep-alive` or `close` is not kept (see `parse_relayed`).
        match head::parse_relayed(buf, MAX_HEAD) {
            Ok(Some(head)) => {
                if head.status.is_informational() && head.status != StatusCode::SWITCHING_PROTOCOLS
                {
                    continue;
                }
                return Ok(head);
            }
            Ok(None) => {}
            Err(_) => return Err(AttemptError::HeadMalformed),
        }
        // Most answers' heads (and small bodies) fit in a first read of 2 KB; more is read
        // into the buffer itself only when the head goes on.
        let read = if buf.is_empty() {
            read_first(reader, buf).await
        } else {
            buf.reserve(READ_SIZE);
            reader.read_buf(buf).await
        };
        match read {
            Ok(0) | Err(_) => return Err(AttemptError::HeadClosed),
            Ok(_) => {}
        }
    }
}

thread_local! {
    /// Where the start of an answer is read before it is copied to a buffer of its own size
    /// (see [`read_first`]): one per thread, used within one poll, never across an await.
    static FIRST: RefCell<[u8; FIRST_READ]> = const { RefCell::new([0; FIRST_READ]) };
}

/// Reads the start of an answer into the thread's [`FIRST`] buffer, then into `buf` (empty),
/// allocated to the size read. A 2 KB buffer allocated for each exchange and held to the end
/// of its answer cost about 870 instructions per request with many answers in flight: jemalloc
/// refilled the thread cache of that size class from fresh slabs, as the number of live 2 KB
/// buffers swung by more than it holds (BENCHMARKS.md, "HTTP/2: where the instructions go").
/// An answer's start is usually a few hundred bytes, in a size class whose thread cache and
/// slabs hold many more; what the answer keeps (its head's field values and the start of its
/// body are slices of `buf`, held until the client's side has sent them, and an HTTP/2
/// client's HPACK table keeps the values it indexes) is no larger than what was read.
async fn read_first<R: tokio::io::AsyncRead + Unpin>(
    reader: &mut R,
    buf: &mut BytesMut,
) -> std::io::Result<usize> {
    std::future::poll_fn(|cx| {
        // Borrowed only within this poll of the backend's socket, which runs no exchange.
        FIRST.with_borrow_mut(|first| {
            let mut read = ReadBuf::new(&mut first[..]);
            std::task::ready!(Pin::new(&mut *reader).poll_read(cx, &mut read))?;
            let filled = read.filled();
            *buf = BytesMut::from(filled);
            Poll::Ready(Ok(filled.len()))
        })
    })
    .await
}
