//! The configuration loader: typed values and defaults, one error per class of bad input (with
//! its line and key), and the `check` warnings.
//!
//! The helpers are here; the tests are in one module per concern.

mod access_log;
mod affinity;
mod edge_example;
mod edge_keys;
mod errors;
mod etcd_access;
mod fleet;
mod http2;
mod limits;
mod log_level;
mod operator_words;
mod proxy_protocol;
mod route_rules;
mod sni_routes;
mod source;
mod tcp_mode;
mod unix_addresses;
mod values;
mod warnings;

use std::net::SocketAddr;
use std::time::Duration;

use capataz::config::{
    check, load, parse_str, Algorithm, AllDownPolicy, CheckKind, Config, ConfigError, LogFormat,
};
use capataz_health::{State, StatusSet};

/// The smallest valid config; everything else is a default.
const MINIMAL: &str = r#"
[[listeners]]
address = "127.0.0.1:8080"

[pools.web]
backends = [{ address = "127.0.0.1:9001" }]
"#;

fn parse(text: &str) -> Config {
    parse_str(text, "config.toml").unwrap_or_else(|error| panic!("{error}\n---\n{text}"))
}

/// `text` must fail on line `line` (`None`: no line) with a key containing `key`.
fn check_err(text: &str, line: Option<usize>, key: &str) -> ConfigError {
    let error = match parse_str(text, "config.toml") {
        Ok(_) => panic!("expected an error at {key}, got a valid config:\n{text}"),
        Err(error) => error,
    };
    let shown = error.to_string();
    assert_eq!(error.line(), line, "wrong line in {shown:?}\n---\n{text}");
    assert!(
        error.key().contains(key),
        "key {:?} does not contain {key:?} in {shown:?}",
        error.key()
    );
    let prefix = match line {
        Some(line) => format!("config.toml:{line}: "),
        None => "config.toml: ".to_owned(),
    };
    assert!(
        shown.starts_with(&prefix),
        "{shown:?} should start with {prefix:?}"
    );
    assert!(!shown.contains('\n'), "one line please: {shown:?}");
    error
}

/// `MINIMAL` with `extra` appended under `[pools.web]`-level tables and keys.
fn with_pool(extra: &str) -> String {
    format!("{MINIMAL}{extra}\n")
}

fn addr(text: &str) -> SocketAddr {
    text.parse().unwrap()
}

/// The complete example of docs/config.md, which must stay valid.
fn doc_example() -> String {
    let doc = include_str!("../../../../../docs/config.md");
    let start = doc
        .find("<!-- example:start -->")
        .expect("docs/config.md marks its example");
    let block = &doc[start..];
    let open = block.find("```toml\n").unwrap() + "```toml\n".len();
    let close = block[open..].find("```").unwrap();
    block[open..open + close].to_owned()
}
