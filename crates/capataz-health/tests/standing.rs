//! A backend's standing on simulated time: which rule decides it when several apply (the
//! precedence every report renders), what brings it back, since when, and the weight, which is
//! the one the picker gets from `eligible`.

use std::time::Duration;

use capataz_health::rotation::{Back, Cause, DownWhy, Probation, ProbesDown, Standing};
use capataz_health::{
    AgentReport, Effective, EjectionPolicy, Join, LoadShedding, Outcome, Override, OverrideKind,
    Policy, Reason, Role, Rotation, Settings, State,
};

const S: Duration = Duration::from_secs(1);
const OK: Outcome = Outcome::Status(200);
const BAD: Outcome = Outcome::Status(500);

/// rise 2, fall 3, three traffic errors eject for 30 s (then 60 s, ...).
fn settings() -> Settings {
    Settings {
        ejection: Some(EjectionPolicy {
            base: 30 * S,
            max: 300 * S,
        }),
        ..Settings::default()
    }
}

fn rotation(settings: Settings, policy: Policy, initial: &[State]) -> Rotation {
    Rotation::with_roles(
        settings,
        policy,
        initial.iter().map(|&initial| {
            (
                2,
                Join::New {
                    initial,
                    warm_up: false,
                },
                Role::Primary,
            )
        }),
        Duration::ZERO,
    )
}

fn agent(r: &mut Rotation, backend: usize, line: &str, at: Duration) {
    let report = AgentReport::parse(line.as_bytes()).expect("a valid agent line");
    r.handle_agent(backend, report, at);
}

fn probes(r: &mut Rotation, backend: usize, outcome: Outcome, n: u32, at: Duration) {
    for _ in 0..n {
        r.handle_probe(backend, outcome, at);
    }
}

fn traffic(r: &mut Rotation, backend: usize, outcome: Outcome, n: u32, at: Duration) {
    for _ in 0..n {
        r.handle_traffic(backend, outcome, at);
    }
}

/// The standing of `backend` at `at`, checked against what the rest of the engine says.
fn standing(r: &Rotation, backend: usize, at: Duration) -> Standing {
    let standing = r.standing(backend, at);
    assert_eq!(standing.effective, r.effective(backend));
    assert_eq!(standing.in_rotation(), r.in_rotation(backend));
    assert_eq!(
        standing.weight_tenths,
        r.eligible(at).member_weights[backend],
        "the weight is the picker's"
    );
    assert_eq!(standing.health, *r.pool().backend(backend));
    standing
}

#[test]
fn a_healthy_backend_is_up_in_rotation_since_it_joined() {
    let r = rotation(settings(), Policy::default(), &[State::Up]);
    let s = standing(&r, 0, 5 * S);
    assert_eq!(
        s.cause,
        Cause::Up {
            probation: None,
            ramping: false
        }
    );
    assert_eq!(s.back, Back::InRotation);
    assert_eq!((s.since, s.last_transition), (Duration::ZERO, None));
    assert_eq!((s.weight, s.weight_tenths), (2, 20));
}

#[test]
fn a_new_backend_is_never_proven_then_down_by_its_failed_probes() {
    let mut r = rotation(settings(), Policy::default(), &[State::Down]);
    let down = |why, has| {
        Cause::ProbesDown(ProbesDown {
            why,
            has,
            needs: 2,
            ends_ejection: false,
        })
    };
    assert_eq!(standing(&r, 0, S).cause, down(DownWhy::NeverProven, 0));
    r.handle_probe(0, OK, S);
    let s = standing(&r, 0, S);
    assert_eq!(s.cause, down(DownWhy::NeverProven, 1));
    assert_eq!(s.back, Back::Passes { has: 1, needs: 2 });
    r.handle_probe(0, OK, 2 * S);
    probes(&mut r, 0, BAD, 3, 3 * S);
    let s = standing(&r, 0, 3 * S);
    assert_eq!(
        s.cause,
        down(
            DownWhy::ProbesFailed {
                streak: 3,
                last: BAD,
                mismatch: None
            },
            0
        )
    );
    assert_eq!(s.since, 3 * S, "since the transition");
    let last = s.last_transition.expect("a transition to DOWN");
    assert_eq!((last.to, last.at), (State::Down, 3 * S));
}

#[test]
fn a_first_probe_backend_waits_for_its_first_probe() {
    let settings = Settings {
        first_probe: true,
        ..settings()
    };
    let mut r = rotation(settings, Policy::default(), &[State::Down]);
    let s = standing(&r, 0, S);
    assert!(matches!(
        s.cause,
        Cause::ProbesDown(ProbesDown {
            why: DownWhy::FirstProbe,
            ..
        })
    ));
    assert_eq!(s.back, Back::FirstPass);
    r.handle_probe(0, BAD, S);
    assert!(matches!(
        standing(&r, 0, S).cause,
        Cause::ProbesDown(ProbesDown {
            why: DownWhy::NeverProven,
            ..
        })
    ));
}

