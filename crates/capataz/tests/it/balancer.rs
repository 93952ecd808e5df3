//! End-to-end tests of the balancer on loopback: real sockets, in-process backends whose
//! behaviour each test scripts, short probe intervals, and waits on events or counts with
//! generous deadlines (never fixed sleeps).

use std::collections::HashMap;
use std::time::Duration;

use bytes::Bytes;
use capataz::health::Notice;
use capataz::sim::{Mode, SimBackend};
use capataz_health::{Ejection, Reason, State};

use crate::support::balancer::{backends, start, ConfigText, FAST_CHECKS};
use crate::support::client::Client;
use crate::support::events::{count_transitions, transition_of, wait_for};
use crate::support::DEADLINE;

/// A config with one listener on a free port and one pool `web` over `backends` (with
/// `weights`, 1 when empty), plus `extra` TOML lines appended to the pool's tables.
fn config_text(backends: &[SimBackend], weights: &[u32], pool_extra: &str) -> String {
    ConfigText::sims(backends)
        .weights(weights)
        .extra(pool_extra)
        .build()
}

#[tokio::test]
async fn traffic_follows_weights_and_only_reaches_up_backends() {
    let b = backends(&["a", "b", "c"]).await;
    let (balancer, mut rx) = start(&config_text(&b, &[1, 2, 3], FAST_CHECKS)).await;
    let mut client = Client::new(balancer.local_addrs()[0]);
    let mut counts: HashMap<String, u32> = HashMap::new();
    for _ in 0..600 {
        let answer = client.get("/").await;
        assert_eq!(answer.status, 200);
        *counts.entry(answer.backend.unwrap()).or_default() += 1;
    }
    assert_eq!((counts["a"], counts["b"], counts["c"]), (100, 200, 300));

    b[2].set_health(Mode::Status(503));
    let event = wait_for(&mut rx, "c DOWN", |e| {
        transition_of(e, "c", State::Down).is_some()
    })
    .await;
    let t = *transition_of(&event, "c", State::Down).unwrap();
    assert!(matches!(
        t.reason,
        Reason::ProbesFailed {
            streak: 3,
            last: capataz_health::Outcome::Status(503),
            mismatch: None,
        }
    ));
    let hits_before = b[2].traffic_hits();
    for _ in 0..90 {
        let answer = client.get("/").await;
        assert_eq!(answer.status, 200);
        assert_ne!(
            answer.backend.as_deref(),
            Some("c"),
            "a DOWN backend got traffic"
        );
    }
    assert_eq!(b[2].traffic_hits(), hits_before);
}

#[tokio::test]
async fn down_after_fall_failed_probes_and_up_after_rise_passes() {
    let b = backends(&["a", "b"]).await;
    let (balancer, mut rx) = start(&config_text(&b, &[], FAST_CHECKS)).await;
    b[0].set_health(Mode::Hang);
    let event = wait_for(&mut rx, "a DOWN", |e| {
        transition_of(e, "a", State::Down).is_some()
    })
    .await;
    let t = *transition_of(&event, "a", State::Down).unwrap();
    assert_eq!(
        t.reason,
        Reason::ProbesFailed {
            streak: 3,
            last: capataz_health::Outcome::Timeout,
            mismatch: None,
        }
    );
    assert_eq!(
        t.reason.to_string(),
        "3 consecutive failed probes, last: TIMEOUT"
    );
    b[0].set_health(Mode::Status(200));
    let event = wait_for(&mut rx, "a UP", |e| {
        transition_of(e, "a", State::Up).is_some()
    })
    .await;
    let t = *transition_of(&event, "a", State::Up).unwrap();
    assert!(
        matches!(t.reason, Reason::ProbesPassed { streak: 2, .. }),
        "{:?}",
        t.reason
    );
    let pool = balancer.pool("web").unwrap();
    assert_eq!(pool.verdict(0), State::Up);
}

#[tokio::test]
async fn crashed_backend_is_refused_then_readmitted_after_restart() {
    let b = backends(&["a", "b"]).await;
    let (_balancer, mut rx) = start(&config_text(&b, &[], FAST_CHECKS)).await;
    b[1].crash();
    let event = wait_for(&mut rx, "b DOWN", |e| {
        transition_of(e, "b", State::Down).is_some()
    })
    .await;
    let t = *transition_of(&event, "b", State::Down).unwrap();
    assert!(matches!(t.reason, Reason::ProbesFailed { streak: 3, .. }));
    b[1].restart().await.unwrap();
    wait_for(&mut rx, "b UP", |e| {
        transition_of(e, "b", State::Up).is_some()
    })
    .await;
}

