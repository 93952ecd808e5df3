//! The `engine` target: arbitrary bytes become a pool, its settings and a history of calls on it
//! (probes, traffic, ticks, new settings, new backends), and every call is checked against the
//! rules written in `capataz_health::pool`.
//!
//! Any byte string decodes (reads past the end give 0), so the fuzzer never wastes an input on
//! a format error, and time only moves forward. After each call:
//!
//! - `healthy()` and `ejected()` equal the UP verdicts and the ejected backends, counted afresh,
//!   and `next_expiry()` is the earliest end of a timed ejection;
//! - the transitions are exactly the verdicts that changed, in pool order, each with
//!   `from != to`, the caller's `now`, a consistent `healthy_after`, and a reason that belongs
//!   to the call (probe reasons from probes, traffic reasons from traffic, expiries from ticks,
//!   nothing from `set_settings` or a push);
//! - a probe touches only its backend's active side and follows the streak rule (`fall` failures
//!   leave it DOWN, `rise` passes leave it UP, and nothing less changes it), except that with
//!   `probes_end_ejection` the probe that brings a DOWN active side UP also turns an ejection
//!   into probation (and nothing else on the passive side); traffic touches only its backend's
//!   passive side;
//! - traffic ejects a backend only while fewer than `max_ejected()` are ejected, and always does
//!   when the streak reaches `consecutive_errors` below the cap; a timed ejection lasts
//!   `policy.duration(nth)`, and a tick ends exactly the ejections due by `now`;
//! - the whole history played again gives the same transitions (the engine is deterministic).
//!
//! The cap is checked on the ejecting call rather than as `ejected() <= max_ejected()` at all
//! times, because two calls may legitimately leave more backends ejected than the cap allows:
//! `set_settings` with a lower `max_ejected_percent` keeps every backend's state (it releases no
//! one early), and `push_health` carries an ejection over from another pool. Only a new ejection
//! has to respect the cap in force.
//!
//! This file uses nothing but `capataz_health` and `std`: the proptest smoke test
//! (`crates/capataz-health/tests/fuzz_smoke.rs`) includes it by path.

use std::num::NonZeroU32;
use std::time::Duration;

use capataz_health::pool::Passive;
use capataz_health::{
    BackendHealth, Ejection, EjectionPolicy, Outcome, Pool, ProbeResult, ProbeRule, Reason,
    Settings, State, StatusSet, TrafficResult, TrafficRule, Transition,
};

/// The most backends a decoded pool grows to (pushes beyond it are dropped).
pub const MAX_BACKENDS: usize = 32;
/// The most calls one input plays, so that every input runs in bounded time.
pub const MAX_STEPS: usize = 2048;

/// One call on the pool. A backend selector is taken modulo the pool's size when the call is
/// played (the pool grows as it goes); probes and traffic on an empty pool are skipped.
#[derive(Clone, Copy, Debug)]
pub enum Op {
    /// `probe(backend, outcome, now)`.
    Probe {
        /// The backend selector.
        backend: usize,
        /// What the probe got.
        outcome: Outcome,
    },
    /// `observe(backend, outcome, now)`.
    Observe {
        /// The backend selector.
        backend: usize,
        /// What the request got.
        outcome: Outcome,
    },
    /// `tick(now)`.
    Tick,
    /// `set_settings(settings)`, as on a reload.
    SetSettings(Settings),
    /// `push(state)`.
    Push(State),
    /// `push_health` with a copy of one backend's health, as a reload carries health over.
    PushCopy(usize),
}

/// A call and how long after the previous one it happens.
#[derive(Clone, Copy, Debug)]
pub struct Step {
    /// Time since the previous call.
    pub after: Duration,
    /// The call.
    pub op: Op,
}

/// A decoded input: the pool's first settings and size, and its history.
#[derive(Clone, Debug)]
pub struct Scenario {
    /// The settings `Pool::new` gets.
    pub settings: Settings,
    /// The pool's size at the start.
    pub size: usize,
    /// The calls, in order.
    pub steps: Vec<Step>,
}

