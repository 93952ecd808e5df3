//! Timed ejection, probation and the ejection cap, on a simulated clock.
//!
//! Time is only ever an argument to the engine, so these tests choose every instant themselves:
//! no sleeps, and an hour of history runs in milliseconds. They also pin the [`Transition`]
//! events the balancer acts on (`emptied_pool`, `refilled_pool`) and their `Display` text.

use std::num::NonZeroU32;
use std::time::Duration;

use capataz_health::pool::human_duration;
use capataz_health::{
    Ejection, EjectionInfo, EjectionPolicy, Outcome, Pool, ProbeResult, Reason, Settings, State,
    TrafficResult, Transition,
};

const BAD: Outcome = Outcome::Status(502);
const GOOD: Outcome = Outcome::Status(200);

fn s(secs: u64) -> Duration {
    Duration::from_secs(secs)
}

fn ms(millis: u64) -> Duration {
    Duration::from_millis(millis)
}

/// Timed ejection lasting `base` seconds times n, at most `max` seconds, with the cap at `percent`.
fn timed(base: u64, max: u64, percent: u8) -> Settings {
    Settings {
        ejection: Some(EjectionPolicy {
            base: s(base),
            max: s(max),
        }),
        max_ejected_percent: percent,
        ..Settings::default()
    }
}

/// Sends `consecutive_errors` (3) bad responses to `backend` at `at` and returns the transition
/// the last one caused; the first two must cause none.
fn three_errors(pool: &mut Pool, backend: usize, at: Duration) -> Option<Transition> {
    assert_eq!(pool.observe(backend, BAD, at), (TrafficResult::Error, None));
    assert_eq!(pool.observe(backend, BAD, at), (TrafficResult::Error, None));
    let (result, transition) = pool.observe(backend, BAD, at);
    assert_eq!(result, TrafficResult::Error);
    transition
}

fn tick(pool: &mut Pool, now: Duration) -> Vec<Transition> {
    let mut out = Vec::new();
    pool.tick(now, &mut out);
    out
}

#[test]
fn three_errors_eject_for_base() {
    let mut pool = Pool::new(timed(10, 60, 100), 2);
    assert_eq!(pool.observe(0, BAD, s(1)), (TrafficResult::Error, None));
    assert_eq!(pool.observe(0, BAD, s(2)), (TrafficResult::Error, None));
    let (_, transition) = pool.observe(0, BAD, s(3));
    assert_eq!(
        transition,
        Some(Transition {
            backend: 0,
            from: State::Up,
            to: State::Down,
            reason: Reason::TrafficErrors {
                streak: 3,
                last: BAD,
                ejection: Some(EjectionInfo {
                    nth: 1,
                    duration: s(10),
                    until: s(13),
                }),
            },
            at: s(3),
            healthy_after: 1,
        })
    );
    assert_eq!(
        pool.backend(0).passive.ejection,
        Ejection::Ejected {
            since: s(3),
            until: Some(s(13)),
            nth: 1,
        }
    );
    assert_eq!(pool.verdict(0), State::Down);
    assert_eq!(pool.verdict(1), State::Up);
    assert_eq!((pool.healthy(), pool.ejected()), (1, 1));
    assert_eq!(pool.next_expiry(), Some(s(13)));
}

#[test]
fn tick_before_until_does_nothing_and_at_until_starts_probation() {
    let mut pool = Pool::new(timed(10, 60, 100), 2);
    three_errors(&mut pool, 0, s(3)).unwrap();
    assert_eq!(tick(&mut pool, s(3)), []);
    assert_eq!(tick(&mut pool, s(13) - ms(1)), []);
    assert_eq!(pool.verdict(0), State::Down);
    assert_eq!(
        tick(&mut pool, s(13)),
        [Transition {
            backend: 0,
            from: State::Down,
            to: State::Up,
            reason: Reason::EjectionExpired {
                nth: 1,
                duration: s(10),
            },
            at: s(13),
            healthy_after: 2,
        }]
    );
    assert_eq!(
        pool.backend(0).passive.ejection,
        Ejection::Probation { since: s(13) }
    );
    assert_eq!(pool.verdict(0), State::Up);
    assert_eq!((pool.healthy(), pool.ejected()), (2, 0));
    assert_eq!(pool.next_expiry(), None);
    // Nothing is left to expire.
    assert_eq!(tick(&mut pool, s(100)), []);
}

