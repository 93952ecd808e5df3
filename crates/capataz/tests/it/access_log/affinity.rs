//! The access log's `affinity=` on pools that hash or are sticky, compared with the traffic
//! (which backend answered) and with `capataz_sticky_moves_total`: a sticky client is `new`,
//! then `kept`, then `moved:draining` or `moved:out_of_rotation` when its backend drains or
//! goes DOWN, each such line one count of the metric; a hashed key is `kept` on its home, or
//! `moved:failed` when its home refuses and a retry answers, `moved:out_of_rotation` or
//! `moved:draining` when it is down or drains, `moved:bounded_load` when it holds its bound; a pool without affinity logs no `affinity=` at all.

use std::path::Path;

use capataz::sim::{Mode, SimBackend};
use capataz_health::State;

use crate::affinity::{admin_post, moves, started, wait_serving, Sticky};
use crate::queue::{self, Hold, SlowBackend};
use crate::support::access_log::{table, wait_lines, LogDir};
use crate::support::balancer::{backends, ConfigText, FAST_CHECKS};
use crate::support::client::Client;
use crate::support::events::{is_transition, wait_for};

/// The value of `name=` on a text line (`None` without the field).
fn field<'l>(line: &'l str, name: &str) -> Option<&'l str> {
    let at = line.find(&format!(" {name}="))? + name.len() + 2;
    line[at..].split(' ').next()
}

/// The `(backend, affinity)` of lines `from..` of `path` once it has `to` lines, sorted (a
/// line is written as its answer ends, so lines of one phase may come in any order).
async fn said(path: &Path, from: usize, to: usize) -> Vec<(String, String)> {
    let lines = wait_lines(path, to).await;
    assert_eq!(
        lines.len(),
        to,
        "no line more than the requests: {lines:#?}"
    );
    let mut said: Vec<(String, String)> = lines[from..]
        .iter()
        .map(|l| {
            let get = |name| field(l, name).unwrap_or("(none)").to_owned();
            (get("backend"), get("affinity"))
        })
        .collect();
    said.sort_unstable();
    said
}

fn sorted(mut pairs: Vec<(String, String)>) -> Vec<(String, String)> {
    pairs.sort_unstable();
    pairs
}

