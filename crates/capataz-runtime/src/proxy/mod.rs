//! The request path: route, pick a backend from the pool's snapshot, forward, retry, relay.
//!
//! Every response, and every failure to get one that was the backend's fault, is fed to the
//! pool's passive side; each failure is classified once, as an [`AttemptError`], which says
//! whose fault it was, whether a retry is safe and what the client gets. What to do after each
//! attempt is the planner's (`plan.rs`), the same for HTTP/1.1 and HTTP/2 backends: retries go
//! to a backend not yet tried, always when nothing was sent (no connection could be made), and
//! for bodiless idempotent requests also after a reset, a timeout before the response headers,
//! a malformed answer, or a 502/503/504, within the pool's retry budget. A failure that is the
//! client's (its body stalled, was malformed, or it went away) is never retried nor charged.
//!
//! The phases of a request: refused or answered before routing (`Proxy::refuse`, HTTP-01
//! tokens, the Host, an HTTPS redirect), routed, prepared for the backends (headers, the
//! request kept for a resend), then attempts (`forward.rs`) until the planner relays an answer
//! or gives up; an upgrade's answer becomes a tunnel (`tunnel.rs`). `tally.rs` keeps what the
//! answer is counted and logged under.

use std::convert::Infallible;
use std::future::Future;
use std::pin::pin;
use std::sync::atomic::Ordering;
use std::sync::Arc;

use bytes::Bytes;
use capataz_h1::framing;
use http::header::{self, HeaderMap, HeaderValue};
use http::{Method, Request, Response, StatusCode, Uri, Version};
use hyper::body::Body as _;

use crate::access_log::{AccessLog, AccessRecord, Phase};
use crate::acme::Http01Tokens;
use crate::balance::PoolHandle;
use crate::body::{Lease, ReqBody, RespBody};
use crate::client_body::ClientBody;
use crate::config::{Algorithm, ConnectionReuse, ForwardedFields, HeaderRules, RequestIdConfig};
use crate::instruments::{AnsweredBy, ListenerMetrics, MethodClass, RouteMetrics};
use crate::upstream::{AttemptError, BackendStream, ExchangeTimeouts, Outgoing};

mod affinity;
mod build;
mod client;
mod error_pages;
mod forward;
mod headers;
mod matchers;
mod pages;
mod plan;
mod queued;
mod rate_limit;
mod redirect;
mod rewrite;
mod rules;
mod tally;
mod tunnel;
mod websocket;

use affinity::Affinity;
use forward::{build_request, forward, forward_h2, trailer_names, Forwarded};
use headers::{
    add_forwarded_headers, head_size, origin_form, request_host, strip_found, strip_hop_by_hop,
    strip_port, too_many_fields, wants_upgrade, HopFields, RequestFields, RequestHost,
    MIN_HYPER_BUFFER,
};
use pages::{error_page, failure_page, http01_page, https_redirect_page, reject_page, Failure};
use plan::{is_idempotent, Attempted, Next, Planner};
use tally::{PoolNames, Stage, Tally};
use tunnel::tunnel;

use build::{Route, Target};
pub use client::ClientInfo;
pub(crate) use client::{BodyReadHook, TunnelHold};

/// The request handler of one listener.
#[derive(Debug)]
pub struct Proxy {
    routes: Vec<Route>,
    /// Whether any route names a host (else the request's host is never looked at).
    any_host: bool,
    max_header_bytes: usize,
    /// Which forwarded fields requests get.
    forwarded: ForwardedFields,
    /// The request id each request gets (`rules.rs`), if any.
    request_id: Option<RequestIdConfig>,
    /// The listener's header rules, run before the route's.
    request_headers: Option<Box<HeaderRules>>,
    response_headers: Option<Box<HeaderRules>>,
    /// Whether a request needs more than hop-by-hop and `X-Forwarded-*` on its way (a request
    /// id, `Forwarded`, header rules: `Proxy::rewrite_request`).
    rewrites: bool,
    /// Whether `Forwarded` or a header rule's `%{host}` needs the request's host (else
    /// `rewrite_request` does not copy it).
    rules_need_host: bool,
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
    /// The listener's own error pages (`None`: capataz's plain-text ones).
    error_pages: Option<error_pages::Pages>,
    /// Whether the listener terminates TLS (the scheme redirects keep).
    tls: bool,
    /// The `Strict-Transport-Security` every answer gets (`[listeners.tls] hsts`), if any.
    hsts: Option<HeaderValue>,
    /// The `Alt-Svc` advertising HTTP/3 that HTTP/1.1 and HTTP/2 answers get
    /// (`[listeners.tls.http3]`), if any.
    alt_svc: Option<HeaderValue>,
}

