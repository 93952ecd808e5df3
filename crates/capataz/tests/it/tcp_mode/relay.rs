//! TCP mode with hand-written backends: bytes both ways, half-close, the idle and session
//! timeouts, connect failover, the all-down policy, draining, and a client that sends nothing.

use std::time::Duration;

use capataz::health::OverrideKind;
use capataz_health::State;
use tokio::io::AsyncWriteExt;
use tokio::net::TcpStream;

use super::{config, greeting, refused_port, to_end, Greeter};
use crate::support::balancer::start;
use crate::support::events::{is_transition, transition_of, wait_for};

/// Probes that notice a refusing backend within a few hundred milliseconds.
const FAST: &str =
    "active.interval = \"30ms\"\nactive.timeout = \"100ms\"\nactive.rise = 2\nactive.fall = 2";

#[tokio::test]
async fn a_client_fin_reaches_the_backend_whose_last_words_still_reach_the_client() {
    let a = Greeter::start("a").await;
    let (balancer, _) = start(&config(&[("a", a.addr)], "", "")).await;
    let mut client = TcpStream::connect(balancer.local_addrs()[0]).await.unwrap();
    assert_eq!(greeting(&mut client).await, "a");
    client.write_all(b"hello, ").await.unwrap();
    client.write_all(b"world\n").await.unwrap();
    // Half-close: the client is done sending, and still reads.
    client.shutdown().await.unwrap();
    let rest = to_end(&mut client).await.expect("a clean end");
    assert_eq!(String::from_utf8_lossy(&rest), "hello, world\nbye a\n");
}

#[tokio::test]
async fn sessions_take_turns_over_the_pool_and_each_stays_on_its_backend() {
    let (a, b) = (Greeter::start("a").await, Greeter::start("b").await);
    let (balancer, _) = start(&config(&[("a", a.addr), ("b", b.addr)], "", "")).await;
    let addr = balancer.local_addrs()[0];
    let mut seen = Vec::new();
    for _ in 0..4 {
        let mut client = TcpStream::connect(addr).await.unwrap();
        let name = greeting(&mut client).await;
        client.write_all(b"ping\n").await.unwrap();
        client.shutdown().await.unwrap();
        let rest = to_end(&mut client).await.expect("a clean end");
        assert_eq!(
            String::from_utf8_lossy(&rest),
            format!("ping\nbye {name}\n")
        );
        seen.push(name);
    }
    seen.sort();
    assert_eq!(seen, ["a", "a", "b", "b"], "round robin over two backends");
}

/// A hashing pool sends every session of one client address to the same backend (HAProxy's
/// `balance source`): the sessions once went round robin, the hash ignored.
#[tokio::test]
async fn a_hashing_pool_keeps_a_clients_sessions_on_one_backend() {
    let (a, b) = (Greeter::start("a").await, Greeter::start("b").await);
    let text = config(&[("a", a.addr), ("b", b.addr)], "", "algorithm = \"hash\"");
    let (balancer, _) = start(&text).await;
    let addr = balancer.local_addrs()[0];
    let mut seen = Vec::new();
    for _ in 0..6 {
        let mut client = TcpStream::connect(addr).await.unwrap();
        seen.push(greeting(&mut client).await);
    }
    seen.dedup();
    assert_eq!(seen.len(), 1, "one backend for one address: {seen:?}");
    assert_eq!(a.accepted() + b.accepted(), 6);
}

#[tokio::test]
async fn a_refused_connect_goes_to_another_backend_and_is_charged_to_the_refusing_one() {
    let live = Greeter::start("live").await;
    let dead_port = refused_port();
    let dead = dead_port.addr;
    let pool = "active.kind = \"none\"\npassive.consecutive_errors = 2";
    let text = config(&[("dead", dead), ("live", live.addr)], "", pool);
    let (balancer, mut rx) = start(&text).await;
    let addr = balancer.local_addrs()[0];
    for _ in 0..4 {
        let mut client = TcpStream::connect(addr).await.unwrap();
        assert_eq!(
            greeting(&mut client).await,
            "live",
            "the refused connect was retried"
        );
    }
    // Two refused connects in a row eject it: its passive side was charged.
    wait_for(&mut rx, "dead ejected", |e| {
        is_transition(e, "dead", State::Down)
    })
    .await;
}

#[tokio::test]
async fn a_session_that_moves_nothing_for_the_idle_timeout_is_closed() {
    let a = Greeter::start("a").await;
    let text = config(&[("a", a.addr)], "idle_timeout = \"300ms\"", "");
    let (balancer, _) = start(&text).await;
    let mut client = TcpStream::connect(balancer.local_addrs()[0]).await.unwrap();
    let started = tokio::time::Instant::now();
    assert_eq!(greeting(&mut client).await, "a");
    // The client sends nothing at all.
    let rest = to_end(&mut client).await.unwrap_or_default();
    assert!(rest.is_empty(), "{rest:?}");
    assert!(
        started.elapsed() >= Duration::from_millis(300),
        "{:?}",
        started.elapsed()
    );
}

