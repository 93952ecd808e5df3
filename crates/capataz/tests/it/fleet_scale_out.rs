//! Scale-out: three `capataz run` processes (real processes, so that one can be
//! SIGKILLed; this binary already starts the built `capataz` as a child, so no test binary of
//! its own is needed), one real etcd, twenty scripted backends on loopback that count the
//! probes and requests they get, pool `web` of every instance following prefix `/fleet/`.
//! Instance `c` reaches etcd through a relay of the test's own, which the test cuts: a
//! partition between one balancer and etcd while the others still reach it.
//!
//! With paced GETs through every live instance all along: a backend killed is excluded by
//! every instance (the time until the last one does is printed); a backend added and one
//! removed in etcd while `c` is cut off reach the traffic of `a` and `b` at once, and of `c`
//! when the relay is mended (meanwhile `c` keeps its membership and says so); `b` SIGKILLed
//! changes nothing for the others. Then: no client error through any live instance (`b`'s
//! requests count until its kill), exactly one transition per real change per instance, and
//! probes per backend per interval: with shared probing ([`SHARED_PROBING`], `[fleet]` with
//! `owners = 2`) each backend is probed by `min(k, live)` instances ([`probers_per_backend`]);
//! `c`, cut off from etcd, probes every backend itself.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::time::{Duration, Instant};

use capataz::sim::SimBackend;

use crate::support::etcd::Etcd;
use crate::support::fleet::{probers_per_backend, Instance, Traffic};
use crate::support::process::{gone, signal};
use crate::support::relay::Relay;
use crate::support::wait::block_until;
use crate::support::{any, runtime, DEADLINE};

/// Shared probing: `Some((k, block))`: `k` instances probe each backend, and `block` is the
/// config table that turns it on (added to every instance's file, `ENDPOINT` replaced by the
/// instance's etcd endpoint; `None` would have every instance probe every backend).
const SHARED_PROBING: Option<(usize, &str)> = Some((
    2,
    r#"
[fleet]
endpoints = ["ENDPOINT"]
group = "scale-out"
owners = 2
lease_ttl = "2s"
timeout = "500ms"
"#,
));

/// The probe interval of pool `web`.
const INTERVAL: Duration = Duration::from_millis(100);

/// How often each instance's client sends a GET.
const PACE: Duration = Duration::from_millis(10);

/// An instance's config: listener `front` and the admin API on ephemeral ports, pool `web`
/// from etcd at `endpoint`, probed every [`INTERVAL`], rise 2, fall 2.
fn config(endpoint: &str) -> String {
    let shared = SHARED_PROBING.map_or(String::new(), |(_, block)| {
        block.replace("ENDPOINT", endpoint)
    });
    format!(
        r#"
[admin]
address = "127.0.0.1:0"

[[listeners]]
name = "front"
address = "127.0.0.1:0"

[pools.web.source]
kind = "etcd"
endpoints = ["{endpoint}"]
prefix = "/fleet/"
timeout = "1s"
reconnect_min = "100ms"
reconnect_max = "300ms"
keepalive = "1s"

[pools.web.active]
interval = "{}ms"
timeout = "500ms"
rise = 2
fall = 2
{shared}
"#,
        INTERVAL.as_millis()
    )
}

