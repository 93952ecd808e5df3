//! TLS to backends (`[pools.NAME.tls]`): backends are tokio-rustls servers with certificates
//! made by rcgen in the test. Proxying with verification by CA and name, keep-alive reuse over
//! TLS, certificates that fail verification (another CA, another name) as backend failures
//! that eject with the TLS reason, `verify = false`, and the config's errors and warning.

use std::sync::Arc;

use capataz::config::{self, BackendProtocol};
use capataz_health::{Outcome, State};

use crate::support::backends_tls::{HttpBackend, Pki, Reply, Script, Speaks};
use crate::support::balancer::{start, ConfigText};
use crate::support::cases;
use crate::support::client::Client;
use crate::support::events::transition_of;

/// Quick checks for TLS pools, with a timeout that leaves room for a TLS handshake in a debug
/// build on a loaded machine (`FAST_CHECKS`' 100 ms does not: a timed-out probe would hide the
/// outcome under test).
const TLS_CHECKS: &str = r#"
[pools.web.active]
interval = "30ms"
timeout = "2s"
jitter = "10%"
rise = 2
fall = 3
"#;

fn hello() -> Script {
    Arc::new(|_| Reply::text("hello"))
}

async fn tls_backend(name: &str, pki: &Pki, names: &[&str]) -> HttpBackend {
    let server = pki.server(names, &[b"http/1.1"]);
    HttpBackend::start(name, Speaks::Http1, Some(server), hello()).await
}

#[tokio::test]
async fn proxies_to_tls_backends_verified_by_ca_and_by_name_or_ip() {
    let pki = Pki::new("verify");
    // One certificate names the IP the backend is reached at; the other a host name, given
    // as server_name in a second pool.
    let by_ip = tls_backend("by-ip", &pki, &["127.0.0.1"]).await;
    let by_name = tls_backend("by-name", &pki, &["backend.test"]).await;
    let text = format!(
        r#"
[[listeners]]
address = "127.0.0.1:0"
routes = [{{ path_prefix = "/ip", pool = "ip" }}, {{ path_prefix = "/name", pool = "name" }}]

[pools.ip]
backends = [{{ name = "by-ip", address = "{ip}" }}]
active.kind = "none"
tls.ca_file = "{ca}"

[pools.name]
backends = [{{ name = "by-name", address = "{name}" }}]
active.kind = "none"
[pools.name.tls]
ca_file = "{ca}"
server_name = "backend.test"
"#,
        ip = by_ip.addr,
        name = by_name.addr,
        ca = pki.ca_file(),
    );
    let (balancer, _events) = start(&text).await;
    let mut client = Client::new(balancer.local_addrs()[0]);
    let answer = client.get("/ip").await;
    assert_eq!(
        (answer.status, answer.backend.as_deref()),
        (200, Some("by-ip"))
    );
    assert_eq!(answer.text(), "hello");
    let answer = client.get("/name").await;
    assert_eq!(
        (answer.status, answer.backend.as_deref()),
        (200, Some("by-name"))
    );
    balancer.shutdown(crate::support::DEADLINE).await;
}

#[tokio::test]
async fn keep_alive_over_tls_reuses_one_connection() {
    let pki = Pki::new("reuse");
    let backend = tls_backend("b", &pki, &["127.0.0.1"]).await;
    let text = ConfigText::new(&[backend.entry()])
        .extra(&format!(
            "active.kind = \"none\"\ntls = {{ ca_file = \"{}\" }}\n",
            pki.ca_file()
        ))
        .build();
    let (balancer, _events) = start(&text).await;
    let mut client = Client::strict(balancer.local_addrs()[0]);
    for _ in 0..20 {
        assert_eq!(client.get("/").await.status, 200);
    }
    assert_eq!(backend.hits(), 20);
    assert_eq!(
        backend.accepted(),
        1,
        "one TLS session carried every request"
    );
    balancer.shutdown(crate::support::DEADLINE).await;
}