#[test]
fn a_late_tick_reports_the_ejection_as_scheduled() {
    let mut pool = Pool::new(timed(10, 60, 100), 1);
    three_errors(&mut pool, 0, s(3)).unwrap();
    let expired = tick(&mut pool, s(30));
    assert_eq!(expired.len(), 1);
    assert_eq!(
        expired[0].reason,
        Reason::EjectionExpired {
            nth: 1,
            duration: s(10),
        }
    );
    assert_eq!(expired[0].at, s(30));
}

#[test]
fn a_good_response_on_probation_readmits_without_a_transition() {
    let mut pool = Pool::new(timed(10, 60, 100), 1);
    three_errors(&mut pool, 0, s(3)).unwrap();
    tick(&mut pool, s(13));
    assert_eq!(pool.observe(0, GOOD, s(14)), (TrafficResult::Ok, None));
    let passive = pool.backend(0).passive;
    assert_eq!(passive.ejection, Ejection::None);
    assert_eq!(passive.readmitted_at, Some(s(14)));
    assert_eq!(passive.error_streak, 0);
    assert_eq!(pool.verdict(0), State::Up);
    // Readmitted for good: one error is a fresh streak of one, not an ejection.
    assert_eq!(pool.observe(0, BAD, s(15)), (TrafficResult::Error, None));
    assert_eq!(pool.verdict(0), State::Up);
}

#[test]
fn a_4xx_on_probation_is_a_good_response() {
    let mut pool = Pool::new(timed(10, 60, 100), 1);
    three_errors(&mut pool, 0, s(3)).unwrap();
    tick(&mut pool, s(13));
    assert_eq!(
        pool.observe(0, Outcome::Status(404), s(14)),
        (TrafficResult::Ok, None)
    );
    assert_eq!(pool.backend(0).passive.ejection, Ejection::None);
}

#[test]
fn an_error_on_probation_ejects_again_at_once_for_twice_base() {
    let mut pool = Pool::new(timed(10, 60, 100), 2);
    three_errors(&mut pool, 0, s(3)).unwrap();
    tick(&mut pool, s(13));
    let (result, transition) = pool.observe(0, Outcome::Reset, s(14));
    assert_eq!(result, TrafficResult::Error);
    assert_eq!(
        transition,
        Some(Transition {
            backend: 0,
            from: State::Up,
            to: State::Down,
            reason: Reason::ProbationFailed {
                last: Outcome::Reset,
                ejection: EjectionInfo {
                    nth: 2,
                    duration: s(20),
                    until: s(34),
                },
            },
            at: s(14),
            healthy_after: 1,
        })
    );
    assert_eq!(pool.next_expiry(), Some(s(34)));
    assert_eq!(tick(&mut pool, s(33)), []);
    let expired = tick(&mut pool, s(34));
    assert_eq!(
        expired[0].reason,
        Reason::EjectionExpired {
            nth: 2,
            duration: s(20),
        }
    );
}

#[test]
fn ejection_durations_grow_by_base_and_cap_at_max() {
    let mut pool = Pool::new(timed(10, 25, 100), 1);
    let mut now = s(1);
    let first = three_errors(&mut pool, 0, now).unwrap();
    let mut durations = vec![first];
    for _ in 0..4 {
        now = pool.next_expiry().unwrap();
        assert_eq!(tick(&mut pool, now).len(), 1);
        now += ms(1);
        durations.push(pool.observe(0, BAD, now).1.unwrap());
    }
    let durations: Vec<(u32, Duration)> = durations
        .iter()
        .map(|t| match t.reason {
            Reason::TrafficErrors {
                ejection: Some(e), ..
            }
            | Reason::ProbationFailed { ejection: e, .. } => {
                assert_eq!(e.until, t.at + e.duration);
                (e.nth, e.duration)
            }
            other => panic!("not an ejection: {other:?}"),
        })
        .collect();
    assert_eq!(
        durations,
        [(1, s(10)), (2, s(20)), (3, s(25)), (4, s(25)), (5, s(25))]
    );
}