/// Decodes `data` and checks it: the fuzz target's whole body.
pub fn run(data: &[u8]) {
    check(&decode(data));
}

/// Reads a scenario from any bytes.
pub fn decode(data: &[u8]) -> Scenario {
    let mut bytes = Bytes(data);
    let settings = decode_settings(&mut bytes);
    let size = usize::from(bytes.u8() % 9);
    let mut steps = Vec::new();
    while !bytes.0.is_empty() && steps.len() < MAX_STEPS {
        let kind = bytes.u8();
        let after = delay(bytes.u8());
        let op = match kind % 16 {
            0..=5 => Op::Probe {
                backend: usize::from(bytes.u8()),
                outcome: outcome(&mut bytes),
            },
            6..=11 => Op::Observe {
                backend: usize::from(bytes.u8()),
                outcome: outcome(&mut bytes),
            },
            12 | 13 => Op::Tick,
            14 => Op::SetSettings(decode_settings(&mut bytes)),
            _ if kind & 0x10 == 0 => Op::Push(state(kind >> 5)),
            _ => Op::PushCopy(usize::from(bytes.u8())),
        };
        steps.push(Step { after, op });
    }
    Scenario {
        settings,
        size,
        steps,
    }
}

/// Plays a scenario twice and checks every call; panics on the first violation.
pub fn check(scenario: &Scenario) {
    let first = play_all(scenario);
    let again = play_all(scenario);
    assert_eq!(first, again, "the same history gave different transitions");
}

fn play_all(scenario: &Scenario) -> Vec<Transition> {
    let mut pool = Pool::new(scenario.settings, scenario.size);
    assert_eq!(pool.len(), scenario.size);
    check_counts(&pool);
    let mut now = Duration::ZERO;
    let mut all = Vec::new();
    for step in &scenario.steps {
        now = now.saturating_add(step.after);
        all.extend(play(&mut pool, now, step.op));
        check_counts(&pool);
    }
    all
}

/// Plays one call and checks it against the rules; returns its transitions.
fn play(pool: &mut Pool, now: Duration, op: Op) -> Vec<Transition> {
    let before: Vec<BackendHealth> = pool.backends().to_vec();
    let settings = *pool.settings();
    let ejected_before = pool.ejected();
    let cap_before = pool.max_ejected();
    let mut transitions = Vec::new();
    match op {
        Op::Probe { backend, outcome } => {
            if pool.is_empty() {
                return transitions;
            }
            let b = backend % pool.len();
            let (result, transition) = pool.probe(b, outcome, now);
            assert_eq!(result, settings.probe_rule.judge(outcome));
            check_probe(&settings, result, now, &before[b], pool.backend(b));
            check_others_untouched(&before, pool, b);
            transitions.extend(transition);
        }
        Op::Observe { backend, outcome } => {
            if pool.is_empty() {
                return transitions;
            }
            let b = backend % pool.len();
            let (result, transition) = pool.observe(b, outcome, now);
            assert_eq!(result, settings.traffic_rule.judge(outcome));
            let below_cap = ejected_before < cap_before;
            check_observe(
                &settings,
                result,
                below_cap,
                now,
                &before[b],
                pool.backend(b),
            );
            check_others_untouched(&before, pool, b);
            transitions.extend(transition);
        }
        Op::Tick => {
            pool.tick(now, &mut transitions);
            check_tick(&before, pool, now);
        }
        Op::SetSettings(new) => {
            pool.set_settings(new);
            assert_eq!(*pool.settings(), new);
            assert_eq!(
                pool.backends(),
                &before[..],
                "set_settings changed a backend"
            );
        }
        Op::Push(state) => {
            if pool.len() < MAX_BACKENDS {
                let index = pool.push(state);
                assert_eq!(index, before.len());
                let health = pool.backend(index);
                assert_eq!(health.active.state, state);
                assert_eq!(health.passive.ejection, Ejection::None);
                assert_eq!(&pool.backends()[..index], &before[..]);
            }
        }
        Op::PushCopy(from) => {
            if pool.len() < MAX_BACKENDS && !pool.is_empty() {
                let health = before[from % before.len()];
                let index = pool.push_health(health);
                assert_eq!(index, before.len());
                assert_eq!(*pool.backend(index), health);
                assert_eq!(&pool.backends()[..index], &before[..]);
            }
        }
    }
    check_transitions(&before, pool, &transitions, now, op, &settings);
    if pool.ejected() > ejected_before {
        // Only traffic ejects, one backend at a time, below the cap in force (a copied
        // ejection is not a new one).
        match op {
            Op::Observe { .. } => {
                assert_eq!(pool.ejected(), ejected_before + 1);
                assert!(
                    pool.ejected() <= cap_before,
                    "ejected {} of {} with a cap of {cap_before}",
                    pool.ejected(),
                    pool.len()
                );
            }
            Op::PushCopy(_) => assert_eq!(pool.ejected(), ejected_before + 1),
            other => panic!("{other:?} ejected a backend"),
        }
    }
    transitions
}

