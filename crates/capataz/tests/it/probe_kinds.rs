//! Health checks that speak the backends' protocol: `kind = "grpc"`
//! against a real gRPC server (Python's grpcio, `tests/support/grpc/server.py`, its serving
//! status switched at run time), `kind = "http"` over HTTP/2 on `h2c` and `h2` pools (hyper
//! HTTP/2 backends, ALPN `h2` over TLS), and an HTTPS probe whose verification fails. Each
//! probe is one connection; DOWN after `fall` failures with explain naming the last answer, UP
//! after `rise` passes.
//!
//! Without Python's grpcio the gRPC tests fail with the command that installs it
//! (`.ci/deps/grpcio.sh`): CI runs it.

use std::io::{BufRead, BufReader, Lines, Write};
use std::net::SocketAddr;
use std::process::{Child, ChildStdin, ChildStdout, Stdio};
use std::sync::atomic::{AtomicU16, Ordering};
use std::sync::Arc;
use std::time::Duration;

use capataz::health::PoolRt;
use capataz_health::{Outcome, State};

use crate::support::backends_tls::{HttpBackend, Pki, Reply, Script, Speaks};
use crate::support::balancer::{start, ConfigText};
use crate::support::cases;
use crate::support::events::{transition_of, wait_for};
use crate::support::grpc;
use crate::support::wait::wait_until;

fn explain(pool: &PoolRt, backend: usize) -> String {
    capataz::status::explain(pool, &pool.view_of(backend))
}

/// A Python gRPC server whose health service's statuses a test sets through its stdin.
struct HealthServer {
    child: Child,
    stdin: ChildStdin,
    stdout: Lines<BufReader<ChildStdout>>,
    addr: SocketAddr,
}

impl HealthServer {
    fn start() -> HealthServer {
        let mut child = grpc::peer("server.py")
            .arg("g")
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .unwrap_or_else(|e| panic!("{e}: {}", grpc::missing()));
        let stdin = child.stdin.take().expect("stdin");
        let mut stdout = BufReader::new(child.stdout.take().expect("stdout")).lines();
        let line = stdout.next().and_then(Result::ok).unwrap_or_default();
        let port: u16 = line.trim().parse().unwrap_or_else(|_| {
            panic!(
                "the gRPC server did not start (got {line:?}); {}",
                grpc::missing()
            )
        });
        HealthServer {
            child,
            stdin,
            stdout,
            addr: ([127, 0, 0, 1], port).into(),
        }
    }

    /// Sets a serving status (`"NOT_SERVING"`, `"SERVING shop.Cart"`) and waits until it is.
    fn set(&mut self, line: &str) {
        writeln!(self.stdin, "{line}").expect("the server reads its stdin");
        self.stdin.flush().expect("flush");
        let ack = self.stdout.next().and_then(Result::ok);
        assert_eq!(ack.as_deref(), Some("ok"), "the server set {line:?}");
    }
}

impl Drop for HealthServer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

const FAST: &str =
    "active.interval = \"30ms\"\nactive.timeout = \"1s\"\nactive.fall = 2\nactive.rise = 2\n";

#[tokio::test]
async fn a_grpc_health_check_follows_the_serving_status_down_and_up() {
    let mut server = HealthServer::start();
    let text = ConfigText::new(&[("g".to_owned(), server.addr)])
        .extra(&format!(
            "protocol = \"h2c\"\nactive.kind = \"grpc\"\nactive.initial = \"first-probe\"\n{FAST}"
        ))
        .build();
    let (balancer, mut rx) = start(&text).await;
    let pool = balancer.pool("web").unwrap();
    // DOWN until a first check passes.
    wait_for(&mut rx, "g UP", |e| {
        transition_of(e, "g", State::Up).is_some()
    })
    .await;
    server.set("NOT_SERVING");
    wait_for(&mut rx, "g DOWN", |e| {
        transition_of(e, "g", State::Down).is_some()
    })
    .await;
    let sentence = explain(&pool, 0);
    assert!(
        sentence.contains("2 consecutive failed probes (last: GRPC 0 OK, gRPC health NOT_SERVING)"),
        "{sentence}"
    );
    server.set("SERVING");
    wait_for(&mut rx, "g UP", |e| {
        transition_of(e, "g", State::Up).is_some()
    })
    .await;
    balancer.shutdown(Duration::from_secs(1)).await;
}