#[test]
fn ejection_policy_duration_saturates() {
    let policy = EjectionPolicy {
        base: s(10),
        max: s(300),
    };
    assert_eq!(policy.duration(0), s(10));
    assert_eq!(policy.duration(1), s(10));
    assert_eq!(policy.duration(7), s(70));
    assert_eq!(policy.duration(u32::MAX), s(300));
    let huge = EjectionPolicy {
        base: Duration::MAX,
        max: Duration::MAX,
    };
    assert_eq!(huge.duration(3), Duration::MAX);
}

#[test]
fn a_timed_ejection_runs_its_course() {
    // Good answers to requests sent before the ejection prove little; errors do not extend it.
    let mut pool = Pool::new(timed(10, 60, 100), 1);
    three_errors(&mut pool, 0, s(3)).unwrap();
    assert_eq!(pool.observe(0, GOOD, s(4)), (TrafficResult::Ok, None));
    assert_eq!(pool.observe(0, BAD, s(5)), (TrafficResult::Error, None));
    assert_eq!(pool.verdict(0), State::Down);
    assert_eq!(pool.next_expiry(), Some(s(13)));
    assert_eq!(tick(&mut pool, s(13)).len(), 1);
    assert_eq!(pool.verdict(0), State::Up);
}

#[test]
fn staying_clear_for_max_after_readmission_counts_ejections_from_one() {
    for (clear_for, nth) in [(s(59), 2), (s(60), 1), (s(3600), 1)] {
        let mut pool = Pool::new(timed(10, 60, 100), 1);
        three_errors(&mut pool, 0, s(3)).unwrap();
        tick(&mut pool, s(13));
        pool.observe(0, GOOD, s(14));
        let transition = three_errors(&mut pool, 0, s(14) + clear_for).unwrap();
        let Reason::TrafficErrors {
            ejection: Some(ejection),
            ..
        } = transition.reason
        else {
            panic!("not an ejection: {transition:?}");
        };
        assert_eq!(ejection.nth, nth, "clear for {clear_for:?}");
        assert_eq!(ejection.duration, s(10) * nth, "clear for {clear_for:?}");
    }
}

#[test]
fn the_cap_holds_two_of_four_at_fifty_percent() {
    let mut pool = Pool::new(timed(10, 60, 50), 4);
    assert_eq!(pool.max_ejected(), 2);
    three_errors(&mut pool, 0, s(1)).unwrap();
    three_errors(&mut pool, 1, s(2)).unwrap();
    assert_eq!(three_errors(&mut pool, 2, s(3)), None);
    assert_eq!(pool.observe(2, BAD, s(4)), (TrafficResult::Error, None));
    assert_eq!(pool.verdict(2), State::Up);
    assert_eq!((pool.healthy(), pool.ejected()), (2, 2));
    // Backend 0's ejection ends; the next error ejects backend 2, whose streak never broke.
    assert_eq!(tick(&mut pool, s(11)).len(), 1);
    assert_eq!(pool.ejected(), 1);
    let transition = pool.observe(2, BAD, s(12)).1.unwrap();
    assert_eq!(
        transition.reason,
        Reason::TrafficErrors {
            streak: 5,
            last: BAD,
            ejection: Some(EjectionInfo {
                nth: 1,
                duration: s(10),
                until: s(22),
            }),
        }
    );
    assert_eq!(pool.ejected(), 2);
    // Backend 0 is on probation, but the cap is full again: its error does not eject it.
    assert_eq!(pool.observe(0, BAD, s(13)), (TrafficResult::Error, None));
    assert_eq!(pool.verdict(0), State::Up);
    assert_eq!(
        pool.backend(0).passive.ejection,
        Ejection::Probation { since: s(11) }
    );
}

#[test]
fn one_backend_at_ten_percent_can_be_ejected() {
    let mut pool = Pool::new(timed(10, 60, 10), 1);
    assert_eq!(pool.max_ejected(), 1);
    let transition = three_errors(&mut pool, 0, s(1)).unwrap();
    assert_eq!(transition.healthy_after, 0);
    assert!(transition.emptied_pool());
    assert!(!transition.refilled_pool());
    let back = tick(&mut pool, s(11));
    assert!(back[0].refilled_pool());
    assert!(!back[0].emptied_pool());
}

