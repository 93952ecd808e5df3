//! HTTP/2 client connections served by h2's server directly, without hyper's HTTP/2 glue.
//!
//! SPIKE: h2c and ALPN h2 requests without extended CONNECT; see BENCHMARKS.md.
//!
//! The connection's task accepts streams ([`Server`], polled by `drive` as hyper's connection
//! was) and spawns one task per stream ([`stream`]) under the stall guard (`stall.rs`). A
//! stream's task polls the request's future (the proxy's, boxed) and, while it waits, the
//! client's RST_STREAM; then sends the answer's head and pipes its body into h2 as the client's
//! window opens, and its trailers.

use std::future::{poll_fn, Future};
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use bytes::Bytes;
use h2::server::{Connection, SendResponse};
use h2::SendStream;
use hyper::body::Body;

use super::stall::{guard, Stall};
use super::{Limits, Tracked};
use crate::client_body::{ClientBody, H2Body};

/// h2's server with the listener's settings and the attack limits.
pub(super) fn builder(limits: &Limits) -> h2::server::Builder {
    let settings = &limits.http2;
    let mut builder = h2::server::Builder::new();
    builder
        .max_concurrent_streams(settings.max_concurrent_streams)
        .initial_window_size(settings.initial_stream_window_size)
        .initial_connection_window_size(settings.initial_connection_window_size)
        .max_frame_size(settings.max_frame_size)
        .max_header_list_size(limits.max_header_list)
        .max_pending_accept_reset_streams(super::MAX_PENDING_ACCEPT_RESETS)
        .max_local_error_reset_streams(Some(super::MAX_LOCAL_ERROR_RESETS))
        .max_send_buffer_size(super::MAX_SEND_BUF)
        .enable_connect_protocol();
    builder
}

/// One connection: accepts its streams and spawns a task for each.
pub(super) struct Server<IO, F> {
    pub(super) conn: Connection<IO, Bytes>,
    pub(super) call: F,
}

impl<IO, F: Unpin> Server<IO, F>
where
    IO: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin,
{
    pub(super) fn graceful_shutdown(self: Pin<&mut Self>) {
        self.get_mut().conn.graceful_shutdown();
    }
}

impl<IO, F, Fut> Future for Server<IO, F>
where
    IO: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin,
    F: Fn(http::Request<ClientBody>) -> Fut + Unpin,
    Fut:
        Future<Output = Result<http::Response<Tracked>, std::convert::Infallible>> + Send + 'static,
{
    type Output = Result<(), h2::Error>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = self.get_mut();
        loop {
            match this.conn.poll_accept(cx) {
                Poll::Pending => return Poll::Pending,
                Poll::Ready(None) => return Poll::Ready(Ok(())),
                Poll::Ready(Some(Err(error))) => return Poll::Ready(Err(error)),
                Poll::Ready(Some(Ok((req, respond)))) => {
                    let length = content_length(req.headers());
                    let req = req.map(|recv| ClientBody::H2(H2Body::new(recv, length)));
                    let answer = Box::pin((this.call)(req));
                    tokio::spawn(guard(stream(answer, respond), Arc::new(Stall::default())));
                }
            }
        }
    }
}

fn content_length(headers: &http::HeaderMap) -> Option<u64> {
    headers
        .get(http::header::CONTENT_LENGTH)
        .and_then(|value| value.to_str().ok())
        .and_then(|value| value.parse().ok())
}

/// One stream's task: the answer, then its body.
async fn stream<Fut>(mut answer: Pin<Box<Fut>>, mut respond: SendResponse<Bytes>)
where
    Fut: Future<Output = Result<http::Response<Tracked>, std::convert::Infallible>>,
{
    let response = poll_fn(|cx| {
        if let Poll::Ready(Ok(response)) = answer.as_mut().poll(cx) {
            return Poll::Ready(Some(response));
        }
        match respond.poll_reset(cx) {
            // Reset by the client, or the connection failed: the request is dropped.
            Poll::Ready(_) => Poll::Ready(None),
            Poll::Pending => Poll::Pending,
        }
    })
    .await;
    drop(answer);
    let Some(response) = response else { return };
    let (mut head, mut body) = response.into_parts();
    strip_connection_fields(&mut head.headers);
    if !head.headers.contains_key(http::header::DATE) {
        head.headers.insert(http::header::DATE, date());
    }
    let head = http::Response::from_parts(head, ());
    if body.is_end_stream() {
        let _ = respond.send_response(head, true);
        return;
    }
    let mut head = head;
    if let Some(length) = body.size_hint().exact() {
        head.headers_mut()
            .entry(http::header::CONTENT_LENGTH)
            .or_insert_with(|| http::HeaderValue::from(length));
    }
    let Ok(mut send) = respond.send_response(head, false) else {
        respond.send_reset(h2::Reason::INTERNAL_ERROR);
        return;
    };
    let mut held: Option<(Bytes, bool)> = None;
    poll_fn(|cx| pipe(&mut body, &mut send, &mut held, cx)).await;
}

