//! Slow start: a recovered backend ramps up to its weight.

use super::*;

/// The effective weight of a weight-10 backend `elapsed` into a 1 s slow start at most: 10 %
/// of the weight at the start, then linear to the full weight.
fn ramp_ceiling(elapsed: Duration) -> f64 {
    (1.0 + 9.0 * elapsed.as_secs_f64()).min(10.0)
}

#[tokio::test]
async fn slow_start_ramps_a_recovered_backend_up_to_its_weight() {
    let b = backends(&["a", "b"]).await;
    let extra = format!("slow_start = \"1s\"\n{FAST_CHECKS}");
    let mut r = Running::start(&config_text("", &[&b[0], &b[1]], &[1, 10], &extra)).await;
    // At process start every backend has its full weight.
    let status = r.backend("b").await;
    assert_eq!(number(&status, "/weight"), 10.0);
    assert_eq!(number(&status, "/effective_weight"), 10.0);

    b[1].set_health(Mode::Status(503));
    r.wait_for("b DOWN", |e| is_transition(e, "b", State::Down))
        .await;
    b[1].set_health(Mode::Status(200));
    let up = r
        .wait_for("b UP", |e| is_transition(e, "b", State::Up))
        .await;
    // Times are the engine's own: when it made b UP, and its clock after each read. The test
    // may be scheduled late on a loaded machine (the event read, or a status read, 200 ms
    // after the transition), so what the weight may be is bounded by the time that really
    // went by, not assumed from when the test got to look.
    let Notice::Transition { transition, .. } = up else {
        unreachable!("waited for a transition")
    };
    let up_at = transition.at;
    let clock = r.balancer.pool("web").expect("pool web").clock();
    let status = r.backend("b").await;
    let read_at = clock.now();
    let first = number(&status, "/effective_weight");
    let ceiling = ramp_ceiling(read_at.saturating_sub(up_at));
    assert!(
        first > 0.0 && first <= ceiling,
        "starts low: {first} above {ceiling} after {:?}: {status:#}",
        read_at.saturating_sub(up_at)
    );
    if first < 10.0 {
        let explain = text(&status, "/explain");
        assert!(explain.contains("slow start: weight"), "{explain}");
    }

    // It ramps up, never down, never above the ramp, and reaches the full weight no sooner
    // than a second after the transition.
    let mut last = first;
    let end = tokio::time::Instant::now() + DEADLINE;
    loop {
        let status = r.backend("b").await;
        let read_at = clock.now();
        let weight = number(&status, "/effective_weight");
        assert!(weight >= last, "the ramp went down: {last} then {weight}");
        let ceiling = ramp_ceiling(read_at.saturating_sub(up_at));
        assert!(
            weight <= ceiling,
            "{weight} above the ramp's {ceiling} after {:?}",
            read_at.saturating_sub(up_at)
        );
        last = weight;
        if weight == 10.0 {
            assert!(!text(&status, "/explain").contains("slow start"));
            let took = read_at.saturating_sub(up_at);
            assert!(
                took >= Duration::from_secs(1),
                "full weight after only {took:?}"
            );
            break;
        }
        assert!(
            tokio::time::Instant::now() < end,
            "never reached full weight: {status:#}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}