#[test]
fn ejection_wins_over_failing_probes_and_says_what_ejected_it() {
    let settings = Settings {
        probes_end_ejection: true,
        ..settings()
    };
    let mut r = rotation(settings, Policy::default(), &[State::Up, State::Up]);
    traffic(&mut r, 0, BAD, 3, S);
    let s = standing(&r, 0, S);
    let Cause::Ejected {
        since,
        until,
        nth,
        reason,
        probes: None,
    } = s.cause
    else {
        panic!("ejected, probes fine: {s:?}")
    };
    assert_eq!((since, until, nth), (S, Some(31 * S), 1));
    assert!(matches!(
        reason,
        Some(Reason::TrafficErrors { streak: 3, .. })
    ));
    assert_eq!(
        s.back,
        Back::EjectionEnds {
            until: Some(31 * S)
        }
    );
    // Probes fail behind the ejection: it still decides, and says what probes need.
    probes(&mut r, 0, BAD, 3, 2 * S);
    let Cause::Ejected { probes, .. } = standing(&r, 0, 2 * S).cause else {
        panic!("still ejected")
    };
    assert_eq!(
        probes,
        Some(ProbesDown {
            why: DownWhy::Failing { streak: 3 },
            has: 0,
            needs: 2,
            ends_ejection: true,
        })
    );
    // The ejection ends into probation, the probes still fail: DOWN by its failure streak
    // (the transition that took it DOWN was the traffic's).
    r.handle_timeout(31 * S);
    assert_eq!(
        standing(&r, 0, 31 * S).cause,
        Cause::ProbesDown(ProbesDown {
            why: DownWhy::Failing { streak: 3 },
            has: 0,
            needs: 2,
            ends_ejection: false,
        })
    );
}

#[test]
fn probation_says_how_long_the_next_ejection_lasts() {
    let mut r = rotation(settings(), Policy::default(), &[State::Up, State::Up]);
    traffic(&mut r, 0, BAD, 3, S);
    r.handle_timeout(31 * S);
    let s = standing(&r, 0, 31 * S);
    assert_eq!(
        s.cause,
        Cause::Up {
            probation: Some(Probation {
                since: 31 * S,
                next_ejection: Some(60 * S),
            }),
            ramping: false,
        }
    );
    assert_eq!(s.since, 31 * S, "back UP at the ejection's end");
}

#[test]
fn ejection_wins_over_tracking_and_tracking_over_the_probes() {
    let mut r = rotation(settings(), Policy::default(), &[State::Up, State::Up]);
    r.set_tracks(0, true);
    let s = standing(&r, 0, S);
    assert_eq!(s.cause, Cause::Tracked { state: State::Up });
    assert_eq!(s.back, Back::InRotation);
    r.handle_tracked(0, State::Down, S);
    let s = standing(&r, 0, S);
    assert_eq!(s.cause, Cause::Tracked { state: State::Down });
    assert_eq!(s.back, Back::TrackedUp);
    r.handle_tracked(0, State::Up, 2 * S);
    traffic(&mut r, 0, BAD, 3, 3 * S);
    assert!(matches!(
        standing(&r, 0, 3 * S).cause,
        Cause::Ejected { .. }
    ));
    // On probation it follows the tracked backend again.
    r.handle_timeout(33 * S);
    assert_eq!(
        standing(&r, 0, 33 * S).cause,
        Cause::Tracked { state: State::Up }
    );
}

#[test]
fn the_agent_and_the_health_route_hold_out_in_their_order() {
    let policy = Policy {
        disable_on_404: true,
        ..Policy::default()
    };
    let mut r = rotation(settings(), policy, &[State::Up, State::Up]);
    r.set_tracks(0, true);
    // A drain the health route asked for wins over tracking.
    r.handle_probe(0, Outcome::Status(404), S);
    let s = standing(&r, 0, S);
    assert_eq!((s.cause, s.back), (Cause::DrainOn404, Back::NextPass));
    assert_eq!(s.effective, Effective::SelfDraining);
    // An agent's drain wins over it.
    agent(&mut r, 0, "drain", 2 * S);
    let s = standing(&r, 0, 2 * S);
    assert_eq!((s.cause, s.back), (Cause::AgentDrain, Back::AgentUp));
    // An agent's down shows DOWN: held out, whatever the verdict.
    agent(&mut r, 0, "down", 3 * S);
    let s = standing(&r, 0, 3 * S);
    assert_eq!((s.cause, s.back), (Cause::AgentHold, Back::AgentUp));
    assert_eq!(s.effective, Effective::Down);
    // A drain while the verdict is DOWN is a hold too.
    agent(&mut r, 1, "drain", 3 * S);
    traffic(&mut r, 1, BAD, 3, 3 * S);
    assert_eq!(standing(&r, 1, 3 * S).cause, Cause::AgentHold);
}

