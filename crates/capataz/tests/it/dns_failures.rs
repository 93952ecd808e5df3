//! "A DNS failure empties the pool": a `dns` pool against a hostile server
//! (`support/hostile_dns.rs`) that lets A queries time out, answers them with bytes no
//! resolver can read, or answers only in part, while AAAA answers NODATA. Each is a failure:
//! the membership stays (a `failing` event, then `restored`), never an empty answer that
//! drops the pool. Before the fix, hickory's merged A/AAAA lookup took the AAAA half's
//! NODATA for the whole answer: `drop_held`, `drop_confirmed`, 0 backends, every request 503.

use std::net::{IpAddr, SocketAddr};
use std::time::Duration;

use capataz::events::MembershipChange;
use capataz::health::Notice;
use capataz::sim::SimBackend;
use tokio::sync::broadcast;

use crate::dns_source::{balancer, membership, same_port_backends};
use crate::support::cases;
use crate::support::client::Client;
use crate::support::events::wait_for;
use crate::support::hostile_dns::{HostileDns, Reply, Type};
use crate::support::wait::wait_until;

const NAME: &str = "web.test.";

/// The first membership event that says what the source made of the bad answer.
async fn first_verdict(rx: &mut broadcast::Receiver<Notice>) -> MembershipChange {
    let event = wait_for(rx, "a membership event after the bad answer", |e| {
        membership(e).is_some_and(|c| {
            matches!(
                c,
                MembershipChange::Failing { .. }
                    | MembershipChange::DropHeld { .. }
                    | MembershipChange::Updated { .. }
            )
        })
    })
    .await;
    membership(&event).cloned().expect("a membership event")
}

/// The pool follows `web.test.` on `dns`, whose A records are 127.0.0.1 and 127.0.0.2 and
/// AAAA `aaaa`; then `kind` is answered with `bad`. The source must fail (keeping every
/// backend, serving requests) through the queries that follow, and recover once the answers
/// are good again.
async fn a_bad_answer_keeps_the_membership(aaaa: Reply, kind: Type, bad: Reply) {
    let (_sims, port) = same_port_backends(2).await;
    // An IPv6 backend on the same port when AAAA has records.
    let _v6 = match &aaaa {
        Reply::Addresses(_) => Some(
            SimBackend::start("v6", SocketAddr::from(([0u16, 0, 0, 0, 0, 0, 0, 1], port)))
                .await
                .expect("a backend on [::1]"),
        ),
        _ => None,
    };
    let dns = HostileDns::start().await;
    let v4 = Reply::Addresses(vec![
        IpAddr::from([127, 0, 0, 1]),
        IpAddr::from([127, 0, 0, 2]),
    ]);
    dns.set(NAME, Type::A, v4.clone());
    dns.set(NAME, Type::Aaaa, aaaa.clone());
    let total = 2 + usize::from(matches!(aaaa, Reply::Addresses(_)));
    let (balancer, mut rx) = balancer(
        &format!(
            "name = \"{NAME}\"\nport = {port}\nresolver = \"{}\"\n",
            dns.addr()
        ),
        "kind = \"none\"",
    )
    .await;
    crate::dns_source::wait_updated(&mut rx, total).await;
    let count = || balancer.pool("web").expect("pool web").backends.len();

    dns.set(NAME, kind, bad);
    let verdict = first_verdict(&mut rx).await;
    let MembershipChange::Failing { error, kept } = verdict else {
        panic!("the bad answer was taken for an answer: {verdict:?}");
    };
    assert_eq!(kept, total);
    let asked_type = match kind {
        Type::A => "A: ",
        Type::Aaaa => "AAAA: ",
        Type::Srv => "SRV",
    };
    assert!(error.starts_with(asked_type), "{error}");
    assert_eq!(count(), total);
    let failing = balancer
        .pool("web")
        .expect("pool")
        .source_record
        .state()
        .failing;
    assert_eq!(
        failing,
        Some(error),
        "/status says another failure than the event"
    );
    // More lookups: each a failure, said once; nothing drops or changes the pool. A lookup
    // asks up to four times (a query that fails is sent once more, a truncated answer is asked
    // again over TCP), so the fifth query starts a lookup after at least one was judged.
    let asked = dns.asked(NAME, kind);
    wait_until("more lookups", || dns.asked(NAME, kind) >= asked + 5).await;
    while let Ok(event) = rx.try_recv() {
        assert!(
            !membership(&event).is_some_and(|c| !matches!(c, MembershipChange::Failing { .. })),
            "the membership moved on a failed lookup: {event:?}"
        );
    }
    assert_eq!(count(), total, "a failed lookup changed the pool");
    let mut client = Client::new(balancer.local_addrs()[0]);
    for _ in 0..4 {
        assert_eq!(client.get("/").await.status, 200);
    }

    dns.set(NAME, Type::A, v4);
    dns.set(NAME, Type::Aaaa, aaaa);
    wait_for(&mut rx, "the restored event", |e| {
        membership(e).is_some_and(|c| matches!(c, MembershipChange::Restored { .. }))
    })
    .await;
    assert_eq!(count(), total);
    balancer.shutdown(Duration::from_secs(5)).await;
}

#[tokio::test]
async fn a_bad_answer_is_a_failure_that_keeps_the_membership() {
    let first = vec![IpAddr::from([127, 0, 0, 1])];
    let v6 = vec![IpAddr::from([0u16, 0, 0, 0, 0, 0, 0, 1])];
    // (AAAA's answer, the query type answered badly, the bad answer.)
    let cases = [
        (
            "a timeout on A beside NODATA on AAAA",
            (Reply::NoData, Type::A, Reply::Silent),
        ),
        (
            "an A answer whose compression pointer points at itself",
            (Reply::NoData, Type::A, Reply::SelfPointer),
        ),
        (
            "an A answer counting 65535 records with one",
            (Reply::NoData, Type::A, Reply::CountLie),
        ),
        (
            // Partial: the UDP answer is truncated to its first record and the TCP retry is
            // closed.
            "a truncated A answer whose TCP retry fails",
            (Reply::NoData, Type::A, Reply::Truncated(first)),
        ),
        (
            // Partial: A answers, AAAA (which had a record) times out; the IPv6 backend stays.
            "an A answer beside a timeout on AAAA keeps the IPv6 backend",
            (Reply::Addresses(v6), Type::Aaaa, Reply::Silent),
        ),
    ];
    cases::concurrently(cases, |(aaaa, kind, bad)| {
        a_bad_answer_keeps_the_membership(aaaa, kind, bad)
    })
    .await;
}
