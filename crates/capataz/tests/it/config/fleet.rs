//! `[fleet]`: shared probing's settings, their defaults, the etcd access reused from the etcd
//! source (TLS files, credentials), and the mistakes refused, each naming its key.

use std::sync::Arc;
use std::time::Duration;

use super::*;
use crate::support::backends_tls::Pki;

const FLEET: &str = "[fleet]\nendpoints = [\"http://127.0.0.1:2379\"]\ngroup = \"edge\"\n";

#[test]
fn fleet_defaults() {
    let config = parse(MINIMAL);
    assert!(config.fleet.is_none(), "no [fleet]: no shared probing");
    let config = parse(&format!("{MINIMAL}{FLEET}"));
    let fleet = config.fleet.expect("[fleet]");
    assert_eq!(fleet.group, "edge");
    assert_eq!(fleet.prefix, "/capataz");
    assert_eq!(fleet.owners, 2);
    assert_eq!(fleet.lease_ttl, Duration::from_secs(10));
    assert_eq!(fleet.timeout, Duration::from_secs(2));
    assert_eq!(fleet.instance, None);
    assert_eq!(fleet.endpoints[0].port, 2379);
    assert!(fleet.endpoints[0].access.tls.is_none());
    let config = parse(&format!(
        "{MINIMAL}{FLEET}owners = 3\nlease_ttl = \"4s\"\ntimeout = \"500ms\"\n\
         instance = \"lb-1\"\nprefix = \"/lbs/\"\n"
    ));
    let fleet = config.fleet.expect("[fleet]");
    assert_eq!(
        (fleet.owners, fleet.lease_ttl, fleet.timeout),
        (3, Duration::from_secs(4), Duration::from_millis(500))
    );
    assert_eq!(fleet.instance.as_deref(), Some("lb-1"));
    assert_eq!(fleet.prefix, "/lbs");
}

#[test]
fn fleet_mistakes_name_their_key() {
    let cases: &[(&str, &str, &str)] = &[
        (
            "[fleet]\ngroup = \"edge\"\n",
            "fleet.endpoints",
            "endpoints",
        ),
        (
            "[fleet]\nendpoints = []\ngroup = \"edge\"\n",
            "fleet.endpoints",
            "1 to 16",
        ),
        (
            "[fleet]\nendpoints = [\"etcd:2379\"]\ngroup = \"edge\"\n",
            "fleet.endpoints[0]",
            "not an etcd endpoint",
        ),
        (
            "[fleet]\nendpoints = [\"http://127.0.0.1:2379\"]\n",
            "fleet.group",
            "needs its group",
        ),
        (
            "[fleet]\nendpoints = [\"http://127.0.0.1:2379\"]\ngroup = \"a/b\"\n",
            "fleet.group",
            "not a group name",
        ),
        ("owners = 0\n", "fleet.owners", ""),
        ("lease_ttl = \"1s\"\n", "fleet.lease_ttl", "at least 2s"),
        ("timeout = \"0s\"\n", "fleet.timeout", "is zero"),
        (
            "lease_ttl = \"4s\"\ntimeout = \"2s\"\n",
            "fleet.timeout",
            "not less than half of fleet.lease_ttl (4 s)",
        ),
        (
            "lease_ttl = \"3s\"\n",
            "fleet.timeout",
            "2 s is not less than half of fleet.lease_ttl (3 s)",
        ),
        (
            "instance = \"\"\n",
            "fleet.instance",
            "not an instance name",
        ),
        ("prefix = \"/\"\n", "fleet.prefix", "not a key prefix"),
        ("color = \"red\"\n", "fleet.color", "unknown key \"color\""),
        (
            "[fleet.tls]\nca_file = \"/ca.pem\"\n",
            "fleet.tls",
            "https:// endpoints",
        ),
        ("password = \"x\"\n", "fleet.password", "needs its user"),
        (
            "username = \"capataz\"\n",
            "fleet.password",
            "needs its password",
        ),
        (
            "username = \"capataz\"\npassword_file = \"/nonexistent/fleet-pw\"\n",
            "fleet.password_file",
            "/nonexistent/fleet-pw",
        ),
    ];
    for (table, key, says) in cases {
        let text = if table.starts_with("[fleet]") {
            format!("{MINIMAL}{table}")
        } else {
            format!("{MINIMAL}{FLEET}{table}")
        };
        let error = parse_str(&text, "config.toml").expect_err(&format!("refused: {table}"));
        assert!(
            error.key().contains(key),
            "{table}: key {:?}, want {key}: {error}",
            error.key()
        );
        assert!(error.to_string().contains(says), "{table}: {error}");
    }
}

#[test]
fn the_fleet_reuses_the_etcd_sources_tls_and_credentials() {
    let pki = Pki::new("fleet-config");
    pki.ca_file();
    pki.leaf_files("client", &["capataz"]);
    let secret = pki.write("fleet-password", "s3cret\n");
    let path = pki.write(
        "capataz.toml",
        &format!(
            "{MINIMAL}[fleet]\nendpoints = [\"https://127.0.0.1:2379\", \"https://etcd-2.test:2379\"]\n\
             group = \"edge\"\nusername = \"capataz\"\npassword_file = {secret:?}\n\
             [fleet.tls]\nca_file = \"ca.pem\"\ncert = \"client.pem\"\nkey = \"client.key\"\n"
        ),
    );
    let config = load(std::path::Path::new(&path)).expect("a valid config");
    let fleet = config.fleet.expect("[fleet]");
    let access = &fleet.endpoints[0].access;
    assert!(
        access
            .tls
            .as_ref()
            .and_then(|tls| tls.client.as_ref())
            .is_some(),
        "the TLS client was built"
    );
    let auth = access.auth.as_ref().expect("credentials");
    assert_eq!(
        (auth.username.as_str(), auth.password.as_str()),
        ("capataz", "s3cret")
    );
    assert!(Arc::ptr_eq(access, &fleet.endpoints[1].access));
    assert!(!format!("{fleet:?}").contains("s3cret"));
}
