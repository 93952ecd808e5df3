//! A backend failing one request in five (deterministically: every 5th) never makes
//! `consecutive_errors = 3` in a row, and the success-rate detector ejects it.

use capataz::sim::Mode;
use capataz_health::{Reason, State};

use super::*;
use crate::support::balancer::backends;
use crate::support::events::transition_of;

const DETECTOR: &str = r#"
[pools.web.passive]
consecutive_errors = 3
ejection_time = "30s"

[pools.web.passive.success_rate]
enabled = true
window = "300ms"
min_requests = 10
min_backends = 5
stdev_factor = 1.9
"#;

#[tokio::test]
async fn a_backend_with_one_error_in_five_is_caught_by_the_success_rate_detector_not_by_consecutive_errors(
) {
    let b = backends(&["a", "b", "c", "d", "flaky"]).await;
    b[4].set_traffic(Mode::FailEvery(5, 500));
    let mut r = Running::start(&config(&b, DETECTOR), 4).await;
    let event = r
        .wait_for("flaky ejected", |e| {
            transition_of(e, "flaky", State::Down).is_some()
        })
        .await;
    let t = *transition_of(&event, "flaky", State::Down).expect("the transition");
    let Reason::ErrorRate {
        success_permille,
        mean_permille,
        threshold_permille,
        ejection: Some(ejection),
    } = t.reason
    else {
        panic!("not a success-rate ejection: {}", t.reason);
    };
    assert!(
        success_permille < threshold_permille && threshold_permille < mean_permille,
        "{}",
        t.reason
    );
    // A window of n >= 10 requests with every 5th failing holds floor(n/5) or ceil(n/5)
    // errors, by its phase: from 8/11 (72.7 %) to 12/14 (85.7 %) successes. (Windows end on
    // the engine clock's grid, so the first one is usually shorter than `window`.)
    assert!((727..=857).contains(&success_permille), "{}", t.reason);
    assert_eq!(ejection.nth, 1);
    let status = r.backend("flaky").await;
    let explain = status["explain"].as_str().unwrap_or_default();
    assert!(
        explain.contains("an error-rate outlier: success rate "),
        "{explain}"
    );
    assert!(status["passive"]["error_streak"].as_u64().unwrap_or(9) < 3);
    for other in ["a", "b", "c", "d"] {
        assert_eq!(r.backend(other).await["verdict"], "UP");
    }
    r.stop().await;
}
