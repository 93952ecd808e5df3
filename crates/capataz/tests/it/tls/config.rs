//! `[listeners.tls]` in the config: every invalid setting or file is an error naming the file,
//! the line and the key; `capataz check` warns about a certificate that expires soon.

use std::path::PathBuf;
use std::process::Command;

use capataz::config::{self, check};

use super::*;

const BASE: &str = "[pools.web]\nbackends = [{ address = \"127.0.0.1:9001\" }]\n\
                    [[listeners]]\naddress = \"127.0.0.1:8443\"\n";

/// The error `tls` (the lines after `[listeners.tls]`, starting on line 6) gives, as text,
/// with the config in `pki`'s directory so relative paths are read from there.
fn error_of(pki: &Pki, tls: &str) -> String {
    let path = pki.dir.join("capataz.toml");
    std::fs::write(&path, format!("{BASE}[listeners.tls]\n{tls}\n")).unwrap();
    let error = config::load(&path).expect_err("invalid").to_string();
    let prefix = format!("{}:", path.display());
    assert!(error.starts_with(&prefix), "{error}");
    error[prefix.len()..].to_owned()
}

#[test]
fn tls_file_errors_name_the_file_the_line_and_the_key() {
    let pki = Pki::new();
    pki.server("site", &["site.test"], None);
    pki.server("other", &["other.test"], None);
    pki.server("old", &["old.test"], Some((2021, 1, 1)));
    std::fs::write(
        pki.dir.join("garbage.pem"),
        "-----BEGIN CERTIFICATE-----\n!!!\n",
    )
    .unwrap();
    std::fs::write(pki.dir.join("empty.pem"), "no PEM here\n").unwrap();
    let at = |file: &str| pki.dir.join(file).display().to_string();
    let key = "listeners[0].tls.certificates[0]";
    for (tls, want) in [
        (
            r#"certificates = [{ cert = "missing.pem", key = "site.key" }]"#,
            format!("6: {key}.cert: {}: cannot read it: No such file", at("missing.pem")),
        ),
        (
            r#"certificates = [{ cert = "garbage.pem", key = "site.key" }]"#,
            format!("6: {key}.cert: {}: is not valid PEM", at("garbage.pem")),
        ),
        (
            r#"certificates = [{ cert = "empty.pem", key = "site.key" }]"#,
            format!("6: {key}.cert: {}: holds no certificate", at("empty.pem")),
        ),
        (
            r#"certificates = [{ cert = "site.pem", key = "empty.pem" }]"#,
            format!("6: {key}.key: {}: holds no private key", at("empty.pem")),
        ),
        (
            r#"certificates = [{ cert = "site.pem", key = "other.key" }]"#,
            format!(
                "6: {key}.key: {}: does not match the certificate in {}",
                at("other.key"),
                at("site.pem")
            ),
        ),
        (
            r#"certificates = [{ cert = "site.pem", key = "site.key" },
                              { cert = "old.pem", key = "old.key" }]"#,
            format!(
                "7: listeners[0].tls.certificates[1].cert: {}: the certificate expired on \
                 2021-01-01T00:00:00",
                at("old.pem")
            ),
        ),
        (
            "certificates = [{ cert = \"site.pem\", key = \"site.key\" }]\nclient_ca = \"empty.pem\"",
            format!("7: listeners[0].tls.client_ca: {}: holds no certificate", at("empty.pem")),
        ),
        (
            "certificates = [{ cert = \"site.pem\", key = \"site.key\" }]\nclient_ca = \"site.key\"",
            format!("7: listeners[0].tls.client_ca: {}: holds no certificate", at("site.key")),
        ),
    ] {
        let error = error_of(&pki, tls);
        assert!(error.starts_with(&want), "{error}\nwanted {want}");
    }
    // An absolute path is taken as it is.
    let absolute = format!(
        "certificates = [{{ cert = {:?}, key = {:?} }}]",
        at("site.pem"),
        "/nonexistent/site.key"
    );
    let error = error_of(&pki, &absolute);
    assert!(
        error.starts_with(&format!(
            "6: {key}.key: /nonexistent/site.key: cannot read it"
        )),
        "{error}"
    );
}

