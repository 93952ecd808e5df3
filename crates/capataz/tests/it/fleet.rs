//! Shared probing with a real etcd and real `capataz run` processes: three
//! instances of one group share the probing of six static backends (`owners = 1`, so each
//! backend has exactly one prober), a dead backend is excluded by all (the others through the
//! owner's published verdict, said in the reason), an instance SIGKILLed has its backends
//! re-owned within one lease TTL without a transition, and an instance cut off from etcd
//! probes every backend itself and says so, then rejoins.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::time::{Duration, Instant};

use capataz::sim::SimBackend;
use serde_json::Value;

use crate::support::etcd::Etcd;
use crate::support::fleet::{get, Instance};
use crate::support::process::{gone, signal};
use crate::support::prometheus::promtool_check;
use crate::support::relay::Relay;
use crate::support::wait::block_until;
use crate::support::{any, runtime, DEADLINE};

/// The probe interval.
const INTERVAL: Duration = Duration::from_millis(100);

/// The fleet's lease.
const LEASE: Duration = Duration::from_secs(2);

/// Instance `name`'s config: pool `web` of `backends`, probed every [`INTERVAL`], in group
/// `group` through etcd at `endpoint`, one owner per backend.
fn config(name: &str, endpoint: &str, group: &str, backends: &[SimBackend]) -> String {
    let list: Vec<String> = backends
        .iter()
        .map(|b| format!(r#"{{ name = "{}", address = "{}" }}"#, b.name(), b.addr()))
        .collect();
    format!(
        r#"
[admin]
address = "127.0.0.1:0"

[[listeners]]
name = "front"
address = "127.0.0.1:0"

[pools.web]
backends = [{}]

[pools.web.active]
interval = "{}ms"
timeout = "500ms"
rise = 2
fall = 2

[fleet]
endpoints = ["{endpoint}"]
group = "{group}"
instance = "{name}"
owners = 1
lease_ttl = "{}s"
timeout = "500ms"
"#,
        list.join(", "),
        INTERVAL.as_millis(),
        LEASE.as_secs()
    )
}

fn fleet(instance: &Instance) -> Value {
    instance.json("/status")["fleet"].clone()
}

fn members(instance: &Instance) -> usize {
    fleet(instance)["members"].as_array().map_or(0, Vec::len)
}

fn all_up(instance: &Instance, names: &[&str]) -> bool {
    let serving = instance.serving("web");
    names.iter().all(|n| serving.get(*n) == Some(&true))
}

/// One metric's value on `instance`'s classic exposition.
fn metric(instance: &Instance, name: &str) -> f64 {
    let (_, body) = get(instance.admin, "/metrics").expect("GET /metrics");
    body.lines()
        .find_map(|line| line.strip_prefix(&format!("{name} ")))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or_else(|| panic!("{name} missing on {}:\n{body}", instance.name))
}

/// Which instances probe each backend over about 15 intervals (by `capataz_probes_total`).
fn probers(live: &[&Instance], backends: &[SimBackend]) -> BTreeMap<String, Vec<String>> {
    let before: Vec<_> = live.iter().map(|i| i.probes_sent("web")).collect();
    let hits: u64 = backends.iter().map(SimBackend::health_hits).sum();
    block_until("15 intervals of probes", || {
        backends.iter().map(SimBackend::health_hits).sum::<u64>()
            >= hits + 15 * backends.len() as u64
    });
    let after: Vec<_> = live.iter().map(|i| i.probes_sent("web")).collect();
    let mut out = BTreeMap::new();
    for backend in backends {
        let name = backend.name().to_owned();
        let by: Vec<String> = live
            .iter()
            .zip(before.iter().zip(&after))
            .filter(|(_, (b, a))| {
                a.get(&name).copied().unwrap_or(0) > b.get(&name).copied().unwrap_or(0)
            })
            .map(|(i, _)| i.name.clone())
            .collect();
        out.insert(name, by);
    }
    out
}

fn sims(rt: &tokio::runtime::Runtime, n: usize) -> Vec<SimBackend> {
    rt.block_on(async {
        let mut out = Vec::new();
        for i in 0..n {
            out.push(
                SimBackend::start(&format!("s{i}"), any())
                    .await
                    .expect("a backend"),
            );
        }
        out
    })
}

#[test]
fn three_instances_share_the_probing_and_all_exclude_a_dead_backend() {
    let rt = runtime();
    let backends = sims(&rt, 6);
    let names: Vec<&str> = backends.iter().map(SimBackend::name).collect();
    let etcd = rt.block_on(Etcd::start("fleet-share"));
    let fleet_of: Vec<Instance> = ["a", "b", "c"]
        .iter()
        .map(|n| Instance::start(n, &config(n, &etcd.endpoint(), "share", &backends)))
        .collect();
    let live: Vec<&Instance> = fleet_of.iter().collect();
    for instance in &live {
        block_until("three members", || members(instance) == 3);
        block_until("every backend UP", || all_up(instance, &names));
    }
    // Each backend is probed by exactly one instance: the owner /status names.
    let probed = probers(&live, &backends);
    let status = fleet(live[0]);
    assert_eq!(status["owners"], 1);
    assert_eq!(status["group"], "share");
    for entry in status["backends"].as_array().expect("backends") {
        let backend = entry["backend"].as_str().unwrap_or_default();
        let owners: Vec<String> = entry["owners"]
            .as_array()
            .expect("owners")
            .iter()
            .map(|o| o.as_str().unwrap_or_default().to_owned())
            .collect();
        assert_eq!(
            probed[backend], owners,
            "backend {backend}: probed by {probed:?}"
        );
    }
    let owned: f64 = live
        .iter()
        .map(|i| metric(i, "capataz_fleet_owned_backends"))
        .sum();
    assert_eq!(owned, 6.0);
    assert_eq!(metric(live[1], "capataz_fleet_members"), 3.0);
    assert_eq!(metric(live[1], "capataz_fleet_cut_off"), 0.0);
    // Every instance that owns a backend publishes its verdicts. Which instance owns what
    // follows from the backends' ephemeral ports, so an instance may own none (b owns none of
    // six in about 9 % of runs).
    for instance in &live {
        if metric(instance, "capataz_fleet_owned_backends") >= 1.0 {
            let published = metric(instance, "capataz_fleet_published_total");
            assert!(published >= 1.0, "{} published {published}", instance.name);
        }
    }
    let (_, page) = get(live[2].admin, "/metrics").expect("GET /metrics");
    let (code, findings) = promtool_check(&page);
    assert_eq!((code, findings.trim()), (0, ""), "promtool:\n{findings}");

    // A backend dies: its owner sees it, every other instance follows the published verdict.
    let dead = &backends[0];
    let owner = probed[dead.name()][0].clone();
    dead.crash();
    let crashed = Instant::now();
    for instance in &live {
        block_until("the dead backend excluded", || {
            instance.serving("web").get(dead.name()) == Some(&false)
        });
    }
    eprintln!(
        "fleet: a dead backend excluded by all three after {:?}",
        crashed.elapsed()
    );
    for instance in &live {
        let reason: Vec<String> = instance
            .events()
            .iter()
            .filter(|e| {
                e["type"] == "transition" && e["backend"] == dead.name() && e["to"] == "DOWN"
            })
            .map(|e| e["reason"].as_str().unwrap_or_default().to_owned())
            .collect();
        assert_eq!(reason.len(), 1, "instance {}: {reason:?}", instance.name);
        if instance.name == owner {
            assert!(reason[0].contains("failed probe"), "{reason:?}");
        } else {
            assert!(
                reason[0].starts_with(&format!("DOWN as published by instance {owner} (")),
                "instance {}: {reason:?}",
                instance.name
            );
        }
    }
    drop(etcd);
}

#[test]
fn a_killed_instance_is_re_owned_within_one_lease_and_nothing_flaps() {
    let rt = runtime();
    let backends = sims(&rt, 6);
    let names: Vec<&str> = backends.iter().map(SimBackend::name).collect();
    let etcd = rt.block_on(Etcd::start("fleet-kill"));
    let fleet_of: Vec<Instance> = ["a", "b", "c"]
        .iter()
        .map(|n| Instance::start(n, &config(n, &etcd.endpoint(), "kill", &backends)))
        .collect();
    for instance in &fleet_of {
        block_until("three members", || members(instance) == 3);
        block_until("every backend UP", || all_up(instance, &names));
    }
    let b = &fleet_of[1];
    let killed = Instant::now();
    signal(b.process.pid(), "KILL");
    block_until("b to be gone", || gone(b.process.pid()));
    let live = [&fleet_of[0], &fleet_of[2]];
    for instance in live {
        block_until("b's lease to end", || members(instance) == 2);
    }
    let reowned = killed.elapsed();
    eprintln!(
        "fleet: a SIGKILLed instance's backends re-owned after {reowned:?} (lease {LEASE:?})"
    );
    assert!(
        reowned < LEASE + Duration::from_millis(1500),
        "re-owning took {reowned:?} with a lease of {LEASE:?}"
    );
    let probed = probers(&live, &backends);
    for (backend, by) in &probed {
        assert_eq!(by.len(), 1, "backend {backend}: probed by {by:?}");
    }
    // Nothing flapped: the backends of a static pool start UP, and no instance saw a
    // transition while ownership moved.
    for instance in live {
        let transitions = instance.transitions();
        assert!(
            transitions.is_empty(),
            "instance {}: {transitions:?}",
            instance.name
        );
    }
    drop(etcd);
}

#[test]
fn an_instance_cut_off_from_etcd_probes_everything_says_so_and_rejoins() {
    let rt = runtime();
    let backends = sims(&rt, 6);
    let names: Vec<&str> = backends.iter().map(SimBackend::name).collect();
    let etcd = rt.block_on(Etcd::start("fleet-cut"));
    let etcd_addr: SocketAddr = etcd
        .endpoint()
        .trim_start_matches("http://")
        .parse()
        .expect("etcd's address");
    let relay = rt.block_on(Relay::start(etcd_addr));
    let a = Instance::start("a", &config("a", &etcd.endpoint(), "cut", &backends));
    let c = Instance::start(
        "c",
        &config("c", &format!("http://{}", relay.addr()), "cut", &backends),
    );
    for instance in [&a, &c] {
        block_until("two members", || members(instance) == 2);
        block_until("every backend UP", || all_up(instance, &names));
    }
    let fleet_events = |i: &Instance| -> Vec<String> {
        i.events()
            .iter()
            .filter(|e| e["type"] == "fleet")
            .map(|e| e["fleet"].as_str().unwrap_or_default().to_owned())
            .collect()
    };
    // c joined once and was never cut off. Which of a and c registers first is a race between
    // two processes: c may join alone and see a come (a `members` event) or join with a there.
    let said = fleet_events(&c);
    assert!(
        said.first().map(String::as_str) == Some("joined")
            && said[1..].iter().all(|e| e == "members"),
        "c's fleet events: {said:?}"
    );
    // With two members c owns the backends /status names it the owner of (which ones
    // follows from the backends' ephemeral ports; all six in 1 of 64 runs).
    let shared = metric(&c, "capataz_fleet_owned_backends");
    let named = fleet(&c)["backends"]
        .as_array()
        .expect("backends")
        .iter()
        .filter(|e| e["owners"] == serde_json::json!(["c"]))
        .count();
    assert_eq!(shared, named as f64, "c's owned backends against /status");

    relay.cut();
    block_until("c to say it is cut off", || {
        fleet_events(&c).iter().any(|e| e == "cut_off")
    });
    assert_eq!(metric(&c, "capataz_fleet_cut_off"), 1.0);
    assert_eq!(metric(&c, "capataz_fleet_owned_backends"), 6.0);
    assert_eq!(fleet(&c)["cut_off"], true);
    // c probes every backend itself; a, alone in the group once c's lease has expired, too.
    // c says it is cut off after one lease without an answer, a sees c's lease end after
    // about one lease too, so either may come first: a's view is waited for, not assumed.
    block_until("a to see c's lease end", || members(&a) == 1);
    let probed = probers(&[&a, &c], &backends);
    for (backend, by) in &probed {
        assert_eq!(by, &["a", "c"], "backend {backend}");
    }

    relay.mend();
    block_until("c to rejoin", || {
        fleet_events(&c).iter().any(|e| e == "reconnected")
    });
    block_until("two members again", || members(&c) == 2 && members(&a) == 2);
    assert_eq!(metric(&c, "capataz_fleet_cut_off"), 0.0);
    let probed = probers(&[&a, &c], &backends);
    for (backend, by) in &probed {
        assert_eq!(by.len(), 1, "backend {backend}: probed by {by:?}");
    }
    // No transition through the cut and the rejoin (a static pool's backends start UP).
    for instance in [&a, &c] {
        let transitions = instance.transitions();
        assert!(
            transitions.is_empty(),
            "instance {}: {transitions:?}",
            instance.name
        );
    }
    drop(relay);
    drop(etcd);
}

/// Waits for a `fleet` event `joined` (alone in its group) for `group`.
async fn joined(seen: &mut tokio::sync::broadcast::Receiver<capataz::events::Notice>, group: &str) {
    use capataz::events::{FleetChange, Notice};
    let deadline = tokio::time::Instant::now() + DEADLINE;
    loop {
        let event = tokio::time::timeout_at(deadline, seen.recv())
            .await
            .unwrap_or_else(|_| panic!("no joined event for group {group}"))
            .expect("events");
        if let Notice::Fleet {
            group: g,
            change: FleetChange::Joined { members: 1 },
            ..
        } = &event
        {
            if &**g == group {
                return;
            }
        }
    }
}

/// A reload applies `[fleet]`: added, it joins; changed, it joins the new group; removed, it
/// stops (every backend probed here again, no `fleet` object in `/status`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reload_starts_changes_and_stops_shared_probing() {
    use capataz::server::Balancer;

    let etcd = Etcd::start("fleet-reload").await;
    let base = "[[listeners]]\naddress = \"127.0.0.1:0\"\n\n[pools.web]\nbackends = \
                [{ address = \"127.0.0.1:9\" }]\n[pools.web.active]\nkind = \"none\"\n";
    let with = |group: &str| {
        format!(
            "{base}\n[fleet]\nendpoints = [\"{}\"]\ngroup = \"{group}\"\ninstance = \"solo\"\n\
             lease_ttl = \"2s\"\ntimeout = \"500ms\"\n",
            etcd.endpoint()
        )
    };
    let config = capataz::config::parse_str(base, "fleet.toml").expect("valid");
    let (events, mut seen) = tokio::sync::broadcast::channel(1024);
    let balancer = Balancer::start(&config, events).await.expect("started");
    assert!(balancer.supervisor().fleet_status().is_none());

    for group in ["one", "two"] {
        let config = capataz::config::parse_str(&with(group), "fleet.toml").expect("valid");
        balancer.reload(&config).await.expect("reloaded");
        joined(&mut seen, group).await;
        let status = balancer
            .supervisor()
            .fleet_status()
            .expect("a fleet object");
        assert_eq!(status["group"], group);
        assert_eq!(status["members"], serde_json::json!(["solo"]));
        assert_eq!(status["backends"][0]["probed_here"], true);
    }
    let config = capataz::config::parse_str(base, "fleet.toml").expect("valid");
    balancer.reload(&config).await.expect("reloaded");
    assert!(balancer.supervisor().fleet_status().is_none());
    assert!(balancer
        .supervisor()
        .fleet()
        .owns_backend("web", "127.0.0.1:9"));
    balancer.shutdown(Duration::from_secs(1)).await;
    drop(etcd);
}

/// Instance `name`'s [`config`] with a lease of `lease` and `owners` owners per backend.
fn config_with(
    name: &str,
    endpoint: &str,
    group: &str,
    backends: &[SimBackend],
    lease: &str,
    owners: usize,
) -> String {
    config(name, endpoint, group, backends)
        .replace(
            &format!("lease_ttl = \"{}s\"", LEASE.as_secs()),
            &format!("lease_ttl = \"{lease}\""),
        )
        .replace("owners = 1", &format!("owners = {owners}"))
}

fn fleet_events(instance: &Instance) -> Vec<String> {
    instance
        .events()
        .iter()
        .filter(|e| e["type"] == "fleet")
        .map(|e| e["fleet"].as_str().unwrap_or_default().to_owned())
        .collect()
}

#[test]
fn a_second_instance_with_the_same_name_says_so_does_not_join_and_takes_over_once_free() {
    let rt = runtime();
    let backends = sims(&rt, 4);
    let names: Vec<&str> = backends.iter().map(SimBackend::name).collect();
    let etcd = rt.block_on(Etcd::start("fleet-twin"));
    // A long lease: only a clean stop (revoking it) frees the name within the test's deadline.
    let twin = config_with("lb", &etcd.endpoint(), "twin", &backends, "60s", 1);
    let first = Instance::start("first", &twin);
    block_until("the first to join", || fleet(&first)["joined"] == true);
    let second = Instance::start("second", &twin);
    block_until("the second to say its name is taken", || {
        fleet_events(&second).contains(&"name_taken".to_owned())
    });
    let taken: Vec<Value> = second
        .events()
        .into_iter()
        .filter(|e| e["fleet"] == "name_taken")
        .collect();
    assert_eq!(taken.len(), 1, "said once: {taken:?}");
    assert_eq!(taken[0]["instance"], "lb");
    assert!(
        taken[0]["sentence"]
            .as_str()
            .unwrap_or_default()
            .contains("already registered"),
        "{:?}",
        taken[0]
    );
    // The second is no member: it probes every backend itself and never joined; the first is
    // the group's only member and still probes them all.
    let status = fleet(&second);
    assert_eq!(status["joined"], false, "{status}");
    for entry in status["backends"].as_array().expect("backends") {
        assert_eq!(entry["probed_here"], true, "{entry}");
    }
    assert!(!fleet_events(&second).contains(&"joined".to_owned()));
    block_until("every backend UP on the second", || all_up(&second, &names));
    assert_eq!(members(&first), 1);
    assert_eq!(fleet(&first)["joined"], true);
    // The first stops cleanly: its lease is revoked and the second takes the name at once.
    let stopped = Instant::now();
    first.process.signal("TERM");
    block_until("the second to join", || fleet(&second)["joined"] == true);
    assert!(
        stopped.elapsed() < Duration::from_secs(30),
        "the name was freed after {:?}, as if the lease had expired",
        stopped.elapsed()
    );
    assert_eq!(members(&second), 1);
    drop(etcd);
}

#[test]
fn a_clean_stop_and_a_reload_hand_over_at_once_not_one_lease_later() {
    let rt = runtime();
    let backends = sims(&rt, 4);
    let names: Vec<&str> = backends.iter().map(SimBackend::name).collect();
    let etcd = rt.block_on(Etcd::start("fleet-stop"));
    let a = Instance::start(
        "a",
        &config_with("a", &etcd.endpoint(), "stop", &backends, "60s", 1),
    );
    let b = Instance::start(
        "b",
        &config_with("b", &etcd.endpoint(), "stop", &backends, "60s", 1),
    );
    for instance in [&a, &b] {
        block_until("two members", || members(instance) == 2);
        block_until("every backend UP", || all_up(instance, &names));
    }
    // A reload that changes [fleet] registers again under the same name: the old lease is
    // revoked first, so the name is not taken by this instance's own old registration.
    b.rewrite(&config_with(
        "b",
        &etcd.endpoint(),
        "stop",
        &backends,
        "60s",
        2,
    ));
    b.process.signal("HUP");
    block_until("b to take the new owners", || fleet(&b)["owners"] == 2);
    block_until("b to join again", || {
        fleet_events(&b).iter().filter(|k| *k == "joined").count() == 2
    });
    assert_eq!(fleet(&b)["joined"], true);
    assert!(!fleet_events(&b).contains(&"name_taken".to_owned()));
    assert_eq!(members(&a), 2);
    // A clean stop revokes the lease: a sees b leave within seconds, not after 60 s.
    let stopped = Instant::now();
    b.process.signal("TERM");
    block_until("b to leave the group", || members(&a) == 1);
    let left = stopped.elapsed();
    eprintln!("fleet: a cleanly stopped instance left the group after {left:?} (lease 60s)");
    assert!(left < Duration::from_secs(30), "left after {left:?}");
    block_until("b to be gone", || gone(b.process.pid()));
    // a owns every backend now and keeps them UP.
    block_until("a to own every backend", || {
        metric(&a, "capataz_fleet_owned_backends") == 4.0
    });
    assert!(all_up(&a, &names));
    drop(etcd);
}

/// The skipped keys `instance` said, as `(key, error)`.
fn skipped(instance: &Instance) -> Vec<(String, String)> {
    instance
        .events()
        .iter()
        .filter(|e| e["type"] == "fleet" && e["fleet"] == "skipped")
        .map(|e| {
            (
                e["key"].as_str().unwrap_or_default().to_owned(),
                e["sentence"].as_str().unwrap_or_default().to_owned(),
            )
        })
        .collect()
}

#[test]
fn hostile_keys_under_the_group_are_skipped_and_never_count() {
    let rt = runtime();
    let backends = sims(&rt, 4);
    let names: Vec<&str> = backends.iter().map(SimBackend::name).collect();
    let etcd = rt.block_on(Etcd::start("fleet-hostile"));
    let a = Instance::start("a", &config("a", &etcd.endpoint(), "hostile", &backends));
    let b = Instance::start("b", &config("b", &etcd.endpoint(), "hostile", &backends));
    for instance in [&a, &b] {
        block_until("two members", || members(instance) == 2);
        block_until("every backend UP", || all_up(instance, &names));
    }
    // A backend one instance probes and the other follows dies: both see it DOWN. Which one
    // owns it follows from the backends' ephemeral ports (a owns none of four in 1 of 16
    // runs), so the owner is the one /status names.
    let status = fleet(&b);
    let first = &status["backends"][0];
    let owner = first["owners"][0].as_str().expect("an owner").to_owned();
    assert!(owner == "a" || owner == "b", "{first}");
    let dead = backends
        .iter()
        .find(|s| first["backend"] == s.name())
        .expect("the backend");
    dead.crash();
    for instance in [&a, &b] {
        block_until("the dead backend excluded", || {
            instance.serving("web").get(dead.name()) == Some(&false)
        });
    }
    let root = "/capataz/groups/hostile/";
    let verdict = |pool: &str, by: &str| format!("{root}verdicts/{pool}/{}/{by}", dead.addr());
    rt.block_on(async {
        // Someone with etcdctl claims the dead backend is UP: in the owner's name without a
        // lease, and in the name of an instance that does not exist, with one.
        etcd.put(&verdict("web", &owner), r#"{"state":"UP","streak":9}"#)
            .await;
        let lease = etcd.grant_lease(60).await;
        etcd.put_with_lease(&verdict("web", "mallory"), r#"{"state":"UP"}"#, &lease)
            .await;
        etcd.put_with_lease(&verdict("nopool", "mallory"), r#"{"state":"UP"}"#, &lease)
            .await;
        // Values that are no verdict.
        let huge = format!(r#"{{"state":"UP","last":"{}"}}"#, "x".repeat(5000));
        etcd.put_with_lease(&verdict("web", "huge"), &huge, &lease)
            .await;
        etcd.put_with_lease(&verdict("web", "json"), "{not json", &lease)
            .await;
        etcd.put_with_lease(&verdict("web", "state"), r#"{"state":"MAYBE"}"#, &lease)
            .await;
        // A member that would never expire.
        etcd.put(&format!("{root}members/ghost"), "{}").await;
    });
    let want = [
        (verdict("web", &owner), "without a lease"),
        (verdict("web", "huge"), "bytes"),
        (verdict("web", "json"), "not a verdict"),
        (verdict("web", "state"), "neither UP nor DOWN"),
        (format!("{root}members/ghost"), "without a lease"),
    ];
    for instance in [&a, &b] {
        block_until("the hostile keys skipped", || {
            let said = skipped(instance);
            want.iter()
                .all(|(key, why)| said.iter().any(|(k, s)| k == key && s.contains(why)))
        });
        // Nothing counted: the ghost is no member, the backend is still out, never back UP.
        assert_eq!(members(instance), 2, "instance {}", instance.name);
        assert_eq!(
            instance.serving("web").get(dead.name()),
            Some(&false),
            "instance {}",
            instance.name
        );
        assert_eq!(
            instance.transitions()[dead.name()],
            ["UP->DOWN"],
            "instance {}",
            instance.name
        );
    }
    let follower = if owner == "a" { &b } else { &a };
    let followed = fleet(follower)["backends"]
        .as_array()
        .expect("backends")
        .iter()
        .find(|e| e["backend"] == dead.name())
        .map(|e| e["verdict_from"].clone());
    assert_ne!(followed, Some(Value::from("mallory")));

    // Someone overwrites a's registration: a says its name is taken and stops counting on it
    // (it probes everything); once the key is deleted it registers again.
    rt.block_on(etcd.put(&format!("{root}members/a"), "{}"));
    block_until("a to say its name is taken", || {
        fleet_events(&a).contains(&"name_taken".to_owned())
    });
    block_until("a to own every backend", || {
        metric(&a, "capataz_fleet_owned_backends") == 4.0
    });
    block_until("b to own every backend", || {
        metric(&b, "capataz_fleet_owned_backends") == 4.0
    });
    rt.block_on(etcd.delete(&format!("{root}members/a")));
    for instance in [&a, &b] {
        block_until("a to be a member again", || members(instance) == 2);
    }
    block_until("a to join again", || fleet(&a)["joined"] == true);
    assert!(a.process.pid() > 0 && !gone(a.process.pid()) && !gone(b.process.pid()));
    drop(etcd);
}
