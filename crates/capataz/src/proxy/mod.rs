//! The request path: route, pick a backend from the pool's snapshot, forward, retry, relay.
//!
//! Every response, and every failure to get one that was the backend's fault, is fed to the
//! pool's passive side; each failure is classified once, as an [`AttemptError`], which says
//! whose fault it was, whether a retry is safe and what the client gets. Retries go to a
//! backend not yet tried: always when nothing was sent (no connection could be made), and for
//! bodiless idempotent requests also after a reset, a timeout before the response headers, a
//! malformed answer, or a 502/503/504, within the pool's retry budget. A failure that is the
//! client's (its body stalled, was malformed, or it went away) is never retried nor charged.

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Instant;

use capataz_health::Outcome;
use http::header::{self, HeaderMap, HeaderValue};
use http::{Method, Request, Response, StatusCode, Uri, Version};
use hyper::body::{Body as _, Incoming};
use hyper_util::rt::TokioIo;

use bytes::Bytes;
use tokio::io::AsyncWriteExt;

use crate::access_log::{AccessLog, AccessRecord, Phase, Termination};
use crate::acme::Http01Tokens;
use crate::balance::PoolHandle;
use crate::body::{grpc_status, BodyRead, Grpc, Lease, ReqBody, RespBody};
use crate::config::{BackendProtocol, ConnectionReuse, ListenerConfig};
use crate::h1::chunked;
use crate::h1::framing::{self, BodyLength};
use crate::instruments::{AnsweredBy, ListenerMetrics, MethodClass, RouteMetrics};
use crate::tls::TlsInfo;
use crate::upstream::{
    self, AttemptError, BackendSlots, BackendStream, ExchangeError, ExchangeTimeouts, H2Failure,
    Outgoing, PrivateIdle, Transport,
};

mod headers;
mod pages;
mod websocket;

use headers::{
    add_forwarded_headers, head_size, origin_form, request_host, rewrite_length, strip_hop_by_hop,
    strip_port, too_many_fields, wants_upgrade, RequestHost, MIN_HYPER_BUFFER,
};
use pages::{error_page, failure_page, http01_page, https_redirect_page, reject_page, Failure};

/// The most backends one request may try (first attempt plus retries).
const MAX_TRIES: usize = 11;

/// The backends one request has tried, without a heap allocation.
#[derive(Default)]
struct Tried {
    backends: [usize; MAX_TRIES],
    len: usize,
}

impl Tried {
    fn push(&mut self, backend: usize) {
        if self.len < MAX_TRIES {
            self.backends[self.len] = backend;
            self.len += 1;
        }
    }

    fn has_room(&self) -> bool {
        self.len < MAX_TRIES
    }

    fn as_slice(&self) -> &[usize] {
        &self.backends[..self.len]
    }
}

/// One route, resolved to its pool.
#[derive(Debug)]
struct Route {
    host: Option<String>,
    path_prefix: String,
    pool: Arc<PoolHandle>,
    /// Its requests' counters.
    metrics: RouteMetrics,
}

/// What a request's answer is counted under: the route that took it (none: refused before
/// routing, or no route matched) and who wrote the answer; and, with an access log, what its
/// record needs: the last backend tried, the attempts, the last failure, where the request is
/// (for a client that goes away), and the record itself.
struct Tally {
    route: Option<usize>,
    by: AnsweredBy,
    backend: Option<usize>,
    attempts: u32,
    failure: Option<Failure>,
    stage: Stage,
    /// The access log record (`None` without an access log): emitted when the answer's body
    /// ends, or, if the request is dropped first (the client went away), when the tally is.
    record: Option<(Box<AccessRecord>, Arc<AccessLog>, Arc<PoolNames>)>,
}

/// The names an access log record takes from the proxy (`None` unless logging).
#[derive(Debug)]
struct PoolNames {
    /// Per route: its label, and its pool's name and backends' names.
    routes: Vec<(String, Arc<str>, Vec<Arc<str>>)>,
}

/// Where a request is: the phase a client going away ends it in.
#[derive(Clone, Copy)]
struct Stage {
    now: Phase,
    /// The phase once connected: `Headers` for a bodiless request (its head goes out at
    /// once), else `Send` (its body may still be flowing).
    connected: Phase,
}