#[tokio::test]
async fn certificates_failing_verification_are_backend_failures_that_eject() {
    let pki = Pki::new("trusted");
    let stranger = Pki::new("stranger");
    let good = tls_backend("good", &pki, &["127.0.0.1"]).await;
    // Signed by a CA the pool does not trust.
    let other_ca = tls_backend("other-ca", &stranger, &["127.0.0.1"]).await;
    // Trusted CA, but issued for another name than the one verified (the IP).
    let other_name = tls_backend("other-name", &pki, &["elsewhere.test"]).await;
    let text = ConfigText::new(&[good.entry(), other_ca.entry(), other_name.entry()])
        .extra(&format!(
            r#"
active.kind = "none"
tls.ca_file = "{}"
passive.consecutive_errors = 2
passive.max_ejected_percent = 100
retries.attempts = 2
retries.min_budget = 1000
"#,
            pki.ca_file()
        ))
        .build();
    let (balancer, mut events) = start(&text).await;
    let mut client = Client::new(balancer.local_addrs()[0]);
    // A failed handshake sent nothing: each request is retried until the good backend answers
    // it, while the passive checks eject the two others, for the TLS failure.
    let mut ejected = Vec::new();
    let deadline = tokio::time::Instant::now() + crate::support::DEADLINE;
    while ejected.len() < 2 {
        tokio::select! {
            event = events.recv() => {
                let event = event.expect("the event stream");
                for bad in ["other-ca", "other-name"] {
                    if let Some(transition) = transition_of(&event, bad, State::Down) {
                        assert_eq!(transition.reason.last(), Some(Outcome::Tls), "{bad}");
                        ejected.push(bad);
                    }
                }
            }
            answer = client.get("/") => {
                assert_eq!((answer.status, answer.backend.as_deref()), (200, Some("good")));
            }
            _ = tokio::time::sleep_until(deadline) => panic!("ejected only {ejected:?}"),
        }
    }
    assert_eq!(ejected.len(), 2);
    assert_eq!(
        other_ca.hits() + other_name.hits(),
        0,
        "no request reached them"
    );
    balancer.shutdown(crate::support::DEADLINE).await;
}

#[tokio::test]
async fn verify_false_accepts_any_certificate_and_check_warns() {
    let stranger = Pki::new("unverified");
    let backend = tls_backend("b", &stranger, &["nothing.test"]).await;
    let text = ConfigText::new(&[backend.entry()])
        .extra("active.kind = \"none\"\ntls.verify = false\n")
        .build();
    let warnings = config::check(&config::parse_str(&text, "<test>").expect("valid"));
    assert!(
        warnings.iter().any(|w| w.key == "pools.web.tls.verify"),
        "{warnings:?}"
    );
    let (balancer, _events) = start(&text).await;
    let answer = Client::new(balancer.local_addrs()[0]).get("/").await;
    assert_eq!((answer.status, answer.text().as_str()), (200, "hello"));
    balancer.shutdown(crate::support::DEADLINE).await;
}

