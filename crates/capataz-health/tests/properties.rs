//! Properties of the health engine, checked on arbitrary histories (proptest).
//!
//! - No DOWN without `fall` consecutive failed probes, no UP without `rise` consecutive passes.
//! - The two sides never touch each other: traffic leaves the active side alone, probes the
//!   passive side, except for the one opt-in edge `probes_end_ejection` allows (the probe that
//!   brings a DOWN active side UP turns an ejection into probation, and changes nothing else).
//! - Every verdict change yields exactly one [`Transition`], and nothing else does.
//! - With timed ejection, the cap is never exceeded and every ejection lasts within `[base, max]`.
//! - The status-line parser never panics and accepts only well-formed lines.

use std::num::NonZeroU32;
use std::time::Duration;

use capataz_health::{
    parse_status_line, BackendHealth, Ejection, EjectionPolicy, Outcome, Pool, ProbeResult,
    ProbeRule, Reason, Settings, State, Transition,
};
use proptest::prelude::*;

/// Something that can happen to a pool, `after` milliseconds after the previous event.
#[derive(Clone, Debug)]
enum Event {
    Probe(usize, Outcome),
    Observe(usize, Outcome),
    Tick,
    /// New settings, as on a configuration reload.
    Reconfigure(Settings),
}

#[derive(Clone, Debug)]
struct Step {
    after: u64,
    event: Event,
}

/// Any outcome at all, well-formed status lines most of the time.
fn outcome() -> impl Strategy<Value = Outcome> {
    prop_oneof![
        6 => (100u16..=599).prop_map(Outcome::Status),
        1 => Just(Outcome::Timeout),
        1 => Just(Outcome::Refused),
        1 => Just(Outcome::Reset),
        1 => Just(Outcome::Malformed),
    ]
}

/// An outcome the default probe rule passes (`true`) or fails (`false`).
fn probe_outcome(pass: bool) -> BoxedStrategy<Outcome> {
    if pass {
        (200u16..=399).prop_map(Outcome::Status).boxed()
    } else {
        prop_oneof![
            (100u16..=199).prop_map(Outcome::Status),
            (400u16..=599).prop_map(Outcome::Status),
            Just(Outcome::Timeout),
            Just(Outcome::Refused),
            Just(Outcome::Reset),
            Just(Outcome::Malformed),
        ]
        .boxed()
    }
}

/// A traffic outcome, errors (5xx or no answer) about two times in three, so ejections happen.
fn traffic_outcome() -> impl Strategy<Value = Outcome> {
    prop_oneof![
        1 => (100u16..=499).prop_map(Outcome::Status),
        1 => (500u16..=599).prop_map(Outcome::Status),
        1 => prop_oneof![
            Just(Outcome::Timeout),
            Just(Outcome::Refused),
            Just(Outcome::Reset),
            Just(Outcome::Malformed),
        ],
    ]
}

fn threshold() -> impl Strategy<Value = NonZeroU32> {
    (1u32..=5).prop_map(|n| NonZeroU32::new(n).unwrap())
}

fn policy() -> impl Strategy<Value = EjectionPolicy> {
    (1u64..=10_000, 1u64..=8).prop_map(|(base, times)| EjectionPolicy {
        base: Duration::from_millis(base),
        max: Duration::from_millis(base * times),
    })
}

fn settings(ejection: BoxedStrategy<Option<EjectionPolicy>>) -> impl Strategy<Value = Settings> {
    (
        threshold(),
        threshold(),
        threshold(),
        prop_oneof![3 => Just(State::Up), 1 => Just(State::Down)],
        any::<bool>(),
        ejection,
        prop_oneof![1 => Just(0u8), 1 => Just(100u8), 3 => 0u8..=100],
        any::<bool>(),
    )
        .prop_map(
            |(rise, fall, consecutive_errors, initial, count_503, ejection, percent, early)| {
                Settings {
                    rise,
                    fall,
                    consecutive_errors,
                    initial,
                    first_probe: false,
                    traffic_rule: capataz_health::TrafficRule {
                        count_503,
                        ..Default::default()
                    },
                    ejection,
                    max_ejected_percent: percent,
                    probes_end_ejection: early,
                    ..Settings::default()
                }
            },
        )
}

fn any_policy() -> BoxedStrategy<Option<EjectionPolicy>> {
    prop::option::of(policy()).boxed()
}

fn timed_policy() -> BoxedStrategy<Option<EjectionPolicy>> {
    policy().prop_map(Some).boxed()
}

