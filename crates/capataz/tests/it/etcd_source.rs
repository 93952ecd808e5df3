//! The `etcd` backend source against a real etcd (Debian's etcd-server on loopback, see
//! `support/etcd.rs`): puts and deletes reach traffic (added backends gated until `rise`
//! probes, removed ones get no new requests), a bad value is skipped with an event naming its
//! key, etcd killed and restarted keeps the membership (events for the failure and the
//! recovery) and the watch resumes without missing a change made meanwhile, a compaction past
//! the watch's revision is read again without missing anything, a hung etcd (stopped, its
//! connections open) is found by the keepalive check, a backend whose lease expires leaves the
//! pool, a large drop waits for confirmation, and a hostile gateway (an endless line, answers
//! that are not JSON) is a failure that keeps the membership.

use std::time::Duration;

use capataz::events::MembershipChange;
use capataz::health::{Notice, PoolRt};
use capataz::server::Balancer;
use capataz::sim::SimBackend;
use capataz_health::State;
use tokio::sync::broadcast;

use crate::support::balancer::{backends, start};
use crate::support::cases;
use crate::support::client::Client;
use crate::support::etcd::Etcd;
use crate::support::events::{is_transition, wait_for};

const CHECKS: &str = "interval = \"30ms\"\ntimeout = \"200ms\"\nrise = 2\nfall = 3\n";

/// A balancer with one listener and pool `web` following prefix `/web/` of `etcd`, with
/// `checks` (the inside of `[pools.web.active]`).
async fn balancer(etcd: &Etcd, checks: &str) -> (Balancer, broadcast::Receiver<Notice>) {
    start(&format!(
        "[[listeners]]\naddress = \"127.0.0.1:0\"\n\n[pools.web.source]\nkind = \"etcd\"\n\
         endpoints = [\"{}\"]\nprefix = \"/web/\"\ntimeout = \"1s\"\nreconnect_min = \"100ms\"\n\
         reconnect_max = \"300ms\"\nkeepalive = \"1s\"\nconfirm_after = \"500ms\"\n\
         [pools.web.active]\n{checks}\n",
        etcd.endpoint()
    ))
    .await
}

