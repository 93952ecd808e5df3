//! Slow start ramps the traffic, not only the weight `/status` reports.

use std::collections::BTreeSet;

use capataz::sim::Mode;
use capataz_health::State;

use super::*;
use crate::support::balancer::backends;
use crate::support::events::is_transition;

/// Takes `name` down through its health route and brings it back; returns once it is UP.
async fn bounce(scene: &mut Scene, name: &str) {
    scene.backend(name).set_health(Mode::Status(503));
    scene
        .wait_for("the backend DOWN", |e| is_transition(e, name, State::Down))
        .await;
    scene.backend(name).set_health(Mode::Status(200));
    scene
        .wait_for("the backend UP", |e| is_transition(e, name, State::Up))
        .await;
}

/// Regression: a backend that rejoined with `slow_start = "2s"` showed
/// `effective_weight` 1.0 after its ramp, but kept 10 % of the traffic (3 of 40 requests 8 s
/// later): the snapshot the picker reads was built at the transition and never again, since
/// nothing woke the timer for the ramp's steps, while `/status` computed the weight afresh.
#[tokio::test]
async fn slow_start_ramps_the_traffic_not_only_the_reported_weight() {
    let b = backends(&["b1", "b2"]).await;
    let text = config(
        &[member(&b[0], 1, ""), member(&b[1], 1, "")],
        "slow_start = \"2s\"",
        "",
    );
    let mut scene = Scene::start(&text, b).await;
    // At start, no ramp: an even split.
    scene.check_windows("at start", 1).await;
    bounce(&mut scene, "b2").await;
    scene
        .wait_reported("b2 back to its full weight", |r| r.weight("b2") == 1.0)
        .await;
    let window = scene.window(40).await;
    assert!(
        window.stable(),
        "nothing changes after the ramp: {window:?}"
    );
    window.check("after the ramp");
    scene.stop().await;
}

/// During the ramp, each window's split follows the weight `/status` reported around it, step
/// by step. A 12 s ramp has 20 steps of 600 ms; a window takes tens of milliseconds (hundreds
/// on a machine busy with other tests: a 6 s ramp's 300 ms steps then left too few windows
/// within one step), so most fall within a step.
#[tokio::test]
async fn the_split_follows_each_step_of_the_ramp() {
    let b = backends(&["a", "b"]).await;
    let text = config(
        &[member(&b[0], 10, ""), member(&b[1], 10, "")],
        "slow_start = \"12s\"",
        "",
    );
    let mut scene = Scene::start(&text, b).await;
    bounce(&mut scene, "b").await;
    let mut levels = BTreeSet::new();
    let mut at_full = 0;
    let end = tokio::time::Instant::now() + DEADLINE;
    while at_full < 2 {
        assert!(
            tokio::time::Instant::now() < end,
            "the ramp never ended: {levels:?}"
        );
        let window = scene.window(WINDOW).await;
        if !window.stable() {
            continue;
        }
        window.check("during the ramp");
        let weight = window.before.weight("b");
        if weight < 10.0 {
            levels.insert((weight * 10.0).round() as u32);
        } else {
            at_full += 1;
        }
    }
    // Windows at a few different steps at least, however slow the machine (the steps last
    // 600 ms each).
    assert!(levels.len() >= 3, "ramp levels compared: {levels:?}");
    scene.stop().await;
}
