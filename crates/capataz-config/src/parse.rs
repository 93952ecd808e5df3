//! Reading a TOML file into a [`Config`]: deserialize, then validate.
//!
//! Stage one (`raw`) deserializes into private `Raw*` structures that reject unknown keys and
//! keep the byte span of every value that still needs checking (`toml::Spanned`). Stage two
//! (`validate`) checks each value, fills in the defaults and builds the typed config. Before
//! both, `env` expands `${VAR}` in string values. Each problem found becomes a [`ConfigError`]
//! that names the file, the line, the dotted key and what to do about it; validation collects
//! every one it can ([`ConfigErrors`], through the `*_all_errors` functions), and the
//! single-error functions return the first.

mod env;
mod errors;
mod locate;
mod page_files;
mod place;
mod raw;
mod resolve;
mod secrets;
mod tls_files;
mod validate;
mod values;
mod wording;

pub use env::Environment;
pub use errors::ConfigErrors;
pub use locate::KeyLines;
pub use resolve::Unresolved;
pub(crate) use values::{listen_address, parse_duration, MAX_DURATION};

use std::path::Path;

use super::Config;
use locate::{key_at, line_of};
use raw::RawConfig;
use validate::Validator;

/// Why a configuration could not be loaded. The `Display` form is one line for the user, such as
/// `config.toml:14: pools.web.active.interval: "2x" is not a duration (use e.g. "500ms", "2s",
/// "1m")`.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    /// The file could not be read.
    #[error("{}: cannot read the configuration: {error} (check the path and its permissions)", one_line(.file))]
    Io {
        /// The path, as given.
        file: String,
        /// What the operating system said.
        #[source]
        error: std::io::Error,
    },
    /// The text is not valid TOML, or does not fit the layout (an unknown key, a wrong type).
    #[error("{}{}: {}{}", one_line(.file), line_part(*.line), key_part(.key), one_line(.message))]
    Parse {
        /// Where the text came from.
        file: String,
        /// The 1-based line, when the parser knew it.
        line: Option<usize>,
        /// The dotted key path around the problem, best effort; empty when unknown.
        key: String,
        /// What is wrong and what to do.
        message: String,
    },
    /// The text parsed but a value is invalid, or a required key is missing.
    #[error("{}{}: {}{}", one_line(.file), line_part(*.line), key_part(.key), one_line(.message))]
    Invalid {
        /// Where the text came from.
        file: String,
        /// The 1-based line of the value (or of its table), when there is one.
        line: Option<usize>,
        /// The dotted key path, e.g. `pools.web.active.interval` or `listeners[0].routes[1].pool`.
        key: String,
        /// What is wrong and what to do.
        message: String,
    },
}

impl ConfigError {
    /// The 1-based line the error points at, if any.
    pub fn line(&self) -> Option<usize> {
        match self {
            ConfigError::Io { .. } => None,
            ConfigError::Parse { line, .. } | ConfigError::Invalid { line, .. } => *line,
        }
    }

    /// The dotted key path the error is about; empty for IO errors and unplaced syntax errors.
    pub fn key(&self) -> &str {
        match self {
            ConfigError::Io { .. } => "",
            ConfigError::Parse { key, .. } | ConfigError::Invalid { key, .. } => key,
        }
    }
}

fn line_part(line: Option<usize>) -> String {
    line.map(|line| format!(":{line}")).unwrap_or_default()
}

fn key_part(key: &str) -> String {
    if key.is_empty() {
        String::new()
    } else {
        format!("{}: ", one_line(key))
    }
}

/// `text` with its control characters escaped (`\r`, `\u{1b}`), so that a message stays one
/// line and cannot drive a terminal: keys, names and values from the file reach it verbatim.
pub(crate) fn one_line(text: &str) -> std::borrow::Cow<'_, str> {
    if !text.contains(char::is_control) {
        return text.into();
    }
    let mut escaped = String::with_capacity(text.len() + 8);
    for c in text.chars() {
        if c.is_control() {
            escaped.extend(c.escape_default());
        } else {
            escaped.push(c);
        }
    }
    escaped.into()
}

