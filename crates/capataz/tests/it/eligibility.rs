//! Who gets traffic, end to end: fail-open only over backends proven healthy, what the
//! `all_down` event says and when, and overrides' time arithmetic and timers. Loopback only,
//! ephemeral ports, waits on events with generous deadlines.

use std::net::SocketAddr;
use std::time::Duration;

use capataz::config;
use capataz::health::{Notice, OverrideKind};
use capataz::sim::SimBackend;
use capataz_health::AllDown;
use tokio::sync::broadcast;

use crate::support::balancer::{backends, lone_pool, start};
use crate::support::client::exchange;
use crate::support::DEADLINE;

/// Probes so rare that no backend passes `rise = 2` of them during a test.
const RARE_PROBES: &str = "interval = \"60s\"\nrise = 2\n";

fn list(backends: &[&SimBackend]) -> String {
    let items: Vec<String> = backends
        .iter()
        .map(|b| format!("{{ name = \"{}\", address = \"{}\" }}", b.name(), b.addr()))
        .collect();
    items.join(", ")
}

/// One GET on a fresh connection: status, `Retry-After`, and the backend that answered.
async fn get(addr: SocketAddr, path: &str) -> (u16, Option<String>, Option<String>) {
    let answer = exchange(addr, "GET", path, "app.test", &[]).await;
    let retry_after = answer
        .headers
        .get("retry-after")
        .and_then(|v| v.to_str().ok())
        .map(str::to_owned);
    (answer.status, retry_after, answer.backend)
}

/// Every event already sent, in order.
fn drain(rx: &mut broadcast::Receiver<Notice>) -> Vec<Notice> {
    std::iter::from_fn(|| rx.try_recv().ok()).collect()
}

fn all_down_of(events: &[Notice]) -> Vec<AllDown> {
    events
        .iter()
        .filter_map(|e| match e {
            Notice::AllDown { policy, .. } => Some(*policy),
            _ => None,
        })
        .collect()
}

/// Regression: with `active.initial = "down"` and the default `fail_open`, requests
/// went to backends that had never passed a probe.
#[tokio::test]
async fn initial_down_pool_rejects_before_any_backend_is_proven() {
    let b = backends(&["a", "b"]).await;
    let text = format!(
        "[[listeners]]\naddress = \"127.0.0.1:0\"\n\n[pools.web]\nbackends = [{}]\n\n\
         [pools.web.active]\ninitial = \"down\"\n{RARE_PROBES}",
        list(&[&b[0], &b[1]])
    );
    let (balancer, mut rx) = start(&text).await;
    let (status, retry_after, backend) = get(balancer.local_addrs()[0], "/").await;
    assert_eq!(
        (status, backend),
        (503, None),
        "an unproven backend answered"
    );
    assert_eq!(retry_after.as_deref(), Some("1"));
    assert_eq!(b[0].traffic_hits() + b[1].traffic_hits(), 0);
    let events = drain(&mut rx);
    assert_eq!(
        all_down_of(&events),
        [AllDown::NoneToFailOpen {
            overridden: 0,
            unproven: 2,
            held: 0,
        }]
    );
    let sentence = events[0].sentence();
    assert!(
        sentence.contains("rejecting requests with 503"),
        "{sentence}"
    );
    assert_eq!(events[0].to_json()["policy"], "reject");
}

/// Regression: a pool added by a reload got fail-open traffic before its first probe.
#[tokio::test]
async fn a_pool_added_by_reload_gets_no_traffic_before_its_first_probe() {
    let b = backends(&["old", "fresh"]).await;
    let listener = "[[listeners]]\naddress = \"127.0.0.1:0\"\n";
    let web = format!("[pools.web]\nbackends = [{}]\n", list(&[&b[0]]));
    let before = format!("{listener}[[listeners.routes]]\npool = \"web\"\n\n{web}");
    let (balancer, mut rx) = start(&before).await;
    let addr = balancer.local_addrs()[0];
    assert_eq!(get(addr, "/new/x").await.0, 200);

    let after = format!(
        "{listener}[[listeners.routes]]\npath_prefix = \"/new/\"\npool = \"fresh\"\n\n\
         [[listeners.routes]]\npool = \"web\"\n\n{web}\n\
         [pools.fresh]\nbackends = [{}]\n\n[pools.fresh.active]\n{RARE_PROBES}",
        list(&[&b[1]])
    );
    let config = config::parse_str(&after, "<test>").expect("valid test config");
    drain(&mut rx);
    balancer.reload(&config).await.expect("the reload applies");
    let (status, retry_after, backend) = get(addr, "/new/x").await;
    assert_eq!((status, backend), (503, None), "a gated backend answered");
    assert!(retry_after.is_some());
    assert_eq!(b[1].traffic_hits(), 0);
    assert_eq!(
        all_down_of(&drain(&mut rx)),
        [AllDown::NoneToFailOpen {
            overridden: 0,
            unproven: 1,
            held: 0,
        }]
    );
    let answer = get(addr, "/").await;
    assert_eq!(answer.2.as_deref(), Some("old"), "{answer:?}");
}