impl Proxy {
    /// The listener's access log this proxy writes to, if it has one.
    pub(crate) fn access_log(&self) -> Option<Arc<AccessLog>> {
        self.access_log.as_ref().map(|(log, _)| log.clone())
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

    /// The index of the first route matching `host` (without its port) and `req` (its path,
    /// and whatever else the route's matchers look at).
    fn route(&self, host: Option<&str>, req: &Request<ClientBody>) -> Option<usize> {
        let host = host.map(strip_port);
        let path = req.uri().path();
        self.routes.iter().position(|route| {
            let host_ok = match (&route.host, host) {
                (None, _) => true,
                (Some(want), Some(got)) => want.eq_ignore_ascii_case(got),
                (Some(_), None) => false,
            };
            host_ok
                && path.starts_with(route.path_prefix.as_str())
                && route.matches.as_ref().is_none_or(|rules| {
                    matchers::matches(rules, req.method(), req.uri(), req.headers())
                })
        })
    }

    /// Serves one client request, and counts its answer.
    pub fn handle(
        self: Arc<Self>,
        req: Request<ClientBody>,
        client: Arc<ClientInfo>,
    ) -> impl Future<Output = Result<Response<RespBody>, Infallible>> {
        self.handle_then(req, client, Ok)
    }

    /// [`Proxy::handle`], with `then` applied to the answer within the same future: a caller
    /// that does something with each answer (the client connection's service) needs no future
    /// of its own around this one, which would keep the request (264 bytes) beside it.
    // Not an `async fn`, whose future would keep each argument twice (as given, and moved into
    // the body): this future is moved whole at least once per request (into hyper's HTTP/1
    // dispatcher), and its size decides its allocation's size class there.
    #[allow(clippy::manual_async_fn)]
    pub fn handle_then<T>(
        self: Arc<Self>,
        mut req: Request<ClientBody>,
        client: Arc<ClientInfo>,
        then: impl FnOnce(Response<RespBody>) -> T,
    ) -> impl Future<Output = T> {
        async move {
            if matches!(req.version(), Version::HTTP_2 | Version::HTTP_3)
                && too_many_fields(req.uri(), req.headers())
            {
                // As an HTTP/1.1 head with as many, which hyper refuses before the proxy sees it:
                // 431, counted as a refused head, not logged.
                self.count_refused();
                let mut page = error_page(
                    StatusCode::REQUEST_HEADER_FIELDS_TOO_LARGE,
                    "too many header fields",
                );
                if let Some(pages) = &self.error_pages {
                    pages.dress(&mut page);
                }
                return then(page);
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
                reason: None,
                request_id: None,
                affinity: None,
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
            if let Some(config) = &self.request_id {
                tally.set_request_id(rules::request_id(config, req.headers()));
            }
            let alt_svc = self
                .alt_svc
                .as_ref()
                .filter(|_| req.version() != Version::HTTP_3)
                .cloned();
            // The routing phase answers on its own or names the pool; the relay is awaited here,
            // not in a function of its own: its future is then one level less deep, and moved
            // (memcpy) once less per request. It is pinned where the call writes it and awaited
            // through the pin: awaited by value, the whole future (several KB) would be copied
            // from there into the place the await keeps it in.
            let mut response = match self.route_request(&mut req, &client, &mut tally) {
                Routed::Answer(page) => page,
                Routed::Pool(pool, hops) => {
                    pin!(self.relay(req, (pool, hops), &client, &mut tally)).await
                }
            };
            let counters = match tally.route {
                Some(index) => &self.routes[index].metrics,
                None => &self.unrouted,
            };
            if let (Some(pages), AnsweredBy::Capataz) = (&self.error_pages, tally.by) {
                pages.dress(&mut response);
            }
            let status = response.status().as_u16();
            counters.answered(method, status, tally.by);
            if let (Some(config), Some(id)) = (&self.request_id, &tally.request_id) {
                if config.response {
                    response
                        .headers_mut()
                        .insert(config.header.clone(), id.clone());
                }
            }
            if let Some(hsts) = &self.hsts {
                response
                    .headers_mut()
                    .insert(header::STRICT_TRANSPORT_SECURITY, hsts.clone());
            }
            if let Some(alt_svc) = alt_svc {
                response.headers_mut().insert(header::ALT_SVC, alt_svc);
            }
            if let Some((mut record, log, names)) = tally.record.take() {
                tally.fill(&mut record, &names, Some(status));
                let ending = tally.ending();
                let body = std::mem::replace(response.body_mut(), RespBody::Full(None));
                *response.body_mut() = RespBody::logged(body, record, log, ending);
            }
            then(response)
        }
    }

    /// The routing phase of a request: the answer to one refused or answered before routing
    /// (`refuse`, an HTTP-01 token, a bad Host, an HTTPS redirect, no route, its route's rate
    /// limit), or the pool of its route (noted in `tally`), the Host it lacked added, its
    /// request counted by the pool's retry budget. The request's fields are looked at once,
    /// here ([`RequestFields`]); its hop-by-hop ones go on with the pool.
    fn route_request(
        &self,
        req: &mut Request<ClientBody>,
        client: &ClientInfo,
        tally: &mut Tally,
    ) -> Routed<'_> {
        let fields = RequestFields::of(req.headers());
        let hops = fields.hops;
        if let Some(refused) = self.refuse(req, hops) {
            return Routed::Answer(refused);
        }
        if let Some(answer) = self
            .http01
            .as_ref()
            .and_then(|tokens| tokens.answer(req.method(), req.uri().path()))
        {
            return Routed::Answer(http01_page(answer));
        }
        let host = match request_host(req, &fields) {
            Ok(host) => host,
            Err(why) => {
                let mut page = error_page(StatusCode::BAD_REQUEST, why);
                page.headers_mut()
                    .insert(header::CONNECTION, HeaderValue::from_static("close"));
                return Routed::Answer(page);
            }
        };
        if let Some(port) = self.https_redirect {
            let host = host.as_str().map(strip_port);
            return Routed::Answer(https_redirect_page(host, req.uri(), port));
        }
        let route_host = if self.any_host { host.as_str() } else { None };
        let Some(route) = self.route(route_host, req) else {
            return Routed::Answer(error_page(
                StatusCode::NOT_FOUND,
                "no route matches this request",
            ));
        };
        tally.route = Some(route);
        if let Some(limit) = &self.routes[route].limit {
            if let Some(page) = limit.check(
                (req.headers(), req.uri().authority().map(|a| a.as_str())),
                client.addr.ip(),
            ) {
                tally.reason = Some(rate_limit::RATE_LIMITED);
                return Routed::Answer(page);
            }
        }
        let pool = match &self.routes[route].target {
            // Borrowed, not cloned: the proxy outlives the request's handling, and the pool's
            // reference count is a line every worker thread would write twice per request.
            Target::Pool(pool) => pool,
            Target::Redirect(rule) => {
                let prefix = &self.routes[route].path_prefix;
                let tls = self.tls;
                let page = redirect::redirect_page(rule, prefix, host.as_str(), req.uri(), tls);
                return Routed::Answer(page);
            }
        };
        // An HTTP/1.0 absolute-form request without Host: the backend gets the host the route
        // was chosen by.
        let add_host = match host {
            RequestHost::Target(authority) => HeaderValue::from_str(authority.as_str()).ok(),
            _ => None,
        };
        if let Some(value) = add_host {
            req.headers_mut().insert(header::HOST, value);
        }
        if let Some(rule) = &self.routes[route].rewrite {
            match rewrite::rewrite(rule, &self.routes[route].path_prefix, req.uri()) {
                Some(uri) => *req.uri_mut() = uri,
                None => {
                    return Routed::Answer(error_page(
                        StatusCode::INTERNAL_SERVER_ERROR,
                        "the route's path rewrite did not leave a path starting with /",
                    ))
                }
            }
        }
        pool.budget.on_request();
        Routed::Pool(pool, hops)
    }

    /// The answer to a request refused before anything else is looked at: a head larger than
    /// the listener allows, a CONNECT over HTTP/2 that is not a WebSocket's, a
    /// Transfer-Encoding other than `chunked` once.
    /// `hops`: the request's hop-by-hop fields.
    fn refuse(&self, req: &Request<ClientBody>, hops: HopFields) -> Option<Response<RespBody>> {
        if self.max_header_bytes < MIN_HYPER_BUFFER && head_size(req) > self.max_header_bytes {
            return Some(error_page(
                StatusCode::REQUEST_HEADER_FIELDS_TOO_LARGE,
                "request header fields too large",
            ));
        }
        // The one tunnel over HTTP/2: a WebSocket by extended CONNECT (RFC 8441), relayed to an
        // HTTP/1.1 backend as an upgrade. A plain CONNECT, or one for another protocol: 501.
        // HTTP/3 has none (RFC 9220 is not served): its CONNECT gets the same 501.
        if req.method() == Method::CONNECT
            && matches!(req.version(), Version::HTTP_2 | Version::HTTP_3)
            && !websocket::is_websocket_connect(req)
        {
            return Some(error_page(
                StatusCode::NOT_IMPLEMENTED,
                "CONNECT over HTTP/2 is supported only as an extended CONNECT for websocket",
            ));
        }
        if hops.transfer_encoding() && !framing::request_codings_ok(req.headers()) {
            let mut page = error_page(
                StatusCode::BAD_REQUEST,
                "Transfer-Encoding other than chunked once",
            );
            page.headers_mut()
                .insert(header::CONNECTION, HeaderValue::from_static("close"));
            return Some(page);
        }
        None
    }

    /// Prepares a routed request for `pool`'s backends and makes attempts, as the planner
    /// says, until an answer is relayed or the planner gives up. `hops`: the request's
    /// hop-by-hop fields, as routing found them.
    // Not an `async fn`, as `handle`.
    #[allow(clippy::manual_async_fn)]
    fn relay<'a>(
        &'a self,
        mut req: Request<ClientBody>,
        (pool, hops): (&'a Arc<PoolHandle>, HopFields),
        client: &'a Arc<ClientInfo>,
        tally: &'a mut Tally,
    ) -> impl Future<Output = Response<RespBody>> + 'a {
        async move {
            let websocket = websocket::is_websocket_connect(&req);
            let upgrade = websocket || (hops.upgrade() && wants_upgrade(req.headers()));
            if upgrade && pool.config.protocol.is_h2() {
                return error_page(
                    StatusCode::NOT_IMPLEMENTED,
                    "upgrades are not relayed to HTTP/2 backends",
                );
            }
            let mut affinity = Affinity::of(pool, &mut req, client);
            tally.affinity = affinity.unanswered();
            let mut prepared = self.prepare(req, (pool, hops), client, (websocket, upgrade), tally);
            let plan = &mut prepared.plan;
            let mut head = Vec::with_capacity(256);
            loop {
                // Each attempt on an HTTP/1.1 pool holds one of the client connection's backend
                // slots (HTTP/2 clients: `max_backend_connections`); a bodiless one waits for one
                // if need be, one with a body never does (`upstream::slots`: its unread body would
                // hold the connection's window that the streams holding the slots need).
                let slot = if prepared.h2 {
                    None
                } else if prepared.bodiless {
                    client.backend_slots.acquire().await
                } else {
                    client.backend_slots.try_acquire()
                };
                // A pool with limits may make the attempt wait for a slot (`queued.rs`; boxed: a
                // pool without them carries nothing of it in this future).
                let picked = match &pool.limits {
                    None => pick(pool, plan, &mut affinity).map(|index| (index, None)),
                    Some(limits) => {
                        Box::pin(queued::admit(pool, limits, plan, tally, &mut affinity)).await
                    }
                };
                let (index, admission) = match picked {
                    Ok(picked) => picked,
                    Err(page) => return page,
                };
                tally.attempt(index);
                // Each attempt's future is awaited here, not in a function of its own: its answer
                // is then moved once less (a response is a few hundred bytes, moved by memcpy).
                // The request goes from `prepared` into the attempt, and back if it was not sent:
                // one place for it, moved as few times as can be.
                let forwarded = if prepared.h2 {
                    let resend = prepared.resend.as_ref();
                    let Some(request) = prepared.request.take().or_else(|| resend?.rebuilt())
                    else {
                        return unsendable(plan);
                    };
                    let lease = match admission {
                        None => Lease::new(pool.clone(), index, None),
                        Some(admission) => Lease::admitted(pool.clone(), admission, None),
                    };
                    // Connecting happens within the exchange: the whole wait counts as sending.
                    tally.stage.now = Phase::Send;
                    // Boxed: inline, this attempt (4.3 KB) would be the largest state of this
                    // future, and of every request's future whatever its pool's protocol; a
                    // request's future is moved whole at least once (into hyper's HTTP/1
                    // dispatcher, into an HTTP/2 stream's box).
                    let attempt =
                        forward_h2(pool, index, request, (lease, resend), prepared.timeouts);
                    Box::pin(attempt).await
                } else {
                    let outgoing = match prepared.request.take() {
                        Some(request) => Outgoing::Request(request),
                        None => match &prepared.resend {
                            Some(Resend::H1(method)) => Outgoing::Resend(method),
                            _ => return unsendable(plan),
                        },
                    };
                    let lease = http1_lease(pool, (index, admission), client, slot);
                    // Pinned where it is made, as the relay in `handle`.
                    let attempt = pin!(forward(
                        pool,
                        index,
                        client,
                        outgoing,
                        &mut head,
                        lease,
                        prepared.upgrade,
                        prepared.timeouts,
                        &mut tally.stage,
                    ));
                    attempt.await
                };
                let next = match forwarded {
                    Forwarded::Response(mut response, status) => {
                        if prepared.websocket && (200..300).contains(&status) {
                            return websocket_not_switched();
                        }
                        match plan.after(Attempted::Answered(status), |t| affordable(pool, t)) {
                            Next::Relay => {
                                let rules_host = prepared.rules_host.as_ref();
                                let answer = (&mut response, index, rules_host);
                                self.deliver(answer, pool, &affinity, client, tally);
                                return response;
                            }
                            next => next,
                        }
                    }
                    Forwarded::Upgraded(mut response, stream, early) => {
                        // A sticky client's cookie rides on the 101 too, as HAProxy inserts it.
                        tally.affinity = affinity.answered(pool, index, &mut response);
                        let tunnel = Tunnel {
                            client: prepared.client_upgrade.take(),
                            hold: prepared.hold.take(),
                            stream,
                            early,
                            websocket: prepared.websocket,
                        };
                        tally.by = AnsweredBy::Backend;
                        return self.upgraded(pool, index, response, tunnel);
                    }
                    Forwarded::NotSent(outgoing, why) => {
                        // Back intact: the next attempt sends it (a resend is made again from
                        // what `prepared` kept).
                        if let Outgoing::Request(request) = outgoing {
                            prepared.request = Some(request);
                        }
                        plan.after(Attempted::NotSent(why), |t| affordable(pool, t))
                    }
                    Forwarded::Failed(why) => {
                        plan.after(Attempted::Failed(why), |t| affordable(pool, t))
                    }
                };
                tally.failure = plan.failure();
                if let Next::Fail(why) = next {
                    return failure_page(why);
                }
            }
        }
    }