/// The counters the pool keeps equal the ones counted afresh.
fn check_counts(pool: &Pool) {
    let backends = pool.backends();
    let up = backends.iter().filter(|b| b.verdict() == State::Up).count();
    let ejected = backends.iter().filter(|b| b.passive.is_ejected()).count();
    assert_eq!(
        pool.healthy(),
        up,
        "healthy() is not the number of UP verdicts"
    );
    assert_eq!(
        pool.ejected(),
        ejected,
        "ejected() is not the number of ejected backends"
    );
    let earliest = backends
        .iter()
        .filter_map(|b| match b.passive.ejection {
            Ejection::Ejected { until, .. } => until,
            _ => None,
        })
        .min();
    assert_eq!(pool.next_expiry(), earliest);
    match pool.settings().max_ejected_percent {
        0 => assert_eq!(pool.max_ejected(), 0),
        _ => assert!(pool.max_ejected() >= 1 && pool.max_ejected() <= pool.len().max(1)),
    }
}

fn check_others_untouched(before: &[BackendHealth], pool: &Pool, touched: usize) {
    for (b, (old, new)) in before.iter().zip(pool.backends()).enumerate() {
        if b != touched {
            assert_eq!(old, new, "a call on backend {touched} changed backend {b}");
        }
    }
}

/// The streak rule: a result clears the opposite streak; `fall` failures in a row take an UP
/// side DOWN, `rise` passes in a row bring a DOWN side UP, and nothing else moves it.
fn check_probe(
    settings: &Settings,
    result: ProbeResult,
    now: Duration,
    old: &BackendHealth,
    new: &BackendHealth,
) {
    let recovered = old.active.state == State::Down && new.active.state == State::Up;
    if settings.probes_end_ejection && recovered && old.passive.is_ejected() {
        let expected = Passive {
            error_streak: 0,
            ejection: Ejection::Probation { since: now },
            ..old.passive
        };
        assert_eq!(
            new.passive, expected,
            "a recovery ended an ejection wrongly"
        );
    } else {
        assert_eq!(old.passive, new.passive, "a probe touched the passive side");
    }
    let (old, new) = (old.active, new.active);
    let (rise, fall) = (settings.rise.get(), settings.fall.get());
    match result {
        ProbeResult::Pass => {
            assert_eq!(new.pass_streak, old.pass_streak.saturating_add(1));
            assert_eq!(new.fail_streak, 0);
            let expected = if new.pass_streak >= rise {
                State::Up
            } else {
                old.state
            };
            assert_eq!(new.state, expected, "{old:?} -> {new:?} with rise {rise}");
        }
        ProbeResult::Fail => {
            assert_eq!(new.fail_streak, old.fail_streak.saturating_add(1));
            assert_eq!(new.pass_streak, 0);
            let expected = if new.fail_streak >= fall {
                State::Down
            } else {
                old.state
            };
            assert_eq!(new.state, expected, "{old:?} -> {new:?} with fall {fall}");
        }
        // A drain request (`disable_on_404`) moves no streak.
        ProbeResult::Drain => assert_eq!(old, new, "a drain request moved a streak"),
    }
}