const PASSIVE: &str = r#"
[pools.web.active]
interval = "30ms"
timeout = "100ms"

[pools.web.passive]
consecutive_errors = 3
ejection_time = "300ms"
max_ejection_time = "2s"
max_ejected_percent = 50

[pools.web.retries]
attempts = 0
"#;

/// [`PASSIVE`] with ejections of `ejection` (at most `max`).
fn passive_ejecting_for(ejection: &str, max: &str) -> String {
    PASSIVE
        .replace(
            "ejection_time = \"300ms\"",
            &format!("ejection_time = \"{ejection}\""),
        )
        .replace(
            "max_ejection_time = \"2s\"",
            &format!("max_ejection_time = \"{max}\""),
        )
}

#[tokio::test]
async fn passive_checks_eject_a_backend_whose_probes_pass_and_readmit_it_on_probation() {
    let b = backends(&["good", "liar"]).await;
    b[1].set_traffic(Mode::Status(500));
    // An ejection of 2 s, not 300 ms: the requests sent while it lasts are checked, and on a
    // loaded machine 300 ms could pass before the first of them is answered.
    let (balancer, mut rx) = start(&config_text(&b, &[], &passive_ejecting_for("2s", "4s"))).await;
    let mut client = Client::new(balancer.local_addrs()[0]);
    // Round robin alternates, so the liar's third 500 comes with the sixth request.
    let mut errors = 0;
    while errors < 3 {
        let answer = client.get("/").await;
        if answer.status == 500 {
            errors += 1;
        }
    }
    let event = wait_for(&mut rx, "liar ejected", |e| {
        transition_of(e, "liar", State::Down).is_some()
    })
    .await;
    let t = *transition_of(&event, "liar", State::Down).unwrap();
    match t.reason {
        Reason::TrafficErrors {
            streak: 3,
            last,
            ejection: Some(ejection),
        } => {
            assert_eq!(last, capataz_health::Outcome::Status(500));
            assert_eq!(ejection.nth, 1);
            assert_eq!(ejection.duration, Duration::from_secs(2));
        }
        other => panic!("unexpected reason {other:?}"),
    }
    // While ejected, no traffic reaches it: every request answered while the engine still
    // says so went to the good one (a request answered once the ejection ended may reach
    // either, and ends the check).
    let pool = balancer.pool("web").unwrap();
    let hits = b[1].traffic_hits();
    let mut while_ejected = 0;
    for _ in 0..20 {
        let backend = client.get("/").await.backend;
        if !pool.health()[1].passive.is_ejected() {
            break;
        }
        assert_eq!(backend.as_deref(), Some("good"));
        assert_eq!(b[1].traffic_hits(), hits);
        while_ejected += 1;
    }
    assert!(
        while_ejected > 0,
        "no request was answered during the ejection"
    );
    // After the ejection time it is back on probation.
    let event = wait_for(&mut rx, "liar on probation", |e| {
        transition_of(e, "liar", State::Up).is_some()
    })
    .await;
    assert!(matches!(
        transition_of(&event, "liar", State::Up).unwrap().reason,
        Reason::EjectionExpired { nth: 1, .. }
    ));
    // Healed: the first good response readmits it for good.
    b[1].set_traffic(Mode::Status(200));
    let end = tokio::time::Instant::now() + DEADLINE;
    while b[1].traffic_hits() == hits {
        assert!(
            tokio::time::Instant::now() < end,
            "the backend on probation got no traffic"
        );
        assert_eq!(client.get("/").await.status, 200);
    }
    let pool = balancer.pool("web").unwrap();
    assert_eq!(pool.health()[1].passive.ejection, Ejection::None);
    assert_eq!(pool.verdict(1), State::Up);
}

