//! The read-only answers: a backend's or every pool's status, the metrics page, and the event
//! stream. Large pages are built off the runtime threads (see [`build_page`]), so that a
//! scrape of thousands of backends never holds up probes and requests.

use std::convert::Infallible;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http::{header, Response, StatusCode};
use http_body_util::BodyExt;
use hyper::body::Frame;
use tokio::sync::{broadcast, Semaphore};

use super::{error, full, json_response, Body};
use crate::health::PoolRt;
use crate::metrics::Format;
use crate::supervisor::Supervisor;

pub(super) fn backend_status(supervisor: &Supervisor, pool: &str, backend: &str) -> Response<Body> {
    let Some(pool_rt) = supervisor.pool(pool) else {
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

/// Pages (`/status`, `/metrics`) covering at most this many backends in all are built on the
/// runtime thread: they take well under a millisecond, less than a hand-off to another thread.
const INLINE_PAGE_BACKENDS: usize = 64;

/// The larger pages being built at once, at most. With thousands of backends one takes tens to
/// hundreds of milliseconds and megabytes, so it is built on tokio's blocking pool, not on a
/// runtime thread that probes and requests need (one worker thread is a supported setup); this
/// keeps a crowd of scrapers from starting hundreds of such builds together. Others wait their
/// turn.
static PAGE_BUILDS: Semaphore = Semaphore::const_new(2);

/// A scrape lists `/proc/self/fd` (see `metrics::process`): with more client connections than
/// this open, it is built off the runtime threads too, whatever the number of backends.
const INLINE_SCRAPE_CONNECTIONS: usize = 1024;

/// Runs `build` for a page about `pools`: inline if the page is small, else on the blocking
/// pool in one of the [`PAGE_BUILDS`] turns, held by the build itself (so a client that goes
/// away frees nothing early). `None` if the build could not run (it panicked).
async fn build_page<T: Send + 'static>(
    pools: &[Arc<PoolRt>],
    build: impl FnOnce() -> T + Send + 'static,
) -> Option<T> {
    let backends: usize = pools.iter().map(|pool| pool.backends.len()).sum();
    build_page_of(backends <= INLINE_PAGE_BACKENDS, build).await
}

/// Runs `build` inline if `small`, else as [`build_page`] does for a large page.
async fn build_page_of<T: Send + 'static>(
    small: bool,
    build: impl FnOnce() -> T + Send + 'static,
) -> Option<T> {
    if small {
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
pub(super) async fn status(supervisor: &Supervisor) -> Response<Body> {
    let pools = supervisor.pools();
    let page = pools.clone();
    let fleet = supervisor.fleet().clone();
    let listeners = supervisor.listener_views();
    let built = build_page(&pools, move || {
        let time = crate::timefmt::rfc3339(std::time::SystemTime::now());
        crate::status::page(&page, &time, fleet.status(&page), &listeners)
    })
    .await;
    match built {
        Some(Ok(body)) => full(StatusCode::OK, "application/json", body),
        Some(Err(_)) | None => error(StatusCode::INTERNAL_SERVER_ERROR, "status encoding failed"),
    }
}

/// `GET /history/events`: the last events the balancer kept, oldest first.
pub(super) fn history_events(supervisor: &Supervisor) -> Response<Body> {
    json_response(StatusCode::OK, &supervisor.history().events_json())
}

/// `GET /history/series[?pool=NAME]`: per pool (or only the pool named) and backend the recent
/// samples, and per backend its timeline over the last hour.
pub(super) async fn history_series(
    supervisor: &Arc<Supervisor>,
    query: Option<&str>,
) -> Response<Body> {
    let pools = supervisor.pools();
    let wanted = match super::query::single(query, "pool", "?pool=web") {
        Ok(wanted) => wanted,
        Err(message) => return error(StatusCode::BAD_REQUEST, message.to_string()),
    };
    let pools = match wanted {
        None => pools,
        Some(name) => match pools.iter().find(|pool| *pool.name == *name) {
            Some(pool) => Arc::new(vec![pool.clone()]),
            None => return error(StatusCode::NOT_FOUND, format!("no pool named {name:?}")),
        },
    };
    let page = pools.clone();
    let supervisor = supervisor.clone();
    let built = build_page(&pools, move || {
        let value = supervisor
            .history()
            .series_json(&page, std::time::SystemTime::now());
        serde_json::to_vec(&value)
    })
    .await;
    match built {
        Some(Ok(mut body)) => {
            body.push(b'\n');
            full(StatusCode::OK, "application/json", body)
        }
        Some(Err(_)) | None => error(StatusCode::INTERNAL_SERVER_ERROR, "history encoding failed"),
    }
}

/// `GET /metrics`: the counters and the live gauges, as OpenMetrics text or the classic
/// Prometheus text format, as `accept` (the request's `Accept`) says (see
/// [`Format::negotiate`]).
pub(super) async fn metrics(supervisor: &Supervisor, accept: Option<&[u8]>) -> Response<Body> {
    let format = Format::negotiate(accept);
    let alerts = supervisor.alert_stats();
    let metrics = supervisor.metrics();
    let pools = supervisor.pools();
    let backends: usize = pools.iter().map(|pool| pool.backends.len()).sum();
    let small = backends <= INLINE_PAGE_BACKENDS
        && supervisor.open_connections() <= INLINE_SCRAPE_CONNECTIONS;
    let page = pools.clone();
    let rendered = build_page_of(small, move || {
        metrics.render(&page, alerts.as_deref(), format)
    })
    .await;
    match rendered {
        Some(Ok(text)) => {
            let mut response = full(StatusCode::OK, format.content_type(), text);
            response
                .headers_mut()
                .insert(header::VARY, header::HeaderValue::from_static("Accept"));
            response
        }
        Some(Err(_)) | None => error(StatusCode::INTERNAL_SERVER_ERROR, "metrics encoding failed"),
    }
}

/// `GET /events`: each health event as one SSE message (`event: <type>`, `data: <json>`), and
/// a comment every 15 s to keep proxies from closing the stream.
pub(super) fn events(supervisor: &Supervisor) -> Response<Body> {
    let mut rx = supervisor.subscribe();
    let mut shutdown = supervisor.shutdown_signal();
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
    let mut response = Response::new(BodyExt::boxed(StreamBody(body_rx)));
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

/// A streamed body (events, records): frames as its task sends them, ending when it stops.
pub(super) struct StreamBody(
    pub(super) tokio::sync::mpsc::Receiver<Result<Frame<Bytes>, Infallible>>,
);

impl hyper::body::Body for StreamBody {
    type Data = Bytes;
    type Error = Infallible;

    fn poll_frame(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Result<Frame<Bytes>, Infallible>>> {
        self.0.poll_recv(cx)
    }
}
