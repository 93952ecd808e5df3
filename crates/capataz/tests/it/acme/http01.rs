//! HTTP-01: a TLS listener with `challenge = "http-01"` gets its certificate from pebble,
//! which validates on the balancer's plaintext listener; and what a plaintext listener answers
//! under `/.well-known/acme-challenge/` (a pending token to GET and HEAD, 405 to other methods,
//! anything else routed as before), where a TLS listener answers nothing of it; and
//! `https_redirect`, which sends every other request of a plaintext listener to HTTPS.

use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};

use super::*;
use crate::support::raw::roundtrip;

/// A plaintext listener on 127.0.0.1:`http_port` and a TLS listener with ACME by HTTP-01.
async fn http01_balancer(
    http_port: u16,
    pebble: &Pebble,
    storage: &Path,
    renew_before: &str,
) -> (Vec<SimBackend>, Balancer) {
    let b = backends(&["a"]).await;
    let text = format!(
        "[[listeners]]\nname = \"plain\"\naddress = \"127.0.0.1:{http_port}\"\n\n\
         [[listeners]]\nname = \"https\"\naddress = \"127.0.0.1:0\"\n\
         [listeners.tls.acme]\ndirectory = {directory:?}\ndomains = [{DOMAIN:?}]\n\
         storage = {storage:?}\nca_file = {ca_file:?}\nchallenge = \"http-01\"\n\
         renew_before = {renew_before:?}\n\n\
         [pools.web]\nbackends = [{{ name = \"a\", address = \"{}\" }}]\n",
        b[0].addr(),
        directory = pebble.directory,
        storage = storage.display().to_string(),
        ca_file = pebble.pki.ca_path().display().to_string(),
    );
    let (balancer, _) = start(&text).await;
    (b, balancer)
}

