//! ACME Renewal Information (ARI, RFC 9773): when the directory has `renewalInfo`, the CA's
//! suggested renewal window for the certificate in force decides when it is renewed.
//!
//! [`Ari`] holds what the CA last said about that certificate and the renewal time chosen in
//! its window (uniformly at random, RFC 9773 section 4.2; at once when the window has already
//! started), kept while the CA answers the same window and chosen again when it answers
//! another. It is asked again after the answer's Retry-After, bounded to [`MIN_ASK_AGAIN`] ..
//! [`MAX_ASK_AGAIN`], or after [`FAILED_ASK_AGAIN`] when the query fails. A directory without
//! `renewalInfo` is not asked again for that certificate: the `renew_before` schedule applies.
//! The choice is pure ([`choose`], [`ask_again`]) so that it is tested on simulated time.

use std::time::Duration;

use instant_acme::{Account, CertificateIdentifier, RenewalInfo};
use rustls::pki_types::Der;

use crate::tls::acme::{AcmeSettings, Issued};

/// The least wait before asking again, whatever the CA's Retry-After says.
pub(super) const MIN_ASK_AGAIN: Duration = Duration::from_secs(60);
/// The longest wait before asking again, whatever the CA's Retry-After says.
pub(super) const MAX_ASK_AGAIN: Duration = Duration::from_secs(24 * 3600);
/// The wait before asking again after a query that failed.
pub(super) const FAILED_ASK_AGAIN: Duration = Duration::from_secs(3600);

/// What capataz knows from ARI about the certificate in force.
#[derive(Clone, Debug)]
pub(super) struct Ari {
    /// The certificate's identifier (`keyIdentifier.serial`, base64url), or `None` when it
    /// has none (no Authority Key Identifier): then ARI is never asked.
    pub(super) id: Option<CertificateIdentifier<'static>>,
    pub(super) state: State,
    /// Whether an order naming this certificate in `replaces` failed to be created: the next
    /// ones do not name it (a CA may refuse it, e.g. `alreadyReplaced`, or not reflect it in
    /// the order as RFC 9773 section 5 requires, which instant-acme takes for an error).
    pub(super) replaces_refused: bool,
}

/// Whether and what the CA answered.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(super) enum State {
    /// Not asked yet.
    Unknown,
    /// The directory has no `renewalInfo`, or the certificate no identifier.
    Unsupported,
    /// The CA's last window (Unix seconds, start and end), the renewal time chosen in it, and
    /// when to ask again.
    Window {
        start: i64,
        end: i64,
        renew_at: i64,
        ask_at: i64,
    },
    /// The directory has `renewalInfo` but the last query failed; ask again at `ask_at`.
    /// `previous` is the window answered before, still followed.
    Failed {
        ask_at: i64,
        previous: Option<(i64, i64, i64)>,
    },
}

impl Ari {
    /// Nothing known yet about `issued`.
    pub(super) fn new(issued: &Issued) -> Ari {
        let id = issued.slot.chain().first().and_then(|leaf| {
            let id = capataz_tls::ari::certificate_id(leaf.as_ref()).ok()??;
            Some(
                CertificateIdentifier::new(
                    Der::from(&id.key_identifier[..]),
                    Der::from(&id.serial[..]),
                )
                .into_owned(),
            )
        });
        let state = if id.is_some() {
            State::Unknown
        } else {
            State::Unsupported
        };
        Ari {
            id,
            state,
            replaces_refused: false,
        }
    }

    /// When the certificate is renewed by ARI (Unix seconds), if the CA answered a window.
    pub(super) fn renew_at(&self) -> Option<i64> {
        match self.state {
            State::Window { renew_at, .. } => Some(renew_at),
            State::Failed { previous, .. } => previous.map(|(_, _, at)| at),
            State::Unknown | State::Unsupported => None,
        }
    }

    /// When to ask the CA (Unix seconds), if it is to be asked.
    pub(super) fn ask_at(&self) -> Option<i64> {
        match self.state {
            State::Unknown => Some(i64::MIN),
            State::Window { ask_at, .. } | State::Failed { ask_at, .. } => Some(ask_at),
            State::Unsupported => None,
        }
    }

    /// What a renewal order names in `replaces`: this certificate, once the CA answered a window
    /// for it (a query that failed from the start proves no `renewalInfo`), unless such an order
    /// failed to be created.
    pub(super) fn replaces(&self) -> Option<CertificateIdentifier<'static>> {
        let offered = matches!(
            self.state,
            State::Window { .. }
                | State::Failed {
                    previous: Some(_),
                    ..
                }
        );
        self.id
            .clone()
            .filter(|_| offered && !self.replaces_refused)
    }

    /// The window last followed (start, end, renewal time).
    fn followed(&self) -> Option<(i64, i64, i64)> {
        match self.state {
            State::Window {
                start,
                end,
                renew_at,
                ..
            } => Some((start, end, renew_at)),
            State::Failed { previous, .. } => previous,
            State::Unknown | State::Unsupported => None,
        }
    }

    /// Records the CA's answer `answer` at `now` (Unix seconds), choosing with `unit`, a
    /// uniform random number in [0, 1).
    pub(super) fn answered(&mut self, answer: Answer, now: i64, unit: f64) {
        self.state = match answer {
            Answer::Unsupported => State::Unsupported,
            Answer::Failed => State::Failed {
                ask_at: now.saturating_add(secs(FAILED_ASK_AGAIN)),
                previous: self.followed(),
            },
            Answer::Window {
                start,
                end,
                retry_after,
            } => {
                let ask_at = now.saturating_add(secs(ask_again(retry_after)));
                if end < start {
                    State::Failed {
                        ask_at,
                        previous: self.followed(),
                    }
                } else {
                    let renew_at = match self.followed() {
                        Some((s, e, at)) if (s, e) == (start, end) => at,
                        _ => choose(start, end, now, unit),
                    };
                    State::Window {
                        start,
                        end,
                        renew_at,
                        ask_at,
                    }
                }
            }
        };
    }
}

