//! `[listeners.tls.http3]` in the config: its defaults, and an error naming the file, the
//! line and the key for each bad value.

use std::time::Duration;

use capataz::config::{self, Http3Config};

use crate::support::tls::Pki;

const BASE: &str = "[pools.web]\nbackends = [{ address = \"127.0.0.1:9001\" }]\n\
                    [[listeners]]\naddress = \"127.0.0.1:8443\"\n";

/// `text` written as `capataz.toml` in `pki`'s directory (which holds `site.pem`/`site.key`),
/// loaded.
fn load(pki: &Pki, text: &str) -> Result<config::Config, String> {
    let path = pki.dir.join("capataz.toml");
    std::fs::write(&path, text).unwrap();
    config::load(&path).map_err(|e| {
        let error = e.to_string();
        let prefix = format!("{}:", path.display());
        assert!(error.starts_with(&prefix), "{error}");
        error[prefix.len()..].to_owned()
    })
}

const TLS: &str = "[listeners.tls]\ncertificates = [{ cert = \"site.pem\", key = \"site.key\" }]\n";

#[test]
fn http3_is_off_by_default_and_its_table_turns_it_on_with_defaults() {
    let pki = Pki::new();
    pki.server("site", &["site.test"], None);
    let off = load(&pki, &format!("{BASE}{TLS}")).unwrap();
    assert_eq!(off.listeners[0].tls.as_ref().unwrap().http3, None);
    let on = load(&pki, &format!("{BASE}{TLS}[listeners.tls.http3]\n")).unwrap();
    let http3 = on.listeners[0].tls.as_ref().unwrap().http3.clone().unwrap();
    assert_eq!(http3, Http3Config::DEFAULT);
    assert_eq!(http3.port, None, "the listener's TCP port");
    assert_eq!(http3.max_streams, 100);
    assert_eq!(http3.alt_svc_max_age, Duration::from_secs(86_400));
    assert_eq!(http3.retry_threshold, 100);
    let set = load(
        &pki,
        &format!(
            "{BASE}{TLS}[listeners.tls.http3]\nport = 9443\nmax_streams = 20\n\
             alt_svc_max_age = \"30m\"\nretry_threshold = 0\n"
        ),
    )
    .unwrap();
    let http3 = set.listeners[0]
        .tls
        .as_ref()
        .unwrap()
        .http3
        .clone()
        .unwrap();
    assert_eq!(http3.port, Some(9443));
    assert_eq!(http3.max_streams, 20);
    assert_eq!(http3.alt_svc_max_age, Duration::from_secs(1800));
    assert_eq!(http3.retry_threshold, 0);
}

#[test]
fn bad_http3_settings_name_the_file_the_line_and_the_key() {
    let pki = Pki::new();
    pki.server("site", &["site.test"], None);
    let at = "listeners[0].tls.http3";
    for (lines, want) in [
        ("port = 0", format!("8: {at}.port: ")),
        ("port = 70000", format!("8: {at}.port: ")),
        ("max_streams = 0", format!("8: {at}.max_streams: ")),
        (
            "alt_svc_max_age = \"soon\"",
            format!("8: {at}.alt_svc_max_age: "),
        ),
        ("retry_threshold = -1", format!("8: {at}.retry_threshold: ")),
        ("zero_rtt = true", format!("8: {at}.zero_rtt: ")),
    ] {
        let error = load(
            &pki,
            &format!("{BASE}{TLS}[listeners.tls.http3]\n{lines}\n"),
        )
        .expect_err(lines);
        assert!(error.starts_with(&want), "{lines}: {error}");
    }
    // HTTP/3 needs TLS: at the listener's level, with no TLS table, it is an unknown key.
    let error = load(&pki, &format!("{BASE}http3 = true\n")).expect_err("no TLS");
    assert!(error.starts_with("5: listeners[0].http3: "), "{error}");
    // A tcp listener relays bytes: no HTTP/3 there.
    let tcp = "[pools.db]\nprotocol = \"tcp\"\nbackends = [{ address = \"127.0.0.1:6379\" }]\n\
               [[listeners]]\naddress = \"127.0.0.1:6380\"\nmode = \"tcp\"\npool = \"db\"\n";
    let error = load(&pki, &format!("{tcp}{TLS}[listeners.tls.http3]\n")).expect_err("tcp");
    assert!(error.contains("listeners[0].tls.http3"), "{error}");
}
