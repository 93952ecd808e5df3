//! How agent answers and tracking meet the eligibility states on simulated time:
//! an agent `maint` is maintenance (no probes, requalification after), an agent `drain` is a
//! drain like `disable_on_404`'s, and a tracking backend requalifies on its readings.

use std::time::Duration;

use capataz_health::{
    AgentReport, Effective, Join, Outcome, OverrideKind, Policy, ProbeResult, Role, Rotation,
    Settings, State,
};

const S: Duration = Duration::from_secs(1);
const OK: Outcome = Outcome::Status(200);
const BAD: Outcome = Outcome::Status(500);

fn rotation(n: usize) -> Rotation {
    Rotation::with_roles(
        Settings::default(),
        Policy::default(),
        (0..n).map(|_| {
            (
                1,
                Join::New {
                    initial: State::Up,
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

#[test]
fn an_agent_maint_is_maintenance_and_ready_requalifies() {
    let mut r = rotation(2);
    agent(&mut r, 0, "maint", S);
    assert_eq!(r.effective(0), Effective::Maintenance);
    assert!(!r.wants_probes(0), "no probes in agent maintenance");
    assert_eq!(r.eligible(S).backends, [1]);
    let before = *r.pool().backend(0);
    assert_eq!(r.handle_probe(0, BAD, 2 * S), ProbeResult::Fail);
    assert_eq!(
        *r.pool().backend(0),
        before,
        "no streak moves in maintenance"
    );
    agent(&mut r, 0, "ready", 3 * S);
    assert_eq!(r.effective(0), Effective::Requalifying);
    assert!(r.wants_probes(0));
    assert_eq!(r.requalifying(0), Some((0, 2)));
    r.handle_probe(0, OK, 4 * S);
    assert_eq!(r.eligible(4 * S).backends, [1]);
    r.handle_probe(0, OK, 5 * S);
    assert_eq!(r.effective(0), Effective::Up);
    assert_eq!(r.eligible(5 * S).backends, [0, 1]);
}

#[test]
fn an_operator_override_wins_over_an_agent_maint() {
    let mut r = rotation(2);
    agent(&mut r, 0, "maint", S);
    r.set_override(0, Some(OverrideKind::Up), None, 2 * S);
    assert_eq!(r.effective(0), Effective::ForcedUp);
    assert!(r.wants_probes(0));
    r.set_override(0, None, None, 3 * S);
    assert_eq!(
        r.effective(0),
        Effective::Maintenance,
        "the agent's maint again"
    );
    assert!(!r.wants_probes(0));
}

#[test]
fn an_agent_drain_is_a_self_drain_lifted_by_up_alone_and_keeps_the_streaks() {
    let mut r = rotation(2);
    agent(&mut r, 0, "drain", S);
    assert_eq!(r.effective(0), Effective::SelfDraining);
    assert!(r.wants_probes(0), "a drained backend is still probed");
    assert_eq!(r.eligible(S).backends, [1]);
    r.handle_probe(0, OK, 2 * S);
    assert_eq!(
        r.effective(0),
        Effective::SelfDraining,
        "a passing probe does not lift the agent's drain"
    );
    for at in 3..6 {
        r.handle_probe(0, BAD, at * S);
    }
    assert_eq!(r.pool().verdict(0), State::Down, "probes still judge it");
    assert_eq!(r.effective(0), Effective::Down);
    agent(&mut r, 0, "up", 6 * S);
    assert_eq!(
        r.effective(0),
        Effective::Down,
        "up lifts the drain, not the verdict"
    );
    assert_eq!(r.requalifying(0), None, "a drain is not maintenance");
}

#[test]
fn an_agent_down_shows_the_backend_down_without_touching_its_verdict() {
    let mut r = rotation(2);
    agent(&mut r, 0, "down", S);
    assert_eq!(r.effective(0), Effective::Down);
    assert_eq!(r.pool().verdict(0), State::Up);
    assert_eq!(r.eligible(S).backends, [1]);
    agent(&mut r, 0, "up", 2 * S);
    assert_eq!(r.effective(0), Effective::Up);
}

#[test]
fn a_tracking_backend_ignores_readings_in_maintenance_and_requalifies_on_them() {
    let mut r = rotation(2);
    r.handle_tracked(0, State::Up, S);
    r.set_override(0, Some(OverrideKind::Maintenance), None, 2 * S);
    assert_eq!(
        r.handle_tracked(0, State::Down, 3 * S),
        State::Up,
        "ignored"
    );
    r.set_override(0, None, None, 4 * S);
    assert_eq!(r.effective(0), Effective::Requalifying);
    r.handle_tracked(0, State::Up, 5 * S);
    assert_eq!(r.requalifying(0), Some((1, 2)));
    r.handle_tracked(0, State::Down, 6 * S);
    assert_eq!(
        r.requalifying(0),
        Some((0, 2)),
        "a DOWN reading starts over"
    );
    r.handle_tracked(0, State::Up, 7 * S);
    r.handle_tracked(0, State::Up, 8 * S);
    assert_eq!(r.effective(0), Effective::Up);
}
