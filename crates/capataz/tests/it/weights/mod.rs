//! What `/status` says a backend weighs is what its traffic shows, for every
//! modifier of a weight: slow start's ramp, an agent's percent, load shedding, an outlier
//! ejected, backups taking over and handing back; and who serves and what is in flight, as
//! `/status`, the metrics and the events say it (`said`).
//!
//! A real balancer on loopback over scripted backends. A client sends windows of requests
//! through it, one at a time, and each backend's share of a window, counted at the backend, is
//! compared with what `/status` reported around the window: its `effective_weight` over the
//! sum of the serving backends' (a backend that is not `serving` weighs nothing).
//!
//! The tolerance, [`TOLERANCE`]: round robin walks nginx's smooth weighted schedule with one
//! cursor that every first attempt advances by one slot. With requests sent one at a time and
//! retries off, a window of `k` requests under one snapshot takes `k` consecutive slots of
//! one schedule, and in any run of consecutive slots a backend of weight `w` out of `W` is
//! picked fewer than 2 times away from `k * w / W` (the unit test
//! `balance::tests::any_run_of_the_schedule_is_within_two_of_its_share` checks it). So a
//! window whose reported weights were the same before and after it must match within 2
//! requests, whatever the machine's load: nothing here depends on timing. A window across a
//! change (a ramp step, a shed ending) mixed two schedules and is not compared; each test
//! says how many comparable windows it needs.

mod modifiers;
mod said;
mod slow_start;

use std::time::Duration;

use capataz::health::Notice;
use capataz::server::Balancer;
use capataz::sim::SimBackend;
use serde_json::Value;
use tokio::sync::broadcast;

use crate::support::balancer::start;
use crate::support::client::{exchange, Client};
use crate::support::events::wait_for;
use crate::support::wait::{until_ok, POLL};
use crate::support::DEADLINE;

/// How far a backend's count in a window may be from its reported share of the window.
const TOLERANCE: f64 = 2.0;

/// Requests per window.
const WINDOW: usize = 30;

/// Probes every 30 ms, rise 2, fall 3: a backend changes state within a few hundred ms.
const CHECKS: &str = "[pools.web.active]\ninterval = \"30ms\"\ntimeout = \"200ms\"\n\
                      jitter = \"10%\"\nrise = 2\nfall = 3\n\n\
                      [pools.web.retries]\nattempts = 0\n";

/// A pool member: its backend, configured weight and extra keys for its inline table.
struct Member<'a> {
    backend: &'a SimBackend,
    weight: u32,
    keys: String,
}

fn member<'a>(backend: &'a SimBackend, weight: u32, keys: &str) -> Member<'a> {
    Member {
        backend,
        weight,
        keys: keys.to_owned(),
    }
}

/// [`config`] over primaries `b[0]` and `b[1]` (weight 1) and backups `b[2]` (weight 1)
/// and `b[3]` (weight 3), all of which serve when the primaries are out (`backups = "all"`).
fn with_backups(b: &[SimBackend]) -> String {
    config(
        &[
            member(&b[0], 1, ""),
            member(&b[1], 1, ""),
            member(&b[2], 1, "backup = true"),
            member(&b[3], 3, "backup = true"),
        ],
        "backups = \"all\"",
        "",
    )
}

