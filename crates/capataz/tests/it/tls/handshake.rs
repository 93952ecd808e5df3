//! Handshakes over TLS 1.2 and 1.3, the minimum version, and what reaches the backend.

use super::*;

#[tokio::test]
async fn tls12_and_tls13_clients_are_proxied_and_the_backend_sees_https() {
    let pki = Pki::new();
    let (cert, key) = pki.server("site", &["site.test"], None);
    let (b, balancer) = tls_balancer(&[(&cert, &key)], "", "").await;
    let addr = balancer.local_addrs()[0];
    for version in [&rustls::version::TLS12, &rustls::version::TLS13] {
        let client = Client::trusting(&pki).versions(&[version]);
        let mut stream = client.connect(addr, "site.test").await.expect("handshake");
        let (_, connection) = stream.get_ref();
        assert_eq!(connection.protocol_version(), Some(version.version));
        assert_eq!(
            connection.alpn_protocol(),
            Some(&b"http/1.1"[..]),
            "the client offered http/1.1 alone"
        );
        for _ in 0..2 {
            let (head, body) = get(&mut stream, "site.test").await.expect("an answer");
            assert!(head.starts_with("http/1.1 200"), "{head}");
            assert!(head.contains("x-seen-proto: https\r\n"), "{head}");
            assert!(head.contains("x-backend: a\r\n"), "{head}");
            assert!(!body.is_empty());
        }
    }
    assert_eq!(b[0].traffic_hits(), 4);
}

#[tokio::test]
async fn min_version_13_refuses_a_tls12_only_client() {
    let pki = Pki::new();
    let (cert, key) = pki.server("site", &["site.test"], None);
    let (b, balancer) = tls_balancer(&[(&cert, &key)], "min_version = \"1.3\"", "").await;
    let addr = balancer.local_addrs()[0];
    let old = Client::trusting(&pki).versions(&[&rustls::version::TLS12]);
    assert!(old.connect(addr, "site.test").await.is_err());
    let modern = Client::trusting(&pki).versions(&[&rustls::version::TLS13]);
    let mut stream = modern
        .connect(addr, "site.test")
        .await
        .expect("TLS 1.3 is fine");
    assert!(get(&mut stream, "site.test").await.is_some());
    assert_eq!(failures(&balancer, "incompatible"), 1.0);
    assert_eq!(b[0].traffic_hits(), 1);
}

#[tokio::test]
async fn a_client_offering_h2_gets_http2_over_tls_and_one_without_alpn_gets_http1() {
    let pki = Pki::new();
    let (cert, key) = pki.server("site", &["site.test"], None);
    let (b, balancer) = tls_balancer(&[(&cert, &key)], "", "").await;
    let mut client = Client::trusting(&pki);
    // As browsers and curl offer: h2 first. The listener's default order prefers h2 too.
    client.alpn = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
    let stream = client
        .connect(balancer.local_addrs()[0], "site.test")
        .await
        .expect("handshake");
    assert_eq!(stream.get_ref().1.alpn_protocol(), Some(&b"h2"[..]));
    let (mut sender, conn) = hyper::client::conn::http2::handshake(
        hyper_util::rt::TokioExecutor::new(),
        hyper_util::rt::TokioIo::new(stream),
    )
    .await
    .expect("HTTP/2 over TLS");
    let conn = tokio::spawn(conn);
    for _ in 0..3 {
        let request = hyper::Request::get("https://site.test/")
            .body(http_body_util::Empty::<bytes::Bytes>::new())
            .expect("a request");
        let answer = sender.send_request(request).await.expect("an answer");
        assert_eq!(answer.status(), 200);
        assert_eq!(answer.version(), hyper::Version::HTTP_2);
        assert_eq!(answer.headers()["x-seen-proto"], "https");
    }
    drop(sender);
    let _ = conn.await;
    // Without ALPN at all, HTTP/1.1 is assumed.
    client.alpn.clear();
    let mut stream = client
        .connect(balancer.local_addrs()[0], "site.test")
        .await
        .expect("handshake");
    assert!(get(&mut stream, "site.test").await.is_some());
    assert_eq!(b[0].traffic_hits(), 4);
}

#[tokio::test]
async fn the_expiry_of_each_certificate_is_a_metric() {
    let pki = Pki::new();
    let (cert, key) = pki.server("site", &["site.test"], Some((2044, 3, 1)));
    let (_b, balancer) = tls_balancer(&[(&cert, &key)], "", "").await;
    let series = format!(
        "capataz_tls_certificate_expiry_timestamp_seconds{{listener=\"listener-0\",certificate=\"{}\"}}",
        cert.display()
    );
    // 2044-03-01T00:00:00Z
    assert_eq!(metric(&balancer, &series), Some(2_340_403_200.0));
}
