//! Until a certificate is issued (here: the ACME server never answers), a handshake for an
//! ACME domain gets the listener's static default certificate if it has one, else fails
//! cleanly; a TLS-ALPN-01 handshake with no challenge pending fails; the failed orders are
//! counted; a hostile directory costs a bounded read and a failed order.

use super::*;

#[tokio::test]
async fn until_issued_an_acme_domain_gets_the_static_default_or_a_failed_handshake() {
    let pki = Pki::new();
    let (cert, key) = pki.server("site", &["site.test"], None);
    // Nothing listens there (held, so no other test's server comes to): every order fails at
    // once.
    let nobody = reserve_port();
    let dead = format!("https://127.0.0.1:{}/dir", nobody.port);
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
        let text = crate::support::balancer::metrics_text(&balancer);
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

/// A directory that answers with an endless body: the order fails after 1 MiB of it (the
/// client's bound), is counted, and the listener keeps serving its static certificate.
#[tokio::test]
async fn an_endless_directory_answer_fails_the_order_within_its_bound() {
    use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
    let pki = Pki::new();
    let (cert, key) = pki.server("site", &["site.test"], None);
    let hostile = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let hostile_addr = hostile.local_addr().unwrap();
    let written = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let server = {
        let written = written.clone();
        tokio::spawn(async move {
            while let Ok((mut socket, _)) = hostile.accept().await {
                let written = written.clone();
                tokio::spawn(async move {
                    let mut head = [0u8; 4096];
                    let _ = socket.read(&mut head).await;
                    let _ = socket
                        .write_all(b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\n\r\n")
                        .await;
                    let chunk = vec![b'['; 64 * 1024];
                    // At most 64 MiB, stopping when the client hangs up.
                    for _ in 0..1024 {
                        if socket.write_all(&chunk).await.is_err() {
                            break;
                        }
                        written.fetch_add(chunk.len(), std::sync::atomic::Ordering::Relaxed);
                    }
                });
            }
        })
    };
    let b = backends(&["a"]).await;
    let text = format!(
        "[[listeners]]\naddress = \"127.0.0.1:0\"\n{}\n\
         [listeners.tls.acme]\ndirectory = \"http://{hostile_addr}/dir\"\ndomains = [{DOMAIN:?}]\n\
         storage = {:?}\n\n[pools.web]\nbackends = [{{ name = \"a\", address = \"{}\" }}]\n",
        Pki::listener(&[(&cert, &key)], ""),
        pki.dir.join("acme").display().to_string(),
        b[0].addr()
    );
    let (balancer, _) = start(&text).await;
    crate::support::wait::wait_until("the failed order is counted", || {
        let text = crate::support::balancer::metrics_text(&balancer);
        text.contains("capataz_acme_orders_total{listener=\"listener-0\",result=\"failed\"} 1")
    })
    .await;
    let sent = written.load(std::sync::atomic::Ordering::Relaxed);
    assert!(
        sent < 32 << 20,
        "the client stopped reading early ({sent} bytes sent)"
    );
    let mut stream = Client::trusting(&pki)
        .connect(balancer.local_addrs()[0], "site.test")
        .await
        .expect("the static certificate still serves");
    assert!(get(&mut stream, "site.test").await.is_some());
    balancer.shutdown(Duration::from_secs(5)).await;
    server.abort();
}
