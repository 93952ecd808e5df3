//! End-to-end tests of operating capataz on loopback: the admin API (status and its explain
//! sentences, the token rule, manual overrides, the event stream), live reloads, graceful
//! shutdown and slow start.
//!
//! Real sockets, in-process backends whose behaviour each test scripts, probes every 30 ms, and
//! waits on events, counts or polled state with generous deadlines (never fixed sleeps).
//!
//! The scaffolding is here; the tests are in one module per area.

mod endpoints;
mod event_stream;
mod overrides;
mod reload;
mod shutdown;
mod slow_start;
mod token;

use std::collections::HashMap;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use capataz::config;
use capataz::events::OverrideKind;
use capataz::health::Notice;
use capataz::server::Balancer;
use capataz::sim::{Mode, SimBackend};
use capataz_health::{Reason, State};
use serde_json::Value;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::sync::broadcast;

use crate::support::balancer::{backends, parse, ConfigText, FAST_CHECKS};
use crate::support::client::{exchange, Client};
use crate::support::events::{is_transition, wait_for};
use crate::support::DEADLINE;

/// Passive checks that eject after three errors for long enough to look at the ejection.
const PASSIVE: &str = r#"
[pools.web.passive]
consecutive_errors = 3
ejection_time = "10s"
max_ejection_time = "20s"
max_ejected_percent = 50

[pools.web.retries]
attempts = 0
"#;

/// A config: an admin listener on a free loopback port (with the `admin` lines), one client
/// listener on a free port, and one pool `web` over `backends` (with `weights`, 1 when
/// missing), followed by `pool_extra`.
fn config_text(admin: &str, backends: &[&SimBackend], weights: &[u32], pool_extra: &str) -> String {
    let pairs: Vec<(String, SocketAddr)> = backends
        .iter()
        .map(|b| (b.name().to_owned(), b.addr()))
        .collect();
    ConfigText::new(&pairs)
        .weights(weights)
        .admin(admin)
        .extra(pool_extra)
        .build()
}

/// A running balancer, its events, and clients for its admin API and its listener.
struct Running {
    balancer: Balancer,
    events: broadcast::Receiver<Notice>,
    admin: SocketAddr,
    proxy: Client,
}

impl Running {
    async fn start(text: &str) -> Running {
        Running::start_config(&parse(text), None).await
    }

    async fn start_from(file: &ConfigFile) -> Running {
        let config = config::load(&file.path).expect("valid test config file");
        Running::start_config(&config, Some(file.path.clone())).await
    }

    async fn start_config(config: &config::Config, path: Option<PathBuf>) -> Running {
        let (events, rx) = broadcast::channel(4096);
        let balancer = Balancer::start_with_path(config, events, path)
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

    async fn get(&self, path: &str) -> Reply {
        admin_call(self.admin, "GET", path, None).await
    }

    async fn post(&self, path: &str) -> Reply {
        admin_call(self.admin, "POST", path, None).await
    }

    /// `GET /status/web/<backend>`, which must succeed.
    async fn backend(&self, backend: &str) -> Value {
        let reply = self.get(&format!("/status/web/{backend}")).await;
        assert_eq!(reply.status, 200, "{}", reply.json);
        reply.json
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

/// A config file in the temporary directory, removed on drop.
struct ConfigFile {
    path: PathBuf,
}

impl ConfigFile {
    fn new(text: &str) -> ConfigFile {
        static NEXT: AtomicUsize = AtomicUsize::new(0);
        let path = std::env::temp_dir().join(format!(
            "capataz-admin-test-{}-{}.toml",
            std::process::id(),
            NEXT.fetch_add(1, Ordering::Relaxed)
        ));
        let file = ConfigFile { path };
        file.write(text);
        file
    }

    fn write(&self, text: &str) {
        std::fs::write(&self.path, text).expect("write the test config file");
    }
}

impl Drop for ConfigFile {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.path);
    }
}

/// An admin API answer: status, headers, and the body as JSON (`Null` when it is not JSON).
struct Reply {
    status: u16,
    headers: http::HeaderMap,
    json: Value,
}

/// One request to the admin API on a fresh connection, with `authorization` as the header.
async fn admin_call(
    addr: SocketAddr,
    method: &str,
    path: &str,
    authorization: Option<&str>,
) -> Reply {
    let headers: Vec<(&str, &str)> = authorization
        .map(|v| ("authorization", v))
        .into_iter()
        .collect();
    let answer = exchange(addr, method, path, &addr.to_string(), &headers).await;
    Reply {
        status: answer.status,
        json: answer.json(),
        headers: answer.headers,
    }
}

/// The override event about `backend`, as `(kind, from, to, reason)`.
fn override_of<'a>(
    event: &'a Notice,
    backend: &str,
) -> Option<(Option<OverrideKind>, &'a str, &'a str, &'a str)> {
    match event {
        Notice::Override {
            backend: b,
            kind,
            from,
            to,
            reason,
            ..
        } if &**b == backend => Some((*kind, *from, *to, reason.as_str())),
        _ => None,
    }
}

fn text<'a>(value: &'a Value, pointer: &str) -> &'a str {
    value
        .pointer(pointer)
        .and_then(Value::as_str)
        .unwrap_or_else(|| panic!("no string at {pointer} in {value:#}"))
}

fn number(value: &Value, pointer: &str) -> f64 {
    value
        .pointer(pointer)
        .and_then(Value::as_f64)
        .unwrap_or_else(|| panic!("no number at {pointer} in {value:#}"))
}

/// Two scripted backends, `a` and `b`, behind a running balancer with an admin listener.
async fn two_backends() -> (Vec<SimBackend>, Running) {
    let b = backends(&["a", "b"]).await;
    let r = Running::start(&config_text("", &[&b[0], &b[1]], &[], FAST_CHECKS)).await;
    (b, r)
}