#[tokio::test]
async fn a_grpc_check_asks_about_its_service_and_an_unknown_one_fails_not_found() {
    let mut server = HealthServer::start();
    server.set("SERVING shop.Cart");
    let text = ConfigText::new(&[("g".to_owned(), server.addr)])
        .extra(&format!(
            "protocol = \"h2c\"\nactive.kind = \"grpc\"\nactive.grpc_service = \"shop.Cart\"\n\
             active.initial = \"first-probe\"\n{FAST}"
        ))
        .build();
    let (balancer, mut rx) = start(&text).await;
    let pool = balancer.pool("web").unwrap();
    wait_for(&mut rx, "g UP", |e| {
        transition_of(e, "g", State::Up).is_some()
    })
    .await;
    // The server as a whole is still SERVING; the service is not.
    server.set("NOT_SERVING shop.Cart");
    wait_for(&mut rx, "g DOWN", |e| {
        transition_of(e, "g", State::Down).is_some()
    })
    .await;
    assert!(
        explain(&pool, 0).contains("gRPC health NOT_SERVING"),
        "{}",
        explain(&pool, 0)
    );
    balancer.shutdown(Duration::from_secs(1)).await;

    let text = ConfigText::new(&[("g".to_owned(), server.addr)])
        .extra(&format!(
            "protocol = \"h2c\"\nactive.kind = \"grpc\"\nactive.grpc_service = \"no.Such\"\n{FAST}"
        ))
        .build();
    let (balancer, mut rx) = start(&text).await;
    let pool = balancer.pool("web").unwrap();
    wait_for(&mut rx, "g DOWN", |e| {
        transition_of(e, "g", State::Down).is_some()
    })
    .await;
    assert!(
        explain(&pool, 0).contains("(last: GRPC 5 NOT_FOUND)"),
        "{}",
        explain(&pool, 0)
    );
    balancer.shutdown(Duration::from_secs(1)).await;
}

/// A backend answering `/healthz` with the status in `health` (and `ok` as the body).
async fn h2_health_backend(
    name: &str,
    tls: Option<Arc<rustls::ServerConfig>>,
    health: Arc<AtomicU16>,
) -> HttpBackend {
    let script: Script = Arc::new(move |parts| {
        let status = if parts.uri.path() == "/healthz" {
            health.load(Ordering::Relaxed)
        } else {
            404
        };
        Reply::Ok {
            status,
            headers: Vec::new(),
            body: bytes::Bytes::from_static(b"ok"),
            trailers: None,
        }
    });
    HttpBackend::start(name, Speaks::H2, tls, script).await
}

#[tokio::test]
async fn an_h2c_pool_probes_over_http2_one_connection_per_probe() {
    let health = Arc::new(AtomicU16::new(200));
    let backend = h2_health_backend("b", None, health.clone()).await;
    let text = ConfigText::new(&[backend.entry()])
        .extra(&format!(
            "protocol = \"h2c\"\nactive.kind = \"http\"\n{FAST}"
        ))
        .build();
    let (balancer, mut rx) = start(&text).await;
    let pool = balancer.pool("web").unwrap();
    wait_until("three probes", || backend.hits() >= 3).await;
    health.store(503, Ordering::Relaxed);
    wait_for(&mut rx, "b DOWN", |e| {
        transition_of(e, "b", State::Down).is_some()
    })
    .await;
    assert!(
        explain(&pool, 0).contains("2 consecutive failed probes (last: HTTP 503)"),
        "{}",
        explain(&pool, 0)
    );
    health.store(200, Ordering::Relaxed);
    wait_for(&mut rx, "b UP", |e| {
        transition_of(e, "b", State::Up).is_some()
    })
    .await;
    balancer.shutdown(Duration::from_secs(1)).await;
    // Every probe opened its own connection (and the pool sent no traffic).
    assert_eq!(backend.accepted(), backend.hits());
}

#[tokio::test]
async fn an_h2_pool_probes_over_tls_with_alpn_content_checks_and_verification() {
    let pki = Pki::new("probes");
    let stranger = Pki::new("stranger");
    let health = Arc::new(AtomicU16::new(200));
    let good = h2_health_backend(
        "good",
        Some(pki.server(&["backend.test"], &[b"h2"])),
        health.clone(),
    )
    .await;
    let untrusted = h2_health_backend(
        "untrusted",
        Some(stranger.server(&["backend.test"], &[b"h2"])),
        Arc::new(AtomicU16::new(200)),
    )
    .await;
    let text = ConfigText::new(&[good.entry(), untrusted.entry()])
        .extra(&format!(
            "protocol = \"h2\"\ntls.ca_file = \"{}\"\ntls.server_name = \"backend.test\"\n\
             active.kind = \"http\"\nactive.body_contains = \"ok\"\n{FAST}",
            pki.ca_file()
        ))
        .build();
    let (balancer, mut rx) = start(&text).await;
    let pool = balancer.pool("web").unwrap();
    let down = wait_for(&mut rx, "untrusted DOWN", |e| {
        transition_of(e, "untrusted", State::Down).is_some()
    })
    .await;
    let transition = transition_of(&down, "untrusted", State::Down).unwrap();
    assert_eq!(transition.reason.last(), Some(Outcome::Tls));
    assert!(
        explain(&pool, 1).contains("(last: TLS)"),
        "{}",
        explain(&pool, 1)
    );
    assert_eq!(untrusted.hits(), 0, "no request after a failed handshake");
    wait_until("three probes verified by name", || good.hits() >= 3).await;
    assert_eq!(pool.verdict(0), State::Up);
    health.store(500, Ordering::Relaxed);
    wait_for(&mut rx, "good DOWN", |e| {
        transition_of(e, "good", State::Down).is_some()
    })
    .await;
    assert!(
        explain(&pool, 0).contains("(last: HTTP 500)"),
        "{}",
        explain(&pool, 0)
    );
    balancer.shutdown(Duration::from_secs(1)).await;
    assert_eq!(good.accepted(), good.hits(), "one connection per probe");
}