/// Probes in runs of passes and failures, so that streaks of every length occur.
fn probe_runs(backends: usize) -> impl Strategy<Value = Vec<(usize, Outcome)>> {
    prop::collection::vec((0..backends, any::<bool>(), 1usize..=7), 0..40).prop_flat_map(|runs| {
        runs.into_iter()
            .map(|(backend, pass, len)| {
                prop::collection::vec(probe_outcome(pass), len)
                    .prop_map(move |outcomes| (backend, outcomes))
            })
            .collect::<Vec<_>>()
            .prop_map(|runs| {
                runs.into_iter()
                    .flat_map(|(backend, outcomes)| outcomes.into_iter().map(move |o| (backend, o)))
                    .collect()
            })
    })
}

/// A history of probes, traffic and ticks on `backends` backends; with `reconfigure`, now and
/// then new settings too.
fn steps(backends: usize, reconfigure: bool) -> impl Strategy<Value = Vec<Step>> {
    let event = prop_oneof![
        8 => (0..backends, outcome()).prop_map(|(b, o)| Event::Probe(b, o)),
        8 => (0..backends, traffic_outcome()).prop_map(|(b, o)| Event::Observe(b, o)),
        3 => Just(Event::Tick),
    ];
    let event = if reconfigure {
        prop_oneof![
            19 => event,
            1 => settings(any_policy()).prop_map(Event::Reconfigure),
        ]
        .boxed()
    } else {
        event.boxed()
    };
    let after = prop_oneof![2 => Just(0u64), 3 => 0u64..=2_000, 1 => 0u64..=100_000];
    prop::collection::vec(
        (after, event).prop_map(|(after, event)| Step { after, event }),
        0..120,
    )
}

/// A pool's settings and size, and a history for it.
fn scenario(
    ejection: BoxedStrategy<Option<EjectionPolicy>>,
    reconfigure: bool,
) -> impl Strategy<Value = (Settings, usize, Vec<Step>)> {
    (settings(ejection), 1usize..=6).prop_flat_map(move |(settings, backends)| {
        (Just(settings), Just(backends), steps(backends, reconfigure))
    })
}

/// Plays one step and returns the transitions it caused.
fn play(pool: &mut Pool, now: Duration, event: &Event) -> Vec<Transition> {
    match *event {
        Event::Probe(backend, outcome) => pool.probe(backend, outcome, now).1.into_iter().collect(),
        Event::Observe(backend, outcome) => {
            pool.observe(backend, outcome, now).1.into_iter().collect()
        }
        Event::Tick => {
            let mut out = Vec::new();
            pool.tick(now, &mut out);
            out
        }
        Event::Reconfigure(settings) => {
            pool.set_settings(settings);
            Vec::new()
        }
    }
}

fn verdicts(pool: &Pool) -> Vec<State> {
    pool.backends().iter().map(BackendHealth::verdict).collect()
}

fn ends_with(history: &[ProbeResult], n: u32, result: ProbeResult) -> bool {
    let n = n as usize;
    history.len() >= n && history[history.len() - n..].iter().all(|&r| r == result)
}

