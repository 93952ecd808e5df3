//! End-to-end tests of operating capataz on loopback: the admin API (status and its explain
//! sentences, the token rule, manual overrides, the event stream), live reloads, graceful
//! shutdown and slow start.
//!
//! Real sockets, in-process backends whose behaviour each test scripts, probes every 30 ms, and
//! waits on events, counts or polled state with generous deadlines (never fixed sleeps).

use std::collections::HashMap;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use capataz::config;
use capataz::events::OverrideKind;
use capataz::health::Event;
use capataz::server::Balancer;
use capataz::sim::{Mode, SimBackend};
use capataz_health::{Reason, State};
use serde_json::Value;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::sync::broadcast;

use crate::support::balancer::{backends, parse, ConfigText, FAST_CHECKS};
use crate::support::client::{exchange, Client};
use crate::support::events::{is_transition, wait_for};
use crate::support::DEADLINE;

/// Passive checks that eject after three errors for long enough to look at the ejection.
const PASSIVE: &str = r#"
[pools.web.passive]
consecutive_errors = 3
ejection_time = "10s"
max_ejection_time = "20s"
max_ejected_percent = 50

[pools.web.retries]
attempts = 0
"#;

/// A config: an admin listener on a free loopback port (with the `admin` lines), one client
/// listener on a free port, and one pool `web` over `backends` (with `weights`, 1 when
/// missing), followed by `pool_extra`.
fn config_text(admin: &str, backends: &[&SimBackend], weights: &[u32], pool_extra: &str) -> String {
    let pairs: Vec<(String, SocketAddr)> = backends
        .iter()
        .map(|b| (b.name().to_owned(), b.addr()))
        .collect();
    ConfigText::new(&pairs)
        .weights(weights)
        .admin(admin)
        .extra(pool_extra)
        .build()
}

/// A running balancer, its events, and clients for its admin API and its listener.
struct Running {
    balancer: Balancer,
    events: broadcast::Receiver<Event>,
    admin: SocketAddr,
    proxy: Client,
}

impl Running {
    async fn start(text: &str) -> Running {
        Running::start_config(&parse(text), None).await
    }

    async fn start_from(file: &ConfigFile) -> Running {
        let config = config::load(&file.path).expect("valid test config file");
        Running::start_config(&config, Some(file.path.clone())).await
    }

    async fn start_config(config: &config::Config, path: Option<PathBuf>) -> Running {
        let (events, rx) = broadcast::channel(4096);
        let balancer = Balancer::start_with_path(config, events, path)
            .await
            .expect("balancer starts");
        let admin = balancer.admin_addr().expect("the admin API runs");
        let proxy = Client::new(balancer.local_addrs()[0]);
        Running {
            balancer,
            events: rx,
            admin,
            proxy,
        }
    }

    async fn get(&self, path: &str) -> Reply {
        admin_call(self.admin, "GET", path, None).await
    }

    async fn post(&self, path: &str) -> Reply {
        admin_call(self.admin, "POST", path, None).await
    }

    /// `GET /status/web/<backend>`, which must succeed.
    async fn backend(&self, backend: &str) -> Value {
        let reply = self.get(&format!("/status/web/{backend}")).await;
        assert_eq!(reply.status, 200, "{}", reply.json);
        reply.json
    }

    /// Sends `n` requests through the listener, all of which must succeed, and counts them per
    /// backend.
    async fn traffic(&mut self, n: usize) -> HashMap<String, usize> {
        let mut seen = HashMap::new();
        for _ in 0..n {
            let answer = self.proxy.get("/").await;
            assert_eq!(answer.status, 200, "a request failed");
            *seen.entry(answer.backend.unwrap_or_default()).or_default() += 1;
        }
        seen
    }

    async fn wait_for(&mut self, what: &str, want: impl Fn(&Event) -> bool) -> Event {
        wait_for(&mut self.events, what, want).await
    }
}

/// A config file in the temporary directory, removed on drop.
struct ConfigFile {
    path: PathBuf,
}

impl ConfigFile {
    fn new(text: &str) -> ConfigFile {
        static NEXT: AtomicUsize = AtomicUsize::new(0);
        let path = std::env::temp_dir().join(format!(
            "capataz-admin-test-{}-{}.toml",
            std::process::id(),
            NEXT.fetch_add(1, Ordering::Relaxed)
        ));
        let file = ConfigFile { path };
        file.write(text);
        file
    }

    fn write(&self, text: &str) {
        std::fs::write(&self.path, text).expect("write the test config file");
    }
}

impl Drop for ConfigFile {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.path);
    }
}

/// An admin API answer: status, headers, and the body as JSON (`Null` when it is not JSON).
struct Reply {
    status: u16,
    headers: http::HeaderMap,
    json: Value,
}