/// Pipes `body` into `send` as the client's window allows; ends when the body has been sent,
/// or the stream is reset.
fn pipe(
    body: &mut Tracked,
    send: &mut SendStream<Bytes>,
    held: &mut Option<(Bytes, bool)>,
    cx: &mut Context<'_>,
) -> Poll<()> {
    loop {
        if held.is_some() {
            while send.capacity() == 0 {
                match send.poll_capacity(cx) {
                    Poll::Pending => return reset_or_pending(send, cx),
                    Poll::Ready(Some(Ok(0))) => {}
                    Poll::Ready(Some(Ok(_))) => break,
                    Poll::Ready(Some(Err(_)) | None) => return Poll::Ready(()),
                }
            }
            let (data, end) = held.take().expect("checked");
            if send.send_data(data, end).is_err() || end {
                return Poll::Ready(());
            }
            continue;
        }
        match Pin::new(&mut *body).poll_frame(cx) {
            Poll::Pending => return reset_or_pending(send, cx),
            Poll::Ready(Some(Ok(frame))) => match frame.into_data() {
                Ok(data) => {
                    let end = body.is_end_stream();
                    if end && !wait_last() {
                        // The last chunk: nothing more will be read from the body, so nothing is
                        // gained by waiting for the window; h2 holds it until the window opens.
                        let _ = send.send_data(data, true);
                        return Poll::Ready(());
                    }
                    if data.is_empty() {
                        if send.send_data(data, end).is_err() || end {
                            return Poll::Ready(());
                        }
                        continue;
                    }
                    send.reserve_capacity(1);
                    *held = Some((data, end));
                }
                Err(frame) => {
                    if let Ok(trailers) = frame.into_trailers() {
                        send.reserve_capacity(0);
                        let _ = send.send_trailers(trailers);
                        return Poll::Ready(());
                    }
                }
            },
            Poll::Ready(Some(Err(_))) => {
                send.send_reset(h2::Reason::INTERNAL_ERROR);
                return Poll::Ready(());
            }
            Poll::Ready(None) => {
                let _ = send.send_data(Bytes::new(), true);
                return Poll::Ready(());
            }
        }
    }
}

/// Connection-specific fields, which h2 refuses to send (RFC 9113 8.2.2): as hyper's
/// `strip_connection_headers` for a response. capataz's own answers may carry `connection`.
fn strip_connection_fields(headers: &mut http::HeaderMap) {
    // One pass over the names first: the answers of backends come here already stripped
    // (`proxy/headers.rs`), and a removal hashes its name, six of them about 1,000 instructions.
    let found = headers.keys().any(|name| {
        name == http::header::CONNECTION
            || name == http::header::TRANSFER_ENCODING
            || name == http::header::UPGRADE
            || name == http::header::TE
            || name.as_str() == "keep-alive"
            || name.as_str() == "proxy-connection"
    });
    if !found {
        return;
    }
    for name in [
        http::header::HeaderName::from_static("keep-alive"),
        http::header::HeaderName::from_static("proxy-connection"),
        http::header::TRANSFER_ENCODING,
        http::header::UPGRADE,
        http::header::TE,
    ] {
        headers.remove(name);
    }
    if let Some(connection) = headers.remove(http::header::CONNECTION) {
        if let Ok(names) = connection.to_str() {
            for name in names.split(',') {
                headers.remove(name.trim());
            }
        }
    }
}

/// SPIKE: `CAPATAZ_H2_WAIT_LAST` set: the last chunk waits for the window as the others.
fn wait_last() -> bool {
    static WAIT: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *WAIT.get_or_init(|| std::env::var_os("CAPATAZ_H2_WAIT_LAST").is_some())
}

/// Pending, unless the stream has been reset (then the pipe ends); registers for the reset.
fn reset_or_pending(send: &mut SendStream<Bytes>, cx: &mut Context<'_>) -> Poll<()> {
    match send.poll_reset(cx) {
        Poll::Ready(_) => Poll::Ready(()),
        Poll::Pending => Poll::Pending,
    }
}

/// The `date` header hyper added to answers without one: formatted once a second per thread.
fn date() -> http::HeaderValue {
    use std::cell::RefCell;
    use std::time::{SystemTime, UNIX_EPOCH};
    thread_local! {
        static CACHED: RefCell<(u64, Option<http::HeaderValue>)> = const { RefCell::new((0, None)) };
    }
    let now = SystemTime::now();
    let secs = now.duration_since(UNIX_EPOCH).map_or(0, |d| d.as_secs());
    CACHED.with(|cached| {
        let mut cached = cached.borrow_mut();
        if cached.0 != secs || cached.1.is_none() {
            let text = httpdate::fmt_http_date(now);
            *cached = (secs, http::HeaderValue::from_str(&text).ok());
        }
        cached
            .1
            .clone()
            .unwrap_or_else(|| http::HeaderValue::from_static(""))
    })
}