#[tokio::test]
async fn an_error_on_probation_ejects_again_for_longer() {
    let b = backends(&["good", "liar"]).await;
    b[1].set_traffic(Mode::Status(502));
    let (balancer, mut rx) = start(&config_text(&b, &[], PASSIVE)).await;
    let mut client = Client::new(balancer.local_addrs()[0]);
    let mut second = None;
    let end = tokio::time::Instant::now() + DEADLINE;
    while second.is_none() && tokio::time::Instant::now() < end {
        client.get("/").await;
        while let Ok(event) = rx.try_recv() {
            if let Some(t) = transition_of(&event, "liar", State::Down) {
                if let Reason::ProbationFailed { ejection, .. } = t.reason {
                    second = Some(ejection);
                }
            }
        }
        tokio::task::yield_now().await;
    }
    let ejection = second.expect("a second ejection after a failed probation");
    assert_eq!(ejection.nth, 2);
    assert_eq!(ejection.duration, Duration::from_millis(600));
}

#[tokio::test]
async fn client_errors_never_eject() {
    let b = backends(&["a", "b"]).await;
    b[0].set_traffic(Mode::Status(404));
    b[1].set_traffic(Mode::Status(403));
    let (balancer, mut rx) = start(&config_text(&b, &[], PASSIVE)).await;
    let mut client = Client::new(balancer.local_addrs()[0]);
    for _ in 0..60 {
        let status = client.get("/missing").await.status;
        assert!(status == 404 || status == 403);
    }
    assert_eq!(count_transitions(&mut rx), 0);
    let pool = balancer.pool("web").unwrap();
    assert!(pool.health().iter().all(|h| h.passive.error_streak == 0));
}

#[tokio::test]
async fn a_backend_killed_under_steady_traffic_costs_clients_no_errors() {
    let b = backends(&["a", "b", "c"]).await;
    let (balancer, mut rx) = start(&config_text(&b, &[], FAST_CHECKS)).await;
    let addr = balancer.local_addrs()[0];
    let mut clients = Vec::new();
    for _ in 0..4 {
        clients.push(tokio::spawn(async move {
            let mut client = Client::new(addr);
            let mut failures = Vec::new();
            for _ in 0..150 {
                let answer = client.get("/").await;
                if answer.status != 200 {
                    failures.push(answer.status);
                }
            }
            failures
        }));
    }
    assert!(b[1].wait_traffic_hits(50, DEADLINE).await);
    b[1].crash();
    let mut failures = Vec::new();
    for c in clients {
        failures.extend(c.await.unwrap());
    }
    assert!(failures.is_empty(), "clients saw errors: {failures:?}");
    wait_for(&mut rx, "b DOWN", |e| {
        transition_of(e, "b", State::Down).is_some()
    })
    .await;
}

#[tokio::test]
async fn all_down_fails_open_by_default_and_says_so() {
    let b = backends(&["a", "b"]).await;
    let (balancer, mut rx) = start(&config_text(&b, &[], FAST_CHECKS)).await;
    for backend in &b {
        backend.set_health(Mode::Status(500));
    }
    wait_for(&mut rx, "all down", |e| matches!(e, Notice::AllDown { .. })).await;
    let mut client = Client::new(balancer.local_addrs()[0]);
    let mut seen = HashMap::<String, u32>::new();
    for _ in 0..10 {
        let answer = client.get("/").await;
        assert_eq!(answer.status, 200, "fail-open still serves");
        *seen.entry(answer.backend.unwrap()).or_default() += 1;
    }
    assert_eq!(seen.len(), 2, "fail-open spreads over every backend");
    b[0].set_health(Mode::Status(200));
    wait_for(&mut rx, "recovered", |e| {
        matches!(e, Notice::Recovered { .. })
    })
    .await;
    for _ in 0..10 {
        assert_eq!(client.get("/").await.backend.as_deref(), Some("a"));
    }
}

#[tokio::test]
async fn all_down_with_reject_answers_503_with_retry_after() {
    let b = backends(&["a"]).await;
    let extra = format!("when_all_down = \"reject\"\nretry_after = \"7s\"\n{FAST_CHECKS}");
    let (balancer, mut rx) = start(&config_text(&b, &[], &extra)).await;
    b[0].set_health(Mode::Status(503));
    wait_for(&mut rx, "all down", |e| matches!(e, Notice::AllDown { .. })).await;
    let mut client = Client::new(balancer.local_addrs()[0]);
    let answer = client.get("/").await;
    assert_eq!(answer.status, 503);
    assert_eq!(answer.headers.get("retry-after").unwrap(), "7");
    assert_eq!(answer.backend, None);
}

