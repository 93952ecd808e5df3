//! Automatic certificates end to end: a balancer whose listener has `[listeners.tls.acme]`
//! orders a certificate from a real ACME server, pebble (`support::pebble`), answering its
//! TLS-ALPN-01 challenge on the listener itself, serves it by SNI, stores it, serves the stored
//! one after a restart without the server, and renews it when `renew_before` says so; the
//! config's errors (`config.rs`), what is served before any certificate (`pending.rs`) and the
//! HTTP-01 challenge (`http01.rs`), the DNS-01 one by RFC 2136 updates (`dns01.rs`), and OCSP
//! stapling of the issued and renewed certificates (`stapling.rs`).

mod ari;
mod config;
mod dns01;
mod http01;
mod pending;
mod stapling;

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use capataz::server::Balancer;
use capataz::sim::SimBackend;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::CertificateDer;

use crate::support::balancer::{backends, start};
use crate::support::pebble::Pebble;
use crate::support::reserve_port;
use crate::support::tls::{get, Client, Pki};

const DOMAIN: &str = "acme.capataz.test";
/// Issuance takes a few round trips and a validation: far under this.
const ISSUANCE_DEADLINE: Duration = Duration::from_secs(60);

/// A balancer on 127.0.0.1:`port` with one backend and `[listeners.tls.acme]`.
async fn acme_balancer(
    port: u16,
    directory: &str,
    ca_file: &Path,
    storage: &Path,
    renew_before: &str,
) -> (Vec<SimBackend>, Balancer, String) {
    let b = backends(&["a"]).await;
    let text = format!(
        "[[listeners]]\naddress = \"127.0.0.1:{port}\"\n\
         [listeners.tls.acme]\ndirectory = {directory:?}\ndomains = [{DOMAIN:?}]\n\
         email = \"ops@capataz.test\"\nstorage = {storage:?}\nca_file = {ca_file:?}\n\
         renew_before = {renew_before:?}\n\n\
         [pools.web]\nbackends = [{{ name = \"a\", address = \"{}\" }}]\n",
        b[0].addr(),
        storage = storage.display().to_string(),
        ca_file = ca_file.display().to_string(),
    );
    let (balancer, _) = start(&text).await;
    (b, balancer, text)
}

/// A client trusting only the PEM root `root` (written to `dir`).
fn client_trusting(dir: &Path, root: &str) -> Client {
    let path = dir.join("pebble-root.pem");
    std::fs::write(&path, root).expect("write the root");
    let mut client = Client::trusting(&Pki::new());
    client.roots = path;
    client
}