/// Reads and validates the configuration file at `path`, and resolves its host names. This
/// blocks (file IO, DNS): call it before the runtime starts or on its blocking pool.
pub fn load(path: &Path) -> Result<Config, ConfigError> {
    load_all_errors(path).map_err(ConfigErrors::into_first)
}

/// [`load`], with every error found rather than the first: those of validation, or when it
/// passes, those of resolving names and reading files.
pub fn load_all_errors(path: &Path) -> Result<Config, ConfigErrors> {
    use std::io::Read as _;
    let file = path.display().to_string();
    let io = |error| ConfigError::Io {
        file: file.clone(),
        error,
    };
    // Read at most one byte past the limit: a path that points at an endless stream
    // (`/dev/zero`, a FIFO fed forever) must end in an error, not in all the memory there is.
    let mut text = String::new();
    std::fs::File::open(path)
        .map_err(io)?
        .take(MAX_CONFIG_BYTES + 1)
        .read_to_string(&mut text)
        .map_err(io)?;
    if text.len() as u64 > MAX_CONFIG_BYTES {
        return Err(ConfigErrors::from(ConfigError::Invalid {
            file: one_line(&file).into_owned(),
            line: None,
            key: String::new(),
            message: format!(
                "the file is larger than {} MiB, the most a configuration may be (is it the \
                 right file?)",
                MAX_CONFIG_BYTES >> 20
            ),
        }));
    }
    parse_all_errors(&text, &file, &Environment::process())?.resolve_all_errors()
}

/// The largest configuration file read: 64 MiB, hundreds of thousands of backends.
const MAX_CONFIG_BYTES: u64 = 64 << 20;

/// Parses and validates a configuration held in memory, and resolves its host names (which
/// blocks on DNS when there are names; see [`parse_unresolved`]); `source` names it in
/// messages and becomes [`Config::source`].
pub fn parse_str(text: &str, source: &str) -> Result<Config, ConfigError> {
    parse_unresolved(text, source)?.resolve()
}

/// Parses and validates a configuration, checking the syntax of host names without resolving
/// them: no IO, safe anywhere. [`Unresolved::resolve`] finishes the job.
pub fn parse_unresolved(text: &str, source: &str) -> Result<Unresolved, ConfigError> {
    parse_all_errors(text, source, &Environment::process()).map_err(ConfigErrors::into_first)
}

/// [`parse_unresolved`] with `${VAR}` looked up in `env`, and every error found rather than
/// the first.
pub fn parse_all_errors(
    text: &str,
    source: &str,
    env: &Environment,
) -> Result<Unresolved, ConfigErrors> {
    let text = &*env::substitute(text, source, env)
        .map_err(|errors| ConfigErrors::from_vec(errors).unwrap_or_else(no_error))?;
    let raw: RawConfig = toml::from_str(text).map_err(|error| toml_error(text, source, &error))?;
    let validator = Validator::new(source, text);
    let config = validator.config(raw);
    if let Some(errors) = ConfigErrors::from_vec(validator.errors.take()) {
        return Err(errors);
    }
    let Some(config) = config else {
        return Err(no_error());
    };
    Ok(Unresolved {
        config,
        lookups: validator.lookups.into_inner(),
        tls_loads: validator.tls_loads.into_inner(),
        secrets: validator.secrets.into_inner(),
        page_loads: validator.page_loads.into_inner(),
    })
}

/// Stands for an error list that came out empty where it cannot be: a bug, told as such
/// rather than a panic.
fn no_error() -> ConfigErrors {
    ConfigErrors::from(ConfigError::Invalid {
        file: String::new(),
        line: None,
        key: String::new(),
        message: "validation failed without saying why (a bug in capataz: please report it)".into(),
    })
}

