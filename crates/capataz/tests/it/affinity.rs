//! Hashing and sticky sessions through a real balancer on loopback, with a backend taken out
//! and brought back: the share of keys (or clients) moved is measured from the traffic (which
//! backend answered) and compared with what `/status` and the metrics say.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::time::Duration;

use capataz::server::Balancer;
use capataz::sim::{Mode, SimBackend};
use capataz_health::State;
use http::Method;
use serde_json::Value;

use crate::support::balancer::{backends, metrics_text, start, ConfigText, FAST_CHECKS};
use crate::support::client::Client;
use crate::support::events::{is_transition, wait_for};
use crate::support::wait::{until_ok, POLL};

/// Keys sent through the hashing pool.
const KEYS: usize = 400;

/// The backends `/status` reports serving in pool `web`.
async fn serving(admin: SocketAddr) -> Vec<String> {
    let status = capataz::ctl::request(admin, Method::GET, "/status", None)
        .await
        .expect("GET /status");
    status["pools"][0]["backends"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|b| b["serving"] == true)
        .map(|b| b["name"].as_str().unwrap_or_default().to_owned())
        .collect()
}

pub(crate) async fn wait_serving(admin: SocketAddr, want: &[&str]) {
    until_ok("the backends /status reports serving", POLL, async || {
        let now = serving(admin).await;
        match now == want {
            true => Ok(()),
            false => Err(format!("{now:?}")),
        }
    })
    .await;
}

/// Which backend answered each key (`X-User: user-<k>`), one request per key.
async fn assignment(client: &mut Client) -> Vec<String> {
    let mut out = Vec::with_capacity(KEYS);
    for k in 0..KEYS {
        let request = http::Request::get("/")
            .header("host", "app.test")
            .header("x-user", format!("user-{k}"))
            .body(bytes::Bytes::new())
            .expect("a request");
        let answer = client.request(request).await;
        assert_eq!(answer.status, 200, "{}", answer.text());
        out.push(answer.backend.expect("X-Backend"));
    }
    out
}

fn moved(before: &[String], after: &[String]) -> usize {
    before.iter().zip(after).filter(|(a, b)| a != b).count()
}

pub(crate) fn admin_post(
    admin: SocketAddr,
    path: &str,
) -> impl std::future::Future<Output = Value> + '_ {
    let path = path.to_owned();
    async move {
        capataz::ctl::request(admin, Method::POST, &path, None)
            .await
            .expect("admin POST")
    }
}

pub(crate) async fn started(
    text: &str,
) -> (
    Balancer,
    tokio::sync::broadcast::Receiver<capataz::health::Notice>,
    SocketAddr,
    Client,
) {
    let (balancer, events) = start(text).await;
    let admin = balancer.admin_addr().expect("the admin API runs");
    let client = Client::new(balancer.local_addrs()[0]);
    (balancer, events, admin, client)
}

/// A backend taken DOWN by its health checks: only its keys move (about 1/N), each to a
/// backend `/status` says serves; when it comes back, every key returns to where it was.
#[tokio::test]
async fn hashed_keys_move_only_off_a_backend_that_goes_down_and_come_back() {
    let b = backends(&["a", "b", "c", "d"]).await;
    let text = ConfigText::sims(&b)
        .admin("")
        .extra(&format!(
            "algorithm = \"hash\"\nhash_key = \"header:X-User\"\n{FAST_CHECKS}\n\
             [pools.web.retries]\nattempts = 0\n"
        ))
        .build();
    let (balancer, mut events, admin, mut client) = started(&text).await;
    wait_serving(admin, &["a", "b", "c", "d"]).await;
    let before = assignment(&mut client).await;
    assert_eq!(
        before,
        assignment(&mut client).await,
        "the same key, the same backend"
    );
    let on_c = before.iter().filter(|n| *n == "c").count();

    b[2].set_health(Mode::Status(503));
    wait_for(&mut events, "c DOWN", |e| {
        is_transition(e, "c", State::Down)
    })
    .await;
    wait_serving(admin, &["a", "b", "d"]).await;
    let during = assignment(&mut client).await;
    let gone = moved(&before, &during);
    for (was, now) in before.iter().zip(&during) {
        assert!(was == now || was == "c", "a key moved from {was} to {now}");
        assert_ne!(now, "c", "/status says c does not serve");
    }
    assert_eq!(gone, on_c, "every key of c moved, and only those");
    println!(
        "c DOWN: {gone} of {KEYS} keys moved ({:.3}; ideal 1/N = 0.250)",
        gone as f64 / KEYS as f64
    );
    assert!((60..=140).contains(&gone), "{gone} keys on c of {KEYS}");

    b[2].set_health(Mode::Status(200));
    wait_for(&mut events, "c UP", |e| is_transition(e, "c", State::Up)).await;
    wait_serving(admin, &["a", "b", "c", "d"]).await;
    let after = assignment(&mut client).await;
    println!("c back: {} keys moved back", moved(&during, &after));
    assert_eq!(after, before, "every key is back where it was");
    balancer.shutdown(Duration::from_secs(1)).await;
}

