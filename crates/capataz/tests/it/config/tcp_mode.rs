//! TCP mode: a `mode = "tcp"` listener and its `protocol = "tcp"` pool, their defaults, and
//! the errors for HTTP keys on either and for a listener and a pool that do not match.

use super::*;
use capataz::config::{BackendProtocol, TcpExpect};

/// A tcp listener (`listener` appended to it) relaying to pool `db` (`pool` appended to it),
/// beside an HTTP pool `web`.
fn tcp(listener: &str, pool: &str) -> String {
    format!(
        "[[listeners]]\naddress = \"127.0.0.1:6380\"\nmode = \"tcp\"\npool = \"db\"\n{listener}\n\n\
         [pools.db]\nprotocol = \"tcp\"\nbackends = [{{ address = \"127.0.0.1:6379\" }}]\n{pool}\n\n\
         [pools.web]\nbackends = [{{ address = \"127.0.0.1:9001\" }}]\n"
    )
}

#[test]
fn a_tcp_listener_relays_to_its_tcp_pool_whose_check_connects_by_default() {
    let config = parse(&tcp("", ""));
    let listener = &config.listeners[0];
    let mode = listener.tcp.as_ref().expect("mode = \"tcp\"");
    let db = mode.pool.expect("the listener's pool");
    assert_eq!(config.pools[db].name, "db");
    assert_eq!(mode.sni, None, "no TLS passthrough routes by default");
    assert_eq!(mode.session_timeout, None, "no session limit by default");
    assert!(listener.routes.is_empty(), "a tcp listener has no routes");
    assert_eq!(listener.idle_timeout, Duration::from_secs(60));
    let db = &config.pools[db];
    assert_eq!(db.protocol, BackendProtocol::Tcp);
    assert_eq!(db.active.kind, CheckKind::Tcp);
    let config = parse(&tcp("session_timeout = \"1h\"\nidle_timeout = \"10m\"", ""));
    let listener = &config.listeners[0];
    assert_eq!(
        listener.tcp.as_ref().and_then(|t| t.session_timeout),
        Some(Duration::from_secs(3600))
    );
    assert_eq!(listener.idle_timeout, Duration::from_secs(600));
    assert_eq!(parse(MINIMAL).listeners[0].tcp, None, "HTTP by default");
    let explicit = MINIMAL.replace("8080\"", "8080\"\nmode = \"http\"");
    assert_eq!(parse(&explicit).listeners[0].tcp, None);
    // The PROXY protocol to the backends, the all-down policy and close_tunnels_on_down apply.
    parse(&tcp(
        "",
        "send_proxy_protocol = \"v2\"\nwhen_all_down = \"reject\"\nclose_tunnels_on_down = true",
    ));
}

#[test]
fn http_keys_on_a_tcp_listener_are_errors_naming_the_key() {
    for (extra, key) in [
        ("h2c = true", "listeners[0].h2c"),
        ("max_header_bytes = 4096", "listeners[0].max_header_bytes"),
        (
            "request_body_timeout = \"5s\"",
            "listeners[0].request_body_timeout",
        ),
        (
            "forwarded_headers = false",
            "listeners[0].forwarded_headers",
        ),
        ("https_redirect = true", "listeners[0].https_redirect"),
        ("http2 = { max_frame_size = 20000 }", "listeners[0].http2"),
        ("h2c = false", "listeners[0].h2c"),
        ("forwarded = \"rfc7239\"", "listeners[0].forwarded"),
        ("request_id = {}", "listeners[0].request_id"),
        (
            "request_headers = { remove = [\"x-a\"] }",
            "listeners[0].request_headers",
        ),
        (
            "response_headers = { remove = [\"x-a\"] }",
            "listeners[0].response_headers",
        ),
        (
            "error_pages = { 503 = { body = \"busy\" } }",
            "listeners[0].error_pages",
        ),
    ] {
        let error = check_err(&tcp(extra, ""), Some(5), key);
        assert!(
            error.to_string().contains("mode = \"tcp\""),
            "{extra}: {error}"
        );
    }
    let routes = tcp("[[listeners.routes]]\npool = \"web\"", "");
    check_err(&routes, Some(5), "listeners[0].routes");
}