#[test]
fn zero_percent_disables_ejection() {
    for ejection in [
        None,
        Some(EjectionPolicy {
            base: s(10),
            max: s(60),
        }),
    ] {
        let mut pool = Pool::new(
            Settings {
                ejection,
                max_ejected_percent: 0,
                ..Settings::default()
            },
            4,
        );
        assert_eq!(pool.max_ejected(), 0);
        for at in 0..20 {
            assert_eq!(pool.observe(0, BAD, s(at)), (TrafficResult::Error, None));
        }
        assert_eq!(pool.verdict(0), State::Up);
        assert_eq!((pool.healthy(), pool.ejected()), (4, 0));
    }
}

#[test]
fn the_cap_rounds_down_but_is_at_least_one() {
    for (backends, percent, cap) in [
        (1, 1, 1),
        (1, 100, 1),
        (3, 50, 1),
        (4, 50, 2),
        (10, 25, 2),
        (10, 100, 10),
        (10, 255, 10),
        (10, 0, 0),
    ] {
        let pool = Pool::new(timed(10, 60, percent), backends);
        assert_eq!(
            pool.max_ejected(),
            cap,
            "{backends} backends at {percent} %"
        );
    }
}

#[test]
fn initial_down_needs_rise_passes() {
    let settings = Settings {
        initial: State::Down,
        ..timed(10, 60, 100)
    };
    let mut pool = Pool::new(settings, 2);
    assert_eq!(pool.healthy(), 0);
    assert_eq!(pool.probe(0, GOOD, s(1)), (ProbeResult::Pass, None));
    assert_eq!(
        pool.probe(0, Outcome::Timeout, s(2)),
        (ProbeResult::Fail, None)
    );
    assert_eq!(pool.probe(0, GOOD, s(3)), (ProbeResult::Pass, None));
    let (_, transition) = pool.probe(0, GOOD, s(4));
    let transition = transition.unwrap();
    assert_eq!(
        transition,
        Transition {
            backend: 0,
            from: State::Down,
            to: State::Up,
            reason: Reason::ProbesPassed {
                streak: 2,
                last: GOOD,
            },
            at: s(4),
            healthy_after: 1,
        }
    );
    assert!(transition.refilled_pool());
    pool.probe(1, GOOD, s(5));
    let second = pool.probe(1, GOOD, s(6)).1.unwrap();
    assert_eq!(second.healthy_after, 2);
    assert!(!second.refilled_pool());
    // Traffic alone cannot bring an initially DOWN backend UP.
    let mut cold = Pool::new(settings, 1);
    for at in 0..10 {
        assert_eq!(cold.observe(0, GOOD, s(at)), (TrafficResult::Ok, None));
    }
    assert_eq!(cold.verdict(0), State::Down);
}

#[test]
fn emptied_and_refilled_pool() {
    let mut pool = Pool::new(Settings::default(), 2);
    let fall = |pool: &mut Pool, backend| {
        assert_eq!(pool.probe(backend, Outcome::Timeout, s(1)).1, None);
        assert_eq!(pool.probe(backend, Outcome::Timeout, s(2)).1, None);
        pool.probe(backend, Outcome::Timeout, s(3)).1.unwrap()
    };
    let first = fall(&mut pool, 0);
    assert_eq!(first.healthy_after, 1);
    assert!(!first.emptied_pool() && !first.refilled_pool());
    let last = fall(&mut pool, 1);
    assert_eq!(last.healthy_after, 0);
    assert!(last.emptied_pool() && !last.refilled_pool());
    assert_eq!(pool.probe(1, GOOD, s(4)).1, None);
    let back = pool.probe(1, GOOD, s(5)).1.unwrap();
    assert!(back.refilled_pool() && !back.emptied_pool());
    pool.probe(0, GOOD, s(6));
    let both = pool.probe(0, GOOD, s(7)).1.unwrap();
    assert!(!both.refilled_pool() && !both.emptied_pool());
}