#[test]
fn maintenance_wins_over_the_agent_and_requalifying_over_its_drain() {
    let mut r = rotation(settings(), Policy::default(), &[State::Up, State::Up]);
    r.set_override(0, Some(OverrideKind::Maintenance), None, S);
    r.set_override(0, None, None, 2 * S);
    agent(&mut r, 0, "drain", 2 * S);
    let s = standing(&r, 0, 2 * S);
    assert_eq!(s.cause, Cause::Requalifying { has: 0, needs: 2 });
    assert_eq!(s.back, Back::Passes { has: 0, needs: 2 });
    assert_eq!(s.requalifying, Some((0, 2)));
    r.handle_probe(0, OK, 3 * S);
    assert_eq!(
        standing(&r, 0, 3 * S).cause,
        Cause::Requalifying { has: 1, needs: 2 }
    );
    agent(&mut r, 0, "maint", 4 * S);
    let s = standing(&r, 0, 4 * S);
    assert_eq!(s.cause, Cause::AgentMaintenance);
    assert_eq!(s.back, Back::LeavingMaintenance { passes: 2 });
    assert_eq!(
        s.requalifying, None,
        "maintenance forgets the requalification"
    );
}

#[test]
fn an_override_wins_over_everything_and_says_when_it_lapses() {
    let mut r = rotation(settings(), Policy::default(), &[State::Up, State::Up]);
    agent(&mut r, 0, "maint", S);
    traffic(&mut r, 0, BAD, 3, S);
    let cases = [
        (
            OverrideKind::Drain,
            Back::OverrideEnds {
                until: Some(12 * S),
            },
        ),
        (
            OverrideKind::Down,
            Back::OverrideEnds {
                until: Some(12 * S),
            },
        ),
        (OverrideKind::Up, Back::InRotation),
        (
            OverrideKind::Maintenance,
            Back::LeavingMaintenance { passes: 2 },
        ),
    ];
    for (kind, back) in cases {
        r.set_override(0, Some(kind), Some(10 * S), 2 * S);
        let s = standing(&r, 0, 2 * S);
        assert_eq!(
            s.cause,
            Cause::Override(Override {
                kind,
                since: 2 * S,
                until: Some(12 * S)
            })
        );
        assert_eq!(s.back, back, "{kind:?}");
    }
    r.handle_timeout(12 * S);
    assert_eq!(standing(&r, 0, 12 * S).cause, Cause::AgentMaintenance);
}

#[test]
fn the_weight_is_the_pickers_through_a_ramp_an_agent_and_a_shed() {
    let policy = Policy {
        slow_start: Some(10 * S),
        load_shedding: Some(LoadShedding {
            weight_percent: 50,
            max: 60 * S,
            default_relief: 5 * S,
        }),
        ..Policy::default()
    };
    let mut r = rotation(settings(), policy, &[State::Down, State::Up]);
    probes(&mut r, 0, OK, 2, S);
    let ramp = |s: Standing| match s.cause {
        Cause::Up { ramping, .. } => ramping,
        other => panic!("UP, not {other:?}"),
    };
    let mut at = S;
    while let Some(next) = r.poll_timeout().filter(|&t| t <= 11 * S) {
        assert!(ramp(standing(&r, 0, at)), "ramping at {at:?}");
        at = next;
        r.handle_timeout(at);
    }
    let s = standing(&r, 0, at);
    assert!(!ramp(s), "the ramp ended at {at:?}");
    assert_eq!(s.weight_tenths, 20);
    agent(&mut r, 0, "50%", at);
    assert_eq!(standing(&r, 0, at).weight_tenths, 10);
    assert!(r.handle_shed(0, 429, 5 * S, at));
    let s = standing(&r, 0, at);
    assert_eq!(s.weight_tenths, 5);
    let shed = s.shed.expect("shedding");
    assert_eq!(
        (shed.status, shed.until, shed.weight_percent),
        (429, at + 5 * S, 50)
    );
}

#[test]
fn a_reload_carries_the_last_transition_and_since() {
    let mut r = rotation(settings(), Policy::default(), &[State::Up, State::Up]);
    probes(&mut r, 1, BAD, 3, 4 * S);
    // The backend moves from index 1 to index 0.
    let kept = Rotation::with_roles(
        settings(),
        Policy::default(),
        [(2, Join::Kept(r.carry(1)), Role::Primary)],
        9 * S,
    );
    let s = standing(&kept, 0, 9 * S);
    assert_eq!(s.since, 4 * S);
    let last = s.last_transition.expect("carried");
    assert_eq!((last.backend, last.to, last.at), (0, State::Down, 4 * S));
    assert!(matches!(
        s.cause,
        Cause::ProbesDown(ProbesDown {
            why: DownWhy::ProbesFailed { streak: 3, .. },
            ..
        })
    ));
}
