//! `[listeners.tls]`'s `session_tickets` and `session_ticket_lifetime`: whether sessions
//! resume by tickets, and for how long a ticket is accepted.

use std::time::Duration;

use toml::{Spanned, Value};

use super::{ConfigError, Validator};
use capataz_tls::tickets::{DEFAULT_LIFETIME, MAX_LIFETIME, MIN_LIFETIME};

impl Validator<'_> {
    /// The lifetime of the listener's tickets at `at` (its `tls` table); `None` when
    /// `session_tickets = false`.
    pub(super) fn session_tickets(
        &self,
        at: &str,
        enabled: Option<Spanned<bool>>,
        lifetime: Option<Spanned<Value>>,
    ) -> Result<Option<Duration>, ConfigError> {
        let key = format!("{at}.session_ticket_lifetime");
        if let (Some(enabled), Some(lifetime)) = (&enabled, &lifetime) {
            if !enabled.get_ref() {
                return Err(self.error(
                    Some(lifetime.span()),
                    &key,
                    "session_tickets = false turns tickets off, so they have no lifetime (remove \
                     one of the two keys)"
                        .into(),
                ));
            }
        }
        if enabled.is_some_and(|e| !e.into_inner()) {
            return Ok(None);
        }
        let Some(written) = self.written_duration(&lifetime, &key)? else {
            return Ok(Some(DEFAULT_LIFETIME));
        };
        let span = lifetime.as_ref().map(Spanned::span);
        let text = match lifetime.as_ref().map(Spanned::get_ref) {
            Some(Value::String(text)) => text.clone(),
            _ => format!("{written:?}"),
        };
        if !(MIN_LIFETIME..=MAX_LIFETIME).contains(&written) {
            return Err(self.error(
                span,
                &key,
                format!(
                    "{text:?} is outside 1s to 168h (7 days, the longest TLS 1.3 allows a ticket; \
                     write a lifetime within them)"
                ),
            ));
        }
        if written.subsec_nanos() != 0 {
            return Err(self.error(
                span,
                &key,
                format!(
                    "{text:?} is not a whole number of seconds (clients are told a ticket's \
                     lifetime in seconds; write e.g. \"2s\" or \"300s\")"
                ),
            ));
        }
        Ok(Some(written))
    }
}