/// One request to the admin API on a fresh connection, with `authorization` as the header.
async fn admin_call(
    addr: SocketAddr,
    method: &str,
    path: &str,
    authorization: Option<&str>,
) -> Reply {
    let headers: Vec<(&str, &str)> = authorization
        .map(|v| ("authorization", v))
        .into_iter()
        .collect();
    let answer = exchange(addr, method, path, &addr.to_string(), &headers).await;
    Reply {
        status: answer.status,
        json: answer.json(),
        headers: answer.headers,
    }
}

/// The override event about `backend`, as `(kind, from, to, reason)`.
fn override_of<'a>(
    event: &'a Event,
    backend: &str,
) -> Option<(Option<OverrideKind>, &'a str, &'a str, &'a str)> {
    match event {
        Event::Override {
            backend: b,
            kind,
            from,
            to,
            reason,
            ..
        } if &**b == backend => Some((*kind, *from, *to, reason.as_str())),
        _ => None,
    }
}

fn text<'a>(value: &'a Value, pointer: &str) -> &'a str {
    value
        .pointer(pointer)
        .and_then(Value::as_str)
        .unwrap_or_else(|| panic!("no string at {pointer} in {value:#}"))
}

fn number(value: &Value, pointer: &str) -> f64 {
    value
        .pointer(pointer)
        .and_then(Value::as_f64)
        .unwrap_or_else(|| panic!("no number at {pointer} in {value:#}"))
}

// ---- Endpoints ----------------------------------------------------------------------------

#[tokio::test]
async fn status_lists_every_backend_and_explains_why_it_is_out() {
    let b = backends(&["good", "good2", "sick", "liar"]).await;
    b[3].set_traffic(Mode::Status(500));
    let all: Vec<&SimBackend> = b.iter().collect();
    let mut r = Running::start(&config_text(
        "",
        &all,
        &[],
        &format!("{FAST_CHECKS}{PASSIVE}"),
    ))
    .await;

    // The liar answers traffic with 500 while its probes pass: passive checks eject it.
    let end = tokio::time::Instant::now() + DEADLINE;
    while b[3].traffic_hits() < 3 {
        assert!(tokio::time::Instant::now() < end, "the liar got no traffic");
        r.proxy.get("/").await;
    }
    r.wait_for("liar ejected", |e| is_transition(e, "liar", State::Down))
        .await;
    // The sick one fails its probes: active checks take it DOWN.
    b[2].set_health(Mode::Status(503));
    r.wait_for("sick DOWN", |e| is_transition(e, "sick", State::Down))
        .await;

    let reply = r.get("/status").await;
    assert_eq!(reply.status, 200);
    assert_eq!(reply.headers["content-type"], "application/json");
    let pools = reply.json["pools"].as_array().expect("a pools array");
    assert_eq!(pools.len(), 1);
    let pool = &pools[0];
    assert_eq!(text(pool, "/name"), "web");
    assert_eq!(number(pool, "/backends_total"), 4.0);
    assert_eq!(number(pool, "/healthy"), 2.0);
    let listed: HashMap<&str, &Value> = pool["backends"]
        .as_array()
        .expect("a backends array")
        .iter()
        .map(|b| (text(b, "/name"), b))
        .collect();
    assert_eq!(listed.len(), 4);
    for (name, backend) in &listed {
        for pointer in ["/verdict", "/state", "/explain", "/since", "/address"] {
            text(backend, pointer);
        }
        for pointer in [
            "/active/fail_streak",
            "/active/pass_streak",
            "/passive/error_streak",
            "/weight",
            "/effective_weight",
        ] {
            number(backend, pointer);
        }
        assert!(
            !backend["history"]["probes"].as_array().unwrap().is_empty(),
            "{name} has no probe history"
        );
    }
    let good = listed["good"];
    assert_eq!(text(good, "/verdict"), "UP");
    assert_eq!(text(good, "/state"), "UP");
    assert!(text(good, "/explain").starts_with("UP since "), "{good:#}");

    let sick = listed["sick"];
    assert_eq!(text(sick, "/verdict"), "DOWN");
    assert_eq!(text(sick, "/state"), "DOWN");
    assert_eq!(text(sick, "/active/state"), "DOWN");
    assert!(number(sick, "/active/fail_streak") >= 3.0);
    let last_probe = sick["history"]["probes"]
        .as_array()
        .unwrap()
        .last()
        .unwrap();
    assert_eq!(text(last_probe, "/outcome"), "HTTP 503");
    assert_eq!(text(last_probe, "/result"), "FAIL");

    let liar = listed["liar"];
    assert_eq!(text(liar, "/verdict"), "DOWN");
    assert_eq!(text(liar, "/active/state"), "UP", "its probes pass");
    assert_eq!(text(liar, "/passive/ejection/state"), "ejected");
    assert_eq!(number(liar, "/passive/ejection/nth"), 1.0);
    let traffic = liar["history"]["traffic"].as_array().unwrap();
    assert!(
        traffic
            .iter()
            .any(|t| text(t, "/outcome") == "HTTP 500" && text(t, "/result") == "ERROR"),
        "{liar:#}"
    );

    // One backend at a time, with the sentence that says why it is out.
    let sick = r.backend("sick").await;
    let explain = text(&sick, "/explain");
    assert!(explain.starts_with("DOWN since "), "{explain}");
    assert!(explain.contains("3 consecutive failed probes"), "{explain}");
    assert!(
        explain.contains("needs 2 passing probes in a row"),
        "{explain}"
    );
    assert_eq!(text(&sick, "/last_transition/side"), "active");

    let liar = r.backend("liar").await;
    let explain = text(&liar, "/explain");
    assert!(explain.starts_with("ejected until "), "{explain}");
    assert!(explain.contains("1st ejection"), "{explain}");
    assert!(
        explain.contains("3 consecutive traffic errors"),
        "{explain}"
    );
    assert_eq!(text(&liar, "/last_transition/side"), "passive");

    // Unknown pools and backends, wrong methods, unknown paths: JSON errors.
    for (method, path, status) in [
        ("GET", "/status/nope/good", 404),
        ("GET", "/status/web/nope", 404),
        ("POST", "/status", 405),
        ("DELETE", "/status/web/good", 405),
        ("POST", "/events", 405),
        ("GET", "/backends/web/good/drain", 405),
        ("GET", "/reload", 405),
        ("GET", "/nope", 404),
        ("POST", "/nope/deeper", 404),
    ] {
        let reply = admin_call(r.admin, method, path, None).await;
        assert_eq!(reply.status, status, "{method} {path}: {}", reply.json);
        assert_eq!(reply.headers["content-type"], "application/json");
        let error = text(&reply.json, "/error");
        if status == 404 {
            assert!(
                error.contains("nope"),
                "{method} {path}: the error names what was not found: {error}"
            );
        }
    }
}