#[test]
fn an_expiry_while_active_is_down_changes_no_verdict() {
    let mut pool = Pool::new(timed(10, 60, 100), 1);
    three_errors(&mut pool, 0, s(1)).unwrap();
    for at in 2..5 {
        assert_eq!(pool.probe(0, Outcome::Refused, s(at)).1, None);
    }
    assert_eq!(pool.backend(0).active.state, State::Down);
    assert_eq!(tick(&mut pool, s(11)), []);
    assert_eq!(
        pool.backend(0).passive.ejection,
        Ejection::Probation { since: s(11) }
    );
    assert_eq!((pool.healthy(), pool.ejected()), (0, 0));
    pool.probe(0, GOOD, s(12));
    let back = pool.probe(0, GOOD, s(13)).1.unwrap();
    assert_eq!(back.from, State::Down);
    assert_eq!(back.to, State::Up);
    assert_eq!(
        back.reason,
        Reason::ProbesPassed {
            streak: 2,
            last: GOOD,
        }
    );
    assert_eq!(pool.healthy(), 1);
}

#[test]
fn next_expiry_is_the_earliest_and_tick_ends_all_that_are_due() {
    let mut pool = Pool::new(timed(10, 60, 100), 3);
    three_errors(&mut pool, 2, s(5)).unwrap();
    three_errors(&mut pool, 0, s(1)).unwrap();
    three_errors(&mut pool, 1, s(3)).unwrap();
    assert_eq!(pool.next_expiry(), Some(s(11)));
    let expired = tick(&mut pool, s(14));
    let backends: Vec<usize> = expired.iter().map(|t| t.backend).collect();
    assert_eq!(backends, [0, 1]);
    assert_eq!(
        expired.iter().map(|t| t.healthy_after).collect::<Vec<_>>(),
        [1, 2]
    );
    assert_eq!(pool.next_expiry(), Some(s(15)));
}

#[test]
fn streak_mode_ejections_end_with_a_good_response_not_a_tick() {
    let mut pool = Pool::new(Settings::default(), 1);
    let transition = three_errors(&mut pool, 0, s(1)).unwrap();
    assert_eq!(
        transition.reason,
        Reason::TrafficErrors {
            streak: 3,
            last: BAD,
            ejection: None,
        }
    );
    assert_eq!(pool.next_expiry(), None);
    assert_eq!(tick(&mut pool, s(3600)), []);
    assert_eq!(pool.verdict(0), State::Down);
    let (result, back) = pool.observe(0, Outcome::Status(301), s(3601));
    assert_eq!(result, TrafficResult::Ok);
    assert_eq!(
        back.unwrap().reason,
        Reason::TrafficRecovered {
            last: Outcome::Status(301),
        }
    );
    assert_eq!((pool.healthy(), pool.ejected()), (1, 0));
}

#[test]
fn transition_display() {
    let at = s(1);
    let transition = |from, to, reason| Transition {
        backend: 0,
        from,
        to,
        reason,
        at,
        healthy_after: 0,
    };
    let ejection = |nth, duration| EjectionInfo {
        nth,
        duration,
        until: at + duration,
    };
    let cases = [
        (
            transition(
                State::Up,
                State::Down,
                Reason::ProbesFailed {
                    streak: 3,
                    last: Outcome::Timeout,
                    mismatch: None,
                },
            ),
            "UP -> DOWN: 3 consecutive failed probes, last: TIMEOUT",
        ),
        (
            transition(
                State::Up,
                State::Down,
                Reason::ProbesFailed {
                    streak: 1,
                    last: Outcome::Status(404),
                    mismatch: None,
                },
            ),
            "UP -> DOWN: 1 failed probe, last: HTTP 404",
        ),
        (
            transition(
                State::Down,
                State::Up,
                Reason::ProbesPassed {
                    streak: 2,
                    last: GOOD,
                },
            ),
            "DOWN -> UP: 2 consecutive passing probes, last: HTTP 200",
        ),
        (
            transition(
                State::Down,
                State::Up,
                Reason::ProbesPassed {
                    streak: 1,
                    last: Outcome::Status(301),
                },
            ),
            "DOWN -> UP: 1 passing probe, last: HTTP 301",
        ),
        (
            transition(
                State::Up,
                State::Down,
                Reason::TrafficErrors {
                    streak: 3,
                    last: Outcome::Malformed,
                    ejection: None,
                },
            ),
            "UP -> DOWN: 3 consecutive traffic errors, last: malformed status line",
        ),
        (
            transition(
                State::Up,
                State::Down,
                Reason::TrafficErrors {
                    streak: 1,
                    last: BAD,
                    ejection: Some(ejection(1, s(10))),
                },
            ),
            "UP -> DOWN: 1 traffic error, last: HTTP 502; ejected for 10 s (ejection #1)",
        ),
        (
            transition(
                State::Down,
                State::Up,
                Reason::TrafficRecovered {
                    last: Outcome::Status(404),
                },
            ),
            "DOWN -> UP: a good response ended the error streak, last: HTTP 404",
        ),
        (
            transition(
                State::Down,
                State::Up,
                Reason::EjectionExpired {
                    nth: 2,
                    duration: ms(1500),
                },
            ),
            "DOWN -> UP: ejection #2 (1.5 s) is over, back on probation",
        ),
        (
            transition(
                State::Up,
                State::Down,
                Reason::ProbationFailed {
                    last: Outcome::Reset,
                    ejection: ejection(3, ms(250)),
                },
            ),
            "UP -> DOWN: traffic error on probation, last: RESET; ejected for 250 ms (ejection #3)",
        ),
    ];
    for (transition, text) in cases {
        assert_eq!(transition.to_string(), text);
    }
}