/// The first certificate other than `first` that the listener at `addr` presents for `DOMAIN`,
/// verified as [`served`] does (waits for the renewal).
async fn renewed(client: &Client, addr: SocketAddr, pebble: &Pebble, first: &[u8]) -> Vec<u8> {
    let end = tokio::time::Instant::now() + ISSUANCE_DEADLINE;
    loop {
        let shown = served(client, addr, Some(pebble)).await;
        if shown != first {
            return shown;
        }
        assert!(
            tokio::time::Instant::now() < end,
            "the certificate was not renewed; pebble's log:\n{}",
            pebble.log()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// The serial-bearing first certificate the listener presents for `DOMAIN`, once its chain
/// verifies against `client`'s root (waits for the order to complete).
async fn served(client: &Client, addr: SocketAddr, pebble: Option<&Pebble>) -> Vec<u8> {
    let end = tokio::time::Instant::now() + ISSUANCE_DEADLINE;
    loop {
        if let Ok(Ok(mut stream)) =
            tokio::time::timeout(Duration::from_secs(5), client.connect(addr, DOMAIN)).await
        {
            let shown = stream.get_ref().1.peer_certificates().expect("a chain")[0].to_vec();
            let (head, _) = get(&mut stream, DOMAIN).await.expect("an answer");
            assert!(head.starts_with("http/1.1 200"), "{head}");
            return shown;
        }
        assert!(
            tokio::time::Instant::now() < end,
            "no certificate from the ACME server was served; pebble's log:\n{}",
            pebble.map(Pebble::log).unwrap_or_default()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

fn stored(storage: &Path) -> Vec<u8> {
    let chain = storage.join("certificate.pem");
    CertificateDer::pem_file_iter(&chain)
        .expect("the stored chain")
        .next()
        .expect("a certificate")
        .expect("PEM")
        .to_vec()
}

fn storage_dir(pebble: &Pebble) -> PathBuf {
    pebble.pki.dir.join("acme")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_certificate_is_ordered_served_by_sni_stored_kept_by_a_reload_and_served_after_a_restart_without_the_server(
) {
    // The balancer's port, held for the whole test: pebble validates against it, and the
    // balancer is started on it again.
    let reserved = reserve_port();
    let port = reserved.port;
    let pebble = Pebble::start(port, 90 * 86_400);
    // Outlives pebble's own directory: the storage, the roots the client trusts, the CA copy.
    let scratch = Pki::new();
    let storage = scratch.dir.join("acme");
    let ca_file = scratch.dir.join("pebble-ca.pem");
    std::fs::copy(pebble.pki.ca_path(), &ca_file).expect("copy the CA");
    let (_b, balancer, config_text) =
        acme_balancer(port, &pebble.directory, &ca_file, &storage, "720h").await;
    let addr = balancer.local_addrs()[0];
    let client = client_trusting(&scratch.dir, &pebble.root_pem());
    let issued = served(&client, addr, Some(&pebble)).await;
    // On disk: the same certificate, and its key readable by the owner alone.
    assert_eq!(stored(&storage), issued);
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt as _;
        let key = std::fs::metadata(storage.join("certificate.key")).expect("the stored key");
        assert_eq!(key.permissions().mode() & 0o777, 0o600);
        let account = std::fs::metadata(storage.join("account.json")).expect("the account");
        assert_eq!(account.permissions().mode() & 0o777, 0o600);
    }
    let text = crate::support::balancer::metrics_text(&balancer);
    assert!(
        text.contains("capataz_acme_orders_total{listener=\"listener-0\",result=\"issued\"} 1"),
        "{text}"
    );
    assert!(
        text.contains("capataz_tls_certificate_expiry_timestamp_seconds{listener=\"listener-0\""),
        "{text}"
    );
    // A reload reads the stored certificate again and keeps serving it, without a new order.
    balancer
        .reload(&crate::support::balancer::parse(&config_text))
        .await
        .expect("the reload applies");
    let mut stream = client
        .connect(addr, DOMAIN)
        .await
        .expect("after the reload");
    assert_eq!(
        stream.get_ref().1.peer_certificates().expect("a chain")[0].to_vec(),
        issued
    );
    assert!(get(&mut stream, DOMAIN).await.is_some());
    let orders = |result: &str| {
        let text = crate::support::balancer::metrics_text(&balancer);
        text.lines()
            .filter(|l| l.starts_with("capataz_acme_orders_total{") && l.contains(result))
            .count()
    };
    assert_eq!(orders("renewed"), 0);
    assert_eq!(orders("failed"), 0);
    balancer.shutdown(Duration::from_secs(5)).await;

    // The server is gone: a restart serves the stored certificate at once.
    let directory = pebble.directory.clone();
    drop(pebble);
    let (_b, balancer, _) = acme_balancer(port, &directory, &ca_file, &storage, "720h").await;
    let mut stream = client
        .connect(balancer.local_addrs()[0], DOMAIN)
        .await
        .expect("the stored certificate is served before any order");
    assert_eq!(
        stream.get_ref().1.peer_certificates().expect("a chain")[0].to_vec(),
        issued
    );
    assert!(get(&mut stream, DOMAIN).await.is_some());
    balancer.shutdown(Duration::from_secs(5)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stored_certificate_within_renew_before_is_renewed_with_a_new_serial() {
    // The balancer's port, held for the whole test: pebble validates against it, and the
    // balancer is started on it again.
    let reserved = reserve_port();
    let port = reserved.port;
    // Valid 10 days: renewing 30 days (720h) ahead means renewing the stored one at once.
    let pebble = Pebble::start(port, 10 * 86_400);
    let storage = storage_dir(&pebble);
    let client = client_trusting(&pebble.pki.dir, &pebble.root_pem());
    let (_b, balancer, _) = acme_balancer(
        port,
        &pebble.directory,
        &pebble.pki.ca_path(),
        &storage,
        "1h",
    )
    .await;
    let first = served(&client, balancer.local_addrs()[0], Some(&pebble)).await;
    balancer.shutdown(Duration::from_secs(5)).await;

    let (_b, balancer, _) = acme_balancer(
        port,
        &pebble.directory,
        &pebble.pki.ca_path(),
        &storage,
        "720h",
    )
    .await;
    let addr = balancer.local_addrs()[0];
    // The stored certificate serves at once, then its renewal replaces it on the same listener.
    let renewed = renewed(&client, addr, &pebble, &first).await;
    assert_ne!(serial(&renewed), serial(&first));
    assert_eq!(stored(&storage), renewed);
    balancer.shutdown(Duration::from_secs(5)).await;
}

/// A certificate's serial number (its bytes), read with a small DER walk: the
/// TBSCertificate's first INTEGER after the optional version.
fn serial(der: &[u8]) -> Vec<u8> {
    fn header(bytes: &[u8]) -> (u8, usize, usize) {
        let tag = bytes[0];
        let first = bytes[1] as usize;
        if first < 0x80 {
            (tag, 2, first)
        } else {
            let n = first & 0x7f;
            let len = bytes[2..2 + n]
                .iter()
                .fold(0usize, |a, b| a << 8 | *b as usize);
            (tag, 2 + n, len)
        }
    }
    let (_, h, _) = header(der); // Certificate SEQUENCE
    let tbs = &der[h..];
    let (_, h, _) = header(tbs); // TBSCertificate SEQUENCE
    let mut rest = &tbs[h..];
    let (tag, h, len) = header(rest);
    if tag == 0xa0 {
        rest = &rest[h + len..];
    }
    let (tag, h, len) = header(rest);
    assert_eq!(tag, 0x02, "a serial INTEGER");
    rest[h..h + len].to_vec()
}
