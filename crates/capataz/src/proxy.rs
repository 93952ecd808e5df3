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
use http::header::{self, HeaderMap, HeaderName, HeaderValue};
use http::{Method, Request, Response, StatusCode, Uri, Version};
use hyper::body::{Body as _, Incoming};
use hyper_util::rt::TokioIo;

use bytes::Bytes;
use tokio::io::AsyncWriteExt;
use tokio::net::TcpStream;

use crate::body::{Lease, ReqBody, RespBody};
use crate::config::{AllDownPolicy, ConnectionReuse, ListenerConfig};
use crate::h1::framing::BodyLength;
use crate::health::PoolRt;
use crate::upstream::{self, AttemptError, ExchangeError, ExchangeTimeouts, PrivateIdle};

/// The most backends one request may try (first attempt plus retries).
const MAX_TRIES: usize = 11;

static X_FORWARDED_FOR: HeaderName = HeaderName::from_static("x-forwarded-for");
static X_FORWARDED_PROTO: HeaderName = HeaderName::from_static("x-forwarded-proto");
static KEEP_ALIVE: HeaderName = HeaderName::from_static("keep-alive");
static PROXY_CONNECTION: HeaderName = HeaderName::from_static("proxy-connection");

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
    pool: Arc<PoolRt>,
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
}

/// Why the last attempt of a request did not give the client an answer.
#[derive(Clone, Copy, Debug)]
enum Failure {
    /// The attempt failed.
    Attempt(AttemptError),
    /// The backend answered this retryable status (502-504) and the answer was not relayed.
    Status(u16),
}

impl Proxy {
    /// The handler of `listener`, whose routes' `pool` indexes refer to `pools`.
    pub fn new(listener: &ListenerConfig, pools: &[Arc<PoolRt>]) -> Proxy {
        let routes = &listener.routes;
        Proxy {
            routes: routes
                .iter()
                .map(|r| Route {
                    host: r.host.clone(),
                    path_prefix: r.path_prefix.clone(),
                    pool: pools[r.pool].clone(),
                })
                .collect(),
            any_host: routes.iter().any(|r| r.host.is_some()),
            max_header_bytes: listener.max_header_bytes,
            forwarded_headers: listener.forwarded_headers,
            request_body_timeout: listener.request_body_timeout,
        }
    }

    /// The pool of the first route matching `host` (without its port) and `path`.
    fn route(&self, host: Option<&str>, path: &str) -> Option<&Arc<PoolRt>> {
        let host = if self.any_host {
            host.map(strip_port)
        } else {
            None
        };
        self.routes
            .iter()
            .find(|route| {
                let host_ok = match (&route.host, host) {
                    (None, _) => true,
                    (Some(want), Some(got)) => want.eq_ignore_ascii_case(got),
                    (Some(_), None) => false,
                };
                host_ok && path.starts_with(route.path_prefix.as_str())
            })
            .map(|route| &route.pool)
    }