// ---- The token rule -----------------------------------------------------------------------

#[tokio::test]
async fn a_token_guards_every_request_unless_reads_are_open() {
    let b = backends(&["a"]).await;
    let r = Running::start(&config_text(
        "token = \"s3cret\"",
        &[&b[0]],
        &[],
        FAST_CHECKS,
    ))
    .await;
    // Each request, and the state of `a` once it has been let through.
    let requests = [
        ("GET", "/status", "UP"),
        ("GET", "/status/web/a", "UP"),
        ("POST", "/backends/web/a/drain", "DRAINING"),
        ("POST", "/backends/web/a/clear", "UP"),
    ];
    let mut state = "UP";
    for (method, path, after) in requests {
        for refused in [
            None,
            Some("Bearer wrong"),
            Some("s3cret"),
            Some("Bearer s3cret2"),
        ] {
            let reply = admin_call(r.admin, method, path, refused).await;
            assert_eq!(reply.status, 401, "{method} {path} with {refused:?}");
            assert_eq!(
                reply.headers["www-authenticate"],
                "Bearer realm=\"capataz\""
            );
            assert!(
                text(&reply.json, "/error").contains("Authorization: Bearer"),
                "{}",
                reply.json
            );
        }
        // A refused request changed nothing.
        let status = admin_call(r.admin, "GET", "/status/web/a", Some("Bearer s3cret")).await;
        assert_eq!(
            text(&status.json, "/state"),
            state,
            "after refused {method} {path}"
        );
        let reply = admin_call(r.admin, method, path, Some("Bearer s3cret")).await;
        assert_eq!(reply.status, 200, "{method} {path}: {}", reply.json);
        state = after;
        let status = admin_call(r.admin, "GET", "/status/web/a", Some("Bearer s3cret")).await;
        assert_eq!(text(&status.json, "/state"), state, "after {method} {path}");
    }

    // With open_read_only, reads need no token; anything that changes something still does.
    let r = Running::start(&config_text(
        "token = \"s3cret\"\nopen_read_only = true",
        &[&b[0]],
        &[],
        FAST_CHECKS,
    ))
    .await;
    assert_eq!(r.get("/status").await.status, 200);
    assert_eq!(r.get("/status/web/a").await.status, 200);
    for path in ["/backends/web/a/drain", "/reload"] {
        assert_eq!(r.post(path).await.status, 401, "POST {path}");
    }
    assert_eq!(text(&r.backend("a").await, "/state"), "UP");
    let reply = admin_call(
        r.admin,
        "POST",
        "/backends/web/a/drain",
        Some("Bearer s3cret"),
    )
    .await;
    assert_eq!(reply.status, 200, "{}", reply.json);
    assert_eq!(text(&r.backend("a").await, "/state"), "DRAINING");
}

