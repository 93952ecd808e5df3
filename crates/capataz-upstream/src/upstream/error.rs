//! Why one proxied attempt failed, classified once, where it happened.
//!
//! Every failure of an attempt is one [`AttemptError`]: the phase it happened in (connect, send
//! the request, wait for the head, stream the body) and, from that, whose fault it was
//! ([`Fault`]: the client, the backend, or capataz itself), what the passive health checks
//! hear of it ([`AttemptError::outcome`]: nothing unless it was the backend's fault), whether
//! the request may go to another backend ([`AttemptError::retry_safe`]) and what the client is
//! answered ([`AttemptError::status`]). The request path never decides any of this on its own.
//!
//! Invariants:
//! - only a [`Fault::Backend`] error yields an outcome, so a hostile or broken client can never
//!   get a healthy backend ejected;
//! - a connection on which an attempt failed is never used again (the caller drops it).

use std::fmt;
use std::io;

use capataz_health::Outcome;
use http::StatusCode;

/// Whose fault a failed attempt was.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Fault {
    /// The client's: its body stalled, was malformed, or it went away.
    Client,
    /// The backend's: it refused, timed out, reset, or answered something that is not HTTP.
    Backend,
    /// capataz's own: it could not open a socket (out of descriptors, no local port).
    Capataz,
}

/// Where in an attempt a failure happened.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AttemptPhase {
    /// Connecting to the backend (its TLS handshake included).
    Connect,
    /// Sending the request to the backend (the client's body included).
    Send,
    /// Waiting for the response head.
    Head,
    /// Relaying the response body.
    Body,
}

/// How one attempt on one backend failed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AttemptError {
    /// The backend refused the connection (or reset it during the handshake).
    ConnectRefused,
    /// The connection was not established within `timeouts.connect`.
    ConnectTimeout,
    /// No socket could be opened here (descriptors or local ports exhausted).
    ConnectLocal,
    /// The TLS handshake failed (within `timeouts.connect`, before any byte of the request):
    /// a certificate not trusted or not for the backend's name, a protocol refused, or the
    /// connection closed during the handshake.
    TlsHandshake,
    /// Writing the request to the backend failed; `sent_any`: whether any byte had gone out.
    Send {
        /// Whether any byte of the request reached the socket.
        sent_any: bool,
    },
    /// The backend stopped reading the request: a write waited longer than
    /// `timeouts.body_idle`.
    BackendNotReading,
    /// No response head within `timeouts.response_header` of the request's end.
    HeadTimeout,
    /// The backend closed or reset the connection before a complete response head.
    HeadClosed,
    /// The response head is not HTTP/1.x (or its framing cannot be trusted).
    HeadMalformed,
    /// A `101 Switching Protocols` to a request that asked for no upgrade.
    UnexpectedUpgrade,
    /// The client sent nothing of its body for `request_body_timeout`.
    ClientBodyStalled,
    /// The client's body is not valid HTTP/1.1 framing (a bad chunk, say).
    ClientBodyMalformed,
    /// The client closed or reset its connection before its body ended.
    ClientGone,
    /// The backend's response body broke off (a close, a reset, bad chunks) before its end.
    BodyBroken,
    /// An HTTP/2 backend refused the stream unprocessed (`REFUSED_STREAM`, or a GOAWAY whose
    /// last stream is below it): RFC 9113 section 8.7 guarantees it did nothing with it.
    StreamRefused,
    /// An HTTP/2 backend closed its connection gracefully (GOAWAY with `NO_ERROR`, as nginx
    /// does after `keepalive_requests`) before taking the stream, or the connection closed
    /// before the request was handed to it: unprocessed, as [`AttemptError::StreamRefused`],
    /// and no fault of the backend's, so never charged to it.
    GoneAway,
    /// The backend sent nothing of its response body for `timeouts.body_idle`.
    BodyStalled,
}

impl AttemptError {
    /// Whose fault it was.
    pub fn fault(self) -> Fault {
        match self {
            AttemptError::ClientBodyStalled
            | AttemptError::ClientBodyMalformed
            | AttemptError::ClientGone => Fault::Client,
            AttemptError::ConnectLocal => Fault::Capataz,
            _ => Fault::Backend,
        }
    }

    /// In which phase of the attempt it happened.
    pub fn phase(self) -> AttemptPhase {
        match self {
            AttemptError::ConnectRefused
            | AttemptError::ConnectTimeout
            | AttemptError::ConnectLocal
            | AttemptError::TlsHandshake => AttemptPhase::Connect,
            AttemptError::Send { .. }
            | AttemptError::BackendNotReading
            | AttemptError::ClientBodyStalled
            | AttemptError::ClientBodyMalformed
            | AttemptError::ClientGone => AttemptPhase::Send,
            AttemptError::HeadTimeout
            | AttemptError::HeadClosed
            | AttemptError::HeadMalformed
            | AttemptError::UnexpectedUpgrade
            | AttemptError::StreamRefused
            | AttemptError::GoneAway => AttemptPhase::Head,
            AttemptError::BodyBroken | AttemptError::BodyStalled => AttemptPhase::Body,
        }
    }

