//! A binary upgrade of a process serving HTTP/3 (`[listeners.tls.http3]`): the new process
//! takes the UDP socket over with the TCP one and answers HTTP/3 at once, passing the
//! datagrams of the old process's QUIC connections on to it, so that a request in progress on
//! one finishes (its whole answer), the connection gets a GOAWAY, and the old process exits
//! once its connections are done, or at its `shutdown_timeout`. `capataz run` as a child
//! process, as in `upgrade.rs`; the client is the real HTTP/3 client of `support::h3client`;
//! the backend a hand-written one that holds `/held` until the test lets it answer; loopback
//! only; every wait has a deadline.

use std::sync::atomic::Ordering;

use tokio::io::AsyncWriteExt as _;
use tokio::sync::watch;

use crate::support::fleet::get;
use crate::support::h3client::{self, H3Client};
use crate::support::process::{gone, pid_in, signal, Capataz, TempFile};
use crate::support::raw::{ok_answer, read_head, RawBackend};
use crate::support::tls::Pki;
use crate::support::{runtime, DEADLINE};

const SITE: &str = "site.test";

/// The length of `/held`'s answer: many QUIC packets, each acknowledged through the new
/// process.
const HELD_BODY: usize = 200_000;

/// A keep-alive backend answering `ok` at once, but `/held` (counted in its hits) only once
/// `release` says so, with [`HELD_BODY`] bytes.
async fn held_backend(release: watch::Receiver<bool>) -> RawBackend {
    RawBackend::start(move |mut stream, hits| {
        let mut release = release.clone();
        async move {
            let mut buf = Vec::new();
            while let Some(head) = read_head(&mut stream, &mut buf).await {
                let answer = if head.starts_with("GET /held ") {
                    hits.fetch_add(1, Ordering::SeqCst);
                    if release.wait_for(|go| *go).await.is_err() {
                        return;
                    }
                    let body = held_body();
                    let mut answer =
                        format!("HTTP/1.1 200 OK\r\nContent-Length: {}\r\n\r\n", body.len())
                            .into_bytes();
                    answer.extend_from_slice(&body);
                    answer
                } else {
                    ok_answer("ok").into_bytes()
                };
                if stream.write_all(&answer).await.is_err() {
                    return;
                }
            }
        }
    })
    .await
}

fn held_body() -> Vec<u8> {
    (0..HELD_BODY).map(|i| b'a' + (i % 26) as u8).collect()
}

fn config(pki: &Pki, backend: &RawBackend, shutdown_timeout: &str) -> TempFile {
    let (cert, key) = pki.server("site", &[SITE], None);
    TempFile::new(
        "upgrade-http3.toml",
        &format!(
            "[server]\nshutdown_timeout = \"{shutdown_timeout}\"\n\n\
             [admin]\naddress = \"127.0.0.1:0\"\n\n\
             [[listeners]]\nname = \"front\"\naddress = \"127.0.0.1:0\"\n{}\
             [listeners.tls.http3]\n\n\
             [pools.web]\nbackends = [{{ name = \"a\", address = \"{}\" }}]\n\n\
             [pools.web.active]\ninterval = \"50ms\"\ntimeout = \"1s\"\n",
            Pki::listener(&[(cert.as_path(), key.as_path())], ""),
            backend.addr
        ),
    )
}

async fn connect(pki: &Pki, udp: std::net::SocketAddr) -> H3Client {
    tokio::time::timeout(DEADLINE, h3client::connect(pki, udp, SITE))
        .await
        .expect("the HTTP/3 handshake within the deadline")
        .expect("an HTTP/3 connection")
}

/// The request `/held` started on `client`, once the backend has it.
fn start_held(
    rt: &tokio::runtime::Runtime,
    client: &mut H3Client,
    backend: &RawBackend,
) -> h3::client::RequestStream<h3_quinn::BidiStream<bytes::Bytes>, bytes::Bytes> {
    let request = http::Request::get(format!("https://{SITE}/held"))
        .body(())
        .unwrap();
    let held = rt
        .block_on(client.start(request, Some(b"")))
        .expect("the request is sent");
    crate::support::wait::block_until("the backend to have /held", || backend.hits() == 1);
    held
}