impl Tally {
    /// Fills `record` with the route, pool, backend, attempts and status.
    fn fill(&self, record: &mut AccessRecord, names: &PoolNames, status: Option<u16>) {
        record.status = status;
        record.attempts = self.attempts;
        if let Some((label, pool, backends)) = self.route.and_then(|r| names.routes.get(r)) {
            record.route = Some(label.clone());
            record.pool = Some(pool.clone());
            record.backend = self.backend.and_then(|b| backends.get(b)).cloned();
        }
    }

    /// Who ended a request whose answer is the one now written, if already decided: capataz's
    /// own page after a failure, or before any attempt. A backend's answer is decided when its
    /// body ends.
    fn ending(&self) -> Option<Termination> {
        if self.by == AnsweredBy::Backend {
            return None;
        }
        Some(match self.failure {
            Some(Failure::Attempt(error)) => Termination::of(error),
            Some(Failure::Status(_)) => Termination {
                ended_by: crate::access_log::EndedBy::Backend,
                phase: Phase::Headers,
            },
            None => Termination::REFUSED,
        })
    }

    /// Notes an attempt on backend `index` starting.
    fn attempt(&mut self, index: usize) {
        self.backend = Some(index);
        self.attempts += 1;
        self.stage.now = Phase::Connect;
    }
}

impl Drop for Tally {
    fn drop(&mut self) {
        // Still here: the request was dropped before its answer (the client went away).
        if let Some((mut record, log, names)) = self.record.take() {
            self.fill(&mut record, &names, None);
            record.termination = Termination::client_gone(self.stage.now);
            log.emit(record);
        }
    }
}

/// The request handler of one listener.
#[derive(Debug)]
pub struct Proxy {
    routes: Vec<Route>,
    /// Whether any route names a host (else the request's host is never looked at).
    any_host: bool,
    max_header_bytes: usize,
    /// Whether `X-Forwarded-For` and `X-Forwarded-Proto` are set.
    forwarded_headers: bool,
    /// The longest wait for the next piece of a client's body.
    request_body_timeout: std::time::Duration,
    /// How long an upgraded connection may move no byte either way before it is closed.
    tunnel_idle: std::time::Duration,
    /// The listener's client-side metrics.
    metrics: Arc<ListenerMetrics>,
    /// The counters of requests no route took.
    unrouted: RouteMetrics,
    /// The listener's access log, if it has one, and the names its records take.
    access_log: Option<(Arc<AccessLog>, Arc<PoolNames>)>,
    /// The pending HTTP-01 tokens, answered before routing (plaintext listeners only).
    http01: Option<Arc<Http01Tokens>>,
    /// The HTTPS port every request is redirected to, instead of routing (`https_redirect`).
    https_redirect: Option<u16>,
}

impl Proxy {
    /// The listener's access log this proxy writes to, if it has one.
    pub(crate) fn access_log(&self) -> Option<Arc<AccessLog>> {
        self.access_log.as_ref().map(|(log, _)| log.clone())
    }

    /// The handler of `listener`, whose routes' `pool` indexes refer to `pools` (the pools'
    /// request-path handles: the proxy never sees the health runtime), counting into
    /// `metrics`, the listener's, answering the pending HTTP-01 tokens of `http01` if given.
    pub(crate) fn new(
        listener: &ListenerConfig,
        pools: &[Arc<PoolHandle>],
        metrics: Arc<ListenerMetrics>,
        access_log: Option<Arc<AccessLog>>,
        http01: Option<Arc<Http01Tokens>>,
    ) -> Proxy {
        let routes = &listener.routes;
        let access_log = access_log.map(|log| {
            let names = routes
                .iter()
                .map(|r| {
                    let pool = &pools[r.pool];
                    (
                        route_label(r.host.as_deref(), &r.path_prefix),
                        pool.name.clone(),
                        pool.backends.iter().map(|b| b.name.clone()).collect(),
                    )
                })
                .collect();
            (log, Arc::new(PoolNames { routes: names }))
        });
        Proxy {
            routes: routes
                .iter()
                .map(|r| {
                    let pool = pools[r.pool].clone();
                    let label = route_label(r.host.as_deref(), &r.path_prefix);
                    Route {
                        host: r.host.clone(),
                        path_prefix: r.path_prefix.clone(),
                        metrics: metrics.route(&label, &pool.name),
                        pool,
                    }
                })
                .collect(),
            any_host: routes.iter().any(|r| r.host.is_some()),
            max_header_bytes: listener.max_header_bytes,
            forwarded_headers: listener.forwarded_headers,
            request_body_timeout: listener.request_body_timeout,
            tunnel_idle: listener.idle_timeout,
            unrouted: metrics.route("", ""),
            metrics,
            access_log,
            http01,
            https_redirect: listener.https_redirect,
        }
    }

