//! Load shedding awareness on simulated time: a `429` (or `503` with `Retry-After`) reduces the
//! backend's weight for the time asked, bounded, then restores it, with one event each way;
//! the answer never touches the passive streaks; without the policy nothing happens.

use std::time::Duration;

use capataz_health::{
    rotation::Event, Join, LoadShedding, Policy, Rotation, Settings, Shed, ShedChange, State,
};

const S: Duration = Duration::from_secs(1);

fn rotation(shedding: Option<LoadShedding>) -> Rotation {
    Rotation::new(
        Settings::default(),
        Policy {
            load_shedding: shedding,
            ..Policy::default()
        },
        (0..3).map(|_| {
            (
                10,
                Join::New {
                    initial: State::Up,
                    warm_up: false,
                },
            )
        }),
        Duration::ZERO,
    )
}

const TEN_PERCENT: LoadShedding = LoadShedding {
    weight_percent: 10,
    max: Duration::from_secs(300),
    default_relief: Duration::from_secs(5),
};

fn sheds(r: &mut Rotation) -> Vec<ShedChange> {
    std::iter::from_fn(|| r.poll_event())
        .filter_map(|e| match e {
            Event::Shedding(change) => Some(change),
            _ => None,
        })
        .collect()
}

#[test]
fn a_429_reduces_the_weight_for_its_retry_after_and_then_restores_it() {
    let mut r = rotation(Some(TEN_PERCENT));
    sheds(&mut r);
    assert_eq!(r.eligible(S).weights, vec![100, 100, 100]);
    assert!(r.handle_shed(1, 429, 30 * S, S));
    assert_eq!(
        sheds(&mut r),
        vec![ShedChange {
            backend: 1,
            shed: Some(Shed {
                status: 429,
                duration: 30 * S,
                until: 31 * S,
                weight_percent: 10,
            }),
            at: S,
        }]
    );
    assert_eq!(r.eligible(2 * S).weights, vec![100, 10, 100]);
    assert_eq!(r.poll_timeout(), Some(31 * S));
    // Another 429 within the shed extends it, without a new event.
    assert!(r.handle_shed(1, 429, 30 * S, 11 * S));
    assert!(sheds(&mut r).is_empty());
    assert_eq!(r.shed(1).map(|s| s.until), Some(41 * S));
    r.handle_timeout(31 * S);
    assert!(sheds(&mut r).is_empty(), "not over yet");
    r.handle_timeout(41 * S);
    assert_eq!(
        sheds(&mut r),
        vec![ShedChange {
            backend: 1,
            shed: None,
            at: 41 * S
        }]
    );
    assert_eq!(r.eligible(41 * S).weights, vec![100, 100, 100]);
    assert_eq!(r.shed(1), None);
}

#[test]
fn a_retry_after_longer_than_the_cap_is_bounded() {
    let mut r = rotation(Some(TEN_PERCENT));
    r.handle_shed(0, 503, Duration::from_secs(86_400 * 365), S);
    assert_eq!(
        r.shed(0).map(|s| s.duration),
        Some(Duration::from_secs(300))
    );
    assert_eq!(r.poll_timeout(), Some(S + Duration::from_secs(300)));
}

#[test]
fn shedding_never_touches_the_passive_side_nor_the_verdict() {
    let mut r = rotation(Some(TEN_PERCENT));
    for i in 0..10 {
        r.handle_shed(2, 503, 5 * S, i * S);
    }
    assert_eq!(r.pool().backend(2).passive.error_streak, 0);
    assert_eq!(r.pool().verdict(2), State::Up);
    assert!(r.eligible(S).backends.contains(&2));
}

#[test]
fn the_weight_never_drops_to_zero() {
    let mut r = Rotation::new(
        Settings::default(),
        Policy {
            load_shedding: Some(LoadShedding {
                weight_percent: 1,
                max: Duration::from_secs(300),
                default_relief: Duration::from_secs(5),
            }),
            ..Policy::default()
        },
        [(
            1,
            Join::New {
                initial: State::Up,
                warm_up: false,
            },
        )],
        Duration::ZERO,
    );
    r.handle_shed(0, 429, 10 * S, S);
    assert_eq!(r.eligible(2 * S).weights, vec![1]);
}

#[test]
fn without_load_shedding_nothing_happens() {
    let mut r = rotation(None);
    sheds(&mut r);
    assert!(!r.handle_shed(0, 429, 30 * S, S));
    assert!(sheds(&mut r).is_empty());
    assert_eq!(r.eligible(2 * S).weights, vec![100, 100, 100]);
    assert_eq!(r.poll_timeout(), None);
}

/// Found by review: `Retry-After: 0` asked for a relief of nothing, yet every such answer made a
/// new shed that ended at once: two events (on, off), two snapshot rebuilds, two log lines and
/// a timer wake-up per answer, so a backend answering `429` with `Retry-After: 0` to every
/// request made capataz rebuild its pool's snapshot twice per request. A zero relief is a
/// shedding answer (never judged) that changes no weight.
#[test]
fn a_retry_after_of_zero_changes_no_weight_and_makes_no_event() {
    let mut r = rotation(Some(TEN_PERCENT));
    sheds(&mut r);
    for i in 1..=100u32 {
        let now = S + Duration::from_millis(u64::from(i));
        assert!(
            r.handle_shed(1, 429, Duration::ZERO, now),
            "a shedding answer"
        );
        r.handle_timeout(now);
    }
    assert!(sheds(&mut r).is_empty());
    assert_eq!(r.shed(1), None);
    assert_eq!(r.poll_timeout(), None);
    assert_eq!(r.eligible(2 * S).weights, vec![100, 100, 100]);
    // During a relief, it neither ends nor shortens it.
    assert!(r.handle_shed(1, 429, 30 * S, 2 * S));
    assert!(r.handle_shed(1, 429, Duration::ZERO, 3 * S));
    assert_eq!(r.shed(1).map(|s| s.until), Some(32 * S));
}
