//! A listener's own error pages (`[listeners.error_pages]`): the answers capataz writes itself
//! get the configured body and `Content-Type` in place of its plain-text ones. Only the body
//! and its type change: the status and every other header capataz sets (`Retry-After` on a 503
//! or 429, `Connection: close`, `Allow`) stay as they were. A backend's answer is never
//! touched: the proxy calls this only for an answer it wrote (`AnsweredBy::Capataz`).
//!
//! The pages are read when the config is loaded (stage three of the config) and held here as
//! shared `Bytes`: serving one is a reference count, no copy and no IO.

use bytes::Bytes;
use http::header::{self, HeaderValue};
use http::Response;

use crate::body::RespBody;
use crate::config::ErrorPages;

/// The pages of one listener, by status.
#[derive(Debug)]
pub(super) struct Pages {
    /// `(status, Content-Type, body)`, a handful at most.
    pages: Vec<(u16, HeaderValue, Bytes)>,
}

impl Pages {
    /// The pages of `config`; `None` when it has none (the request path then checks nothing).
    pub(super) fn new(config: Option<&ErrorPages>) -> Option<Pages> {
        let pages: Vec<_> = config?
            .pages
            .iter()
            .filter_map(|page| {
                // Validation checked the value; a page whose type is not a header value is
                // left out rather than sent broken.
                let content_type = HeaderValue::from_str(&page.content_type).ok()?;
                Some((page.status, content_type, Bytes::from(page.body.clone())))
            })
            .collect();
        (!pages.is_empty()).then_some(Pages { pages })
    }

    /// Gives `response`, one capataz wrote, the page of its status, if there is one.
    pub(super) fn dress(&self, response: &mut Response<RespBody>) {
        let status = response.status().as_u16();
        let Some((_, content_type, body)) = self.pages.iter().find(|(s, ..)| *s == status) else {
            return;
        };
        *response.body_mut() = RespBody::Full(Some(body.clone()));
        let headers = response.headers_mut();
        headers.insert(header::CONTENT_TYPE, content_type.clone());
        headers.remove(header::CONTENT_LENGTH);
    }
}

#[cfg(test)]
mod tests {
    use http::StatusCode;

    use super::*;
    use crate::config::ErrorPage;

    fn page(status: u16, body: &str) -> ErrorPage {
        ErrorPage {
            status,
            content_type: "text/html".into(),
            body: body.as_bytes().to_vec(),
            file: None,
        }
    }

    #[test]
    fn a_page_replaces_the_body_and_type_and_keeps_the_other_headers() {
        let config = ErrorPages {
            pages: vec![page(503, "<h1>down</h1>")],
        };
        let pages = Pages::new(Some(&config)).expect("one page");
        let mut response = Response::new(RespBody::text("503 Service Unavailable: ..."));
        *response.status_mut() = StatusCode::SERVICE_UNAVAILABLE;
        response
            .headers_mut()
            .insert(header::RETRY_AFTER, HeaderValue::from(5));
        pages.dress(&mut response);
        assert_eq!(response.status(), 503);
        assert_eq!(response.headers()[header::CONTENT_TYPE], "text/html");
        assert_eq!(response.headers()[header::RETRY_AFTER], "5");
        assert!(
            matches!(response.body(), RespBody::Full(Some(b)) if b == "<h1>down</h1>"),
            "the page's body"
        );
        let mut other = Response::new(RespBody::text("404 Not Found"));
        *other.status_mut() = StatusCode::NOT_FOUND;
        pages.dress(&mut other);
        assert!(matches!(other.body(), RespBody::Full(Some(b)) if b == "404 Not Found"));
    }

    #[test]
    fn no_pages_is_none() {
        assert!(Pages::new(None).is_none());
        assert!(Pages::new(Some(&ErrorPages::default())).is_none());
    }
}
