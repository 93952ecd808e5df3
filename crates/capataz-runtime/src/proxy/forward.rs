//! One attempt on one backend, HTTP/1.1 or HTTP/2, with its outcome fed to the passive side.

use std::future::Future;
use std::pin::pin;
use std::sync::Arc;
use std::time::Instant;

use bytes::Bytes;
use capataz_h1::chunked;
use capataz_h1::framing::BodyLength;
use capataz_health::Outcome;
use http::header::{self, HeaderMap, HeaderValue};
use http::{Method, Request, Response, Uri, Version};

use super::headers::{origin_form, rewrite_length, strip_hop_by_hop};
use super::tally::Stage;
use super::{ClientInfo, Resend};
use crate::balance::PoolHandle;
use crate::body::{grpc_status, Grpc, Lease, ReqBody, RespBody};
use crate::upstream::{
    self, AttemptError, BackendStream, ExchangeError, ExchangeTimeouts, H2Failure, Outgoing,
};

/// What became of one attempt.
pub(super) enum Forwarded<'a> {
    /// The backend answered (status code given).
    Response(Response<RespBody>, u16),
    /// The backend switched protocols: its answer, its connection and what it sent past the
    /// answer's head.
    Upgraded(Response<RespBody>, BackendStream, Bytes),
    /// Nothing reached the backend; the request comes back intact.
    NotSent(Outgoing<'a, ReqBody>, AttemptError),
    /// The request was sent (at least in part) and no usable answer came.
    Failed(AttemptError),
}

/// One attempt on one backend, with its outcome fed to the passive side (an answer's once its
/// body has ended; see `body::Lease`); `stage` follows it (for the access log).
// Not an `async fn`, whose future would keep `outgoing` and `lease` twice (see `Proxy::handle`).
#[allow(clippy::too_many_arguments, clippy::manual_async_fn)]
pub(super) fn forward<'a, 'f>(
    pool: &'f Arc<PoolHandle>,
    index: usize,
    client: &'f ClientInfo,
    mut outgoing: Outgoing<'a, ReqBody>,
    head: &'f mut Vec<u8>,
    mut lease: Lease,
    upgrade: bool,
    timeouts: ExchangeTimeouts,
    stage: &'f mut Stage,
) -> impl Future<Output = Forwarded<'a>> + 'f
where
    'a: 'f,
{
    async move {
        let backend = &pool.backends[index];
        // A pooled connection the backend closed meanwhile is no fault of the backend: one fresh
        // connection is tried before anything is judged.
        let mut fresh_only = false;
        // One clock reading serves the idle check, the deadline and the latency of a request sent
        // on a pooled connection; a fresh connection reads the clock again once connected.
        let started = Instant::now();
        // A Unix socket's client has no address to name: a LOCAL header.
        let addrs = (!client.unix()).then(|| (client.addr, client.destination()));
        loop {
            let conn = if fresh_only {
                backend.upstream.connect(addrs).await
            } else {
                backend
                    .upstream
                    .acquire(started, lease.private(), addrs)
                    .await
            };
            let conn = match conn {
                Ok(conn) => conn,
                Err(error) => {
                    pool.charge(index, error);
                    return Forwarded::NotSent(outgoing, error);
                }
            };
            stage.now = stage.connected;
            let reused = conn.reused && !fresh_only;
            let sent_at = if reused { started } else { Instant::now() };
            // Pinned where it is made, and awaited through the pin: awaited by value, the
            // exchange's future (several hundred bytes) would be moved (memcpy) from where the
            // call writes it into the place the await keeps it in.
            let sent = pin!(upstream::exchange(
                conn.stream,
                outgoing,
                head,
                upgrade,
                timeouts,
                sent_at
            ));
            match sent.await {
                Err(ExchangeError::NotSent(unsent)) if reused => {
                    // A pooled connection the backend closed meanwhile: one fresh try.
                    outgoing = unsent;
                    fresh_only = true;
                }
                Err(ExchangeError::NotSent(unsent)) => {
                    let error = AttemptError::Send { sent_any: false };
                    pool.charge(index, error);
                    return Forwarded::NotSent(unsent, error);
                }
                Err(ExchangeError::Failed(error)) => {
                    pool.charge(index, error);
                    return Forwarded::Failed(error);
                }
                Ok(answer) => {
                    // A chunked body already broken in what came with the head: a 502 now, as for
                    // a malformed head, rather than a head relayed and a connection cut before any
                    // of its body (hyper would send nothing at all, not even the status).
                    if answer.framing.body == BodyLength::Chunked
                        && chunked::check_start(&answer.buf).is_err()
                    {
                        pool.charge(index, AttemptError::HeadMalformed);
                        return Forwarded::Failed(AttemptError::HeadMalformed);
                    }
                    let status = answer.head.status.as_u16();
                    let answered_at = Instant::now();
                    let latency = answered_at.saturating_duration_since(sent_at);
                    backend.answered(status, latency);
                    lease.answered_after(latency);
                    let mut response = Response::new(RespBody::Full(None));
                    *response.status_mut() = answer.head.status;
                    *response.headers_mut() = answer.head.headers;
                    if status == 101 {
                        // The connection becomes the tunnel; the passive side hears of the 101.
                        pool.observe_answered(index, Outcome::Status(status), Some(latency));
                        drop(lease);
                        return Forwarded::Upgraded(response, answer.stream, answer.buf.freeze());
                    }
                    if answer.framing.rewrite_length {
                        rewrite_length(response.headers_mut(), answer.framing.body);
                    }
                    // A backend asking for relief gets less weight, not an error on its record.
                    // Read before the strip below: a `Retry-After` the backend's `Connection`
                    // names is for capataz, the hop's end, to read (RFC 9110 section 7.6.1).
                    match pool.shed_request(status, response.headers()) {
                        Some(relief) => pool.shed(index, status, relief, latency),
                        None => lease.judge_at_end(Outcome::Status(status)),
                    }
                    // The answer relayed: its hop-by-hop fields out. The head's parse noted
                    // whether it has any (a lone `Connection: keep-alive` or `close`, nearly
                    // every answer's, it did not keep: `head::parse_relayed`), so most answers
                    // are not looked at again.
                    if answer.head.hop_by_hop {
                        strip_hop_by_hop(response.headers_mut(), false);
                    }
                    *response.body_mut() = RespBody::upstream(
                        answer.stream,
                        answer.buf,
                        answer.framing,
                        lease,
                        answered_at,
                        timeouts.body_idle,
                    );
                    return Forwarded::Response(response, status);
                }
            }
        }
    }
}