    /// What the passive checks hear: `None` unless the backend is at fault.
    pub fn outcome(self) -> Option<Outcome> {
        Some(match self {
            AttemptError::ConnectRefused | AttemptError::StreamRefused => Outcome::Refused,
            AttemptError::ConnectTimeout
            | AttemptError::BackendNotReading
            | AttemptError::HeadTimeout
            | AttemptError::BodyStalled => Outcome::Timeout,
            AttemptError::Send { .. } | AttemptError::HeadClosed | AttemptError::BodyBroken => {
                Outcome::Reset
            }
            AttemptError::HeadMalformed | AttemptError::UnexpectedUpgrade => Outcome::Malformed,
            AttemptError::TlsHandshake => Outcome::Tls,
            AttemptError::ConnectLocal
            | AttemptError::GoneAway
            | AttemptError::ClientBodyStalled
            | AttemptError::ClientBodyMalformed
            | AttemptError::ClientGone => return None,
        })
    }

    /// Whether nothing of the request reached the backend (it can go elsewhere as it is).
    pub fn nothing_sent(self) -> bool {
        matches!(
            self,
            AttemptError::ConnectRefused
                | AttemptError::ConnectTimeout
                | AttemptError::ConnectLocal
                | AttemptError::TlsHandshake
                | AttemptError::StreamRefused
                | AttemptError::GoneAway
                | AttemptError::Send { sent_any: false }
        )
    }

    /// Whether the request may be sent to another backend: always when nothing was sent; never
    /// for the client's fault or once the response head has been relayed; otherwise only a
    /// `replayable` request (bodiless and idempotent, no upgrade).
    pub fn retry_safe(self, replayable: bool) -> bool {
        if self.nothing_sent() {
            return true;
        }
        match self {
            AttemptError::ClientBodyStalled
            | AttemptError::ClientBodyMalformed
            | AttemptError::ClientGone
            | AttemptError::BodyBroken
            | AttemptError::BodyStalled => false,
            _ => replayable,
        }
    }

    /// The status the client gets when no other attempt is made. (A client that went away
    /// gets nothing; 400 is what it would have got.)
    pub fn status(self) -> StatusCode {
        match self {
            AttemptError::ConnectTimeout
            | AttemptError::BackendNotReading
            | AttemptError::HeadTimeout
            | AttemptError::BodyStalled => StatusCode::GATEWAY_TIMEOUT,
            AttemptError::ClientBodyStalled => StatusCode::REQUEST_TIMEOUT,
            AttemptError::ClientBodyMalformed | AttemptError::ClientGone => StatusCode::BAD_REQUEST,
            _ => StatusCode::BAD_GATEWAY,
        }
    }

    /// The failure of a connect that returned `error`.
    pub(crate) fn of_connect(error: &io::Error) -> AttemptError {
        match error.kind() {
            io::ErrorKind::TimedOut => AttemptError::ConnectTimeout,
            io::ErrorKind::AddrNotAvailable | io::ErrorKind::OutOfMemory => {
                AttemptError::ConnectLocal
            }
            // EMFILE and ENFILE: no descriptor left in this process or system.
            _ if matches!(error.raw_os_error(), Some(23 | 24)) => AttemptError::ConnectLocal,
            _ => AttemptError::ConnectRefused,
        }
    }

    /// The failure of reading the client's body with `error` (hyper's): a framing error is
    /// malformed, anything else (an early end, a reset) means the client went away.
    pub(crate) fn of_client_body(error: &hyper::Error) -> AttemptError {
        let mut source = std::error::Error::source(error);
        while let Some(cause) = source {
            if let Some(io) = cause.downcast_ref::<io::Error>() {
                if matches!(
                    io.kind(),
                    io::ErrorKind::InvalidInput | io::ErrorKind::InvalidData
                ) {
                    return AttemptError::ClientBodyMalformed;
                }
                break;
            }
            source = cause.source();
        }
        AttemptError::ClientGone
    }
}

