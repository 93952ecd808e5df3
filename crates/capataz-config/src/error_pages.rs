//! A listener's own error pages (`[listeners.error_pages]`): the body and `Content-Type` of
//! the answers capataz writes itself, by status, in place of its plain-text ones.

use std::path::PathBuf;

/// The statuses capataz answers with itself, the ones a page may be given for: a malformed
/// request (400), no route (404), a client's body that stalled (408), a rate limit (429), a
/// head too large (431), a method or upgrade capataz does not relay (501), and a backend that
/// failed (502), none to send to (503) or one too slow (504).
pub const ERROR_PAGE_STATUSES: [u16; 9] = [400, 404, 408, 429, 431, 501, 502, 503, 504];

/// The largest page, inline or in a file: 64 KiB (a page is held in memory, per listener).
pub const MAX_ERROR_PAGE_BYTES: usize = 64 << 10;

/// The `Content-Type` of a page that does not name one.
pub const DEFAULT_ERROR_PAGE_TYPE: &str = "text/html; charset=utf-8";

/// A listener's error pages, by status (each status at most once).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ErrorPages {
    /// The pages, in status order.
    pub pages: Vec<ErrorPage>,
}

/// The page of one status.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ErrorPage {
    /// The status it is sent with (one of [`ERROR_PAGE_STATUSES`]).
    pub status: u16,
    /// Its `Content-Type` (default [`DEFAULT_ERROR_PAGE_TYPE`]), a valid header value.
    pub content_type: String,
    /// Its body: the inline `body`, or the file's bytes once the config is resolved (empty in
    /// an [`Unresolved`](crate::Unresolved) config).
    pub body: Vec<u8>,
    /// The file it was read from (`file`), if any, joined to the config file's directory.
    pub file: Option<PathBuf>,
}

impl ErrorPages {
    /// The page for `status`, if one was configured.
    pub fn page(&self, status: u16) -> Option<&ErrorPage> {
        self.pages.iter().find(|page| page.status == status)
    }
}
