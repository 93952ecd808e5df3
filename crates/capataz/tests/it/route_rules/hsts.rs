//! HSTS on a TLS listener: every answer (the backend's and capataz's own) carries the
//! listener's `Strict-Transport-Security`, replacing a backend's; with a request id, the
//! `%{tls_version}` and `%{tls_sni}` variables are filled from the handshake.

use super::*;
use crate::support::balancer::start;
use crate::support::tls::{get, Client as TlsClient, Pki};

#[tokio::test]
async fn a_tls_listener_with_hsts_sends_it_on_every_answer() {
    let echo = echo_backend("web1").await;
    let pki = Pki::new();
    let (cert, key) = pki.server("site", &["site.test"], None);
    let text = format!(
        r#"
[[listeners]]
address = "127.0.0.1:0"
[listeners.request_headers]
set = {{ "X-Tls" = "%{{tls_version}} %{{tls_sni}} %{{scheme}}" }}
{tls}
  [[listeners.routes]]
  pool = "web"

{pool}"#,
        tls = Pki::listener(
            &[(&cert, &key)],
            "hsts = { max_age = \"8760h\", include_subdomains = true, preload = true }"
        ),
        pool = pool("web", echo.addr),
    );
    let (balancer, _rx) = start(&text).await;
    let client = TlsClient::trusting(&pki);
    let mut stream = client
        .connect(balancer.local_addrs()[0], "site.test")
        .await
        .expect("handshake");
    let (head, body) = get(&mut stream, "site.test").await.expect("an answer");
    assert!(
        head.contains(
            "\r\nstrict-transport-security: max-age=31536000; includesubdomains; preload\r\n"
        ),
        "{head}"
    );
    assert_eq!(
        echoed(&body, "x-tls"),
        ["TLSv1.3 site.test https"],
        "{body}"
    );
    // capataz's own answer (a Host that is not one: 400) carries it too.
    let mut stream = client
        .connect(balancer.local_addrs()[0], "site.test")
        .await
        .expect("handshake");
    let (head, _) = get(&mut stream, "bad host").await.expect("an answer");
    assert!(head.starts_with("http/1.1 400"), "{head}");
    assert!(
        head.contains("\r\nstrict-transport-security: max-age=31536000;"),
        "{head}"
    );
}

#[test]
fn hsts_preload_needs_subdomains_and_a_year() {
    let text = |hsts: &str| {
        format!(
            "[[listeners]]\naddress = \"127.0.0.1:8443\"\n[listeners.tls]\n\
             certificates = [{{ cert = \"a.pem\", key = \"a.key\" }}]\n{hsts}\n\
             [pools.web]\nbackends = [{{ address = \"127.0.0.1:9001\" }}]\n"
        )
    };
    let error = capataz::config::parse_unresolved(&text("hsts = { preload = true }"), "c.toml")
        .expect_err("preload without include_subdomains");
    assert_eq!(error.line(), Some(5), "{error}");
    assert!(error.key().ends_with("tls.hsts.preload"), "{error}");
    let error = capataz::config::parse_unresolved(&text("hsts = { max_age = \"1x\" }"), "c.toml")
        .expect_err("a bad duration");
    assert!(error.key().ends_with("tls.hsts.max_age"), "{error}");
    let error = capataz::config::parse_unresolved(&text("hsts = { maxage = \"1h\" }"), "c.toml")
        .expect_err("an unknown key");
    assert!(error.to_string().contains("maxage"), "{error}");
}
