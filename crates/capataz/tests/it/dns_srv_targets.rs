//! "One bad SRV target empties or freezes a DNS pool": an SRV target without an
//! address (NXDOMAIN, from Knot DNS) is left out and the other targets are the membership,
//! from the first answer on and when it appears later (a weight change after it is still
//! applied); a target whose lookup times out (the hostile server) stays at its last address.
//! Each is said in `/status` (`source.unresolved`) and by `target_*` membership events, and
//! the target is asked again with the others on the records' TTL. Before the fix, one such
//! target failed the whole answer: the pool froze (`failing`), or stayed empty and answered
//! 503.

use std::net::IpAddr;
use std::time::Duration;

use capataz::health::Notice;
use capataz::server::Balancer;
use serde_json::Value;
use tokio::sync::broadcast;

use crate::dns_source::{membership, text, wait_updated};
use crate::support::balancer::{backends, parse, start};
use crate::support::client::Client;
use crate::support::events::wait_for;
use crate::support::hostile_dns::{HostileDns, Reply, Type};
use crate::support::knot::Knot;
use crate::support::wait::wait_until;

const SRV: &str = "_http._tcp.web.test.";

/// The config of a pool following the SRV records of `SRV` on `resolver`, without probes.
fn srv_text(resolver: std::net::SocketAddr) -> String {
    text(
        &format!("name = \"{SRV}\"\nrecord = \"srv\"\nresolver = \"{resolver}\"\n"),
        "kind = \"none\"",
    )
}

async fn srv_pool(resolver: std::net::SocketAddr) -> (Balancer, broadcast::Receiver<Notice>) {
    start(&srv_text(resolver)).await
}

/// The first membership event among `kinds` (as named in `/events`).
async fn first_of(rx: &mut broadcast::Receiver<Notice>, kinds: &[&str]) -> Notice {
    wait_for(rx, &format!("a membership event among {kinds:?}"), |e| {
        membership(e).is_some_and(|c| kinds.contains(&c.as_str()))
    })
    .await
}

/// The pool's `source` in `/status`.
fn source_status(balancer: &Balancer) -> Value {
    let page = capataz::status::page(&balancer.pools(), "now", None, &[]).expect("status page");
    let page: Value = serde_json::from_slice(&page).expect("status JSON");
    page["pools"][0]["source"].clone()
}

fn weight_of(balancer: &Balancer, name: &str) -> Option<u32> {
    let pool = balancer.pool("web")?;
    let backend = pool.config.backends.iter().find(|b| b.name == name)?;
    Some(backend.weight)
}

#[tokio::test]
async fn a_new_srv_target_without_an_address_is_left_out_and_does_not_freeze_the_pool() {
    let sims = backends(&["a", "b", "gone"]).await;
    let port = |i: usize| sims[i].addr().port();
    let zone = |weight_a: u16, gone: &str| {
        format!(
            "_http._tcp.web 1 IN SRV 0 {weight_a} {} a\n_http._tcp.web 1 IN SRV 0 10 {} b\n\
             a 1 IN A 127.0.0.1\nb 1 IN A 127.0.0.1\n{gone}",
            port(0),
            port(1)
        )
    };
    let gone_srv = format!("_http._tcp.web 1 IN SRV 0 10 {} gone", port(2));
    let mut knot = Knot::start("srv-freeze", &zone(10, ""));
    let (balancer, mut rx) = srv_pool(knot.addr()).await;
    wait_updated(&mut rx, 2).await;
    let a = format!("a.test:{}", port(0));
    let gone = format!("gone.test:{}", port(2));

    // A record for a name that does not exist joins the set.
    knot.set_records(&zone(10, &gone_srv));
    let event = first_of(&mut rx, &["failing", "target_left_out", "updated"]).await;
    let json = event.to_json();
    assert_eq!(json["membership"], "target_left_out", "{json}");
    assert_eq!(json["target"], gone.as_str(), "{json}");
    assert!(
        json["sentence"]
            .as_str()
            .is_some_and(|s| s.contains("left out (no address: NXDOMAIN)")),
        "{json}"
    );
    let source = source_status(&balancer);
    assert!(source["failing"].is_null(), "{source}");
    assert_eq!(
        source["unresolved"],
        serde_json::json!([{ "target": gone, "reason": "no address: NXDOMAIN", "kept": null }]),
        "{source}"
    );
    // A later weight change is applied while the target is still left out.
    knot.set_records(&zone(30, &gone_srv));
    wait_until("a's new weight applied", || {
        weight_of(&balancer, &a) == Some(30)
    })
    .await;
    assert_eq!(balancer.pool("web").expect("pool").backends.len(), 2);
    // The name gets an address: the target comes back and joins.
    knot.set_records(&format!("{}\ngone 1 IN A 127.0.0.1", zone(30, &gone_srv)));
    let back = first_of(&mut rx, &["target_restored", "failing"]).await;
    assert_eq!(back.to_json()["target"], gone.as_str());
    wait_updated(&mut rx, 3).await;
    assert_eq!(
        source_status(&balancer)["unresolved"],
        serde_json::json!([])
    );
    balancer.shutdown(Duration::from_secs(5)).await;
}

