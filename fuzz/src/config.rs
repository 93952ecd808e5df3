//! The `config` target: any UTF-8 text through `capataz::config::parse_str`.
//!
//! The loader must never panic, whatever the text. When it accepts the text, the config has at
//! least one listener and one pool, and `config::check` (the warnings) runs on it too. When it
//! refuses, the message is the promised single line for the user: it starts with the source
//! name, holds no line break, and the line it names lies within the text.
//!
//! Backend addresses and webhook hosts are resolved when a config is loaded, and a fuzzer would
//! send a stream of DNS queries for made-up names to the machine's resolver (here each answer
//! took 0.3-15 ms, and such traffic is not ours to send). So an input that could make the loader
//! look a name up is skipped before the loader sees it: see [`may_resolve`]. Every other input,
//! including every one that is not valid TOML, goes through.

use std::net::{IpAddr, Ipv6Addr, SocketAddr};

use toml::{Table, Value};

/// The source name the target gives the loader.
pub const SOURCE: &str = "<fuzz>";

/// Checks one input; panics on the first violation.
pub fn run(data: &[u8]) {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    if may_resolve(text) {
        return;
    }
    match capataz::config::parse_str(text, SOURCE) {
        Ok(config) => {
            assert_eq!(config.source, SOURCE);
            assert!(!config.listeners.is_empty(), "a config without listeners");
            assert!(!config.pools.is_empty(), "a config without pools");
            for warning in capataz::config::check(&config) {
                assert!(!warning.to_string().is_empty());
            }
        }
        Err(error) => {
            let message = error.to_string();
            assert!(
                message.starts_with(SOURCE),
                "the message does not name the source: {message:?}"
            );
            assert!(
                !message.contains(['\n', '\r']),
                "the message is not one line: {message:?}"
            );
            if let Some(line) = error.line() {
                let lines = text.matches('\n').count() + 1;
                assert!(
                    (1..=lines).contains(&line),
                    "line {line} of a text of {lines} lines: {message:?}"
                );
            }
        }
    }
}

/// Whether loading `text` might look a host name up: whether some `address` or `url` string in
/// it, at any depth, names a host by something other than an IP literal. Errs on the side of
/// yes. Text that is not TOML cannot reach the resolver: the loader stops at the syntax error.
pub fn may_resolve(text: &str) -> bool {
    match text.parse::<Table>() {
        Ok(table) => table
            .iter()
            .any(|(key, value)| value_may_resolve(key, value)),
        Err(_) => false,
    }
}

fn value_may_resolve(key: &str, value: &Value) -> bool {
    match value {
        Value::String(text) => match key {
            "address" => address_may_resolve(text),
            "url" => url_may_resolve(text),
            _ => false,
        },
        Value::Array(items) => items.iter().any(|item| value_may_resolve(key, item)),
        Value::Table(table) => table
            .iter()
            .any(|(key, value)| value_may_resolve(key, value)),
        _ => false,
    }
}

/// `impl ToSocketAddrs for str` looks up the host only for `host:port` with a valid port that
/// is not already a socket address.
fn address_may_resolve(text: &str) -> bool {
    if text.parse::<SocketAddr>().is_ok() {
        return false;
    }
    match text.rsplit_once(':') {
        Some((_, port)) => port.parse::<u16>().is_ok(),
        None => false,
    }
}

/// A webhook URL resolves its host: safe only when the host is an IP literal (an IPv6 one in
/// brackets). Text without `://` is refused before any lookup.
fn url_may_resolve(text: &str) -> bool {
    let Some((_, rest)) = text.split_once("://") else {
        return false;
    };
    let authority = &rest[..rest.find(['/', '?', '#']).unwrap_or(rest.len())];
    if let Some(bracketed) = authority.strip_prefix('[') {
        let inside = bracketed.split(']').next().unwrap_or_default();
        return inside.parse::<Ipv6Addr>().is_err();
    }
    let host = authority
        .rsplit_once(':')
        .map_or(authority, |(host, _)| host);
    !matches!(host.parse::<IpAddr>(), Ok(IpAddr::V4(_)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn literals_pass_names_are_skipped() {
        let backend =
            |address: &str| format!("[pools.p]\nbackends = [{{ address = {address:?} }}]\n");
        assert!(!may_resolve(&backend("127.0.0.1:9001")));
        assert!(!may_resolve(&backend("[::1]:9001")));
        assert!(!may_resolve(&backend("no port")));
        assert!(!may_resolve(&backend("host:notaport")));
        assert!(may_resolve(&backend("localhost:9001")));
        assert!(may_resolve(&backend("backend.internal:8080")));
        assert!(may_resolve(&backend("[zz]:80")));
        let hook = |url: &str| format!("[[alerts.webhooks]]\nurl = {url:?}\n");
        assert!(!may_resolve(&hook("http://127.0.0.1:9000/hook")));
        assert!(!may_resolve(&hook("http://[::1]:9000/hook")));
        assert!(!may_resolve(&hook("not a url")));
        assert!(may_resolve(&hook("http://example.com/hook")));
        assert!(may_resolve(&hook("http://[1.2.3.4]/hook")));
        assert!(!may_resolve("this is = not [toml"));
        // Dotted and quoted keys are the same key to TOML.
        assert!(may_resolve(
            "pools.p.backends = [{ \"address\" = \"db:1\" }]"
        ));
    }
}