#[test]
fn a_non_loopback_admin_address_without_a_token_is_a_config_error() {
    let rest = r#"
[[listeners]]
address = "127.0.0.1:0"

[pools.web]
backends = [{ address = "127.0.0.1:9001" }]
"#;
    let error = config::parse_str(
        &format!("[admin]\naddress = \"0.0.0.0:9901\"\n{rest}"),
        "<test>",
    )
    .expect_err("a non-loopback admin address without a token is refused")
    .to_string();
    assert!(error.contains("admin.address"), "{error}");
    assert!(
        error.contains("admin.token"),
        "the error says what to do: {error}"
    );
    let config = parse(&format!(
        "[admin]\naddress = \"0.0.0.0:9901\"\ntoken = \"s3cret\"\n{rest}"
    ));
    assert_eq!(config.admin.unwrap().token.as_deref(), Some("s3cret"));
}

// ---- Overrides ----------------------------------------------------------------------------

async fn two_backends() -> (Vec<SimBackend>, Running) {
    let b = backends(&["a", "b"]).await;
    let r = Running::start(&config_text("", &[&b[0], &b[1]], &[], FAST_CHECKS)).await;
    (b, r)
}

#[tokio::test]
async fn drain_stops_new_requests_and_clear_brings_them_back() {
    let (b, mut r) = two_backends().await;
    assert!(r.traffic(10).await.get("b").is_some_and(|&n| n > 0));

    let reply = r.post("/backends/web/b/drain").await;
    assert_eq!(reply.status, 200, "{}", reply.json);
    assert_eq!(text(&reply.json, "/state"), "DRAINING");
    assert_eq!(text(&reply.json, "/override"), "drain");
    assert!(reply.json["ttl_ms"].is_null());
    let event = r
        .wait_for("b drained", |e| override_of(e, "b").is_some())
        .await;
    let (kind, from, to, reason) = override_of(&event, "b").unwrap();
    assert_eq!(
        (kind, from, to),
        (Some(OverrideKind::Drain), "UP", "DRAINING")
    );
    assert!(reason.contains("until cleared"), "{reason}");

    let status = r.backend("b").await;
    assert_eq!(text(&status, "/state"), "DRAINING");
    assert_eq!(text(&status, "/verdict"), "UP");
    assert_eq!(status["eligible"], false);
    assert_eq!(text(&status, "/override/kind"), "drain");
    assert!(status["override"]["until"].is_null());
    assert!(text(&status, "/explain").starts_with("DRAINING since "));

    let hits = b[1].traffic_hits();
    assert_eq!(r.traffic(20).await.get("a"), Some(&20));
    assert_eq!(
        b[1].traffic_hits(),
        hits,
        "a draining backend got new requests"
    );

    let reply = r.post("/backends/web/b/clear").await;
    assert_eq!(reply.status, 200, "{}", reply.json);
    assert_eq!(text(&reply.json, "/state"), "UP");
    assert!(reply.json["override"].is_null());
    let event = r
        .wait_for("b cleared", |e| {
            override_of(e, "b").is_some_and(|(kind, ..)| kind.is_none())
        })
        .await;
    let (_, from, to, reason) = override_of(&event, "b").unwrap();
    assert_eq!((from, to), ("DRAINING", "UP"));
    assert!(reason.contains("cleared by an operator"), "{reason}");
    let status = r.backend("b").await;
    assert_eq!(text(&status, "/state"), "UP");
    assert!(status["override"].is_null());
    assert!(r.traffic(20).await.get("b").is_some_and(|&n| n > 0));
    assert!(b[1].traffic_hits() > hits);
}

#[tokio::test]
async fn down_forces_a_healthy_backend_out() {
    let (b, mut r) = two_backends().await;
    let reply = r.post("/backends/web/b/down").await;
    assert_eq!(reply.status, 200, "{}", reply.json);
    assert_eq!(text(&reply.json, "/state"), "FORCED_DOWN");
    let event = r
        .wait_for("b forced down", |e| override_of(e, "b").is_some())
        .await;
    let (kind, from, to, _) = override_of(&event, "b").unwrap();
    assert_eq!(
        (kind, from, to),
        (Some(OverrideKind::Down), "UP", "FORCED_DOWN")
    );

    // Its probes keep passing, and it still gets nothing.
    let probes = b[1].health_hits();
    assert!(b[1].wait_health_hits(probes + 3, DEADLINE).await);
    let hits = b[1].traffic_hits();
    assert_eq!(r.traffic(20).await.get("a"), Some(&20));
    assert_eq!(b[1].traffic_hits(), hits);
    let status = r.backend("b").await;
    assert_eq!(text(&status, "/verdict"), "UP");
    assert_eq!(text(&status, "/state"), "FORCED_DOWN");
    assert_eq!(text(&status, "/override/kind"), "down");
    let explain = text(&status, "/explain");
    assert!(explain.starts_with("FORCED DOWN since "), "{explain}");
    assert!(explain.contains("health checks say UP"), "{explain}");

    assert_eq!(r.post("/backends/web/b/clear").await.status, 200);
    assert!(r.traffic(20).await.get("b").is_some_and(|&n| n > 0));
}

