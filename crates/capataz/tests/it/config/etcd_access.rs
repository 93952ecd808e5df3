//! An etcd source's access: `https://` endpoints with `[pools.NAME.source.tls]` (files relative
//! to the config file, loaded once and shared by the endpoints), `username` with `password`
//! (from the environment) or `password_file`, the mistakes they refuse (each naming its key,
//! and its file when one cannot be read), the warning for a password sent in clear, and a
//! password that never shows in the config's `Debug`.

use std::sync::Arc;

use capataz::config::{parse_all_errors, Environment, EtcdSource, PoolSource};

use super::*;
use crate::support::backends_tls::Pki;

const POOL: &str = "[[listeners]]\naddress = \"127.0.0.1:8080\"\n\n[pools.web.source]\nkind = \"etcd\"\nprefix = \"/web/\"\n";

fn source_of(config: &Config) -> &EtcdSource {
    match &config.pools[0].source {
        PoolSource::Etcd(etcd) => etcd,
        other => panic!("an etcd source, not {other:?}"),
    }
}

#[test]
fn an_https_etcd_source_loads_its_files_relative_to_the_config_file_once_for_all_endpoints() {
    let pki = Pki::new("etcd-config");
    pki.ca_file();
    pki.leaf_files("client", &["capataz"]);
    let path = pki.write(
        "capataz.toml",
        &format!(
            "{POOL}endpoints = [\"https://127.0.0.1:2379\", \"https://etcd-2.test:2379\"]\n\
             [pools.web.source.tls]\nca_file = \"ca.pem\"\ncert = \"client.pem\"\n\
             key = \"client.key\"\nserver_name = \"etcd.test\"\n"
        ),
    );
    let config = load(std::path::Path::new(&path)).expect("a valid config");
    let etcd = source_of(&config);
    let dir = std::path::Path::new(&path).parent().expect("a directory");
    let tls = etcd.endpoints[0].access.tls.as_ref().expect("TLS on");
    assert_eq!(
        tls.ca_file.as_deref(),
        Some(dir.join("ca.pem").display().to_string().as_str())
    );
    assert_eq!(
        tls.cert.as_deref(),
        Some(dir.join("client.pem").display().to_string().as_str())
    );
    assert_eq!(tls.server_name.as_deref(), Some("etcd.test"));
    assert!(tls.client.is_some(), "the TLS client was not built");
    assert!(
        Arc::ptr_eq(&etcd.endpoints[0].access, &etcd.endpoints[1].access),
        "the endpoints of one source share one access (one token)"
    );
    assert!(etcd.endpoints[0].access.auth.is_none());
    // No tls table: https:// verifies with the system's roots, no client certificate.
    let unresolved = parse_all_errors(
        &format!("{POOL}endpoints = [\"https://127.0.0.1:2379\"]\n"),
        "config.toml",
        &Environment::from_pairs::<&str, &str>([]),
    )
    .expect("valid");
    let tls = source_of(unresolved.config()).endpoints[0]
        .access
        .tls
        .clone()
        .expect("TLS on");
    assert_eq!((tls.ca_file, tls.cert, tls.server_name), (None, None, None));
}

