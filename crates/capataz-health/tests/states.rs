//! The eligibility states on simulated time: backups that take over and hand back,
//! maintenance (no probes, requalification after), drains a backend's health route asks for
//! (`disable_on_404`), and the minimum healthy share below which a pool fails open.

use std::time::Duration;

use capataz_health::rotation::{Event, OnBackups, StandingCause, StandingChange};
use capataz_health::{
    AllDown, BackupUse, Carried, Effective, Join, MinHealthy, Outcome, OverrideKind, Policy,
    ProbeResult, Role, Rotation, Settings, State, WhenAllDown,
};

const S: Duration = Duration::from_secs(1);
const OK: Outcome = Outcome::Status(200);
const BAD: Outcome = Outcome::Status(500);
const GONE: Outcome = Outcome::Status(404);

fn new() -> Join {
    Join::New {
        initial: State::Up,
        warm_up: false,
    }
}

/// A rotation over `roles`, every backend UP, with the default settings (rise 2, fall 3).
fn rotation(policy: Policy, roles: &[Role]) -> Rotation {
    Rotation::with_roles(
        Settings::default(),
        policy,
        roles.iter().map(|&role| (1, new(), role)),
        Duration::ZERO,
    )
}

fn events(rotation: &mut Rotation) -> Vec<Event> {
    std::iter::from_fn(|| rotation.poll_event()).collect()
}

/// What each event is, in order, in a word: enough to pin causal order.
fn kinds(events: &[Event]) -> Vec<String> {
    events
        .iter()
        .map(|e| match e {
            Event::Transition(t) => format!("{}:{}", t.backend, t.to),
            Event::ActiveChange(c) => format!("active:{}", c.backend),
            Event::Override(o) => format!("override:{}:{}", o.backend, o.to),
            Event::AllDown { applied, .. } => format!("all_down:{}", applied.policy()),
            Event::Recovered { .. } => "recovered".into(),
            Event::Backups { on: Some(on), .. } => format!("backups:{}x{}", on.first, on.serving),
            Event::Backups {
                on: None,
                to_primaries,
                ..
            } => format!("backups:off:{to_primaries}"),
            Event::Standing(s) => format!("standing:{}:{}", s.backend, s.to),
            Event::CloseTunnels { backend, .. } => format!("close_tunnels:{backend}"),
            Event::Agent(a) => format!("agent:{}:{}", a.backend, a.to),
            Event::Shedding(s) => format!("shedding:{}", s.backend),
        })
        .collect()
}

fn fail(rotation: &mut Rotation, backend: usize, at: Duration) {
    for _ in 0..3 {
        rotation.handle_probe(backend, BAD, at);
    }
}

fn pass(rotation: &mut Rotation, backend: usize, at: Duration) {
    for _ in 0..2 {
        rotation.handle_probe(backend, OK, at);
    }
}

const P: Role = Role::Primary;
const B: Role = Role::Backup;

#[test]
fn backups_take_over_when_no_primary_is_in_rotation_and_hand_back() {
    let mut r = rotation(Policy::default(), &[P, B, P, B]);
    assert_eq!(r.eligible(S).backends, [0, 2], "backups stand by");
    assert_eq!(events(&mut r), []);
    fail(&mut r, 0, S);
    assert_eq!(r.eligible(S).backends, [2]);
    fail(&mut r, 2, 2 * S);
    assert_eq!(kinds(&events(&mut r)), ["0:DOWN", "2:DOWN", "backups:1x1"]);
    assert_eq!(
        r.on_backups(),
        Some(OnBackups {
            first: 1,
            serving: 1
        })
    );
    let eligible = r.eligible(2 * S);
    assert_eq!(eligible.backends, [1], "the first backup only, by default");
    assert!(!eligible.all_down);
    // The first backup goes down: the next one takes over, and says so.
    fail(&mut r, 1, 3 * S);
    assert_eq!(kinds(&events(&mut r)), ["1:DOWN", "backups:3x1"]);
    assert_eq!(r.eligible(3 * S).backends, [3]);
    // A primary comes back: the backups hand back.
    pass(&mut r, 2, 4 * S);
    assert_eq!(kinds(&events(&mut r)), ["2:UP", "backups:off:true"]);
    assert_eq!(r.eligible(4 * S).backends, [2]);
    assert_eq!(r.on_backups(), None);
}

