//! The probe side on simulated time: probe intervals by state (the cadence), the
//! `first-probe` initial state with gating and slow start, body and header matches judged by
//! the probe rule, and agent checks changing eligibility and weight but never the verdict.

use std::time::Duration;

use capataz_health::rotation::Event;
use capataz_health::{
    AgentReport, AllDown, Cadence, Join, Mismatch, Outcome, Policy, ProbeIntervals, ProbeOutcome,
    ProbeResult, Reason, Replay, Rotation, Settings, Snippet, State,
};

const S: Duration = Duration::from_secs(1);
const OK: Outcome = Outcome::Status(200);
const BAD: Outcome = Outcome::Timeout;

fn rotation(settings: Settings, policy: Policy, n: usize) -> Rotation {
    let join = Join::New {
        initial: settings.initial,
        warm_up: false,
    };
    Rotation::new(settings, policy, (0..n).map(|_| (1, join)), Duration::ZERO)
}

fn drain(rotation: &mut Rotation) -> Vec<Event> {
    std::iter::from_fn(|| rotation.poll_event()).collect()
}

fn agent(line: &str) -> AgentReport {
    AgentReport::parse(line.as_bytes()).expect("a valid agent line")
}

#[test]
fn cadence_is_fast_during_a_streak_and_slow_while_down() {
    let mut r = rotation(Settings::default(), Policy::default(), 1);
    let mut seen = vec![r.cadence(0)];
    for outcome in [BAD, BAD, BAD, BAD, OK, BAD, OK, OK, OK] {
        r.handle_probe(0, outcome, S);
        seen.push(r.cadence(0));
    }
    use Cadence::*;
    // UP steady; a failing streak (fall 3) is fast until it ends DOWN; DOWN stays slow until a
    // pass starts a streak; a failure ends it; rise 2 brings it UP and steady again.
    assert_eq!(
        seen,
        [Steady, Fast, Fast, Down, Down, Fast, Down, Fast, Steady, Steady]
    );
    let intervals = ProbeIntervals {
        steady: 2 * S,
        fast: S / 2,
        down: 10 * S,
    };
    assert_eq!(intervals.of(Fast), S / 2);
    assert_eq!(intervals.of(Down), 10 * S);
    assert_eq!(ProbeIntervals::uniform(2 * S).of(Down), 2 * S);
}

#[test]
fn a_backend_never_probed_is_probed_at_the_steady_interval_even_when_it_starts_down() {
    let settings = Settings {
        initial: State::Down,
        ..Settings::default()
    };
    let mut r = rotation(settings, Policy::default(), 1);
    assert_eq!(r.cadence(0), Cadence::Steady);
    r.handle_probe(0, BAD, S);
    assert_eq!(r.cadence(0), Cadence::Down);
}

fn first_probe() -> Settings {
    Settings {
        initial: State::Down,
        first_probe: true,
        rise: std::num::NonZeroU32::new(3).unwrap(),
        ..Settings::default()
    }
}

#[test]
fn first_probe_admits_a_backend_after_one_pass_and_proves_it() {
    let policy = Policy {
        slow_start: Some(10 * S),
        ..Policy::default()
    };
    let mut r = rotation(first_probe(), policy, 2);
    // Gated: never proven, so neither rotation nor fail-open.
    assert!(r.eligible(Duration::ZERO).backends.is_empty());
    assert_eq!(
        r.all_down(),
        Some(AllDown::NoneToFailOpen {
            overridden: 0,
            unproven: 2,
            held: 0,
        })
    );
    assert_eq!(r.handle_probe(0, OK, S), ProbeResult::Pass);
    assert_eq!(r.pool().verdict(0), State::Up);
    assert!(r.is_proven(0));
    let up = drain(&mut r)
        .into_iter()
        .find_map(|e| match e {
            Event::Transition(t) => Some(t),
            _ => None,
        })
        .expect("a transition");
    assert!(
        matches!(up.reason, Reason::ProbesPassed { streak: 1, .. }),
        "{up}"
    );
    // Slow start begins at that transition, as for any backend coming UP.
    let eligible = r.eligible(S);
    assert_eq!(eligible.backends, [0]);
    assert_eq!(eligible.weights, [1]);
    // From then on the streaks apply: fall 3 takes it down, rise 3 brings it back.
    for _ in 0..3 {
        r.handle_probe(0, BAD, 2 * S);
    }
    assert_eq!(r.pool().verdict(0), State::Down);
    r.handle_probe(0, OK, 3 * S);
    assert_eq!(
        r.pool().verdict(0),
        State::Down,
        "only the first probe decides at once"
    );
}

