//! A request's way through the admin API: whether it may come in at all (the token, or the
//! checks against web pages in [`super::guard`]), and which endpoint its method and path name.
//! Path segments are split first and then percent-decoded, so a name may hold any character.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use http::{header, Method, Request, Response, StatusCode};
use hyper::body::Incoming;
use serde_json::json;

use super::{error, full, guard, json_response, not_allowed, overrides, pages, Body};
use crate::supervisor::Supervisor;

const DASHBOARD: &str = include_str!("dashboard.html");

/// How a request got in, if it did.
enum Access {
    /// It carries the configured token: no web page can have sent it.
    Token,
    /// No token was needed (none configured, or an open read): it must pass [`guard::check`].
    Open,
    /// A token is needed and missing or wrong.
    Denied,
}

fn access(supervisor: &Supervisor, req: &Request<Incoming>) -> Access {
    let config = supervisor.config();
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

/// How long `POST /reload` waits for its reload before it answers `202 Accepted`: less than
/// `capataz ctl`'s 30 s, so the tool hears an answer; bounded, so a reload stuck reading its
/// file does not hold an admin connection (of 256) for as long as it takes.
const RELOAD_WAIT: Duration = Duration::from_secs(20);

/// Answers `POST /reload`: 200 with what the reload did, 422 if it was refused, or 202 if it
/// is still under way after [`RELOAD_WAIT`] (it then applies whole when it ends, and its
/// outcome is logged).
async fn reload(supervisor: Arc<Supervisor>) -> Response<Body> {
    let mut reload = tokio::spawn(async move { supervisor.reload_from_file().await });
    let outcome = match tokio::time::timeout(RELOAD_WAIT, &mut reload).await {
        Ok(outcome) => outcome,
        Err(_) => {
            tokio::spawn(async move {
                if let Ok(Err(e)) = reload.await {
                    tracing::error!("reload refused, the running configuration stays: {e}");
                }
            });
            return json_response(
                StatusCode::ACCEPTED,
                &json!({
                    "reloaded": false,
                    "pending": true,
                    "message": "the reload is still under way (reading its file, or building the pools); it applies when it ends, and its outcome is logged",
                }),
            );
        }
    };
    match outcome {
        Ok(Ok(summary)) => json_response(
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
        Ok(Err(e)) => {
            tracing::error!("reload refused, the running configuration stays: {e}");
            error(
                StatusCode::UNPROCESSABLE_ENTITY,
                format!("reload refused, the running configuration stays: {e}"),
            )
        }
        Err(_) => error(
            StatusCode::INTERNAL_SERVER_ERROR,
            "the reload failed unexpectedly (a bug in capataz; please report it)",
        ),
    }
}

/// Answers one admin request: refused, or routed to its endpoint.
pub(super) async fn handle(
    supervisor: Arc<Supervisor>,
    local: SocketAddr,
    req: Request<Incoming>,
) -> Response<Body> {
    let access = access(&supervisor, &req);
    if let Access::Open = access {
        let config = supervisor.config();
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
        ["status"] if get => pages::status(&supervisor).await,
        ["status", pool, backend] if get => pages::backend_status(&supervisor, pool, backend),
        ["events"] if get => pages::events(&supervisor),
        ["record", pool] if get => super::record::record(&supervisor, pool),
        ["history", "events"] if get => pages::history_events(&supervisor),
        ["history", "series"] if get => pages::history_series(&supervisor, req.uri().query()).await,
        ["metrics"] if get => {
            let accept = req.headers().get(header::ACCEPT).map(|v| v.as_bytes());
            pages::metrics(&supervisor, accept).await
        }
        ["backends", pool, backend, action] if method == Method::POST => {
            overrides::override_backend(&supervisor, pool, backend, action, req.uri().query()).await
        }
        ["reload"] if method == Method::POST => reload(supervisor).await,
        [] | ["status"] | ["status", _, _] | ["events"] | ["record", _] | ["metrics"] | ["history", "events" | "series"] => {
            not_allowed("GET, HEAD", "use GET")
        }
        ["backends", _, _, _] | ["reload"] => not_allowed("POST", "use POST"),
        _ => error(
            StatusCode::NOT_FOUND,
            format!(
                "no such endpoint: {method} {path} (see GET /, /status, /status/<pool>/<backend>, \
                 /events, /record/<pool>, /history/events, /history/series, /metrics; POST /backends/<pool>/<backend>/<action>, /reload)"
            ),
        ),
    }
}

/// `text` with its `%XX` escapes decoded; `None` if an escape is malformed or the bytes are
/// not UTF-8.
pub(super) fn percent_decode(text: &str) -> Option<String> {
    // percent-encoding passes a malformed escape (`%zz`, a lone `%`) through as written: here
    // it is the client's error.
    let well_formed = text.split('%').skip(1).all(|after| {
        after
            .as_bytes()
            .get(..2)
            .is_some_and(|hex| hex.iter().all(u8::is_ascii_hexdigit))
    });
    if !well_formed {
        return None;
    }
    let decoded = percent_encoding::percent_decode_str(text)
        .decode_utf8()
        .ok()?;
    Some(decoded.into_owned())
}

#[cfg(test)]
mod tests {
    use super::percent_decode;

    #[test]
    fn escapes_are_decoded_and_a_malformed_one_is_refused() {
        assert_eq!(percent_decode("web").as_deref(), Some("web"));
        assert_eq!(percent_decode("web%202%2Fx").as_deref(), Some("web 2/x"));
        assert_eq!(percent_decode("w%C3%a9b").as_deref(), Some("w\u{e9}b"));
        assert_eq!(percent_decode("%25").as_deref(), Some("%"));
        for bad in ["%", "%4", "%zz", "a%%41", "%4g", "%FF", "%C3"] {
            assert_eq!(percent_decode(bad), None, "{bad:?}");
        }
    }
}
