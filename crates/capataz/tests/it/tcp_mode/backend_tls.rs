//! TLS to a tcp pool's backends (`[pools.NAME.tls]` on a `protocol = "tcp"` pool): capataz
//! originates TLS to a real TLS server and relays the plain bytes of a plain client; a backend
//! whose certificate is not trusted fails its connect (charged to it) and its `tcp` check
//! (outcome `TLS`), and gets no session; the check's exchange runs over TLS; a client's TLS
//! terminated at capataz is encrypted again to the backend.

use std::cell::Cell;

use capataz_health::{Outcome, State};
use tokio::io::AsyncWriteExt;
use tokio::net::TcpStream;

use super::sni::TlsGreeter;
use super::to_end;
use crate::support::access_log::{table, wait_json, LogDir};
use crate::support::backends_tls::Pki;
use crate::support::balancer::start;
use crate::support::events::{is_transition, transition_of, wait_for};

/// A tcp listener (with `listener` lines) to pool `db` over TLS trusting `ca`, its backends
/// `backends` and `pool` lines added.
fn config(
    ca: &str,
    backends: &[(&str, std::net::SocketAddr)],
    listener: &str,
    pool: &str,
) -> String {
    let list = backends
        .iter()
        .map(|(name, addr)| format!("{{ name = \"{name}\", address = \"{addr}\" }}"))
        .collect::<Vec<_>>()
        .join(", ");
    format!(
        "[[listeners]]\naddress = \"127.0.0.1:0\"\nmode = \"tcp\"\npool = \"db\"\n{listener}\n\n\
         [pools.db]\nprotocol = \"tcp\"\nbackends = [{list}]\n{pool}\n\
         [pools.db.tls]\nca_file = {ca:?}\nserver_name = \"db.test\"\n"
    )
}

/// A plain session through `addr`: everything the backend said after `ping\n` and a FIN.
async fn plain_session(addr: std::net::SocketAddr) -> String {
    let mut client = TcpStream::connect(addr).await.expect("connect");
    client.write_all(b"ping\n").await.expect("write");
    client.shutdown().await.expect("FIN");
    let all = to_end(&mut client).await.unwrap_or_default();
    String::from_utf8_lossy(&all).into_owned()
}

#[tokio::test]
async fn a_plain_client_reaches_a_tls_backend_and_an_untrusted_one_gets_no_session() {
    let pki = Pki::new("tcp-backend-tls");
    let other = Pki::new("tcp-backend-tls-other");
    let good = TlsGreeter::start(&pki, "good", &["db.test"]).await;
    // A certificate for the right name from a CA the pool does not trust.
    let bad = TlsGreeter::start(&other, "bad", &["db.test"]).await;
    let dir = LogDir::new();
    let log = dir.path("tcp.log");
    // Round robin over both, no check: the untrusted backend's handshake fails at connect,
    // charged to it, and the session is retried on the good one.
    let pool = "active.kind = \"none\"\npassive.consecutive_errors = 1";
    let text = config(
        &pki.ca_file(),
        &[("bad", bad.addr), ("good", good.addr)],
        &table(&log, "json", ""),
        pool,
    );
    let (balancer, mut rx) = start(&text).await;
    let addr = balancer.local_addrs()[0];
    assert_eq!(plain_session(addr).await, "good\nping\nbye good\n");
    let line = wait_json(&log, 1).await.remove(0);
    assert_eq!(line["backend"], "good", "{line}");
    assert_eq!(line["attempts"], 2, "the untrusted one first: {line}");
    assert_eq!(line["bytes_in"], 5, "the plain bytes: {line}");
    wait_for(&mut rx, "bad ejected", |e| {
        is_transition(e, "bad", State::Down)
    })
    .await;
    for _ in 0..3 {
        assert_eq!(plain_session(addr).await, "good\nping\nbye good\n");
    }
    // The untrusted backend completed no handshake: only its failed connect reached it.
    assert_eq!(bad.accepted(), 1);
    assert_eq!(good.accepted(), 4);
}

#[tokio::test]
async fn a_tcp_check_over_tls_fails_an_untrusted_backend_and_its_exchange_runs_over_tls() {
    let pki = Pki::new("tcp-check-tls");
    let other = Pki::new("tcp-check-tls-other");
    let good = TlsGreeter::start(&pki, "good", &["db.test"]).await;
    let bad = TlsGreeter::start(&other, "bad", &["db.test"]).await;
    // Pool db starts its backends UP and has only the untrusted one, checked by a connect
    // (and handshake); pool ex starts them DOWN and has only the good one, whose exchange must
    // pass to bring it UP (the greeter greets, then echoes what it reads).
    let check = "kind = \"tcp\"\ninterval = \"100ms\"\nrise = 1\nfall = 1";
    let text = format!(
        "{}\n[[listeners]]\naddress = \"127.0.0.1:0\"\nmode = \"tcp\"\npool = \"ex\"\n\n\
         [pools.ex]\nprotocol = \"tcp\"\nbackends = [{{ name = \"good\", address = \"{}\" }}]\n\
         tls = {{ ca_file = {:?}, server_name = \"db.test\" }}\n\
         [pools.ex.active]\n{check}\ninitial = \"down\"\nsend = \"hello\\n\"\nexpect_text = \"hello\"\n",
        config(&pki.ca_file(), &[("bad", bad.addr)], "", &format!("[pools.db.active]\n{check}")),
        good.addr,
        pki.ca_file(),
    );
    let (balancer, mut rx) = start(&text).await;
    // Either may come first: both are looked for in one pass over the events.
    let (bad_last, good_up) = (Cell::new(None), Cell::new(false));
    wait_for(&mut rx, "bad down and good up", |e| {
        if let Some(transition) = transition_of(e, "bad", State::Down) {
            bad_last.set(Some(transition.reason.last()));
        }
        good_up.set(good_up.get() || is_transition(e, "good", State::Up));
        bad_last.get().is_some() && good_up.get()
    })
    .await;
    assert_eq!(
        bad_last.get(),
        Some(Some(Outcome::Tls)),
        "the handshake refused"
    );
    let addr = balancer.local_addrs()[1];
    for _ in 0..3 {
        assert_eq!(plain_session(addr).await, "good\nping\nbye good\n");
    }
}

#[tokio::test]
async fn a_session_terminated_at_capataz_is_encrypted_again_to_the_backend() {
    let backends = Pki::new("tcp-reencrypt");
    let good = TlsGreeter::start(&backends, "good", &["db.test"]).await;
    let edge = crate::support::tls::Pki::new();
    let (cert, key) = edge.server("edge", &["edge.test"], None);
    let listener = crate::support::tls::Pki::listener(&[(&cert, &key)], "");
    let text = config(&backends.ca_file(), &[("good", good.addr)], &listener, "");
    let (balancer, _) = start(&text).await;
    let mut client = crate::support::tls::Client::trusting(&edge);
    // A TCP client offers no ALPN.
    client.alpn.clear();
    let mut stream = client
        .connect(balancer.local_addrs()[0], "edge.test")
        .await
        .expect("the handshake with capataz");
    stream.write_all(b"ping\n").await.unwrap();
    stream.shutdown().await.unwrap();
    let mut all = Vec::new();
    let read = tokio::io::AsyncReadExt::read_to_end(&mut stream, &mut all);
    // A TLS close without close_notify is still the end of the bytes.
    let _ = tokio::time::timeout(crate::support::DEADLINE, read)
        .await
        .expect("the end");
    assert_eq!(String::from_utf8_lossy(&all), "good\nping\nbye good\n");
}