/// What a query of `renewalInfo` gave.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Answer {
    /// The directory has no `renewalInfo`.
    Unsupported,
    /// The query failed (no answer, an error, a malformed body, no Retry-After).
    Failed,
    /// The suggested window (Unix seconds) and the answer's Retry-After.
    Window {
        start: i64,
        end: i64,
        retry_after: Duration,
    },
}

/// The renewal time in the window `start`..`end` at `now`: at once (`now`) if the window has
/// started, else `start` plus `unit` (uniform in [0, 1)) of the window's length.
pub(super) fn choose(start: i64, end: i64, now: i64, unit: f64) -> i64 {
    if now >= start {
        return now;
    }
    let length = end.saturating_sub(start);
    // The product is within 0..=length: the cast back cannot overflow.
    #[allow(clippy::cast_possible_truncation, clippy::cast_precision_loss)]
    let offset = (length as f64 * unit.clamp(0.0, 1.0)) as i64;
    start.saturating_add(offset.clamp(0, length))
}

/// The wait before asking again: the CA's Retry-After, at least a minute, at most a day.
pub(super) fn ask_again(retry_after: Duration) -> Duration {
    retry_after.clamp(MIN_ASK_AGAIN, MAX_ASK_AGAIN)
}

fn secs(duration: Duration) -> i64 {
    i64::try_from(duration.as_secs()).unwrap_or(i64::MAX)
}

/// Asks `account`'s directory about `id`: the answer, and the CA's explanation URL or why the
/// query failed (for the logs).
pub(super) async fn ask(
    account: &Account,
    id: &CertificateIdentifier<'static>,
) -> (Answer, Option<String>) {
    match account.renewal_info(id).await {
        Ok((info, retry_after)) => {
            let RenewalInfo {
                suggested_window,
                explanation_url,
                ..
            } = info;
            let answer = Answer::Window {
                start: suggested_window.start.unix_timestamp(),
                end: suggested_window.end.unix_timestamp(),
                retry_after,
            };
            (answer, explanation_url)
        }
        Err(instant_acme::Error::Unsupported(_)) => (Answer::Unsupported, None),
        Err(error) => (Answer::Failed, Some(error.to_string())),
    }
}

/// How long asking ARI may take, the account's directory included.
const ASK_TIMEOUT: Duration = Duration::from_secs(120);

/// Asks the CA about the certificate `ari` is for and records the answer, logging it.
pub(super) async fn refresh(listener: &str, settings: &AcmeSettings, ari: &mut Ari) {
    let Some(id) = ari.id.clone() else {
        ari.state = State::Unsupported;
        return;
    };
    let asked = async {
        match super::account(settings).await {
            Ok(account) => ask(&account, &id).await,
            Err(error) => (Answer::Failed, Some(error.to_string())),
        }
    };
    let (answer, note) = tokio::time::timeout(ASK_TIMEOUT, asked)
        .await
        .unwrap_or_else(|_| {
            (
                Answer::Failed,
                Some(format!("no answer within {ASK_TIMEOUT:?}")),
            )
        });
    let before = ari.state.clone();
    ari.answered(answer, super::unix_now(), fastrand::f64());
    let certificate = format!("{}.{}", id.authority_key_identifier, id.serial);
    match (&ari.state, answer) {
        (State::Unsupported, _) => tracing::debug!(
            listener,
            "the ACME directory has no renewalInfo: renewing on the renew_before schedule"
        ),
        (
            State::Window {
                start,
                end,
                renew_at,
                ask_at,
            },
            _,
        ) => {
            let changed = !matches!(before, State::Window { start: s, end: e, .. } if (s, e) == (*start, *end));
            let fields = (
                crate::timefmt::rfc3339(super::unix_to_system(*start)),
                crate::timefmt::rfc3339(super::unix_to_system(*end)),
                crate::timefmt::rfc3339(super::unix_to_system(*renew_at)),
                crate::timefmt::rfc3339(super::unix_to_system(*ask_at)),
            );
            if changed {
                tracing::info!(
                    listener,
                    certificate,
                    window_start = %fields.0,
                    window_end = %fields.1,
                    next_renewal = %fields.2,
                    ask_again = %fields.3,
                    explanation = note.as_deref().unwrap_or(""),
                    "ACME renewal window"
                );
            } else {
                tracing::debug!(listener, certificate, ask_again = %fields.3, "ACME renewal window unchanged");
            }
        }
        (State::Failed { ask_at, .. }, _) => tracing::warn!(
            listener,
            certificate,
            error = note.as_deref().unwrap_or("the window ends before it starts"),
            ask_again = %crate::timefmt::rfc3339(super::unix_to_system(*ask_at)),
            "ACME renewal information unavailable"
        ),
        (State::Unknown, _) => {}
    }
}

#[cfg(test)]
mod tests;