#[test]
fn every_backup_in_rotation_serves_with_backups_all() {
    let policy = Policy {
        backups: BackupUse::All,
        ..Policy::default()
    };
    let mut r = rotation(policy, &[P, B, B, B]);
    r.set_override(2, Some(OverrideKind::Drain), None, S);
    fail(&mut r, 0, 2 * S);
    assert_eq!(
        kinds(&events(&mut r)),
        ["override:2:DRAINING", "0:DOWN", "backups:1x2"]
    );
    assert_eq!(r.eligible(2 * S).backends, [1, 3]);
}

/// What a backups event carries is what the snapshot built right after it serves: the runtime
/// names them from the event alone.
#[test]
fn a_backups_event_names_the_backups_serving_at_its_time() {
    let serving = |events: Vec<Event>| -> Vec<Vec<usize>> {
        events
            .into_iter()
            .filter_map(|e| match e {
                Event::Backups { serving, .. } => Some(serving),
                _ => None,
            })
            .collect()
    };
    let all = Policy {
        backups: BackupUse::All,
        ..Policy::default()
    };
    let mut r = rotation(all, &[P, B, B, B]);
    r.set_override(2, Some(OverrideKind::Drain), None, S);
    fail(&mut r, 0, 2 * S);
    assert_eq!(serving(events(&mut r)), [vec![1, 3]]);
    assert_eq!(r.eligible(2 * S).backends, [1, 3]);
    // Each change of who serves names its own set: the first backup leaves, then the drained
    // one is cleared; the primary's return hands back with none.
    fail(&mut r, 1, 3 * S);
    assert_eq!(serving(events(&mut r)), [vec![3]]);
    r.set_override(2, None, None, 4 * S);
    assert_eq!(serving(events(&mut r)), [vec![2, 3]]);
    pass(&mut r, 0, 5 * S);
    assert_eq!(serving(events(&mut r)), [Vec::<usize>::new()]);

    let mut r = rotation(Policy::default(), &[P, B, B]);
    fail(&mut r, 0, S);
    assert_eq!(serving(events(&mut r)), [vec![1]], "the first backup only");
}

#[test]
fn the_all_down_policy_applies_only_when_the_backups_are_out_too() {
    let mut r = rotation(Policy::default(), &[P, B]);
    fail(&mut r, 0, S);
    assert_eq!(kinds(&events(&mut r)), ["0:DOWN", "backups:1x1"]);
    assert_eq!(r.all_down(), None);
    fail(&mut r, 1, 2 * S);
    assert_eq!(
        kinds(&events(&mut r)),
        ["1:DOWN", "backups:off:false", "all_down:fail_open"]
    );
    assert_eq!(r.all_down(), Some(AllDown::FailOpen { backends: 2, of: 2 }));
    let eligible = r.eligible(2 * S);
    assert_eq!(
        eligible.backends,
        [0, 1],
        "fail-open spreads over backups too"
    );
    assert!(eligible.all_down);
    // The backup comes back first: the pool recovers onto it.
    pass(&mut r, 1, 3 * S);
    assert_eq!(kinds(&events(&mut r)), ["1:UP", "recovered", "backups:1x1"]);
    // With reject, the pool rejects only once the backups are out too.
    let policy = Policy {
        when_all_down: WhenAllDown::Reject,
        ..Policy::default()
    };
    let mut r = rotation(policy, &[P, B]);
    fail(&mut r, 0, S);
    assert_eq!(r.eligible(S).backends, [1]);
    fail(&mut r, 1, S);
    assert_eq!(r.all_down(), Some(AllDown::Reject));
    assert_eq!(r.eligible(S).backends, Vec::<usize>::new());
}

