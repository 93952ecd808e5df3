//! TCP mode in front of real MariaDB servers: the `mariadb` client through capataz, sessions
//! alternating between two servers, a server killed in the middle of a session, and a stopped
//! server taken DOWN by a check that reads its greeting while its port still accepts.

use capataz_health::{Reason, State};
use tokio::net::TcpStream;

use super::both_up;
use super::config;
use crate::support::balancer::start;
use crate::support::events::{is_transition, transition_of, wait_for};
use crate::support::mariadb::{query, Client, Mariadb};
use crate::support::process::signal;

/// The greeting check (as HAProxy's `option mysql-check` without a user): a MariaDB server
/// speaks first, its handshake naming its version; fast.
const GREETING: &str = "active.interval = \"30ms\"\nactive.timeout = \"300ms\"\nactive.rise = 2\n\
                        active.fall = 2\nactive.expect_text = \"MariaDB\"";

/// The `server_id` of the server that answers a `mariadb` session through `addr`.
async fn served_by(addr: std::net::SocketAddr) -> String {
    let lines = query(addr, "SELECT @@server_id")
        .await
        .unwrap_or_else(|error| panic!("mariadb through capataz failed: {error}"));
    assert_eq!(lines.len(), 1, "{lines:?}");
    lines[0].clone()
}

async fn four_sessions(addr: std::net::SocketAddr) -> Vec<String> {
    let mut served = Vec::new();
    for _ in 0..4 {
        served.push(served_by(addr).await);
    }
    served
}

#[tokio::test]
async fn mariadb_sessions_alternate_and_the_greeting_check_takes_a_stopped_server_down() {
    let (m1, m2) = (Mariadb::start(1).await, Mariadb::start(2).await);
    // Both start DOWN: each is UP only once the check has passed on it.
    let check = format!("{GREETING}\nactive.initial = \"down\"");
    let text = config(&[("m1", m1.addr), ("m2", m2.addr)], "", &check);
    let (balancer, mut rx) = start(&text).await;
    let addr = balancer.local_addrs()[0];
    both_up(&mut rx, ["m1", "m2"]).await;
    assert_eq!(four_sessions(addr).await, ["1", "2", "1", "2"], "in turns");
    let large = ["SELECT REPEAT('x', 100000)"; 3].join(" UNION ALL ");
    let rows = query(addr, &large).await.unwrap();
    assert_eq!(
        rows,
        vec!["x".repeat(100_000); 3],
        "a large result comes back whole"
    );
    signal(m1.pid(), "STOP");
    let down = wait_for(&mut rx, "m1 DOWN", |e| is_transition(e, "m1", State::Down)).await;
    let reason = transition_of(&down, "m1", State::Down)
        .unwrap()
        .reason
        .to_string();
    assert!(reason.contains("TIMEOUT"), "{reason}");
    // Stopped, its kernel still completes the handshake: a connect check would pass.
    let connect = TcpStream::connect(m1.addr).await;
    assert!(connect.is_ok(), "{connect:?}");
    assert_eq!(
        four_sessions(addr).await,
        ["2"; 4],
        "the stopped server gets none"
    );
    signal(m1.pid(), "CONT");
    wait_for(&mut rx, "m1 UP", |e| is_transition(e, "m1", State::Up)).await;
    let mut served = four_sessions(addr).await;
    served.sort();
    assert_eq!(served, ["1", "1", "2", "2"], "back in rotation");
}

#[tokio::test]
async fn a_mariadb_killed_mid_session_ends_it_goes_down_and_is_back_after_a_restart() {
    let (mut m1, m2) = (Mariadb::start(1).await, Mariadb::start(2).await);
    let text = config(&[("m1", m1.addr), ("m2", m2.addr)], "", GREETING);
    let (balancer, mut rx) = start(&text).await;
    let addr = balancer.local_addrs()[0];
    // The first session goes to m1 (round robin from the start).
    let mut session = Client::open(addr);
    assert_eq!(session.one("SELECT @@server_id").await.as_deref(), Ok("1"));
    m1.kill();
    let after = session.one("SELECT @@server_id").await;
    assert!(after.is_err(), "the session ended: {after:?}");
    let down = wait_for(&mut rx, "m1 DOWN", |e| is_transition(e, "m1", State::Down)).await;
    let reason = transition_of(&down, "m1", State::Down).unwrap().reason;
    assert!(
        matches!(reason, Reason::ProbesFailed { .. }),
        "taken DOWN by its check: {reason}"
    );
    assert_eq!(
        four_sessions(addr).await,
        ["2"; 4],
        "new sessions go to the survivor"
    );
    m1.run().await;
    wait_for(&mut rx, "m1 UP", |e| is_transition(e, "m1", State::Up)).await;
    let mut served = four_sessions(addr).await;
    served.sort();
    assert_eq!(served, ["1", "1", "2", "2"], "back in rotation");
}