/// Sticky clients: `new` at first, `kept` after; drained (`on_drain = "move"`) or DOWN, the
/// clients of that backend are `moved:draining` / `moved:out_of_rotation`, as many lines as
/// the metric's increase for that backend and reason; a forged cookie is `unknown`.
#[tokio::test]
async fn sticky_lines_say_new_kept_and_moved_with_the_reason_the_metric_counts() {
    let b = backends(&["a", "b", "c"]).await;
    let dir = LogDir::new();
    let log = dir.path("access.log");
    let text = ConfigText::sims(&b)
        .admin("")
        .listener(&table(&log, "text", ""))
        .extra(&format!(
            "{FAST_CHECKS}\n[pools.web.retries]\nattempts = 0\n\n\
             [pools.web.sticky]\ncookie = \"SRV\"\non_drain = \"move\"\n"
        ))
        .build();
    let (balancer, mut events, admin, _) = started(&text).await;
    wait_serving(admin, &["a", "b", "c"]).await;
    let addr = balancer.local_addrs()[0];
    let mut clients: Vec<Sticky> = (0..12)
        .map(|_| Sticky {
            client: Client::new(addr),
            cookie: None,
        })
        .collect();
    let mut home = Vec::new();
    for c in &mut clients {
        home.push(c.get().await.0);
    }
    let pairs = |home: &[String], word: &str| -> Vec<(String, String)> {
        home.iter().map(|h| (h.clone(), word.to_owned())).collect()
    };
    assert_eq!(said(&log, 0, 12).await, sorted(pairs(&home, "new")));
    for c in &mut clients {
        c.get().await;
    }
    assert_eq!(said(&log, 12, 24).await, sorted(pairs(&home, "kept")));

    // b drains and moves its clients: each says so, once, as the metric counts.
    let on_b = home.iter().filter(|h| *h == "b").count();
    assert!(on_b > 0, "{home:?}");
    let before = moves(&balancer, "b", "draining");
    admin_post(admin, "/backends/web/b/drain").await;
    wait_serving(admin, &["a", "c"]).await;
    let mut want = Vec::new();
    for (c, home) in clients.iter_mut().zip(&mut home) {
        let (now, _) = c.get().await;
        let word = if home == "b" {
            assert_ne!(now, "b");
            *home = now.clone();
            "moved:draining"
        } else {
            assert_eq!(&now, home);
            "kept"
        };
        want.push((now, word.to_owned()));
    }
    let lines = said(&log, 24, 36).await;
    assert_eq!(lines, sorted(want));
    let logged = lines.iter().filter(|(_, a)| a == "moved:draining").count();
    assert_eq!(logged, on_b);
    assert_eq!(moves(&balancer, "b", "draining") - before, logged as u64);

    // c goes DOWN: its clients are moved out of rotation, to a (b still drains).
    let on_c = home.iter().filter(|h| *h == "c").count();
    assert!(on_c > 0, "{home:?}");
    let before = moves(&balancer, "c", "out_of_rotation");
    b[2].set_health(Mode::Status(503));
    wait_for(&mut events, "c DOWN", |e| {
        is_transition(e, "c", State::Down)
    })
    .await;
    wait_serving(admin, &["a"]).await;
    for c in &mut clients {
        assert_eq!(c.get().await.0, "a");
    }
    let lines = said(&log, 36, 48).await;
    let logged = lines
        .iter()
        .filter(|l| *l == &("a".to_owned(), "moved:out_of_rotation".to_owned()))
        .count();
    assert_eq!(logged, on_c, "{lines:?}");
    assert_eq!(
        lines.iter().filter(|(_, a)| a == "kept").count(),
        12 - on_c,
        "{lines:?}"
    );
    assert_eq!(
        moves(&balancer, "c", "out_of_rotation") - before,
        logged as u64
    );

    // A cookie naming no backend of the pool: `unknown`, not a move.
    let mut forged = Sticky {
        client: Client::new(addr),
        cookie: Some("0123456789abcdef".into()),
    };
    forged.get().await;
    assert_eq!(
        said(&log, 48, 49).await,
        [("a".to_owned(), "unknown".to_owned())]
    );
    balancer.shutdown(std::time::Duration::from_secs(1)).await;
}

/// One request with key `key` (none: no `X-User`); the backend that answered.
async fn keyed(client: &mut Client, key: Option<usize>) -> String {
    let mut request = http::Request::get("/").header("host", "app.test");
    if let Some(k) = key {
        request = request.header("x-user", format!("user-{k}"));
    }
    let answer = client
        .request(request.body(bytes::Bytes::new()).expect("a request"))
        .await;
    assert_eq!(answer.status, 200, "{}", answer.text());
    answer.backend.expect("X-Backend")
}