/// A retry walks the ring on: with `c` refusing connections but still in rotation (no checks
/// to notice), each of its keys is retried on the backend that key moves to once `c` is out of
/// rotation, so a failing backend's keys land where they will stay.
#[tokio::test]
async fn a_retried_key_goes_where_it_will_move() {
    let b = backends(&["a", "b", "c", "d"]).await;
    let text = ConfigText::sims(&b)
        .admin("")
        .extra(
            "algorithm = \"hash\"\nhash_key = \"header:X-User\"\n\
             [pools.web.active]\nkind = \"none\"\n[pools.web.passive]\nenabled = false\n\
             [pools.web.retries]\nattempts = 1\nbudget_percent = 100\nmin_budget = 1000\n",
        )
        .build();
    let (balancer, _events, admin, mut client) = started(&text).await;
    wait_serving(admin, &["a", "b", "c", "d"]).await;
    let before = assignment(&mut client).await;
    b[2].crash();
    let retried = assignment(&mut client).await;
    admin_post(admin, "/backends/web/c/down").await;
    wait_serving(admin, &["a", "b", "d"]).await;
    let out = assignment(&mut client).await;
    let on_c = before.iter().filter(|n| *n == "c").count();
    assert!(on_c > 0);
    assert_eq!(retried, out, "each retried key went where it moved");
    assert_eq!(moved(&before, &out), on_c);
    balancer.shutdown(Duration::from_secs(1)).await;
}

/// Bounded loads spread a hot key: 20 requests with one key held open by the backends
/// (outstanding together), sent one after the other. Without `hash_balance_factor` all go to
/// the key's backend; with 150 none holds more than HAProxy's bound (`ceil(ceil(20 x 1.5) /
/// 4)` = 8), and the others take the rest.
#[tokio::test]
async fn bounded_loads_spread_a_hot_key() {
    for factor in [0, 150] {
        let b = backends(&["a", "b", "c", "d"]).await;
        for backend in &b {
            backend.set_traffic(Mode::Hang);
        }
        let text = ConfigText::sims(&b)
            .extra(&format!(
                "algorithm = \"hash\"\nhash_key = \"header:X-User\"\n\
                 hash_balance_factor = {factor}\n[pools.web.active]\nkind = \"none\"\n"
            ))
            .build();
        let (balancer, _events) = start(&text).await;
        let addr = balancer.local_addrs()[0];
        let mut pending = Vec::new();
        for k in 0..20u64 {
            pending.push(tokio::spawn(async move {
                let request = http::Request::get("/")
                    .header("host", "app.test")
                    .header("x-user", "hot")
                    .body(bytes::Bytes::new())
                    .expect("a request");
                Client::new(addr).request(request).await
            }));
            crate::support::wait::wait_until("the request reaches a backend", || {
                b.iter().map(SimBackend::traffic_hits).sum::<u64>() == k + 1
            })
            .await;
        }
        let hits: Vec<u64> = b.iter().map(SimBackend::traffic_hits).collect();
        println!("hash_balance_factor = {factor}: outstanding per backend {hits:?}");
        if factor == 0 {
            assert_eq!(hits.iter().filter(|&&h| h > 0).count(), 1, "{hits:?}");
        } else {
            assert!(hits.iter().all(|&h| h <= 8), "{hits:?}");
            assert!(hits.iter().filter(|&&h| h > 0).count() >= 3, "{hits:?}");
        }
        for task in pending {
            task.abort();
        }
        balancer.shutdown(Duration::from_secs(1)).await;
    }
}

