//! The members' own states, end to end on loopback: backups that take over and hand
//! back, a `404` on the health route that drains (`disable_on_404`), maintenance that stops
//! probes and requalifies, and failing open below the minimum healthy share.
//!
//! Scripted backends (`capataz::sim`), probes every 30 ms, an admin listener for `/status` and
//! overrides; every wait is on an event or a count with a generous deadline.

mod backups;
mod close_tunnels;
mod config;
mod drain_404;
mod maintenance;
mod min_healthy;

use std::collections::HashMap;
use std::net::SocketAddr;

use capataz::health::Notice;
use capataz::server::Balancer;
use capataz::sim::SimBackend;
use serde_json::Value;
use tokio::sync::broadcast;

use crate::support::balancer::{parse, FAST_CHECKS};
use crate::support::client::{exchange, Client};
use crate::support::events::wait_for;

/// A config: an admin listener, one client listener, and pool `web` over `backends`, each
/// with its extra backend keys (`backup = true`), then `pool_keys` in `[pools.web]`, the fast
/// checks with `active_keys` added, no retries, and `extra`.
fn config(backends: &[(&SimBackend, &str)], pool_keys: &str, active_keys: &str) -> String {
    let list: Vec<String> = backends
        .iter()
        .map(|(b, keys)| {
            let keys = if keys.is_empty() {
                String::new()
            } else {
                format!(", {keys}")
            };
            format!(
                "{{ name = \"{}\", address = \"{}\"{keys} }}",
                b.name(),
                b.addr()
            )
        })
        .collect();
    format!(
        "[admin]\naddress = \"127.0.0.1:0\"\n\n[[listeners]]\naddress = \"127.0.0.1:0\"\n\n\
         [pools.web]\nbackends = [{}]\n{pool_keys}\n{FAST_CHECKS}{active_keys}\n\n\
         [pools.web.retries]\nattempts = 0\n",
        list.join(", ")
    )
}

/// A running balancer, its events, its admin address and a keep-alive client of its listener.
struct Running {
    balancer: Balancer,
    events: broadcast::Receiver<Notice>,
    admin: SocketAddr,
    proxy: Client,
}

impl Running {
    async fn start(text: &str) -> Running {
        let (events, rx) = broadcast::channel(4096);
        let balancer = Balancer::start(&parse(text), events)
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

    /// An admin call; returns the status and the JSON body.
    async fn admin(&self, method: &str, path: &str) -> (u16, Value) {
        let answer = exchange(self.admin, method, path, &self.admin.to_string(), &[]).await;
        (answer.status, answer.json())
    }

    /// The `/metrics` page.
    async fn metrics(&self) -> String {
        let answer = exchange(self.admin, "GET", "/metrics", &self.admin.to_string(), &[]).await;
        assert_eq!(answer.status, 200);
        answer.text()
    }

    /// `GET /status/web/<backend>`, which must succeed.
    async fn backend(&self, backend: &str) -> Value {
        let (status, json) = self.admin("GET", &format!("/status/web/{backend}")).await;
        assert_eq!(status, 200, "{json}");
        json
    }

    /// Pool `web` of `GET /status`.
    async fn pool(&self) -> Value {
        let (status, json) = self.admin("GET", "/status").await;
        assert_eq!(status, 200, "{json}");
        json["pools"][0].clone()
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

    async fn wait_for(&mut self, what: &str, want: impl Fn(&Notice) -> bool) -> Notice {
        wait_for(&mut self.events, what, want).await
    }
}

/// The eligibility event of `backend` to `to`, as its reason.
fn eligibility_to<'a>(event: &'a Notice, backend: &str, to: &str) -> Option<&'a str> {
    match event {
        Notice::Eligibility {
            backend: b,
            to: t,
            reason,
            ..
        } if &**b == backend && *t == to => Some(reason),
        _ => None,
    }
}

/// The backups event: the backups serving (empty once they stop) and whether primaries serve.
fn backups_of(event: &Notice) -> Option<(Vec<String>, bool)> {
    match event {
        Notice::Backups {
            serving,
            to_primaries,
            ..
        } => Some((
            serving.iter().map(|s| s.to_string()).collect(),
            *to_primaries,
        )),
        _ => None,
    }
}
