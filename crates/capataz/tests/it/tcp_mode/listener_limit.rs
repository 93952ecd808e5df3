//! A tcp listener's `max_connections` (HAProxy's `maxconn` on a `mode tcp` frontend): at the
//! limit, the next sessions wait in the kernel's backlog, reaching no backend, until one ends.

use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use super::{config, greeting, to_end, Greeter};
use crate::support::balancer::{metrics_text, start};
use crate::support::wait::wait_until;

/// A tcp listener's open sessions, as its gauge says.
fn open(balancer: &capataz::server::Balancer) -> f64 {
    metrics_text(balancer)
        .lines()
        .find_map(|l| {
            l.strip_prefix("capataz_client_connections_open{listener=\"listener-0\"} ")?
                .parse()
                .ok()
        })
        .unwrap_or(0.0)
}

#[tokio::test]
async fn sessions_over_the_listener_limit_wait_for_one_to_end() {
    let a = Greeter::start("a").await;
    // No probes: a TCP connect probe would count in the greeter's `accepted` (every 2 s, so
    // within a slow run).
    let text = config(
        &[("a", a.addr)],
        "max_connections = 2",
        "active.kind = \"none\"",
    );
    let (balancer, _rx) = start(&text).await;
    let addr = balancer.local_addrs()[0];
    let mut first = TcpStream::connect(addr).await.expect("connect");
    assert_eq!(greeting(&mut first).await, "a");
    let mut second = TcpStream::connect(addr).await.expect("connect");
    assert_eq!(greeting(&mut second).await, "a");
    wait_until("two sessions open", || open(&balancer) == 2.0).await;
    // The third is in the backlog: no session, no backend connection.
    let mut third = TcpStream::connect(addr)
        .await
        .expect("the backlog takes it");
    let mut byte = [0u8; 1];
    let early = tokio::time::timeout(Duration::from_millis(300), third.read(&mut byte)).await;
    assert!(early.is_err(), "a session over the limit: {early:?}");
    assert_eq!(a.accepted(), 2);
    // The first ends (its FIN, then the backend's goodbye): the third's session starts.
    first.shutdown().await.expect("shutdown");
    to_end(&mut first).await.expect("a clean end");
    assert_eq!(greeting(&mut third).await, "a");
    assert_eq!(a.accepted(), 3);
    assert_eq!(open(&balancer), 2.0);
    third.write_all(b"ping\n").await.expect("send");
    third.shutdown().await.expect("shutdown");
    let rest = to_end(&mut third).await.expect("a clean end");
    assert_eq!(String::from_utf8_lossy(&rest), "ping\nbye a\n");
}
