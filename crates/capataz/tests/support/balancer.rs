//! Starting a balancer from a config string, over scripted backends, on ephemeral ports.

use std::net::SocketAddr;
use std::sync::Arc;

use capataz::config;
use capataz::health::{Clock, Notice, PoolRt};
use capataz::metrics::{HistogramScope, Metrics};
use capataz::server::Balancer;
use capataz::sim::SimBackend;
use tokio::sync::broadcast;

use super::any;

/// Probes of pool `web` every 30 ms (100 ms timeout, 10 % jitter), rise 2, fall 3: a backend
/// changes state within a few hundred milliseconds.
pub const FAST_CHECKS: &str = r#"
[pools.web.active]
interval = "30ms"
timeout = "100ms"
jitter = "10%"
rise = 2
fall = 3
"#;

/// Scripted backends named `names`, each on an ephemeral port.
pub async fn backends(names: &[&str]) -> Vec<SimBackend> {
    let mut out = Vec::new();
    for name in names {
        out.push(SimBackend::start(name, any()).await.expect("start backend"));
    }
    out
}

/// The `(name, address)` of each backend, for [`ConfigText::new`].
pub fn pairs(backends: &[SimBackend]) -> Vec<(String, SocketAddr)> {
    backends
        .iter()
        .map(|b| (b.name().to_owned(), b.addr()))
        .collect()
}

/// A config of one client listener on an ephemeral port and one pool over some backends,
/// optionally with an admin listener on an ephemeral port too.
///
/// ```text
/// [admin]                      (only with .admin(lines))
/// address = "127.0.0.1:0"
/// <admin lines>
///
/// [[listeners]]
/// address = "127.0.0.1:0"
/// <listener lines>
///
/// [pools.<pool>]               (web unless .pool(name))
/// backends = [{ name, address, weight }, ...]
/// <extra>
/// ```
#[derive(Clone, Debug)]
pub struct ConfigText {
    backends: Vec<(String, SocketAddr)>,
    weights: Vec<u32>,
    admin: Option<String>,
    listener: String,
    pool: String,
    extra: String,
}

impl ConfigText {
    /// Pool `web` over `backends`, weight 1 each, no admin listener.
    pub fn new(backends: &[(String, SocketAddr)]) -> ConfigText {
        ConfigText {
            backends: backends.to_vec(),
            weights: Vec::new(),
            admin: None,
            listener: String::new(),
            pool: "web".into(),
            extra: String::new(),
        }
    }

    /// Pool `web` over scripted backends.
    pub fn sims(backends: &[SimBackend]) -> ConfigText {
        ConfigText::new(&pairs(backends))
    }

    /// The backends' weights in order (1 for those past the end).
    pub fn weights(mut self, weights: &[u32]) -> ConfigText {
        self.weights = weights.to_vec();
        self
    }

    /// An admin listener on an ephemeral port, with `lines` added to its table.
    pub fn admin(mut self, lines: &str) -> ConfigText {
        self.admin = Some(lines.to_owned());
        self
    }

    /// `lines` added to the client listener's table.
    pub fn listener(mut self, lines: &str) -> ConfigText {
        self.listener = lines.to_owned();
        self
    }

    /// The pool's name.
    pub fn pool(mut self, name: &str) -> ConfigText {
        self.pool = name.to_owned();
        self
    }

    /// TOML appended after the pool's table (its sub-tables, `[alerts]`, ...).
    pub fn extra(mut self, toml: &str) -> ConfigText {
        self.extra = toml.to_owned();
        self
    }

    /// The config text.
    pub fn build(&self) -> String {
        let list: Vec<String> = self
            .backends
            .iter()
            .enumerate()
            .map(|(i, (name, addr))| {
                format!(
                    "{{ name = \"{name}\", address = \"{addr}\", weight = {} }}",
                    self.weights.get(i).copied().unwrap_or(1)
                )
            })
            .collect();
        let admin = match &self.admin {
            Some(lines) => format!("[admin]\naddress = \"127.0.0.1:0\"\n{lines}\n"),
            None => String::new(),
        };
        format!(
            "\n{admin}\n[[listeners]]\naddress = \"127.0.0.1:0\"\n{listener}\n\n\
             [pools.{pool}]\nbackends = [{list}]\n{extra}\n",
            listener = self.listener,
            pool = self.pool,
            list = list.join(", "),
            extra = self.extra,
        )
    }
}

/// `balancer`'s metrics page, in the OpenMetrics form `/metrics` serves.
pub fn metrics_text(balancer: &Balancer) -> String {
    balancer
        .supervisor()
        .metrics()
        .render(
            &balancer.pools(),
            None,
            capataz::metrics::Format::OpenMetrics,
        )
        .expect("the metrics render")
}

/// `text` parsed, which must be a valid config.
pub fn parse(text: &str) -> config::Config {
    config::parse_str(text, "<test>").expect("valid test config")
}

/// A balancer started from `text`, and the receiving end of its events.
pub async fn start(text: &str) -> (Balancer, broadcast::Receiver<Notice>) {
    let (events, rx) = broadcast::channel(4096);
    let balancer = Balancer::start(&parse(text), events)
        .await
        .expect("balancer starts");
    (balancer, rx)
}

/// The health runtime of the first pool in `text`, on its own (no listener, no probes
/// driver), and the receiving end of its events.
pub fn lone_pool(text: &str) -> (Arc<PoolRt>, broadcast::Receiver<Notice>) {
    let config = parse(text);
    let (events, rx) = broadcast::channel(64);
    let pool = PoolRt::new(
        config.pools[0].clone(),
        events,
        Clock::start(),
        None,
        false,
        Metrics::new(HistogramScope::Pool).families(),
    );
    (pool, rx)
}

/// Waits until the first pool's `/status` (through `admin`, with `token` if given) lists
/// `count` backends, each UP with a passing last probe (polled every 20 ms, within
/// [`super::DEADLINE`]).
pub async fn wait_probed_up(admin: SocketAddr, token: Option<&str>, count: usize) {
    let end = tokio::time::Instant::now() + super::DEADLINE;
    loop {
        let status = capataz::ctl::request(admin, http::Method::GET, "/status", token)
            .await
            .expect("GET /status");
        let probed = status["pools"][0]["backends"].as_array().is_some_and(|b| {
            b.len() == count
                && b.iter()
                    .all(|b| b["state"] == "UP" && b["active"]["last_probe"]["result"] == "PASS")
        });
        if probed {
            return;
        }
        assert!(tokio::time::Instant::now() < end, "not probed: {status:#}");
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
}