#[test]
fn a_tcp_listener_needs_a_tcp_pool_and_an_http_listener_cannot_use_one() {
    let without = tcp("", "").replace("pool = \"db\"\n", "");
    let error = check_err(&without, Some(1), "listeners[0].pool");
    assert!(error.to_string().contains("add pool = NAME"), "{error}");
    let error = check_err(
        &tcp("", "").replace("\"db\"\n\n", "\"nope\"\n\n"),
        Some(4),
        "listeners[0].pool",
    );
    assert!(
        error.to_string().contains("\"nope\" is not a pool"),
        "{error}"
    );
    let http_pool = tcp("", "").replace("pool = \"db\"", "pool = \"web\"");
    let error = check_err(&http_pool, Some(4), "listeners[0].pool");
    assert!(error.to_string().contains("protocol = \"tcp\""), "{error}");
    // An HTTP listener routing to the tcp pool, by a route or as its only pool.
    let routed = format!(
        "{}\n[[listeners]]\naddress = \"127.0.0.1:8080\"\n[[listeners.routes]]\npool = \"db\"\n",
        tcp("", "")
    );
    let error = check_err(&routed, Some(18), "listeners[1].routes[0].pool");
    assert!(error.to_string().contains("mode = \"tcp\""), "{error}");
    let only = "[[listeners]]\naddress = \"127.0.0.1:8080\"\n\n[pools.db]\nprotocol = \"tcp\"\n\
                backends = [{ address = \"127.0.0.1:6379\" }]\n";
    check_err(only, Some(1), "listeners[0].routes");
    // A pool or a session limit on an HTTP listener.
    let pool_on_http = MINIMAL.replace("8080\"", "8080\"\npool = \"web\"");
    let error = check_err(&pool_on_http, Some(4), "listeners[0].pool");
    assert!(error.to_string().contains("mode = \"tcp\""), "{error}");
    let limit_on_http = MINIMAL.replace("8080\"", "8080\"\nsession_timeout = \"1h\"");
    check_err(&limit_on_http, Some(4), "listeners[0].session_timeout");
    check_err(
        &tcp("session_timeout = \"0s\"", ""),
        Some(5),
        "listeners[0].session_timeout",
    );
    let udp = tcp("", "").replace("mode = \"tcp\"", "mode = \"udp\"");
    let error = check_err(&udp, Some(3), "listeners[0].mode");
    assert!(error.to_string().contains(r#""http", "tcp""#), "{error}");
}

#[test]
fn http_keys_on_a_tcp_pool_are_errors_naming_the_key() {
    for (extra, key) in [
        ("connection_reuse = \"shared\"", "pools.db.connection_reuse"),
        (
            "timeouts.response_header = \"5s\"",
            "pools.db.timeouts.response_header",
        ),
        ("timeouts.body_idle = \"5s\"", "pools.db.timeouts.body_idle"),
        ("timeouts.idle = \"5s\"", "pools.db.timeouts.idle"),
        ("active.kind = \"http\"", "pools.db.active.kind"),
        ("active.kind = \"grpc\"", "pools.db.active.kind"),
        ("active.path = \"/healthz\"", "pools.db.active.path"),
        // A session has no cookie, header, path or query: sticky cookies and those keys were
        // once accepted and ignored (sessions went round robin).
        ("sticky = { cookie = \"SRV\" }", "pools.db.sticky"),
        (
            "hash_key = \"header:x-user\"\nalgorithm = \"hash\"",
            "pools.db.hash_key",
        ),
    ] {
        let error = check_err(&tcp("", extra), Some(10), key);
        assert!(
            error.to_string().contains("protocol = \"tcp\""),
            "{extra}: {error}"
        );
    }
    // What does apply: the connect timeout, retries, a check that says none.
    let config = parse(&tcp(
        "",
        "timeouts.connect = \"250ms\"\nretries.attempts = 2\nactive.kind = \"none\"",
    ));
    let db = &config.pools[0];
    assert_eq!(db.timeouts.connect, Duration::from_millis(250));
    assert_eq!(db.retries.attempts, 2);
    assert_eq!(db.active.kind, CheckKind::None);
    // TLS to the backends (HAProxy's `server ... ssl` in mode tcp).
    let config = parse(&tcp(
        "",
        "tls = { server_name = \"db.internal\", verify = false }",
    ));
    let tls = config.pools[0].tls.as_ref().expect("TLS to the backends");
    assert_eq!(tls.server_name.as_deref(), Some("db.internal"));
    assert!(!tls.verify);
}

#[test]
fn a_tcp_check_sends_and_expects_text_with_tomls_escapes() {
    let config = parse(&tcp(
        "",
        "active.send = \"PING\\r\\n\"\nactive.expect_text = \"+PONG\"",
    ));
    let exchange = config.pools[0]
        .active
        .tcp_exchange
        .clone()
        .expect("an exchange");
    assert_eq!(exchange.send, b"PING\r\n");
    assert_eq!(exchange.expect, Some(TcpExpect::Text("+PONG".into())));
    // A literal string keeps its backslashes; expect alone sends nothing.
    let config = parse(&tcp("", "active.send = 'PING\\r\\n'"));
    let exchange = config.pools[0].active.tcp_exchange.clone().unwrap();
    assert_eq!(exchange.send, b"PING\\r\\n");
    assert_eq!(exchange.expect, None);
    let config = parse(&tcp("", "active.expect_text = \"220 \""));
    assert_eq!(
        config.pools[0].active.tcp_exchange.clone().unwrap().send,
        b""
    );
    assert_eq!(parse(&tcp("", "")).pools[0].active.tcp_exchange, None);
}

#[test]
fn send_and_expect_text_belong_to_a_tcp_check_and_are_bounded() {
    // An HTTP pool's check (kind "http" by default, or written).
    let http = with_pool("[pools.web.active]\nsend = \"PING\\r\\n\"");
    let error = check_err(&http, Some(8), "pools.web.active.send");
    assert!(error.to_string().contains("kind = \"tcp\""), "{error}");
    let written = with_pool("[pools.web.active]\nkind = \"none\"\nexpect_text = \"+PONG\"");
    check_err(&written, Some(8), "pools.web.active.kind");
    // On an HTTP pool whose check is a connect, they are fine.
    parse(&with_pool(
        "[pools.web.active]\nkind = \"tcp\"\nexpect_text = \"+PONG\"",
    ));
    check_err(
        &tcp("", "active.expect_text = \"\""),
        Some(10),
        "pools.db.active.expect_text",
    );
    let long = format!("active.expect_text = \"{}\"", "x".repeat(257));
    check_err(&tcp("", &long), Some(10), "pools.db.active.expect_text");
    let huge = format!("active.send = \"{}\"", "x".repeat(64 * 1024 + 1));
    check_err(&tcp("", &huge), Some(10), "pools.db.active.send");
}

#[test]
fn a_tcp_check_sends_and_expects_bytes_written_in_hex() {
    // PostgreSQL's SSLRequest, answered by one byte: 'N' (no TLS) or 'S'.
    let config = parse(&tcp(
        "",
        "active.send_hex = \"0000 0008 04d2 162f\"\nactive.expect_hex = \"4E\"",
    ));
    let exchange = config.pools[0].active.tcp_exchange.clone().unwrap();
    assert_eq!(exchange.send, [0, 0, 0, 8, 0x04, 0xd2, 0x16, 0x2f]);
    assert_eq!(exchange.expect, Some(TcpExpect::Prefix(vec![b'N'])));
    // Hex and text mix: bytes sent, text expected, and the other way round.
    let config = parse(&tcp(
        "",
        "active.send_hex = \"0a\"\nactive.expect_text = \"ok\"",
    ));
    let exchange = config.pools[0].active.tcp_exchange.clone().unwrap();
    assert_eq!(exchange.send, b"\n");
    assert_eq!(exchange.expect, Some(TcpExpect::Text("ok".into())));
    let config = parse(&tcp("", "active.expect_hex = \"0a\""));
    let exchange = config.pools[0].active.tcp_exchange.clone().unwrap();
    assert_eq!(exchange.send, b"");
}

#[test]
fn send_hex_and_expect_hex_are_hex_bounded_and_not_beside_their_text_twins() {
    for (pool, key) in [
        ("active.send_hex = \"0x52\"", "pools.db.active.send_hex"),
        ("active.send_hex = \"525\"", "pools.db.active.send_hex"),
        ("active.expect_hex = \"5 2\"", "pools.db.active.expect_hex"),
        ("active.expect_hex = \"\"", "pools.db.active.expect_hex"),
        ("active.expect_hex = \"  \"", "pools.db.active.expect_hex"),
    ] {
        let error = check_err(&tcp("", pool), Some(10), key);
        assert!(error.to_string().contains("hex"), "{error}");
    }
    let long = format!("active.expect_hex = \"{}\"", "ab".repeat(257));
    check_err(&tcp("", &long), Some(10), "pools.db.active.expect_hex");
    let huge = format!("active.send_hex = \"{}\"", "00".repeat(64 * 1024 + 1));
    check_err(&tcp("", &huge), Some(10), "pools.db.active.send_hex");
    let both = "active.send = \"PING\"\nactive.send_hex = \"50\"";
    let error = check_err(&tcp("", both), Some(11), "pools.db.active.send_hex");
    assert!(error.to_string().contains("keep one"), "{error}");
    let both = "active.expect_text = \"R\"\nactive.expect_hex = \"52\"";
    let error = check_err(&tcp("", both), Some(11), "pools.db.active.expect_hex");
    assert!(error.to_string().contains("keep one"), "{error}");
    // On a check that is not a tcp one, the key written is named.
    let http = with_pool("[pools.web.active]\nexpect_hex = \"52\"");
    check_err(&http, Some(8), "pools.web.active.expect_hex");
}

#[test]
fn expect_text_alone_on_an_http_check_is_the_key_named_not_send() {
    // The error named `send`, a key the file does not have, when only `expect_text` was written.
    let http = with_pool("[pools.web.active]\nexpect_text = \"+PONG\"");
    let error = check_err(&http, Some(8), "pools.web.active.expect_text");
    assert!(!error.key().ends_with(".send"), "{error}");
}

#[test]
fn the_documented_postgresql_login_check_is_the_startup_message_it_says() {
    let doc = include_str!("../../../../../docs/config.md");
    let section = &doc[doc.find("### Bytes in hex").expect("the section")..];
    let open = section.find("```toml\n").unwrap() + "```toml\n".len();
    let block = &section[open..open + section[open..].find("```").unwrap()];
    let text = format!(
        "[[listeners]]\naddress = \"127.0.0.1:5433\"\nmode = \"tcp\"\npool = \"pg\"\n\n\
         [pools.pg]\nprotocol = \"tcp\"\nbackends = [{{ address = \"127.0.0.1:5432\" }}]\n\n{block}"
    );
    let exchange = parse(&text).pools[0].active.tcp_exchange.clone().unwrap();
    let mut startup = 40u32.to_be_bytes().to_vec();
    startup.extend_from_slice(&0x0003_0000u32.to_be_bytes());
    startup.extend_from_slice(b"user\0capataz\0database\0postgres\0\0");
    assert_eq!(exchange.send, startup);
    assert_eq!(exchange.expect, Some(TcpExpect::Prefix(b"R".to_vec())));
}