    /// Makes backend `index`'s answer the one relayed (`relayed`), with what the request's
    /// affinity sets (a sticky cookie) and the response rules when the listener has any
    /// (`rules_host`: the request's host, for them).
    fn deliver(
        &self,
        (response, index, rules_host): (
            &mut Response<RespBody>,
            usize,
            Option<&Option<HeaderValue>>,
        ),
        pool: &PoolHandle,
        affinity: &Affinity,
        client: &ClientInfo,
        tally: &mut Tally,
    ) {
        relayed(response, pool.config.protocol.is_h2());
        tally.affinity = affinity.answered(pool, index, response);
        if let Some(host) = rules_host {
            let name = &pool.backends[index].name;
            self.rewrite_response(response, host, name, client, tally);
        }
        tally.by = AnsweredBy::Backend;
    }

    /// A routed request made ready for the backends: hop-by-hop fields out, a WebSocket over
    /// HTTP/2 made an HTTP/1.1 handshake, the forwarded fields in, origin-form, and what a
    /// resend needs. `(websocket, upgrade)`: whether it is a WebSocket by extended CONNECT,
    /// and whether it asks for an upgrade (never to an HTTP/2 pool: refused before).
    /// Inlined in `relay`, its one caller: the request it takes and the `Prepared` it gives
    /// are then not copied (memcpy) in and out of a call.
    #[inline(always)]
    fn prepare(
        &self,
        mut req: Request<ClientBody>,
        (pool, hops): (&PoolHandle, HopFields),
        client: &ClientInfo,
        (websocket, upgrade): (bool, bool),
        tally: &mut Tally,
    ) -> Prepared {
        let h2 = pool.config.protocol.is_h2();
        let client_upgrade = upgrade.then(|| hyper::upgrade::on(&mut req));
        let (mut parts, body) = req.into_parts();
        // What the tunnel of an HTTP/2 client's WebSocket holds for its client connection.
        let hold = websocket
            .then(|| parts.extensions.remove::<TunnelHold>())
            .flatten();
        strip_found(&mut parts.headers, hops, upgrade);
        if websocket {
            websocket::to_http1_handshake(&mut parts.method, &mut parts.headers);
        }
        if self.forwarded.x_forwarded() {
            add_forwarded_headers(&mut parts.headers, client);
        }
        let rules_host = if self.rewrites {
            Some(self.rewrite_request(&mut parts, pool, client, tally))
        } else {
            None
        };
        let uri = origin_form(&parts.uri);
        let bodiless = body.is_end_stream();
        if bodiless {
            tally.stage.connected = Phase::Headers;
        }
        let replayable = bodiless && !upgrade && is_idempotent(&parts.method);
        let resend = Resend::of(
            h2,
            bodiless,
            replayable,
            &parts.method,
            &uri,
            &parts.headers,
        );
        // Rebuildable when nothing of it was sent: exactly when an HTTP/2 resend is kept.
        let rebuildable = matches!(resend, Some(Resend::H2(..)));
        let plan = Planner::new(replayable, rebuildable, pool.config.retries.attempts);
        // An HTTP/1 client connection hears when the body has been read (bodiless: it knows).
        let hook = (!bodiless && parts.version != Version::HTTP_2)
            .then(|| parts.extensions.remove::<BodyReadHook>())
            .flatten()
            .map(|hook| hook.0);
        let request = build_request(
            parts.method,
            uri,
            parts.headers,
            ReqBody::Incoming(body, hook),
        );
        Prepared {
            request: Some(request),
            resend,
            plan,
            client_upgrade,
            hold,
            websocket,
            upgrade,
            bodiless,
            h2,
            rules_host,
            timeouts: ExchangeTimeouts {
                response_header: pool.config.timeouts.response_header,
                body_idle: pool.config.timeouts.body_idle,
                request_body: self.request_body_timeout,
            },
        }
    }