/// `c`'s effective weight as `/status` reports it.
async fn weight_of_c(admin: SocketAddr) -> f64 {
    let status = capataz::ctl::request(admin, Method::GET, "/status", None)
        .await
        .expect("GET /status");
    status["pools"][0]["backends"]
        .as_array()
        .into_iter()
        .flatten()
        .find(|b| b["name"] == "c")
        .and_then(|b| b["effective_weight"].as_f64())
        .expect("c's effective_weight")
}

/// Under slow start a returning backend's keys come back gradually: while `/status` reports
/// it below its full weight, only part of its keys are back (and no other key moves); at full
/// weight, all of them.
#[tokio::test]
async fn hashed_keys_come_back_gradually_under_slow_start() {
    let b = backends(&["a", "b", "c", "d"]).await;
    let text = ConfigText::sims(&b)
        .admin("")
        .extra(&format!(
            "algorithm = \"hash\"\nhash_key = \"header:X-User\"\nslow_start = \"8s\"\n\
             {FAST_CHECKS}\n[pools.web.retries]\nattempts = 0\n"
        ))
        .build();
    let (balancer, mut events, admin, mut client) = started(&text).await;
    wait_serving(admin, &["a", "b", "c", "d"]).await;
    let before = assignment(&mut client).await;
    let on_c = before.iter().filter(|n| *n == "c").count();
    b[2].set_health(Mode::Status(503));
    wait_for(&mut events, "c DOWN", |e| {
        is_transition(e, "c", State::Down)
    })
    .await;
    wait_serving(admin, &["a", "b", "d"]).await;
    let down = assignment(&mut client).await;
    b[2].set_health(Mode::Status(200));
    wait_for(&mut events, "c UP", |e| is_transition(e, "c", State::Up)).await;
    wait_serving(admin, &["a", "b", "c", "d"]).await;
    let mut partial = None;
    let end = tokio::time::Instant::now() + crate::support::DEADLINE;
    loop {
        assert!(tokio::time::Instant::now() < end, "the ramp never ended");
        let (w0, now, w1) = (
            weight_of_c(admin).await,
            assignment(&mut client).await,
            weight_of_c(admin).await,
        );
        for ((was, gone), now) in before.iter().zip(&down).zip(&now) {
            assert!(
                now == gone || (now == "c" && was == "c"),
                "{was} {gone} {now}"
            );
        }
        let back = now.iter().filter(|n| *n == "c").count();
        if w0 == w1 {
            println!("c at weight {w0} all through the window: {back} of its {on_c} keys back");
        }
        if w1 < 1.0 && partial.is_none() {
            println!("slow start at weight {w0}..{w1}: {back} of c's {on_c} keys back");
            assert!(back < on_c, "all keys back at weight {w1}");
            partial = Some(back);
        }
        if w0 == 1.0 {
            println!("full weight: {back} of {on_c} back");
            assert_eq!(now, before, "at full weight every key is back");
            break;
        }
    }
    assert!(partial.is_some(), "no window during the ramp");
    balancer.shutdown(Duration::from_secs(1)).await;
}

/// The value of the sticky cookie `SRV` an answer sets, if it sets one.
fn set_cookie(answer: &crate::support::client::Answer) -> Option<String> {
    answer
        .headers
        .get_all(http::header::SET_COOKIE)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .find_map(|v| v.strip_prefix("SRV="))
        .map(|v| v.split(';').next().unwrap_or_default().to_owned())
}

/// A sticky client: it sends its cookie, and keeps the one it is given.
pub(crate) struct Sticky {
    pub(crate) client: Client,
    pub(crate) cookie: Option<String>,
}

