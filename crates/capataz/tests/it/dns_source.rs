//! The `dns` backend source against a real authoritative server (Knot DNS on loopback, see
//! `support/knot.rs`): A records followed on their TTL (added backends gated until `rise`
//! probes, removed ones get no new requests, kept ones keep their health), SRV ports, weights
//! and priorities, failures (REFUSED, an unreachable server) that keep the last membership
//! with an event and a recovery event, and a large drop held until the next answer confirms it.

use std::net::SocketAddr;
use std::time::Duration;

use capataz::events::MembershipChange;
use capataz::health::{Notice, PoolRt};
use capataz::server::Balancer;
use capataz::sim::SimBackend;
use capataz_health::State;
use tokio::sync::broadcast;

use crate::support::balancer::start;
use crate::support::client::Client;
use crate::support::events::{is_transition, wait_for};
use crate::support::knot::Knot;

/// The config of one listener and pool `web` following `source` (the inside of
/// `[pools.web.source]`), with `checks` (the inside of `[pools.web.active]`).
pub(crate) fn text(source: &str, checks: &str) -> String {
    format!(
        "[[listeners]]\naddress = \"127.0.0.1:0\"\n\n[pools.web.source]\nkind = \"dns\"\n\
         ttl_min = \"1s\"\ntimeout = \"500ms\"\n{source}\n[pools.web.active]\n{checks}\n"
    )
}

/// A balancer started from [`text`].
pub(crate) async fn balancer(
    source: &str,
    checks: &str,
) -> (Balancer, broadcast::Receiver<Notice>) {
    start(&text(source, checks)).await
}

pub(crate) fn membership(event: &Notice) -> Option<&MembershipChange> {
    match event {
        Notice::Membership { change, .. } => Some(change),
        _ => None,
    }
}

pub(crate) fn names(pool: &PoolRt) -> Vec<String> {
    pool.backends.iter().map(|b| b.name.to_string()).collect()
}

pub(crate) async fn wait_updated(
    rx: &mut broadcast::Receiver<Notice>,
    total: usize,
) -> MembershipChange {
    let event = wait_for(rx, &format!("a membership update to {total}"), |e| {
        matches!(membership(e), Some(MembershipChange::Updated { total: t, .. }) if *t == total)
    })
    .await;
    membership(&event).cloned().expect("a membership event")
}

/// Sim backends on 127.0.0.1, 127.0.0.2, ... all on one port (loopback is 127/8).
pub(crate) async fn same_port_backends(n: u8) -> (Vec<SimBackend>, u16) {
    let first = SimBackend::start("b1", ([127, 0, 0, 1], 0).into())
        .await
        .expect("backend");
    let port = first.addr().port();
    let mut all = vec![first];
    for i in 2..=n {
        let addr = SocketAddr::from(([127, 0, 0, i], port));
        all.push(
            SimBackend::start(&format!("b{i}"), addr)
                .await
                .expect("backend on the same port"),
        );
    }
    (all, port)
}

pub(crate) const CHECKS: &str = "interval = \"30ms\"\ntimeout = \"200ms\"\nrise = 2\nfall = 3\n";