#[test]
fn a_forced_up_backup_still_waits_for_the_primaries_to_be_out() {
    let mut r = rotation(Policy::default(), &[P, B]);
    r.set_override(1, Some(OverrideKind::Up), None, S);
    assert_eq!(r.eligible(S).backends, [0]);
    assert_eq!(r.role(1), Role::Backup);
}

#[test]
fn maintenance_stops_probes_and_needs_rise_passing_probes_after() {
    let mut r = rotation(Policy::default(), &[P, P]);
    assert!(r.wants_probes(0));
    let state = r.set_override(0, Some(OverrideKind::Maintenance), None, S);
    assert_eq!(state, Effective::Maintenance);
    assert!(!r.wants_probes(0), "no probes in maintenance");
    assert_eq!(r.eligible(S).backends, [1]);
    // A probe that was already under way when maintenance began changes nothing.
    let before = *r.pool().backend(0);
    assert_eq!(r.handle_probe(0, BAD, 2 * S), ProbeResult::Fail);
    assert_eq!(
        *r.pool().backend(0),
        before,
        "no streak moves in maintenance"
    );
    events(&mut r);
    // Leaving maintenance: probes again, but no traffic before two passes in a row.
    assert_eq!(
        r.set_override(0, None, None, 3 * S),
        Effective::Requalifying
    );
    assert!(r.wants_probes(0));
    assert_eq!(r.requalifying(0), Some((0, 2)));
    assert_eq!(r.eligible(3 * S).backends, [1]);
    r.handle_probe(0, OK, 4 * S);
    assert_eq!(r.requalifying(0), Some((1, 2)));
    r.handle_probe(0, BAD, 5 * S);
    assert_eq!(r.requalifying(0), Some((0, 2)), "a failure starts over");
    r.handle_probe(0, OK, 6 * S);
    assert_eq!(r.eligible(6 * S).backends, [1]);
    r.handle_probe(0, OK, 7 * S);
    assert_eq!(r.requalifying(0), None);
    assert_eq!(r.effective(0), Effective::Up);
    assert_eq!(r.eligible(7 * S).backends, [0, 1]);
    let all = events(&mut r);
    assert_eq!(
        kinds(&all),
        ["override:0:REQUALIFYING", "standing:0:UP"],
        "the verdict never changed: no transition"
    );
    assert_eq!(
        all[1],
        Event::Standing(StandingChange {
            backend: 0,
            from: Effective::Requalifying,
            to: Effective::Up,
            cause: StandingCause::Requalified { passes: 2 },
            at: 7 * S,
        })
    );
}

#[test]
fn maintenance_lapsing_also_requalifies_and_the_pass_count_is_configurable() {
    let policy = Policy {
        requalify_passes: Some(3),
        ..Policy::default()
    };
    let mut r = rotation(policy, &[P, P]);
    r.set_override(0, Some(OverrideKind::Maintenance), Some(10 * S), S);
    assert_eq!(r.poll_timeout(), Some(11 * S));
    r.handle_timeout(11 * S);
    assert_eq!(r.effective(0), Effective::Requalifying);
    assert_eq!(r.requalifying(0), Some((0, 3)));
    for at in 12..14 {
        r.handle_probe(0, OK, at * S);
    }
    assert_eq!(r.effective(0), Effective::Requalifying);
    r.handle_probe(0, OK, 14 * S);
    assert_eq!(r.effective(0), Effective::Up);
    // Some(0): no probes to wait for (a pool without active checks).
    let policy = Policy {
        requalify_passes: Some(0),
        ..Policy::default()
    };
    let mut r = rotation(policy, &[P]);
    r.set_override(0, Some(OverrideKind::Maintenance), None, S);
    assert_eq!(r.set_override(0, None, None, 2 * S), Effective::Up);
}

