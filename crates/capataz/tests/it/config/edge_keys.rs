//! `[listeners.error_pages]` and a route's `rate_limit`: values, defaults, and one error per
//! class of bad input with its file, line and key.

use super::*;

/// A listener with `lines` in its table (after `address`), one route to pool `web` with
/// `route` lines, and the pool.
fn listener_with(lines: &str, route: &str) -> String {
    format!(
        "[[listeners]]\naddress = \"127.0.0.1:8080\"\n{lines}\n\n[[listeners.routes]]\n\
         pool = \"web\"\n{route}\n\n[pools.web]\nbackends = [{{ address = \"127.0.0.1:9001\" }}]\n"
    )
}

#[test]
fn error_pages_read_inline_bodies_and_files() {
    let dir = std::env::temp_dir().join(format!("capataz-pages-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let file = dir.join("503.html");
    std::fs::write(&file, "<p>back soon</p>").unwrap();
    let text = listener_with(
        &format!(
            "[listeners.error_pages]\n503 = {{ file = \"{}\" }}\n\
             429 = {{ body = \"slow down\", content_type = \"text/plain\" }}",
            file.display()
        ),
        "",
    );
    let config = parse(&text);
    let pages = config.listeners[0].error_pages.as_ref().expect("pages");
    let statuses: Vec<u16> = pages.pages.iter().map(|p| p.status).collect();
    assert_eq!(statuses, [429, 503]);
    let page = pages.page(503).unwrap();
    assert_eq!(page.body, b"<p>back soon</p>");
    assert_eq!(page.content_type, "text/html; charset=utf-8");
    assert_eq!(pages.page(429).unwrap().body, b"slow down");
    assert_eq!(pages.page(429).unwrap().content_type, "text/plain");
    assert!(parse(MINIMAL).listeners[0].error_pages.is_none());
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn error_page_errors_name_the_line_and_key() {
    let big = "x".repeat(64 * 1024 + 1);
    let cases: [(&str, String, usize, &str); 6] = [
        (
            "a status capataz never writes",
            "[listeners.error_pages]\n500 = { body = \"x\" }".into(),
            4,
            "listeners[0].error_pages.500",
        ),
        (
            "not a number",
            "[listeners.error_pages]\noops = { body = \"x\" }".into(),
            4,
            "listeners[0].error_pages.oops",
        ),
        (
            "neither file nor body",
            "[listeners.error_pages]\n502 = { content_type = \"text/html\" }".into(),
            4,
            "listeners[0].error_pages.502",
        ),
        (
            "both file and body",
            "[listeners.error_pages]\n502 = { file = \"a.html\", body = \"x\" }".into(),
            4,
            "listeners[0].error_pages.502.file",
        ),
        (
            "a Content-Type that is no header value",
            "[listeners.error_pages]\n502 = { body = \"x\", content_type = \"a\\nb\" }".into(),
            4,
            "listeners[0].error_pages.502.content_type",
        ),
        (
            "an inline body too big",
            format!("[listeners.error_pages]\n503 = {{ body = \"{big}\" }}"),
            4,
            "listeners[0].error_pages.503.body",
        ),
    ];
    for (what, lines, line, key) in cases {
        let error = check_err(&listener_with(&lines, ""), Some(line), key);
        assert_eq!(error.key(), key, "{what}");
    }
}

#[test]
fn an_unreadable_or_oversized_page_file_names_file_line_and_key() {
    let dir = std::env::temp_dir().join(format!("capataz-bad-pages-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let missing = dir.join("missing.html");
    let text = listener_with(
        &format!(
            "[listeners.error_pages]\n502 = {{ file = \"{}\" }}",
            missing.display()
        ),
        "",
    );
    let error = check_err(&text, Some(4), "listeners[0].error_pages.502.file");
    assert!(
        error.to_string().contains("cannot read the error page"),
        "{error}"
    );
    let big = dir.join("big.html");
    std::fs::write(&big, vec![b'x'; 64 * 1024 + 1]).unwrap();
    let text = listener_with(
        &format!(
            "[listeners.error_pages]\n\n504 = {{ file = \"{}\" }}",
            big.display()
        ),
        "",
    );
    let error = check_err(&text, Some(5), "listeners[0].error_pages.504.file");
    assert!(error.to_string().contains("larger than 64 KiB"), "{error}");
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn a_rate_limit_reads_its_key_and_defaults() {
    use capataz::config::{RateLimitKey, DEFAULT_RATE_LIMIT_KEYS};
    let config = parse(&listener_with(
        "",
        "rate_limit = { key = \"client_ip\", rate = 100 }",
    ));
    let limit = config.listeners[0].routes[0]
        .rate_limit
        .clone()
        .expect("a limit");
    assert_eq!(limit.key, RateLimitKey::ClientIp);
    assert_eq!(
        (limit.rate, limit.burst),
        (100, 100),
        "burst defaults to rate"
    );
    assert_eq!(limit.per, Duration::from_secs(1));
    assert_eq!(limit.max_keys, DEFAULT_RATE_LIMIT_KEYS);
    assert_eq!(limit.interval(), Duration::from_millis(10));
    let config = parse(&listener_with(
        "",
        "rate_limit = { key = \"header:X-Api-Key\", rate = 5, per = \"1m\", burst = 1, max_keys = 10 }",
    ));
    let limit = config.listeners[0].routes[0].rate_limit.clone().unwrap();
    assert_eq!(
        limit.key,
        RateLimitKey::Header(http::HeaderName::from_static("x-api-key"))
    );
    assert_eq!(
        (limit.rate, limit.per, limit.burst, limit.max_keys),
        (5, Duration::from_secs(60), 1, 10)
    );
    assert!(parse(MINIMAL).listeners[0].routes[0].rate_limit.is_none());
}

#[test]
fn rate_limit_errors_name_the_line_and_key() {
    let at = "listeners[0].routes[0].rate_limit";
    let cases: [(&str, &str, String); 8] = [
        ("no key", "{ rate = 1 }", format!("{at}.key")),
        (
            "an unknown key kind",
            "{ key = \"cookie:a\", rate = 1 }",
            format!("{at}.key"),
        ),
        (
            "a bad header name",
            "{ key = \"header:a b\", rate = 1 }",
            format!("{at}.key"),
        ),
        ("no rate", "{ key = \"client_ip\" }", format!("{at}.rate")),
        (
            "rate 0",
            "{ key = \"client_ip\", rate = 0 }",
            format!("{at}.rate"),
        ),
        (
            "burst 0",
            "{ key = \"client_ip\", rate = 1, burst = 0 }",
            format!("{at}.burst"),
        ),
        (
            "a period under 1ms",
            "{ key = \"client_ip\", rate = 1, per = \"500us\" }",
            format!("{at}.per"),
        ),
        (
            "max_keys 0",
            "{ key = \"client_ip\", rate = 1, max_keys = 0 }",
            format!("{at}.max_keys"),
        ),
    ];
    for (what, table, key) in cases {
        let text = listener_with("", &format!("rate_limit = {table}"));
        let error = check_err(&text, Some(7), &key);
        assert_eq!(error.key(), key, "{what}: {error}");
    }
    let error = check_err(
        &listener_with(
            "",
            "rate_limit = { key = \"client_ip\", rate = 1, burst = 2, bucket = 3 }",
        ),
        Some(7),
        "bucket",
    );
    assert!(error.to_string().contains("bucket"), "{error}");
}

#[test]
fn peak_ewma_is_an_algorithm() {
    let text = MINIMAL.replace("[pools.web]\n", "[pools.web]\nalgorithm = \"peak_ewma\"\n");
    assert_eq!(parse(&text).pools[0].algorithm, Algorithm::PeakEwma);
}
