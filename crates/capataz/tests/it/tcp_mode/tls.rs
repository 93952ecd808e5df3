//! TLS termination on a tcp listener: the client speaks TLS to capataz, the backend gets the
//! plain bytes; the access log says the session's TLS version and SNI.

use serde_json::Value;
use tokio::io::AsyncWriteExt;

use super::{config, Greeter};
use crate::support::access_log::{table, wait_json, LogDir};
use crate::support::balancer::start;
use crate::support::tls::{Client, Pki};
use crate::support::DEADLINE;

#[tokio::test]
async fn a_tls_client_is_relayed_in_plain_bytes_and_its_session_logged_with_tls() {
    let pki = Pki::new();
    let (cert, key) = pki.server("db", &["db.test"], None);
    let a = Greeter::start("a").await;
    let dir = LogDir::new();
    let log = dir.path("tcp.log");
    let listener = format!(
        "{}\n{}",
        Pki::listener(&[(&cert, &key)], ""),
        table(&log, "json", "")
    );
    let (balancer, _) = start(&config(&[("a", a.addr)], &listener, "")).await;
    let mut client = Client::trusting(&pki);
    // A TCP client offers no ALPN.
    client.alpn.clear();
    let mut stream = client
        .connect(balancer.local_addrs()[0], "db.test")
        .await
        .expect("the handshake");
    stream.write_all(b"over tls\n").await.unwrap();
    stream.shutdown().await.unwrap();
    let mut all = Vec::new();
    let read = tokio::io::AsyncReadExt::read_to_end(&mut stream, &mut all);
    // A peer's TLS close without close_notify is still the end of the bytes.
    let _ = tokio::time::timeout(DEADLINE, read).await.expect("the end");
    assert_eq!(String::from_utf8_lossy(&all), "a\nover tls\nbye a\n");
    let line = wait_json(&log, 1).await.remove(0);
    assert_eq!(line["tls_version"], "TLSv1.3", "{line}");
    assert_eq!(line["sni"], "db.test", "{line}");
    assert_eq!(line["bytes_in"], Value::from(9), "the plain bytes: {line}");
    assert_eq!(line["bytes"], Value::from(2 + 9 + 6), "{line}");
}
