//! Health events in the log: one readable sentence per event in text mode, the same sentence
//! plus structured fields (pool, backend, from, to, side, reason, ...) in JSON mode.
//!
//! Text logs carry only the sentence, because the sentence already names everything and a
//! trail of `key=value` pairs after it would say it all twice.

use std::io::IsTerminal as _;
use std::sync::atomic::{AtomicBool, Ordering};

use tracing::Level;

use crate::config::LogFormat;

static JSON: AtomicBool = AtomicBool::new(false);

/// Installs the global subscriber: `format` on standard error, filtered by `level` (a `tracing`
/// directive such as `info`; `RUST_LOG` overrides it). Calling it twice keeps the first.
pub fn init(format: LogFormat, level: &str) {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(level));
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_target(false)
        .with_ansi(std::io::stderr().is_terminal())
        .with_writer(std::io::stderr);
    let installed = match format {
        LogFormat::Text => builder.try_init().is_ok(),
        LogFormat::Json => builder.json().flatten_event(true).try_init().is_ok(),
    };
    if installed {
        JSON.store(format == LogFormat::Json, Ordering::Relaxed);
    }
}

/// The structured fields of a health event; absent ones are left out of the JSON.
#[derive(Clone, Copy, Debug, Default)]
pub struct Fields<'a> {
    /// What happened: `transition`, `all_down`, `recovered`, `active_change`, ...
    pub event: &'a str,
    /// The pool.
    pub pool: Option<&'a str>,
    /// The backend.
    pub backend: Option<&'a str>,
    /// The verdict before.
    pub from: Option<&'a str>,
    /// The verdict after.
    pub to: Option<&'a str>,
    /// `active` or `passive`.
    pub side: Option<&'a str>,
    /// The reason, as a sentence.
    pub reason: Option<&'a str>,
    /// The all-down policy.
    pub policy: Option<&'a str>,
}

macro_rules! emit_at {
    ($level:expr, $json:expr, $f:expr, $sentence:expr) => {
        if $json {
            tracing::event!(
                $level,
                event = $f.event,
                pool = $f.pool,
                backend = $f.backend,
                from = $f.from,
                to = $f.to,
                side = $f.side,
                reason = $f.reason,
                policy = $f.policy,
                "{}",
                $sentence
            )
        } else {
            tracing::event!($level, "{}", $sentence)
        }
    };
}

/// Logs one event: `sentence` as the message, and in JSON mode also `fields`.
pub(crate) fn emit(level: Level, sentence: &str, fields: Fields<'_>) {
    let json = JSON.load(Ordering::Relaxed);
    match level {
        Level::ERROR => emit_at!(Level::ERROR, json, fields, sentence),
        Level::WARN => emit_at!(Level::WARN, json, fields, sentence),
        Level::INFO => emit_at!(Level::INFO, json, fields, sentence),
        Level::DEBUG => emit_at!(Level::DEBUG, json, fields, sentence),
        Level::TRACE => emit_at!(Level::TRACE, json, fields, sentence),
    }
}
