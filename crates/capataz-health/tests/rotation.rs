//! Eligibility on simulated time: overrides with expiry, slow start, the all-down policy and
//! its fail-open set, gating of never-proven backends, and the one timer.

use std::time::Duration;

use capataz_health::rotation::{ActiveChange, Event, OverrideCause, OverrideChange};
use capataz_health::{
    AllDown, Effective, EjectionPolicy, Join, Outcome, OverrideKind, Policy, Rotation, Settings,
    State, WhenAllDown,
};
use proptest::prelude::*;

const S: Duration = Duration::from_secs(1);
const OK: Outcome = Outcome::Status(200);
const BAD: Outcome = Outcome::Status(500);

fn settings(initial: State) -> Settings {
    Settings {
        initial,
        ejection: Some(EjectionPolicy {
            base: 30 * S,
            max: 300 * S,
        }),
        ..Settings::default()
    }
}

fn fail_open() -> Policy {
    Policy::default()
}

fn new(initial: State) -> Join {
    Join::New {
        initial,
        warm_up: false,
    }
}

fn rotation(initial: State, policy: Policy, n: usize) -> Rotation {
    Rotation::new(
        settings(initial),
        policy,
        (0..n).map(|_| (1, new(initial))),
        Duration::ZERO,
    )
}

fn events(rotation: &mut Rotation) -> Vec<Event> {
    std::iter::from_fn(|| rotation.poll_event()).collect()
}

fn probes(rotation: &mut Rotation, backend: usize, outcome: Outcome, n: u32, at: Duration) {
    for _ in 0..n {
        rotation.handle_probe(backend, outcome, at);
    }
}

fn kinds(events: &[Event]) -> Vec<&'static str> {
    events
        .iter()
        .map(|e| match e {
            Event::Transition(t) if t.to == State::Up => "up",
            Event::Transition(_) => "down",
            Event::ActiveChange(_) => "active",
            Event::Override(_) => "override",
            Event::AllDown { applied, .. } => applied.policy(),
            Event::Recovered { .. } => "recovered",
            Event::Agent(_) => "agent",
            Event::Shedding(_) => "shedding",
            Event::Backups { .. } | Event::Standing(_) | Event::CloseTunnels { .. } => {
                unreachable!("no backup, no drain, no tunnel closing here")
            }
        })
        .collect()
}

/// Regression: with `initial = "down"` and the default `fail_open`, requests went to
/// backends that had never passed a probe. Fail-open now spreads only over proven backends, and
/// a pool with none rejects.
#[test]
fn fail_open_spreads_only_over_backends_proven_healthy() {
    let mut r = rotation(State::Down, fail_open(), 3);
    assert_eq!(
        events(&mut r),
        [Event::AllDown {
            applied: AllDown::NoneToFailOpen {
                overridden: 0,
                unproven: 3,
                held: 0,
            },
            at: Duration::ZERO
        }]
    );
    let eligible = r.eligible(Duration::ZERO);
    assert!(eligible.all_down && eligible.backends.is_empty());

    probes(&mut r, 1, OK, 2, S);
    assert_eq!(kinds(&events(&mut r)), ["up", "recovered"]);
    assert_eq!(r.eligible(S).backends, [1]);

    probes(&mut r, 1, BAD, 3, 2 * S);
    let after = events(&mut r);
    assert_eq!(kinds(&after), ["down", "fail_open"]);
    assert_eq!(
        after[1],
        Event::AllDown {
            applied: AllDown::FailOpen { backends: 1, of: 3 },
            at: 2 * S
        }
    );
    let eligible = r.eligible(2 * S);
    assert!(eligible.all_down);
    assert_eq!(eligible.backends, [1], "never-proven backends stay out");
}

