//! The admin API: a separate listener that answers "which backends are in or out, why, and
//! when do they come back", streams events, and lets an operator act on a backend by hand or
//! reload the configuration.
//!
//! Endpoints (JSON unless said):
//! - `GET /` the live dashboard (one self-contained HTML page);
//! - `GET /status`, `GET /status/<pool>/<backend>` state, streaks, history and the explain
//!   sentence;
//! - `GET /events` a Server-Sent Events stream of health events;
//! - `GET /metrics` Prometheus text;
//! - `POST /backends/<pool>/<backend>/{drain,down,up,clear}[?ttl=30s]` manual overrides;
//! - `POST /reload` re-read and apply the config file.
//!
//! With a token configured every request needs `Authorization: Bearer <token>` (401 otherwise),
//! except `GET` and `HEAD` requests when `open_read_only` is set. Without a token the listener only runs on
//! a loopback address (the config loader refuses anything else). A request let in without a
//! token must also pass the checks against web pages in [`guard`] (its Host, and for writes its
//! Origin and content type).

mod guard;

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http::{header, Method, Request, Response, StatusCode};
use http_body_util::{combinators::BoxBody, BodyExt, Full};
use hyper::body::{Frame, Incoming};
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper_util::rt::{TokioIo, TokioTimer};
use serde_json::{json, Value};
use tokio::net::TcpListener;
use tokio::sync::{broadcast, Semaphore};

use crate::events::OverrideKind;
use crate::health::PoolRt;
use crate::shared::Shared;

type Body = BoxBody<Bytes, Infallible>;

const DASHBOARD: &str = include_str!("admin/dashboard.html");

/// The most admin connections open at once (event streams included); more are closed as soon
/// as they are accepted. HAProxy's stats socket has a similar bound (`stats maxconn`).
pub const MAX_CONNECTIONS: usize = 256;

/// How long a connection may take to send a request head, counted from when the server starts
/// waiting for it (so an idle connection is closed after it too).
const HEAD_TIMEOUT: Duration = Duration::from_secs(30);

