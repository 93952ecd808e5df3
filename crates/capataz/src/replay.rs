//! `capataz replay`: drives the health engine with the line protocol from a file or stdin.
//!
//! It streams: a result is written as soon as its line is read whenever no further input is
//! already buffered, so it can sit in an interactive pipe, and memory stays flat however long
//! the script is. [`pool_settings`] takes the engine's settings from a pool of a config file
//! (or the balancer's defaults) with `--set` changes, validated as the balancer would.

use std::io::{self, BufRead, Read, Write};

use capataz_health::{Replay, ReplayOptions, Settings};

use crate::config;
use crate::health::{engine_policy, engine_settings};

/// The config `--set` changes when no `--config` is given: one pool, every key its default.
const DEFAULTS: &str = "[[listeners]]\naddress = \"127.0.0.1:1\"\n\n[pools.replay]\nbackends = [{ address = \"127.0.0.1:1\" }]\n";

/// Why `capataz replay` cannot take a pool's settings: a message for the command line.
#[derive(Debug, thiserror::Error)]
pub enum SettingsError {
    /// The config (with the `--set` changes) is not valid.
    #[error(transparent)]
    Config(#[from] config::ConfigError),
    /// The config is not TOML (where it came from, and the parser's message).
    #[error("{origin}: {}", .error.message())]
    Toml {
        /// Where the text came from.
        origin: String,
        /// The parser's error.
        #[source]
        error: toml::de::Error,
    },
    /// The changed config cannot be written back (toml's error).
    #[error(transparent)]
    Write(#[from] toml::ser::Error),
    /// The config has no `[pools]` table (where it came from).
    #[error("{0} has no [pools] table")]
    NoPools(String),
    /// More than one pool and no `--pool`.
    #[error("{origin} has {count} pools; say which with --pool")]
    WhichPool {
        /// Where the text came from.
        origin: String,
        /// How many pools it has.
        count: usize,
    },
    /// No pool of that name.
    #[error("{origin} has no pool {name:?}")]
    NoPool {
        /// Where the text came from.
        origin: String,
        /// The name asked for.
        name: String,
    },
    /// A `--set` without `=`.
    #[error("--set {0:?}: expected KEY=VALUE")]
    NotKeyValue(String),
    /// A `--set` whose key is not dotted bare keys.
    #[error("--set {0:?}: the key must be dotted bare keys, e.g. passive.latency_outliers.factor")]
    BadKey(String),
    /// A `--set` through a key that is not a table.
    #[error("--set {set:?}: {part} is not a table")]
    NotATable {
        /// The `--set` as given.
        set: String,
        /// The part of its key that is not a table.
        part: String,
    },
}

/// The engine settings and replay options of pool `pool` (the only pool when `None`) of the
/// config `text` (read from `source`; the balancer's defaults when `None`), after each
/// `KEY=VALUE` of `sets` is written into the pool's table (`passive.latency_outliers.factor=5`:
/// the value is TOML, or a string when it is not). The result is validated exactly as the
/// balancer validates its config (no name is resolved, no file read). The error is a message
/// for the command line.
pub fn pool_settings(
    text: Option<(&str, &str)>,
    pool: Option<&str>,
    sets: &[String],
) -> Result<(Settings, ReplayOptions), SettingsError> {
    let (text, source) = text.unwrap_or((DEFAULTS, "the default settings"));
    let changed;
    let text = if sets.is_empty() {
        text
    } else {
        changed = apply_sets(text, source, pool, sets)?;
        changed.as_str()
    };
    let parsed = config::parse_unresolved(text, source)?;
    let pools = &parsed.config().pools;
    let found = match pool {
        Some(name) => pools.iter().find(|p| p.name == name),
        None if pools.len() == 1 => pools.first(),
        None => {
            return Err(SettingsError::WhichPool {
                origin: source.to_owned(),
                count: pools.len(),
            })
        }
    };
    let Some(found) = found else {
        return Err(SettingsError::NoPool {
            origin: source.to_owned(),
            name: pool.unwrap_or_default().to_owned(),
        });
    };
    let passive = &found.passive;
    let defaults = ReplayOptions::default();
    let options = ReplayOptions {
        latency_window: passive
            .latency_outliers
            .map_or(defaults.latency_window, |l| l.window),
        success_window: passive
            .success_rate
            .map_or(defaults.success_window, |r| r.window),
        load_shedding: engine_policy(found).load_shedding,
    };
    Ok((engine_settings(found), options))
}

/// `text` with each `KEY=VALUE` of `sets` written into pool `pool`'s table.
fn apply_sets(
    text: &str,
    source: &str,
    pool: Option<&str>,
    sets: &[String],
) -> Result<String, SettingsError> {
    let mut table: toml::Table = text.parse().map_err(|error| SettingsError::Toml {
        origin: source.to_owned(),
        error,
    })?;
    let pools = table
        .get_mut("pools")
        .and_then(toml::Value::as_table_mut)
        .ok_or_else(|| SettingsError::NoPools(source.to_owned()))?;
    let name = match pool {
        Some(name) => name.to_owned(),
        None if pools.len() == 1 => pools.keys().next().cloned().unwrap_or_default(),
        None => {
            return Err(SettingsError::WhichPool {
                origin: source.to_owned(),
                count: pools.len(),
            })
        }
    };
    let target = pools
        .get_mut(&name)
        .and_then(toml::Value::as_table_mut)
        .ok_or_else(|| SettingsError::NoPool {
            origin: source.to_owned(),
            name: name.clone(),
        })?;
    for set in sets {
        set_key(target, set)?;
    }
    Ok(toml::to_string(&table)?)
}

/// Writes one `KEY=VALUE` into `pool` (a dotted key, each part a bare key).
fn set_key(pool: &mut toml::Table, set: &str) -> Result<(), SettingsError> {
    let Some((key, value)) = set.split_once('=') else {
        return Err(SettingsError::NotKeyValue(set.to_owned()));
    };
    let parts: Vec<&str> = key.split('.').collect();
    let bare = |p: &&str| {
        !p.is_empty()
            && p.bytes()
                .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-')
    };
    if !parts.iter().all(bare) {
        return Err(SettingsError::BadKey(set.to_owned()));
    }
    let value = match format!("v = {value}").parse::<toml::Table>() {
        Ok(mut parsed) => parsed.remove("v").unwrap_or_else(|| value.into()),
        Err(_) => toml::Value::String(value.to_owned()),
    };
    let (last, path) = parts.split_last().expect("split gives one part at least");
    let mut table = pool;
    for part in path {
        let next = table
            .entry(part.to_string())
            .or_insert_with(|| toml::Value::Table(toml::Table::new()));
        table = next
            .as_table_mut()
            .ok_or_else(|| SettingsError::NotATable {
                set: set.to_owned(),
                part: part.to_string(),
            })?;
    }
    table.insert(last.to_string(), value);
    Ok(())
}

const BUFFER: usize = 256 * 1024;
/// The longest line read whole; a longer one prints `ERR`, changes nothing, and is skipped to
/// its end without being held in memory.
const MAX_LINE: usize = 64 * 1024;

/// Runs the protocol over `input`, writing results to `output` and, when `explain` is given,
/// each verdict change to it. Returns the number of verdict changes seen.
pub fn run(
    settings: Settings,
    input: impl io::Read,
    output: impl Write,
    explain: Option<&mut dyn Write>,
) -> io::Result<u64> {
    run_with(settings, ReplayOptions::default(), input, output, explain)
}

/// [`run`] with the detectors' windows and load shedding of `options`.
pub fn run_with(
    settings: Settings,
    options: ReplayOptions,
    input: impl io::Read,
    output: impl Write,
    mut explain: Option<&mut dyn Write>,
) -> io::Result<u64> {
    let mut input = io::BufReader::with_capacity(BUFFER, input);
    let mut output = output;
    let mut replay = Replay::with_options(settings, options);
    let mut line = Vec::with_capacity(256);
    let mut out = Vec::with_capacity(BUFFER + 4096);
    let mut notes = Vec::new();
    loop {
        // Flush before a read that may block, so results reach an interactive reader at once.
        if input.buffer().is_empty() {
            flush(&mut output, &mut out, &mut explain, &mut notes)?;
        }
        line.clear();
        if (&mut input)
            .take(MAX_LINE as u64 + 1)
            .read_until(b'\n', &mut line)?
            == 0
        {
            break;
        }
        if line.len() > MAX_LINE && line.last() != Some(&b'\n') {
            skip_line(&mut input)?;
            out.extend_from_slice(format!("ERR line longer than {MAX_LINE} bytes\n").as_bytes());
            continue;
        }
        let notes_sink = if explain.is_some() {
            Some(&mut notes)
        } else {
            None
        };
        replay.run_line(&line, &mut out, notes_sink);
        if out.len() >= BUFFER || notes.len() >= BUFFER {
            flush(&mut output, &mut out, &mut explain, &mut notes)?;
        }
    }
    flush(&mut output, &mut out, &mut explain, &mut notes)?;
    Ok(replay.transitions())
}

/// Skips the rest of an overlong line, to its line ending or the end of input.
fn skip_line(input: &mut impl BufRead) -> io::Result<()> {
    loop {
        let buffer = input.fill_buf()?;
        if buffer.is_empty() {
            return Ok(());
        }
        if let Some(end) = buffer.iter().position(|&b| b == b'\n') {
            input.consume(end + 1);
            return Ok(());
        }
        let len = buffer.len();
        input.consume(len);
    }
}

fn flush(
    output: &mut impl Write,
    out: &mut Vec<u8>,
    explain: &mut Option<&mut dyn Write>,
    notes: &mut Vec<u8>,
) -> io::Result<()> {
    if let Some(explain) = explain {
        if !notes.is_empty() {
            explain.write_all(notes)?;
            explain.flush()?;
            notes.clear();
        }
    }
    if !out.is_empty() {
        output.write_all(out)?;
        out.clear();
    }
    output.flush()
}