/// Regression: a gated new backend in a pool whose others are DOWN got fail-open
/// traffic before its first probe.
#[test]
fn gated_backend_gets_no_fail_open_traffic_while_the_others_are_down() {
    let mut before = rotation(State::Up, fail_open(), 2);
    probes(&mut before, 0, BAD, 3, S);
    probes(&mut before, 1, BAD, 3, S);
    assert_eq!(
        before.all_down(),
        Some(AllDown::FailOpen { backends: 2, of: 2 })
    );

    let joins = [
        (1, Join::Kept(before.carry(0))),
        (1, Join::Kept(before.carry(1))),
        (1, new(State::Down)),
    ];
    let mut after = Rotation::new(settings(State::Up), fail_open(), joins, 2 * S);
    assert_eq!(after.eligible(2 * S).backends, [0, 1]);
    assert!(!after.is_proven(2));
    assert_eq!(
        events(&mut after),
        [Event::AllDown {
            applied: AllDown::FailOpen { backends: 2, of: 3 },
            at: 2 * S
        }]
    );

    // A pool added by a reload, every backend gated: nothing to fail open to.
    let gated = Rotation::new(settings(State::Up), fail_open(), [(1, new(State::Down))], S);
    assert_eq!(
        gated.all_down(),
        Some(AllDown::NoneToFailOpen {
            overridden: 0,
            unproven: 1,
            held: 0,
        })
    );
    assert!(gated.eligible(S).backends.is_empty());
}

/// Regression: when every backend was overridden down or drained, requests got 503
/// but the `all_down` event said `fail_open` and came before the override that caused it.
#[test]
fn all_overridden_pool_reports_reject_after_the_override() {
    let mut r = rotation(State::Up, fail_open(), 2);
    assert!(events(&mut r).is_empty());
    r.set_override(0, Some(OverrideKind::Down), None, S);
    r.set_override(1, Some(OverrideKind::Drain), None, 2 * S);
    let events = events(&mut r);
    assert_eq!(kinds(&events), ["override", "override", "reject"]);
    assert_eq!(
        events[2],
        Event::AllDown {
            applied: AllDown::NoneToFailOpen {
                overridden: 2,
                unproven: 0,
                held: 0,
            },
            at: 2 * S
        }
    );
    assert!(r.eligible(2 * S).backends.is_empty());
    assert_eq!(
        AllDown::NoneToFailOpen {
            overridden: 2,
            unproven: 0,
            held: 0,
        }
        .to_string(),
        "rejecting requests with 503: fail_open has no backend to spread traffic over \
         (2 under a manual override, 0 never proven healthy)"
    );
}

#[test]
fn draining_the_fail_open_set_changes_the_policy_applied() {
    let mut r = rotation(State::Up, fail_open(), 2);
    probes(&mut r, 0, BAD, 3, S);
    probes(&mut r, 1, BAD, 3, S);
    assert_eq!(kinds(&events(&mut r)), ["down", "down", "fail_open"]);
    r.set_override(0, Some(OverrideKind::Drain), None, 2 * S);
    assert_eq!(kinds(&events(&mut r)), ["override", "fail_open"]);
    assert_eq!(r.eligible(2 * S).backends, [1]);
    r.set_override(1, Some(OverrideKind::Down), None, 3 * S);
    assert_eq!(kinds(&events(&mut r)), ["override", "reject"]);
    r.set_override(1, Some(OverrideKind::Up), None, 4 * S);
    assert_eq!(kinds(&events(&mut r)), ["override", "recovered"]);
    assert_eq!(r.eligible(4 * S).backends, [1]);
    assert!(!r.eligible(4 * S).all_down);
}

#[test]
fn reject_policy_sends_nothing_and_says_reject() {
    let policy = Policy {
        when_all_down: WhenAllDown::Reject,
        slow_start: None,
        ..Policy::default()
    };
    let mut r = rotation(State::Up, policy, 2);
    probes(&mut r, 0, BAD, 3, S);
    probes(&mut r, 1, BAD, 3, S);
    let events = events(&mut r);
    assert_eq!(kinds(&events), ["down", "down", "reject"]);
    assert!(matches!(
        events[2],
        Event::AllDown {
            applied: AllDown::Reject,
            ..
        }
    ));
    assert!(r.eligible(S).backends.is_empty());
}

