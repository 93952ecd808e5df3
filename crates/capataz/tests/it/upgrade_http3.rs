//! A binary upgrade of a process serving HTTP/3 (`[listeners.tls.http3]`): the new process
//! takes the UDP socket over with the TCP one and answers HTTP/3 at once, and the old
//! process's QUIC connections are closed at the handover (CONNECTION_CLOSE with H3_NO_ERROR),
//! a request in progress on one cut, not finished. `capataz run` as a child process, as in
//! `upgrade.rs`; the client is the real HTTP/3 client of `support::h3client`; loopback only;
//! every wait has a deadline.

use capataz::sim::{Mode, SimBackend};

use crate::support::any;
use crate::support::h3client::{self, H3Client};
use crate::support::process::{gone, pid_in, signal, Capataz, TempFile};
use crate::support::tls::Pki;
use crate::support::DEADLINE;

const SITE: &str = "site.test";

/// HTTP/3's code for a connection closed without error (RFC 9114 section 8.1).
const H3_NO_ERROR: u32 = 0x100;

async fn connect(pki: &Pki, udp: std::net::SocketAddr) -> H3Client {
    tokio::time::timeout(DEADLINE, h3client::connect(pki, udp, SITE))
        .await
        .expect("the HTTP/3 handshake within the deadline")
        .expect("an HTTP/3 connection")
}

#[test]
fn after_an_upgrade_the_new_process_answers_http3_and_the_old_connections_are_closed() {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .expect("a tokio runtime");
    let backend = rt.block_on(SimBackend::start("a", any())).expect("start a");
    let pki = Pki::new();
    let (cert, key) = pki.server("site", &[SITE], None);
    // A drain longer than the test: the request held at the handover is cut by the close,
    // where a connection the old process kept would see it answered (a 504 once the backend's
    // timeout passes).
    let config = TempFile::new(
        "upgrade-http3.toml",
        &format!(
            "[server]\nshutdown_timeout = \"120s\"\n\n\
             [[listeners]]\nname = \"front\"\naddress = \"127.0.0.1:0\"\n{}\
             [listeners.tls.http3]\n\n\
             [pools.web]\nbackends = [{{ name = \"a\", address = \"{}\" }}]\n\n\
             [pools.web.active]\ninterval = \"50ms\"\ntimeout = \"1s\"\n",
            Pki::listener(&[(cert.as_path(), key.as_path())], ""),
            backend.addr()
        ),
    );
    let mut capataz = Capataz::spawn(&["run", "--config", config.text()], &[]);
    let udp = capataz.listening_on("front");
    capataz.wait_line("the HTTP/3 line", |l| l.contains("listening for HTTP/3"));

    let mut old = rt.block_on(connect(&pki, udp));
    let answer = rt
        .block_on(old.get(SITE, "/before"))
        .expect("an answer before");
    assert_eq!(answer.head.status(), 200);
    // A request in progress at the handover: the backend holds it.
    backend.set_traffic(Mode::Hang);
    let hits = backend.traffic_hits();
    let request = http::Request::get(format!("https://{SITE}/held"))
        .body(())
        .unwrap();
    let mut held = rt
        .block_on(old.start(request, Some(b"")))
        .expect("the request is sent");
    assert!(rt.block_on(backend.wait_traffic_hits(hits + 1, DEADLINE)));

    let first = capataz.pid();
    let mark = capataz.line_count();
    signal(first, "USR2");
    let (_, started) = capataz.wait_line_after(mark, "the new process", |l| {
        l.contains("upgrade: the new process started")
    });
    let new = pid_in(&started);
    capataz.adopt(new);
    capataz.wait_line_after(mark, "the takeover", |l| {
        l.contains("took over from the old process")
    });
    let status = capataz.wait_exit();
    assert!(status.success(), "the old process exited with {status}");
    assert!(!gone(new), "the new process is gone:\n{}", capataz.stderr());
    let log = capataz.stderr();
    assert!(
        !log.contains("cannot serve HTTP/3"),
        "the new process serves HTTP/3 on the socket handed over:\n{log}"
    );

    // The old connection was closed at the handover, its request cut.
    let reason = rt.block_on(async {
        tokio::time::timeout(DEADLINE, old.connection.closed())
            .await
            .expect("the old connection closed")
    });
    match &reason {
        quinn::ConnectionError::ApplicationClosed(close) => {
            assert_eq!(
                close.error_code,
                quinn::VarInt::from_u32(H3_NO_ERROR),
                "{reason}"
            )
        }
        other => panic!("the old connection ended otherwise: {other}"),
    }
    let cut = rt
        .block_on(async { tokio::time::timeout(DEADLINE, h3client::read_answer(&mut held)).await });
    let status = cut.as_ref().map(|r| r.as_ref().map(|a| a.head.status()));
    assert!(
        matches!(cut, Ok(Err(_))),
        "the request in progress was cut, not answered: {status:?}"
    );

    // The new process answers HTTP/3 on the same port.
    backend.set_traffic(Mode::Status(200));
    let mut fresh = rt.block_on(connect(&pki, udp));
    let answer = rt
        .block_on(fresh.get(SITE, "/after"))
        .expect("an answer after");
    assert_eq!(answer.head.status(), 200);

    signal(new, "TERM");
    crate::support::wait::block_until("the new process to exit", || gone(new));
}