#[test]
fn reasons_know_their_side_and_last_outcome() {
    use capataz_health::Side;
    let probe = Reason::ProbesFailed {
        streak: 3,
        last: Outcome::Timeout,
        mismatch: None,
    };
    let expiry = Reason::EjectionExpired {
        nth: 1,
        duration: s(10),
    };
    let recovered = Reason::TrafficRecovered { last: GOOD };
    assert_eq!(
        (probe.side(), probe.last()),
        (Side::Active, Some(Outcome::Timeout))
    );
    assert_eq!((expiry.side(), expiry.last()), (Side::Passive, None));
    assert_eq!(
        (recovered.side(), recovered.last()),
        (Side::Passive, Some(GOOD))
    );
}

#[test]
fn human_durations() {
    for (duration, text) in [
        (ms(0), "0 ms"),
        (ms(250), "250 ms"),
        (ms(999), "999 ms"),
        (s(1), "1 s"),
        (ms(1500), "1.5 s"),
        (s(30), "30 s"),
        (s(300), "300 s"),
    ] {
        assert_eq!(human_duration(duration).to_string(), text);
    }
}

#[test]
fn an_hour_of_errors_then_recovery() {
    // A backend fails every request for an hour at 10 requests a second, then heals. The
    // balancer ticks before each request, as the runtime does when woken for `next_expiry`.
    let step = ms(100);
    let mut pool = Pool::new(timed(10, 60, 100), 2);
    let mut now = Duration::ZERO;
    let mut ejections = Vec::new();
    let mut expiries = 0;
    let mut requests = 0;
    while now < s(3600) {
        now += step;
        for transition in tick(&mut pool, now) {
            assert_eq!(transition.to, State::Up);
            expiries += 1;
        }
        if pool.verdict(0) == State::Down {
            continue;
        }
        requests += 1;
        if let (_, Some(transition)) = pool.observe(0, BAD, now) {
            assert_eq!(transition.to, State::Down);
            assert_eq!(transition.healthy_after, 1);
            ejections.push(transition);
        }
    }
    let lengths: Vec<u64> = ejections
        .iter()
        .map(|t| match t.reason {
            Reason::TrafficErrors {
                ejection: Some(e), ..
            }
            | Reason::ProbationFailed { ejection: e, .. } => e.duration.as_secs(),
            other => panic!("not an ejection: {other:?}"),
        })
        .collect();
    // 10+20+30+40+50 s, then 60 s each until the hour is over.
    assert_eq!(lengths[..7], [10, 20, 30, 40, 50, 60, 60]);
    assert!(lengths[5..].iter().all(|&l| l == 60));
    assert_eq!(lengths.len(), 5 + (3600 - 150) / 60 + 1);
    // Only the first ejection took a streak; every other one was a failed probation.
    assert!(matches!(ejections[0].reason, Reason::TrafficErrors { .. }));
    assert!(ejections[1..]
        .iter()
        .all(|t| matches!(t.reason, Reason::ProbationFailed { .. })));
    assert_eq!(requests, 3 + (lengths.len() - 1));
    // The last ejection is still running when the hour ends.
    assert_eq!(expiries + 1, lengths.len());
    // It heals: the next expiry puts it on probation, and one good response readmits it.
    let until = pool.next_expiry().unwrap();
    assert_eq!(tick(&mut pool, until).len(), 1);
    assert_eq!(
        pool.observe(0, GOOD, until + step),
        (TrafficResult::Ok, None)
    );
    assert_eq!(pool.backend(0).passive.ejection, Ejection::None);
    assert_eq!((pool.healthy(), pool.ejected()), (2, 0));
    // Backend 1 never saw an error and was never touched.
    assert_eq!(pool.backend(1).passive.times_ejected, 0);
}

