//! HTTP/2 to backends (`protocol = "h2"` over TLS, `"h2c"` over TCP with prior knowledge),
//! with hyper's HTTP/2 client.
//!
//! One multiplexed connection per backend ([`H2Conns`]), shared by every request to it: the
//! streams of an HTTP/2 connection are isolated from each other, so the private reuse policy
//! of HTTP/1.1 (`connection_reuse`) does not apply. A connection the backend closed or sent
//! GOAWAY on is replaced by the next request; at most one connect runs at a time per backend,
//! the other requests wait for it within their own connect deadline.
//!
//! The deadlines are those of HTTP/1.1 (see `exchange`): `connect` for the TCP connect, the TLS
//! handshake and the HTTP/2 handshake together, the client's body waits bounded by
//! `request_body` (the client's fault), a backend that stops taking the body (it leaves the
//! request body unread, flow control closed, for `body_idle`) is not reading, and
//! `response_header` runs from the end of the request body. Failures are
//! [`AttemptError`]s with the same blame: a stream the backend resets is the backend's
//! (`HeadClosed` before the head, `BodyBroken` after), and a stream it refused unprocessed
//! (`REFUSED_STREAM`, or above a GOAWAY's last stream) is [`AttemptError::StreamRefused`],
//! safe to send elsewhere; above a graceful GOAWAY (`NO_ERROR`: the backend closing a
//! connection it has used enough, as nginx does after `keepalive_requests`) it is
//! [`AttemptError::GoneAway`], which is no fault of the backend's.

use std::any::Any;
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use crate::atomic_enum::atomic_enum;
use crate::lockstat::{self, Site};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use http::{Request, Response};
use hyper::body::{Body, Frame, Incoming, SizeHint};
use hyper::client::conn::http2::{self, SendRequest};
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use tokio::sync::Notify;

use super::{AttemptError, BackendStream, ExchangeTimeouts, Upstream};

/// The HTTP/2 connection to one backend, when its pool speaks HTTP/2.
#[derive(Debug, Default)]
pub struct H2Conns {
    /// The live connection's handle, if any.
    current: Mutex<Option<SendRequest<H2Body>>>,
    /// Held while a connection is being made.
    connecting: tokio::sync::Mutex<()>,
}

impl H2Conns {
    fn live(&self) -> Option<SendRequest<H2Body>> {
        let current = lockstat::lock(&self.current, Site::H2Conn);
        current.as_ref().filter(|s| !s.is_closed()).cloned()
    }

    /// Forgets the current connection (it failed): the next request makes a new one. The
    /// connection itself ends when its last stream does.
    fn forget(&self) {
        *lockstat::lock(&self.current, Site::H2Conn) = None;
    }
}

impl Upstream {
    /// The live HTTP/2 connection to this backend, or a new one, within the connect deadline.
    async fn h2_sender(&self, conns: &H2Conns) -> Result<SendRequest<H2Body>, AttemptError> {
        if let Some(sender) = conns.live() {
            return Ok(sender);
        }
        let deadline = tokio::time::Instant::now() + self.connect_timeout();
        let _connecting = tokio::time::timeout_at(deadline, conns.connecting.lock())
            .await
            .map_err(|_| AttemptError::ConnectTimeout)?;
        // Another request may have connected while this one waited.
        if let Some(sender) = conns.live() {
            return Ok(sender);
        }
        let connect = async {
            match self.tls() {
                None if self.unix_path().is_some() => Ok(self.connect(None).await?.stream),
                None => Ok(BackendStream::Tcp(self.connect_tcp().await?)),
                Some(tls) => {
                    let stream = self.connect_tls(tls).await?;
                    if tls_negotiated_h2(&stream) {
                        Ok(BackendStream::Tls(Box::new(stream)))
                    } else {
                        tracing::debug!(backend = %self.addr(), "the backend did not agree to h2 by ALPN");
                        Err(AttemptError::TlsHandshake)
                    }
                }
            }
        };
        // One deadline for the wait for another connect, the connect and the handshakes.
        let stream = tokio::time::timeout_at(deadline, connect)
            .await
            .map_err(|_| AttemptError::ConnectTimeout)??;
        let mut builder = http2::Builder::new(TokioExecutor::new());
        builder.timer(TokioTimer::new());
        // As for HTTP/1.1 answers (`MAX_HEAD`): a backend's head is at most 64 KB.
        builder.max_header_list_size(super::MAX_HEAD as u32);
        // A connection that went silent under open streams (a backend host gone without a
        // FIN) is found by PING and closed, so the next request opens a new one.
        builder.keep_alive_interval(H2_PING_INTERVAL);
        builder.keep_alive_timeout(H2_PING_TIMEOUT);
        let handshake = builder.handshake::<_, H2Body>(TokioIo::new(stream));
        let (sender, connection) = match tokio::time::timeout_at(deadline, handshake).await {
            Err(_) => return Err(AttemptError::ConnectTimeout),
            Ok(Err(_)) => return Err(AttemptError::ConnectRefused),
            Ok(Ok(pair)) => pair,
        };
        tokio::spawn(async move {
            if let Err(error) = connection.await {
                tracing::debug!(%error, "HTTP/2 connection to a backend ended");
            }
        });
        *lockstat::lock(&conns.current, Site::H2Conn) = Some(sender.clone());
        Ok(sender)
    }
}