    /// The listener's client-side metrics.
    pub(crate) fn metrics(&self) -> &Arc<ListenerMetrics> {
        &self.metrics
    }

    /// Counts a request hyper refused before the proxy saw it (a malformed or oversized head),
    /// answered with a 4xx of its own.
    pub(crate) fn count_refused(&self) {
        self.unrouted
            .answered(MethodClass::OTHER, 400, AnsweredBy::Capataz);
    }

    /// The index of the first route matching `host` (without its port) and `path`.
    fn route(&self, host: Option<&str>, path: &str) -> Option<usize> {
        let host = host.map(strip_port);
        self.routes.iter().position(|route| {
            let host_ok = match (&route.host, host) {
                (None, _) => true,
                (Some(want), Some(got)) => want.eq_ignore_ascii_case(got),
                (Some(_), None) => false,
            };
            host_ok && path.starts_with(route.path_prefix.as_str())
        })
    }

    /// Serves one client request, and counts its answer.
    pub async fn handle(
        self: Arc<Self>,
        req: Request<Incoming>,
        client: Arc<ClientInfo>,
    ) -> Result<Response<RespBody>, Infallible> {
        if req.version() == Version::HTTP_2 && too_many_fields(req.uri(), req.headers()) {
            // As an HTTP/1.1 head with as many, which hyper refuses before the proxy sees it:
            // 431, counted as a refused head, not logged.
            self.count_refused();
            return Ok(error_page(
                StatusCode::REQUEST_HEADER_FIELDS_TOO_LARGE,
                "too many header fields",
            ));
        }
        let method = MethodClass::of(req.method());
        let mut tally = Tally {
            route: None,
            by: AnsweredBy::Capataz,
            backend: None,
            attempts: 0,
            failure: None,
            stage: Stage {
                now: Phase::Request,
                connected: Phase::Send,
            },
            record: None,
        };
        if let Some((log, names)) = &self.access_log {
            let mut record = Box::new(AccessRecord::start(
                client.addr,
                req.method(),
                req.uri(),
                req.version(),
                req.headers(),
            ));
            if let Some(tls) = &client.tls {
                record.set_tls(tls.version, tls.sni.as_deref());
            }
            tally.record = Some((record, log.clone(), names.clone()));
        }
        let Ok(mut response) = self.respond(req, client, &mut tally).await;
        let counters = match tally.route {
            Some(index) => &self.routes[index].metrics,
            None => &self.unrouted,
        };
        let status = response.status().as_u16();
        counters.answered(method, status, tally.by);
        if let Some((mut record, log, names)) = tally.record.take() {
            tally.fill(&mut record, &names, Some(status));
            let ending = tally.ending();
            let body = std::mem::replace(response.body_mut(), RespBody::Full(None));
            *response.body_mut() = RespBody::logged(body, record, log, ending);
        }
        Ok(response)
    }