#[tokio::test]
async fn dns_a_records_are_followed_added_backends_gated_removed_ones_drained() {
    let (sims, port) = same_port_backends(3).await;
    let mut knot = Knot::start("a", "web 1 IN A 127.0.0.1\nweb 1 IN A 127.0.0.2");
    let (balancer, mut rx) = balancer(
        &format!(
            "name = \"web.test.\"\nport = {port}\nresolver = \"{}\"\n",
            knot.addr()
        ),
        CHECKS,
    )
    .await;
    let a = format!("127.0.0.1:{port}");
    let b = format!("127.0.0.2:{port}");
    let c = format!("127.0.0.3:{port}");
    assert_eq!(
        wait_updated(&mut rx, 2).await,
        MembershipChange::Updated {
            added: 2,
            removed: 0,
            total: 2
        }
    );
    let pool = balancer.pool("web").expect("pool web");
    assert_eq!(names(&pool), vec![a.clone(), b.clone()]);
    // Both start DOWN (gated): each has a transition to UP after its rise probes.
    let mut up = std::collections::HashSet::new();
    while up.len() < 2 {
        let event = wait_for(&mut rx, "both backends UP after rise probes", |e| {
            is_transition(e, &a, State::Up) || is_transition(e, &b, State::Up)
        })
        .await;
        up.insert(event.backend().map(str::to_owned));
    }
    let mut client = Client::new(balancer.local_addrs()[0]);
    for _ in 0..6 {
        assert_eq!(client.get("/").await.status, 200);
    }
    // One record replaced (TTL 2 now): .3 comes in gated, .2 goes out.
    knot.set_records("web 2 IN A 127.0.0.1\nweb 2 IN A 127.0.0.3");
    assert_eq!(
        wait_updated(&mut rx, 2).await,
        MembershipChange::Updated {
            added: 1,
            removed: 1,
            total: 2
        }
    );
    let pool = balancer.pool("web").expect("pool web");
    assert_eq!(names(&pool), vec![a.clone(), c.clone()]);
    // The kept backend kept its verdict; the added one waits for its rise probes (its
    // transition to UP below).
    assert_eq!(pool.views()[0].standing.health.active.state, State::Up);
    let removed_hits = sims[1].traffic_hits();
    wait_for(&mut rx, "the added backend UP after rise probes", |e| {
        is_transition(e, &c, State::Up)
    })
    .await;
    for _ in 0..10 {
        assert_eq!(client.get("/").await.status, 200);
    }
    assert!(
        sims[2].traffic_hits() > 0,
        "the added backend got no request"
    );
    assert_eq!(
        sims[1].traffic_hits(),
        removed_hits,
        "the removed backend still got requests"
    );
    balancer.shutdown(Duration::from_secs(5)).await;
}

#[tokio::test]
async fn dns_srv_records_bring_their_ports_weights_and_priorities() {
    let sims = crate::support::balancer::backends(&["a", "b", "c"]).await;
    let port = |i: usize| sims[i].addr().port();
    let knot = Knot::start(
        "srv",
        &format!(
            "_http._tcp.web 1 IN SRV 0 10 {} a\n_http._tcp.web 1 IN SRV 0 30 {} b\n\
             _http._tcp.web 1 IN SRV 5 0 {} c\na 1 IN A 127.0.0.1\nb 1 IN A 127.0.0.1\n\
             c 1 IN A 127.0.0.1",
            port(0),
            port(1),
            port(2)
        ),
    );
    let (balancer, mut rx) = balancer(
        &format!(
            "name = \"_http._tcp.web.test.\"\nrecord = \"srv\"\nresolver = \"{}\"\n",
            knot.addr()
        ),
        "kind = \"none\"",
    )
    .await;
    wait_updated(&mut rx, 3).await;
    let pool = balancer.pool("web").expect("pool web");
    let got: Vec<(String, String, u32, bool)> = pool
        .config
        .backends
        .iter()
        .map(|b| (b.name.clone(), b.address.clone(), b.weight, b.backup))
        .collect();
    let want = |host: &str, i: usize, weight: u32, backup: bool| {
        (
            format!("{host}.test:{}", port(i)),
            format!("127.0.0.1:{}", port(i)),
            weight,
            backup,
        )
    };
    assert_eq!(
        got,
        vec![
            want("a", 0, 10, false),
            want("b", 1, 30, false),
            // Priority 5 stands by; SRV weight 0 is the smallest weight capataz has.
            want("c", 2, 1, true),
        ]
    );
    // Traffic follows the weights over the primaries; the backup gets none.
    let mut client = Client::new(balancer.local_addrs()[0]);
    for _ in 0..40 {
        assert_eq!(client.get("/").await.status, 200);
    }
    assert_eq!(sims[0].traffic_hits(), 10);
    assert_eq!(sims[1].traffic_hits(), 30);
    assert_eq!(sims[2].traffic_hits(), 0);
    balancer.shutdown(Duration::from_secs(5)).await;
}

/// Something done to the DNS server: a failure, or its end.
type KnotStep = fn(&mut Knot);