fn orders(balancer: &Balancer, line: &str) -> bool {
    crate::support::balancer::metrics_text(balancer).contains(line)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_certificate_is_issued_by_http01_on_the_plaintext_listener_stored_served_and_renewed() {
    // The balancer's plaintext port, held for the whole test: pebble validates against it,
    // and the balancer is started on it again.
    let reserved = crate::support::reserve_port();
    let http_port = reserved.port;
    // Valid 10 days: a restart with renew_before = 720h renews it at once.
    let pebble = Pebble::start_http01(http_port, 10 * 86_400);
    let storage = storage_dir(&pebble);
    let client = client_trusting(&pebble.pki.dir, &pebble.root_pem());
    let (b, balancer) = http01_balancer(http_port, &pebble, &storage, "1h").await;
    let https = balancer.local_addrs()[1];
    let first = served(&client, https, Some(&pebble)).await;
    assert_eq!(stored(&storage), first);
    assert!(orders(
        &balancer,
        "capataz_acme_orders_total{listener=\"https\",result=\"issued\"} 1"
    ));
    // pebble's TLS-ALPN-01 port has nothing behind it: it validated on the plaintext
    // listener, which answered the validation itself (GET, 2xx, by capataz, before routing).
    let text = crate::support::balancer::metrics_text(&balancer);
    assert!(
        text.lines()
            .any(|l| l.starts_with("capataz_client_requests_total{")
                && l.contains("listener=\"plain\"")
                && l.contains("method=\"GET\"")
                && l.contains("class=\"2xx\"")
                && l.contains("answered_by=\"capataz\"")),
        "{text}"
    );
    // The order is over: no token is pending, and the path goes to routing again.
    assert!(balancer.supervisor().http01().is_empty());
    let plain = balancer.local_addrs()[0];
    let before = b[0].traffic_hits();
    let reply = roundtrip(
        plain,
        b"GET /.well-known/acme-challenge/gone HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n",
    )
    .await
    .expect("an answer");
    assert_eq!((reply.status, reply.body.as_slice()), (200, &b"a\n"[..]));
    assert_eq!(b[0].traffic_hits(), before + 1);
    balancer.shutdown(Duration::from_secs(5)).await;

    // The renewal goes through the same path: a new certificate, validated by HTTP-01 again.
    let (_b, balancer) = http01_balancer(http_port, &pebble, &storage, "720h").await;
    let https = balancer.local_addrs()[1];
    let renewed = renewed(&client, https, &pebble, &first).await;
    assert_ne!(serial(&renewed), serial(&first));
    assert_eq!(stored(&storage), renewed);
    crate::support::wait::wait_until("the renewal is counted", || {
        orders(
            &balancer,
            "capataz_acme_orders_total{listener=\"https\",result=\"renewed\"} 1",
        )
    })
    .await;
    balancer.shutdown(Duration::from_secs(5)).await;
}

#[tokio::test]
async fn a_pending_token_is_answered_before_routing_to_get_and_head_on_plaintext_listeners_only() {
    let pki = Pki::new();
    let (cert, key) = pki.server("site", &["site.test"], None);
    let b = backends(&["a"]).await;
    let text = format!(
        "[[listeners]]\naddress = \"127.0.0.1:0\"\nh2c = true\n\n\
         [[listeners]]\naddress = \"127.0.0.1:0\"\n{}\n\
         [pools.web]\nbackends = [{{ name = \"a\", address = \"{}\" }}]\n",
        Pki::listener(&[(&cert, &key)], ""),
        b[0].addr()
    );
    let (balancer, _) = start(&text).await;
    let (plain, tls) = (balancer.local_addrs()[0], balancer.local_addrs()[1]);
    let owner = balancer.supervisor().http01().owner();
    let token = "Xm-2_tq9kR4aBcDeFgHiJkLmNoPqRsTuVwXyZ012345";
    let key_authorization = format!("{token}.thumbprint_Q");
    owner.set(token, &key_authorization);
    let path = format!("/.well-known/acme-challenge/{token}");
    let ask = |method: &str, path: &str| {
        format!("{method} {path} HTTP/1.1\r\nHost: {DOMAIN}\r\nConnection: close\r\n\r\n")
    };

    let get = roundtrip(plain, ask("GET", &path).as_bytes())
        .await
        .expect("an answer");
    assert_eq!(get.status, 200, "{}", get.head);
    assert_eq!(get.body, key_authorization.as_bytes());
    assert!(get
        .head
        .to_ascii_lowercase()
        .contains("content-type: application/octet-stream"));

    // HEAD: the same head, no body.
    let mut stream = tokio::net::TcpStream::connect(plain).await.unwrap();
    stream
        .write_all(ask("HEAD", &path).as_bytes())
        .await
        .unwrap();
    let mut answer = Vec::new();
    tokio::time::timeout(crate::support::DEADLINE, stream.read_to_end(&mut answer))
        .await
        .expect("closed in time")
        .unwrap();
    let answer = String::from_utf8_lossy(&answer).to_ascii_lowercase();
    assert!(answer.starts_with("http/1.1 200"), "{answer}");
    assert!(
        answer.contains(&format!("content-length: {}", key_authorization.len())),
        "{answer}"
    );
    assert!(answer.ends_with("\r\n\r\n"), "no body: {answer:?}");

    // Another method on the token: 405, Allow, and the backend never sees it.
    let post = format!(
        "POST {path} HTTP/1.1\r\nHost: {DOMAIN}\r\nContent-Length: 3\r\nConnection: close\r\n\r\nabc"
    );
    let post = roundtrip(plain, post.as_bytes()).await.expect("an answer");
    assert_eq!(post.status, 405, "{}", post.head);
    assert!(post.head.to_ascii_lowercase().contains("allow: get, head"));
    assert_eq!(b[0].traffic_hits(), 0, "nothing so far reached the backend");

    // Over h2c too.
    let mut h2 = crate::support::h2client::connect(plain).await;
    let answer = h2.get(DOMAIN, &path).await;
    assert_eq!(answer.status, 200);
    assert_eq!(answer.text(), key_authorization);

    // Anything else under the prefix is routed as before: other tokens, a long or odd one,
    // the token with a suffix, the prefix alone.
    let long = format!("/.well-known/acme-challenge/{}", "A".repeat(8000));
    let odd = format!("/.well-known/acme-challenge/{token}%2F..%00");
    let suffixed = format!("{path}/");
    for other in [
        "/.well-known/acme-challenge/other",
        "/.well-known/acme-challenge/",
        long.as_str(),
        odd.as_str(),
        suffixed.as_str(),
    ] {
        let before = b[0].traffic_hits();
        let reply = roundtrip(plain, ask("GET", other).as_bytes())
            .await
            .expect("an answer");
        assert_eq!((reply.status, reply.body.as_slice()), (200, &b"a\n"[..]));
        assert_eq!(b[0].traffic_hits(), before + 1, "{other} was routed");
    }

    // A TLS listener does not answer challenges: the request is routed.
    let client = Client::trusting(&pki);
    let mut stream = client.connect(tls, "site.test").await.expect("handshake");
    stream
        .write_all(ask("GET", &path).as_bytes())
        .await
        .unwrap();
    let mut answer = Vec::new();
    let _ = tokio::time::timeout(crate::support::DEADLINE, stream.read_to_end(&mut answer))
        .await
        .expect("closed in time");
    let answer = String::from_utf8_lossy(&answer);
    assert!(answer.ends_with("\r\n\r\na\n"), "{answer}");

    // Once its task lets go of it, the token is routed like any path.
    drop(owner);
    let reply = roundtrip(plain, ask("GET", &path).as_bytes())
        .await
        .expect("an answer");
    assert_eq!((reply.status, reply.body.as_slice()), (200, &b"a\n"[..]));
    balancer.shutdown(Duration::from_secs(5)).await;
}

#[tokio::test]
async fn https_redirect_sends_every_request_but_a_pending_token_to_https_with_its_path() {
    let b = backends(&["a"]).await;
    let text = |extra: &str| {
        format!(
            "[[listeners]]\naddress = \"127.0.0.1:0\"\nh2c = true\n{extra}\n\
             [pools.web]\nbackends = [{{ name = \"a\", address = \"{}\" }}]\n",
            b[0].addr()
        )
    };
    let (balancer, _) = start(&text("https_redirect = true")).await;
    let plain = balancer.local_addrs()[0];
    let cases = [
        (
            "GET /a/b?x=1&y=%20 HTTP/1.1\r\nHost: Site.test:8080\r\n",
            308,
            Some("https://Site.test/a/b?x=1&y=%20"),
        ),
        (
            "POST /form HTTP/1.1\r\nHost: [::1]:80\r\nContent-Length: 0\r\n",
            308,
            Some("https://[::1]/form"),
        ),
        (
            "GET http://abs.test/p HTTP/1.1\r\nHost: abs.test\r\n",
            308,
            Some("https://abs.test/p"),
        ),
        (
            "OPTIONS * HTTP/1.1\r\nHost: site.test\r\n",
            308,
            Some("https://site.test/"),
        ),
        ("GET / HTTP/1.0\r\n", 400, None),
        (
            "GET / HTTP/1.1\r\nHost: a.test\r\nHost: b.test\r\n",
            400,
            None,
        ),
        ("GET / HTTP/1.1\r\nHost: a/b\r\n", 400, None),
    ];
    for (head, status, location) in cases {
        let request = format!("{head}Connection: close\r\n\r\n");
        let reply = roundtrip(plain, request.as_bytes())
            .await
            .expect("an answer");
        assert_eq!(reply.status, status, "{head}: {}", reply.head);
        assert_eq!(
            crate::support::raw::header(&reply.head, "location"),
            location,
            "{head}"
        );
    }
    // Over h2c, with the :authority.
    let mut h2 = crate::support::h2client::connect(plain).await;
    let answer = h2.get("h2.test:81", "/q?z").await;
    assert_eq!(answer.status, 308);
    assert_eq!(answer.header("location"), Some("https://h2.test/q?z"));
    // A pending HTTP-01 token is answered, not redirected.
    let owner = balancer.supervisor().http01().owner();
    owner.set("tok", "tok.key");
    let reply = roundtrip(
        plain,
        b"GET /.well-known/acme-challenge/tok HTTP/1.1\r\nHost: x.test\r\nConnection: close\r\n\r\n",
    )
    .await
    .expect("an answer");
    assert_eq!(
        (reply.status, reply.body.as_slice()),
        (200, &b"tok.key"[..])
    );
    assert_eq!(b[0].traffic_hits(), 0, "nothing was routed");
    balancer.shutdown(Duration::from_secs(5)).await;

    // Another port is written in the Location.
    let (balancer, _) = start(&text("https_redirect = true\nhttps_redirect_port = 8443")).await;
    let reply = roundtrip(
        balancer.local_addrs()[0],
        b"GET /p HTTP/1.1\r\nHost: site.test\r\nConnection: close\r\n\r\n",
    )
    .await
    .expect("an answer");
    assert_eq!(
        crate::support::raw::header(&reply.head, "location"),
        Some("https://site.test:8443/p")
    );
    balancer.shutdown(Duration::from_secs(5)).await;
}