/// Serves the admin API on `socket` until the balancer shuts down.
pub async fn serve(socket: TcpListener, shared: Arc<Shared>) {
    let mut shutdown = shared.shutdown_signal();
    // `changed` only sees a shutdown sent after the subscription, and this task may first run
    // after the balancer was told to stop.
    if *shutdown.borrow() {
        return;
    }
    let connections = Arc::new(Semaphore::new(MAX_CONNECTIONS));
    let mut warned = false;
    loop {
        let (stream, _) = tokio::select! {
            accepted = socket.accept() => match accepted {
                Ok(pair) => pair,
                Err(error) => {
                    tracing::warn!(%error, "admin accept failed");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            },
            _ = shutdown.changed() => return,
        };
        // At most MAX_CONNECTIONS at once: past that a connection is closed at once, so that
        // clients that connect and idle cannot use up the process's file descriptors, which
        // the proxy needs too.
        let Ok(permit) = connections.clone().try_acquire_owned() else {
            drop(stream);
            if !warned {
                tracing::warn!(
                    limit = MAX_CONNECTIONS,
                    "admin API: too many connections at once; closing new ones until some end"
                );
                warned = true;
            }
            continue;
        };
        warned = false;
        let shared = shared.clone();
        // The address the client reached: a Host naming it is this listener.
        let Ok(local) = stream.local_addr() else {
            continue;
        };
        tokio::spawn(async move {
            let _permit = permit;
            let service = service_fn(move |req| {
                let shared = shared.clone();
                async move { Ok::<_, Infallible>(handle(shared, local, req).await) }
            });
            let _ = http1::Builder::new()
                .timer(TokioTimer::new())
                // Also bounds an idle keep-alive connection: the next head must arrive in time.
                .header_read_timeout(HEAD_TIMEOUT)
                .serve_connection(TokioIo::new(stream), service)
                .await;
        });
    }
}

fn full(status: StatusCode, content_type: &'static str, body: impl Into<Bytes>) -> Response<Body> {
    let mut response = Response::new(Full::new(body.into()).boxed());
    *response.status_mut() = status;
    response.headers_mut().insert(
        header::CONTENT_TYPE,
        header::HeaderValue::from_static(content_type),
    );
    response.headers_mut().insert(
        header::CACHE_CONTROL,
        header::HeaderValue::from_static("no-store"),
    );
    response
}

fn json_response(status: StatusCode, value: &Value) -> Response<Body> {
    let mut text = serde_json::to_string_pretty(value).unwrap_or_else(|_| "{}".into());
    text.push('\n');
    full(status, "application/json", text)
}

fn error(status: StatusCode, message: impl Into<String>) -> Response<Body> {
    json_response(status, &json!({ "error": message.into() }))
}

/// How a request got in, if it did.
enum Access {
    /// It carries the configured token: no web page can have sent it.
    Token,
    /// No token was needed (none configured, or an open read): it must pass [`guard::check`].
    Open,
    /// A token is needed and missing or wrong.
    Denied,
}

fn access(shared: &Shared, req: &Request<Incoming>) -> Access {
    let config = shared.config();
    let Some(token) = config.admin.as_ref().and_then(|a| a.token.as_ref()) else {
        return Access::Open;
    };
    let presented = req
        .headers()
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        // The scheme is case-insensitive (RFC 9110 section 11.1): `bearer` is fine too.
        .and_then(|v| {
            let (scheme, token) = v.split_once(' ')?;
            scheme.eq_ignore_ascii_case("bearer").then_some(token)
        });
    if presented.is_some_and(|p| constant_time_eq(p.as_bytes(), token.as_bytes())) {
        return Access::Token;
    }
    let open_read = config.admin.as_ref().is_some_and(|a| a.open_read_only);
    if open_read && (req.method() == Method::GET || req.method() == Method::HEAD) {
        Access::Open
    } else {
        Access::Denied
    }
}

fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

async fn handle(shared: Arc<Shared>, local: SocketAddr, req: Request<Incoming>) -> Response<Body> {
    let access = access(&shared, &req);
    if let Access::Open = access {
        let config = shared.config();
        let target = req.uri().authority().map(|a| a.as_str());
        if let Err(refusal) = guard::check(
            config.admin.as_ref(),
            local,
            req.method(),
            target,
            req.headers(),
        ) {
            return error(refusal.status, refusal.message);
        }
    }
    if let Access::Denied = access {
        let mut response = error(
            StatusCode::UNAUTHORIZED,
            "this admin API needs `Authorization: Bearer <token>` (admin.token in the config)",
        );
        response.headers_mut().insert(
            header::WWW_AUTHENTICATE,
            header::HeaderValue::from_static("Bearer realm=\"capataz\""),
        );
        return response;
    }
    let path = req.uri().path().to_owned();
    // Split first, then decode each segment: a name may hold any character, `/` included
    // (`%2F`), and a client must percent-encode spaces and non-ASCII text.
    let mut segments = Vec::new();
    for raw in path.split('/').filter(|s| !s.is_empty()) {
        match percent_decode(raw) {
            Some(segment) => segments.push(segment),
            None => {
                return error(
                    StatusCode::BAD_REQUEST,
                    format!(
                    "the path {path:?} has a bad percent-encoding (use %XX for each byte of UTF-8)"
                ),
                )
            }
        }
    }
    let segments: Vec<&str> = segments.iter().map(String::as_str).collect();
    let method = req.method().clone();
    let get = method == Method::GET || method == Method::HEAD;
    match segments.as_slice() {
        [] if get => full(StatusCode::OK, "text/html; charset=utf-8", DASHBOARD),
        ["status"] if get => status(&shared).await,
        ["status", pool, backend] if get => backend_status(&shared, pool, backend),
        ["events"] if get => events(&shared),
        ["metrics"] if get => metrics(&shared).await,
        ["backends", pool, backend, action] if method == Method::POST => {
            override_backend(&shared, pool, backend, action, req.uri().query())
        }
        ["reload"] if method == Method::POST => match shared.reload_from_file().await {
            Ok(summary) => json_response(
                StatusCode::OK,
                &json!({
                    "reloaded": true,
                    "kept": summary.kept,
                    "added": summary.added,
                    "removed": summary.removed,
                    "listeners_added": summary.listeners_added,
                    "listeners_removed": summary.listeners_removed,
                }),
            ),
            Err(e) => {
                tracing::error!("reload refused, the running configuration stays: {e}");
                error(
                    StatusCode::UNPROCESSABLE_ENTITY,
                    format!("reload refused, the running configuration stays: {e}"),
                )
            }
        },
        [] | ["status"] | ["status", _, _] | ["events"] | ["metrics"] => {
            not_allowed("GET, HEAD", "use GET")
        }
        ["backends", _, _, _] | ["reload"] => not_allowed("POST", "use POST"),
        _ => error(
            StatusCode::NOT_FOUND,
            format!(
                "no such endpoint: {method} {path} (see GET /, /status, /status/<pool>/<backend>, \
                 /events, /metrics; POST /backends/<pool>/<backend>/<action>, /reload)"
            ),
        ),
    }
}

/// A 405 with the `Allow` header RFC 9110 asks for.
fn not_allowed(allow: &'static str, message: &str) -> Response<Body> {
    let mut response = error(StatusCode::METHOD_NOT_ALLOWED, message);
    response
        .headers_mut()
        .insert(header::ALLOW, header::HeaderValue::from_static(allow));
    response
}

/// `text` with its `%XX` escapes decoded; `None` if an escape is malformed or the bytes are
/// not UTF-8.
fn percent_decode(text: &str) -> Option<String> {
    if !text.contains('%') {
        return Some(text.to_owned());
    }
    let bytes = text.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'%' {
            let hex = bytes.get(i + 1..i + 3)?;
            let hex = std::str::from_utf8(hex).ok()?;
            if !hex.bytes().all(|b| b.is_ascii_hexdigit()) {
                return None;
            }
            out.push(u8::from_str_radix(hex, 16).ok()?);
            i += 3;
        } else {
            out.push(bytes[i]);
            i += 1;
        }
    }
    String::from_utf8(out).ok()
}