/// The traffic rule on the passive side of the backend that got the response.
fn check_observe(
    settings: &Settings,
    result: TrafficResult,
    below_cap: bool,
    now: Duration,
    old: &BackendHealth,
    new: &BackendHealth,
) {
    assert_eq!(old.active, new.active, "traffic touched the active side");
    let (old, new) = (old.passive, new.passive);
    match result {
        TrafficResult::Ok => {
            assert_eq!(new.error_streak, 0);
            assert_eq!(new.times_ejected, old.times_ejected);
            match old.ejection {
                Ejection::Ejected { until: None, .. } => {
                    assert_eq!(new.ejection, Ejection::None);
                    assert_eq!(new.readmitted_at, old.readmitted_at);
                }
                Ejection::Probation { .. } => {
                    assert_eq!(new.ejection, Ejection::None);
                    assert_eq!(new.readmitted_at, Some(now));
                }
                // A timed ejection runs its course.
                Ejection::Ejected { .. } | Ejection::None => assert_eq!(
                    new,
                    Passive {
                        error_streak: 0,
                        ..old
                    }
                ),
            }
        }
        TrafficResult::Error => {
            let streak = old.error_streak.saturating_add(1);
            assert_eq!(new.error_streak, streak);
            assert_eq!(new.readmitted_at, old.readmitted_at);
            let should_eject = below_cap
                && match old.ejection {
                    Ejection::None => streak >= settings.consecutive_errors.get(),
                    Ejection::Probation { .. } => true,
                    Ejection::Ejected { .. } => false,
                };
            if !should_eject {
                assert_eq!(new.ejection, old.ejection, "{old:?} -> {new:?}");
                assert_eq!(new.times_ejected, old.times_ejected);
                return;
            }
            let Ejection::Ejected { since, until, nth } = new.ejection else {
                panic!("not ejected: {old:?} -> {new:?} with {settings:?}");
            };
            assert_eq!(since, now);
            assert_eq!(nth, new.times_ejected);
            let restarted = match (settings.ejection, old.readmitted_at) {
                (Some(policy), Some(readmitted)) => now.saturating_sub(readmitted) >= policy.max,
                _ => false,
            };
            let expected_nth = if restarted {
                1
            } else {
                old.times_ejected.saturating_add(1)
            };
            assert_eq!(nth, expected_nth, "{old:?} -> {new:?}");
            let expected_until = settings
                .ejection
                .map(|policy| now.saturating_add(policy.duration(nth)));
            assert_eq!(until, expected_until);
        }
    }
}

/// A tick ends exactly the timed ejections due by `now`, and touches nothing else.
fn check_tick(before: &[BackendHealth], pool: &Pool, now: Duration) {
    assert_eq!(before.len(), pool.len());
    for (old, new) in before.iter().zip(pool.backends()) {
        assert_eq!(old.active, new.active, "a tick touched the active side");
        match old.passive.ejection {
            Ejection::Ejected {
                until: Some(until), ..
            } if until <= now => {
                assert_eq!(new.passive.ejection, Ejection::Probation { since: now });
                assert_eq!(new.passive.error_streak, 0);
                assert_eq!(new.passive.times_ejected, old.passive.times_ejected);
            }
            _ => assert_eq!(old, new, "a tick at {now:?} changed a backend"),
        }
    }
    if let Some(next) = pool.next_expiry() {
        assert!(
            next > now,
            "a tick at {now:?} left an ejection due at {next:?}"
        );
    }
}