#[test]
fn a_pool_whose_backends_are_all_in_maintenance_or_requalifying_rejects_and_says_why() {
    let mut r = rotation(Policy::default(), &[P, P]);
    r.set_override(0, Some(OverrideKind::Maintenance), None, S);
    r.set_override(1, Some(OverrideKind::Maintenance), None, S);
    r.set_override(1, None, None, 2 * S);
    assert_eq!(
        r.all_down(),
        Some(AllDown::NoneToFailOpen {
            overridden: 1,
            unproven: 0,
            held: 1
        })
    );
    assert_eq!(
        r.all_down().map(|a| a.to_string()).unwrap_or_default(),
        "rejecting requests with 503: fail_open has no backend to spread traffic over \
         (1 under a manual override, 0 never proven healthy, 1 requalifying, draining itself or \
         held by its agent)"
    );
}

fn drains() -> Policy {
    Policy {
        disable_on_404: true,
        ..Policy::default()
    }
}

#[test]
fn a_404_on_the_health_route_drains_without_touching_the_streaks() {
    let mut r = rotation(drains(), &[P, P]);
    r.handle_probe(0, BAD, S);
    let before = *r.pool().backend(0);
    assert_eq!(before.active.fail_streak, 1);
    assert_eq!(r.handle_probe(0, GONE, 2 * S), ProbeResult::Drain);
    assert_eq!(
        *r.pool().backend(0),
        before,
        "a drain request moves no streak"
    );
    assert_eq!(r.pool().verdict(0), State::Up, "drained, not DOWN");
    assert_eq!(r.effective(0), Effective::SelfDraining);
    assert_eq!(r.eligible(2 * S).backends, [1]);
    // More 404s: still drained, nothing new to say, still no streak.
    for at in 3..10 {
        assert_eq!(r.handle_probe(0, GONE, at * S), ProbeResult::Drain);
    }
    assert_eq!(*r.pool().backend(0), before);
    // One passing probe brings it back at once (rise is 2).
    assert_eq!(r.handle_probe(0, OK, 10 * S), ProbeResult::Pass);
    assert_eq!(r.effective(0), Effective::Up);
    assert_eq!(r.eligible(10 * S).backends, [0, 1]);
    let all = events(&mut r);
    assert_eq!(kinds(&all), ["standing:0:SELF_DRAINING", "standing:0:UP"]);
    assert!(matches!(
        all[1],
        Event::Standing(StandingChange {
            cause: StandingCause::DrainEnded { last: OK },
            ..
        })
    ));
}

#[test]
fn a_404_is_a_plain_failure_without_disable_on_404() {
    let mut r = rotation(Policy::default(), &[P]);
    assert_eq!(r.handle_probe(0, GONE, S), ProbeResult::Fail);
    assert_eq!(r.pool().backend(0).active.fail_streak, 1);
}

#[test]
fn a_down_backend_that_asks_for_a_drain_still_needs_its_rise() {
    let mut r = rotation(drains(), &[P, P]);
    fail(&mut r, 0, S);
    r.handle_probe(0, GONE, 2 * S);
    assert_eq!(r.effective(0), Effective::Down);
    r.handle_probe(0, OK, 3 * S);
    assert_eq!(r.effective(0), Effective::Down, "one pass of rise 2");
    r.handle_probe(0, OK, 4 * S);
    assert_eq!(r.effective(0), Effective::Up);
    // Fail-open never sends traffic to a backend that asked for a drain.
    let mut r = rotation(drains(), &[P, P]);
    fail(&mut r, 1, S);
    r.handle_probe(0, GONE, S);
    assert_eq!(r.all_down(), Some(AllDown::FailOpen { backends: 1, of: 2 }));
    assert_eq!(r.eligible(S).backends, [1]);
}

fn min_healthy(count: u32, percent: u8) -> Policy {
    Policy {
        min_healthy: MinHealthy { count, percent },
        ..Policy::default()
    }
}