    /// The answer of a backend that switched protocols, its connection joined to the
    /// client's once the answer reaches the client. A 101 nobody asked for: the client gets it,
    /// and nothing else.
    fn upgraded(
        &self,
        pool: &PoolHandle,
        index: usize,
        mut response: Response<RespBody>,
        tunneled: Tunnel,
    ) -> Response<RespBody> {
        if tunneled.websocket {
            websocket::to_h2_answer(&mut response);
        }
        match tunneled.client {
            Some(client) => {
                let closing = pool.backends[index]
                    .tunnels
                    .as_ref()
                    .filter(|_| pool.config.close_tunnels_on_down)
                    .map(|tunnels| tunnels.subscribe());
                tunnel(
                    client,
                    tunneled.hold,
                    tunneled.stream,
                    tunneled.early,
                    self.tunnel_idle,
                    closing,
                );
            }
            None => drop(tunneled.stream),
        }
        response
    }
}

/// What the routing phase came to. Never stored: a value on the stack that `handle` matches at
/// once, so the answer is not boxed (that would allocate for every page capataz writes).
#[allow(clippy::large_enum_variant)]
enum Routed<'a> {
    /// The request is answered without a backend.
    Answer(Response<RespBody>),
    /// The request goes to this pool's backends; its hop-by-hop fields, as found.
    Pool(&'a Arc<PoolHandle>, HopFields),
}