/// An admin listener, a client listener and pool `web` over `members`, with `pool_keys` in
/// the pool's table, the fast [`CHECKS`], no retries, and then `tables` (the pool's other
/// sub-tables).
fn config(members: &[Member<'_>], pool_keys: &str, tables: &str) -> String {
    let list: Vec<String> = members
        .iter()
        .map(|m| {
            let keys = if m.keys.is_empty() {
                String::new()
            } else {
                format!(", {}", m.keys)
            };
            format!(
                "{{ name = \"{}\", address = \"{}\", weight = {}{keys} }}",
                m.backend.name(),
                m.backend.addr(),
                m.weight
            )
        })
        .collect();
    format!(
        "[admin]\naddress = \"127.0.0.1:0\"\n\n[[listeners]]\naddress = \"127.0.0.1:0\"\n\n\
         [pools.web]\nbackends = [{}]\n{pool_keys}\n\n{CHECKS}\n{tables}\n",
        list.join(", ")
    )
}

/// What `/status` reported for each backend, in pool order.
#[derive(Clone, Debug, PartialEq)]
struct Reported {
    names: Vec<String>,
    serving: Vec<bool>,
    weights: Vec<f64>,
}

impl Reported {
    /// Each backend's reported share of new requests: its weight over the serving backends'
    /// total, zero when it is not serving.
    fn shares(&self) -> Vec<f64> {
        let serving: Vec<f64> = self
            .serving
            .iter()
            .zip(&self.weights)
            .map(|(&serving, &weight)| if serving { weight } else { 0.0 })
            .collect();
        let total: f64 = serving.iter().sum();
        serving.iter().map(|w| w / total).collect()
    }

    /// Backend `name`'s reported effective weight.
    fn weight(&self, name: &str) -> f64 {
        let i = self
            .names
            .iter()
            .position(|n| n == name)
            .expect("a backend");
        self.weights[i]
    }

    /// Whether backend `name` is reported serving.
    fn serving(&self, name: &str) -> bool {
        let i = self
            .names
            .iter()
            .position(|n| n == name)
            .expect("a backend");
        self.serving[i]
    }
}

/// One window: what was reported before and after it, and the requests each backend got.
#[derive(Debug)]
struct Window {
    before: Reported,
    after: Reported,
    hits: Vec<u64>,
}

impl Window {
    /// Whether the reports agree around the window, so that one schedule served all of it.
    fn stable(&self) -> bool {
        self.before == self.after
    }

    /// Panics unless every backend's count is within [`TOLERANCE`] of its reported share of
    /// the window. Only for a stable window.
    fn check(&self, what: &str) {
        let n: u64 = self.hits.iter().sum();
        let shares = self.before.shares();
        for (i, name) in self.before.names.iter().enumerate() {
            let expected = n as f64 * shares[i];
            let got = self.hits[i] as f64;
            assert!(
                (got - expected).abs() <= TOLERANCE,
                "{what}: {name} got {got} of {n} requests, its reported weight says \
                 {expected:.1} ± {TOLERANCE}: reported {:?}, serving {:?}, hits {:?}",
                self.before.weights,
                self.before.serving,
                self.hits
            );
        }
    }
}

/// A running balancer over scripted backends, with a client for its listener.
struct Scene {
    balancer: Balancer,
    events: broadcast::Receiver<Notice>,
    admin: std::net::SocketAddr,
    client: Client,
    backends: Vec<SimBackend>,
}

impl Scene {
    /// Starts a balancer from `text` over `backends` (which `text` names, in pool order).
    async fn start(text: &str, backends: Vec<SimBackend>) -> Scene {
        let (balancer, events) = start(text).await;
        let admin = balancer.admin_addr().expect("the admin API runs");
        let client = Client::new(balancer.local_addrs()[0]);
        Scene {
            balancer,
            events,
            admin,
            client,
            backends,
        }
    }

    /// The backend named `name`.
    fn backend(&self, name: &str) -> &SimBackend {
        self.backends
            .iter()
            .find(|b| b.name() == name)
            .expect("a backend of the scene")
    }

    /// What `GET /status` reports for pool `web`'s backends now.
    async fn reported(&self) -> Reported {
        let host = self.admin.to_string();
        let answer = exchange(self.admin, "GET", "/status", &host, &[]).await;
        assert_eq!(answer.status, 200, "{}", answer.text());
        let status = answer.json();
        let backends = status["pools"][0]["backends"]
            .as_array()
            .cloned()
            .unwrap_or_default();
        let mut reported = Reported {
            names: Vec::new(),
            serving: Vec::new(),
            weights: Vec::new(),
        };
        for b in &backends {
            reported.names.push(text(b, "name"));
            reported.serving.push(b["serving"] == true);
            reported
                .weights
                .push(b["effective_weight"].as_f64().expect("effective_weight"));
        }
        let names: Vec<&str> = self.backends.iter().map(SimBackend::name).collect();
        assert_eq!(reported.names, names, "backends in pool order: {status:#}");
        reported
    }

    /// Polls `/status` until `done` holds for what it reports, or panics after [`DEADLINE`].
    async fn wait_reported(&self, what: &str, done: impl Fn(&Reported) -> bool) -> Reported {
        until_ok(what, POLL, async || {
            let reported = self.reported().await;
            match done(&reported) {
                true => Ok(reported),
                false => Err(format!("{reported:?}")),
            }
        })
        .await
    }

    /// Sends `n` requests one at a time, which must all succeed.
    async fn send(&mut self, n: usize) {
        for _ in 0..n {
            let answer = self.client.get("/").await;
            assert_eq!(answer.status, 200, "a request failed: {}", answer.text());
        }
    }

    /// One window of `n` requests between two reads of `/status`.
    async fn window(&mut self, n: usize) -> Window {
        let before = self.reported().await;
        let hits_before: Vec<u64> = self.backends.iter().map(|b| b.traffic_hits()).collect();
        self.send(n).await;
        let hits = self
            .backends
            .iter()
            .zip(&hits_before)
            .map(|(b, before)| b.traffic_hits() - before)
            .collect();
        let after = self.reported().await;
        Window {
            before,
            after,
            hits,
        }
    }

    /// Compares `count` stable windows with what was reported (a window across a change is
    /// sent again, up to 20 times in all), and returns what was reported.
    async fn check_windows(&mut self, what: &str, count: usize) -> Reported {
        let mut checked = 0;
        let mut last = None;
        for _ in 0..20 {
            let window = self.window(WINDOW).await;
            if window.stable() {
                window.check(what);
                checked += 1;
                last = Some(window.after);
                if checked == count {
                    break;
                }
            }
        }
        assert_eq!(checked, count, "{what}: the reports kept changing");
        last.expect("a window was checked")
    }

    async fn wait_for(&mut self, what: &str, want: impl Fn(&Notice) -> bool) -> Notice {
        wait_for(&mut self.events, what, want).await
    }

    async fn stop(self) {
        self.balancer.shutdown(Duration::from_secs(1)).await;
    }
}

fn text(value: &Value, key: &str) -> String {
    value[key].as_str().unwrap_or_default().to_owned()
}