fn tls_negotiated_h2(stream: &tokio_rustls::client::TlsStream<tokio::net::TcpStream>) -> bool {
    stream.get_ref().1.alpn_protocol() == Some(b"h2")
}

/// How one HTTP/2 exchange failed.
// Returned once per failed exchange; boxing the request would cost an allocation for nothing.
#[allow(clippy::large_enum_variant)]
pub enum H2Failure<B> {
    /// Nothing of the request reached the backend: it comes back intact.
    NotSent(Request<B>, AttemptError),
    /// The request was handed to the backend's connection and no usable head came.
    Failed(AttemptError),
}

/// Sends `request` to the backend over its HTTP/2 connection and waits for the response head
/// within the deadlines (see the module documentation). `B` is the client's body; an error
/// reading it is the client's fault.
pub async fn exchange_h2<B>(
    upstream: &Upstream,
    conns: &H2Conns,
    request: Request<B>,
    timeouts: ExchangeTimeouts,
) -> Result<Response<Incoming>, H2Failure<B>>
where
    B: Body<Data = Bytes, Error = hyper::Error> + Send + Unpin + 'static,
{
    let mut sender = match upstream.h2_sender(conns).await {
        Ok(sender) => sender,
        Err(error) => return Err(H2Failure::NotSent(request, error)),
    };
    let progress = Arc::new(Progress::new(request.body().is_end_stream()));
    let request = request.map(|body| {
        H2Body(Box::pin(Tracked {
            inner: Some(body),
            progress: progress.clone(),
            stall: None,
            waiting: false,
            request_body: timeouts.request_body,
        }))
    });
    let answer = sender.try_send_request(request);
    let deadline = head_deadline(&progress, timeouts);
    let outcome = tokio::select! {
        answer = answer => answer,
        why = deadline => return Err(H2Failure::Failed(why)),
    };
    match outcome {
        Ok(response) => Ok(response),
        Err(mut error) => {
            if let Some(client) = progress.client_failure() {
                return Err(H2Failure::Failed(client));
            }
            let why = classify(error.error(), Phase::Head);
            conns_forget_if_dead(conns, why);
            match error
                .take_message()
                .and_then(|request| unwrap_request(request))
            {
                Some(request) => {
                    // Never handed to the connection: this one is closing. Nothing reached
                    // the backend, so nothing is charged (the streams the connection had
                    // say whether it failed), and it goes once more to a new connection,
                    // as HTTP/1.1's request on a reused connection found closed does.
                    conns.forget();
                    Err(H2Failure::NotSent(request, AttemptError::GoneAway))
                }
                None => Err(H2Failure::Failed(why)),
            }
        }
    }
}

/// While streams are open, a PING every this long...
const H2_PING_INTERVAL: Duration = Duration::from_secs(30);
/// ...answered within this long, or the connection is closed.
const H2_PING_TIMEOUT: Duration = Duration::from_secs(20);

/// Drops the backend's connection after a failure that says it is gone or going (a slow
/// stream says nothing about the connection: PINGs find a dead one).
fn conns_forget_if_dead(conns: &H2Conns, why: AttemptError) {
    if matches!(
        why,
        AttemptError::HeadClosed
            | AttemptError::HeadMalformed
            | AttemptError::StreamRefused
            | AttemptError::GoneAway
    ) {
        conns.forget();
    }
}

