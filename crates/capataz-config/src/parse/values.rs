//! The value syntaxes of the config that TOML does not have: durations, percentages, log
//! levels and webhook URLs.

use std::time::Duration;

/// The longest duration the config and the admin API accept: one year (8760 h). Longer values
/// would mean "never" in practice, and adding them to a clock reading can overflow it.
pub(crate) const MAX_DURATION: Duration = Duration::from_secs(365 * 24 * 3600);

/// Parses `500ms`, `2s`, `1.5s`, `1m`, `1h`: digits, an optional fraction, then a unit.
/// Returns `None` for anything else, including an overflow; zero is returned as such.
pub(crate) fn parse_duration(text: &str) -> Option<Duration> {
    const NANOS_PER_SEC: u128 = 1_000_000_000;
    let number_end = text
        .find(|c: char| !c.is_ascii_digit() && c != '.')
        .unwrap_or(text.len());
    let (number, unit) = text.split_at(number_end);
    let unit_nanos: u128 = match unit {
        "ms" => 1_000_000,
        "s" => NANOS_PER_SEC,
        "m" => 60 * NANOS_PER_SEC,
        "h" => 3600 * NANOS_PER_SEC,
        _ => return None,
    };
    let (whole, fraction) = number.split_once('.').unwrap_or((number, ""));
    if whole.is_empty()
        || (number.contains('.') && fraction.is_empty())
        || fraction.len() > 9
        || fraction.contains('.')
    {
        return None;
    }
    let whole: u128 = whole.parse().ok()?;
    let mut nanos = whole.checked_mul(unit_nanos)?;
    if !fraction.is_empty() {
        let digits: u128 = fraction.parse().ok()?;
        let scale = 10u128.pow(fraction.len() as u32);
        nanos = nanos.checked_add(digits * unit_nanos / scale)?;
    }
    let secs = u64::try_from(nanos / NANOS_PER_SEC).ok()?;
    // The remainder is below one second, so it fits in u32.
    Some(Duration::new(secs, (nanos % NANOS_PER_SEC) as u32))
}

/// The longest `log.level` accepted, in bytes.
pub(super) const MAX_LOG_LEVEL_BYTES: usize = 1024;

/// Checks a `log.level` filter: comma-separated directives, each `LEVEL`, `TARGET` or
/// `TARGET=LEVEL`, where a target is a module path (letters, digits, `_`, `-`, `::`) and a level
/// is `off`, `error`, `warn`, `info`, `debug` or `trace`. Span and field filters (`[span{..}]`)
/// are refused: `tracing-subscriber` compiles their values as regexes, and a crafted one takes
/// exponential time to parse. A text with no directive at all (empty, blanks, commas) is
/// refused too: it would silence every log line. The error is the rest of a sentence about the
/// text.
pub(super) fn check_log_level(text: &str) -> Result<(), LogLevelError> {
    if text.len() > MAX_LOG_LEVEL_BYTES {
        return Err(LogLevelError::TooLong(text.len()));
    }
    let is_level = |word: &str| {
        ["off", "error", "warn", "info", "debug", "trace"]
            .iter()
            .any(|level| word.eq_ignore_ascii_case(level))
    };
    let is_target = |word: &str| {
        !word.is_empty()
            && word
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-' || b == b':')
    };
    if text.split(',').all(|directive| directive.trim().is_empty()) {
        return Err(LogLevelError::NoDirective);
    }
    for directive in text.split(',').map(str::trim) {
        if directive.contains(['[', ']', '{', '}']) {
            return Err(LogLevelError::SpanOrField(directive.to_owned()));
        }
        let ok = match directive.split_once('=') {
            None => directive.is_empty() || is_level(directive) || is_target(directive),
            Some((target, level)) => is_target(target) && is_level(level),
        };
        if !ok {
            return Err(LogLevelError::NotADirective(directive.to_owned()));
        }
    }
    Ok(())
}

/// Why a `log.level` filter is refused: the rest of a sentence about the text.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub(super) enum LogLevelError {
    /// Longer than [`MAX_LOG_LEVEL_BYTES`] (its length).
    #[error("is {0} bytes long, more than the {MAX_LOG_LEVEL_BYTES} allowed")]
    TooLong(usize),
    #[error("has no directive, which would silence every log line (write \"off\" to mean that)")]
    NoDirective,
    #[error(
        "has a span or field filter ({0:?}), which log.level does not accept (filter by target \
         and level only; RUST_LOG can still set such filters)"
    )]
    SpanOrField(String),
    #[error(
        "has {0:?}, which is neither a level (off, error, warn, info, debug, trace) nor \
         TARGET=LEVEL"
    )]
    NotADirective(String),
}