#[test]
fn override_ttl_lapses_at_its_time_and_health_decides_again() {
    let mut r = rotation(State::Up, fail_open(), 2);
    let state = r.set_override(1, Some(OverrideKind::Down), Some(10 * S), S);
    assert_eq!(state, Effective::ForcedDown);
    assert_eq!(r.poll_timeout(), Some(11 * S));
    r.handle_timeout(10 * S);
    assert_eq!(kinds(&events(&mut r)), ["override"]);
    assert_eq!(r.eligible(10 * S).backends, [0]);
    r.handle_timeout(11 * S);
    assert_eq!(
        events(&mut r),
        [Event::Override(OverrideChange {
            backend: 1,
            kind: None,
            ttl: None,
            from: Effective::ForcedDown,
            to: Effective::Up,
            cause: OverrideCause::Lapsed,
            at: 11 * S,
        })]
    );
    assert_eq!(r.eligible(11 * S).backends, [0, 1]);
    assert_eq!(r.poll_timeout(), None);
}

/// Regression: a TTL of u64::MAX seconds overflowed the clock arithmetic.
#[test]
fn huge_override_ttl_saturates_and_never_lapses() {
    let mut r = rotation(State::Up, fail_open(), 1);
    r.set_override(0, Some(OverrideKind::Drain), Some(Duration::MAX), 5 * S);
    r.set_override(
        0,
        Some(OverrideKind::Drain),
        Some(Duration::from_secs(u64::MAX)),
        5 * S,
    );
    assert_eq!(r.override_of(0).and_then(|o| o.until), Some(Duration::MAX));
    r.handle_timeout(Duration::from_secs(u64::MAX / 2));
    assert_eq!(r.effective(0), Effective::Draining);
}

#[test]
fn one_poll_timeout_covers_ejections_overrides_and_ramps() {
    let policy = Policy {
        when_all_down: WhenAllDown::FailOpen,
        slow_start: Some(20 * S),
        ..Policy::default()
    };
    let mut r = rotation(State::Up, policy, 3);
    assert_eq!(r.poll_timeout(), None, "no ramp at start");
    // Ejection: 3 errors at 1 s, 30 s long.
    for _ in 0..3 {
        r.handle_traffic(0, BAD, S);
    }
    assert!(r.needs_traffic(0) && !r.needs_traffic(1));
    assert_eq!(r.poll_timeout(), Some(31 * S));
    r.set_override(1, Some(OverrideKind::Drain), Some(5 * S), 2 * S);
    assert_eq!(r.poll_timeout(), Some(7 * S));
    r.handle_timeout(7 * S);
    assert_eq!(r.poll_timeout(), Some(31 * S));
    r.handle_timeout(31 * S);
    // Back on probation and UP: it ramps, one step per second.
    assert_eq!(r.pool().verdict(0), State::Up);
    assert!(r.needs_traffic(0));
    assert_eq!(r.poll_timeout(), Some(32 * S));
    assert_eq!(r.weight_tenths(0, 31 * S), 1);
    assert_eq!(r.weight_tenths(0, 41 * S), 5);
    assert_eq!(r.weight_tenths(1, 41 * S), 10);
    r.handle_timeout(51 * S);
    assert_eq!(r.weight_tenths(0, 51 * S), 10);
    assert_eq!(r.poll_timeout(), None, "the ramp is over");
    let kinds = kinds(&events(&mut r));
    assert_eq!(kinds, ["down", "override", "override", "up"]);
}

#[test]
fn an_active_change_behind_an_ejection_is_reported_without_a_transition() {
    let mut r = rotation(State::Up, fail_open(), 2);
    for _ in 0..3 {
        r.handle_traffic(0, BAD, S);
    }
    events(&mut r);
    probes(&mut r, 0, BAD, 3, 2 * S);
    assert_eq!(
        events(&mut r),
        [Event::ActiveChange(ActiveChange {
            backend: 0,
            state: State::Down,
            streak: 3,
            last: BAD,
            at: 2 * S
        })]
    );
}