#[test]
fn the_pool_fails_open_below_its_minimum_healthy_count() {
    let mut r = rotation(min_healthy(2, 0), &[P, P, P, P]);
    fail(&mut r, 0, S);
    fail(&mut r, 1, S);
    assert_eq!(r.all_down(), None, "2 of 4 UP is enough");
    fail(&mut r, 2, 2 * S);
    let applied = AllDown::BelowMinHealthy {
        up: 1,
        needed: 2,
        threshold: MinHealthy {
            count: 2,
            percent: 0,
        },
        backends: 4,
        primaries: 4,
    };
    assert_eq!(r.all_down(), Some(applied));
    assert_eq!(
        kinds(&events(&mut r)),
        ["0:DOWN", "1:DOWN", "2:DOWN", "all_down:fail_open"]
    );
    let eligible = r.eligible(2 * S);
    assert_eq!(eligible.backends, [0, 1, 2, 3]);
    assert!(eligible.all_down);
    assert_eq!(
        applied.to_string(),
        "failing open below its minimum healthy share: 1 of 4 primaries UP, needs 2 \
         (min_healthy = 2); spreading traffic over 4 of them (those UP and those proven healthy \
         once and held out by health checks only)"
    );
    assert_eq!(applied.headline(), "has too few UP backends");
    // The last one goes down too: the plain all-down policy, reported again.
    fail(&mut r, 3, 3 * S);
    assert_eq!(kinds(&events(&mut r)), ["3:DOWN", "all_down:fail_open"]);
    assert_eq!(r.all_down(), Some(AllDown::FailOpen { backends: 4, of: 4 }));
    pass(&mut r, 0, 4 * S);
    pass(&mut r, 1, 4 * S);
    assert_eq!(
        kinds(&events(&mut r)),
        ["0:UP", "all_down:fail_open", "1:UP", "recovered"]
    );
    assert_eq!(r.eligible(4 * S).backends, [0, 1]);
}

#[test]
fn the_pool_fails_open_below_its_minimum_healthy_percentage_rounded_up() {
    assert_eq!(
        MinHealthy {
            count: 0,
            percent: 50
        }
        .needed(5),
        3
    );
    assert_eq!(
        MinHealthy {
            count: 4,
            percent: 50
        }
        .needed(5),
        4
    );
    assert_eq!(
        MinHealthy {
            count: 9,
            percent: 0
        }
        .needed(5),
        5,
        "capped"
    );
    assert_eq!(MinHealthy::default().needed(5), 1, "today's rule");
    let mut r = rotation(min_healthy(0, 50), &[P, P, P, B]);
    fail(&mut r, 0, S);
    assert_eq!(r.all_down(), None, "2 of 3 UP, 2 needed");
    fail(&mut r, 1, S);
    assert!(matches!(
        r.all_down(),
        Some(AllDown::BelowMinHealthy {
            up: 1,
            needed: 2,
            backends: 3,
            primaries: 3,
            ..
        })
    ));
    assert_eq!(r.eligible(S).backends, [0, 1, 2], "backups stay out");
}

#[test]
fn a_reject_pool_ignores_the_threshold_while_a_primary_is_in_rotation() {
    let policy = Policy {
        when_all_down: WhenAllDown::Reject,
        min_healthy: MinHealthy {
            count: 3,
            percent: 0,
        },
        ..Policy::default()
    };
    let mut r = rotation(policy, &[P, P, P]);
    fail(&mut r, 0, S);
    assert_eq!(r.all_down(), None);
    assert_eq!(r.eligible(S).backends, [1, 2]);
}

