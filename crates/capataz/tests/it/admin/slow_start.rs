//! Slow start: a recovered backend ramps up to its weight.

use super::*;

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
    r.wait_for("b UP", |e| is_transition(e, "b", State::Up))
        .await;
    let up_at = tokio::time::Instant::now();
    let status = r.backend("b").await;
    let first = number(&status, "/effective_weight");
    assert!(first > 0.0 && first <= 3.0, "starts low: {status:#}");
    let explain = text(&status, "/explain");
    assert!(explain.contains("slow start: weight"), "{explain}");

    // It ramps up, never down, and reaches the full weight after about a second.
    let mut last = first;
    let end = tokio::time::Instant::now() + DEADLINE;
    loop {
        let status = r.backend("b").await;
        let weight = number(&status, "/effective_weight");
        assert!(weight >= last, "the ramp went down: {last} then {weight}");
        last = weight;
        if weight == 10.0 {
            assert!(!text(&status, "/explain").contains("slow start"));
            break;
        }
        assert!(
            tokio::time::Instant::now() < end,
            "never reached full weight: {status:#}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let took = up_at.elapsed();
    assert!(
        took >= Duration::from_millis(800),
        "full weight after only {took:?}"
    );
}
