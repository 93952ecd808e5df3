//! The answers capataz writes itself: its error pages and HTTP-01 key authorizations.

use http::header::{self, HeaderValue};
use std::time::Duration;

use http::{Response, StatusCode, Uri};

use crate::acme::Http01Answer;
use crate::balance::PoolHandle;
use crate::body::RespBody;
use crate::config::AllDownPolicy;
use crate::upstream::{self, AttemptError};

/// Why the last attempt of a request did not give the client an answer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Failure {
    /// The attempt failed.
    Attempt(AttemptError),
    /// The backend answered this retryable status (502-504) and the answer was not relayed.
    Status(u16),
    /// Every eligible backend was at its limit, and the pool's queue refused the request.
    Queue(Refusal),
}

/// Why the queue refused a request.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Refusal {
    /// The queue held `queue_size` requests already.
    Full { size: usize },
    /// The request waited `queue_timeout` without a slot.
    Timeout { timeout: Duration },
}

impl Refusal {
    /// The answer: 503, saying why, without `Retry-After` (as HAProxy's queue timeout and
    /// Envoy's overflow: a slot may free in milliseconds, not seconds).
    pub(super) fn page(self) -> Response<RespBody> {
        let text = match self {
            Refusal::Full { size } => format!(
                "every eligible backend is at its connection limit and the queue is full \
                 ({size} requests waiting)"
            ),
            Refusal::Timeout { timeout } => format!(
                "every eligible backend stayed at its connection limit for the queue timeout \
                 ({} ms)",
                timeout.as_millis()
            ),
        };
        error_page(StatusCode::SERVICE_UNAVAILABLE, &text)
    }
}

pub(super) fn error_page(status: StatusCode, text: &str) -> Response<RespBody> {
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

pub(super) fn failure_page(failure: Failure) -> Response<RespBody> {
    match failure {
        Failure::Queue(refusal) => refusal.page(),
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

pub(super) fn reject_page(pool: &PoolHandle, all_down: bool) -> Response<RespBody> {
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

/// The answer to an HTTP-01 validation request (RFC 8555, section 8.3): the key authorization
/// as `application/octet-stream`, or `405` with `Allow` for another method.
pub(super) fn http01_page(answer: Http01Answer) -> Response<RespBody> {
    match answer {
        Http01Answer::KeyAuthorization(key_authorization) => {
            let mut response = Response::new(RespBody::text(key_authorization));
            response.headers_mut().insert(
                header::CONTENT_TYPE,
                HeaderValue::from_static("application/octet-stream"),
            );
            response
        }
        Http01Answer::MethodNotAllowed => {
            let status = StatusCode::METHOD_NOT_ALLOWED;
            let mut page = error_page(status, "an ACME challenge answers GET and HEAD only");
            page.headers_mut()
                .insert(header::ALLOW, HeaderValue::from_static("GET, HEAD"));
            page
        }
    }
}

/// The `308` to the same host (without its port), on HTTPS port `port` (written unless 443),
/// with the same path and query; a request without a host gets `400`.
pub(super) fn https_redirect_page(host: Option<&str>, uri: &Uri, port: u16) -> Response<RespBody> {
    let Some(host) = host.filter(|h| !h.is_empty()) else {
        return error_page(
            StatusCode::BAD_REQUEST,
            "a redirect to HTTPS needs the request's host",
        );
    };
    let target = uri
        .path_and_query()
        .map(|p| p.as_str())
        .filter(|p| p.starts_with('/'))
        .unwrap_or("/");
    let location = if port == 443 {
        format!("https://{host}{target}")
    } else {
        format!("https://{host}:{port}{target}")
    };
    let Ok(value) = HeaderValue::from_str(&location) else {
        return error_page(StatusCode::BAD_REQUEST, "the request's host or path");
    };
    let status = StatusCode::PERMANENT_REDIRECT;
    let mut page = error_page(status, &location);
    page.headers_mut().insert(header::LOCATION, value);
    page
}
