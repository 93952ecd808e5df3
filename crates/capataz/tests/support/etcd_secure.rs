//! A real etcd (see `etcd.rs`) with TLS or authentication on its client port, the one capataz
//! is given: a test CA made by rcgen ([`start_tls`]: etcd's certificate for 127.0.0.1, a client
//! certificate for capataz, `--client-cert-auth`), and users set up with `etcdctl` through the
//! plain admin port ([`enable_auth`]: `root`, and a user who may only read one prefix).

use super::backends_tls::Pki;
use super::etcd::{Etcd, EtcdServerTls, EtcdSettings};

/// The password of etcd's `root` user (the test's `etcdctl` uses it once auth is on).
pub const ROOT_PASSWORD: &str = "root-pw-5c1e";

/// The user capataz authenticates as: it may read the prefix given to [`enable_auth`].
pub const USER: &str = "capataz";

/// [`USER`]'s password.
pub const PASSWORD: &str = "capataz-pw-a83f";

/// The files capataz is given for an etcd started by [`start_tls`].
pub struct EtcdFiles {
    /// The CA that signed etcd's certificate (and the client's).
    pub ca: String,
    /// capataz's client certificate and key.
    pub cert: String,
    pub key: String,
    /// Keeps the files for as long as the test runs.
    pub pki: Pki,
}

/// A fresh etcd serving TLS on its client port (`https://127.0.0.1:PORT`), asking for a client
/// certificate signed by the test's CA, run with `flags` too.
pub async fn start_tls(tag: &str, flags: &[&str]) -> (Etcd, EtcdFiles) {
    let pki = Pki::new(tag);
    let ca = pki.ca_file();
    // No extended key usage: the certificate serves as etcd's server certificate and as the
    // client certificate etcd's own JSON gateway presents when it dials etcd.
    let (cert, key) = pki.leaf_files("etcd", &["127.0.0.1"]);
    let (client_cert, client_key) = pki.leaf_files("capataz", &["capataz"]);
    let settings = EtcdSettings {
        tls: Some(EtcdServerTls {
            cert,
            key,
            client_ca: ca.clone(),
        }),
        flags: flags.iter().map(|f| (*f).to_owned()).collect(),
        user: None,
    };
    let etcd = Etcd::start_with(tag, settings).await;
    (
        etcd,
        EtcdFiles {
            ca,
            cert: client_cert,
            key: client_key,
            pki,
        },
    )
}

/// Turns etcd's authentication on: `root` (with [`ROOT_PASSWORD`], which the test's
/// `etcdctl` uses from now on) and [`USER`] (with [`PASSWORD`]), who may read the keys under
/// `prefix` and nothing else.
pub async fn enable_auth(etcd: &mut Etcd, prefix: &str) {
    let root = format!("root:{ROOT_PASSWORD}");
    let user = format!("{USER}:{PASSWORD}");
    etcd.must(&["user", "add", &root, "--interactive=false"])
        .await;
    etcd.must(&["role", "add", "root"]).await;
    etcd.must(&["user", "grant-role", "root", "root"]).await;
    etcd.must(&["role", "add", "reader"]).await;
    etcd.must(&[
        "role",
        "grant-permission",
        "reader",
        "--prefix=true",
        "read",
        prefix,
    ])
    .await;
    etcd.must(&["user", "add", &user, "--interactive=false"])
        .await;
    etcd.must(&["user", "grant-role", USER, "reader"]).await;
    etcd.must(&["auth", "enable"]).await;
    etcd.settings_mut().user = Some(root);
}