pub(crate) fn value(sim: &SimBackend) -> String {
    format!(r#"{{"address": "{}", "weight": 1}}"#, sim.addr())
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

pub(crate) async fn wait_change(
    rx: &mut broadcast::Receiver<Notice>,
    what: &str,
    want: impl Fn(&MembershipChange) -> bool,
) -> MembershipChange {
    let event = wait_for(rx, what, |e| membership(e).is_some_and(&want)).await;
    membership(&event).cloned().expect("a membership event")
}

pub(crate) async fn wait_total(
    rx: &mut broadcast::Receiver<Notice>,
    total: usize,
) -> MembershipChange {
    wait_change(
        rx,
        &format!("a membership update to {total}"),
        |c| matches!(c, MembershipChange::Updated { total: t, .. } if *t == total),
    )
    .await
}

#[tokio::test]
async fn etcd_puts_and_deletes_reach_traffic_added_gated_removed_drained() {
    let sims = backends(&["a", "b", "c"]).await;
    let etcd = Etcd::start("traffic").await;
    etcd.put("/web/a", &value(&sims[0])).await;
    etcd.put("/web/b", &value(&sims[1])).await;
    let (balancer, mut rx) = balancer(&etcd, CHECKS).await;
    assert_eq!(
        wait_total(&mut rx, 2).await,
        MembershipChange::Updated {
            added: 2,
            removed: 0,
            total: 2
        }
    );
    let pool = balancer.pool("web").expect("pool web");
    assert_eq!(names(&pool), vec!["a", "b"]);
    // Both start DOWN (gated), in whichever order their rise probes pass.
    let mut up = std::collections::HashSet::new();
    while up.len() < 2 {
        let event = wait_for(&mut rx, "both backends UP after rise probes", |e| {
            is_transition(e, "a", State::Up) || is_transition(e, "b", State::Up)
        })
        .await;
        up.insert(event.backend().map(str::to_owned));
    }
    let mut client = Client::new(balancer.local_addrs()[0]);
    for _ in 0..6 {
        assert_eq!(client.get("/").await.status, 200);
    }

    // c comes in (gated until its rise probes), then b goes out.
    etcd.put("/web/c", &value(&sims[2])).await;
    assert_eq!(
        wait_total(&mut rx, 3).await,
        MembershipChange::Updated {
            added: 1,
            removed: 0,
            total: 3
        }
    );
    let pool = balancer.pool("web").expect("pool web");
    assert_ne!(
        pool.views()[2].standing.health.active.state,
        State::Up,
        "c not gated"
    );
    assert_eq!(
        pool.views()[0].standing.health.active.state,
        State::Up,
        "a lost its health"
    );
    wait_for(&mut rx, "c UP after rise probes", |e| {
        is_transition(e, "c", State::Up)
    })
    .await;
    etcd.delete("/web/b").await;
    assert_eq!(
        wait_total(&mut rx, 2).await,
        MembershipChange::Updated {
            added: 0,
            removed: 1,
            total: 2
        }
    );
    assert_eq!(names(&balancer.pool("web").expect("pool")), vec!["a", "c"]);
    let b_hits = sims[1].traffic_hits();
    for _ in 0..10 {
        assert_eq!(client.get("/").await.status, 200);
    }
    assert!(
        sims[2].traffic_hits() > 0,
        "the added backend got no request"
    );
    assert_eq!(
        sims[1].traffic_hits(),
        b_hits,
        "the removed backend still got requests"
    );

    // /status, explain and the metrics say where the backends come from and how old the
    // membership is.
    let page = capataz::status::page(&balancer.pools(), "now", None, &[]).expect("status page");
    let page: serde_json::Value = serde_json::from_slice(&page).expect("status JSON");
    let source = &page["pools"][0]["source"];
    assert_eq!(source["kind"], "etcd", "{source}");
    assert_eq!(source["prefix"], "/web/");
    assert_eq!(source["endpoints"][0], etcd.endpoint().as_str());
    assert!(source["age_seconds"].as_f64().is_some(), "{source}");
    let backend = &page["pools"][0]["backends"][0];
    assert_eq!(backend["source"], "etcd");
    assert!(
        backend["explain"]
            .as_str()
            .is_some_and(|e| e.contains("from etcd /web/, joined ")),
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
    balancer.shutdown(Duration::from_secs(5)).await;
}

#[tokio::test]
async fn etcd_a_bad_value_is_skipped_with_an_event_naming_its_key() {
    let sims = backends(&["a", "b"]).await;
    let etcd = Etcd::start("bad").await;
    etcd.put("/web/a", &value(&sims[0])).await;
    let (balancer, mut rx) = balancer(&etcd, "kind = \"none\"").await;
    wait_total(&mut rx, 1).await;
    etcd.put("/web/broken", "{\"address\": ").await;
    let skipped = wait_change(&mut rx, "the bad value skipped", |c| {
        matches!(c, MembershipChange::Skipped { .. })
    })
    .await;
    let MembershipChange::Skipped { key, error } = skipped else {
        unreachable!("matched above")
    };
    assert_eq!(key, "/web/broken");
    assert!(error.contains("not JSON"), "{error}");
    // The other keys still count: a good one after it comes in, the pool was never emptied.
    etcd.put("/web/b", &value(&sims[1])).await;
    wait_total(&mut rx, 2).await;
    assert_eq!(names(&balancer.pool("web").expect("pool")), vec!["a", "b"]);
    // A bad value over a good key takes that backend out (it counts as absent).
    etcd.put("/web/b", r#"{"address": "not-an-ip:80"}"#).await;
    wait_change(
        &mut rx,
        "the bad value over b skipped",
        |c| matches!(c, MembershipChange::Skipped { key, .. } if key == "/web/b"),
    )
    .await;
    wait_total(&mut rx, 1).await;
    assert_eq!(names(&balancer.pool("web").expect("pool")), vec!["a"]);
    balancer.shutdown(Duration::from_secs(5)).await;
}

#[tokio::test]
async fn etcd_killed_and_restarted_keeps_the_membership_and_resumes_without_missing_a_change() {
    let sims = backends(&["a", "b", "c"]).await;
    let mut etcd = Etcd::start("restart").await;
    etcd.put("/web/a", &value(&sims[0])).await;
    etcd.put("/web/b", &value(&sims[1])).await;
    let (balancer, mut rx) = balancer(&etcd, "kind = \"none\"").await;
    wait_total(&mut rx, 2).await;
    let count = || balancer.pool("web").expect("pool web").backends.len();

    // Killed: the source fails, the membership stays, traffic goes on.
    etcd.kill();
    let failing = wait_change(&mut rx, "a failing event", |c| {
        matches!(c, MembershipChange::Failing { .. })
    })
    .await;
    assert!(
        matches!(&failing, MembershipChange::Failing { kept: 2, error } if error.starts_with(&etcd.endpoint())),
        "{failing:?}"
    );
    assert_eq!(count(), 2, "a failing source emptied the pool");
    let mut client = Client::new(balancer.local_addrs()[0]);
    for _ in 0..4 {
        assert_eq!(client.get("/").await.status, 200);
    }
    // Back where capataz cannot reach it: a change capataz has not seen.
    etcd.hide().await;
    etcd.put("/web/c", &value(&sims[2])).await;
    assert_eq!(count(), 2);
    assert!(balancer
        .pool("web")
        .expect("pool")
        .source_record
        .state()
        .failing
        .is_some());
    // Reachable again: the recovery, then the change made meanwhile.
    etcd.restart().await;
    wait_change(&mut rx, "a restored event", |c| {
        matches!(c, MembershipChange::Restored { kept: 2 })
    })
    .await;
    assert_eq!(
        wait_total(&mut rx, 3).await,
        MembershipChange::Updated {
            added: 1,
            removed: 0,
            total: 3
        }
    );
    assert_eq!(
        names(&balancer.pool("web").expect("pool")),
        vec!["a", "b", "c"]
    );
    // The watch runs again: a change now arrives too.
    etcd.delete("/web/a").await;
    wait_total(&mut rx, 2).await;
    balancer.shutdown(Duration::from_secs(5)).await;
}

#[tokio::test]
async fn etcd_compaction_past_the_watch_revision_is_read_again_and_nothing_is_missed() {
    let sims = backends(&["a", "b", "c"]).await;
    let mut etcd = Etcd::start("compact").await;
    etcd.put("/web/a", &value(&sims[0])).await;
    etcd.put("/web/b", &value(&sims[1])).await;
    let (balancer, mut rx) = balancer(&etcd, "kind = \"none\"").await;
    wait_total(&mut rx, 2).await;
    etcd.hide().await;
    wait_change(&mut rx, "a failing event", |c| {
        matches!(c, MembershipChange::Failing { .. })
    })
    .await;
    // While capataz is away: one backend replaced, others' keys written over and over, and
    // the history compacted away (the watch's revision is gone).
    etcd.put("/web/c", &value(&sims[2])).await;
    etcd.delete("/web/b").await;
    for _ in 0..3 {
        etcd.put("/web/other", "not a backend").await;
        etcd.delete("/web/other").await;
    }
    etcd.compact().await;
    etcd.restart().await;
    assert_eq!(
        wait_total(&mut rx, 2).await,
        MembershipChange::Updated {
            added: 1,
            removed: 1,
            total: 2
        }
    );
    assert_eq!(names(&balancer.pool("web").expect("pool")), vec!["a", "c"]);
    // And it watches from the new read.
    etcd.put("/web/b", &value(&sims[1])).await;
    wait_total(&mut rx, 3).await;
    balancer.shutdown(Duration::from_secs(5)).await;
}

#[tokio::test]
async fn etcd_a_large_drop_is_held_until_a_second_read_confirms_it() {
    let sims = backends(&["a", "b1", "b2", "b3"]).await;
    let etcd = Etcd::start("drop").await;
    for (i, name) in ["a", "b1", "b2", "b3"].into_iter().enumerate() {
        etcd.put(&format!("/web/{name}"), &value(&sims[i])).await;
    }
    let (balancer, mut rx) = balancer(&etcd, "kind = \"none\"").await;
    wait_total(&mut rx, 4).await;
    let count = || balancer.pool("web").expect("pool web").backends.len();
    // Three of four at once (one revision): held.
    etcd.delete_prefix("/web/b").await;
    wait_change(&mut rx, "the drop held", |c| {
        *c == MembershipChange::DropHeld { from: 4, to: 1 }
    })
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
    // The second read (confirm_after later) still says so: applied.
    wait_change(&mut rx, "the drop confirmed", |c| {
        *c == MembershipChange::DropConfirmed { from: 4, to: 1 }
    })
    .await;
    wait_total(&mut rx, 1).await;
    assert_eq!(names(&balancer.pool("web").expect("pool")), vec!["a"]);
    assert_eq!(
        balancer
            .pool("web")
            .expect("pool")
            .source_record
            .state()
            .held,
        None
    );
    balancer.shutdown(Duration::from_secs(5)).await;
}

#[tokio::test]
async fn etcd_a_hung_etcd_is_found_by_the_keepalive_check_and_the_membership_stays() {
    let sims = backends(&["a"]).await;
    let etcd = Etcd::start("hung").await;
    etcd.put("/web/a", &value(&sims[0])).await;
    let (balancer, mut rx) = balancer(&etcd, "kind = \"none\"").await;
    wait_total(&mut rx, 1).await;
    // Stopped: the watch's connection stays open and silent; the check (keepalive 1 s,
    // timeout 1 s) times out.
    etcd.pause(true);
    let failing = wait_change(&mut rx, "a failing event", |c| {
        matches!(c, MembershipChange::Failing { .. })
    })
    .await;
    assert!(
        matches!(failing, MembershipChange::Failing { kept: 1, .. }),
        "{failing:?}"
    );
    assert_eq!(names(&balancer.pool("web").expect("pool")), vec!["a"]);
    etcd.pause(false);
    wait_change(&mut rx, "a restored event", |c| {
        matches!(c, MembershipChange::Restored { kept: 1 })
    })
    .await;
    balancer.shutdown(Duration::from_secs(5)).await;
}

#[tokio::test]
async fn etcd_a_backend_whose_lease_expires_leaves_the_pool() {
    let sims = backends(&["a", "b"]).await;
    let etcd = Etcd::start("lease").await;
    etcd.put("/web/a", &value(&sims[0])).await;
    let (balancer, mut rx) = balancer(&etcd, "kind = \"none\"").await;
    wait_total(&mut rx, 1).await;
    // b comes with a lease of 2 s once the balancer watches: it sees the put, whenever the
    // lease ends (granted before the balancer started, a slow start could miss b entirely).
    let lease = etcd.grant_lease(2).await;
    etcd.put_with_lease("/web/b", &value(&sims[1]), &lease)
        .await;
    assert_eq!(
        wait_total(&mut rx, 2).await,
        MembershipChange::Updated {
            added: 1,
            removed: 0,
            total: 2
        }
    );
    // Nobody keeps the lease alive: etcd deletes b when it expires.
    assert_eq!(
        wait_total(&mut rx, 1).await,
        MembershipChange::Updated {
            added: 0,
            removed: 1,
            total: 1
        }
    );
    assert_eq!(names(&balancer.pool("web").expect("pool")), vec!["a"]);
    balancer.shutdown(Duration::from_secs(5)).await;
}

/// A hand-written gateway: a range answer with one backend (`address`), then a watch that is
/// created and sends one line that never ends; or, with `garbage`, answers that are not JSON.
async fn hostile_gateway(address: std::net::SocketAddr, garbage: bool) -> std::net::SocketAddr {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let local = listener.local_addr().expect("address");
    let key = "L3dlYi9h"; // "/web/a"
    let value = encode(&format!(r#"{{"address":"{address}"}}"#));
    tokio::spawn(async move {
        loop {
            let Ok((mut socket, _)) = listener.accept().await else {
                return;
            };
            let value = value.clone();
            tokio::spawn(async move {
                let mut head = Vec::new();
                let mut byte = [0u8; 1];
                while !head.ends_with(b"\r\n\r\n") && head.len() < 65_536 {
                    if socket.read(&mut byte).await.unwrap_or(0) == 0 {
                        return;
                    }
                    head.push(byte[0]);
                }
                let head = String::from_utf8_lossy(&head).to_string();
                if garbage {
                    let _ = socket
                        .write_all(b"HTTP/1.1 200 OK\r\ncontent-length: 5\r\n\r\n<html")
                        .await;
                    return;
                }
                if head.starts_with("POST /v3/kv/range") {
                    let body = format!(
                        r#"{{"header":{{"revision":"5"}},"kvs":[{{"key":"{key}","value":"{value}","mod_revision":"5"}}],"count":"1"}}"#
                    );
                    let _ = socket
                        .write_all(
                            format!(
                                "HTTP/1.1 200 OK\r\ncontent-length: {}\r\n\r\n{body}",
                                body.len()
                            )
                            .as_bytes(),
                        )
                        .await;
                } else {
                    let created = "{\"result\":{\"created\":true}}\n";
                    let mut out = format!(
                        "HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n{:x}\r\n{created}\r\n",
                        created.len()
                    )
                    .into_bytes();
                    let chunk = vec![b'x'; 1 << 20];
                    if socket.write_all(&out).await.is_err() {
                        return;
                    }
                    out.clear();
                    out.extend_from_slice(format!("{:x}\r\n", chunk.len()).as_bytes());
                    out.extend_from_slice(&chunk);
                    out.extend_from_slice(b"\r\n");
                    // Without end, until capataz hangs up.
                    while socket.write_all(&out).await.is_ok() {}
                }
            });
        }
    });
    local
}

/// Base64 for the hand-written gateway.
fn encode(text: &str) -> String {
    const ALPHABET: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let bytes = text.as_bytes();
    let mut out = String::new();
    for chunk in bytes.chunks(3) {
        let b = [
            chunk[0],
            *chunk.get(1).unwrap_or(&0),
            *chunk.get(2).unwrap_or(&0),
        ];
        let n = (u32::from(b[0]) << 16) | (u32::from(b[1]) << 8) | u32::from(b[2]);
        for i in 0..4 {
            if i <= chunk.len() {
                out.push(char::from(ALPHABET[(n >> (18 - 6 * i)) as usize & 63]));
            } else {
                out.push('=');
            }
        }
    }
    out
}

/// A hostile gateway case: what the pool holds and the failure says.
struct Hostile {
    /// Answers that are not JSON instead of an endless watch line.
    garbage: bool,
    /// More `[pools.web.source]` lines.
    source: &'static str,
    /// The failure's error says this.
    error: &'static str,
    /// The backends kept (read before the failure).
    kept: &'static [&'static str],
}

#[tokio::test]
async fn etcd_a_hostile_gateway_is_a_failure_that_keeps_the_membership() {
    let cases = [
        (
            "an endless watch line: cut at the bound, a failure; the backend read before stays",
            Hostile {
                garbage: false,
                source: "reconnect_min = \"5s\"\nreconnect_max = \"5s\"\n",
                error: "longer than",
                kept: &["a"],
            },
        ),
        (
            "answers that are not JSON: a failure from the start, nothing in the pool, no panic",
            Hostile {
                garbage: true,
                source: "",
                error: "not JSON",
                kept: &[],
            },
        ),
    ];
    let sims = backends(&["a"]).await;
    cases::each(cases, |case| {
        let backend = sims[0].addr();
        async move {
            let gateway = hostile_gateway(backend, case.garbage).await;
            let (balancer, mut rx) = start(&format!(
                "[[listeners]]\naddress = \"127.0.0.1:0\"\n\n[pools.web.source]\nkind = \"etcd\"\n\
                 endpoints = [\"http://{gateway}\"]\nprefix = \"/web/\"\ntimeout = \"1s\"\n{}\
                 [pools.web.active]\nkind = \"none\"\n",
                case.source
            ))
            .await;
            if !case.kept.is_empty() {
                wait_total(&mut rx, case.kept.len()).await;
            }
            let failing = wait_change(&mut rx, "a failing event", |c| {
                matches!(c, MembershipChange::Failing { .. })
            })
            .await;
            let MembershipChange::Failing { error, kept } = failing else {
                unreachable!("matched above")
            };
            assert!(error.contains(case.error), "{error}");
            assert_eq!(kept, case.kept.len());
            assert_eq!(names(&balancer.pool("web").expect("pool")), case.kept);
            balancer.shutdown(Duration::from_secs(5)).await;
        }
    })
    .await;
}