impl fmt::Display for AttemptError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            AttemptError::ConnectRefused => "the backend refused the connection",
            AttemptError::ConnectTimeout => "connecting to the backend timed out",
            AttemptError::ConnectLocal => "no local socket available to reach the backend",
            AttemptError::TlsHandshake => "the TLS handshake with the backend failed",
            AttemptError::Send { .. } => "the backend's connection failed while sending",
            AttemptError::BackendNotReading => "the backend stopped reading the request",
            AttemptError::HeadTimeout => "the backend did not answer in time",
            AttemptError::HeadClosed => "the backend closed the connection without an answer",
            AttemptError::HeadMalformed => "the backend's answer is not valid HTTP",
            AttemptError::UnexpectedUpgrade => "the backend switched protocols unasked",
            AttemptError::ClientBodyStalled => "the request body stalled",
            AttemptError::ClientBodyMalformed => "the request body is malformed",
            AttemptError::ClientGone => "the client went away during its request body",
            AttemptError::BodyBroken => "the backend's response body broke off",
            AttemptError::StreamRefused => "the backend refused the HTTP/2 stream unprocessed",
            AttemptError::GoneAway => "the backend closed its HTTP/2 connection before the stream",
            AttemptError::BodyStalled => "the backend's response body stalled",
        })
    }
}

impl std::error::Error for AttemptError {}

#[cfg(test)]
mod tests {
    use super::*;

    const ALL: [AttemptError; 18] = [
        AttemptError::ConnectRefused,
        AttemptError::StreamRefused,
        AttemptError::GoneAway,
        AttemptError::TlsHandshake,
        AttemptError::ConnectTimeout,
        AttemptError::ConnectLocal,
        AttemptError::Send { sent_any: false },
        AttemptError::Send { sent_any: true },
        AttemptError::BackendNotReading,
        AttemptError::HeadTimeout,
        AttemptError::HeadClosed,
        AttemptError::HeadMalformed,
        AttemptError::UnexpectedUpgrade,
        AttemptError::ClientBodyStalled,
        AttemptError::ClientBodyMalformed,
        AttemptError::ClientGone,
        AttemptError::BodyBroken,
        AttemptError::BodyStalled,
    ];

    #[test]
    fn only_the_backends_faults_reach_the_health_checks() {
        for error in ALL {
            // A graceful GOAWAY is the backend's doing (it ends the request, in the access
            // log) but no fault: never charged.
            let charged = error.fault() == Fault::Backend && error != AttemptError::GoneAway;
            assert_eq!(error.outcome().is_some(), charged, "{error:?}");
        }
        assert_eq!(AttemptError::GoneAway.outcome(), None);
        assert!(AttemptError::GoneAway.nothing_sent());
    }

    #[test]
    fn a_clients_fault_is_never_retried_and_gets_a_4xx() {
        for error in ALL.into_iter().filter(|e| e.fault() == Fault::Client) {
            assert!(!error.retry_safe(true), "{error:?}");
            assert!(error.status().is_client_error(), "{error:?}");
        }
        assert_eq!(
            AttemptError::ClientBodyStalled.status(),
            StatusCode::REQUEST_TIMEOUT
        );
        assert_eq!(
            AttemptError::ClientBodyMalformed.status(),
            StatusCode::BAD_REQUEST
        );
    }

    #[test]
    fn only_a_failure_before_anything_was_sent_is_in_the_connect_phase() {
        for error in ALL {
            let connect = error.phase() == AttemptPhase::Connect;
            // A refused stream is known unprocessed, but it fails waiting for the head.
            let unsent = error.nothing_sent()
                && !matches!(
                    error,
                    AttemptError::StreamRefused
                        | AttemptError::GoneAway
                        | AttemptError::Send { .. }
                );
            assert_eq!(connect, unsent, "{error:?}");
        }
        assert_eq!(AttemptError::BodyBroken.phase(), AttemptPhase::Body);
        assert_eq!(AttemptError::ClientGone.phase(), AttemptPhase::Send);
    }

    #[test]
    fn what_is_retried() {
        for error in ALL {
            let expected_any = error.nothing_sent();
            assert_eq!(error.retry_safe(false), expected_any, "{error:?}");
        }
        assert!(AttemptError::HeadTimeout.retry_safe(true));
        assert!(AttemptError::Send { sent_any: true }.retry_safe(true));
        assert!(!AttemptError::BodyBroken.retry_safe(true));
        assert!(!AttemptError::BodyStalled.retry_safe(true));
    }

    #[test]
    fn statuses_and_outcomes() {
        assert_eq!(
            AttemptError::HeadTimeout.status(),
            StatusCode::GATEWAY_TIMEOUT
        );
        assert_eq!(AttemptError::HeadTimeout.outcome(), Some(Outcome::Timeout));
        assert_eq!(
            AttemptError::UnexpectedUpgrade.status(),
            StatusCode::BAD_GATEWAY
        );
        assert_eq!(
            AttemptError::UnexpectedUpgrade.outcome(),
            Some(Outcome::Malformed)
        );
        assert_eq!(AttemptError::ConnectLocal.outcome(), None);
        let refused = io::Error::from(io::ErrorKind::ConnectionRefused);
        assert_eq!(
            AttemptError::of_connect(&refused),
            AttemptError::ConnectRefused
        );
        let emfile = io::Error::from_raw_os_error(24);
        assert_eq!(
            AttemptError::of_connect(&emfile),
            AttemptError::ConnectLocal
        );
    }
}