/// One attempt on an HTTP/2 backend (see `upstream::exchange_h2`), with its outcome fed to the
/// passive side: a gRPC call's by its `grpc-status` (in the head of a trailers-only answer,
/// else in the trailers, judged when the body ends).
///
/// A request the backend did not take because its connection closed ([`AttemptError::GoneAway`]:
/// above a graceful GOAWAY, as nginx sends after `keepalive_requests`, or never handed to the
/// closing connection) is sent once more to the same backend on a new connection, when it is
/// back intact or can be rebuilt (`resend`: a bodiless request), as `forward` tries a fresh
/// connection after a pooled one found closed: the backend is not failing, and a pool of one
/// backend has nowhere else to send it.
pub(super) async fn forward_h2<'a>(
    pool: &Arc<PoolHandle>,
    index: usize,
    mut request: Request<ReqBody>,
    (mut lease, resend): (Lease, Option<&Resend>),
    timeouts: ExchangeTimeouts,
) -> Forwarded<'a> {
    let backend = &pool.backends[index];
    // Only set up for pools that speak HTTP/2.
    let Some(conns) = backend.upstream.h2() else {
        return Forwarded::Failed(AttemptError::ConnectLocal);
    };
    let host = h2_target(
        &mut request,
        backend.upstream.tls().is_some(),
        &backend.address,
    );
    let sent_at = Instant::now();
    let exchanged = upstream::exchange_h2(&backend.upstream, conns, request, timeouts).await;
    let exchanged = match exchanged {
        // Never handed to the closing connection: the request as it was, to a new one.
        Err(H2Failure::NotSent(request, AttemptError::GoneAway)) => {
            upstream::exchange_h2(&backend.upstream, conns, request, timeouts).await
        }
        Err(H2Failure::Failed(AttemptError::GoneAway)) => match resend.and_then(Resend::rebuilt) {
            Some(mut again) => {
                let tls = backend.upstream.tls().is_some();
                h2_target(&mut again, tls, &backend.address);
                upstream::exchange_h2(&backend.upstream, conns, again, timeouts).await
            }
            None => Err(H2Failure::Failed(AttemptError::GoneAway)),
        },
        other => other,
    };
    let response = match exchanged {
        Ok(response) => response,
        Err(H2Failure::NotSent(mut request, error)) => {
            pool.charge(index, error);
            // Back to how the proxy built it, for another backend.
            *request.uri_mut() = origin_form(request.uri());
            if let Some(host) = host {
                request.headers_mut().insert(header::HOST, host);
            }
            return Forwarded::NotSent(Outgoing::Request(request), error);
        }
        Err(H2Failure::Failed(error)) => {
            pool.charge(index, error);
            return Forwarded::Failed(error);
        }
    };
    let status = response.status().as_u16();
    let latency = Instant::now().saturating_duration_since(sent_at);
    backend.answered(status, latency);
    lease.answered_after(latency);
    let (parts, body) = response.into_parts();
    let grpc_call = status == 200
        && parts
            .headers
            .get(header::CONTENT_TYPE)
            .is_some_and(|ct| ct.as_bytes().starts_with(b"application/grpc"));
    let grpc = match (grpc_call, grpc_status(&parts.headers)) {
        (true, Some(code)) => {
            lease.judge_at_end(Outcome::Grpc(code));
            Grpc::No
        }
        (true, None) => {
            lease.judge_at_end(Outcome::Status(status));
            Grpc::Pending
        }
        (false, _) => {
            // A backend asking for relief gets less weight, not an error on its record.
            match pool.shed_request(status, &parts.headers) {
                Some(relief) => pool.shed(index, status, relief, latency),
                None => lease.judge_at_end(Outcome::Status(status)),
            }
            Grpc::No
        }
    };
    let mut relayed = Response::new(RespBody::h2(body, lease, grpc, timeouts.body_idle));
    *relayed.status_mut() = parts.status;
    *relayed.headers_mut() = parts.headers;
    Forwarded::Response(relayed, status)
}

