//! Why a duration or an address to listen on, written as in the config, on the command line
//! or in the admin API, is not one. The text is the rest of the operator's message: the caller
//! adds where it was (file, line and key; the flag; the query).

/// Why a text is not a duration (`500ms`, `2s`, `1.5m`, `1h`).
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum DurationError {
    /// Not a number and a unit.
    #[error("{0:?} is not a duration (use e.g. \"500ms\", \"30s\", \"5m\")")]
    NotADuration(String),
    /// Above [`crate::MAX_DURATION`].
    #[error("{0:?} is above the maximum of 8760h (one year); use a shorter duration")]
    AboveMaximum(String),
}

/// A text that is not an address to listen on (`ip:port` or `localhost:port`).
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error(
    r#"{0:?} is not an address to listen on (use ip:port or localhost:port, e.g. "127.0.0.1:8080", "[::1]:8080" or "localhost:8080")"#
)]
pub struct ListenAddressError(pub String);