#[tokio::test]
async fn an_srv_set_with_a_target_without_an_address_from_the_start_serves_the_others() {
    let sims = backends(&["a", "b"]).await;
    let port = |i: usize| sims[i].addr().port();
    let knot = Knot::start(
        "srv-start",
        &format!(
            "_http._tcp.web 1 IN SRV 0 10 {} a\n_http._tcp.web 1 IN SRV 0 10 {} b\n\
             _http._tcp.web 1 IN SRV 0 10 9 gone\na 1 IN A 127.0.0.1\nb 1 IN A 127.0.0.1",
            port(0),
            port(1)
        ),
    );
    let (balancer, mut rx) = srv_pool(knot.addr()).await;
    let event = first_of(&mut rx, &["failing", "target_left_out", "updated"]).await;
    assert_eq!(event.to_json()["membership"], "target_left_out");
    wait_updated(&mut rx, 2).await;
    let mut client = Client::new(balancer.local_addrs()[0]);
    for _ in 0..4 {
        assert_eq!(client.get("/").await.status, 200);
    }
    assert_eq!(sims[0].traffic_hits() + sims[1].traffic_hits(), 4);
    let source = source_status(&balancer);
    assert_eq!(source["unresolved"][0]["target"], "gone.test:9", "{source}");
    assert_eq!(source["unresolved"][0]["reason"], "no address: NXDOMAIN");
    balancer.shutdown(Duration::from_secs(5)).await;
}

#[tokio::test]
async fn an_srv_target_whose_lookup_times_out_stays_at_its_last_address() {
    let sims = backends(&["a", "b"]).await;
    let port = |i: usize| sims[i].addr().port();
    let dns = HostileDns::start().await;
    let records = |weight_a: u16| {
        Reply::Srv(vec![
            (0, weight_a, port(0), "a.test.".to_owned()),
            (0, 10, port(1), "b.test.".to_owned()),
        ])
    };
    let loopback = || Reply::Addresses(vec![IpAddr::from([127, 0, 0, 1])]);
    dns.set(SRV, Type::Srv, records(10));
    for host in ["a.test.", "b.test."] {
        dns.set(host, Type::A, loopback());
        dns.set(host, Type::Aaaa, Reply::NoData);
    }
    let (balancer, mut rx) = srv_pool(dns.addr()).await;
    wait_updated(&mut rx, 2).await;
    let b = format!("b.test:{}", port(1));

    dns.set("b.test.", Type::A, Reply::Silent);
    let event = first_of(
        &mut rx,
        &["failing", "target_failing", "updated", "drop_held"],
    )
    .await;
    let json = event.to_json();
    assert_eq!(json["membership"], "target_failing", "{json}");
    assert_eq!(json["target"], b.as_str());
    let source = source_status(&balancer);
    let unresolved = &source["unresolved"][0];
    assert_eq!(unresolved["target"], b.as_str(), "{source}");
    assert_eq!(
        unresolved["kept"],
        format!("127.0.0.1:{}", port(1)).as_str()
    );
    assert!(
        unresolved["reason"]
            .as_str()
            .is_some_and(|r| r == "lookup failed: A: request timed out"),
        "{source}"
    );
    // The other target's weight change goes through; b stays and serves.
    dns.set(SRV, Type::Srv, records(30));
    let a = format!("a.test:{}", port(0));
    wait_until("a's new weight applied", || {
        weight_of(&balancer, &a) == Some(30)
    })
    .await;
    assert_eq!(weight_of(&balancer, &b), Some(10));
    let mut client = Client::new(balancer.local_addrs()[0]);
    for _ in 0..40 {
        assert_eq!(client.get("/").await.status, 200);
    }
    let (to_a, to_b) = (sims[0].traffic_hits(), sims[1].traffic_hits());
    assert!(
        to_b > 0 && to_a > to_b,
        "a {to_a}, b {to_b} of 40 at weights 30 and 10"
    );

    // A reload restarts the source: b still stays where it was, and nothing is told again.
    balancer
        .reload(&parse(&srv_text(dns.addr())))
        .await
        .expect("reload");
    // A lookup that times out asks twice (the resolver sends a query once more): the third
    // query starts the second lookup, so the first one's answer was judged.
    let asked = dns.asked("b.test.", Type::A);
    wait_until("a second lookup of b", || {
        dns.asked("b.test.", Type::A) >= asked + 3
    })
    .await;
    while let Ok(event) = rx.try_recv() {
        assert!(membership(&event).is_none(), "after the reload: {event:?}");
    }
    assert_eq!(weight_of(&balancer, &b), Some(10), "b left the pool");
    assert_eq!(
        source_status(&balancer)["unresolved"][0]["target"],
        b.as_str()
    );

    dns.set("b.test.", Type::A, loopback());
    let back = first_of(&mut rx, &["target_restored", "failing"]).await;
    assert_eq!(back.to_json()["membership"], "target_restored");
    assert_eq!(
        source_status(&balancer)["unresolved"],
        serde_json::json!([])
    );
    balancer.shutdown(Duration::from_secs(5)).await;
}
