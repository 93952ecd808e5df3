//! The QUIC series of an HTTP/3 listener (`capataz_quic_*`) against what the clients did:
//! each completed handshake counted `ok`, each refused one `failed`, each Retry sent counted,
//! and nothing left in progress once the handshakes are over.

use http::StatusCode;

use super::{h3_balancer, udp_addr, SITE};
use crate::support::balancer::{backends, metrics_text, ConfigText};
use crate::support::h3client::{client_config, client_config_alpn, connect, connect_with};
use crate::support::tls::Pki;
use crate::support::wait::wait_until;

/// The value of the sample line `series` (name and labels, exactly as written) in `text`.
pub(super) fn value(text: &str, series: &str) -> Option<f64> {
    text.lines().find_map(|line| {
        let (name, value) = line.rsplit_once(' ')?;
        (name == series).then(|| value.parse().expect("a number"))
    })
}

/// The listener's QUIC series now: handshakes ok, failed, timed out, Retry packets sent,
/// handshakes in progress.
pub(super) fn quic(text: &str) -> [f64; 5] {
    let handshakes = |result: &str| {
        let series =
            format!("capataz_quic_handshakes_total{{listener=\"listener-0\",result=\"{result}\"}}");
        value(text, &series).unwrap_or_else(|| panic!("no {series} in {text}"))
    };
    let listener = |name: &str| {
        let series = format!("{name}{{listener=\"listener-0\"}}");
        value(text, &series).unwrap_or_else(|| panic!("no {series} in {text}"))
    };
    [
        handshakes("ok"),
        handshakes("failed"),
        handshakes("timeout"),
        listener("capataz_quic_retries_sent_total"),
        listener("capataz_quic_handshakes_in_progress"),
    ]
}

#[tokio::test]
async fn quic_handshakes_and_retries_are_counted_as_the_clients_saw_them() {
    let pki = Pki::new();
    let b = backends(&["a"]).await;
    // Every new client is sent a Retry first.
    let http3 = Some("retry_threshold = 0");
    let balancer = h3_balancer(&pki, ConfigText::sims(&b), http3, "").await.0;
    let addr = udp_addr(&balancer);
    // Every series is there from the start, at 0.
    assert_eq!(quic(&metrics_text(&balancer)), [0.0; 5]);
    const N: usize = 3;
    for _ in 0..N {
        let mut client = connect(&pki, addr, SITE).await.expect("HTTP/3 connection");
        let answer = client.get(SITE, "/").await.expect("answer");
        assert_eq!(answer.head.status(), StatusCode::OK);
    }
    let n = N as f64;
    assert_eq!(quic(&metrics_text(&balancer)), [n, 0.0, 0.0, n, 0.0]);
    // A client asking for another protocol than h3: the handshake fails (after its Retry).
    let refused = connect_with(client_config_alpn(&pki, &[b"h2"]), addr, SITE).await;
    assert!(refused.is_err(), "a client offering only h2 was served");
    // A client that does not trust the certificate aborts the handshake with an alert.
    let untrusted = client_config(&Pki::new());
    let refused = connect_with(untrusted, addr, SITE).await;
    assert!(refused.is_err(), "a client trusting another CA was served");
    wait_until("both failed handshakes counted", || {
        quic(&metrics_text(&balancer))[1] == 2.0
    })
    .await;
    assert_eq!(
        quic(&metrics_text(&balancer)),
        [n, 2.0, 0.0, n + 2.0, 0.0],
        "ok, failed, timeout, retries, in progress"
    );
    // As many connections accepted as handshakes done.
    let text = metrics_text(&balancer);
    let accepted = "capataz_client_connections_accepted_total{listener=\"listener-0\"}";
    assert_eq!(value(&text, accepted), Some(n), "{text}");
}

#[tokio::test]
async fn no_retry_is_sent_below_the_retry_threshold() {
    let pki = Pki::new();
    let b = backends(&["a"]).await;
    let balancer = h3_balancer(&pki, ConfigText::sims(&b), Some(""), "")
        .await
        .0;
    let addr = udp_addr(&balancer);
    for _ in 0..2 {
        let mut client = connect(&pki, addr, SITE).await.expect("HTTP/3 connection");
        client.get(SITE, "/").await.expect("answer");
    }
    assert_eq!(quic(&metrics_text(&balancer)), [2.0, 0.0, 0.0, 0.0, 0.0]);
}
