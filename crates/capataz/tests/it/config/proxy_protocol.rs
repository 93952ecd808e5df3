//! A listener's `proxy_protocol` table: its trusted blocks, and the errors for bad ones.

use super::*;

fn with_listener(extra: &str) -> String {
    format!(
        "[[listeners]]\naddress = \"127.0.0.1:8080\"\n{extra}\n\n\
         [pools.web]\nbackends = [{{ address = \"127.0.0.1:9001\" }}]\n"
    )
}

#[test]
fn proxy_protocol_is_off_by_default_and_takes_blocks_and_lone_addresses() {
    assert_eq!(parse(MINIMAL).listeners[0].proxy_protocol, None);
    let config = parse(&with_listener(
        "proxy_protocol = { trusted = [\"10.0.0.0/8\", \"127.0.0.1\", \"2001:db8::/32\"] }",
    ));
    let table = config.listeners[0]
        .proxy_protocol
        .as_ref()
        .expect("the table");
    let shown: Vec<String> = table.trusted.iter().map(|b| b.to_string()).collect();
    assert_eq!(shown, ["10.0.0.0/8", "127.0.0.1/32", "2001:db8::/32"]);
    assert!(table.trusted[1].contains("127.0.0.1".parse().unwrap()));
}

#[test]
fn proxy_protocol_errors_name_the_block_and_what_to_write() {
    let error = check_err(
        &with_listener("proxy_protocol = { trusted = [\"10.0.0.0/8\", \"10.1.2.3/8\"] }"),
        Some(3),
        "listeners[0].proxy_protocol.trusted[1]",
    );
    assert!(
        error.to_string().contains("did you mean 10.0.0.0/8"),
        "{error}"
    );
    check_err(
        &with_listener("proxy_protocol = { trusted = [\"proxy.internal\"] }"),
        Some(3),
        "listeners[0].proxy_protocol.trusted[0]",
    );
    check_err(
        &with_listener("proxy_protocol = { trusted = [\"::1/129\"] }"),
        Some(3),
        "listeners[0].proxy_protocol.trusted[0]",
    );
    let error = check_err(
        &with_listener("proxy_protocol = { trusted = [] }"),
        Some(3),
        "listeners[0].proxy_protocol.trusted",
    );
    assert!(error.to_string().contains("trusted = ["), "{error}");
    check_err(
        &with_listener("proxy_protocol = {}"),
        Some(3),
        "listeners[0].proxy_protocol.trusted",
    );
    let error = check_err(
        &with_listener("proxy_protocol = { trusted = [\"127.0.0.1\"], version = 2 }"),
        Some(3),
        "listeners[0].proxy_protocol",
    );
    assert!(
        error
            .to_string()
            .contains("unknown key \"version\" (the keys here are trusted)"),
        "{error}"
    );
}
