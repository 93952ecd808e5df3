//! The admin API: a separate listener that answers "which backends are in or out, why, and
//! when do they come back", streams events, and lets an operator act on a backend by hand or
//! reload the configuration.
//!
//! Endpoints (JSON unless said):
//! - `GET /` the live dashboard (one self-contained HTML page);
//! - `GET /status`, `GET /status/<pool>/<backend>` state, streaks, history and the explain
//!   sentence;
//! - `GET /events` a Server-Sent Events stream of health events;
//! - `GET /record/<pool>` the pool's probe and traffic outcomes, streamed in the replay
//!   protocol ([`record`]);
//! - `GET /history/events` the last health events kept (500 at most), oldest first;
//! - `GET /history/series` per pool and backend the request rate, error rate and latency
//!   samples of the last 15 minutes, and per backend its state timeline over the last hour;
//! - `GET /metrics` Prometheus text;
//! - `POST /backends/<pool>/<backend>/{drain,down,up,maintenance,clear}[?ttl=30s]` manual overrides;
//! - `POST /reload` re-read and apply the config file.
//!
//! With a token configured every request needs `Authorization: Bearer <token>` (401 otherwise),
//! except `GET` and `HEAD` requests when `open_read_only` is set. Without a token the listener only runs on
//! a loopback address (the config loader refuses anything else). A request let in without a
//! token must also pass the checks against web pages in [`guard`] (its Host, and for writes its
//! Origin and content type).
//!
//! The module holds the listener (a bounded number of connections, each with a head
//! deadline) and the response helpers; [`routes`] decides who may ask and what a path means,
//! [`overrides`] parses and applies manual overrides, and [`pages`] builds the read-only
//! answers (status, metrics, the event stream).

// The runtime's modules, under the names the admin API's modules have always used.
use capataz_runtime::{balance, config, events, health, metrics, status, supervisor, timefmt};

mod guard;
mod overrides;
mod pages;
mod query;
mod record;
mod routes;

use std::convert::Infallible;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http::{header, Response, StatusCode};
use http_body_util::{combinators::BoxBody, BodyExt, Full};
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper_util::rt::{TokioIo, TokioTimer};
use serde_json::{json, Value};
use tokio::net::TcpListener;
use tokio::sync::Semaphore;

use crate::supervisor::Supervisor;

pub use overrides::{parse_ttl, TtlError};
pub use query::QueryError;

type Body = BoxBody<Bytes, Infallible>;

/// The most admin connections open at once (event streams included); more are closed as soon
/// as they are accepted. HAProxy's stats socket has a similar bound (`stats maxconn`).
pub const MAX_CONNECTIONS: usize = 256;

/// How long a connection may take to send a request head, counted from when the server starts
/// waiting for it (so an idle connection is closed after it too).
const HEAD_TIMEOUT: Duration = Duration::from_secs(30);

/// Serves the admin API on `socket` until the balancer shuts down.
pub async fn serve(socket: TcpListener, supervisor: Arc<Supervisor>) {
    let mut shutdown = supervisor.shutdown_signal();
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
        let supervisor = supervisor.clone();
        // The address the client reached: a Host naming it is this listener.
        let Ok(local) = stream.local_addr() else {
            continue;
        };
        tokio::spawn(async move {
            let _permit = permit;
            let service = service_fn(move |req| {
                let supervisor = supervisor.clone();
                async move { Ok::<_, Infallible>(routes::handle(supervisor, local, req).await) }
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

/// A 405 with the `Allow` header RFC 9110 asks for.
fn not_allowed(allow: &'static str, message: &str) -> Response<Body> {
    let mut response = error(StatusCode::METHOD_NOT_ALLOWED, message);
    response
        .headers_mut()
        .insert(header::ALLOW, header::HeaderValue::from_static(allow));
    response
}