/// The ejection length a transition reports, if any, after checking its `until` and `nth`.
fn ejection_lengths(transition: &Transition) -> Option<Duration> {
    match transition.reason {
        Reason::TrafficErrors {
            ejection: Some(e), ..
        }
        | Reason::ProbationFailed { ejection: e, .. } => {
            assert_eq!(e.until, transition.at + e.duration, "{transition:?}");
            assert!(e.nth >= 1, "{transition:?}");
            Some(e.duration)
        }
        Reason::EjectionExpired { duration, .. } => Some(duration),
        _ => None,
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    /// (a) No UP -> DOWN unless the last `fall` probes failed, no DOWN -> UP unless the last
    /// `rise` passed; and conversely, `fall` failures in a row always leave a backend DOWN and
    /// `rise` passes in a row always leave it UP.
    #[test]
    fn verdicts_follow_probe_streaks(
        rise in threshold(),
        fall in threshold(),
        initial in prop_oneof![Just(State::Up), Just(State::Down)],
        backends in 1usize..=3,
        probes in probe_runs(3),
    ) {
        let settings = Settings { rise, fall, initial, ..Settings::default() };
        let mut pool = Pool::new(settings, backends);
        let mut history = vec![Vec::new(); backends];
        for (at, &(backend, outcome)) in probes.iter().enumerate() {
            let backend = backend % backends;
            let before = pool.verdict(backend);
            let (result, transition) =
                pool.probe(backend, outcome, Duration::from_millis(at as u64));
            prop_assert_eq!(result, ProbeRule::default().judge(outcome));
            history[backend].push(result);
            let after = pool.verdict(backend);
            let history = &history[backend];
            prop_assert_eq!(transition.is_some(), before != after);
            if before == State::Up && after == State::Down {
                prop_assert!(ends_with(history, fall.get(), ProbeResult::Fail), "{history:?}");
            }
            if before == State::Down && after == State::Up {
                prop_assert!(ends_with(history, rise.get(), ProbeResult::Pass), "{history:?}");
            }
            if ends_with(history, fall.get(), ProbeResult::Fail) {
                prop_assert_eq!(after, State::Down);
            }
            if ends_with(history, rise.get(), ProbeResult::Pass) {
                prop_assert_eq!(after, State::Up);
            }
        }
    }

    /// (b) Traffic never changes the active side, probes never change the passive side (but for
    /// the one `probes_end_ejection` edge, checked exactly), and ticks only ever touch the
    /// passive side.
    #[test]
    fn sides_never_touch_each_other(
        (settings, backends, steps) in scenario(any_policy(), false),
    ) {
        let mut pool = Pool::new(settings, backends);
        let mut now = Duration::ZERO;
        for step in &steps {
            now += Duration::from_millis(step.after);
            let before: Vec<BackendHealth> = pool.backends().to_vec();
            play(&mut pool, now, &step.event);
            for (b, (old, new)) in before.iter().zip(pool.backends()).enumerate() {
                match step.event {
                    Event::Probe(backend, _) => {
                        let recovered =
                            old.active.state == State::Down && new.active.state == State::Up;
                        if pool.settings().probes_end_ejection
                            && recovered
                            && old.passive.is_ejected()
                        {
                            prop_assert_eq!(new.passive.error_streak, 0);
                            prop_assert_eq!(new.passive.ejection, Ejection::Probation { since: now });
                            prop_assert_eq!(new.passive.times_ejected, old.passive.times_ejected);
                            prop_assert_eq!(new.passive.readmitted_at, old.passive.readmitted_at);
                        } else {
                            prop_assert_eq!(old.passive, new.passive);
                        }
                        if backend != b {
                            prop_assert_eq!(old.active, new.active);
                        }
                    }
                    Event::Observe(backend, _) => {
                        prop_assert_eq!(old.active, new.active);
                        if backend != b {
                            prop_assert_eq!(old.passive, new.passive);
                        }
                    }
                    Event::Tick | Event::Reconfigure(_) => {
                        prop_assert_eq!(old.active, new.active);
                    }
                }
            }
        }
    }

    /// (d) Every transition is a real change reported once: the transitions of a call are
    /// exactly the verdicts that changed across it, with consistent counts.
    #[test]
    fn transitions_are_exactly_the_verdict_changes(
        (settings, backends, steps) in scenario(any_policy(), true),
    ) {
        let mut pool = Pool::new(settings, backends);
        let mut now = Duration::ZERO;
        let mut changes = 0usize;
        let mut transitions = 0usize;
        for step in &steps {
            now += Duration::from_millis(step.after);
            let before = verdicts(&pool);
            let events = play(&mut pool, now, &step.event);
            let after = verdicts(&pool);
            let changed: Vec<usize> = (0..backends).filter(|&b| before[b] != after[b]).collect();
            let reported: Vec<usize> = events.iter().map(|t| t.backend).collect();
            prop_assert_eq!(&reported, &changed, "{:?}", step.event);
            let mut healthy = before.iter().filter(|&&v| v == State::Up).count();
            for t in &events {
                prop_assert_ne!(t.from, t.to);
                prop_assert_eq!(t.from, before[t.backend]);
                prop_assert_eq!(t.to, after[t.backend]);
                prop_assert_eq!(t.at, now);
                match t.to {
                    State::Up => healthy += 1,
                    State::Down => healthy -= 1,
                }
                prop_assert_eq!(t.healthy_after, healthy);
                prop_assert_eq!(t.emptied_pool(), t.to == State::Down && healthy == 0);
                prop_assert_eq!(t.refilled_pool(), t.to == State::Up && healthy == 1);
            }
            prop_assert_eq!(pool.healthy(), after.iter().filter(|&&v| v == State::Up).count());
            prop_assert_eq!(
                pool.ejected(),
                pool.backends().iter().filter(|b| b.passive.is_ejected()).count()
            );
            changes += changed.len();
            transitions += events.len();
        }
        prop_assert_eq!(changes, transitions);
    }

    /// (e) With timed ejection, the cap holds and every ejection lasts within `[base, max]`.
    #[test]
    fn timed_ejection_respects_cap_and_bounds(
        (settings, backends, steps) in scenario(timed_policy(), false),
    ) {
        let policy = settings.ejection.unwrap();
        let within = |d: Duration| policy.base <= d && d <= policy.max;
        let mut pool = Pool::new(settings, backends);
        let mut now = Duration::ZERO;
        for step in &steps {
            now += Duration::from_millis(step.after);
            for t in play(&mut pool, now, &step.event) {
                if let Some(duration) = ejection_lengths(&t) {
                    prop_assert!(within(duration), "{t:?} with {policy:?}");
                }
            }
            prop_assert!(pool.ejected() <= pool.max_ejected());
            prop_assert_eq!(
                pool.ejected(),
                pool.backends().iter().filter(|b| b.passive.is_ejected()).count()
            );
            for health in pool.backends() {
                if let Ejection::Ejected { since, until, nth } = health.passive.ejection {
                    let until = until.expect("timed ejections have an end");
                    prop_assert!(within(until - since), "{health:?} with {policy:?}");
                    prop_assert!(nth >= 1);
                    if matches!(step.event, Event::Tick) {
                        prop_assert!(until > now, "tick left a due ejection: {health:?}");
                    }
                }
            }
            if let Some(next) = pool.next_expiry() {
                prop_assert!(pool.ejected() > 0);
                if matches!(step.event, Event::Tick) {
                    prop_assert!(next > now);
                }
            }
        }
    }

    /// (c) The parser never panics on arbitrary bytes, and whatever it accepts is a status line.
    #[test]
    fn parsers_never_panic_on_bytes(line in prop::collection::vec(any::<u8>(), 0..64)) {
        check_accepted(&line)?;
    }

    /// (c) The same, on bytes close to a status line, where the interesting cases are.
    #[test]
    fn parsers_never_panic_near_status_lines(
        head in prop::collection::vec(prop::sample::select(b"HTP/0123456789. \t\r\nx\x00\xff".to_vec()), 0..16),
        tail in prop::collection::vec(any::<u8>(), 0..8),
    ) {
        let mut line = b"HTTP/".to_vec();
        line.extend_from_slice(&head);
        line.extend_from_slice(&tail);
        check_accepted(&line)?;
        check_accepted(&line[5..])?;
    }

    /// (c) Well-formed lines parse to their code when it is within 100-599, and only then.
    #[test]
    fn well_formed_lines_parse_to_their_code(
        major in 0u8..=9,
        minor in 0u8..=9,
        code in 0u16..=999,
        reason in prop::option::of("[ -~\t\u{80}-\u{ff}]{0,20}"),
    ) {
        let mut line = format!("HTTP/{major}.{minor} {code:03}").into_bytes();
        if let Some(reason) = &reason {
            line.push(b' ');
            line.extend(reason.chars().map(|c| c as u32 as u8));
        }
        let expected = (100..=599).contains(&code).then_some(code);
        prop_assert_eq!(parse_status_line(&line), expected);
        prop_assert_eq!(
            Outcome::parse(&line),
            expected.map_or(Outcome::Malformed, Outcome::Status)
        );
    }
}

/// Parses `line` both ways and checks that anything accepted is a status line with its code in
/// 100-599, and that the two parsers agree.
fn check_accepted(line: &[u8]) -> Result<(), TestCaseError> {
    let parsed = parse_status_line(line);
    if let Some(code) = parsed {
        prop_assert!((100..=599).contains(&code), "{line:?} gave {code}");
        prop_assert!(line.starts_with(b"HTTP/"), "{line:?}");
        let digits = code.to_string();
        prop_assert_eq!(&line[9..12], digits.as_bytes());
    }
    let outcome = Outcome::parse(line);
    match outcome {
        Outcome::Status(code) => {
            prop_assert!((100..=599).contains(&code), "{line:?} gave {code}");
            prop_assert!(line.starts_with(b"HTTP/"), "{line:?}");
            prop_assert_eq!(parsed, Some(code));
        }
        Outcome::Timeout => prop_assert_eq!(line, b"TIMEOUT"),
        Outcome::Refused => prop_assert_eq!(line, b"REFUSED"),
        Outcome::Reset => prop_assert_eq!(line, b"RESET"),
        Outcome::Tls => prop_assert_eq!(line, b"TLS"),
        Outcome::Connected => prop_assert_eq!(line, b"CONNECTED"),
        Outcome::Malformed => prop_assert_eq!(parsed, None),
        Outcome::Grpc(code) => {
            prop_assert!(line.starts_with(b"GRPC "), "{line:?}");
            let digits = code.to_string();
            prop_assert_eq!(&line[5..], digits.as_bytes());
        }
    }
    Ok(())
}