fn backend_status(shared: &Shared, pool: &str, backend: &str) -> Response<Body> {
    let Some(pool_rt) = shared.pool(pool) else {
        return error(StatusCode::NOT_FOUND, format!("no pool named {pool:?}"));
    };
    let Some(index) = pool_rt.index_of(backend) else {
        return error(
            StatusCode::NOT_FOUND,
            format!("pool {pool} has no backend named {backend:?}"),
        );
    };
    json_response(
        StatusCode::OK,
        &crate::status::backend_json(&pool_rt, &pool_rt.view_of(index)),
    )
}

/// Reads the `ttl` of an override's query string (`?ttl=30s`, percent-encoding allowed): `None`
/// without one; an error for zero, above [`crate::config::MAX_DURATION`], a value that is not a
/// duration, a second `ttl`, or any other parameter (a typo such as `?tll=10m` would otherwise
/// set an override until cleared). Public for the fuzz target.
pub fn parse_ttl(query: Option<&str>) -> Result<Option<Duration>, String> {
    let Some(query) = query else {
        return Ok(None);
    };
    let mut ttl = None;
    for pair in query.split('&').filter(|pair| !pair.is_empty()) {
        let (key, value) = pair.split_once('=').unwrap_or((pair, ""));
        let decode = |text: &str| {
            percent_decode(&text.replace('+', " "))
                .ok_or_else(|| format!("the query {query:?} has a bad percent-encoding"))
        };
        let (key, value) = (decode(key)?, decode(value)?);
        if key != "ttl" {
            return Err(format!(
                "unknown query parameter {key:?} (the only one is ttl, e.g. ?ttl=30s)"
            ));
        }
        if ttl.is_some() {
            return Err("ttl is given twice (give it once)".into());
        }
        ttl = Some(match crate::config::parse_duration(&value) {
            Ok(Duration::ZERO) => {
                return Err(format!(
                    "ttl: {value:?} is zero (use a duration above zero, e.g. \"30s\", or leave \
                     ttl out for an override until cleared)"
                ))
            }
            Ok(ttl) => ttl,
            Err(e) => return Err(format!("ttl: {e}")),
        });
    }
    Ok(ttl)
}

