//! `[listeners.access_log]`: off by default, its defaults, and its errors.

use std::path::PathBuf;

use capataz::config::{AccessLogConfig, AccessLogFormat, AccessLogTarget};

use super::{check_err, parse, MINIMAL};

fn with_log(table: &str) -> String {
    MINIMAL.replace(
        "address = \"127.0.0.1:8080\"\n",
        &format!("address = \"127.0.0.1:8080\"\n[listeners.access_log]\n{table}\n"),
    )
}

#[test]
fn the_access_log_is_off_by_default() {
    assert_eq!(parse(MINIMAL).listeners[0].access_log, None);
}

#[test]
fn an_access_log_defaults_to_text_and_4096_lines_beside_the_config_file() {
    let config = parse(&with_log("path = \"logs/access.log\""));
    assert_eq!(
        config.listeners[0].access_log,
        Some(AccessLogConfig {
            // Relative to the config file's directory ("config.toml": the current one).
            target: AccessLogTarget::File(PathBuf::from("logs/access.log")),
            format: AccessLogFormat::Text,
            buffer: 4096,
        })
    );
    let config = parse(&with_log(
        "path = \"stdout\"\nformat = \"json\"\nbuffer = 1",
    ));
    let log = config.listeners[0].access_log.clone().unwrap();
    assert_eq!(
        (log.target, log.format, log.buffer),
        (AccessLogTarget::Stdout, AccessLogFormat::Json, 1)
    );
}

#[test]
fn an_access_log_without_a_path_or_with_a_bad_format_or_buffer_is_refused() {
    check_err(&with_log("format = \"json\""), Some(4), "access_log.path");
    check_err(
        &with_log("path = \"a.log\"\nformat = \"clf\""),
        Some(6),
        "access_log.format",
    );
    check_err(
        &with_log("path = \"a.log\"\nbuffer = 0"),
        Some(6),
        "access_log.buffer",
    );
    check_err(&with_log("path = \"\""), Some(5), "access_log.path");
    check_err(
        &with_log("path = \"a.log\"\nlines = 3"),
        Some(6),
        "access_log",
    );
}