/// The value of the metric `series` (name and labels, as written) on the admin API at
/// `admin`, 0 if absent.
fn metric(admin: std::net::SocketAddr, series: &str) -> f64 {
    let (_, text) = get(admin, "/metrics").expect("GET /metrics");
    text.lines()
        .find_map(|line| line.strip_prefix(series)?.trim().parse().ok())
        .unwrap_or(0.0)
}

/// A running `capataz` serving HTTP/3 in front of a [`held_backend`], with its drain of
/// `shutdown_timeout`, and what the test needs of it.
struct Started {
    rt: tokio::runtime::Runtime,
    /// Lets `/held` be answered.
    release: watch::Sender<bool>,
    backend: RawBackend,
    pki: Pki,
    capataz: Capataz,
    /// The listener's UDP address.
    udp: std::net::SocketAddr,
    _config: TempFile,
}

impl Started {
    fn new(shutdown_timeout: &str) -> Started {
        let rt = runtime();
        let (release, gate) = watch::channel(false);
        let backend = rt.block_on(held_backend(gate));
        let pki = Pki::new();
        let config = config(&pki, &backend, shutdown_timeout);
        let capataz = Capataz::spawn(&["run", "--config", config.text()], &[]);
        let udp = capataz.listening_on("front");
        capataz.wait_line("the HTTP/3 line", |l| l.contains("listening for HTTP/3"));
        Started {
            rt,
            release,
            backend,
            pki,
            capataz,
            udp,
            _config: config,
        }
    }

    /// A new HTTP/3 connection to the listener.
    fn connect(&self) -> H3Client {
        self.rt.block_on(connect(&self.pki, self.udp))
    }
}

/// Sends SIGUSR2 to `capataz` and waits for the new process to take over; its pid.
fn upgrade(capataz: &mut Capataz) -> u32 {
    let mark = capataz.line_count();
    signal(capataz.pid(), "USR2");
    let (_, started) = capataz.wait_line_after(mark, "the new process", |l| {
        l.contains("upgrade: the new process started")
    });
    let new = pid_in(&started);
    capataz.adopt(new);
    capataz.wait_line_after(mark, "the takeover", |l| {
        l.contains("took over from the old process")
    });
    new
}

#[test]
fn an_upgrade_lets_a_request_in_progress_on_an_http3_connection_finish() {
    // A drain far longer than the test: the old process exits because its connections are
    // done, not at its deadline.
    let Started {
        rt,
        release,
        backend,
        pki,
        mut capataz,
        udp,
        _config,
    } = Started::new("120s");
    let admin = capataz.admin_on();

    let mut old = rt.block_on(connect(&pki, udp));
    let answer = rt.block_on(old.get(SITE, "/before")).expect("an answer");
    assert_eq!(answer.head.status(), 200);
    let mut held = start_held(&rt, &mut old, &backend);

    let first = capataz.pid();
    let new = upgrade(&mut capataz);
    // The new process serves new connections while the old one still has its request.
    let mut fresh = rt.block_on(connect(&pki, udp));
    let answer = rt
        .block_on(fresh.get(SITE, "/after"))
        .expect("an answer from the new process");
    assert_eq!(answer.head.status(), 200);
    assert!(
        capataz.exited().is_none(),
        "the old process left its request"
    );

    // The held request finishes on the old process, its whole answer through the new one.
    release.send(true).unwrap();
    let answer = rt
        .block_on(async { tokio::time::timeout(DEADLINE, h3client::read_answer(&mut held)).await })
        .expect("the held answer within the deadline")
        .expect("the request in progress at the upgrade is answered");
    assert_eq!(answer.head.status(), 200);
    assert!(answer.body[..] == held_body()[..], "the whole answer");
    // The old connection got a GOAWAY: no new request on it; it ends without an error.
    let refused = rt.block_on(old.get(SITE, "/again"));
    assert!(
        refused.as_ref().is_err_and(|e| e.contains("closing")),
        "a request after the GOAWAY: {:?}",
        refused.map(|a| a.head.status())
    );
    let ended = rt
        .block_on(async { tokio::time::timeout(DEADLINE, &mut old.driver).await })
        .expect("the old connection closed")
        .expect("its driver");
    assert!(ended.is_h3_no_error(), "the old connection ended: {ended}");
    // The new process says it passed the old connection's datagrams on, and dropped none.
    let forwarded = metric(
        admin,
        "capataz_quic_upgrade_datagrams_total{listener=\"front\",result=\"forwarded\"}",
    );
    assert!(
        forwarded > 0.0,
        "forwarded: {forwarded}\n{}",
        capataz.stderr()
    );

    // Its connections done, the old process exits, well before its deadline.
    let status = capataz.wait_exit();
    assert!(status.success(), "the old process exited with {status}");
    assert!(gone(first));
    let log = capataz.stderr();
    assert!(
        !log.contains("shutdown deadline reached"),
        "the old process waited for its deadline:\n{log}"
    );
    assert!(!gone(new), "the new process is gone:\n{log}");
    let answer = rt
        .block_on(fresh.get(SITE, "/later"))
        .expect("the new process still serves");
    assert_eq!(answer.head.status(), 200);
    signal(new, "TERM");
    crate::support::wait::block_until("the new process to exit", || gone(new));
}