/// The transitions of one call are the verdicts it changed, each reported once, in pool order,
/// with a reason that belongs to the call.
fn check_transitions(
    before: &[BackendHealth],
    pool: &Pool,
    transitions: &[Transition],
    now: Duration,
    op: Op,
    settings: &Settings,
) {
    let changed: Vec<usize> = before
        .iter()
        .zip(pool.backends())
        .enumerate()
        .filter(|(_, (old, new))| old.verdict() != new.verdict())
        .map(|(b, _)| b)
        .collect();
    let reported: Vec<usize> = transitions.iter().map(|t| t.backend).collect();
    assert_eq!(reported, changed, "{op:?}: transitions {transitions:?}");
    let mut healthy = before.iter().filter(|b| b.verdict() == State::Up).count();
    for t in transitions {
        let (old, new) = (&before[t.backend], pool.backend(t.backend));
        assert_ne!(t.from, t.to, "{t:?}");
        assert_eq!(t.from, old.verdict());
        assert_eq!(t.to, new.verdict());
        assert_eq!(t.at, now);
        match t.to {
            State::Up => healthy += 1,
            State::Down => healthy -= 1,
        }
        assert_eq!(t.healthy_after, healthy, "{t:?}");
        assert_eq!(t.emptied_pool(), t.to == State::Down && healthy == 0);
        assert_eq!(t.refilled_pool(), t.to == State::Up && healthy == 1);
        // The text form never panics, whatever the numbers.
        assert!(!t.to_string().is_empty());
        check_reason(t, old, new, op, settings);
    }
}

fn check_reason(
    t: &Transition,
    old: &BackendHealth,
    new: &BackendHealth,
    op: Op,
    settings: &Settings,
) {
    let ejection_matches = |e: capataz_health::EjectionInfo| {
        let policy = settings
            .ejection
            .expect("a timed ejection without a policy");
        assert_eq!(e.duration, policy.duration(e.nth), "{t:?} with {policy:?}");
        assert_eq!(e.until, t.at.saturating_add(e.duration), "{t:?}");
        assert!(new.passive.is_ejected());
    };
    match (op, t.reason) {
        (Op::Probe { outcome, .. }, Reason::ProbesFailed { streak, last, .. }) => {
            assert_eq!(last, outcome);
            assert_eq!(streak, new.active.fail_streak);
            assert!(streak >= settings.fall.get());
        }
        (Op::Probe { outcome, .. }, Reason::ProbesPassed { streak, last }) => {
            assert_eq!(last, outcome);
            assert_eq!(streak, new.active.pass_streak);
            assert!(streak >= settings.rise.get());
            assert!(
                !(settings.probes_end_ejection && old.passive.is_ejected()),
                "{t:?}: an ejection outlived a recovery with probes_end_ejection"
            );
        }
        (Op::Probe { outcome, .. }, Reason::ProbesEndedEjection { streak, last, nth }) => {
            assert!(settings.probes_end_ejection, "{t:?} with the setting off");
            assert_eq!(last, outcome);
            assert_eq!(streak, new.active.pass_streak);
            assert!(streak >= settings.rise.get(), "{t:?}");
            assert_eq!(old.active.state, State::Down);
            assert_eq!(t.to, State::Up);
            let Ejection::Ejected { nth: was, .. } = old.passive.ejection else {
                panic!("{t:?} from {old:?}");
            };
            assert_eq!(nth, was);
            assert!(matches!(new.passive.ejection, Ejection::Probation { .. }));
        }
        (
            Op::Observe { outcome, .. },
            Reason::TrafficErrors {
                streak,
                last,
                ejection,
            },
        ) => {
            assert_eq!(last, outcome);
            assert_eq!(streak, new.passive.error_streak);
            assert_eq!(t.to, State::Down);
            assert!(new.passive.is_ejected());
            match ejection {
                Some(e) => ejection_matches(e),
                None => assert_eq!(settings.ejection, None, "{t:?}"),
            }
        }
        (Op::Observe { outcome, .. }, Reason::TrafficRecovered { last }) => {
            assert_eq!(last, outcome);
            assert_eq!(t.to, State::Up);
            assert!(matches!(
                old.passive.ejection,
                Ejection::Ejected { until: None, .. }
            ));
        }
        (Op::Observe { outcome, .. }, Reason::ProbationFailed { last, ejection }) => {
            assert_eq!(last, outcome);
            assert_eq!(t.to, State::Down);
            assert!(matches!(old.passive.ejection, Ejection::Probation { .. }));
            ejection_matches(ejection);
        }
        (Op::Tick, Reason::EjectionExpired { nth, duration }) => {
            let Ejection::Ejected {
                since,
                until: Some(until),
                nth: was,
            } = old.passive.ejection
            else {
                panic!("{t:?} from {old:?}");
            };
            assert_eq!(nth, was);
            assert_eq!(duration, until.saturating_sub(since));
            assert_eq!(t.to, State::Up);
        }
        (op, reason) => panic!("{op:?} gave a transition for {reason:?}"),
    }
}