#[tokio::test]
async fn up_forces_a_failing_backend_in() {
    let (b, mut r) = two_backends().await;
    let reply = r.post("/backends/web/b/up").await;
    assert_eq!(reply.status, 200, "{}", reply.json);
    assert_eq!(text(&reply.json, "/state"), "FORCED_UP");
    b[1].set_health(Mode::Status(503));
    r.wait_for("b DOWN", |e| is_transition(e, "b", State::Down))
        .await;

    let status = r.backend("b").await;
    assert_eq!(text(&status, "/verdict"), "DOWN");
    assert_eq!(text(&status, "/state"), "FORCED_UP");
    assert_eq!(status["eligible"], true);
    let explain = text(&status, "/explain");
    assert!(explain.starts_with("FORCED UP since "), "{explain}");
    assert!(explain.contains("health checks say DOWN"), "{explain}");
    let hits = b[1].traffic_hits();
    assert!(r.traffic(20).await.get("b").is_some_and(|&n| n > 0));
    assert!(
        b[1].traffic_hits() > hits,
        "a forced-up backend got no traffic"
    );

    // Cleared, the health checks decide again: out.
    assert_eq!(r.post("/backends/web/b/clear").await.status, 200);
    let event = r
        .wait_for("b cleared", |e| {
            override_of(e, "b").is_some_and(|(kind, ..)| kind.is_none())
        })
        .await;
    let (_, from, to, _) = override_of(&event, "b").unwrap();
    assert_eq!((from, to), ("FORCED_UP", "DOWN"));
    let hits = b[1].traffic_hits();
    assert_eq!(r.traffic(20).await.get("a"), Some(&20));
    assert_eq!(b[1].traffic_hits(), hits);
}

#[tokio::test]
async fn an_override_with_a_ttl_lapses_by_itself() {
    let (b, mut r) = two_backends().await;
    let reply = r.post("/backends/web/b/drain?ttl=300ms").await;
    assert_eq!(reply.status, 200, "{}", reply.json);
    assert_eq!(number(&reply.json, "/ttl_ms"), 300.0);
    let status = r.backend("b").await;
    assert_eq!(text(&status, "/state"), "DRAINING");
    text(&status, "/override/until");
    assert!(text(&status, "/explain").contains("(manual, until "));

    // Until it lapses, a request reaches b only once the override is gone (the override is
    // cleared before the snapshot that readmits b is published).
    let pool = r.balancer.pool("web").unwrap();
    let end = tokio::time::Instant::now() + DEADLINE;
    loop {
        assert!(
            tokio::time::Instant::now() < end,
            "b never got traffic back"
        );
        let answer = r.proxy.get("/").await;
        assert_eq!(answer.status, 200);
        if answer.backend.as_deref() == Some("b") {
            assert!(
                pool.views()[1].info.override_.is_none(),
                "b got a request while draining"
            );
            break;
        }
        tokio::task::yield_now().await;
    }
    let event = r
        .wait_for("the drain lapsing", |e| {
            override_of(e, "b").is_some_and(|(kind, ..)| kind.is_none())
        })
        .await;
    let (_, from, to, reason) = override_of(&event, "b").unwrap();
    assert_eq!((from, to), ("DRAINING", "UP"));
    assert!(reason.contains("lapsed"), "{reason}");
    assert!(r.backend("b").await["override"].is_null());
    let hits = b[1].traffic_hits();
    assert!(r.traffic(10).await.get("b").is_some_and(|&n| n > 0));
    assert!(b[1].traffic_hits() > hits);

    // Bad requests change nothing.
    for (path, status, says) in [
        ("/backends/web/b/drain?ttl=soon", 400, "ttl"),
        ("/backends/web/b/drain?ttl=", 400, "ttl"),
        ("/backends/web/b/explode", 404, "explode"),
        ("/backends/web/nope/drain", 404, "nope"),
        ("/backends/nope/b/drain", 404, "nope"),
    ] {
        let reply = r.post(path).await;
        assert_eq!(reply.status, status, "POST {path}: {}", reply.json);
        let error = text(&reply.json, "/error");
        assert!(error.contains(says), "POST {path}: {error}");
    }
    assert_eq!(text(&r.backend("b").await, "/state"), "UP");
}

// ---- The event stream ---------------------------------------------------------------------

