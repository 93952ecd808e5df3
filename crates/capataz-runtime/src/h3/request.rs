//! One HTTP/3 request on its own task: its head read, handed to the proxy, the answer sent
//! back (head, data, trailers), and a client going away seen at any point (see `mod.rs`).

use std::sync::Arc;
use std::time::Duration;

use bytes::{Buf, Bytes};
use h3::error::Code;
use h3::server::{RequestResolver, RequestStream};
use http::header;
use http::{Method, Response};
use http_body_util::BodyExt;
use hyper::body::Body as _;
use tokio::sync::Notify;

use super::body::{H3Body, RecvStream};
use super::malformed;
use super::{InFlight, Limits};
use crate::body::RespBody;
use crate::client_body::ClientBody;
use crate::proxy::{ClientInfo, Proxy};

/// The sending half of a request stream.
type SendStream = RequestStream<h3_quinn::SendStream<Bytes>, Bytes>;

/// How long an answer's frame may wait for the client to take it when its body has no limit
/// of its own (capataz's own pages): as a backend's answer's default `body_idle`.
const OWN_ANSWER_IDLE: Duration = Duration::from_secs(30);

/// What a request's task holds.
pub(super) struct Request {
    pub(super) proxy: Arc<Proxy>,
    pub(super) client: Arc<ClientInfo>,
    pub(super) limits: Limits,
    /// Counted in progress on its connection while the task lives.
    pub(super) _in_flight: InFlight,
}

impl Request {
    /// Serves the request `resolver` holds, to its end.
    pub(super) async fn serve(self, resolver: RequestResolver<super::capped::Connection, Bytes>) {
        let head =
            tokio::time::timeout(self.limits.header_read_timeout, resolver.resolve_request());
        let (head, stream) = match head.await {
            Ok(Ok(resolved)) => resolved,
            // An oversized head, answered 431 by h3 itself: counted as a head refused before
            // the proxy saw it, as hyper's 431 on HTTP/1.1 is.
            Ok(Err(h3::error::StreamError::HeaderTooBig { .. })) => {
                self.proxy.count_refused();
                return;
            }
            // A malformed head (h3 reset its stream), a reset, or too slow: no request.
            Ok(Err(error)) => {
                tracing::debug!(%error, "HTTP/3 request head refused");
                return;
            }
            Err(_) => return,
        };
        // Malformed as h2 would find it over HTTP/2 (`malformed.rs`): its stream reset as h2
        // resets it, before the proxy sees it.
        let length = match malformed::check(head.headers()) {
            Ok(length) => length,
            Err(malformed) => {
                tracing::debug!(%malformed, "HTTP/3 request head refused");
                let mut stream = stream;
                stream.stop_sending(Code::H3_MESSAGE_ERROR);
                stream.stop_stream(Code::H3_MESSAGE_ERROR);
                return;
            }
        };
        let (mut send, mut recv) = stream.split();
        let gone = Arc::new(Notify::new());
        // The stream's next event, within the head's own limit: a request that may have no
        // body and whose stream stays open after its head is not complete.
        let first = first_data(&mut recv, head.method(), length);
        let first = match tokio::time::timeout(self.limits.header_read_timeout, first).await {
            // The body ended before its first byte, short of its `Content-Length`: malformed
            // (RFC 9114 section 4.1.2), never relayed as a request without a body.
            Ok(Some(First::Ended)) if length.is_some_and(|length| length > 0) => {
                send.stop_stream(Code::H3_MESSAGE_ERROR);
                return;
            }
            Ok(Some(first)) => first,
            // The client went away before its body's first byte.
            Ok(None) => return,
            Err(_) => {
                recv.stop_sending(Code::H3_REQUEST_INCOMPLETE);
                send.stop_stream(Code::H3_REQUEST_INCOMPLETE);
                return;
            }
        };
        let body = match first {
            First::Ended => ClientBody::Empty,
            First::Data(first) => {
                let body = H3Body::new(recv, first, length, gone.clone());
                ClientBody::Streamed(Box::pin(body))
            }
        };
        let request = head.map(|()| body);
        let answered = tokio::select! {
            answered = self.proxy.clone().handle(request, self.client.clone()) => answered,
            // The proxy's future dropped: the request counted as the client's going away.
            _ = gone.notified() => {
                send.stop_stream(Code::H3_REQUEST_CANCELLED);
                return;
            }
        };
        let Ok(response) = answered;
        send_answer(&mut send, response).await;
    }
}

/// Whether the request has a body, and its first bytes.
enum First {
    /// No body: the stream ended with the head.
    Ended,
    /// A body, and its first bytes when they were already there.
    Data(Option<Bytes>),
}

/// Learns whether the request has a body (the proxy retries a bodiless request, never one
/// with a body): a request that may have none (a safe method without `Content-Length`, or
/// `Content-Length: 0`) waits for its stream's next event; any other looks at what has
/// arrived without waiting. `None`: the stream failed (the client went away).
async fn first_data(recv: &mut RecvStream, method: &Method, length: Option<u64>) -> Option<First> {
    let may_be_bodiless = length == Some(0) || (length.is_none() && method.is_safe());
    let polled = std::future::poll_fn(|cx| {
        let polled = recv.poll_recv_data(cx);
        if polled.is_pending() && !may_be_bodiless {
            return std::task::Poll::Ready(None);
        }
        polled.map(Some)
    })
    .await;
    match polled {
        None => Some(First::Data(None)),
        Some(Ok(Some(mut data))) => Some(First::Data(Some(data.copy_to_bytes(data.remaining())))),
        // The data ended: trailers may follow (rare), read by the body then.
        Some(Ok(None)) => Some(First::Ended),
        Some(Err(_)) => None,
    }
}

/// Sends `response` on `send`: its head (without HTTP/1.1's connection fields, which HTTP/3
/// forbids), its data and its trailers. A client that stops taking it for the body's
/// `client_idle` (the pool's `body_idle`) has its stream reset and the body dropped, letting
/// go of the backend's connection; a client gone drops it the same way.
async fn send_answer(send: &mut SendStream, response: Response<RespBody>) {
    let (mut parts, mut body) = response.into_parts();
    for name in [
        header::CONNECTION,
        header::TRANSFER_ENCODING,
        header::UPGRADE,
        header::HeaderName::from_static("keep-alive"),
        header::HeaderName::from_static("proxy-connection"),
    ] {
        parts.headers.remove(name);
    }
    let idle = body.client_idle().unwrap_or(OWN_ANSWER_IDLE);
    if send
        .send_response(Response::from_parts(parts, ()))
        .await
        .is_err()
    {
        return;
    }
    while !body.is_end_stream() {
        let Some(frame) = body.frame().await else {
            break;
        };
        let Ok(frame) = frame else {
            // The backend's body broke (judged by its lease): the client's stream is cut.
            send.stop_stream(Code::H3_INTERNAL_ERROR);
            return;
        };
        let sent = match frame.into_data() {
            Ok(data) if data.is_empty() => continue,
            Ok(data) => tokio::time::timeout(idle, send.send_data(data)).await,
            Err(frame) => match frame.into_trailers() {
                Ok(trailers) => tokio::time::timeout(idle, send.send_trailers(trailers)).await,
                Err(_) => continue,
            },
        };
        match sent {
            Ok(Ok(())) => {}
            Ok(Err(_)) => return,
            Err(_) => {
                send.stop_stream(Code::H3_REQUEST_CANCELLED);
                return;
            }
        }
    }
    let _ = tokio::time::timeout(idle, send.finish()).await;
}