#[tokio::test]
async fn passive_checks_never_eject_more_than_their_share() {
    let b = backends(&["a", "b", "c", "d"]).await;
    for backend in &b {
        backend.set_traffic(Mode::Status(500));
    }
    // Ejections that outlast the test: one ending (300 ms would, on a loaded machine, before
    // the 40 requests are through) brings a backend back on probation, a transition more.
    let passive = passive_ejecting_for("60s", "120s");
    let (balancer, mut rx) = start(&config_text(&b, &[], &passive)).await;
    let mut client = Client::new(balancer.local_addrs()[0]);
    for _ in 0..40 {
        client.get("/").await;
    }
    let pool = balancer.pool("web").unwrap();
    let ejected = pool
        .health()
        .iter()
        .filter(|h| h.passive.is_ejected())
        .count();
    assert_eq!(ejected, 2, "50 % of 4 backends");
    assert_eq!(count_transitions(&mut rx), 2);
}

/// `GET /x` for host `app.test`, already forwarded once (`X-Forwarded-For: 192.0.2.1`), with
/// a hop-by-hop header named in `Connection`.
fn forwarded_request() -> http::Request<Bytes> {
    http::Request::get("/x")
        .header("host", "app.test")
        .header("x-forwarded-for", "192.0.2.1")
        .header("connection", "x-hop")
        .header("x-hop", "secret")
        .body(Bytes::new())
        .unwrap()
}

#[tokio::test]
async fn proxy_headers_and_error_statuses() {
    let b = backends(&["a"]).await;
    let extra = r#"
[pools.web.active]
kind = "none"

[pools.web.passive]
enabled = false

[pools.web.timeouts]
response_header = "200ms"
"#;
    let (balancer, _rx) = start(&config_text(&b, &[], extra)).await;
    let mut client = Client::new(balancer.local_addrs()[0]);
    let answer = client.request(forwarded_request()).await;
    assert_eq!(answer.status, 200);
    assert_eq!(answer.headers.get("x-seen-host").unwrap(), "app.test");
    assert_eq!(
        answer.headers.get("x-seen-xff").unwrap(),
        "192.0.2.1, 127.0.0.1"
    );
    assert_eq!(answer.headers.get("x-seen-proto").unwrap(), "http");
    // A `Connection` naming `Host` removes the other names, never the host.
    let mut listing_host = forwarded_request();
    listing_host
        .headers_mut()
        .insert("connection", http::HeaderValue::from_static("Host, x-hop"));
    let answer = client.request(listing_host).await;
    assert_eq!(answer.status, 200);
    assert_eq!(answer.headers.get("x-seen-host").unwrap(), "app.test");

    b[0].set_traffic(Mode::Hang);
    assert_eq!(client.get("/").await.status, 504);
    b[0].set_traffic(Mode::Garbage);
    assert_eq!(client.get("/").await.status, 502);
    b[0].set_traffic(Mode::Status(200));
    b[0].crash();
    assert_eq!(client.get("/").await.status, 502);
}

/// `forwarded_headers = false` (HAProxy without `option forwardfor`, nginx without
/// `proxy_set_header X-Forwarded-For`): the request's own forwarding headers pass untouched
/// and none are added.
#[tokio::test]
async fn forwarded_headers_can_be_turned_off_per_listener() {
    let b = backends(&["a"]).await;
    let text = config_text(&b, &[], "").replacen(
        "address = \"127.0.0.1:0\"\n",
        "address = \"127.0.0.1:0\"\nforwarded_headers = false\n",
        1,
    );
    assert!(text.contains("forwarded_headers = false"), "{text}");
    let (balancer, _rx) = start(&text).await;
    let mut client = Client::new(balancer.local_addrs()[0]);
    let answer = client.request(forwarded_request()).await;
    assert_eq!(answer.status, 200);
    assert_eq!(answer.headers.get("x-seen-xff").unwrap(), "192.0.2.1");
    assert!(answer.headers.get("x-seen-proto").is_none());
    let plain = client.get("/").await;
    assert_eq!(plain.status, 200);
    assert!(plain.headers.get("x-seen-xff").is_none());
}