fn config_error(extra: &str) -> String {
    let text = ConfigText::new(&[("a".to_owned(), "127.0.0.1:1".parse().unwrap())])
        .extra(extra)
        .build();
    match capataz::config::parse_str(&text, "<test>") {
        Ok(_) => panic!("{extra:?} was accepted"),
        Err(error) => error.to_string(),
    }
}

#[test]
fn grpc_checks_need_an_http2_pool_and_grpc_keys_need_grpc_checks() {
    let cases = [
        (
            "a grpc check on an HTTP/1.1 pool",
            (
                "active.kind = \"grpc\"\n",
                &["pools.web.active.kind", "set protocol = \"h2c\""][..],
            ),
        ),
        (
            "grpc_service without a grpc check",
            (
                "active.grpc_service = \"shop.Cart\"\n",
                &["pools.web.active.grpc_service"][..],
            ),
        ),
        (
            "expect with a grpc check",
            (
                "protocol = \"h2c\"\nactive.kind = \"grpc\"\nactive.expect = \"200\"\n",
                &["pools.web.active.expect"][..],
            ),
        ),
        (
            "path with a grpc check",
            (
                "protocol = \"h2c\"\nactive.kind = \"grpc\"\nactive.path = \"/x\"\n",
                &["pools.web.active.path"][..],
            ),
        ),
    ];
    cases::each_sync(cases, |(extra, says)| {
        let error = config_error(extra);
        for words in says {
            assert!(error.contains(words), "{error}");
        }
    });
    // An h2c pool's http check is HTTP/2 now, content rules included.
    let text = ConfigText::new(&[("a".to_owned(), "127.0.0.1:1".parse().unwrap())])
        .extra("protocol = \"h2c\"\nactive.kind = \"http\"\nactive.body_contains = \"ok\"\n")
        .build();
    assert!(capataz::config::parse_str(&text, "<test>").is_ok());
}

/// A gRPC health check against a backend that answers `reply` over `speaks`, with `timeout`.
struct Failing {
    speaks: Speaks,
    reply: Script,
    timeout: &'static str,
    /// What the explanation names as the last answer.
    last: &'static str,
    /// The backend counts every probe's connection as one request.
    one_connection_per_probe: bool,
}

#[tokio::test]
async fn a_failing_grpc_check_goes_down_naming_the_last_answer() {
    let cases = [
        (
            "a server without the health service: UNIMPLEMENTED",
            Failing {
                speaks: Speaks::H2,
                // A trailers-only answer, as a gRPC server gives for a method it does not have.
                reply: Arc::new(|_| Reply::Ok {
                    status: 200,
                    headers: vec![
                        ("content-type", "application/grpc".to_owned()),
                        ("grpc-status", "12".to_owned()),
                    ],
                    body: Default::default(),
                    trailers: None,
                }),
                timeout: "1s",
                last: "(last: GRPC 12 UNIMPLEMENTED)",
                one_connection_per_probe: true,
            },
        ),
        (
            "a hung answer: TIMEOUT",
            Failing {
                speaks: Speaks::H2,
                reply: Arc::new(|_| Reply::Hang),
                timeout: "200ms",
                last: "(last: TIMEOUT)",
                one_connection_per_probe: false,
            },
        ),
        (
            // hyper's HTTP/1.1 server closes the connection on the HTTP/2 preface.
            "an HTTP/1.1 backend closing on the preface: RESET",
            Failing {
                speaks: Speaks::Http1,
                reply: Arc::new(|_| Reply::text("ok")),
                timeout: "200ms",
                last: "(last: RESET)",
                one_connection_per_probe: false,
            },
        ),
    ];
    cases::each(cases, |case| async move {
        let backend = HttpBackend::start("b", case.speaks, None, case.reply).await;
        let text = ConfigText::new(&[backend.entry()])
            .extra(&format!(
                "protocol = \"h2c\"\nactive.kind = \"grpc\"\nactive.interval = \"30ms\"\n\
                 active.timeout = \"{}\"\nactive.fall = 2\nactive.rise = 2\n",
                case.timeout
            ))
            .build();
        let (balancer, mut rx) = start(&text).await;
        let pool = balancer.pool("web").unwrap();
        wait_for(&mut rx, "b DOWN", |e| {
            transition_of(e, "b", State::Down).is_some()
        })
        .await;
        assert!(
            explain(&pool, 0).contains(case.last),
            "{}",
            explain(&pool, 0)
        );
        if case.one_connection_per_probe {
            assert_eq!(
                backend.accepted(),
                backend.hits(),
                "one connection per probe"
            );
        }
        balancer.shutdown(Duration::from_secs(1)).await;
    })
    .await;
}
