//! The probe side end to end, on loopback: a body that stops matching takes a backend
//! DOWN with the text in `explain`; probes run faster during a streak and slower while DOWN;
//! `first-probe` admits a backend after one pass; an agent's `down` and `50%` change
//! eligibility and weight, and a failing agent changes nothing.

use std::time::Duration;

use capataz::health::{Notice, PoolRt};
use capataz_health::{Reason, State};
use tokio::time::Instant;

use crate::support::balancer::{start, ConfigText};
use crate::support::checks::{AgentBackend, HealthAnswer, HealthBackend};
use crate::support::events::{transition_of, wait_for};
use crate::support::wait::wait_until;

fn explain(pool: &PoolRt, backend: usize) -> String {
    capataz::status::explain(pool, &pool.view_of(backend))
}

#[tokio::test]
async fn a_body_that_stops_matching_takes_the_backend_down_and_explain_says_why() {
    let a = HealthBackend::start("a", HealthAnswer::new(200, "status: ok\n")).await;
    let text = ConfigText::new(&[("a".to_owned(), a.addr)])
        .extra(
            "[pools.web.active]\ninterval = \"30ms\"\ntimeout = \"500ms\"\nfall = 2\n\
             body_contains = \"ok\"\nbody_not_contains = \"maintenance\"\n",
        )
        .build();
    let (balancer, mut rx) = start(&text).await;
    let pool = balancer.pool("web").unwrap();
    wait_until("two probes that match", || a.probes().len() >= 2).await;
    assert_eq!(pool.verdict(0), State::Up);
    a.answer(HealthAnswer::new(200, "status: degraded\n"));
    let down = wait_for(&mut rx, "a DOWN", |e| {
        transition_of(e, "a", State::Down).is_some()
    })
    .await;
    let Notice::Transition { transition, .. } = down else {
        unreachable!()
    };
    assert!(
        matches!(
            transition.reason,
            Reason::ProbesFailed {
                mismatch: Some(_),
                ..
            }
        ),
        "{transition}"
    );
    let sentence = explain(&pool, 0);
    assert!(
        sentence
            .contains(r#"2 consecutive failed probes (last: HTTP 200, body did not contain "ok")"#),
        "{sentence}"
    );
    // A forbidden text fails too, once the expected one is back.
    a.answer(HealthAnswer::new(200, "ok\n"));
    wait_for(&mut rx, "a UP", |e| {
        transition_of(e, "a", State::Up).is_some()
    })
    .await;
    a.answer(HealthAnswer::new(200, "ok, maintenance at noon\n"));
    wait_for(&mut rx, "a DOWN again", |e| {
        transition_of(e, "a", State::Down).is_some()
    })
    .await;
    assert!(
        explain(&pool, 0).contains(r#"body contained "maintenance""#),
        "{}",
        explain(&pool, 0)
    );
    balancer.shutdown(Duration::from_secs(1)).await;
}

#[tokio::test]
async fn probes_are_faster_during_a_failing_streak_and_stop_while_down() {
    let a = HealthBackend::start("a", HealthAnswer::new(200, "")).await;
    // Steady every 300 ms, 30 ms during a streak, 60 s while DOWN. Without fast_interval,
    // the three failures that take it DOWN would span at least two steady intervals (540 ms
    // with the jitter); with it, about 60 ms.
    let text = ConfigText::new(&[("a".to_owned(), a.addr)])
        .extra(
            "[pools.web.active]\ninterval = \"300ms\"\nfast_interval = \"30ms\"\n\
             down_interval = \"60s\"\ntimeout = \"500ms\"\nfall = 3\n",
        )
        .build();
    let (balancer, mut rx) = start(&text).await;
    let pool = balancer.pool("web").unwrap();
    wait_until("a first probe", || !a.probes().is_empty()).await;
    a.answer(HealthAnswer::new(500, ""));
    wait_for(&mut rx, "a DOWN", |e| {
        transition_of(e, "a", State::Down).is_some()
    })
    .await;
    let down_at = Instant::now();
    let probes = a.probes();
    let first_failure = probes
        .iter()
        .find(|(_, status)| *status == 500)
        .map(|(at, _)| *at)
        .expect("a failed probe");
    assert!(
        down_at - first_failure < Duration::from_millis(450),
        "DOWN {:?} after the first failure",
        down_at - first_failure
    );
    let view = pool.view_of(0);
    let json = capataz::status::backend_json(&pool, &view);
    assert_eq!(json["active"]["cadence"], "down", "{json}");
    assert_eq!(json["active"]["probe_interval_ms"], 60_000, "{json}");
    // The schedule has the next probe one jittered down_interval (+-10 %) away.
    let next = view.next_probe.expect("a is probed") - view.now;
    assert!(next > Duration::from_secs(53), "next probe in {next:?}");
    let count = a.probes().len();
    // An absence in wall time is the subject: no probe reaches the backend in a window ten
    // times the fast interval.
    tokio::time::sleep(Duration::from_millis(600)).await;
    assert_eq!(a.probes().len(), count, "no probe while DOWN within 54 s");
    assert!(
        explain(&pool, 0).contains("probed every 60 s while DOWN"),
        "{}",
        explain(&pool, 0)
    );
    balancer.shutdown(Duration::from_secs(1)).await;
}

#[tokio::test]
async fn first_probe_admits_a_backend_after_one_pass_and_keeps_a_failing_one_out() {
    let a = HealthBackend::start("a", HealthAnswer::new(200, "")).await;
    let b = HealthBackend::start("b", HealthAnswer::new(503, "")).await;
    let text = ConfigText::new(&[("a".to_owned(), a.addr), ("b".to_owned(), b.addr)])
        .extra(
            "[pools.web.active]\ninterval = \"30ms\"\ntimeout = \"500ms\"\nrise = 5\n\
             initial = \"first-probe\"\n",
        )
        .build();
    let (balancer, mut rx) = start(&text).await;
    let pool = balancer.pool("web").unwrap();
    let up = wait_for(&mut rx, "a UP", |e| {
        transition_of(e, "a", State::Up).is_some()
    })
    .await;
    let Notice::Transition { transition, .. } = up else {
        unreachable!()
    };
    assert!(
        matches!(transition.reason, Reason::ProbesPassed { streak: 1, .. }),
        "{transition}"
    );
    assert!(pool.eligibility()[0].0);
    wait_until("b probed", || !b.probes().is_empty()).await;
    assert_eq!(pool.verdict(1), State::Down);
    assert!(!pool.eligibility()[1].0);
    balancer.shutdown(Duration::from_secs(1)).await;
}

#[tokio::test]
async fn agent_down_and_weight_change_eligibility_and_a_failing_agent_changes_nothing() {
    let a = HealthBackend::start("a", HealthAnswer::new(200, "")).await;
    let b = HealthBackend::start("b", HealthAnswer::new(200, "")).await;
    let agent_a = AgentBackend::start("up\n").await;
    let agent_b = AgentBackend::start("up\n").await;
    let text = format!(
        "[[listeners]]\naddress = \"127.0.0.1:0\"\n\n[pools.web]\nbackends = [\
         {{ name = \"a\", address = \"{}\" }}, \
         {{ name = \"b\", address = \"{}\", agent_port = {} }}]\n\
         [pools.web.active]\ninterval = \"30ms\"\ntimeout = \"500ms\"\n\
         [pools.web.agent]\nport = {}\ninterval = \"20ms\"\ntimeout = \"500ms\"\n",
        a.addr,
        b.addr,
        agent_b.addr.port(),
        agent_a.addr.port()
    );
    let (balancer, mut rx) = start(&text).await;
    let pool = balancer.pool("web").unwrap();
    wait_until("both agents asked", || {
        agent_a.asked() > 0 && agent_b.asked() > 0
    })
    .await;
    agent_a.say(Some("down\n"));
    wait_for(
        &mut rx,
        "a's agent event",
        |e| matches!(e, Notice::Agent { backend, in_rotation: false, .. } if &**backend == "a"),
    )
    .await;
    assert_eq!(pool.eligibility(), [(false, 10), (true, 10)]);
    assert_eq!(
        pool.verdict(0),
        State::Up,
        "the agent never changes the verdict"
    );
    assert!(explain(&pool, 0).starts_with("HELD OUT by its agent (agent says down)"));
    agent_a.say(Some("up, 50%\n"));
    wait_until("a back at half weight", || {
        pool.eligibility()[0] == (true, 5)
    })
    .await;
    assert!(
        explain(&pool, 0).contains("agent weight 50%"),
        "{}",
        explain(&pool, 0)
    );
    // Silence, then garbage: the agent's last word stands.
    for line in [None, Some("what?\n")] {
        agent_a.say(line);
        let asked = agent_a.asked();
        wait_until("a few failed agent exchanges", || {
            agent_a.asked() >= asked + 3
        })
        .await;
        assert_eq!(pool.eligibility()[0], (true, 5));
    }
    // b's own port: its agent drains it.
    agent_b.say(Some("drain\n"));
    wait_until("b drained by its agent", || !pool.eligibility()[1].0).await;
    balancer.shutdown(Duration::from_secs(1)).await;
}

const POOL: &str = "[[listeners]]\naddress = \"127.0.0.1:0\"\n\n[pools.web]\n\
                    backends = [{ name = \"a\", address = \"127.0.0.1:9001\" }]\n";

fn config_error(extra: &str) -> String {
    match capataz::config::parse_str(&format!("{POOL}{extra}\n"), "<test>") {
        Ok(_) => panic!("accepted: {extra}"),
        Err(error) => error.to_string(),
    }
}

#[test]
fn new_check_keys_default_to_todays_behaviour() {
    let config = capataz::config::parse_str(
        &format!("{POOL}[pools.web.active]\ninterval = \"5s\"\n"),
        "<t>",
    )
    .unwrap();
    let active = &config.pools[0].active;
    assert_eq!(active.fast_interval, Duration::from_secs(5));
    assert_eq!(active.down_interval, Duration::from_secs(5));
    assert!(!active.first_probe);
    assert!(
        active.is_plain(),
        "the status-line-only probe stays the default"
    );
    assert_eq!(active.content.body_limit, 16 * 1024);
    assert_eq!(config.pools[0].agent, None);
    let config = capataz::config::parse_str(
        &format!(
            "{POOL}[pools.web.active]\ninitial = \"first-probe\"\n[pools.web.agent]\nport = 9777\n"
        ),
        "<t>",
    )
    .unwrap();
    assert!(config.pools[0].active.first_probe);
    assert_eq!(config.pools[0].active.initial, State::Down);
    let agent = config.pools[0].agent.unwrap();
    assert_eq!(
        (agent.port, agent.interval, agent.timeout),
        (9777, Duration::from_secs(2), Duration::from_secs(1))
    );
}

#[test]
fn bad_check_keys_are_refused_with_their_key() {
    for (extra, key) in [
        (
            "[pools.web.active]\nkind = \"tcp\"\nbody_contains = \"ok\"",
            "pools.web.active.body_contains",
        ),
        (
            "[pools.web.active]\nbody_contains = \"\"",
            "pools.web.active.body_contains",
        ),
        (
            "[pools.web.active]\nbody_contains = \"ok\"\nbody_limit = 0",
            "pools.web.active.body_limit",
        ),
        (
            "[pools.web.active]\nbody_contains = \"ok\"\nbody_limit = 1048577",
            "pools.web.active.body_limit",
        ),
        (
            "[pools.web.active]\nmethod = \"get\"",
            "pools.web.active.method",
        ),
        (
            "[pools.web.active]\nmethod = \"HEAD\"\nbody_contains = \"ok\"",
            "pools.web.active.method",
        ),
        (
            "[pools.web.active]\nheaders = { Host = \"x\" }",
            "pools.web.active.headers.Host",
        ),
        (
            "[pools.web.active]\nheaders = { \"a b\" = \"x\" }",
            "pools.web.active.headers.a b",
        ),
        (
            "[pools.web.active]\nheaders = { X = \"a\\nb\" }",
            "pools.web.active.headers.X",
        ),
        (
            "[pools.web.active]\nexpect_header_contains = \"yes\"",
            "pools.web.active.expect_header_contains",
        ),
        (
            "[pools.web.active]\nexpect_header = \"bad name\"",
            "pools.web.active.expect_header",
        ),
        (
            "[pools.web.active]\nfast_interval = \"0s\"",
            "pools.web.active.fast_interval",
        ),
        (
            "[pools.web.active]\ndown_interval = \"2 years\"",
            "pools.web.active.down_interval",
        ),
        (
            "[pools.web.active]\ninitial = \"sometimes\"",
            "pools.web.active.initial",
        ),
        (
            "[pools.web.agent]\ninterval = \"1s\"",
            "pools.web.agent.port",
        ),
        ("[pools.web.agent]\nport = 0", "pools.web.agent.port"),
        ("[pools.web.agent]\nport = 70000", "pools.web.agent.port"),
    ] {
        let error = config_error(extra);
        assert!(error.contains(key), "{extra:?}: {error}");
    }
}

#[test]
fn agent_port_needs_agent_checks_on_the_pool() {
    let text = "[[listeners]]\naddress = \"127.0.0.1:0\"\n\n[pools.web]\n\
                backends = [{ name = \"a\", address = \"127.0.0.1:9001\", agent_port = 9777 }]\n";
    let error = capataz::config::parse_str(text, "<t>")
        .unwrap_err()
        .to_string();
    assert!(
        error.contains("pools.web.backends[0].agent_port"),
        "{error}"
    );
}

#[test]
fn track_must_name_a_backend_and_never_come_back_to_itself() {
    let pools = |a: &str, b: &str| {
        format!(
            "[[listeners]]\naddress = \"127.0.0.1:0\"\n[[listeners.routes]]\npool = \"web\"\n\n[pools.web]\nbackends = [\
             {{ name = \"a\", address = \"127.0.0.1:9001\"{a} }}, \
             {{ name = \"b\", address = \"127.0.0.1:9002\"{b} }}]\n\
             [pools.api]\nbackends = [{{ name = \"c\", address = \"127.0.0.1:9003\", track = \"web/a\" }}]\n"
        )
    };
    let parse = |text: String| capataz::config::parse_str(&text, "<t>").map_err(|e| e.to_string());
    let config = parse(pools("", ", track = \"a\"")).unwrap();
    let web = config.pools.iter().find(|p| p.name == "web").unwrap();
    let track = web.backends[1].track.as_ref().unwrap();
    assert_eq!((track.pool.as_str(), track.backend.as_str()), ("web", "a"));
    for (a, b, key) in [
        ("", ", track = \"web/zz\"", "pools.web.backends[1].track"),
        ("", ", track = \"nope/a\"", "pools.web.backends[1].track"),
        (", track = \"a\"", "", "pools.api.backends[0].track"),
        (", track = \"b\"", ", track = \"web/a\"", "track"),
    ] {
        let error = parse(pools(a, b)).unwrap_err();
        assert!(error.contains(key), "{a} {b}: {error}");
    }
    let error = parse(pools(", track = \"b\"", ", track = \"a\"")).unwrap_err();
    assert!(error.contains("cycle"), "{error}");
}

#[tokio::test]
async fn a_tracking_backend_is_never_probed_and_follows_its_target_across_pools() {
    let a = HealthBackend::start("a", HealthAnswer::new(200, "")).await;
    // b and c would fail every probe: they are never probed, so they stay UP with a.
    let b = HealthBackend::start("b", HealthAnswer::new(500, "")).await;
    let c = HealthBackend::start("c", HealthAnswer::new(500, "")).await;
    let text = format!(
        "[[listeners]]\naddress = \"127.0.0.1:0\"\n[[listeners.routes]]\npool = \"web\"\n\n[pools.web]\nbackends = [\
         {{ name = \"a\", address = \"{}\" }}, {{ name = \"b\", address = \"{}\", track = \"a\" }}]\n\
         [pools.web.active]\ninterval = \"30ms\"\ntimeout = \"500ms\"\nfall = 2\n\
         [pools.api]\nbackends = [{{ name = \"c\", address = \"{}\", track = \"web/a\" }}]\n\
         [pools.api.active]\ninterval = \"30ms\"\n",
        a.addr, b.addr, c.addr
    );
    let (balancer, mut rx) = start(&text).await;
    let web = balancer.pool("web").unwrap();
    let api = balancer.pool("api").unwrap();
    wait_until("a probed a few times", || a.probes().len() >= 3).await;
    assert_eq!((web.verdict(1), api.verdict(0)), (State::Up, State::Up));
    a.answer(HealthAnswer::new(500, ""));
    wait_for(&mut rx, "b DOWN", |e| {
        transition_of(e, "b", State::Down).is_some()
    })
    .await;
    wait_until("c DOWN", || api.verdict(0) == State::Down).await;
    let sentence = explain(&web, 1);
    assert!(
        sentence.contains("tracks web/a, whose active checks say DOWN"),
        "{sentence}"
    );
    a.answer(HealthAnswer::new(200, ""));
    wait_until("c back UP", || api.verdict(0) == State::Up).await;
    assert!(b.probes().is_empty() && c.probes().is_empty());
    balancer.shutdown(Duration::from_secs(1)).await;
}
