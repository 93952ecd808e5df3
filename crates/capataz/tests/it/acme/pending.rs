//! Until a certificate is issued (here: the ACME server never answers), a handshake for an
//! ACME domain gets the listener's static default certificate if it has one, else fails
//! cleanly; a TLS-ALPN-01 handshake with no challenge pending fails; the failed orders are
//! counted.

use super::*;

#[tokio::test]
async fn until_issued_an_acme_domain_gets_the_static_default_or_a_failed_handshake() {
    let pki = Pki::new();
    let (cert, key) = pki.server("site", &["site.test"], None);
    // Nothing listens there: every order fails at once.
    let dead = format!("https://127.0.0.1:{}/dir", free_tcp_port());
    let acme = format!(
        "[listeners.tls.acme]\ndirectory = {dead:?}\ndomains = [{DOMAIN:?}]\nstorage = {:?}\n",
        pki.dir.join("acme").display().to_string()
    );
    let b = backends(&["a"]).await;
    let with_static = format!(
        "[[listeners]]\naddress = \"127.0.0.1:0\"\n{}\n{acme}\n\
         [pools.web]\nbackends = [{{ name = \"a\", address = \"{}\" }}]\n",
        Pki::listener(&[(&cert, &key)], ""),
        b[0].addr()
    );
    let (balancer, _) = start(&with_static).await;
    let addr = balancer.local_addrs()[0];
    let client = Client::trusting(&pki);
    let mut stream = client
        .insecure()
        .connect(addr, DOMAIN)
        .await
        .expect("the static default");
    assert!(crate::support::tls::presented(&stream, &cert));
    assert!(get(&mut stream, DOMAIN).await.is_some());
    let mut validator = Client::trusting(&pki).insecure();
    validator.alpn = vec![b"acme-tls/1".to_vec()];
    assert!(
        validator.connect(addr, DOMAIN).await.is_err(),
        "no challenge is pending"
    );
    crate::support::wait::wait_until("a failed order is counted", || {
        let text = balancer
            .shared()
            .metrics()
            .render(
                &balancer.pools(),
                None,
                capataz::metrics::Format::OpenMetrics,
            )
            .expect("metrics");
        text.contains("capataz_acme_orders_total{listener=\"listener-0\",result=\"failed\"} 1")
    })
    .await;
    balancer.shutdown(Duration::from_secs(5)).await;

    let alone = format!(
        "[[listeners]]\naddress = \"127.0.0.1:0\"\n{acme}\n\
         [pools.web]\nbackends = [{{ name = \"a\", address = \"{}\" }}]\n",
        b[0].addr()
    );
    let (balancer, _) = start(&alone).await;
    let result = Client::trusting(&pki)
        .insecure()
        .connect(balancer.local_addrs()[0], DOMAIN)
        .await;
    assert!(result.is_err(), "no certificate yet: the handshake fails");
    balancer.shutdown(Duration::from_secs(5)).await;
}