fn override_backend(
    shared: &Shared,
    pool: &str,
    backend: &str,
    action: &str,
    query: Option<&str>,
) -> Response<Body> {
    let kind = match action {
        "drain" => Some(OverrideKind::Drain),
        "down" => Some(OverrideKind::Down),
        "up" => Some(OverrideKind::Up),
        "clear" => None,
        other => {
            return error(
                StatusCode::NOT_FOUND,
                format!("unknown action {other:?}: use drain, down, up or clear"),
            )
        }
    };
    let ttl = match parse_ttl(query) {
        Ok(ttl) => ttl,
        Err(e) => return error(StatusCode::BAD_REQUEST, e),
    };
    if kind.is_none() && ttl.is_some() {
        return error(
            StatusCode::BAD_REQUEST,
            "clear takes no ttl: it ends the override now (to set one for a while, use drain, \
             down or up with ?ttl=...)",
        );
    }
    let Some(outcome) = shared.set_override(pool, backend, kind, ttl) else {
        return error(StatusCode::NOT_FOUND, format!("no pool named {pool:?}"));
    };
    match outcome {
        Ok(state) => json_response(
            StatusCode::OK,
            &json!({ "pool": pool, "backend": backend, "state": state,
                     "override": kind.map(|k| k.as_str()), "ttl_ms": ttl.map(|t| u64::try_from(t.as_millis()).unwrap_or(u64::MAX)) }),
        ),
        Err(e) => error(StatusCode::NOT_FOUND, e.to_string()),
    }
}

/// Pages (`/status`, `/metrics`) covering at most this many backends in all are built on the
/// runtime thread: they take well under a millisecond, less than a hand-off to another thread.
const INLINE_PAGE_BACKENDS: usize = 64;

/// The larger pages being built at once, at most. With thousands of backends one takes tens to
/// hundreds of milliseconds and megabytes, so it is built on tokio's blocking pool, not on a
/// runtime thread that probes and requests need (one worker thread is a supported setup); this
/// keeps a crowd of scrapers from starting hundreds of such builds together. Others wait their
/// turn.
static PAGE_BUILDS: Semaphore = Semaphore::const_new(2);

/// Runs `build` for a page about `pools`: inline if the page is small, else on the blocking
/// pool in one of the [`PAGE_BUILDS`] turns, held by the build itself (so a client that goes
/// away frees nothing early). `None` if the build could not run (it panicked).
async fn build_page<T: Send + 'static>(
    pools: &[Arc<PoolRt>],
    build: impl FnOnce() -> T + Send + 'static,
) -> Option<T> {
    let backends: usize = pools.iter().map(|pool| pool.backends.len()).sum();
    if backends <= INLINE_PAGE_BACKENDS {
        return Some(build());
    }
    // The semaphore is never closed, so a turn always comes.
    let turn = PAGE_BUILDS.acquire().await.ok()?;
    tokio::task::spawn_blocking(move || {
        let _turn = turn;
        build()
    })
    .await
    .ok()
}

/// `GET /status`: every pool and backend, as JSON.
async fn status(shared: &Shared) -> Response<Body> {
    let pools = shared.pools();
    let page = pools.clone();
    let built = build_page(&pools, move || {
        let time = crate::timefmt::rfc3339(std::time::SystemTime::now());
        crate::status::page(&page, &time)
    })
    .await;
    match built {
        Some(Ok(body)) => full(StatusCode::OK, "application/json", body),
        Some(Err(_)) | None => error(StatusCode::INTERNAL_SERVER_ERROR, "status encoding failed"),
    }
}