/// What a request is sent again from, to another backend: for HTTP/1.1 the head encoded for
/// the first attempt, byte for byte, which needs only the method besides (a copy without
/// allocation for the methods that are replayable); for HTTP/2, which has no head bytes to
/// resend, a bodiless request rebuilt from its parts (a stream refused unprocessed may go
/// elsewhere whatever its method).
enum Resend {
    H1(Method),
    H2(Method, Uri, HeaderMap),
}

impl Resend {
    fn of(
        h2: bool,
        bodiless: bool,
        replayable: bool,
        method: &Method,
        uri: &Uri,
        headers: &HeaderMap,
    ) -> Option<Resend> {
        match (h2, bodiless, replayable) {
            (true, true, _) => Some(Resend::H2(method.clone(), uri.clone(), headers.clone())),
            (false, _, true) => Some(Resend::H1(method.clone())),
            _ => None,
        }
    }

    /// An HTTP/2 request rebuilt for another backend (none for an HTTP/1.1 resend, which is
    /// `Outgoing::Resend` of the method).
    fn rebuilt(&self) -> Option<Request<ReqBody>> {
        match self {
            Resend::H1(_) => None,
            Resend::H2(method, uri, headers) => Some(build_request(
                method.clone(),
                uri.clone(),
                headers.clone(),
                ReqBody::Empty,
            )),
        }
    }
}