#[test]
fn new_thresholds_apply_from_the_next_result() {
    let mut pool = Pool::new(Settings::default(), 1);
    pool.probe(0, Outcome::Timeout, s(1));
    pool.probe(0, Outcome::Timeout, s(2));
    pool.set_settings(Settings {
        fall: NonZeroU32::new(5).unwrap(),
        ..Settings::default()
    });
    assert_eq!(pool.probe(0, Outcome::Timeout, s(3)).1, None);
    assert_eq!(pool.probe(0, Outcome::Timeout, s(4)).1, None);
    assert!(pool.probe(0, Outcome::Timeout, s(5)).1.is_some());
}

/// Regression: an error on probation after `set_settings` dropped the ejection policy ejected
/// the backend without a [`Transition`], so `healthy()` kept counting it and later climbed past
/// the pool's size.
#[test]
fn probation_error_after_the_policy_is_dropped_reports_the_ejection() {
    let mut pool = Pool::new(timed(10, 60, 100), 2);
    three_errors(&mut pool, 0, s(1)).unwrap();
    assert_eq!(tick(&mut pool, s(11)).len(), 1);
    pool.set_settings(Settings::default());
    let (result, transition) = pool.observe(0, BAD, s(12));
    assert_eq!(result, TrafficResult::Error);
    assert_eq!(
        transition,
        Some(Transition {
            backend: 0,
            from: State::Up,
            to: State::Down,
            reason: Reason::TrafficErrors {
                streak: 1,
                last: BAD,
                ejection: None,
            },
            at: s(12),
            healthy_after: 1,
        })
    );
    assert_eq!((pool.healthy(), pool.ejected()), (1, 1));
    // Streak mode now: one good response ends it.
    let back = pool.observe(0, GOOD, s(13)).1.unwrap();
    assert_eq!(back.reason, Reason::TrafficRecovered { last: GOOD });
    assert_eq!(back.healthy_after, 2);
    assert_eq!((pool.healthy(), pool.ejected()), (2, 0));
}

/// The same bug through `push_health`: a backend on probation moved into a streak-mode pool.
#[test]
fn probation_error_in_a_pool_without_a_policy_reports_the_ejection() {
    let mut timed_pool = Pool::new(timed(10, 60, 100), 1);
    three_errors(&mut timed_pool, 0, s(1)).unwrap();
    tick(&mut timed_pool, s(11));
    let mut pool = Pool::new(Settings::default(), 1);
    pool.push_health(*timed_pool.backend(0));
    assert_eq!(pool.healthy(), 2);
    let transition = pool.observe(1, BAD, s(12)).1.unwrap();
    assert_eq!((transition.from, transition.to), (State::Up, State::Down));
    assert_eq!(transition.healthy_after, 1);
    assert_eq!((pool.healthy(), pool.ejected()), (1, 1));
}