#[test]
fn close_tunnels_follows_a_verdict_going_down_only_when_asked() {
    let mut r = rotation(Policy::default(), &[P, P]);
    fail(&mut r, 0, S);
    assert_eq!(kinds(&events(&mut r)), ["0:DOWN"]);
    let policy = Policy {
        close_tunnels_on_down: true,
        ..Policy::default()
    };
    let mut r = rotation(policy, &[P, P]);
    r.set_override(0, Some(OverrideKind::Down), None, S);
    fail(&mut r, 1, S);
    pass(&mut r, 1, 2 * S);
    assert_eq!(
        kinds(&events(&mut r)),
        [
            "override:0:FORCED_DOWN",
            "1:DOWN",
            "close_tunnels:1",
            "all_down:fail_open",
            "1:UP",
            "recovered"
        ],
        "a verdict going DOWN closes tunnels; an override does not"
    );
}

#[test]
fn a_reload_carries_requalification_and_a_requested_drain() {
    let mut r = rotation(drains(), &[P, P]);
    r.set_override(0, Some(OverrideKind::Maintenance), None, S);
    r.set_override(0, None, None, S);
    r.handle_probe(1, GONE, S);
    let carried: Vec<Carried> = (0..2).map(|i| r.carry(i)).collect();
    assert_eq!(carried[0].requalify, Some(0));
    assert!(carried[1].self_drained);
    let next = Rotation::with_roles(
        Settings::default(),
        drains(),
        carried.iter().map(|&c| (1, Join::Kept(c), P)),
        2 * S,
    );
    assert_eq!(next.effective(0), Effective::Requalifying);
    assert_eq!(next.effective(1), Effective::SelfDraining);
    // A pool that no longer drains on 404 forgets the request.
    let next = Rotation::with_roles(
        Settings::default(),
        Policy::default(),
        carried.iter().map(|&c| (1, Join::Kept(c), P)),
        2 * S,
    );
    assert_eq!(next.effective(1), Effective::Up);
    // Nor does one without probes keep a backend requalifying: nothing would end it.
    let no_probes = Policy {
        requalify_passes: Some(0),
        ..Policy::default()
    };
    let next = Rotation::with_roles(
        Settings::default(),
        no_probes,
        carried.iter().map(|&c| (1, Join::Kept(c), P)),
        2 * S,
    );
    assert_eq!(next.effective(0), Effective::Up);
}

#[test]
fn replay_puts_a_backend_in_maintenance_and_it_requalifies_with_rise() {
    let mut replay = capataz_health::Replay::new(Settings::default());
    let mut out = Vec::new();
    let script = "POOL a b
        OVERRIDE a maintenance
        PROBE a TIMEOUT
        PROBE a TIMEOUT
        PROBE a TIMEOUT
        STATUS
        OVERRIDE a clear
        ELIGIBLE
        PROBE a HTTP/1.1 200 OK
        ELIGIBLE
        PROBE a HTTP/1.1 200 OK
        ELIGIBLE";
    for line in script.lines() {
        replay.run_line(line.trim_start().as_bytes(), &mut out, None);
    }
    assert_eq!(
        String::from_utf8_lossy(&out),
        "OK\nMAINTENANCE\nFAIL\nFAIL\nFAIL\na UP\nb UP\nREQUALIFYING\nb\nPASS\nb\nPASS\na,b\n",
        "probes in maintenance change nothing; two passes (rise) requalify"
    );
}

#[derive(Clone, Debug)]
enum Op {
    Probe(usize, u16),
    Traffic(usize, bool),
    Override(usize, Option<OverrideKind>, Option<u64>),
    Wait(u64),
}

fn op() -> impl proptest::strategy::Strategy<Value = Op> {
    use proptest::prelude::*;
    let kind = prop_oneof![
        Just(None),
        Just(Some(OverrideKind::Up)),
        Just(Some(OverrideKind::Down)),
        Just(Some(OverrideKind::Drain)),
        Just(Some(OverrideKind::Maintenance)),
    ];
    prop_oneof![
        (0..5usize, prop_oneof![Just(200u16), Just(404), Just(500)])
            .prop_map(|(b, code)| Op::Probe(b, code)),
        (0..5usize, any::<bool>()).prop_map(|(b, ok)| Op::Traffic(b, ok)),
        (
            0..5usize,
            kind,
            proptest::option::of(prop_oneof![0..100u64, Just(u64::MAX)])
        )
            .prop_map(|(b, k, ttl)| Op::Override(b, k, ttl)),
        (0..60u64).prop_map(Op::Wait),
    ]
}

