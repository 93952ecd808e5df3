//! The key Retry tokens are sealed with lives as long as the HTTP/3 endpoint, not one
//! configuration: a client sent a Retry just before a reload echoes its token just after it,
//! and is validated and served. (With a key per configuration its token no longer opens, so
//! it is taken for an unvalidated client and sent a second Retry, which a client must ignore
//! (RFC 9000 section 17.2.5.2): its connection never starts. The first client after the
//! reload failed too: its Retry was sealed under the configuration its first packet came
//! with, its token checked under the one the accept loop installed on taking that packet.)

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use http::StatusCode;
use tokio::net::UdpSocket;
use tokio::sync::{oneshot, watch};

use super::initial_flood::is_retry;
use super::quic_metrics::quic;
use super::{udp_addr, SITE};
use crate::support::balancer::{backends, metrics_text, parse, start, ConfigText};
use crate::support::h3client::{client_config, connect, connect_with};
use crate::support::tls::Pki;
use crate::support::wait::wait_until;
use crate::support::DEADLINE;

/// Where `quic` puts the handshakes done and the Retry packets sent.
const OK: usize = 0;
const RETRIES: usize = 3;

/// A UDP relay between one QUIC client and capataz (`server`) that, once it has passed a
/// Retry on to the client, holds the client's next datagrams (its Initial echoing the
/// token) until `release`, then relays both ways again. `retried` turns true at the Retry.
async fn relay(
    socket: UdpSocket,
    server: SocketAddr,
    retried: watch::Sender<bool>,
    mut release: oneshot::Receiver<()>,
) {
    let mut client = None;
    let mut held: Vec<Vec<u8>> = Vec::new();
    let (mut holding, mut released) = (false, false);
    let mut buf = vec![0u8; 65536];
    loop {
        tokio::select! {
            got = socket.recv_from(&mut buf) => {
                let Ok((n, from)) = got else { return };
                let datagram = &buf[..n];
                if from == server {
                    if let Some(client) = client {
                        let _ = socket.send_to(datagram, client).await;
                    }
                    if is_retry(datagram) && !released {
                        holding = true;
                        let _ = retried.send(true);
                    }
                } else if holding {
                    held.push(datagram.to_vec());
                } else {
                    client = Some(from);
                    let _ = socket.send_to(datagram, server).await;
                }
            }
            _ = &mut release, if holding => {
                for datagram in held.drain(..) {
                    let _ = socket.send_to(&datagram, server).await;
                }
                (holding, released) = (false, true);
            }
        }
    }
}

#[tokio::test]
async fn a_retry_token_from_before_a_reload_validates_its_client_after_it() {
    let pki = Pki::new();
    let b = backends(&["a"]).await;
    let (cert, key) = pki.server("site", &[SITE], None);
    // Every new client is sent a Retry.
    let listener = Pki::listener(
        &[(cert.as_path(), key.as_path())],
        "[listeners.tls.http3]\nretry_threshold = 0\n",
    );
    let text = ConfigText::sims(&b).listener(&listener).build();
    let (balancer, _) = start(&text).await;
    let addr = udp_addr(&balancer);

    // A client through the relay: sent its Retry, its answer held.
    let socket = UdpSocket::bind("127.0.0.1:0").await.unwrap();
    let relayed = socket.local_addr().unwrap();
    let (retried_tx, mut retried) = watch::channel(false);
    let (release, released) = oneshot::channel();
    let relay = tokio::spawn(relay(socket, addr, retried_tx, released));
    // Its handshake may take as long as the test's deadline, no longer.
    let mut transport = quinn::TransportConfig::default();
    transport.max_idle_timeout(Some(DEADLINE.try_into().unwrap()));
    let mut config = client_config(&pki);
    config.transport_config(Arc::new(transport));
    let held = tokio::spawn(connect_with(config, relayed, SITE));
    tokio::time::timeout(DEADLINE, retried.wait_for(|sent| *sent))
        .await
        .expect("a Retry for the relayed client")
        .unwrap();

    // A reload, then a client the endpoint takes with the reloaded configuration (its
    // accept loop installs it as it takes that client's first packet, whose Retry was
    // sealed under the configuration before).
    balancer
        .supervisor()
        .reload(&parse(&text))
        .await
        .expect("the reload applies");
    let mut after = connect(&pki, addr, SITE)
        .await
        .expect("HTTP/3 after the reload");
    assert_eq!(
        after.get(SITE, "/").await.unwrap().head.status(),
        StatusCode::OK
    );
    // Retries: the held client's and this one's.
    assert_eq!(quic(&metrics_text(&balancer))[RETRIES], 2.0);

    // The held client's token, sealed before the reload, opens after it: validated, served.
    release.send(()).unwrap();
    let mut client = tokio::time::timeout(DEADLINE + Duration::from_secs(5), held)
        .await
        .expect("the held client's handshake ended")
        .unwrap()
        .expect("the client sent a Retry before the reload is served after it");
    assert_eq!(
        client.get(SITE, "/").await.unwrap().head.status(),
        StatusCode::OK
    );
    // Two handshakes done, one Retry each: the held client was not sent another.
    wait_until("two handshakes done", || {
        quic(&metrics_text(&balancer))[OK] == 2.0
    })
    .await;
    let [_, failed, _, retries, _] = quic(&metrics_text(&balancer));
    assert_eq!((failed, retries), (0.0, 2.0));
    relay.abort();
}