#[test]
fn a_backend_added_by_reload_warms_up_and_kept_ones_keep_their_ramp() {
    let policy = Policy {
        when_all_down: WhenAllDown::FailOpen,
        slow_start: Some(10 * S),
        ..Policy::default()
    };
    let joins = [
        (2, new(State::Up)),
        (
            2,
            Join::New {
                initial: State::Up,
                warm_up: true,
            },
        ),
    ];
    let r = Rotation::new(settings(State::Up), policy, joins, S);
    assert_eq!(r.weight_tenths(0, S), 20);
    assert_eq!(r.weight_tenths(1, S), 2);
    let kept = Rotation::new(
        settings(State::Up),
        policy,
        [(2, Join::Kept(r.carry(1)))],
        6 * S,
    );
    assert_eq!(kept.weight_tenths(0, 6 * S), 11);
    assert!(kept.is_proven(0));
}

#[derive(Clone, Debug)]
enum Op {
    Probe(usize, bool),
    Traffic(usize, bool),
    Override(usize, Option<OverrideKind>, Option<u64>),
    Wait(u64),
}

fn op() -> impl Strategy<Value = Op> {
    let kind = prop_oneof![
        Just(None),
        Just(Some(OverrideKind::Up)),
        Just(Some(OverrideKind::Down)),
        Just(Some(OverrideKind::Drain)),
    ];
    prop_oneof![
        (0..4usize, any::<bool>()).prop_map(|(b, ok)| Op::Probe(b, ok)),
        (0..4usize, any::<bool>()).prop_map(|(b, ok)| Op::Traffic(b, ok)),
        (
            0..4usize,
            kind,
            proptest::option::of(prop_oneof![0..100u64, Just(u64::MAX)])
        )
            .prop_map(|(b, k, ttl)| Op::Override(b, k, ttl)),
        (0..60u64).prop_map(Op::Wait),
    ]
}

proptest! {
    /// Whatever happens: fail-open never reaches a never-proven or overridden backend, the
    /// all-down events agree with the state, and no timer is ever left overdue.
    #[test]
    fn eligibility_invariants_hold(
        initial_down in any::<bool>(),
        reject in any::<bool>(),
        ops in proptest::collection::vec(op(), 0..200),
    ) {
        let initial = if initial_down { State::Down } else { State::Up };
        let policy = Policy {
            when_all_down: if reject { WhenAllDown::Reject } else { WhenAllDown::FailOpen },
            slow_start: Some(10 * S),
            ..Policy::default()
        };
        let mut r = rotation(initial, policy, 4);
        let mut now = Duration::ZERO;
        let mut all_down_seen = false;
        for op in ops {
            match op {
                Op::Probe(b, ok) => { r.handle_probe(b, if ok { OK } else { BAD }, now); }
                Op::Traffic(b, ok) => { r.handle_traffic(b, if ok { OK } else { BAD }, now); }
                Op::Override(b, kind, ttl) => {
                    r.set_override(b, kind, ttl.map(Duration::from_secs), now);
                }
                Op::Wait(secs) => {
                    now += Duration::from_secs(secs);
                    while let Some(due) = r.poll_timeout().filter(|&due| due <= now) {
                        r.handle_timeout(due);
                    }
                    r.handle_timeout(now);
                    prop_assert!(r.poll_timeout().is_none_or(|due| due > now));
                }
            }
            while let Some(event) = r.poll_event() {
                match event {
                    Event::AllDown { .. } => all_down_seen = true,
                    Event::Recovered { .. } => {
                        prop_assert!(all_down_seen);
                        all_down_seen = false;
                    }
                    _ => {}
                }
            }
            prop_assert_eq!(all_down_seen, r.all_down().is_some());
            let eligible = r.eligible(now);
            prop_assert_eq!(eligible.all_down, r.all_down().is_some());
            for &b in &eligible.backends {
                let in_rotation = r.in_rotation(b);
                prop_assert!(
                    in_rotation || (r.is_proven(b) && r.override_of(b).is_none()),
                    "backend {} gets traffic unproven or overridden", b
                );
                prop_assert!(!eligible.all_down || !in_rotation);
            }
            if !eligible.all_down {
                prop_assert!(!eligible.backends.is_empty());
            }
            if r.all_down().is_some_and(AllDown::rejects) {
                prop_assert!(eligible.backends.is_empty());
            }
        }
    }
}

