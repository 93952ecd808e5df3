//! `[listeners.error_pages]`: a page per status for the answers capataz writes itself. An
//! inline `body` is checked here; a `file` is queued for stage three (`page_files`), which
//! reads it, so validation does no IO.

use std::collections::BTreeMap;

use toml::Spanned;

use super::super::page_files::PageLoad;
use super::super::raw::RawErrorPage;
use super::{ConfigError, Validator};
use crate::{
    ErrorPage, ErrorPages, DEFAULT_ERROR_PAGE_TYPE, ERROR_PAGE_STATUSES, MAX_ERROR_PAGE_BYTES,
};

impl Validator<'_> {
    /// Listener `listener`'s (at `at`) error pages. Each status is reported on its own; a
    /// listener with a bad one is refused.
    pub(super) fn error_pages(
        &self,
        at: &str,
        listener: usize,
        raw: BTreeMap<Spanned<String>, RawErrorPage>,
    ) -> Result<ErrorPages, ConfigError> {
        let before = self.error_count();
        let mut pages = Vec::with_capacity(raw.len());
        for (status, page) in raw {
            if let Some(page) = self.keep(self.error_page(at, listener, status, page)) {
                pages.push(page);
            }
        }
        pages.sort_by_key(|page| page.status);
        if self.error_count() > before {
            // Reported; the listener is refused with them.
            return Ok(ErrorPages::default());
        }
        Ok(ErrorPages { pages })
    }

    fn error_page(
        &self,
        at: &str,
        listener: usize,
        status: Spanned<String>,
        raw: RawErrorPage,
    ) -> Result<ErrorPage, ConfigError> {
        let key = format!("{at}.error_pages.{}", status.get_ref());
        let allowed = || {
            ERROR_PAGE_STATUSES
                .iter()
                .map(u16::to_string)
                .collect::<Vec<_>>()
                .join(", ")
        };
        let code = match status.get_ref().parse::<u16>() {
            Ok(code) if ERROR_PAGE_STATUSES.contains(&code) => code,
            _ => {
                return Err(self.error(
                    Some(status.span()),
                    &key,
                    format!(
                        "{:?} is not a status capataz answers with itself (use one of {}; a \
                         backend's answers are always relayed as they are)",
                        status.get_ref(),
                        allowed()
                    ),
                ))
            }
        };
        let content_type = match raw.content_type {
            None => DEFAULT_ERROR_PAGE_TYPE.to_owned(),
            Some(value) => {
                let text = value.get_ref();
                if text.is_empty() || http::HeaderValue::from_str(text).is_err() {
                    return Err(self.error(
                        Some(value.span()),
                        &format!("{key}.content_type"),
                        format!(
                            r#"{text:?} is not a Content-Type value (e.g. "text/html; charset=utf-8")"#
                        ),
                    ));
                }
                value.into_inner()
            }
        };
        match (raw.file, raw.body) {
            (Some(file), None) => {
                let path = self.config_path(&file, &format!("{key}.file"))?;
                self.page_loads.borrow_mut().push(PageLoad {
                    listener,
                    status: code,
                    path: path.clone(),
                    file: self.file.to_owned(),
                    line: Some(self.line_at(file.span().start)),
                    key: format!("{key}.file"),
                });
                Ok(ErrorPage {
                    status: code,
                    content_type,
                    body: Vec::new(),
                    file: Some(path),
                })
            }
            (None, Some(body)) => {
                if body.get_ref().len() > MAX_ERROR_PAGE_BYTES {
                    return Err(self.error(
                        Some(body.span()),
                        &format!("{key}.body"),
                        format!(
                            "the page is {} bytes, above the most a page may be ({} KiB; \
                             shorten it)",
                            body.get_ref().len(),
                            MAX_ERROR_PAGE_BYTES >> 10
                        ),
                    ));
                }
                Ok(ErrorPage {
                    status: code,
                    content_type,
                    body: body.into_inner().into_bytes(),
                    file: None,
                })
            }
            (Some(file), Some(_)) => Err(self.error(
                Some(file.span()),
                &format!("{key}.file"),
                "body is set too (keep one of file and body)".into(),
            )),
            (None, None) => Err(self.error(
                Some(status.span()),
                &key,
                r#"a page needs a file or a body (e.g. { file = "/etc/capataz/503.html" })"#.into(),
            )),
        }
    }
}