#[test]
fn tls_settings_parse_with_their_defaults() {
    let pki = Pki::new("parse");
    let (cert, key) = pki.leaf_files("client", &["client.test"]);
    let pool = |extra: &str| {
        let text = format!(
            "[[listeners]]\naddress = \"127.0.0.1:0\"\n[pools.web]\nbackends = [{{ address = \"127.0.0.1:9\" }}]\n{extra}"
        );
        config::parse_str(&text, "<test>").map(|c| c.pools[0].clone())
    };
    let plain = pool("").expect("valid");
    assert_eq!(plain.protocol, BackendProtocol::Http1);
    assert!(plain.tls.is_none());
    let typo = pool("[pools.web.tls]\nca_fil = \"/x.pem\"").expect_err("an unknown key");
    assert!(
        typo.to_string()
            .contains("unknown key \"ca_fil\": did you mean \"ca_file\"?"),
        "{typo}"
    );
    // The system's roots: loaded, or (on a host without any) a clear error.
    match pool("tls = true") {
        Ok(flag) => assert!(flag
            .tls
            .is_some_and(|tls| tls.verify && !tls.roots.is_empty())),
        Err(error) => assert!(
            error.to_string().contains("no system CA certificate"),
            "{error}"
        ),
    }
    let flag = pool(&format!("[pools.web.tls]\nca_file = \"{}\"", pki.ca_file())).expect("valid");
    let tls = flag.tls.expect("tls on");
    assert!(tls.verify && tls.server_name.is_none() && tls.identity.is_none());
    assert_eq!(tls.roots.len(), 1);
    let mtls = pool(&format!(
        "tls = {{ ca_file = \"{}\", cert = \"{cert}\", key = \"{key}\" }}",
        pki.ca_file()
    ))
    .expect("valid");
    assert!(mtls.tls.expect("tls").identity.is_some());
    let h2 = pool(&format!(
        "protocol = \"h2\"\ntls.ca_file = \"{}\"",
        pki.ca_file()
    ))
    .expect("valid");
    assert_eq!(h2.protocol, BackendProtocol::H2);
    assert!(h2.tls.is_some());
    let h2c = pool("protocol = \"h2c\"").expect("valid");
    assert!(h2c.tls.is_none());
    let codes = pool("passive.grpc_error_codes = [14]").expect("valid");
    assert!(codes.passive.grpc_error_codes.contains(14));
    assert!(!codes.passive.grpc_error_codes.contains(13));
}

#[test]
fn tls_config_errors_name_the_line_and_key() {
    let pki = Pki::new("errors");
    let (cert, _key) = pki.leaf_files("client", &["client.test"]);
    let (_other_cert, other_key) = pki.leaf_files("other", &["other.test"]);
    let not_pem = pki.write("garbage.pem", "not a certificate\n");
    let missing = format!("{}/missing.pem", std::env::temp_dir().display());
    for (extra, line, key, says) in [
        (
            format!("tls.ca_file = \"{missing}\""),
            6,
            "pools.web.tls.ca_file",
            "cannot read",
        ),
        (
            format!("tls.ca_file = \"{not_pem}\""),
            6,
            "pools.web.tls.ca_file",
            "holds no certificate",
        ),
        (
            format!("tls.cert = \"{cert}\""),
            6,
            "pools.web.tls.key",
            "needs its private key",
        ),
        (
            format!("[pools.web.tls]\ncert = \"{cert}\"\nkey = \"{other_key}\""),
            8,
            "pools.web.tls.key",
            "is not the private key",
        ),
        (
            "tls.server_name = \"not a name\"".to_owned(),
            6,
            "pools.web.tls.server_name",
            "is not a DNS name",
        ),
        (
            "protocol = \"h2c\"\ntls = true".to_owned(),
            7,
            "pools.web.tls",
            "HTTP/2 without TLS",
        ),
        (
            "protocol = \"h2\"\ntls = false".to_owned(),
            7,
            "pools.web.tls",
            "HTTP/2 over TLS",
        ),
        (
            "passive.grpc_error_codes = [14, 99]".to_owned(),
            6,
            "pools.web.passive.grpc_error_codes",
            "99 is not a gRPC error code",
        ),
    ] {
        let text = format!(
            "[[listeners]]\naddress = \"127.0.0.1:0\"\n\n[pools.web]\nbackends = [{{ address = \"127.0.0.1:9\" }}]\n{extra}\n"
        );
        let error = config::parse_str(&text, "edge.toml").expect_err(&extra);
        assert_eq!(error.key(), key, "{extra}: {error}");
        assert_eq!(error.line(), Some(line), "{extra}: {error}");
        let message = error.to_string();
        assert!(message.starts_with("edge.toml:"), "{message}");
        assert!(message.contains(says), "{extra}: {message}");
    }
}