/// `GET /metrics`: the counters and the live gauges, as OpenMetrics text.
async fn metrics(shared: &Shared) -> Response<Body> {
    let alerts = shared.alert_stats();
    let metrics = shared.metrics();
    let pools = shared.pools();
    let page = pools.clone();
    let rendered = build_page(&pools, move || metrics.render(&page, alerts.as_deref())).await;
    match rendered {
        Some(Ok(text)) => full(StatusCode::OK, crate::metrics::CONTENT_TYPE, text),
        Some(Err(_)) | None => error(StatusCode::INTERNAL_SERVER_ERROR, "metrics encoding failed"),
    }
}

/// `GET /events`: each health event as one SSE message (`event: <type>`, `data: <json>`), and
/// a comment every 15 s to keep proxies from closing the stream.
fn events(shared: &Shared) -> Response<Body> {
    let mut rx = shared.subscribe();
    let mut shutdown = shared.shutdown_signal();
    let (tx, body_rx) = tokio::sync::mpsc::channel::<Result<Frame<Bytes>, Infallible>>(64);
    tokio::spawn(async move {
        let hello = Bytes::from_static(b": capataz events\n\n");
        if tx.send(Ok(Frame::data(hello))).await.is_err() {
            return;
        }
        loop {
            let message = tokio::select! {
                received = rx.recv() => match received {
                    Ok(event) => format!("event: {}\ndata: {}\n\n", event.kind(), event.to_json()),
                    Err(broadcast::error::RecvError::Lagged(n)) => {
                        format!("event: lagged\ndata: {{\"missed\": {n}}}\n\n")
                    }
                    Err(broadcast::error::RecvError::Closed) => return,
                },
                _ = tokio::time::sleep(Duration::from_secs(15)) => ": keep-alive\n\n".to_string(),
                _ = shutdown.changed() => return,
            };
            if tx
                .send(Ok(Frame::data(Bytes::from(message))))
                .await
                .is_err()
            {
                return;
            }
        }
    });
    let mut response = Response::new(BodyExt::boxed(SseBody(body_rx)));
    response.headers_mut().insert(
        header::CONTENT_TYPE,
        header::HeaderValue::from_static("text/event-stream"),
    );
    response.headers_mut().insert(
        header::CACHE_CONTROL,
        header::HeaderValue::from_static("no-store"),
    );
    response
}

/// The SSE body: frames as the event task sends them, ending when it stops.
struct SseBody(tokio::sync::mpsc::Receiver<Result<Frame<Bytes>, Infallible>>);

impl hyper::body::Body for SseBody {
    type Data = Bytes;
    type Error = Infallible;

    fn poll_frame(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Result<Frame<Bytes>, Infallible>>> {
        self.0.poll_recv(cx)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ttls() {
        assert_eq!(parse_ttl(None), Ok(None));
        assert_eq!(
            parse_ttl(Some("ttl=30s")),
            Ok(Some(Duration::from_secs(30)))
        );
        assert_eq!(
            parse_ttl(Some("ttl=8760h")),
            Ok(Some(crate::config::MAX_DURATION))
        );
        assert_eq!(
            parse_ttl(Some("ttl=1.5%6D&")),
            Ok(Some(Duration::from_secs(90)))
        );
        assert_eq!(parse_ttl(Some("")), Ok(None));
        for bad in [
            "ttl=18446744073709551615s",
            "ttl=9223372036854775807s",
            "ttl=8761h",
            "ttl=x",
            "ttl=0s",
            "ttl=0.0ms",
            "tll=10m",
            "TTL=10m",
            "a=b&ttl=1s",
            "ttl=1s&ttl=1h",
            "ttl=1s%26ttl%3D1h",
            "ttl=%zz",
        ] {
            assert!(parse_ttl(Some(bad)).is_err(), "{bad}");
        }
    }

    proptest::proptest! {
        /// Any query: no panic, and a TTL never above the maximum.
        #[test]
        fn the_admin_query_parser_never_panics_and_enforces_the_maximum(
            query in "((ttl|x)=[0-9.]{0,25}(ms|s|m|h)?&?){0,3}|\\PC{0,40}",
        ) {
            if let Ok(Some(ttl)) = parse_ttl(Some(&query)) {
                proptest::prop_assert!(ttl <= crate::config::MAX_DURATION);
            }
        }
    }
}
