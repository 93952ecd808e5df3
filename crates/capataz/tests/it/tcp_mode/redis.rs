//! TCP mode in front of real Redis servers: commands relayed both ways, and a server killed
//! in the middle of a session.

use capataz_health::State;
use tokio::net::TcpStream;

use super::config;
use crate::support::balancer::start;
use crate::support::events::{is_transition, transition_of, wait_for};
use crate::support::process::signal;
use crate::support::redis::{command, Redis};

/// Probes that notice a dead server within a few hundred milliseconds.
const FAST: &str =
    "active.interval = \"30ms\"\nactive.timeout = \"100ms\"\nactive.rise = 2\nactive.fall = 2";

/// The PING probe (`redis-cli ping`'s exchange, as HAProxy's `tcp-check send PING\r\n` /
/// `expect string +PONG`), fast.
const PING: &str = "active.interval = \"30ms\"\nactive.timeout = \"200ms\"\nactive.rise = 2\n\
                    active.fall = 2\nactive.send = \"PING\\r\\n\"\nactive.expect_text = \"+PONG\"";

/// Which of `servers` holds `key` (asked directly, not through capataz).
async fn holder(servers: &[&Redis], key: &str) -> Vec<usize> {
    let mut found = Vec::new();
    for (index, server) in servers.iter().enumerate() {
        let mut direct = TcpStream::connect(server.addr).await.unwrap();
        if command(&mut direct, &["EXISTS", key]).await.as_deref() == Some(":1") {
            found.push(index);
        }
    }
    found
}

#[tokio::test]
async fn redis_commands_go_through_and_sessions_alternate_between_two_servers() {
    let (r0, r1) = (Redis::start().await, Redis::start().await);
    let text = config(&[("r0", r0.addr), ("r1", r1.addr)], "", FAST);
    let (balancer, _) = start(&text).await;
    let addr = balancer.local_addrs()[0];
    let mut holders = Vec::new();
    for session in 0..4 {
        let mut client = TcpStream::connect(addr).await.unwrap();
        let key = format!("session-{session}");
        assert_eq!(
            command(&mut client, &["PING"]).await.as_deref(),
            Some("+PONG")
        );
        let value = "v".repeat(10_000);
        assert_eq!(
            command(&mut client, &["SET", &key, &value])
                .await
                .as_deref(),
            Some("+OK")
        );
        let got = command(&mut client, &["GET", &key]).await.expect("a reply");
        assert_eq!(got, format!("$10000 {value}"));
        holders.push(holder(&[&r0, &r1], &key).await);
    }
    assert_eq!(
        holders,
        [vec![0], vec![1], vec![0], vec![1]],
        "one server per session, in turns"
    );
}

#[tokio::test]
async fn a_redis_killed_mid_session_ends_it_goes_down_and_new_sessions_reach_the_survivor() {
    let (mut r0, r1) = (Redis::start().await, Redis::start().await);
    let text = config(&[("r0", r0.addr), ("r1", r1.addr)], "", PING);
    let (balancer, mut rx) = start(&text).await;
    let addr = balancer.local_addrs()[0];
    // The first session goes to r0 (round robin from the start).
    let mut session = TcpStream::connect(addr).await.unwrap();
    assert_eq!(
        command(&mut session, &["SET", "mine", "1"])
            .await
            .as_deref(),
        Some("+OK")
    );
    assert_eq!(holder(&[&r0, &r1], "mine").await, [0]);
    r0.kill();
    assert_eq!(
        command(&mut session, &["GET", "mine"]).await,
        None,
        "the session ended"
    );
    wait_for(&mut rx, "r0 DOWN", |e| is_transition(e, "r0", State::Down)).await;
    for n in 0..4 {
        let mut client = TcpStream::connect(addr).await.unwrap();
        let key = format!("after-{n}");
        assert_eq!(
            command(&mut client, &["SET", &key, "1"]).await.as_deref(),
            Some("+OK")
        );
        assert_eq!(holder(&[&r1], &key).await, [0]);
    }
}