#[tokio::test]
async fn a_busy_session_ends_at_its_session_timeout() {
    let a = Greeter::start("a").await;
    let text = config(&[("a", a.addr)], "session_timeout = \"400ms\"", "");
    let (balancer, _) = start(&text).await;
    let mut client = TcpStream::connect(balancer.local_addrs()[0]).await.unwrap();
    let started = tokio::time::Instant::now();
    assert_eq!(greeting(&mut client).await, "a");
    let busy = async {
        loop {
            if client.write_all(b"x").await.is_err() {
                break;
            }
            let mut byte = [0];
            match tokio::io::AsyncReadExt::read(&mut client, &mut byte).await {
                Ok(1) => tokio::time::sleep(Duration::from_millis(20)).await,
                _ => break,
            }
        }
    };
    tokio::time::timeout(crate::support::DEADLINE, busy)
        .await
        .expect("the session ends");
    assert!(
        started.elapsed() >= Duration::from_millis(400),
        "{:?}",
        started.elapsed()
    );
}

#[tokio::test]
async fn with_every_backend_down_a_rejecting_pool_closes_the_client_at_once() {
    let dead_port = refused_port();
    let dead = dead_port.addr;
    let reject = format!("when_all_down = \"reject\"\n{FAST}");
    let (balancer, mut rx) = start(&config(&[("dead", dead)], "", &reject)).await;
    wait_for(&mut rx, "dead DOWN", |e| {
        is_transition(e, "dead", State::Down)
    })
    .await;
    let mut client = TcpStream::connect(balancer.local_addrs()[0]).await.unwrap();
    let rest = to_end(&mut client).await.unwrap_or_default();
    assert!(rest.is_empty(), "closed without a byte: {rest:?}");
}

#[tokio::test]
async fn a_drained_backend_keeps_its_sessions_and_new_ones_go_elsewhere() {
    let (a, b) = (Greeter::start("a").await, Greeter::start("b").await);
    let (balancer, _) = start(&config(&[("a", a.addr), ("b", b.addr)], "", "")).await;
    let addr = balancer.local_addrs()[0];
    let mut kept = TcpStream::connect(addr).await.unwrap();
    let name = greeting(&mut kept).await;
    let other = if name == "a" { "b" } else { "a" };
    balancer
        .pool("db")
        .unwrap()
        .set_override(&name, Some(OverrideKind::Drain), None)
        .unwrap();
    for _ in 0..4 {
        let mut client = TcpStream::connect(addr).await.unwrap();
        assert_eq!(greeting(&mut client).await, other);
    }
    // The drained backend's session goes on, both ways.
    kept.write_all(b"still here\n").await.unwrap();
    kept.shutdown().await.unwrap();
    let rest = to_end(&mut kept).await.expect("a clean end");
    assert_eq!(
        String::from_utf8_lossy(&rest),
        format!("still here\nbye {name}\n")
    );
}

#[tokio::test]
async fn close_tunnels_on_down_closes_the_sessions_of_a_backend_going_down() {
    let a = Greeter::start("a").await;
    let pool = format!("close_tunnels_on_down = true\n{FAST}");
    let (balancer, mut rx) = start(&config(&[("a", a.addr)], "", &pool)).await;
    let mut client = TcpStream::connect(balancer.local_addrs()[0]).await.unwrap();
    // The greeting proves the session reached `a` (its accept count also has the probes').
    assert_eq!(greeting(&mut client).await, "a");
    // The backend stops listening: its probes fail, its verdict goes DOWN.
    drop(a);
    wait_for(&mut rx, "a DOWN", |e| is_transition(e, "a", State::Down)).await;
    let rest = to_end(&mut client).await.unwrap_or_default();
    assert!(rest.is_empty(), "{rest:?}");
}

#[tokio::test]
async fn a_backend_that_never_answers_the_expected_text_goes_down_and_fail_open_still_uses_it() {
    let a = Greeter::start("a").await;
    let check = format!("{FAST}\nactive.send = \"PING\\r\\n\"\nactive.expect_text = \"+PONG\"");
    let (balancer, mut rx) = start(&config(&[("a", a.addr)], "", &check)).await;
    let down = wait_for(&mut rx, "a DOWN", |e| is_transition(e, "a", State::Down)).await;
    let reason = transition_of(&down, "a", State::Down)
        .unwrap()
        .reason
        .to_string();
    assert!(
        reason.contains("answer did not contain \"+PONG\""),
        "{reason}"
    );
    // Every backend DOWN, `fail_open` (the default): the proven backend still gets sessions.
    let mut client = TcpStream::connect(balancer.local_addrs()[0]).await.unwrap();
    assert_eq!(greeting(&mut client).await, "a");
}

#[tokio::test]
async fn a_check_expecting_bytes_in_hex_passes_the_backend_whose_answer_starts_with_them() {
    let (a, b) = (Greeter::start("a").await, Greeter::start("b").await);
    // "a\n" in hex: the greeting of `a` starts with it, the greeting of `b` does not.
    let check = format!("{FAST}\nactive.send_hex = \"00 ff\"\nactive.expect_hex = \"610a\"");
    let (balancer, mut rx) = start(&config(&[("a", a.addr), ("b", b.addr)], "", &check)).await;
    let down = wait_for(&mut rx, "b DOWN", |e| is_transition(e, "b", State::Down)).await;
    let reason = transition_of(&down, "b", State::Down)
        .unwrap()
        .reason
        .to_string();
    assert!(
        reason.contains("answer did not start with hex \"610a\""),
        "{reason}"
    );
    for _ in 0..4 {
        let mut client = TcpStream::connect(balancer.local_addrs()[0]).await.unwrap();
        assert_eq!(greeting(&mut client).await, "a", "b is DOWN, a is UP");
    }
    let page = capataz::status::page(&balancer.pools(), "now", None, &[]).unwrap();
    let page: serde_json::Value = serde_json::from_slice(&page).unwrap();
    assert_eq!(page["pools"][0]["backends"][0]["state"], "UP", "{page}");
}