#[test]
fn first_probe_that_fails_leaves_the_backend_down_until_rise_passes() {
    let mut r = rotation(first_probe(), Policy::default(), 1);
    r.handle_probe(0, BAD, S);
    r.handle_probe(0, OK, 2 * S);
    r.handle_probe(0, OK, 3 * S);
    assert_eq!(r.pool().verdict(0), State::Down);
    r.handle_probe(0, OK, 4 * S);
    assert_eq!(r.pool().verdict(0), State::Up);
}

#[test]
fn a_body_mismatch_fails_the_probe_and_names_the_text_in_the_reason() {
    let mut r = rotation(Settings::default(), Policy::default(), 1);
    let mismatched = ProbeOutcome {
        outcome: OK,
        mismatch: Some(Mismatch::BodyLacks(Snippet::new("ok"))),
    };
    for _ in 0..3 {
        assert_eq!(r.handle_probe(0, mismatched, S), ProbeResult::Fail);
    }
    let down = drain(&mut r)
        .into_iter()
        .find_map(|e| match e {
            Event::Transition(t) => Some(t),
            _ => None,
        })
        .expect("DOWN");
    assert_eq!(
        down.to_string(),
        r#"UP -> DOWN: 3 consecutive failed probes, last: HTTP 200, body did not contain "ok""#
    );
    // A match passes like a bare status.
    assert_eq!(
        r.handle_probe(0, ProbeOutcome::from(OK), S),
        ProbeResult::Pass
    );
}

#[test]
fn a_grpc_health_check_passes_only_serving_and_names_what_it_got() {
    let mut r = rotation(Settings::default(), Policy::default(), 1);
    let serving = ProbeOutcome::from(Outcome::Grpc(0));
    assert_eq!(r.handle_probe(0, serving, S), ProbeResult::Pass);
    let not_serving = ProbeOutcome {
        outcome: Outcome::Grpc(0),
        mismatch: Some(Mismatch::GrpcServing(2)),
    };
    for _ in 0..3 {
        assert_eq!(r.handle_probe(0, not_serving, S), ProbeResult::Fail);
    }
    let down = drain(&mut r)
        .into_iter()
        .find_map(|e| match e {
            Event::Transition(t) => Some(t),
            _ => None,
        })
        .expect("DOWN");
    assert_eq!(
        down.to_string(),
        "UP -> DOWN: 3 consecutive failed probes, last: GRPC 0 OK, gRPC health NOT_SERVING"
    );
    // A failed call fails whatever its code, and reads with the code's name.
    let unimplemented = ProbeOutcome::from(Outcome::Grpc(12));
    assert_eq!(r.handle_probe(0, unimplemented, S), ProbeResult::Fail);
    assert_eq!(unimplemented.to_string(), "GRPC 12 UNIMPLEMENTED");
    let unknown = ProbeOutcome {
        outcome: Outcome::Grpc(0),
        mismatch: Some(Mismatch::GrpcServing(3)),
    };
    assert_eq!(
        unknown.to_string(),
        "GRPC 0 OK, gRPC health SERVICE_UNKNOWN"
    );
}

#[test]
fn agent_down_and_weight_change_eligibility_never_the_verdict_or_streaks() {
    let mut r = rotation(Settings::default(), Policy::default(), 2);
    r.handle_probe(0, BAD, S);
    let health = *r.pool().backend(0);
    r.handle_agent(0, agent("down"), S);
    assert_eq!(
        *r.pool().backend(0),
        health,
        "the agent never touches streaks"
    );
    assert_eq!(r.pool().verdict(0), State::Up);
    assert_eq!(r.eligible(S).backends, [1]);
    let events = drain(&mut r);
    assert!(
        matches!(events[..], [Event::Agent(change)] if !change.in_rotation),
        "{events:?}"
    );
    // Weight: 50 % of weight 1 is 5 tenths.
    r.handle_agent(0, agent("up 50%"), 2 * S);
    let eligible = r.eligible(2 * S);
    assert_eq!(eligible.backends, [0, 1]);
    assert_eq!(eligible.weights, [5, 10]);
    // The same answer again changes nothing and says nothing.
    drain(&mut r);
    r.handle_agent(0, agent("50%"), 3 * S);
    assert!(drain(&mut r).is_empty());
    // Garbage is no input at all: the runtime never calls handle_agent with it.
    assert_eq!(AgentReport::parse(b"what?"), None);
    assert_eq!(r.agent(0).weight_percent, 50);
}