#[tokio::test]
async fn the_ping_probe_takes_a_stopped_redis_down_while_its_port_still_accepts_and_back_up() {
    let (r0, r1) = (Redis::start().await, Redis::start().await);
    let text = config(&[("r0", r0.addr), ("r1", r1.addr)], "", PING);
    let (balancer, mut rx) = start(&text).await;
    let addr = balancer.local_addrs()[0];
    // Stopped, the server's kernel still accepts connections (a connect check would pass),
    // but nothing answers PING.
    signal(r0.pid(), "STOP");
    let down = wait_for(&mut rx, "r0 DOWN", |e| is_transition(e, "r0", State::Down)).await;
    let reason = transition_of(&down, "r0", State::Down)
        .unwrap()
        .reason
        .to_string();
    assert!(reason.contains("TIMEOUT"), "{reason}");
    for n in 0..4 {
        let mut client = TcpStream::connect(addr).await.unwrap();
        let key = format!("while-stopped-{n}");
        assert_eq!(
            command(&mut client, &["SET", &key, "1"]).await.as_deref(),
            Some("+OK")
        );
        assert_eq!(
            holder(&[&r1], &key).await,
            [0],
            "the stopped server gets no session"
        );
    }
    signal(r0.pid(), "CONT");
    wait_for(&mut rx, "r0 UP", |e| is_transition(e, "r0", State::Up)).await;
    let mut on_r0 = 0;
    for n in 0..4 {
        let mut client = TcpStream::connect(addr).await.unwrap();
        let key = format!("after-{n}");
        assert_eq!(
            command(&mut client, &["SET", &key, "1"]).await.as_deref(),
            Some("+OK")
        );
        on_r0 += holder(&[&r0], &key).await.len();
    }
    assert_eq!(on_r0, 2, "back in rotation: every other session");
}

#[tokio::test]
async fn a_redis_back_from_down_under_slow_start_gets_a_small_share_of_new_sessions_at_first() {
    let (r0, r1) = (Redis::start().await, Redis::start().await);
    let pool = format!("slow_start = \"60s\"\n{PING}");
    let weighted = [("r0", r0.addr), ("r1", r1.addr)];
    let text = config(&weighted, "", &pool).replace(
        &format!("{{ name = \"r0\", address = \"{}\" }}", r0.addr),
        &format!(
            "{{ name = \"r0\", address = \"{}\", weight = 100 }}",
            r0.addr
        ),
    );
    let text = text.replace(
        &format!("{{ name = \"r1\", address = \"{}\" }}", r1.addr),
        &format!(
            "{{ name = \"r1\", address = \"{}\", weight = 100 }}",
            r1.addr
        ),
    );
    let (balancer, mut rx) = start(&text).await;
    let addr = balancer.local_addrs()[0];
    signal(r0.pid(), "STOP");
    wait_for(&mut rx, "r0 DOWN", |e| is_transition(e, "r0", State::Down)).await;
    signal(r0.pid(), "CONT");
    wait_for(&mut rx, "r0 UP", |e| is_transition(e, "r0", State::Up)).await;
    // Seconds into a 60 s ramp, r0's weight is a small part of its 100.
    let mut on_r0 = 0;
    for n in 0..20 {
        let mut client = TcpStream::connect(addr).await.unwrap();
        let key = format!("ramp-{n}");
        assert_eq!(
            command(&mut client, &["SET", &key, "1"]).await.as_deref(),
            Some("+OK")
        );
        on_r0 += holder(&[&r0], &key).await.len();
    }
    assert!(on_r0 <= 4, "a ramping backend got {on_r0} of 20 sessions");
    let page = capataz::status::page(&balancer.pools(), "now", None, &[]).unwrap();
    let page: serde_json::Value = serde_json::from_slice(&page).unwrap();
    let weight = page["pools"][0]["backends"][0]["effective_weight"]
        .as_f64()
        .unwrap();
    assert!(weight < 100.0, "r0's weight ramps: {weight}");
}
