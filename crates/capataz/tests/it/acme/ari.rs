//! ACME Renewal Information (RFC 9773) end to end: acme2certifier (`support::acme2certifier`),
//! whose directory has `renewalInfo`, issues one-day certificates and suggests renewing within
//! seconds of issuance; a stored certificate is renewed in that window, not on `renew_before`'s
//! schedule (one hour before `notAfter`, a day away). acme2certifier 0.46.3 does not echo an
//! order's `replaces` (RFC 9773 section 5), so the first renewal order, which names the
//! certificate, fails, and the retry, which does not, succeeds.

use std::time::Duration;

use crate::support::acme2certifier::Acme2certifier;
use crate::support::reserve_port;
use crate::support::tls::{Client, Pki};

use super::{acme_balancer, serial, stored, DOMAIN};

/// The renewal: the window opens 0.01 % into the day (9 s) and lasts 20 s, then an order
/// refused for its `replaces`, the backoff (10 s +-25 %) and the order again.
const RENEWAL_DEADLINE: Duration = Duration::from_secs(120);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stored_certificate_is_renewed_in_the_cas_renewal_window_not_on_renew_before() {
    let ca = Acme2certifier::start(0.01, 20, 30);
    let reserved = reserve_port();
    let port = reserved.port;
    let storage = ca.dir.join("acme");
    let mut client = Client::trusting(&Pki::new());
    client.roots = ca.ca_path();
    // renew_before = 1h: without ARI the one-day certificate is renewed 23 hours from now.
    let (_b, balancer, _) = acme_balancer(port, &ca.directory, &ca.ca_path(), &storage, "1h").await;
    let first = shown(&client, balancer.local_addrs()[0], &ca, None).await;
    balancer.shutdown(Duration::from_secs(5)).await;

    // Started again with the stored certificate: it asks renewalInfo and renews in the window
    // (the first run's own renewal waits for the hour between two orders).
    let (_b, balancer, _) = acme_balancer(port, &ca.directory, &ca.ca_path(), &storage, "1h").await;
    let renewed = shown(&client, balancer.local_addrs()[0], &ca, Some(&first)).await;
    assert_ne!(serial(&renewed), serial(&first));
    assert_eq!(stored(&storage), renewed);
    balancer.shutdown(Duration::from_secs(5)).await;

    let log = ca.log();
    assert!(
        log.contains("GET /acme/renewal-info/"),
        "the renewal time came from renewalInfo; acme2certifier's log:\n{log}"
    );
}

/// The first certificate the listener at `addr` presents for `DOMAIN` other than `not`,
/// verified against acme2certifier's CA (waits for the order).
async fn shown(
    client: &Client,
    addr: std::net::SocketAddr,
    ca: &Acme2certifier,
    not: Option<&[u8]>,
) -> Vec<u8> {
    let end = tokio::time::Instant::now() + RENEWAL_DEADLINE;
    loop {
        if let Ok(Ok(stream)) =
            tokio::time::timeout(Duration::from_secs(5), client.connect(addr, DOMAIN)).await
        {
            let leaf = stream.get_ref().1.peer_certificates().expect("a chain")[0].to_vec();
            if not != Some(&leaf[..]) {
                return leaf;
            }
        }
        assert!(
            tokio::time::Instant::now() < end,
            "no (new) certificate from acme2certifier was served; its log:\n{}",
            ca.log()
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}