/// Plays `script` through the replay protocol and compares everything it prints.
fn check_replay(settings: Settings, script: &str, expected: &str) {
    let mut replay = capataz_health::Replay::new(settings);
    let mut out = Vec::new();
    for line in script.lines() {
        replay.run_line(line.trim_start().as_bytes(), &mut out, None);
    }
    assert_eq!(String::from_utf8_lossy(&out), expected);
}

#[test]
fn replay_drives_time_and_overrides() {
    check_replay(
        Settings::default(),
        "POOL a b
         OVERRIDE a drain 100
         STATUS
         ELIGIBLE
         OVERRIDE b down
         ELIGIBLE
         HEALTHY
         WAIT 90
         ELIGIBLE
         WAIT 10
         ELIGIBLE
         OVERRIDE b clear
         OVERRIDE b up 18446744073709551615
         OVERRIDE b clear 5
         OVERRIDE c up
         WAIT
         WAIT -1
         ELIGIBLE now",
        "OK\nDRAINING\na UP\nb UP\nb\nFORCED_DOWN\nnone\na,b\nOK\nnone\nOK\na\nUP\nFORCED_UP\n\
         ERR OVERRIDE needs a backend, up|down|drain|clear, and optionally milliseconds\n\
         ERR OVERRIDE needs a backend, up|down|drain|clear, and optionally milliseconds\n\
         ERR WAIT needs a number of milliseconds\nERR WAIT needs a number of milliseconds\n\
         ERR ELIGIBLE takes no arguments\n",
    );
}

#[test]
fn replay_wait_ends_timed_ejections() {
    let settings = Settings {
        consecutive_errors: std::num::NonZeroU32::new(1).unwrap(),
        ejection: Some(EjectionPolicy {
            base: Duration::from_millis(50),
            max: Duration::from_millis(500),
        }),
        ..Settings::default()
    };
    // Without WAIT (as before these commands existed) the ejection never ends; WAIT ends it.
    check_replay(
        settings,
        "POOL a b
         OBSERVE a RESET
         HEALTHY
         WAIT 10
         HEALTHY
         WAIT 100
         HEALTHY",
        "OK\nERROR\nb\nOK\nb\nOK\na,b\n",
    );
}

/// A drained backend whose verdict is UP is out of rotation but listed as draining (it may
/// keep its sticky clients); once its verdict is DOWN, or when forced down or in maintenance,
/// it is not; when the drain is cleared it is back in rotation.
#[test]
fn a_draining_backend_is_listed_only_while_its_verdict_is_up() {
    let mut r = rotation(State::Up, fail_open(), 3);
    r.set_override(1, Some(OverrideKind::Drain), None, S);
    r.set_override(2, Some(OverrideKind::Down), None, S);
    let eligible = r.eligible(S);
    assert_eq!(eligible.backends, vec![0]);
    assert_eq!(eligible.draining, vec![1]);
    r.set_override(2, Some(OverrideKind::Maintenance), None, S);
    assert_eq!(r.eligible(S).draining, vec![1]);
    probes(&mut r, 1, BAD, 10, 2 * S);
    assert_eq!(r.effective(1), Effective::Draining);
    assert!(
        r.eligible(2 * S).draining.is_empty(),
        "DOWN: it serves nobody"
    );
    probes(&mut r, 1, OK, 10, 3 * S);
    assert_eq!(r.eligible(3 * S).draining, vec![1]);
    r.set_override(1, None, None, 4 * S);
    let eligible = r.eligible(4 * S);
    assert_eq!(eligible.backends, vec![0, 1]);
    assert!(eligible.draining.is_empty());
}