/// The trailer field names an HTTP/1.1 client may be sent (hyper's HTTP/1.1 server sends only
/// the trailers a response's `Trailer` header names, and only to a client that asked with `TE:
/// trailers`): the backend's own `Trailer` (taken out, it is hop-by-hop in form), else, for a
/// gRPC answer whose status is still to come, gRPC's.
pub(super) fn trailer_names(headers: &mut HeaderMap) -> Option<HeaderValue> {
    if let Some(names) = headers.remove(header::TRAILER) {
        return Some(names);
    }
    let grpc = headers
        .get(header::CONTENT_TYPE)
        .is_some_and(|ct| ct.as_bytes().starts_with(b"application/grpc"));
    (grpc && !headers.contains_key("grpc-status"))
        .then(|| HeaderValue::from_static("grpc-status, grpc-message, grpc-status-details-bin"))
}

/// Makes `request` (origin-form, as the proxy builds it) an HTTP/2 request: the scheme, and
/// the authority from its Host, else the backend's address. The `Host` field itself is taken
/// out: `:authority` carries it (RFC 9113 section 8.3.1), and a backend may refuse a request
/// with both (nginx: "client sent duplicate host header", 400). A gRPC call gets `TE:
/// trailers`, which gRPC servers require (hop-by-hop, it was stripped). Returns the `Host`
/// taken out, to put back if the request goes to another backend.
fn h2_target(
    request: &mut Request<ReqBody>,
    tls: bool,
    backend_address: &str,
) -> Option<HeaderValue> {
    let host = request.headers_mut().remove(header::HOST);
    let authority = host
        .as_ref()
        .and_then(|host| http::uri::Authority::try_from(host.as_bytes()).ok())
        .or_else(|| http::uri::Authority::try_from(backend_address).ok());
    let mut parts = http::uri::Parts::default();
    parts.scheme = Some(if tls {
        http::uri::Scheme::HTTPS
    } else {
        http::uri::Scheme::HTTP
    });
    parts.authority = authority;
    parts.path_and_query = request
        .uri()
        .path_and_query()
        .cloned()
        .or_else(|| Some(http::uri::PathAndQuery::from_static("/")));
    if let Ok(uri) = Uri::from_parts(parts) {
        *request.uri_mut() = uri;
    }
    let grpc = request
        .headers()
        .get(header::CONTENT_TYPE)
        .is_some_and(|ct| ct.as_bytes().starts_with(b"application/grpc"));
    if grpc {
        request
            .headers_mut()
            .insert(header::TE, HeaderValue::from_static("trailers"));
    }
    host
}

pub(super) fn build_request(
    method: Method,
    uri: Uri,
    headers: HeaderMap,
    body: ReqBody,
) -> Request<ReqBody> {
    let mut request = Request::new(body);
    *request.method_mut() = method;
    *request.uri_mut() = uri;
    *request.version_mut() = Version::HTTP_11;
    *request.headers_mut() = headers;
    request
}