#[tokio::test]
async fn the_event_stream_carries_transitions() {
    let (b, r) = two_backends().await;
    let mut stream = TcpStream::connect(r.admin).await.unwrap();
    stream
        .write_all(format!("GET /events HTTP/1.1\r\nHost: {}\r\n\r\n", r.admin).as_bytes())
        .await
        .unwrap();
    let mut seen = String::new();
    let end = tokio::time::Instant::now() + DEADLINE;
    // The greeting comes once the stream is subscribed, so nothing after it is missed.
    read_until(&mut stream, &mut seen, end, |s| {
        s.contains(": capataz events")
    })
    .await;
    let head = seen.to_ascii_lowercase();
    assert!(head.starts_with("http/1.1 200"), "{seen}");
    assert!(head.contains("content-type: text/event-stream"), "{seen}");

    b[1].set_health(Mode::Status(503));
    let message = |s: &str| -> Option<Value> {
        s.split("event: transition\ndata: ")
            .skip(1)
            .filter_map(|rest| rest.split_once('\n'))
            .filter_map(|(line, _)| serde_json::from_str::<Value>(line).ok())
            .find(|data| data["backend"] == "b" && data["to"] == "DOWN")
    };
    read_until(&mut stream, &mut seen, end, |s| message(s).is_some()).await;
    let data = message(&seen).unwrap();
    assert_eq!(text(&data, "/type"), "transition");
    assert_eq!(text(&data, "/pool"), "web");
    assert_eq!(text(&data, "/from"), "UP");
    assert_eq!(text(&data, "/side"), "active");
    let reason = text(&data, "/reason");
    assert!(reason.contains("3 consecutive failed probes"), "{reason}");
    text(&data, "/time");
}

/// Reads from `stream` into `seen` until `done(seen)`, failing at `end`.
async fn read_until(
    stream: &mut TcpStream,
    seen: &mut String,
    end: tokio::time::Instant,
    done: impl Fn(&str) -> bool,
) {
    let mut buf = [0u8; 4096];
    while !done(seen) {
        let n = tokio::time::timeout_at(end, stream.read(&mut buf))
            .await
            .unwrap_or_else(|_| panic!("the event stream went quiet: {seen}"))
            .expect("read the event stream");
        assert!(n > 0, "the event stream closed: {seen}");
        seen.push_str(&String::from_utf8_lossy(&buf[..n]));
    }
}

// ---- Reload -------------------------------------------------------------------------------

/// The fields of a backend's status that a reload must not touch.
fn health_fields(status: &Value) -> Value {
    serde_json::json!({
        "verdict": status["verdict"],
        "state": status["state"],
        "since": status["since"],
        "active": {
            "state": status["active"]["state"],
            "fail_streak": status["active"]["fail_streak"],
            "pass_streak": status["active"]["pass_streak"],
        },
        "passive": status["passive"],
        "last_transition": status["last_transition"],
        "probes": status["history"]["probes"],
    })
}

#[tokio::test]
async fn a_reload_keeps_the_health_of_unchanged_backends() {
    let b = backends(&["a", "b"]).await;
    let both = [&b[0], &b[1]];
    let file = ConfigFile::new(&config_text("", &both, &[], FAST_CHECKS));
    let mut r = Running::start_from(&file).await;
    b[1].set_health(Mode::Status(503));
    r.wait_for("b DOWN", |e| is_transition(e, "b", State::Down))
        .await;
    let before = r.backend("b").await;
    let fail_streak = number(&before, "/active/fail_streak");
    assert!(fail_streak >= 3.0);

    // The operator slows the probes down: the backends themselves are unchanged.
    let slow = FAST_CHECKS.replace("interval = \"30ms\"", "interval = \"1h\"");
    let config = parse(&config_text("", &both, &[], &slow));
    let summary = r
        .balancer
        .reload(&config)
        .await
        .expect("the reload applies");
    assert_eq!((summary.kept, summary.added, summary.removed), (2, 0, 0));
    let after = r.backend("b").await;
    assert_eq!(text(&after, "/verdict"), "DOWN", "{after:#}");
    assert!(
        number(&after, "/active/fail_streak") >= fail_streak,
        "{after:#}"
    );
    assert_eq!(after["last_transition"], before["last_transition"]);
    assert_eq!(after["since"], before["since"]);
    let a = r.backend("a").await;
    assert_eq!(text(&a, "/state"), "UP");
    assert_eq!(r.traffic(10).await.get("a"), Some(&10));

    // With no probe due for an hour, nothing moves: a second reload, from the file, keeps
    // every field exactly.
    let (a_before, b_before) = (r.backend("a").await, r.backend("b").await);
    file.write(&format!(
        "# touched\n{}",
        config_text("", &both, &[], &slow)
    ));
    let reply = r.post("/reload").await;
    assert_eq!(reply.status, 200, "{}", reply.json);
    assert_eq!(reply.json["reloaded"], true);
    assert_eq!(number(&reply.json, "/kept"), 2.0);
    assert_eq!(number(&reply.json, "/added"), 0.0);
    assert_eq!(number(&reply.json, "/removed"), 0.0);
    let (a_after, b_after) = (r.backend("a").await, r.backend("b").await);
    assert_eq!(health_fields(&a_after), health_fields(&a_before));
    assert_eq!(health_fields(&b_after), health_fields(&b_before));
    assert_eq!(text(&a_after, "/state"), "UP");
    assert_eq!(text(&b_after, "/state"), "DOWN");
    assert_eq!(
        number(&b_after, "/active/fail_streak"),
        number(&b_before, "/active/fail_streak")
    );
    assert_eq!(r.traffic(10).await.get("a"), Some(&10));
}