    /// Serves one client request, noting in `tally` the route it took and who answered.
    async fn respond(
        &self,
        mut req: Request<Incoming>,
        client: Arc<ClientInfo>,
        tally: &mut Tally,
    ) -> Result<Response<RespBody>, Infallible> {
        if self.max_header_bytes < MIN_HYPER_BUFFER && head_size(&req) > self.max_header_bytes {
            return Ok(error_page(
                StatusCode::REQUEST_HEADER_FIELDS_TOO_LARGE,
                "request header fields too large",
            ));
        }
        // The one tunnel over HTTP/2: a WebSocket by extended CONNECT (RFC 8441), relayed to an
        // HTTP/1.1 backend as an upgrade. A plain CONNECT, or one for another protocol: 501.
        let websocket = websocket::is_websocket_connect(&req);
        if req.method() == Method::CONNECT && req.version() == Version::HTTP_2 && !websocket {
            return Ok(error_page(
                StatusCode::NOT_IMPLEMENTED,
                "CONNECT over HTTP/2 is supported only as an extended CONNECT for websocket",
            ));
        }
        if !framing::request_codings_ok(req.headers()) {
            let mut page = error_page(
                StatusCode::BAD_REQUEST,
                "Transfer-Encoding other than chunked once",
            );
            page.headers_mut()
                .insert(header::CONNECTION, HeaderValue::from_static("close"));
            return Ok(page);
        }
        if let Some(answer) = self
            .http01
            .as_ref()
            .and_then(|tokens| tokens.answer(req.method(), req.uri().path()))
        {
            return Ok(http01_page(answer));
        }
        let host = match request_host(&req) {
            Ok(host) => host,
            Err(why) => {
                let mut page = error_page(StatusCode::BAD_REQUEST, why);
                page.headers_mut()
                    .insert(header::CONNECTION, HeaderValue::from_static("close"));
                return Ok(page);
            }
        };
        if let Some(port) = self.https_redirect {
            let host = host.as_str().map(strip_port);
            return Ok(https_redirect_page(host, req.uri(), port));
        }
        let route_host = if self.any_host { host.as_str() } else { None };
        let Some(route) = self.route(route_host, req.uri().path()) else {
            return Ok(error_page(
                StatusCode::NOT_FOUND,
                "no route matches this host and path",
            ));
        };
        tally.route = Some(route);
        let pool = self.routes[route].pool.clone();
        // An HTTP/1.0 absolute-form request without Host: the backend gets the host the route
        // was chosen by.
        let add_host = match host {
            RequestHost::Target(authority) => HeaderValue::from_str(authority.as_str()).ok(),
            _ => None,
        };
        if let Some(value) = add_host {
            req.headers_mut().insert(header::HOST, value);
        }
        pool.budget.on_request();
        let upgrade = websocket || wants_upgrade(req.headers());
        let h2 = pool.config.protocol != BackendProtocol::Http1;
        if upgrade && h2 {
            return Ok(error_page(
                StatusCode::NOT_IMPLEMENTED,
                "upgrades are not relayed to HTTP/2 backends",
            ));
        }
        let client_upgrade = upgrade.then(|| hyper::upgrade::on(&mut req));
        let (mut parts, body) = req.into_parts();
        strip_hop_by_hop(&mut parts.headers, upgrade);
        if websocket {
            websocket::to_http1_handshake(&mut parts.method, &mut parts.headers);
        }
        if self.forwarded_headers {
            add_forwarded_headers(&mut parts.headers, &client);
        }
        let uri = origin_form(&parts.uri);
        let bodiless = body.is_end_stream();
        if bodiless {
            tally.stage.connected = Phase::Headers;
        }
        let replayable = bodiless && !upgrade && is_idempotent(&parts.method);
        let mut retries_left = pool.config.retries.attempts;
        // A resend to another backend sends the head encoded for the first attempt again, byte
        // for byte; it needs only the method besides (a copy without allocation for the
        // methods that are replayable).
        let resend_method = replayable.then(|| parts.method.clone());
        // HTTP/2 has no head bytes to resend: a bodiless request is rebuilt from its parts (a
        // stream refused unprocessed may go elsewhere whatever its method).
        let h2_resend =
            (h2 && bodiless).then(|| (parts.method.clone(), uri.clone(), parts.headers.clone()));
        let mut head = Vec::with_capacity(256);
        // An HTTP/1 client connection hears when the body has been read (bodiless: it knows).
        let hook = (!bodiless && parts.version != Version::HTTP_2)
            .then(|| client.body_read.clone())
            .flatten();
        let mut pending = Some(Outgoing::Request(build_request(
            parts.method,
            uri,
            parts.headers,
            ReqBody::Incoming(body, hook),
        )));
        let mut tried = Tried::default();
        let mut failure = None;
        let timeouts = ExchangeTimeouts {
            response_header: pool.config.timeouts.response_header,
            body_idle: pool.config.timeouts.body_idle,
            request_body: self.request_body_timeout,
        };
        loop {
            // Each attempt on an HTTP/1.1 pool holds one of the client connection's backend
            // slots (HTTP/2 clients: `max_backend_connections`); a bodiless one waits for one
            // if need be, one with a body never does (`upstream::slots`: its unread body would
            // hold the connection's window that the streams holding the slots need).
            let slot = if h2 {
                None
            } else if bodiless {
                client.backend_slots.acquire().await
            } else {
                client.backend_slots.try_acquire()
            };
            let snapshot = pool.snapshot();
            let picked =
                snapshot.pick(pool.config.algorithm, &pool.cursor, tried.as_slice(), |b| {
                    pool.backends[b].in_flight.load(Ordering::Relaxed)
                });
            let all_down = snapshot.all_down;
            drop(snapshot);
            let Some(index) = picked else {
                return Ok(match failure {
                    Some(failure) => failure_page(failure),
                    None => {
                        pool.metrics.reject();
                        reject_page(&pool, all_down)
                    }
                });
            };
            tried.push(index);
            tally.attempt(index);
            if h2 {
                let request = match pending.take() {
                    Some(Outgoing::Request(request)) => request,
                    _ => match &h2_resend {
                        Some((method, uri, headers)) => build_request(
                            method.clone(),
                            uri.clone(),
                            headers.clone(),
                            ReqBody::Empty,
                        ),
                        None => {
                            let why =
                                failure.unwrap_or(Failure::Attempt(AttemptError::HeadTimeout));
                            return Ok(failure_page(why));
                        }
                    },
                };
                let lease = Lease::new(pool.clone(), index, None);
                // Connecting happens within the exchange: the whole wait counts as sending.
                tally.stage.now = Phase::Send;
                match forward_h2(&pool, index, request, lease, timeouts).await {
                    Forwarded::Response(mut response, status) => {
                        let retry_status = matches!(status, 502..=504);
                        if retry_status && replayable && may_retry(&pool, &mut retries_left, &tried)
                        {
                            failure = Some(Failure::Status(status));
                            tally.failure = failure;
                            continue;
                        }
                        let trailer = trailer_names(response.headers_mut());
                        strip_hop_by_hop(response.headers_mut(), false);
                        if let Some(names) = trailer {
                            response.headers_mut().insert(header::TRAILER, names);
                        }
                        tally.by = AnsweredBy::Backend;
                        return Ok(response);
                    }
                    Forwarded::NotSent(outgoing, why) => {
                        failure = Some(Failure::Attempt(why));
                        tally.failure = failure;
                        pending = Some(outgoing);
                        if may_retry(&pool, &mut retries_left, &tried) {
                            continue;
                        }
                        return Ok(failure_page(Failure::Attempt(why)));
                    }
                    Forwarded::Failed(why) => {
                        failure = Some(Failure::Attempt(why));
                        tally.failure = failure;
                        let again = why.retry_safe(replayable)
                            && (replayable || (why.nothing_sent() && h2_resend.is_some()));
                        if again && may_retry(&pool, &mut retries_left, &tried) {
                            continue;
                        }
                        return Ok(failure_page(Failure::Attempt(why)));
                    }
                    // HTTP/2 answers are never upgrades (refused above).
                    Forwarded::Upgraded(response, _, _) => return Ok(response),
                }
            }
            let outgoing = match pending.take() {
                Some(outgoing) => outgoing,
                None => match &resend_method {
                    Some(method) => Outgoing::Resend(method),
                    // Unreachable: a request that is not replayable is not retried once sent.
                    None => {
                        let why = failure.unwrap_or(Failure::Attempt(AttemptError::HeadTimeout));
                        return Ok(failure_page(why));
                    }
                },
            };
            let private = match pool.config.connection_reuse {
                ConnectionReuse::Private => Some(client.private.clone()),
                ConnectionReuse::Shared => None,
            };
            let mut lease = Lease::new(pool.clone(), index, private);
            lease.hold(slot);
            let attempt = forward(
                &pool,
                index,
                &client,
                outgoing,
                &mut head,
                lease,
                upgrade,
                timeouts,
                &mut tally.stage,
            );
            match attempt.await {
                Forwarded::Response(mut response, status) => {
                    if websocket && (200..300).contains(&status) {
                        // Over HTTP/2 a 2xx would open the tunnel: the backend did not switch.
                        return Ok(error_page(
                            StatusCode::BAD_GATEWAY,
                            "the backend answered the WebSocket handshake without switching protocols",
                        ));
                    }
                    let retry_status = matches!(status, 502..=504);
                    if retry_status && replayable && may_retry(&pool, &mut retries_left, &tried) {
                        failure = Some(Failure::Status(status));
                        tally.failure = failure;
                        continue;
                    }
                    strip_hop_by_hop(response.headers_mut(), false);
                    tally.by = AnsweredBy::Backend;
                    return Ok(response);
                }
                Forwarded::Upgraded(mut response, stream, early) => {
                    if websocket {
                        websocket::to_h2_answer(&mut response);
                    }
                    match client_upgrade {
                        Some(client_upgrade) => {
                            let closing = pool.backends[index]
                                .tunnels
                                .as_ref()
                                .filter(|_| pool.config.close_tunnels_on_down)
                                .map(|tunnels| tunnels.subscribe());
                            tunnel(client_upgrade, stream, early, self.tunnel_idle, closing);
                        }
                        // A 101 nobody asked for: the client gets it, and nothing else.
                        None => drop(stream),
                    }
                    tally.by = AnsweredBy::Backend;
                    return Ok(response);
                }
                Forwarded::NotSent(outgoing, why) => {
                    failure = Some(Failure::Attempt(why));
                    tally.failure = failure;
                    pending = Some(outgoing);
                    if may_retry(&pool, &mut retries_left, &tried) {
                        continue;
                    }
                    return Ok(failure_page(Failure::Attempt(why)));
                }
                Forwarded::Failed(why) => {
                    failure = Some(Failure::Attempt(why));
                    tally.failure = failure;
                    if why.retry_safe(replayable) && may_retry(&pool, &mut retries_left, &tried) {
                        continue;
                    }
                    return Ok(failure_page(Failure::Attempt(why)));
                }
            }
        }
    }
}