/// A request ready for its attempts (see [`Proxy::prepare`]).
struct Prepared {
    /// The request as the next attempt sends it: taken by the attempt, back if it was not
    /// sent (a resend is made from `resend`).
    request: Option<Request<ReqBody>>,
    resend: Option<Resend>,
    plan: Planner,
    /// The client's side of an upgrade it asked for.
    client_upgrade: Option<hyper::upgrade::OnUpgrade>,
    /// What its tunnel holds for the client connection (an HTTP/2 client's WebSocket).
    hold: Option<TunnelHold>,
    /// A WebSocket by extended CONNECT over HTTP/2, relayed as an HTTP/1.1 upgrade.
    websocket: bool,
    upgrade: bool,
    bodiless: bool,
    /// The pool's backends speak HTTP/2.
    h2: bool,
    /// With header rules or a request id: the request's host as sent (`%{host}`), for the
    /// answer's rules; `None` when the listener has neither.
    rules_host: Option<Option<HeaderValue>>,
    timeouts: ExchangeTimeouts,
}

/// The answer when an attempt has nothing to send. Unreachable: a request that cannot be sent
/// again is not retried once sent.
fn unsendable(plan: &Planner) -> Response<RespBody> {
    failure_page(
        plan.failure()
            .unwrap_or(Failure::Attempt(AttemptError::HeadTimeout)),
    )
}