/// Regression: a reload adding a second listener on `127.0.0.1:0` matched it to the running
/// one on that address, so it was never started; listeners are now kept one to one.
#[tokio::test]
async fn a_reload_adding_a_second_listener_on_port_zero_starts_it() {
    let b = backends(&["a"]).await;
    let one = config_text(&b, &[], "");
    let (balancer, _rx) = start(&one).await;
    let first = balancer.local_addrs()[0];
    let two = format!("[[listeners]]\naddress = \"127.0.0.1:0\"\n{one}");
    let summary = balancer
        .reload(&crate::support::balancer::parse(&two))
        .await
        .expect("the reload applies");
    assert_eq!((summary.listeners_added, summary.listeners_removed), (1, 0));
    let addrs = balancer.local_addrs();
    assert_eq!(addrs.len(), 2, "{addrs:?}");
    assert!(addrs.contains(&first), "the first listener kept: {addrs:?}");
    for addr in &addrs {
        assert_eq!(Client::new(*addr).get("/").await.status, 200, "{addr}");
    }
    let summary = balancer
        .reload(&crate::support::balancer::parse(&one))
        .await
        .expect("the reload applies");
    assert_eq!((summary.listeners_added, summary.listeners_removed), (0, 1));
    assert_eq!(balancer.local_addrs(), [first]);
    assert_eq!(Client::new(first).get("/").await.status, 200);
}

/// Two named listeners on `127.0.0.1:0`, `first` routing to pool `a` and `second` to `b`, in
/// the order `names` gives, and the two pools over `b`'s backends.
fn two_listeners(b: &[SimBackend], names: &[&str]) -> String {
    let mut text = String::new();
    for name in names {
        let pool = if *name == "first" { "a" } else { "b" };
        text += &format!(
            "[[listeners]]\nname = \"{name}\"\naddress = \"127.0.0.1:0\"\n\
             [[listeners.routes]]\npool = \"{pool}\"\n\n"
        );
    }
    for (pool, backend) in ["a", "b"].iter().zip(b) {
        text += &format!(
            "[pools.{pool}]\nbackends = [{{ name = \"{}\", address = \"{}\" }}]\n\n",
            backend.name(),
            backend.addr()
        );
    }
    text
}

/// Each running listener's address, by the backend that answers on it.
async fn by_backend(balancer: &capataz::server::Balancer) -> HashMap<String, std::net::SocketAddr> {
    let mut found = HashMap::new();
    for addr in balancer.local_addrs() {
        let answer = Client::new(addr).get("/").await;
        assert_eq!(answer.status, 200, "{addr}");
        found.insert(answer.backend.expect("a backend answered"), addr);
    }
    found
}

/// Regression: with several listeners on `127.0.0.1:0`, a reload paired them with the running
/// ones by position, so removing the first moved the second's routes onto the first's socket
/// and closed the second's, and swapping two swapped their sockets. A listener's name now
/// decides among running listeners on the same address.
#[tokio::test]
async fn a_reload_keeps_each_named_listener_on_port_zero_on_its_own_socket() {
    let b = backends(&["a", "b"]).await;
    let (balancer, _rx) = start(&two_listeners(&b, &["first", "second"])).await;
    let before = by_backend(&balancer).await;
    assert_eq!(before.len(), 2, "{before:?}");

    // Swapped: each keeps its socket.
    let swapped = two_listeners(&b, &["second", "first"]);
    let summary = balancer
        .reload(&crate::support::balancer::parse(&swapped))
        .await
        .expect("the reload applies");
    assert_eq!((summary.listeners_added, summary.listeners_removed), (0, 0));
    assert_eq!(by_backend(&balancer).await, before, "after the swap");

    // The first removed: the second stays where it was.
    let second = two_listeners(&b, &["second"]);
    let summary = balancer
        .reload(&crate::support::balancer::parse(&second))
        .await
        .expect("the reload applies");
    assert_eq!((summary.listeners_added, summary.listeners_removed), (0, 1));
    assert_eq!(balancer.local_addrs(), [before["b"]]);
    assert_eq!(by_backend(&balancer).await["b"], before["b"]);
}

