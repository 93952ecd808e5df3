//! OCSP stapling of ACME certificates (`ocsp_fetch = true` beside `[listeners.tls.acme]`),
//! seen by `openssl s_client -status`: pebble names a responder in the certificates it issues
//! (its `ocspResponderURL`), and OpenSSL's responder answers for pebble's intermediate with
//! the intermediate's own key (`support::ocsp::IssuerOcsp`), `unknown` for a serial the test has
//! not vouched for yet. The issued certificate is stapled once its status is `good` and not
//! while it is `unknown`; its renewal starts without a staple (the old certificate's response
//! is never served with it) and gets its own; a staple that cannot be refreshed is dropped
//! when it goes stale.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use capataz::server::Balancer;
use capataz::sim::SimBackend;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::CertificateDer;

use super::{serial, DOMAIN};
use crate::support::balancer::{backends, start};
use crate::support::ocsp::{handshake_text, IssuerOcsp};
use crate::support::pebble::Pebble;
use crate::support::{reserve_port, ReservedPort};

/// Issuance, then a fetch retried after a refusal (10 s ±25 %, 20 s if the retry finds the
/// responder restarting): far under this.
const STAPLE_DEADLINE: Duration = Duration::from_secs(90);

/// A balancer on 127.0.0.1:`port` whose listener has `[listeners.tls.acme]` and
/// `ocsp_fetch = true`.
async fn stapling_balancer(
    port: u16,
    pebble: &Pebble,
    storage: &Path,
    renew_before: &str,
) -> (Vec<SimBackend>, Balancer) {
    let b = backends(&["a"]).await;
    let text = format!(
        "[[listeners]]\naddress = \"127.0.0.1:{port}\"\n\
         [listeners.tls]\nocsp_fetch = true\n\
         [listeners.tls.acme]\ndirectory = {directory:?}\ndomains = [{DOMAIN:?}]\n\
         storage = {storage:?}\nca_file = {ca_file:?}\nrenew_before = {renew_before:?}\n\n\
         [pools.web]\nbackends = [{{ name = \"a\", address = \"{}\" }}]\n",
        b[0].addr(),
        directory = pebble.directory,
        storage = storage.display().to_string(),
        ca_file = pebble.pki.ca_path().display().to_string(),
    );
    let (balancer, _) = start(&text).await;
    (b, balancer)
}

/// Pebble issuing certificates valid `days` that name a responder, that responder (its answers
/// fresh for `minutes`), and the storage for the balancer on `port`, reserved (pebble
/// validates against it) for as long as this lives.
struct Issuing {
    _reserved: ReservedPort,
    port: u16,
    pebble: Pebble,
    ocsp: IssuerOcsp,
    storage: PathBuf,
}

impl Issuing {
    fn start(days: u64, minutes: u32) -> Issuing {
        let reserved = reserve_port();
        let port = reserved.port;
        let responder_port = reserve_port();
        let pebble = Pebble::start_ocsp(port, days * 86_400, responder_port.port);
        let (intermediate, key) = pebble.intermediate_pem();
        let ocsp = IssuerOcsp::start(responder_port, (&intermediate, &key), minutes);
        let storage = super::storage_dir(&pebble);
        Issuing {
            _reserved: reserved,
            port,
            pebble,
            ocsp,
            storage,
        }
    }
}

/// One handshake for `DOMAIN`, as `openssl s_client -status` saw it.
#[derive(Debug)]
struct Seen {
    /// The server certificate's serial (uppercase hex, whole bytes, as OpenSSL prints it);
    /// `None` if the handshake failed (no certificate yet).
    serial: Option<String>,
    /// The stapled response's status and certificate serial, if one was stapled.
    staple: Option<(String, String)>,
    text: String,
}

async fn seen(addr: SocketAddr) -> Seen {
    let text = handshake_text(addr, DOMAIN).await;
    // The server's certificate: the PEM after `Server certificate` (the stapled response,
    // printed before it, may carry its signer's).
    let server = text.split("Server certificate").nth(1).unwrap_or_default();
    let serial = CertificateDer::pem_slice_iter(server.as_bytes())
        .next()
        .and_then(Result::ok)
        .map(|der| hex(&serial(&der)));
    let ocsp = text.split("OCSP response:").nth(1).unwrap_or_default();
    let ocsp = ocsp.split("Certificate chain").next().unwrap_or_default();
    let field = |name: &str| {
        ocsp.lines()
            .find_map(|l| l.trim().strip_prefix(name))
            .map(|v| v.trim().to_owned())
    };
    let staple = field("Cert Status:").zip(field("Serial Number:"));
    Seen {
        serial,
        staple,
        text,
    }
}

/// `bytes` as OpenSSL prints a serial: uppercase hex, leading zero bytes dropped.
fn hex(bytes: &[u8]) -> String {
    let start = bytes.iter().position(|b| *b != 0).unwrap_or(bytes.len());
    bytes[start..].iter().map(|b| format!("{b:02X}")).collect()
}