/// The TOML parser's error, placed and in the operator's words. When the text is TOML, the
/// error is about a value's type or an unknown key, placed by the parsed document (which sees
/// into inline tables and lists); otherwise it is a syntax error, placed by the line scanner.
fn toml_error(text: &str, source: &str, error: &toml::de::Error) -> ConfigError {
    let offset = error.span().map(|span| span.start);
    let scanned = |offset: Option<usize>| {
        let line = offset.map(|offset| line_of(text, offset));
        (
            line,
            offset
                .map(|offset| key_at(text, offset))
                .unwrap_or_default(),
        )
    };
    let (line, key, message) = match place::Document::parse(text) {
        Some(document) => match offset.and_then(|offset| document.place(offset)) {
            Some(place) => {
                let message = wording::shape_message(error.message(), &place.found, &place.key);
                (Some(place.line), place.key, message)
            }
            // Not placed in the document: the scanner's best effort.
            None => {
                let (line, key) = scanned(offset);
                let message = wording::shape_message(error.message(), "this value", &key);
                (line, key, message)
            }
        },
        None => {
            let (line, key) = scanned(offset);
            (line, key, wording::syntax_message(error.message()))
        }
    };
    ConfigError::Parse {
        file: source.to_owned(),
        line,
        key,
        message,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Regression: a control character in the file reached the message verbatim, through the
    /// key read around a syntax error, the TOML parser's own message, or a validated key path,
    /// so a carriage return or a newline split the promised one-line message (found by the
    /// `config` fuzz target).
    #[test]
    fn a_control_character_in_the_file_split_the_one_line_error() {
        for (text, shown) in [
            ("[\"\r\"", "<t>:1: \\r: invalid basic string"),
            ("\"a\\rb\" = 1\n", "<t>:1: a\\rb: unknown key \"a\\rb\""),
            (
                "[[listeners]]\naddress = \"127.0.0.1:8080\"\n[pools.\"a\\nb\"]\n",
                "<t>:3: pools.a\\nb: \"a\\nb\" is not a pool name",
            ),
        ] {
            let message = parse_str(text, "<t>").unwrap_err().to_string();
            assert!(message.starts_with(shown), "{text:?} gave {message:?}");
            assert!(!message.contains(char::is_control), "{message:?}");
        }
    }

    /// Regression: a duration of `i64::MAX` seconds was accepted, and adding it to a clock
    /// reading panicked later (an ejection, a probe interval, a TTL).
    #[test]
    fn a_duration_of_i64_max_seconds_was_accepted_and_crashed_later() {
        let base = "[[listeners]]\naddress = \"127.0.0.1:8080\"\n\
                    [pools.web]\nbackends = [{ address = \"127.0.0.1:9001\" }]\n";
        for (key, line) in [
            ("[pools.web.active]\ninterval", "pools.web.active.interval"),
            (
                "[pools.web.passive]\nejection_time",
                "pools.web.passive.ejection_time",
            ),
            ("[server]\nshutdown_timeout", "server.shutdown_timeout"),
        ] {
            for value in ["9223372036854775807s", "18446744073709551615s", "8761h"] {
                let text = format!("{base}{key} = \"{value}\"\n");
                let message = parse_str(&text, "<t>").unwrap_err().to_string();
                let want = format!("<t>:6: {line}: \"{value}\" is above the maximum of 8760h");
                assert!(message.starts_with(&want), "{message}");
            }
        }
        let text = format!("{base}[server]\nshutdown_timeout = \"8760h\"\n");
        assert!(
            parse_str(&text, "<t>").is_ok(),
            "the maximum itself is fine"
        );
    }

    /// Regression: `tracing-subscriber` compiles field filter values as regexes, in time
    /// exponential in nesting: this level took seconds to load (24 dots took 518 s), on the
    /// runtime thread during `POST /reload`.
    #[test]
    fn a_log_level_with_a_field_filter_took_seconds_to_load() {
        let level = format!("[{{=M{}n}}]", ".".repeat(16));
        let text = format!(
            "[log]\nlevel = \"{level}\"\n[[listeners]]\naddress = \"127.0.0.1:8080\"\n\
             [pools.web]\nbackends = [{{ address = \"127.0.0.1:9001\" }}]\n"
        );
        let started = std::time::Instant::now();
        let message = parse_str(&text, "<t>").unwrap_err().to_string();
        assert!(
            message.starts_with("<t>:2: log.level: ") && message.contains("span or field filter"),
            "{message}"
        );
        assert!(started.elapsed() < std::time::Duration::from_secs(1));
    }

    /// A config of one listener and pool `web` with `n` backends, backend `i` written as
    /// `backend(i)` (an inline table), one per line from line 5.
    fn pool_of(n: usize, backend: impl Fn(usize) -> String) -> String {
        let mut text = String::from(
            "[[listeners]]\naddress = \"127.0.0.1:8080\"\n[pools.web]\nbackends = [\n",
        );
        for i in 0..n {
            text.push_str(&backend(i));
            text.push_str(",\n");
        }
        text.push_str("]\n");
        text
    }

    /// Regression: a pool's backend names were checked for duplicates by scanning every earlier
    /// backend, so a pool of 50,000 backends took half a minute of CPU to validate (on the
    /// blocking pool during a reload, holding every later reload back).
    #[test]
    fn a_pool_of_fifty_thousand_backends_validates_in_linear_time() {
        let pool = |n: usize| {
            pool_of(n, |i| {
                format!(
                    "{{ name = \"b{i}\", address = \"127.0.0.1:{}\" }}",
                    1 + i % 60_000
                )
            })
        };
        // Ten times the backends must cost about ten times the time, not a hundred (the
        // quadratic scan). A ratio, best of two, so a loaded machine does not fail it.
        let best = |text: &str| {
            (0..2)
                .map(|_| {
                    let started = std::time::Instant::now();
                    parse_unresolved(text, "<t>").expect("valid");
                    started.elapsed()
                })
                .min()
                .unwrap_or_default()
        };
        let small = best(&pool(5_000));
        let text = pool(50_000);
        let large = best(&text);
        assert!(
            large < small * 40,
            "5,000 backends: {small:?}; 50,000: {large:?}"
        );
        let config = parse_unresolved(&text, "<t>").expect("valid");
        drop(config);
        let duplicate = text.replace("name = \"b49999\"", "name = \"b7\"");
        let message = parse_unresolved(&duplicate, "<t>").unwrap_err().to_string();
        assert!(
            message.contains("\"b7\" is already the name of backends[7]"),
            "{message}"
        );
    }

    /// Each error's line is looked up by its key path in the parsed text: a lookup per
    /// segment, not a scan, so that 50,000 bad weights are placed in linear time (a scan of the
    /// list per error took minutes).
    #[test]
    fn fifty_thousand_errors_are_placed_in_linear_time() {
        let pool = |n: usize| {
            pool_of(n, |i| {
                format!(
                    "{{ address = \"127.0.0.1:{}\", weight = 0 }}",
                    1 + i % 60_000
                )
            })
        };
        let env = Environment::from_pairs::<&str, &str>([]);
        let best = |text: &str| {
            (0..2)
                .map(|_| {
                    let started = std::time::Instant::now();
                    let errors = parse_all_errors(text, "<t>", &env).expect_err("bad weights");
                    (started.elapsed(), errors)
                })
                .min_by_key(|(elapsed, _)| *elapsed)
                .expect("two runs")
        };
        let (small, _) = best(&pool(5_000));
        let text = pool(50_000);
        let (large, errors) = best(&text);
        assert!(
            large < small * 40,
            "5,000 errors: {small:?}; 50,000: {large:?}"
        );
        assert_eq!(errors.len(), 50_000);
        let last = errors.iter().last().expect("errors").to_string();
        assert!(
            last.starts_with("<t>:50004: pools.web.backends[49999].weight: 0 is out of range"),
            "{last}"
        );
    }

    /// Regression: the file was read whole, however large: `capataz check /dev/zero` (or a
    /// config path pointing at an endless stream) grew until memory ran out.
    #[cfg(unix)]
    #[test]
    fn an_endless_config_file_is_refused_past_the_size_limit() {
        let message = load(Path::new("/dev/zero")).unwrap_err().to_string();
        assert!(
            message.starts_with("/dev/zero: the file is larger than 64 MiB"),
            "{message}"
        );
    }

    proptest::proptest! {
        /// The public duration parser never panics and never returns more than the maximum.
        #[test]
        fn the_duration_parser_never_panics_and_enforces_the_maximum(
            text in "[0-9.]{0,30}(ms|s|m|h|x)?",
        ) {
            if let Ok(duration) = crate::parse_duration(&text) {
                proptest::prop_assert!(duration <= crate::MAX_DURATION);
            }
        }

        #[test]
        fn any_text_through_the_duration_parser_is_fine(text in "\\PC{0,40}") {
            if let Ok(duration) = crate::parse_duration(&text) {
                proptest::prop_assert!(duration <= crate::MAX_DURATION);
            }
        }
    }
}

#[cfg(test)]
mod explore {
    #[test]
    fn explore() {
        let base = "[[listeners]]\naddress = \"127.0.0.1:8080\"\n[pools.web]\n";
        for extra in [
            "backends = [{ address = \"127.0.0.1:9001\" }]\nactive = []",
            "backends = [{ address = \"127.0.0.1:9001\" }]\nactive = 5",
            "backends = [{ address = \"127.0.0.1:9001\" }]\nactive = [\"http\"]",
            "backends = []",
            "algorithm = \"round_robin\"\n\nbackends = []",
            "backends = [\n { address = \"127.0.0.1:9001\" },\n { address = \"127.0.0.1:9002\", weight = 1.5 },\n]",
            "backends = [\n { address = \"127.0.0.1:9001\" },\n { address = \"127.0.0.1:9002\", backup = \"yes\" },\n]",
            "backends = [\n { address = \"127.0.0.1:9001\" },\n { address = \"127.0.0.1:9002\", colour = \"red\" },\n]",
            "backends = [\n { address = \"127.0.0.1:9001\" },\n { address = \"127.0.0.1:9002\", wieght = 2 },\n]",
            "backends = 5",
            "backends = [5]",
            "backends = [{ address = \"127.0.0.1:9001\" }]\nalgorithm = 5",
            "backends = [{ address = \"127.0.0.1:9001\" }]\nalgorithm = \"round-robin\"",
            "backends = [{ address = \"127.0.0.1:9001\" }]\nalgorithm = {}",
            "backends = [{ address = \"127.0.0.1:9001\" }]\ntls = 5",
            "backends = [{ address = \"127.0.0.1:9001\" }]\ntls = { colour = 1 }",
            "backends = [{ address = \"127.0.0.1:9001\" }]\nactive.headers = 5",
            "backends = [{ address = \"127.0.0.1:9001\" }]\nactive.headers = { a = 5 }",
            "backends = [{ address = \"127.0.0.1:9001\" }]\nactive.rise = 99999999999999999999",
            "backends = [{ address = \"127.0.0.1:9001\" }]\nactive.rise = 2024-01-01",
            "backends = [{ address = \"127.0.0.1:9001\" }]\npassive.grpc_error_codes = [\"a\"]",
            "backends = [{ address = \"127.0.0.1:9001\" }]\n[pools.web.passive.success_rate]\ncolour = 1",
            "backends = [{ address = \"127.0.0.1:9001\" }]\n[pools.web.active]\ninitial = \"first_probe\"",
            "backends = [{ address = \"127.0.0.1:9001\" }]\n[[pools.web.x]]\na = 1",
            "backends = [{ address = \"127.0.0.1:9001\", agent_port = 99 }]",
        ] {
            let text = format!("{base}{extra}\n");
            match super::parse_all_errors(&text, "c.toml", &super::Environment::process()) {
                Ok(_) => eprintln!("{extra:?}\n  OK"),
                Err(e) => eprintln!("{extra:?}\n  {e}"),
            }
        }
        for text in [
            "listeners = 5",
            "listeners = [5]",
            "[[listeners]]\ntls = 5",
            "[[listeners]]\n[listeners.tls]\ncertificates = [{ cert = 5 }]",
            "pools = []",
            "[pools]\nweb = 5",
            "[log]\nformat = 5",
            "log = []",
            "[[alerts.commands]]\nqueue = \"x\"",
            "[fleet]\nendpoints = [1]",
            "[admin]\nallowed_hosts = \"x\"",
            "[logging]\nx=1",
        ] {
            match super::parse_unresolved(text, "c.toml") {
                Ok(_) => eprintln!("{text:?}\n  OK"),
                Err(e) => eprintln!("{text:?}\n  {e}"),
            }
        }
    }
}