/// A hashing pool: every key's line says its home was `kept` (the backend that answered); a
/// request without a key says `no_key`; with `c` refusing (no checks to take it out), each of
/// its keys is retried elsewhere and says `moved:failed`, the others still `kept`; with `c`
/// forced down and `d` drained, their keys say `moved:out_of_rotation` and `moved:draining`.
#[tokio::test]
async fn a_hash_pools_lines_say_the_owner_was_kept_or_why_it_was_left() {
    const KEYS: usize = 40;
    let b = backends(&["a", "b", "c", "d"]).await;
    let dir = LogDir::new();
    let log = dir.path("access.log");
    let text = ConfigText::sims(&b)
        .admin("")
        .listener(&table(&log, "text", ""))
        .extra(
            "algorithm = \"hash\"\nhash_key = \"header:X-User\"\n\
             [pools.web.active]\nkind = \"none\"\n[pools.web.passive]\nenabled = false\n\
             [pools.web.retries]\nattempts = 1\nbudget_percent = 100\nmin_budget = 1000\n",
        )
        .build();
    let (balancer, _events, admin, mut client) = started(&text).await;
    wait_serving(admin, &["a", "b", "c", "d"]).await;
    let mut owners = Vec::new();
    for k in 0..KEYS {
        owners.push(keyed(&mut client, Some(k)).await);
    }
    let kept: Vec<(String, String)> = owners.iter().map(|o| (o.clone(), "kept".into())).collect();
    assert_eq!(said(&log, 0, KEYS).await, sorted(kept));
    let round_robin = keyed(&mut client, None).await;
    assert_eq!(
        said(&log, KEYS, KEYS + 1).await,
        [(round_robin, "no_key".to_owned())]
    );

    b[2].crash();
    let mut want = Vec::new();
    for (k, owner) in owners.iter().enumerate() {
        let now = keyed(&mut client, Some(k)).await;
        let word = if owner == "c" {
            assert_ne!(now, "c");
            "moved:failed"
        } else {
            assert_eq!(&now, owner);
            "kept"
        };
        want.push((now, word.to_owned()));
    }
    assert!(owners.iter().any(|o| o == "c"), "{owners:?}");
    assert_eq!(said(&log, KEYS + 1, 2 * KEYS + 1).await, sorted(want));

    // c taken down and d drained: their keys move, out of rotation and draining; the
    // others stay home.
    admin_post(admin, "/backends/web/c/down").await;
    admin_post(admin, "/backends/web/d/drain").await;
    wait_serving(admin, &["a", "b"]).await;
    let mut want = Vec::new();
    for (k, owner) in owners.iter().enumerate() {
        let now = keyed(&mut client, Some(k)).await;
        let word = match owner.as_str() {
            "c" => "moved:out_of_rotation",
            "d" => "moved:draining",
            _ => "kept",
        };
        assert!(word != "kept" || &now == owner, "{k}: {owner} -> {now}");
        want.push((now, word.to_owned()));
    }
    assert!(owners.iter().any(|o| o == "d"), "{owners:?}");
    let from = 2 * KEYS + 1;
    assert_eq!(said(&log, from, from + KEYS).await, sorted(want));
    balancer.shutdown(std::time::Duration::from_secs(1)).await;
}

/// Slow start: while a returning backend ramps up, the keys it is home to that its few points
/// do not hold yet say `moved:weight` (from wherever they are served), those back on it `kept`.
#[tokio::test]
async fn a_returning_backends_keys_say_weight_while_it_ramps_up() {
    const KEYS: usize = 40;
    let b = backends(&["a", "b", "c", "d"]).await;
    let dir = LogDir::new();
    let log = dir.path("access.log");
    let text = ConfigText::sims(&b)
        .admin("")
        .listener(&table(&log, "text", ""))
        .extra(&format!(
            "algorithm = \"hash\"\nhash_key = \"header:X-User\"\nslow_start = \"60s\"\n\
             {FAST_CHECKS}\n[pools.web.retries]\nattempts = 0\n"
        ))
        .build();
    let (balancer, mut events, admin, mut client) = started(&text).await;
    wait_serving(admin, &["a", "b", "c", "d"]).await;
    let mut homes = Vec::new();
    for k in 0..KEYS {
        homes.push(keyed(&mut client, Some(k)).await);
    }
    assert!(homes.iter().any(|h| h == "c"), "{homes:?}");
    b[2].set_health(Mode::Status(503));
    wait_for(&mut events, "c DOWN", |e| {
        is_transition(e, "c", State::Down)
    })
    .await;
    b[2].set_health(Mode::Status(200));
    wait_for(&mut events, "c UP", |e| is_transition(e, "c", State::Up)).await;
    wait_serving(admin, &["a", "b", "c", "d"]).await;
    let mut want = Vec::new();
    for (k, home) in homes.iter().enumerate() {
        let now = keyed(&mut client, Some(k)).await;
        let word = if &now == home { "kept" } else { "moved:weight" };
        assert!(home == "c" || &now == home, "{k}: {home} -> {now}");
        want.push((now, word.to_owned()));
    }
    let lines = said(&log, KEYS, 2 * KEYS).await;
    assert_eq!(lines, sorted(want));
    assert!(
        lines.iter().any(|(_, a)| a == "moved:weight"),
        "c ramps for 60 s: some of its keys are not back yet: {lines:?}"
    );
    balancer.shutdown(std::time::Duration::from_secs(1)).await;
}