#[tokio::test]
async fn dns_failures_keep_the_membership_and_a_large_drop_waits_for_confirmation() {
    let four =
        "web 1 IN A 127.0.0.1\nweb 1 IN A 127.0.0.2\nweb 1 IN A 127.0.0.3\nweb 1 IN A 127.0.0.4";
    let mut knot = Knot::start("fail", four);
    let (balancer, mut rx) = balancer(
        &format!(
            "name = \"web.test.\"\nport = 9\nresolver = \"{}\"\n",
            knot.addr()
        ),
        "kind = \"none\"",
    )
    .await;
    wait_updated(&mut rx, 4).await;
    let count = || balancer.pool("web").expect("pool web").backends.len();

    // /status and explain say where each backend came from and when it joined; the metrics
    // show how old the membership is.
    let page = capataz::status::page(&balancer.pools(), "now", None, &[]).expect("status page");
    let page: serde_json::Value = serde_json::from_slice(&page).expect("status JSON");
    let pool = &page["pools"][0];
    assert_eq!(pool["source"]["kind"], "dns");
    assert_eq!(pool["source"]["name"], "web.test.");
    assert!(pool["source"]["age_seconds"].as_f64().is_some(), "{pool}");
    assert!(pool["source"]["failing"].is_null());
    let backend = &pool["backends"][0];
    assert_eq!(backend["source"], "dns");
    assert!(
        backend["joined"].as_str().is_some_and(|t| t.ends_with('Z')),
        "{backend}"
    );
    assert!(
        backend["explain"]
            .as_str()
            .is_some_and(|e| e.contains("from dns web.test. A/AAAA, joined ")),
        "{backend}"
    );
    let metrics = balancer
        .supervisor()
        .metrics()
        .render(&balancer.pools(), None, capataz::metrics::Format::Classic)
        .expect("metrics");
    assert!(
        metrics
            .lines()
            .any(|l| l.starts_with("capataz_pool_membership_age_seconds{pool=\"web\"}")),
        "{metrics}"
    );
    let is =
        |want: fn(&MembershipChange) -> bool| move |e: &Notice| membership(e).is_some_and(want);

    // The zone no longer served (REFUSED), then the server gone (queries time out): each a
    // failure that keeps the four backends, said in /status, until the answers come back.
    let failures: [(&str, KnotStep, KnotStep); 2] = [
        (
            "REFUSED",
            |knot| knot.serve_zone(false),
            |knot| knot.serve_zone(true),
        ),
        ("knotd killed", Knot::kill, Knot::restart),
    ];
    for (failure, fail, recover) in failures {
        fail(&mut knot);
        let event = wait_for(
            &mut rx,
            &format!("a failing event ({failure})"),
            is(|c| matches!(c, MembershipChange::Failing { .. })),
        )
        .await;
        assert!(
            matches!(
                membership(&event),
                Some(MembershipChange::Failing { kept: 4, .. })
            ),
            "{failure}: {event:?}"
        );
        assert_eq!(count(), 4, "{failure}: a failing source emptied the pool");
        let state = || balancer.pool("web").expect("pool").source_record.state();
        assert!(state().failing.is_some(), "{failure}");
        recover(&mut knot);
        wait_for(
            &mut rx,
            &format!("a restored event ({failure})"),
            is(|c| matches!(c, MembershipChange::Restored { kept: 4 })),
        )
        .await;
        assert!(state().failing.is_none(), "{failure}");
    }

    // Four to one is more than half the pool at once: held, then confirmed by the next answer.
    knot.set_records("web 1 IN A 127.0.0.1");
    wait_for(
        &mut rx,
        "the drop held",
        is(|c| *c == MembershipChange::DropHeld { from: 4, to: 1 }),
    )
    .await;
    assert_eq!(count(), 4, "a held drop was applied");
    assert_eq!(
        balancer
            .pool("web")
            .expect("pool")
            .source_record
            .state()
            .held,
        Some((4, 1))
    );
    wait_for(
        &mut rx,
        "the drop confirmed",
        is(|c| *c == MembershipChange::DropConfirmed { from: 4, to: 1 }),
    )
    .await;
    wait_updated(&mut rx, 1).await;
    assert_eq!(count(), 1);

    // The name left without an A record (NODATA, not NXDOMAIN) is a drop to zero: held,
    // then confirmed.
    knot.set_records("web 1 IN TXT \"no address\"");
    wait_for(
        &mut rx,
        "the drop to zero held",
        is(|c| *c == MembershipChange::DropHeld { from: 1, to: 0 }),
    )
    .await;
    assert_eq!(count(), 1);
    wait_updated(&mut rx, 0).await;
    assert_eq!(count(), 0);
    balancer.shutdown(Duration::from_secs(5)).await;
}