/// Parses `10%` or `2.5%` into a fraction (0.1, 0.025).
pub(super) fn parse_percent(text: &str) -> Option<f64> {
    let number = text.trim().strip_suffix('%')?.trim_end();
    let well_formed = !number.is_empty()
        && number.bytes().all(|b| b.is_ascii_digit() || b == b'.')
        && number.bytes().filter(|&b| b == b'.').count() <= 1
        && !number.starts_with('.')
        && !number.ends_with('.');
    if !well_formed {
        return None;
    }
    number.parse::<f64>().ok().map(|n| n / 100.0)
}

/// A plain-HTTP URL taken apart: `http://authority/path?query`.
#[derive(Debug, PartialEq, Eq)]
pub(super) struct HttpUrl<'a> {
    /// The authority as written (`host`, `host:port`, `[v6]:port`): the Host header.
    pub(super) authority: &'a str,
    /// The host and port with the default port 80 filled in, ready to resolve.
    pub(super) host_port: String,
    /// The path and query, `/` when the URL has no path; a fragment is dropped (it is never
    /// sent).
    pub(super) path: String,
}

/// Takes apart an `http://` URL. The error is the rest of a sentence about the URL, saying what
/// is wrong and what to do, e.g. `uses https, which ...`.
pub(super) fn parse_http_url(text: &str) -> Result<HttpUrl<'_>, &'static str> {
    if text.chars().any(|c| c.is_whitespace() || c.is_control()) {
        return Err("contains a space or control character (percent-encode it, e.g. %20)");
    }
    let Some((scheme, rest)) = text.split_once("://") else {
        return Err(r#"is not an http:// URL (use e.g. "http://127.0.0.1:9000/hook")"#);
    };
    if scheme.eq_ignore_ascii_case("https") {
        return Err(
            "uses https, which webhooks do not support: they speak plain HTTP \
                    (use an http:// URL, e.g. of a local relay that adds TLS)",
        );
    }
    if !scheme.eq_ignore_ascii_case("http") {
        return Err(r#"is not an http:// URL (use e.g. "http://127.0.0.1:9000/hook")"#);
    }
    let authority_end = rest.find(['/', '?', '#']).unwrap_or(rest.len());
    let (authority, path) = rest.split_at(authority_end);
    if authority.contains('@') {
        return Err("carries credentials, which are not supported \
                    (leave out user:password@; put a secret in the path or query instead)");
    }
    let (host, port) = if authority.starts_with('[') {
        let Some(close) = authority.find(']') else {
            return Err(r#"has an unclosed IPv6 address (write it as "http://[::1]:9000/hook")"#);
        };
        let (host, after) = authority.split_at(close + 1);
        match after.strip_prefix(':') {
            Some(port) => (host, Some(port)),
            None if after.is_empty() => (host, None),
            None => return Err("has text after its IPv6 address (use [address]:port)"),
        }
    } else {
        match authority.rsplit_once(':') {
            Some((host, _)) if host.contains(':') => {
                return Err(
                    r#"has an IPv6 address without brackets (write it as "http://[::1]:9000/hook")"#,
                )
            }
            Some((host, port)) => (host, Some(port)),
            None => (authority, None),
        }
    };
    if host.is_empty() || host == "[]" {
        return Err(r#"has no host (use e.g. "http://127.0.0.1:9000/hook")"#);
    }
    let port = match port {
        None => 80,
        // `parse` alone would accept a sign ("+80").
        Some(port) if port.bytes().all(|b| b.is_ascii_digit()) => match port.parse::<u16>() {
            Ok(port) if port != 0 => port,
            _ => return Err("has a bad port (use 1-65535, or leave it out for 80)"),
        },
        Some(_) => return Err("has a bad port (use 1-65535, or leave it out for 80)"),
    };
    let path = path.split_once('#').map_or(path, |(before, _)| before);
    let path = if path.starts_with('/') {
        path.to_owned()
    } else {
        // Empty, or only a query.
        format!("/{path}")
    };
    Ok(HttpUrl {
        authority,
        host_port: format!("{host}:{port}"),
        path,
    })
}

/// An address to listen on: `ip:port`, or `localhost:port` for `127.0.0.1:port`.
pub(crate) fn listen_address(text: &str) -> Option<std::net::SocketAddr> {
    if let Ok(address) = text.parse() {
        return Some(address);
    }
    let (host, port) = text.rsplit_once(':')?;
    if !host.eq_ignore_ascii_case("localhost") || !port.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    Some(std::net::SocketAddr::from((
        std::net::Ipv4Addr::LOCALHOST,
        port.parse().ok()?,
    )))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations() {
        let ms = Duration::from_millis;
        for (text, expected) in [
            ("500ms", Some(ms(500))),
            ("2s", Some(ms(2000))),
            ("1.5s", Some(ms(1500))),
            ("0.1s", Some(ms(100))),
            ("1m", Some(ms(60_000))),
            ("1.5m", Some(ms(90_000))),
            ("2h", Some(ms(7_200_000))),
            ("0s", Some(Duration::ZERO)),
            ("0.000000001s", Some(Duration::from_nanos(1))),
            ("1.5ms", Some(Duration::from_micros(1500))),
            ("2", None),
            ("2x", None),
            ("s", None),
            ("", None),
            (".5s", None),
            ("1.s", None),
            ("1..5s", None),
            ("1.2.3s", None),
            ("-1s", None),
            ("1 s", None),
            (" 1s", None),
            ("1S", None),
            ("1sec", None),
            ("1d", None),
            ("1e3ms", None),
            ("0.0000000001s", None),
            ("99999999999999999999999h", None),
            ("18446744073709551616s", None),
        ] {
            assert_eq!(parse_duration(text), expected, "{text:?}");
        }
    }

    #[test]
    fn http_urls() {
        let ok = |text: &str| {
            let url = parse_http_url(text).unwrap_or_else(|why| panic!("{text:?} {why}"));
            (url.authority.to_owned(), url.host_port, url.path)
        };
        let parts = |a: &str, h: &str, p: &str| (a.to_owned(), h.to_owned(), p.to_owned());
        assert_eq!(
            ok("http://127.0.0.1:9000/hook"),
            parts("127.0.0.1:9000", "127.0.0.1:9000", "/hook")
        );
        assert_eq!(
            ok("http://hooks.internal"),
            parts("hooks.internal", "hooks.internal:80", "/")
        );
        assert_eq!(
            ok("HTTP://h:8080?a=1&b=2#frag"),
            parts("h:8080", "h:8080", "/?a=1&b=2")
        );
        assert_eq!(
            ok("http://[::1]:9000/a/b?c#d"),
            parts("[::1]:9000", "[::1]:9000", "/a/b?c")
        );
        assert_eq!(ok("http://[::1]"), parts("[::1]", "[::1]:80", "/"));
        for (bad, why) in [
            ("https://h/hook", "uses https"),
            ("HTTPS://h/hook", "uses https"),
            ("ftp://h/hook", "is not an http:// URL"),
            ("127.0.0.1:9000/hook", "is not an http:// URL"),
            ("http:///hook", "has no host"),
            ("http://:9000/hook", "has no host"),
            ("http://[]:9000", "has no host"),
            ("http://u:p@h/hook", "carries credentials"),
            ("http://h:0/hook", "has a bad port"),
            ("http://h:/hook", "has a bad port"),
            ("http://h:+80/hook", "has a bad port"),
            ("http://h:65536/hook", "has a bad port"),
            ("http://::1:9000/hook", "without brackets"),
            ("http://[::1/hook", "unclosed"),
            ("http://[::1]x/hook", "after its IPv6"),
            ("http://h/a hook", "contains a space"),
            ("http://h/a\r\nX: y", "contains a space"),
        ] {
            match parse_http_url(bad) {
                Ok(url) => panic!("{bad:?} parsed as {url:?}"),
                Err(error) => assert!(error.to_string().contains(why), "{bad:?}: {error}"),
            }
        }
    }

    #[test]
    fn log_levels() {
        for good in [
            "info",
            "DEBUG",
            "info,capataz=debug",
            "info,",
            "warn, capataz::proxy=trace ,hyper=off",
            "capataz",
            "my-crate=info",
        ] {
            assert_eq!(check_log_level(good), Ok(()), "{good:?}");
        }
        let nested = format!("[{{=M{}n}}]", ".".repeat(16));
        for (bad, why) in [
            (nested.as_str(), "span or field filter"),
            ("[span]=info", "span or field filter"),
            ("capataz{x}", "span or field filter"),
            ("capataz=debug=x", "neither a level"),
            ("capataz=loud", "neither a level"),
            ("a b", "neither a level"),
            ("=info", "neither a level"),
            ("capataz.proxy=info", "neither a level"),
            ("", "no directive"),
            ("  \t", "no directive"),
            (",", "no directive"),
            (" , ,", "no directive"),
        ] {
            match check_log_level(bad) {
                Ok(()) => panic!("{bad:?} accepted"),
                Err(error) => assert!(error.to_string().contains(why), "{bad:?}: {error}"),
            }
        }
        assert!(check_log_level(&"info,".repeat(300)).is_err());
    }

    #[test]
    fn percents() {
        assert_eq!(parse_percent("10%"), Some(0.1));
        assert_eq!(parse_percent("0%"), Some(0.0));
        assert_eq!(parse_percent("2.5%"), Some(0.025));
        for bad in ["10", "%", "1e1%", "inf%", ".5%", "5.%", "-5%", "1.2.3%"] {
            assert_eq!(parse_percent(bad), None, "{bad:?}");
        }
    }
}