/// Bounded loads: twelve requests with one key held open by the backends, sent one after the
/// other to a pool with `hash_balance_factor = 150`. The first lands on the key's owner; the
/// lines of the requests it held say `kept`, those of the ones the walk sent on say
/// `moved:bounded_load`, and each backend has as many lines as it held requests.
#[tokio::test]
async fn a_hot_keys_lines_say_kept_on_its_owner_and_bounded_load_elsewhere() {
    const REQUESTS: usize = 12;
    let mut slow = Vec::new();
    for _ in 0..4 {
        slow.push(SlowBackend::start(Hold::Gate).await);
    }
    let names = ["a", "b", "c", "d"];
    let backends: Vec<(&str, std::net::SocketAddr, &str)> = names
        .iter()
        .zip(&slow)
        .map(|(n, s)| (*n, s.addr(), ""))
        .collect();
    let dir = LogDir::new();
    let log = dir.path("access.log");
    let pool = "algorithm = \"hash\"\nhash_key = \"path\"\nhash_balance_factor = 150";
    let text = queue::config(&backends, pool, &table(&log, "text", ""));
    let (balancer, _events) = crate::support::balancer::start(&text).await;
    let addr = balancer.local_addrs()[0];
    let held_now = || {
        slow.iter()
            .map(SlowBackend::holding)
            .collect::<Vec<usize>>()
    };
    let mut pending = Vec::new();
    let mut owner = None;
    for k in 0..REQUESTS {
        pending.push(tokio::spawn(async move { queue::get(addr, "/hot").await }));
        crate::support::wait::wait_until("the request reaches a backend", || {
            held_now().iter().sum::<usize>() == k + 1
        })
        .await;
        if k == 0 {
            owner = held_now().iter().position(|&n| n == 1);
        }
    }
    let held = held_now();
    let owner = names[owner.expect("the first request's backend")];
    for s in &slow {
        s.release(REQUESTS);
    }
    for answer in pending {
        assert_eq!(answer.await.expect("the request's task").status, 200);
    }
    let lines = said(&log, 0, REQUESTS).await;
    println!("hash_balance_factor = 150: held per backend {held:?}");
    assert!(held.iter().filter(|&&n| n > 0).count() >= 2, "{held:?}");
    for (name, &n) in names.iter().zip(&held) {
        let mine: Vec<&str> = lines
            .iter()
            .filter(|(b, _)| b == name)
            .map(|(_, a)| a.as_str())
            .collect();
        assert_eq!(mine.len(), n, "{name}: {lines:?}");
    }
    // Every line on the owner says kept, every other one bounded_load.
    for (backend, affinity) in &lines {
        let want = if backend == owner {
            "kept"
        } else {
            "moved:bounded_load"
        };
        assert_eq!(affinity, want, "{backend}: {lines:?}");
    }
    balancer.shutdown(std::time::Duration::from_secs(1)).await;
}

/// A pool with neither hashing nor a sticky cookie: no `affinity=` on its lines.
#[tokio::test]
async fn a_pool_without_affinity_logs_no_affinity_field() {
    let b: Vec<SimBackend> = backends(&["a", "b"]).await;
    let dir = LogDir::new();
    let log = dir.path("access.log");
    let text = ConfigText::sims(&b)
        .admin("")
        .listener(&table(&log, "text", ""))
        .build();
    let (balancer, _events, _admin, mut client) = started(&text).await;
    assert_eq!(client.get("/").await.status, 200);
    let lines = wait_lines(&log, 1).await;
    assert!(!lines[0].contains("affinity="), "{lines:?}");
    assert!(lines[0].ends_with(" reason=-"), "{lines:?}");
    balancer.shutdown(std::time::Duration::from_secs(1)).await;
}