/// `probes_end_ejection`: a crashed backend, ejected by traffic and then DOWN by probes, comes
/// back on probation as soon as `rise` probes pass, not when its ejection runs out.
#[test]
fn recovery_by_probes_ends_an_ejection_early() {
    let settings = Settings {
        probes_end_ejection: true,
        ..timed(30, 300, 100)
    };
    let mut pool = Pool::new(settings, 2);
    let crash = Outcome::Refused;
    three_errors(&mut pool, 0, s(1)).expect("ejected");
    // The probes fail too: the active side goes DOWN behind the ejection, silently.
    for at in 2..=4 {
        assert_eq!(pool.probe(0, crash, s(at)), (ProbeResult::Fail, None));
    }
    assert_eq!(pool.backend(0).active.state, State::Down);
    // Restarted: the first pass is not enough, the second (rise = 2) ends the ejection.
    assert_eq!(pool.probe(0, GOOD, s(5)), (ProbeResult::Pass, None));
    let (_, transition) = pool.probe(0, GOOD, s(6));
    let transition = transition.expect("readmitted by probes");
    assert_eq!(
        transition,
        Transition {
            backend: 0,
            from: State::Down,
            to: State::Up,
            reason: Reason::ProbesEndedEjection {
                streak: 2,
                last: GOOD,
                nth: 1,
            },
            at: s(6),
            healthy_after: 2,
        }
    );
    assert_eq!(
        transition.to_string(),
        "DOWN -> UP: 2 consecutive passing probes after DOWN, last: HTTP 200; \
         ends ejection #1 early, back on probation"
    );
    assert_eq!(transition.reason.side(), capataz_health::Side::Active);
    let passive = pool.backend(0).passive;
    assert_eq!(passive.ejection, Ejection::Probation { since: s(6) });
    assert_eq!((passive.error_streak, passive.times_ejected), (0, 1));
    assert_eq!(pool.ejected(), 0);
    assert_eq!(pool.next_expiry(), None);
    assert!(tick(&mut pool, s(31)).is_empty(), "the old expiry is gone");
    // Probation as after any ejection: one error ejects it again, for twice as long.
    let (_, again) = pool.observe(0, BAD, s(7));
    assert_eq!(
        again.map(|t| t.reason),
        Some(Reason::ProbationFailed {
            last: BAD,
            ejection: EjectionInfo {
                nth: 2,
                duration: s(60),
                until: s(67),
            },
        })
    );
}

/// The liar (probes pass, traffic fails) never had a DOWN active side, so passing probes do not
/// shorten its ejection, with or without the setting.
#[test]
fn passing_probes_do_not_readmit_a_liar() {
    let settings = Settings {
        probes_end_ejection: true,
        ..timed(30, 300, 100)
    };
    let mut pool = Pool::new(settings, 2);
    three_errors(&mut pool, 0, s(1)).expect("ejected");
    for at in 2..30 {
        assert_eq!(pool.probe(0, GOOD, s(at)), (ProbeResult::Pass, None));
    }
    assert!(pool.backend(0).passive.is_ejected());
    let expired = tick(&mut pool, s(31));
    assert_eq!(expired.len(), 1);
    assert!(matches!(
        expired[0].reason,
        Reason::EjectionExpired { nth: 1, .. }
    ));
}

/// Without the setting, the sides stay apart: the active side comes back UP behind the
/// ejection, which runs its full time.
#[test]
fn without_the_setting_recovery_leaves_the_ejection_alone() {
    let mut pool = Pool::new(timed(30, 300, 100), 2);
    three_errors(&mut pool, 0, s(1)).expect("ejected");
    for at in 2..=4 {
        pool.probe(0, Outcome::Refused, s(at));
    }
    for at in 5..=8 {
        assert_eq!(pool.probe(0, GOOD, s(at)), (ProbeResult::Pass, None));
    }
    assert_eq!(pool.backend(0).active.state, State::Up);
    assert!(pool.backend(0).passive.is_ejected());
    assert_eq!(tick(&mut pool, s(31)).len(), 1);
}

/// An active recovery on a backend that is not ejected (or already on probation) is an ordinary
/// `ProbesPassed`, and the passive side is untouched.
#[test]
fn recovery_without_an_ejection_is_ordinary() {
    let settings = Settings {
        probes_end_ejection: true,
        initial: State::Down,
        ..timed(30, 300, 100)
    };
    let mut pool = Pool::new(settings, 1);
    pool.probe(0, GOOD, s(1));
    let (_, transition) = pool.probe(0, GOOD, s(2));
    assert!(matches!(
        transition.map(|t| t.reason),
        Some(Reason::ProbesPassed { streak: 2, .. })
    ));
    assert_eq!(pool.backend(0).passive.ejection, Ejection::None);
}