/// Handshakes until one satisfies `done`, asserting on each that a stapled response is about
/// the certificate served with it; returns that handshake.
async fn until_seen(
    addr: SocketAddr,
    what: &str,
    ocsp: &IssuerOcsp,
    pebble: &Pebble,
    done: impl Fn(&Seen) -> bool,
) -> Seen {
    let end = tokio::time::Instant::now() + STAPLE_DEADLINE;
    loop {
        let shown = seen(addr).await;
        if let Some((_, stapled_for)) = &shown.staple {
            assert_eq!(
                Some(stapled_for),
                shown.serial.as_ref(),
                "a staple served with another certificate:\n{}",
                shown.text
            );
        }
        if done(&shown) {
            return shown;
        }
        assert!(
            tokio::time::Instant::now() < end,
            "timed out waiting for {what}; last handshake:\n{}\nresponder:\n{}\npebble:\n{}",
            shown.text,
            ocsp.log(),
            pebble.log()
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_acme_certificate_is_stapled_when_good_and_its_renewal_gets_its_own_staple() {
    // Valid 10 days: renewing 30 days (720h) ahead means renewing the stored one at once.
    let Issuing {
        _reserved,
        port,
        pebble,
        mut ocsp,
        storage,
    } = Issuing::start(10, 60);

    // Issued, then answered `unknown` (not vouched for yet): served without a staple.
    let (_b, balancer) = stapling_balancer(port, &pebble, &storage, "1h").await;
    let addr = balancer.local_addrs()[0];
    let first = until_seen(addr, "the issued certificate", &ocsp, &pebble, |s| {
        s.serial.is_some()
    })
    .await;
    let first_serial = first.serial.clone().expect("a certificate");
    crate::support::wait::wait_until("the responder answered unknown", || {
        ocsp.log().contains("Cert Status: unknown")
    })
    .await;
    let shown = seen(addr).await;
    assert_eq!(shown.serial.as_ref(), Some(&first_serial));
    assert!(
        shown.text.contains("OCSP response: no response sent"),
        "{}",
        shown.text
    );

    // Vouched for: the retry staples its `good` response.
    ocsp.vouch_for(&first_serial);
    let shown = until_seen(
        addr,
        "the issued certificate stapled",
        &ocsp,
        &pebble,
        |s| s.staple.is_some(),
    )
    .await;
    assert_eq!(
        shown.staple,
        Some(("good".to_owned(), first_serial.clone())),
        "{}",
        shown.text
    );
    assert!(shown.text.contains("Next Update:"), "{}", shown.text);
    balancer.shutdown(Duration::from_secs(5)).await;

    // A restart within `renew_before`: the stored certificate serves and is stapled again
    // while its renewal is ordered; the renewed one is served without the old staple (every
    // handshake's staple is checked against its certificate), and is stapled once vouched for.
    let (_b, balancer) = stapling_balancer(port, &pebble, &storage, "720h").await;
    let addr = balancer.local_addrs()[0];
    let renewed = until_seen(addr, "the renewed certificate", &ocsp, &pebble, |s| {
        s.serial
            .as_ref()
            .is_some_and(|serial| *serial != first_serial)
    })
    .await;
    let renewed_serial = renewed.serial.clone().expect("a certificate");
    assert_eq!(renewed.staple, None, "{}", renewed.text);
    assert_eq!(hex(&serial(&super::stored(&storage))), renewed_serial);
    ocsp.vouch_for(&renewed_serial);
    let shown = until_seen(
        addr,
        "the renewed certificate stapled",
        &ocsp,
        &pebble,
        |s| s.staple.is_some(),
    )
    .await;
    assert_eq!(
        shown.staple,
        Some(("good".to_owned(), renewed_serial)),
        "{}",
        shown.text
    );
    balancer.shutdown(Duration::from_secs(5)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_acme_staple_that_goes_stale_is_dropped_not_served() {
    // Valid 90 days, renewed 30 days ahead: no renewal during the test. Each response fresh
    // for one minute (`nextUpdate` a minute after `thisUpdate`).
    let Issuing {
        _reserved,
        port,
        pebble,
        mut ocsp,
        storage,
    } = Issuing::start(90, 1);
    let (_b, balancer) = stapling_balancer(port, &pebble, &storage, "720h").await;
    let addr = balancer.local_addrs()[0];
    let issued = until_seen(addr, "the issued certificate", &ocsp, &pebble, |s| {
        s.serial.is_some()
    })
    .await;
    ocsp.vouch_for(issued.serial.as_ref().expect("a certificate"));
    let shown = until_seen(
        addr,
        "the issued certificate stapled",
        &ocsp,
        &pebble,
        |s| s.staple.is_some(),
    )
    .await;
    let stapled_at = tokio::time::Instant::now();
    assert_eq!(shown.staple.as_ref().map(|s| s.0.as_str()), Some("good"));

    // No responder any more: the refresh (a minute after the fetch) fails, and the staple is
    // served, for its certificate, until its `nextUpdate`, then no longer.
    ocsp.stop();
    let shown = until_seen(addr, "the stale staple dropped", &ocsp, &pebble, |s| {
        s.serial.is_some() && s.staple.is_none()
    })
    .await;
    assert!(
        stapled_at.elapsed() >= Duration::from_secs(45),
        "dropped after {:?}, before its nextUpdate:\n{}",
        stapled_at.elapsed(),
        shown.text
    );
    assert!(
        shown.text.contains("OCSP response: no response sent"),
        "{}",
        shown.text
    );
    assert_eq!(seen(addr).await.staple, None, "still dropped");
    balancer.shutdown(Duration::from_secs(5)).await;
}
