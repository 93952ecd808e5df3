//! `[listeners.tls.acme]` in the config: each invalid setting is an error naming the line and
//! the key; a listener may have ACME alone, or beside static certificates.

use std::path::Path;

use capataz::config;

use super::*;

const BASE: &str = "[pools.web]\nbackends = [{ address = \"127.0.0.1:9001\" }]\n\
                    [[listeners]]\naddress = \"127.0.0.1:8443\"\n";

/// The config with `acme` after `[listeners.tls.acme]` (starting on line 6), written in `dir`.
fn load(dir: &Path, acme: &str) -> Result<config::Config, String> {
    let path = dir.join("capataz.toml");
    std::fs::write(&path, format!("{BASE}[listeners.tls.acme]\n{acme}\n")).unwrap();
    config::load(&path).map_err(|error| {
        let error = error.to_string();
        let prefix = format!("{}:", path.display());
        assert!(error.starts_with(&prefix), "{error}");
        error[prefix.len()..].to_owned()
    })
}

const GOOD: &str = "directory = \"https://127.0.0.1:14000/dir\"\ndomains = [\"a.test\"]\n\
                    storage = \"acme\"";

#[test]
fn acme_settings_errors_name_the_line_and_the_key() {
    let pki = Pki::new();
    let at = "listeners[0].tls.acme";
    for (acme, want) in [
        (
            "domains = [\"a.test\"]\nstorage = \"s\"".to_owned(),
            format!("5: {at}.directory: ACME needs directory"),
        ),
        (
            "directory = \"ftp://x\"\ndomains = [\"a.test\"]\nstorage = \"s\"".into(),
            format!(r#"6: {at}.directory: "ftp://x" is not an http(s) URL"#),
        ),
        (
            "directory = \"https://x/d\"\nstorage = \"s\"".into(),
            format!("5: {at}.domains: ACME needs domains"),
        ),
        (
            "directory = \"https://x/d\"\ndomains = []\nstorage = \"s\"".into(),
            format!("7: {at}.domains: list between 1 and 100 domain names"),
        ),
        (
            "directory = \"https://x/d\"\ndomains = [\"*.a.test\"]\nstorage = \"s\"".into(),
            format!("7: {at}.domains: *.a.test is a wildcard, which only DNS-01 can prove"),
        ),
        (
            "directory = \"https://x/d\"\ndomains = [\"a.*.test\"]\nstorage = \"s\"".into(),
            format!(r#"7: {at}.domains: "a.*.test" is not a DNS name capataz can order"#),
        ),
        (
            "directory = \"https://x/d\"\ndomains = [\"127.0.0.1\"]\nstorage = \"s\"".into(),
            format!(r#"7: {at}.domains: "127.0.0.1" is not a DNS name"#),
        ),
        (
            "directory = \"https://x/d\"\ndomains = [\"a.test\", \"A.test.\"]\nstorage = \"s\""
                .into(),
            format!("7: {at}.domains: a.test is listed twice"),
        ),
        (
            "directory = \"https://x/d\"\ndomains = [\"a.test\"]".into(),
            format!("5: {at}.storage: ACME needs storage"),
        ),
        (
            format!("{GOOD}\nemail = \"nobody\""),
            format!(r#"9: {at}.email: "nobody" is not an e-mail address"#),
        ),
        (
            format!("{GOOD}\nchallenge = \"dns-02\""),
            format!(
                r#"9: {at}.challenge: "dns-02" is not a challenge capataz answers (use "tls-alpn-01", "http-01" or "dns-01")"#
            ),
        ),
        (
            // The only listener is the TLS one: nowhere to answer HTTP-01.
            format!("{GOOD}\nchallenge = \"http-01\""),
            format!("9: {at}.challenge: http-01 is answered on the plaintext listeners"),
        ),
        (
            format!("{GOOD}\nrenew_before = \"30d\""),
            format!("9: {at}.renew_before:"),
        ),
        (
            format!("{GOOD}\nrenew_before = \"0s\""),
            format!("9: {at}.renew_before:"),
        ),
        (
            format!("{GOOD}\nca_file = \"missing.pem\""),
            format!("9: {at}.ca_file: {}", pki.dir.join("missing.pem").display()),
        ),
        (
            format!("{GOOD}\nhttp_port = 80"),
            format!("9: {at}.http_port: unknown key \"http_port\""),
        ),
    ] {
        let error = load(&pki.dir, &acme).expect_err(&acme);
        assert!(error.starts_with(&want), "{error}\nwanted {want}");
    }
}

/// `GOOD` with `challenge = "dns-01"` (line 9) and a `[listeners.tls.acme.dns01]` table
/// (line 10) holding `dns01` (from line 11).
fn with_dns01(dns01: &str) -> String {
    format!("{GOOD}\nchallenge = \"dns-01\"\n[listeners.tls.acme.dns01]\n{dns01}")
}

const DNS01_GOOD: &str = "server = \"127.0.0.1:5353\"\ntsig_key = \"acme-key.\"\n\
                          tsig_secret_file = \"tsig.secret\"";

#[test]
fn dns01_settings_errors_name_the_line_and_the_key() {
    let pki = Pki::new();
    std::fs::write(pki.dir.join("tsig.secret"), "AAECAwQFBgcICQoLDA0ODxA=\n").unwrap();
    std::fs::write(pki.dir.join("not-base64.secret"), "not base64!\n").unwrap();
    let at = "listeners[0].tls.acme";
    for (acme, want) in [
        (
            format!("{GOOD}\nchallenge = \"dns-01\""),
            format!("5: {at}.dns01: dns-01 publishes its TXT records by RFC 2136 updates"),
        ),
        (
            format!("{GOOD}\n[listeners.tls.acme.dns01]\n{DNS01_GOOD}"),
            // The table's own line.
            format!("9: {at}.dns01: [listeners.tls.acme.dns01] is for challenge = \"dns-01\", and the challenge is tls-alpn-01"),
        ),
        (
            with_dns01("tsig_key = \"k\"\ntsig_secret_file = \"tsig.secret\""),
            format!("10: {at}.dns01.server: DNS-01 needs server"),
        ),
        (
            with_dns01("server = \"ns.example.com\"\ntsig_key = \"k\"\ntsig_secret_file = \"s\""),
            format!(r#"11: {at}.dns01.server: "ns.example.com" is not an IP address"#),
        ),
        (
            with_dns01("server = \"127.0.0.1\"\ntsig_secret_file = \"tsig.secret\""),
            format!("10: {at}.dns01.tsig_key: DNS-01 needs tsig_key"),
        ),
        (
            with_dns01("server = \"127.0.0.1\"\ntsig_key = \"a b\"\ntsig_secret_file = \"s\""),
            format!(r#"12: {at}.dns01.tsig_key: "a b" is not a DNS name"#),
        ),
        (
            with_dns01("server = \"127.0.0.1\"\ntsig_key = \"k\""),
            format!("10: {at}.dns01.tsig_secret_file: DNS-01 needs tsig_secret_file"),
        ),
        (
            with_dns01(&format!("{DNS01_GOOD}\ntsig_algorithm = \"hmac-md5\"")),
            format!(r#"14: {at}.dns01.tsig_algorithm: "hmac-md5" is not a TSIG algorithm"#),
        ),
        (
            with_dns01(&format!("{DNS01_GOOD}\nzone = \"a..b\"")),
            format!(r#"14: {at}.dns01.zone: "a..b" is not a DNS name"#),
        ),
        (
            with_dns01(&format!("{DNS01_GOOD}\nttl = \"1500ms\"")),
            format!("14: {at}.dns01.ttl: must be whole seconds, at most 24h"),
        ),
        (
            with_dns01(&format!("{DNS01_GOOD}\npropagation_timeout = \"48h\"")),
            format!("14: {at}.dns01.propagation_timeout: must be whole seconds, at most 24h"),
        ),
        (
            with_dns01(&format!("{DNS01_GOOD}\npropagation_timeout = \"0s\"")),
            format!("14: {at}.dns01.propagation_timeout:"),
        ),
        (
            with_dns01(&format!("{DNS01_GOOD}\nsecret = \"x\"")),
            format!("14: {at}.dns01.secret: unknown key \"secret\""),
        ),
        (
            with_dns01("server = \"127.0.0.1\"\ntsig_key = \"k\"\ntsig_secret_file = \"missing.secret\""),
            format!(
                "13: {at}.dns01.tsig_secret_file: {}: cannot read the secret",
                pki.dir.join("missing.secret").display()
            ),
        ),
        (
            with_dns01("server = \"127.0.0.1\"\ntsig_key = \"k\"\ntsig_secret_file = \"not-base64.secret\""),
            format!(
                "13: {at}.dns01.tsig_secret_file: {}: the TSIG secret is not base64",
                pki.dir.join("not-base64.secret").display()
            ),
        ),
    ] {
        let error = load(&pki.dir, &acme).expect_err(&acme);
        assert!(error.starts_with(&want), "{error}\nwanted {want}");
    }
}

#[test]
fn dns01_settings_are_read_with_their_defaults_and_the_secret_decoded() {
    let pki = Pki::new();
    std::fs::write(pki.dir.join("tsig.secret"), "AAECAwQFBgcICQoLDA0ODxA=\n").unwrap();
    let config = load(
        &pki.dir,
        &with_dns01(&format!(
            "{DNS01_GOOD}\nzone = \"Example.COM.\"\ntsig_algorithm = \"hmac-sha512\""
        )),
    )
    .expect("valid");
    let acme = config.listeners[0]
        .tls
        .as_ref()
        .unwrap()
        .settings
        .acme
        .as_ref()
        .unwrap();
    assert_eq!(acme.challenge, capataz::tls::acme::Challenge::Dns01);
    let dns01 = acme.dns01.as_ref().expect("dns01");
    assert_eq!(dns01.server, "127.0.0.1:5353".parse().unwrap());
    assert_eq!(dns01.zone.as_deref(), Some("example.com"));
    assert_eq!(dns01.tsig_key, "acme-key");
    assert_eq!(
        dns01.tsig_algorithm,
        capataz::tls::acme::TsigAlgorithm::HmacSha512
    );
    assert_eq!(dns01.tsig_secret.0, (0u8..=16).collect::<Vec<u8>>());
    assert_eq!(dns01.ttl, Duration::from_secs(60));
    assert_eq!(dns01.propagation_timeout, Duration::from_secs(60));
    // A wildcard with DNS-01, and port 53 when none is written.
    let config = load(
        &pki.dir,
        &with_dns01(
            "server = \"192.0.2.53\"\ntsig_key = \"k\"\ntsig_secret_file = \"tsig.secret\"",
        )
        .replace("[\"a.test\"]", "[\"*.a.test\", \"a.test\"]"),
    )
    .expect("valid");
    let acme = config.listeners[0]
        .tls
        .as_ref()
        .unwrap()
        .settings
        .acme
        .as_ref()
        .unwrap();
    assert_eq!(acme.domains, ["*.a.test", "a.test"]);
    assert_eq!(
        acme.dns01.as_ref().unwrap().server,
        "192.0.2.53:53".parse().unwrap()
    );
}

#[test]
fn acme_alone_or_beside_static_certificates_is_valid_and_paths_are_relative_to_the_config() {
    let pki = Pki::new();
    let config = load(
        &pki.dir,
        &format!(
            "{GOOD}\nemail = \"mailto:ops@a.test\"\nca_file = \"ca.pem\"\nrenew_before = \"240h\""
        ),
    )
    .expect("valid");
    let tls = config.listeners[0].tls.as_ref().expect("TLS");
    let acme = tls.settings.acme.as_ref().expect("ACME");
    assert!(tls.settings.certificates.is_empty());
    assert_eq!(acme.domains, ["a.test"]);
    assert_eq!(acme.email.as_deref(), Some("ops@a.test"));
    assert_eq!(acme.storage, pki.dir.join("acme"));
    assert_eq!(acme.ca_file, Some(pki.ca_path()));
    assert_eq!(acme.renew_before, Duration::from_secs(240 * 3600));
    let defaults = load(&pki.dir, GOOD).expect("valid");
    let acme = defaults.listeners[0]
        .tls
        .as_ref()
        .unwrap()
        .settings
        .acme
        .clone()
        .unwrap();
    assert_eq!(acme.renew_before, Duration::from_secs(30 * 86_400));
    assert_eq!(acme.email, None);
    assert_eq!(acme.ca_file, None);
    // Beside a static certificate: the [listeners.tls] table has both.
    pki.server("site", &["site.test"], None);
    let path = pki.dir.join("both.toml");
    std::fs::write(
        &path,
        format!(
            "{BASE}[listeners.tls]\ncertificates = [{{ cert = \"site.pem\", key = \"site.key\" }}]\n\
             [listeners.tls.acme]\n{GOOD}\n"
        ),
    )
    .unwrap();
    let both = config::load(&path).expect("valid");
    let tls = both.listeners[0].tls.as_ref().unwrap();
    assert_eq!(tls.settings.certificates.len(), 1);
    assert!(tls.settings.acme.is_some());
}

/// The example of `[listeners.tls.acme]` in docs/config.md validates.
#[test]
fn the_documented_acme_example_is_valid() {
    let doc = include_str!("../../../../../docs/config.md");
    let section = &doc[doc
        .find("### `[listeners.tls.acme]`")
        .expect("the ACME section")..];
    let open = section.find("```toml\n").unwrap() + "```toml\n".len();
    let close = section[open..].find("```").unwrap();
    let text = format!(
        "{}\n[pools.web]\nbackends = [{{ address = \"127.0.0.1:9001\" }}]\n",
        &section[open..open + close]
    );
    let unresolved = config::parse_unresolved(&text, "/etc/capataz/capataz.toml").expect("valid");
    let tls = unresolved.config().listeners[0].tls.as_ref().expect("TLS");
    let acme = tls.settings.acme.as_ref().expect("ACME");
    assert_eq!(acme.storage, Path::new("/var/lib/capataz/acme"));
    assert_eq!(acme.domains, ["example.com", "www.example.com"]);
}

#[test]
fn the_documented_dns01_example_is_valid() {
    let doc = include_str!("../../../../../docs/config.md");
    let section = &doc[doc
        .find("#### `[listeners.tls.acme.dns01]`")
        .expect("the DNS-01 section")..];
    let open = section.find("```toml\n").unwrap() + "```toml\n".len();
    let close = section[open..].find("```").unwrap();
    let text = format!(
        "[[listeners]]\naddress = \"0.0.0.0:443\"\n{}\n\
         [pools.web]\nbackends = [{{ address = \"127.0.0.1:9001\" }}]\n",
        &section[open..open + close]
    );
    let unresolved = config::parse_unresolved(&text, "/etc/capataz/capataz.toml").expect("valid");
    let tls = unresolved.config().listeners[0].tls.as_ref().expect("TLS");
    let acme = tls.settings.acme.as_ref().expect("ACME");
    assert_eq!(acme.domains, ["*.example.com", "example.com"]);
    let dns01 = acme.dns01.as_ref().expect("dns01");
    assert_eq!(dns01.server, "192.0.2.53:53".parse().unwrap());
    assert_eq!(dns01.tsig_key, "capataz-acme");
}

#[test]
fn http01_is_valid_beside_a_plaintext_listener_and_warns_without_one_on_port_80() {
    use capataz::tls::acme::Challenge;
    let pki = Pki::new();
    let path = pki.dir.join("http01.toml");
    let text = |plain: &str| {
        format!(
            "[pools.web]\nbackends = [{{ address = \"127.0.0.1:9001\" }}]\n\
             [[listeners]]\naddress = \"{plain}\"\n\
             [[listeners]]\naddress = \"127.0.0.1:8443\"\n\
             [listeners.tls.acme]\n{GOOD}\nchallenge = \"http-01\"\n"
        )
    };
    std::fs::write(&path, text("127.0.0.1:8080")).unwrap();
    let config = config::load(&path).expect("valid");
    let acme = config.listeners[1]
        .tls
        .as_ref()
        .unwrap()
        .settings
        .acme
        .clone();
    assert_eq!(acme.expect("ACME").challenge, Challenge::Http01);
    let warnings = config::check(&config);
    let warning = warnings
        .iter()
        .find(|w| w.key == "listeners[1].tls.acme.challenge")
        .expect("a warning about port 80");
    assert_eq!(warning.line, Some(11));
    assert!(warning.message.contains("port 80"), "{}", warning.message);
    std::fs::write(&path, text("127.0.0.1:80")).unwrap();
    let config = config::load(&path).expect("valid");
    assert!(config::check(&config)
        .iter()
        .all(|w| !w.key.ends_with("acme.challenge")));
}

#[test]
fn https_redirect_errors_name_the_line_and_the_key() {
    let pki = Pki::new();
    let path = pki.dir.join("redirect.toml");
    for (listener, want) in [
        (
            "address = \"127.0.0.1:8443\"\nhttps_redirect = true\n[listeners.tls.acme]\n"
                .to_owned()
                + GOOD,
            "5: listeners[0].https_redirect: a TLS listener already speaks HTTPS",
        ),
        (
            "address = \"127.0.0.1:8080\"\nhttps_redirect_port = 8443".to_owned(),
            "5: listeners[0].https_redirect_port: https_redirect_port needs https_redirect = true",
        ),
        (
            "address = \"127.0.0.1:8080\"\nhttps_redirect = true\nhttps_redirect_port = 0"
                .to_owned(),
            "6: listeners[0].https_redirect_port: 0 is out of range",
        ),
    ] {
        std::fs::write(
            &path,
            format!(
                "[pools.web]\nbackends = [{{ address = \"127.0.0.1:9001\" }}]\n[[listeners]]\n{listener}\n"
            ),
        )
        .unwrap();
        let error = config::load(&path).expect_err(&listener).to_string();
        let at = format!("{}:{want}", path.display());
        assert!(error.starts_with(&at), "{error}\nwanted {at}");
    }
}