/// The request a failed `try_send_request` gave back, with the client's body taken out of
/// its wrapper (it was never polled).
fn unwrap_request<B: 'static>(request: Request<H2Body>) -> Option<Request<B>> {
    let (parts, body) = request.into_parts();
    let inner = body.take_inner()?;
    let inner = inner.downcast::<B>().ok()?;
    Some(Request::from_parts(parts, *inner))
}

/// Resolves with the failure the exchange's deadlines decide: the backend not taking the
/// body for `body_idle`, the client's body stalled (reported by the body), or no head
/// `response_header` after the body's end. Pending forever otherwise.
async fn head_deadline(progress: &Progress, timeouts: ExchangeTimeouts) -> AttemptError {
    let mut seen = progress.frames.load(Ordering::Relaxed);
    while !progress.ended.load(Ordering::Acquire) {
        tokio::select! {
            _ = progress.notify.notified() => {}
            _ = tokio::time::sleep(timeouts.body_idle) => {
                let now = progress.frames.load(Ordering::Relaxed);
                let client = progress.waiting_on_client.load(Ordering::Relaxed);
                if now == seen && !client && !progress.ended.load(Ordering::Acquire) {
                    return AttemptError::BackendNotReading;
                }
                seen = now;
            }
        }
        if let Some(client) = progress.client_failure() {
            return client;
        }
    }
    tokio::time::sleep(timeouts.response_header).await;
    AttemptError::HeadTimeout
}

/// Where a failure happened.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Phase {
    /// Before the response head.
    Head,
    /// While the response body streamed.
    Body,
}

/// The failure a hyper HTTP/2 client error means, in `phase`.
pub fn classify(error: &hyper::Error, phase: Phase) -> AttemptError {
    let mut source = std::error::Error::source(error);
    while let Some(cause) = source {
        if let Some(h2) = cause.downcast_ref::<h2::Error>() {
            let refused = h2.reason() == Some(h2::Reason::REFUSED_STREAM);
            let gone_away = h2.is_go_away() && h2.is_remote();
            if phase == Phase::Head && gone_away && h2.reason() == Some(h2::Reason::NO_ERROR) {
                return AttemptError::GoneAway;
            }
            if phase == Phase::Head && (refused || gone_away) {
                return AttemptError::StreamRefused;
            }
            if h2.is_library() && !h2.is_io() && phase == Phase::Head {
                // The backend broke the protocol (a malformed frame or header).
                return AttemptError::HeadMalformed;
            }
            break;
        }
        source = cause.source();
    }
    match phase {
        Phase::Head if error.is_parse() => AttemptError::HeadMalformed,
        Phase::Head => AttemptError::HeadClosed,
        Phase::Body => AttemptError::BodyBroken,
    }
}

/// What the request body wrapper tells the exchange.
struct Progress {
    /// The body has ended (or there was none).
    ended: AtomicBool,
    /// Woken when it ends.
    notify: Notify,
    /// Frames hyper pulled from it.
    frames: AtomicU64,
    /// Whether the last poll waited on the client.
    waiting_on_client: AtomicBool,
    /// The client's failure, if its body failed.
    client: ClientFailureCell,
}

atomic_enum! {
    /// How the client's body failed, if it did.
    enum ClientFailure in ClientFailureCell {
        /// It did not (yet).
        None,
        /// It stalled.
        Stalled,
        /// It was malformed.
        Malformed,
        /// The client went away.
        Gone,
    }
}

impl Progress {
    fn new(ended: bool) -> Progress {
        Progress {
            ended: AtomicBool::new(ended),
            notify: Notify::new(),
            frames: AtomicU64::new(0),
            waiting_on_client: AtomicBool::new(false),
            client: ClientFailureCell::new(ClientFailure::None),
        }
    }

    fn end(&self) {
        if !self.ended.swap(true, Ordering::AcqRel) {
            self.notify.notify_one();
        }
    }

    fn fail(&self, why: AttemptError) {
        let code = match why {
            AttemptError::ClientBodyStalled => ClientFailure::Stalled,
            AttemptError::ClientBodyMalformed => ClientFailure::Malformed,
            _ => ClientFailure::Gone,
        };
        self.client.store(code, Ordering::Release);
        self.notify.notify_one();
    }

