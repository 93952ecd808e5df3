//! TCP mode in front of real PostgreSQL servers: `psql` through capataz, sessions alternating
//! between two servers, a server killed in the middle of a session, and a stopped server taken
//! DOWN by a check that logs in (HAProxy's `option pgsql-check`) while its port still accepts.

use capataz_health::{Reason, State};
use tokio::net::TcpStream;

use super::config;
use crate::support::balancer::start;
use crate::support::events::{is_transition, transition_of, wait_for};
use crate::support::postgres::{psql, startup, Postgres, Session, USER};
use crate::support::process::signal;

/// The login check: a `StartupMessage` for [`USER`], passing on an answer that starts with
/// `R` (an authentication request, `AuthenticationOk` here) and failing on an `E`rror (a
/// server starting up, shutting down or full) or no answer; fast.
fn login_check() -> String {
    let hex: String = startup(USER).iter().map(|b| format!("{b:02x}")).collect();
    format!(
        "active.interval = \"30ms\"\nactive.timeout = \"300ms\"\nactive.rise = 2\n\
         active.fall = 2\nactive.send_hex = \"{hex}\"\nactive.expect_hex = \"52\""
    )
}

/// The `cluster_name` of the server that answers a `psql` session through `addr`.
async fn served_by(addr: std::net::SocketAddr) -> String {
    let lines = psql(addr, "SELECT current_setting('cluster_name')")
        .await
        .unwrap_or_else(|error| panic!("psql through capataz failed: {error}"));
    assert_eq!(lines.len(), 1, "{lines:?}");
    lines[0].clone()
}

#[tokio::test]
async fn psql_sessions_go_through_and_alternate_between_two_postgres_servers() {
    let (pg0, pg1) = (Postgres::start("pg0").await, Postgres::start("pg1").await);
    let text = config(&[("pg0", pg0.addr), ("pg1", pg1.addr)], "", &login_check());
    let (balancer, _) = start(&text).await;
    let addr = balancer.local_addrs()[0];
    let mut served = Vec::new();
    for _ in 0..4 {
        served.push(served_by(addr).await);
    }
    assert_eq!(
        served,
        ["pg0", "pg1", "pg0", "pg1"],
        "one server per session, in turns"
    );
    // A statement with a result of some size comes back whole.
    let rows = psql(
        addr,
        "SELECT repeat('x', 100000) FROM generate_series(1, 3)",
    )
    .await
    .unwrap();
    assert_eq!(rows, vec!["x".repeat(100_000); 3]);
}

#[tokio::test]
async fn a_postgres_killed_mid_session_ends_it_goes_down_and_is_back_after_a_restart() {
    let (mut pg0, pg1) = (Postgres::start("pg0").await, Postgres::start("pg1").await);
    let text = config(&[("pg0", pg0.addr), ("pg1", pg1.addr)], "", &login_check());
    let (balancer, mut rx) = start(&text).await;
    let addr = balancer.local_addrs()[0];
    // The first session goes to pg0 (round robin from the start).
    let mut session = Session::open(addr)
        .await
        .expect("a session through capataz");
    let name = session
        .query("SELECT current_setting('cluster_name')")
        .await;
    assert_eq!(name.as_deref(), Ok(&["pg0".to_string()][..]));
    pg0.kill();
    let after = session.query("SELECT 1").await;
    assert!(after.is_err(), "the session ended: {after:?}");
    let down = wait_for(&mut rx, "pg0 DOWN", |e| {
        is_transition(e, "pg0", State::Down)
    })
    .await;
    let reason = transition_of(&down, "pg0", State::Down).unwrap().reason;
    assert!(
        matches!(reason, Reason::ProbesFailed { .. }),
        "taken DOWN by its check: {reason}"
    );
    for _ in 0..4 {
        assert_eq!(
            served_by(addr).await,
            "pg1",
            "new sessions go to the survivor"
        );
    }
    pg0.run().await;
    wait_for(&mut rx, "pg0 UP", |e| is_transition(e, "pg0", State::Up)).await;
    let mut served = Vec::new();
    for _ in 0..4 {
        served.push(served_by(addr).await);
    }
    served.sort();
    assert_eq!(
        served,
        ["pg0", "pg0", "pg1", "pg1"],
        "back in rotation: {served:?}"
    );
}

#[tokio::test]
async fn the_login_check_takes_a_stopped_postgres_down_while_its_port_still_accepts() {
    let (pg0, pg1) = (Postgres::start("pg0").await, Postgres::start("pg1").await);
    let text = config(&[("pg0", pg0.addr), ("pg1", pg1.addr)], "", &login_check());
    let (balancer, mut rx) = start(&text).await;
    let addr = balancer.local_addrs()[0];
    signal(pg0.pid(), "STOP");
    let down = wait_for(&mut rx, "pg0 DOWN", |e| {
        is_transition(e, "pg0", State::Down)
    })
    .await;
    let reason = transition_of(&down, "pg0", State::Down)
        .unwrap()
        .reason
        .to_string();
    assert!(reason.contains("TIMEOUT"), "{reason}");
    // Stopped, its kernel still completes the handshake: a connect check would pass.
    let connect = TcpStream::connect(pg0.addr).await;
    assert!(connect.is_ok(), "{connect:?}");
    for _ in 0..4 {
        assert_eq!(
            served_by(addr).await,
            "pg1",
            "the stopped server gets no session"
        );
    }
    signal(pg0.pid(), "CONT");
    wait_for(&mut rx, "pg0 UP", |e| is_transition(e, "pg0", State::Up)).await;
    let mut served = Vec::new();
    for _ in 0..4 {
        served.push(served_by(addr).await);
    }
    served.sort();
    assert_eq!(
        served,
        ["pg0", "pg0", "pg1", "pg1"],
        "back in rotation: {served:?}"
    );
}