#[tokio::test]
async fn a_reload_keeps_a_dns_pools_membership_and_health() {
    let (_sims, port) = same_port_backends(2).await;
    let knot = Knot::start("reload", "web 1 IN A 127.0.0.1\nweb 1 IN A 127.0.0.2");
    let text = format!(
        "[[listeners]]\naddress = \"127.0.0.1:0\"\n\n[pools.web.source]\nkind = \"dns\"\n\
         ttl_min = \"1s\"\nname = \"web.test.\"\nport = {port}\nresolver = \"{}\"\n\
         [pools.web.active]\n{CHECKS}\n",
        knot.addr()
    );
    let (balancer, mut rx) = start(&text).await;
    wait_updated(&mut rx, 2).await;
    let mut up = std::collections::HashSet::new();
    while up.len() < 2 {
        let event = wait_for(
            &mut rx,
            "both backends UP",
            |e| matches!(e, Notice::Transition { transition, .. } if transition.to == State::Up),
        )
        .await;
        up.insert(event.backend().map(str::to_owned));
    }
    let summary = balancer
        .reload(&crate::support::balancer::parse(&text))
        .await
        .expect("reload");
    assert_eq!((summary.kept, summary.added, summary.removed), (2, 0, 0));
    let pool = balancer.pool("web").expect("pool web");
    assert_eq!(pool.backends.len(), 2);
    assert!(pool
        .views()
        .iter()
        .all(|v| v.standing.health.active.state == State::Up));
    balancer.shutdown(Duration::from_secs(5)).await;
}

/// BENCHMARKS.md, "DNS: from a record change to traffic": a record is added to the zone and
/// the time until the new backend gets its first request is measured, while a client sends
/// requests without pause. Run with
/// `cargo test --release -p capataz --test it dns_record_change_to_traffic -- --ignored --nocapture`.
#[tokio::test]
#[ignore = "a benchmark: run it by name with --ignored --nocapture"]
async fn dns_record_change_to_traffic() {
    const ROUNDS: u8 = 7;
    let (sims, port) = same_port_backends(ROUNDS + 1).await;
    let mut records = String::from("web 1 IN A 127.0.0.1");
    let mut knot = Knot::start("bench", &records);
    let (balancer, mut rx) = balancer(
        &format!(
            "name = \"web.test.\"\nport = {port}\nresolver = \"{}\"\n",
            knot.addr()
        ),
        "interval = \"100ms\"\ntimeout = \"200ms\"\njitter = \"0%\"\nrise = 2\nfall = 3\n",
    )
    .await;
    wait_updated(&mut rx, 1).await;
    let listener = balancer.local_addrs()[0];
    let load = tokio::spawn(async move {
        let mut client = Client::new(listener);
        loop {
            client.get("/").await;
        }
    });
    let mut times = Vec::new();
    for round in 1..=ROUNDS {
        let ip = round + 1;
        records.push_str(&format!("\nweb 1 IN A 127.0.0.{ip}"));
        let changed = tokio::time::Instant::now();
        knot.set_records(&records);
        let sim = &sims[usize::from(round)];
        let end = changed + Duration::from_secs(20);
        // Wall time is what this benchmark measures: looked at every millisecond.
        while sim.traffic_hits() == 0 {
            assert!(tokio::time::Instant::now() < end, "no traffic within 20 s");
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
        times.push(changed.elapsed());
    }
    load.abort();
    let mut sorted = times.clone();
    sorted.sort();
    println!(
        "record change -> first request, ttl 1 s (ttl_min 1s), interval 100 ms, rise 2: \
         median {:?}, min {:?}, max {:?} over {ROUNDS} changes: {times:?}",
        sorted[sorted.len() / 2],
        sorted[0],
        sorted[sorted.len() - 1]
    );
    balancer.shutdown(Duration::from_secs(5)).await;
}