#[test]
fn agent_holds_keep_a_backend_out_of_fail_open_and_an_override_wins() {
    let mut r = rotation(Settings::default(), Policy::default(), 2);
    r.handle_agent(0, agent("drain"), S);
    r.handle_agent(1, agent("maint"), S);
    assert_eq!(r.eligible(S).backends, Vec::<usize>::new());
    assert!(matches!(
        r.all_down(),
        Some(AllDown::NoneToFailOpen {
            overridden: 0,
            held: 2,
            ..
        })
    ));
    r.set_override(0, Some(capataz_health::OverrideKind::Up), None, 2 * S);
    assert_eq!(r.eligible(2 * S).backends, [0]);
    // Leaving the agent's maintenance requalifies, as leaving an operator's does.
    r.handle_agent(1, agent("ready"), 3 * S);
    assert_eq!(r.all_down(), None);
    assert_eq!(r.effective(1), capataz_health::Effective::Requalifying);
    assert_eq!(r.eligible(3 * S).backends, [0]);
    r.handle_probe(1, Outcome::Status(200), 4 * S);
    r.handle_probe(1, Outcome::Status(200), 5 * S);
    assert_eq!(r.eligible(5 * S).backends, [0, 1]);
    // 0 % holds out like drain.
    r.handle_agent(1, agent("0%"), 6 * S);
    assert_eq!(r.eligible(6 * S).backends, [0]);
}

#[test]
fn agent_state_is_carried_across_a_reload() {
    let mut r = rotation(Settings::default(), Policy::default(), 1);
    r.handle_agent(0, agent("drain 25%"), S);
    let carried = r.carry(0);
    let next = Rotation::new(
        Settings::default(),
        Policy::default(),
        [(1, Join::Kept(carried))],
        2 * S,
    );
    assert_eq!(next.agent(0).to_string(), "drain, weight 25%");
    assert!(!next.in_rotation(0));
}

fn replay(script: &str) -> String {
    let mut session = Replay::new(Settings::default());
    let mut out = Vec::new();
    for line in script.lines() {
        session.run_line(line.as_bytes(), &mut out, None);
    }
    String::from_utf8(out).unwrap()
}

#[test]
fn replay_agent_command_prints_what_the_agent_says() {
    let out = replay(
        "POOL a b\nAGENT a down\nELIGIBLE\nAGENT a up, 50%\nELIGIBLE\nAGENT a ???\nAGENT\nAGENT c up\nSTATUS\n",
    );
    assert_eq!(
        out,
        "OK\ndown\nb\nup, weight 50%\na,b\nIGNORED\nERR AGENT needs a backend and an answer\n\
         ERR unknown backend \"c\"\na UP\nb UP\n"
    );
}

#[test]
fn a_tracking_backend_follows_the_active_state_it_is_given_and_says_so() {
    let mut r = rotation(Settings::default(), Policy::default(), 2);
    r.handle_probe(1, BAD, S);
    assert_eq!(r.handle_tracked(1, State::Up, S), State::Up);
    assert!(drain(&mut r).is_empty(), "no change, no event");
    assert_eq!(r.handle_tracked(1, State::Down, 2 * S), State::Down);
    let events = drain(&mut r);
    let [Event::Transition(t)] = events[..] else {
        panic!("{events:?}")
    };
    assert_eq!(
        t.to_string(),
        "UP -> DOWN: the backend it tracks is DOWN by its active checks"
    );
    assert_eq!(t.reason.side(), capataz_health::Side::Active);
    let active = r.pool().backend(1).active;
    assert_eq!((active.fail_streak, active.pass_streak), (0, 0));
    // A gated newcomer that tracks an UP backend is proven by it.
    let settings = Settings {
        initial: State::Down,
        ..Settings::default()
    };
    let mut r = rotation(settings, Policy::default(), 1);
    assert!(!r.is_proven(0));
    r.handle_tracked(0, State::Up, S);
    assert!(r.is_proven(0));
    assert_eq!(r.eligible(S).backends, [0]);
}

mod parsers {
    use capataz_health::{AgentReport, Snippet};
    use proptest::prelude::*;

    proptest! {
        /// Agent lines and snippets come from hostile backends and configs: never a panic,
        /// and a snippet is always a prefix of its text within its bound.
        #[test]
        fn agent_lines_and_snippets_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..400), text in ".{0,80}") {
            let _ = AgentReport::parse(&bytes);
            let snippet = Snippet::new(&text);
            prop_assert!(text.starts_with(snippet.as_str()));
            prop_assert!(snippet.as_str().len() <= Snippet::MAX);
            prop_assert_eq!(snippet.is_cut(), snippet.as_str().len() < text.len());
        }
    }
}