/// Bytes read front to back; past the end every read gives 0, so any input decodes.
struct Bytes<'a>(&'a [u8]);

impl Bytes<'_> {
    fn u8(&mut self) -> u8 {
        match self.0.split_first() {
            Some((&b, rest)) => {
                self.0 = rest;
                b
            }
            None => 0,
        }
    }

    fn u16(&mut self) -> u16 {
        u16::from_le_bytes([self.u8(), self.u8()])
    }
}

/// 0-63 units of 1 ms, 10 ms, 1 s or 1 min: many calls at the same instant, and long gaps too.
fn delay(b: u8) -> Duration {
    const UNIT_MS: [u64; 4] = [1, 10, 1_000, 60_000];
    Duration::from_millis(u64::from(b & 0x3f) * UNIT_MS[usize::from(b >> 6)])
}

fn state(b: u8) -> State {
    if b & 1 == 0 {
        State::Up
    } else {
        State::Down
    }
}

/// Status codes at the edges of the rules' classes.
const CODES: [u16; 16] = [
    100, 199, 200, 204, 299, 301, 302, 399, 400, 404, 499, 500, 502, 503, 504, 599,
];

fn outcome(bytes: &mut Bytes<'_>) -> Outcome {
    match bytes.u8() % 8 {
        0 => Outcome::Timeout,
        1 => Outcome::Refused,
        2 => Outcome::Reset,
        3 => Outcome::Malformed,
        4 | 5 => Outcome::Status(CODES[usize::from(bytes.u8() % 16)]),
        _ => Outcome::Status(100 + bytes.u16() % 500),
    }
}

/// Mostly small thresholds, so streaks reach them; now and then huge ones.
fn threshold(b: u8) -> NonZeroU32 {
    let n = match b {
        0..=239 => 1 + u32::from(b % 6),
        240..=254 => u32::from(b) * 1_000,
        255 => u32::MAX,
    };
    NonZeroU32::new(n).unwrap_or(NonZeroU32::MIN)
}

fn decode_settings(bytes: &mut Bytes<'_>) -> Settings {
    let rise = threshold(bytes.u8());
    let fall = threshold(bytes.u8());
    let consecutive_errors = threshold(bytes.u8());
    let flags = bytes.u8();
    let expect = match bytes.u8() % 4 {
        0 | 1 => StatusSet::default(),
        2 => {
            let lo = 100 + 2 * u16::from(bytes.u8());
            StatusSet::range(lo, lo + 2 * u16::from(bytes.u8()))
        }
        _ => StatusSet::empty(),
    };
    let ejection = if flags & 0b100 != 0 {
        let base = Duration::from_millis(u64::from(bytes.u16()));
        // Mostly `max` a multiple of `base`, as the config loader makes it; sometimes any value,
        // even below `base` or zero, which the engine must take without panicking.
        let max = if flags & 0b1000 != 0 {
            base * (1 + u32::from(bytes.u8() % 8))
        } else {
            Duration::from_millis(u64::from(bytes.u16()))
        };
        Some(EjectionPolicy { base, max })
    } else {
        None
    };
    let max_ejected_percent = match bytes.u8() {
        p @ 0..=100 => p,
        101..=180 => 100,
        p => p,
    };
    Settings {
        rise,
        fall,
        consecutive_errors,
        initial: state(flags),
        first_probe: false,
        probe_rule: ProbeRule { expect },
        traffic_rule: TrafficRule {
            count_503: flags & 0b10 != 0,
            ..TrafficRule::default()
        },
        ejection,
        max_ejected_percent,
        probes_end_ejection: flags & 0b1_0000 != 0,
        // The outlier detectors are driven by window inputs this target does not generate;
        // their engine tests are in crates/capataz-health/tests.
        latency_outliers: None,
        success_rate: None,
    }
}
