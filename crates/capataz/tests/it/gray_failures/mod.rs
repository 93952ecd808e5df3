//! Gray failures, end to end on loopback with scripted backends: a backend
//! slower than its pool (latency outliers), one failing intermittently (success-rate outliers)
//! and one asking for relief (load shedding).
//!
//! Traffic comes from a few client loops running beside the test until it ends; every wait is
//! on an event with a generous deadline.

mod latency;
mod shedding;
mod success_rate;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use capataz::health::Notice;
use capataz::server::Balancer;
use capataz::sim::SimBackend;
use serde_json::Value;
use tokio::sync::broadcast;
use tokio::task::JoinSet;

use crate::support::balancer::parse;
use crate::support::client::{exchange, Client};
use crate::support::events::wait_for;

/// A config: an admin listener, one client listener, pool `web` over `backends` with
/// `pool_keys`, slow probes (they stay out of the way) and no retries.
fn config(backends: &[SimBackend], pool_keys: &str) -> String {
    let list: Vec<String> = backends
        .iter()
        .map(|b| format!("{{ name = \"{}\", address = \"{}\" }}", b.name(), b.addr()))
        .collect();
    format!(
        "[admin]\naddress = \"127.0.0.1:0\"\n\n[[listeners]]\naddress = \"127.0.0.1:0\"\n\n\
         [pools.web]\nbackends = [{}]\n\n[pools.web.active]\ninterval = \"1s\"\n\n\
         [pools.web.retries]\nattempts = 0\n\n{pool_keys}\n",
        list.join(", ")
    )
}

/// A running balancer with `clients` loops sending `GET /` through it until dropped.
struct Running {
    balancer: Balancer,
    events: broadcast::Receiver<Notice>,
    admin: std::net::SocketAddr,
    stop: Arc<AtomicBool>,
    loops: JoinSet<()>,
}

impl Running {
    async fn start(text: &str, clients: usize) -> Running {
        let (events, rx) = broadcast::channel(65_536);
        let balancer = Balancer::start(&parse(text), events)
            .await
            .expect("balancer starts");
        let admin = balancer.admin_addr().expect("the admin API runs");
        let stop = Arc::new(AtomicBool::new(false));
        let mut loops = JoinSet::new();
        for _ in 0..clients {
            let (addr, stop) = (balancer.local_addrs()[0], stop.clone());
            loops.spawn(async move {
                let mut client = Client::new(addr);
                while !stop.load(Ordering::Relaxed) {
                    client.get("/").await;
                }
            });
        }
        Running {
            balancer,
            events: rx,
            admin,
            stop,
            loops,
        }
    }

    /// `GET /status/web/<backend>`, which must succeed.
    async fn backend(&self, backend: &str) -> Value {
        let path = format!("/status/web/{backend}");
        let answer = exchange(self.admin, "GET", &path, &self.admin.to_string(), &[]).await;
        assert_eq!(answer.status, 200);
        answer.json()
    }

    /// The `/metrics` page.
    async fn metrics(&self) -> String {
        let answer = exchange(self.admin, "GET", "/metrics", &self.admin.to_string(), &[]).await;
        assert_eq!(answer.status, 200);
        answer.text()
    }

    async fn wait_for(&mut self, what: &str, want: impl Fn(&Notice) -> bool) -> Notice {
        wait_for(&mut self.events, what, want).await
    }

    async fn stop(mut self) {
        self.stop.store(true, Ordering::Relaxed);
        while self.loops.join_next().await.is_some() {}
        self.balancer
            .shutdown(std::time::Duration::from_secs(1))
            .await;
    }
}