/// The picking phase of an attempt: the backend affinity (a sticky cookie, a hashed key) or
/// else the pool's algorithm gives among those the request has not tried (noted in `plan`),
/// or, when none is left, the answer: the last failure's, or the pool's rejection if there
/// was none. (The answer is not boxed: it is
/// matched at once, and a box would allocate for it.)
#[allow(clippy::result_large_err)]
fn pick(
    pool: &PoolHandle,
    plan: &mut Planner,
    affinity: &mut Affinity,
) -> Result<usize, Response<RespBody>> {
    let snapshot = pool.snapshot();
    let in_flight = |b: usize| pool.backends[b].in_flight.load(Ordering::Relaxed);
    let picked = match affinity.pick(pool, &snapshot, plan.tried()) {
        Some(picked) => picked,
        None => match pool.config.algorithm {
            Algorithm::PeakEwma => {
                let now = std::time::Instant::now();
                snapshot.pick_peak_ewma(plan.tried(), in_flight, |b| {
                    pool.backends[b].ewma.as_ref()?.estimate(now)
                })
            }
            algorithm => snapshot.pick(algorithm, &pool.cursor, plan.tried(), in_flight),
        },
    };
    let all_down = snapshot.all_down;
    drop(snapshot);
    let Some(index) = picked else {
        return Err(match plan.failure() {
            Some(failure) => failure_page(failure),
            None => {
                pool.metrics.reject();
                reject_page(pool, all_down)
            }
        });
    };
    plan.picked(index);
    Ok(index)
}