impl Sticky {
    /// One request; the backend that answered and whether the cookie was rewritten.
    pub(crate) async fn get(&mut self) -> (String, bool) {
        let mut request = http::Request::get("/").header("host", "app.test");
        if let Some(cookie) = &self.cookie {
            request = request.header("cookie", format!("theme=dark; SRV={cookie}"));
        }
        let answer = self
            .client
            .request(request.body(bytes::Bytes::new()).expect("a request"))
            .await;
        assert_eq!(answer.status, 200, "{}", answer.text());
        let set = set_cookie(&answer);
        let rewritten = set.is_some();
        if let Some(value) = set {
            self.cookie = Some(value);
        }
        (answer.backend.expect("X-Backend"), rewritten)
    }
}

/// `capataz_sticky_moves_total` for `backend` and `reason`, 0 when absent.
pub(crate) fn moves(balancer: &Balancer, backend: &str, reason: &str) -> u64 {
    let want = format!(
        "capataz_sticky_moves_total{{pool=\"web\",backend=\"{backend}\",reason=\"{reason}\"}} "
    );
    metrics_text(balancer)
        .lines()
        .find_map(|l| l.strip_prefix(want.as_str()))
        .map_or(0, |n| n.trim().parse().expect("a count"))
}

fn sticky_config(b: &[SimBackend], on_drain: &str) -> String {
    let text = ConfigText::sims(b)
        .admin("")
        .listener("h2c = true")
        .extra(&format!(
            "{FAST_CHECKS}\n[pools.web.retries]\nattempts = 0\n\n\
             [pools.web.sticky]\ncookie = \"SRV\"\non_drain = \"{on_drain}\"\n"
        ))
        .build();
    text
}

/// Clients stay on their backend over many requests; when it goes DOWN they move, each gets
/// its cookie rewritten once, and the metric counts exactly the moves the traffic showed.
#[tokio::test]
async fn sticky_clients_stay_and_move_once_when_their_backend_goes_down() {
    let b = backends(&["a", "b", "c"]).await;
    let (balancer, mut events, admin, _) = started(&sticky_config(&b, "keep")).await;
    wait_serving(admin, &["a", "b", "c"]).await;
    let addr = balancer.local_addrs()[0];
    let mut clients: Vec<Sticky> = (0..30)
        .map(|_| Sticky {
            client: Client::new(addr),
            cookie: None,
        })
        .collect();
    let mut home = Vec::new();
    for c in &mut clients {
        let (backend, set) = c.get().await;
        assert!(set, "a new client gets a cookie");
        home.push(backend);
    }
    for _ in 0..10 {
        for (c, home) in clients.iter_mut().zip(&home) {
            assert_eq!(
                &c.get().await,
                &(home.clone(), false),
                "it stays, no new cookie"
            );
        }
    }
    let per: BTreeMap<String, usize> = home.iter().fold(BTreeMap::new(), |mut m, h| {
        *m.entry(h.clone()).or_default() += 1;
        m
    });
    assert_eq!(per.len(), 3, "round robin spread the new clients: {per:?}");

    b[1].set_health(Mode::Status(503));
    wait_for(&mut events, "b DOWN", |e| {
        is_transition(e, "b", State::Down)
    })
    .await;
    wait_serving(admin, &["a", "c"]).await;
    let mut seen_moves = 0;
    for (c, home) in clients.iter_mut().zip(&mut home) {
        let (backend, rewritten) = c.get().await;
        if home == "b" {
            assert_ne!(backend, "b");
            assert!(rewritten, "a moved client gets its cookie rewritten");
            seen_moves += 1;
            *home = backend;
        } else {
            assert_eq!((&backend, rewritten), (&*home, false));
        }
    }
    assert_eq!(seen_moves, per["b"]);
    assert_eq!(moves(&balancer, "b", "out_of_rotation"), seen_moves as u64);
    // Moved clients stay where they were moved, even once b is back.
    b[1].set_health(Mode::Status(200));
    wait_for(&mut events, "b UP", |e| is_transition(e, "b", State::Up)).await;
    wait_serving(admin, &["a", "b", "c"]).await;
    for (c, home) in clients.iter_mut().zip(&home) {
        assert_eq!(&c.get().await, &(home.clone(), false));
    }
    // A forged cookie is a miss: balanced, and given a real one.
    let mut forged = Sticky {
        client: Client::new(addr),
        cookie: Some("not-a-backend".into()),
    };
    let (_, rewritten) = forged.get().await;
    assert!(rewritten);
    assert_eq!(moves(&balancer, "b", "out_of_rotation"), seen_moves as u64);
    balancer.shutdown(Duration::from_secs(1)).await;
}

