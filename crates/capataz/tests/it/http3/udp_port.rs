//! An HTTP/3 UDP port that cannot be bound is an error, as a TCP one is: the start fails
//! naming the key and the port, and a reload onto it is refused, the old HTTP/3 endpoint
//! serving on.

use http::StatusCode;

use super::{udp_addr, SITE};
use crate::support::balancer::{backends, metrics_text, parse, ConfigText};
use crate::support::h3client::connect;
use crate::support::tls::Pki;
use capataz::server::Balancer;

/// The config text of a TLS listener on `127.0.0.1:0` with HTTP/3 (`http3`: its lines) over
/// `b`.
fn text(pki: &Pki, b: &[capataz::sim::SimBackend], http3: &str) -> String {
    let (cert, key) = pki.server("site", &[SITE], None);
    let listener = Pki::listener(
        &[(cert.as_path(), key.as_path())],
        &format!("[listeners.tls.http3]\n{http3}\n"),
    );
    ConfigText::sims(b).listener(&listener).build()
}

/// What capataz says of a UDP port another process holds.
fn in_use(port: u16) -> String {
    format!(
        "listeners[0].tls.http3.port: UDP 127.0.0.1:{port} (HTTP/3) is in use (another \
         process holds it: pick another port or stop it)"
    )
}

#[tokio::test]
async fn a_taken_udp_port_fails_the_start_naming_the_key_and_the_port() {
    let pki = Pki::new();
    let b = backends(&["a"]).await;
    let taken = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
    let port = taken.local_addr().unwrap().port();
    let config = parse(&text(&pki, &b, &format!("port = {port}")));
    let (events, _) = tokio::sync::broadcast::channel(64);
    let Err(error) = Balancer::start(&config, events).await else {
        panic!("the start fails");
    };
    assert_eq!(error.to_string(), in_use(port));
}

#[tokio::test]
async fn a_reload_onto_a_taken_udp_port_is_refused_and_http3_serves_on() {
    let pki = Pki::new();
    let b = backends(&["a"]).await;
    let config = parse(&text(&pki, &b, ""));
    let (events, _) = tokio::sync::broadcast::channel(64);
    let balancer = Balancer::start(&config, events).await.expect("starts");
    let addr = udp_addr(&balancer);
    let taken = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
    let port = taken.local_addr().unwrap().port();
    let moved = parse(&text(&pki, &b, &format!("port = {port}")));
    let Err(error) = balancer.supervisor().reload(&moved).await else {
        panic!("the reload is refused");
    };
    assert_eq!(error.to_string(), in_use(port));
    let metrics = metrics_text(&balancer);
    assert!(
        metrics.contains("capataz_config_reloads_total{result=\"failure\"} 1"),
        "{metrics}"
    );
    // The old endpoint serves on.
    let mut client = connect(&pki, addr, SITE)
        .await
        .expect("HTTP/3 on the old port");
    let answer = client.get(SITE, "/").await.expect("answer");
    assert_eq!(answer.head.status(), StatusCode::OK);
    // Once the port is free, the same reload applies and HTTP/3 moves there.
    drop(taken);
    balancer
        .supervisor()
        .reload(&moved)
        .await
        .expect("the reload applies");
    let moved_to = std::net::SocketAddr::new(addr.ip(), port);
    let mut client = connect(&pki, moved_to, SITE)
        .await
        .expect("HTTP/3 on the new port");
    let answer = client.get(SITE, "/").await.expect("answer");
    assert_eq!(answer.head.status(), StatusCode::OK);
}