/// Regression: after a reload the kept listeners came first and the new ones after them, so
/// `local_addrs` and `/status` no longer listed the listeners in the file's order.
#[tokio::test]
async fn after_a_reload_the_listeners_are_listed_in_the_files_order() {
    let b = backends(&["a", "b"]).await;
    let (balancer, _rx) = start(&two_listeners(&b, &["first"])).await;
    let first = balancer.local_addrs()[0];
    let both = two_listeners(&b, &["second", "first"]);
    let summary = balancer
        .reload(&crate::support::balancer::parse(&both))
        .await
        .expect("the reload applies");
    assert_eq!((summary.listeners_added, summary.listeners_removed), (1, 0));
    let addrs = balancer.local_addrs();
    assert_eq!(addrs.len(), 2, "{addrs:?}");
    assert_eq!(
        addrs[1], first,
        "the kept listener is second, as in the file"
    );
    let served = by_backend(&balancer).await;
    assert_eq!((served["b"], served["a"]), (addrs[0], addrs[1]));
}

/// Listeners named `names` (TCP on `127.0.0.1:0`, but `u` on the Unix socket `socket`), each
/// routed to the pool of its own name over the backend of that name.
fn named_listeners(b: &[SimBackend], socket: &std::path::Path, names: &[&str]) -> String {
    let mut text = String::new();
    for name in names {
        let address = if *name == "u" {
            format!("unix:{}", socket.display())
        } else {
            "127.0.0.1:0".to_owned()
        };
        text += &format!(
            "[[listeners]]\nname = \"{name}\"\naddress = \"{address}\"\n\
             [[listeners.routes]]\npool = \"{name}\"\n\n"
        );
    }
    for backend in b {
        text += &format!(
            "[pools.{0}]\nbackends = [{{ name = \"{0}\", address = \"{1}\" }}]\n\n",
            backend.name(),
            backend.addr()
        );
    }
    text
}

/// The running listeners' names, in `/status`'s order.
fn listed(balancer: &capataz::server::Balancer) -> Vec<String> {
    let views = balancer.supervisor().listener_views();
    views.into_iter().map(|view| view.name).collect()
}

/// A reload that drops one listener, names a new one between kept ones and reorders the rest (a
/// Unix socket among them) lists them in the new file's order, each on its own socket serving
/// its own routes; and a second reload pairs them again by that order.
#[tokio::test]
async fn a_reload_that_adds_removes_and_reorders_lists_and_serves_in_the_files_order() {
    let b = backends(&["a", "b", "c", "d", "u"]).await;
    let dir = crate::support::access_log::LogDir::new();
    let socket = dir.path("u.sock");
    let (balancer, _rx) = start(&named_listeners(&b, &socket, &["a", "b", "u", "c"])).await;
    assert_eq!(listed(&balancer), ["a", "b", "u", "c"]);
    let tcp = |balancer: &capataz::server::Balancer| -> Vec<std::net::SocketAddr> {
        balancer
            .local_addrs()
            .into_iter()
            .filter(|addr| addr.ip().is_loopback())
            .collect()
    };
    let before = tcp(&balancer);
    assert_eq!(before.len(), 3, "{before:?}");
    let (a, c) = (before[0], before[2]);
    let parse = crate::support::balancer::parse;
    let text = named_listeners(&b, &socket, &["c", "d", "u", "a"]);
    let summary = balancer.reload(&parse(&text)).await.expect("reload");
    // `d` takes the socket `b` leaves on the same configured address (`127.0.0.1:0`), as a
    // listener whose name changed would.
    assert_eq!((summary.listeners_added, summary.listeners_removed), (0, 0));
    assert_eq!(listed(&balancer), ["c", "d", "u", "a"]);
    let now = tcp(&balancer);
    assert_eq!(now, [c, before[1], a]);
    for (addr, name) in now.iter().zip(["c", "d", "a"]) {
        let answer = Client::new(*addr).get("/").await;
        assert_eq!(answer.backend.as_deref(), Some(name), "{addr}");
    }
    let mut unix = crate::support::unix::UnixClient::connect(&socket).await;
    assert_eq!(unix.get("/").await.backend.as_deref(), Some("u"));
    let text = named_listeners(&b, &socket, &["u", "a"]);
    balancer.reload(&parse(&text)).await.expect("reload");
    assert_eq!(listed(&balancer), ["u", "a"]);
    assert_eq!(tcp(&balancer), [a]);
    assert_eq!(Client::new(a).get("/").await.backend.as_deref(), Some("a"));
}