/// Regression: with every backend overridden, requests got 503 but the `all_down`
/// event said `fail_open` ("spreading traffic") and came before the override that caused it.
#[tokio::test]
async fn overriding_every_backend_reports_reject_after_the_override() {
    let b = backends(&["a", "b"]).await;
    let text = format!(
        "[[listeners]]\naddress = \"127.0.0.1:0\"\n\n[pools.web]\nbackends = [{}]\n\n\
         [pools.web.active]\n{RARE_PROBES}",
        list(&[&b[0], &b[1]])
    );
    let (balancer, mut rx) = start(&text).await;
    let pool = balancer.pool("web").expect("pool web");
    pool.set_override("a", Some(OverrideKind::Down), None)
        .unwrap();
    pool.set_override("b", Some(OverrideKind::Drain), None)
        .unwrap();
    let kinds: Vec<&str> = drain(&mut rx).iter().map(Notice::kind).collect();
    assert_eq!(kinds, ["override", "override", "all_down"]);
    let (status, _, _) = get(balancer.local_addrs()[0], "/").await;
    assert_eq!(status, 503);
    let page = capataz::status::page(&balancer.pools(), "now", None, &[]).expect("a status page");
    let page: serde_json::Value = serde_json::from_slice(&page).expect("JSON");
    assert_eq!(page["pools"][0]["when_all_down"], "fail_open");
    assert_eq!(page["pools"][0]["all_down_policy"], "reject");

    pool.set_override("a", None, None).unwrap();
    let events = drain(&mut rx);
    let kinds: Vec<&str> = events.iter().map(Notice::kind).collect();
    assert_eq!(kinds, ["override", "recovered"]);
}

const NO_PROBES: &str = "[[listeners]]\naddress = \"127.0.0.1:0\"\n\n[pools.web]\n\
    backends = [{ name = \"a\", address = \"127.0.0.1:9\" }, { name = \"b\", address = \"127.0.0.1:9\" }]\n\
    [pools.web.active]\nkind = \"none\"\n";

/// Regression: an override TTL of u64::MAX seconds overflowed the clock arithmetic
/// and panicked.
#[tokio::test]
async fn huge_override_ttl_neither_panics_nor_lapses() {
    let (pool, mut rx) = lone_pool(NO_PROBES);
    let tasks = pool.spawn_tasks();
    for ttl in [Duration::MAX, Duration::from_secs(u64::MAX)] {
        let state = pool
            .set_override("a", Some(OverrideKind::Drain), Some(ttl))
            .unwrap();
        assert_eq!(state, "DRAINING");
    }
    let view = pool.view_of(0);
    let json = capataz::status::backend_json(&pool, &view);
    assert_eq!(json["state"], "DRAINING");
    assert!(json["override"]["until"].as_str().is_some());
    let sentence = drain(&mut rx)[0].sentence();
    assert!(sentence.contains("for "), "{sentence}");
    pool.tick();
    assert_eq!(pool.view_of(0).state(), "DRAINING");
    for task in tasks {
        task.abort();
    }
}

/// The one timer: an override set for 30 s lapses 30 s later on the runtime clock (paused
/// tokio time), and health decides again.
#[tokio::test(start_paused = true)]
async fn override_ttl_lapses_on_time() {
    let (pool, mut rx) = lone_pool(NO_PROBES);
    let tasks = pool.spawn_tasks();
    pool.set_override("b", Some(OverrideKind::Down), Some(Duration::from_secs(30)))
        .unwrap();
    let set_at = pool.clock().now();
    assert_eq!(pool.snapshot().eligible, [0]);
    let lapsed = loop {
        match tokio::time::timeout(DEADLINE * 10, rx.recv()).await {
            Ok(Ok(event @ Notice::Override { kind: None, .. })) => break event,
            Ok(Ok(_)) => continue,
            other => panic!("no lapse: {other:?}"),
        }
    };
    let elapsed = pool.clock().now() - set_at;
    assert!(
        elapsed >= Duration::from_secs(30) && elapsed < Duration::from_secs(31),
        "lapsed after {elapsed:?}"
    );
    assert!(
        lapsed.sentence().contains("lapsed"),
        "{}",
        lapsed.sentence()
    );
    assert_eq!(pool.snapshot().eligible, [0, 1]);
    for task in tasks {
        task.abort();
    }
}