proptest::proptest! {
    /// Whatever happens to a pool of three primaries and two backups: a backup serves only
    /// while no primary is in rotation; no backend in maintenance, requalifying or drained on
    /// request gets traffic (unless forced up); a drain request or a probe in maintenance moves
    /// no streak; the pool fails open below its threshold only with some primary in rotation;
    /// and the backups events agree with the state.
    #[test]
    fn state_invariants_hold(
        all in proptest::bool::ANY,
        reject in proptest::bool::ANY,
        count in 0..4u32,
        percent in 0..101u8,
        ops in proptest::collection::vec(op(), 0..200),
    ) {
        let policy = Policy {
            when_all_down: if reject { WhenAllDown::Reject } else { WhenAllDown::FailOpen },
            backups: if all { BackupUse::All } else { BackupUse::First },
            min_healthy: MinHealthy { count, percent },
            disable_on_404: true,
            ..Policy::default()
        };
        let mut r = rotation(policy, &[P, B, P, B, P]);
        let mut now = Duration::ZERO;
        let mut on_backups = false;
        for op in ops {
            match op {
                Op::Probe(b, code) => {
                    let before = *r.pool().backend(b);
                    let maintenance = r.effective(b) == Effective::Maintenance;
                    let result = r.handle_probe(b, Outcome::Status(code), now);
                    if maintenance || result == ProbeResult::Drain {
                        proptest::prop_assert_eq!(*r.pool().backend(b), before);
                    }
                    proptest::prop_assert_eq!(
                        result == ProbeResult::Drain,
                        code == 404 && !maintenance
                    );
                }
                Op::Traffic(b, ok) => {
                    r.handle_traffic(b, if ok { OK } else { BAD }, now);
                }
                Op::Override(b, kind, ttl) => {
                    r.set_override(b, kind, ttl.map(Duration::from_secs), now);
                }
                Op::Wait(secs) => {
                    now += Duration::from_secs(secs);
                    r.handle_timeout(now);
                }
            }
            while let Some(event) = r.poll_event() {
                if let Event::Backups { on, .. } = event {
                    on_backups = on.is_some();
                }
            }
            proptest::prop_assert_eq!(on_backups, r.on_backups().is_some());
            let primaries_in = [0, 2, 4].iter().filter(|&&i| r.in_rotation(i)).count();
            let backups_in = [1, 3].iter().filter(|&&i| r.in_rotation(i)).count();
            let eligible = r.eligible(now);
            for &b in &eligible.backends {
                if r.role(b) == Role::Backup && !eligible.all_down {
                    proptest::prop_assert_eq!(primaries_in, 0, "backup {} serves beside a primary", b);
                }
                if !r.in_rotation(b) {
                    proptest::prop_assert!(eligible.all_down);
                    proptest::prop_assert!(matches!(r.effective(b), Effective::Down), "{:?}", r.effective(b));
                }
            }
            match r.all_down() {
                Some(AllDown::BelowMinHealthy { up, needed, .. }) => {
                    proptest::prop_assert!(!reject);
                    proptest::prop_assert!(up > 0 && up < needed);
                    proptest::prop_assert_eq!(up, primaries_in);
                }
                Some(_) => proptest::prop_assert_eq!(primaries_in + backups_in, 0),
                None => proptest::prop_assert!(!eligible.backends.is_empty()),
            }
            if primaries_in > 0 {
                proptest::prop_assert!(r.on_backups().is_none());
            } else if backups_in > 0 {
                let expected = if all { backups_in } else { 1 };
                proptest::prop_assert_eq!(eligible.backends.len(), expected);
            }
        }
    }
}