#[tokio::test]
async fn an_invalid_reload_is_refused_and_the_old_config_keeps_serving() {
    let b = backends(&["a", "b"]).await;
    let both = [&b[0], &b[1]];
    let text_before = config_text("", &both, &[], FAST_CHECKS);
    let file = ConfigFile::new(&text_before);
    let mut r = Running::start_from(&file).await;
    let config_before = r.balancer.shared().config();

    let bad_interval = FAST_CHECKS.replace("\"30ms\"", "\"2x\"");
    let in_use = format!("{text_before}\n[[listeners]]\naddress = \"{}\"\n", r.admin);
    for (bad, says) in [
        (
            config_text("", &[&b[0]], &[], &bad_interval),
            "pools.web.active.interval",
        ),
        (
            config_text("", &both, &[], &format!("{FAST_CHECKS}\nbogus = 1\n")),
            "bogus",
        ),
        // Valid, but a new listener cannot bind: nothing changes either.
        (in_use, "cannot listen on"),
    ] {
        file.write(&bad);
        let reply = r.post("/reload").await;
        assert_eq!(reply.status, 422, "{}", reply.json);
        let error = text(&reply.json, "/error");
        assert!(error.contains("reload refused"), "{error}");
        assert!(
            error.contains(says),
            "the error names the problem ({says}): {error}"
        );

        assert_eq!(r.balancer.shared().config(), config_before);
        let seen = r.traffic(10).await;
        assert_eq!((seen.get("a"), seen.get("b")), (Some(&5), Some(&5)));
        let status = r.get("/status").await;
        assert_eq!(
            status.json["pools"][0]["backends"]
                .as_array()
                .unwrap()
                .len(),
            2
        );
    }
    assert_eq!(r.balancer.local_addrs().len(), 1);
}

#[tokio::test]
async fn a_backend_added_by_a_reload_gets_traffic_only_after_rise_probes() {
    let b = backends(&["a", "new"]).await;
    b[1].set_health(Mode::Status(503));
    let file = ConfigFile::new(&config_text("", &[&b[0]], &[], FAST_CHECKS));
    let mut r = Running::start_from(&file).await;

    file.write(&config_text("", &[&b[0], &b[1]], &[], FAST_CHECKS));
    let reply = r.post("/reload").await;
    assert_eq!(reply.status, 200, "{}", reply.json);
    assert_eq!(number(&reply.json, "/kept"), 1.0);
    assert_eq!(number(&reply.json, "/added"), 1.0);
    let status = r.backend("new").await;
    assert_eq!(text(&status, "/verdict"), "DOWN", "{status:#}");
    assert_eq!(status["eligible"], false);
    let explain = text(&status, "/explain");
    assert!(explain.starts_with("DOWN since "), "{explain}");
    assert!(
        explain.contains("needs 2 passing probes in a row"),
        "{explain}"
    );

    // Probed but failing: no traffic.
    assert!(b[1].wait_health_hits(3, DEADLINE).await);
    assert_eq!(r.traffic(20).await.get("a"), Some(&20));
    assert_eq!(b[1].traffic_hits(), 0, "a gated backend got traffic");

    b[1].set_health(Mode::Status(200));
    let event = r
        .wait_for("new UP", |e| is_transition(e, "new", State::Up))
        .await;
    let Event::Transition { transition, .. } = event else {
        unreachable!("matched a transition")
    };
    assert!(
        matches!(transition.reason, Reason::ProbesPassed { streak: 2, .. }),
        "{:?}",
        transition.reason
    );
    assert_eq!(b[1].traffic_hits(), 0);
    assert!(r.traffic(20).await.get("new").is_some_and(|&n| n > 0));
    assert!(b[1].traffic_hits() > 0);
}

#[tokio::test]
async fn a_removed_backend_finishes_its_in_flight_request_and_gets_no_more() {
    let b = backends(&["a", "b"]).await;
    b[1].set_traffic(Mode::Delay(Duration::from_millis(700), 200));
    let mut r = Running::start(&config_text("", &[&b[0], &b[1]], &[], FAST_CHECKS)).await;
    let addr = r.balancer.local_addrs()[0];
    // Round robin sends one of two requests to b, which answers late.
    let requests: Vec<_> = (0..2)
        .map(|_| tokio::spawn(async move { Client::new(addr).get("/").await }))
        .collect();
    assert!(b[1].wait_traffic_hits(1, DEADLINE).await);

    let config = parse(&config_text("", &[&b[0]], &[], FAST_CHECKS));
    let summary = r
        .balancer
        .reload(&config)
        .await
        .expect("the reload applies");
    assert_eq!((summary.kept, summary.added, summary.removed), (1, 0, 1));
    assert!(
        requests.iter().any(|t| !t.is_finished()),
        "the slow request finished before the reload"
    );
    assert_eq!(r.traffic(20).await.get("a"), Some(&20));
    assert_eq!(
        b[1].traffic_hits(),
        1,
        "a removed backend got a new request"
    );
    let status = r.get("/status/web/b").await;
    assert_eq!(status.status, 404);

    let mut served = Vec::new();
    for request in requests {
        let answer = request.await.unwrap();
        assert_eq!(answer.status, 200, "a request failed across the reload");
        served.push(answer.backend.unwrap());
    }
    served.sort();
    assert_eq!(served, ["a", "b"]);

    // Nobody probes it any more (one probe may have been under way).
    let probes = b[1].health_hits();
    assert!(
        b[0].wait_health_hits(b[0].health_hits() + 5, DEADLINE)
            .await
    );
    assert!(b[1].health_hits() <= probes + 1);
}

