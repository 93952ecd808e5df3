//! A real nginx (1.22 on Debian 12, `support::nginx`) behind capataz, as HTTP/2 over TLS, as
//! h2c and as HTTP/1.1: what capataz sends must be what a real server takes. nginx refuses an
//! HTTP/2 request carrying both `:authority` and `host` ("client sent duplicate host header",
//! 400), so the host goes as `:authority` alone (RFC 9113 section 8.3.1), carrying what an
//! HTTP/1.1 backend gets as `Host`. Each answer says what nginx saw.

use bytes::Bytes;
use http::Method;

use crate::support::backends_tls::Pki;
use crate::support::balancer::{start, ConfigText};
use crate::support::client::Client;
use crate::support::h2client::{connect, empty, request};
use crate::support::nginx::{Nginx, BIG_BODY_BYTES};
use crate::support::DEADLINE;

/// A balancer (its listener also speaking h2c) over pool `web` of `backends`, with `pool`
/// lines; no probes, nothing ejected.
async fn balancer_over(
    backends: &[(String, std::net::SocketAddr)],
    pool: &str,
) -> capataz::server::Balancer {
    let text = ConfigText::new(backends)
        .listener("h2c = true")
        .extra(&format!(
            "active.kind = \"none\"\npassive.consecutive_errors = 1000\n{pool}"
        ))
        .build();
    start(&text).await.0
}

/// Requests through `balancer` from an HTTP/1.1 client (`Host: app.test:8080`) and an HTTP/2
/// client (`:authority` `app.test`), and nginx's account of each: `protocol` and `scheme` as
/// nginx saw them, and the host the client named. Then `/big` over HTTP/2, whole.
async fn nginx_sees_the_clients_host(
    balancer: &capataz::server::Balancer,
    nginx: &Nginx,
    protocol: &str,
    scheme: &str,
) {
    let addr = balancer.local_addrs()[0];
    let mut client = Client::new(addr);
    for _ in 0..3 {
        let answer = client
            .send("GET", "/one?q=1", "app.test:8080", Bytes::new())
            .await;
        assert_eq!(
            (answer.status, answer.text()),
            (
                200,
                format!("host=app.test:8080 protocol={protocol} scheme={scheme} uri=/one?q=1\n")
            ),
            "nginx's error log: {}",
            nginx.error_log()
        );
    }
    let mut h2 = connect(addr).await;
    for _ in 0..3 {
        let answer = h2.get("app.test", "/two").await;
        assert_eq!(
            (answer.status.as_u16(), answer.text()),
            (
                200,
                format!("host=app.test protocol={protocol} scheme={scheme} uri=/two\n")
            ),
            "nginx's error log: {}",
            nginx.error_log()
        );
    }
    let big = h2
        .send(request(Method::GET, "app.test", "/big", empty()))
        .await
        .expect("/big answered");
    assert_eq!(big.status.as_u16(), 200);
    assert_eq!(big.body.len(), BIG_BODY_BYTES);
    assert!(
        !nginx.error_log().contains("duplicate host"),
        "{}",
        nginx.error_log()
    );
}

#[tokio::test]
async fn h2_over_tls_to_nginx_sends_authority_without_a_duplicate_host() {
    let pki = Pki::new("nginx-h2");
    let nginx = Nginx::start("h2", &pki);
    let pool = format!("protocol = \"h2\"\ntls.ca_file = \"{}\"\n", pki.ca_file());
    let balancer = balancer_over(&[("nginx".into(), nginx.tls_addr())], &pool).await;
    nginx_sees_the_clients_host(&balancer, &nginx, "HTTP/2.0", "https").await;
    balancer.shutdown(DEADLINE).await;
}

#[tokio::test]
async fn h2c_to_nginx_sends_authority_without_a_duplicate_host() {
    let pki = Pki::new("nginx-h2c");
    let nginx = Nginx::start("h2c", &pki);
    let balancer = balancer_over(
        &[("nginx".into(), nginx.h2c_addr())],
        "protocol = \"h2c\"\n",
    )
    .await;
    nginx_sees_the_clients_host(&balancer, &nginx, "HTTP/2.0", "http").await;
    balancer.shutdown(DEADLINE).await;
}

#[tokio::test]
async fn http1_to_nginx_keeps_the_clients_host() {
    let pki = Pki::new("nginx-h1");
    let nginx = Nginx::start("h1", &pki);
    let balancer = balancer_over(&[("nginx".into(), nginx.http1_addr())], "").await;
    nginx_sees_the_clients_host(&balancer, &nginx, "HTTP/1.1", "http").await;
    balancer.shutdown(DEADLINE).await;
}

/// A request that could not be sent to one backend (its connect refused) goes to the next
/// with the client's host as its `:authority` still, not the first backend's address nor the
/// next one's.
#[tokio::test]
async fn a_request_sent_on_to_nginx_after_a_refused_connect_keeps_its_host() {
    let pki = Pki::new("nginx-retry");
    let nginx = Nginx::start("retry", &pki);
    // A port nobody listens on: held, never listening, so connects are refused.
    let dead = crate::support::reserve_port();
    let dead_addr = std::net::SocketAddr::from(([127, 0, 0, 1], dead.port));
    let balancer = balancer_over(
        &[
            ("dead".into(), dead_addr),
            ("nginx".into(), nginx.h2c_addr()),
        ],
        "protocol = \"h2c\"\nretries.attempts = 1\nretries.min_budget = 1000\n",
    )
    .await;
    let mut client = Client::new(balancer.local_addrs()[0]);
    for _ in 0..6 {
        let answer = client
            .send("POST", "/up", "app.test:8080", Bytes::from_static(b"body"))
            .await;
        assert_eq!(
            (answer.status, answer.text()),
            (
                200,
                "host=app.test:8080 protocol=HTTP/2.0 scheme=http uri=/up\n".to_owned()
            ),
            "nginx's error log: {}",
            nginx.error_log()
        );
    }
    let dead_tries = balancer.pool("web").expect("pool web").backends[0]
        .traffic
        .recent();
    assert!(!dead_tries.is_empty(), "the dead backend was tried first");
    balancer.shutdown(DEADLINE).await;
}