/// A TLS pool of a good backend and a bad one that its probes take DOWN.
struct TlsProbes {
    /// The bad backend's certificate is from another CA.
    bad_ca: bool,
    /// What the bad backend answers.
    bad_body: &'static str,
    /// More `[pools.web.active]` lines.
    checks: &'static str,
    /// The last outcome its DOWN names, and what its reason says besides.
    last: Outcome,
    says: &'static str,
}

#[tokio::test]
async fn http_probes_of_a_tls_pool_run_over_tls() {
    let cases = [
        (
            "a certificate from another CA fails the handshake",
            TlsProbes {
                bad_ca: true,
                bad_body: "hello",
                checks: "",
                last: Outcome::Tls,
                says: "",
            },
        ),
        (
            // The good backend's body is read over TLS and matches all along.
            "content checks read the body over TLS",
            TlsProbes {
                bad_ca: false,
                bad_body: "nope",
                checks: "body_contains = \"hello\"\n",
                last: Outcome::Status(200),
                says: "body did not contain \"hello\"",
            },
        ),
    ];
    cases::each(cases, |case| async move {
        let pki = Pki::new("probes");
        let stranger = Pki::new("probes-stranger");
        let good = tls_backend("good", &pki, &["127.0.0.1"]).await;
        let bad_pki = if case.bad_ca { &stranger } else { &pki };
        let server = bad_pki.server(&["127.0.0.1"], &[b"http/1.1"]);
        let body = case.bad_body;
        let answer: Script = Arc::new(move |_| Reply::text(body));
        let bad = HttpBackend::start("bad", Speaks::Http1, Some(server), answer).await;
        let text = ConfigText::new(&[good.entry(), bad.entry()])
            .extra(&format!(
                "tls.ca_file = \"{}\"\n{}{}",
                pki.ca_file(),
                TLS_CHECKS,
                case.checks
            ))
            .build();
        let (balancer, mut events) = start(&text).await;
        let event = crate::support::events::wait_for(&mut events, "bad down by probes", |event| {
            transition_of(event, "bad", State::Down).is_some()
        })
        .await;
        let transition = transition_of(&event, "bad", State::Down).expect("transition");
        assert_eq!(transition.reason.last(), Some(case.last));
        assert!(
            transition.reason.to_string().contains(case.says),
            "{}",
            transition.reason
        );
        // The good backend answered its probes over TLS all along.
        crate::support::wait::wait_until("probes of good", || good.hits() >= 3).await;
        let pool = balancer.pool("web").expect("pool");
        assert_eq!(pool.views()[0].standing.health.verdict(), State::Up);
        balancer.shutdown(crate::support::DEADLINE).await;
    })
    .await;
}

#[test]
fn http2_pools_probe_with_tcp_by_default_and_over_http2_when_asked() {
    let pool = |extra: &str| {
        let text = format!(
            "[[listeners]]\naddress = \"127.0.0.1:0\"\n[pools.web]\nbackends = [{{ address = \"127.0.0.1:9\" }}]\n{extra}"
        );
        config::parse_str(&text, "<test>").map(|c| c.pools[0].clone())
    };
    let h2c = pool("protocol = \"h2c\"").expect("valid");
    assert_eq!(h2c.active.kind, config::CheckKind::Tcp);
    let none = pool("protocol = \"h2c\"\nactive.kind = \"none\"").expect("valid");
    assert_eq!(none.active.kind, config::CheckKind::None);
    // The http probe speaks HTTP/2 to an HTTP/2 pool (see probe_kinds.rs); grpc needs one.
    let http = pool("protocol = \"h2c\"\nactive.kind = \"http\"").expect("valid");
    assert_eq!(http.active.kind, config::CheckKind::Http);
    let error = pool("active.kind = \"grpc\"").expect_err("refused on an HTTP/1.1 pool");
    assert_eq!(error.key(), "pools.web.active.kind");
}

