//! Reloading certificates: new handshakes get the new ones, established connections keep
//! working, and a bad file keeps the old ones whole.

use capataz::config;

use super::*;

/// A balancer started from a config file (so that it can reload it) whose TLS listener
/// serves `site.pem`/`site.key` from `pki`'s directory, named relative to the file.
async fn from_file(pki: &Pki, backend: &SimBackend) -> (Balancer, std::path::PathBuf) {
    let text = ConfigText::sims(std::slice::from_ref(backend))
        .listener("[listeners.tls]\ncertificates = [{ cert = \"site.pem\", key = \"site.key\" }]\n")
        .build();
    let path = pki.dir.join("capataz.toml");
    std::fs::write(&path, text).unwrap();
    let config = config::load(&path).expect("valid");
    let (events, _) = tokio::sync::broadcast::channel(64);
    let balancer = Balancer::start_with_path(&config, events, Some(path.clone()))
        .await
        .expect("starts");
    (balancer, path)
}

#[tokio::test]
async fn a_reload_swaps_the_certificates_for_new_handshakes_and_keeps_established_connections() {
    let pki = Pki::new();
    let (old_cert, _) = pki.server("site", &["site.test"], None);
    let old = std::fs::read(&old_cert).unwrap();
    let b = backends(&["a"]).await;
    let (balancer, _) = from_file(&pki, &b[0]).await;
    let addr = balancer.local_addrs()[0];
    let client = Client::trusting(&pki);
    let mut established = client.connect(addr, "site.test").await.expect("handshake");
    assert!(get(&mut established, "site.test").await.is_some());

    // Renewed in place, as certbot does, then reloaded.
    let (new_cert, _) = pki.server("site", &["site.test"], None);
    assert_ne!(std::fs::read(&new_cert).unwrap(), old, "a new certificate");
    balancer
        .supervisor()
        .reload_from_file()
        .await
        .expect("the reload applies");

    let fresh = client.connect(addr, "site.test").await.expect("handshake");
    assert!(presented(&fresh, &new_cert));
    // The connection made before the reload still has its certificate and still works.
    let (_, connection) = established.get_ref();
    assert_eq!(
        connection.peer_certificates().unwrap()[0].as_ref(),
        pem_der(&old)
    );
    for _ in 0..2 {
        let (head, _) = get(&mut established, "site.test")
            .await
            .expect("still served");
        assert!(head.starts_with("http/1.1 200"), "{head}");
    }
}

#[tokio::test]
async fn a_reload_with_a_bad_key_fails_whole_and_keeps_the_old_certificates() {
    let pki = Pki::new();
    let (cert, key) = pki.server("site", &["site.test"], None);
    let b = backends(&["a"]).await;
    let (balancer, path) = from_file(&pki, &b[0]).await;
    let addr = balancer.local_addrs()[0];
    let client = Client::trusting(&pki);
    let before = client.connect(addr, "site.test").await.expect("handshake");
    assert!(presented(&before, &cert));

    // A new certificate whose key is another one's: a mismatch.
    let good_key = std::fs::read(&key).unwrap();
    let (new_cert, _) = pki.server("site", &["site.test"], None);
    std::fs::write(&key, &good_key).unwrap();
    let error = balancer
        .supervisor()
        .reload_from_file()
        .await
        .expect_err("refused")
        .to_string();
    let want = format!(
        "{}:6: listeners[0].tls.certificates[0].key: {}: does not match the certificate in {}",
        path.display(),
        key.display(),
        new_cert.display()
    );
    assert!(error.starts_with(&want), "{error}\nwanted {want}");
    let after = client.connect(addr, "site.test").await.expect("handshake");
    assert!(!presented(&after, &new_cert));
    assert_eq!(
        after.get_ref().1.peer_certificates().unwrap()[0],
        before.get_ref().1.peer_certificates().unwrap()[0],
        "the old certificate is still served"
    );
    // Garbage in the key file is refused the same way.
    std::fs::write(&key, b"not a key").unwrap();
    let error = balancer
        .supervisor()
        .reload_from_file()
        .await
        .expect_err("refused")
        .to_string();
    assert!(error.contains("holds no private key"), "{error}");
    let mut after = client.connect(addr, "site.test").await.expect("handshake");
    assert!(get(&mut after, "site.test").await.is_some());
}

/// The DER of the first certificate in PEM `bytes`.
fn pem_der(bytes: &[u8]) -> Vec<u8> {
    use rustls::pki_types::pem::PemObject;
    rustls::pki_types::CertificateDer::from_pem_slice(bytes)
        .unwrap()
        .to_vec()
}