// ---- Shutdown -----------------------------------------------------------------------------

#[tokio::test]
async fn shutdown_lets_a_slow_request_finish_then_refuses_connections() {
    let b = backends(&["a"]).await;
    let mut r = Running::start(&config_text("", &[&b[0]], &[], FAST_CHECKS)).await;
    let addr = r.balancer.local_addrs()[0];
    // An idle keep-alive connection does not hold the shutdown up.
    assert_eq!(r.traffic(1).await.get("a"), Some(&1));
    b[0].set_traffic(Mode::Delay(Duration::from_millis(500), 200));
    let slow = tokio::spawn(async move { Client::new(addr).get("/").await });
    assert!(b[0].wait_traffic_hits(2, DEADLINE).await);

    let started = tokio::time::Instant::now();
    r.balancer.shutdown(Duration::from_secs(10)).await;
    let took = started.elapsed();
    assert!(took < Duration::from_secs(5), "shutdown waited {took:?}");
    let answer = tokio::time::timeout(DEADLINE, slow)
        .await
        .expect("the slow request ends")
        .unwrap();
    assert_eq!(answer.status, 200, "the in-flight request was cut");
    assert_eq!(answer.backend.as_deref(), Some("a"));
    assert!(
        TcpStream::connect(addr).await.is_err(),
        "a connection was accepted after shutdown"
    );
}

/// Regression: `shutdown` returned while the accept loops were merely aborted, so for a moment
/// the kernel still queued new connections on the listening sockets (and reset them later)
/// instead of refusing them. The race needs worker threads, and several rounds to show.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shutdown_closes_the_listening_sockets_before_it_returns() {
    let b = backends(&["a"]).await;
    for _ in 0..20 {
        let r = Running::start(&config_text("", &[&b[0]], &[], FAST_CHECKS)).await;
        let addr = r.balancer.local_addrs()[0];
        let admin = r.admin;
        r.balancer.shutdown(Duration::from_secs(10)).await;
        assert!(
            TcpStream::connect(addr).await.is_err(),
            "a connection was accepted after shutdown"
        );
        assert!(
            TcpStream::connect(admin).await.is_err(),
            "the admin API accepted a connection after shutdown"
        );
    }
}

// ---- Slow start ---------------------------------------------------------------------------

#[tokio::test]
async fn slow_start_ramps_a_recovered_backend_up_to_its_weight() {
    let b = backends(&["a", "b"]).await;
    let extra = format!("slow_start = \"1s\"\n{FAST_CHECKS}");
    let mut r = Running::start(&config_text("", &[&b[0], &b[1]], &[1, 10], &extra)).await;
    // At process start every backend has its full weight.
    let status = r.backend("b").await;
    assert_eq!(number(&status, "/weight"), 10.0);
    assert_eq!(number(&status, "/effective_weight"), 10.0);

    b[1].set_health(Mode::Status(503));
    r.wait_for("b DOWN", |e| is_transition(e, "b", State::Down))
        .await;
    b[1].set_health(Mode::Status(200));
    r.wait_for("b UP", |e| is_transition(e, "b", State::Up))
        .await;
    let up_at = tokio::time::Instant::now();
    let status = r.backend("b").await;
    let first = number(&status, "/effective_weight");
    assert!(first > 0.0 && first <= 3.0, "starts low: {status:#}");
    let explain = text(&status, "/explain");
    assert!(explain.contains("slow start: weight"), "{explain}");

    // It ramps up, never down, and reaches the full weight after about a second.
    let mut last = first;
    let end = tokio::time::Instant::now() + DEADLINE;
    loop {
        let status = r.backend("b").await;
        let weight = number(&status, "/effective_weight");
        assert!(weight >= last, "the ramp went down: {last} then {weight}");
        last = weight;
        if weight == 10.0 {
            assert!(!text(&status, "/explain").contains("slow start"));
            break;
        }
        assert!(
            tokio::time::Instant::now() < end,
            "never reached full weight: {status:#}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let took = up_at.elapsed();
    assert!(
        took >= Duration::from_millis(800),
        "full weight after only {took:?}"
    );
}
