//! A flood of QUIC Initial packets from many source ports, none of which ever answers (as
//! from spoofed addresses): with `retry_threshold` handshakes in progress, every further
//! Initial gets a stateless Retry, so the handshake state capataz keeps stays at the
//! threshold; the handshakes it did start send no more than QUIC's anti-amplification limit
//! to their silent clients and end at `header_read_timeout`; a real client is served during
//! the flood (it answers its Retry) and after it.

use std::net::SocketAddr;

use http::StatusCode;
use tokio::net::UdpSocket;

use super::quic_metrics::quic;
use super::{h3_balancer, udp_addr, SITE};
use crate::support::balancer::{backends, metrics_text, ConfigText};
use crate::support::h3client::{client_config, connect};
use crate::support::tls::Pki;
use crate::support::wait::wait_until;
use crate::support::DEADLINE;

/// Handshakes in progress before new clients get a Retry.
const THRESHOLD: usize = 4;
/// Initial packets in the flood, each from its own source port.
const FLOOD: usize = 200;
/// Initials sent before waiting for capataz to have taken them (the socket's receive buffer
/// holds many more).
const BATCH: usize = 20;

/// A real client's first datagram (its Initial, with a fresh connection ID): the client is
/// pointed at a socket of ours, which keeps what it sent.
async fn initial(endpoint: &quinn::Endpoint, config: &quinn::ClientConfig) -> Vec<u8> {
    let tap = UdpSocket::bind("127.0.0.1:0").await.unwrap();
    let connecting = endpoint
        .connect_with(config.clone(), tap.local_addr().unwrap(), SITE)
        .unwrap();
    let mut datagram = vec![0u8; 65536];
    let n = tokio::time::timeout(DEADLINE, tap.recv(&mut datagram))
        .await
        .expect("the client's Initial")
        .unwrap();
    drop(connecting);
    datagram.truncate(n);
    datagram
}

/// Whether `datagram` is a QUIC version 1 Retry packet (long header, type 3: RFC 9000
/// section 17.2.5; its fixed bit may be greased, RFC 9287).
pub(super) fn is_retry(datagram: &[u8]) -> bool {
    datagram.first().is_some_and(|b| b & 0xb0 == 0xb0) && datagram.get(1..5) == Some(&[0, 0, 0, 1])
}

/// The most a handshake may send to a client whose address is not validated, for `received`
/// bytes from it: three times that (RFC 9000 section 8.1), where quinn lets the datagram that
/// starts within that budget be a full one (`MTU`, 1,200 bytes: up to 1,199 more;
/// quinn-rs/quinn#1082).
fn amplification_bound(received: usize) -> usize {
    3 * received + MTU - 1
}

/// The datagram size QUIC starts with.
const MTU: usize = 1200;

#[tokio::test]
async fn an_initial_flood_gets_retries_and_a_real_client_is_served_during_and_after() {
    let pki = Pki::new();
    let b = backends(&["a"]).await;
    let (balancer, _) = h3_balancer(
        &pki,
        ConfigText::sims(&b),
        Some(&format!("retry_threshold = {THRESHOLD}")),
        "header_read_timeout = \"8s\"",
    )
    .await;
    let addr: SocketAddr = udp_addr(&balancer);
    let config = client_config(&pki);
    let maker = quinn::Endpoint::client("127.0.0.1:0".parse().unwrap()).unwrap();
    // The flood: each Initial from a socket of its own, which reads what comes back and never
    // answers.
    let mut sources = Vec::with_capacity(FLOOD);
    let mut largest = 0;
    for batch in 0..FLOOD / BATCH {
        for _ in 0..BATCH {
            let source = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
            source.set_nonblocking(true).unwrap();
            let datagram = initial(&maker, &config).await;
            largest = largest.max(datagram.len());
            source.send_to(&datagram, addr).unwrap();
            sources.push(source);
        }
        // Each Initial taken: retried, or its handshake started (and still waiting on its
        // silent client); never more handshakes in progress than the threshold.
        let sent = (batch + 1) * BATCH;
        wait_until("the batch taken", || {
            let [ok, failed, timeout, retries, in_progress] = quic(&metrics_text(&balancer));
            assert!(in_progress <= THRESHOLD as f64, "{in_progress} in progress");
            assert_eq!(
                ok + failed + timeout,
                0.0,
                "a silent client's handshake ended"
            );
            retries + in_progress == sent as f64
        })
        .await;
    }
    let [_, _, _, retries, in_progress] = quic(&metrics_text(&balancer));
    assert_eq!(in_progress, THRESHOLD as f64);
    assert_eq!(retries, (FLOOD - THRESHOLD) as f64);
    // During the flood (its handshakes still in progress): a real client gets a Retry too,
    // answers it, and is served.
    let mut client = connect(&pki, addr, SITE)
        .await
        .expect("HTTP/3 during the flood");
    let answer = client.get(SITE, "/").await.expect("answer");
    assert_eq!(answer.head.status(), StatusCode::OK);
    drop(client);
    // What came back to the flood's sources: a Retry for each retried one; the others got
    // their handshake's packets, within QUIC's anti-amplification limit for an address not
    // validated however long capataz waited for them. Read once those handshakes timed out.
    wait_until("the flood's handshakes timed out", || {
        quic(&metrics_text(&balancer))[2] == THRESHOLD as f64
    })
    .await;
    let mut retried = 0;
    let mut datagram = vec![0u8; 65536];
    for source in &sources {
        let mut first = true;
        let mut bytes = 0;
        let mut sizes = Vec::new();
        while let Ok(n) = source.recv(&mut datagram) {
            sizes.push(n);
            if first && is_retry(&datagram[..n]) {
                retried += 1;
            }
            first = false;
            bytes += n;
        }
        assert!(
            bytes <= amplification_bound(largest),
            "{bytes} bytes sent to a silent client for {largest}: {sizes:?}"
        );
    }
    assert_eq!(retried, FLOOD - THRESHOLD, "Retry packets the sources got");
    // After the flood: nothing left in progress, the real client the one handshake done, and
    // a new client served.
    let [ok, failed, timeout, retries, in_progress] = quic(&metrics_text(&balancer));
    assert_eq!(
        [ok, failed, timeout, retries, in_progress],
        [
            1.0,
            0.0,
            THRESHOLD as f64,
            (FLOOD - THRESHOLD + 1) as f64,
            0.0
        ],
        "ok, failed, timeout, retries, in progress"
    );
    let mut client = connect(&pki, addr, SITE)
        .await
        .expect("HTTP/3 after the flood");
    let answer = client.get(SITE, "/").await.expect("answer");
    assert_eq!(answer.head.status(), StatusCode::OK);
    assert_eq!(b[0].traffic_hits(), 2);
}
