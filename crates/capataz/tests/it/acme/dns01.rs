//! DNS-01 end to end: pebble asks a real Knot DNS server (`support::knot`) for the TXT records
//! that the balancer publishes there by RFC 2136 updates signed with TSIG. A wildcard
//! certificate is ordered, served for a name under it, and the TXT records are removed after
//! the validation, and after a failed one too; a wrong TSIG secret or a DNS server that is
//! down fails the order with a clear error, no certificate, and the usual retry.

use super::*;
use crate::support::knot::Knot;
use crate::support::process::{Capataz, TempFile};

const KEY_NAME: &str = "acme-update";
/// The key knot trusts (hmac-sha256, 32 bytes).
const SECRET: &str = "AAECAwQFBgcICQoLDA0ODxAREhMUFRYXGBkaGxwdHh8=";
/// Another key of the same length.
const WRONG_SECRET: &str = "HxwdHh8AAQIDBAUGBwgJCgsMDQ4PEBESExQVFhcYGRo=";
const WILDCARD: &str = "*.dns01.test";
const APEX: &str = "dns01.test";
/// The owner of the challenge's TXT records in zone `test.`.
const TXT_OWNER: &str = "_acme-challenge.dns01";

/// A config for a listener on 127.0.0.1:0 ordering `*.dns01.test` and `dns01.test` by DNS-01
/// through `dns` (the zone found by its SOA), the secret read from `secret_file`.
fn dns01_config(
    directory: &str,
    ca_file: &Path,
    storage: &Path,
    secret_file: &Path,
    dns: SocketAddr,
    backend: SocketAddr,
) -> String {
    format!(
        "[[listeners]]\naddress = \"127.0.0.1:0\"\nname = \"edge\"\n\
         [listeners.tls.acme]\ndirectory = {directory:?}\ndomains = [{WILDCARD:?}, {APEX:?}]\n\
         storage = {storage:?}\nca_file = {ca_file:?}\nchallenge = \"dns-01\"\n\
         [listeners.tls.acme.dns01]\nserver = \"{dns}\"\ntsig_key = {KEY_NAME:?}\n\
         tsig_secret_file = {secret:?}\nttl = \"5s\"\npropagation_timeout = \"20s\"\n\n\
         [pools.web]\nbackends = [{{ name = \"a\", address = \"{backend}\" }}]\n",
        storage = storage.display().to_string(),
        ca_file = ca_file.display().to_string(),
        secret = secret_file.display().to_string(),
    )
}