#[test]
fn the_old_process_of_an_upgrade_exits_at_its_deadline_with_an_http3_request_held() {
    let mut started = Started::new("1s");
    let mut old = started.connect();
    let _held = start_held(&started.rt, &mut old, &started.backend);

    let new = upgrade(&mut started.capataz);
    let capataz = &mut started.capataz;
    // The held request keeps the old process until its deadline; then it exits.
    let status = capataz.wait_exit();
    assert!(status.success(), "the old process exited with {status}");
    let log = capataz.stderr();
    assert!(
        log.contains("shutdown deadline reached with connections still open"),
        "the old process exits at its deadline, its HTTP/3 connection still open:\n{log}"
    );
    let mut fresh = started.connect();
    let answer = started
        .rt
        .block_on(fresh.get(SITE, "/after"))
        .expect("an answer");
    assert_eq!(answer.head.status(), 200);
    signal(new, "TERM");
    crate::support::wait::block_until("the new process to exit", || gone(new));
}

#[test]
fn the_old_process_of_an_upgrade_reads_its_udp_socket_again_when_the_new_one_dies() {
    let started = Started::new("120s");
    let mut old = started.connect();
    let Started {
        rt,
        release,
        backend,
        mut capataz,
        ..
    } = started;
    let mut held = start_held(&rt, &mut old, &backend);

    let new = upgrade(&mut capataz);
    capataz.wait_line("the old process's switch", |l| {
        l.contains("finish on datagrams the new process passes on")
    });
    // The new process dies mid-drain: nothing passes datagrams on any more, the old process
    // reads the socket itself, and its request in progress finishes all the same.
    let mark = capataz.line_count();
    signal(new, "KILL");
    crate::support::wait::block_until("the new process to die", || gone(new));
    capataz.wait_line_after(mark, "the old process reading its socket again", |l| {
        l.contains("this one reads its UDP socket again")
    });
    release.send(true).unwrap();
    let answer = rt
        .block_on(async { tokio::time::timeout(DEADLINE, h3client::read_answer(&mut held)).await })
        .expect("the held answer within the deadline")
        .expect("the request in progress is answered by the old process alone");
    assert_eq!(answer.head.status(), 200);
    assert!(answer.body[..] == held_body()[..], "the whole answer");
    // Its connection done, the old process exits before its deadline.
    let status = capataz.wait_exit();
    assert!(status.success(), "the old process exited with {status}");
    assert!(
        !capataz.stderr().contains("shutdown deadline reached"),
        "the old process waited for its deadline:\n{}",
        capataz.stderr()
    );
}