    /// Serves one client request.
    pub async fn handle(
        self: Arc<Self>,
        mut req: Request<Incoming>,
        client: Arc<ClientInfo>,
    ) -> Result<Response<RespBody>, Infallible> {
        if self.max_header_bytes < MIN_HYPER_BUFFER && head_size(&req) > self.max_header_bytes {
            return Ok(error_page(
                StatusCode::REQUEST_HEADER_FIELDS_TOO_LARGE,
                "request header fields too large",
            ));
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
        let Some(pool) = self.route(host.as_deref(), req.uri().path()).cloned() else {
            return Ok(error_page(
                StatusCode::NOT_FOUND,
                "no route matches this host and path",
            ));
        };
        if let (Some(host), false) = (host, req.headers().contains_key(header::HOST)) {
            // An HTTP/1.0 absolute-form request without Host: the backend gets the host the
            // route was chosen by.
            if let Ok(value) = HeaderValue::from_str(&host) {
                req.headers_mut().insert(header::HOST, value);
            }
        }
        pool.budget.on_request();
        let upgrade = wants_upgrade(req.headers());
        let client_upgrade = upgrade.then(|| hyper::upgrade::on(&mut req));
        let (mut parts, body) = req.into_parts();
        strip_hop_by_hop(&mut parts.headers, upgrade);
        if self.forwarded_headers {
            add_forwarded_headers(&mut parts.headers, &client);
        }
        let uri = origin_form(&parts.uri);
        let bodiless = body.is_end_stream();
        let replayable = bodiless && !upgrade && is_idempotent(&parts.method);
        let mut retries_left = pool.config.retries.attempts;
        // Keep what a resend needs only when a resend may happen (to another backend).
        let template = (replayable && retries_left > 0 && pool.backends.len() > 1)
            .then(|| Template::new(&parts.method, &uri, &parts.headers));
        let mut pending = Some(build_request(
            parts.method,
            uri,
            parts.headers,
            ReqBody::Incoming(body),
        ));
        let mut tried = Tried::default();
        let mut failure = None;
        let timeouts = ExchangeTimeouts {
            response_header: pool.config.timeouts.response_header,
            body_idle: pool.config.timeouts.body_idle,
            request_body: self.request_body_timeout,
        };
        loop {
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
            let request = match pending.take() {
                Some(request) => request,
                None => match &template {
                    Some(template) => template.request(),
                    // Unreachable: without a template no retry is attempted once sent.
                    None => {
                        let why = failure.unwrap_or(Failure::Attempt(AttemptError::HeadTimeout));
                        return Ok(failure_page(why));
                    }
                },
            };
            let backend = pool.backends[index].clone();
            let private = match pool.config.connection_reuse {
                ConnectionReuse::Private => Some(client.private.clone()),
                ConnectionReuse::Shared => None,
            };
            let lease = Lease::new(backend, private);
            match forward(&pool, index, request, lease, timeouts).await {
                Forwarded::Response(mut response, status) => {
                    let retry_status = matches!(status, 502..=504);
                    if retry_status && replayable && may_retry(&pool, &mut retries_left, &tried) {
                        failure = Some(Failure::Status(status));
                        continue;
                    }
                    strip_hop_by_hop(response.headers_mut(), false);
                    return Ok(response);
                }
                Forwarded::Upgraded(response, stream, early) => {
                    match client_upgrade {
                        Some(client_upgrade) => tunnel(client_upgrade, stream, early),
                        // A 101 nobody asked for: the client gets it, and nothing else.
                        None => drop(stream),
                    }
                    return Ok(response);
                }
                Forwarded::NotSent(request, why) => {
                    failure = Some(Failure::Attempt(why));
                    pending = Some(request);
                    if may_retry(&pool, &mut retries_left, &tried) {
                        continue;
                    }
                    return Ok(failure_page(Failure::Attempt(why)));
                }
                Forwarded::Failed(why) => {
                    failure = Some(Failure::Attempt(why));
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
enum Forwarded {
    /// The backend answered (status code given).
    Response(Response<RespBody>, u16),
    /// The backend switched protocols: its answer, its connection and what it sent past the
    /// answer's head.
    Upgraded(Response<RespBody>, TcpStream, Bytes),
    /// Nothing reached the backend; the request comes back intact.
    NotSent(Request<ReqBody>, AttemptError),
    /// The request was sent (at least in part) and no usable answer came.
    Failed(AttemptError),
}

/// One attempt on one backend, with its outcome fed to the passive side (an answer's once its
/// body has ended; see `body::Lease`).
async fn forward(
    pool: &Arc<PoolRt>,
    index: usize,
    request: Request<ReqBody>,
    mut lease: Lease,
    timeouts: ExchangeTimeouts,
) -> Forwarded {
    let backend = lease.backend().clone();
    let mut request = request;
    // A pooled connection the backend closed meanwhile is no fault of the backend: one fresh
    // connection is tried before anything is judged.
    let mut fresh_only = false;
    // One clock reading serves the idle check, the deadline and the latency of a request sent
    // on a pooled connection; a fresh connection reads the clock again once connected.
    let started = Instant::now();
    loop {
        let conn = if fresh_only {
            backend.upstream.connect().await
        } else {
            backend.upstream.acquire(started, lease.private()).await
        };
        let conn = match conn {
            Ok(conn) => conn,
            Err(error) => {
                charge(pool, index, error);
                return Forwarded::NotSent(request, error);
            }
        };
        let reused = conn.reused && !fresh_only;
        let sent_at = if reused { started } else { Instant::now() };
        match upstream::exchange(conn.stream, request, timeouts, sent_at).await {
            Err(ExchangeError::NotSent(unsent)) if reused => {
                // A pooled connection the backend closed meanwhile: one fresh try.
                request = unsent;
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
                let status = answer.head.status.as_u16();
                let answered_at = Instant::now();
                backend
                    .metrics
                    .answered(status, answered_at.saturating_duration_since(sent_at));
                let mut response = Response::new(RespBody::Full(None));
                *response.status_mut() = answer.head.status;
                *response.headers_mut() = answer.head.headers;
                if status == 101 {
                    // The connection becomes the tunnel; the passive side hears of the 101.
                    pool.observe(index, Outcome::Status(status));
                    drop(lease);
                    return Forwarded::Upgraded(response, answer.stream, answer.buf.freeze());
                }
                frame_relayed(response.headers_mut(), answer.framing.body);
                lease.judge_at_end(pool.clone(), index, Outcome::Status(status));
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

/// Feeds a failed attempt to the passive side if it was the backend's fault; a failure that
/// was the client's (or capataz's own) is only logged, at debug.
fn charge(pool: &PoolRt, index: usize, error: AttemptError) {
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

/// Makes the relayed head's framing fields agree with how capataz reads the body: the
/// client's framing is hyper's to choose from the body, so a `Content-Length` that did not
/// delimit the backend's body (one that came with `Transfer-Encoding`, which wins) never
/// reaches the client, and a length written as a list (`7, 7`) goes as one number.
fn frame_relayed(headers: &mut HeaderMap, body: BodyLength) {
    match body {
        BodyLength::Exact(n) => {
            let mut values = headers.get_all(header::CONTENT_LENGTH).iter();
            let plain = values
                .next()
                .is_some_and(|v| v.as_bytes().iter().all(u8::is_ascii_digit));
            if !plain || values.next().is_some() {
                headers.insert(header::CONTENT_LENGTH, HeaderValue::from(n));
            }
        }
        BodyLength::Chunked | BodyLength::UntilClose => {
            headers.remove(header::CONTENT_LENGTH);
        }
        BodyLength::Empty => {}
    }
}

/// What a resend of a bodiless request needs. Nearly every request is answered without one, so
/// the headers are kept as a plain list: one allocation, where a cloned `HeaderMap` takes two
/// (its index table and its entries); the map is rebuilt only for a resend.
struct Template {
    method: Method,
    uri: Uri,
    headers: Vec<(HeaderName, HeaderValue)>,
}

impl Template {
    fn new(method: &Method, uri: &Uri, headers: &HeaderMap) -> Template {
        let mut list = Vec::with_capacity(headers.len());
        list.extend(
            headers
                .iter()
                .map(|(name, value)| (name.clone(), value.clone())),
        );
        Template {
            method: method.clone(),
            uri: uri.clone(),
            headers: list,
        }
    }

    /// A fresh copy of the request, without a body.
    fn request(&self) -> Request<ReqBody> {
        let mut headers = HeaderMap::with_capacity(self.headers.len());
        for (name, value) in &self.headers {
            headers.append(name.clone(), value.clone());
        }
        build_request(
            self.method.clone(),
            self.uri.clone(),
            headers,
            ReqBody::Empty,
        )
    }
}

fn build_request(method: Method, uri: Uri, headers: HeaderMap, body: ReqBody) -> Request<ReqBody> {
    let mut request = Request::new(body);
    *request.method_mut() = method;
    *request.uri_mut() = uri;
    *request.version_mut() = Version::HTTP_11;
    *request.headers_mut() = headers;
    request
}

/// hyper's smallest read buffer; heads larger than the limit but within it are checked here.
const MIN_HYPER_BUFFER: usize = 8192;

fn head_size(req: &Request<Incoming>) -> usize {
    let line = req.method().as_str().len() + req.uri().to_string().len() + 12;
    line + req
        .headers()
        .iter()
        .map(|(name, value)| name.as_str().len() + value.len() + 4)
        .sum::<usize>()
}

/// The host a request is for, one and unambiguous (RFC 9112 section 3.2): its `Host` field,
/// or the authority of an absolute-form target, which must then agree with `Host`. Refused
/// (400): two `Host` fields, an HTTP/1.1 request without one, a `Host` that is not text, and an
/// absolute-form target naming another host or port than `Host`.
fn request_host(
    req: &Request<Incoming>,
) -> Result<Option<std::borrow::Cow<'_, str>>, &'static str> {
    let mut fields = req.headers().get_all(header::HOST).iter();
    let field = fields.next();
    if fields.next().is_some() {
        return Err("more than one Host header field");
    }
    let field = match field {
        Some(value) => Some(
            value
                .to_str()
                .map_err(|_| "the Host header field is not text")?,
        ),
        None if req.version() == Version::HTTP_11 => {
            return Err("an HTTP/1.1 request needs a Host header field")
        }
        None => None,
    };
    let Some(authority) = req.uri().authority() else {
        return Ok(field.map(std::borrow::Cow::Borrowed));
    };
    match field {
        Some(field) if same_authority(req.uri(), authority, field) => {
            Ok(Some(std::borrow::Cow::Borrowed(field)))
        }
        Some(_) => Err("the request target's host differs from the Host header field"),
        None => Ok(Some(std::borrow::Cow::Owned(authority.as_str().to_owned()))),
    }
}

/// Whether `field` (a Host value) names the same host and port as `authority`, the port
/// defaulting to the scheme's.
fn same_authority(uri: &Uri, authority: &http::uri::Authority, field: &str) -> bool {
    let default = if uri.scheme_str() == Some("https") {
        443
    } else {
        80
    };
    let Ok(field) = field.parse::<http::uri::Authority>() else {
        return false;
    };
    field.host().eq_ignore_ascii_case(authority.host())
        && field.port_u16().unwrap_or(default) == authority.port_u16().unwrap_or(default)
}

fn strip_port(host: &str) -> &str {
    if host.starts_with('[') {
        // [v6]:port
        return host.split_once(']').map_or(host, |(h, _)| &h[1..]);
    }
    host.rsplit_once(':').map_or(host, |(h, _)| h)
}

fn origin_form(uri: &Uri) -> Uri {
    match uri.path_and_query() {
        Some(_) if uri.scheme().is_none() && uri.authority().is_none() => uri.clone(),
        Some(pq) => Uri::from(pq.clone()),
        None => Uri::from_static("/"),
    }
}

/// Whether an eligible backend has not been tried yet. Checked before retrying an answer, so
/// when no backend is left the last one's own answer (a 503 with its `Retry-After`, say)
/// reaches the client instead of a 502 of ours, and no retry budget is spent for nothing.
fn untried_left(pool: &PoolRt, tried: &[usize]) -> bool {
    pool.snapshot().eligible.iter().any(|b| !tried.contains(b))
}

/// Whether one more attempt may be made: a retry is left for this request, a backend is left
/// to try, and the pool's budget pays for it (spending one token and one retry if so).
fn may_retry(pool: &PoolRt, retries_left: &mut u32, tried: &Tried) -> bool {
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

fn wants_upgrade(headers: &HeaderMap) -> bool {
    headers.contains_key(header::UPGRADE)
        && connection_tokens(headers).any(|t| t.eq_ignore_ascii_case("upgrade"))
}

fn connection_tokens(headers: &HeaderMap) -> impl Iterator<Item = &str> {
    headers
        .get_all(header::CONNECTION)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .map(str::trim)
        .filter(|t| !t.is_empty())
}

/// Removes the hop-by-hop headers of RFC 9110 section 7.6.1 (and any the Connection header
/// names). For an upgrade, `Connection: upgrade` and `Upgrade` are kept.
///
/// This runs twice per proxied request, so it first finds which of those names are present in
/// one pass over the names (no hashing, and for most names only a length compared: a message
/// usually carries none of them, or only `Connection`) and then removes just those.
fn strip_hop_by_hop(headers: &mut HeaderMap, keep_upgrade: bool) {
    let mut present = [false; FIXED_HOP_BY_HOP.len()];
    let mut upgrade = false;
    // Names the Connection header lists go too; the usual tokens name no header of their own,
    // or one removed below anyway, and are skipped without parsing a name.
    let mut named: Vec<HeaderName> = Vec::new();
    for (name, value) in headers.iter() {
        match hop_by_hop(name) {
            None => {}
            Some(HopByHop::Upgrade) => upgrade = true,
            Some(HopByHop::Fixed(i)) => {
                present[i] = true;
                if i == 0 {
                    let tokens = value.to_str().unwrap_or("").split(',').map(str::trim);
                    named.extend(
                        tokens
                            .filter(|t| {
                                !(t.is_empty()
                                    || t.eq_ignore_ascii_case("keep-alive")
                                    || t.eq_ignore_ascii_case("close")
                                    || t.eq_ignore_ascii_case("upgrade"))
                            })
                            .filter_map(|t| HeaderName::from_bytes(t.as_bytes()).ok()),
                    );
                }
            }
        }
    }
    for name in named {
        headers.remove(name);
    }
    for (name, present) in FIXED_HOP_BY_HOP.iter().zip(present) {
        if present {
            headers.remove(*name);
        }
    }
    if keep_upgrade {
        headers.insert(header::CONNECTION, HeaderValue::from_static("upgrade"));
    } else if upgrade {
        headers.remove(header::UPGRADE);
    }
}

/// The hop-by-hop headers always removed (RFC 9110 section 7.6.1, and the legacy
/// `Keep-Alive` and `Proxy-Connection`); `Connection` first.
const FIXED_HOP_BY_HOP: [&HeaderName; 6] = [
    &header::CONNECTION,
    &KEEP_ALIVE,
    &PROXY_CONNECTION,
    &header::TE,
    &header::TRAILER,
    &header::TRANSFER_ENCODING,
];

/// A hop-by-hop header name: one of [`FIXED_HOP_BY_HOP`] (its index), or `Upgrade`.
#[derive(Clone, Copy, Debug, PartialEq)]
enum HopByHop {
    Fixed(usize),
    Upgrade,
}

/// Which hop-by-hop header `name` is, if any. Names are stored lowercase; the length is looked
/// at first, and most names have a length no hop-by-hop name has.
fn hop_by_hop(name: &HeaderName) -> Option<HopByHop> {
    let name = name.as_str();
    let found = match (name.len(), name) {
        (10, "connection") => HopByHop::Fixed(0),
        (10, "keep-alive") => HopByHop::Fixed(1),
        (16, "proxy-connection") => HopByHop::Fixed(2),
        (2, "te") => HopByHop::Fixed(3),
        (7, "trailer") => HopByHop::Fixed(4),
        (17, "transfer-encoding") => HopByHop::Fixed(5),
        (7, "upgrade") => HopByHop::Upgrade,
        _ => return None,
    };
    Some(found)
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
        }
    }
}

fn add_forwarded_headers(headers: &mut HeaderMap, client: &ClientInfo) {
    match headers.entry(&X_FORWARDED_FOR) {
        header::Entry::Vacant(entry) => {
            entry.insert(client.ip.clone());
        }
        header::Entry::Occupied(mut entry) => {
            let appended = entry.get().to_str().ok().and_then(|before| {
                HeaderValue::try_from(format!("{before}, {}", client.addr.ip())).ok()
            });
            if let Some(appended) = appended {
                entry.insert(appended);
            }
        }
    }
    headers.insert(&X_FORWARDED_PROTO, HeaderValue::from_static("http"));
}

/// Joins the client's upgraded connection and the backend's, once the 101 has reached the
/// client; `early` is what the backend sent after its 101 before the tunnel existed.
fn tunnel(client: hyper::upgrade::OnUpgrade, mut backend: TcpStream, early: Bytes) {
    tokio::spawn(async move {
        let Ok(client) = client.await else {
            return;
        };
        let mut client = TokioIo::new(client);
        if !early.is_empty() && client.write_all(&early).await.is_err() {
            return;
        }
        let _ = tokio::io::copy_bidirectional(&mut client, &mut backend).await;
    });
}

fn error_page(status: StatusCode, text: &str) -> Response<RespBody> {
    let mut response = Response::new(RespBody::text(format!(
        "{} {}: {text}\n",
        status.as_u16(),
        status.canonical_reason().unwrap_or("")
    )));
    *response.status_mut() = status;
    response.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("text/plain; charset=utf-8"),
    );
    response
}

fn failure_page(failure: Failure) -> Response<RespBody> {
    match failure {
        Failure::Status(status) => error_page(
            StatusCode::BAD_GATEWAY,
            &format!("the backend failed (HTTP {status})"),
        ),
        Failure::Attempt(error) => {
            let mut page = error_page(error.status(), &error.to_string());
            if error.fault() == upstream::Fault::Client {
                // The rest of the client's body is not read: the connection cannot go on.
                page.headers_mut()
                    .insert(header::CONNECTION, HeaderValue::from_static("close"));
            }
            page
        }
    }
}

fn reject_page(pool: &PoolRt, all_down: bool) -> Response<RespBody> {
    let retry_after = match pool.config.when_all_down {
        AllDownPolicy::Reject { retry_after } => retry_after.as_secs().max(1),
        AllDownPolicy::FailOpen => 1,
    };
    let text = if all_down {
        format!("pool {} has no healthy backend", pool.name)
    } else {
        format!("pool {} has no backend left to try", pool.name)
    };
    let mut response = error_page(StatusCode::SERVICE_UNAVAILABLE, &text);
    response
        .headers_mut()
        .insert(header::RETRY_AFTER, HeaderValue::from(retry_after));
    response
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_name_lookup_agrees_with_the_fixed_list_and_knows_nothing_else() {
        for (i, name) in FIXED_HOP_BY_HOP.iter().enumerate() {
            assert_eq!(hop_by_hop(name), Some(HopByHop::Fixed(i)), "{name}");
        }
        assert_eq!(hop_by_hop(&header::UPGRADE), Some(HopByHop::Upgrade));
        for other in [
            "host",
            "x-forwarded-for",
            "x-forwarded-proto",
            "content-length",
            "connectionx",
            "t",
            "trailers",
            "x-connection",
        ] {
            let name = HeaderName::from_bytes(other.as_bytes()).unwrap();
            assert_eq!(hop_by_hop(&name), None, "{other}");
        }
    }

    #[test]
    fn hop_by_hop_headers_go() {
        let mut h = HeaderMap::new();
        h.insert(
            header::CONNECTION,
            HeaderValue::from_static("keep-alive, x-secret"),
        );
        h.insert("x-secret", HeaderValue::from_static("1"));
        h.insert("keep-alive", HeaderValue::from_static("timeout=5"));
        h.insert(header::TE, HeaderValue::from_static("trailers"));
        h.insert(
            header::TRANSFER_ENCODING,
            HeaderValue::from_static("chunked"),
        );
        h.insert(header::UPGRADE, HeaderValue::from_static("websocket"));
        h.insert(header::HOST, HeaderValue::from_static("example.com"));
        h.insert("x-keep", HeaderValue::from_static("yes"));
        strip_hop_by_hop(&mut h, false);
        let mut names: Vec<&str> = h.keys().map(|k| k.as_str()).collect();
        names.sort();
        assert_eq!(names, ["host", "x-keep"]);
    }

    #[test]
    fn every_hop_by_hop_name_goes_in_any_case_and_order() {
        let listed = ["Keep-Alive", "CLOSE", "x-a", " X-B ", "upgrade", "te"];
        for keep_upgrade in [false, true] {
            let mut h = HeaderMap::new();
            h.append("x-b", HeaderValue::from_static("2"));
            h.insert(
                header::CONNECTION,
                HeaderValue::from_str(&listed.join(",")).unwrap(),
            );
            h.append(header::CONNECTION, HeaderValue::from_static("x-c"));
            for name in [
                "x-a",
                "x-c",
                "proxy-connection",
                "trailer",
                "keep-alive",
                "transfer-encoding",
                "te",
            ] {
                h.append(HeaderName::from_static(name), HeaderValue::from_static("1"));
            }
            h.insert(header::UPGRADE, HeaderValue::from_static("h2c"));
            h.insert("x-keep", HeaderValue::from_static("yes"));
            strip_hop_by_hop(&mut h, keep_upgrade);
            let mut names: Vec<&str> = h.keys().map(|k| k.as_str()).collect();
            names.sort();
            if keep_upgrade {
                assert_eq!(names, ["connection", "upgrade", "x-keep"]);
                assert_eq!(h.get_all(header::CONNECTION).iter().count(), 1);
            } else {
                assert_eq!(names, ["x-keep"]);
            }
        }
        // Nothing to strip: nothing changes.
        let mut h = HeaderMap::new();
        h.insert(header::HOST, HeaderValue::from_static("a"));
        h.insert("x-keep-alive", HeaderValue::from_static("1"));
        let before = h.clone();
        strip_hop_by_hop(&mut h, false);
        assert_eq!(h, before);
    }

    #[test]
    fn upgrade_headers_stay_for_upgrades() {
        let mut h = HeaderMap::new();
        h.insert(header::CONNECTION, HeaderValue::from_static("Upgrade"));
        h.insert(header::UPGRADE, HeaderValue::from_static("websocket"));
        assert!(wants_upgrade(&h));
        strip_hop_by_hop(&mut h, true);
        assert_eq!(h.get(header::CONNECTION).unwrap(), "upgrade");
        assert_eq!(h.get(header::UPGRADE).unwrap(), "websocket");
    }

    #[test]
    fn forwarded_headers() {
        let mut h = HeaderMap::new();
        h.insert("x-forwarded-for", HeaderValue::from_static("10.0.0.1"));
        h.insert("x-forwarded-proto", HeaderValue::from_static("https"));
        let client = ClientInfo::new("127.0.0.2:5000".parse().unwrap());
        add_forwarded_headers(&mut h, &client);
        assert_eq!(h.get("x-forwarded-for").unwrap(), "10.0.0.1, 127.0.0.2");
        assert_eq!(h.get("x-forwarded-proto").unwrap(), "http");
    }

    #[test]
    fn a_resend_carries_the_same_method_target_and_headers() {
        let mut h = HeaderMap::new();
        h.insert(header::HOST, HeaderValue::from_static("app.test"));
        h.append("x-tag", HeaderValue::from_static("one"));
        h.append("x-tag", HeaderValue::from_static("two"));
        h.insert(header::ACCEPT, HeaderValue::from_static("*/*"));
        let uri: Uri = "/a?b=1".parse().unwrap();
        let template = Template::new(&Method::DELETE, &uri, &h);
        for _ in 0..2 {
            let resend = template.request();
            assert_eq!(resend.method(), Method::DELETE);
            assert_eq!(resend.uri(), &uri);
            assert_eq!(resend.version(), Version::HTTP_11);
            assert_eq!(resend.headers(), &h);
            let tags: Vec<_> = resend.headers().get_all("x-tag").iter().collect();
            assert_eq!(tags, ["one", "two"]);
            assert!(resend.body().is_end_stream());
        }
    }

    #[test]
    fn hosts_and_uris() {
        assert_eq!(strip_port("example.com:8080"), "example.com");
        assert_eq!(strip_port("example.com"), "example.com");
        assert_eq!(strip_port("[::1]:80"), "::1");
        let abs: Uri = "http://example.com/a?b=1".parse().unwrap();
        assert_eq!(origin_form(&abs), "/a?b=1");
        let rel: Uri = "/x".parse().unwrap();
        assert_eq!(origin_form(&rel), "/x");
    }

    #[test]
    fn idempotent_methods() {
        assert!(is_idempotent(&Method::GET));
        assert!(is_idempotent(&Method::PUT));
        assert!(!is_idempotent(&Method::POST));
        assert!(!is_idempotent(&Method::PATCH));
    }
}