#[test]
fn tls_settings_errors_name_the_line_and_the_key() {
    let pki = Pki::new();
    pki.server("site", &["site.test"], None);
    let cert = r#"certificates = [{ cert = "site.pem", key = "site.key" }]"#;
    for (tls, want) in [
        ("min_version = \"1.3\"", "5: listeners[0].tls.certificates: TLS needs at least one certificate".to_owned()),
        ("certificates = []", "6: listeners[0].tls.certificates: TLS needs at least one certificate".into()),
        (r#"certificates = [{ cert = "site.pem" }]"#, "6: listeners[0].tls.certificates[0].key: every certificate needs cert and key files".into()),
        (&format!("{cert}\nmin_version = \"1.1\""), r#"7: listeners[0].tls.min_version: "1.1" is not a TLS version"#.into()),
        (&format!("{cert}\nmin_version = 1.3"), r#"7: listeners[0].tls.min_version: 1.3 is not a TLS version (use "1.2" or "1.3")"#.into()),
        (&format!("{cert}\nalpn = [\"spdy/3\"]"), r#"7: listeners[0].tls.alpn: "spdy/3" is not a protocol"#.into()),
        (&format!("{cert}\nalpn = [\"http/1.1\", \"http/1.1\"]"), "7: listeners[0].tls.alpn: http/1.1 is listed twice".into()),
        (&format!("{cert}\nclient_auth = \"optional\""), "7: listeners[0].tls.client_auth: client_auth needs client_ca".into()),
        (&format!("{cert}\nclient_ca = \"ca.pem\"\nclient_auth = \"maybe\""), r#"8: listeners[0].tls.client_auth: "maybe" is not a client_auth"#.into()),
        (
            r#"certificates = [{ cert = "site.pem", key = "site.key", default = true },
                              { cert = "site.pem", key = "site.key", default = true }]"#,
            "7: listeners[0].tls.certificates[1].default: listeners[0].tls.certificates[0] is already the default".into(),
        ),
        (&format!("{cert}\nsession_ticket = true"), "7: listeners[0].tls.session_ticket: unknown key \"session_ticket\"".into()),
        (&format!("{cert}\nsession_tickets = \"no\""), "7: listeners[0].tls.session_tickets: ".into()),
        (&format!("{cert}\nsession_ticket_lifetime = 300"), "7: listeners[0].tls.session_ticket_lifetime: 300 is not a duration".into()),
        (&format!("{cert}\nsession_ticket_lifetime = \"0s\""), r#"7: listeners[0].tls.session_ticket_lifetime: "0s" is zero"#.into()),
        (&format!("{cert}\nsession_ticket_lifetime = \"500ms\""), r#"7: listeners[0].tls.session_ticket_lifetime: "500ms" is outside 1s to 168h (7 days"#.into()),
        (&format!("{cert}\nsession_ticket_lifetime = \"169h\""), r#"7: listeners[0].tls.session_ticket_lifetime: "169h" is outside 1s to 168h"#.into()),
        (&format!("{cert}\nsession_ticket_lifetime = \"1500ms\""), r#"7: listeners[0].tls.session_ticket_lifetime: "1500ms" is not a whole number of seconds"#.into()),
        (
            &format!("{cert}\nsession_tickets = false\nsession_ticket_lifetime = \"1h\""),
            "8: listeners[0].tls.session_ticket_lifetime: session_tickets = false turns tickets off, so they have no lifetime (remove one of the two keys)".into(),
        ),
    ] {
        let error = error_of(&pki, tls);
        assert!(error.starts_with(&want), "{error}\nwanted {want}");
    }
}

#[test]
fn alpn_must_name_a_protocol_the_listener_serves() {
    let pki = Pki::new();
    pki.server("site", &["site.test"], None);
    let tls = "certificates = [{ cert = \"site.pem\", key = \"site.key\" }]\nalpn = [\"h2\"]";
    let path = pki.dir.join("capataz.toml");
    std::fs::write(&path, format!("{BASE}[listeners.tls]\n{tls}\n")).unwrap();
    let served = capataz::tls::Alpn::H2.served();
    match config::load(&path) {
        Ok(_) => assert!(served, "h2 alone is accepted only once HTTP/2 is served"),
        Err(error) => {
            assert!(!served);
            assert!(
                error.to_string().contains(
                    "listeners[0].tls.alpn: no protocol listed is one this listener serves (add \"http/1.1\")"
                ),
                "{error}"
            );
        }
    }
}

/// The config of a TLS listener serving `stem.pem` from `pki`, written beside it.
fn config_file(pki: &Pki, stem: &str) -> PathBuf {
    let path = pki.dir.join("capataz.toml");
    let tls = format!("certificates = [{{ cert = \"{stem}.pem\", key = \"{stem}.key\" }}]");
    std::fs::write(&path, format!("{BASE}[listeners.tls]\n{tls}\n")).unwrap();
    path
}

#[test]
fn check_warns_about_a_certificate_that_expires_within_30_days() {
    let pki = Pki::new();
    pki.server(
        "soon",
        &["soon.test"],
        Some(crate::support::tls::date_in(10)),
    );
    pki.server(
        "later",
        &["later.test"],
        Some(crate::support::tls::date_in(40)),
    );
    let later = config::load(&config_file(&pki, "later")).expect("valid");
    assert_eq!(check(&later), Vec::new(), "40 days left: no warning");
    let path = config_file(&pki, "soon");
    let soon = config::load(&path).expect("valid");
    let warnings = check(&soon);
    assert_eq!(warnings.len(), 1, "{warnings:?}");
    assert_eq!(warnings[0].key, "listeners[0].tls.certificates[0].cert");
    assert_eq!(warnings[0].line, Some(6));
    let soon_pem = pki.dir.join("soon.pem").display().to_string();
    assert!(
        warnings[0]
            .message
            .starts_with(&format!("{soon_pem}: the certificate expires on ")),
        "{}",
        warnings[0].message
    );
    assert!(
        warnings[0].message.contains(", in 9 days") || warnings[0].message.contains(", in 10 days")
    );

    // The same through the command line: printed with line and key, exit status 0 (valid).
    let out = Command::new(env!("CARGO_BIN_EXE_capataz"))
        .arg("check")
        .arg(&path)
        .output()
        .expect("run capataz check");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(0), "{stdout}");
    assert!(
        stdout.starts_with(&format!(
            "warning: {}:6: listeners[0].tls.certificates[0].cert: {soon_pem}: the certificate expires on",
            path.display()
        )),
        "{stdout}"
    );
}

/// The example of `[listeners.tls]` in docs/config.md validates, and names the files it says.
#[test]
fn the_documented_tls_example_is_valid() {
    let doc = include_str!("../../../../../docs/config.md");
    let section = &doc[doc.find("### `[listeners.tls]`").expect("the TLS section")..];
    let open = section.find("```toml\n").unwrap() + "```toml\n".len();
    let close = section[open..].find("```").unwrap();
    let text = format!(
        "{}\n[pools.web]\nbackends = [{{ address = \"127.0.0.1:9001\" }}]\n",
        &section[open..open + close]
    );
    let unresolved = config::parse_unresolved(&text, "/etc/capataz/capataz.toml").expect("valid");
    let files: Vec<String> = unresolved
        .files()
        .map(|p| p.display().to_string())
        .collect();
    assert_eq!(
        files,
        [
            "/etc/capataz/example.com.pem",
            "/etc/capataz/example.com.key",
            "/etc/capataz/api.pem",
            "/etc/capataz/api.key",
            "/etc/capataz/clients-ca.pem",
        ]
    );
    let tls = unresolved.config().listeners[0].tls.as_ref().expect("TLS");
    assert_eq!(tls.settings.min_version, capataz::tls::MinVersion::Tls12);
    assert_eq!(
        tls.settings.client_ca.as_ref().map(|c| c.1),
        Some(capataz::tls::ClientAuth::Required)
    );
}

#[test]
fn session_tickets_default_to_a_12_hour_lifetime_and_can_be_turned_off() {
    let pki = Pki::new();
    pki.server("site", &["site.test"], None);
    let cert = r#"certificates = [{ cert = "site.pem", key = "site.key" }]"#;
    let path = pki.dir.join("capataz.toml");
    let hour = std::time::Duration::from_secs(3600);
    for (lines, want) in [
        ("", Some(12 * hour)),
        ("session_tickets = true", Some(12 * hour)),
        ("session_ticket_lifetime = \"5m\"", Some(hour / 12)),
        ("session_ticket_lifetime = \"168h\"", Some(168 * hour)),
        ("session_tickets = false", None),
    ] {
        std::fs::write(&path, format!("{BASE}[listeners.tls]\n{cert}\n{lines}\n")).unwrap();
        let config = config::load(&path).expect("valid");
        let tls = config.listeners[0].tls.as_ref().unwrap();
        assert_eq!(tls.settings.session_tickets, want, "{lines}");
        let loaded = tls.loaded.as_ref().expect("loaded");
        assert_eq!(loaded.session_ticket_lifetime(), want, "{lines}");
    }
}