/// The first certificate the listener presents for `name`, once its chain verifies (for
/// `name`) against `client`'s root and a request is answered.
async fn served_for(client: &Client, addr: SocketAddr, name: &str, pebble: &Pebble) -> Vec<u8> {
    let end = tokio::time::Instant::now() + ISSUANCE_DEADLINE;
    loop {
        if let Ok(Ok(mut stream)) =
            tokio::time::timeout(Duration::from_secs(5), client.connect(addr, name)).await
        {
            let shown = stream.get_ref().1.peer_certificates().expect("a chain")[0].to_vec();
            let (head, _) = get(&mut stream, name).await.expect("an answer");
            assert!(head.starts_with("http/1.1 200"), "{head}");
            return shown;
        }
        assert!(
            tokio::time::Instant::now() < end,
            "no certificate for {name} was served; pebble's log:\n{}",
            pebble.log()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_wildcard_certificate_is_ordered_by_dns01_updates_served_and_its_txt_records_removed() {
    let knot = Knot::start_updatable("acme-dns01", "", (KEY_NAME, SECRET));
    let pebble = Pebble::start_dns01(knot.addr(), 90 * 86_400);
    let scratch = Pki::new();
    let storage = scratch.dir.join("acme");
    let ca_file = scratch.dir.join("pebble-ca.pem");
    std::fs::copy(pebble.pki.ca_path(), &ca_file).expect("copy the CA");
    let secret_file = scratch.dir.join("tsig.secret");
    std::fs::write(&secret_file, format!("{SECRET}\n")).expect("write the secret");
    let b = backends(&["a"]).await;
    let text = dns01_config(
        &pebble.directory,
        &ca_file,
        &storage,
        &secret_file,
        knot.addr(),
        b[0].addr(),
    );
    let (balancer, _) = start(&text).await;
    let addr = balancer.local_addrs()[0];
    let client = client_trusting(&scratch.dir, &pebble.root_pem());
    // One certificate, verified for a name under the wildcard and for the apex.
    let under = served_for(&client, addr, "www.dns01.test", &pebble).await;
    let apex = served_for(&client, addr, APEX, &pebble).await;
    assert_eq!(under, apex);
    assert_eq!(stored(&storage), under);
    // A name two labels under the wildcard is not covered: the client refuses the certificate.
    let deeper = tokio::time::timeout(
        Duration::from_secs(5),
        client.connect(addr, "a.www.dns01.test"),
    )
    .await
    .expect("the handshake ends");
    assert!(
        deeper.is_err(),
        "a.www.dns01.test is not under *.dns01.test"
    );
    // The two TXT values (one per authorization) were removed after the validation.
    crate::support::wait::wait_until("the TXT records are removed", || {
        knot.zone_read(TXT_OWNER, "TXT").trim().is_empty()
    })
    .await;
    let metrics = crate::support::balancer::metrics_text(&balancer);
    assert!(
        metrics.contains("capataz_acme_orders_total{listener=\"edge\",result=\"issued\"} 1"),
        "{metrics}"
    );
    balancer.shutdown(Duration::from_secs(5)).await;
}

/// Runs the binary with the DNS-01 config and returns the first `ACME order failed` line.
fn failed_order(text: &str) -> (Capataz, String) {
    let config = TempFile::new("acme-dns01.toml", text);
    let capataz = Capataz::spawn(&["run", "--config", config.text()], &[]);
    let line = capataz.wait_line("the failed order", |l| l.contains("ACME order failed"));
    (capataz, line)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_wrong_tsig_secret_or_a_dns_server_that_is_down_fails_the_order_clearly_and_issues_nothing(
) {
    let mut knot = Knot::start_updatable("acme-dns01-bad", "", (KEY_NAME, SECRET));
    let pebble = Pebble::start_dns01(knot.addr(), 90 * 86_400);
    let scratch = Pki::new();
    let storage = scratch.dir.join("acme");
    let ca_file = scratch.dir.join("pebble-ca.pem");
    std::fs::copy(pebble.pki.ca_path(), &ca_file).expect("copy the CA");
    let secret_file = scratch.dir.join("tsig.secret");
    std::fs::write(&secret_file, WRONG_SECRET).expect("write the secret");
    let b = backends(&["a"]).await;
    let text = dns01_config(
        &pebble.directory,
        &ca_file,
        &storage,
        &secret_file,
        knot.addr(),
        b[0].addr(),
    );
    let (capataz, line) = tokio::task::block_in_place(|| failed_order(&text));
    assert!(
        line.contains("refused to add _acme-challenge.dns01.test.")
            && line.contains("TSIG error BadSig")
            && line.contains("check tsig_key, tsig_algorithm and the secret")
            && line.contains("retry_in="),
        "{line}"
    );
    assert!(!storage.join("certificate.pem").exists(), "nothing issued");
    let left = knot.zone_read(TXT_OWNER, "TXT");
    assert!(left.trim().is_empty(), "{left}");
    drop(capataz);

    // The server down: the update cannot be sent, and the order is retried later.
    std::fs::write(&secret_file, SECRET).expect("write the secret");
    knot.kill();
    let (capataz, line) = tokio::task::block_in_place(|| failed_order(&text));
    assert!(
        line.contains(&format!("the DNS server {}: ", knot.addr())) && line.contains("retry_in="),
        "{line}"
    );
    assert!(!storage.join("certificate.pem").exists(), "nothing issued");
    drop(capataz);
}

/// The SOA serial of zone `test.` (Knot bumps it on each update it applies).
fn serial(knot: &Knot) -> u32 {
    let soa = knot.zone_read("@", "SOA");
    // `[test.] test. 1 SOA ns.test. admin.test. SERIAL 60 60 600 1`
    let fields: Vec<&str> = soa.split_whitespace().collect();
    let at = fields.iter().position(|f| *f == "SOA").expect("an SOA") + 3;
    fields[at].parse().expect("a serial")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_validation_removes_the_txt_records_it_added() {
    let knot = Knot::start_updatable("acme-dns01-invalid", "", (KEY_NAME, SECRET));
    // pebble asks a DNS server that is not there: its validation fails after capataz has
    // added the records on knot.
    let nobody = std::net::UdpSocket::bind("127.0.0.1:0").expect("a UDP port");
    let nowhere = nobody.local_addr().expect("its address");
    drop(nobody);
    let pebble = Pebble::start_dns01(nowhere, 90 * 86_400);
    let scratch = Pki::new();
    let storage = scratch.dir.join("acme");
    let ca_file = scratch.dir.join("pebble-ca.pem");
    std::fs::copy(pebble.pki.ca_path(), &ca_file).expect("copy the CA");
    let secret_file = scratch.dir.join("tsig.secret");
    std::fs::write(&secret_file, SECRET).expect("write the secret");
    let before = serial(&knot);
    let b = backends(&["a"]).await;
    let text = dns01_config(
        &pebble.directory,
        &ca_file,
        &storage,
        &secret_file,
        knot.addr(),
        b[0].addr(),
    );
    let (balancer, _) = start(&text).await;
    crate::support::wait::wait_until("the failed order is counted", || {
        let text = crate::support::balancer::metrics_text(&balancer);
        text.contains("capataz_acme_orders_total{listener=\"edge\",result=\"failed\"} 1")
    })
    .await;
    // Two values added (the wildcard's and the apex's), then both deleted: four updates, and
    // nothing left at the name.
    crate::support::wait::wait_until("the TXT records are removed", || {
        knot.zone_read(TXT_OWNER, "TXT").trim().is_empty() && serial(&knot) == before + 4
    })
    .await;
    assert!(!storage.join("certificate.pem").exists(), "nothing issued");
    balancer.shutdown(Duration::from_secs(5)).await;
}
