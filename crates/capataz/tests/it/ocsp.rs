//! OCSP stapling, seen by `openssl s_client -status`: a response fetched from a real
//! responder (`openssl ocsp` on loopback) for a certificate that names it, stapled when good
//! and never when revoked; a response file stapled as is, checked when the config is loaded
//! (a file about another certificate is an error naming the key; a revoked one is not
//! stapled), and replaced by a reload.

use std::path::Path;
use std::time::Duration;

use capataz::config;

use crate::support::balancer::{backends, parse, start};
use crate::support::ocsp::{stapled, OcspCa};

/// A TLS listener over `entries` (`{ cert = ..., key = ... }` tables) with `extra` lines.
fn config_text(entries: &[String], extra: &str, backend: std::net::SocketAddr) -> String {
    format!(
        "[[listeners]]\naddress = \"127.0.0.1:0\"\n[listeners.tls]\ncertificates = [{}]\n{extra}\n\
         [pools.web]\nbackends = [{{ name = \"a\", address = \"{backend}\" }}]\n",
        entries.join(", ")
    )
}

fn entry(cert: &Path, key: &Path, ocsp: Option<&Path>) -> String {
    let ocsp = ocsp.map_or(String::new(), |o| {
        format!(", ocsp_response = {:?}", o.display().to_string())
    });
    format!(
        "{{ cert = {:?}, key = {:?}{ocsp} }}",
        cert.display().to_string(),
        key.display().to_string()
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fetched_good_response_is_stapled_and_a_revoked_one_never_is() {
    let mut ca = OcspCa::new();
    let (good, good_key) = ca.leaf("good.test", 0x1001, false);
    let (revoked, revoked_key) = ca.leaf("revoked.test", 0x1002, true);
    let responder = ca.responder(60);
    let b = backends(&["a"]).await;
    let text = config_text(
        &[
            entry(&good, &good_key, None),
            entry(&revoked, &revoked_key, None),
        ],
        "ocsp_fetch = true",
        b[0].addr(),
    );
    let (balancer, _) = start(&text).await;
    let addr = balancer.local_addrs()[0];
    let end = tokio::time::Instant::now() + crate::support::DEADLINE;
    loop {
        let shown = stapled(addr, "good.test").await;
        if shown.contains("Cert Status: good") {
            assert!(
                shown.contains("OCSP Response Status: successful"),
                "{shown}"
            );
            assert!(shown.contains("Next Update:"), "{shown}");
            break;
        }
        assert!(
            tokio::time::Instant::now() < end,
            "no good response stapled: {shown}\nresponder:\n{}",
            responder.log()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    crate::support::wait::wait_until("the responder answered for the revoked certificate", || {
        responder.log().contains("Cert Status: revoked")
    })
    .await;
    let shown = stapled(addr, "revoked.test").await;
    assert!(shown.contains("no response sent"), "{shown}");
    // The good one is still stapled on the next handshakes.
    assert!(stapled(addr, "good.test")
        .await
        .contains("Cert Status: good"));
    balancer.shutdown(Duration::from_secs(5)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_response_file_is_stapled_checked_when_loaded_and_replaced_by_a_reload() {
    let mut ca = OcspCa::new();
    let (good, good_key) = ca.leaf("good.test", 0x2001, false);
    let (revoked, revoked_key) = ca.leaf("revoked.test", 0x2002, true);
    let good_response = ca.response_file("good.test", 60);
    let revoked_response = ca.response_file("revoked.test", 60);
    let b = backends(&["a"]).await;
    let text = config_text(
        &[
            entry(&good, &good_key, Some(&good_response)),
            entry(&revoked, &revoked_key, Some(&revoked_response)),
        ],
        "",
        b[0].addr(),
    );
    let (balancer, _) = start(&text).await;
    let addr = balancer.local_addrs()[0];
    let shown = stapled(addr, "good.test").await;
    assert!(shown.contains("Cert Status: good"), "{shown}");
    let first = shown.clone();
    // A revoked response is loaded, not stapled.
    let shown = stapled(addr, "revoked.test").await;
    assert!(shown.contains("no response sent"), "{shown}");

    // A reload reads the file again: a new response (another thisUpdate) is stapled.
    let end = tokio::time::Instant::now() + crate::support::DEADLINE;
    loop {
        // openssl writes times to the second: wait for the next one.
        ca.response_file("good.test", 120);
        balancer
            .reload(&parse(&text))
            .await
            .expect("the reload applies");
        let shown = stapled(addr, "good.test").await;
        assert!(shown.contains("Cert Status: good"), "{shown}");
        if shown != first {
            break;
        }
        assert!(
            tokio::time::Instant::now() < end,
            "the file was not read again"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    balancer.shutdown(Duration::from_secs(5)).await;

    // Errors, naming the file and the key: a response about another certificate, and bytes
    // that are no OCSP response.
    let garbage = ca.dir().join("garbage.der");
    std::fs::write(&garbage, b"\x30\x03\x0a\x01").unwrap();
    for (file, why) in [
        (&revoked_response, "it is about another certificate"),
        (&garbage, "not a DER OCSP response"),
    ] {
        let path = ca.dir().join("bad.toml");
        let text = config_text(&[entry(&good, &good_key, Some(file))], "", b[0].addr());
        std::fs::write(&path, &text).unwrap();
        let error = config::load(&path).expect_err("refused").to_string();
        assert!(
            error.contains(":4: listeners[0].tls.certificates[0].ocsp_response: "),
            "{error}"
        );
        assert!(error.contains(&file.display().to_string()), "{error}");
        assert!(error.contains(why), "{error}");
    }
}

/// A responder that answers an endless body: the fetch stops reading at its bound, nothing is
/// stapled, and the listener serves as before.
#[tokio::test]
async fn an_endless_responder_answer_is_cut_at_its_bound_and_nothing_is_stapled() {
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::Arc;
    use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
    let mut ca = OcspCa::new();
    let (good, good_key) = ca.leaf("good.test", 0x3001, false);
    let hostile = tokio::net::TcpListener::bind(("127.0.0.1", ca.port))
        .await
        .expect("the responder's port");
    let written = Arc::new(AtomicUsize::new(0));
    let done = Arc::new(AtomicUsize::new(0));
    let server = {
        let (written, done) = (written.clone(), done.clone());
        tokio::spawn(async move {
            while let Ok((mut socket, _)) = hostile.accept().await {
                let (written, done) = (written.clone(), done.clone());
                tokio::spawn(async move {
                    let mut head = [0u8; 4096];
                    let _ = socket.read(&mut head).await;
                    let _ = socket
                        .write_all(
                            b"HTTP/1.1 200 OK\r\ncontent-type: application/ocsp-response\r\n\r\n",
                        )
                        .await;
                    let chunk = vec![0x30u8; 64 * 1024];
                    // At most 64 MiB, stopping when the client hangs up.
                    for _ in 0..1024 {
                        if socket.write_all(&chunk).await.is_err() {
                            break;
                        }
                        written.fetch_add(chunk.len(), Ordering::Relaxed);
                    }
                    done.fetch_add(1, Ordering::Relaxed);
                });
            }
        })
    };
    let b = backends(&["a"]).await;
    let text = config_text(
        &[entry(&good, &good_key, None)],
        "ocsp_fetch = true",
        b[0].addr(),
    );
    let (balancer, _) = start(&text).await;
    crate::support::wait::wait_until("the fetch hung up on the endless answer", || {
        done.load(Ordering::Relaxed) >= 1
    })
    .await;
    let sent = written.load(Ordering::Relaxed);
    assert!(
        sent < 32 << 20,
        "the fetch stopped reading early ({sent} bytes sent)"
    );
    let shown = stapled(balancer.local_addrs()[0], "good.test").await;
    assert!(shown.contains("no response sent"), "{shown}");
    balancer.shutdown(Duration::from_secs(5)).await;
    server.abort();
}
