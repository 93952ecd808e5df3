//! The exposition as Prometheus's own tools and a dashboard read it: `promtool check metrics`
//! on the classic format (`promtool`), a real Prometheus server scraping OpenMetrics and a
//! query per metric (`prometheus`), the Grafana dashboard's queries against a scrape
//! (`grafana`), and the client side's counts (`client_side`).
//!
//! [`busy`] starts a balancer and drives every kind of traffic a series needs to appear:
//! answers relayed from a backend, capataz's own 404, 400 (hyper's, for a malformed head) and
//! 502, a reload that applies and one that is refused, and a failed alert delivery.

mod client_side;
mod grafana;
mod prometheus;
mod promtool;

use std::collections::BTreeSet;
use std::net::SocketAddr;

use capataz::server::Balancer;
use capataz::sim::SimBackend;

use crate::support;
use crate::support::balancer::{backends, parse, start, ConfigText};
use crate::support::wait::wait_until;

/// A balancer after one of every kind of traffic, with what it runs on.
pub(super) struct Busy {
    pub(super) balancer: Balancer,
    pub(super) admin: SocketAddr,
    pub(super) _backends: Vec<SimBackend>,
    /// The port of pool `dead`'s backend, held so that nothing listens there.
    pub(super) _dead: support::ReservedPort,
}

/// The config of [`busy`]: listener `front` with routes `/api/` to pool `web` (backends `a`
/// and `b`, probed) and `/dead/` to pool `dead` (one backend on a closed port, not probed), and
/// an alert command that always fails.
fn busy_config(b: &[SimBackend], dead: SocketAddr) -> String {
    ConfigText::sims(b)
        .admin("")
        .listener(
            "name = \"front\"\n\n[[listeners.routes]]\npath_prefix = \"/api/\"\npool = \"web\"\n\n\
             [[listeners.routes]]\npath_prefix = \"/dead/\"\npool = \"dead\"\n",
        )
        .extra(&format!(
            "[pools.web.active]\ninterval = \"50ms\"\ntimeout = \"500ms\"\n\n\
             [pools.web.passive.latency_outliers]\nenabled = true\n\n\
             [pools.web.passive.load_shedding]\nenabled = true\n\n\
             [pools.dead]\nbackends = [{{ name = \"x\", address = \"{dead}\" }}]\n\n\
             [pools.dead.active]\nkind = \"none\"\n\n\
             [[alerts.commands]]\ncommand = [\"false\"]\n"
        ))
        .build()
}

/// One exchange on a fresh connection.
pub(super) async fn exchange(
    addr: SocketAddr,
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
) -> support::client::Answer {
    support::client::exchange(addr, method, path, &addr.to_string(), headers).await
}

/// A scrape of `admin`'s `/metrics` with `accept` (none: no `Accept` header): its
/// `Content-Type` and text.
pub(super) async fn scrape(admin: SocketAddr, accept: Option<&str>) -> (String, String) {
    let headers: Vec<(&str, &str)> = accept.map(|a| ("accept", a)).into_iter().collect();
    let answer = exchange(admin, "GET", "/metrics", &headers).await;
    assert_eq!(answer.status, 200, "{}", answer.text());
    (answer.content_type().to_owned(), answer.text())
}

/// The sample names of an exposition (either format).
pub(super) fn sample_names(text: &str) -> BTreeSet<String> {
    text.lines()
        .filter(|line| !line.starts_with('#') && !line.is_empty())
        .map(|line| {
            let end = line.find(['{', ' ']).unwrap_or(line.len());
            line[..end].to_owned()
        })
        .collect()
}

/// Starts [`busy_config`]'s balancer and sends it one of every kind of traffic.
pub(super) async fn busy() -> Busy {
    let b = backends(&["a", "b"]).await;
    // Held, not released: a released port is soon another test's listener, and then pool
    // `dead` answers.
    let dead = support::reserve_port();
    let text = busy_config(&b, SocketAddr::from(([127, 0, 0, 1], dead.port)));
    let (balancer, _rx) = start(&text).await;
    let proxy = balancer.local_addrs()[0];
    let admin = balancer.admin_addr().expect("the admin listener runs");
    for _ in 0..4 {
        assert_eq!(exchange(proxy, "GET", "/api/x", &[]).await.status, 200);
    }
    assert_eq!(exchange(proxy, "POST", "/api/x", &[]).await.status, 200);
    assert_eq!(exchange(proxy, "GET", "/nowhere", &[]).await.status, 404);
    assert_eq!(exchange(proxy, "GET", "/dead/x", &[]).await.status, 502);
    let refused = support::raw::raw_roundtrip(proxy, b"GET / HTTP/1.1\r\nno colon\r\n\r\n").await;
    assert_eq!(support::raw::status_of(&refused), Some(400));
    // A reload that applies, and one refused (this balancer has no file to re-read).
    balancer.reload(&parse(&text)).await.expect("reload");
    let refused = exchange(admin, "POST", "/reload", &[]).await;
    assert_eq!(refused.status, 422, "{}", refused.text());
    // An override is an event: the alert command runs, and fails.
    let down = exchange(admin, "POST", "/backends/dead/x/down", &[]).await;
    assert_eq!(down.status, 200, "{}", down.text());
    let supervisor = balancer.supervisor().clone();
    wait_until("a failed alert", || {
        supervisor
            .alert_stats()
            .is_some_and(|stats| stats.command.failed() >= 1)
    })
    .await;
    Busy {
        balancer,
        admin,
        _backends: b,
        _dead: dead,
    }
}