/// The answer to a WebSocket handshake over HTTP/2 that a backend answered 2xx without
/// switching protocols (over HTTP/2 a 2xx would open the tunnel).
fn websocket_not_switched() -> Response<RespBody> {
    error_page(
        StatusCode::BAD_GATEWAY,
        "the backend answered the WebSocket handshake without switching protocols",
    )
}

/// Makes a backend's answer the one relayed: hop-by-hop fields out; an HTTP/2 backend's
/// trailer names kept (see `trailer_names`). An HTTP/1.1 backend's answer has been stripped
/// already, by `forward`, which knows from its head's parse whether it has any.
fn relayed(response: &mut Response<RespBody>, h2: bool) {
    if !h2 {
        return;
    }
    let trailer = trailer_names(response.headers_mut());
    strip_hop_by_hop(response.headers_mut(), false);
    if let Some(names) = trailer {
        response.headers_mut().insert(header::TRAILER, names);
    }
}

/// The lease of an attempt on an HTTP/1.1 pool's backend `index` (on the slot `admission`
/// holds, in a pool with limits): it holds the client connection's backend `slot` and, with
/// `connection_reuse = "private"`, the connection's private idle connections.
fn http1_lease(
    pool: &Arc<PoolHandle>,
    (index, admission): (usize, Option<crate::balance::Admission<'_>>),
    client: &ClientInfo,
    slot: Option<crate::upstream::Slot>,
) -> Lease {
    let private = match pool.config.connection_reuse {
        ConnectionReuse::Private => Some(client.private.clone()),
        ConnectionReuse::Shared => None,
    };
    let mut lease = match admission {
        None => Lease::new(pool.clone(), index, private),
        Some(admission) => Lease::admitted(pool.clone(), admission, private),
    };
    lease.hold(slot);
    lease
}

/// An upgraded exchange's two ends: the client's upgrade (none if it asked for none), the
/// backend's connection and what the backend sent after its 101 before the tunnel existed.
struct Tunnel {
    client: Option<hyper::upgrade::OnUpgrade>,
    /// Held for the tunnel's life ([`TunnelHold`]).
    hold: Option<TunnelHold>,
    stream: BackendStream,
    early: Bytes,
    websocket: bool,
}

/// Whether the pool pays for one more attempt: an eligible backend has not been tried yet,
/// and is below its limit in a pool with limits (else the last one's own answer, a 503 with
/// its `Retry-After` say, reaches the client instead of a 502 of ours, and no budget is spent
/// for nothing), and the pool's retry budget has a token (spent, and the retry counted, if
/// so).
fn affordable(pool: &PoolHandle, tried: &[usize]) -> bool {
    let snapshot = pool.snapshot();
    let left = |b: &usize| {
        !tried.contains(b)
            && pool
                .limits
                .as_ref()
                .is_none_or(|limits| !limits.at_limit(pool, &snapshot, *b))
    };
    let ok = snapshot.eligible.iter().any(left) && pool.budget.try_spend();
    if ok {
        pool.metrics.retry();
    }
    ok
}
