//! Choosing a certificate by SNI, and client certificates (mTLS).

use super::*;

#[tokio::test]
async fn sni_picks_the_certificate_naming_the_host_and_unknown_names_get_the_default() {
    let pki = Pki::new();
    let default = pki.server("default", &["default.test"], None);
    let wildcard = pki.server("wildcard", &["*.example.com"], None);
    let api = pki.server("api", &["api.example.com"], None);
    let files = [
        (default.0.as_path(), default.1.as_path()),
        (wildcard.0.as_path(), wildcard.1.as_path()),
        (api.0.as_path(), api.1.as_path()),
    ];
    let (_b, balancer) = tls_balancer(&files, "", "").await;
    let addr = balancer.local_addrs()[0];
    let client = Client::trusting(&pki);
    for (sni, want) in [
        ("api.example.com", &api.0),
        ("www.example.com", &wildcard.0),
        ("default.test", &default.0),
    ] {
        let stream = client.connect(addr, sni).await.expect("handshake");
        assert!(presented(&stream, want), "{sni} got another certificate");
    }
    // An unknown name, a name a wildcard does not cover, or no SNI (an IP address) get the
    // default, which a verifying client refuses (it names none of them).
    let any = Client::trusting(&pki).insecure();
    for sni in [
        "unknown.test",
        "a.b.example.com",
        "example.com",
        "127.0.0.1",
    ] {
        let stream = any.connect(addr, sni).await.expect("handshake");
        assert!(
            presented(&stream, &default.0),
            "{sni} got another certificate"
        );
        assert!(client.connect(addr, sni).await.is_err(), "{sni}");
    }
}

#[tokio::test]
async fn the_certificate_marked_default_is_served_for_unknown_names() {
    let pki = Pki::new();
    let first = pki.server("first", &["first.test"], None);
    let second = pki.server("second", &["second.test"], None);
    let b = backends(&["a"]).await;
    let text = ConfigText::sims(&b)
        .listener(&format!(
            "[listeners.tls]\ncertificates = [{{ cert = {:?}, key = {:?} }}, \
             {{ cert = {:?}, key = {:?}, default = true }}]\n",
            first.0.display().to_string(),
            first.1.display().to_string(),
            second.0.display().to_string(),
            second.1.display().to_string(),
        ))
        .build();
    let (balancer, _) = start(&text).await;
    let client = Client::trusting(&pki).insecure();
    let addr = balancer.local_addrs()[0];
    for sni in ["unknown.test", "127.0.0.1", "second.test"] {
        let stream = client.connect(addr, sni).await.expect("handshake");
        assert!(presented(&stream, &second.0), "{sni}");
    }
    let stream = client.connect(addr, "first.test").await.expect("handshake");
    assert!(presented(&stream, &first.0));
}

#[tokio::test]
async fn mtls_required_refuses_a_client_without_a_certificate_and_accepts_one_signed_by_the_ca() {
    let pki = Pki::new();
    let (cert, key) = pki.server("site", &["site.test"], None);
    let ca = format!("client_ca = {:?}", pki.ca_path().display().to_string());
    let (b, balancer) = tls_balancer(&[(&cert, &key)], &ca, "").await;
    let addr = balancer.local_addrs()[0];
    for version in [&rustls::version::TLS12, &rustls::version::TLS13] {
        let anonymous = Client::trusting(&pki).versions(&[version]);
        // TLS 1.2 fails the handshake; TLS 1.3 completes the client's side and then the
        // server's refusal closes the connection before any answer.
        if let Ok(mut stream) = anonymous.connect(addr, "site.test").await {
            assert_eq!(get(&mut stream, "site.test").await, None);
        }
        let stranger = Pki::new();
        let forged = Client::trusting(&pki)
            .versions(&[version])
            .identity(stranger.client("eve"));
        if let Ok(mut stream) = forged.connect(addr, "site.test").await {
            assert_eq!(get(&mut stream, "site.test").await, None);
        }
        let known = Client::trusting(&pki)
            .versions(&[version])
            .identity(pki.client("alice"));
        let mut stream = known.connect(addr, "site.test").await.expect("handshake");
        let (head, _) = get(&mut stream, "site.test").await.expect("an answer");
        assert!(head.starts_with("http/1.1 200"), "{head}");
    }
    assert_eq!(
        b[0].traffic_hits(),
        2,
        "only the clients with a certificate got through"
    );
    assert_eq!(failures(&balancer, "client_certificate"), 4.0);
}

#[tokio::test]
async fn mtls_optional_lets_a_client_without_a_certificate_in_but_not_a_forged_one() {
    let pki = Pki::new();
    let (cert, key) = pki.server("site", &["site.test"], None);
    let lines = format!(
        "client_ca = {:?}\nclient_auth = \"optional\"",
        pki.ca_path().display().to_string()
    );
    let (b, balancer) = tls_balancer(&[(&cert, &key)], &lines, "").await;
    let addr = balancer.local_addrs()[0];
    let mut anonymous = Client::trusting(&pki)
        .connect(addr, "site.test")
        .await
        .expect("handshake");
    assert!(get(&mut anonymous, "site.test").await.is_some());
    let stranger = Pki::new();
    let forged = Client::trusting(&pki).identity(stranger.client("eve"));
    if let Ok(mut stream) = forged.connect(addr, "site.test").await {
        assert_eq!(get(&mut stream, "site.test").await, None);
    }
    assert_eq!(b[0].traffic_hits(), 1);
}