    fn client_failure(&self) -> Option<AttemptError> {
        match self.client.load(Ordering::Acquire) {
            ClientFailure::Stalled => Some(AttemptError::ClientBodyStalled),
            ClientFailure::Malformed => Some(AttemptError::ClientBodyMalformed),
            ClientFailure::Gone => Some(AttemptError::ClientGone),
            ClientFailure::None => None,
        }
    }
}

/// The client's body on its way to an HTTP/2 backend, type-erased (hyper's connection is typed
/// by its body; the client's body type is the proxy's business). One allocation per request,
/// on the HTTP/2 path only.
pub struct H2Body(Pin<Box<dyn ErasedBody>>);

impl std::fmt::Debug for H2Body {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("H2Body")
    }
}

/// A request body whose inner body can be taken back while it was never polled.
trait ErasedBody: Body<Data = Bytes, Error = AttemptError> + Send + 'static {
    fn take_inner(self: Pin<&mut Self>) -> Option<Box<dyn Any + Send>>;
}

impl H2Body {
    fn take_inner(mut self) -> Option<Box<dyn Any + Send>> {
        self.0.as_mut().take_inner()
    }
}

impl Body for H2Body {
    type Data = Bytes;
    type Error = AttemptError;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, AttemptError>>> {
        self.0.as_mut().poll_frame(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.0.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.0.size_hint()
    }
}

/// The client's body, with the progress the exchange's deadlines read, and the client's
/// waits bounded by `request_body`.
struct Tracked<B> {
    inner: Option<B>,
    progress: Arc<Progress>,
    /// The client-wait timer, created at the first wait.
    stall: Option<Pin<Box<tokio::time::Sleep>>>,
    /// Whether the last poll waited on the client (its timer runs).
    waiting: bool,
    request_body: Duration,
}

impl<B> Body for Tracked<B>
where
    B: Body<Data = Bytes, Error = hyper::Error> + Unpin,
{
    type Data = Bytes;
    type Error = AttemptError;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, AttemptError>>> {
        let this = self.get_mut();
        let Some(inner) = this.inner.as_mut() else {
            return Poll::Ready(None);
        };
        match Pin::new(&mut *inner).poll_frame(cx) {
            Poll::Ready(Some(Ok(frame))) => {
                this.progress.frames.fetch_add(1, Ordering::Relaxed);
                this.progress
                    .waiting_on_client
                    .store(false, Ordering::Relaxed);
                this.waiting = false;
                if inner.is_end_stream() {
                    this.progress.end();
                }
                Poll::Ready(Some(Ok(frame)))
            }
            Poll::Ready(None) => {
                this.progress.end();
                Poll::Ready(None)
            }
            Poll::Ready(Some(Err(error))) => {
                let why = AttemptError::of_client_body(&error);
                this.progress.fail(why);
                Poll::Ready(Some(Err(why)))
            }
            Poll::Pending => {
                this.progress
                    .waiting_on_client
                    .store(true, Ordering::Relaxed);
                if !this.waiting {
                    this.waiting = true;
                    let deadline = tokio::time::Instant::now() + this.request_body;
                    match &mut this.stall {
                        Some(stall) => stall.as_mut().reset(deadline),
                        None => this.stall = Some(Box::pin(tokio::time::sleep_until(deadline))),
                    }
                }
                let stalled = this
                    .stall
                    .as_mut()
                    .is_some_and(|stall| stall.as_mut().poll(cx).is_ready());
                if stalled {
                    this.progress.fail(AttemptError::ClientBodyStalled);
                    return Poll::Ready(Some(Err(AttemptError::ClientBodyStalled)));
                }
                Poll::Pending
            }
        }
    }

    fn is_end_stream(&self) -> bool {
        self.inner.as_ref().is_none_or(Body::is_end_stream)
    }

    fn size_hint(&self) -> SizeHint {
        self.inner
            .as_ref()
            .map_or_else(|| SizeHint::with_exact(0), Body::size_hint)
    }
}

impl<B> ErasedBody for Tracked<B>
where
    B: Body<Data = Bytes, Error = hyper::Error> + Send + Unpin + 'static,
{
    fn take_inner(self: Pin<&mut Self>) -> Option<Box<dyn Any + Send>> {
        let this = self.get_mut();
        if this.progress.frames.load(Ordering::Relaxed) != 0 {
            return None;
        }
        this.inner
            .take()
            .map(|b| Box::new(b) as Box<dyn Any + Send>)
    }
}