#[tokio::test]
async fn large_bodies_stream_both_ways_over_tls() {
    let pki = Pki::new("large");
    let big: bytes::Bytes = (0..300_000u32)
        .map(|i| (i % 251) as u8)
        .collect::<Vec<u8>>()
        .into();
    let answer_body = big.clone();
    let server = pki.server(&["127.0.0.1"], &[b"http/1.1"]);
    let backend = HttpBackend::start(
        "b",
        Speaks::Http1,
        Some(server),
        Arc::new(move |_| Reply::Ok {
            status: 200,
            headers: Vec::new(),
            body: answer_body.clone(),
            trailers: None,
        }),
    )
    .await;
    let text = ConfigText::new(&[backend.entry()])
        .extra(&format!(
            "active.kind = \"none\"\ntls.ca_file = \"{}\"\n",
            pki.ca_file()
        ))
        .build();
    let (balancer, _events) = start(&text).await;
    let mut client = Client::strict(balancer.local_addrs()[0]);
    for _ in 0..3 {
        // A large upload (read whole by the backend) and a large answer, on one TLS session.
        let answer = client.send("POST", "/", "app.test", big.clone()).await;
        assert_eq!(answer.status, 200);
        assert_eq!(answer.body, big);
    }
    assert_eq!(backend.accepted(), 1);
    balancer.shutdown(crate::support::DEADLINE).await;
}

#[test]
fn relative_tls_paths_of_a_pool_are_relative_to_the_config_file() {
    let pki = Pki::new("relative");
    let (cert, _key) = pki.leaf_files("client", &["capataz.test"]);
    let ca = pki.ca_file();
    let dir = std::path::Path::new(&ca).parent().unwrap().to_owned();
    // Written as bare file names: they resolve next to the config file, not in the test's
    // working directory (the crate's), where no such files are.
    assert!(!std::path::Path::new("ca.pem").exists());
    let text = r#"
[[listeners]]
address = "127.0.0.1:0"

[pools.web]
backends = [{ address = "127.0.0.1:9" }]
active.kind = "none"
[pools.web.tls]
ca_file = "ca.pem"
cert = "client.pem"
key = "client.key"
"#;
    let path = dir.join("pool-tls.toml");
    std::fs::write(&path, text).unwrap();
    let config = config::load(&path).unwrap_or_else(|error| panic!("{error}"));
    let tls = config.pools[0].tls.as_ref().unwrap();
    assert_eq!(tls.ca_file.as_deref(), Some(ca.as_str()));
    assert_eq!(tls.cert.as_deref(), Some(cert.as_str()));
    assert!(!tls.roots.is_empty());
    assert!(tls.identity.is_some());
}

#[tokio::test]
async fn every_probe_is_a_full_tls_handshake_while_traffic_resumes_sessions() {
    let pki = Pki::new("fresh-probes");
    // rustls's server keeps sessions by default: a client that offers one resumes it.
    let backend = tls_backend("b", &pki, &["127.0.0.1"]).await;
    let text = ConfigText::new(&[backend.entry()])
        .extra(&format!(
            "tls.ca_file = \"{}\"\n{TLS_CHECKS}",
            pki.ca_file()
        ))
        .build();
    let (balancer, _events) = start(&text).await;
    crate::support::wait::wait_until("ten probes", || backend.hits() >= 10).await;
    // Probes never resume: each one verifies the certificate the backend serves now.
    assert_eq!(backend.resumed(), 0, "probes resumed a TLS session");
    // Traffic does: each client connection gets a backend connection of its own (private
    // reuse), each a handshake, and the later ones resume the first one's session.
    let addr = balancer.local_addrs()[0];
    for _ in 0..3 {
        assert_eq!(Client::new(addr).get("/").await.status, 200);
    }
    assert!(backend.resumed() >= 1, "traffic resumed no session");
    balancer.shutdown(crate::support::DEADLINE).await;
}