#[test]
fn etcd_access_mistakes_name_their_key() {
    const HTTPS: &str = "endpoints = [\"https://127.0.0.1:2379\"]\n";
    const HTTP: &str = "endpoints = [\"http://127.0.0.1:2379\"]\n";
    let cases: &[(String, &str, &str)] = &[
        (
            format!("{HTTP}[pools.web.source.tls]\nca_file = \"/ca.pem\"\n"),
            "pools.web.source.tls",
            "https:// endpoints",
        ),
        (
            format!("{HTTPS}[pools.web.source.tls]\nverify = false\n"),
            "pools.web.source.tls.verify",
            "always verified",
        ),
        (
            format!("{HTTPS}[pools.web.source.tls]\ncert = \"/c.pem\"\n"),
            "pools.web.source.tls.key",
            "private key",
        ),
        (
            format!("{HTTPS}[pools.web.source.tls]\nserver_name = \"not a name\"\n"),
            "pools.web.source.tls.server_name",
            "not a DNS name",
        ),
        (
            format!("{HTTPS}[pools.web.source.tls]\nca_file = \"/nonexistent/etcd-ca.pem\"\n"),
            "pools.web.source.tls.ca_file",
            "/nonexistent/etcd-ca.pem",
        ),
        (
            format!("{HTTP}password = \"x\"\n"),
            "pools.web.source.password",
            "needs its user",
        ),
        (
            format!("{HTTP}username = \"capataz\"\n"),
            "pools.web.source.password",
            "needs its password",
        ),
        (
            format!("{HTTP}username = \"capataz\"\npassword = \"x\"\npassword_file = \"/p\"\n"),
            "pools.web.source.password_file",
            "keep one",
        ),
        (
            format!("{HTTP}username = \"capataz\"\npassword = \"\"\n"),
            "pools.web.source.password",
            "1 to",
        ),
        (
            format!("{HTTP}username = \"\"\npassword = \"x\"\n"),
            "pools.web.source.username",
            "1 to",
        ),
        (
            format!("{HTTP}username = \"capataz\"\npassword_file = \"/nonexistent/etcd-pw\"\n"),
            "pools.web.source.password_file",
            "/nonexistent/etcd-pw",
        ),
    ];
    for (table, key, says) in cases {
        let text = format!("{POOL}{table}");
        let error = parse_str(&text, "config.toml").expect_err(&format!("refused: {table}"));
        assert!(
            error.key().contains(key),
            "{table}: key {:?}, want {key}: {error}",
            error.key()
        );
        assert!(error.to_string().contains(says), "{table}: {error}");
    }
    // The keys belong to etcd sources only.
    let dns = "[[listeners]]\naddress = \"127.0.0.1:8080\"\n\n[pools.web.source]\nkind = \"dns\"\n\
               name = \"web.test\"\nport = 80\nusername = \"capataz\"\n";
    let error = parse_str(dns, "config.toml").expect_err("username on a dns source");
    assert!(error.key().contains("username"), "{error}");
}

#[test]
fn an_etcd_password_comes_from_the_environment_or_a_file_and_never_shows_in_debug() {
    let text = format!(
        "{POOL}endpoints = [\"http://127.0.0.1:2379\"]\nusername = \"capataz\"\n\
         password = \"${{ETCD_PASSWORD}}\"\n"
    );
    let unresolved = parse_all_errors(
        &text,
        "config.toml",
        &Environment::from_pairs([("ETCD_PASSWORD", "from-the-env-7d1f")]),
    )
    .expect("valid");
    let auth = source_of(unresolved.config()).endpoints[0]
        .access
        .auth
        .clone()
        .expect("credentials");
    assert_eq!(
        (auth.username.as_str(), auth.password.as_str()),
        ("capataz", "from-the-env-7d1f")
    );
    assert!(!format!("{:?}", unresolved.config()).contains("from-the-env-7d1f"));

    let pki = Pki::new("etcd-password");
    pki.write("etcd-password", "from-a-file-93ac\n");
    let path = pki.write(
        "capataz.toml",
        &format!(
            "{POOL}endpoints = [\"http://127.0.0.1:2379\"]\nusername = \"capataz\"\n\
             password_file = \"etcd-password\"\n"
        ),
    );
    let config = load(std::path::Path::new(&path)).expect("a valid config");
    let auth = source_of(&config).endpoints[0]
        .access
        .auth
        .clone()
        .expect("credentials");
    assert_eq!(
        auth.password, "from-a-file-93ac",
        "the line break is not part of it"
    );
    assert!(!format!("{config:?}").contains("from-a-file-93ac"));
    // An empty file is refused, naming the key.
    pki.write("etcd-password", "\n");
    let error = load(std::path::Path::new(&path)).expect_err("an empty password");
    assert!(error.key().contains("password_file"), "{error}");
}

#[test]
fn a_password_sent_in_clear_beyond_loopback_is_warned_about() {
    let warned = |endpoint: &str| -> Vec<String> {
        let config = parse(&format!(
            "{POOL}endpoints = [\"{endpoint}\"]\nusername = \"capataz\"\npassword = \"x\"\n"
        ));
        check(&config).iter().map(|w| w.key.clone()).collect()
    };
    assert_eq!(
        warned("http://10.0.0.5:2379"),
        ["pools.web.source.username"]
    );
    assert!(warned("http://127.0.0.1:2379").is_empty());
}