/// A drained backend keeps its sticky clients with `on_drain = "keep"` (no new ones), and
/// moves them with `"move"`, counted as `draining`.
#[tokio::test]
async fn a_drained_backend_keeps_or_moves_its_sticky_clients() {
    for on_drain in ["keep", "move"] {
        let b = backends(&["a", "b"]).await;
        let (balancer, _events, admin, _) = started(&sticky_config(&b, on_drain)).await;
        wait_serving(admin, &["a", "b"]).await;
        let addr = balancer.local_addrs()[0];
        let mut clients: Vec<Sticky> = (0..10)
            .map(|_| Sticky {
                client: Client::new(addr),
                cookie: None,
            })
            .collect();
        let mut home = Vec::new();
        for c in &mut clients {
            home.push(c.get().await.0);
        }
        let on_b = home.iter().filter(|h| *h == "b").count();
        assert!(on_b > 0, "{home:?}");
        admin_post(admin, "/backends/web/b/drain").await;
        wait_serving(admin, &["a"]).await;
        let status = capataz::ctl::request(admin, Method::GET, "/status", None)
            .await
            .expect("GET /status");
        let keeping = if on_drain == "keep" {
            vec!["b"]
        } else {
            vec![]
        };
        assert_eq!(
            status["pools"][0]["affinity"],
            serde_json::json!({
                "hash": null,
                "sticky": { "cookie": "SRV", "on_drain": on_drain, "keeping": keeping },
            })
        );
        for (c, home) in clients.iter_mut().zip(&home) {
            let (backend, rewritten) = c.get().await;
            match (on_drain, home.as_str()) {
                ("move", "b") => assert_eq!((backend.as_str(), rewritten), ("a", true)),
                _ => assert_eq!((&backend, rewritten), (home, false), "{on_drain}"),
            }
        }
        // A new client never lands on the draining backend.
        for _ in 0..10 {
            let mut new = Sticky {
                client: Client::new(addr),
                cookie: None,
            };
            assert_eq!(new.get().await, ("a".to_owned(), true));
        }
        let counted = moves(&balancer, "b", "draining");
        assert_eq!(counted, if on_drain == "move" { on_b as u64 } else { 0 });
        balancer.shutdown(Duration::from_secs(1)).await;
    }
}

/// An HTTP/2 client, which splits its cookies over several `cookie` fields, stays on its
/// backend too.
#[tokio::test]
async fn an_http2_client_with_split_cookie_fields_stays_on_its_backend() {
    use crate::support::h2client::{connect, empty, request};
    let b = backends(&["a", "b", "c"]).await;
    let (balancer, _events, admin, _) = started(&sticky_config(&b, "keep")).await;
    wait_serving(admin, &["a", "b", "c"]).await;
    let mut h2 = connect(balancer.local_addrs()[0]).await;
    for _ in 0..3 {
        let first = h2.get("app.test", "/").await;
        let home = first.header("x-backend").expect("X-Backend").to_owned();
        let set = first
            .header("set-cookie")
            .expect("a new client gets a cookie");
        let value = set
            .strip_prefix("SRV=")
            .and_then(|v| v.split(';').next())
            .expect("the cookie")
            .to_owned();
        for _ in 0..10 {
            let mut req = request(Method::GET, "app.test", "/", empty());
            req.headers_mut()
                .append("cookie", "theme=dark".parse().unwrap());
            req.headers_mut()
                .append("cookie", format!("SRV={value}").parse().unwrap());
            let answer = h2.send(req).await.expect("an answer");
            assert_eq!(answer.header("x-backend"), Some(home.as_str()));
            assert_eq!(answer.header("set-cookie"), None);
        }
    }
    balancer.shutdown(Duration::from_secs(1)).await;
}