/// What became of one attempt.
enum Forwarded<'a> {
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
#[allow(clippy::too_many_arguments)]
async fn forward<'a>(
    pool: &Arc<PoolHandle>,
    index: usize,
    client: &ClientInfo,
    outgoing: Outgoing<'a, ReqBody>,
    head: &mut Vec<u8>,
    mut lease: Lease,
    upgrade: bool,
    timeouts: ExchangeTimeouts,
    stage: &mut Stage,
) -> Forwarded<'a> {
    let backend = &pool.backends[index];
    let mut outgoing = outgoing;
    // A pooled connection the backend closed meanwhile is no fault of the backend: one fresh
    // connection is tried before anything is judged.
    let mut fresh_only = false;
    // One clock reading serves the idle check, the deadline and the latency of a request sent
    // on a pooled connection; a fresh connection reads the clock again once connected.
    let started = Instant::now();
    let addrs = Some((client.addr, client.destination()));
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
                charge(pool, index, error);
                return Forwarded::NotSent(outgoing, error);
            }
        };
        stage.now = stage.connected;
        let reused = conn.reused && !fresh_only;
        let sent_at = if reused { started } else { Instant::now() };
        let sent = upstream::exchange(conn.stream, outgoing, head, upgrade, timeouts, sent_at);
        match sent.await {
            Err(ExchangeError::NotSent(unsent)) if reused => {
                // A pooled connection the backend closed meanwhile: one fresh try.
                outgoing = unsent;
                fresh_only = true;
            }
            Err(ExchangeError::NotSent(unsent)) => {
                let error = AttemptError::Send { sent_any: false };
                charge(pool, index, error);
                return Forwarded::NotSent(unsent, error);
            }
            Err(ExchangeError::Failed(error)) => {
                charge(pool, index, error);
                return Forwarded::Failed(error);
            }
            Ok(answer) => {
                // A chunked body already broken in what came with the head: a 502 now, as for
                // a malformed head, rather than a head relayed and a connection cut before any
                // of its body (hyper would send nothing at all, not even the status).
                if answer.framing.body == BodyLength::Chunked
                    && chunked::check_start(&answer.buf).is_err()
                {
                    charge(pool, index, AttemptError::HeadMalformed);
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
                match pool.shed_request(status, response.headers()) {
                    Some(relief) => pool.shed(index, status, relief, latency),
                    None => lease.judge_at_end(Outcome::Status(status)),
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

/// One attempt on an HTTP/2 backend (see `upstream::exchange_h2`), with its outcome fed to the
/// passive side: a gRPC call's by its `grpc-status` (in the head of a trailers-only answer,
/// else in the trailers, judged when the body ends).
async fn forward_h2<'a>(
    pool: &Arc<PoolHandle>,
    index: usize,
    mut request: Request<ReqBody>,
    mut lease: Lease,
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
    let response = match upstream::exchange_h2(&backend.upstream, conns, request, timeouts).await {
        Ok(response) => response,
        Err(H2Failure::NotSent(mut request, error)) => {
            charge(pool, index, error);
            // Back to how the proxy built it, for another backend.
            *request.uri_mut() = origin_form(request.uri());
            if let Some(host) = host {
                request.headers_mut().insert(header::HOST, host);
            }
            return Forwarded::NotSent(Outgoing::Request(request), error);
        }
        Err(H2Failure::Failed(error)) => {
            charge(pool, index, error);
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
fn trailer_names(headers: &mut HeaderMap) -> Option<HeaderValue> {
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

/// Feeds a failed attempt to the passive side if it was the backend's fault; a failure that
/// was the client's (or capataz's own) is only logged, at debug.
fn charge(pool: &PoolHandle, index: usize, error: AttemptError) {
    let backend = &pool.backends[index];
    match error.outcome() {
        Some(outcome) => {
            pool.observe(index, outcome);
            backend.metrics.unanswered();
        }
        None => tracing::debug!(
            pool = %pool.name,
            backend = %backend.name,
            fault = ?error.fault(),
            %error,
            "attempt failed; nothing charged to the backend"
        ),
    }
}

/// A route's label (metrics and access log): its host and path prefix.
fn route_label(host: Option<&str>, path_prefix: &str) -> String {
    format!("{}{}", host.unwrap_or(""), path_prefix)
}

fn build_request(method: Method, uri: Uri, headers: HeaderMap, body: ReqBody) -> Request<ReqBody> {
    let mut request = Request::new(body);
    *request.method_mut() = method;
    *request.uri_mut() = uri;
    *request.version_mut() = Version::HTTP_11;
    *request.headers_mut() = headers;
    request
}

/// Whether an eligible backend has not been tried yet. Checked before retrying an answer, so
/// when no backend is left the last one's own answer (a 503 with its `Retry-After`, say)
/// reaches the client instead of a 502 of ours, and no retry budget is spent for nothing.
fn untried_left(pool: &PoolHandle, tried: &[usize]) -> bool {
    pool.snapshot().eligible.iter().any(|b| !tried.contains(b))
}

/// Whether one more attempt may be made: a retry is left for this request, a backend is left
/// to try, and the pool's budget pays for it (spending one token and one retry if so).
fn may_retry(pool: &PoolHandle, retries_left: &mut u32, tried: &Tried) -> bool {
    let ok = *retries_left > 0
        && tried.has_room()
        && untried_left(pool, tried.as_slice())
        && pool.budget.try_spend();
    if ok {
        *retries_left -= 1;
        pool.metrics.retry();
    }
    ok
}

fn is_idempotent(method: &Method) -> bool {
    matches!(
        *method,
        Method::GET | Method::HEAD | Method::OPTIONS | Method::TRACE | Method::PUT | Method::DELETE
    )
}

/// What the proxy knows of a client connection, computed once per connection, and the idle
/// backend connections private to it (closed when it closes).
#[derive(Debug)]
pub struct ClientInfo {
    /// The peer address.
    pub addr: SocketAddr,
    ip: HeaderValue,
    /// The idle backend connections only this client connection may use (see
    /// `upstream::PrivateIdle`).
    pub private: Arc<PrivateIdle>,
    /// What its TLS handshake settled, when the listener terminates TLS.
    pub tls: Option<Box<TlsInfo>>,
    /// The address the client connected to (from a PROXY protocol header when one named it),
    /// if known.
    pub destination: Option<SocketAddr>,
    /// The backend connections its requests may hold at once (limited for HTTP/2).
    pub backend_slots: BackendSlots,
    /// Told when a request's body has been read to its end (set by the client connection).
    pub(crate) body_read: Option<Arc<dyn BodyRead>>,
}

impl ClientInfo {
    /// The info for a client at `addr`.
    pub fn new(addr: SocketAddr) -> ClientInfo {
        let ip = HeaderValue::try_from(addr.ip().to_string())
            // An IP address is always a valid header value.
            .unwrap_or_else(|_| HeaderValue::from_static("unknown"));
        ClientInfo {
            addr,
            ip,
            private: Arc::new(PrivateIdle::new()),
            tls: None,
            destination: None,
            backend_slots: BackendSlots::default(),
            body_read: None,
        }
    }

    /// The address the client connected to, for a PROXY protocol header to a backend: the
    /// unspecified address of the client's family, port 0, when not known.
    pub fn destination(&self) -> SocketAddr {
        self.destination.unwrap_or_else(|| match self.addr {
            SocketAddr::V4(_) => SocketAddr::from(([0, 0, 0, 0], 0)),
            SocketAddr::V6(_) => SocketAddr::from(([0u16; 8], 0)),
        })
    }

    /// The info for a client at `addr` whose connection is TLS, as `tls` says.
    pub fn with_tls(addr: SocketAddr, tls: TlsInfo) -> ClientInfo {
        ClientInfo {
            tls: Some(Box::new(tls)),
            ..ClientInfo::new(addr)
        }
    }
}

/// Joins the client's upgraded connection and the backend's, once the 101 has reached the
/// client; `early` is what the backend sent after its 101 before the tunnel existed. The
/// tunnel closes when either side does, or once no byte has moved either way for `idle` (the
/// listener's `idle_timeout`): an idle upgraded connection holds two sockets and a task. With
/// `closing` (the pool's `close_tunnels_on_down`), it also closes when the health runtime
/// signals that the backend went DOWN.
fn tunnel<S: Transport>(
    client: hyper::upgrade::OnUpgrade,
    mut backend: S,
    early: Bytes,
    idle: std::time::Duration,
    closing: Option<tokio::sync::watch::Receiver<u64>>,
) {
    tokio::spawn(async move {
        let Ok(client) = client.await else {
            return;
        };
        let moved = Arc::new(std::sync::atomic::AtomicU64::new(0));
        let mut client = Moving {
            inner: TokioIo::new(client),
            moved: moved.clone(),
        };
        if !early.is_empty() && client.write_all(&early).await.is_err() {
            return;
        }
        let mut backend = Moving {
            inner: &mut backend,
            moved: moved.clone(),
        };
        let copy = tokio::io::copy_bidirectional(&mut client, &mut backend);
        tokio::pin!(copy);
        // Looked at a few times per `idle`, as client connections are (see `client/watch.rs`): the
        // tunnel closes between `idle` and `idle` plus that period after its last byte.
        let period = (idle / 4).clamp(
            std::time::Duration::from_millis(20),
            std::time::Duration::from_secs(1),
        );
        let mut tick = tokio::time::interval(period);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut seen = 0;
        let mut quiet_since = tokio::time::Instant::now();
        let closed = backend_down(closing);
        tokio::pin!(closed);
        loop {
            tokio::select! {
                _ = &mut copy => return,
                // Dropping both ends closes them.
                _ = &mut closed => return,
                now = tick.tick() => {
                    let count = moved.load(Ordering::Relaxed);
                    if count != seen {
                        seen = count;
                        quiet_since = now;
                    } else if now.saturating_duration_since(quiet_since) >= idle {
                        // Dropping both ends closes them.
                        return;
                    }
                }
            }
        }
    });
}

/// Resolves once the backend's tunnels are to close; never without a receiver, or once the
/// signal's sender is gone (its pool was removed by a reload).
async fn backend_down(closing: Option<tokio::sync::watch::Receiver<u64>>) {
    if let Some(mut rx) = closing {
        if rx.changed().await.is_ok() {
            return;
        }
    }
    std::future::pending().await
}

/// One end of a tunnel, counting the reads that moved bytes.
struct Moving<T> {
    inner: T,
    moved: Arc<std::sync::atomic::AtomicU64>,
}

impl<T: tokio::io::AsyncRead + Unpin> tokio::io::AsyncRead for Moving<T> {
    fn poll_read(
        self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        buf: &mut tokio::io::ReadBuf<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        let this = self.get_mut();
        let before = buf.filled().len();
        let polled = std::pin::Pin::new(&mut this.inner).poll_read(cx, buf);
        if buf.filled().len() > before {
            this.moved.fetch_add(1, Ordering::Relaxed);
        }
        polled
    }
}

impl<T: tokio::io::AsyncWrite + Unpin> tokio::io::AsyncWrite for Moving<T> {
    fn poll_write(
        self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        buf: &[u8],
    ) -> std::task::Poll<std::io::Result<usize>> {
        std::pin::Pin::new(&mut self.get_mut().inner).poll_write(cx, buf)
    }

    fn poll_flush(
        self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        std::pin::Pin::new(&mut self.get_mut().inner).poll_flush(cx)
    }

    fn poll_shutdown(
        self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        std::pin::Pin::new(&mut self.get_mut().inner).poll_shutdown(cx)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn idempotent_methods() {
        assert!(is_idempotent(&Method::GET));
        assert!(is_idempotent(&Method::PUT));
        assert!(!is_idempotent(&Method::POST));
        assert!(!is_idempotent(&Method::PATCH));
    }
}
