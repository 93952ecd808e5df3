//! An HTTP/3 listener's certificates (SNI, reload), its idle timeout, Retry, and shutdown.

use std::time::Duration;

use capataz::config;
use capataz::server::Balancer;
use capataz::sim::Mode;
use http::StatusCode;

use super::{h3_balancer, udp_addr, SITE};
use crate::support::balancer::{backends, metrics_text, ConfigText};
use crate::support::h3client::{connect, presented};
use crate::support::tls::Pki;
use crate::support::wait::wait_until;
use crate::support::DEADLINE;

#[tokio::test]
async fn sni_and_a_reload_of_the_certificates_apply_to_new_quic_connections() {
    let pki = Pki::new();
    let (old_cert, _) = pki.server("site", &[SITE], None);
    let (other, _) = pki.server("other", &["other.test"], None);
    let b = backends(&["a"]).await;
    let text = ConfigText::sims(&b)
        .listener(
            "[listeners.tls]\ncertificates = [{ cert = \"site.pem\", key = \"site.key\" }, \
             { cert = \"other.pem\", key = \"other.key\" }]\n[listeners.tls.http3]\n",
        )
        .build();
    let path = pki.dir.join("capataz.toml");
    std::fs::write(&path, text).unwrap();
    let config = config::load(&path).expect("valid");
    let (events, _) = tokio::sync::broadcast::channel(64);
    let balancer = Balancer::start_with_path(&config, events, Some(path.clone()))
        .await
        .expect("starts");
    let addr = udp_addr(&balancer);
    let mut established = connect(&pki, addr, SITE).await.expect("HTTP/3");
    assert!(presented(&established.connection, &old_cert));
    let by_name = connect(&pki, addr, "other.test").await.expect("HTTP/3");
    assert!(
        presented(&by_name.connection, &other),
        "SNI picks the certificate"
    );

    // Renewed in place, then reloaded: new QUIC connections get the new certificate.
    let old_cert = {
        let kept = pki.dir.join("old-site.pem");
        std::fs::copy(&old_cert, &kept).unwrap();
        kept
    };
    let (new_cert, _) = pki.server("site", &[SITE], None);
    balancer
        .supervisor()
        .reload_from_file()
        .await
        .expect("the reload applies");
    let fresh = connect(&pki, addr, SITE).await.expect("HTTP/3");
    assert!(presented(&fresh.connection, &new_cert));
    assert!(!presented(&fresh.connection, &old_cert));
    // The connection made before the reload keeps its certificate and is still served.
    assert!(presented(&established.connection, &old_cert));
    let answer = established.get(SITE, "/").await.expect("still served");
    assert_eq!(answer.head.status(), StatusCode::OK);
}

#[tokio::test]
async fn an_idle_connection_is_closed_after_idle_timeout_and_counted_closed() {
    let pki = Pki::new();
    let b = backends(&["a"]).await;
    let (balancer, _) = h3_balancer(
        &pki,
        ConfigText::sims(&b),
        Some(""),
        "idle_timeout = \"300ms\"",
    )
    .await;
    let mut client = connect(&pki, udp_addr(&balancer), SITE).await.unwrap();
    assert_eq!(client.get(SITE, "/").await.unwrap().head.status(), 200);
    // No request for idle_timeout: capataz closes the connection (GOAWAY, then the close).
    tokio::time::timeout(DEADLINE, &mut client.driver)
        .await
        .expect("the connection closed by capataz")
        .unwrap();
    wait_until("the connection counted closed", || {
        metrics_text(&balancer)
            .contains("capataz_client_connections_open{listener=\"listener-0\"} 0")
    })
    .await;
}

#[tokio::test]
async fn with_retry_threshold_zero_every_new_client_is_validated_and_served() {
    let pki = Pki::new();
    let b = backends(&["a"]).await;
    let (balancer, _) =
        h3_balancer(&pki, ConfigText::sims(&b), Some("retry_threshold = 0"), "").await;
    for _ in 0..3 {
        let mut client = connect(&pki, udp_addr(&balancer), SITE)
            .await
            .expect("HTTP/3");
        let answer = client.get(SITE, "/").await.expect("answer");
        assert_eq!(answer.head.status(), StatusCode::OK);
    }
    assert_eq!(b[0].traffic_hits(), 3);
}

#[tokio::test]
async fn shutdown_lets_the_request_in_progress_finish_and_refuses_new_connections() {
    let pki = Pki::new();
    let b = backends(&["a"]).await;
    b[0].set_traffic(Mode::Delay(Duration::from_millis(500), 200));
    let (balancer, _) = h3_balancer(&pki, ConfigText::sims(&b), Some(""), "").await;
    let addr = udp_addr(&balancer);
    let mut client = connect(&pki, addr, SITE).await.unwrap();
    let in_flight = tokio::spawn(async move {
        let answer = client.get(SITE, "/slow").await;
        (client, answer)
    });
    assert!(
        b[0].wait_traffic_hits(1, DEADLINE).await,
        "the backend has it"
    );
    // A deadline far past the test's: the shutdown must end when the connection is done,
    // not at its deadline.
    let shutdown = tokio::spawn(balancer.shutdown(Duration::from_secs(600)));
    let (mut client, answer) = in_flight.await.unwrap();
    let answer = answer.expect("the request in progress is answered");
    assert_eq!(answer.head.status(), StatusCode::OK);
    assert_eq!(answer.text(), "a\n");
    // The connection, its request done, is closed by capataz (after its GOAWAY).
    tokio::time::timeout(DEADLINE, &mut client.driver)
        .await
        .expect("the connection closed by capataz")
        .unwrap();
    tokio::time::timeout(DEADLINE, shutdown)
        .await
        .expect("shutdown ends once the connection is done")
        .unwrap();
    // Once shut down, nothing answers on the UDP port.
    let refused = tokio::time::timeout(Duration::from_secs(2), connect(&pki, addr, SITE)).await;
    assert!(
        !matches!(refused, Ok(Ok(_))),
        "a new connection after shutdown"
    );
}