fn value(backend: &SimBackend) -> String {
    format!(r#"{{"address": "{}"}}"#, backend.addr())
}

/// Waits until `instance` has exactly `names` in pool `web`, every one serving.
fn wait_serving(instance: &Instance, names: &[String]) {
    let want: BTreeMap<String, bool> = names.iter().map(|n| (n.clone(), true)).collect();
    let end = Instant::now() + DEADLINE;
    loop {
        let last = instance.serving("web");
        if last == want {
            return;
        }
        assert!(
            Instant::now() < end,
            "instance {}: pool web is {last:?}, wanted {want:?}",
            instance.name
        );
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// Over a stretch of about 20 intervals, with `live` instances up: each backend is probed by
/// exactly the instances [`probers_per_backend`] says (by each one's `capataz_probes_total`),
/// and gets about that many probes per interval (counted by the backend itself).
///
/// With shared probing it first waits until every live instance sees as many members in the
/// group as there are live instances: until then ownership is still moving (an instance SIGKILLed leaves
/// the group only when its lease ends, up to a lease and etcd's expiry check later), and its
/// backends get fewer probes than the stretch expects.
fn check_probe_load(live: &[&Instance], backends: &[&SimBackend]) {
    if SHARED_PROBING.is_some() {
        for instance in live {
            block_until(
                &format!("{} to see {} members", instance.name, live.len()),
                || instance.fleet_members().len() == live.len(),
            );
        }
    }
    let probers = probers_per_backend(live.len(), SHARED_PROBING.map(|(k, _)| k));
    let before: Vec<_> = live.iter().map(|i| i.probes_sent("web")).collect();
    let hits_before: Vec<u64> = backends.iter().map(|b| b.health_hits()).collect();
    let started = Instant::now();
    let total = || -> u64 { backends.iter().map(|b| b.health_hits()).sum() };
    let want = total() + (20 * probers * backends.len()) as u64;
    block_until("20 intervals of probes", || total() >= want);
    let elapsed = started.elapsed();
    let after: Vec<_> = live.iter().map(|i| i.probes_sent("web")).collect();
    let intervals = elapsed.as_secs_f64() / INTERVAL.as_secs_f64();
    for (j, backend) in backends.iter().enumerate() {
        let name = backend.name();
        let sent: Vec<u64> = before
            .iter()
            .zip(&after)
            .map(|(b, a)| a.get(name).copied().unwrap_or(0) - b.get(name).copied().unwrap_or(0))
            .collect();
        let by = sent.iter().filter(|&&n| n > 0).count();
        assert_eq!(
            by,
            probers,
            "backend {name} was probed by {by} of {} instances ({sent:?}), expected {probers}",
            live.len()
        );
        let got = backend.health_hits() - hits_before[j];
        let per_interval = got as f64 / intervals;
        assert!(
            (0.5 * probers as f64..=1.5 * probers as f64).contains(&per_interval),
            "backend {name}: {got} probes in {elapsed:?} ({per_interval:.2} per interval), \
             expected about {probers}"
        );
    }
    eprintln!(
        "fleet: {} live instances, {probers} probers per backend: {:.2} probes per backend per \
         interval (over {elapsed:?})",
        live.len(),
        (total() - hits_before.iter().sum::<u64>()) as f64
            / backends.len() as f64
            / (started.elapsed().as_secs_f64() / INTERVAL.as_secs_f64())
    );
}

#[test]
fn fleet_of_three_follows_etcd_through_a_kill_a_partition_and_churn_without_a_client_error() {
    let rt = runtime();
    let names: Vec<String> = (0..20).map(|i| format!("b{i:02}")).collect();
    let sims: Vec<SimBackend> = rt.block_on(async {
        let mut out = Vec::new();
        for name in &names {
            out.push(SimBackend::start(name, any()).await.expect("a backend"));
        }
        out
    });
    let etcd = rt.block_on(Etcd::start("fleet"));
    let etcd_addr: SocketAddr = etcd
        .endpoint()
        .trim_start_matches("http://")
        .parse()
        .expect("etcd's address");
    let relay = rt.block_on(Relay::start(etcd_addr));
    // b00..b18 to begin with; b19 comes later, and b18 goes.
    rt.block_on(async {
        for sim in &sims[..19] {
            etcd.put(&format!("/fleet/{}", sim.name()), &value(sim))
                .await;
        }
    });
    let mut members: Vec<String> = names[..19].to_vec();

    let a = Instance::start("a", &config(&etcd.endpoint()));
    let b = Instance::start("b", &config(&etcd.endpoint()));
    let c = Instance::start("c", &config(&format!("http://{}", relay.addr())));
    let fleet = [&a, &b, &c];
    for instance in fleet {
        wait_serving(instance, &members);
    }
    let traffic: Vec<Traffic> = fleet
        .iter()
        .map(|i| Traffic::start(i.front, PACE))
        .collect();
    for t in &traffic {
        t.wait_more(20);
    }
    let live_sims: Vec<&SimBackend> = sims[..19].iter().collect();
    check_probe_load(&fleet, &live_sims);

    // A backend dies: every instance excludes it.
    let killed = &sims[3];
    killed.crash();
    let crashed = Instant::now();
    let mut excluded: Vec<Option<Duration>> = vec![None; fleet.len()];
    block_until("every instance to exclude the killed backend", || {
        for (i, instance) in fleet.iter().enumerate() {
            if excluded[i].is_none() && instance.backend("web", killed.name()).1["serving"] == false
            {
                excluded[i] = Some(crashed.elapsed());
            }
        }
        excluded.iter().all(Option::is_some)
    });
    let excluded: Vec<Duration> = excluded.into_iter().flatten().collect();
    let converged = excluded.iter().max().copied().unwrap_or_default();
    eprintln!("fleet: the killed backend excluded after {excluded:?} (a, b, c): converged in {converged:?}");
    assert!(
        converged < Duration::from_secs(5),
        "instances took {excluded:?} to exclude a dead backend probed every {INTERVAL:?}"
    );

    // c is cut off from etcd: it keeps its membership and says so.
    relay.cut();
    block_until("c's source to fail", || {
        c.membership_events().iter().any(|m| m == "failing")
    });
    let status = c.json("/status");
    let pool = &status["pools"][0];
    assert!(pool["source"]["failing"].is_string(), "{}", pool["source"]);
    assert_eq!(pool["backends_total"], 19, "c lost its membership");

    // Churn in etcd meanwhile: b19 added, b18 removed. a and b follow at once.
    let added = &sims[19];
    let removed = &sims[18];
    let churned = Instant::now();
    rt.block_on(async {
        etcd.put(&format!("/fleet/{}", added.name()), &value(added))
            .await;
        etcd.delete(&format!("/fleet/{}", removed.name())).await;
    });
    members.retain(|m| m != removed.name());
    members.push(added.name().to_owned());
    let mut want_serving: BTreeMap<String, bool> = members
        .iter()
        .map(|m| (m.clone(), m != killed.name()))
        .collect();
    let mut gone_from: Vec<Option<Instant>> = vec![None; fleet.len()];
    for (i, instance) in fleet.iter().enumerate().take(2) {
        block_until(&format!("{} to follow the churn", instance.name), || {
            instance.serving("web") == want_serving
        });
        gone_from[i] = Some(Instant::now());
        block_until(
            &format!("{} to send traffic to the added backend", instance.name),
            || traffic[i].served_since(added.name(), churned) > 0,
        );
    }
    // c still serves its old membership, b18 included, and still says its source fails.
    let on_c = c.serving("web");
    assert!(
        on_c.contains_key(removed.name()) && !on_c.contains_key(added.name()),
        "c changed its membership while cut off: {on_c:?}"
    );
    let c_b18 = traffic[2].served_since(removed.name(), churned);
    traffic[2].wait_more(40);
    assert!(
        traffic[2].served_since(removed.name(), churned) > c_b18,
        "c stopped sending to a backend it still has"
    );

    // The relay is mended: c catches up on what it missed.
    relay.mend();
    block_until("c's source to answer again", || {
        c.membership_events().iter().any(|m| m == "restored")
    });
    block_until("c to follow the churn", || c.serving("web") == want_serving);
    gone_from[2] = Some(Instant::now());
    block_until("c to send traffic to the added backend", || {
        traffic[2].served_since(added.name(), churned) > 0
    });
    for t in &traffic {
        t.wait_more(40);
    }
    for (i, instance) in fleet.iter().enumerate() {
        let since = gone_from[i].expect("noted above");
        assert_eq!(
            traffic[i].served_since(removed.name(), since),
            0,
            "instance {} sent new requests to the removed backend",
            instance.name
        );
    }

    // Each instance saw each real change once: every member came UP once (the first
    // membership and b19, gated until rise probes), the killed one went DOWN once, and the
    // removal is no transition.
    let expected: BTreeMap<String, Vec<String>> = names
        .iter()
        .map(|n| {
            let mut changes = vec!["DOWN->UP".to_owned()];
            if n == killed.name() {
                changes.push("UP->DOWN".to_owned());
            }
            (n.clone(), changes)
        })
        .collect();
    let check_events = |instance: &Instance, partitioned: bool| {
        assert_eq!(
            instance.transitions(),
            expected,
            "instance {}: transitions per backend",
            instance.name
        );
        let membership = instance.membership_events();
        let count = |what: &str| membership.iter().filter(|m| *m == what).count();
        let once = usize::from(partitioned);
        assert_eq!(
            (count("failing"), count("restored")),
            (once, once),
            "instance {}: membership events {membership:?}",
            instance.name
        );
    };

    // b is SIGKILLed; its requests count until then.
    check_events(&b, false);
    let b_killed = Instant::now();
    signal(b.process.pid(), "KILL");
    block_until("b to be gone", || gone(b.process.pid()));
    let mut traffic = traffic;
    let b_traffic = traffic.remove(1);
    let b_errors = b_traffic.errors(Some(b_killed));
    let b_log = b_traffic.stop();
    let live = [&a, &c];
    for t in &traffic {
        t.wait_more(40);
    }
    want_serving.remove(killed.name());
    let live_sims: Vec<&SimBackend> = sims
        .iter()
        .filter(|s| want_serving.contains_key(s.name()))
        .collect();
    check_probe_load(&live, &live_sims);
    check_events(&a, false);
    check_events(&c, true);

    // Not one client error through a live instance.
    let logs: Vec<_> = traffic.into_iter().map(Traffic::stop).collect();
    for (instance, log) in [(&a, &logs[0]), (&c, &logs[1])] {
        let errors: Vec<_> = log.iter().filter(|r| r.outcome.is_err()).collect();
        assert!(
            errors.is_empty(),
            "instance {}: {} of {} requests failed: {:?}",
            instance.name,
            errors.len(),
            log.len(),
            errors.iter().take(5).collect::<Vec<_>>()
        );
    }
    assert!(
        b_errors.is_empty(),
        "instance b: {} requests failed before its kill: {:?}",
        b_errors.len(),
        b_errors.iter().take(5).collect::<Vec<_>>()
    );
    eprintln!(
        "fleet: {} + {} + {} requests through a, b (until killed), c; 0 errors",
        logs[0].len(),
        b_log.iter().filter(|r| r.ended < b_killed).count(),
        logs[1].len()
    );
    drop(relay);
    drop(etcd);
}
