//! TCP mode in front of real PostgreSQL servers: `psql` through capataz, sessions alternating
//! between two servers, a server killed in the middle of a session, and a stopped server taken
//! DOWN by a check that logs in (HAProxy's `option pgsql-check`) while its port still accepts.

use capataz_health::{Reason, State};
use tokio::net::TcpStream;

use super::both_up;
use super::config;
use crate::support::balancer::start;
use crate::support::events::{is_transition, transition_of, wait_for};
use crate::support::postgres::{psql, Postgres, Session, USER};
use crate::support::process::signal;

/// The fast probe settings of these tests.
const FAST: &str =
    "active.interval = \"30ms\"\nactive.timeout = \"300ms\"\nactive.rise = 2\nactive.fall = 2";

/// The login check of docs/config.md ("Bytes in hex"), HAProxy's `option pgsql-check`: a
/// `StartupMessage` for [`USER`] on database `postgres`, passing on an answer that starts with
/// `R` (an authentication request) and failing on an `E`rror (a server starting up, shutting
/// down or full) or no answer.
fn login_check() -> String {
    let hex = "00000028 00030000 75736572 00636170 6174617a 00646174 61626173 6500706f \
               73746772 65730000";
    assert_eq!(USER, "capataz", "the documented check logs in as capataz");
    format!("{FAST}\nactive.send_hex = \"{hex}\"\nactive.expect_hex = \"52\"")
}

/// The quiet check of docs/config.md: an `SSLRequest`, answered `N` by a server without TLS.
fn ssl_request_check() -> String {
    format!("{FAST}\nactive.send_hex = \"00000008 04d2162f\"\nactive.expect_hex = \"4e\"")
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
    // Both start DOWN: each is UP only once the check has passed on it.
    let check = format!("{}\nactive.initial = \"down\"", ssl_request_check());
    let text = config(&[("pg0", pg0.addr), ("pg1", pg1.addr)], "", &check);
    let (balancer, mut rx) = start(&text).await;
    let addr = balancer.local_addrs()[0];
    both_up(&mut rx, ["pg0", "pg1"]).await;
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
    // The server dies: its session's process sees the postmaster gone, says so and hangs up,
    // and capataz ends the client's session.
    pg0.kill();
    let errors = session.ended().await;
    assert!(
        errors.iter().all(|e| e.contains("postmaster")),
        "only the server's goodbye came: {errors:?}"
    );
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
